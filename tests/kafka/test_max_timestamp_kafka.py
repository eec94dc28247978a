"""ListOffsets MAX_TIMESTAMP (-3, KIP-734) on kbroker and on Apache Kafka 4.4, the same records and the same
deletions sent to both, answers compared whole.

Kafka's rule (UnifiedLog.fetchOffsetByTimestamp): the first segment with the largest max timestamp, in it the
first batch reaching that timestamp, in that batch the first record carrying it; the log start offset plays no
part, so after DeleteRecords within that segment the answer lies below the log start, until the segment itself
is deleted. Compared here across segments (1 MiB segments, rolled by size), after DeleteRecords inside and past a
segment, after retention.bytes deletes the segment holding the max, and after restarting both brokers.

Kafka deletes the segments that DeleteRecords left wholly below the log start only at its next retention check
(kbroker at once): both run with a short log.retention.check.interval.ms and the test waits for Kafka's files.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka, KafkaUnavailable
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.delete_records_request import DeleteRecordsRequest
from protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch
from tests.kafka.test_differential_kafka import by_partition

SETTINGS = {"log.retention.check.interval.ms": "300"}
SEGMENT_BYTES = 1 << 20  # Kafka 4.3's smallest segment.bytes
PADDING = b"p" * 300_000  # three batches fill a segment; the fourth rolls a new one
MAX_TIMESTAMP, EARLIEST = -3, -2
TOPIC_RESOURCE, SET = 2, 0


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApacheKafka, RunningBroker]]:
    kafka = ApacheKafka(tmp_path_factory.mktemp("kafka-max-timestamp"), SETTINGS, heap="512m")
    try:
        kafka.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        with RunningBroker(tmp_path_factory.mktemp("kbroker-max-timestamp"), {**SETTINGS, "node.id": "1"}) as ours:
            yield kafka, ours
    finally:
        kafka.stop()


def ask_both(brokers: tuple[ApacheKafka, RunningBroker], request: Any, version: int) -> tuple[Any, Any]:
    """(Kafka's answer, kbroker's answer), each on a new connection."""
    answers = []
    for bootstrap in (brokers[0].bootstrap, brokers[1].bootstrap):
        with WireClient(bootstrap) as client:
            answers.append(client.request(request, version))
    return answers[0], answers[1]


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def list_offsets(name: str, spec: int) -> ListOffsetsRequest:
    partitions = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=spec)]
    return ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=name, partitions=partitions)]
    )


def answered(answer: Any) -> tuple[int, int, int]:
    partition = answer.topics[0].partitions[0]
    assert partition.error_code == ErrorCode.NONE
    return partition.offset, partition.timestamp, partition.leader_epoch


def max_timestamp_of_both(
    brokers: tuple[ApacheKafka, RunningBroker], name: str, *, same_epochs: bool = True
) -> tuple[int, int]:
    """The (offset, timestamp) both brokers answer for MAX_TIMESTAMP, in every version that has it, the answers
    equal whole. ``same_epochs`` False leaves the leader epoch out: Kafka's node starts a new leader epoch at each
    restart (its batches since carry it), kbroker's does not."""
    found = set()
    for version in (7, 8, 11):
        kafka, ours = ask_both(brokers, list_offsets(name, MAX_TIMESTAMP), version)
        compared = [by_partition(answer) for answer in (kafka, ours)]
        if not same_epochs:
            for data in compared:
                data["topics"][0]["partitions"][0].pop("leader_epoch")
        assert compared[1] == compared[0], (version, answered(kafka), answered(ours))
        found.add(answered(kafka)[:2])
    assert len(found) == 1
    return found.pop()


def log_start_of_both(brokers: tuple[ApacheKafka, RunningBroker], name: str) -> tuple[int, int]:
    kafka, ours = ask_both(brokers, list_offsets(name, EARLIEST), 11)
    return answered(kafka)[0], answered(ours)[0]


