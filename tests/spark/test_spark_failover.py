"""Spark's Kafka source reads a replicated topic of a kbroker cluster through a leader failover (issue #29).

A 3-broker cluster (the plugin's ``kbroker_cluster``: Apache Kafka's KRaft controller, kbroker brokers), a topic
of 3 partitions with replication factor 3 and min.insync.replicas=2, records written with acks=all by an
idempotent producer. A streaming query (file sink, checkpoint) runs while the leader of partition 0 is killed
(SIGKILL) and records are written to the new leader; a batch query reads the topic while that broker is down; the
broker is restarted, more records are written, and the streaming query is started again from its checkpoint.
Spark must return exactly the acknowledged records: every key, value and offset of every partition, none lost,
none twice. Safety only: every wait is a generous bound, never a measure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql.streaming import StreamingQuery  # noqa: E402

from kbroker.pytest_plugin import KbrokerCluster  # noqa: E402

TOPIC = "spark-failover"
PARTITIONS = 3
PER_PARTITION = 25  # records per partition in each phase
WITHIN = 180.0  # seconds: a bound against hanging on 2 busy cores, not a measure
# (partition, offset, key, value): what a Kafka source row says of a record
Row = tuple[int, int, str, str]
# Spark's driver asks the brokers for offsets and gives up after fetchOffset.numRetries failures: while a leader
# is being elected every try can fail, so the source retries for as long as the other waits allow.
SOURCE_OPTIONS = {"subscribe": TOPIC, "startingOffsets": "earliest", "fetchOffset.numRetries": "60"}


def wait_for(what: str, found: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WITHIN
    while not (answer := found()):
        assert time.monotonic() < deadline, f"no {what} within {WITHIN:g} s"
        time.sleep(0.5)
    return answer


def partition_state(admin: AdminClient, partition: int) -> Any:
    """The partition as Metadata describes it (leader, replicas, isrs), or None while the topic is unknown."""
    described = admin.list_topics(TOPIC, timeout=10).topics.get(TOPIC)
    if described is None or described.error is not None or partition not in described.partitions:
        return None
    return described.partitions[partition]


def produce(producer: Producer, phase: str, acknowledged: list[Row]) -> None:
    """PER_PARTITION records to each partition, acks=all; each acknowledged one is added to ``acknowledged``."""
    failed: list[Any] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failed.append(error)
        else:
            acknowledged.append(
                (message.partition(), message.offset(), message.key().decode(), message.value().decode())
            )

    for partition in range(PARTITIONS):
        for n in range(PER_PARTITION):
            key, value = f"{phase}-{partition}-{n}", f"{phase} record {n} of partition {partition}"
            producer.produce(TOPIC, key=key, value=value, partition=partition, on_delivery=delivered)
    assert producer.flush(WITHIN) == 0
    assert failed == []


def kafka_rows(records: DataFrame) -> DataFrame:
    return records.selectExpr("partition", "offset", "CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")


def collected(frame: DataFrame) -> list[Row]:
    return sorted((row.partition, row.offset, row.key, row.value) for row in frame.collect())


def batch_read(spark: SparkSession, bootstrap: str) -> list[Row]:
    reader = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    return collected(kafka_rows(reader.options(**SOURCE_OPTIONS, endingOffsets="latest").load()))


def start_stream(spark: SparkSession, bootstrap: str, output: Path, checkpoint: Path) -> StreamingQuery:
    reader = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).options(**SOURCE_OPTIONS)
    writer = kafka_rows(reader.load()).writeStream.format("parquet").option("path", str(output))
    return writer.option("checkpointLocation", str(checkpoint)).trigger(processingTime="1 second").start()


def stream_output(spark: SparkSession, output: Path) -> list[Row]:
    """What the file sink has committed (its _spark_metadata log names the files of committed batches only)."""
    if not (output / "_spark_metadata").is_dir() or not any((output / "_spark_metadata").iterdir()):
        return []
    return collected(spark.read.parquet(str(output)))


def wait_for_stream(spark: SparkSession, query: StreamingQuery, output: Path, count: int) -> list[Row]:
    def done() -> list[Row] | None:
        if query.exception() is not None:
            raise AssertionError(f"the streaming query failed: {query.exception()}")
        rows = stream_output(spark, output)
        assert len(rows) <= count, f"the stream wrote {len(rows)} rows, more than the {count} records written"
        return rows if len(rows) == count else None

    return wait_for(f"{count} rows from the stream", done)  # type: ignore[no-any-return]


def test_spark_reads_through_a_leader_failover(
    kafka_spark: SparkSession, kbroker_cluster: KbrokerCluster, tmp_path: Path
) -> None:
    cluster = kbroker_cluster
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic])[TOPIC].result(WITHIN)
    wait_for(
        "every replica in sync",
        lambda: all((p := partition_state(admin, i)) and len(p.isrs) == 3 for i in range(PARTITIONS)),
    )
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    acknowledged: list[Row] = []
    output, checkpoint = tmp_path / "output", tmp_path / "checkpoint"

    produce(producer, "before", acknowledged)
    query = start_stream(kafka_spark, cluster.bootstrap, output, checkpoint)
    try:
        assert wait_for_stream(kafka_spark, query, output, len(acknowledged)) == sorted(acknowledged)

        # kill -9 of partition 0's leader while the stream runs; the controller elects another ISR member.
        before = partition_state(admin, 0)
        leader = cluster.broker(before.leader)
        leader.kill()
        wait_for("a new leader", lambda: (p := partition_state(admin, 0)) and p.leader not in (-1, before.leader))
        produce(producer, "during", acknowledged)
        # A batch query while the former leader is down reads what the stream reads: every acknowledged record.
        assert batch_read(kafka_spark, cluster.bootstrap) == sorted(acknowledged)
        assert wait_for_stream(kafka_spark, query, output, len(acknowledged)) == sorted(acknowledged)
    finally:
        query.stop()

    # The former leader comes back (truncating to the new leader's log if need be) and rejoins the ISR.
    leader.start()
    wait_for("the restarted broker in the ISR", lambda: before.leader in partition_state(admin, 0).isrs)
    produce(producer, "after", acknowledged)
    # The stream again from its checkpoint: it goes on from the offsets it committed, writing nothing twice.
    query = start_stream(kafka_spark, cluster.bootstrap, output, checkpoint)
    try:
        assert wait_for_stream(kafka_spark, query, output, len(acknowledged)) == sorted(acknowledged)
    finally:
        query.stop()
    assert batch_read(kafka_spark, cluster.bootstrap) == sorted(acknowledged)

    # What was acknowledged is each partition's offsets 0..n-1, each record once: the comparisons above are exact.
    for partition in range(PARTITIONS):
        offsets = sorted(offset for p, offset, _, _ in acknowledged if p == partition)
        assert offsets == list(range(3 * PER_PARTITION))
