"""KIP-848 consumer groups in __consumer_offsets: each change is written as Kafka's ConsumerGroup* records, and a
fresh shard replaying them rebuilds the group exactly (members, epochs, reconciliation states, assignments and
targets), its members' sessions starting again at the load."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kbroker.coordinators.runtime import CoordinatorRecord
from kbroker.durable.files import StorageError
from kbroker.groups import consumer_group_records as records
from kbroker.groups.assignors import TopicMetadata
from kbroker.groups.consumer_group import (
    ConsumerGroup,
    ConsumerGroupCoordinator,
    HeartbeatResult,
    MemberHeartbeat,
    MemberState,
)
from kbroker.groups.offsets import OFFSETS_TOPIC, OffsetStore
from protocol.coordinator_frame import decode_coordinator_record
from protocol.coordinator_records.consumer_group_current_member_assignment_value import (
    ConsumerGroupCurrentMemberAssignmentValue,
)
from protocol.coordinator_records.consumer_group_member_metadata_value import ConsumerGroupMemberMetadataValue
from protocol.coordinator_records.consumer_group_metadata_value import ConsumerGroupMetadataValue
from protocol.coordinator_records.consumer_group_target_assignment_member_value import (
    ConsumerGroupTargetAssignmentMemberValue,
)
from protocol.coordinator_records.consumer_group_target_assignment_metadata_value import (
    ConsumerGroupTargetAssignmentMetadataValue,
)
from protocol.errors import ErrorCode
from protocol.records import decode_records, iter_batches

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
SESSION_MS = 45_000
REBALANCE_MS = 30_000
PARTITIONS = 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FailingStore:
    """The store, with writes that fail while ``failing`` is set (a full disk)."""

    def __init__(self, store: OffsetStore) -> None:
        self.store = store
        self.failing = False

    def write_consumer_group(self, group_id: str, group_records: list[CoordinatorRecord]) -> int:
        if self.failing:
            raise StorageError("no space left on device")
        return self.store.write_consumer_group(group_id, group_records)

    async def committed(self, group: str, end_offset: int) -> None:
        await self.store.committed(group, end_offset)

    def stored_consumer_group(self, group_id: str) -> records.StoredConsumerGroup | None:
        return self.store.stored_consumer_group(group_id)


class Harness:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.clock = Clock()
        self.topics = {"orders": TopicMetadata(T1, "orders", 6), "payments": TopicMetadata(T2, "payments", 2)}
        self.store = OffsetStore.in_data_dir(data_dir, partitions=PARTITIONS)
        self.writes = FailingStore(self.store)
        self.coordinator = self.new_coordinator(self.writes)

    def new_coordinator(self, store: FailingStore | OffsetStore) -> ConsumerGroupCoordinator:
        return ConsumerGroupCoordinator(
            topics=lambda: list(self.topics.values()),
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=5000,
            max_size=100,
            assignors=("uniform", "range"),
            clock=self.clock,
            store=store,
            wall_clock_ms=lambda: 1_700_000_000_000,
        )

    def join(self, member_id: str, topics: list[str] | None = None, **extra: object) -> HeartbeatResult:
        fields: dict = {
            "version": 1,
            "group_id": "g",
            "member_id": member_id,
            "member_epoch": 0,
            "rebalance_timeout_ms": REBALANCE_MS,
            "subscribed_topic_names": ["orders"] if topics is None else topics,
            "owned": [],
            "client_id": f"client-{member_id}",
            "client_host": "/10.0.0.1",
        }
        fields.update(extra)
        return self.checked(self.coordinator.heartbeat(MemberHeartbeat(**fields)))

    def beat(self, member_id: str, epoch: int, owned: dict[uuid.UUID, set[int]] | None, **extra: object):
        owned_list = None if owned is None else [(t, sorted(p)) for t, p in owned.items()]
        request = MemberHeartbeat(
            version=1,
            group_id="g",
            member_id=member_id,
            member_epoch=epoch,
            owned=owned_list,
            client_id=f"client-{member_id}",
            client_host="/10.0.0.1",
            **extra,
        )
        return self.checked(self.coordinator.heartbeat(request))

    def checked(self, result: HeartbeatResult) -> HeartbeatResult:
        """After every operation: a fresh store replaying the log rebuilds exactly the group in memory."""
        if not self.writes.failing:
            assert reloaded_state(self) == state_of(self.coordinator), "the replay differs from memory"
        return result

    def reload(self) -> ConsumerGroupCoordinator:
        """A restart: a fresh store replays __consumer_offsets and a fresh coordinator is rebuilt from it."""
        self.store.close()
        self.store = OffsetStore.in_data_dir(self.data_dir, partitions=PARTITIONS)
        coordinator = self.new_coordinator(self.store)
        coordinator.restore(self.store.stored_consumer_groups())
        return coordinator

    def close(self) -> None:
        self.store.close()


def reloaded_state(h: Harness) -> dict:
    store = OffsetStore.in_data_dir(h.data_dir, partitions=PARTITIONS)
    try:
        coordinator = h.new_coordinator(store)
        coordinator.restore(store.stored_consumer_groups())
        return state_of(coordinator)
    finally:
        store.close()


def group_state(group: ConsumerGroup) -> dict:
    return {
        "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch,
        "static_members": dict(group.static_members),
        "target": {m: t for m, t in group.target.items() if t},
        "partition_epochs": dict(group.partition_epochs),
        "resolved_regexes": dict(group.resolved_regexes),
        "members": {
            m.member_id: (
                m.instance_id,
                m.rack_id,
                m.client_id,
                m.client_host,
                sorted(m.subscribed_topic_names),
                m.subscribed_topic_regex,
                m.regex_topics,
                m.rebalance_timeout_ms,
                m.server_assignor,
                m.member_epoch,
                m.previous_member_epoch,
                m.state,
                m.assigned,
                m.pending_revocation,
            )
            for m in group.members.values()
        },
    }


def state_of(coordinator: ConsumerGroupCoordinator) -> dict:
    return {group_id: group_state(group) for group_id, group in coordinator.groups.items()}


def written(h: Harness) -> list[tuple[int, object, object]]:
    """Every ConsumerGroup* record of the group's partition, decoded: (type, key, value)."""
    partition = h.store.partition_for("g")
    segment = h.data_dir / f"{OFFSETS_TOPIC}-{partition}" / "00000000000000000000.log"
    found = []
    for _, batch in iter_batches(segment.read_bytes()):
        for record in decode_records(batch):
            decoded = decode_coordinator_record("group", record.key, record.value)
            if decoded.record_type in records.CONSUMER_GROUP_RECORD_TYPES:
                found.append((decoded.record_type, decoded.key, decoded.value))
    return found


