"""Hanging transactions (issue #26): a commit marker lost to a crash is written again by the coordinator at
restart, with no manual step; one the coordinator cannot know about is found (``find-hanging``) and aborted with
WriteTxnMarkers, as KIP-664's tools do.

The reproduction: a transactional producer (confluent-kafka) commits one record to a one-partition topic, the
broker is killed (SIGKILL), the last 10 bytes of the active segment (the commit marker) are cut, and the broker
restarts. Log recovery drops the torn marker: the partition holds the transaction open, the last stable offset
stays at 0 and every other transactional producer's records stay invisible to read_committed consumers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kbroker.cli import main
from kbroker.testing import BrokerProcess
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.describe_producers_request import DescribeProducersRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch, decode_records, iter_batches
from tools import maven_artifacts

READ_UNCOMMITTED, READ_COMMITTED = 0, 1
HOUR_MS = 3_600_000
KAFKA_TOOLS = "kafka-tools-4.4.0"  # tools/maven/kafka-tools-4.4.0.pom.xml: kafka-transactions.sh's classes


@pytest.fixture(scope="module")
def kafka_transactions() -> list[str]:
    """The command line of Kafka's ``kafka-transactions.sh`` (TransactionsCommand), from the Maven jars."""
    try:
        jars = maven_artifacts.prepare(KAFKA_TOOLS)
    except maven_artifacts.MavenUnavailable as exc:
        pytest.skip(f"{KAFKA_TOOLS} unavailable (python tools/maven_artifacts.py {KAFKA_TOOLS}): {exc}")
    classpath = ":".join(str(jar) for jar in sorted(jars.glob("*.jar")))
    return ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", classpath, TRANSACTIONS_COMMAND]


TRANSACTIONS_COMMAND = "org.apache.kafka.tools.TransactionsCommand"


def create_topic(bootstrap: str, topic: str) -> None:
    with WireClient(bootstrap) as client:
        creatable = CreateTopicsRequest.CreatableTopic(name=topic, num_partitions=1, replication_factor=1)
        answer = client.request(CreateTopicsRequest(topics=[creatable], timeout_ms=10_000), 7)
        assert answer.topics[0].error_code == ErrorCode.NONE


def commit_with_confluent_kafka(bootstrap: str, transactional_id: str, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value)
    producer.commit_transaction(30)


