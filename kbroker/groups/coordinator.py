"""The classic consumer group coordinator: membership, rebalances and generations.

Kafka's state machine (KIP-62, KIP-345, KIP-394):

    Empty ──join──▶ PreparingRebalance ──all joined / timeout──▶ CompletingRebalance ──leader syncs──▶ Stable
      ▲                   ▲                                            │                                  │
      └── last member ────┴──────── join, leave, expiry ───────────────┴──────────────────────────────────┘

A JoinGroup waits until every known member has rejoined (or the rebalance timeout passes, and the
stragglers are removed); then a new generation starts, the leader receives every member's metadata and
assigns partitions in the client, and SyncGroup hands each member its share. Members that stop
heartbeating are removed after their session timeout. Assignors run in the clients, so eager and
cooperative rebalancing both work unchanged.

Waiting is done with trio events; a single background task (``run``) handles every timeout.
"""

from __future__ import annotations

import logging
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import trio

from protocol.errors import ErrorCode

log = logging.getLogger("kbroker.groups")

TICK_SECONDS = 0.05


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
    join_waiter: trio.Event | None = None
    join_result: JoinResult | None = None
    sync_waiter: trio.Event | None = None
    sync_result: SyncResult | None = None
    rejoined: bool = False  # has sent JoinGroup in the current rebalance

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    @property
    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


@dataclass(slots=True)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_members: dict[str, float] = field(default_factory=dict)  # KIP-394 ids handed out, with deadline
    rebalance_deadline: float = 0.0
    initial_delay_until: float = 0.0

    def select_protocol(self) -> str | None:
        """The protocol every member supports, preferring the members' most-preferred ones (Kafka's vote)."""
        candidates = None
        for member in self.members.values():
            names = set(member.protocol_names)
            candidates = names if candidates is None else candidates & names
        if not candidates:
            return None
        votes: dict[str, int] = {}
        for member in self.members.values():
            preferred = next(name for name in member.protocol_names if name in candidates)
            votes[preferred] = votes.get(preferred, 0) + 1
        return max(sorted(votes), key=lambda name: votes[name])

    def supports_protocols(self, protocol_type: str, protocols: list[str]) -> bool:
        if not self.members:
            return bool(protocols)
        if protocol_type != self.protocol_type:
            return False
        common = set(protocols)
        for member in self.members.values():
            common &= set(member.protocol_names)
        return bool(common)

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


