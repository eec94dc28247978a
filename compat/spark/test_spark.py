"""The Spark pipeline's end-to-end scenarios (compat/spark/scenarios.py) against each compat target.

    python -m pytest compat/spark --target kbroker,kafka

They need pyspark, Java and the spark-sql-kafka-0-10 connector, which comes from the repository's Maven set
(tools/maven/spark-kafka.pom.xml; .ci/run fetches it): without the connector they fail saying what could not
be fetched. One SparkSession serves every scenario and target (compat/spark/fixtures.py).
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


def test_spark_batch_read_with_headers(kafka_spark: SparkSession, target: Target, names: Names) -> None:
    scenarios.batch_read_with_headers_and_batch_write(kafka_spark, target.bootstrap, names)


def test_spark_batch_write_columns(kafka_spark: SparkSession, target: Target, names: Names) -> None:
    scenarios.batch_write_with_partitions_and_headers(kafka_spark, target.bootstrap, names)


def test_spark_streaming_pipeline(kafka_spark: SparkSession, target: Target, tmp_path: Path, names: Names) -> None:
    scenarios.streaming_pipeline(kafka_spark, target.bootstrap, tmp_path, names)


def test_spark_stream_restart(kafka_spark: SparkSession, target: Target, tmp_path: Path, names: Names) -> None:
    scenarios.stream_restart_from_checkpoint(kafka_spark, target.bootstrap, tmp_path, names)
