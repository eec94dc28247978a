"""Handlers whose work grows with an array in the request let other tasks run as they go (kbroker/apis/turns.py),
and large frames and answers are decoded and encoded off the event loop (kbroker/server/offload.py); small
requests do neither.

Each test runs the handler (or codec) beside a task that counts how often it gets to run: with turns taken it
runs again and again during a large request, and not at all during a small one. The answers are checked whole."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from kbroker.apis.configs import handle_describe_configs
from kbroker.apis.fetch import handle_fetch
from kbroker.apis.group_offsets import handle_offset_commit, handle_offset_fetch
from kbroker.apis.leader_epochs import handle_offset_for_leader_epoch
from kbroker.apis.list_offsets import handle_list_offsets
from kbroker.apis.metadata import handle_metadata
from kbroker.apis.produce import handle_produce
from kbroker.apis.records_admin import handle_delete_records
from kbroker.apis.topics import handle_create_topics
from kbroker.apis.turns import Turns
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
from kbroker.server import offload
from kbroker.storage import LogManager
from protocol.errors import ErrorCode
from protocol.framing import decode_response, encode_request, produce_partitions
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.delete_records_request import DeleteRecordsRequest
from protocol.messages.describe_configs_request import DescribeConfigsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.offset_commit_request import OffsetCommitRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from protocol.messages.offset_for_leader_epoch_request import OffsetForLeaderEpochRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch
from tests.broker.test_handlers_in_memory import context

TOPIC = "t"
PARTITIONS = 3


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    config = BrokerConfig({})
    broker = Broker(
        config, tmp_path / "data", Endpoint("localhost", 9092), logs=LogManager.in_memory_store(config.topic_defaults())
    )
    try:
        topic = CreateTopicsRequest.CreatableTopic(name=TOPIC, num_partitions=PARTITIONS, replication_factor=1)
        trio.run(handle_create_topics, context(broker, 19, 7), CreateTopicsRequest(topics=[topic], timeout_ms=5000))
        yield broker
    finally:
        broker.close()


def beside_a_counter(work: Callable[[], Awaitable[Any]]) -> tuple[Any, int]:
    """``work()``'s result, and how many times another task ran while it was in progress."""

    async def main() -> tuple[Any, int]:
        runs = 0
        result = None

        async def other() -> None:
            nonlocal runs
            while True:
                await trio.lowlevel.checkpoint()
                runs += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            await trio.lowlevel.checkpoint()  # the counter starts
            before = runs
            result = await work()
            during = runs - before
            nursery.cancel_scope.cancel()
        return result, during

    return trio.run(main)


def fetch_of(partitions: int) -> FetchRequest:
    wanted = [
        FetchRequest.FetchPartition(partition=i, fetch_offset=0, partition_max_bytes=1024) for i in range(partitions)
    ]
    return FetchRequest(max_wait_ms=0, topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=wanted)])


def test_a_fetch_of_many_partitions_takes_turns_and_answers_each(broker: Broker) -> None:
    partitions = 20_000
    answer, others_ran = beside_a_counter(lambda: handle_fetch(context(broker, 1, 12), fetch_of(partitions)))
    assert isinstance(answer, FetchResponse)
    codes = [(p.partition_index, p.error_code) for t in answer.responses for p in t.partitions]
    assert codes[:PARTITIONS] == [(i, ErrorCode.NONE) for i in range(PARTITIONS)]
    assert codes[PARTITIONS:] == [(i, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) for i in range(PARTITIONS, partitions)]
    assert others_ran >= 2 * partitions // 1000  # a turn per 1,000 partitions in each of its passes


def test_a_small_fetch_takes_no_turn(broker: Broker) -> None:
    answer, others_ran = beside_a_counter(lambda: handle_fetch(context(broker, 1, 12), fetch_of(PARTITIONS)))
    assert [p.error_code for t in answer.responses for p in t.partitions] == [ErrorCode.NONE] * PARTITIONS
    assert others_ran == 0


