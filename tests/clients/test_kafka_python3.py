"""kafka-python 3.x (installed with the test extra) against a live broker, with its defaults."""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic
from kafka.errors import TopicAlreadyExistsError

from kbroker.testing import RunningBroker


def _consume_all(bootstrap: str, topic: str, expected: int, **config) -> list:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
        **config,
    )
    try:
        records = []
        for record in consumer:
            records.append(record)
            if len(records) >= expected:
                break
        return records
    finally:
        consumer.close()


def test_admin_produce_consume_round_trip(broker: RunningBroker) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic("orders", num_partitions=3, replication_factor=1)])
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("orders", num_partitions=3, replication_factor=1)])
        assert "orders" in admin.list_topics()
    finally:
        admin.close()

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)  # idempotent by default in 3.x
    sent = []
    for i in range(30):
        key = f"key-{i % 5}".encode()
        meta = producer.send("orders", key=key, value=f"value-{i}".encode(), headers=[("h", str(i).encode())]).get(
            timeout=10
        )
        sent.append((meta.partition, meta.offset, key, f"value-{i}".encode()))
    producer.flush()
    producer.close()

    # Same key, same partition; offsets per partition are 0, 1, 2, ... in send order.
    by_key: dict[bytes, set[int]] = {}
    for partition, _, key, _ in sent:
        by_key.setdefault(key, set()).add(partition)
    assert all(len(parts) == 1 for parts in by_key.values())
    for partition in range(3):
        offsets = [o for p, o, _, _ in sent if p == partition]
        assert offsets == list(range(len(offsets)))

    records = _consume_all(broker.bootstrap, "orders", 30)
    got = sorted((r.partition, r.offset, r.key, r.value) for r in records)
    assert got == sorted(sent)
    headers = {(r.partition, r.offset): r.headers for r in records}
    for partition, offset, _, value in sent:
        assert headers[(partition, offset)] == [("h", value.split(b"-")[1])]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_round_trip(broker: RunningBroker, codec: str) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec, linger_ms=20)
    futures = [producer.send("compressed", key=None, value=b"x" * (i + 1)) for i in range(50)]
    producer.flush()
    offsets = [f.get(timeout=10).offset for f in futures]
    producer.close()
    assert offsets == list(range(50))
    records = _consume_all(broker.bootstrap, "compressed", 50)
    assert [(r.offset, r.value) for r in records] == [(i, b"x" * (i + 1)) for i in range(50)]


def test_list_offsets_by_time_and_end_offsets(broker: RunningBroker) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    base = int(time.time() * 1000) - 10_000
    for i in range(10):
        producer.send("timed", value=str(i).encode(), partition=0, timestamp_ms=base + i * 1000).get(timeout=10)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        tp = TopicPartition("timed", 0)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        found = consumer.offsets_for_times({tp: base + 3500})
        assert found[tp].offset == 4 and found[tp].timestamp == base + 4000
        assert consumer.offsets_for_times({tp: base + 60_000})[tp] is None
    finally:
        consumer.close()


def test_configs_and_partitions_admin(broker: RunningBroker) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic("cfg", 1, 1, topic_configs={"retention.ms": "60000"})])
        resource = ConfigResource(ConfigResourceType.TOPIC, "cfg")
        modified = admin.describe_configs([resource])["topic"]["cfg"]
        assert list(modified) == ["retention.ms"]
        assert modified["retention.ms"]["value"] == "60000"
        assert modified["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        everything = admin.describe_configs([resource], config_filter="all")["topic"]["cfg"]
        assert everything["cleanup.policy"]["value"] == "delete"
        assert everything["cleanup.policy"]["config_source"] == "DEFAULT_CONFIG"
        assert everything["retention.ms"]["value"] == "60000"
        admin.create_partitions({"cfg": NewPartitions(total_count=4)})
        meta = admin.describe_topics(["cfg"])
        assert len(meta[0]["partitions"]) == 4
        admin.delete_topics(["cfg"])
        assert "cfg" not in admin.list_topics()
    finally:
        admin.close()


def test_committed_data_survives_restart(broker: RunningBroker) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(20):
        producer.send("durable", key=b"k", value=str(i).encode()).get(timeout=10)
    producer.close()
    broker.restart()
    records = _consume_all(broker.bootstrap, "durable", 20)
    assert [(r.offset, r.value) for r in records] == [(i, str(i).encode()) for i in range(20)]
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    assert producer.send("durable", key=b"k", value=b"after").get(timeout=10).offset == 20
    producer.close()
