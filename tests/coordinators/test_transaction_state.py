"""Transaction state in __transaction_state (kbroker/transactions/state_log.py): Kafka's TransactionLog records,
which Kafka's own dump tool decodes, replayed at start-up."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from compat.apache_kafka import KAFKA_VERSION
from kbroker.groups.offsets import OffsetStore
from kbroker.java_hashing import coordinator_partition
from kbroker.storage import LogManager
from kbroker.testing import RunningBroker
from kbroker.transactions import coordinator as coordinator_module
from kbroker.transactions.coordinator import TransactionCoordinator
from kbroker.transactions.state_log import TRANSACTION_TOPIC
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.describe_transactions_request import DescribeTransactionsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.records import decode_records, iter_batches
from tests.coordinators.older_kbroker import masked_partition

TID = "dumped-txn"


def test_kafkas_dump_tool_decodes_the_transaction_log(tmp_path: Path) -> None:
    from tools import maven_artifacts

    classpath = maven_artifacts.classpath(f"kafka-tools-{KAFKA_VERSION}")
    logs = LogManager(tmp_path, {})
    coordinator = coordinator_in(tmp_path, logs, count(1000), partitions=3)
    assert coordinator.init_producer_id(TID, 60_000).error == ErrorCode.NONE
    assert coordinator.add_partitions(TID, 1000, 0, [("orders", 1), ("orders", 0)]) == ErrorCode.NONE
    assert coordinator.add_offsets(TID, 1000, 0, "readers") == ErrorCode.NONE
    logs.close()
    segment = tmp_path / f"{TRANSACTION_TOPIC}-{coordinator_partition(TID, 3)}" / "00000000000000000000.log"
    command = ["java", "-cp", classpath, "org.apache.kafka.tools.DumpLogSegments", "--transaction-log-decoder"]
    out = subprocess.run([*command, "--files", str(segment)], capture_output=True, text=True, timeout=120, check=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("| offset:")]
    assert len(lines) == 3
    key = 'key: {"type":"0","data":{"transactionalId":"dumped-txn"}}'
    assert all(key in line for line in lines)
    assert (
        'payload: {"version":"1","data":{"producerId":1000,"producerEpoch":0,"transactionTimeoutMs":60000,'
        '"transactionStatus":"Empty","transactionPartitions":[],"transactionLastUpdateTimestampMs":1700000000000,'
        '"transactionStartTimestampMs":-1,"clientTransactionVersion":1}}'
    ) in lines[0]
    # The group is listed as its __consumer_offsets partition, as Kafka lists it.
    group_partition = coordinator_partition("readers", 3)
    assert (
        '"transactionStatus":"Ongoing","transactionPartitions":[{"topic":"__consumer_offsets","partitionIds":['
        f'{group_partition}]}},{{"topic":"orders","partitionIds":[0,1]}}]'
    ) in lines[2]


def describe(bootstrap: str) -> tuple[int, int, str]:
    with WireClient(bootstrap) as client:
        [state] = client.request(DescribeTransactionsRequest(transactional_ids=["kept-txn"]), 0).transaction_states
    return state.producer_id, state.producer_epoch, state.transaction_state


def test_a_transactional_id_survives_a_restart_and_its_producer_goes_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with RunningBroker(data) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("orders", 1, 1)])["orders"].result(timeout=30)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "kept-txn"})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce("orders", b"one")
        producer.commit_transaction(30)
        producer_id, epoch, state = describe(broker.bootstrap)
        assert state == "CompleteCommit"
        with WireClient(broker.bootstrap) as client:
            topics = {t.name: t.is_internal for t in client.request(MetadataRequest(topics=None), 12).topics}
        assert topics[TRANSACTION_TOPIC] is True
    with RunningBroker(data) as broker:
        assert describe(broker.bootstrap) == (producer_id, epoch, "CompleteCommit")
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "kept-txn"})
        producer.init_transactions(30)  # the next instance fences the last: the same id, the epoch bumped
        assert describe(broker.bootstrap)[:2] == (producer_id, epoch + 1)


def coordinator_in(
    data_dir: Path, logs: LogManager, next_ids: Iterator[int], partitions: int = 5
) -> TransactionCoordinator:
    """A single node's transaction coordinator over ``logs``, both internal topics of ``partitions``."""
    return TransactionCoordinator(
        data_dir,
        allocate_producer_id=lambda: next(next_ids),
        partition=lambda topic, partition: None,
        offsets=OffsetStore(logs, partitions=partitions),
        logs=logs,
        state_partitions=partitions,
        offsets_partitions=partitions,
        wall_clock_ms=lambda: 1_700_000_000_000,
    )


def test_ids_an_older_kbroker_kept_in_another_partition_move_to_kafkas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The id's state moves to its own partition and is tombstoned in the old one; its own partition is replayed
    first here (1, then 2), so the old partition's tombstone, replayed after, must leave the state as it is."""
    tid = "group-100"  # Java hash -1484205661
    old, own = masked_partition(tid, 5), coordinator_partition(tid, 5)
    assert (old, own) == (2, 1)
    ids = count(1000)
    with monkeypatch.context() as older_kbroker:
        older_kbroker.setattr(coordinator_module, "coordinator_partition", masked_partition)
        logs = LogManager(tmp_path, {})
        first = coordinator_in(tmp_path, logs, ids).init_producer_id(tid, 60_000)
        assert (first.error, first.producer_id, first.producer_epoch) == (ErrorCode.NONE, 1000, 0)
        logs.close()

    logs = LogManager(tmp_path, {})
    coordinator = coordinator_in(tmp_path, logs, ids)
    coordinator.ensure_topic()
    # The same producer id, its epoch bumped: the id kept its state (a lost one would get a new producer id).
    again = coordinator.init_producer_id(tid, 60_000)
    assert (again.error, again.producer_id, again.producer_epoch) == (ErrorCode.NONE, 1000, 1)
    old_log = logs.get_partition(TRANSACTION_TOPIC, old)
    assert old_log is not None
    chunk = old_log.read(old_log.log_start_offset, 1 << 20, max_offset=old_log.log_end_offset)
    [*_, (_, last)] = [(h, list(decode_records(b))) for h, b in iter_batches(chunk.read_bytes())]
    assert [record.value for record in last] == [None]  # the old copy's tombstone
    logs.close()

    logs = LogManager(tmp_path, {})
    restarted = coordinator_in(tmp_path, logs, ids)
    restarted.ensure_topic()
    metadata = restarted.transactions[tid]
    assert (metadata.producer_id, metadata.producer_epoch) == (1000, 1)
    logs.close()
