"""Consumer groups of the new consumer group protocol (KIP-848): ConsumerGroupHeartbeat's state machine.

The broker assigns partitions; members only heartbeat. Three epochs drive it:

- the *group epoch* is bumped whenever the group's makeup changes: a member joins, leaves or is fenced,
  a subscription changes, or a subscribed topic appears, disappears or gains partitions;
- the *assignment epoch* is the group epoch the current *target assignment* was computed for (by the
  ``uniform`` or ``range`` assignor, assignors.py); it catches up on the next heartbeat after a bump;
- each *member epoch* says which target assignment the member has reconciled to.

Reconciliation (Kafka's CurrentAssignmentBuilder) moves each member towards its target, one heartbeat
at a time, so that no partition is ever owned by two members:

    STABLE ──new target──▶ UNREVOKED_PARTITIONS ──owner stops reporting them──▶ (next epoch)
       │                                                                            │
       └──────────▶ UNRELEASED_PARTITIONS ◀── target partitions still owned elsewhere ┘

A member first keeps ``current ∩ target``; partitions it must give up are *pending revocation* and it
stays at its epoch until a heartbeat no longer lists them among its owned partitions; partitions it
should gain are handed over only once no other member owns them (their *partition epoch* is free).
Members that stop heartbeating are removed after the session timeout; members that do not revoke
within their rebalance timeout are removed too. Those timers fire in ``tick``, called at ``next_deadline`` by
the CoordinatorTimers (kbroker.groups.timers) the coordinator registers with.

Group ids are shared with classic groups: an id held by a classic group with members is not taken over, an
empty classic group gives its id up. The coordinator asks through a one-method interface (OtherGroupKinds),
never by looking into the classic coordinator's groups.

A regex subscription resolves, on every heartbeat, to the existing topics it matches that the principal which
sent it may DESCRIBE (Kafka 4.3 never assigns a regex member a topic it could not describe itself).

The group state is derived, as in Kafka: Empty (no members), Assigning (group epoch ahead of the
assignment epoch), Reconciling (some member not at the target), Stable.

As Kafka, the group is kept in ``__consumer_offsets`` as ConsumerGroup* records (kbroker/groups/
consumer_group_records.py): each heartbeat, leave, expiry and deletion writes the records of what it changed (the
member's metadata, a regex's resolved topics, the group epoch, the target assignment's delta and epoch, the member's
current assignment, tombstones of a member or group that goes) as one batch through the coordinator runtime, and
the heartbeat is answered once they are committed. When ``__consumer_offsets`` is loaded the groups are rebuilt from
those records (``restore``): members keep their ids, epochs and partitions, and their session timers start again,
as Kafka's.
"""

from __future__ import annotations

import base64
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import trio

from kbroker.coordinators.runtime import CoordinatorRecord
from kbroker.durable.files import StorageError
from kbroker.groups import consumer_group_records as records
from kbroker.groups.assignors import ASSIGNORS, Assignor, MemberSpec, TopicAssignment, TopicMetadata
from kbroker.groups.timers import CoordinatorTimers
from protocol.errors import ErrorCode, KafkaError

log = logging.getLogger("kbroker.groups")

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
CONSUMER_GENERATED_MEMBER_ID_VERSION = 1  # KIP-1082: from v1 the client picks its member id
NO_OWNER = -1

OwnedPartitions = list[tuple[uuid.UUID, list[int]]]
TopicFilter = Callable[[str], bool]