@pytest.fixture
def h(tmp_path: Path):
    harness = Harness(tmp_path / "data")
    yield harness
    harness.close()


def test_a_join_writes_kafkas_records_in_kafkas_order(h: Harness) -> None:
    result = h.join("m1", server_assignor="range", rack_id="r1")
    assert (result.error_code, result.member_epoch, result.written_offset) == (ErrorCode.NONE, 1, 5)
    types = [(t, type(k).__name__, getattr(k, "member_id", None)) for t, k, _ in written(h)]
    assert types == [
        (5, "ConsumerGroupMemberMetadataKey", "m1"),
        (3, "ConsumerGroupMetadataKey", None),
        (7, "ConsumerGroupTargetAssignmentMemberKey", "m1"),
        (6, "ConsumerGroupTargetAssignmentMetadataKey", None),
        (8, "ConsumerGroupCurrentMemberAssignmentKey", "m1"),
    ]
    values = [v for _, _, v in written(h)]
    meta, epoch, target, target_epoch, current = values
    assert isinstance(meta, ConsumerGroupMemberMetadataValue)
    assert (meta.client_id, meta.client_host, meta.rack_id, meta.instance_id) == ("client-m1", "/10.0.0.1", "r1", None)
    assert (meta.subscribed_topic_names, meta.subscribed_topic_regex) == (["orders"], None)
    assert (meta.rebalance_timeout_ms, meta.server_assignor, meta.classic_member_metadata) == (
        REBALANCE_MS,
        "range",
        None,
    )
    assert isinstance(epoch, ConsumerGroupMetadataValue) and epoch.epoch == 1 and epoch.metadata_hash != 0
    assert isinstance(target, ConsumerGroupTargetAssignmentMemberValue)
    assert [(tp.topic_id, tp.partitions) for tp in target.topic_partitions] == [(T1, [0, 1, 2, 3, 4, 5])]
    assert isinstance(target_epoch, ConsumerGroupTargetAssignmentMetadataValue)
    assert (target_epoch.assignment_epoch, target_epoch.assignment_timestamp) == (1, 1_700_000_000_000)
    assert isinstance(current, ConsumerGroupCurrentMemberAssignmentValue)
    assert (current.member_epoch, current.previous_member_epoch, current.state) == (1, 0, records.STATE_STABLE)
    assert [(tp.topic_id, tp.partitions) for tp in current.assigned_partitions] == [(T1, [0, 1, 2, 3, 4, 5])]
    assert current.partitions_pending_revocation == []

    # A heartbeat that changes nothing writes nothing.
    again = h.beat("m1", 1, {T1: set(range(6))})
    assert (again.error_code, again.written_offset) == (ErrorCode.NONE, -1)
    assert len(written(h)) == 5


