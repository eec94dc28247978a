"""``kbroker produce``: lines in, records out, against kbroker and Apache Kafka (``cluster``). The records are read
back with kafka-python's consumer, not with ``kbroker consume``, so a fault in one command cannot hide one in the
other."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from kbroker.testing import RunningBroker
from tests.commands.conftest import Cli, create_topic, unique


def read_partition(
    bootstrap: str, topic: str, partition: int, expected: int, isolation: str = "read_uncommitted"
) -> list[Any]:
    """Every record of one partition up to its end offset (at least ``expected`` of them)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        records: list[Any] = []
        for _ in range(100):
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
            if len(records) >= expected and consumer.position(tp) >= consumer.end_offsets([tp])[tp]:
                break
        return records
    finally:
        consumer.close()


def write_lines(tmp_path: Path, text: bytes) -> str:
    path = tmp_path / "input.txt"
    path.write_bytes(text)
    return str(path)


def test_keys_values_headers_and_partition_round_trip(cluster: str, cli: Cli, tmp_path: Path) -> None:
    topic = create_topic(cluster, "produce", partitions=3)
    lines = write_lines(tmp_path, b"k1:v1\nk2:v:2\nk3:\n:no key text\n")
    result = cli(
        "produce", topic, "--bootstrap", cluster, "--file", lines, "-K", ":", "-H", "a=1", "-H", "b=x=y",
        "--partition", "1", "--output", "json",
    )  # fmt: skip
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.json() == {
        "topic": topic,
        "produced": 4,
        "failed": 0,
        "transactional_id": None,
        "transaction": None,
        "partitions": [{"partition": 1, "records": 4, "first_offset": 0, "last_offset": 3}],
        "errors": [],
    }
    records = read_partition(cluster, topic, 1, 4)
    assert [(r.offset, r.key, r.value, r.headers) for r in records] == [
        (0, b"k1", b"v1", [("a", b"1"), ("b", b"x=y")]),
        (1, b"k2", b"v:2", [("a", b"1"), ("b", b"x=y")]),
        (2, b"k3", b"", [("a", b"1"), ("b", b"x=y")]),
        (3, b"", b"no key text", [("a", b"1"), ("b", b"x=y")]),
    ]


def test_stdin_lines_without_key_and_the_verbose_summary(
    cluster: str, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = create_topic(cluster, "produce")
    # CRLF line ends are taken off as Kafka's line reader does; the last line has no end; an empty line is a record.
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"one\r\n\ntwo \xff\nthree")))
    result = cli("produce", topic, "--bootstrap", cluster, "-v")
    assert (result.exit_code, result.stdout) == (0, "")
    assert result.stderr == f"produced 4 records to {topic}\n  partition 0: offsets 0-3 (4 records)\n"
    records = read_partition(cluster, topic, 0, 4)
    assert [(r.key, r.value, r.headers) for r in records] == [
        (None, b"one", []),
        (None, b"", []),
        (None, b"two \xff", []),
        (None, b"three", []),
    ]


def test_null_value_marker_sends_tombstones(cluster: str, cli: Cli, tmp_path: Path) -> None:
    topic = create_topic(cluster, "produce")
    lines = write_lines(tmp_path, b"a=1\na=NULL\nNULL=2\n")
    result = cli(
        "produce", topic, "--bootstrap", cluster, "--file", lines, "-K", "=", "--null-value-marker", "NULL"
    )  # fmt: skip
    assert (result.exit_code, result.stderr) == (0, f"produced 3 records to {topic}\n")
    records = read_partition(cluster, topic, 0, 3)
    assert [(r.key, r.value) for r in records] == [(b"a", b"1"), (b"a", None), (None, b"2")]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression_codecs_round_trip(cluster: str, cli: Cli, tmp_path: Path, codec: str) -> None:
    topic = create_topic(cluster, "produce")
    values = [f"{codec} record {n} ".encode() * 20 for n in range(5)]
    lines = write_lines(tmp_path, b"\n".join(values) + b"\n")
    result = cli(
        "produce", topic, "--bootstrap", cluster, "--file", lines, "--compression", codec, "--linger-ms", "50",
        "--acks", "1",
    )  # fmt: skip
    assert (result.exit_code, result.stderr) == (0, f"produced 5 records to {topic}\n")
    records = read_partition(cluster, topic, 0, 5)
    assert [(r.offset, r.value) for r in records] == list(enumerate(values))


def test_idempotent_producer(cluster: str, cli: Cli, tmp_path: Path) -> None:
    topic = create_topic(cluster, "produce")
    lines = write_lines(tmp_path, b"x\ny\n")
    result = cli("produce", topic, "--bootstrap", cluster, "--file", lines, "--idempotent")
    assert (result.exit_code, result.stderr) == (0, f"produced 2 records to {topic}\n")
    assert [r.value for r in read_partition(cluster, topic, 0, 2)] == [b"x", b"y"]


def test_transaction_is_committed_at_the_end_of_the_input(cluster: str, cli: Cli, tmp_path: Path) -> None:
    topic = create_topic(cluster, "produce")
    lines = write_lines(tmp_path, b"t1\nt2\nt3\n")
    result = cli("produce", topic, "--bootstrap", cluster, "--file", lines, "--transactional-id", unique("tx"))
    assert (result.exit_code, result.stderr) == (0, f"produced 3 records to {topic} (transaction committed)\n")
    records = read_partition(cluster, topic, 0, 3, isolation="read_committed")
    assert [(r.offset, r.value) for r in records] == [(0, b"t1"), (1, b"t2"), (2, b"t3")]


