"""Producing and consuming: keys, headers, every codec, ordering, key -> partition, large records, the
idempotent producer. Everything asserted is Kafka's documented behaviour, so it holds against Apache Kafka."""

from __future__ import annotations

import hashlib

import pytest

from compat.clients import ClientSpec
from compat.clients.api import ClientError
from compat.clients.remote import RemoteClient
from compat.helpers import CODECS, COMPRESSION_ATTRIBUTE, essentials, produce, read, record
from compat.reference import Reference
from kbroker.partitioners import DEFAULT_PARTITIONERS

PARTITIONS = 3


def test_keys_headers_and_every_codec(client: RemoteClient, reference: Reference, names) -> None:
    for codec in CODECS:
        topic = names(codec)
        reference.create_topic(topic, PARTITIONS)
        # Compressible values: librdkafka sends a batch uncompressed when compression would not shrink it.
        sent = [
            record(
                f"key-{i % 5}",
                f"{codec} value {i} " + "." * 200,
                # Headers keep their order and repeated names (KIP-82).
                [["codec", codec], ["seq", str(i)], ["seq", "again"]],
            )
            for i in range(20)
        ]
        placed = produce(client, topic, sent, codec=codec)

        # Per partition, offsets are given in send order, from 0 without gaps.
        for partition in range(PARTITIONS):
            offsets = [offset for p, offset in placed if p == partition]
            assert offsets == list(range(len(offsets))), (codec, partition, placed)
        expected = sorted((p, o, r["key"], r["value"], r["headers"]) for (p, o), r in zip(placed, sent, strict=True))
        got = []
        for partition in range(PARTITIONS):
            count = sum(1 for p, _ in placed if p == partition)
            got += essentials(read(client, topic, partition, 0, count)) if count else []
        assert sorted(got) == expected, codec
        assert got == sorted(got)  # each partition read back in offset order

        # On the log: every batch carries the producer's codec (topics keep compression.type=producer).
        for partition in range(PARTITIONS):
            codecs = {batch.header.compression for batch in reference.batches(topic, partition)}
            assert codecs <= {COMPRESSION_ATTRIBUTE[codec]}, (codec, partition, codecs)


def test_header_without_a_value(client: RemoteClient, reference: Reference, names) -> None:
    """A header's value may be null (KIP-82); not every client can send one."""
    topic = names("nullheader")
    reference.create_topic(topic, 1)
    headers = [["present", "yes"], ["absent", None]]
    assert produce(client, topic, [record("k", "v", headers)]) == [[0, 0]]
    assert [r["headers"] for r in read(client, topic, 0, 0, 1)] == [headers]
    assert [r.headers for r in reference.records(topic, 0)] == [headers]


def test_key_to_partition(client: RemoteClient, client_spec: ClientSpec, reference: Reference, names) -> None:
    """Each client's documented default partitioner, and the same partition for a key every time.

    The defaults differ: Java, kafka-python and aiokafka hash with murmur2; librdkafka (confluent-kafka,
    kcat) uses consistent_random (CRC-32). Moving between those clients moves keys to other partitions."""
    if client_spec.partitioner is None:
        pytest.skip(f"n/a: {client_spec.name} declares no default partitioner")
    partition_of = DEFAULT_PARTITIONERS[client_spec.partitioner]
    topic = names("keys")
    reference.create_topic(topic, 6)
    keys = [f"user-{i}" for i in range(40)]
    first = produce(client, topic, [record(k, f"first {k}") for k in keys])
    second = produce(client, topic, [record(k, f"second {k}") for k in reversed(keys)])
    assert [p for p, _ in first] == [partition_of(k.encode(), 6) for k in keys]
    assert [p for p, _ in second] == [partition_of(k.encode(), 6) for k in reversed(keys)]
    # Per partition, the order of the sends.
    for partition in range(6):
        stored = [r.value for r in reference.records(topic, partition)]
        ours = [f"first {k}" for k in keys if partition_of(k.encode(), 6) == partition]
        ours += [f"second {k}" for k in reversed(keys) if partition_of(k.encode(), 6) == partition]
        assert stored == ours, partition


def pattern(length: int) -> str:
    return "".join(chr(ord("a") + (i * 7) % 26) for i in range(length))


def test_large_records(client: RemoteClient, reference: Reference, names) -> None:
    """900 KB fits every default (broker message.max.bytes 1048588, client request limits ~1 MB); a fetch
    size smaller than a batch still returns that batch (KIP-74); 1.1 MB is refused by the broker with
    MESSAGE_TOO_LARGE once the client's own limit is raised past it."""
    topic = names("large")
    reference.create_topic(topic, 1)
    big = pattern(900_000)
    assert produce(client, topic, [record("big", big), record("small", "after")]) == [[0, 0], [0, 1]]
    got = read(client, topic, 0, 0, 2, max_partition_fetch_bytes=65_536)
    assert [(r["offset"], r["key"], len(r["value"])) for r in got] == [(0, "big", 900_000), (1, "small", 5)]
    assert hashlib.sha256(got[0]["value"].encode()).digest() == hashlib.sha256(big.encode()).digest()

    with pytest.raises(ClientError) as refused:
        produce(client, topic, [record("huge", pattern(1_100_000))], max_request_bytes=2_000_000)
    assert refused.value.error == "MESSAGE_TOO_LARGE"
    assert [r.key for r in reference.records(topic, 0)] == ["big", "small"]


def test_idempotent_producer(client: RemoteClient, reference: Reference, names) -> None:
    """KIP-98: an idempotent producer's batches carry its producer id and epoch and sequence numbers that
    continue from batch to batch from 0; another producer gets another id and starts again at 0.
    (The ids themselves are the broker's choice and differ between targets.)"""
    topic = names("idempotent")
    reference.create_topic(topic, 1)
    first = [record(None, f"first {i}", partition=0) for i in range(30)]
    second = [record(None, f"second {i}", partition=0) for i in range(10)]
    assert produce(client, topic, first, idempotent=True) == [[0, i] for i in range(30)]
    assert produce(client, topic, second, idempotent=True) == [[0, 30 + i] for i in range(10)]

    batches = reference.batches(topic, 0)
    assert [r.value for b in batches for r in b.records] == [r["value"] for r in first + second]
    by_producer: dict[int, list] = {}
    for batch in batches:
        assert batch.header.producer_id >= 0 and batch.header.producer_epoch >= 0, batch.header
        by_producer.setdefault(batch.header.producer_id, []).append(batch.header)
    assert len(by_producer) == 2
    for headers in by_producer.values():
        assert len({h.producer_epoch for h in headers}) == 1
        sequence = 0
        for header in headers:
            assert header.base_sequence == sequence, headers
            sequence = header.last_sequence + 1
    first_id, second_id = (batches[0].header.producer_id, batches[-1].header.producer_id)
    assert [h.base_offset for h in by_producer[first_id]][0] == 0
    assert by_producer[second_id][-1].last_offset == 39
