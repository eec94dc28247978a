"""One pass through what a kafka-python user does, printed as JSON for the test to check.

Run as a separate process so that a different kafka-python (2.x) than the one installed can be put first
on sys.path: ``PYTHONPATH=<dir with kafka-python 2.x> python kafka_python_scenario.py host:port``.
"""

from __future__ import annotations

import json
import sys
import time

import kafka
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


def main(bootstrap: str) -> dict:
    result: dict = {"version": kafka.__version__}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic("py", 2, 1, topic_configs={"retention.ms": "3600000"})])
    result["topics"] = sorted(t for t in admin.list_topics() if not t.startswith("_"))
    described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "py")])
    # kafka-python 2.x returns the raw DescribeConfigs responses: (error, message, type, name, entries).
    entries = described[0].resources[0][4]
    result["configs"] = {row[0]: row[1] for row in entries}

    sent = []
    for codec in CODECS:
        producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec)
        for i in range(10):
            key = f"{codec}-{i % 3}".encode()
            meta = producer.send("py", key=key, value=f"{codec}-{i}".encode(), headers=[("i", str(i).encode())]).get(10)
            sent.append([meta.partition, meta.offset, key.decode(), f"{codec}-{i}"])
        producer.close()
    result["sent"] = sent

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    partitions = [TopicPartition("py", 0), TopicPartition("py", 1)]
    consumer.assign(partitions)
    consumer.seek_to_beginning()
    got = []
    for record in consumer:
        got.append(
            [
                record.partition,
                record.offset,
                record.key.decode(),
                record.value.decode(),
                [[k, v.decode()] for k, v in record.headers],
            ]
        )
        if len(got) == len(sent):
            break
    result["consumed"] = got
    result["end_offsets"] = {str(tp.partition): o for tp, o in consumer.end_offsets(partitions).items()}
    result["beginning_offsets"] = {str(tp.partition): o for tp, o in consumer.beginning_offsets(partitions).items()}
    consumer.close()

    base = int(time.time() * 1000) - 30_000
    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=1_000_000)
    admin.create_topics([NewTopic("timed", num_partitions=1, replication_factor=1)])
    for i in range(5):
        producer.send("timed", value=str(i).encode(), timestamp_ms=base + i * 1000).get(10)
    big = bytes(range(256)) * 3600
    result["big_offset"] = producer.send("timed", key=b"big", value=big).get(10).offset
    producer.close()
    tp = TopicPartition("timed", 0)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
        max_partition_fetch_bytes=2_000_000,
    )
    found = consumer.offsets_for_times({tp: base + 2500})[tp]
    result["offset_for_time"] = [found.offset, found.timestamp - base]
    consumer.assign([tp])
    consumer.seek(tp, found.offset)
    records = []
    for record in consumer:
        records.append(record)
        if len(records) == 3:
            break
    result["from_time"] = [[r.offset, len(r.value)] for r in records]
    result["big_intact"] = records[-1].value == big
    consumer.seek_to_end(tp)
    result["position_at_end"] = consumer.position(tp)
    consumer.close()

    admin.delete_topics(["py"])
    result["after_delete"] = sorted(t for t in admin.list_topics() if not t.startswith("_"))
    admin.close()
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