def latest(client: WireClient, topic: str, isolation: int) -> int:
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)]
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=isolation,
        topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=wanted)],
    )
    answer = client.request(request, 7).topics[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE
    return int(answer.offset)


def committed_values(client: WireClient, topic: str) -> list[bytes | None]:
    """What a read_committed consumer gets from offset 0: aborted transactions dropped, as clients drop them."""
    partition = FetchRequest.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=READ_COMMITTED,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
    )
    answer = client.request(request, 11).responses[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE
    aborted = sorted((a.first_offset, a.producer_id) for a in answer.aborted_transactions or [])
    dropping: set[int] = set()
    values: list[bytes | None] = []
    for header, view in iter_batches(bytes(answer.records or b"")):
        while aborted and aborted[0][0] <= header.base_offset:
            dropping.add(aborted.pop(0)[1])
        if header.is_control:
            dropping.discard(header.producer_id)
        elif header.producer_id not in dropping:
            values.extend(record.value for record in decode_records(view))
    return values


def open_transactions(client: WireClient, topic: str) -> list[tuple[int, int]]:
    """(producer id, first offset) of each transaction the partition holds open (DescribeProducers)."""
    request = DescribeProducersRequest(
        topics=[DescribeProducersRequest.TopicRequest(name=topic, partition_indexes=[0])]
    )
    answer = client.request(request, 0).topics[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE
    return [
        (p.producer_id, p.current_txn_start_offset) for p in answer.active_producers if p.current_txn_start_offset >= 0
    ]


def cut_active_segment(partition_dir: Path, count: int) -> None:
    active = max(partition_dir.glob("*.log"))
    size = active.stat().st_size
    with open(active, "r+b") as segment:
        segment.truncate(size - count)


def test_a_commit_marker_cut_by_recovery_is_written_again_at_restart(tmp_path: Path) -> None:
    topic = "torn"
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir).start()
    try:
        create_topic(broker.bootstrap, topic)
        commit_with_confluent_kafka(broker.bootstrap, "torn-id", topic, [b"first"])  # record 0, marker 1
        broker.kill()
        cut_active_segment(data_dir / f"{topic}-0", 10)  # inside the commit marker
        broker.start()
        with WireClient(broker.bootstrap) as client:
            # The marker is back: the transaction committed, its record visible, nothing held open.
            assert latest(client, topic, READ_UNCOMMITTED) == 2
            assert latest(client, topic, READ_COMMITTED) == 2
            assert open_transactions(client, topic) == []
            assert committed_values(client, topic) == [b"first"]
        # Another transactional id commits on the partition: its records are visible to read_committed.
        commit_with_confluent_kafka(broker.bootstrap, "other-id", topic, [b"second"])  # record 2, marker 3
        with WireClient(broker.bootstrap) as client:
            assert latest(client, topic, READ_COMMITTED) == latest(client, topic, READ_UNCOMMITTED) == 4
            assert committed_values(client, topic) == [b"first", b"second"]
    finally:
        broker.kill()


class RawTransaction:
    """A transaction begun by hand on partition 0 (InitProducerId, AddPartitionsToTxn, Produce), its batch stamped
    an hour ago so that it is older than any transaction timeout."""

    def __init__(self, client: WireClient, transactional_id: str, topic: str, values: list[bytes]) -> None:
        answer = client.request(
            InitProducerIdRequest(transactional_id=transactional_id, transaction_timeout_ms=60_000), 4
        )
        assert answer.error_code == ErrorCode.NONE
        self.producer_id, self.producer_epoch = answer.producer_id, answer.producer_epoch
        add = AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=self.producer_id,
            v3_and_below_producer_epoch=self.producer_epoch,
            v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=[0])],
        )
        added = client.request(add, 3).results_by_topic_v3_and_below[0].results_by_partition[0]
        assert added.partition_error_code == ErrorCode.NONE
        self.timestamp = int(time.time() * 1000) - HOUR_MS
        records = [Record(offset_delta=i, timestamp_delta=0, value=v) for i, v in enumerate(values)]
        batch = build_batch(
            records,
            base_timestamp=self.timestamp,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            base_sequence=0,
            is_transactional=True,
        )
        produce = ProduceRequest(
            transactional_id=transactional_id,
            acks=-1,
            timeout_ms=10_000,
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name=topic, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
                )
            ],
        )
        answer = client.request(produce, 9).responses[0].partition_responses[0]
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 0)


def hanging_transaction(tmp_path: Path, topic: str) -> tuple[BrokerProcess, RawTransaction]:
    """A broker whose partition holds open a transaction its coordinator knows nothing of: begun, then the broker
    killed and its transaction state lost (as if ``__transaction_state`` were gone), then restarted."""
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir).start()
    try:
        create_topic(broker.bootstrap, topic)
        with WireClient(broker.bootstrap) as client:
            transaction = RawTransaction(client, "lost-id", topic, [b"hanging"])
        broker.kill()
        for partition in data_dir.glob("__transaction_state-*"):
            shutil.rmtree(partition)  # the topic's partitions come back empty
        broker.start()
        with WireClient(broker.bootstrap) as client:
            assert open_transactions(client, topic) == [(transaction.producer_id, 0)]
            assert latest(client, topic, READ_COMMITTED) == 0
    except BaseException:
        broker.kill()
        raise
    return broker, transaction


@pytest.fixture
def hanging(tmp_path: Path) -> Iterator[tuple[BrokerProcess, RawTransaction]]:
    broker, transaction = hanging_transaction(tmp_path, "hang")
    try:
        yield broker, transaction
    finally:
        broker.kill()


