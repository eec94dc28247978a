"""The pipeline (compat/spark/pipeline.py) end to end against a Kafka bootstrap, with Spark's Kafka connector.

Each scenario takes the session, a bootstrap address, a scratch directory and ``name`` (topic names unique to
the run, so scenarios can share a broker). compat/spark runs them against each compat target (kbroker, Apache
Kafka, an external broker): the assertions are Kafka's and Spark's documented behaviour, so they hold on either.

Events are produced and results read with kafka-python (compat/spark/example.py), with explicit partitions so
that each partition's order, and so the watermark's course, is known.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from compat.spark import pipeline
from compat.spark.example import Event, create_topics, produce, read_topic

Names = Callable[[str], str]


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


def source_offsets(progress: dict[str, Any], which: str) -> Any:
    """The Kafka source's start or end offsets in a progress report (PySpark 4 gives them as JSON text)."""
    offsets = progress["sources"][0][which]
    return json.loads(offsets) if isinstance(offsets, str) else offsets


def wait_for_output(bootstrap: str, topic: str, count: int, query: StreamingQuery, timeout: float = 120) -> None:
    """Until ``topic`` holds ``count`` records (the running query's error, if it fails meanwhile)."""
    deadline = time.monotonic() + timeout
    while len(read_topic(bootstrap, topic)) < count:
        if query.exception() is not None or not query.isActive:
            query.awaitTermination(0)  # raises the query's error
            raise AssertionError("the query stopped")
        assert time.monotonic() < deadline, f"{topic} did not get {count} records in {timeout} s"
        time.sleep(0.2)


def run_until_caught_up(spark: SparkSession, job: pipeline.StreamJob) -> list[dict[str, Any]]:
    """Run the streaming job with trigger availableNow; its progress reports once it has stopped."""
    query = pipeline.start_stream(spark, job)
    try:
        query.awaitTermination(180)  # raises the query's error if it failed
        assert not query.isActive, "the availableNow query did not finish"
        return query.recentProgress
    finally:
        query.stop()


# Per partition, in order, within 10 s of each other: whatever micro-batches they fall in, none is late and,
# with 5 s windows and a 10 s watermark, no window is final (the watermark stays at 0).
EARLY: dict[int, list[Event]] = {
    0: [("a", 1000, 1), ("a", 4000, 2), ("b", 6000, 4)],
    1: [("b", 2000, 8), ("a", 6500, 16), ("b", 9000, 32)],
}
# The windows of EARLY, final once an event at 30 s has moved the watermark to 20 s.
EARLY_TOTALS = [
    total("a", 0, 2, 3.0, 5000),
    total("a", 5000, 1, 16.0, 5000),
    total("b", 0, 1, 8.0, 5000),
    total("b", 5000, 2, 36.0, 5000),
]
# After that: a at 17 s is older than the watermark, dropped (else a, [15 s, 20 s) would be written with 128);
# b at 21 s is not; a at 50 s moves the watermark to 40 s, so [20 s, 25 s) and [30 s, 35 s) are final.
LATE: dict[int, list[Event]] = {1: [("a", 17000, 128)], 0: [("b", 21000, 256), ("a", 50000, 512)]}
LATE_TOTALS = [total("a", 30000, 1, 64.0, 5000), total("b", 20000, 1, 256.0, 5000)]


def stream_job(bootstrap: str, scratch: Path, name: Names, **settings: Any) -> pipeline.StreamJob:
    events, out = name("events"), name("totals")
    create_topics(bootstrap, {events: 2, out: 1})
    return pipeline.StreamJob(
        bootstrap=bootstrap,
        input_topic=events,
        output_topic=out,
        checkpoint=str(scratch / "checkpoint"),
        window="5 seconds",
        watermark="10 seconds",
        **settings,
    )


