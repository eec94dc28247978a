"""``kbroker topics``: list, describe (leaders, offsets, sizes, configs with sources), create, delete, alter, each
against kbroker and Apache Kafka 4.3 (``cluster``), with exact output, JSON and error lines.

Where the two brokers differ it is the broker, not the command: Apache Kafka's KRaft format stores
min.insync.replicas=1 as a cluster-wide dynamic default (so it shows as a non-default topic config), and the two
word their INVALID_CONFIG and INVALID_PARTITIONS messages differently.
"""

from __future__ import annotations

import re

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tests.commands.conftest import Cli

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
KAFKA_MIN_ISR = {
    "name": "min.insync.replicas",
    "value": "1",
    "source": "DYNAMIC_DEFAULT_BROKER_CONFIG",
    "sensitive": False,
    "read_only": False,
}


@pytest.fixture
def kind(request: pytest.FixtureRequest) -> str:
    """``kbroker`` or ``kafka``: which broker ``cluster`` is."""
    return str(request.node.callspec.params["cluster"])


def lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def produce(bootstrap: str, topic: str, partition: int, count: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    for index in range(count):
        # One batch per record (waiting for each), so the bytes on disk are the same on every broker.
        producer.send(
            topic, key=b"k", value=b"v%d" % index, partition=partition, timestamp_ms=1_700_000_000_000 + index
        ).get(10)
    producer.close()


def test_create_list_describe_delete(cli: Cli, cluster: str, kind: str) -> None:
    topic = "cli-topics-life"
    created = cli("topics", "create", topic, "--partitions", "2", "--replication-factor", "1",
                  "--config", "retention.ms=5000", "--bootstrap", cluster)  # fmt: skip
    assert (created.exit_code, created.stdout, created.stderr) == (0, f"Created topic {topic}.\n", "")
    produce(cluster, topic, 0, 3)

    listed = cli("topics", "list", "cli-topics-l.*", "--bootstrap", cluster)
    assert listed.exit_code == 0
    assert lines(listed.stdout) == [
        " NAME            ┃ PARTITIONS ┃ REPLICATION FACTOR",
        "━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━",
        " cli-topics-life │          2 │                  1",
    ]
    as_json = cli("topics", "list", "cli-topics-l.*", "--bootstrap", cluster, "--output", "json")
    assert as_json.json() == [{"name": topic, "partitions": 2, "replication_factor": 1, "internal": False}]

    described = cli("topics", "describe", topic, "--bootstrap", cluster, "-o", "json")
    assert described.exit_code == 0
    [document] = described.json()
    topic_id = document.pop("topic_id")
    assert UUID.match(topic_id)
    leader = 0 if kind == "kbroker" else 1  # Apache Kafka's node.id in compat/apache_kafka.py
    # The same three batches on both brokers: 213 bytes on disk.
    partitions = [
        {"partition": 0, "leader": leader, "replicas": [leader], "isr": [leader],
         "log_start_offset": 0, "log_end_offset": 3, "size_bytes": 213},
        {"partition": 1, "leader": leader, "replicas": [leader], "isr": [leader],
         "log_start_offset": 0, "log_end_offset": 0, "size_bytes": 0},
    ]  # fmt: skip
    retention = {
        "name": "retention.ms",
        "value": "5000",
        "source": "DYNAMIC_TOPIC_CONFIG",
        "sensitive": False,
        "read_only": False,
    }
    assert document == {
        "name": topic,
        "internal": False,
        "partition_count": 2,
        "replication_factor": 1,
        "partitions": partitions,
        "configs": [retention] if kind == "kbroker" else [KAFKA_MIN_ISR, retention],
    }

    table = cli("topics", "describe", topic, "--bootstrap", cluster)
    assert table.exit_code == 0
    config_lines = (
        [
            " NAME         ┃ VALUE ┃ SOURCE               ┃ SENSITIVE ┃ READ ONLY",
            "━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━",
            " retention.ms │ 5000  │ DYNAMIC_TOPIC_CONFIG │        no │        no",
        ]
        if kind == "kbroker"
        else [
            " NAME                ┃ VALUE ┃ SOURCE                        ┃ SENSITIVE ┃ READ ONLY",
            "━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━",
            " min.insync.replicas │ 1     │ DYNAMIC_DEFAULT_BROKER_CONFIG │        no │        no",
            " retention.ms        │ 5000  │ DYNAMIC_TOPIC_CONFIG          │        no │        no",
        ]
    )
    assert lines(table.stdout) == [
        f"Topic: {topic}  TopicId: {topic_id}  PartitionCount: 2  ReplicationFactor: 1",
        " PARTITION ┃ LEADER ┃ REPLICAS ┃ ISR ┃ LOG START OFFSET ┃ LOG END OFFSET ┃ SIZE BYTES",
        "━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━╇━━━━━╇━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━",
        f"         0 │      {leader} │ {leader}        │ {leader}   │                0 │              3 │        213",
        f"         1 │      {leader} │ {leader}        │ {leader}   │                0 │              0 │          0",
        "Configs (non-default)",
        *config_lines,
    ]

    # --all-configs: the defaults too, each with its source.
    everything = cli("topics", "describe", topic, "--all-configs", "--bootstrap", cluster, "-o", "json").json()[0]
    by_name = {entry["name"]: entry for entry in everything["configs"]}
    assert by_name["retention.ms"] == retention
    assert by_name["cleanup.policy"] == {
        "name": "cleanup.policy",
        "value": "delete",
        "source": "DEFAULT_CONFIG",
        "sensitive": False,
        "read_only": False,
    }
    assert [entry["name"] for entry in everything["configs"]] == sorted(by_name)

    deleted = cli("topics", "delete", topic, "--bootstrap", cluster)
    assert (deleted.exit_code, deleted.stdout, deleted.stderr) == (0, f"Deleted topic {topic}.\n", "")
    assert cli("topics", "list", "cli-topics-l.*", "--bootstrap", cluster, "-o", "json").json() == []


def test_create_with_broker_defaults_and_if_not_exists(cli: Cli, cluster: str) -> None:
    topic = "cli-topics-defaults"
    assert cli("topics", "create", topic, "--bootstrap", cluster).stdout == f"Created topic {topic}.\n"
    # num.partitions=1 and default.replication.factor=1 on both brokers.
    assert cli("topics", "list", topic, "--bootstrap", cluster, "-o", "json").json() == [
        {"name": topic, "partitions": 1, "replication_factor": 1, "internal": False}
    ]
    again = cli("topics", "create", topic, "--bootstrap", cluster)
    assert (again.exit_code, again.stdout) == (1, "")
    assert again.stderr == f"kbroker topics: TOPIC_ALREADY_EXISTS (36): Topic '{topic}' already exists.\n"
    quiet = cli("topics", "create", topic, "--partitions", "4", "--if-not-exists", "--bootstrap", cluster)
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "")
    assert cli("topics", "list", topic, "--bootstrap", cluster, "-o", "json").json()[0]["partitions"] == 1


