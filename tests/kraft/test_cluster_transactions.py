"""Transactions across three kbroker brokers under a real Apache Kafka 4.4 controller, with the transaction
coordinator, the partitions' leaders and the group coordinator on different brokers.

The transaction coordinator writes the markers of the partitions other brokers lead with WriteTxnMarkers sent to
those leaders, and completes the transaction once all are written; a transactional produce reaching a leader whose
coordinator is another broker is verified there with AddPartitionsToTxn (verify_only). confluent-kafka commits and
aborts across the three leaders, and a read_committed consumer reads exactly the committed records at their exact
offsets (each marker one offset); a consume-transform-produce's offsets, committed to a group coordinator on another
broker than the transaction coordinator, become visible with the transaction's commit and never with its abort.
The data topic has one replica or three; Java clients 3.9 (transaction version 1) and 4.4 (version 2, partitions
added by the brokers) run tests/transactions' scenario with the three roles on three brokers."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat.apache_kafka import KafkaController
from kbroker.java_hashing import coordinator_partition
from kbroker.testing import BrokerProcess
from kbroker.wire_client import WireClient
from protocol.messages.metadata_request import MetadataRequest
from tests.kraft.conftest import WITHIN, broker_role_settings
from tests.kraft.test_serve_broker_role import format_data_dir

JavaProgram = Callable[..., list[str]]  # the java_program fixture (tests/conftest.py)
JAVA_SCENARIO = Path(__file__).parents[1] / "transactions" / "java" / "TransactionalScenario.java"
NODES = (31, 32, 33)
INTERNAL_PARTITIONS = 3
TOPIC = "spread"
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(controller: KafkaController, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[BrokerProcess]]:
    root = tmp_path_factory.mktemp("brokers")
    brokers: list[BrokerProcess] = []
    try:
        for node_id in NODES:
            data_dir = root / f"node-{node_id}"
            format_data_dir(data_dir, controller.cluster_id, node_id)
            settings = {
                **broker_role_settings(controller, node_id),
                # Internal partitions spread over the three brokers, one replica each.
                "offsets.topic.num.partitions": str(INTERNAL_PARTITIONS),
                "transaction.state.log.num.partitions": str(INTERNAL_PARTITIONS),
            }
            brokers.append(BrokerProcess(data_dir, settings, log_level="INFO").start(timeout=WITHIN))
        yield brokers
    finally:
        for broker in brokers:
            broker.stop()


def eventually(probe: Callable[[], T | None], what: str) -> T:
    """``probe``'s first answer that is not None, asked every 0.2 s (a bound against hanging, not a measure)."""
    deadline = time.monotonic() + WITHIN
    while time.monotonic() < deadline:
        answer = probe()
        if answer is not None:
            return answer
        time.sleep(0.2)
    raise AssertionError(f"not within {WITHIN} s: {what}")


def leaders(broker: BrokerProcess, topic: str) -> dict[int, int] | None:
    """Each partition's leader as Metadata names it; None until every partition has one."""
    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False
    )
    with WireClient(broker.bootstrap) as client:
        answer = client.request(request, 12)
    [described] = answer.topics
    if described.error_code or not described.partitions or any(p.leader_id < 0 for p in described.partitions):
        return None
    return {p.partition_index: p.leader_id for p in described.partitions}


def bootstrap(cluster: list[BrokerProcess]) -> str:
    return ",".join(b.bootstrap for b in cluster)


def internal_leaders(cluster: list[BrokerProcess], topic: str, first_use: Callable[[], None]) -> dict[int, int]:
    """The leaders of an internal topic's partitions, once ``first_use`` (a coordinator lookup) made it exist."""
    first_use()
    return eventually(lambda: leaders(cluster[0], topic), f"{topic} with its leaders")


def find_id(prefix: str, wanted: Callable[[int], bool]) -> str:
    """The first ``prefix-N`` whose internal partition satisfies ``wanted``."""
    return next(
        f"{prefix}-{n}" for n in range(1000) if wanted(coordinator_partition(f"{prefix}-{n}", INTERNAL_PARTITIONS))
    )