def streaming_pipeline(spark: SparkSession, bootstrap: str, scratch: Path, name: Names) -> None:
    """The pipeline as it runs in production: one query, a micro-batch every 200 ms, events arriving meanwhile."""
    job = stream_job(bootstrap, scratch, name, trigger_interval="200 milliseconds")
    query = pipeline.start_stream(spark, job)
    try:
        for partition, events in EARLY.items():
            assert produce(bootstrap, job.input_topic, partition, events) == [0, 1, 2]
        query.processAllAvailable()
        assert totals(bootstrap, job.output_topic) == []

        produce(bootstrap, job.input_topic, 0, [("a", 30000, 64)])
        wait_for_output(bootstrap, job.output_topic, len(EARLY_TOTALS), query)
        assert totals(bootstrap, job.output_topic) == EARLY_TOTALS

        for partition, events in LATE.items():
            produce(bootstrap, job.input_topic, partition, events)
        wait_for_output(bootstrap, job.output_topic, len(EARLY_TOTALS) + len(LATE_TOTALS), query)
        query.processAllAvailable()
        assert totals(bootstrap, job.output_topic, after=len(EARLY_TOTALS)) == LATE_TOTALS
        progress = query.recentProgress
        assert sum(p["numInputRows"] for p in progress) == 10
        assert sum(op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"]) == 1
        assert source_offsets(query.lastProgress, "endOffset") == {job.input_topic: {"0": 6, "1": 4}}
    finally:
        query.stop()


def stream_restart_from_checkpoint(spark: SparkSession, bootstrap: str, scratch: Path, name: Names) -> None:
    """Three runs of the job on one checkpoint (trigger availableNow: each run stops by itself once it has
    caught up): each resumes at the offsets and with the window state the one before left, so the output
    holds every window exactly once."""
    job = stream_job(bootstrap, scratch, name, max_offsets_per_trigger=3, available_now=True)
    for partition, events in EARLY.items():
        assert produce(bootstrap, job.input_topic, partition, events) == [0, 1, 2]
    progress = run_until_caught_up(spark, job)
    read = [p["numInputRows"] for p in progress]
    assert sum(read) == 6 and max(read) <= 3 and len([n for n in read if n]) >= 2  # maxOffsetsPerTrigger
    assert source_offsets(progress[-1], "endOffset") == {job.input_topic: {"0": 3, "1": 3}}
    assert totals(bootstrap, job.output_topic) == []

    # The windows of the first run are written by the second, from the state the checkpoint kept.
    produce(bootstrap, job.input_topic, 0, [("a", 30000, 64)])
    progress = run_until_caught_up(spark, job)
    assert source_offsets(progress[0], "startOffset") == {job.input_topic: {"0": 3, "1": 3}}
    assert sum(p["numInputRows"] for p in progress) == 1
    assert totals(bootstrap, job.output_topic) == EARLY_TOTALS

    for partition, events in LATE.items():
        produce(bootstrap, job.input_topic, partition, events)
    progress = run_until_caught_up(spark, job)
    assert source_offsets(progress[0], "startOffset") == {job.input_topic: {"0": 4, "1": 3}}
    assert source_offsets(progress[-1], "endOffset") == {job.input_topic: {"0": 6, "1": 4}}
    assert sum(p["numInputRows"] for p in progress) == 3
    assert sum(op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"]) == 1
    assert totals(bootstrap, job.output_topic, after=len(EARLY_TOTALS)) == LATE_TOTALS
    assert len(read_topic(bootstrap, job.output_topic)) == len(EARLY_TOTALS) + len(LATE_TOTALS)

    # Nothing new: a run reads nothing and writes nothing.
    progress = run_until_caught_up(spark, job)
    assert sum(p["numInputRows"] for p in progress) == 0
    assert len(read_topic(bootstrap, job.output_topic)) == len(EARLY_TOTALS) + len(LATE_TOTALS)


BATCH_EVENTS: dict[int, list[Event]] = {
    0: [("a", 1000, 1), ("a", 2000, 2), ("b", 3000, 4), ("a", 11000, 8), ("b", 12000, 16)],
    1: [("b", 1500, 32), ("a", 4000, 64), ("a", 13000, 128), ("b", 14000, 256)],
}
BATCH_TOTALS = [
    total("a", 0, 2, 66.0, 10000),
    total("a", 10000, 2, 136.0, 10000),
    total("b", 0, 2, 36.0, 10000),
    total("b", 10000, 1, 256.0, 10000),
]


def batch_headers(partition: int, offset: int) -> list[tuple[str, bytes]]:
    """Headers of the batch events: none on every third record, else two, one name twice on partition 1."""
    if (partition + offset) % 3 == 0:
        return []
    if partition == 1:
        return [("trace", f"t{offset}".encode()), ("trace", b"")]
    return [("source", f"p{partition}-o{offset}".encode()), ("empty", b"")]


def batch_read_with_headers_and_batch_write(spark: SparkSession, bootstrap: str, name: Names) -> None:
    """An offset range read with its keys, headers and timestamps (partition 0 from offset 1 to 4, exclusive;
    partition 1 from its earliest to its latest offset), then its totals written with the Kafka sink."""
    orders, out = name("orders"), name("order-totals")
    create_topics(bootstrap, {orders: 2, out: 1})
    for partition, events in BATCH_EVENTS.items():
        headers = [batch_headers(partition, offset) for offset in range(len(events))]
        offsets = produce(bootstrap, orders, partition, events, keys=True, headers=headers, timestamps=True)
        assert offsets == list(range(len(events)))
    job = pipeline.BatchJob(
        bootstrap=bootstrap,
        input_topic=orders,
        output_topic=out,
        starting_offsets=pipeline.offsets_json(orders, {0: 1, 1: pipeline.EARLIEST}),
        ending_offsets=pipeline.offsets_json(orders, {0: 4, 1: pipeline.LATEST}),
        window="10 seconds",
        include_headers=True,
    )
    rows = (
        pipeline.read_batch(spark, job)
        .select(
            "topic",
            "partition",
            "offset",
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").alias("value"),
            "headers",
            F.unix_millis("timestamp").alias("timestamp"),
            "timestampType",
        )
        .collect()
    )
    read = sorted(
        (
            r["topic"],
            r["partition"],
            r["offset"],
            r["key"],
            json.loads(r["value"]),
            None if r["headers"] is None else [(h["key"], bytes(h["value"])) for h in r["headers"]],
            r["timestamp"],
            r["timestampType"],
        )
        for r in rows
    )
    expected = [(0, offset) for offset in (1, 2, 3)] + [(1, offset) for offset in range(4)]
    assert read == [
        (
            orders,
            partition,
            offset,
            BATCH_EVENTS[partition][offset][0],
            dict(zip(("key", "ts", "amount"), BATCH_EVENTS[partition][offset], strict=True)),
            batch_headers(partition, offset) or None,  # no headers: a null column, not an empty array
            BATCH_EVENTS[partition][offset][1],
            0,  # CreateTime
        )
        for partition, offset in expected
    ]

    assert pipeline.run_batch(spark, job) == 4
    assert totals(bootstrap, out) == BATCH_TOTALS


def batch_write_with_partitions_and_headers(spark: SparkSession, bootstrap: str, name: Names) -> None:
    """The Kafka sink's optional columns: partition, headers (repeated names, none, null), a null key."""
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