def test_a_rebalance_replays_exactly_at_every_step(h: Harness) -> None:
    h.join("m1")
    h.join("m2")  # m2: UNRELEASED_PARTITIONS until m1 revokes
    h.beat("m1", 1, {T1: set(range(6))})  # m1: UNREVOKED_PARTITIONS, 3-5 pending revocation
    group = h.coordinator.groups["g"]
    assert group.members["m1"].state == MemberState.UNREVOKED_PARTITIONS
    assert group.members["m1"].pending_revocation == {T1: {3, 4, 5}}
    # Only m2's target changed when m2 joined (Kafka writes the delta); both members' targets were written by then.
    targets = [(k.member_id, v) for t, k, v in written(h) if t == records.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER]
    assert [m for m, _ in targets] == ["m1", "m1", "m2"]
    h.beat("m1", 1, {T1: {0, 1, 2}})
    h.beat("m2", 2, {})
    h.beat("m2", 2, {T1: {3, 4, 5}})
    reloaded = h.reload()
    g = reloaded.groups["g"]
    assert (g.group_epoch, g.assignment_epoch) == (2, 2)
    assert {m.member_id: (m.member_epoch, m.state, m.assigned) for m in g.members.values()} == {
        "m1": (2, MemberState.STABLE, {T1: {0, 1, 2}}),
        "m2": (2, MemberState.STABLE, {T1: {3, 4, 5}}),
    }


def test_a_member_revoking_at_the_restart_keeps_its_pending_partitions_and_its_rebalance_timeout(h: Harness) -> None:
    h.join("m1")
    h.join("m2")
    h.beat("m1", 1, {T1: set(range(6))})
    h.clock.now += 100
    reloaded = h.reload()
    m1 = reloaded.groups["g"].members["m1"]
    assert (m1.state, m1.member_epoch, m1.pending_revocation) == (MemberState.UNREVOKED_PARTITIONS, 1, {T1: {3, 4, 5}})
    # Sessions and the rebalance timeout count from the load, as Kafka's coordinator schedules them on load.
    assert m1.session_deadline == h.clock.now + SESSION_MS / 1000
    assert m1.revocation_deadline == h.clock.now + REBALANCE_MS / 1000
    assert reloaded.groups["g"].partition_epochs[(T1, 3)] == 1
    # The member carries on where it was: it revokes and moves to epoch 2.
    h.coordinator = reloaded
    h.writes = FailingStore(h.store)
    reloaded.store = h.writes
    done = h.beat("m1", 1, {T1: {0, 1, 2}})
    assert (done.error_code, done.member_epoch) == (ErrorCode.NONE, 2)
    # A member that does not come back expires a session after the load.
    h.clock.now += SESSION_MS / 1000 + 1
    reloaded.tick()
    assert reloaded.groups["g"].members == {}
    assert reloaded.groups["g"].group_epoch == 4  # two members fenced, one epoch each
    assert reloaded_state(h) == state_of(reloaded)


