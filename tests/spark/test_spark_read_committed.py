"""Spark's Kafka source with ``kafka.isolation.level=read_committed`` against kbroker: a batch query and a
streaming query (trigger availableNow) see only the records of committed transactions, in order, and stop at
the last stable offset while a transaction is open; read_uncommitted sees everything written.

The transactional data is written with confluent-kafka: commit 10, abort 10, commit 5, then 3 records in a
transaction left open while Spark reads.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from confluent_kafka import Producer  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from kbroker.testing import RunningBroker  # noqa: E402

TOPIC = "payments"
COMMITTED = [f"first {i}" for i in range(10)] + [f"last {i}" for i in range(5)]
ABORTED = [f"aborted {i}" for i in range(10)]
OPEN = [f"open {i}" for i in range(3)]


def transaction(producer: Producer, texts: list[str], commit: bool | None) -> None:
    """One transaction of ``texts`` on partition 0: committed, aborted, or (None) left open."""
    producer.begin_transaction()
    for text in texts:
        producer.produce(TOPIC, value=text.encode(), partition=0)
    assert producer.flush(30) == 0  # sent before an abort (librdkafka drops what it has not sent)
    if commit is True:
        producer.commit_transaction(30)
    elif commit is False:
        producer.abort_transaction(30)


@pytest.fixture
def transactional_topic(broker: RunningBroker) -> Iterator[str]:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "spark-data"})
    producer.init_transactions(30)
    transaction(producer, COMMITTED[:10], commit=True)
    transaction(producer, ABORTED, commit=False)
    transaction(producer, COMMITTED[10:], commit=True)
    transaction(producer, OPEN, commit=None)
    yield broker.bootstrap
    producer.abort_transaction(30)


def options(bootstrap: str, isolation: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": TOPIC,
        "startingOffsets": "earliest",
        "kafka.isolation.level": isolation,
    }


def test_batch_read_committed(kafka_spark: SparkSession, transactional_topic: str) -> None:
    def read(isolation: str) -> list[tuple[int, str]]:
        frame = (
            kafka_spark.read.format("kafka")
            .options(**options(transactional_topic, isolation))
            .option("endingOffsets", "latest")
            .load()
        )
        return [(row["offset"], bytes(row["value"]).decode()) for row in frame.orderBy("offset").collect()]

    # Offsets: 0-9 committed, marker 10, 11-20 aborted, marker 21, 22-26 committed, marker 27, 28-30 open.
    committed = list(zip([*range(10), *range(22, 27)], COMMITTED, strict=True))
    assert read("read_committed") == committed
    uncommitted = sorted(committed + list(zip(range(11, 21), ABORTED, strict=True)))
    assert read("read_uncommitted") == uncommitted + list(zip(range(28, 31), OPEN, strict=True))


def test_stream_read_committed(kafka_spark: SparkSession, transactional_topic: str) -> None:
    stream = kafka_spark.readStream.format("kafka").options(**options(transactional_topic, "read_committed")).load()
    query = (
        stream.selectExpr("offset", "CAST(value AS STRING) AS value")
        .writeStream.format("memory")
        .queryName("committed_payments")
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the availableNow query did not finish in 120 s"
        rows = kafka_spark.sql("SELECT offset, value FROM committed_payments ORDER BY offset").collect()
    finally:
        query.stop()
    assert [row["value"] for row in rows] == COMMITTED
    assert [row["offset"] for row in rows] == [*range(10), *range(22, 27)]
