"""A classic-protocol group member in its own process, so a test can kill it without a LeaveGroup.

    python classic_member.py CLIENT BOOTSTRAP GROUP TOPIC NAME [--assignor A] [--session-ms N]

CLIENT is kafka-python (whichever version PYTHONPATH finds first), aiokafka or confluent. Prints JSON lines:
{"event": "assigned", "partitions": [...], "t": ns} on each change of assignment; {"event": "added" |
"revoked", "partitions": [...], "t": ns} from the rebalance callbacks; {"event": "records", "records":
[[partition, offset], ...]} once a synchronous commit stored them; {"event": "consumed", ...} lists each batch
as it is read, before the commit. A failed commit ({"event": "commit-failed"}) is retried while the member
keeps the partitions; records of partitions it loses uncommitted are never counted as committed (their
next owner reads them again).
On the stdin line "close" (or once --stop-after records are committed) it prints {"event": "closing"}, closes
the consumer (which leaves the group) and prints {"event": "closed"}.
``t`` is time.monotonic_ns(), one clock for every process on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from typing import Any


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


class Uncommitted:
    """Records read but not yet committed, per partition; forgotten when the partition is revoked."""

    def __init__(self) -> None:
        self.records: dict[int, list[int]] = {}

    def add(self, records: list[list[int]]) -> None:
        for partition, offset in records:
            self.records.setdefault(partition, []).append(offset)

    def drop(self, partitions: list[int]) -> None:
        for partition in partitions:
            self.records.pop(partition, None)

    def next_offsets(self) -> dict[int, int]:
        return {partition: max(offsets) + 1 for partition, offsets in self.records.items()}

    def snapshot(self) -> dict[int, list[int]]:
        return {partition: list(offsets) for partition, offsets in self.records.items()}

    def committed(self, snapshot: dict[int, list[int]]) -> int:
        """Report the records of ``snapshot`` (taken before the commit) as committed; their number."""
        records = [[p, o] for p, offsets in sorted(snapshot.items()) for o in offsets]
        for partition, offsets in snapshot.items():
            left = [o for o in self.records.get(partition, []) if o not in set(offsets)]
            if left:
                self.records[partition] = left
            else:
                self.records.pop(partition, None)
        emit("records", records=records)
        return len(records)


class Stdin:
    """Watches stdin for "close" on a thread (the consumers' loops poll ``closing``)."""

    def __init__(self) -> None:
        self.closing = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                self.closing = True
        self.closing = True


def run_kafka_python(args: argparse.Namespace, stdin: Stdin) -> None:
    import kafka
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka.errors import KafkaError

    emit("client", version=kafka.__version__)
    pending = Uncommitted()

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):  # noqa: ANN001, ANN202
            partitions = sorted(tp.partition for tp in revoked)
            pending.drop(partitions)
            emit("revoked", partitions=partitions, t=time.monotonic_ns())

        def on_partitions_assigned(self, assigned):  # noqa: ANN001, ANN202
            emit("added", partitions=sorted(tp.partition for tp in assigned), t=time.monotonic_ns())

    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        client_id=args.name,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=args.session_ms,
        heartbeat_interval_ms=500,
        max_poll_records=args.max_records,
    )
    consumer.subscribe([args.topic], listener=Listener())
    assigned: list[int] | None = None
    committed = 0
    while not stdin.closing and not (args.stop_after and committed >= args.stop_after):
        batches = consumer.poll(100)
        records = [[tp.partition, r.offset] for tp, rs in batches.items() for r in rs]
        if records:
            emit("consumed", records=records)
            pending.add(records)
        if pending.records:
            snapshot = pending.snapshot()
            try:
                consumer.commit()  # every assigned partition's position: all that was read
                committed += pending.committed(snapshot)
            except KafkaError as exc:
                emit("commit-failed", error=type(exc).__name__)
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != assigned:
            assigned = now
            emit("assigned", partitions=now, t=time.monotonic_ns())
    emit("closing", t=time.monotonic_ns())
    consumer.close()
    emit("closed")


