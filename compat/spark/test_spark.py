"""The Spark pipeline's end-to-end scenarios (compat/spark/scenarios.py) against each compat target.

They need pyspark and the spark-sql-kafka-0-10 connector ($KBROKER_SPARK_KAFKA_JARS or Maven Central, see
compat/spark/pipeline.py); without them they skip with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from pyspark.sql import SparkSession  # noqa: E402

from compat.spark import scenarios  # noqa: E402
from compat.targets import Target  # noqa: E402

Names = Callable[[str], str]


def test_spark_streaming_pipeline(kafka_spark: SparkSession, target: Target, tmp_path: Path, names: Names) -> None:
    scenarios.streaming_pipeline(kafka_spark, target.bootstrap, tmp_path, names)


def test_spark_batch_offset_range(kafka_spark: SparkSession, target: Target, names: Names) -> None:
    scenarios.batch_read_of_an_offset_range_and_batch_write(kafka_spark, target.bootstrap, names)


def test_spark_batch_write_columns(kafka_spark: SparkSession, target: Target, names: Names) -> None:
    scenarios.batch_write_with_partitions_and_headers(kafka_spark, target.bootstrap, names)


def test_spark_command_line(kafka_spark: SparkSession, target: Target, names: Names) -> None:
    scenarios.batch_command_line(target.bootstrap, names)
