"""Damaged files met by a running broker: start-up stops with one line naming the file and the fix, or the
broker starts and keeps every byte of data; a broken batch answers CORRUPT_MESSAGE for its partition only.

The storage-level cases (every kind of wrong index entry, recovery points, gaps) are in
tests/storage/test_damaged_files.py.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch, decode_records, iter_batches

TOPIC = "kept"
OLDER_DATA_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "topics-json-datadir" / "data"
OLD_TOPIC = "orders"
BATCH_SIZE = 72  # one record with a 4-byte value


def serve(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """`kbroker serve` expected to stop at start-up (one that starts is killed after 30 s)."""
    command = [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def _create(client: WireClient, partitions: int, **configs: str) -> None:
    topic = CreateTopicsRequest.CreatableTopic(
        name=TOPIC,
        num_partitions=partitions,
        replication_factor=1,
        configs=[CreateTopicsRequest.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()],
    )
    assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0


def _produce(client: WireClient, partition: int, value: bytes, topic: str = TOPIC) -> tuple[int, int]:
    batch = build_batch([Record(offset_delta=0, value=value)], base_timestamp=0)
    data = [ProduceRequest.PartitionProduceData(index=partition, records=batch)]
    request = ProduceRequest(
        acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=data)]
    )
    answer = client.request(request, 9).responses[0].partition_responses[0]
    return answer.error_code, answer.base_offset


def _fetch(
    client: WireClient, offsets: dict[int, int], max_bytes: int = 1 << 20, topic: str = TOPIC
) -> dict[int, tuple[int, list[bytes | None]]]:
    """partition -> (error code, the values fetched)."""
    partitions = [
        FetchRequest.FetchPartition(partition=p, fetch_offset=o, partition_max_bytes=max_bytes)
        for p, o in offsets.items()
    ]
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=partitions)],
    )
    answers = {}
    for part in client.request(request, 11).responses[0].partitions:
        values = [r.value for _, view in iter_batches(bytes(part.records or b"")) for r in decode_records(view)]
        answers[part.partition_index] = (part.error_code, values)
    return answers


def _older_data_dir(tmp_path: Path) -> Path:
    """A data directory an older kbroker wrote, its topics in topics.json (tools/capture_topics_json_datadir.py):
    topic ``orders``, partitions 0-2, each holding orders-<partition>-0..2."""
    data_dir = tmp_path / "data"
    shutil.copytree(OLDER_DATA_DIR, data_dir)
    return data_dir


def _log_bytes(data_dir: Path) -> dict[str, bytes]:
    """The partitions' segments (not the metadata log's)."""
    return {
        str(p.relative_to(data_dir)): p.read_bytes()
        for p in sorted(data_dir.glob("*/*.log"))
        if p.parent.name != "__cluster_metadata-0"
    }


def test_a_truncated_topics_json_stops_start_up_with_the_file_and_the_fix(tmp_path: Path) -> None:
    data_dir = _older_data_dir(tmp_path)
    topics = data_dir / "topics.json"
    topics.write_bytes(topics.read_bytes()[:20])
    before = _log_bytes(data_dir)
    result = serve(data_dir)
    assert "Traceback" not in result.stderr and result.returncode == 1
    assert result.stderr.strip() == (
        f"kbroker: damaged file {topics}: not valid JSON (line 2, column 19); to fix: restore it from a backup, or "
        "move it out of the data directory and kbroker rebuilds it from the partition directories (topic config "
        "overrides are not recovered)"
    )
    assert _log_bytes(data_dir) == before
    # The fix works: moved aside, the topic and its records are back.
    topics.rename(tmp_path / "topics.json.damaged")
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        assert _fetch(client, {0: 0}, topic=OLD_TOPIC) == {
            0: (ErrorCode.NONE, [b"orders-0-0", b"orders-0-1", b"orders-0-2"])
        }


def test_an_empty_meta_properties_stops_start_up_with_the_file_and_the_fix(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with RunningBroker(data_dir):
        pass
    meta = data_dir / "meta.properties"
    meta.write_text("")
    result = serve(data_dir)
    assert "Traceback" not in result.stderr and result.returncode == 1
    assert result.stderr.strip() == (
        f"kbroker: damaged file {meta}: no cluster.id; to fix: restore it from a backup, or write its lines again: "
        "version=1, cluster.id=<this cluster's id>, node.id=<this broker's node.id> (moved aside instead, the "
        "broker starts as a new cluster)"
    )


def test_a_deleted_topics_json_keeps_the_records_and_auto_creation_does_not_wipe_them(tmp_path: Path) -> None:
    data_dir = _older_data_dir(tmp_path)
    before = _log_bytes(data_dir)
    (data_dir / "topics.json").unlink()
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        # A produce to the name would auto-create it; it finds the rebuilt topic and appends after the records.
        assert _produce(client, 1, b"after", topic=OLD_TOPIC) == (ErrorCode.NONE, 3)
        assert _fetch(client, {0: 0, 1: 0}, topic=OLD_TOPIC) == {
            0: (ErrorCode.NONE, [b"orders-0-0", b"orders-0-1", b"orders-0-2"]),
            1: (ErrorCode.NONE, [b"orders-1-0", b"orders-1-1", b"orders-1-2", b"after"]),
        }
    old_log = f"{OLD_TOPIC}-0/00000000000000000000.log"
    assert _log_bytes(data_dir)[old_log] == before[old_log]


def test_a_broken_batch_answers_corrupt_message_and_other_partitions_are_served(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        _create(client, 2, **{"index.interval.bytes": "150"})
        for i in range(10):
            assert _produce(client, 0, b"r%03d" % i) == (ErrorCode.NONE, i)
        assert _produce(client, 1, b"o000") == (ErrorCode.NONE, 0)
    segment = data_dir / f"{TOPIC}-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    assert len(data) == 10 * BATCH_SIZE
    data[4 * BATCH_SIZE + 8 : 4 * BATCH_SIZE + 12] = struct.pack(">i", 5)  # offset 4's batch length
    segment.write_bytes(bytes(data))
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        # Whole batches up to a limit: the broker reads headers, as Kafka does (without a limit it sends the
        # bytes as they are, and the client's CRC and length checks are what find the damage, as with Kafka).
        limited = _fetch(client, {0: 2, 1: 0}, max_bytes=BATCH_SIZE)
        assert limited == {0: (ErrorCode.NONE, [b"r002"]), 1: (ErrorCode.NONE, [b"o000"])}
        # Apache Kafka 4.3 answers the same (measured on a copy of this log: CORRUPT_MESSAGE, high watermark -1,
        # from its CorruptRecordException "Found record size 5 smaller than minimum record overhead").
        assert _fetch(client, {0: 5, 1: 0}) == {0: (ErrorCode.CORRUPT_MESSAGE, []), 1: (ErrorCode.NONE, [b"o000"])}
        assert _fetch(client, {0: 7}) == {0: (ErrorCode.NONE, [b"r007", b"r008", b"r009"])}
    assert segment.read_bytes() == bytes(data)  # nothing cut


def test_a_partition_directory_of_another_topic_is_kept_aside(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        _create(client, 1)
        assert _produce(client, 0, b"old") == (ErrorCode.NONE, 0)
    directory = data_dir / f"{TOPIC}-0"
    (directory / "partition.metadata").write_text("version: 0\ntopic_id: 00000000-0000-0000-0000-000000000003\n")
    before = (directory / "00000000000000000000.log").read_bytes()
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        assert _produce(client, 0, b"new") == (ErrorCode.NONE, 0)
    [stray] = data_dir.glob(f"{TOPIC}-0.*-stray")
    assert (stray / "00000000000000000000.log").read_bytes() == before


def test_a_topics_json_that_cannot_be_rebuilt_stops_start_up_with_one_line(tmp_path: Path) -> None:
    data_dir = _older_data_dir(tmp_path)
    (data_dir / "topics.json").unlink()
    other = "00000000-0000-0000-0000-000000000004"
    (data_dir / f"{OLD_TOPIC}-1" / "partition.metadata").write_text(f"version: 0\ntopic_id: {other}\n")
    result = serve(data_dir)
    assert "Traceback" not in result.stderr and result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"kbroker: {data_dir / 'topics.json'} is missing and cannot be rebuilt: the directories ")
    assert line.endswith(
        f"{other}: {data_dir / (OLD_TOPIC + '-1')}); move the directories of the wrong topic out of the data "
        "directory, or restore topics.json from a backup"
    )


def test_the_flush_service_writes_the_recovery_points_on_its_interval(tmp_path: Path) -> None:
    overrides = {"log.flush.offset.checkpoint.interval.ms": "200", "log.flush.interval.messages": "1"}
    with RunningBroker(tmp_path, overrides) as broker, WireClient(broker.bootstrap) as client:
        topic = CreateTopicsRequest.CreatableTopic(name="points", num_partitions=1, replication_factor=1)
        assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0
        batch = build_batch([Record(offset_delta=i, value=b"v") for i in range(3)], base_timestamp=0)
        data = [ProduceRequest.PartitionProduceData(index=0, records=batch)]
        produce = ProduceRequest(
            acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name="points", partition_data=data)]
        )
        assert client.request(produce, 9).responses[0].partition_responses[0].error_code == 0
        checkpoint = tmp_path / "recovery-point-offset-checkpoint"
        deadline = time.monotonic() + 10
        while not (checkpoint.exists() and "points 0 3" in checkpoint.read_text().splitlines()):
            assert time.monotonic() < deadline, "the recovery point of points-0 was not checkpointed"
            time.sleep(0.05)
        # Written while the broker runs (no clean shutdown yet): an fsynced append needs no re-check after a crash.
        assert checkpoint.read_text().splitlines()[:2] == ["0", "1"]