def run_confluent(args: argparse.Namespace, stdin: Stdin) -> None:
    import confluent_kafka
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    emit("client", version=confluent_kafka.__version__, librdkafka=confluent_kafka.libversion()[0])
    pending = Uncommitted()

    def on_assign(consumer, partitions) -> None:  # noqa: ANN001
        emit("added", partitions=sorted(tp.partition for tp in partitions), t=time.monotonic_ns())

    def on_revoke(consumer, partitions) -> None:  # noqa: ANN001
        revoked = sorted(tp.partition for tp in partitions)
        pending.drop(revoked)
        emit("revoked", partitions=revoked, t=time.monotonic_ns())

    def on_lost(consumer, partitions) -> None:  # noqa: ANN001
        lost = sorted(tp.partition for tp in partitions)
        pending.drop(lost)
        emit("lost", partitions=lost, t=time.monotonic_ns())

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "client.id": args.name,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": args.session_ms,
            "heartbeat.interval.ms": 500,
            "partition.assignment.strategy": args.assignor,
        }
    )
    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    assigned: list[int] | None = None
    committed = 0
    while not stdin.closing and not (args.stop_after and committed >= args.stop_after):
        messages = [m for m in consumer.consume(args.max_records, 0.1) if m.error() is None]
        if messages:
            records = [[m.partition(), m.offset()] for m in messages]
            emit("consumed", records=records)
            pending.add(records)
        if pending.records:
            snapshot = pending.snapshot()
            offsets = [TopicPartition(args.topic, p, o) for p, o in pending.next_offsets().items()]
            try:
                consumer.commit(offsets=offsets, asynchronous=False)  # exactly what was read
                committed += pending.committed(snapshot)
            except KafkaException as exc:
                emit("commit-failed", error=str(exc.args[0]))
        now = sorted(tp.partition for tp in consumer.assignment())
        if now != assigned:
            assigned = now
            emit("assigned", partitions=now, t=time.monotonic_ns())
    emit("closing", t=time.monotonic_ns())
    consumer.close()
    emit("closed")


async def run_aiokafka(args: argparse.Namespace, stdin: Stdin) -> None:
    import aiokafka
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.errors import KafkaError

    emit("client", version=aiokafka.__version__)
    pending = Uncommitted()

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):  # noqa: ANN001, ANN202
            partitions = sorted(tp.partition for tp in revoked)
            pending.drop(partitions)
            emit("revoked", partitions=partitions, t=time.monotonic_ns())

        async def on_partitions_assigned(self, assigned):  # noqa: ANN001, ANN202
            emit("added", partitions=sorted(tp.partition for tp in assigned), t=time.monotonic_ns())

    consumer = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        client_id=args.name,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=args.session_ms,
        heartbeat_interval_ms=500,
    )
    consumer.subscribe([args.topic], listener=Listener())
    await consumer.start()
    assigned: list[int] | None = None
    committed = 0
    try:
        while not stdin.closing and not (args.stop_after and committed >= args.stop_after):
            batches = await consumer.getmany(timeout_ms=100, max_records=args.max_records)
            records = [[tp.partition, r.offset] for tp, rs in batches.items() for r in rs]
            if records:
                emit("consumed", records=records)
                pending.add(records)
            if pending.records:
                # Taken before the commit: a revocation may run while it is awaited.
                snapshot = pending.snapshot()
                try:
                    await consumer.commit()  # every assigned partition's position: all that was read
                    committed += pending.committed(snapshot)
                except KafkaError as exc:
                    emit("commit-failed", error=type(exc).__name__)
            now = sorted(tp.partition for tp in consumer.assignment())
            if now != assigned:
                assigned = now
                emit("assigned", partitions=now, t=time.monotonic_ns())
    finally:
        emit("closing", t=time.monotonic_ns())
        await consumer.stop()
    emit("closed")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("client", choices=["kafka-python", "aiokafka", "confluent"])
    parser.add_argument("bootstrap")
    parser.add_argument("group")
    parser.add_argument("topic")
    parser.add_argument("name")
    parser.add_argument("--assignor", default="range")
    parser.add_argument("--session-ms", type=int, default=6000)
    parser.add_argument("--max-records", type=int, default=500, help="records per poll")
    parser.add_argument("--stop-after", type=int, default=0, help="close after committing this many records")
    args = parser.parse_args()
    stdin = Stdin()
    if args.client == "kafka-python":
        run_kafka_python(args, stdin)
    elif args.client == "confluent":
        run_confluent(args, stdin)
    else:
        asyncio.run(run_aiokafka(args, stdin))


if __name__ == "__main__":
    main()