def make_topic(cluster: list[BrokerProcess], name: str, replication_factor: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    # Partition i led by NODES[i] (the first replica listed), followed by the next ones.
    assignment = [[NODES[(i + r) % len(NODES)] for r in range(replication_factor)] for i in range(len(NODES))]
    admin.create_topics([NewTopic(name, num_partitions=len(NODES), replica_assignment=assignment)])[name].result(
        timeout=WITHIN
    )
    assert eventually(lambda: leaders(cluster[0], name), f"{name}'s leaders") == dict(enumerate(NODES))


def committed_reader(cluster: list[BrokerProcess], group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap(cluster),
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )


def read_all(consumer: Consumer, topic: str, ends: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    """Every record (offset, value) a consumer reads from each partition until its position reaches ``ends``."""
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    seen: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
    deadline = time.monotonic() + WITHIN
    while time.monotonic() < deadline:
        positions = {tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p) for p in ends])}
        if all(positions[p] >= end for p, end in ends.items()):
            return seen
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        seen[message.partition()].append((message.offset(), message.value()))
    raise AssertionError(f"positions did not reach {ends}: read {seen}")


@pytest.mark.parametrize("replication_factor", [1, 3])
def test_commit_and_abort_across_three_leaders(cluster: list[BrokerProcess], replication_factor: int) -> None:
    topic = f"{TOPIC}-rf{replication_factor}"
    make_topic(cluster, topic, replication_factor)
    # The transaction coordinator: the leader of the id's __transaction_state partition, not a data leader alone.
    probe = Producer({"bootstrap.servers": bootstrap(cluster), "transactional.id": "probe"})
    state_leaders = internal_leaders(cluster, "__transaction_state", lambda: probe.init_transactions(WITHIN))
    assert sorted(set(state_leaders.values())) == sorted(NODES)  # spread: one partition on each broker
    transactional_id = find_id(f"{topic}-txn", lambda p: state_leaders[p] == NODES[0])

    producer = Producer({"bootstrap.servers": bootstrap(cluster), "transactional.id": transactional_id, "linger.ms": 0})
    producer.init_transactions(WITHIN)
    plan = [("commit", [b"a", b"b"]), ("abort", [b"x"]), ("commit", [b"c"])]
    for outcome, values in plan:
        producer.begin_transaction()
        for partition in range(len(NODES)):
            for value in values:
                producer.produce(topic, value=value + str(partition).encode(), partition=partition)
        producer.flush(WITHIN)
        if outcome == "commit":
            producer.commit_transaction(WITHIN)
        else:
            producer.abort_transaction(WITHIN)

    # Per partition: a, b at 0-1, commit marker 2; x at 3, abort marker 4; c at 5, commit marker 6.
    for partition in range(len(NODES)):
        low, high = eventually(
            lambda p=partition: (lambda w: w if w[1] == 7 else None)(
                committed_reader(cluster, "watermarks").get_watermark_offsets(TopicPartition(topic, p), WITHIN)
            ),
            f"partition {partition}'s markers written",
        )
        assert (low, high) == (0, 7)
    reader = committed_reader(cluster, "reader")
    try:
        seen = read_all(reader, topic, dict.fromkeys(range(len(NODES)), 7))
    finally:
        reader.close()
    assert seen == {p: [(0, b"a%d" % p), (1, b"b%d" % p), (5, b"c%d" % p)] for p in range(len(NODES))}


