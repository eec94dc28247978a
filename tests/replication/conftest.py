"""Shared by the replication tests: a broker of one process whose logs are kept in memory, to which the tests
hand requests and metadata records directly."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
from kbroker.storage import LogManager

NODE = 0  # the node id of the broker under test


@contextmanager
def in_memory_broker(data_dir: Path, settings: dict[str, str] | None = None) -> Iterator[Broker]:
    """Broker ``NODE`` (topics of one partition, ``settings`` beside) on ``data_dir``, its logs in memory; closed
    on exit."""
    config = BrokerConfig({"num.partitions": "1", "node.id": str(NODE), **(settings or {})})
    broker = Broker(
        config, data_dir, Endpoint("localhost", 9092), logs=LogManager.in_memory_store(config.topic_defaults())
    )
    try:
        yield broker
    finally:
        broker.close()