def test_errors_are_one_line(cli: Cli, cluster: str, kind: str) -> None:
    def failure(*argv: str) -> str:
        result = cli(*argv, "--bootstrap", cluster)
        assert (result.exit_code, result.stdout) == (1, "")
        return result.stderr

    missing = "kbroker topics: UNKNOWN_TOPIC_OR_PARTITION (3): topic 'cli-topics-missing' does not exist\n"
    assert failure("topics", "describe", "cli-topics-missing") == missing
    assert failure("topics", "delete", "cli-topics-missing") == missing
    assert failure("topics", "alter", "cli-topics-missing", "--partitions", "3") == missing

    bad_value = (
        "expected an integer, got 'abc'" if kind == "kbroker" else "Not a number of type LONG"
    )  # each broker's own words
    assert failure("topics", "create", "cli-topics-bad", "--config", "retention.ms=abc") == (
        f"kbroker topics: INVALID_CONFIG (40): Invalid value abc for configuration retention.ms: {bad_value}\n"
    )
    assert failure("topics", "create", "cli-topics-bad", "--config", "retention.ms") == (
        "kbroker topics: --config 'retention.ms': expected KEY=VALUE\n"
    )
    assert failure("topics", "create", "cli-topics-bad", "--partitions", "99999999999") == (
        "kbroker topics: a number given is out of range for Kafka's protocol "
        "('i' format requires -2147483648 <= number <= 2147483647)\n"
    )
    assert failure("topics", "list", "(") == (
        "kbroker topics: list: '(' is not a regular expression: missing ), unterminated subpattern at position 0\n"
    )
    assert failure("topics", "alter", "cli-topics-bad") == (
        "kbroker topics: alter: nothing to change (give --partitions N, --config KEY=VALUE or --delete-config KEY)\n"
    )
    assert cli("topics", "list", "cli-topics-bad", "--bootstrap", cluster, "-o", "json").json() == []

    skipped = cli("topics", "delete", "cli-topics-missing", "--if-exists", "--bootstrap", cluster)
    assert (skipped.exit_code, skipped.stdout, skipped.stderr) == (0, "", "")


