"""Two kbroker brokers under a real Apache Kafka 4.4 controller: what clients see of the cluster is the metadata
image's, the same from either broker. Metadata lists both brokers and each partition's leader; a produce or fetch
sent to the broker that does not lead the partition is refused NOT_LEADER_OR_FOLLOWER naming the leader and its
endpoint (KIP-951); FindCoordinator answers COORDINATOR_NOT_AVAILABLE at once while __consumer_offsets is created,
then names the leader of the group's partition from either broker, the other answering NOT_COORDINATOR;
confluent-kafka produces to and consumes from both leaders exactly."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat.apache_kafka import KafkaController
from kbroker.testing import BrokerProcess
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.describe_cluster_request import DescribeClusterRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.metadata_response import MetadataResponse
from protocol.messages.offset_commit_request import OffsetCommitRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch
from tests.kraft.test_serve_broker_role import WITHIN, format_data_dir

FIRST, SECOND = 21, 22
TOPIC = "split"
T = TypeVar("T")


def start_broker(controller: KafkaController, data_dir: Path, node_id: int) -> BrokerProcess:
    format_data_dir(data_dir, controller.cluster_id, node_id)
    settings = {
        "process.roles": "broker",
        "node.id": str(node_id),
        "controller.quorum.bootstrap.servers": controller.bootstrap,
        "controller.listener.names": "CONTROLLER",
        "broker.heartbeat.interval.ms": "500",
        "offsets.topic.num.partitions": "4",
        "offsets.topic.replication.factor": "2",  # both brokers: Kafka's default of 3 needs a third
    }
    return BrokerProcess(data_dir, settings, log_level="INFO").start(timeout=WITHIN)


def eventually(probe: Callable[[], T | None], what: str) -> T:
    """``probe``'s first answer that is not None, asked every 0.2 s (a bound against hanging, not a measure)."""
    deadline = time.monotonic() + WITHIN
    while time.monotonic() < deadline:
        answer = probe()
        if answer is not None:
            return answer
        time.sleep(0.2)
    raise AssertionError(f"not within {WITHIN} s: {what}")


def metadata(broker: BrokerProcess, version: int = 12) -> MetadataResponse:
    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)], allow_auto_topic_creation=False
    )
    with WireClient(broker.bootstrap) as client:
        answer: MetadataResponse = client.request(request, version)
    return answer


def leaders_known(broker: BrokerProcess) -> MetadataResponse | None:
    answer = metadata(broker)
    [topic] = answer.topics
    if len(answer.brokers) < 2 or topic.error_code or any(p.error_code for p in topic.partitions):
        return None
    return answer


