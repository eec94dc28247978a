"""The Spark tests' session (compat/spark/fixtures.py): one per process, with the Kafka connector if available."""

from compat.spark.fixtures import kafka_spark, spark, spark_for_tests  # noqa: F401
