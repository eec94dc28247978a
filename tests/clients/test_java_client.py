"""The Java client (kafka-clients 3.9.0 and 4.4.0) against a live broker: admin, every codec, large records,
offsets by position and time, and the calls Spark's Kafka source and sink make.

The jars come from Maven Central (tools/java_clients.py; CI runs ``python tools/java_clients.py`` first);
tests/clients/java/KafkaClientScenario.java is compiled against each version once per session and run
once per scenario, printing JSON lines that are checked here exactly.

KBROKER_JAVA_LOG=DEBUG (or INFO, ...) puts log4j on the classpath and the client's log on stderr, which a
failing test shows.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from compat.java import JSON_SOURCE
from kbroker.testing import RunningBroker

REPO = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).with_name("java") / "KafkaClientScenario.java"
VERSIONS = ["3.9.0", "4.4.0"]
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
Event = dict[str, Any]
JavaProgram = Callable[..., list[str]]  # the java_program fixture (tests/conftest.py)


def run_scenario(
    java_program: JavaProgram,
    version: str,
    broker: RunningBroker,
    scenario: str,
    base: int,
    on_waiting: Callable[[], None] | None = None,
) -> list[Event]:
    """Run one scenario with kafka-clients ``version``; at {"event": "waiting"} call ``on_waiting``, then go on."""
    command = java_program(SOURCE, version, JSON_SOURCE)
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(
            [*command, broker.bootstrap, scenario, str(base)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        watchdog = threading.Timer(120, process.kill)
        watchdog.start()
        try:
            assert process.stdin is not None and process.stdout is not None
            events = []
            for line in process.stdout:
                if not line.startswith("{"):
                    continue
                events.append(json.loads(line))
                if events[-1]["event"] == "waiting":
                    assert on_waiting is not None, "the scenario waits for a callback"
                    on_waiting()
                    process.stdin.write("go\n")
                    process.stdin.flush()
            returncode = process.wait()
        finally:
            watchdog.cancel()
            process.kill()
        stderr.seek(0)
        log = stderr.read()
    elapsed = time.monotonic() - started
    errors = [e for e in events if e["event"] in ("error", "poll-count")]
    assert not errors and returncode == 0, (
        f"scenario {scenario} failed (exit {returncode}, {elapsed:.1f} s): {errors}\n{log[-6000:]}"
    )
    assert events[0] == {"event": "client", "version": version} and events[-1] == {"event": "done"}
    return events[1:-1]


def named(events: list[Event], name: str, **where: Any) -> list[Event]:
    """The events called ``name`` (whose fields match ``where``), without their "event" field."""
    return [
        {k: v for k, v in e.items() if k != "event"}
        for e in events
        if e["event"] == name and all(e.get(k) == v for k, v in where.items())
    ]


def murmur2_partition(key: str, partitions: int) -> int:
    """The Java client's default partitioner for a keyed record: toPositive(murmur2(key)) % partitions."""
    data = key.encode()
    mask = 0xFFFFFFFF
    m = 0x5BD1E995
    h = (0x9747B28C ^ len(data)) & mask
    for i in range(len(data) // 4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[len(data) & ~3 :]
    if tail:
        for index in reversed(range(len(tail))):
            h ^= tail[index] << (8 * index)
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def assign_offsets(topic: str, keys: list[str], partitions: int, start: dict[int, int] | None = None) -> list[Event]:
    """Where keyed records sent in this order land: the partition of their key, the next offset there."""
    next_offset = dict(start or {})
    out = []
    for key in keys:
        partition = murmur2_partition(key, partitions)
        offset = next_offset.get(partition, 0)
        next_offset[partition] = offset + 1
        out.append({"topic": topic, "partition": partition, "offset": offset, "key": key})
    return out


def base_timestamp() -> int:
    """Record timestamps are base + n: recent (no retention or timestamp check touches them) and known here."""
    return int(time.time() * 1000) - 600_000


def test_partitioner_matches_the_java_clients() -> None:
    # The partitions kafka-clients 3.9 and 4.3 chose for these keys, and toPositive(murmur2) for every tail
    # length (the same values as kafka-python's port of Utils.murmur2).
    assert [murmur2_partition(f"key-{i}", 3) for i in range(7)] == [1, 0, 2, 2, 0, 2, 2]
    assert [murmur2_partition("abcde"[:n], 2**31) for n in range(6)] == [
        275646681,
        584102524,
        316155434,
        479470107,
        823834100,
        461995741,
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_admin_client(broker: RunningBroker, java_program: JavaProgram, version: str) -> None:
    events = run_scenario(java_program, version, broker, "admin", base_timestamp())
    defaults = {
        "cleanup.policy": ["delete", "DEFAULT_CONFIG"],
        "retention.ms": ["604800000", "DEFAULT_CONFIG"],
        "max.message.bytes": ["1048588", "DEFAULT_CONFIG"],
        "compression.type": ["producer", "DEFAULT_CONFIG"],
        "segment.bytes": ["1073741824", "DEFAULT_CONFIG"],
    }
    configured_b = {
        **defaults,
        "cleanup.policy": ["compact", "DYNAMIC_TOPIC_CONFIG"],
        "retention.ms": ["3600000", "DYNAMIC_TOPIC_CONFIG"],
    }
    altered_a = {**defaults, "retention.ms": ["86400000", "DYNAMIC_TOPIC_CONFIG"]}

    def partitions(count: int) -> list[list[Any]]:
        return [[p, 0, [0], [0]] for p in range(count)]

    def offsets(label: str, rows: list[list[int]]) -> Event:
        return {"event": "list-offsets", "spec": label, "partitions": rows}

    def topic(name: str, count: int) -> Event:
        return {"event": "topic", "name": name, "internal": False, "hasTopicId": True, "partitions": partitions(count)}

    def configs(when: str, a: dict, b: dict) -> list[Event]:
        return [
            {"event": "configs", "when": when, "topic": "admin-a", "entries": a},
            {"event": "configs", "when": when, "topic": "admin-b", "entries": b},
            {"event": "broker-config", "when": when, "message.max.bytes": "1048588"},
        ]

    created = {"event": "created", "partitions": 3, "replication": 1, "hasTopicId": True}
    # Partition 0 holds timestamps base+0, +10, ..., +40 (offsets 0-4), partition 1 base+0, +10; 2 and 3 none.
    sent = [
        {"event": "sent", "topic": "admin-a", "partition": 0, "offset": i, "timestamp": 10 * i, "key": None}
        for i in range(5)
    ]
    sent += [
        {"event": "sent", "topic": "admin-a", "partition": 1, "offset": i, "timestamp": 10 * i, "key": None}
        for i in range(2)
    ]
    assert events == [
        {**created, "topic": "admin-a", "cleanup.policy": "delete", "retention.ms": "604800000"},
        {**created, "topic": "admin-b", "partitions": 1, "cleanup.policy": "compact", "retention.ms": "3600000"},
        {"event": "create-existing", "error": "TopicExistsException"},
        {"event": "create-rf3", "error": "InvalidReplicationFactorException"},
        {"event": "topics", "names": ["admin-a", "admin-b"]},
        {"event": "cluster", "nodes": [[0, broker.bootstrap]], "controller": 0, "hasClusterId": True},
        topic("admin-a", 3),
        topic("admin-b", 1),
        *configs("before", defaults, configured_b),
        *configs("after", altered_a, configured_b),
        topic("admin-a", 4),
        *sent,
        # [partition, offset, timestamp - base]; -1 where Kafka answers -1 (no timestamp, no such offset).
        offsets("earliest", [[0, 0, -1], [1, 0, -1], [2, 0, -1], [3, 0, -1]]),
        offsets("latest", [[0, 5, -1], [1, 2, -1], [2, 0, -1], [3, 0, -1]]),
        offsets("max-timestamp", [[0, 4, 40], [1, 1, 10], [2, -1, -1], [3, -1, -1]]),
        offsets("timestamp=base+15", [[0, 2, 20], [1, -1, -1], [2, -1, -1], [3, -1, -1]]),
        offsets("timestamp=base+10", [[0, 1, 10], [1, 1, 10], [2, -1, -1], [3, -1, -1]]),
        offsets("timestamp=base+1000", [[0, -1, -1], [1, -1, -1], [2, -1, -1], [3, -1, -1]]),
        {"event": "deleted-records", "lowWatermark": 2},
        offsets("earliest-after-delete", [[0, 2, -1], [1, 0, -1], [2, 0, -1], [3, 0, -1]]),
        {"event": "topics-after-delete", "names": []},
        {"event": "describe-deleted", "error": "UnknownTopicOrPartitionException"},
    ]


def codec_value(codec: str, i: int) -> str:
    return f"{codec} value {i} " + "." * 100


def pattern_sha256(length: int) -> str:
    return hashlib.sha256(bytes(i % 251 for i in range(length))).hexdigest()


@pytest.mark.parametrize("version", VERSIONS)
def test_producer_and_consumer(broker: RunningBroker, java_program: JavaProgram, version: str) -> None:
    events = run_scenario(java_program, version, broker, "records", base_timestamp())

    # Every codec: 30 keyed records with headers into 3 partitions, idempotent (the default), read back.
    expected_sent: list[Event] = []
    expected_records: list[Event] = []
    for codec in CODECS:
        keys = [f"key-{i % 7}" for i in range(30)]
        for i, placed in enumerate(assign_offsets(f"codec-{codec}", keys, 3)):
            expected_sent.append({**placed, "timestamp": i})
            expected_records.append(
                {
                    **placed,
                    "timestamp": i,
                    "timestampType": "CREATE_TIME",
                    "value": codec_value(codec, i),
                    "headers": [["codec", codec], ["index", str(i)], ["nothing", None]],
                    "leaderEpoch": 0,
                }
            )
    large_sent = [
        {"topic": "large", "partition": 0, "offset": 0, "timestamp": 0, "key": "big"},
        {"topic": "large", "partition": 0, "offset": 1, "timestamp": 1, "key": "small"},
    ]
    assert named(events, "sent") == expected_sent + large_sent

    records = named(events, "record")
    codec_records = [r for r in records if r["topic"].startswith("codec-")]
    order = sorted(codec_records, key=lambda r: (r["topic"], r["partition"], r["offset"]))
    # Within a partition the consumer hands records over in offset order.
    for tp in {(r["topic"], r["partition"]) for r in codec_records}:
        in_tp = [r for r in codec_records if (r["topic"], r["partition"]) == tp]
        assert in_tp == sorted(in_tp, key=lambda r: r["offset"])
    assert order == sorted(expected_records, key=lambda r: (r["topic"], r["partition"], r["offset"]))

    # 900 KB with default settings; 1.1 MB (max.request.size raised) refused by the broker.
    assert named(events, "too-large") == [{"error": "RecordTooLargeException"}]
    large = [
        {"offset": 0, "key": "big", "length": 921600, "intact": True, "sha256": pattern_sha256(921600)},
        {"offset": 1, "key": "small", "length": 5, "intact": False, "sha256": hashlib.sha256(b"after").hexdigest()},
    ]
    for fetch_bytes in ("default", "65536"):
        assert named(events, "large-record", fetchBytes=fetch_bytes) == [
            {"fetchBytes": fetch_bytes, **r} for r in large
        ]
        assert named(events, "large-position", fetchBytes=fetch_bytes) == [{"fetchBytes": fetch_bytes, "position": 2}]

    # From the end: seekToEnd, then only what is produced afterwards.
    assert named(events, "tail-position") == [
        {"when": "after-seek-to-end", "position": 3},
        {"when": "after-poll", "position": 5},
    ]
    assert named(events, "tail-empty-poll") == [{"count": 0}]
    assert [r for r in records if r["topic"] == "tail"] == [
        {"topic": "tail", "partition": 0, "offset": 3 + i, "key": None, "value": f"new-{i}", "headers": []}
        for i in range(2)
    ]

    # From a timestamp: records at base, base+1000, ..., base+5000.
    assert named(events, "offset-for-time") == [
        {"delta": 0, "offset": 0, "timestamp": 0},
        {"delta": 1000, "offset": 1, "timestamp": 1000},
        {"delta": 2500, "offset": 3, "timestamp": 3000},
        {"delta": 5000, "offset": 5, "timestamp": 5000},
        {"delta": 5001, "offset": None, "timestamp": None},
    ]
    assert named(events, "timed-range") == [{"beginning": 0, "end": 6}]
    assert [r for r in records if r["topic"] == "timed"] == [
        {"topic": "timed", "partition": 0, "offset": i, "key": None, "value": f"timed-{i}", "headers": []}
        for i in range(3, 6)
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_spark_source_and_sink_calls(broker: RunningBroker, java_program: JavaProgram, version: str) -> None:
    events = run_scenario(java_program, version, broker, "spark", base_timestamp())
    batches = [[f"k{n}" for n in range(20 * b, 20 * b + 20)] for b in range(2)]
    placed0 = assign_offsets("spark", batches[0], 2)
    latest0 = {p: sum(1 for r in placed0 if r["partition"] == p) for p in (0, 1)}
    placed1 = assign_offsets("spark", batches[1], 2, latest0)
    latest1 = {p: latest0[p] + sum(1 for r in placed1 if r["partition"] == p) for p in (0, 1)}
    assert min(latest0.values()) >= 2 and min(latest1[p] - latest0[p] for p in (0, 1)) >= 4

    # The sink: acknowledgements may interleave across partitions, so compare in partition and offset order.
    sent = sorted(named(events, "sent", topic="spark"), key=lambda e: (e["partition"], e["offset"]))
    assert [{k: e[k] for k in ("topic", "partition", "offset", "key")} for e in sent] == sorted(
        placed0 + placed1, key=lambda e: (e["partition"], e["offset"])
    )
    timestamps = {e["key"]: e["timestamp"] for e in sent}
    assert max(timestamps[k] for k in batches[0]) < min(timestamps[k] for k in batches[1])
    # The sink's partition and timestamp columns, a null key.
    assert sorted(named(events, "sent", topic="spark-sink"), key=lambda e: e["timestamp"]) == [
        {"topic": "spark-sink", "partition": 1, "offset": 0, "timestamp": 100, "key": None},
        {"topic": "spark-sink", "partition": 0, "offset": 0, "timestamp": 200, "key": "e1"},
        {"topic": "spark-sink", "partition": 1, "offset": 1, "timestamp": 300, "key": "e2"},
    ]

    # The driver.
    assert named(events, "spark-partitions") == [{"batch": 0, "partitions": [0, 1]}, {"batch": 1, "partitions": [0, 1]}]
    assert named(events, "spark-pattern") == [
        {"topics": ["spark", "spark-sink"], "partitions": ["spark-0", "spark-1", "spark-sink-0", "spark-sink-1"]}
    ]
    as_json = {str(p): offset for p, offset in latest0.items()}
    latest1_json = {str(p): offset for p, offset in latest1.items()}
    assert named(events, "spark-offsets") == [
        {"batch": 0, "spec": "earliest", "offsets": {"0": 0, "1": 0}},
        {"batch": 0, "spec": "latest", "offsets": as_json},
        {"batch": 1, "spec": "earliest", "offsets": {"0": 0, "1": 0}},
        {"batch": 1, "spec": "latest", "offsets": latest1_json},
        # The first offset at or after a time between the batches: where the second batch starts.
        {"batch": 1, "spec": "timestamp", "offsets": as_json},
        # No transactions: the last stable offset is the high watermark.
        {"batch": 1, "spec": "latest-read-committed", "offsets": latest1_json},
        {"batch": 1, "spec": "earliest-0-latest-1", "offsets": {"0": 0, "1": latest1[1]}},
    ]

    # The executors, one consumer per partition: batch 0 reads [1, latest0) with Spark's settings (one
    # poll), batch 1 [latest0, latest1) with max.poll.records=4 (polls of 4, 4, 2), then a range past the
    # end polls nothing; after every poll the available range is [0, the partition's end).
    # An empty poll (a slow machine) is legal: Spark then looks at the available range and polls again.
    def polls(start: int, until: int, size: int) -> list[list[int]]:
        return [[o, min(size, until - o), min(o + size, until)] for o in range(start, until, size)]

    tasks = named(events, "spark-task")
    for task in tasks:
        task["polls"] = [poll for poll in task["polls"] if poll[1] > 0 or task["batch"] == 2]
    expected_tasks = [
        {
            "batch": 0,
            "topic": "spark",
            "partition": p,
            "from": 1,
            "until": latest0[p],
            "offsets": list(range(1, latest0[p])),
            "polls": polls(1, latest0[p], 500),
            "ranges": [[0, latest0[p]]],
        }
        for p in (0, 1)
    ]
    expected_tasks += [
        {
            "batch": 1,
            "topic": "spark",
            "partition": p,
            "from": latest0[p],
            "until": latest1[p],
            "offsets": list(range(latest0[p], latest1[p])),
            "polls": polls(latest0[p], latest1[p], 4),
            "ranges": [[0, latest1[p]]],
        }
        for p in (0, 1)
    ]
    end0 = latest1[0]
    expected_tasks.append(
        {
            "batch": 2,
            "topic": "spark",
            "partition": 0,
            "from": end0,
            "until": end0 + 1,
            "offsets": [],
            "polls": [[end0, 0, end0]],
            "ranges": [[0, end0]],
        }
    )
    expected_tasks += [
        {
            "batch": 3,
            "topic": "spark-sink",
            "partition": p,
            "from": 0,
            "until": count,
            "offsets": list(range(count)),
            "polls": [[0, count, count]],
            "ranges": [[0, count]],
        }
        for p, count in ((0, 1), (1, 2))
    ]
    assert tasks == expected_tasks

    # Offsets 0 and 1 deleted under a reader that wants offset 0.
    assert named(events, "spark-data-loss") == [
        {"error": "OffsetOutOfRangeException", "offsets": {"0": 0}, "range": [2, end0], "resumedAt": 2}
    ]

    by_partition: dict[int, list[Event]] = {0: [], 1: []}
    for record in named(events, "record", topic="spark"):
        by_partition[record["partition"]].append(record)
    for p in (0, 1):
        keys = [r["key"] for r in placed0 + placed1 if r["partition"] == p][1:]  # batch 0 skipped offset 0
        assert by_partition[p] == [
            {
                "topic": "spark",
                "partition": p,
                "offset": offset,
                "key": key,
                "value": "v" + key[1:],
                "headers": [["n", key[1:]]],
            }
            for offset, key in zip(range(1, latest1[p]), keys, strict=True)
        ]
    sink_record = {"topic": "spark-sink", "timestampType": "CREATE_TIME", "leaderEpoch": 0}
    assert named(events, "record", topic="spark-sink") == [
        {
            **sink_record,
            "partition": 0,
            "offset": 0,
            "timestamp": 200,
            "key": "e1",
            "value": "e1",
            "headers": [["h", "1"]],
        },
        {**sink_record, "partition": 1, "offset": 0, "timestamp": 100, "key": None, "value": "e0", "headers": []},
        {**sink_record, "partition": 1, "offset": 1, "timestamp": 300, "key": "e2", "value": "e2", "headers": []},
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_producer_and_consumer_across_a_broker_restart(
    broker: RunningBroker, java_program: JavaProgram, version: str
) -> None:
    events = run_scenario(java_program, version, broker, "restart", base_timestamp(), on_waiting=broker.restart)
    # The same idempotent producer goes on after the restart (its producer id and sequence numbers are
    # still valid), a new one after it gets a new producer id, and the same consumer picks up at the offset
    # it had reached.
    assert named(events, "sent") == [
        {"topic": "durable", "partition": 0, "offset": i, "timestamp": i, "key": None} for i in range(13)
    ]
    values = [f"before-{i}" for i in range(5)] + [f"after-{i}" for i in range(5)] + [f"fresh-{i}" for i in range(3)]
    assert named(events, "record") == [
        {"topic": "durable", "partition": 0, "offset": i, "key": None, "value": value, "headers": []}
        for i, value in enumerate(values)
    ]
    assert named(events, "position") == [{"position": 13}]
    assert named(events, "all") == [{"records": [[i, value] for i, value in enumerate(values)], "end": 13}]