def delete_records(brokers: tuple[ApacheKafka, RunningBroker], name: str, offset: int) -> None:
    partitions = [DeleteRecordsRequest.DeleteRecordsPartition(partition_index=0, offset=offset)]
    request = DeleteRecordsRequest(
        topics=[DeleteRecordsRequest.DeleteRecordsTopic(name=name, partitions=partitions)], timeout_ms=10_000
    )
    for answer in ask_both(brokers, request, 2):
        partition = answer.topics[0].partitions[0]
        assert (partition.error_code, partition.low_watermark) == (ErrorCode.NONE, offset)


def kafka_segment_gone(kafka: ApacheKafka, name: str, base_offset: int) -> Callable[[], bool]:
    """True once Kafka deleted the segment (its .log renamed .deleted, then removed)."""
    return lambda: not (kafka.data_dir / f"{name}-0" / f"{base_offset:020d}.log").exists()


def create_topic(brokers: tuple[ApacheKafka, RunningBroker], name: str) -> None:
    topic = CreateTopicsRequest.CreatableTopic(
        name=name,
        num_partitions=1,
        replication_factor=1,
        configs=[CreateTopicsRequest.CreatableTopicConfig(name="segment.bytes", value=str(SEGMENT_BYTES))],
    )
    for answer in ask_both(brokers, CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7):
        assert answer.topics[0].error_code == ErrorCode.NONE, answer.topics[0].error_message
    wait_readable(brokers, name)


def wait_readable(brokers: tuple[ApacheKafka, RunningBroker], name: str) -> None:
    """Kafka names a leader (and opens its log) a moment after answering, and again after a restart."""
    metadata = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=name)], allow_auto_topic_creation=False
    )

    def ready() -> bool:
        answers = ask_both(brokers, metadata, 12)
        if not all(a.topics[0].error_code == 0 and a.topics[0].partitions[0].leader_id >= 0 for a in answers):
            return False
        return not any(a.topics[0].partitions[0].error_code for a in ask_both(brokers, list_offsets(name, -1), 11))

    wait_until(ready, f"{name} not readable on both brokers")


def produce(brokers: tuple[ApacheKafka, RunningBroker], name: str, timestamps: list[int], base: int) -> None:
    """One batch, its first record padded so that every three batches fill a segment."""
    records = [
        Record(offset_delta=i, timestamp_delta=ts, value=PADDING if i == 0 else b"v") for i, ts in enumerate(timestamps)
    ]
    data = [ProduceRequest.PartitionProduceData(index=0, records=build_batch(records, base_timestamp=base))]
    request = ProduceRequest(
        acks=-1, timeout_ms=10_000, topic_data=[ProduceRequest.TopicProduceData(name=name, partition_data=data)]
    )
    for answer in ask_both(brokers, request, 9):
        assert answer.responses[0].partition_responses[0].error_code == ErrorCode.NONE


def restart_both(brokers: tuple[ApacheKafka, RunningBroker], name: str) -> None:
    brokers[0].restart()
    brokers[1].restart()
    wait_readable(brokers, name)


def kbroker_segments(ours: RunningBroker, name: str) -> list[int]:
    return sorted(int(path.stem) for path in (Path(ours.data_dir) / f"{name}-0").glob("*.log"))


