"""min.insync.replicas above 1 on a topic with one replica, sent to Apache Kafka 4.3 and to kbroker: the error
codes of acks=-1, 1 and 0 compared, with the value set as the broker-level default (server.properties), at
topic creation, and with IncrementalAlterConfigs.

Kafka caps min.insync.replicas by the partition's replica count (Partition.effectiveMinIsr, KAFKA-15583), so on
a one-replica topic every acks is accepted; what a too-small ISR answers (NOT_ENOUGH_REPLICAS to acks=all, acks=1
and 0 accepted) needs more replicas than in-sync ones, which tests/replication exercises through the replica
layer's input.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka, KafkaUnavailable
from kbroker.config import KEYS as BROKER_KEYS
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.framing import encode_request
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch

LATEST = -1
SET = 0
TOPIC = 2  # IncrementalAlterConfigs resource type


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """{"kafka": bootstrap, "kbroker": bootstrap}, both with min.insync.replicas=2 as the broker default."""
    try:
        kafka = ApacheKafka(tmp_path_factory.mktemp("apache-kafka-min-isr"), {"min.insync.replicas": "2"})
        kafka.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        overrides = {name: value for name, value in kafka.settings.items() if name in BROKER_KEYS}
        with RunningBroker(tmp_path_factory.mktemp("kbroker"), {**overrides, "node.id": "1"}) as running:
            yield {"kafka": kafka.bootstrap, "kbroker": running.bootstrap}
    finally:
        kafka.stop()


def latest(bootstrap: str, topic: str) -> tuple[int, int]:
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=LATEST)]
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=wanted)]
    )
    with WireClient(bootstrap) as client:
        answer = client.request(request, 8).topics[0].partitions[0]
    return answer.error_code, answer.offset


def create(brokers: dict[str, str], configs: dict[str, str]) -> tuple[str, dict[str, tuple[int, str | None]]]:
    """A one-partition topic with one replica on both brokers: its name and each broker's CreateTopics answer."""
    name = f"min-isr-{uuid.uuid4().hex[:10]}"
    topic = CreateTopicsRequest.CreatableTopic(
        name=name,
        num_partitions=1,
        replication_factor=1,
        configs=[CreateTopicsRequest.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()],
    )
    answers = {}
    for broker, bootstrap in brokers.items():
        with WireClient(bootstrap) as client:
            answer = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7).topics[0]
        answers[broker] = (answer.error_code, answer.error_message)
    if all(code == ErrorCode.NONE for code, _ in answers.values()):
        deadline = time.monotonic() + 15
        while any(latest(bootstrap, name)[0] for bootstrap in brokers.values()):  # Kafka's log comes a moment late
            assert time.monotonic() < deadline, f"{name} not readable on both brokers"
            time.sleep(0.1)
    return name, answers


def alter(bootstrap: str, topic: str, value: str) -> tuple[int, str | None]:
    config = IncrementalAlterConfigsRequest.AlterableConfig(
        name="min.insync.replicas", config_operation=SET, value=value
    )
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource(
        resource_type=TOPIC, resource_name=topic, configs=[config]
    )
    with WireClient(bootstrap) as client:
        answer = client.request(IncrementalAlterConfigsRequest(resources=[resource]), 1).responses[0]
    return answer.error_code, answer.error_message


def produce(bootstrap: str, topic: str, acks: int) -> Any:
    """One record with ``acks``: the partition's (error code, base offset), or None (acks=0 gets no answer)."""
    batch = build_batch([Record(offset_delta=0, timestamp_delta=0, key=b"k", value=f"acks={acks}".encode())])
    request = ProduceRequest(
        acks=acks,
        timeout_ms=10_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
            )
        ],
    )
    if acks == 0:  # answered with silence: sent, and its effect looked for in the log end
        host, _, port = bootstrap.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as connection:
            connection.sendall(encode_request(request, 9, 1, client_id="min-isr-test"))
        return None
    with WireClient(bootstrap) as client:
        answer = client.request(request, 9).responses[0].partition_responses[0]
    return answer.error_code, answer.base_offset


def outcomes(brokers: dict[str, str], topic: str) -> dict[str, list[Any]]:
    """Per broker: acks=-1, 1 and 0's answers, then the log end they left (what was written)."""
    found: dict[str, list[Any]] = {}
    for broker, bootstrap in brokers.items():
        answers = [produce(bootstrap, topic, acks) for acks in (-1, 1, 0)]
        deadline = time.monotonic() + 10
        while latest(bootstrap, topic) != (ErrorCode.NONE, 3):  # acks=0 is not answered: wait for its record
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        found[broker] = [*answers, latest(bootstrap, topic)]
    return found


def test_min_insync_replicas_above_the_replica_count_answers_as_kafka(brokers: dict[str, str]) -> None:
    everything_written = [(ErrorCode.NONE, 0), (ErrorCode.NONE, 1), None, (ErrorCode.NONE, 3)]
    # The broker-level default (2).
    by_default, created = create(brokers, {})
    assert created == {"kafka": (ErrorCode.NONE, None), "kbroker": (ErrorCode.NONE, None)}
    assert outcomes(brokers, by_default) == {"kafka": everything_written, "kbroker": everything_written}
    # Set at creation (above the default too).
    at_creation, created = create(brokers, {"min.insync.replicas": "3"})
    assert created == {"kafka": (ErrorCode.NONE, None), "kbroker": (ErrorCode.NONE, None)}
    assert outcomes(brokers, at_creation) == {"kafka": everything_written, "kbroker": everything_written}
    # Created with 1, then altered to 2.
    altered, created = create(brokers, {"min.insync.replicas": "1"})
    assert created == {"kafka": (ErrorCode.NONE, None), "kbroker": (ErrorCode.NONE, None)}
    assert {broker: alter(bootstrap, altered, "2") for broker, bootstrap in brokers.items()} == {
        "kafka": (ErrorCode.NONE, None),
        "kbroker": (ErrorCode.NONE, None),
    }
    assert outcomes(brokers, altered) == {"kafka": everything_written, "kbroker": everything_written}
    # A value below 1 is refused by both, with the same code.
    _, refused = create(brokers, {"min.insync.replicas": "0"})
    assert refused["kafka"][0] == refused["kbroker"][0] == ErrorCode.INVALID_CONFIG
