"""A broker restart under running clients: only for targets whose broker the suite controls (kbroker).

The producer stays open across the restart and goes on where it was (it reconnects; an idempotent
producer keeps its producer id and sequence numbers, which the broker must still accept). Everything
acknowledged before the restart is there after it, and so are committed offsets."""

from __future__ import annotations

import time

import pytest

from compat.clients.remote import RemoteClient
from compat.helpers import Member, poll_until, read, record
from compat.reference import Reference
from compat.targets import Target


def restartable(target: Target) -> None:
    if not target.can_restart:
        pytest.skip(f"the suite does not control the {target.name} target's broker")


def test_producer_across_a_broker_restart(client: RemoteClient, target: Target, reference: Reference, names) -> None:
    restartable(target)
    topic = names("topic")
    reference.create_topic(topic, 1)
    producer = client.producer_open(settings={"idempotent": True})
    try:
        records = [record(None, f"before {i}") for i in range(5)]
        before = client.producer_send(handle=producer, topic=topic, records=records)
        target.restart()
        records = [record(None, f"after {i}") for i in range(5)]
        after = client.producer_send(handle=producer, topic=topic, records=records)
    finally:
        client.producer_close(handle=producer)
    assert before + after == [[0, i] for i in range(10)]
    values = [f"before {i}" for i in range(5)] + [f"after {i}" for i in range(5)]
    assert [r["value"] for r in read(client, topic, 0, 0, 10)] == values
    assert [r.value for r in reference.records(topic, 0)] == values


def test_committed_offsets_across_a_broker_restart(
    client: RemoteClient, target: Target, reference: Reference, names
) -> None:
    restartable(target)
    topic, group = names("topic"), names("group")
    reference.create_topic(topic, 1)
    now = int(time.time() * 1000)
    reference.produce(topic, 0, [(None, f"before {i}", now) for i in range(5)])
    member = Member.join(client, group, [topic], target.session_timeout_ms)
    poll_until([member], lambda: len(member.records) == 5, "the records before the restart")
    client.consumer_commit(handle=member.handle)
    client.consumer_close(handle=member.handle)

    target.restart()

    assert reference.committed(group, topic, 1) == {0: 5}
    reference.produce(topic, 0, [(None, f"after {i}", now) for i in range(3)])
    resumed = Member.join(client, group, [topic], target.session_timeout_ms)
    poll_until([resumed], lambda: len(resumed.records) >= 3, "the records after the restart")
    assert [(r["offset"], r["value"]) for r in resumed.records] == [(5 + i, f"after {i}") for i in range(3)]
    client.consumer_close(handle=resumed.handle)
