"""``kbroker consume``: records out of a topic, against kbroker and Apache Kafka (``cluster``). The records are
written with kafka-python's producer, not with ``kbroker produce``, so a fault in one command cannot hide one in
the other; Ctrl-C is tested on a real ``python -m kbroker consume`` process."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer

from kbroker.testing import RunningBroker
from tests.commands.conftest import Cli, create_topic, unique

NOW_MS = int(time.time() * 1000) - 3_600_000  # an hour ago: inside any retention, before "now"


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]], **settings: Any) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, **settings)
    try:
        for record in records:
            producer.send(topic, **record).get(timeout=30)
    finally:
        producer.close()


def test_format_string_output_is_exact(cluster: str, cli: Cli) -> None:
    topic = create_topic(cluster, "consume", partitions=2)
    produce(
        cluster,
        topic,
        [
            {"key": b"k0", "value": b"v0", "partition": 1, "timestamp_ms": NOW_MS, "headers": [("h", b"1")]},
            {"key": None, "value": b"no key", "partition": 1, "timestamp_ms": NOW_MS + 1},
            {"key": b"k2", "value": None, "partition": 1, "timestamp_ms": NOW_MS + 2,
             "headers": [("a", b"x"), ("b", b"")]},
            {"key": b"elsewhere", "value": b"p0", "partition": 0, "timestamp_ms": NOW_MS},
        ],
    )  # fmt: skip
    result = cli(
        "consume", topic, "--bootstrap", cluster, "--from-beginning", "--partition", "1", "--count", "3",
        "--format", "%t|%p|%o|%k|%s|%h|%T|%K|%S|100%%\\t.\\n",
    )  # fmt: skip
    assert result.exit_code == 0
    assert result.stdout == (
        f"{topic}|1|0|k0|v0|h=1|{NOW_MS}|2|2|100%\t.\n"
        f"{topic}|1|1||no key||{NOW_MS + 1}|-1|6|100%\t.\n"
        f"{topic}|1|2|k2||a=x,b=|{NOW_MS + 2}|2|-1|100%\t.\n"
    )
    assert result.stderr == "Processed a total of 3 messages\n"


def test_default_output_is_the_value_and_count_spans_partitions(cluster: str, cli: Cli) -> None:
    topic = create_topic(cluster, "consume", partitions=3)
    produce(cluster, topic, [{"value": f"v{n}".encode(), "partition": n % 3} for n in range(6)])
    result = cli("consume", topic, "--bootstrap", cluster, "--from-beginning", "--count", "6")
    assert result.exit_code == 0
    assert sorted(result.stdout.splitlines()) == ["v0", "v1", "v2", "v3", "v4", "v5"]
    # Within a partition the order is the offsets' order.
    lines = result.stdout.splitlines()
    for partition in range(3):
        mine = [line for line in lines if int(line[1:]) % 3 == partition]
        assert mine == [f"v{partition}", f"v{partition + 3}"]


def test_json_lines_decode_utf8_and_base64_the_rest(cluster: str, cli: Cli) -> None:
    topic = create_topic(cluster, "consume")
    produce(
        cluster,
        topic,
        [
            {"key": b"k\xc3\xa9", "value": b"text", "timestamp_ms": NOW_MS, "headers": [("bin", b"\xff\x00")]},
            {"key": None, "value": b"\xff\xfe", "timestamp_ms": NOW_MS + 5},
        ],
    )
    result = cli("consume", topic, "--bootstrap", cluster, "--from-beginning", "--count", "2", "--output", "json")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines == [
        f'{{"topic":"{topic}","partition":0,"offset":0,"timestamp":{NOW_MS},"key":"k\\u00e9","value":"text",'
        '"headers":[{"key":"bin","value":"/wA=","value_encoding":"base64"}]}',
        f'{{"topic":"{topic}","partition":0,"offset":1,"timestamp":{NOW_MS + 5},"key":null,"value":"//4=",'
        '"value_encoding":"base64","headers":[]}',
    ]


def test_offset_and_timestamp_starts(cluster: str, cli: Cli) -> None:
    topic = create_topic(cluster, "consume")
    produce(cluster, topic, [{"value": f"r{n}".encode(), "timestamp_ms": NOW_MS + n * 1000} for n in range(4)])
    base = ("consume", topic, "--bootstrap", cluster, "--format", "%o %s\\n")

    at_offset = cli(*base, "--partition", "0", "--offset", "1", "--count", "2")
    assert (at_offset.exit_code, at_offset.stdout) == (0, "1 r1\n2 r2\n")

    by_epoch_ms = cli(*base, "--from-timestamp", str(NOW_MS + 1500), "--count", "2")
    assert (by_epoch_ms.exit_code, by_epoch_ms.stdout) == (0, "2 r2\n3 r3\n")

    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((NOW_MS + 3000) // 1000)) + f".{(NOW_MS + 3000) % 1000:03d}Z"
    by_iso = cli(*base, "--from-timestamp", iso, "--count", "1")
    assert (by_iso.exit_code, by_iso.stdout) == (0, "3 r3\n")
    # Without a zone: UTC, as kbroker groups reset-offsets --to-datetime and Kafka's tools read it.
    by_zoneless_iso = cli(*base, "--from-timestamp", iso.removesuffix("Z"), "--count", "1")
    assert (by_zoneless_iso.exit_code, by_zoneless_iso.stdout) == (0, "3 r3\n")

    # After every record's time: the end, so nothing until the idle timeout.
    after_all = cli(*base, "--from-timestamp", str(NOW_MS + 10_000), "--timeout-ms", "500")
    assert (after_all.exit_code, after_all.stdout, after_all.stderr) == (0, "", "Processed a total of 0 messages\n")

    # The default start is the end (kafka-console-consumer's): the records already there are not printed.
    from_end = cli("consume", topic, "--bootstrap", cluster, "--timeout-ms", "500")
    assert (from_end.exit_code, from_end.stdout) == (0, "")


def test_read_committed_skips_aborted_transactions(cluster: str, cli: Cli) -> None:
    topic = create_topic(cluster, "consume")
    producer = KafkaProducer(bootstrap_servers=cluster, transactional_id=unique("tx"))
    try:
        producer.init_transactions()
        for values, commit in (([b"c1", b"c2"], True), ([b"a1"], False), ([b"c3"], True)):
            producer.begin_transaction()
            for value in values:
                producer.send(topic, value=value)
            producer.flush()
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close()
    committed = cli(
        "consume", topic, "--bootstrap", cluster, "--from-beginning", "--count", "3", "--isolation", "read_committed"
    )  # fmt: skip
    assert (committed.exit_code, committed.stdout) == (0, "c1\nc2\nc3\n")
    everything = cli("consume", topic, "--bootstrap", cluster, "--from-beginning", "--count", "4")
    assert (everything.exit_code, everything.stdout) == (0, "c1\nc2\na1\nc3\n")


def test_group_commits_what_was_printed(cluster: str, cli: Cli) -> None:
    topic = create_topic(cluster, "consume")
    group = unique("group")
    produce(cluster, topic, [{"value": f"r{n}".encode()} for n in range(6)])
    base = ("consume", topic, "--bootstrap", cluster, "--group", group)
    first = cli(*base, "--from-beginning", "--count", "2")
    assert (first.exit_code, first.stdout) == (0, "r0\nr1\n")
    # The group's committed offset (2) wins over the default start at the end.
    second = cli(*base, "--count", "3")
    assert (second.exit_code, second.stdout) == (0, "r2\nr3\nr4\n")
    # ... and over --from-beginning, which only covers partitions the group has no offset for.
    third = cli(*base, "--from-beginning", "--count", "1")
    assert (third.exit_code, third.stdout) == (0, "r5\n")
    admin = KafkaAdminClient(bootstrap_servers=cluster)
    try:
        offsets = admin.list_group_offsets(group)[group]
    finally:
        admin.close()
    assert {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic} == {0: 6}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--offset", "3"], "--offset needs --partition (an offset belongs to one partition)"),
        (["--offset", "x", "-p", "0"], "--offset must be a non-negative number, earliest or latest, got 'x'"),
        (["--format", "%q"], "--format: %q is not a token (%t %p %o %k %s %h %T %K %S, %% for a percent sign)"),
        (["--count", "0"], "--count must be at least 1, got 0"),
        (["--from-timestamp", "yesterday"], "--from-timestamp: 'yesterday' is neither epoch milliseconds nor "
         "ISO 8601 (2024-05-01T12:00:00Z)"),
        (["--format", "%s", "--output", "json"], "--format and --output json are two different outputs: choose one"),
    ],
)  # fmt: skip
def test_bad_options_are_one_line(cli: Cli, arguments: list[str], message: str) -> None:
    result = cli("consume", "any", "--bootstrap", "127.0.0.1:1", *arguments)
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"kbroker consume: {message}\n")


def test_unknown_topic_and_partition(cluster: str, cli: Cli) -> None:
    missing = unique("missing")
    result = cli("consume", missing, "--bootstrap", cluster, "--count", "1")
    assert (result.exit_code, result.stderr) == (
        1,
        f"kbroker consume: UNKNOWN_TOPIC_OR_PARTITION (3): topic {missing!r} does not exist\n",
    )
    topic = create_topic(cluster, "consume", partitions=2)
    result = cli("consume", topic, "--bootstrap", cluster, "--partition", "2", "--count", "1")
    assert (result.exit_code, result.stderr) == (
        1,
        f"kbroker consume: UNKNOWN_TOPIC_OR_PARTITION (3): topic {topic!r} has partitions 0-1, not 2\n",
    )


def test_ctrl_c_stops_cleanly_and_commits_the_group(broker: RunningBroker, cli: Cli) -> None:
    """A real ``python -m kbroker consume`` in a group, from the end: records produced while it runs are printed,
    SIGINT ends it with 130 and no traceback, and the group resumes right after the last printed record."""
    topic = create_topic(broker.bootstrap, "consume")
    group = unique("group")
    produce(broker.bootstrap, topic, [{"value": b"old"}])
    process = subprocess.Popen(
        [sys.executable, "-m", "kbroker", "consume", topic, "--bootstrap", broker.bootstrap, "--group", group],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: queue.Queue[bytes] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in iter(process.stdout.readline, b"")])  # type: ignore[union-attr]
    reader.start()
    printed: list[str] = []
    sent: list[str] = []
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        # Until it has joined the group and seen three records, keep producing (records sent before it took its
        # start at the end are not for it).
        for n in range(300):
            value = f"new-{n}"
            producer.send(topic, value=value.encode()).get(timeout=30)
            sent.append(value)
            try:
                while True:
                    printed.append(lines.get(timeout=0.1).decode().rstrip("\n"))
            except queue.Empty:
                pass
            if len(printed) >= 3 or process.poll() is not None:
                break
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        producer.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=10)
    while not lines.empty():
        printed.append(lines.get().decode().rstrip("\n"))
    assert process.returncode == 130, stderr.decode()
    assert "Traceback" not in stderr.decode()
    assert stderr.decode().endswith(f"Processed a total of {len(printed)} messages\n")
    first = sent.index(printed[0])
    assert printed == sent[first : first + len(printed)]  # consecutive, none lost or repeated, no "old"
    # The group committed the position after the last printed record: the rest come next.
    rest = sent[first + len(printed) :]
    if rest:
        resumed = cli("consume", topic, "--bootstrap", broker.bootstrap, "--group", group, "--count", str(len(rest)))
        assert resumed.stdout.splitlines() == rest
    resumed_end = cli("consume", topic, "--bootstrap", broker.bootstrap, "--group", group, "--timeout-ms", "300")
    assert (resumed_end.exit_code, resumed_end.stdout) == (0, "")


def test_help_shows_the_default_format(capsys: pytest.CaptureFixture[str]) -> None:
    from kbroker.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["consume", "--help"])
    assert exited.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal's width
    assert "--format FMT, -F FMT kcat -f style output (default '%s\\\\n')" in help_text


def test_records_not_flushed_to_stdout_are_not_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that left (`| head`) makes the flush fail: --group must not commit the records it never got."""
    from types import SimpleNamespace

    from kafka.structs import TopicPartition

    from kbroker.commands.records import ConsumePlan, GroupCommitter, StopSignals, _consume_loop

    class ClosedPipe:
        def write(self, data: bytes) -> int:
            return len(data)

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    partition = TopicPartition("t", 0)
    records = [SimpleNamespace(topic="t", partition=0, offset=offset, value=b"v", key=None) for offset in (0, 1)]
    consumer = SimpleNamespace(poll=lambda **_: {partition: records}, assignment=lambda: {partition})
    monkeypatch.setattr(sys, "stdout", SimpleNamespace(buffer=ClosedPipe(), flush=lambda: None))
    committer = GroupCommitter(consumer)
    plan = ConsumePlan(None, None, None, True, None, None, [b"x"])
    with pytest.raises(BrokenPipeError):
        _consume_loop(consumer, plan, committer, StopSignals())
    assert committer.printed == {}
