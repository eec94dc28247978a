"""The brokers the compat scenarios run against.

- ``kbroker``: started by the suite (in-process, kbroker.testing.RunningBroker), restartable.
- ``kafka``: Apache Kafka 4.4, one KRaft node (broker and controller). Where a Docker engine answers, in Docker
  through testcontainers' Kafka module (image ``apache/kafka:4.4.0``, KBROKER_COMPAT_KAFKA_IMAGE to change it);
  without one, as a local JVM process from Maven Central's jars (compat/apache_kafka.py), restartable.
- ``external``: whatever KBROKER_COMPAT_BOOTSTRAP points at; the suite cannot restart it.

The group settings are the same on the two brokers the suite starts: no initial rebalance delay and a
1 s minimum session timeout, so a crashed member is noticed in seconds; and the log cleaner backs off 100 ms
when idle, not 15 s. An external broker keeps its own
settings; its minimum session timeout (Kafka's default: 6 s) is KBROKER_COMPAT_SESSION_TIMEOUT_MS.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from compat.apache_kafka import KAFKA_VERSION, ApacheKafka, KafkaUnavailable, new_cluster_id
from kbroker.health import wait_until_ready
from kbroker.testing import RunningBroker

TARGETS = ("kbroker", "kafka", "external")
KAFKA_IMAGE = os.environ.get("KBROKER_COMPAT_KAFKA_IMAGE", f"apache/kafka:{KAFKA_VERSION}")
FAST_GROUPS = {"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000"}
# The log cleaner looks for dirty logs every 100 ms instead of 15 s, so compaction scenarios see it work.
FAST_CLEANER = {"log.cleaner.backoff.ms": "100"}
TEST_SETTINGS = {**FAST_GROUPS, **FAST_CLEANER}


class TargetUnavailable(Exception):
    """This target cannot run here (no Docker engine, no address given); the message says why."""


@dataclass
class Target:
    name: str
    bootstrap: str
    session_timeout_ms: int = 2000

    @property
    def heartbeat_interval_ms(self) -> int:
        return max(100, self.session_timeout_ms // 6)

    @property
    def can_restart(self) -> bool:
        return False

    def restart(self) -> None:
        raise TargetUnavailable(f"the suite does not control the {self.name} target's broker")

    def stop(self) -> None:
        pass


class KBrokerTarget(Target):
    def __init__(self, data_dir: Path) -> None:
        self.broker = RunningBroker(data_dir, TEST_SETTINGS).start()
        super().__init__("kbroker", self.broker.bootstrap)

    @property
    def can_restart(self) -> bool:
        return True

    def restart(self) -> None:
        self.broker.restart()  # same port, same data directory

    def stop(self) -> None:
        self.broker.stop()


class KafkaContainerTarget(Target):
    """Apache Kafka in Docker (testcontainers); the suite cannot restart it."""

    def __init__(self) -> None:
        self.container = apache_kafka_container(KAFKA_IMAGE).start(timeout=180)  # the image pull included
        bootstrap = self.container.get_bootstrap_server()
        wait_until_ready(bootstrap, timeout=120)
        super().__init__("kafka", bootstrap)

    def stop(self) -> None:
        self.container.stop()


class LocalKafkaTarget(Target):
    """Apache Kafka as a local JVM process, with the same group settings as the kbroker target."""

    def __init__(self, directory: Path) -> None:
        try:
            self.kafka = ApacheKafka(directory, TEST_SETTINGS).start()
        except KafkaUnavailable as exc:
            raise TargetUnavailable(str(exc)) from None
        super().__init__("kafka", self.kafka.bootstrap)

    @property
    def can_restart(self) -> bool:
        return True

    def restart(self) -> None:
        self.kafka.restart()  # same ports, same data

    def stop(self) -> None:
        self.kafka.stop()


def kafka_target(scratch: Path) -> Target:
    """In Docker where an engine answers (testcontainers), else a local JVM."""
    try:
        from kbroker.testcontainers import docker_engine_problem

        problem = docker_engine_problem()
    except ImportError as exc:
        problem = str(exc)
    if problem is None:
        return KafkaContainerTarget()
    return LocalKafkaTarget(scratch / "apache-kafka")


def apache_kafka_container(image: str):
    """testcontainers' KafkaContainer, set up for the apache/kafka image instead of Confluent's.

    testcontainers-python's KafkaContainer starts Confluent images (its start script runs
    /etc/confluent/docker/*). The apache/kafka image is configured by KAFKA_* environment variables and
    started by /etc/kafka/docker/run; the container's start flow (wait for a start script, write it once
    the host port is known, wait for the log line) is KafkaContainer's own.
    """
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # testcontainers before the community namespace
        from testcontainers.kafka import KafkaContainer

    class ApacheKafkaContainer(KafkaContainer):
        def __init__(self) -> None:
            super().__init__(image=image, port=9092)

        def configure(self) -> None:
            self.wait_for = re.compile(r".*Kafka Server started.*")
            self.env.clear()  # KafkaContainer's variables are for Confluent images
            settings = {
                "CLUSTER_ID": new_cluster_id(),  # Kafka's form
                "KAFKA_NODE_ID": "1",
                "KAFKA_PROCESS_ROLES": "broker,controller",
                "KAFKA_LISTENERS": "PLAINTEXT://0.0.0.0:9092,BROKER://0.0.0.0:9093,CONTROLLER://0.0.0.0:9094",
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "KAFKA_INTER_BROKER_LISTENER_NAME": "BROKER",
                "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
                "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9094",
                "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
                "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
                "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
                "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
                "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
                "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": FAST_GROUPS["group.initial.rebalance.delay.ms"],
                "KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS": FAST_GROUPS["group.min.session.timeout.ms"],
                "KAFKA_LOG_CLEANER_BACKOFF_MS": FAST_CLEANER["log.cleaner.backoff.ms"],
            }
            for name, value in settings.items():
                self.with_env(name, value)

        def tc_start(self) -> None:
            advertised = f"PLAINTEXT://{self.get_bootstrap_server()},BROKER://$(hostname):9093"
            script = f"#!/bin/sh\nexport KAFKA_ADVERTISED_LISTENERS={advertised}\nexec /etc/kafka/docker/run\n"
            self.create_file(script.encode(), KafkaContainer.TC_START_SCRIPT)

    return ApacheKafkaContainer()


class ExternalTarget(Target):
    def __init__(self) -> None:
        bootstrap = os.environ.get("KBROKER_COMPAT_BOOTSTRAP")
        if not bootstrap:
            raise TargetUnavailable("set KBROKER_COMPAT_BOOTSTRAP=host:port to run against an external broker")
        wait_until_ready(bootstrap, timeout=30)
        super().__init__("external", bootstrap, int(os.environ.get("KBROKER_COMPAT_SESSION_TIMEOUT_MS", "6000")))


def start_target(name: str, scratch: Path) -> Target:
    if name == "kbroker":
        return KBrokerTarget(scratch / "kbroker-data")
    if name == "kafka":
        return kafka_target(scratch)
    if name == "external":
        return ExternalTarget()
    raise ValueError(f"unknown target {name!r}; expected one of {', '.join(TARGETS)}")