def test_two_kbroker_brokers_name_each_other_and_their_leaders(controller: KafkaController, tmp_path: Path) -> None:
    first = start_broker(controller, tmp_path / "first", FIRST)
    second = start_broker(controller, tmp_path / "second", SECOND)
    try:
        admin = AdminClient({"bootstrap.servers": first.bootstrap})
        # Partition 0 on the first broker, partition 1 on the second (replication factor 1).
        created = admin.create_topics([NewTopic(TOPIC, num_partitions=2, replica_assignment=[[FIRST], [SECOND]])])
        created[TOPIC].result(timeout=WITHIN)

        # Either broker answers the same: both brokers, each partition's own leader, replicas and ISR.
        expected_brokers = [(FIRST, "127.0.0.1", first.port, None), (SECOND, "127.0.0.1", second.port, None)]
        for broker in (first, second):
            answer = eventually(lambda b=broker: leaders_known(b), f"broker on {broker.port} naming both leaders")
            assert [(b.node_id, b.host, b.port, b.rack) for b in answer.brokers] == expected_brokers
            assert answer.controller_id in (FIRST, SECOND)
            [topic] = answer.topics
            assert [
                (p.partition_index, p.error_code, p.leader_id, p.leader_epoch, p.replica_nodes, p.isr_nodes)
                for p in topic.partitions
            ] == [(0, 0, FIRST, 0, [FIRST], [FIRST]), (1, 0, SECOND, 0, [SECOND], [SECOND])]
            assert [p.offline_replicas for p in topic.partitions] == [[], []]
            # Metadata v0 (no rack, no controller) and DescribeCluster say the same.
            oldest = metadata(broker, 0)
            assert [(b.node_id, b.port) for b in oldest.brokers] == [(FIRST, first.port), (SECOND, second.port)]
            assert [p.leader_id for p in oldest.topics[0].partitions] == [FIRST, SECOND]
            with WireClient(broker.bootstrap) as client:
                cluster = client.request(DescribeClusterRequest(), 1)
            assert [(b.broker_id, b.port, b.is_fenced) for b in cluster.brokers] == [
                (FIRST, first.port, False),
                (SECOND, second.port, False),
            ]

        # A produce of partition 1 sent to the first broker: NOT_LEADER_OR_FOLLOWER naming the second (KIP-951).
        records = build_batch([Record(offset_delta=0, key=b"k", value=b"misdirected")])
        partition_data = [ProduceRequest.PartitionProduceData(index=1, records=records)]
        produce = ProduceRequest(
            acks=-1,
            timeout_ms=5000,
            topic_data=[ProduceRequest.TopicProduceData(name=TOPIC, partition_data=partition_data)],
        )
        with WireClient(first.bootstrap) as client:
            refused = client.request(produce, 11)
        [answer] = refused.responses[0].partition_responses
        assert (answer.index, answer.error_code, answer.base_offset) == (1, ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)
        assert (answer.current_leader.leader_id, answer.current_leader.leader_epoch) == (SECOND, 0)
        assert [(n.node_id, n.host, n.port) for n in refused.node_endpoints] == [(SECOND, "127.0.0.1", second.port)]

        # A consumer's fetch of partition 0 sent to the second broker: the same, naming the first.
        topic_id = answer_topic_id = metadata(second).topics[0].topic_id
        fetch = FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=1 << 20,
            topics=[
                FetchRequest.FetchTopic(
                    topic_id=topic_id,
                    partitions=[FetchRequest.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)],
                )
            ],
        )
        with WireClient(second.bootstrap) as client:
            fetched = client.request(fetch, 16)
        [data] = fetched.responses[0].partitions
        assert fetched.responses[0].topic_id == answer_topic_id
        assert (data.partition_index, data.error_code) == (0, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        assert (data.current_leader.leader_id, data.current_leader.leader_epoch) == (FIRST, 0)
        assert [(n.node_id, n.host, n.port) for n in fetched.node_endpoints] == [(FIRST, "127.0.0.1", first.port)]

        # The first FindCoordinator finds no __consumer_offsets: COORDINATOR_NOT_AVAILABLE at once, as Kafka answers
        # while the topic is created in the background; then both brokers name the same leader.
        find = FindCoordinatorRequest(key_type=0, coordinator_keys=["readers"])
        with WireClient(second.bootstrap) as client:
            [first_answer] = client.request(find, 4).coordinators
        assert (first_answer.error_code, first_answer.node_id) == (ErrorCode.COORDINATOR_NOT_AVAILABLE, -1)

        def coordinator(broker: BrokerProcess) -> tuple[int, int] | None:
            with WireClient(broker.bootstrap) as client:
                [found] = client.request(find, 4).coordinators
            return (found.node_id, found.port) if found.error_code == ErrorCode.NONE else None

        named = eventually(lambda: coordinator(second), "a coordinator for group readers")
        assert named in ((FIRST, first.port), (SECOND, second.port))
        assert eventually(lambda: coordinator(first), "the first broker naming it") == named
        # The other broker is not the group's coordinator: NOT_COORDINATOR, and the client looks again.
        other = first if named[0] == SECOND else second
        commit = OffsetCommitRequest(
            group_id="readers",
            topics=[
                OffsetCommitRequest.OffsetCommitRequestTopic(
                    name=TOPIC, partitions=[OffsetCommitRequest.OffsetCommitRequestPartition(committed_offset=1)]
                )
            ],
        )
        with WireClient(other.bootstrap) as client:
            misdirected = client.request(commit, 8)
        assert misdirected.topics[0].partitions[0].error_code == ErrorCode.NOT_COORDINATOR

        # confluent-kafka, bootstrapped from the first broker only, produces to both leaders.
        producer = Producer({"bootstrap.servers": first.bootstrap, "acks": "all", "enable.idempotence": True})
        delivered: list[tuple[int | None, int | None, bytes | None]] = []
        for index in range(6):
            producer.produce(
                TOPIC,
                value=f"v{index}".encode(),
                partition=index % 2,
                on_delivery=lambda err, msg: (
                    delivered.append((msg.partition(), msg.offset(), msg.value())) if err is None else None
                ),
            )
        assert producer.flush(WITHIN) == 0
        assert sorted(delivered, key=lambda d: (d[0] or 0, d[1] or 0)) == [
            (0, 0, b"v0"),
            (0, 1, b"v2"),
            (0, 2, b"v4"),
            (1, 0, b"v1"),
            (1, 1, b"v3"),
            (1, 2, b"v5"),
        ]

        # The group's coordinator is the leader of its __consumer_offsets partition, named alike by both brokers;
        # a consumer bootstrapped from the second broker reads every record of both partitions, exactly, and
        # commits its position there.
        consumer = Consumer({"bootstrap.servers": second.bootstrap, "group.id": "readers", "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(TOPIC, 0, 0), TopicPartition(TOPIC, 1, 0)])
            read: list[tuple[int | None, int | None, bytes | None]] = []
            deadline = time.monotonic() + WITHIN
            while len(read) < 6 and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    read.append((message.partition(), message.offset(), message.value()))
            assert sorted(read, key=lambda r: (r[0] or 0, r[1] or 0)) == sorted(
                delivered, key=lambda d: (d[0] or 0, d[1] or 0)
            )
            consumer.commit(asynchronous=False)
            committed = consumer.committed([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], timeout=WITHIN)
            assert [(c.partition, c.offset) for c in committed] == [(0, 3), (1, 3)]
        finally:
            consumer.close()

        # Each broker made the files of its own replicas only.
        assert [path.name for path in first.data_dir.glob(f"{TOPIC}-*")] == [f"{TOPIC}-0"]
        assert [path.name for path in second.data_dir.glob(f"{TOPIC}-*")] == [f"{TOPIC}-1"]

        # __consumer_offsets was created with offsets.topic.replication.factor: each partition on both brokers.
        wanted = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="__consumer_offsets")])
        with WireClient(first.bootstrap) as client:
            [offsets_topic] = client.request(wanted, 12).topics
        assert offsets_topic.error_code == ErrorCode.NONE and len(offsets_topic.partitions) == 4
        assert {tuple(sorted(p.replica_nodes)) for p in offsets_topic.partitions} == {(FIRST, SECOND)}
    finally:
        second.stop(timeout=WITHIN)
        first.stop(timeout=WITHIN)