class GroupCoordinator:
    def __init__(
        self,
        *,
        min_session_timeout_ms: int,
        max_session_timeout_ms: int,
        initial_rebalance_delay_ms: int,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.groups: dict[str, Group] = {}
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.initial_rebalance_delay = initial_rebalance_delay_ms / 1000
        self.clock = clock

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
    ) -> JoinResult:
        if not group_id:
            return JoinResult(ErrorCode.INVALID_GROUP_ID, member_id)
        if not self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms:
            return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, member_id)
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        if group.state == GroupState.DEAD:
            return JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
        if not group.supports_protocols(protocol_type, [name for name, _ in protocols]):
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
        now = self.clock()

        if member_id == "":
            if group_instance_id is not None and group_instance_id in group.static_members:
                return await self._rejoin_static(
                    group,
                    group_instance_id,
                    client_id,
                    client_host,
                    session_timeout_ms,
                    rebalance_timeout_ms,
                    protocol_type,
                    protocols,
                )
            new_id = f"{group_instance_id or client_id}-{uuid.uuid4()}"
            if require_known_member_id and group_instance_id is None:
                # KIP-394: hand out the id first, so a client that times out does not leave a ghost member.
                group.pending_members[new_id] = now + session_timeout_ms / 1000
                return JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_id)
            member_id = new_id
        else:
            member = group.members.get(member_id)
            if member is None and member_id not in group.pending_members:
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
            if member is not None and group_instance_id is not None and member.group_instance_id != group_instance_id:
                return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id)
            if group_instance_id is not None and group.static_members.get(group_instance_id, member_id) != member_id:
                return JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id)
        group.pending_members.pop(member_id, None)

        member = group.members.get(member_id)
        if member is None:
            member = Member(
                member_id,
                group_instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                protocols,
            )
            group.members[member_id] = member
            if group_instance_id is not None:
                group.static_members[group_instance_id] = member_id
            if group.protocol_type is None:
                group.protocol_type = protocol_type
            log.info("group %s: member %s joins", group_id, member_id)
        elif group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE) and (
            member.protocols == protocols and member_id != group.leader_id
        ):
            # A follower rejoining with nothing changed: answer with the current generation at once.
            if group.state == GroupState.STABLE or member.rejoined:
                member.heartbeat_deadline = now + member.session_timeout_ms / 1000
                return self._join_result(group, member)
        member.protocols = protocols
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.client_id, member.client_host = client_id, client_host
        return await self._wait_for_join(group, member)

    async def _rejoin_static(
        self,
        group: Group,
        instance_id: str,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
    ) -> JoinResult:
        """KIP-345: a static member coming back replaces its old member id, without a rebalance if possible."""
        old_id = group.static_members[instance_id]
        old = group.members.pop(old_id)
        new_id = f"{instance_id}-{uuid.uuid4()}"
        member = Member(
            new_id,
            instance_id,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            protocols,
            assignment=old.assignment,
        )
        group.members[new_id] = member
        group.static_members[instance_id] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        # The old incarnation's pending requests are fenced.
        for waiter_kind in ("join", "sync"):
            event = getattr(old, f"{waiter_kind}_waiter")
            if event is not None:
                if waiter_kind == "join":
                    old.join_result = JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_id)
                else:
                    old.sync_result = SyncResult(ErrorCode.FENCED_INSTANCE_ID)
                event.set()
        log.info("group %s: static member %s rejoins as %s", group.group_id, instance_id, new_id)
        if group.state == GroupState.STABLE and old.protocols == protocols:
            member.heartbeat_deadline = self.clock() + session_timeout_ms / 1000
            result = self._join_result(group, member)
            result.skip_assignment = group.leader_id == new_id
            if group.leader_id == new_id:
                result.members = []  # the leader must not reassign: nothing changed
            return result
        return await self._wait_for_join(group, member)

    async def _wait_for_join(self, group: Group, member: Member) -> JoinResult:
        member.rejoined = True
        member.join_waiter = trio.Event()
        member.join_result = None
        waiter = member.join_waiter
        if group.state != GroupState.PREPARING_REBALANCE:
            self._prepare_rebalance(group, f"member {member.member_id} joining")
        elif group.initial_delay_until:
            # Each new member of a starting group extends the delay, up to the rebalance timeout.
            group.initial_delay_until = min(self.clock() + self.initial_rebalance_delay, group.rebalance_deadline)
        self._maybe_complete_join(group)
        await waiter.wait()
        assert member.join_result is not None
        return member.join_result

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state == GroupState.COMPLETING_REBALANCE:
            for member in group.members.values():
                member.assignment = b""
                self._finish_sync(member, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        now = self.clock()
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000
        group.rebalance_deadline = now + timeout
        group.initial_delay_until = 0.0
        if group.state == GroupState.EMPTY and self.initial_rebalance_delay > 0:
            group.initial_delay_until = min(now + self.initial_rebalance_delay, group.rebalance_deadline)
        group.state = GroupState.PREPARING_REBALANCE
        for member in group.members.values():
            if member.join_waiter is None:
                member.rejoined = False
        log.info("group %s: preparing rebalance (generation %d): %s", group.group_id, group.generation_id, reason)

    def _maybe_complete_join(self, group: Group, force: bool = False) -> None:
        if group.state != GroupState.PREPARING_REBALANCE:
            return
        now = self.clock()
        if group.initial_delay_until and now < group.initial_delay_until and not force:
            return
        if not force and not all(m.rejoined for m in group.members.values()):
            return
        for member in [m for m in group.members.values() if not m.rejoined]:
            log.info("group %s: removing %s, which did not rejoin in time", group.group_id, member.member_id)
            self._remove_member(group, member)
        group.initial_delay_until = 0.0
        group.generation_id += 1
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol_name = None
            group.leader_id = None
            group.protocol_type = None
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.state = GroupState.COMPLETING_REBALANCE
        log.info(
            "group %s: generation %d with %d member(s), protocol %s",
            group.group_id,
            group.generation_id,
            len(group.members),
            group.protocol_name,
        )
        for member in group.members.values():
            member.heartbeat_deadline = now + member.session_timeout_ms / 1000
            member.assignment = b""
            result = self._join_result(group, member)
            member.join_result = result
            if member.join_waiter is not None:
                member.join_waiter.set()
                member.join_waiter = None

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        members = []
        if member.member_id == group.leader_id and group.protocol_name is not None:
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
        if group is None or member_id not in group.members:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        member = group.members[member_id]
        if group_instance_id is not None and member.group_instance_id != group_instance_id:
            return SyncResult(ErrorCode.FENCED_INSTANCE_ID)
        if generation_id != group.generation_id:
            return SyncResult(ErrorCode.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if group.state == GroupState.PREPARING_REBALANCE:
            return SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        member.heartbeat_deadline = self.clock() + member.session_timeout_ms / 1000
        if group.state == GroupState.STABLE:
            return self._sync_result(group, member)
        # CompletingRebalance: the leader's assignments complete it; everyone else waits for them.
        if member_id == group.leader_id:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.state = GroupState.STABLE
            log.info("group %s: stable at generation %d", group_id, group.generation_id)
            for m in group.members.values():
                if m.sync_waiter is not None:
                    self._finish_sync(m, self._sync_result(group, m))
            return self._sync_result(group, member)
        member.sync_waiter = trio.Event()
        member.sync_result = None
        waiter = member.sync_waiter
        await waiter.wait()
        assert member.sync_result is not None
        return member.sync_result

    def _sync_result(self, group: Group, member: Member) -> SyncResult:
        return SyncResult(ErrorCode.NONE, member.assignment, group.protocol_type, group.protocol_name)

    @staticmethod
    def _finish_sync(member: Member, result: SyncResult) -> None:
        if member.sync_waiter is not None:
            member.sync_result = result
            member.sync_waiter.set()
            member.sync_waiter = None

    # --- heartbeats, leaving, expiry ------------------------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        member = group.members[member_id]
        if group_instance_id is not None and member.group_instance_id != group_instance_id:
            return ErrorCode.FENCED_INSTANCE_ID
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        member.heartbeat_deadline = self.clock() + member.session_timeout_ms / 1000
        if group.state == GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group_id: str, member_id: str, group_instance_id: str | None) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_id == "" and group_instance_id is not None:
            member_id = group.static_members.get(group_instance_id, "")
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group_instance_id is not None and member.group_instance_id != group_instance_id:
            return ErrorCode.FENCED_INSTANCE_ID
        log.info("group %s: member %s leaves", group_id, member_id)
        self._member_gone(group, member, "member left")
        return ErrorCode.NONE

    def _remove_member(self, group: Group, member: Member) -> None:
        group.members.pop(member.member_id, None)
        if (
            member.group_instance_id is not None
            and group.static_members.get(member.group_instance_id) == member.member_id
        ):
            del group.static_members[member.group_instance_id]
        if member.join_waiter is not None:
            member.join_result = JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member.member_id)
            member.join_waiter.set()
            member.join_waiter = None
        self._finish_sync(member, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        if group.leader_id == member.member_id:
            group.leader_id = next(iter(group.members), None)

    def _member_gone(self, group: Group, member: Member, reason: str) -> None:
        self._remove_member(group, member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            if group.members:
                self._prepare_rebalance(group, reason)
            else:
                group.state = GroupState.EMPTY
                group.generation_id += 1
                group.protocol_name = group.protocol_type = group.leader_id = None
        elif group.state == GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)

    def tick(self) -> None:
        """Expire silent members and finish rebalances whose time is up."""
        now = self.clock()
        for group in list(self.groups.values()):
            for pending, deadline in list(group.pending_members.items()):
                if deadline <= now:
                    del group.pending_members[pending]
            if group.state == GroupState.PREPARING_REBALANCE:
                if now >= group.rebalance_deadline:
                    self._maybe_complete_join(group, force=True)
                elif group.initial_delay_until and now >= group.initial_delay_until:
                    self._maybe_complete_join(group)
                continue
            for member in list(group.members.values()):
                if member.heartbeat_deadline <= now and member.join_waiter is None and member.sync_waiter is None:
                    log.info("group %s: member %s session expired", group.group_id, member.member_id)
                    self._member_gone(group, member, f"session of {member.member_id} expired")

    async def run(self) -> None:
        while True:
            await trio.sleep(TICK_SECONDS)
            self.tick()

    # --- administration -------------------------------------------------------------------------------

    def state_of(self, group_id: str) -> GroupState | None:
        group = self.groups.get(group_id)
        return group.state if group is not None else None

    def delete(self, group_id: str) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is not None and group.members:
            return ErrorCode.NON_EMPTY_GROUP
        self.groups.pop(group_id, None)
        return ErrorCode.NONE

    def wake_all(self) -> None:
        """At shutdown: answer every waiting JoinGroup/SyncGroup so connections can drain."""
        for group in self.groups.values():
            if group.state == GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join(group, force=True)
            for member in group.members.values():
                self._finish_sync(member, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