def test_delete_reports_each_topic(cli: Cli, cluster: str) -> None:
    assert cli("topics", "create", "cli-topics-del-a", "--bootstrap", cluster).exit_code == 0
    result = cli("topics", "delete", "cli-topics-del-a", "cli-topics-del-missing", "--bootstrap", cluster)
    assert result.exit_code == 1
    assert result.stdout == "Deleted topic cli-topics-del-a.\n"
    assert result.stderr == (
        "kbroker topics: UNKNOWN_TOPIC_OR_PARTITION (3): topic 'cli-topics-del-missing' does not exist\n"
    )


def test_alter_partitions_and_configs(cli: Cli, cluster: str, kind: str) -> None:
    topic = "cli-topics-alter"
    cli("topics", "create", topic, "--partitions", "1", "--config", "retention.ms=5000", "--bootstrap", cluster)
    result = cli("topics", "alter", topic, "--partitions", "3", "--config", "segment.ms=100000",
                 "--delete-config", "retention.ms", "--bootstrap", cluster)  # fmt: skip
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == f"Topic {topic} now has 3 partitions.\nCompleted updating config for topic {topic}.\n"
    [document] = cli("topics", "describe", topic, "--bootstrap", cluster, "-o", "json").json()
    assert [partition["partition"] for partition in document["partitions"]] == [0, 1, 2]
    segment = {
        "name": "segment.ms",
        "value": "100000",
        "source": "DYNAMIC_TOPIC_CONFIG",
        "sensitive": False,
        "read_only": False,
    }
    assert document["configs"] == ([segment] if kind == "kbroker" else [KAFKA_MIN_ISR, segment])

    fewer = cli("topics", "alter", topic, "--partitions", "2", "--bootstrap", cluster)
    assert (fewer.exit_code, fewer.stdout) == (1, "")
    assert fewer.stderr == "kbroker topics: INVALID_PARTITIONS (37): " + (
        "Topic currently has 3 partitions, which is higher than the requested 2.\n"
        if kind == "kbroker"
        else f"The topic {topic} currently has 3 partition(s); 2 would not be an increase.\n"
    )


def test_list_internal_topics(cli: Cli, cluster: str, kind: str) -> None:
    # A committed offset makes the group coordinator create __consumer_offsets.
    topic = "cli-topics-internal"
    cli("topics", "create", topic, "--bootstrap", cluster)
    consumer = KafkaConsumer(bootstrap_servers=cluster, group_id="cli-topics-internal-group", enable_auto_commit=False)
    consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(0, "", -1)})
    consumer.close()

    assert cli("topics", "list", "__consumer_offsets", "--bootstrap", cluster, "-o", "json").json() == []
    internal = cli("topics", "list", "__consumer_offsets", "--internal", "--bootstrap", cluster, "-o", "json").json()
    # kbroker's fixture broker has the default 50 partitions; compat/apache_kafka.py sets offsets.topic.num.partitions=1
    partitions = 50 if kind == "kbroker" else 1
    assert internal == [
        {"name": "__consumer_offsets", "partitions": partitions, "replication_factor": 1, "internal": True}
    ]
    described = cli("topics", "describe", "--bootstrap", cluster, "-o", "json").json()
    assert "__consumer_offsets" not in [document["name"] for document in described]
    assert topic in [document["name"] for document in described]
