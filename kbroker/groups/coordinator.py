"""The classic consumer group coordinator: membership, rebalances and generations.

Kafka's state machine (KIP-62, KIP-345, KIP-394, the group coordinator's ClassicGroup):

    Empty ──join──▶ PreparingRebalance ──all joined / timeout──▶ CompletingRebalance ──leader syncs──▶ Stable
      ▲                   ▲                                            │                                  │
      └── no members ─────┴──────── join, leave, expiry ───────────────┴──────────────────────────────────┘
    (any state) ──DeleteGroups of an empty group──▶ Dead

A JoinGroup waits until every known member has rejoined and every member id handed out with
MEMBER_ID_REQUIRED has been used (or the rebalance timeout passes: dynamic stragglers are removed,
static ones keep their place until their session ends); then a new generation starts, the leader receives
every member's metadata and assigns partitions in the client, and SyncGroup hands each member its share.
The first rebalance of an empty group waits group.initial.rebalance.delay.ms, and again while new members
keep arriving, so that a group of starting consumers settles in one rebalance. Members that stop
heartbeating are removed after their session timeout, members that never send SyncGroup after the
rebalance timeout. Assignors run in the clients, so eager and cooperative rebalancing both work unchanged.

Time comes from an injectable ``clock`` (seconds, monotonic); ``tick`` fires every timer that is due and
``next_deadline`` says when the next one is. The coordinator registers with a CoordinatorTimers
(kbroker.groups.timers), which calls ``tick`` at those deadlines; setting a timer wakes the runtime if it would
sleep past it. Waiting requests park on trio events.

Each generation is written to ``store`` (Kafka's GroupMetadata record in __consumer_offsets) when a rebalance
completes (the leader's SyncGroup) or leaves the group Empty, and a deleted group's tombstone; after a restart
``restore`` brings the groups back Stable or Empty, as Kafka's coordinator loads them.
"""

from __future__ import annotations

import logging
import struct
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import trio

from kbroker.coordinators.runtime import write_error_answer
from kbroker.durable.files import StorageError
from kbroker.groups.timers import CoordinatorTimers
from protocol.errors import ErrorCode, KafkaError

log = logging.getLogger("kbroker.groups")

# Kafka's classic-group constant: a new member parked in JoinGroup cannot heartbeat, so its request is
# answered (UNKNOWN_MEMBER_ID) after this long if the rebalance has not completed by then.
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000
UNKNOWN_MEMBER_ID = ""


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class JoinResult:
    error_code: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)  # id, instance id, metadata
    skip_assignment: bool = False


@dataclass(slots=True)
class SyncResult:
    error_code: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    heartbeat_deadline: float = 0.0
    assignment: bytes = b""
    is_new: bool = False  # added in this rebalance, not yet given a generation
    join_waiter: trio.Event | None = None  # set while the member awaits its JoinGroup response
    join_result: JoinResult | None = None
    sync_waiter: trio.Event | None = None  # set while the member awaits its SyncGroup response
    sync_result: SyncResult | None = None

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_waiter is not None

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    @property
    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        return next(name for name in self.protocol_names if name in candidates)


