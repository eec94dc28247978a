"""Finding offsets: by timestamp (ListOffsets, KIP-79) and the log's start and end."""

from __future__ import annotations

import time

from compat.clients.remote import RemoteClient
from compat.helpers import read
from compat.reference import Reference


def seed(reference: Reference, topic: str) -> int:
    """Partition 0: six records at base+0s, +1s, ..., +5s; partition 1: two at base+0.5s, +1.5s. Returns base.

    Timestamps lie ten minutes in the past: recent enough for any retention, and accepted under Kafka 4's
    log.message.timestamp.before.max.ms / after.max.ms defaults."""
    base = int(time.time() * 1000) - 600_000
    reference.create_topic(topic, 2)
    reference.produce(topic, 0, [(None, f"p0-{i}", base + 1000 * i) for i in range(6)])
    reference.produce(topic, 1, [(None, f"p1-{i}", base + 500 + 1000 * i) for i in range(2)])
    return base


def test_offsets_by_timestamp(client: RemoteClient, reference: Reference, names) -> None:
    """The first offset whose timestamp is at or after the one asked for; none past the last record."""
    topic = names("timed")
    base = seed(reference, topic)
    lookups = [
        ({"0": base + 2500, "1": base + 1000}, {"0": 3, "1": 1}),
        ({"0": base, "1": base}, {"0": 0, "1": 0}),
        ({"0": base + 5000, "1": base + 1500}, {"0": 5, "1": 1}),
        ({"0": base + 5001, "1": base + 1501}, {"0": None, "1": None}),
    ]
    for asked, expected in lookups:
        assert client.offsets_for_times(topic=topic, timestamps=asked) == expected, asked
    # Reading from the offset found gives the records from that time on, with their timestamps.
    got = read(client, topic, 0, 3, 3)
    assert [(r["offset"], r["value"], r["timestamp"] - base) for r in got] == [
        (3, "p0-3", 3000),
        (4, "p0-4", 4000),
        (5, "p0-5", 5000),
    ]


def test_earliest_and_latest_offsets(client: RemoteClient, reference: Reference, names) -> None:
    topic = names("ends")
    seed(reference, topic)
    assert client.list_offsets(topic=topic, partitions=[0, 1], spec="earliest") == {"0": 0, "1": 0}
    assert client.list_offsets(topic=topic, partitions=[0, 1], spec="latest") == {"0": 6, "1": 2}
