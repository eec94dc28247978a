"""WriteTxnMarkers (27), as Admin ``abortTransaction`` sends it: kbroker's answers, and the same requests sent to
Apache Kafka 4.3 after the same transaction: an abort of an open transaction, a fenced producer epoch, unknown
partitions, a producer with no open transaction, a fenced coordinator epoch, transaction version 2 markers at
the producer's epoch (refused only while a transaction is open at it) and newer; and CLUSTER_ACTION (or ALTER)
on the cluster required."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.messages.write_txn_markers_request import WriteTxnMarkersRequest
from protocol.records import Record, build_batch
from tests.commands.test_transactions import open_transaction
from tests.kafka.test_transactions_kafka import (  # noqa: F401 (brokers is a fixture)
    brokers,
    create_topic,
    init_retrying,
    settled,
)
from tests.security.test_handler_authorization import ADMIN, STANDARD, allow, make_broker, send
from tests.security.test_handler_authorization import run as run_in_trio
from tests.transactions.test_hanging_transactions import kafka_transactions, run_tool  # noqa: F401 (a fixture)
from tests.transactions.test_transaction_apis import add_partitions

Marker = WriteTxnMarkersRequest.WritableTxnMarker
Topic = WriteTxnMarkersRequest.WritableTxnMarkerTopic
UNKNOWN_PRODUCER = 7_777_777


def produce_transactional(client: WireClient, tid: str, topic: str, pid: int, epoch: int, sequence: int = 0) -> int:
    batch = build_batch(
        [Record(value=b"open")], producer_id=pid, producer_epoch=epoch, base_sequence=sequence, is_transactional=True
    )
    request = ProduceRequest(
        transactional_id=tid,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
            )
        ],
    )
    deadline = time.monotonic() + 30
    while True:
        answer = client.request(request, 9).responses[0].partition_responses[0]
        # A busy Kafka can name the leader in Metadata before its replica manager leads the new partition; a
        # producer retries NOT_LEADER_OR_FOLLOWER (nothing was written), and so does this.
        if answer.error_code != ErrorCode.NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert answer.error_code == ErrorCode.NONE
    return int(answer.base_offset)


def offsets(client: WireClient, topic: str, isolation: int) -> int:
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)]
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=isolation,
        topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=wanted)],
    )
    return int(client.request(request, 7).topics[0].partitions[0].offset)


def write_markers(client: WireClient, *markers: Marker, version: int = 1) -> list[tuple[int, str, int, int]]:
    """(producer id, topic, partition, error) of each partition of the answer, sorted (Kafka's order is a hash
    map's)."""
    answer = client.request(WriteTxnMarkersRequest(markers=list(markers)), version)
    return sorted(
        (m.producer_id, t.name, p.partition_index, p.error_code)
        for m in answer.markers
        for t in m.topics
        for p in t.partitions
    )


def marker(
    pid: int, epoch: int, topics: dict[str, list[int]], *, commit: bool = False, coordinator_epoch: int = 0, tv: int = 0
) -> Marker:
    return Marker(
        producer_id=pid,
        producer_epoch=epoch,
        transaction_result=commit,
        topics=[Topic(name=name, partition_indexes=indexes) for name, indexes in topics.items()],
        coordinator_epoch=coordinator_epoch,
        transaction_version=tv,
    )


def scenario(bootstrap: str, run: str) -> dict[str, Any]:
    """A transaction left open on partition 0 at epoch 1, then ended and probed with WriteTxnMarkers."""
    topic, tid = f"markers-{run}", f"markers-{run}"
    seen: dict[str, Any] = {}
    with WireClient(bootstrap) as client:
        create_topic(client, topic)
        pid = init_retrying(client, tid).producer_id
        assert init_retrying(client, tid).producer_epoch == 1
        added = settled(lambda: add_partitions(client, tid, pid, 1, {topic: [0]}))
        assert added == {(topic, 0): ErrorCode.NONE}
        assert produce_transactional(client, tid, topic, pid, 1) == 0
        seen["held"] = offsets(client, topic, 1), offsets(client, topic, 0)
        seen["older epoch"] = write_markers(client, marker(pid, 0, {topic: [0]}))
        seen["unknown partitions"] = write_markers(client, marker(pid, 1, {topic: [7], f"nowhere-{run}": [0]}))
        seen["no open transaction"] = write_markers(client, marker(UNKNOWN_PRODUCER, 0, {topic: [1]}, commit=True))
        seen["abort"] = write_markers(client, marker(pid, 1, {topic: [0]}), marker(pid, 1, {topic: [1]}))
        seen["after abort"] = offsets(client, topic, 1), offsets(client, topic, 0)
        seen["fenced coordinator"] = write_markers(client, marker(pid, 1, {topic: [0]}, coordinator_epoch=-1))
        seen["tv2 same epoch"] = write_markers(client, marker(pid, 1, {topic: [0]}, tv=2), version=2)
        # The coordinator still has the transaction ongoing: its producer writes again, opening one at epoch 1.
        assert produce_transactional(client, tid, topic, pid, 1, sequence=1) == 3
        seen["tv2 open, same epoch"] = write_markers(client, marker(pid, 1, {topic: [0]}, tv=2), version=2)
        seen["tv2 newer epoch"] = write_markers(client, marker(pid, 2, {topic: [0]}, tv=2), version=2)
    # Producer ids differ between the brokers: named by role.
    return {
        case: [(("pid" if p == pid else p), t.replace(run, "RUN"), i, e) for p, t, i, e in answers]
        if isinstance(answers, list)
        else answers
        for case, answers in seen.items()
    }


def test_write_txn_markers_answers_as_kafka(brokers: dict[str, str]) -> None:  # noqa: F811
    run = uuid.uuid4().hex[:8]
    seen = {name: scenario(bootstrap, run) for name, bootstrap in brokers.items()}
    t = "markers-RUN"
    assert seen["kbroker"] == {
        "held": (0, 1),  # read_committed stops before the open transaction
        "older epoch": [("pid", t, 0, ErrorCode.INVALID_PRODUCER_EPOCH)],
        "unknown partitions": [
            ("pid", t, 7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
            ("pid", "nowhere-RUN", 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ],
        "no open transaction": [(UNKNOWN_PRODUCER, t, 1, ErrorCode.NONE)],  # written all the same
        "abort": [("pid", t, 0, ErrorCode.NONE), ("pid", t, 1, ErrorCode.NONE)],  # one entry per producer
        "after abort": (2, 2),
        "fenced coordinator": [("pid", t, 0, ErrorCode.TRANSACTION_COORDINATOR_FENCED)],
        "tv2 same epoch": [("pid", t, 0, ErrorCode.NONE)],  # no transaction open: a retried marker, written
        "tv2 open, same epoch": [("pid", t, 0, ErrorCode.INVALID_PRODUCER_EPOCH)],
        "tv2 newer epoch": [("pid", t, 0, ErrorCode.NONE)],
    }
    assert seen["kafka"] == seen["kbroker"]


@pytest.mark.parametrize("granted", [None, AclOperation.ALTER, AclOperation.CLUSTER_ACTION, AclOperation.WRITE])
def test_write_txn_markers_needs_alter_or_cluster_action(tmp_path: Path, granted: AclOperation | None) -> None:
    broker = make_broker(
        tmp_path,
        {"authorizer.class.name": STANDARD, "super.users": ADMIN, "allow.everyone.if.no.acl.found": "false"},
    )
    try:
        run_in_trio(lambda: broker.topics.create("allowed", 2, {}))
        if granted is not None:
            allow(broker, ResourceType.CLUSTER, CLUSTER_NAME, granted)
        request = WriteTxnMarkersRequest(markers=[marker(UNKNOWN_PRODUCER, 0, {"allowed": [0, 1]})])
        answer = send(broker, 27, 1, request)
        codes = [(p.partition_index, p.error_code) for m in answer.markers for t in m.topics for p in t.partitions]
        authorized = granted in (AclOperation.ALTER, AclOperation.CLUSTER_ACTION)
        expected = ErrorCode.NONE if authorized else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert codes == [(0, expected), (1, expected)]
        partition = broker.topics.partition("allowed", 0)
        assert partition is not None and partition.log_end_offset == (1 if authorized else 0)  # the marker
    finally:
        broker.close()


def test_kafka_transactions_tool_aborts_an_open_transaction_on_both(
    brokers: dict[str, str],  # noqa: F811
    kafka_transactions: list[str],  # noqa: F811
) -> None:
    """kafka-transactions.sh find-hanging does not count a transaction its coordinator holds; abort ends it."""
    run = uuid.uuid4().hex[:8]
    seen = {}
    for name, bootstrap in brokers.items():
        with WireClient(bootstrap) as client:
            create_topic(client, f"tool-{run}")
        pid, epoch = open_transaction(bootstrap, f"tool-{run}", f"tool-{run}")
        found = run_tool(kafka_transactions, bootstrap, "find-hanging", "--topic", f"tool-{run}")
        aborted = run_tool(
            kafka_transactions, bootstrap, "abort", "--topic", f"tool-{run}", "--partition", "0", "--start-offset", "0"
        )
        with WireClient(bootstrap) as client:
            stable = offsets(client, f"tool-{run}", 1), offsets(client, f"tool-{run}", 0)
        seen[name] = found[1:], aborted, stable
    assert seen["kbroker"] == seen["kafka"] == ([], [], (2, 2))
