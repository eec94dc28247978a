"""Fixtures for the client commands' tests: run ``kbroker <command>`` in this process, and a ``cluster`` that is
kbroker and, in a second run of each test, Apache Kafka 4.3 (the commands are Kafka clients: both must work)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka
from kbroker.cli import main
from kbroker.testing import RunningBroker


@dataclass
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


Cli = Callable[..., CommandResult]


def unique(prefix: str) -> str:
    """A topic, group or transactional id of its own (the Apache Kafka JVM is shared by the session)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, prefix: str, partitions: int = 1) -> str:
    """A new topic named after ``prefix``, made with kafka-python's admin client (not the command under test)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    topic = unique(prefix)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()
    return topic


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Cli:
    """``cli("topics", "list", "--bootstrap", b)``: run the kbroker command line here; exit code and output."""

    def run(*argv: str) -> CommandResult:
        capsys.readouterr()  # drop what came before
        code = main(list(argv))
        captured = capsys.readouterr()
        return CommandResult(code, captured.out, captured.err)

    return run


@pytest.fixture(params=["kbroker", "kafka"])
def cluster(request: pytest.FixtureRequest) -> str:
    """The bootstrap address of kbroker, then of Apache Kafka 4.3 (one JVM for the session; tests use topic and
    group names of their own so they do not meet)."""
    if request.param == "kbroker":
        broker: RunningBroker = request.getfixturevalue("broker")
        return broker.bootstrap
    kafka: ApacheKafka = request.getfixturevalue("apache_kafka")
    return kafka.bootstrap
