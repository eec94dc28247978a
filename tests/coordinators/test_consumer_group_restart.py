"""A KIP-848 consumer group survives a ``kbroker`` process restart, as in Kafka: a librdkafka consumer with
group.protocol=consumer keeps its member id, member epoch, partitions and committed offsets, and reads nothing
twice; Kafka's own dump tool decodes the ConsumerGroup* records kbroker wrote (run under the JVM lock)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat.apache_kafka import KAFKA_VERSION
from kbroker.groups.offsets import OFFSETS_TOPIC
from kbroker.java_hashing import coordinator_partition
from kbroker.testing import BrokerProcess
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest
from protocol.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest

PARTITIONS = 3
PER_PARTITION = 10
OFFSETS_PARTITIONS = 4
SETTINGS = {
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.heartbeat.interval.ms": "500",
    "group.consumer.min.heartbeat.interval.ms": "100",
    "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
}
WAIT_SECONDS = 90  # a generous bound for anything to happen, never a speed check


def produce(bootstrap: str, start: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(PARTITIONS * PER_PARTITION):
        producer.produce("orders", value=f"{start + i}".encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def describe(bootstrap: str) -> tuple[int, int, list[tuple[str, int, list[int]]]]:
    """(group epoch, assignment epoch, [(member id, member epoch, assigned partitions)]) of group "kept"."""
    with WireClient(bootstrap) as client:
        [group] = client.request(ConsumerGroupDescribeRequest(group_ids=["kept"]), 1).groups
    assert group.error_code == ErrorCode.NONE, group.error_message
    members = [
        (m.member_id, m.member_epoch, [p for tp in m.assignment.topic_partitions for p in tp.partitions])
        for m in group.members
    ]
    return group.group_epoch, group.assignment_epoch, members


def consume_until(consumer: Consumer, seen: list[tuple[int, int]], count: int) -> None:
    """Poll, committing each batch synchronously, until ``count`` records were read in all."""
    deadline = time.monotonic() + WAIT_SECONDS
    while len(seen) < count and time.monotonic() < deadline:
        messages = consumer.consume(100, 0.2)
        batch = [(m.partition(), m.offset()) for m in messages if m.error() is None]
        if batch:
            consumer.commit(asynchronous=False)
            seen.extend(batch)


def wait_stable(bootstrap: str, consumer: Consumer) -> tuple[int, int, list[tuple[str, int, list[int]]]]:
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        consumer.poll(0.1)
        state = describe(bootstrap)
        epoch, assignment_epoch, members = state
        if len(members) == 1 and members[0][1] == epoch == assignment_epoch and len(members[0][2]) == PARTITIONS:
            return state
    raise AssertionError(f"the group did not settle: {describe(bootstrap)}")


def test_a_consumer_protocol_member_keeps_its_id_epoch_partitions_and_offsets_across_a_restart(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(data, SETTINGS).start()
    consumer: Consumer | None = None
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("orders", PARTITIONS, 1)])["orders"].result(timeout=30)
        produce(broker.bootstrap, 0)
        config = {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "kept",
            "group.protocol": "consumer",
            "client.id": "keeper",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
        consumer = Consumer(config)
        consumer.subscribe(["orders"])
        seen: list[tuple[int, int]] = []
        consume_until(consumer, seen, PARTITIONS * PER_PARTITION)
        # A second member joins and leaves, so the group's epoch is past what a group made afresh would have.
        with WireClient(broker.bootstrap) as client:
            joined = client.request(
                ConsumerGroupHeartbeatRequest(
                    group_id="kept",
                    member_id="passer-by",
                    member_epoch=0,
                    rebalance_timeout_ms=30000,
                    subscribed_topic_names=["orders"],
                    topic_partitions=[],
                ),
                1,
            )
            assert joined.error_code == ErrorCode.NONE
            left = client.request(
                ConsumerGroupHeartbeatRequest(group_id="kept", member_id="passer-by", member_epoch=-1), 1
            )
            assert left.error_code == ErrorCode.NONE
        before = wait_stable(broker.bootstrap, consumer)
        group_epoch, _, [(member_id, member_epoch, partitions)] = before
        assert group_epoch == member_epoch == 3 and partitions == [0, 1, 2]

        broker.stop()
        broker.start()  # the same port: the consumer reconnects by itself
        produce(broker.bootstrap, 1000)
        consume_until(consumer, seen, 2 * PARTITIONS * PER_PARTITION)
        after = describe(broker.bootstrap)
        committed = consumer.committed([TopicPartition("orders", p) for p in range(PARTITIONS)], timeout=30)
        assignment = sorted(tp.partition for tp in consumer.assignment())
    finally:
        if consumer is not None:
            consumer.close()
        broker.stop()
    # Not one record twice, none missed, and the second half read from the offsets committed before the restart.
    assert len(seen) == len(set(seen))
    assert sorted(seen) == [(p, o) for p in range(PARTITIONS) for o in range(2 * PER_PARTITION)]
    assert [(tp.partition, tp.offset) for tp in committed] == [(p, 2 * PER_PARTITION) for p in range(PARTITIONS)]
    # The same member at the same epoch with the same partitions: no rejoin, no rebalance.
    assert after == (3, 3, [(member_id, 3, [0, 1, 2])])
    assert assignment == [0, 1, 2]


def test_kafkas_dump_tool_decodes_the_consumer_group_records(tmp_path: Path) -> None:
    from tools import maven_artifacts

    data = tmp_path / "data"
    broker = BrokerProcess(data, SETTINGS).start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("orders", PARTITIONS, 1)])["orders"].result(timeout=30)
        with WireClient(broker.bootstrap) as client:
            joined = client.request(
                ConsumerGroupHeartbeatRequest(
                    group_id="dumped",
                    member_id="m-1",
                    member_epoch=0,
                    rebalance_timeout_ms=30000,
                    subscribed_topic_names=["orders"],
                    topic_partitions=[],
                ),
                1,
            )
            assert (joined.error_code, joined.member_epoch) == (ErrorCode.NONE, 1)
            left = client.request(ConsumerGroupHeartbeatRequest(group_id="dumped", member_id="m-1", member_epoch=-1), 1)
            assert left.error_code == ErrorCode.NONE
    finally:
        broker.stop()
    classpath = maven_artifacts.classpath(f"kafka-tools-{KAFKA_VERSION}")
    segment = (
        data / f"{OFFSETS_TOPIC}-{coordinator_partition('dumped', OFFSETS_PARTITIONS)}" / "00000000000000000000.log"
    )
    command = ["java", "-cp", classpath, "org.apache.kafka.tools.DumpLogSegments", "--offsets-decoder"]
    out = subprocess.run([*command, "--files", str(segment)], capture_output=True, text=True, timeout=120, check=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("| offset:")]
    member = '"groupId":"dumped","memberId":"m-1"'
    expected = [
        (f'key: {{"type":"5","data":{{{member}}}}}', '"clientId":"'),
        ('key: {"type":"3","data":{"groupId":"dumped"}}', '"epoch":1'),
        (f'key: {{"type":"7","data":{{{member}}}}}', '"partitions":[0,1,2]'),
        ('key: {"type":"6","data":{"groupId":"dumped"}}', '"assignmentEpoch":1'),
        (f'key: {{"type":"8","data":{{{member}}}}}', '"memberEpoch":1,"previousMemberEpoch":0,"state":0'),
        (f'key: {{"type":"8","data":{{{member}}}}}', "payload: <DELETE>"),
        (f'key: {{"type":"7","data":{{{member}}}}}', "payload: <DELETE>"),
        (f'key: {{"type":"5","data":{{{member}}}}}', "payload: <DELETE>"),
        ('key: {"type":"3","data":{"groupId":"dumped"}}', '"epoch":2'),
    ]
    assert len(lines) == len(expected), out.stdout
    for line, (key, payload) in zip(lines, expected, strict=True):
        assert key in line and payload in line, line
