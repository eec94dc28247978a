"""A partition whose files cannot be opened answers KAFKA_STORAGE_ERROR on every API that reads or writes it,
while the topic's other partitions keep working and nothing of its data is discarded."""

from __future__ import annotations

from pathlib import Path

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.delete_records_request import DeleteRecordsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch

TOPIC = "fragile"


def _produce(client: WireClient) -> list[tuple[int, int, int]]:
    batch = build_batch([Record(offset_delta=0, value=b"v")], base_timestamp=0)
    data = [ProduceRequest.PartitionProduceData(index=p, records=batch) for p in (0, 1)]
    request = ProduceRequest(
        acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=TOPIC, partition_data=data)]
    )
    return [(p.index, p.error_code, p.base_offset) for p in client.request(request, 9).responses[0].partition_responses]


def test_every_api_answers_a_storage_error_for_the_damaged_partition_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        topic = CreateTopicsRequest.CreatableTopic(name=TOPIC, num_partitions=2, replication_factor=1)
        assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0
        assert _produce(client) == [(0, ErrorCode.NONE, 0), (1, ErrorCode.NONE, 0)]
    metadata = data_dir / f"{TOPIC}-1" / "partition.metadata"
    metadata.write_text("version: 0\ntopic_id: damaged\n")
    segment = data_dir / f"{TOPIC}-1" / "00000000000000000000.log"
    size_before = segment.stat().st_size

    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        assert _produce(client) == [(0, ErrorCode.NONE, 1), (1, ErrorCode.KAFKA_STORAGE_ERROR, -1)]

        fetch_partitions = [
            FetchRequest.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20) for p in (0, 1)
        ]
        fetch = FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=1 << 20,
            topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=fetch_partitions)],
        )
        fetched = client.request(fetch, 11).responses[0].partitions
        assert [(p.partition_index, p.error_code, p.high_watermark) for p in fetched] == [
            (0, ErrorCode.NONE, 2),
            (1, ErrorCode.KAFKA_STORAGE_ERROR, -1),
        ]

        list_partitions = [ListOffsetsRequest.ListOffsetsPartition(partition_index=p, timestamp=-1) for p in (0, 1)]
        listed = client.request(
            ListOffsetsRequest(
                replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=TOPIC, partitions=list_partitions)]
            ),
            7,
        )
        assert [(p.partition_index, p.error_code, p.offset) for p in listed.topics[0].partitions] == [
            (0, ErrorCode.NONE, 2),
            (1, ErrorCode.KAFKA_STORAGE_ERROR, -1),
        ]

        delete_partitions = [DeleteRecordsRequest.DeleteRecordsPartition(partition_index=p, offset=1) for p in (0, 1)]
        deleted = client.request(
            DeleteRecordsRequest(
                topics=[DeleteRecordsRequest.DeleteRecordsTopic(name=TOPIC, partitions=delete_partitions)],
                timeout_ms=5000,
            ),
            2,
        )
        assert [(p.partition_index, p.error_code) for p in deleted.topics[0].partitions] == [
            (0, ErrorCode.NONE),
            (1, ErrorCode.KAFKA_STORAGE_ERROR),
        ]
    assert segment.stat().st_size == size_before  # the damaged partition's data is all still there