class ConsumerGroupState(Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class MemberState(Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


# A member's state as Kafka's records number it (MemberState.value()), both ways.
_STATE_VALUES = {
    MemberState.STABLE: records.STATE_STABLE,
    MemberState.UNREVOKED_PARTITIONS: records.STATE_UNREVOKED_PARTITIONS,
    MemberState.UNRELEASED_PARTITIONS: records.STATE_UNRELEASED_PARTITIONS,
}
_STATES_BY_VALUE = {value: state for state, value in _STATE_VALUES.items()}


def new_member_id() -> str:
    """Kafka's Uuid.toString(): URL-safe base64 of a random UUID, without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _copy(assignment: TopicAssignment) -> TopicAssignment:
    return {topic_id: set(partitions) for topic_id, partitions in assignment.items() if partitions}


@dataclass(slots=True)
class ConsumerGroupMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: list[str] = field(default_factory=list)
    subscribed_topic_regex: str | None = None
    # Whether the principal that set the regex may DESCRIBE a topic: a regex resolves only to those (None: all).
    may_describe_topic: TopicFilter | None = None
    regex_topics: frozenset[str] = frozenset()  # the existing topics the regex resolves to, as last resolved
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: TopicAssignment = field(default_factory=dict)
    pending_revocation: TopicAssignment = field(default_factory=dict)
    session_deadline: float = 0.0
    revocation_deadline: float | None = None  # set while in UNREVOKED_PARTITIONS
    revocation_epoch: int = 0  # the epoch the member must leave before revocation_deadline

    def update_epoch(self, epoch: int) -> None:
        self.previous_member_epoch = self.member_epoch
        self.member_epoch = epoch


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerGroupMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, TopicAssignment] = field(default_factory=dict)  # member id -> target assignment
    partition_epochs: dict[tuple[uuid.UUID, int], int] = field(default_factory=dict)  # owner's member epoch
    subscribed_metadata: dict[uuid.UUID, TopicMetadata] = field(default_factory=dict)
    # What the group's ConsumerGroupRegularExpression records hold: each subscribed regex's topics.
    resolved_regexes: dict[str, frozenset[str]] = field(default_factory=dict)

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch != self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for member in self.members.values():
            if member.state != MemberState.STABLE or member.member_epoch != self.assignment_epoch:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def partition_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        return self.partition_epochs.get((topic_id, partition), NO_OWNER)

    def subscribed_topic_names(self) -> set[str]:
        """Names of existing topics some member subscribes to (by name or regex), for OffsetDelete."""
        return {meta.name for meta in self.subscribed_metadata.values()}

    # Partition ownership: a partition is owned from the moment it is assigned until its owner no longer
    # has it assigned or pending revocation. Only unowned partitions can be given to another member.
    def _release(self, member: ConsumerGroupMember) -> None:
        for assignment in (member.assigned, member.pending_revocation):
            for topic_id, partitions in assignment.items():
                for partition in partitions:
                    self.partition_epochs.pop((topic_id, partition), None)

    def _claim(self, member: ConsumerGroupMember) -> None:
        for assignment in (member.assigned, member.pending_revocation):
            for topic_id, partitions in assignment.items():
                for partition in partitions:
                    key = (topic_id, partition)
                    owner_epoch = self.partition_epochs.get(key)
                    # Never two owners: a bug here must not hand a partition out twice silently.
                    assert owner_epoch is None, f"{self.group_id}: partition {key} is already owned"
                    self.partition_epochs[key] = member.member_epoch


@dataclass(frozen=True, slots=True)
class MemberHeartbeat:
    """One ConsumerGroupHeartbeat, as the coordinator needs it (None / -1: the field was not sent)."""

    version: int
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: list[str] | None = None
    subscribed_topic_regex: str | None = None
    # With a regex: whether the heartbeat's principal may DESCRIBE a topic (None: every topic, no authorizer).
    may_describe_topic: TopicFilter | None = None
    server_assignor: str | None = None
    owned: OwnedPartitions | None = None
    client_id: str = ""
    client_host: str = ""


@dataclass(slots=True)
class HeartbeatResult:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: TopicAssignment | None = None  # None: unchanged, not sent
    written_offset: int = -1  # the offset after the records it wrote (-1: none), to await before answering


class ConsumerGroupStore(Protocol):
    """Where a consumer group's records are written (kbroker/groups/offsets.py: its __consumer_offsets partition)."""

    def write_consumer_group(self, group_id: str, records: list[CoordinatorRecord]) -> int:
        """Append the records as one batch; the offset after them. StorageError, nothing written, on failure."""
        ...

    async def committed(self, group: str, end_offset: int) -> None:
        """Return once the write that returned ``end_offset`` is committed (KafkaError if it cannot be)."""
        ...

    def stored_consumer_group(self, group_id: str) -> records.StoredConsumerGroup | None:
        """The group as its records left it (what a load would rebuild)."""
        ...


class OtherGroupKinds(Protocol):
    """The rest of the group id namespace, asked before an id that is not a consumer group becomes one.

    The classic coordinator (kbroker.groups.coordinator.GroupCoordinator) answers for its groups.
    """

    def release_group_id(self, group_id: str, *, release: bool) -> bool:
        """False if a group with members holds ``group_id``. Otherwise True, and with ``release`` a memberless
        group of that id is dropped (its committed offsets stay) so the id is free."""
        ...


class ConsumerGroupCoordinator:
    def __init__(
        self,
        *,
        topics: Callable[[], Iterable[TopicMetadata]],
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        max_size: int,
        assignors: Iterable[str],
        classic: OtherGroupKinds | None = None,
        clock: Callable[[], float] = trio.current_time,
        runtime: CoordinatorTimers | None = None,
        group_configs: Callable[[str], Mapping[str, str]] | None = None,
        store: ConsumerGroupStore | None = None,
        wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        authorizing: Callable[[], bool] = lambda: False,
    ) -> None:
        """``session_timeout_ms``, ``heartbeat_interval_ms``: the broker's defaults; ``group_configs`` gives a
        group's own configs (Kafka's GroupConfig: consumer.session.timeout.ms, consumer.heartbeat.interval.ms),
        read at each heartbeat so a change applies at the member's next one, as in Kafka. ``store``: where each
        change's records are written (None: memory only, unit tests). ``authorizing``: whether an authorizer
        decides which topics a regex may resolve to (a restored regex member is then held to its stored topics
        until it sends its regex, and so its principal's rights, again)."""
        self.authorizing = authorizing
        self.group_configs = group_configs
        self.store = store
        self.wall_clock_ms = wall_clock_ms
        # The records of the operation under way, by group, written together when it ends (``_write``).
        self._records: dict[str, list[CoordinatorRecord]] = {}
        # Groups a write failed for: memory is ahead of the log, so their next write rewrites them whole.
        self._unwritten: set[str] = set()
        self.groups: dict[str, ConsumerGroup] = {}
        self._topics = topics
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_size = max_size
        self.assignors: dict[str, Assignor] = {name: ASSIGNORS[name] for name in assignors}
        self.default_assignor = next(iter(self.assignors))
        self.classic = classic
        self.clock = clock
        self._regex_cache: dict[str, re.Pattern[str]] = {}
        # The timer service that ticks this coordinator; without one (unit tests) the caller calls tick().
        self.runtime = runtime if runtime is not None else CoordinatorTimers()
        self.runtime.register(self)

    def _group_setting(self, group_id: str, name: str) -> int:
        """A group's session timeout or heartbeat interval: its group config, else the broker's default."""
        if self.group_configs is not None:
            value = self.group_configs(group_id).get(name)
            if value is not None and value.strip().isdigit():  # validated when set (kbroker/dynamic_config.py)
                return int(value)
        return self.session_timeout_ms if name == "consumer.session.timeout.ms" else self.heartbeat_interval_ms

    # --- the heartbeat --------------------------------------------------------------------------------

    def heartbeat(self, request: MemberHeartbeat) -> HeartbeatResult:
        """Apply the heartbeat and write its records (not yet waiting for them to be committed: the caller awaits
        ``committed``, as ``heartbeat_committed`` does)."""
        try:
            self._validate(request)
            if request.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
                result = self._leave(request.group_id, request.member_id, request.member_epoch, request.instance_id)
            else:
                result = self._heartbeat(request)
        except KafkaError as error:
            result = HeartbeatResult(error.code, error.message)
        try:
            written = self._write()
        except KafkaError as error:  # the change stays in memory and is rewritten whole by the group's next write
            return HeartbeatResult(error.code, error.message)
        result.written_offset = written.get(request.group_id, -1)
        return result

    async def heartbeat_committed(self, request: MemberHeartbeat) -> HeartbeatResult:
        """``heartbeat``, answered once its records are committed (Kafka answers after the append commits)."""
        result = self.heartbeat(request)
        if result.written_offset >= 0 and self.store is not None:
            try:
                await self.store.committed(request.group_id, result.written_offset)
            except KafkaError as error:
                return HeartbeatResult(error.code, error.message)
        return result

    # --- records ----------------------------------------------------------------------------------------

    def _emit(self, group_id: str, *group_records: CoordinatorRecord) -> None:
        if self.store is not None:
            self._records.setdefault(group_id, []).extend(group_records)

    def _write(self) -> dict[str, int]:
        """Write each group's records of the operation as one batch; the offset after each group's.

        KafkaError NOT_COORDINATOR (as Kafka answers a failed append to __consumer_offsets) if one failed: that
        group's state in memory is then ahead of its log, and its next write rewrites it whole."""
        pending, self._records = self._records, {}
        if self.store is None:
            return {}
        written: dict[str, int] = {}
        failed: KafkaError | None = None
        for group_id, group_records in pending.items():
            if group_id in self._unwritten:  # the whole group first, then this operation's change again
                group_records = self._rewrite(group_id) + group_records
            try:
                written[group_id] = self.store.write_consumer_group(group_id, group_records)
            except StorageError as exc:
                log.warning("group %s: %d record(s) were not written: %s", group_id, len(group_records), exc)
                self._unwritten.add(group_id)
                failed = KafkaError(ErrorCode.NOT_COORDINATOR, f"the group's change was not written: {exc}")
                continue
            self._unwritten.discard(group_id)
        if failed is not None:
            raise failed
        return written

    def _rewrite(self, group_id: str) -> list[CoordinatorRecord]:
        """Every record of the group as it is in memory, after the tombstones of what its log has and memory no
        longer does (a group deleted, a member gone): the log is made to match memory again."""
        assert self.store is not None
        stored = self.store.stored_consumer_group(group_id)
        group = self.groups.get(group_id)
        if group is None:
            if stored is None:
                return records.group_tombstones(group_id)
            regex_tombstones = [records.regex_tombstone(group_id, r) for r in stored.regexes]
            return regex_tombstones + records.group_tombstones(group_id, stored.members)
        written: list[CoordinatorRecord] = []
        if stored is not None:
            for member_id in set(stored.members) | set(stored.current) | set(stored.targets):
                if member_id not in group.members:
                    written.extend(records.member_tombstones(group_id, member_id))
        for member in group.members.values():
            written.append(self._member_metadata_record(group_id, member))
        if stored is not None:
            written.extend(
                records.regex_tombstone(group_id, r) for r in stored.regexes if r not in group.resolved_regexes
            )
        now_ms = self.wall_clock_ms()
        written.extend(records.regex_record(group_id, r, t, now_ms) for r, t in group.resolved_regexes.items())
        written.append(self._group_epoch_record(group))
        written.extend(records.target_assignment_record(group_id, m, t) for m, t in group.target.items())
        written.append(records.target_assignment_epoch_record(group_id, group.assignment_epoch, self.wall_clock_ms()))
        for member in group.members.values():
            written.append(self._current_assignment_record(group_id, member))
        return written

    def _write_regexes(self, group: ConsumerGroup) -> None:
        """The records of the regexes whose resolution changed, and tombstones of those no member uses now."""
        if self.store is None:
            return
        resolved = {
            m.subscribed_topic_regex: m.regex_topics for m in group.members.values() if m.subscribed_topic_regex
        }
        if resolved == group.resolved_regexes:
            return
        now_ms = self.wall_clock_ms()
        for regex, topics in resolved.items():
            if group.resolved_regexes.get(regex) != topics:
                self._emit(group.group_id, records.regex_record(group.group_id, regex, topics, now_ms))
        for regex in group.resolved_regexes.keys() - resolved.keys():
            self._emit(group.group_id, records.regex_tombstone(group.group_id, regex))
        group.resolved_regexes = resolved

    @staticmethod
    def _group_epoch_record(group: ConsumerGroup) -> CoordinatorRecord:
        topics = ((m.topic_id, m.name, m.partitions) for m in group.subscribed_metadata.values())
        return records.group_epoch_record(group.group_id, group.group_epoch, records.metadata_hash(topics))

    @staticmethod
    def _member_metadata_record(group_id: str, member: ConsumerGroupMember) -> CoordinatorRecord:
        return records.member_metadata_record(
            group_id,
            member.member_id,
            instance_id=member.instance_id,
            rack_id=member.rack_id,
            client_id=member.client_id,
            client_host=member.client_host,
            subscribed_topic_names=member.subscribed_topic_names,
            subscribed_topic_regex=member.subscribed_topic_regex,
            rebalance_timeout_ms=member.rebalance_timeout_ms,
            server_assignor=member.server_assignor,
        )

    @staticmethod
    def _current_assignment_record(group_id: str, member: ConsumerGroupMember) -> CoordinatorRecord:
        return records.current_assignment_record(
            group_id,
            member.member_id,
            member_epoch=member.member_epoch,
            previous_member_epoch=member.previous_member_epoch,
            state=_STATE_VALUES[member.state],
            assigned=member.assigned,
            pending_revocation=member.pending_revocation,
        )

    # --- loading --------------------------------------------------------------------------------------

    def restore(self, stored_groups: Iterable[records.StoredConsumerGroup]) -> None:
        """Rebuild the groups a load found (the replay of their records), as Kafka's coordinator loads them: each
        member keeps its id, epochs and partitions, and its session (and a revoking member's rebalance timeout)
        counts from now. A group whose subscribed topics changed while the broker was down (its stored metadata
        hash differs) gets a new group epoch at its next heartbeat."""
        stored_list = list(stored_groups)
        if not stored_list:
            return  # nothing to time: the clock (trio's) is not asked outside a run
        now = self.clock()
        for stored in stored_list:
            group = self._restored(stored, now)
            self.groups[group.group_id] = group
            log.info(
                "group %s: loaded at epoch %d with %d member(s)", group.group_id, group.group_epoch, len(group.members)
            )
        self.runtime.wake()

    def unload(self, belongs: Callable[[str], bool]) -> None:
        """This broker stopped coordinating the groups ``belongs`` says are in an unloaded partition: they go from
        memory, as Kafka's onUnloaded (their members' next heartbeat answers NOT_COORDINATOR, and the new
        coordinator loads them from the log)."""
        for group_id in [g for g in self.groups if belongs(g)]:
            del self.groups[group_id]

    def _restored(self, stored: records.StoredConsumerGroup, now: float) -> ConsumerGroup:
        group_id = stored.group_id
        group = ConsumerGroup(
            group_id, group_epoch=max(stored.epoch, 0), assignment_epoch=max(stored.assignment_epoch, 0)
        )
        session_s = self._group_setting(group_id, "consumer.session.timeout.ms") / 1000
        for member_id in [*stored.members, *(m for m in stored.current if m not in stored.members)]:
            meta = stored.members.get(member_id)
            member = ConsumerGroupMember(member_id, session_deadline=now + session_s)
            if meta is not None:
                member.instance_id = meta.instance_id
                member.rack_id = meta.rack_id
                member.client_id, member.client_host = meta.client_id, meta.client_host
                member.subscribed_topic_names = list(meta.subscribed_topic_names)
                member.subscribed_topic_regex = meta.subscribed_topic_regex or None
                member.rebalance_timeout_ms = meta.rebalance_timeout_ms
                member.server_assignor = meta.server_assignor
            current = stored.current.get(member_id)
            if current is not None:
                member.member_epoch = current.member_epoch
                member.previous_member_epoch = current.previous_member_epoch
                member.state = _STATES_BY_VALUE.get(current.state, MemberState.STABLE)
                member.assigned = records.partitions_of(current.assigned_partitions)
                member.pending_revocation = records.partitions_of(current.partitions_pending_revocation)
            if member.state == MemberState.UNREVOKED_PARTITIONS:
                member.revocation_deadline = now + max(member.rebalance_timeout_ms, 0) / 1000
                member.revocation_epoch = member.member_epoch
            group.members[member_id] = member
            if member.instance_id is not None:
                group.static_members[member.instance_id] = member_id
            for assignment in (member.assigned, member.pending_revocation):
                for topic_id, partitions in assignment.items():
                    for partition in partitions:
                        owner = group.partition_epochs.setdefault((topic_id, partition), member.member_epoch)
                        if owner != member.member_epoch:
                            log.warning("group %s: %s-%d has two owners in the log", group_id, topic_id, partition)
        group.target = {m: records.partitions_of(t.topic_partitions) for m, t in stored.targets.items()}
        group.resolved_regexes = {regex: frozenset(value.topics) for regex, value in stored.regexes.items()}
        restrict = self.authorizing()
        for member in group.members.values():
            if member.subscribed_topic_regex:
                member.regex_topics = group.resolved_regexes.get(member.subscribed_topic_regex, frozenset())
                if restrict:  # the principal's rights are not stored: no topic beyond the stored ones meanwhile
                    member.may_describe_topic = member.regex_topics.__contains__
        group.subscribed_metadata = self._subscribed_metadata(group)
        topics = ((m.topic_id, m.name, m.partitions) for m in group.subscribed_metadata.values())
        if records.metadata_hash(topics) != stored.metadata_hash:
            group.subscribed_metadata = {}  # the next heartbeat finds the topics changed and bumps the epoch
        return group

    def _validate(self, request: MemberHeartbeat) -> None:
        """Kafka's checks, in Kafka's order (GroupMetadataManager.throwIfConsumerGroupHeartbeatRequestIsInvalid)."""
        version, group_id, member_id, member_epoch = (
            request.version,
            request.group_id,
            request.member_id,
            request.member_epoch,
        )
        instance_id, rack_id, owned = request.instance_id, request.rack_id, request.owned
        names, regex, assignor = request.subscribed_topic_names, request.subscribed_topic_regex, request.server_assignor

        def invalid(message: str) -> KafkaError:
            return KafkaError(ErrorCode.INVALID_REQUEST, message)

        # Kafka's throwIfEmptyString: set, but nothing left once trimmed.
        if (version >= CONSUMER_GENERATED_MEMBER_ID_VERSION or member_epoch > 0 or member_epoch == -1) and (
            not member_id.strip()
        ):
            raise invalid("MemberId can't be empty.")
        if not group_id.strip():
            raise invalid("GroupId can't be empty.")
        if instance_id is not None and not instance_id.strip():
            raise invalid("InstanceId can't be empty.")
        if rack_id is not None and not rack_id.strip():
            raise invalid("RackId can't be empty.")
        if member_epoch == 0:
            if request.rebalance_timeout_ms == -1:
                raise invalid("RebalanceTimeoutMs must be provided in first request.")
            if owned is None or owned:
                raise invalid("TopicPartitions must be empty when (re-)joining.")
            if names is None and regex is None:
                raise invalid("Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.")
        elif member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if instance_id is None:
                raise invalid("InstanceId can't be null.")
        elif member_epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise invalid("MemberEpoch is invalid.")
        if assignor is not None and assignor not in self.assignors:
            raise KafkaError(
                ErrorCode.UNSUPPORTED_ASSIGNOR,
                f"ServerAssignor {assignor} is not supported. Supported assignors: {', '.join(self.assignors)}.",
            )
        if regex:
            self._compile(regex)

    def _compile(self, regex: str) -> re.Pattern[str]:
        pattern = self._regex_cache.get(regex)
        if pattern is None:
            try:
                pattern = re.compile(regex)
            except re.error as exc:
                raise KafkaError(
                    ErrorCode.INVALID_REGULAR_EXPRESSION,
                    f"SubscribedTopicRegex `{regex}` is not a valid regular expression: {exc}.",
                ) from None
            if len(self._regex_cache) > 1000:
                self._regex_cache.clear()
            self._regex_cache[regex] = pattern
        return pattern

    def _group_for(self, group_id: str, create: bool) -> ConsumerGroup:
        group = self.groups.get(group_id)
        if group is not None:
            return group
        # An empty classic group (offsets stay) gives its id up to a joining member.
        if self.classic is not None and not self.classic.release_group_id(group_id, release=create):
            # Kafka would upgrade a classic group whose members all use the consumer protocol type
            # (KIP-848 online migration); kbroker does not, so the id stays the classic group's.
            raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group")
        if not create:
            # Kafka answers GROUP_ID_NOT_FOUND here. Groups survive restarts here too, but one can still be lost
            # (__consumer_offsets deleted, a write that never made it): its member is told to rejoin instead of
            # failing for good.
            raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID, f"Consumer group {group_id} not found.")
        group = self.groups[group_id] = ConsumerGroup(group_id)
        return group

    def _member_for(
        self,
        group: ConsumerGroup,
        member_id: str,
        member_epoch: int,
        instance_id: str | None,
        owned: OwnedPartitions | None,
    ) -> tuple[ConsumerGroupMember, bool]:
        """The member the heartbeat is for (created or replacing a static one when joining); True if new."""
        joining = member_epoch == 0
        if instance_id is not None:
            existing_id = group.static_members.get(instance_id)
            existing = group.members.get(existing_id) if existing_id is not None else None
            if joining:
                if existing is None:
                    return self._new_or_rejoining(group, member_id, member_epoch, owned)
                if existing.member_id == member_id:
                    return self._new_or_rejoining(group, member_id, member_epoch, owned)
                if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                    raise KafkaError(
                        ErrorCode.UNRELEASED_INSTANCE_ID,
                        f"Static member {member_id} with instance id {instance_id} cannot join the group "
                        f"because the instance id is owned by {existing.member_id} member.",
                    )
                return self._replace_static(group, existing, member_id), False  # already in the group
            if existing is None:
                raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
            if existing.member_id != member_id:
                raise KafkaError(
                    ErrorCode.FENCED_INSTANCE_ID,
                    f"Static member {member_id} with instance id {instance_id} was fenced by member "
                    f"{existing.member_id}.",
                )
            self._check_epoch(existing, member_epoch, owned)
            return existing, False
        if joining:
            return self._new_or_rejoining(group, member_id, member_epoch, owned)
        member = group.members.get(member_id)
        if member is None:
            raise KafkaError(
                ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group.group_id}."
            )
        self._check_epoch(member, member_epoch, owned)
        return member, False

    def _new_or_rejoining(
        self, group: ConsumerGroup, member_id: str, member_epoch: int, owned: OwnedPartitions | None
    ) -> tuple[ConsumerGroupMember, bool]:
        member = group.members.get(member_id)
        if member is None:
            return ConsumerGroupMember(member_id), True
        if member.previous_member_epoch == 0 or member.member_epoch == 0:
            # The response to its join was lost: Kafka accepts the repeated join as is.
            self._check_epoch(member, member_epoch, owned)
            return member, False
        # A known member rejoining with epoch 0 has given up all its partitions (after FENCED_MEMBER_EPOCH,
        # KIP-848). Kafka fences it again until its session expires; releasing its partitions at once is as
        # safe (it owns none) and lets it rejoin without waiting.
        log.info("group %s: member %s rejoins with epoch 0", group.group_id, member_id)
        group._release(member)
        member.assigned, member.pending_revocation = {}, {}
        member.member_epoch, member.previous_member_epoch = 0, -1
        member.state, member.revocation_deadline = MemberState.STABLE, None
        return member, False

    @staticmethod
    def _check_epoch(member: ConsumerGroupMember, received: int, owned: OwnedPartitions | None) -> None:
        """Kafka's throwIfConsumerGroupMemberEpochIsInvalid."""
        if received > member.member_epoch:
            raise KafkaError(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"The consumer group member has a greater member epoch ({received}) than the one known by the "
                f"group coordinator ({member.member_epoch}). The member must abandon all its partitions and rejoin.",
            )
        if received < member.member_epoch:
            # The previous epoch is fine if the member owns only assigned partitions: the response that
            # bumped its epoch may have been lost.
            if received != member.previous_member_epoch or not _is_subset(owned, member.assigned):
                raise KafkaError(
                    ErrorCode.FENCED_MEMBER_EPOCH,
                    f"The consumer group member has a smaller member epoch ({received}) than the one known by "
                    f"the group coordinator ({member.member_epoch}). The member must abandon all its "
                    "partitions and rejoin.",
                )

    def _replace_static(self, group: ConsumerGroup, old: ConsumerGroupMember, member_id: str) -> ConsumerGroupMember:
        """KIP-345 in KIP-848: a static member back within its session takes over its old assignment."""
        log.info(
            "group %s: static member %s rejoins as %s, replacing %s",
            group.group_id,
            old.instance_id,
            member_id,
            old.member_id,
        )
        group._release(old)
        del group.members[old.member_id]
        target = group.target.pop(old.member_id, None)
        self._emit(group.group_id, *records.member_tombstones(group.group_id, old.member_id))
        if target is not None:
            self._emit(group.group_id, records.target_assignment_record(group.group_id, member_id, target))
        new = ConsumerGroupMember(
            member_id,
            instance_id=old.instance_id,
            rack_id=old.rack_id,
            rebalance_timeout_ms=old.rebalance_timeout_ms,
            subscribed_topic_names=list(old.subscribed_topic_names),
            subscribed_topic_regex=old.subscribed_topic_regex,
            may_describe_topic=old.may_describe_topic,
            regex_topics=old.regex_topics,
            server_assignor=old.server_assignor,
            member_epoch=0,
            previous_member_epoch=0,
            assigned=_copy(old.assigned),
        )
        group.members[member_id] = new
        if target is not None:
            group.target[member_id] = target
        assert old.instance_id is not None
        group.static_members[old.instance_id] = member_id
        group._claim(new)
        return new

    def _heartbeat(self, request: MemberHeartbeat) -> HeartbeatResult:
        group_id, member_id, member_epoch = request.group_id, request.member_id, request.member_epoch
        instance_id, rack_id, owned = request.instance_id, request.rack_id, request.owned
        names, regex, assignor = request.subscribed_topic_names, request.subscribed_topic_regex, request.server_assignor
        rebalance_timeout_ms = request.rebalance_timeout_ms
        now = self.clock()
        joining = member_epoch == 0
        group = self._group_for(group_id, create=joining)
        is_known = bool(member_id) and (
            member_id in group.members or (instance_id is not None and instance_id in group.static_members)
        )
        if len(group.members) >= self.max_size and not is_known:
            self._forget_if_unused(group)
            raise KafkaError(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"The consumer group has reached its maximum capacity of {self.max_size} members.",
            )
        if not member_id:
            member_id = new_member_id()  # v0: the coordinator names the member
        # What the records describe before the heartbeat, to write only what it changes (as Kafka's records).
        known = group.members.get(member_id)
        metadata_before = _metadata_view(known) if known is not None else None
        current_before = _current_view(known) if known is not None else None
        epoch_before, assignment_epoch_before, target_before = group.group_epoch, group.assignment_epoch, group.target
        try:
            member, is_new = self._member_for(group, member_id, member_epoch, instance_id, owned)
        except KafkaError:
            self._forget_if_unused(group)
            raise
        before = _copy(member.assigned)

        # 1. The member's subscription; a change to what the group subscribes to bumps the group epoch
        #    (as in Kafka, a member joining with an empty subscription changes nothing to assign).
        changed = False
        if instance_id is not None:
            member.instance_id = instance_id
        if rack_id is not None:
            member.rack_id = rack_id
        if rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = rebalance_timeout_ms
        if assignor is not None:
            member.server_assignor = assignor
        if names is not None and names != member.subscribed_topic_names:
            member.subscribed_topic_names = list(names)
            changed = True
        if regex is not None and (regex or None) != member.subscribed_topic_regex:
            member.subscribed_topic_regex = regex or None  # "" clears the regex
            changed = True
        if regex is not None:
            # The regex resolves with the rights of the principal that sent it (Kafka 4.3: only topics it may
            # DESCRIBE); heartbeats that do not repeat the regex keep them.
            member.may_describe_topic = request.may_describe_topic if regex else None
        member.client_id, member.client_host = request.client_id, request.client_host
        if is_new:
            group.members[member.member_id] = member
            if member.instance_id is not None:
                group.static_members[member.instance_id] = member.member_id
            log.info("group %s: member %s joins (instance %s)", group_id, member.member_id, member.instance_id)
        if self._resolve_regexes(group):
            changed = True
        metadata = self._subscribed_metadata(group)
        if metadata != group.subscribed_metadata:
            group.subscribed_metadata = metadata
            changed = True
        if changed or group.group_epoch == 0:
            group.group_epoch += 1
            log.info("group %s: epoch %d", group_id, group.group_epoch)

        # 2. A new target assignment when the group epoch moved on.
        if group.group_epoch > group.assignment_epoch:
            self._compute_target(group)

        # 3. Reconcile this member towards its target.
        self._reconcile(group, member, owned, now)
        member.session_deadline = now + self._group_setting(group_id, "consumer.session.timeout.ms") / 1000
        self.runtime.wake(at=member.session_deadline)

        # 4. The records of what changed, in Kafka's order.
        if self.store is not None:
            if _metadata_view(member) != metadata_before:
                self._emit(group_id, self._member_metadata_record(group_id, member))
            if changed:
                self._write_regexes(group)
            if group.group_epoch != epoch_before:
                self._emit(group_id, self._group_epoch_record(group))
            if group.assignment_epoch != assignment_epoch_before:
                target = group.target
                self._emit(
                    group_id,
                    *(
                        records.target_assignment_record(group_id, m, t)
                        for m, t in target.items()
                        if m not in target_before or target_before[m] != t
                    ),
                    records.target_assignment_epoch_record(group_id, group.assignment_epoch, self.wall_clock_ms()),
                )
            if _current_view(member) != current_before:
                self._emit(group_id, self._current_assignment_record(group_id, member))

        full_request = joining or (
            rebalance_timeout_ms != -1 and (names is not None or regex is not None) and owned is not None
        )
        return HeartbeatResult(
            member_id=member.member_id,
            member_epoch=member.member_epoch,
            heartbeat_interval_ms=self._group_setting(group_id, "consumer.heartbeat.interval.ms"),
            assignment=_copy(member.assigned) if full_request or member.assigned != before else None,
        )

    def _forget_if_unused(self, group: ConsumerGroup) -> None:
        """A group created by a join that then failed leaves no trace."""
        if not group.members and group.group_epoch == 0:
            self.groups.pop(group.group_id, None)

    def _resolve_regexes(self, group: ConsumerGroup) -> bool:
        """Resolve every member's regex against the topics that exist now, keeping only those the principal that
        set it may DESCRIBE (as Kafka 4.3's coordinator, which never assigns a regex member a topic it could not
        name itself). Done on every heartbeat, so created and deleted topics and changed ACLs count at once.
        True if some member's topics changed."""
        changed = False
        names: list[str] | None = None
        for member in group.members.values():
            resolved: frozenset[str] = frozenset()
            if member.subscribed_topic_regex:
                if names is None:
                    names = [meta.name for meta in self._topics()]
                # Kafka matches with RE2/J against the whole name; Python's re is close for common patterns.
                pattern = self._compile(member.subscribed_topic_regex)
                allowed = member.may_describe_topic
                resolved = frozenset(n for n in names if pattern.fullmatch(n) and (allowed is None or allowed(n)))
            if resolved != member.regex_topics:
                member.regex_topics = resolved
                changed = True
        return changed

    def _subscribed_metadata(self, group: ConsumerGroup) -> dict[uuid.UUID, TopicMetadata]:
        by_name = {meta.name: meta for meta in self._topics()}
        names: set[str] = set()
        for member in group.members.values():
            names.update(n for n in member.subscribed_topic_names if n in by_name)
            names.update(n for n in member.regex_topics if n in by_name)
        return {by_name[n].topic_id: by_name[n] for n in names}

    def _member_topics(self, group: ConsumerGroup, member: ConsumerGroupMember) -> frozenset[uuid.UUID]:
        wanted = set(member.subscribed_topic_names) | member.regex_topics
        return frozenset(topic_id for topic_id, meta in group.subscribed_metadata.items() if meta.name in wanted)

    def preferred_assignor(self, group: ConsumerGroup) -> str:
        """The server assignor most members ask for (ties: configuration order), else the default."""
        votes: dict[str, int] = {}
        for member in group.members.values():
            if member.server_assignor is not None:
                votes[member.server_assignor] = votes.get(member.server_assignor, 0) + 1
        if not votes:
            return self.default_assignor
        order = list(self.assignors)
        return max(votes, key=lambda name: (votes[name], -order.index(name)))

    def _compute_target(self, group: ConsumerGroup) -> None:
        specs = [
            MemberSpec(m.member_id, self._member_topics(group, m), group.target.get(m.member_id, {}))
            for m in group.members.values()
        ]
        assignor = self.assignors[self.preferred_assignor(group)]
        group.target = assignor.assign(specs, group.subscribed_metadata) if specs else {}
        group.assignment_epoch = group.group_epoch
        log.info("group %s: target assignment for epoch %d by %s", group.group_id, group.group_epoch, assignor.name)

    def _reconcile(
        self, group: ConsumerGroup, member: ConsumerGroupMember, owned: OwnedPartitions | None, now: float
    ) -> None:
        """Kafka's CurrentAssignmentBuilder, for one member."""
        target_epoch = group.assignment_epoch
        if member.state == MemberState.STABLE and member.member_epoch == target_epoch:
            return
        if member.state == MemberState.UNREVOKED_PARTITIONS:
            if _owns_any(owned, member.pending_revocation):
                return  # still revoking
            next_epoch = member.member_epoch + 1
        else:
            next_epoch = member.member_epoch
        group._release(member)
        self._next_assignment(group, member, next_epoch, owned)
        group._claim(member)
        if member.state == MemberState.UNREVOKED_PARTITIONS:
            if member.revocation_deadline is None or member.revocation_epoch != member.member_epoch:
                member.revocation_deadline = now + max(member.rebalance_timeout_ms, 0) / 1000
                member.revocation_epoch = member.member_epoch
                self.runtime.wake(at=member.revocation_deadline)
        else:
            member.revocation_deadline = None

    def _next_assignment(
        self, group: ConsumerGroup, member: ConsumerGroupMember, epoch: int, owned: OwnedPartitions | None
    ) -> None:
        target = group.target.get(member.member_id, {})
        keep: TopicAssignment = {}
        revoke: TopicAssignment = {}
        gain: TopicAssignment = {}
        unreleased = False
        for topic_id in set(target) | set(member.assigned):
            wanted = target.get(topic_id, set())
            current = member.assigned.get(topic_id, set())
            if current & wanted:
                keep[topic_id] = current & wanted
            if current - wanted:
                revoke[topic_id] = current - wanted
            free = set()
            for partition in wanted - current:
                if group.partition_epoch(topic_id, partition) == NO_OWNER:
                    free.add(partition)
                else:
                    unreleased = True
            if free:
                gain[topic_id] = free
        if revoke and _owns_any(owned, revoke):
            # Give up first: stay at this epoch until the member reports the partitions gone.
            member.state = MemberState.UNREVOKED_PARTITIONS
            member.update_epoch(epoch)
            member.assigned, member.pending_revocation = keep, revoke
            return
        for topic_id, partitions in gain.items():
            keep.setdefault(topic_id, set()).update(partitions)
        member.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
        member.update_epoch(group.assignment_epoch)
        member.assigned, member.pending_revocation = keep, {}

    # --- leaving, fencing, expiry ---------------------------------------------------------------------

    def _leave(self, group_id: str, member_id: str, member_epoch: int, instance_id: str | None) -> HeartbeatResult:
        group = self.groups.get(group_id)
        if group is None:
            raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found.")
        if instance_id is None:
            member = group.members.get(member_id)
            if member is None:
                raise KafkaError(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {group_id}."
                )
        else:
            static_id = group.static_members.get(instance_id)
            member = group.members.get(static_id) if static_id is not None else None
            if member is None:
                raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
            if member.member_id != member_id:
                raise KafkaError(
                    ErrorCode.FENCED_INSTANCE_ID,
                    f"Static member {member_id} with instance id {instance_id} was fenced by member "
                    f"{member.member_id}.",
                )
            if member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                # Gone for a moment (a bounce): keeps its assignment until its session expires.
                log.info("group %s: static member %s leaves temporarily", group_id, member_id)
                group._release(member)
                member.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH
                member.pending_revocation = {}
                member.state = MemberState.STABLE
                member.revocation_deadline = None
                group._claim(member)
                self._emit(group_id, self._current_assignment_record(group_id, member))
                return HeartbeatResult(member_id=member_id, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH)
        log.info("group %s: member %s leaves", group_id, member.member_id)
        self._remove(group, member)
        return HeartbeatResult(member_id=member_id, member_epoch=member_epoch)

    def _remove(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        """Fence a member: its partitions are free and the group epoch moves on (a new target)."""
        group._release(member)
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        if member.instance_id is not None and group.static_members.get(member.instance_id) == member.member_id:
            del group.static_members[member.instance_id]
        group.subscribed_metadata = self._subscribed_metadata(group)
        group.group_epoch += 1
        self._emit(group.group_id, *records.member_tombstones(group.group_id, member.member_id))
        self._write_regexes(group)
        self._emit(group.group_id, self._group_epoch_record(group))

    @staticmethod
    def _revocation_deadline(member: ConsumerGroupMember) -> float | None:
        """When the member is fenced for not revoking: only while it still holds partitions it must give up."""
        if member.state == MemberState.UNREVOKED_PARTITIONS and member.member_epoch == member.revocation_epoch:
            return member.revocation_deadline
        return None

    def tick(self, now: float | None = None) -> None:
        """Fence members whose session expired or who did not revoke within their rebalance timeout, at ``now``
        (default: the clock)."""
        if now is None:
            now = self.clock()
        for group in list(self.groups.values()):
            for member in list(group.members.values()):
                revocation_deadline = self._revocation_deadline(member)
                if member.session_deadline <= now:
                    log.info("group %s: member %s session expired", group.group_id, member.member_id)
                    self._remove(group, member)
                elif revocation_deadline is not None and revocation_deadline <= now:
                    log.info(
                        "group %s: member %s fenced: did not revoke within %d ms",
                        group.group_id,
                        member.member_id,
                        member.rebalance_timeout_ms,
                    )
                    self._remove(group, member)
        try:
            self._write()
        except KafkaError:  # logged; the groups' next writes rewrite them whole
            pass

    def next_deadline(self, now: float) -> float | None:
        """The earliest session or revocation deadline of any member, or None without members."""
        earliest: float | None = None
        for group in self.groups.values():
            for member in group.members.values():
                revocation_deadline = self._revocation_deadline(member)
                deadline = member.session_deadline
                if revocation_deadline is not None and revocation_deadline < deadline:
                    deadline = revocation_deadline
                if earliest is None or deadline < earliest:
                    earliest = deadline
        return earliest

    # --- administration and offsets -------------------------------------------------------------------

    def delete(self, group_id: str) -> ErrorCode:
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if group.members:
            return ErrorCode.NON_EMPTY_GROUP
        self._emit(group_id, *records.group_tombstones(group_id))
        try:
            self._write()  # written before the group is forgotten: a failed write leaves it as it was
        except KafkaError as error:
            return error.code
        del self.groups[group_id]
        return ErrorCode.NONE

    def has_members(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    def validate_offset_commit(
        self, group_id: str, member_id: str | None, member_epoch: int, api_version: int
    ) -> ErrorCode | None:
        """Kafka's ConsumerGroup.validateOffsetCommit; None if ``group_id`` is not a consumer group."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        if member_epoch < 0 and not group.members:
            return ErrorCode.NONE  # an admin client or a consumer without group management
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if api_version < 9:
            return ErrorCode.UNSUPPORTED_VERSION  # consumer-protocol members must commit with v9+
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """Kafka's ConsumerGroup.validateOffsetFetch (OffsetFetch v9+)."""
        group = self.groups.get(group_id)
        if group is None or (member_id is None and member_epoch < 0):
            return ErrorCode.NONE
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH
        return ErrorCode.NONE

    def topic_names(self) -> Mapping[uuid.UUID, str]:
        return {meta.topic_id: meta.name for meta in self._topics()}


def _metadata_view(member: ConsumerGroupMember) -> tuple[object, ...]:
    """What the member's ConsumerGroupMemberMetadata record holds."""
    return (
        member.instance_id,
        member.rack_id,
        member.client_id,
        member.client_host,
        member.subscribed_topic_names,
        member.subscribed_topic_regex,
        member.rebalance_timeout_ms,
        member.server_assignor,
    )


def _current_view(member: ConsumerGroupMember) -> tuple[object, ...]:
    """What the member's ConsumerGroupCurrentMemberAssignment record holds (the assignments are replaced, never
    changed in place, so keeping them is a snapshot)."""
    return (member.member_epoch, member.previous_member_epoch, member.state, member.assigned, member.pending_revocation)


def _is_subset(owned: OwnedPartitions | None, assigned: TopicAssignment) -> bool:
    if owned is None:
        return False
    for topic_id, partitions in owned:
        mine = assigned.get(topic_id)
        if partitions and (mine is None or not set(partitions) <= mine):
            return False
    return True


def _owns_any(owned: OwnedPartitions | None, partitions: TopicAssignment) -> bool:
    """Whether the heartbeat still reports any of ``partitions``; unknown (no list sent) counts as yes."""
    if owned is None:
        return True
    for topic_id, reported in owned:
        pending = partitions.get(topic_id)
        if pending and pending.intersection(reported):
            return True
    return False
