"""The README's Spark commands, as a user runs them, against a fresh kbroker: compat/spark/example.py creates the
topics, sends the sample events and prints the output; compat/spark/pipeline.py runs the stream (twice on one
checkpoint, each run a new Spark process) and the batch, with the connector from the repository's Maven set.

The pipeline's scenarios against each broker, Apache Kafka included, are compat/spark's
(``python -m pytest compat/spark --target kbroker,kafka``); they share one SparkSession, these commands start
their own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from compat.spark import example, pipeline  # noqa: E402
from kbroker.testing import RunningBroker  # noqa: E402

PIPELINE = str(Path(pipeline.__file__).resolve())
EXAMPLE = str(Path(example.__file__).resolve())
MINUTE = 60_000


def run(*command: str) -> str:
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-5000:]}"
    return done.stdout


def shown(bootstrap: str, topic: str) -> list[tuple[int, int, str, dict[str, Any]]]:
    """``example.py show``'s lines: partition, offset, key, value (JSON)."""
    lines = run(EXAMPLE, "--bootstrap", bootstrap, "show", topic).splitlines()
    records = []
    for line in lines:
        partition, offset, key, value = line.split(" ", 3)
        records.append((int(partition), int(offset), key, json.loads(value)))
    return records


def window(key: str, clock: str, count: int, amount: float) -> dict[str, Any]:
    start = example.at(clock)
    return {"key": key, "window_start": start, "window_end": start + MINUTE, "count": count, "total": amount}


def windows(records: list[tuple[int, int, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    assert all(key == value["key"] for _, _, key, value in records)
    return sorted((value for _, _, _, value in records), key=lambda v: (v["window_start"], v["key"]))


def test_readme_commands_on_a_fresh_broker(broker: RunningBroker, tmp_path: Path) -> None:
    bootstrap = broker.bootstrap
    checkpoint = str(tmp_path / "checkpoint")
    stream = [PIPELINE, "stream", "--bootstrap", bootstrap, "--input", "events", "--output", "totals"]
    stream += ["--checkpoint", checkpoint, "--window", "1 minute", "--watermark", "30 seconds", "--available-now"]

    run(EXAMPLE, "--bootstrap", bootstrap, "topics", "events:2", "totals:1", "batch-totals:1")
    assert run(EXAMPLE, "--bootstrap", bootstrap, "send", "events").splitlines() == [
        "events partition 0: offsets 0-4",
        "events partition 1: offsets 0-2",
    ]
    run(*stream)
    # The watermark is at 12:02:15: the windows of 12:00 and 12:01 are final, 12:02's is not.
    first = shown(bootstrap, "totals")
    assert [(partition, offset) for partition, offset, _, _ in first] == [(0, 0), (0, 1), (0, 2)]
    assert windows(first) == [
        window("store-1", "12:00:00", 2, 12.5),
        window("store-2", "12:00:00", 2, 12.0),
        window("store-1", "12:01:00", 2, 7.0),
    ]

    # partition 0 from offset 0 up to 3 (exclusive), all of partition 1
    batch = [PIPELINE, "batch", "--bootstrap", bootstrap, "--input", "events", "--output", "batch-totals"]
    batch += ["--window", "1 minute", "--starting-offsets", '{"events":{"0":0,"1":-2}}']
    batch += ["--ending-offsets", '{"events":{"0":3,"1":-1}}']
    assert json.loads(run(*batch).splitlines()[-1]) == {"written": 4, "topic": "batch-totals"}
    assert windows(shown(bootstrap, "batch-totals")) == [
        window("store-1", "12:00:00", 2, 12.5),
        window("store-2", "12:00:00", 2, 12.0),
        window("store-1", "12:01:00", 1, 3.0),
        window("store-1", "12:02:00", 1, 6.0),
    ]

    # The stream again, in a new process: it resumes at the checkpoint's offsets with its window state (the
    # 12:02 window holds events of the first run), and writes none of the first run's windows again.
    assert example.produce(bootstrap, "events", 1, [("store-2", example.at("12:03:40"), 2.0)]) == [3]
    run(*stream)
    again = shown(bootstrap, "totals")
    assert again[:3] == first
    assert [(partition, offset) for partition, offset, _, _ in again[3:]] == [(0, 3), (0, 4)]
    assert windows(again[3:]) == [window("store-1", "12:02:00", 1, 6.0), window("store-2", "12:02:00", 1, 1.0)]