def run_tool(command: list[str], bootstrap: str, *args: str) -> list[list[str]]:
    """Run kafka-transactions.sh; the rows of the table it prints (its header first)."""
    done = subprocess.run(
        [*command, "--bootstrap-server", bootstrap, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return [line.split() for line in done.stdout.splitlines() if line.strip()]


def test_kafka_transactions_tool_finds_and_aborts_a_hanging_transaction(
    hanging: tuple[BrokerProcess, RawTransaction], kafka_transactions: list[str]
) -> None:
    broker, transaction = hanging
    found = run_tool(kafka_transactions, broker.bootstrap, "find-hanging", "--broker-id", "0")
    assert found[0] == [
        "Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset", "LastTimestamp",
        "Duration(min)",
    ]  # fmt: skip
    assert [row[:7] for row in found[1:]] == [
        [
            "hang",
            "0",
            str(transaction.producer_id),
            str(transaction.producer_epoch),
            "-1",
            "0",
            str(transaction.timestamp),
        ]
    ]
    assert int(found[1][7]) >= 60
    # Admin abortTransaction: WriteTxnMarkers with the producer DescribeProducers reports at that start offset.
    assert (
        run_tool(
            kafka_transactions, broker.bootstrap, "abort", "--topic", "hang", "--partition", "0", "--start-offset", "0"
        )
        == []
    )
    with WireClient(broker.bootstrap) as client:
        assert open_transactions(client, "hang") == []
        assert latest(client, "hang", READ_COMMITTED) == latest(client, "hang", READ_UNCOMMITTED) == 2
        assert committed_values(client, "hang") == []  # the hanging record was aborted
    assert run_tool(kafka_transactions, broker.bootstrap, "find-hanging", "--broker-id", "0")[1:] == []
    commit_with_confluent_kafka(broker.bootstrap, "after-id", "hang", [b"after"])  # record 2, marker 3
    with WireClient(broker.bootstrap) as client:
        assert latest(client, "hang", READ_COMMITTED) == 4
        assert committed_values(client, "hang") == [b"after"]


def kbroker_transactions(capsys: pytest.CaptureFixture[str], bootstrap: str, *args: str) -> Any:
    """``kbroker transactions ... -o json``, run here: its JSON answer (the command must succeed)."""
    capsys.readouterr()
    code = main(["transactions", *args, "--bootstrap", bootstrap, "-o", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_kbroker_transactions_finds_and_aborts_a_hanging_transaction(
    hanging: tuple[BrokerProcess, RawTransaction], capsys: pytest.CaptureFixture[str]
) -> None:
    broker, transaction = hanging
    found = kbroker_transactions(capsys, broker.bootstrap, "find-hanging", "--broker-id", "0")
    assert len(found) == 1 and found[0]["duration_min"] >= 60
    assert found == [
        {
            "topic": "hang",
            "partition": 0,
            "producer_id": transaction.producer_id,
            "producer_epoch": transaction.producer_epoch,
            "coordinator_epoch": -1,
            "start_offset": 0,
            "last_timestamp": transaction.timestamp,
            "duration_min": found[0]["duration_min"],
        }
    ]
    # Younger than the maximum transaction timeout asked for: not a candidate.
    assert (
        kbroker_transactions(
            capsys, broker.bootstrap, "find-hanging", "--topic", "hang", "--max-transaction-timeout", "90"
        )
        == []
    )
    aborted = kbroker_transactions(
        capsys, broker.bootstrap, "abort", "--topic", "hang", "--partition", "0", "--start-offset", "0"
    )
    assert aborted == {
        "topic": "hang",
        "partition": 0,
        "producer_id": transaction.producer_id,
        "producer_epoch": transaction.producer_epoch,
        "coordinator_epoch": 0,
    }
    with WireClient(broker.bootstrap) as client:
        assert open_transactions(client, "hang") == []
        assert latest(client, "hang", READ_COMMITTED) == 2
    assert kbroker_transactions(capsys, broker.bootstrap, "find-hanging", "--broker-id", "0") == []