def test_max_timestamp_follows_kafkas_rule_through_deletions_and_restarts(
    brokers: tuple[ApacheKafka, RunningBroker],
) -> None:
    kafka, ours = brokers
    name = f"max-ts-{uuid.uuid4().hex[:8]}"
    create_topic(brokers, name)
    base = int(time.time() * 1000) - 600_000
    # Segment 0 (offsets 0-5): the max (9000) at offsets 1, 2 (same batch) and 3 (next batch).
    # Segment 6 (offsets 6-9): its max, also 9000, at offsets 7 and 9. Segment 10 (active): 8000 at offset 10.
    for timestamps in ([1000, 9000, 9000], [9000, 3000], [4000], [5000, 9000], [6000], [9000], [8000]):
        produce(brokers, name, timestamps, base)
    assert kbroker_segments(ours, name) == [0, 6, 10]
    assert (kafka.data_dir / f"{name}-0" / f"{6:020d}.log").exists()
    assert (kafka.data_dir / f"{name}-0" / f"{10:020d}.log").exists()
    assert max_timestamp_of_both(brokers, name) == (1, base + 9000)

    # DeleteRecords inside segment 0, past the max's first record, then past all three: Kafka still answers 1.
    delete_records(brokers, name, 2)
    assert max_timestamp_of_both(brokers, name) == (1, base + 9000)
    delete_records(brokers, name, 4)
    assert max_timestamp_of_both(brokers, name) == (1, base + 9000)
    restart_both(brokers, name)
    assert log_start_of_both(brokers, name) == (4, 4)
    assert max_timestamp_of_both(brokers, name) == (1, base + 9000)

    # Past segment 0: once Kafka's retention check deleted it, segment 6 holds the max, first at offset 7.
    delete_records(brokers, name, 6)
    wait_until(kafka_segment_gone(kafka, name, 0), "Kafka did not delete segment 0")
    assert kbroker_segments(ours, name) == [6, 10]
    assert max_timestamp_of_both(brokers, name) == (7, base + 9000)
    delete_records(brokers, name, 9)
    assert max_timestamp_of_both(brokers, name) == (7, base + 9000)
    restart_both(brokers, name)
    assert max_timestamp_of_both(brokers, name) == (7, base + 9000)

    # retention.bytes deletes segment 6 (never the active one): the max is now the active segment's.
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource(
        resource_type=TOPIC_RESOURCE,
        resource_name=name,
        configs=[
            IncrementalAlterConfigsRequest.AlterableConfig(name="retention.bytes", config_operation=SET, value="1")
        ],
    )
    for answer in ask_both(brokers, IncrementalAlterConfigsRequest(resources=[resource]), 1):
        assert answer.responses[0].error_code == ErrorCode.NONE
    wait_until(lambda: log_start_of_both(brokers, name) == (10, 10), "retention did not delete segment 6")
    wait_until(kafka_segment_gone(kafka, name, 6), "Kafka did not delete segment 6")
    assert max_timestamp_of_both(brokers, name) == (10, base + 8000)
    restart_both(brokers, name)
    assert max_timestamp_of_both(brokers, name) == (10, base + 8000)


def test_max_timestamp_of_records_without_timestamps_and_of_an_empty_log(
    brokers: tuple[ApacheKafka, RunningBroker],
) -> None:
    """Records sent with timestamp -1 (NO_TIMESTAMP, which CreateTime accepts): no segment has a max above -1,
    and Kafka answers the first record all the same; an empty log has no answer."""
    name = f"max-ts-none-{uuid.uuid4().hex[:8]}"
    create_topic(brokers, name)
    assert max_timestamp_of_both(brokers, name) == (-1, -1)
    produce(brokers, name, [0, 0], base=-1)
    produce(brokers, name, [0], base=-1)
    assert max_timestamp_of_both(brokers, name) == (0, -1)


