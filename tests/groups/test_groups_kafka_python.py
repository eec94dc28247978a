"""Consumer groups with kafka-python 3.x: shares, leaving, crashing, resuming from commits, fan-out, static
membership and the group admin APIs."""

from __future__ import annotations

import pytest
from classic_scenarios import python_member
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata
from member_processes import MemberProcess, wait_for

from kbroker.testing import RunningBroker

FAST_GROUPS = {"group.initial.rebalance.delay.ms": "0"}
SESSION_MS = 6000  # the broker's default minimum


def make_topic(bootstrap: str, name: str, partitions: int, records_per_partition: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(name, partitions, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for partition in range(partitions):
        for i in range(records_per_partition):
            producer.send(name, value=f"{partition}-{i}".encode(), partition=partition)
    producer.flush()
    producer.close()


def group_state(broker: RunningBroker, group_id: str) -> str:
    """The coordinator's view of a classic group, for a failure message."""
    assert broker.broker is not None
    group = broker.broker.groups.groups.get(group_id)
    if group is None:
        return f"group {group_id}: unknown to the coordinator"
    members = [
        (m.member_id, m.client_id, f"join={m.awaiting_join} sync={m.awaiting_sync} new={m.is_new}")
        for m in group.members.values()
    ]
    return (
        f"group {group_id}: {group.state.value} generation {group.generation_id} leader {group.leader_id} "
        f"pending ids {sorted(group.pending_members)} awaiting sync {sorted(group.pending_sync)} members {members}"
    )


@pytest.fixture
def fast_broker(broker_factory) -> RunningBroker:  # noqa: ANN001
    return broker_factory(FAST_GROUPS)


def test_three_members_share_six_partitions_then_survive_a_crash(
    fast_broker: RunningBroker, members: list[MemberProcess]
) -> None:
    make_topic(fast_broker.bootstrap, "six", 6, 10)
    # classic_member.py with this process's kafka-python (3.x), the member closing its consumer on request.
    members.extend(
        python_member("kafka-python", fast_broker, "g", "six", f"member-{i}", session_ms=SESSION_MS) for i in range(3)
    )

    def balanced() -> bool:
        shares = [m.assigned or [] for m in members]
        return all(len(s) == 2 for s in shares) and sorted(sum(shares, [])) == list(range(6))

    wait_for(
        balanced, members, "three disjoint shares of two partitions", describe=lambda: group_state(fast_broker, "g")
    )
    wait_for(lambda: sum(len(m.records) for m in members) >= 60, members, "all 60 records")
    consumed = [r for m in members for r in m.records]
    # At least once: while the group settles, a record read before a rebalance whose commit was refused
    # (REBALANCE_IN_PROGRESS) is read again by the partition's next owner, as with Kafka.
    assert set(consumed) == {(p, o) for p in range(6) for o in range(10)}

    # One member dies without leaving: within the session timeout the others take over its share.
    crashed, survivors = members[0], members[1:]
    crashed_share = crashed.assigned or []
    crashed.kill()
    wait_for(
        lambda: sorted(sum((m.assigned or [] for m in survivors), [])) == list(range(6)),
        members,
        "survivors owning every partition",
        timeout=20,
    )
    assert set(crashed_share) <= set(sum((m.assigned or [] for m in survivors), []))
    # New records reach the survivors; nothing already committed is read again.
    seen = [len(m.records) for m in survivors]
    before = sum(seen)
    producer = KafkaProducer(bootstrap_servers=fast_broker.bootstrap)
    for partition in range(6):
        producer.send("six", value=b"late", partition=partition)
    producer.flush()
    producer.close()
    wait_for(lambda: sum(len(m.records) for m in survivors) >= before + 6, members, "the late records")
    late = [r for m, n in zip(survivors, seen, strict=True) for r in m.records[n:]]
    # Exactly the six new records: nothing below the crashed member's commits was read again.
    assert sorted(late) == [(p, 10) for p in range(6)]

    # One leaves cleanly (LeaveGroup on close): the last one gets everything at once.
    survivors[0].close()
    wait_for(lambda: survivors[1].assigned == list(range(6)), members, "the last member owning all")


def _consume_committing(bootstrap: str, group: str, topic: str, count: int, **config) -> list[int]:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
        **config,
    )
    consumer.partitions_for_topic(topic)  # before the join (kafka-python 3.0.12: tests/commands/test_groups.py)
    values = []
    for record in consumer:
        values.append(int(record.value))
        if len(values) == count:
            break
    if not config.get("enable_auto_commit", True):
        consumer.commit()
    consumer.close()  # auto-commit commits on close
    return values


@pytest.mark.parametrize("auto_commit", [True, False], ids=["auto-commit", "manual-commit"])
def test_resume_after_commit_across_a_broker_restart(fast_broker: RunningBroker, auto_commit: bool) -> None:
    admin = KafkaAdminClient(bootstrap_servers=fast_broker.bootstrap)
    admin.create_topics([NewTopic("resume", 1, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=fast_broker.bootstrap)
    for i in range(20):
        producer.send("resume", value=str(i).encode())
    producer.flush()
    producer.close()
    first = _consume_committing(fast_broker.bootstrap, "resumer", "resume", 8, enable_auto_commit=auto_commit)
    assert first == list(range(8))
    fast_broker.restart()
    rest = _consume_committing(fast_broker.bootstrap, "resumer", "resume", 12, enable_auto_commit=auto_commit)
    assert rest == list(range(8, 20))


def test_two_groups_each_receive_every_record(fast_broker: RunningBroker) -> None:
    make_topic(fast_broker.bootstrap, "fan", 2, 5)
    expected = sorted(f"{p}-{i}".encode() for p in range(2) for i in range(5))
    for group in ("billing", "audit"):
        consumer = KafkaConsumer(
            "fan",
            bootstrap_servers=fast_broker.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            consumer_timeout_ms=5000,
        )
        consumer.partitions_for_topic("fan")  # before the join (kafka-python 3.0.12: tests/commands/test_groups.py)
        values = []
        for record in consumer:
            values.append(record.value)
            if len(values) == 10:
                break
        consumer.close()
        assert sorted(values) == expected


def test_static_member_gets_its_partitions_back_without_a_rebalance(fast_broker: RunningBroker) -> None:
    make_topic(fast_broker.bootstrap, "static", 4, 1)

    def member(instance: str) -> KafkaConsumer:
        consumer = KafkaConsumer(
            "static",
            bootstrap_servers=fast_broker.bootstrap,
            group_id="statics",
            group_instance_id=instance,
            session_timeout_ms=10_000,
            auto_offset_reset="earliest",
        )
        consumer.partitions_for_topic("static")  # before the join (kafka-python 3.0.12: tests/commands/test_groups.py)
        return consumer

    consumers = {name: member(name) for name in ("a", "b")}

    def shares() -> dict[str, list[int]]:
        for c in consumers.values():
            c.poll(50)
        return {n: sorted(tp.partition for tp in c.assignment()) for n, c in consumers.items()}

    wait_for(
        lambda: sorted(sum(shares().values(), [])) == [0, 1, 2, 3] and all(shares().values()),
        [],
        "two static members sharing four partitions",
    )
    before = shares()
    coordinator = fast_broker.broker.groups  # type: ignore[union-attr]
    generation = coordinator.groups["statics"].generation_id
    # A static member's close does not send LeaveGroup (KIP-345); it comes back with the same instance id.
    consumers["a"].close()
    consumers["a"] = member("a")
    wait_for(lambda: shares()["a"] == before["a"], [], "member a getting its partitions back")
    assert coordinator.groups["statics"].generation_id == generation
    for c in consumers.values():
        c.close()


def test_group_admin_list_describe_offsets_and_delete(fast_broker: RunningBroker) -> None:
    make_topic(fast_broker.bootstrap, "admin", 2, 3)
    consumer = KafkaConsumer(
        "admin",
        bootstrap_servers=fast_broker.bootstrap,
        group_id="tool",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
    )
    consumer.partitions_for_topic("admin")  # before the join (kafka-python 3.0.12: tests/commands/test_groups.py)
    values = []
    for record in consumer:
        values.append(record.value)
        if len(values) == 6:
            break
    consumer.commit()
    consumer.close()
    assert sorted(values) == sorted(f"{p}-{i}".encode() for p in range(2) for i in range(3))
    admin = KafkaAdminClient(bootstrap_servers=fast_broker.bootstrap)
    try:
        listed = {g["group_id"]: g for g in admin.list_groups()}
        assert listed["tool"]["group_state"] == "Empty"
        offsets = admin.list_group_offsets("tool")["tool"]
        assert {tp.partition: o.offset for tp, o in offsets.items()} == {0: 3, 1: 3}
        # Reset offsets through the admin API, as a user rewinding a group would.
        admin.alter_group_offsets("tool", {TopicPartition("admin", 0): OffsetAndMetadata(1, "rewound", -1)})
        offsets = admin.list_group_offsets("tool")["tool"]
        assert (offsets[TopicPartition("admin", 0)].offset, offsets[TopicPartition("admin", 0)].metadata) == (
            1,
            "rewound",
        )
        described = admin.describe_groups(["tool"])["tool"]
        assert described["group_state"] == "Empty" and described["members"] == []
        admin.delete_group_offsets("tool", [TopicPartition("admin", 1)])
        assert set(admin.list_group_offsets("tool")["tool"]) == {TopicPartition("admin", 0)}
        admin.delete_groups(["tool"])
        assert "tool" not in {g["group_id"] for g in admin.list_groups()}
    finally:
        admin.close()
