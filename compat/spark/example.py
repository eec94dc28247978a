"""The Kafka side of the pipeline's example (the README's Spark section), with kafka-python: create topics, send
sample events, print a topic. The tests' scenarios (compat/spark/scenarios.py) use the same helpers.

    python compat/spark/example.py topics events:2 totals:1 batch-totals:1   # NAME:PARTITIONS, replication 1
    python compat/spark/example.py send events        # the sample events below, each to its partition
    python compat/spark/example.py show totals        # every record: partition, offset, key, value

``--bootstrap`` (default 127.0.0.1:9092) names the broker.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

Event = tuple[str, int, float]  # key, ts (epoch ms), amount
Header = tuple[str, bytes]


def at(clock: str) -> int:
    """Epoch milliseconds of an HH:MM:SS on 2024-05-01, UTC."""
    moment = datetime.strptime(f"2024-05-01 {clock}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


# Per partition, in order. With 1-minute windows and a 30 s watermark, store-1 at 12:02:45 moves the watermark
# to 12:02:15, so the windows [12:00, 12:01) and [12:01, 12:02) are final and written; [12:02, 12:03) is not.
SAMPLE_EVENTS: dict[int, list[Event]] = {
    0: [
        ("store-1", at("12:00:05"), 10.0),
        ("store-2", at("12:00:20"), 5.0),
        ("store-1", at("12:00:50"), 2.5),
        ("store-1", at("12:01:10"), 4.0),
        ("store-2", at("12:02:00"), 1.0),
    ],
    1: [
        ("store-2", at("12:00:40"), 7.0),
        ("store-1", at("12:01:30"), 3.0),
        ("store-1", at("12:02:45"), 6.0),
    ],
}


def create_topics(bootstrap: str, partitions: dict[str, int], exist_ok: bool = False) -> None:
    """Each topic with its number of partitions (replication factor 1)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        for name, count in partitions.items():
            try:
                admin.create_topics([NewTopic(name, count, 1)])
            except TopicAlreadyExistsError:
                if not exist_ok:
                    raise
    finally:
        admin.close()


def event_value(event: Event) -> bytes:
    key, ts, amount = event
    return json.dumps({"key": key, "ts": ts, "amount": amount}).encode()


def produce(
    bootstrap: str,
    topic: str,
    partition: int,
    events: list[Event],
    *,
    keys: bool = False,
    headers: list[list[Header]] | None = None,
    timestamps: bool = False,
) -> list[int]:
    """Send the events, in order, to one partition (with the event's key as the record key, each record's
    headers, the event time as the record's timestamp if asked); their offsets."""
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        futures = [
            producer.send(
                topic,
                event_value(event),
                key=event[0].encode() if keys else None,
                partition=partition,
                headers=headers[i] if headers else None,
                timestamp_ms=event[1] if timestamps else None,
            )
            for i, event in enumerate(events)
        ]
        producer.flush()
        return [future.get(timeout=30).offset for future in futures]
    finally:
        producer.close()


def read_topic(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every record of ``topic`` (up to the end offsets of now), in partition and offset order."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        if not partitions:
            raise LookupError(f"no partitions for topic {topic}")
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        records = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < end[tp] for tp in partitions) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        if any(consumer.position(tp) < end[tp] for tp in partitions):
            raise TimeoutError(f"could not read topic {topic} to its end offsets {end}")
    finally:
        consumer.close()
    return [
        {
            "partition": r.partition,
            "offset": r.offset,
            "key": None if r.key is None else r.key.decode(),
            "value": r.value.decode(),
            "headers": [(name, value.decode()) for name, value in r.headers],
        }
        for r in sorted(records, key=lambda r: (r.partition, r.offset))
        if r.offset < end[TopicPartition(topic, r.partition)]
    ]


def name_and_partitions(text: str) -> tuple[str, int]:
    name, sep, count = text.rpartition(":")
    if not sep or not name or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME:PARTITIONS, got {text!r}")
    return name, int(count)


def main(argv: Sequence[str] | None = None) -> int:
    top = argparse.ArgumentParser(prog="example.py", description=__doc__.split("\n\n")[0])
    top.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    commands = top.add_subparsers(dest="command", required=True)
    topics = commands.add_parser("topics", help="create topics (an existing one is left as it is)")
    topics.add_argument("topics", nargs="+", type=name_and_partitions, metavar="NAME:PARTITIONS")
    commands.add_parser("send", help="send the sample events").add_argument("topic")
    commands.add_parser("show", help="print every record of a topic").add_argument("topic")
    args = top.parse_args(argv)

    if args.command == "topics":
        create_topics(args.bootstrap, dict(args.topics), exist_ok=True)
        print(f"topics: {', '.join(f'{name} ({count} partitions)' for name, count in args.topics)}")
    elif args.command == "send":
        for partition, events in SAMPLE_EVENTS.items():
            offsets = produce(args.bootstrap, args.topic, partition, events)
            print(f"{args.topic} partition {partition}: offsets {offsets[0]}-{offsets[-1]}")
    else:
        for record in read_topic(args.bootstrap, args.topic):
            print(record["partition"], record["offset"], record["key"], record["value"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
