"""What the broker does to batches on append: compression.type other than producer (the batch is rebuilt in the
topic's codec) and message.timestamp.type=LogAppendTime (the broker's clock replaces the producer's). Both are
Kafka's documented topic settings, so every assertion holds against Apache Kafka too."""

from __future__ import annotations

import time

from compat.clients.remote import RemoteClient
from compat.helpers import COMPRESSION_ATTRIBUTE, essentials, produce, read, record
from compat.reference import Reference

TOPIC_CODEC_ATTRIBUTE = {**COMPRESSION_ATTRIBUTE, "uncompressed": 0}


def now_ms() -> int:
    return int(time.time() * 1000)


def test_batches_are_stored_in_the_topic_codec(client: RemoteClient, reference: Reference, names) -> None:
    """The records come back as sent, with the producer's timestamps, from batches in the topic's codec."""
    for sent_codec, topic_codec in (
        ("lz4", "zstd"),
        ("none", "gzip"),
        ("gzip", "lz4"),
        ("none", "snappy"),
        ("zstd", "uncompressed"),
    ):
        topic = names(f"{sent_codec}-{topic_codec}")
        reference.create_topic(topic, 1, {"compression.type": topic_codec})
        # Compressible values: librdkafka sends a batch uncompressed when compression would not shrink it.
        sent = [
            record(f"key-{i % 3}", f"{sent_codec} to {topic_codec} {i} " + "." * 200, [["i", str(i)]], partition=0)
            for i in range(30)
        ]
        assert produce(client, topic, sent, codec=sent_codec) == [[0, i] for i in range(30)]

        got = read(client, topic, 0, 0, 30)
        assert essentials(got) == [(0, i, r["key"], r["value"], r["headers"]) for i, r in enumerate(sent)]
        batches = reference.batches(topic, 0)
        assert {batch.header.compression for batch in batches} == {TOPIC_CODEC_ATTRIBUTE[topic_codec]}, topic
        stored = [r for batch in batches for r in batch.records]
        assert [(r.offset, r.value) for r in stored] == [(i, r["value"]) for i, r in enumerate(sent)]
        assert [r.timestamp for r in stored] == [r["timestamp"] for r in got]  # CreateTime: the producer's
        assert all(not batch.header.is_log_append_time for batch in batches)


def test_log_append_time_replaces_the_producer_timestamps(client: RemoteClient, reference: Reference, names) -> None:
    """Every record reads as its batch's append time, inside the produce call; ListOffsets looks up that time."""
    topic = names("append-time")
    reference.create_topic(topic, 1, {"message.timestamp.type": "LogAppendTime"})
    long_ago = now_ms() - 3_600_000  # what the producer says; the broker replaces it
    before = now_ms()
    sent = [record(None, f"v{i}", partition=0, timestamp=long_ago + i) for i in range(10)]
    assert produce(client, topic, sent) == [[0, i] for i in range(10)]
    after = now_ms()

    batches = reference.batches(topic, 0)
    assert all(batch.header.is_log_append_time for batch in batches)
    append_times = [batch.header.max_timestamp for batch in batches for _ in batch.records]
    assert all(before <= t <= after for t in append_times), (before, append_times, after)
    got = read(client, topic, 0, 0, 10)
    assert [(r["offset"], r["timestamp"]) for r in got] == list(enumerate(append_times))

    last = append_times[-1]
    assert client.offsets_for_times(topic=topic, timestamps={"0": long_ago}) == {"0": 0}
    assert client.offsets_for_times(topic=topic, timestamps={"0": last}) == {"0": append_times.index(last)}
    assert client.offsets_for_times(topic=topic, timestamps={"0": last + 1}) == {"0": None}
