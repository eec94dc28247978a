"""Issue #15, item 6: more partitions than the process may open files. A broker started under ``ulimit -n 256``
(soft and hard, so start-up cannot raise it) gets a topic of 1,000 partitions: every partition is written
(acks=1) twice, so that evicted segment files are reopened to append, and read back exactly; new connections are
still accepted and answered; the segment files open at once stay within the descriptor cache's capacity (half
the limit); and after a clean restart under the same limit every record is read back again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kbroker.wire_client import WireClient
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch, decode_records, iter_batches
from tests.broker.limited_broker import start, stop

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts the broker's open files in /proc (Linux only)"
)

LIMIT = 256
PARTITIONS = 1000
TOPIC = "many"


def _value(partition: int, round_: int) -> bytes:
    return b"partition %d round %d" % (partition, round_)


def _produce_all(client: WireClient, round_: int) -> list[tuple[int, int, int]]:
    """One record to every partition (acks=1); (partition, error code, base offset) of each answer."""
    data = [
        ProduceRequest.PartitionProduceData(
            index=p, records=build_batch([Record(offset_delta=0, key=None, value=_value(p, round_))])
        )
        for p in range(PARTITIONS)
    ]
    topic = ProduceRequest.TopicProduceData(name=TOPIC, partition_data=data)
    answer = client.request(ProduceRequest(acks=1, timeout_ms=30_000, topic_data=[topic]), 9)
    rows = [(r.index, r.error_code, r.base_offset) for r in answer.responses[0].partition_responses]
    return sorted(rows)


def _fetch_all(client: WireClient) -> dict[int, list[tuple[int, bytes | None]]]:
    """Every partition read from offset 0: its records as (offset, value)."""
    partitions = [
        FetchRequest.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 16) for p in range(PARTITIONS)
    ]
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=64 << 20,
        topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=partitions)],
    )
    answer = client.request(request, 12)
    read: dict[int, list[tuple[int, bytes | None]]] = {}
    for partition in answer.responses[0].partitions:
        assert partition.error_code == 0, (partition.partition_index, partition.error_code)
        records = read.setdefault(partition.partition_index, [])
        for header, view in iter_batches(partition.records or b""):
            records.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
    return read


def _open_segment_files(pid: int) -> int:
    count = 0
    for link in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = link.readlink()
        except OSError:  # closed meanwhile
            continue
        # The metadata log's active segment stays open beside the partitions' cache, as Kafka keeps it.
        count += str(target).endswith(".log") and "__cluster_metadata-0" not in str(target)
    return count


def test_a_thousand_partitions_under_a_limit_of_256_open_files(tmp_path: Path) -> None:
    process, address, stderr = start(tmp_path, LIMIT, LIMIT)
    expected = {p: [(0, _value(p, 0)), (1, _value(p, 1))] for p in range(PARTITIONS)}
    try:
        with WireClient(address) as client:
            topic = CreateTopicsRequest.CreatableTopic(name=TOPIC, num_partitions=PARTITIONS, replication_factor=1)
            created = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=60_000), 7)
            assert [(t.name, t.error_code) for t in created.topics] == [(TOPIC, 0)]
            assert _produce_all(client, 0) == [(p, 0, 0) for p in range(PARTITIONS)]
            assert _produce_all(client, 1) == [(p, 0, 1) for p in range(PARTITIONS)]  # most reopened to append
            assert _fetch_all(client) == expected
            open_logs = _open_segment_files(process.pid)
            assert 0 < open_logs <= LIMIT // 2, open_logs  # the cache's capacity, not one per partition
            # New connections, all open at once, are accepted and answered, reads and writes alike.
            fresh = [WireClient(address) for _ in range(40)]
            try:
                for n, other in enumerate(fresh):
                    versions = other.request(
                        ApiVersionsRequest(client_software_name="many", client_software_version="1"), 3
                    )
                    assert versions.error_code == 0
                    metadata = other.request(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12)
                    assert [(t.name, len(t.partitions)) for t in metadata.topics] == [(TOPIC, PARTITIONS)]
                    batch = build_batch([Record(offset_delta=0, key=None, value=b"fresh %d" % n)])
                    data = [ProduceRequest.PartitionProduceData(index=n * 25, records=batch)]
                    produce = ProduceRequest(
                        acks=1,
                        timeout_ms=5000,
                        topic_data=[ProduceRequest.TopicProduceData(name=TOPIC, partition_data=data)],
                    )
                    answer = other.request(produce, 9).responses[0].partition_responses[0]
                    assert (answer.error_code, answer.base_offset) == (0, 2)
                    expected[n * 25].append((2, b"fresh %d" % n))
            finally:
                for other in fresh:
                    other.close()
            assert _fetch_all(client) == expected
    finally:
        log = stop(process, stderr)
    assert process.returncode == 0, log
    assert "Traceback" not in log and "Too many open files" not in log, log

    process, address, stderr = start(
        tmp_path, LIMIT, LIMIT
    )  # the same limit; every partition opened again on first read
    try:
        with WireClient(address) as client:
            assert _fetch_all(client) == expected
            assert _open_segment_files(process.pid) <= LIMIT // 2
    finally:
        log = stop(process, stderr)
    assert process.returncode == 0, log
    assert "Traceback" not in log and "Too many open files" not in log, log
