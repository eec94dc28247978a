"""replication-offset-checkpoint (Kafka's offset-checkpoint layout): the high watermarks written at shutdown and
read at start-up, where a reopened log's high watermark starts (bounded by its log; its log start without an
entry, as Kafka's); a leader without followers moves it to its log end at once, one with followers keeps it until
they have fetched. A damaged file stops start-up with one line, as Kafka stops a broker whose only log directory
failed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.broker import Broker, Endpoint
from kbroker.cli import error_line
from kbroker.config import BrokerConfig
from kbroker.durable.files import DamagedFileError
from kbroker.metadata.image import PartitionRegistration, TopicImage, TopicsImage
from kbroker.replication import HIGH_WATERMARK_FILE, read_high_watermarks
from kbroker.storage import LogManager
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch
from tests.broker.test_damaged_startup import serve
from tests.broker.test_handlers_in_memory import batch, create, produce

CONFIG = BrokerConfig({"num.partitions": "1", "node.id": "0"})


def open_broker(data_dir: Path) -> Broker:
    return Broker(CONFIG, data_dir, Endpoint("localhost", 9092))


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A data directory holding topic t (two partitions, three records in partition 0), stopped cleanly."""
    broker = open_broker(tmp_path / "data")
    try:
        create(broker, "t", partitions=2)
        for value in (b"a", b"b", b"c"):
            assert produce(broker, "t", batch([value])).error_code == ErrorCode.NONE
    finally:
        broker.close()
    yield tmp_path / "data"


def write_checkpoint(data_dir: Path, *lines: str) -> None:
    (data_dir / HIGH_WATERMARK_FILE).write_text("\n".join(["0", str(len(lines)), *lines]) + "\n")


def test_shutdown_checkpoints_the_high_watermarks_and_a_restart_keeps_them(data_dir: Path) -> None:
    assert (data_dir / HIGH_WATERMARK_FILE).read_text() == "0\n1\nt 0 3\n"  # t-1 was never read or written
    open_broker(data_dir).close()  # opening no partition: the entries read at start-up are written back
    assert (data_dir / HIGH_WATERMARK_FILE).read_text() == "0\n1\nt 0 3\n"
    broker = open_broker(data_dir)
    try:
        partition = broker.replicas.partition("t", 0)
        assert partition is not None and partition.high_watermark == 3
        assert produce(broker, "t", batch([b"d"]), partition=1).error_code == ErrorCode.NONE
    finally:
        broker.close()
    assert (data_dir / HIGH_WATERMARK_FILE).read_text() == "0\n2\nt 0 3\nt 1 1\n"


def test_a_reopened_log_starts_from_its_checkpointed_high_watermark_bounded_by_the_log(data_dir: Path) -> None:
    starts = {}
    for label, lines in {"checkpointed": ["t 0 2"], "beyond the end": ["t 0 99"], "no entry": ["t 1 7"]}.items():
        write_checkpoint(data_dir, *lines)
        logs = LogManager(data_dir, {}, high_watermarks=read_high_watermarks(data_dir))
        try:
            plog = logs.get_partition("t", 0)
            assert plog is not None
            starts[label] = (plog.high_watermark, plog.log_end_offset)
        finally:
            logs.close()
    assert starts == {"checkpointed": (2, 3), "beyond the end": (3, 3), "no entry": (0, 3)}


def test_a_leader_with_followers_keeps_the_checkpointed_high_watermark_until_they_fetch(data_dir: Path) -> None:
    write_checkpoint(data_dir, "t 0 1")

    broker = open_broker(data_dir)
    try:
        info = broker.topics.topic("t")
        assert info is not None
        topic = TopicImage("t", info.topic_id, {0: PartitionRegistration((0, 1), (0, 1), 0, 1, 1)})
        # A metadata image says t-0 has a follower in its ISR, before the log is opened.
        broker.replicas.leadership = TopicsImage({info.topic_id: topic}, {"t": topic})
        partition = broker.replicas.partition("t", 0)
        assert partition is not None and (partition.high_watermark, partition.log.log_end_offset) == (1, 3)
        partition.record_follower_fetch(1, 3, 0, 0, 3)
        assert partition.high_watermark == 3
    finally:
        broker.close()


def test_a_missing_checkpoint_starts_a_single_nodes_high_watermarks_at_the_log_end(data_dir: Path) -> None:
    (data_dir / HIGH_WATERMARK_FILE).unlink()  # as a data directory from before the checkpoint was written
    broker = open_broker(data_dir)
    try:
        partition = broker.replicas.partition("t", 0)
        assert partition is not None and partition.high_watermark == 3  # from the log start, then moved by the leader
    finally:
        broker.close()


def test_a_damaged_checkpoint_stops_start_up_with_one_line(data_dir: Path) -> None:
    (data_dir / HIGH_WATERMARK_FILE).write_text("0\n2\nt 0 3\n")  # cut short
    with pytest.raises(DamagedFileError) as caught:
        open_broker(data_dir)
    path = data_dir / HIGH_WATERMARK_FILE
    assert error_line(caught.value) == (
        f"kbroker: damaged file {path}: 1 entries, but the file says 2 (cut short?); to fix: move it out of the data "
        "directory: each partition's high watermark then starts from its log start offset, and its leader moves it "
        "to its log end"
    )
    path.unlink()  # as the line says: the data directory was left unlocked, and starts
    open_broker(data_dir).close()


def test_a_running_broker_checkpoints_a_moved_high_watermark_on_its_interval_and_a_damaged_file_stops_serve(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    with (
        RunningBroker(data_dir, {"replica.high.watermark.checkpoint.interval.ms": "200"}) as running,
        WireClient(running.bootstrap) as client,
    ):
        topic = CreateTopicsRequest.CreatableTopic(name="hw", num_partitions=1, replication_factor=1)
        assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0
        records = build_batch([Record(offset_delta=i, value=b"v") for i in range(3)], base_timestamp=0)
        data = [ProduceRequest.PartitionProduceData(index=0, records=records)]
        request = ProduceRequest(
            acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name="hw", partition_data=data)]
        )
        assert client.request(request, 9).responses[0].partition_responses[0].error_code == ErrorCode.NONE
        checkpoint = data_dir / HIGH_WATERMARK_FILE
        deadline = time.monotonic() + 10
        while not (checkpoint.exists() and checkpoint.read_text() == "0\n1\nhw 0 3\n"):
            assert time.monotonic() < deadline, "the high watermark of hw-0 was not checkpointed while running"
            time.sleep(0.05)
        # Nothing moved: the intervals that pass write nothing (each write is a new file renamed into place).
        written = checkpoint.stat().st_ino
        time.sleep(1)
        assert checkpoint.stat().st_ino == written
        assert client.request(request, 9).responses[0].partition_responses[0].error_code == ErrorCode.NONE
        deadline = time.monotonic() + 10
        while checkpoint.read_text() != "0\n1\nhw 0 6\n":
            assert time.monotonic() < deadline, "the moved high watermark of hw-0 was not checkpointed"
            time.sleep(0.05)
    checkpoint.write_bytes(b"\xff\xfe")
    result = serve(data_dir)
    assert "Traceback" not in result.stderr and result.returncode == 1
    assert result.stderr.strip() == (
        f"kbroker: damaged file {checkpoint}: not an ASCII text file; to fix: move it out of the data directory: "
        "each partition's high watermark then starts from its log start offset, and its leader moves it to its log end"
    )
