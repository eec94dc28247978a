"""The partition side of transactions against Apache Kafka 4.4 (the ``apache_kafka`` fixture): the same
transactional requests to both brokers (commit 3, abort 2, commit 1, then a transaction left open), and then
the control batches as stored, the read_committed and read_uncommitted Fetch answers (high watermark, last
stable offset, aborted list, batches) and ListOffsets latest in both isolation levels, compared. Producer ids,
timestamps and CRCs legitimately differ and are normalised; everything else must be equal."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka
from kbroker.config import KEYS as BROKER_KEYS
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.end_txn_request import EndTxnRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch, decode_records, iter_batches

RETRIABLE = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.CONCURRENT_TRANSACTIONS,
}
DEADLINE_S = 30


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory, apache_kafka: ApacheKafka) -> Iterator[dict[str, str]]:
    overrides = {name: value for name, value in apache_kafka.settings.items() if name in BROKER_KEYS}
    with RunningBroker(tmp_path_factory.mktemp("kbroker"), {**overrides, "node.id": "1"}) as running:
        yield {"kafka": apache_kafka.bootstrap, "kbroker": running.bootstrap}


def until(probe: Any, done: Any) -> Any:
    """``probe()`` again until ``done(answer)`` (Kafka writes markers after answering EndTxn) or the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        answer = probe()
        if done(answer) or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


class Session:
    """One transactional producer of one broker, spoken by hand."""

    def __init__(self, client: WireClient, topic: str, tid: str) -> None:
        self.client, self.topic, self.tid = client, topic, tid
        # As clients do: FindCoordinator(TRANSACTION) first (Kafka creates __transaction_state on it).
        find = FindCoordinatorRequest(key=tid, key_type=1)
        until(lambda: client.request(find, 3), lambda a: a.error_code == ErrorCode.NONE)
        request = InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60_000)
        answer = until(lambda: client.request(request, 4), lambda a: a.error_code not in RETRIABLE)
        assert answer.error_code == ErrorCode.NONE
        self.pid, self.epoch, self.sequence = answer.producer_id, answer.producer_epoch, 0

    def add(self, partition: int) -> None:
        request = AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.tid,
            v3_and_below_producer_id=self.pid,
            v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=[
                AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=self.topic, partitions=[partition])
            ],
        )
        answer = until(
            lambda: self.client.request(request, 3),
            lambda a: all(
                p.partition_error_code not in RETRIABLE
                for t in a.results_by_topic_v3_and_below
                for p in t.results_by_partition
            ),
        )
        codes = [p.partition_error_code for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition]
        assert codes == [ErrorCode.NONE]

    def send(self, values: list[bytes], partition: int = 0, version: int = 9) -> tuple[int, str | None]:
        records = [Record(offset_delta=i, value=v) for i, v in enumerate(values)]
        batch = build_batch(
            records, producer_id=self.pid, producer_epoch=self.epoch, base_sequence=self.sequence, is_transactional=True
        )
        request = ProduceRequest(
            transactional_id=self.tid,
            acks=-1,
            timeout_ms=10_000,
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name=self.topic,
                    partition_data=[ProduceRequest.PartitionProduceData(index=partition, records=batch)],
                )
            ],
        )
        answer = self.client.request(request, version).responses[0].partition_responses[0]
        if answer.error_code == ErrorCode.NONE:
            self.sequence += len(values)
        return answer.error_code, answer.error_message

    def end(self, commit: bool) -> None:
        request = EndTxnRequest(
            transactional_id=self.tid, producer_id=self.pid, producer_epoch=self.epoch, committed=commit
        )
        answer = until(lambda: self.client.request(request, 3), lambda a: a.error_code not in RETRIABLE)
        assert answer.error_code == ErrorCode.NONE


def fetch(client: WireClient, topic: str, isolation: int, offset: int = 0) -> Any:
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=isolation,
        topics=[
            FetchRequest.FetchTopic(
                topic=topic,
                partitions=[FetchRequest.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)],
            )
        ],
    )
    return client.request(request, 11).responses[0].partitions[0]


def latest(client: WireClient, topic: str, isolation: int, partition: int = 0) -> tuple[int, int]:
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=partition, timestamp=-1)]
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=isolation,
        topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=wanted)],
    )
    answer = client.request(request, 7).topics[0].partitions[0]
    return answer.error_code, answer.offset


