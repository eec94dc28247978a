"""A PySpark Structured Streaming pipeline over Kafka (kbroker or Apache Kafka): see pipeline.py."""
