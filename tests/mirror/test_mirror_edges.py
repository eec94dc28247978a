"""``kbroker mirror`` on records Kafka allows that are easy to get wrong: a record with neither key nor value and
header values that are null (kafka-python's send() refuses both), transactional source topics (aborted records
and commit markers leave offset gaps)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from kbroker.testing import RunningBroker
from tests.mirror.conftest import Pair, Result, create_topic, list_topics, mirror_once, read_all

BASE_TIMESTAMP = 1_700_000_000_000


def write_nullable(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None, list[Any]]]) -> None:
    """Write records with null keys, values and header values to partition 0 as one batch over the wire:
    kafka-python's send() refuses a record with neither key nor value and a null header value, though Kafka's
    record format carries both."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from kbroker.wire_client import WireClient
    from protocol.messages.produce_request import ProduceRequest

    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for offset, (key, value, headers) in enumerate(records):
        builder.append(offset, BASE_TIMESTAMP, key, value, headers)
    partition = ProduceRequest.PartitionProduceData(index=0, records=bytes(builder.build()))
    request = ProduceRequest(
        acks=-1, timeout_ms=10_000, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[partition])]
    )
    with WireClient(bootstrap) as client:
        answer = client.request(request, 9).responses[0].partition_responses[0]
    assert answer.error_code == 0, answer


def test_records_without_key_and_value(pair: Pair, kbroker: Callable[..., Result]) -> None:
    topic = f"nulls-{pair.alias}"
    create_topic(pair.source, topic, 1)
    write_nullable(pair.source, topic, [(None, None, []), (None, None, [("h", b"x")]), (b"k", None, [("e", b"")])])
    source_records = read_all(pair.source, topic)
    assert [(k, v, h) for _p, _o, k, v, h, _t in source_records] == [
        (None, None, ()),
        (None, None, (("h", b"x"),)),
        (b"k", None, (("e", b""),)),
    ]

    result = mirror_once(kbroker, pair, topic)

    assert result.exit_code == 0, result.stderr
    assert read_all(pair.target, f"{pair.alias}.{topic}") == source_records


def test_a_null_header_value_stops_the_copy_in_one_line(
    broker_factory: Callable[..., RunningBroker], kbroker: Callable[..., Result]
) -> None:
    source, target = broker_factory().bootstrap, broker_factory().bootstrap
    create_topic(source, "h", 1)
    write_nullable(source, "h", [(b"a", b"1", [("ok", b"x")]), (b"b", b"2", [("trace", None)])])
    pair = Pair(source, target, "source")

    result = mirror_once(kbroker, pair, "h")

    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1] == (
        "kbroker mirror: cannot copy h-0 offset 1: its header 'trace' has a null value, which kbroker mirror's "
        "producer (kafka-python) cannot write"
    )
    assert read_all(target, "source.h") == []  # nothing of that batch was sent, so none of it was committed
    again = mirror_once(kbroker, pair, "h")
    assert again.exit_code == 1 and "cannot copy h-0 offset 1" in again.stderr