def normalised(data: Any, pid: int) -> dict[str, Any]:
    """A Fetch partition answer with the producer id named "P" and batches without timestamps and CRCs."""
    batches = []
    for header, view in iter_batches(bytes(data.records or b"")):
        batches.append(
            (
                header.base_offset,
                header.last_offset_delta,
                header.partition_leader_epoch,
                header.attributes,
                "P" if header.producer_id == pid else header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                [(r.offset_delta, r.timestamp_delta, r.key, r.value, r.headers) for r in decode_records(view)],
            )
        )
    aborted = data.aborted_transactions
    return {
        "error": data.error_code,
        "hw": data.high_watermark,
        "lso": data.last_stable_offset,
        "log_start": data.log_start_offset,
        "aborted": None
        if aborted is None
        else [("P" if a.producer_id == pid else a.producer_id, a.first_offset) for a in aborted],
        "batches": batches,
    }


def scenario(bootstrap: str, run: str) -> dict[str, Any]:
    topic, tid = f"rc-{run}", f"rc-tid-{run}"
    seen: dict[str, Any] = {}
    with WireClient(bootstrap, timeout=30) as client:
        created = CreateTopicsRequest.CreatableTopic(name=topic, num_partitions=2, replication_factor=1)
        assert client.request(CreateTopicsRequest(topics=[created], timeout_ms=10_000), 7).topics[0].error_code == 0
        metadata = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False
        )
        until(
            lambda: client.request(metadata, 12).topics[0],
            lambda t: t.error_code == 0 and len(t.partitions) == 2 and all(p.leader_id >= 0 for p in t.partitions),
        )
        # Metadata names the leaders before a loaded Kafka has made its replicas leaders (NOT_LEADER_OR_FOLLOWER to
        # a produce then): wait until each partition answers ListOffsets, which needs a local leader.
        for partition in (0, 1):
            until(lambda p=partition: latest(client, topic, 0, p), lambda a: a[0] == 0)
        session = Session(client, topic, tid)
        pid = session.pid
        seen["not_added_v9"] = session.send([b"nope"], partition=1)
        seen["not_added_v11"] = session.send([b"nope"], partition=1, version=11)
        for values, commit in (([b"c0", b"c1", b"c2"], True), ([b"a0", b"a1"], False), ([b"d0"], True)):
            session.add(0)
            seen.setdefault("sends", []).append(session.send(values))
            session.end(commit)
        # Markers land after EndTxn is answered (Kafka): wait for the last one (offset 8, so 9 is stable).
        until(lambda: fetch(client, topic, 1), lambda a: a.last_stable_offset == 9)
        session.add(0)
        seen["open"] = session.send([b"open"])  # offset 9, left open
        seen["committed"] = normalised(fetch(client, topic, 1), pid)
        seen["uncommitted"] = normalised(fetch(client, topic, 0), pid)
        seen["committed_from_5"] = normalised(fetch(client, topic, 1, 5), pid)
        seen["committed_at_lso"] = normalised(fetch(client, topic, 1, 9), pid)
        seen["latest"] = (latest(client, topic, 1), latest(client, topic, 0))
        session.end(False)
        until(lambda: fetch(client, topic, 1), lambda a: a.last_stable_offset == 11)
        seen["after_abort"] = normalised(fetch(client, topic, 1, 6), pid)
    return seen


def test_control_batches_and_read_committed_answers_match_kafka(brokers: dict[str, str]) -> None:
    run = uuid.uuid4().hex[:8]
    kafka = scenario(brokers["kafka"], run)
    ours = scenario(brokers["kbroker"], run)
    assert ours == kafka
    # And they are what the spec says (so equal answers are not equally wrong).
    committed = kafka["committed"]
    assert (committed["hw"], committed["lso"], committed["aborted"]) == (10, 9, [("P", 4)])
    markers = [b for b in committed["batches"] if b[3] & 0x20]
    assert [(b[0], b[3], b[6], b[7][0][2]) for b in markers] == [
        (3, 0x30, -1, b"\x00\x00\x00\x01"),
        (6, 0x30, -1, b"\x00\x00\x00\x00"),
        (8, 0x30, -1, b"\x00\x00\x00\x01"),
    ]
    assert kafka["uncommitted"]["aborted"] is None
    assert kafka["committed_at_lso"]["aborted"] == []
    assert kafka["latest"] == ((0, 9), (0, 10))
