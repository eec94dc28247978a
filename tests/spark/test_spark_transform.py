"""The pipeline's transformation (compat/spark/pipeline.py) in a real local Spark, without Kafka.

Batch: DataFrames made here. Streaming: JSON lines files read by Spark's file source (a ``value`` column,
like the Kafka source's), one file per micro-batch, with trigger availableNow, so watermark and late-event
handling run exactly as they do on Kafka input.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from compat.spark import pipeline

Event = dict[str, Any]


def values(spark: SparkSession, texts: list[str], binary: bool = False) -> DataFrame:
    if binary:
        return spark.createDataFrame([(bytearray(t.encode()),) for t in texts], "value binary")
    return spark.createDataFrame([(t,) for t in texts], "value string")


def events(spark: SparkSession, rows: list[tuple[str, int, float]]) -> DataFrame:
    """Kafka-like records of {"key", "ts" (epoch ms), "amount"}."""
    return values(spark, [json.dumps({"key": k, "ts": ts, "amount": amount}) for k, ts, amount in rows])


def totals(frame: DataFrame) -> list[tuple[str, int, int, int, float]]:
    return sorted((r["key"], r["window_start"], r["window_end"], r["count"], r["total"]) for r in frame.collect())


GOOD = [
    ('{"key": "a", "ts": 1000, "amount": 1.5}', ("a", 1000, 1.5)),
    ('{"key": "a", "ts": "2500", "amount": 2}', ("a", 2500, 2.0)),
    ('{"key": "a", "ts": " 6000 ", "amount": 1e3}', ("a", 6000, 1000.0)),
    ('{"key": "b", "ts": "1970-01-01T00:00:03Z", "amount": -4}', ("b", 3000, -4.0)),
    ('{"key": "b", "ts": "1970-01-01T02:00:04.250+02:00", "amount": 0.25}', ("b", 4250, 0.25)),
    ('{"key": "c", "ts": "1970-01-01T00:00:05", "amount": 8}', ("c", 5000, 8.0)),  # no zone: UTC
    ('{"key": "c", "ts": "1970-01-01 00:00:05.5", "amount": 8}', ("c", 5500, 8.0)),
    ('{"key": "d", "ts": 1714564803250, "amount": 1, "extra": [1]}', ("d", 1714564803250, 1.0)),
    ('{"key": "d", "ts": -1000, "amount": 1}', ("d", -1000, 1.0)),
    ('{"key": "é ü", "ts": 0, "amount": 0}', ("é ü", 0, 0.0)),
]
BAD = [
    "not json",
    "",
    "[1, 2]",
    '{"key": "x", "ts": 1000}',  # no amount
    '{"ts": 1000, "amount": 1}',  # no key
    '{"key": null, "ts": 1000, "amount": 1}',
    '{"key": "x", "ts": null, "amount": 1}',
    '{"key": "x", "ts": "yesterday", "amount": 1}',
    '{"key": "x", "ts": "2024-13-45T00:00:00Z", "amount": 1}',
    '{"key": "x", "ts": 10000000000000000, "amount": 1}',  # 17 digits: would overflow, dropped instead
    '{"key": "x", "ts": 1000.5, "amount": 1}',
    '{"key": "x", "ts": 1000, "amount": "1"}',  # amount must be a JSON number
    '{"key": "x", "ts": 1000, "amount": NaN}',
]


@pytest.mark.parametrize("binary", [False, True], ids=["string", "binary"])
def test_parse_events_keeps_the_documented_forms_and_drops_the_rest(spark: SparkSession, binary: bool) -> None:
    texts = [t for t, _ in GOOD] + BAD
    parsed = pipeline.parse_events(values(spark, texts, binary))
    assert parsed.columns == ["key", "event_time", "amount"]
    rows = parsed.select("key", F.unix_millis("event_time").alias("ms"), "amount").collect()
    assert sorted((r["key"], r["ms"], r["amount"]) for r in rows) == sorted(expected for _, expected in GOOD)


def test_tumbling_windows_count_and_sum_per_key(spark: SparkSession) -> None:
    frame = events(
        spark,
        [("a", 1000, 1), ("a", 9999, 2), ("a", 10000, 4), ("b", 500, 8), ("b", 25000, 16), ("a", -1, 32)],
    )
    result = pipeline.windowed_totals(pipeline.parse_events(frame), "10 seconds", "1 minute")
    assert result.columns == ["key", "window_start", "window_end", "count", "total"]
    assert totals(result) == [
        ("a", -10000, 0, 1, 32.0),
        ("a", 0, 10000, 2, 3.0),  # the end is exclusive: 10000 opens the next window
        ("a", 10000, 20000, 1, 4.0),
        ("b", 0, 10000, 1, 8.0),
        ("b", 20000, 30000, 1, 16.0),
    ]


def test_sliding_windows_put_an_event_in_every_window_that_covers_it(spark: SparkSession) -> None:
    frame = events(spark, [("a", 1000, 1), ("a", 7000, 2), ("a", 12000, 4)])
    result = pipeline.windowed_totals(pipeline.parse_events(frame), "10 seconds", "1 minute", slide="5 seconds")
    assert totals(result) == [
        ("a", -5000, 5000, 1, 1.0),
        ("a", 0, 10000, 2, 3.0),
        ("a", 5000, 15000, 2, 6.0),
        ("a", 10000, 20000, 1, 4.0),
    ]


def test_output_records_are_keyed_json(spark: SparkSession) -> None:
    frame = values(
        spark,
        [
            '{"key": "a", "ts": 1000, "amount": 1.5}',
            '{"key": "a", "ts": "1970-01-01T00:00:02Z", "amount": 2}',
            '{"key": "é", "ts": 60000, "amount": 3}',
        ],
    )
    out = pipeline.transform(frame, "1 minute", "10 seconds")
    assert out.columns == ["key", "value"]
    assert [(f.name, f.dataType.simpleString()) for f in out.schema.fields] == [("key", "string"), ("value", "string")]
    assert sorted((r["key"], r["value"]) for r in out.collect()) == [
        ("a", '{"key":"a","window_start":0,"window_end":60000,"count":2,"total":3.5}'),
        ("é", '{"key":"é","window_start":60000,"window_end":120000,"count":1,"total":3.0}'),
    ]


# ------------------------------------------------------------------------------------------ streaming


class FileStream:
    """JSON lines files as a stream: each file one micro-batch, in the order written."""

    def __init__(self, root: Path) -> None:
        self.input = root / "input"
        self.input.mkdir()
        self.checkpoint = root / "checkpoint"
        self.files = 0
        self.mtime = time.time() - 1000  # the file source orders files by modification time

    def add(self, rows: list[tuple[str, int, float]]) -> None:
        path = self.input / f"part-{self.files:03}.json"
        path.write_text("".join(json.dumps({"key": k, "ts": ts, "amount": a}) + "\n" for k, ts, a in rows))
        os.utime(path, (self.mtime + self.files, self.mtime + self.files))
        self.files += 1

    def run(
        self, spark: SparkSession, output_mode: str, window: str = "10 seconds", watermark: str = "5 seconds"
    ) -> tuple[list[tuple[int, list[Event]]], list[dict[str, Any]]]:
        """Process every new file (trigger availableNow); the rows each micro-batch wrote, and the progress."""
        written: list[tuple[int, list[Event]]] = []

        def collect(batch: DataFrame, batch_id: int) -> None:
            rows = [json.loads(r["value"]) for r in batch.collect()]
            written.append((batch_id, sorted(rows, key=lambda e: (e["key"], e["window_start"]))))

        source = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(self.input))
        query = (
            pipeline.transform(source, window, watermark)
            .writeStream.foreachBatch(collect)
            .outputMode(output_mode)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
            assert not query.isActive, "the availableNow query did not finish"
            assert query.exception() is None
            return written, query.recentProgress
        finally:
            query.stop()


def emitted(written: list[tuple[int, list[Event]]]) -> list[Event]:
    return [row for _, rows in written for row in rows]


def row(key: str, start: int, count: int, total: float, length: int = 10000) -> Event:
    return {"key": key, "window_start": start, "window_end": start + length, "count": count, "total": total}


def test_append_mode_writes_each_window_once_and_drops_late_events(spark: SparkSession, tmp_path: Path) -> None:
    stream = FileStream(tmp_path)
    stream.add([("a", 1000, 1), ("b", 2000, 2)])
    stream.add([("a", 4000, 4), ("a", 12000, 8)])
    stream.add([("b", 26000, 16)])  # the watermark moves to 26000 - 5000: windows ending by then are final
    written, progress = stream.run(spark, "append")
    assert emitted(written) == [row("a", 0, 2, 5.0), row("a", 10000, 1, 8.0), row("b", 0, 1, 2.0)]
    assert sum(p["numInputRows"] for p in progress) == 5
    assert progress[-1]["eventTime"]["watermark"] == "1970-01-01T00:00:21.000Z"

    # A restart from the checkpoint keeps the watermark: events older than 21 s are late and dropped,
    # even for windows never seen (a, [10 s, 20 s) would otherwise be written again with 128).
    stream.add([("a", 3000, 32), ("b", 22000, 64)])
    stream.add([("a", 19000, 128)])
    stream.add([("a", 40000, 256)])  # watermark 35 s: [20 s, 30 s) is final; [40 s, 50 s) stays open
    written, progress = stream.run(spark, "append")
    assert emitted(written) == [row("b", 20000, 2, 80.0)]
    assert sum(p["numInputRows"] for p in progress) == 4
    assert sum(op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"]) == 2
    assert progress[-1]["eventTime"]["watermark"] == "1970-01-01T00:00:35.000Z"


def test_update_mode_writes_running_totals_after_each_micro_batch(spark: SparkSession, tmp_path: Path) -> None:
    stream = FileStream(tmp_path)
    stream.add([("a", 1000, 1), ("a", 2000, 2)])
    stream.add([("a", 3000, 4), ("b", 4000, 8)])
    stream.add([("a", 30000, 16)])  # the next micro-batch runs with watermark 25 s
    stream.add([("b", 31000, 32)])
    # Late: a micro-batch drops events older than the watermark the micro-batch before it ran with (Spark
    # keeps one watermark for late events and a newer one for eviction), so the late event comes 2 batches on.
    stream.add([("a", 5000, 64)])
    written, progress = stream.run(spark, "update")
    assert [rows for _, rows in written if rows] == [
        [row("a", 0, 2, 3.0)],
        [row("a", 0, 3, 7.0), row("b", 0, 1, 8.0)],
        [row("a", 30000, 1, 16.0)],
        [row("b", 30000, 1, 32.0)],
    ]
    assert [op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"]][:5] == [0, 0, 0, 0, 1]
