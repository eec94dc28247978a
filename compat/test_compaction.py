"""Log compaction: a compacted topic keeps the latest record of each key at its offset, tombstones included,
and a consumer reading it from the start rebuilds exactly the latest value per key; a record without a key
is refused. Both brokers run their cleaner every 100 ms when idle (compat/targets.py); the topic rolls a
segment per round of updates (segment.ms), so every round but the last is cleanable at once."""

from __future__ import annotations

import time

import pytest

from compat.clients import ClientSpec
from compat.clients.api import ClientError
from compat.clients.remote import RemoteClient
from compat.helpers import produce, read, record
from compat.reference import Reference

COMPACTED = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}
KEYS = [f"key-{k}" for k in range(6)]


def latest_records(placed: list[tuple[int, str, str | None]]) -> list[tuple[int, str, str | None]]:
    """(offset, key, value) of the last record of each key, in offset order."""
    last: dict[str, tuple[int, str, str | None]] = {}
    for offset, key, value in placed:
        last[key] = (offset, key, value)
    return sorted(last.values())


def test_a_compacted_topic_keeps_the_latest_record_per_key(client: RemoteClient, reference: Reference, names) -> None:
    topic = names("compacted")
    reference.create_topic(topic, 1, COMPACTED)
    placed: list[tuple[int, str, str | None]] = []
    for round_ in range(4):
        updates = [record(key, f"{key} round {round_}", partition=0) for key in KEYS]
        offsets = produce(client, topic, updates)
        placed += [(offset, r["key"], r["value"]) for (_, offset), r in zip(offsets, updates, strict=True)]
        if round_ == 2:  # a tombstone for key-1, written raw: not every client can send a null value
            timestamp = int(time.time() * 1000)
            placed.append((reference.produce(topic, 0, [("key-1", None, timestamp)]), "key-1", None))
        time.sleep(0.3)  # past segment.ms: the next append rolls a new segment
    # One more record moves the last round out of the active segment, which is never cleaned.
    offset = produce(client, topic, [record("tail", "tail", partition=0)])[0][1]
    placed.append((offset, "tail", "tail"))
    # The tombstone stays (delete.retention.ms is a day), holding key-1's place.
    expected = latest_records(placed)

    deadline = time.monotonic() + 60
    while (stored := [(r.offset, r.key, r.value) for r in reference.records(topic, 0)]) != expected:
        assert time.monotonic() < deadline, f"not compacted in 60 s: {stored}"
        time.sleep(0.2)

    # A consumer reading from the start gets exactly those records, at their offsets, skipping the gaps.
    got = read(client, topic, 0, 0, len(expected))
    assert [(r["offset"], r["key"], r["value"]) for r in got] == expected
    rebuilt = {r["key"]: r["value"] for r in got}
    assert rebuilt == {key: value for _, key, value in placed}  # the table a KTable rebuilds from it


def test_a_compacted_topic_refuses_a_record_without_a_key(
    client: RemoteClient, client_spec: ClientSpec, reference: Reference, names
) -> None:
    topic = names("keyless")
    reference.create_topic(topic, 1, COMPACTED)
    with pytest.raises(ClientError) as refused:
        produce(client, topic, [record(None, "no key", partition=0)])
    # aiokafka 0.14 has no class for error 87 and reports it as UnknownError, whichever broker says it.
    assert refused.value.error == ("UnknownError" if client_spec.name == "aiokafka" else "INVALID_RECORD")
    assert produce(client, topic, [record("k", "keyed", partition=0)]) == [[0, 0]]