def test_a_metadata_request_for_many_topics_takes_turns(broker: Broker) -> None:
    names = [f"unknown-{i}" for i in range(20_000)] + [TOPIC]
    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=name) for name in names], allow_auto_topic_creation=False
    )
    answer, others_ran = beside_a_counter(lambda: handle_metadata(context(broker, 3, 12), request))
    assert [(t.name, t.error_code, len(t.partitions)) for t in answer.topics] == [
        (name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0) for name in names[:-1]
    ] + [(TOPIC, ErrorCode.NONE, PARTITIONS)]
    assert others_ran >= 15  # a turn per 1,000 topics


def test_a_metadata_request_for_one_topic_takes_no_turn(broker: Broker) -> None:
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)])
    answer, others_ran = beside_a_counter(lambda: handle_metadata(context(broker, 3, 12), request))
    assert [(t.name, len(t.partitions)) for t in answer.topics] == [(TOPIC, PARTITIONS)]
    assert others_ran == 0


def produce_of(partitions: int) -> ProduceRequest:
    batch = build_batch([Record(value=b"v")])
    data = [ProduceRequest.PartitionProduceData(index=i, records=batch) for i in range(partitions)]
    return ProduceRequest(
        acks=1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=TOPIC, partition_data=data)]
    )


def test_a_produce_to_many_partitions_takes_turns_and_appends_what_exists(broker: Broker) -> None:
    partitions = 5_000
    answer, others_ran = beside_a_counter(lambda: handle_produce(context(broker, 0, 9), produce_of(partitions)))
    results = [(p.index, p.error_code, p.base_offset) for t in answer.responses for p in t.partition_responses]
    assert results[:PARTITIONS] == [(i, ErrorCode.NONE, 0) for i in range(PARTITIONS)]
    assert results[PARTITIONS:] == [
        (i, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1) for i in range(PARTITIONS, partitions)
    ]
    assert others_ran >= partitions // 400  # a turn per 200 partitions


def test_a_produce_to_a_few_partitions_takes_no_turn(broker: Broker) -> None:
    answer, others_ran = beside_a_counter(lambda: handle_produce(context(broker, 0, 9), produce_of(PARTITIONS)))
    assert [p.error_code for t in answer.responses for p in t.partition_responses] == [ErrorCode.NONE] * PARTITIONS
    assert others_ran == 0


MANY = 5_000  # partitions (or topics) of a large request: a few turns' worth
# The counter runs once per turn taken, except that trio may run it after the handler's last turn has ended.
TURNS = MANY // 1000 - 1


def test_list_offsets_of_many_partitions_takes_turns(broker: Broker) -> None:
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=i, timestamp=-1) for i in range(MANY)]
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=TOPIC, partitions=wanted)]
    )
    answer, others_ran = beside_a_counter(lambda: handle_list_offsets(context(broker, 2, 7), request))
    rows = [(p.partition_index, p.error_code, p.offset) for t in answer.topics for p in t.partitions]
    assert rows == [(i, ErrorCode.NONE, 0) for i in range(PARTITIONS)] + [
        (i, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1) for i in range(PARTITIONS, MANY)
    ]
    assert others_ran >= TURNS


def test_list_offsets_refuses_40000_duplicates_in_linear_time(broker: Broker) -> None:
    distinct = 20_000  # each asked twice: the refusals were found by scanning a list, 20,000 times 20,000 / 2
    wanted = [
        ListOffsetsRequest.ListOffsetsPartition(partition_index=i % distinct, timestamp=-1) for i in range(2 * distinct)
    ]
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=TOPIC, partitions=wanted)]
    )
    started = time.perf_counter()
    answer = trio.run(handle_list_offsets, context(broker, 2, 7), request)
    took = time.perf_counter() - started
    assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in answer.topics] == [
        (TOPIC, [(i, ErrorCode.INVALID_REQUEST) for i in range(distinct)])
    ]
    assert took < 3.0  # about 0.1 s; it was 3.5 s, and 14 s for twice as many


