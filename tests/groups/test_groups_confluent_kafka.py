"""Consumer groups with confluent-kafka (librdkafka, classic protocol) and its group admin API."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.testing import RunningBroker


def test_two_members_split_partitions_commit_and_admin_sees_the_group(broker_factory) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory({"group.initial.rebalance.delay.ms": "0"})
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic("orders", 4, 1)]).values():
        future.result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(40):
        producer.produce("orders", value=str(i).encode(), partition=i % 4)
    assert producer.flush(10) == 0

    config = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": "shop",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    }
    members = [Consumer(config), Consumer(config)]
    for member in members:
        member.subscribe(["orders"])
    # A set: the first member may start on all four partitions before the second joins, and without a
    # commit the second then re-reads from the start (at-least-once), which is Kafka's behaviour too.
    consumed: set[tuple[int, int]] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for member in members:
            msg = member.poll(0.1)
            if msg is not None and msg.error() is None:
                consumed.add((msg.partition(), msg.offset()))
        shares = [sorted(tp.partition for tp in m.assignment()) for m in members]
        if len(consumed) == 40 and all(len(s) == 2 for s in shares):
            break
    assert sorted(sum(shares, [])) == [0, 1, 2, 3] and all(len(s) == 2 for s in shares)
    assert sorted(consumed) == [(p, o) for p in range(4) for o in range(10)]
    for member in members:
        member.commit(asynchronous=False)

    described = admin.describe_consumer_groups(["shop"])["shop"].result(10)
    assert str(described.state).endswith("STABLE")
    assert sorted(tp.partition for m in described.members for tp in m.assignment.topic_partitions) == [0, 1, 2, 3]
    listed = admin.list_consumer_groups().result(10)
    assert "shop" in {g.group_id for g in listed.valid}
    for member in members:
        member.close()

    from confluent_kafka import ConsumerGroupTopicPartitions

    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("shop")])["shop"].result(10)
    assert sorted((tp.partition, tp.offset) for tp in offsets.topic_partitions) == [(p, 10) for p in range(4)]
    rewind = ConsumerGroupTopicPartitions("shop", [TopicPartition("orders", 0, 3)])
    admin.alter_consumer_group_offsets([rewind])["shop"].result(10)
    resumed = Consumer(config)
    resumed.assign([TopicPartition("orders", 0)])
    committed = resumed.committed([TopicPartition("orders", 0)], timeout=10)
    assert committed[0].offset == 3
    resumed.close()
    admin.delete_consumer_groups(["shop"])["shop"].result(10)
    assert "shop" not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}
