"""The pipeline (compat/spark/pipeline.py) end to end against a Kafka bootstrap, with Spark's Kafka connector.

Each scenario takes the session, a bootstrap address, a scratch directory and ``name`` (topic names unique to
the run, so scenarios can share a broker). tests/spark runs them against a fresh kbroker per test,
compat/spark against each compat target (kbroker, Apache Kafka, an external broker): the assertions are
Kafka's and Spark's documented behaviour, so they hold on either.

Events are produced and results read with kafka-python, with explicit partitions so that each partition's
order, and so the watermark's course, is known.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from compat.spark import pipeline

PIPELINE = Path(pipeline.__file__).resolve()
Event = tuple[str, int, float]  # key, ts (epoch ms), amount
Names = Callable[[str], str]


def create_topics(bootstrap: str, partitions: dict[str, int]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, count, 1) for name, count in partitions.items()])
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, partition: int, events: list[Event]) -> list[int]:
    """Send the events, in order, to one partition; their offsets."""
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        futures = [
            producer.send(topic, json.dumps({"key": k, "ts": ts, "amount": a}).encode(), partition=partition)
            for k, ts, a in events
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
        assert partitions, f"no partitions for {topic}"
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        records = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < end[tp] for tp in partitions) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        assert all(consumer.position(tp) == end[tp] for tp in partitions), "could not read the whole topic"
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
    ]


def totals(bootstrap: str, topic: str, after: int = 0) -> list[dict[str, Any]]:
    """The pipeline's output records from offset ``after`` on (the output topics have one partition)."""
    out = []
    for record in read_topic(bootstrap, topic)[after:]:
        value = json.loads(record["value"])
        assert record["key"] == value["key"] and record["headers"] == []
        out.append(value)
    return sorted(out, key=lambda v: (v["key"], v["window_start"]))


def total(key: str, start: int, count: int, amount: float, length: int) -> dict[str, Any]:
    return {"key": key, "window_start": start, "window_end": start + length, "count": count, "total": amount}


def end_offsets(progress: dict[str, Any]) -> Any:
    """The Kafka source's end offsets in a progress report (PySpark 4 gives them as JSON text)."""
    offsets = progress["sources"][0]["endOffset"]
    return json.loads(offsets) if isinstance(offsets, str) else offsets


def run_until_caught_up(spark: SparkSession, job: pipeline.StreamJob) -> list[dict[str, Any]]:
    """Run the streaming job with trigger availableNow; its progress reports once it has stopped."""
    query = pipeline.start_stream(spark, job)
    try:
        query.awaitTermination(180)  # raises the query's error if it failed
        assert not query.isActive, "the availableNow query did not finish"
        return query.recentProgress
    finally:
        query.stop()