def test_offset_commit_and_fetch_of_many_partitions_take_turns(broker: Broker) -> None:
    commit = OffsetCommitRequest(
        group_id="g",
        topics=[
            OffsetCommitRequest.OffsetCommitRequestTopic(
                name=TOPIC,
                partitions=[
                    OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=i, committed_offset=10 + i)
                    for i in range(MANY)
                ],
            )
        ],
    )
    committed, others_ran = beside_a_counter(lambda: handle_offset_commit(context(broker, 8, 8), commit))
    codes = [(p.partition_index, p.error_code) for t in committed.topics for p in t.partitions]
    assert codes == [(i, ErrorCode.NONE) for i in range(PARTITIONS)] + [
        (i, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) for i in range(PARTITIONS, MANY)
    ]
    assert others_ran >= TURNS
    fetch = OffsetFetchRequest(
        group_id="g",
        topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=list(range(MANY)))],
    )
    fetched, others_ran = beside_a_counter(lambda: handle_offset_fetch(context(broker, 9, 7), fetch))
    offsets = [(p.partition_index, p.committed_offset) for t in fetched.topics for p in t.partitions]
    assert offsets == [(i, 10 + i) for i in range(PARTITIONS)] + [(i, -1) for i in range(PARTITIONS, MANY)]
    assert others_ran >= 2 * TURNS  # the offsets, then the answer


def test_delete_records_and_offset_for_leader_epoch_of_many_partitions_take_turns(broker: Broker) -> None:
    delete = DeleteRecordsRequest(
        topics=[
            DeleteRecordsRequest.DeleteRecordsTopic(
                name=TOPIC,
                partitions=[
                    DeleteRecordsRequest.DeleteRecordsPartition(partition_index=i, offset=0) for i in range(MANY)
                ],
            )
        ],
        timeout_ms=1000,
    )
    deleted, others_ran = beside_a_counter(lambda: handle_delete_records(context(broker, 21, 2), delete))
    rows = [(p.partition_index, p.error_code, p.low_watermark) for t in deleted.topics for p in t.partitions]
    assert rows == [(i, ErrorCode.NONE, 0) for i in range(PARTITIONS)] + [
        (i, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1) for i in range(PARTITIONS, MANY)
    ]
    assert others_ran >= TURNS
    epochs = OffsetForLeaderEpochRequest(
        replica_id=-1,
        topics=[
            OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
                topic=TOPIC,
                partitions=[
                    OffsetForLeaderEpochRequest.OffsetForLeaderPartition(partition=i, leader_epoch=0)
                    for i in range(MANY)
                ],
            )
        ],
    )
    ends, others_ran = beside_a_counter(lambda: handle_offset_for_leader_epoch(context(broker, 23, 4), epochs))
    rows = [(p.partition, p.error_code, p.end_offset) for t in ends.topics for p in t.partitions]
    assert rows == [(i, ErrorCode.NONE, 0) for i in range(PARTITIONS)] + [
        (i, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1) for i in range(PARTITIONS, MANY)
    ]
    assert others_ran >= TURNS


def test_describe_configs_of_many_topics_takes_turns(broker: Broker) -> None:
    names = [TOPIC] + [f"unknown-{i}" for i in range(MANY)]
    request = DescribeConfigsRequest(
        resources=[
            DescribeConfigsRequest.DescribeConfigsResource(resource_type=2, resource_name=name, configuration_keys=None)
            for name in names
        ]
    )
    answer, others_ran = beside_a_counter(lambda: handle_describe_configs(context(broker, 32, 4), request))
    assert [(r.resource_name, r.error_code) for r in answer.results] == [(TOPIC, ErrorCode.NONE)] + [
        (name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) for name in names[1:]
    ]
    assert "retention.ms" in {c.name for c in answer.results[0].configs}
    assert others_ran >= TURNS


