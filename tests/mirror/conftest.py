"""Fixtures for ``kbroker mirror``'s tests: pairs of clusters (kbroker→kbroker, kbroker→Apache Kafka, Apache
Kafka→kbroker), a way to run the command in this process, and helpers that write and read records exactly."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka
from kbroker.cli import main
from kbroker.testing import RunningBroker


@dataclass(frozen=True)
class Pair:
    source: str
    target: str
    alias: str  # unique per test: Apache Kafka is shared by the session, so names must not meet


@pytest.fixture(params=["kbroker-to-kbroker", "kbroker-to-kafka", "kafka-to-kbroker"])
def pair(request: pytest.FixtureRequest, broker_factory: Callable[..., RunningBroker]) -> Pair:
    alias = f"s{uuid.uuid4().hex[:8]}"
    if request.param == "kbroker-to-kbroker":
        return Pair(broker_factory().bootstrap, broker_factory().bootstrap, alias)
    kafka: ApacheKafka = request.getfixturevalue("apache_kafka")
    if request.param == "kbroker-to-kafka":
        return Pair(broker_factory().bootstrap, kafka.bootstrap, alias)
    return Pair(kafka.bootstrap, broker_factory().bootstrap, alias)


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def kbroker(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``kbroker("mirror", "--source", ...)``: the command line, run here; exit code and output."""

    def run(*argv: str) -> Result:
        capsys.readouterr()
        code = main(list(argv))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


# A record as the test compares it: everything the mirror must preserve.
Record = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int]  # partition, offset, ...


def create_topic(bootstrap: str, name: str, partitions: int, configs: dict[str, str] | None = None) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
    finally:
        admin.close()


def produce(
    bootstrap: str, topic: str, records: Iterable[tuple[int, bytes | None, bytes | None, list[Any], int]]
) -> None:
    """Write ``(partition, key, value, headers, timestamp)`` records and wait for them."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        for partition, key, value, headers, timestamp in records:
            producer.send(
                topic, key=key, value=value, headers=headers or None, partition=partition, timestamp_ms=timestamp
            )
        producer.flush()
    finally:
        producer.close()


def read_all(bootstrap: str, topic: str, isolation_level: str = "read_committed") -> list[Record]:
    """Every record of ``topic`` up to its end, in partition and offset order."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation_level)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        records: list[Record] = []
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend((r.partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp) for r in batch)
        return sorted(records)
    finally:
        consumer.close(autocommit=False)


def topic_partitions(bootstrap: str, topic: str) -> int:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (description,) = admin.describe_topics([topic])
        return len(description["partitions"])
    finally:
        admin.close()


def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    """The topic's configs set on the topic itself."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        entries = described["topic"][topic]
        return {name: e["value"] for name, e in entries.items() if e["config_source"] == "DYNAMIC_TOPIC_CONFIG"}
    finally:
        admin.close()


def list_topics(bootstrap: str) -> set[str]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def mirror_once(kbroker: Callable[..., Result], pair: Pair, topic: str, *extra: str) -> Result:
    """``kbroker mirror --once`` of the topics matching ``topic`` from the pair's source to its target."""
    return kbroker("mirror", "--source", pair.source, "--target", pair.target, "--topics", topic,
                   "--source-alias", pair.alias, "--once", *extra)  # fmt: skip
