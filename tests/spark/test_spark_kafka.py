"""The pipeline (compat/spark/pipeline.py) end to end against a live kbroker, with Spark's Kafka connector.

The scenarios are in compat/spark/scenarios.py (compat/spark/test_spark.py runs them against the compat
targets, Apache Kafka included). They need spark-sql-kafka-0-10, from $KBROKER_SPARK_KAFKA_JARS or Maven
Central (see the pipeline's docstring); without either they skip with that reason.
tests/clients/test_java_client.py's test_spark_source_and_sink_calls makes the connector's Kafka calls with
kafka-clients instead, and always runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from pyspark.sql import SparkSession  # noqa: E402

from compat.spark import scenarios  # noqa: E402
from kbroker.testing import RunningBroker  # noqa: E402


def same(what: str) -> str:
    return what  # a fresh broker for each test: plain topic names


def test_streaming_pipeline(kafka_spark: SparkSession, broker: RunningBroker, tmp_path: Path) -> None:
    scenarios.streaming_pipeline(kafka_spark, broker.bootstrap, tmp_path, same)


def test_batch_read_of_an_offset_range_and_batch_write(kafka_spark: SparkSession, broker: RunningBroker) -> None:
    scenarios.batch_read_of_an_offset_range_and_batch_write(kafka_spark, broker.bootstrap, same)


def test_batch_write_with_partitions_and_headers(kafka_spark: SparkSession, broker: RunningBroker) -> None:
    scenarios.batch_write_with_partitions_and_headers(kafka_spark, broker.bootstrap, same)


def test_batch_command_line(kafka_spark: SparkSession, broker: RunningBroker) -> None:
    # kafka_spark: the command runs its own Spark, but only where the tests' session found the connector.
    scenarios.batch_command_line(broker.bootstrap, same)