def streaming_pipeline(spark: SparkSession, bootstrap: str, scratch: Path, name: Names) -> None:
    events, out = name("events"), name("totals")
    create_topics(bootstrap, {events: 2, out: 1})
    job = pipeline.StreamJob(
        bootstrap=bootstrap,
        input_topic=events,
        output_topic=out,
        checkpoint=str(scratch / "checkpoint"),
        window="5 seconds",
        watermark="10 seconds",
        max_offsets_per_trigger=3,
        available_now=True,
    )

    # Within 10 s of each other: whatever order the micro-batches take them in, none is late, and no
    # window is final yet (the watermark stays at 0).
    assert produce(bootstrap, events, 0, [("a", 1000, 1), ("a", 4000, 2), ("b", 6000, 4)]) == [0, 1, 2]
    assert produce(bootstrap, events, 1, [("b", 2000, 8), ("a", 6500, 16), ("b", 9000, 32)]) == [0, 1, 2]
    progress = run_until_caught_up(spark, job)
    read = [p["numInputRows"] for p in progress]
    assert sum(read) == 6 and max(read) <= 3 and len([n for n in read if n]) >= 2  # maxOffsetsPerTrigger
    assert end_offsets(progress[-1]) == {events: {"0": 3, "1": 3}}
    assert totals(bootstrap, out) == []

    # A restart resumes at the checkpointed offsets; an event at 30 s moves the watermark to 20 s and
    # makes every window so far final.
    produce(bootstrap, events, 0, [("a", 30000, 64)])
    progress = run_until_caught_up(spark, job)
    assert sum(p["numInputRows"] for p in progress) == 1
    assert totals(bootstrap, out) == [
        total("a", 0, 2, 3.0, 5000),
        total("a", 5000, 1, 16.0, 5000),
        total("b", 0, 1, 8.0, 5000),
        total("b", 5000, 2, 36.0, 5000),
    ]

    # a at 17 s is older than the watermark: dropped (else a, [15 s, 20 s) would be written with 128);
    # b at 21 s is not. a at 50 s moves the watermark to 40 s.
    produce(bootstrap, events, 1, [("a", 17000, 128)])
    produce(bootstrap, events, 0, [("b", 21000, 256), ("a", 50000, 512)])
    progress = run_until_caught_up(spark, job)
    assert sum(p["numInputRows"] for p in progress) == 3
    assert sum(op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"]) == 1
    assert totals(bootstrap, out, after=4) == [total("a", 30000, 1, 64.0, 5000), total("b", 20000, 1, 256.0, 5000)]


BATCH_EVENTS = {
    0: [("a", 1000, 1), ("a", 2000, 2), ("b", 3000, 4), ("a", 11000, 8), ("b", 12000, 16)],
    1: [("b", 1500, 32), ("a", 4000, 64), ("a", 13000, 128), ("b", 14000, 256)],
}
BATCH_TOTALS = [
    total("a", 0, 2, 66.0, 10000),
    total("a", 10000, 2, 136.0, 10000),
    total("b", 0, 2, 36.0, 10000),
    total("b", 10000, 1, 256.0, 10000),
]


def produce_orders(bootstrap: str, name: Names) -> tuple[str, str, str, str]:
    """The orders topic and an empty output topic; the offset range to read: partition 0 from offset 1 to 4
    (exclusive), partition 1 from its earliest to its latest offset."""
    orders, out = name("orders"), name("order-totals")
    create_topics(bootstrap, {orders: 2, out: 1})
    for partition, events in BATCH_EVENTS.items():
        assert produce(bootstrap, orders, partition, events) == list(range(len(events)))
    starting = pipeline.offsets_json(orders, {0: 1, 1: pipeline.EARLIEST})
    ending = pipeline.offsets_json(orders, {0: 4, 1: pipeline.LATEST})
    return orders, out, starting, ending


def batch_read_of_an_offset_range_and_batch_write(spark: SparkSession, bootstrap: str, name: Names) -> None:
    orders, out, starting, ending = produce_orders(bootstrap, name)
    job = pipeline.BatchJob(
        bootstrap=bootstrap,
        input_topic=orders,
        output_topic=out,
        starting_offsets=starting,
        ending_offsets=ending,
        window="10 seconds",
    )
    records = pipeline.read_batch(spark, job)
    rows = records.select("topic", "partition", "offset", F.col("value").cast("string").alias("value")).collect()
    expected = [(0, offset) for offset in (1, 2, 3)] + [(1, offset) for offset in range(4)]
    assert sorted((r["topic"], r["partition"], r["offset"]) for r in rows) == [(orders, p, o) for p, o in expected]
    by_offset = {(r["partition"], r["offset"]): json.loads(r["value"]) for r in rows}
    for partition, offset in expected:
        key, ts, amount = BATCH_EVENTS[partition][offset]
        assert by_offset[(partition, offset)] == {"key": key, "ts": ts, "amount": amount}

    assert pipeline.run_batch(spark, job) == 4
    assert totals(bootstrap, out) == BATCH_TOTALS


def batch_write_with_partitions_and_headers(spark: SparkSession, bootstrap: str, name: Names) -> None:
    topic = name("written")
    create_topics(bootstrap, {topic: 3})
    rows = [
        ("k0", "v0", 2, [("h", bytearray(b"x")), ("h", bytearray(b"y"))]),
        (None, "v1", 0, None),
        ("k2", "v2", 2, []),
        ("k3", "v3", 1, [("only", bytearray(b"z"))]),
    ]
    frame = spark.createDataFrame(
        rows, "key string, value string, partition int, headers array<struct<key: string, value: binary>>"
    )
    pipeline.write_batch(frame.coalesce(1), bootstrap, topic)  # one task: the rows go out in order
    assert read_topic(bootstrap, topic) == [
        {"partition": 0, "offset": 0, "key": None, "value": "v1", "headers": []},
        {"partition": 1, "offset": 0, "key": "k3", "value": "v3", "headers": [("only", "z")]},
        {"partition": 2, "offset": 0, "key": "k0", "value": "v0", "headers": [("h", "x"), ("h", "y")]},
        {"partition": 2, "offset": 1, "key": "k2", "value": "v2", "headers": []},
    ]


def batch_command_line(bootstrap: str, name: Names) -> None:
    """The documented command, in a Spark of its own (the connector as the tests' session found it)."""
    orders, out, starting, ending = produce_orders(bootstrap, name)
    command = [sys.executable, str(PIPELINE), "batch", "--master", "local[1]", "--bootstrap", bootstrap]
    command += ["--input", orders, "--output", out, "--window", "10 seconds"]
    command += ["--starting-offsets", starting, "--ending-offsets", ending, "--conf", "spark.ui.enabled=false"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert run.returncode == 0, run.stderr[-5000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"written": 4, "topic": out}
    assert totals(bootstrap, out) == BATCH_TOTALS
