"""read_committed over the wire: a real transaction flow (InitProducerId with a transactional id,
AddPartitionsToTxn, transactional Produce, EndTxn) against a running broker, then Fetch and ListOffsets with
both isolation levels: read_committed sees exactly the committed records and the aborted list, read_uncommitted
sees everything; produce to a partition not in the transaction is refused; a long poll wakes when the last
stable offset moves; all of it the same after a clean and an unclean restart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kbroker.testing import BrokerProcess, RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.end_txn_request import EndTxnRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch, decode_records, iter_batches

TOPIC = "rc"
TXN_ID = "rc-txn"
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


class Producer:
    """A transactional producer spoken by hand: one partition, sequences counted here."""

    def __init__(self, client: WireClient, transactional_id: str = TXN_ID) -> None:
        self.client = client
        self.transactional_id = transactional_id
        answer = client.request(
            InitProducerIdRequest(transactional_id=transactional_id, transaction_timeout_ms=60_000), 4
        )
        assert answer.error_code == ErrorCode.NONE
        self.producer_id, self.epoch = answer.producer_id, answer.producer_epoch
        self.sequence = 0

    def add_partition(self, partition: int = 0) -> None:
        request = AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.transactional_id,
            v3_and_below_producer_id=self.producer_id,
            v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=TOPIC, partitions=[partition])],
        )
        answer = self.client.request(request, 3)
        assert [
            p.partition_error_code for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition
        ] == [ErrorCode.NONE]

    def send(self, values: list[bytes], partition: int = 0) -> tuple[int, str | None, int]:
        records = [Record(offset_delta=i, value=v) for i, v in enumerate(values)]
        batch = build_batch(
            records,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            base_sequence=self.sequence,
            is_transactional=True,
        )
        request = ProduceRequest(
            transactional_id=self.transactional_id,
            acks=-1,
            timeout_ms=10_000,
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name=TOPIC, partition_data=[ProduceRequest.PartitionProduceData(index=partition, records=batch)]
                )
            ],
        )
        answer = self.client.request(request, 9).responses[0].partition_responses[0]
        if answer.error_code == ErrorCode.NONE:
            self.sequence += len(values)
        return answer.error_code, answer.error_message, answer.base_offset

    def end(self, commit: bool) -> None:
        request = EndTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            committed=commit,
        )
        assert self.client.request(request, 3).error_code == ErrorCode.NONE

    def transaction(self, values: list[bytes], commit: bool) -> int:
        self.add_partition()
        code, message, base_offset = self.send(values)
        assert (code, message) == (ErrorCode.NONE, None)
        self.end(commit)
        return base_offset


def create_topic(client: WireClient, partitions: int = 1) -> None:
    topic = CreateTopicsRequest.CreatableTopic(name=TOPIC, num_partitions=partitions, replication_factor=1)
    assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7).topics[0].error_code == 0


def fetch(
    client: WireClient, isolation: int, offset: int = 0, *, max_wait_ms: int = 0, partition: int = 0
) -> FetchRequest:
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=isolation,
        topics=[
            FetchRequest.FetchTopic(
                topic=TOPIC,
                partitions=[
                    FetchRequest.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20)
                ],
            )
        ],
    )
    return client.request(request, 11).responses[0].partitions[0]


def visible(data: object, read_committed: bool) -> list[tuple[int, bytes | None]]:
    """(offset, value) of what a consumer hands over: control batches skipped, aborted transactions dropped
    (as Kafka's clients do with the aborted list) when reading committed."""
    aborted = sorted((a.first_offset, a.producer_id) for a in (data.aborted_transactions or []))  # type: ignore[attr-defined]
    dropping: set[int] = set()
    out: list[tuple[int, bytes | None]] = []
    for header, view in iter_batches(bytes(data.records or b"")):  # type: ignore[attr-defined]
        while aborted and aborted[0][0] <= header.base_offset:
            dropping.add(aborted.pop(0)[1])
        if header.is_control:
            dropping.discard(header.producer_id)
            continue
        if read_committed and header.producer_id in dropping:
            continue
        out.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
    return out


def latest(client: WireClient, isolation: int) -> int:
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)]
    request = ListOffsetsRequest(
        replica_id=-1,
        isolation_level=isolation,
        topics=[ListOffsetsRequest.ListOffsetsTopic(name=TOPIC, partitions=wanted)],
    )
    answer = client.request(request, 7).topics[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE
    return int(answer.offset)


COMMITTED = [b"c%d" % i for i in range(10)]
ABORTED = [b"a%d" % i for i in range(10)]
COMMITTED_AGAIN = [b"d%d" % i for i in range(5)]


def commit_abort_commit(client: WireClient) -> Producer:
    """10 committed (0..9, marker 10), 10 aborted (11..20, marker 21), 5 committed (22..26, marker 27)."""
    producer = Producer(client)
    assert producer.transaction(COMMITTED, commit=True) == 0
    assert producer.transaction(ABORTED, commit=False) == 11
    assert producer.transaction(COMMITTED_AGAIN, commit=True) == 22
    return producer


def check_answers(client: WireClient, producer_id: int) -> None:
    committed = fetch(client, READ_COMMITTED)
    assert (committed.error_code, committed.high_watermark, committed.last_stable_offset) == (0, 28, 28)
    assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [(producer_id, 11)]
    assert [v for _, v in visible(committed, read_committed=True)] == COMMITTED + COMMITTED_AGAIN
    uncommitted = fetch(client, READ_UNCOMMITTED)
    assert uncommitted.aborted_transactions is None
    assert [v for _, v in visible(uncommitted, read_committed=False)] == COMMITTED + ABORTED + COMMITTED_AGAIN
    # From inside the aborted range, and past it (no aborted transaction there: an empty list, not null).
    assert [(a.producer_id, a.first_offset) for a in fetch(client, READ_COMMITTED, 15).aborted_transactions] == [
        (producer_id, 11)
    ]
    tail = fetch(client, READ_COMMITTED, 22)
    assert tail.aborted_transactions == []
    assert [v for _, v in visible(tail, read_committed=True)] == COMMITTED_AGAIN
    at_end = fetch(client, READ_COMMITTED, 28)
    assert (at_end.aborted_transactions, len(at_end.records)) == ([], 0)
    assert latest(client, READ_COMMITTED) == latest(client, READ_UNCOMMITTED) == 28


def test_read_committed_sees_exactly_the_committed_records(tmp_path: Path) -> None:
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        create_topic(client)
        producer = commit_abort_commit(client)
        check_answers(client, producer.producer_id)


@pytest.mark.parametrize("clean", [True, False])
def test_the_answers_survive_a_restart(tmp_path: Path, clean: bool) -> None:
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir).start()
    try:
        with WireClient(broker.bootstrap) as client:
            create_topic(client)
            producer = commit_abort_commit(client)
            producer.add_partition()
            assert producer.send([b"open"])[2] == 28  # a transaction left open (its timeout is a minute)
    finally:
        if clean:
            broker.stop()
        else:
            broker.kill()  # kill -9
    again = BrokerProcess(data_dir).start()
    try:
        with WireClient(again.bootstrap) as client:
            committed = fetch(client, READ_COMMITTED)
            assert (committed.high_watermark, committed.last_stable_offset) == (29, 28)  # still open
            assert (latest(client, READ_COMMITTED), latest(client, READ_UNCOMMITTED)) == (28, 29)
            assert [(a.producer_id, a.first_offset) for a in committed.aborted_transactions] == [
                (producer.producer_id, 11)
            ]
            assert [v for _, v in visible(committed, read_committed=True)] == COMMITTED + COMMITTED_AGAIN
            producer.client = client
            producer.end(commit=False)  # the coordinator resumed the transaction: it can still be ended
            ended = fetch(client, READ_COMMITTED)
            assert (ended.high_watermark, ended.last_stable_offset) == (30, 30)
            assert [(a.producer_id, a.first_offset) for a in ended.aborted_transactions] == [
                (producer.producer_id, 11),
                (producer.producer_id, 28),
            ]
            assert [v for _, v in visible(ended, read_committed=True)] == COMMITTED + COMMITTED_AGAIN
    finally:
        again.stop()


