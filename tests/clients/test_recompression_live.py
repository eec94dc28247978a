"""Broker-side compression and LogAppendTime through a real client (kafka-python) against a live broker."""

from __future__ import annotations

import time

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from kbroker.testing import RunningBroker
from protocol.compression import Codec
from protocol.records import iter_batches

LOG_APPEND_TIME = 1  # kafka-python's ConsumerRecord.timestamp_type for LogAppendTime


def create_topic(broker: RunningBroker, name: str, configs: dict[str, str]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1, topic_configs=configs)])
    finally:
        admin.close()


def consume(broker: RunningBroker, topic: str, count: int) -> list:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        records = []
        for record in consumer:
            records.append(record)
            if len(records) == count:
                break
        return records
    finally:
        consumer.close()


def stored_codecs(broker: RunningBroker, topic: str) -> list[int]:
    """The codec of every batch in the partition's segment file on disk."""
    data = (broker.data_dir / f"{topic}-0" / "00000000000000000000.log").read_bytes()
    return [header.compression for header, _ in iter_batches(data)]


def test_lz4_batches_to_a_zstd_topic_are_stored_as_zstd(broker: RunningBroker) -> None:
    create_topic(broker, "recompressed", {"compression.type": "zstd"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="lz4", linger_ms=50)
    sent = [(f"key-{i % 7}".encode(), f"value {i} ".encode() * 30, [("n", str(i).encode())]) for i in range(200)]
    futures = [producer.send("recompressed", key=k, value=v, headers=h, partition=0) for k, v, h in sent]
    producer.flush()
    assert [f.get(timeout=10).offset for f in futures] == list(range(200))
    producer.close()

    records = consume(broker, "recompressed", 200)
    assert [(r.offset, r.key, r.value, r.headers) for r in records] == [
        (i, k, v, h) for i, (k, v, h) in enumerate(sent)
    ]
    codecs = stored_codecs(broker, "recompressed")
    assert codecs and set(codecs) == {Codec.ZSTD}


def test_log_append_time_is_what_consumers_and_list_offsets_see(broker: RunningBroker) -> None:
    create_topic(broker, "appended", {"message.timestamp.type": "LogAppendTime", "compression.type": "gzip"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="snappy")
    created = 1_000_000_000_000  # the producer's timestamps, long ago: the broker replaces them
    before = int(time.time() * 1000)
    answers = [
        producer.send("appended", value=str(i).encode(), partition=0, timestamp_ms=created + i).get(timeout=10)
        for i in range(5)
    ]
    after = int(time.time() * 1000)
    producer.close()
    append_times = [answer.timestamp for answer in answers]  # the produce answers' log_append_time_ms
    assert all(before <= t <= after for t in append_times) and append_times == sorted(append_times)

    records = consume(broker, "appended", 5)
    assert [(r.offset, r.timestamp, r.timestamp_type) for r in records] == [
        (i, append_times[i], LOG_APPEND_TIME) for i in range(5)
    ]
    assert set(stored_codecs(broker, "appended")) == {Codec.GZIP}

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        tp = TopicPartition("appended", 0)
        found = consumer.offsets_for_times({tp: append_times[2]})[tp]
        first_at_that_time = append_times.index(append_times[2])
        assert (found.offset, found.timestamp) == (first_at_that_time, append_times[2])
        assert consumer.offsets_for_times({tp: created})[tp].offset == 0  # every record is later than that
        assert consumer.offsets_for_times({tp: after + 60_000})[tp] is None
    finally:
        consumer.close()