def test_leaving_and_expiring_write_tombstones_and_the_bumped_epoch(h: Harness) -> None:
    h.join("m1")
    h.join("m2")
    before = len(written(h))
    left = h.beat("m2", -1, None)
    assert left.error_code == ErrorCode.NONE
    tail = [(t, getattr(k, "member_id", None), v) for t, k, v in written(h)[before:]]
    assert [(t, m, v is None) for t, m, v in tail] == [
        (records.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT, "m2", True),
        (records.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER, "m2", True),
        (records.CONSUMER_GROUP_MEMBER_METADATA, "m2", True),
        (records.CONSUMER_GROUP_METADATA, None, False),
    ]
    assert isinstance(tail[-1][2], ConsumerGroupMetadataValue) and tail[-1][2].epoch == 3
    h.clock.now += SESSION_MS / 1000 + 1
    h.coordinator.tick()
    assert reloaded_state(h) == state_of(h.coordinator)
    reloaded = h.reload()
    assert reloaded.groups["g"].members == {} and reloaded.groups["g"].group_epoch == 4


def test_deleting_the_group_writes_its_tombstones(h: Harness) -> None:
    h.join("m1")
    h.beat("m1", -1, None)
    assert h.coordinator.delete("g") == ErrorCode.NONE
    tail = [(t, v is None) for t, _, v in written(h)[-3:]]
    assert tail == [
        (records.CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, True),
        (records.CONSUMER_GROUP_PARTITION_METADATA, True),
        (records.CONSUMER_GROUP_METADATA, True),
    ]
    assert h.reload().groups == {}


def test_static_members_replay_through_a_bounce_and_a_replacement(h: Harness) -> None:
    h.join("a1", instance_id="i-a")
    h.join("b1", instance_id="i-b")
    h.beat("a1", 1, {T1: set(range(6))})
    h.beat("a1", 1, {T1: {0, 1, 2}})
    h.beat("b1", 2, {})
    assert h.beat("a1", -2, None, instance_id="i-a").member_epoch == -2  # a bounce: keeps its partitions
    assert h.reload().groups["g"].members["a1"].member_epoch == -2
    h.join("a2", instance_id="i-a")  # the replacement takes over a1's assignment
    reloaded = h.reload().groups["g"]
    assert reloaded.static_members == {"i-a": "a2", "i-b": "b1"}
    assert set(reloaded.members) == {"a2", "b1"}
    assert reloaded.members["a2"].assigned == {T1: {0, 1, 2}}
    assert reloaded.target["a2"] == {T1: {0, 1, 2}}


def test_a_regex_members_resolution_is_written_and_restored(h: Harness) -> None:
    h.join("m1", topics=[], subscribed_topic_regex="pay.*")
    assert h.coordinator.groups["g"].members["m1"].assigned == {T2: {0, 1}}
    regex_records = [
        (k.regular_expression, v) for t, k, v in written(h) if t == records.CONSUMER_GROUP_REGULAR_EXPRESSION
    ]
    assert [(r, v.topics, v.timestamp) for r, v in regex_records] == [("pay.*", ["payments"], 1_700_000_000_000)]
    h.topics["payroll"] = TopicMetadata(uuid.UUID(int=3), "payroll", 1)  # resolves now: a new record
    h.beat("m1", 1, {T2: {0, 1}})
    regex_records = [
        (k.regular_expression, v) for t, k, v in written(h) if t == records.CONSUMER_GROUP_REGULAR_EXPRESSION
    ]
    assert [v.topics for _, v in regex_records] == [["payments"], ["payments", "payroll"]]
    reloaded = h.reload()
    member = reloaded.groups["g"].members["m1"]
    assert (member.subscribed_topic_regex, member.regex_topics) == ("pay.*", frozenset({"payments", "payroll"}))
    assert member.may_describe_topic is None  # no authorizer: the regex resolves against every topic again
    # The member leaves: its regex is no longer used, and its record goes.
    h.coordinator = reloaded
    reloaded.store = h.writes = FailingStore(h.store)
    h.beat("m1", -1, None)
    assert [(t, v is None) for t, _, v in written(h)[-2:]] == [
        (records.CONSUMER_GROUP_REGULAR_EXPRESSION, True),
        (records.CONSUMER_GROUP_METADATA, False),
    ]