def test_transactional_source_copies_committed_records_and_translates_across_gaps(
    pair: Pair, kbroker: Callable[..., Result]
) -> None:
    from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    topic, group = f"txn-{pair.alias}", f"g-{pair.alias}"
    create_topic(pair.source, topic, 1)
    producer = KafkaProducer(bootstrap_servers=pair.source, transactional_id=f"tx-{pair.alias}")
    try:
        producer.init_transactions()
        for values, commit in (([b"a", b"b", b"c"], True), ([b"x", b"y"], False), ([b"d", b"e"], True)):
            producer.begin_transaction()
            for value in values:
                producer.send(topic, value=value, partition=0, timestamp_ms=BASE_TIMESTAMP)
            producer.flush()
            producer.commit_transaction() if commit else producer.abort_transaction()
    finally:
        producer.close()
    # source offsets: a b c at 0-2, a commit marker at 3, x y aborted at 4-5, the abort marker at 6, d e at 7-8,
    # a commit marker at 9; the group read c and stopped inside the aborted run
    admin = KafkaAdminClient(bootstrap_servers=pair.source)
    try:
        admin.alter_group_offsets(group, {TopicPartition(topic, 0): OffsetAndMetadata(5, "", -1)})
    finally:
        admin.close()

    result = mirror_once(kbroker, pair, topic, "--groups", group)  # ends although the log ends with a marker

    assert result.exit_code == 0, result.stderr
    target_topic = f"{pair.alias}.{topic}"
    assert [(o, v) for _p, o, _k, v, _h, _t in read_all(pair.target, target_topic)] == [
        (0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e"),
    ]  # fmt: skip
    assert result.stderr.splitlines()[-1] == f"kbroker mirror: 5 records copied; lag 0: {topic}-0=0"
    admin = KafkaAdminClient(bootstrap_servers=pair.target)
    try:
        translated = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    assert {(tp.topic, tp.partition): o.offset for tp, o in translated.items()} == {(target_topic, 0): 3}  # at d


def test_target_topic_with_other_partition_counts(
    broker_factory: Callable[..., RunningBroker], kbroker: Callable[..., Result]
) -> None:
    from tests.mirror.conftest import produce, topic_partitions

    source, target = broker_factory().bootstrap, broker_factory().bootstrap
    create_topic(source, "fewer", 3)
    create_topic(source, "more", 2)
    create_topic(target, "source.fewer", 1)
    create_topic(target, "source.more", 4)
    for topic in ("fewer", "more"):
        produce(source, topic, [(i % (3 if topic == "fewer" else 2), None, f"{topic}{i}".encode(), [], BASE_TIMESTAMP)
                                for i in range(12)])  # fmt: skip

    result = mirror_once(kbroker, Pair(source, target, "source"), "fewer|more")

    assert result.exit_code == 0, result.stderr
    assert "grew source.fewer in the target to 3 partitions" in result.stderr
    assert (topic_partitions(target, "source.fewer"), topic_partitions(target, "source.more")) == (3, 4)
    for topic in ("fewer", "more"):  # each record in its own partition number, none in the extra ones
        assert read_all(target, f"source.{topic}") == read_all(source, topic)


def test_a_source_topic_growing_while_mirrored(broker_factory: Callable[..., RunningBroker]) -> None:
    import re
    import threading
    import time

    from kafka import KafkaAdminClient
    from kafka.admin import NewPartitions

    from kbroker.commands.connection import ClientSettings
    from kbroker.mirror.policy import ReplicationPolicy
    from kbroker.mirror.replicator import Mirror, MirrorOptions
    from tests.mirror.conftest import produce

    source, target = broker_factory().bootstrap, broker_factory().bootstrap
    create_topic(source, "grows", 1)
    produce(source, "grows", [(0, None, b"first", [], BASE_TIMESTAMP)])
    policy = ReplicationPolicy("prefix", "source", "target", re.compile("grows"))
    lines: list[str] = []
    mirror = Mirror(
        MirrorOptions(ClientSettings(source), ClientSettings(target), policy, refresh_interval=0.2), lines.append
    )
    failures: list[BaseException] = []

    def run() -> None:
        try:
            mirror.run()
        except BaseException as exc:  # the test reports it
            failures.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while (
            "source.grows" not in list_topics(target) or len(read_all(target, "source.grows")) < 1
        ):  # copying, and its producer knows the topic
            assert time.monotonic() < deadline and runner.is_alive(), (lines, failures)
            time.sleep(0.05)
        admin = KafkaAdminClient(bootstrap_servers=source)
        try:
            admin.create_partitions({"grows": NewPartitions(3)})
        finally:
            admin.close()
        produce(source, "grows", [(2, None, b"in a new partition", [], BASE_TIMESTAMP)])
        while len(read_all(target, "source.grows")) < 2:
            assert time.monotonic() < deadline and runner.is_alive(), (lines, failures)
            time.sleep(0.05)
    finally:
        mirror.stop()
        runner.join(30)
    assert not failures and not runner.is_alive()
    assert [(p, v) for p, _o, _k, v, _h, _t in read_all(target, "source.grows")] == [
        (0, b"first"),
        (2, b"in a new partition"),
    ]


def test_a_second_signal_stops_at_once() -> None:
    from kbroker.mirror.replicator import _stop_on_signals

    stops: list[str] = []
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), _stop_on_signals(lambda: stops.append("stop")):
        os.kill(os.getpid(), signal.SIGTERM)  # the first: finish the batch in hand, then stop
        assert stops == ["stop"]
        os.kill(os.getpid(), signal.SIGTERM)  # the second: now
        raise AssertionError("not interrupted")
    assert stops == ["stop"]
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