def test_an_open_transaction_holds_the_stable_offset_and_a_long_poll_wakes_when_it_ends(tmp_path: Path) -> None:
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        create_topic(client)
        producer = Producer(client)
        producer.add_partition()
        assert producer.send([b"x", b"y"])[2] == 0
        assert (latest(client, READ_COMMITTED), latest(client, READ_UNCOMMITTED)) == (0, 2)
        assert len(fetch(client, READ_COMMITTED).records) == 0
        answers: list[object] = []

        def long_poll() -> None:
            with WireClient(broker.bootstrap) as waiting:
                answers.append(fetch(waiting, READ_COMMITTED, max_wait_ms=30_000))

        poller = threading.Thread(target=long_poll)
        poller.start()
        time.sleep(0.3)  # lets the fetch start waiting (if it has not, it finds the data at once: same answer)
        producer.end(commit=True)
        poller.join(35)
        (answer,) = answers
        assert answer.last_stable_offset == 3  # type: ignore[attr-defined]
        assert [v for _, v in visible(answer, read_committed=True)] == [b"x", b"y"]


def test_transactional_produce_needs_the_partition_in_the_transaction(tmp_path: Path) -> None:
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        create_topic(client, partitions=2)
        producer = Producer(client)
        producer.add_partition(0)
        assert producer.send([b"x"], partition=1) == (
            ErrorCode.INVALID_TXN_STATE,
            "Partition was not added to the transaction",
            -1,
        )
        assert producer.send([b"x"], partition=0)[0] == ErrorCode.NONE
        assert latest(client, READ_UNCOMMITTED) == 1
        uncommitted_1 = fetch(client, READ_UNCOMMITTED, partition=1)
        assert (uncommitted_1.high_watermark, len(uncommitted_1.records)) == (0, 0)  # nothing was written
