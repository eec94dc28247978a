"""Shared by the tests run against a real Apache Kafka KRaft controller: one controller-only Kafka 4.4 node per
test module, formatted with the feature levels kbroker's brokers serve, and the settings of a kbroker broker under
it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from compat.apache_kafka import KafkaController, KafkaUnavailable

# Kafka 4.4 would finalize share.version and streams.version, which kbroker's brokers do not serve.
KBROKER_LEVELS = {"share.version": 0, "streams.version": 0}
WITHIN = 120.0  # seconds: a bound against hanging on 2 busy cores, never a measure


@contextmanager
def running_controller(directory: Path, settings: dict[str, str] | None = None) -> Iterator[KafkaController]:
    """Kafka's controller in ``directory`` with ``settings`` beside its own, stopped on exit; the test is skipped
    where Apache Kafka cannot run."""
    running = KafkaController(directory, settings, features=KBROKER_LEVELS)
    try:
        running.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaController]:
    with running_controller(tmp_path_factory.mktemp("kafka-controller")) as running:
        yield running


def broker_role_settings(controller: KafkaController, node_id: int) -> dict[str, str]:
    """A kbroker broker of ``controller``'s cluster: node ``node_id``, heartbeats every 0.5 s, and internal topics
    of one replica (a test's brokers may be fewer than Kafka's default replication factor of 3)."""
    return {
        "process.roles": "broker",
        "node.id": str(node_id),
        "controller.quorum.bootstrap.servers": controller.bootstrap,
        "controller.listener.names": "CONTROLLER",
        "broker.heartbeat.interval.ms": "500",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
    }


def wait_for(what: str, found: Callable[[], Any]) -> Any:
    """``found``'s first true answer, asked every 0.2 s; the test fails after WITHIN seconds."""
    deadline = time.monotonic() + WITHIN
    while not (answer := found()):
        assert time.monotonic() < deadline, f"no {what} within {WITHIN:g} s"
        time.sleep(0.2)
    return answer