def test_max_timestamp_after_deleting_every_record(brokers: tuple[ApacheKafka, RunningBroker]) -> None:
    """DeleteRecords up to the log end: Kafka keeps the active segment (only a segment with a next one is deleted
    for lying below the log start), so its records still answer, until a roll and the next retention check."""
    kafka, ours = brokers
    name = f"max-ts-all-{uuid.uuid4().hex[:8]}"
    create_topic(brokers, name)
    base = int(time.time() * 1000) - 600_000
    for timestamps in ([9000, 1000], [2000]):
        produce(brokers, name, timestamps, base)
    delete_records(brokers, name, 3)
    assert max_timestamp_of_both(brokers, name) == (0, base + 9000)
    assert kbroker_segments(ours, name) == [0]
    restart_both(brokers, name)
    assert log_start_of_both(brokers, name) == (3, 3)
    assert max_timestamp_of_both(brokers, name) == (0, base + 9000)
    produce(brokers, name, [5000], base)  # offset 3, in the same segment
    assert max_timestamp_of_both(brokers, name) == (0, base + 9000)
    produce(brokers, name, [3000], base)  # offset 4 rolls segment 4: segment 0 still holds offset 3
    time.sleep(1)  # a few retention checks
    assert kbroker_segments(ours, name) == [0, 4]
    assert (kafka.data_dir / f"{name}-0" / f"{0:020d}.log").exists()
    assert max_timestamp_of_both(brokers, name) == (0, base + 9000)
    # Past offset 3, segment 0 lies wholly below the log start: deleted (by Kafka at its next retention check).
    delete_records(brokers, name, 5)
    wait_until(kafka_segment_gone(kafka, name, 0), "Kafka did not delete segment 0")
    assert kbroker_segments(ours, name) == [4]
    assert max_timestamp_of_both(brokers, name, same_epochs=False) == (4, base + 3000)
    # Again to the log end, then a roll: the segment DeleteRecords left goes at the next retention check.
    for timestamps in ([7000], [1000]):  # offsets 5 and 6 fill segment 4
        produce(brokers, name, timestamps, base)
    delete_records(brokers, name, 7)
    assert max_timestamp_of_both(brokers, name, same_epochs=False) == (5, base + 7000)
    produce(brokers, name, [1000], base)  # offset 7 rolls segment 7
    wait_until(kafka_segment_gone(kafka, name, 4), "Kafka did not delete segment 4")
    wait_until(lambda: kbroker_segments(ours, name) == [7], "kbroker did not delete segment 4")
    assert max_timestamp_of_both(brokers, name, same_epochs=False) == (7, base + 1000)


def test_delete_records_on_a_compact_only_topic_is_a_policy_violation(
    brokers: tuple[ApacheKafka, RunningBroker],
) -> None:
    """Kafka refuses DeleteRecords unless cleanup.policy has ``delete``, before it looks at the offset."""
    answers = {}
    for policy in ("compact", "compact,delete"):
        name = f"delete-records-{policy.replace(',', '-')}-{uuid.uuid4().hex[:8]}"
        configs = [CreateTopicsRequest.CreatableTopicConfig(name="cleanup.policy", value=policy)]
        topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=1, replication_factor=1, configs=configs)
        for answer in ask_both(brokers, CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7):
            assert answer.topics[0].error_code == ErrorCode.NONE, answer.topics[0].error_message
        wait_readable(brokers, name)
        records = [Record(offset_delta=i, timestamp_delta=0, key=b"k%d" % i, value=b"v") for i in range(3)]
        data = [ProduceRequest.PartitionProduceData(index=0, records=build_batch(records))]
        produce_request = ProduceRequest(
            acks=-1, timeout_ms=10_000, topic_data=[ProduceRequest.TopicProduceData(name=name, partition_data=data)]
        )
        for answer in ask_both(brokers, produce_request, 9):
            assert answer.responses[0].partition_responses[0].error_code == ErrorCode.NONE
        for offset in (1, 99, -1):  # inside the log, past its end, the high watermark
            partitions = [DeleteRecordsRequest.DeleteRecordsPartition(partition_index=0, offset=offset)]
            request = DeleteRecordsRequest(
                topics=[DeleteRecordsRequest.DeleteRecordsTopic(name=name, partitions=partitions)], timeout_ms=10_000
            )
            kafka, ours = ask_both(brokers, request, 2)
            theirs = kafka.topics[0].partitions[0]
            mine = ours.topics[0].partitions[0]
            assert (mine.error_code, mine.low_watermark) == (theirs.error_code, theirs.low_watermark)
            answers[policy, offset] = theirs.error_code, theirs.low_watermark
    assert answers == {
        ("compact", 1): (ErrorCode.POLICY_VIOLATION, -1),
        ("compact", 99): (ErrorCode.POLICY_VIOLATION, -1),
        ("compact", -1): (ErrorCode.POLICY_VIOLATION, -1),
        ("compact,delete", 1): (ErrorCode.NONE, 1),
        ("compact,delete", 99): (ErrorCode.OFFSET_OUT_OF_RANGE, -1),
        ("compact,delete", -1): (ErrorCode.NONE, 3),
    }
