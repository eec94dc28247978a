"""pytest fixtures for the Spark pipeline's tests (tests/spark and compat/spark import them in their conftest).

One SparkSession per process: a JVM takes seconds to start and a process can hold only one SparkContext.
It includes the Kafka connector from the repository's Maven set (tools/maven/spark-kafka.pom.xml, which
.ci/run fetches; fetched here if need be), since jars can only be added when the JVM starts, so the
transformation tests and the live-broker tests share it. Where the connector cannot be had, the tests that
need it fail with the one line that says what could not be fetched: they are not optional.

pyspark is imported when a fixture is first used, so this module loads without it; the test modules
themselves skip, with the reason, when pyspark is not installed.
"""

from __future__ import annotations

import atexit
import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Small and quiet: two local cores, two shuffle partitions (the default 200 makes every aggregation slow),
# no adaptive re-planning of tiny queries, no web UI or progress bar.
TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.adaptive.enabled": "false",
}


@dataclass
class SparkForTests:
    session: SparkSession
    connector_missing: str | None  # why the Kafka connector is not on the classpath (None: it is)


_shared: list[SparkForTests] = []


def shared_spark() -> SparkForTests:
    """The process's session for tests, started on first use and stopped when the process exits."""
    if not _shared:
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            pytest.skip("Spark needs Java 17 or later (apt-get install -y default-jdk-headless)")
        from compat.spark import pipeline

        try:
            connector: dict[str, str] | None = pipeline.connector_conf()
            missing = None
        except pipeline.ConnectorUnavailable as exc:
            connector, missing = None, str(exc)
        session = pipeline.build_session("local[2]", app_name="kbroker-tests", connector=connector, extra=TEST_CONF)
        session.sparkContext.setLogLevel("ERROR")
        atexit.register(session.stop)
        _shared.append(SparkForTests(session, missing))
    return _shared[0]


@pytest.fixture(scope="session")
def spark_for_tests() -> SparkForTests:
    return shared_spark()


@pytest.fixture
def spark(spark_for_tests: SparkForTests) -> SparkSession:
    return spark_for_tests.session


@pytest.fixture
def kafka_spark(spark_for_tests: SparkForTests) -> SparkSession:
    """The session, for tests that need the Kafka connector: they fail, with the reason, without it."""
    if spark_for_tests.connector_missing is not None:
        pytest.fail(spark_for_tests.connector_missing, pytrace=False)
    return spark_for_tests.session
