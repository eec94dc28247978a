"""Shared by the tests run against a real Apache Kafka KRaft controller: one controller-only Kafka 4.4 node per
test module, formatted with the feature levels kbroker's brokers serve."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from compat.apache_kafka import KafkaController, KafkaUnavailable

# Kafka 4.4 would finalize share.version and streams.version, which kbroker's brokers do not serve.
KBROKER_LEVELS = {"share.version": 0, "streams.version": 0}


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaController]:
    running = KafkaController(tmp_path_factory.mktemp("kafka-controller"), features=KBROKER_LEVELS)
    try:
        running.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        yield running
    finally:
        running.stop()
