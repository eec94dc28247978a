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
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
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


class Member:
    """What every client's loop does around its own poll and commit calls: watching stdin for "close",
    tracking uncommitted records, and reporting rebalances, reads, commits and assignments."""

    def __init__(self, stop_after: int) -> None:
        self.stop_after = stop_after
        self.closing = False
        self.uncommitted = Uncommitted()
        self.committed = 0
        self.assigned: list[int] | None = None
        threading.Thread(target=self._read_stdin, daemon=True).start()

    def _read_stdin(self) -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                self.closing = True
        self.closing = True

    @property
    def running(self) -> bool:
        return not self.closing and not (self.stop_after and self.committed >= self.stop_after)

    def added(self, partitions: Iterable[Any]) -> None:
        """From the rebalance listener: ``partitions`` (the client's TopicPartitions) were assigned."""
        emit("added", partitions=sorted(tp.partition for tp in partitions), t=time.monotonic_ns())

    def revoked(self, partitions: Iterable[Any], event: str = "revoked") -> None:
        """From the rebalance listener: what was read of ``partitions`` and not committed is forgotten."""
        gone = sorted(tp.partition for tp in partitions)
        self.uncommitted.drop(gone)
        emit(event, partitions=gone, t=time.monotonic_ns())

    def read(self, records: list[list[int]]) -> None:
        if records:
            emit("consumed", records=records)
            self.uncommitted.add(records)

    @contextmanager
    def committing(self, errors: type[Exception], describe: Callable[[Exception], str]) -> Iterator[None]:
        """Around a synchronous commit of all that is uncommitted: its records count as committed once it
        returns; ``errors`` it raises are reported and the commit is tried again after the next poll."""
        # Taken before the commit: a revocation may run while it is under way.
        snapshot = self.uncommitted.snapshot()
        try:
            yield
        except errors as exc:
            emit("commit-failed", error=describe(exc))
        else:
            self.committed += self.uncommitted.committed(snapshot)

    def assignment(self, partitions: Iterable[Any]) -> None:
        now = sorted(tp.partition for tp in partitions)
        if now != self.assigned:
            self.assigned = now
            emit("assigned", partitions=now, t=time.monotonic_ns())


def error_name(exc: Exception) -> str:
    return type(exc).__name__


def kafka_python_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The consumer settings of kafka-python and of aiokafka, which took over its API."""
    return {
        "bootstrap_servers": args.bootstrap,
        "group_id": args.group,
        "client_id": args.name,
        "auto_offset_reset": "earliest",
        "enable_auto_commit": False,
        "session_timeout_ms": args.session_ms,
        "heartbeat_interval_ms": 500,
    }


def run_kafka_python(args: argparse.Namespace, member: Member) -> None:
    import kafka
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka.errors import KafkaError

    emit("client", version=kafka.__version__)

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):  # noqa: ANN001, ANN202
            member.revoked(revoked)

        def on_partitions_assigned(self, assigned):  # noqa: ANN001, ANN202
            member.added(assigned)

    consumer = KafkaConsumer(**kafka_python_settings(args), max_poll_records=args.max_records)
    consumer.subscribe([args.topic], listener=Listener())
    # Work around a kafka-python 3.0.12 bug (still in its main branch). A leader whose first assignment ran
    # before it knew the topic's partitions rejoins when the metadata arrives; if that join outlives
    # poll()'s timeout, the join itself clears the metadata check, need_rejoin() turns False and the
    # finished join is never taken up: heartbeats stay off, the coordinator expires the member after its
    # session and it never rejoins. (Java's rejoinNeededOrPending() also counts a pending join.) Loading
    # the topic's metadata after subscribe() and before the first join takes that rejoin away.
    consumer.topics()
    while member.running:
        batches = consumer.poll(100)
        member.read([[tp.partition, r.offset] for tp, rs in batches.items() for r in rs])
        if member.uncommitted.records:
            with member.committing(KafkaError, error_name):
                consumer.commit()  # every assigned partition's position: all that was read
        member.assignment(consumer.assignment())
    emit("closing", t=time.monotonic_ns())
    consumer.close()
    emit("closed")


def run_confluent(args: argparse.Namespace, member: Member) -> None:
    import confluent_kafka
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    emit("client", version=confluent_kafka.__version__, librdkafka=confluent_kafka.libversion()[0])
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
    consumer.subscribe(
        [args.topic],
        on_assign=lambda _, partitions: member.added(partitions),
        on_revoke=lambda _, partitions: member.revoked(partitions),
        on_lost=lambda _, partitions: member.revoked(partitions, "lost"),
    )
    while member.running:
        messages = [m for m in consumer.consume(args.max_records, 0.1) if m.error() is None]
        member.read([[m.partition(), m.offset()] for m in messages])
        if member.uncommitted.records:
            offsets = [TopicPartition(args.topic, p, o) for p, o in member.uncommitted.next_offsets().items()]
            with member.committing(KafkaException, lambda exc: str(exc.args[0])):
                consumer.commit(offsets=offsets, asynchronous=False)  # exactly what was read
        member.assignment(consumer.assignment())
    emit("closing", t=time.monotonic_ns())
    consumer.close()
    emit("closed")


async def run_aiokafka(args: argparse.Namespace, member: Member) -> None:
    import aiokafka
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.errors import KafkaError

    emit("client", version=aiokafka.__version__)

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):  # noqa: ANN001, ANN202
            member.revoked(revoked)

        async def on_partitions_assigned(self, assigned):  # noqa: ANN001, ANN202
            member.added(assigned)

    consumer = AIOKafkaConsumer(**kafka_python_settings(args))  # its records per poll go to getmany
    consumer.subscribe([args.topic], listener=Listener())
    await consumer.start()
    try:
        while member.running:
            batches = await consumer.getmany(timeout_ms=100, max_records=args.max_records)
            member.read([[tp.partition, r.offset] for tp, rs in batches.items() for r in rs])
            if member.uncommitted.records:
                with member.committing(KafkaError, error_name):
                    await consumer.commit()  # every assigned partition's position: all that was read
            member.assignment(consumer.assignment())
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
    # The clients' own warnings (failed joins, coordinator changes) go to stderr, which a failing test shows.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    member = Member(args.stop_after)
    if args.client == "kafka-python":
        run_kafka_python(args, member)
    elif args.client == "confluent":
        run_confluent(args, member)
    else:
        asyncio.run(run_aiokafka(args, member))


if __name__ == "__main__":
    main()
