"""``kbroker configs describe|alter`` for topics and brokers, against kbroker and Apache Kafka 4.3 (``cluster``):
only the resource's own (dynamic) configs by default as kafka-configs.sh, every one with ``--all``, SET and DELETE
through IncrementalAlterConfigs, and refusals as one line with the broker's error code name."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from tests.commands.conftest import Cli

T = TypeVar("T")


@pytest.fixture
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["cluster"])


def entry(name: str, value: str | None, source: str, *, sensitive: bool = False, read_only: bool = False) -> dict:
    return {"name": name, "value": value, "source": source, "sensitive": sensitive, "read_only": read_only}


def test_topic_configs(cli: Cli, cluster: str, kind: str) -> None:
    topic = "cli-configs-topic"
    cli("topics", "create", topic, "--config", "retention.ms=7000", "--bootstrap", cluster)

    table = cli("configs", "describe", "--topic", topic, "--bootstrap", cluster)
    assert (table.exit_code, table.stderr) == (0, "")
    assert [line.rstrip() for line in table.stdout.splitlines()] == [
        f"Dynamic configs for topic {topic}",
        " NAME         ┃ VALUE ┃ SOURCE               ┃ SENSITIVE ┃ READ ONLY",
        "━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━",
        " retention.ms │ 7000  │ DYNAMIC_TOPIC_CONFIG │        no │        no",
    ]

    altered = cli("configs", "alter", "--topic", topic, "--set", "cleanup.policy=compact", "--delete", "retention.ms",
                  "--bootstrap", cluster)  # fmt: skip
    assert (altered.exit_code, altered.stdout, altered.stderr) == (
        0,
        f"Completed updating config for topic {topic}.\n",
        "",
    )
    document = cli("configs", "describe", "--topic", topic, "--bootstrap", cluster, "-o", "json").json()
    assert document == {
        "resource_type": "topic",
        "name": topic,
        "configs": [entry("cleanup.policy", "compact", "DYNAMIC_TOPIC_CONFIG")],
    }

    everything = cli("configs", "describe", "--topic", topic, "--all", "--bootstrap", cluster, "-o", "json").json()
    by_name = {config["name"]: config for config in everything["configs"]}
    assert by_name["cleanup.policy"] == entry("cleanup.policy", "compact", "DYNAMIC_TOPIC_CONFIG")
    assert by_name["retention.ms"] == entry("retention.ms", "604800000", "DEFAULT_CONFIG")
    assert by_name["min.insync.replicas"] == (
        entry("min.insync.replicas", "1", "DEFAULT_CONFIG")
        if kind == "kbroker"
        else entry("min.insync.replicas", "1", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    )


def test_topic_config_errors(cli: Cli, cluster: str, kind: str) -> None:
    topic = "cli-configs-errors"
    cli("topics", "create", topic, "--bootstrap", cluster)

    def failure(*argv: str) -> str:
        result = cli("configs", *argv, "--bootstrap", cluster)
        assert (result.exit_code, result.stdout) == (1, "")
        return result.stderr

    bad_value = "expected an integer, got 'x'" if kind == "kbroker" else "Not a number of type LONG"
    assert failure("alter", "--topic", topic, "--set", "retention.ms=x") == (
        f"kbroker configs: INVALID_CONFIG (40): Invalid value x for configuration retention.ms: {bad_value}\n"
    )
    assert failure("describe", "--topic", "cli-configs-missing") == (
        "kbroker configs: UNKNOWN_TOPIC_OR_PARTITION (3): topic 'cli-configs-missing' does not exist\n"
    )
    assert failure("alter", "--topic", topic) == (
        "kbroker configs: alter: nothing to change (give --set KEY=VALUE or --delete KEY)\n"
    )
    assert failure("alter", "--topic", topic, "--set", "a=1", "--delete", "a") == (
        "kbroker configs: alter: a is both set and deleted\n"
    )
    assert failure("alter", "--topic", topic, "--set", "novalue") == (
        "kbroker configs: --set 'novalue': expected KEY=VALUE\n"
    )
    assert failure("describe", "--broker", "7") == (
        f"kbroker configs: --broker 7: no such broker in the cluster (its brokers: {0 if kind == 'kbroker' else 1})\n"
    )


def test_broker_configs(cli: Cli, cluster: str, kind: str) -> None:
    broker_id = "0" if kind == "kbroker" else "1"
    # No dynamic broker config is set on either broker to begin with.
    dynamic = cli("configs", "describe", "--broker", "--bootstrap", cluster, "-o", "json")
    assert (dynamic.exit_code, dynamic.json()) == (0, {"resource_type": "broker", "name": broker_id, "configs": []})

    everything = cli("configs", "describe", "--broker", broker_id, "--all", "--bootstrap", cluster, "-o", "json")
    by_name = {config["name"]: config for config in everything.json()["configs"]}
    assert by_name["log.dirs"]["source"] == "STATIC_BROKER_CONFIG"
    assert by_name["num.partitions"] == entry("num.partitions", "1", "DEFAULT_CONFIG", read_only=True)

    altered = cli("configs", "alter", "--broker", "--set", "log.cleaner.threads=2", "--bootstrap", cluster)
    assert (altered.exit_code, altered.stdout) == (0, f"Completed updating config for broker {broker_id}.\n")

    def dynamic_configs() -> list[dict[str, object]]:
        document = cli("configs", "describe", "--broker", broker_id, "--bootstrap", cluster, "-o", "json").json()
        return list(document["configs"])

    altered_entry = [entry("log.cleaner.threads", "2", "DYNAMIC_BROKER_CONFIG")]
    try:
        # Kafka's controller accepts the change, the broker applies it once the metadata record reaches it.
        assert settled(dynamic_configs, altered_entry) == altered_entry
    finally:  # the Apache Kafka JVM is shared by the session
        removed = cli("configs", "alter", "--broker", "--delete", "log.cleaner.threads", "--bootstrap", cluster)
    assert removed.exit_code == 0
    assert settled(dynamic_configs, []) == []


def settled(read: Callable[[], T], wanted: T, timeout: float = 15.0) -> T:
    """``read()`` once it equals ``wanted`` (Kafka applies a config change a moment after answering), else its
    last value after ``timeout`` seconds, for the assertion to show."""
    deadline = time.monotonic() + timeout
    value = read()
    while value != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        value = read()
    return value