def test_turns_let_others_run_once_per_turn() -> None:
    async def work() -> int:
        turns = Turns(10)
        for _ in range(95):
            await turns.step()
        await turns.step(25)  # weighted: the 10th turn
        return turns.taken

    taken, others_ran = beside_a_counter(work)
    assert taken == 10  # at most one turn per step, however heavy
    assert others_ran >= 9  # trio may run the two tasks of a batch in either order: the last run can come after


# --- the codecs off the loop ----------------------------------------------------------------------------------


def test_a_large_frame_is_decoded_off_the_loop_and_a_small_one_on_it() -> None:
    large = bytearray(encode_request(fetch_of(5_000), 12, 7)[4:])
    small = bytearray(encode_request(fetch_of(3), 12, 8)[4:])
    assert len(large) >= offload.LARGE_FRAME_BYTES > len(small)
    request, others_ran = beside_a_counter(lambda: offload.decode(large))
    assert (request.correlation_id, len(request.body.topics[0].partitions)) == (7, 5_000)
    assert others_ran > 0
    request, others_ran = beside_a_counter(lambda: offload.decode(small))
    assert (request.correlation_id, len(request.body.topics[0].partitions), others_ran) == (8, 3, 0)


def test_a_large_produce_of_few_partitions_is_decoded_on_the_loop() -> None:
    big_batch = build_batch([Record(value=bytes(200_000))])
    request = ProduceRequest(
        acks=1,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=TOPIC, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=big_batch)]
            )
        ],
    )
    few = bytearray(encode_request(request, 9, 3)[4:])
    many = bytearray(encode_request(produce_of(offload.MANY_ITEMS), 9, 4)[4:])
    assert len(few) >= offload.LARGE_FRAME_BYTES and len(many) >= offload.LARGE_FRAME_BYTES
    decoded, others_ran = beside_a_counter(lambda: offload.decode(few))
    assert (bytes(decoded.body.topic_data[0].partition_data[0].records), others_ran) == (big_batch, 0)
    decoded, others_ran = beside_a_counter(lambda: offload.decode(many))
    assert len(decoded.body.topic_data[0].partition_data) == offload.MANY_ITEMS and others_ran > 0


@pytest.mark.parametrize("version", [3, 8, 9, 12, 13])
def test_produce_partitions_are_counted_without_decoding(version: int) -> None:
    batch = build_batch([Record(value=b"v" * 300)])
    request = ProduceRequest(
        acks=-1,
        timeout_ms=5000,
        transactional_id="txn",
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=f"t{t}",
                partition_data=[
                    ProduceRequest.PartitionProduceData(index=i, records=batch if i % 2 else None) for i in range(count)
                ],
            )
            for t, count in enumerate([5, 0, 40])
        ],
    )
    frame = encode_request(request, version, 1)[4:]
    assert produce_partitions(frame, 1000) == 45
    assert produce_partitions(frame, 10) == 45  # counted a topic at a time: 5, then 45 >= 10
    assert produce_partitions(frame, 3) == 5
    assert produce_partitions(frame[:30], 1000) == 1000  # cut short: as many as could be


def test_a_large_answer_is_encoded_off_the_loop_and_a_small_one_on_it(broker: Broker) -> None:
    large = trio.run(handle_fetch, context(broker, 1, 12), fetch_of(offload.MANY_ITEMS))
    small = trio.run(handle_fetch, context(broker, 1, 12), fetch_of(PARTITIONS))
    assert offload.array_items(large, offload.MANY_ITEMS) >= offload.MANY_ITEMS
    assert offload.array_items(small, offload.MANY_ITEMS) == 1 + PARTITIONS
    for answer, offloaded in ((large, True), (small, False)):
        encoded, others_ran = beside_a_counter(lambda answer=answer: offload.encode(answer, 1, 12, 5))
        assert (others_ran > 0) is offloaded
        correlation_id, decoded = decode_response(memoryview(encoded)[4:], 1, 12)
        assert correlation_id == 5
        assert [p.error_code for p in decoded.responses[0].partitions] == [
            p.error_code for p in answer.responses[0].partitions
        ]
