"""aiokafka against a live broker: admin, every codec, idempotence, offsets by time, large records, restart."""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from kbroker.testing import RunningBroker

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


async def create_topic(bootstrap: str, name: str, partitions: int = 1) -> int:
    """Create a topic; returns the error code the broker gave for it (aiokafka does not raise)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(name, partitions, 1)])
        ((_, error_code, *_),) = response.topic_errors
        return error_code
    finally:
        await admin.close()


async def read(bootstrap: str, assignment: list[TopicPartition], expected: int, **config) -> list:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **config)
    await consumer.start()
    try:
        consumer.assign(assignment)
        for tp in assignment:
            consumer.seek(tp, 0)
        records: list = []
        deadline = time.monotonic() + 15
        while len(records) < expected and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for batch in batches.values():
                records.extend(batch)
        return records
    finally:
        await consumer.stop()


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c or "none")
@pytest.mark.parametrize("idempotent", [False, True], ids=["default", "idempotent"])
def test_produce_and_consume_every_codec(broker: RunningBroker, codec: str | None, idempotent: bool) -> None:
    async def scenario() -> None:
        await create_topic(broker.bootstrap, "events", 2)
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap, compression_type=codec, enable_idempotence=idempotent
        )
        await producer.start()
        sent = []
        try:
            for i in range(60):
                meta = await producer.send_and_wait(
                    "events", key=f"k{i % 3}".encode(), value=f"v{i}".encode() * 30, headers=[("i", str(i).encode())]
                )
                sent.append((meta.partition, meta.offset, f"k{i % 3}".encode(), f"v{i}".encode() * 30, str(i)))
        finally:
            await producer.stop()
        for partition in (0, 1):
            offsets = [o for p, o, *_ in sent if p == partition]
            assert offsets == list(range(len(offsets)))
        records = await read(broker.bootstrap, [TopicPartition("events", 0), TopicPartition("events", 1)], 60)
        got = sorted((r.partition, r.offset, r.key, r.value, r.headers[0][1].decode()) for r in records)
        assert got == sorted(sent)

    asyncio.run(scenario())


def test_admin_offsets_for_times_and_large_record(broker: RunningBroker) -> None:
    async def scenario() -> None:
        assert await create_topic(broker.bootstrap, "mixed") == 0
        assert await create_topic(broker.bootstrap, "mixed") == TopicAlreadyExistsError.errno
        base = int(time.time() * 1000) - 50_000
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, max_request_size=1_000_000)
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait("mixed", value=str(i).encode(), timestamp_ms=base + i * 1000)
            big = bytes(range(256)) * 3600
            meta = await producer.send_and_wait("mixed", key=b"big", value=big)
            assert meta.offset == 5
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, max_partition_fetch_bytes=2_000_000)
        await consumer.start()
        try:
            tp = TopicPartition("mixed", 0)
            assert await consumer.beginning_offsets([tp]) == {tp: 0}
            assert await consumer.end_offsets([tp]) == {tp: 6}
            found = await consumer.offsets_for_times({tp: base + 2500})
            assert (found[tp].offset, found[tp].timestamp) == (3, base + 3000)
        finally:
            await consumer.stop()
        records = await read(broker.bootstrap, [TopicPartition("mixed", 0)], 6, max_partition_fetch_bytes=2_000_000)
        assert [r.value for r in records[:5]] == [str(i).encode() for i in range(5)]
        assert (records[5].offset, records[5].key, records[5].value) == (5, b"big", big)

    asyncio.run(scenario())


def test_restart_keeps_acknowledged_records(broker: RunningBroker) -> None:
    async def produce(prefix: str) -> list[tuple[int, bytes]]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            out = []
            for i in range(20):
                meta = await producer.send_and_wait("durable", value=f"{prefix}{i}".encode())
                out.append((meta.offset, f"{prefix}{i}".encode()))
            return out
        finally:
            await producer.stop()

    async def before() -> list[tuple[int, bytes]]:
        await create_topic(broker.bootstrap, "durable")
        return await produce("before-")

    acked = asyncio.run(before())
    broker.restart()
    acked += asyncio.run(produce("after-"))
    assert [offset for offset, _ in acked] == list(range(40))
    records = asyncio.run(read(broker.bootstrap, [TopicPartition("durable", 0)], 40))
    assert [(r.offset, r.value) for r in records] == acked
