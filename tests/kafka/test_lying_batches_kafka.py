"""Each lying batch shape of tests/broker/test_lying_batches.py sent to Apache Kafka 4.4 and to kbroker: the same
error code from both (issue #15, item 3). Kafka puts the reason in its log, not in the Produce answer (its
error_message is null for these), so the messages kbroker sends, Kafka's logged words, are asserted by the
kbroker-only test. Shapes Kafka accepts are accepted by both, and ListOffsets then answers the same from
both: Kafka recomputes a batch's max timestamp from its records, and so does kbroker.
"""

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
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.produce_request import ProduceRequest
from tests.broker.test_lying_batches import ACCEPTED_SHAPES, LYING_SHAPES, REQUEST_SHAPES

LATEST, MAX_TIMESTAMP = -1, -3


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory, apache_kafka: ApacheKafka) -> Iterator[dict[str, str]]:
    """{"kafka": bootstrap, "kbroker": bootstrap}, kbroker set up like the Kafka fixture."""
    overrides = {name: value for name, value in apache_kafka.settings.items() if name in BROKER_KEYS}
    with RunningBroker(tmp_path_factory.mktemp("kbroker"), {**overrides, "node.id": "1"}) as running:
        yield {"kafka": apache_kafka.bootstrap, "kbroker": running.bootstrap}


def list_offsets(bootstrap: str, topic: str, timestamp: int) -> tuple[int, int, int]:
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=timestamp)]
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=wanted)]
    )
    with WireClient(bootstrap) as client:
        answer = client.request(request, 8).topics[0].partitions[0]
    return answer.error_code, answer.offset, answer.timestamp


def create(brokers: dict[str, str]) -> str:
    """A new one-partition topic on both brokers, once both can take writes (Kafka's log comes a moment late)."""
    name = f"lying-{uuid.uuid4().hex[:10]}"
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=1, replication_factor=1)
    for bootstrap in brokers.values():
        with WireClient(bootstrap) as client:
            answer = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7)
        assert answer.topics[0].error_code == ErrorCode.NONE, answer.topics[0].error_message
    deadline = time.monotonic() + 15
    while any(list_offsets(bootstrap, name, LATEST)[0] for bootstrap in brokers.values()):
        assert time.monotonic() < deadline, f"{name} not readable on both brokers"
        time.sleep(0.1)
    return name


def produce(bootstrap: str, topic: str, batch: bytes) -> Any:
    request = ProduceRequest(
        acks=-1,
        timeout_ms=10_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
            )
        ],
    )
    with WireClient(bootstrap) as client:
        return client.request(request, 9).responses[0].partition_responses[0]


def test_lying_batches_get_kafkas_codes(brokers: dict[str, str]) -> None:
    topic = create(brokers)
    now = int(time.time() * 1000)
    shapes = {**LYING_SHAPES, **REQUEST_SHAPES}
    answers = {
        label: {name: produce(bootstrap, topic, build(now)) for name, bootstrap in brokers.items()}
        for label, (build, _, _) in shapes.items()
    }
    codes = {label: {name: a.error_code for name, a in pair.items()} for label, pair in answers.items()}
    assert codes == {label: {"kafka": code, "kbroker": code} for label, (_, code, _) in shapes.items()}
    assert {label: pair["kafka"].error_message for label, pair in answers.items()} == dict.fromkeys(shapes)
    # Nothing was written on either side.
    assert {name: list_offsets(bootstrap, topic, LATEST) for name, bootstrap in brokers.items()} == {
        "kafka": (ErrorCode.NONE, 0, -1),
        "kbroker": (ErrorCode.NONE, 0, -1),
    }


def test_batches_kafka_accepts_are_stored_alike(brokers: dict[str, str]) -> None:
    now = int(time.time() * 1000)
    for label, (build, _) in ACCEPTED_SHAPES.items():
        topic = create(brokers)
        batch = build(now)
        offsets = {name: produce(bootstrap, topic, batch).error_code for name, bootstrap in brokers.items()}
        assert offsets == {"kafka": ErrorCode.NONE, "kbroker": ErrorCode.NONE}, label
        # The largest timestamp is the records' own on both, not the header's claim.
        found = {name: list_offsets(bootstrap, topic, MAX_TIMESTAMP) for name, bootstrap in brokers.items()}
        assert found["kbroker"] == found["kafka"], label
        later = {name: list_offsets(bootstrap, topic, now + 500)[1] for name, bootstrap in brokers.items()}
        assert later == {"kafka": -1, "kbroker": -1}, label