@dataclass(slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    previous_state: GroupState = GroupState.DEAD
    state_since_ms: int = field(default_factory=lambda: int(time.time() * 1000))  # wall clock
    generation_id: int = 0
    protocol_type: str | None = None  # kept while Empty, as Kafka does (offset expiry and listings use it)
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_members: dict[str, float] = field(default_factory=dict)  # KIP-394 ids handed out -> expiry
    pending_sync: set[str] = field(default_factory=set)  # members yet to send SyncGroup this generation
    sync_deadline: float | None = None  # when members still in pending_sync are removed
    join_deadline: float | None = None  # when the join phase is completed without the stragglers
    initial_delay_ms: int = 0  # the current window of an initial rebalance's delay
    initial_remaining_ms: int = 0  # how much longer that delay may still be extended
    new_member_added: bool = False  # a new member arrived during the current initial delay window

    def candidate_protocols(self) -> set[str]:
        candidates: set[str] | None = None
        for member in self.members.values():
            names = set(member.protocol_names)
            candidates = names if candidates is None else candidates & names
        return candidates or set()

    def select_protocol(self) -> str | None:
        """The protocol every member supports that most members prefer (Kafka's vote)."""
        candidates = self.candidate_protocols()
        if not candidates:
            return None
        votes: dict[str, int] = {}
        for member in self.members.values():
            preferred = member.vote(candidates)
            votes[preferred] = votes.get(preferred, 0) + 1
        return max(sorted(votes), key=lambda name: votes[name])

    def supports_protocols(self, protocol_type: str, protocols: list[str]) -> bool:
        if self.state == GroupState.EMPTY:
            return bool(protocol_type) and bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        return bool(self.candidate_protocols() & set(protocols))

    def has_all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_members

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to (consumer protocol), or None if that cannot be read."""
        if self.protocol_type != "consumer" or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = parse_subscription(member.metadata_for(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return topics


def parse_subscription(metadata: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (version int16, then an array of int16-length strings)."""
    try:
        pos = 2
        (count,) = struct.unpack_from(">i", metadata, pos)
        pos += 4
        topics = set()
        for _ in range(max(count, 0)):
            (length,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            topics.add(metadata[pos : pos + length].decode())
            pos += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


class GroupStore(Protocol):
    """Where a classic group's membership is kept (kbroker/groups/offsets.py: Kafka's GroupMetadata records)."""

    def store_group(self, group: Group) -> int:
        """Write the group's generation: its members and their assignments (raises StorageError on failure); the
        offset after the write (-1: nothing written), for ``committed``."""
        ...

    async def committed(self, group: str, end_offset: int) -> None:
        """Return once the write that returned ``end_offset`` is committed (KafkaError if it cannot be)."""
        ...

    def remove_group(self, group_id: str) -> None:
        """Write the group's tombstone (raises StorageError on failure)."""
        ...


class GroupCoordinator:
    def __init__(
        self,
        *,
        min_session_timeout_ms: int,
        max_session_timeout_ms: int,
        initial_rebalance_delay_ms: int,
        max_size: int = 2**31 - 1,
        clock: Callable[[], float] = trio.current_time,
        wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        runtime: CoordinatorTimers | None = None,
        started_ms: int | None = None,
        store: GroupStore | None = None,
    ) -> None:
        self.groups: dict[str, Group] = {}
        # Where each generation is written (GroupMetadata records in __consumer_offsets); None: memory only.
        self.store = store
        # The offset after the last GroupMetadata record written (-1: none yet): what an answer waits to be
        # committed when its operation wrote one (a LeaveGroup that left its group Empty).
        self._last_written = -1
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.max_size = max_size
        self.clock = clock
        self.wall_clock_ms = wall_clock_ms
        # The broker's start (offsets of groups unknown since then age from it): now, unless made later.
        self.started_ms = wall_clock_ms() if started_ms is None else started_ms
        # The timer service that ticks this coordinator; without one (unit tests) the caller calls tick().
        self.runtime = runtime if runtime is not None else CoordinatorTimers()
        self.runtime.register(self)

    # --- helpers --------------------------------------------------------------------------------------

    def _transition(self, group: Group, state: GroupState) -> None:
        group.previous_state = group.state
        group.state = state
        group.state_since_ms = self.wall_clock_ms()

    def _store(self, group: Group) -> int:
        """Write the group's new generation, as Kafka's coordinator does when a rebalance completes (the leader's
        SyncGroup) or leaves the group empty; the offset after the write (-1: nothing written). A failed write is
        logged and the group carries on in memory; the generation before it is what a restart finds."""
        if self.store is None:
            return -1
        try:
            self._last_written = self.store.store_group(group)
        except StorageError as exc:
            log.warning("group %s: generation %d was not written: %s", group.group_id, group.generation_id, exc)
            return -1
        return self._last_written

    async def _committed(self, group: Group, written: int) -> ErrorCode:
        """Wait until the group's write that returned ``written`` is committed (replicated to the ISR), as Kafka's
        coordinator answers a write only then (at once on a single node); the error to answer with if it cannot
        be, as Kafka maps it."""
        if written < 0 or self.store is None:
            return ErrorCode.NONE
        try:
            await self.store.committed(group.group_id, written)
        except KafkaError as exc:
            log.warning("group %s: generation %d was not committed: %s", group.group_id, group.generation_id, exc)
            return write_error_answer(exc.code)
        return ErrorCode.NONE

    async def _assignment_committed(self, group: Group) -> ErrorCode:
        """Write the leader's assignment and wait until it is committed, as Kafka answers SyncGroup only then: a
        member never works on an assignment a failover could take back."""
        return await self._committed(group, self._store(group))

    def restore(self, groups: Iterable[Group]) -> None:
        """Take the groups a restart found (the replay of their GroupMetadata records): each member's session
        counts from now, so a member that is still there carries on with its generation by heartbeating."""
        for group in groups:
            self.groups[group.group_id] = group
            for member in group.members.values():
                self._schedule_heartbeat(member)
        self.runtime.wake()

    @staticmethod
    def validate_member(group: Group, member_id: str, group_instance_id: str | None) -> ErrorCode:
        """Kafka's ClassicGroup.validateMember: a static id must map to this member id, which must exist."""
        if group_instance_id is not None:
            existing = group.static_members.get(group_instance_id)
            if existing is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if existing != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE

    def _schedule_heartbeat(self, member: Member, timeout_ms: int | None = None) -> None:
        member.heartbeat_deadline = self.clock() + (timeout_ms or member.session_timeout_ms) / 1000
        self.runtime.wake(at=member.heartbeat_deadline)

    def _set_join_deadline(self, group: Group, deadline: float) -> None:
        group.join_deadline = deadline
        self.runtime.wake(at=deadline)

    def _accepts_joining_member(self, group: Group, member_id: str) -> bool:
        """KIP-389 group.max.size, with Kafka's rules for members already in the group."""
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.state == GroupState.PREPARING_REBALANCE:
            member = group.members.get(member_id)
            awaiting = sum(1 for m in group.members.values() if m.awaiting_join)
            return (member is not None and member.awaiting_join) or awaiting < self.max_size
        return member_id in group.members or len(group.members) < self.max_size

    # --- joining ---------------------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
        supports_skip_assignment: bool = False,
    ) -> JoinResult:
        if not group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, member_id)
        if not self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms:
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        is_unknown_member = member_id == UNKNOWN_MEMBER_ID
        group = self.groups.get(group_id)
        if group is None:
            if not is_unknown_member:  # a member of a group that no longer exists: start over
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
            group = self.groups[group_id] = Group(group_id, state_since_ms=self.wall_clock_ms())
        if not self._accepts_joining_member(group, member_id):
            self._remove_member(group, member_id, JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER_ID))
            return JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER_ID)
        if group.state == GroupState.DEAD:
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        if not group.supports_protocols(protocol_type, [name for name, _ in protocols]):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        request = _JoinRequest(
            group_instance_id,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            protocols,
            supports_skip_assignment,
        )
        if is_unknown_member:
            new_id = f"{group_instance_id or client_id}-{uuid.uuid4()}"
            if group_instance_id is not None:
                old_id = group.static_members.get(group_instance_id)
                if old_id is not None:
                    return await self._replace_static_member(group, old_id, new_id, request)
            elif require_known_member_id:
                # KIP-394: hand out the id first, so a client that times out does not leave a ghost member.
                group.pending_members[new_id] = self.clock() + session_timeout_ms / 1000
                self.runtime.wake(at=group.pending_members[new_id])
                return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_id)
            return await self._add_member(group, new_id, request)
        if member_id in group.pending_members:
            if group_instance_id is not None:  # pending ids are only handed to dynamic members
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
            return await self._add_member(group, member_id, request)
        error = self.validate_member(group, member_id, group_instance_id)
        if error != ErrorCode.NONE:
            return JoinResult(error, member_id)
        member = group.members[member_id]
        if group.state == GroupState.PREPARING_REBALANCE:
            return await self._update_member(group, member, request)
        if group.state == GroupState.COMPLETING_REBALANCE:
            if member.protocols == protocols:
                # It lost the JoinGroup response: the current generation's answer again.
                return self._join_result(group, member)
            return await self._update_member(group, member, request)
        if group.state == GroupState.STABLE:
            if member_id == group.leader_id or member.protocols != protocols:
                # The leader rejoins to make the group rebalance (e.g. a subscribed topic gained partitions).
                return await self._update_member(group, member, request)
            self._schedule_heartbeat(member)
            return self._join_result(group, member)
        log.warning("group %s: member %s rejoins in state %s", group_id, member_id, group.state.value)
        return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)

    async def _add_member(self, group: Group, member_id: str, request: _JoinRequest) -> JoinResult:
        group.pending_members.pop(member_id, None)
        member = Member(
            member_id,
            request.group_instance_id,
            request.client_id,
            request.client_host,
            request.session_timeout_ms,
            request.rebalance_timeout_ms,
            request.protocol_type,
            request.protocols,
            is_new=True,
        )
        if group.state == GroupState.PREPARING_REBALANCE and group.previous_state == GroupState.EMPTY:
            group.new_member_added = True  # extends the initial rebalance delay
        if not group.members:
            group.protocol_type = request.protocol_type
        if group.leader_id is None:
            group.leader_id = member_id
        group.members[member_id] = member
        if request.group_instance_id is not None:
            group.static_members[request.group_instance_id] = member_id
        log.info("group %s: member %s joins", group.group_id, member_id)
        # A parked JoinGroup cannot heartbeat; it is bounded by the new-member timeout instead.
        self._schedule_heartbeat(member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        waiter = self._park_join(member)
        self._rebalance_or_complete_join(group, f"member {member_id} joins")
        return await self._join_response(member, waiter)

    async def _update_member(self, group: Group, member: Member, request: _JoinRequest) -> JoinResult:
        self._update(member, request)
        waiter = self._park_join(member)
        self._rebalance_or_complete_join(group, f"member {member.member_id} rejoins")
        return await self._join_response(member, waiter)

    @staticmethod
    def _update(member: Member, request: _JoinRequest) -> None:
        member.protocols = request.protocols
        member.session_timeout_ms = request.session_timeout_ms
        member.rebalance_timeout_ms = request.rebalance_timeout_ms
        member.client_id, member.client_host = request.client_id, request.client_host

    async def _replace_static_member(self, group: Group, old_id: str, new_id: str, request: _JoinRequest) -> JoinResult:
        """KIP-345: a static member coming back takes over its old member id's place and assignment."""
        assert request.group_instance_id is not None
        current_leader = group.leader_id or ""
        old = group.members.pop(old_id)
        # The old incarnation is fenced: anything it is still waiting for is answered now.
        self._finish_join(old, JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_id))
        self._finish_sync(old, SyncResult(ErrorCode.FENCED_INSTANCE_ID))
        member = Member(
            new_id,
            old.group_instance_id,
            old.client_id,
            old.client_host,
            old.session_timeout_ms,
            old.rebalance_timeout_ms,
            old.protocol_type,
            old.protocols,
            assignment=old.assignment,
        )
        group.members[new_id] = member
        group.static_members[request.group_instance_id] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(new_id)
        self._schedule_heartbeat(member)
        self._update(member, request)
        log.info("group %s: static member %s rejoins as %s", group.group_id, request.group_instance_id, new_id)
        if group.state == GroupState.STABLE:
            if group.select_protocol() == group.protocol_name:
                # Nothing the assignment depends on changed: no rebalance; the member syncs to get its share.
                if request.supports_skip_assignment:
                    # KIP-814 (JoinGroup v9): a returning leader learns it leads, and the members' metadata,
                    # but must not reassign.
                    is_leader = group.leader_id == new_id
                    result = self._join_result(group, member, with_members=is_leader)
                    result.skip_assignment = is_leader
                    return result
                # Older clients are told the old leader id, so a returning leader acts as a follower.
                result = self._join_result(group, member, with_members=False)
                result.leader = current_leader
                return result
            waiter = self._park_join(member)
            self._rebalance_or_complete_join(group, f"static member {new_id} changes the selected protocol")
            return await self._join_response(member, waiter)
        waiter = self._park_join(member)
        if group.state == GroupState.COMPLETING_REBALANCE:
            # The leader may already be assigning to the old member id: rebalance again.
            self._prepare_rebalance(group, f"static member {new_id} replaces {old_id}")
        else:
            self._maybe_complete_join_phase(group)
        return await self._join_response(member, waiter)

    @staticmethod
    def _park_join(member: Member) -> trio.Event:
        """The event the member's JoinGroup waits on (shared if the client sent the request twice)."""
        if member.join_waiter is None:
            member.join_waiter = trio.Event()
            member.join_result = None
        return member.join_waiter

    @staticmethod
    async def _join_response(member: Member, waiter: trio.Event) -> JoinResult:
        if not waiter.is_set():
            await waiter.wait()
        assert member.join_result is not None
        return member.join_result

    def _finish_join(self, member: Member, result: JoinResult) -> None:
        if member.join_waiter is not None:
            member.join_result = result
            waiter, member.join_waiter = member.join_waiter, None
            waiter.set()
            self.runtime.wake(at=member.heartbeat_deadline)  # no longer parked: its session counts again

    def _rebalance_or_complete_join(self, group: Group, reason: str) -> None:
        if group.state in (GroupState.EMPTY, GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, reason)
        else:
            self._maybe_complete_join_phase(group)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state == GroupState.COMPLETING_REBALANCE:
            # Members waiting for their assignment rejoin instead.
            for member in group.members.values():
                member.assignment = b""
                self._finish_sync(member, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        group.pending_sync.clear()
        group.sync_deadline = None
        initial = group.state == GroupState.EMPTY
        self._transition(group, GroupState.PREPARING_REBALANCE)
        log.info("group %s: preparing rebalance (generation %d): %s", group.group_id, group.generation_id, reason)
        now = self.clock()
        if initial:
            # A new group: wait for more members before the first generation.
            delay = self.initial_rebalance_delay_ms
            group.initial_delay_ms = delay
            group.initial_remaining_ms = max(group.rebalance_timeout_ms() - delay, 0)
            group.new_member_added = False
            self._set_join_deadline(group, now + delay / 1000)
            if delay == 0:
                self._on_join_deadline(group)
            return
        if group.has_all_members_joined():
            self._complete_join(group)
        else:
            self._set_join_deadline(group, now + group.rebalance_timeout_ms() / 1000)

    def _maybe_complete_join_phase(self, group: Group) -> None:
        # The first rebalance of an empty group only ends when its delay does.
        if (
            group.state == GroupState.PREPARING_REBALANCE
            and group.previous_state != GroupState.EMPTY
            and group.has_all_members_joined()
        ):
            self._complete_join(group)

    def _on_join_deadline(self, group: Group) -> None:
        if group.state != GroupState.PREPARING_REBALANCE:
            group.join_deadline = None
            return
        if group.previous_state == GroupState.EMPTY and group.new_member_added and group.initial_remaining_ms > 0:
            # Members are still arriving: wait another delay, within the rebalance timeout.
            group.new_member_added = False
            window = min(self.initial_rebalance_delay_ms, group.initial_remaining_ms)
            group.initial_remaining_ms = max(group.initial_remaining_ms - group.initial_delay_ms, 0)
            group.initial_delay_ms = window
            self._set_join_deadline(group, self.clock() + window / 1000)
            return
        self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        group.join_deadline = None
        for member in [m for m in group.members.values() if not m.awaiting_join and m.group_instance_id is None]:
            log.info("group %s: removing %s, which did not rejoin in time", group.group_id, member.member_id)
            self._remove_member(group, member.member_id)
        if group.members and not self._elect_joined_leader(group):
            # Only static members that have not rejoined are left: wait for them (or their session to end).
            log.warning("group %s: no member rejoined; waiting another rebalance timeout", group.group_id)
            self._set_join_deadline(group, self.clock() + group.rebalance_timeout_ms() / 1000)
            return
        group.generation_id += 1
        group.pending_sync.clear()
        if not group.members:
            group.protocol_name = None
            group.leader_id = None
            self._transition(group, GroupState.EMPTY)
            log.info("group %s: empty at generation %d", group.group_id, group.generation_id)
            self._store(group)
            return
        group.protocol_name = group.select_protocol()
        self._transition(group, GroupState.COMPLETING_REBALANCE)
        log.info(
            "group %s: generation %d with %d member(s), protocol %s",
            group.group_id,
            group.generation_id,
            len(group.members),
            group.protocol_name,
        )
        for member in group.members.values():
            member.assignment = b""
            self._finish_join(member, self._join_result(group, member))
            self._schedule_heartbeat(member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        group.sync_deadline = self.clock() + group.rebalance_timeout_ms() / 1000
        self.runtime.wake(at=group.sync_deadline)

    @staticmethod
    def _elect_joined_leader(group: Group) -> bool:
        """Keep the leader if it rejoined, else pick one that did; False if no member rejoined."""
        leader = group.members.get(group.leader_id) if group.leader_id is not None else None
        if leader is not None and leader.awaiting_join:
            return True
        for member in group.members.values():
            if member.awaiting_join:
                group.leader_id = member.member_id
                return True
        return False

    def _join_result(self, group: Group, member: Member, with_members: bool | None = None) -> JoinResult:
        if with_members is None:
            with_members = member.member_id == group.leader_id
        members = []
        if with_members and group.protocol_name is not None:
            members = [
                (m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name)) for m in group.members.values()
            ]
        return JoinResult(
            ErrorCode.NONE,
            member.member_id,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            members,
        )

    # --- syncing ---------------------------------------------------------------------------------------

    async def sync(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> SyncResult:
        group = self.groups.get(group_id)
        if group is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state == GroupState.DEAD:
            return SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        error = self.validate_member(group, member_id, group_instance_id)
        if error != ErrorCode.NONE:
            return SyncResult(error)
        if generation_id != group.generation_id:
            return SyncResult(ErrorCode.ILLEGAL_GENERATION)
        # SyncGroup v5 carries what the member believes; a mismatch with the group is an error.
        if _inconsistent(protocol_type, group.protocol_type) or _inconsistent(protocol_name, group.protocol_name):
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if group.state == GroupState.EMPTY:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state == GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        member = group.members[member_id]
        self._synced(group, member_id)
        if group.state == GroupState.STABLE:
            self._schedule_heartbeat(member)
            return self._sync_result(group, member)
        # CompletingRebalance: the leader's assignments complete it; everyone else waits for them.
        if member.sync_waiter is None:
            member.sync_waiter = trio.Event()
            member.sync_result = None
        waiter = member.sync_waiter
        if member_id == group.leader_id:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            # The group stays CompletingRebalance until its assignment is committed (others' SyncGroups wait).
            error = await self._assignment_committed(group)
            # Meanwhile the group may have moved on (a member joined or left, it was unloaded): then whatever moved
            # it answered the waiting members, and this write is of a generation that is over.
            if self.groups.get(group_id) is group and group.state == GroupState.COMPLETING_REBALANCE:
                if group.generation_id == generation_id and error != ErrorCode.NONE:
                    for m in group.members.values():
                        m.assignment = b""
                        self._finish_sync(m, SyncResult(error))
                    self._rebalance_or_complete_join(group, f"error {error.name} when storing the group assignment")
                elif group.generation_id == generation_id:
                    self._transition(group, GroupState.STABLE)
                    log.info("group %s: stable at generation %d", group_id, group.generation_id)
                    for m in group.members.values():
                        if m.awaiting_sync:
                            self._finish_sync(m, self._sync_result(group, m))
                            self._schedule_heartbeat(m)
        if not waiter.is_set():
            await waiter.wait()
        assert member.sync_result is not None
        return member.sync_result

    @staticmethod
    def _synced(group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            group.sync_deadline = None

    @staticmethod
    def _sync_result(group: Group, member: Member) -> SyncResult:
        return SyncResult(ErrorCode.NONE, member.assignment, group.protocol_type, group.protocol_name)

    def _finish_sync(self, member: Member, result: SyncResult) -> None:
        if member.sync_waiter is not None:
            member.sync_result = result
            waiter, member.sync_waiter = member.sync_waiter, None
            waiter.set()
            self.runtime.wake(at=member.heartbeat_deadline)  # no longer parked: its session counts again

    # --- heartbeats, leaving, expiry ------------------------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self.validate_member(group, member_id, group_instance_id)
        if error != ErrorCode.NONE:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if group.state == GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._schedule_heartbeat(group.members[member_id])
        if group.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group_id: str, leaving: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        """LeaveGroup for (member id, group instance id) pairs: the top-level error and one per member."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(leaving)
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        codes = []
        anyone_left = False
        for member_id, instance_id in leaving:
            if member_id == UNKNOWN_MEMBER_ID:
                # An administrator removing a static member by its instance id (KIP-345).
                current = group.static_members.get(instance_id) if instance_id is not None else None
                if current is None:
                    codes.append(ErrorCode.UNKNOWN_MEMBER_ID)
                    continue
                member_id = current
            elif member_id in group.pending_members:
                del group.pending_members[member_id]
                codes.append(ErrorCode.NONE)
                continue
            else:
                error = self.validate_member(group, member_id, instance_id)
                if error != ErrorCode.NONE:
                    codes.append(error)
                    continue
            log.info("group %s: member %s leaves", group_id, member_id)
            self._remove_member(group, member_id)
            codes.append(ErrorCode.NONE)
            anyone_left = True
        if anyone_left:
            if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                self._prepare_rebalance(group, "members left")
            else:
                self._maybe_complete_join_phase(group)
        return ErrorCode.NONE, codes

    async def leave_committed(
        self, group_id: str, leaving: list[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        """``leave``, answered as Kafka's LeaveGroup, a coordinator write answered once its records are committed:
        if the members' leaving left the group Empty, once its new generation is (a failover then cannot bring
        back members that left). If that cannot be committed, the request's error as Kafka maps it, without
        per-member answers; the members are gone from memory all the same (Kafka does not undo a write whose
        commit failed)."""
        self._last_written = -1
        top, codes = self.leave(group_id, leaving)
        written, self._last_written = self._last_written, -1
        group = self.groups.get(group_id)
        if written >= 0 and group is not None:
            error = await self._committed(group, written)
            if error != ErrorCode.NONE:
                return error, []
        return top, codes

    def _remove_member(self, group: Group, member_id: str, answer: JoinResult | None = None) -> None:
        member = group.members.pop(member_id, None)
        group.pending_members.pop(member_id, None)
        group.pending_sync.discard(member_id)
        if member is None:
            return
        if member.group_instance_id is not None and group.static_members.get(member.group_instance_id) == member_id:
            del group.static_members[member.group_instance_id]
        # A parked request is answered, so the client (if still there) starts over.
        self._finish_join(member, answer or JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER_ID))
        self._finish_sync(member, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        if group.leader_id == member_id:
            group.leader_id = next(iter(group.members), None)

    def _expire_member(self, group: Group, member: Member) -> None:
        log.info("group %s: member %s session expired", group.group_id, member.member_id)
        self._remove_member(group, member.member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"session of {member.member_id} expired")
        elif group.state == GroupState.PREPARING_REBALANCE and group.has_all_members_joined():
            self._complete_join(group)

    @staticmethod
    def _session_counts(member: Member) -> bool:
        """Members parked in JoinGroup/SyncGroup cannot heartbeat; only new ones time out meanwhile."""
        return member.is_new or not (member.awaiting_join or member.awaiting_sync)

    @staticmethod
    def _sync_deadline(group: Group) -> float | None:
        """When members yet to send SyncGroup are removed; only while the group waits for them."""
        if group.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return group.sync_deadline
        return None

    def tick(self, now: float | None = None) -> None:
        """Fire every timer that is due at ``now`` (default: the clock): pending ids, sessions, the join phase
        and the sync phase."""
        if now is None:
            now = self.clock()
        for group in list(self.groups.values()):
            for pending, deadline in list(group.pending_members.items()):
                if deadline <= now:
                    del group.pending_members[pending]
                    if group.state == GroupState.PREPARING_REBALANCE and group.has_all_members_joined():
                        self._complete_join(group)
            for member in list(group.members.values()):
                if member.member_id not in group.members or member.heartbeat_deadline > now:
                    continue
                if self._session_counts(member):
                    self._expire_member(group, member)
            if group.join_deadline is not None and now >= group.join_deadline:
                self._on_join_deadline(group)
            sync_deadline = self._sync_deadline(group)
            if sync_deadline is not None and now >= sync_deadline:
                group.sync_deadline = None
                stragglers = sorted(group.pending_sync)
                if stragglers:
                    log.info("group %s: removing %s, which did not sync in time", group.group_id, stragglers)
                    for member_id in stragglers:
                        self._remove_member(group, member_id)
                    self._prepare_rebalance(group, "members did not send SyncGroup in time")

    def next_deadline(self, now: float) -> float | None:
        """When ``tick`` next has something to do (the timers it fires, with the same conditions), or None."""
        deadlines: list[float] = []
        for group in self.groups.values():
            deadlines.extend(group.pending_members.values())
            deadlines.extend(m.heartbeat_deadline for m in group.members.values() if self._session_counts(m))
            if group.join_deadline is not None:
                deadlines.append(group.join_deadline)
            sync_deadline = self._sync_deadline(group)
            if sync_deadline is not None:
                deadlines.append(sync_deadline)
        return min(deadlines, default=None)

    # --- offsets, administration ------------------------------------------------------------------------

    def validate_offset_commit(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        api_version: int,
        group_has_offsets: bool,
    ) -> ErrorCode:
        """Kafka's OffsetCommit checks for a classic group (or a group that only stores offsets)."""
        group = self.groups.get(group_id)
        if group is None and not group_has_offsets:
            if generation_id < 0:
                return ErrorCode.NONE  # a "simple" group: assign() consumers and admin tools
            # OffsetCommit v9 says so; older versions answer ILLEGAL_GENERATION, which clients also handle.
            return ErrorCode.GROUP_ID_NOT_FOUND if api_version >= 9 else ErrorCode.ILLEGAL_GENERATION
        if group is None:  # known only by its offsets: an empty group without members
            return ErrorCode.NONE if generation_id < 0 else ErrorCode.UNKNOWN_MEMBER_ID
        if group.state == GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.state == GroupState.EMPTY:
            return ErrorCode.NONE
        if generation_id >= 0 or member_id or group_instance_id is not None:
            error = self.validate_member(group, member_id, group_instance_id)
            if error != ErrorCode.NONE:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.ILLEGAL_GENERATION
        elif group.state != GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID  # only members may commit while the group has members
        if group.state == GroupState.COMPLETING_REBALANCE:
            # Its generation is current but it has no assignment yet: rejoin and sync first.
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def offset_expiry_base_ms(self, group_id: str) -> int | None:
        """When an empty group's offsets start to age (KIP-211), or None to age each from its commit.

        A group that had members ages from the moment it became Empty (kept across restarts in its GroupMetadata
        record). A group with no such record (only offsets: a "simple" group, or one written by an older kbroker)
        ages at the earliest from start-up, so a restart never makes offsets expire sooner than Kafka would.
        """
        group = self.groups.get(group_id)
        if group is None:
            return self.started_ms
        if group.state != GroupState.EMPTY:
            return None
        return group.state_since_ms if group.protocol_type else None

    def delete(self, group_id: str) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is not None and group.members:
            return ErrorCode.NON_EMPTY_GROUP
        if group is not None:
            self._transition(group, GroupState.DEAD)
            del self.groups[group_id]
            if self.store is not None:
                try:
                    self.store.remove_group(group_id)  # DeleteGroups waits for its commit (kbroker.groups.router)
                except StorageError as exc:  # logged by the store; the group may come back after a restart, empty
                    log.warning("group %s: its deletion was not written: %s", group_id, exc)
        return ErrorCode.NONE

    def unload(self, belongs: Callable[[str], bool]) -> None:
        """This broker stopped coordinating the groups ``belongs`` says are in an unloaded partition: they go
        from memory, as Kafka's onUnloaded, and a JoinGroup or SyncGroup parked in one is answered
        NOT_COORDINATOR so its client finds the new coordinator."""
        for group_id in [g for g in self.groups if belongs(g)]:
            group = self.groups.pop(group_id)
            for member in group.members.values():
                self._finish_join(member, JoinResult(ErrorCode.NOT_COORDINATOR, member.member_id))
                self._finish_sync(member, SyncResult(ErrorCode.NOT_COORDINATOR))

    def has_members(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    def release_group_id(self, group_id: str, *, release: bool) -> bool:
        """For the consumer group coordinator (kbroker.groups.consumer_group.OtherGroupKinds): whether
        ``group_id`` may become a consumer group's. A group with members keeps its id; with ``release``, an empty
        group of that id is deleted (its committed offsets are not the coordinator's and stay)."""
        if self.has_members(group_id):
            return False
        if release:
            self.delete(group_id)
        return True

    def forget_empty_groups(self, keep: Callable[[str], bool]) -> list[str]:
        """Kafka's periodic clean-up: Empty groups with nothing left (no offsets) become Dead and go."""
        gone = [
            group_id
            for group_id, group in self.groups.items()
            if group.state == GroupState.EMPTY and not group.pending_members and not keep(group_id)
        ]
        for group_id in gone:
            self.delete(group_id)
        return gone

    def wake_all(self) -> None:
        """At shutdown: answer every waiting JoinGroup/SyncGroup so connections can drain.

        NOT_COORDINATOR, as Kafka answers when a coordinator unloads its groups: clients look for the
        coordinator again and rejoin there.
        """
        for group in self.groups.values():
            for member in group.members.values():
                self._finish_join(member, JoinResult(ErrorCode.NOT_COORDINATOR, member.member_id))
                self._finish_sync(member, SyncResult(ErrorCode.NOT_COORDINATOR))


@dataclass(slots=True)
class _JoinRequest:
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    supports_skip_assignment: bool


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current
