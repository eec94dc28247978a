"""``kbroker mirror`` on records Kafka allows that are easy to get wrong: a record with neither key nor value and
header values that are null (kafka-python's send() refuses both), transactional source topics (aborted records
and commit markers leave offset gaps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conftest import Pair, Result, create_topic, read_all

from kbroker.testing import RunningBroker

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


def mirror_once(kbroker: Callable[..., Result], pair: Pair, topic: str, *extra: str) -> Result:
    return kbroker("mirror", "--source", pair.source, "--target", pair.target, "--topics", topic,
                   "--source-alias", pair.alias, "--once", *extra)  # fmt: skip


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
