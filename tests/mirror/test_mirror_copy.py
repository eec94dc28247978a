"""``kbroker mirror`` copies records exactly, makes target topics like the source's, and renames as MM2 does:
kbroker→kbroker, kbroker→Apache Kafka and Apache Kafka→kbroker."""

from __future__ import annotations

from collections.abc import Callable

from tests.mirror.conftest import (
    Pair,
    Result,
    create_topic,
    list_topics,
    mirror_once,
    produce,
    read_all,
    topic_configs,
    topic_partitions,
)

BASE_TIMESTAMP = 1_700_000_000_000


def sample_records(count: int) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]]:
    """Keys, values, headers and timestamps of every shape: null keys, a tombstone, binary bytes, no headers."""
    records = []
    for i in range(count):
        key = None if i % 5 == 0 else f"key-{i}".encode()
        value = None if i == 7 else bytes([i % 256, 0, 255]) + f"value-{i}".encode()
        headers = [] if i % 3 == 0 else [("trace", f"t{i}".encode()), ("bin", b"\x00\x01")]
        records.append((i % 3, key, value, headers, BASE_TIMESTAMP + i * 1000))
    return records


def test_records_topics_and_configs_copied(pair: Pair, kbroker: Callable[..., Result]) -> None:
    topic = f"orders-{pair.alias}"
    create_topic(pair.source, topic, 3, {"retention.ms": "86400000", "max.message.bytes": "2000000"})
    produce(pair.source, topic, sample_records(60))

    result = mirror_once(kbroker, pair, f"orders-{pair.alias}")

    assert result.exit_code == 0, result.stderr
    target_topic = f"{pair.alias}.{topic}"
    assert topic_partitions(pair.target, target_topic) == 3
    assert topic_configs(pair.target, target_topic) == {"retention.ms": "86400000", "max.message.bytes": "2000000"}
    # byte-identical, in the same partitions and at the same offsets (nothing else was written there)
    assert read_all(pair.target, target_topic) == read_all(pair.source, topic)
    assert len(read_all(pair.target, target_topic)) == 60
    assert f"created topic {target_topic} in the target (3 partitions" in result.stderr
    lag_line = [line for line in result.stderr.splitlines() if "records copied" in line][-1]
    assert lag_line == (f"kbroker mirror: 60 records copied; lag 0: {topic}-0=0 {topic}-1=0 {topic}-2=0")


def test_rerun_copies_only_new_records(pair: Pair, kbroker: Callable[..., Result]) -> None:
    topic = f"events-{pair.alias}"
    create_topic(pair.source, topic, 2)
    produce(pair.source, topic, [(i % 2, None, f"a{i}".encode(), [], BASE_TIMESTAMP + i) for i in range(10)])
    assert mirror_once(kbroker, pair, topic).exit_code == 0
    produce(pair.source, topic, [(i % 2, None, f"b{i}".encode(), [], BASE_TIMESTAMP + i) for i in range(6)])

    second = mirror_once(kbroker, pair, topic)

    assert second.exit_code == 0, second.stderr
    assert "6 records copied; lag 0" in second.stderr  # resumed at its committed progress in the source
    assert read_all(pair.target, f"{pair.alias}.{topic}") == read_all(pair.source, topic)


def test_exactly_once_copy(pair: Pair, kbroker: Callable[..., Result]) -> None:
    topic = f"payments-{pair.alias}"
    create_topic(pair.source, topic, 2)
    produce(
        pair.source,
        topic,
        [(i % 2, f"k{i}".encode(), f"v{i}".encode(), [("h", b"x")], BASE_TIMESTAMP + i) for i in range(20)],
    )
    assert mirror_once(kbroker, pair, topic, "--exactly-once").exit_code == 0
    produce(pair.source, topic, [(0, b"late", b"late", [], BASE_TIMESTAMP + 99)])
    second = mirror_once(kbroker, pair, topic, "--exactly-once")

    assert second.exit_code == 0, second.stderr
    assert "1 records copied; lag 0" in second.stderr  # resumed from its group in the TARGET
    copied = [(p, k, v, h, t) for p, _offset, k, v, h, t in read_all(pair.target, f"{pair.alias}.{topic}")]
    expected = [(p, k, v, h, t) for p, _offset, k, v, h, t in read_all(pair.source, topic)]
    assert copied == expected  # offsets differ: transaction markers take offsets in the target


