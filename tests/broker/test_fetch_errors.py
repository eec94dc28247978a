"""Fetch answers for partitions the broker cannot read, on the wire: Kafka's error, no offsets, empty records.

A null record set in any partition makes librdkafka drop the whole response ("invalid MessageSetSize -1"),
so every error path must answer empty records (tests/kafka compares the same requests with Apache Kafka).
"""

from __future__ import annotations

import uuid

import pytest

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch

TOPIC = "readable"


def _setup(client: WireClient) -> uuid.UUID:
    topic = CreateTopicsRequest.CreatableTopic(name=TOPIC, num_partitions=2, replication_factor=1)
    assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0
    batch = build_batch([Record(offset_delta=i, value=b"v%d" % i) for i in range(3)], base_timestamp=0)
    data = [ProduceRequest.PartitionProduceData(index=p, records=batch) for p in (0, 1)]
    produce = ProduceRequest(
        acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=TOPIC, partition_data=data)]
    )
    assert all(p.error_code == 0 for p in client.request(produce, 9).responses[0].partition_responses)
    metadata = client.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)]), 12)
    return metadata.topics[0].topic_id


def _request(topic_id: uuid.UUID, session_epoch: int = -1, session_id: int = 0) -> FetchRequest:
    def partition(index: int, offset: int) -> FetchRequest.FetchPartition:
        return FetchRequest.FetchPartition(partition=index, fetch_offset=offset, partition_max_bytes=1 << 20)

    return FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        session_id=session_id,
        session_epoch=session_epoch,
        topics=[
            FetchRequest.FetchTopic(
                topic=TOPIC, topic_id=topic_id, partitions=[partition(0, 50), partition(1, 0), partition(7, 0)]
            ),
            FetchRequest.FetchTopic(topic="missing", topic_id=uuid.uuid4(), partitions=[partition(0, 0)]),
        ],
    )


def _rows(response: FetchResponse) -> list[tuple[str, int, int, int, int, int, int | None]]:
    """(topic, partition, error, high watermark, last stable offset, log start offset, bytes or None)."""
    return [
        (
            t.topic,
            p.partition_index,
            p.error_code,
            p.high_watermark,
            p.last_stable_offset,
            p.log_start_offset,
            None if p.records is None else len(p.records),
        )
        for t in response.responses
        for p in t.partitions
    ]


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16, 18])
def test_errored_partitions_carry_empty_records_and_no_offsets(broker: RunningBroker, version: int) -> None:
    with WireClient(broker.bootstrap) as client:
        topic_id = _setup(client)
        response = client.request(_request(topic_id), version)
    assert response.error_code == ErrorCode.NONE
    rows = _rows(response)
    read = rows[1][6]
    assert read is not None and read > 0
    name = TOPIC if version < 13 else ""  # from v13 topics are named by id
    missing = "missing" if version < 13 else ""
    start = 0 if version >= 5 else -1  # no log start offset before v5
    unknown_topic = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if version < 13 else ErrorCode.UNKNOWN_TOPIC_ID
    # Kafka's order: the partitions read, then unknown topic ids, then unknown topics or partitions.
    read_rows = [(name, 0, ErrorCode.OFFSET_OUT_OF_RANGE, -1, -1, -1, 0), (name, 1, ErrorCode.NONE, 3, 3, start, read)]
    unknown_rows = [
        (name, 7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, -1, 0),
        (missing, 0, unknown_topic, -1, -1, -1, 0),
    ]
    assert rows == read_rows + (unknown_rows if version < 13 else unknown_rows[::-1])


def test_an_incremental_session_repeats_the_errors_with_empty_records(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        topic_id = _setup(client)
        full = client.request(_request(topic_id, session_epoch=0), 16)
        assert full.session_id != 0
        incremental = FetchRequest(replica_id=-1, max_wait_ms=0, session_id=full.session_id, session_epoch=1)
        again = client.request(incremental, 16)
    assert again.error_code == ErrorCode.NONE
    assert [row[1:] for row in _rows(again)] == [
        (0, ErrorCode.OFFSET_OUT_OF_RANGE, -1, -1, -1, 0),
        (1, ErrorCode.NONE, 3, 3, 0, len(full.responses[0].partitions[1].records)),  # its position is unchanged
        (0, ErrorCode.UNKNOWN_TOPIC_ID, -1, -1, -1, 0),
        (7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, -1, 0),
    ]
