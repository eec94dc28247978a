"""Request handlers called directly, without sockets or segment files: the broker's log store keeps its logs in
memory (LogManager.in_memory_store, kbroker/storage/memory.py) and each test hands decoded requests to a handler
and checks the exact response. Only the broker's identity files (meta.properties, producer-id-block, the lock) go
to tmp_path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import trio
import trio.testing

from kbroker.apis.context import HandlerServices, RequestContext
from kbroker.apis.fetch import handle_fetch
from kbroker.apis.list_offsets import handle_list_offsets
from kbroker.apis.produce import handle_produce
from kbroker.apis.records_admin import handle_delete_records
from kbroker.apis.topics import handle_create_topics
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
from kbroker.storage import LogManager
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.create_topics_response import CreateTopicsResponse
from protocol.messages.delete_records_request import DeleteRecordsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.messages.produce_response import ProduceResponse
from protocol.records import Record, build_batch, decode_records, iter_batches

T0 = 1_700_000_000_000
Result = TypeVar("Result")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    config = BrokerConfig({"num.partitions": "1"})
    broker = Broker(
        config, tmp_path / "data", Endpoint("localhost", 9092), logs=LogManager.in_memory_store(config.topic_defaults())
    )
    try:
        yield broker
    finally:
        broker.close()


def context(broker: Broker, api_key: int, api_version: int) -> RequestContext:
    return RequestContext(
        services=HandlerServices.of(broker),
        api_key=api_key,
        api_version=api_version,
        correlation_id=1,
        client_id="unit-test",
        client_host="127.0.0.1:40000",
        connection_id=1,
    )


def run(handler: Callable[[], Awaitable[Result]]) -> Result:
    """Run one handler call on a virtual clock, so long-poll deadlines pass at once."""
    return trio.run(handler, clock=trio.testing.MockClock(autojump_threshold=0))


def batch(values: list[bytes], *, timestamp: int = T0, producer_id: int = -1, sequence: int = -1) -> bytes:
    records = [Record(offset_delta=i, timestamp_delta=i, key=b"k", value=v) for i, v in enumerate(values)]
    return build_batch(
        records,
        base_timestamp=timestamp,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=sequence,
    )


def values_of(data: object) -> list[tuple[int, bytes | None]]:
    assert isinstance(data, bytes | bytearray | memoryview), f"records are {type(data).__name__}"
    out = []
    for header, view in iter_batches(bytes(data)):
        out.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
    return out


def create(broker: Broker, name: str, partitions: int = 1) -> CreateTopicsResponse:
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1)
    request = CreateTopicsRequest(topics=[topic], timeout_ms=5000)
    return run(lambda: handle_create_topics(context(broker, 19, 7), request))


def produce(broker: Broker, topic: str, records: bytes, partition: int = 0) -> ProduceResponse.PartitionProduceResponse:
    data = [ProduceRequest.PartitionProduceData(index=partition, records=records)]
    request = ProduceRequest(
        acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=data)]
    )
    response = run(lambda: handle_produce(context(broker, 0, 9), request))
    assert response is not None
    return response.responses[0].partition_responses[0]


def fetch_request(topic: str, offset: int, *, max_wait_ms: int = 0, max_bytes: int = 1 << 20) -> FetchRequest:
    partition = FetchRequest.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=max_bytes)
    return FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
    )


def fetch(broker: Broker, topic: str, offset: int, **options: int) -> FetchResponse.PartitionData:
    request = fetch_request(topic, offset, **options)
    response = run(lambda: handle_fetch(context(broker, 1, 4), request))
    assert response.error_code == ErrorCode.NONE
    return response.responses[0].partitions[0]


def list_offset(broker: Broker, topic: str, timestamp: int) -> tuple[int, int, int]:
    """(error code, offset, timestamp) of ListOffsets v7 for partition 0 at ``timestamp``."""
    partition = ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=timestamp)
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[partition])]
    )
    answer = run(lambda: handle_list_offsets(context(broker, 2, 7), request)).topics[0].partitions[0]
    return answer.error_code, answer.offset, answer.timestamp


def delete_records(broker: Broker, topic: str, offset: int) -> tuple[int, int]:
    """(error code, low watermark) of DeleteRecords for partition 0 up to ``offset``."""
    partition = DeleteRecordsRequest.DeleteRecordsPartition(partition_index=0, offset=offset)
    request = DeleteRecordsRequest(
        topics=[DeleteRecordsRequest.DeleteRecordsTopic(name=topic, partitions=[partition])], timeout_ms=5000
    )
    answer = run(lambda: handle_delete_records(context(broker, 21, 2), request)).topics[0].partitions[0]
    return answer.error_code, answer.low_watermark


# --- CreateTopics ------------------------------------------------------------------------------------------


def test_create_topics_in_memory(broker: Broker, tmp_path: Path) -> None:
    created = create(broker, "orders", 3).topics[0]
    info = broker.topic("orders")
    assert info is not None
    assert (created.name, created.error_code, created.error_message) == ("orders", ErrorCode.NONE, None)
    assert (created.num_partitions, created.replication_factor, created.topic_id) == (3, 1, info.topic_id)
    assert [broker.partition("orders", i) is not None for i in range(4)] == [True, True, True, False]
    assert not list((tmp_path / "data").glob("orders-*"))  # no partition directories: nothing on disk
    again = create(broker, "orders", 1).topics[0]
    assert (again.error_code, again.error_message) == (ErrorCode.TOPIC_ALREADY_EXISTS, "Topic 'orders' already exists.")
    bad = create(broker, "no way", 1).topics[0]
    assert bad.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert bad.error_message == (
        "Topic name 'no way' is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
    )
    assert create(broker, "none", 0).topics[0].error_code == ErrorCode.INVALID_PARTITIONS


# --- Produce ------------------------------------------------------------------------------------------------


def test_produce_assigns_offsets_and_answers_errors_per_partition(broker: Broker) -> None:
    create(broker, "t")
    first = produce(broker, "t", batch([b"a", b"b", b"c"]))
    assert (first.error_code, first.base_offset, first.log_append_time_ms, first.log_start_offset) == (
        ErrorCode.NONE,
        0,
        -1,
        0,
    )
    assert produce(broker, "t", batch([b"d"])).base_offset == 3
    unknown_topic = produce(broker, "nope", batch([b"x"]))
    assert (unknown_topic.error_code, unknown_topic.base_offset) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)
    assert produce(broker, "t", batch([b"x"]), partition=5).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    corrupt = bytearray(batch([b"x"]))
    corrupt[-1] ^= 0xFF
    refused = produce(broker, "t", bytes(corrupt))
    assert (refused.error_code, refused.error_message) == (
        ErrorCode.CORRUPT_MESSAGE,
        "batch CRC does not match its contents",
    )
    plog = broker.partition("t", 0)
    assert plog is not None and (plog.log_end_offset, plog.high_watermark) == (4, 4)


def test_produce_retries_of_an_idempotent_producer_are_not_written_twice(broker: Broker) -> None:
    create(broker, "t")
    assert produce(broker, "t", batch([b"a", b"b"], producer_id=42, sequence=0)).base_offset == 0
    retry = produce(broker, "t", batch([b"a", b"b"], producer_id=42, sequence=0))
    assert (retry.error_code, retry.base_offset) == (ErrorCode.NONE, 0)
    gap = produce(broker, "t", batch([b"c"], producer_id=42, sequence=7))
    assert (gap.error_code, gap.error_message) == (
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
        "producer 42 sent sequence 7 after 1",
    )
    assert values_of(fetch(broker, "t", 0).records) == [(0, b"a"), (1, b"b")]


# --- Fetch --------------------------------------------------------------------------------------------------


def test_fetch_returns_whole_batches_with_the_partition_offsets(broker: Broker) -> None:
    create(broker, "t")
    sent = [batch([b"a", b"b"]), batch([b"c"])]
    for records in sent:
        produce(broker, "t", records)
    data = fetch(broker, "t", 1)
    assert (data.partition_index, data.error_code, data.high_watermark, data.last_stable_offset) == (
        0,
        ErrorCode.NONE,
        3,
        3,
    )
    assert data.log_start_offset == 0
    assert values_of(data.records) == [(0, b"a"), (1, b"b"), (2, b"c")]  # from the batch holding offset 1
    assert len(data.records) == len(sent[0]) + len(sent[1])
    at_end = fetch(broker, "t", 3)
    assert (at_end.error_code, at_end.high_watermark, bytes(at_end.records)) == (ErrorCode.NONE, 3, b"")
    # partition_max_bytes below one batch: the first batch anyway (KIP-74).
    assert values_of(fetch(broker, "t", 0, max_bytes=1).records) == [(0, b"a"), (1, b"b")]


def test_fetch_errors(broker: Broker) -> None:
    create(broker, "t")
    produce(broker, "t", batch([b"a"]))
    beyond = fetch(broker, "t", 5)
    assert (beyond.error_code, beyond.high_watermark, beyond.log_start_offset, bytes(beyond.records)) == (
        ErrorCode.OFFSET_OUT_OF_RANGE,
        -1,
        -1,
        b"",
    )
    unknown = fetch(broker, "nope", 0)
    assert (unknown.error_code, unknown.high_watermark) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)


def test_fetch_checks_the_fetchers_leader_epoch(broker: Broker) -> None:
    create(broker, "t")
    produce(broker, "t", batch([b"a"]))
    plog = broker.logs.get_partition("t", 0)
    assert plog is not None
    plog.assign_leader_epoch(3)

    def fetch_in_epoch(epoch: int) -> tuple[int, int]:
        request = fetch_request("t", 0)
        request.topics[0].partitions[0].current_leader_epoch = epoch
        answer = run(lambda: handle_fetch(context(broker, 1, 12), request)).responses[0].partitions[0]
        return answer.error_code, answer.high_watermark

    assert fetch_in_epoch(2) == (ErrorCode.FENCED_LEADER_EPOCH, -1)  # an older leader's fetcher
    assert fetch_in_epoch(4) == (ErrorCode.UNKNOWN_LEADER_EPOCH, -1)
    assert fetch_in_epoch(3) == fetch_in_epoch(-1) == (ErrorCode.NONE, 1)


def test_a_waiting_fetch_is_woken_by_a_produce(broker: Broker) -> None:
    create(broker, "t")
    woken_after: list[float] = []
    answers: list[FetchResponse] = []

    async def main() -> None:
        async def consumer() -> None:
            start = trio.current_time()
            answers.append(await handle_fetch(context(broker, 1, 4), fetch_request("t", 0, max_wait_ms=30_000)))
            woken_after.append(trio.current_time() - start)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            await trio.sleep(5)  # the fetch is waiting: nothing to read yet
            assert not answers
            request = ProduceRequest(
                acks=-1,
                timeout_ms=5000,
                topic_data=[
                    ProduceRequest.TopicProduceData(
                        name="t", partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch([b"x"]))]
                    )
                ],
            )
            await handle_produce(context(broker, 0, 9), request)

    run(main)
    data = answers[0].responses[0].partitions[0]
    assert values_of(data.records) == [(0, b"x")] and data.high_watermark == 1
    assert woken_after == [5]  # by the append's event, not by the 30 s deadline


# --- ListOffsets and DeleteRecords --------------------------------------------------------------------------


def test_list_offsets_and_delete_records(broker: Broker) -> None:
    create(broker, "t")
    produce(broker, "t", batch([b"a", b"b"], timestamp=T0))  # offsets 0, 1 at T0, T0 + 1
    produce(broker, "t", batch([b"c", b"d"], timestamp=T0 + 10))  # offsets 2, 3 at T0 + 10, T0 + 11
    assert list_offset(broker, "t", -1) == (ErrorCode.NONE, 4, -1)  # latest
    assert list_offset(broker, "t", -2) == (ErrorCode.NONE, 0, -1)  # earliest
    assert list_offset(broker, "t", -3) == (ErrorCode.NONE, 3, T0 + 11)  # max timestamp
    assert list_offset(broker, "t", T0 + 1) == (ErrorCode.NONE, 1, T0 + 1)
    assert list_offset(broker, "t", T0 + 5) == (ErrorCode.NONE, 2, T0 + 10)
    assert list_offset(broker, "t", T0 + 12) == (ErrorCode.NONE, -1, -1)
    assert list_offset(broker, "nope", -1) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)

    assert delete_records(broker, "t", 5) == (ErrorCode.OFFSET_OUT_OF_RANGE, -1)  # beyond the high watermark
    assert delete_records(broker, "t", 3) == (ErrorCode.NONE, 3)
    assert list_offset(broker, "t", -2) == (ErrorCode.NONE, 3, -1)
    assert list_offset(broker, "t", T0 + 10) == (ErrorCode.NONE, 3, T0 + 11)  # offset 2 (at T0 + 10) is gone
    assert fetch(broker, "t", 0).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert fetch(broker, "t", 3).log_start_offset == 3
    assert delete_records(broker, "t", 1) == (ErrorCode.NONE, 3)  # not forward: nothing changes
    assert delete_records(broker, "t", -1) == (ErrorCode.NONE, 4)  # -1: up to the high watermark
    assert delete_records(broker, "nope", 0) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1)