def test_a_restored_regex_member_under_an_authorizer_keeps_to_its_stored_topics(h: Harness) -> None:
    h.join("m1", topics=[], subscribed_topic_regex="pay.*", may_describe_topic=lambda name: name != "payroll")
    h.topics["payroll"] = TopicMetadata(uuid.UUID(int=3), "payroll", 1)
    h.beat("m1", 1, {T2: {0, 1}})
    assert h.coordinator.groups["g"].members["m1"].regex_topics == frozenset({"payments"})
    h.store.close()
    h.store = OffsetStore.in_data_dir(h.data_dir, partitions=PARTITIONS)
    reloaded = h.new_coordinator(h.store)
    reloaded.authorizing = lambda: True
    reloaded.restore(h.store.stored_consumer_groups())
    h.coordinator = reloaded
    reloaded.store = h.writes = FailingStore(h.store)
    # A heartbeat without the regex (the principal's rights unknown) resolves to no topic the stored ones lack.
    result = h.beat("m1", 1, {T2: {0, 1}})
    assert (result.error_code, result.member_epoch) == (ErrorCode.NONE, 1)
    assert reloaded.groups["g"].members["m1"].regex_topics == frozenset({"payments"})


def test_a_topic_change_while_down_bumps_the_epoch_at_the_next_heartbeat(h: Harness) -> None:
    h.join("m1", topics=["payments"])
    h.topics["payments"] = TopicMetadata(T2, "payments", 3)  # partitions added while the broker is down
    reloaded = h.reload()
    h.coordinator = reloaded
    reloaded.store = h.writes = FailingStore(h.store)
    result = h.beat("m1", 1, {T2: {0, 1}})
    assert (result.member_epoch, result.assignment) == (2, {T2: {0, 1, 2}})


def test_a_failed_write_answers_not_coordinator_and_the_next_write_rewrites_the_group(h: Harness) -> None:
    h.join("m1")
    h.writes.failing = True
    failed = h.join("m2")
    assert failed.error_code == ErrorCode.NOT_COORDINATOR
    left = h.beat("m1", -1, None)  # m1's tombstones are not written either
    assert left.error_code == ErrorCode.NOT_COORDINATOR
    h.writes.failing = False
    retried = h.beat("m2", 2, {})
    assert retried.error_code == ErrorCode.NONE
    # The log matches memory again: m1 is gone from it too, m2 at its epoch with every partition.
    assert set(h.reload().groups["g"].members) == {"m2"}


def test_nothing_is_written_without_a_store(tmp_path: Path) -> None:
    coordinator = ConsumerGroupCoordinator(
        topics=lambda: [TopicMetadata(T1, "orders", 2)],
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=5000,
        max_size=10,
        assignors=("uniform",),
        clock=Clock(),
    )
    request = MemberHeartbeat(
        version=1,
        group_id="g",
        member_id="m",
        member_epoch=0,
        rebalance_timeout_ms=1,
        subscribed_topic_names=["orders"],
        owned=[],
    )
    result = coordinator.heartbeat(request)
    assert (result.error_code, result.member_epoch, result.written_offset) == (ErrorCode.NONE, 1, -1)