def test_consume_transform_produce_with_group_coordinator_elsewhere(cluster: list[BrokerProcess]) -> None:
    source, sink = "ctp-in", "ctp-out"
    make_topic(cluster, source)
    make_topic(cluster, sink)
    plain = Producer({"bootstrap.servers": bootstrap(cluster), "linger.ms": 0})
    for partition in range(len(NODES)):
        for n in range(4):
            plain.produce(source, value=b"in-%d-%d" % (partition, n), partition=partition)
    assert plain.flush(WITHIN) == 0

    probe = Producer({"bootstrap.servers": bootstrap(cluster), "transactional.id": "probe"})
    state_leaders = internal_leaders(cluster, "__transaction_state", lambda: probe.init_transactions(WITHIN))
    lookup = committed_reader(cluster, "probe-group")
    offsets_leaders = internal_leaders(
        cluster, "__consumer_offsets", lambda: lookup.committed([TopicPartition(source, 0)], WITHIN)
    )
    lookup.close()
    transactional_id = find_id("ctp-txn", lambda p: state_leaders[p] == NODES[1])
    group = find_id("ctp-group", lambda p: offsets_leaders[p] == NODES[2])

    consumer = committed_reader(cluster, group)
    producer = Producer({"bootstrap.servers": bootstrap(cluster), "transactional.id": transactional_id})
    producer.init_transactions(WITHIN)
    try:
        consumer.assign([TopicPartition(source, p, 0) for p in range(len(NODES))])
        batch = []
        while len(batch) < 2 * len(NODES):  # two records of each partition
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            if message.offset() < 2:
                batch.append(message)

        def transform(aborted: bool) -> None:
            producer.begin_transaction()
            for message in batch:
                producer.produce(sink, value=b"out-" + message.value(), partition=message.partition())
            assert producer.flush(WITHIN) == 0  # written before the abort (which would drop what is queued)
            next_offsets = [TopicPartition(source, p, 4 if aborted else 2) for p in range(len(NODES))]
            producer.send_offsets_to_transaction(next_offsets, consumer.consumer_group_metadata(), WITHIN)
            if aborted:
                producer.abort_transaction(WITHIN)
            else:
                producer.commit_transaction(WITHIN)

        transform(aborted=False)
        checker = committed_reader(cluster, group)
        try:
            committed = eventually(
                lambda: (lambda c: c if all(tp.offset == 2 for tp in c) else None)(
                    checker.committed([TopicPartition(source, p) for p in range(len(NODES))], WITHIN)
                ),
                "the transaction's offsets committed",
            )
            assert [(tp.partition, tp.offset) for tp in committed] == [(p, 2) for p in range(len(NODES))]
            transform(aborted=True)
            # The abort's offsets (4) never show: once its markers are written the group still has 2.
            ends = dict.fromkeys(range(len(NODES)), 6)  # 2 committed + marker, 2 aborted + marker
            reader = committed_reader(cluster, "ctp-reader")
            try:
                seen = read_all(reader, sink, ends)
            finally:
                reader.close()
            assert seen == {p: [(0, b"out-in-%d-0" % p), (1, b"out-in-%d-1" % p)] for p in range(len(NODES))}
            after = checker.committed([TopicPartition(source, p) for p in range(len(NODES))], WITHIN)
            assert [(tp.partition, tp.offset) for tp in after] == [(p, 2) for p in range(len(NODES))]
        finally:
            checker.close()
    finally:
        consumer.close()


@pytest.mark.parametrize("version", ["3.9.0", "4.4.0"])
def test_java_transactions_with_three_coordinators_apart(
    cluster: list[BrokerProcess], java_program: JavaProgram, version: str
) -> None:
    """tests/transactions' Java scenario (commit with sendOffsetsToTransaction, abort, commit, a fenced zombie)
    with the partition's leader, the transaction coordinator and the group coordinator on three brokers:
    kafka-clients 3.9 (transaction version 1) and 4.4 (version 2, EndTxn bumping the epoch)."""
    name = f"java-apart-{version.replace('.', '')}"
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    admin.create_topics([NewTopic(name, num_partitions=1, replica_assignment=[[NODES[2]]])])[name].result(
        timeout=WITHIN
    )
    assert eventually(lambda: leaders(cluster[0], name), f"{name}'s leader") == {0: NODES[2]}
    probe = Producer({"bootstrap.servers": bootstrap(cluster), "transactional.id": "probe"})
    state_leaders = internal_leaders(cluster, "__transaction_state", lambda: probe.init_transactions(WITHIN))
    lookup = committed_reader(cluster, "probe-group")
    offsets_leaders = internal_leaders(
        cluster, "__consumer_offsets", lambda: lookup.committed([TopicPartition(name, 0)], WITHIN)
    )
    lookup.close()
    transactional_id = find_id(f"{name}-id", lambda p: state_leaders[p] == NODES[0])
    group = find_id(f"{name}-group", lambda p: offsets_leaders[p] == NODES[1])

    command = java_program(JAVA_SCENARIO, version)
    done = subprocess.run(
        [*command, bootstrap(cluster), name, group, transactional_id], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    expected = [f"commit-a-{i}" for i in range(10)] + [f"commit-b-{i}" for i in range(5)]
    assert lines["read_committed"].split(",") == expected
    assert lines["read_uncommitted"] == "25"
    assert lines["group_offset"] == "7"
    assert lines["zombie"] in ("ProducerFencedException", "InvalidProducerEpochException"), lines["zombie"]
    assert lines["last"] == "successor-0 count=16"
