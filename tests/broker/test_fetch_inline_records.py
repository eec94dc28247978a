"""Which record data a Fetch answer carries in itself and which it leaves in segment files for sendfile.

The first INLINE_RECORD_BYTES of an answer's record data are read into it (a consumer that keeps up asks for a
few small batches, which then go out in one send); what comes after stays a region of its segment file. Either
way the client gets the same bytes. The handlers are called directly on a broker with the disk engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from kbroker.apis.fetch import INLINE_RECORD_BYTES, handle_fetch
from kbroker.apis.produce import handle_produce
from kbroker.apis.topics import handle_create_topics
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
from kbroker.storage.segment import FileRegion
from protocol.errors import ErrorCode
from protocol.framing import encode_response
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch, decode_records, iter_batches
from tests.broker.test_handlers_in_memory import context

FETCH_VERSION = 12


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    broker = Broker(BrokerConfig({}), tmp_path / "data", Endpoint("localhost", 9092))
    try:
        yield broker
    finally:
        broker.close()


def setup_topic(broker: Broker, value_sizes: dict[int, list[int]]) -> None:
    """Topic "t" with a partition per key of ``value_sizes``, each given one single-record batch per size."""
    topic = CreateTopicsRequest.CreatableTopic(name="t", num_partitions=len(value_sizes), replication_factor=1)
    created = trio.run(handle_create_topics, context(broker, 19, 7), CreateTopicsRequest(topics=[topic]))
    assert created.topics[0].error_code == ErrorCode.NONE
    for partition, sizes in value_sizes.items():
        for size in sizes:
            batch = build_batch([Record(offset_delta=0, value=bytes([partition]) * size)], base_timestamp=0)
            data = [ProduceRequest.PartitionProduceData(index=partition, records=batch)]
            request = ProduceRequest(
                acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name="t", partition_data=data)]
            )
            answer = trio.run(handle_produce, context(broker, 0, 9), request)
            assert answer is not None and answer.responses[0].partition_responses[0].error_code == ErrorCode.NONE


def fetch_request(partitions: list[int]) -> FetchRequest:
    wanted = [FetchRequest.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 22) for p in partitions]
    return FetchRequest(
        max_wait_ms=0, min_bytes=1, max_bytes=1 << 24, topics=[FetchRequest.FetchTopic(topic="t", partitions=wanted)]
    )


def fetch(broker: Broker, partitions: list[int]) -> FetchResponse:
    response = trio.run(handle_fetch, context(broker, 1, FETCH_VERSION), fetch_request(partitions))
    assert response.error_code == ErrorCode.NONE
    return response


def stored(broker: Broker, partition: int) -> bytes:
    plog = broker.partition("t", partition)
    assert plog is not None
    return plog.read(0, 1 << 24).read_bytes()


def value_sizes(records: bytes) -> list[int]:
    return [len(record.value or b"") for _, view in iter_batches(records) for record in decode_records(view)]


def test_small_record_data_is_read_into_the_answer_which_has_nothing_to_splice(broker: Broker) -> None:
    setup_topic(broker, {0: [100, 100, 100], 1: [50]})
    response = fetch(broker, [0, 1])
    answers = response.responses[0].partitions
    for partition, answer in enumerate(answers):
        assert answer.error_code == ErrorCode.NONE
        assert isinstance(answer.records, bytes)
        assert answer.records == stored(broker, partition)
    assert [value_sizes(answer.records) for answer in answers] == [[100, 100, 100], [50]]
    encoded = encode_response(response, 1, FETCH_VERSION, 7)
    assert encoded.splices == [] and encoded.spliced_length == 0  # one buffer: one send


def test_record_data_past_the_inline_budget_stays_in_the_segment_file(broker: Broker) -> None:
    big = INLINE_RECORD_BYTES // 2 + 1000
    setup_topic(broker, {0: [big], 1: [big], 2: [10]})
    first, second, third = fetch(broker, [0, 1, 2]).responses[0].partitions
    assert isinstance(first.records, bytes) and first.records == stored(broker, 0)
    assert isinstance(second.records, FileRegion)  # the budget is spent: sent from the file
    assert bytes(second.records) == stored(broker, 1)
    second.records.close()
    assert isinstance(third.records, bytes) and third.records == stored(broker, 2)  # small enough for what is left
    assert value_sizes(first.records) == [big] and value_sizes(third.records) == [10]


def test_one_answer_larger_than_the_budget_is_a_region(broker: Broker) -> None:
    setup_topic(broker, {0: [INLINE_RECORD_BYTES + 1]})
    (answer,) = fetch(broker, [0]).responses[0].partitions
    assert isinstance(answer.records, FileRegion)
    assert bytes(answer.records) == stored(broker, 0)
    answer.records.close()
