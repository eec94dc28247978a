"""kcat (the Debian package, librdkafka inside) against a live broker: metadata, produce, consume, offsets."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from kbroker.testing import RunningBroker

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat is not installed (apt-get install -y kcat; .ci/run does)")


def kcat(broker: RunningBroker, *args: str, stdin: str | None = None) -> str:
    assert KCAT is not None
    result = subprocess.run(
        [KCAT, "-b", broker.bootstrap, *args], input=stdin, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_keys_and_headers_then_consume_from_the_beginning(broker: RunningBroker, codec: str) -> None:
    lines = "".join(f"key{i}:value {i}\n" for i in range(25))
    kcat(broker, "-P", "-t", "lines", "-K:", "-H", "origin=kcat", "-z", codec, stdin=lines)  # auto-creates the topic
    out = kcat(broker, "-C", "-t", "lines", "-o", "beginning", "-e", "-J")
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert [(r["offset"], r["key"], r["payload"]) for r in records] == [(i, f"key{i}", f"value {i}") for i in range(25)]
    assert all(r["headers"] == ["origin", "kcat"] for r in records)


def test_metadata_listing_shows_topic_and_broker(broker: RunningBroker) -> None:
    kcat(broker, "-P", "-t", "listed", stdin="x\n")
    metadata = json.loads(kcat(broker, "-L", "-J"))
    assert [b["name"] for b in metadata["brokers"]] == [broker.bootstrap]
    topic = next(t for t in metadata["topics"] if t["topic"] == "listed")
    assert [(p["partition"], p["leader"]) for p in topic["partitions"]] == [(0, 0)]


def test_offsets_from_the_end_and_by_timestamp(broker: RunningBroker) -> None:
    kcat(broker, "-P", "-t", "timed", stdin="".join(f"{i}\n" for i in range(3)))
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    kcat(broker, "-P", "-t", "timed", stdin="".join(f"{i}\n" for i in range(3, 6)))
    # The last two messages, counted back from the end.
    assert kcat(broker, "-C", "-t", "timed", "-o", "-2", "-e", "-f", "%o:%s\n").splitlines() == ["4:4", "5:5"]
    # From a timestamp: the first message at or after it (ListOffsets by timestamp).
    assert kcat(broker, "-C", "-t", "timed", "-o", f"s@{middle}", "-e", "-f", "%o:%s\n").splitlines() == [
        "3:3",
        "4:4",
        "5:5",
    ]
    assert "offset 3" in kcat(broker, "-Q", "-t", f"timed:0:{middle}")
