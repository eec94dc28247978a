"""Small building blocks the scenarios share: producing through a client, reading back, and driving group
members until a condition on their assignments and records holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from compat.clients.remote import RemoteClient

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
COMPRESSION_ATTRIBUTE = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # the batch attributes' low bits

Record = dict[str, Any]


def record(
    key: str | None,
    value: str | None,
    headers: list[list[str | None]] | None = None,
    partition: int | None = None,
    timestamp: int | None = None,
) -> Record:
    return {"key": key, "value": value, "headers": headers or [], "partition": partition, "timestamp": timestamp}


def produce(client: RemoteClient, topic: str, records: list[Record], **settings: Any) -> list[list[int]]:
    """One producer for these records: opened, all sent in order and acknowledged, closed."""
    handle = client.producer_open(settings=settings)
    try:
        return client.producer_send(handle=handle, topic=topic, records=records)
    finally:
        client.producer_close(handle=handle)


def read(client: RemoteClient, topic: str, partition: int, offset: int, count: int, **settings: Any) -> list[Record]:
    return client.read(topic=topic, partition=partition, offset=offset, count=count, settings=settings)


def essentials(records: list[Record]) -> list[tuple[Any, ...]]:
    """What every client reports the same way: (partition, offset, key, value, headers)."""
    return [(r["partition"], r["offset"], r["key"], r["value"], r["headers"]) for r in records]


@dataclass
class Member:
    """A consumer group member: a consumer in a client process, and what it has seen so far."""

    client: RemoteClient
    handle: int
    assignment: list[list[Any]] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)

    @classmethod
    def join(cls, client: RemoteClient, group: str, topics: list[str], session_timeout_ms: int) -> Member:
        settings = {
            "session_timeout_ms": session_timeout_ms,
            "heartbeat_interval_ms": max(100, session_timeout_ms // 6),
        }
        return cls(client, client.consumer_open(group=group, topics=topics, settings=settings))

    def poll(self, timeout_ms: int = 200) -> None:
        answer = self.client.consumer_poll(handle=self.handle, timeout_ms=timeout_ms)
        self.assignment = answer["assignment"]
        self.records.extend(answer["records"])

    def partitions(self) -> list[int]:
        return sorted(p for _, p in self.assignment)

    def seen(self) -> list[tuple[int, int, str | None]]:
        return sorted((r["partition"], r["offset"], r["value"]) for r in self.records)


def poll_until(members: list[Member], done: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll every member at once, round after round, until ``done()`` (members keep heartbeating meanwhile).

    Rebalances need all members to take part: a Java or kafka-python member rejoins only inside poll."""
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(max_workers=max(1, len(members))) as pool:
        while True:
            list(pool.map(lambda m: m.poll(), members))
            if done():
                return
            if time.monotonic() > deadline:
                state = [(m.partitions(), len(m.records)) for m in members]
                raise AssertionError(f"{what}: not reached in {timeout:g} s; (assignment, records) per member: {state}")