def test_rename_policies_and_replicas(broker_factory: Callable[..., object], kbroker: Callable[..., Result]) -> None:
    source = broker_factory().bootstrap  # type: ignore[attr-defined]
    target = broker_factory().bootstrap  # type: ignore[attr-defined]
    for name in ("inventory", "east.inventory", "west.inventory", "__private"):
        create_topic(source, name, 1)
        produce(source, name, [(0, None, name.encode(), [], BASE_TIMESTAMP)])

    prefix = kbroker(
        "mirror",
        "--source",
        source,
        "--target",
        target,
        "--topics",
        ".*",
        "--source-alias",
        "east",
        "--target-alias",
        "west",
        "--once",
    )
    identity = kbroker(
        "mirror",
        "--source",
        source,
        "--target",
        target,
        "--topics",
        "inv.*",
        "--rename",
        "identity",
        "--source-alias",
        "a",
        "--once",
    )

    assert prefix.exit_code == 0 and identity.exit_code == 0, prefix.stderr + identity.stderr
    # east.inventory and west.inventory are replicas (of this source, of the target): never mirrored again
    assert {t for t in list_topics(target) if not t.endswith(".internal")} == {"east.inventory", "inventory"}
    assert [r[3] for r in read_all(target, "east.inventory")] == [b"inventory"]
    assert [r[3] for r in read_all(target, "inventory")] == [b"inventory"]


def test_bad_arguments_are_one_line(kbroker: Callable[..., Result]) -> None:
    bad_regex = kbroker("mirror", "--source", "127.0.0.1:1", "--target", "127.0.0.1:1", "--topics", "[")
    same_alias = kbroker(
        "mirror", "--target", "127.0.0.1:1", "--topics", "x", "--source-alias", "a", "--target-alias", "a"
    )
    dotted = kbroker("mirror", "--target", "127.0.0.1:1", "--topics", "x", "--source-alias", "a.b")

    assert (bad_regex.exit_code, same_alias.exit_code, dotted.exit_code) == (1, 1, 1)
    assert bad_regex.stderr == (
        "kbroker mirror: --topics '[' is not a regular expression: unterminated character set at position 0\n"
    )
    assert same_alias.stderr == (
        "kbroker mirror: --source-alias and --target-alias are both 'a': give them different names\n"
    )
    assert dotted.stderr == "kbroker mirror: --source-alias 'a.b': a cluster alias is a non-empty name without '.'\n"


def test_new_source_topics_are_picked_up(broker_factory: Callable[..., object]) -> None:
    import re
    import threading
    import time

    from kbroker.commands.connection import ClientSettings
    from kbroker.mirror.policy import ReplicationPolicy
    from kbroker.mirror.replicator import Mirror, MirrorOptions

    source = broker_factory().bootstrap  # type: ignore[attr-defined]
    target = broker_factory().bootstrap  # type: ignore[attr-defined]
    create_topic(source, "logs-a", 1)
    policy = ReplicationPolicy("prefix", "source", "target", re.compile("logs-.*"))
    lines: list[str] = []
    mirror = Mirror(
        MirrorOptions(ClientSettings(source), ClientSettings(target), policy, refresh_interval=0.2), lines.append
    )
    runner = threading.Thread(target=mirror.run)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while "mirroring logs-a (1 partition)" not in lines:  # running: logs-b comes after its first look
            assert time.monotonic() < deadline and runner.is_alive(), lines
            time.sleep(0.05)
        create_topic(source, "logs-b", 2)
        produce(source, "logs-b", [(1, b"k", b"late topic", [], BASE_TIMESTAMP)])
        deadline = time.monotonic() + 30
        while "source.logs-b" not in list_topics(target) or not read_all(target, "source.logs-b"):
            assert time.monotonic() < deadline, lines
            time.sleep(0.1)
    finally:
        mirror.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert [(p, k, v) for p, _o, k, v, _h, _t in read_all(target, "source.logs-b")] == [(1, b"k", b"late topic")]
    assert topic_partitions(target, "source.logs-b") == 2
    assert "mirroring logs-b (2 partitions)" in lines