def test_bad_line_aborts_the_transaction(cluster: str, cli: Cli, tmp_path: Path) -> None:
    topic = create_topic(cluster, "produce")
    transactional_id = unique("tx")
    lines = write_lines(tmp_path, b"k:first\nno separator here\nk:third\n")
    result = cli(
        "produce", topic, "--bootstrap", cluster, "--file", lines, "-K", ":", "--transactional-id", transactional_id
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr == (
        "kbroker produce: line 2: no key separator ':' (with --key-separator every line is KEY<SEP>VALUE)\n"
        f"produced 0 records to {topic} (transaction aborted); 1 failed\n"
    )
    # The first line was written and aborted: read_uncommitted sees it, read_committed does not.
    assert [r.value for r in read_partition(cluster, topic, 0, 1)] == [b"first"]
    committed = cli(
        "produce", topic, "--bootstrap", cluster, "--file", write_lines(tmp_path, b"k:after\n"), "-K", ":",
        "--transactional-id", transactional_id,
    )  # fmt: skip
    assert committed.exit_code == 0
    records = read_partition(cluster, topic, 0, 1, isolation="read_committed")
    assert [(r.key, r.value) for r in records] == [(b"k", b"after")]


def test_bad_line_stops_a_plain_run_after_what_was_sent(cluster: str, cli: Cli, tmp_path: Path) -> None:
    topic = create_topic(cluster, "produce")
    lines = write_lines(tmp_path, b"k:1\nbroken\nk:3\n")
    result = cli("produce", topic, "--bootstrap", cluster, "--file", lines, "-K", ":")
    assert result.exit_code == 1
    assert result.stderr == (
        "kbroker produce: line 2: no key separator ':' (with --key-separator every line is KEY<SEP>VALUE)\n"
        f"produced 1 record to {topic}; 1 failed\n"
    )
    assert [r.value for r in read_partition(cluster, topic, 0, 1)] == [b"1"]


def test_partition_that_does_not_exist(cluster: str, cli: Cli, tmp_path: Path) -> None:
    topic = create_topic(cluster, "produce", partitions=2)
    result = cli("produce", topic, "--bootstrap", cluster, "--file", write_lines(tmp_path, b"x\n"), "-p", "7")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        f"kbroker produce: UNKNOWN_TOPIC_OR_PARTITION (3): topic {topic!r} has partitions 0-1, not 7\n"
    )


def test_topic_is_auto_created_when_the_cluster_does_so(cluster: str, cli: Cli, tmp_path: Path) -> None:
    topic = unique("auto")  # both clusters run with Kafka's default auto.create.topics.enable=true
    result = cli("produce", topic, "--bootstrap", cluster, "--file", write_lines(tmp_path, b"hello\n"))
    assert result.exit_code == 0
    assert result.stderr == (
        f"kbroker produce: topic {topic!r} does not exist; asking the cluster to create it on first use "
        "(auto.create.topics.enable)\n"
        f"produced 1 record to {topic}\n"
    )
    assert [r.value for r in read_partition(cluster, topic, 0, 1)] == [b"hello"]


def test_unknown_topic_is_refused_when_the_cluster_does_not_create_topics(
    broker_factory: Any, cli: Cli, tmp_path: Path
) -> None:
    # Only kbroker here: auto.create.topics.enable is a static setting of the JVM the session shares.
    broker: RunningBroker = broker_factory({"auto.create.topics.enable": "false"})
    result = cli("produce", "missing", "--bootstrap", broker.bootstrap, "--file", write_lines(tmp_path, b"x\n"))
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        "kbroker produce: topic 'missing' does not exist; asking the cluster to create it on first use "
        "(auto.create.topics.enable)\n"
        "kbroker produce: UNKNOWN_TOPIC_OR_PARTITION (3): topic 'missing' does not exist and the cluster did not "
        "create it (it does so only with auto.create.topics.enable=true); create it: kbroker topics create missing\n"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--idempotent", "--acks", "1"], "--idempotent needs --acks all"),
        (["--transactional-id", "t", "--acks", "0"], "--transactional-id needs --acks all"),
        (["--header", "novalue"], "--header expects KEY=VALUE, got 'novalue'"),
        (["--key-separator", ""], "--key-separator must not be empty"),
        (["--linger-ms", "-1"], "--linger-ms must not be negative, got -1"),
    ],
)
def test_bad_options_are_one_line(cli: Cli, arguments: list[str], message: str) -> None:
    result = cli("produce", "any", "--bootstrap", "127.0.0.1:1", *arguments)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"kbroker produce: {message}")
    assert result.stderr.count("\n") == 1


def test_missing_input_file(cli: Cli, tmp_path: Path) -> None:
    result = cli("produce", "any", "--bootstrap", "127.0.0.1:1", "--file", str(tmp_path / "nope.txt"))
    assert (result.exit_code, result.stderr) == (
        1,
        f"kbroker produce: --file {tmp_path / 'nope.txt'}: No such file or directory\n",
    )


def test_the_progress_bar_passes_every_line_through(tmp_path: Path) -> None:
    from kbroker.commands.records import input_lines, with_progress

    source = tmp_path / "lines.txt"
    source.write_bytes(b"one\ntwo\r\n\nthree")
    with source.open("rb") as stream:
        assert list(with_progress(input_lines(stream), stream, source.stat().st_size)) == [
            b"one",
            b"two",
            b"",
            b"three",
        ]
