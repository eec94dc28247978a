"""Produce from a client to Kafka's internal topics, sent to Apache Kafka 4.4 and to kbroker: the answers compared
partition for partition. Only the coordinators write ``__consumer_offsets`` and ``__transaction_state``; Kafka's
ReplicaManager answers a client's batch INVALID_TOPIC_EXCEPTION (without a message); ``__cluster_metadata`` is
no topic to clients."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from compat.apache_kafka import ApacheKafka, KafkaUnavailable
from kbroker.config import KEYS as BROKER_KEYS
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch

GROUP, TRANSACTION = 0, 1  # FindCoordinator key types
OFFSETS, TRANSACTIONS, METADATA = "__consumer_offsets", "__transaction_state", "__cluster_metadata"


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    try:
        kafka = ApacheKafka(tmp_path_factory.mktemp("apache-kafka-internal-produce"))
        kafka.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        overrides = {name: value for name, value in kafka.settings.items() if name in BROKER_KEYS}
        with RunningBroker(tmp_path_factory.mktemp("kbroker"), {**overrides, "node.id": "1"}) as running:
            yield {"kafka": kafka.bootstrap, "kbroker": running.bootstrap}
    finally:
        kafka.stop()


def internal_topics_ready(client: WireClient) -> dict[str, uuid.UUID]:
    """Both internal topics created (the first FindCoordinator of each kind creates one) and loaded: their ids."""
    deadline = time.monotonic() + 60
    while True:
        codes = [
            client.request(FindCoordinatorRequest(key_type=kind, coordinator_keys=[key]), 4).coordinators[0].error_code
            for kind, key in ((GROUP, "internal-produce"), (TRANSACTION, "internal-produce"))
        ]
        if codes == [ErrorCode.NONE, ErrorCode.NONE]:
            break
        assert time.monotonic() < deadline, codes
        time.sleep(0.2)
    answer = client.request(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12)
    return {t.name: t.topic_id for t in answer.topics if t.name in (OFFSETS, TRANSACTIONS)}


def end_offset(client: WireClient, topic: str) -> int:
    """Partition 0's log end offset, once its leader serves it (Kafka's comes a moment after its coordinator)."""
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)]
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=wanted)]
    )
    deadline = time.monotonic() + 60
    while (answer := client.request(request, 7).topics[0].partitions[0]).error_code != ErrorCode.NONE:
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)
    return int(answer.offset)


def produce(client: WireClient, topic: str, partition: int, acks: int, version: int, topic_id: uuid.UUID) -> tuple:
    batch = build_batch([Record(key=b"k", value=b"v", timestamp_delta=0, offset_delta=0)], base_timestamp=0)
    data = ProduceRequest.PartitionProduceData(index=partition, records=batch)
    named = ProduceRequest.TopicProduceData(name=topic, partition_data=[data])
    if version >= 13:
        named = ProduceRequest.TopicProduceData(topic_id=topic_id, partition_data=[data])
    answer = client.request(ProduceRequest(acks=acks, timeout_ms=10_000, topic_data=[named]), version)
    (response,) = answer.responses
    (part,) = response.partition_responses
    return (part.index, part.error_code, part.error_message, part.base_offset, part.record_errors)


def scenario(bootstrap: str) -> dict[str, tuple]:
    seen = {}
    with WireClient(bootstrap) as client:
        ids = internal_topics_ready(client)
        ends = {topic: end_offset(client, topic) for topic in (OFFSETS, TRANSACTIONS)}
        cases = [(OFFSETS, 0), (TRANSACTIONS, 0), (OFFSETS, 999), (METADATA, 0)]
        for topic, partition in cases:
            for acks in (-1, 1):
                for version in (3, 9, 13):
                    # __cluster_metadata has Kafka's fixed topic id 1 (Uuid.METADATA_TOPIC_ID).
                    topic_id = ids.get(topic, uuid.UUID(int=1))
                    key = f"{topic}-{partition} acks={acks} v{version}"
                    seen[key] = produce(client, topic, partition, acks, version, topic_id)
        seen["nothing written"] = tuple(end_offset(client, topic) - ends[topic] for topic in (OFFSETS, TRANSACTIONS))
    return seen


def test_produce_to_internal_topics_is_refused_as_kafka_refuses_it(brokers: dict[str, str]) -> None:
    seen = {name: scenario(bootstrap) for name, bootstrap in brokers.items()}
    assert seen["kbroker"] == seen["kafka"]
    refused = (0, ErrorCode.INVALID_TOPIC_EXCEPTION, None, -1, [])
    assert seen["kafka"][f"{OFFSETS}-0 acks=-1 v9"] == refused
    assert seen["kafka"][f"{TRANSACTIONS}-0 acks=1 v13"] == refused
    assert seen["kafka"]["nothing written"] == (0, 0)
