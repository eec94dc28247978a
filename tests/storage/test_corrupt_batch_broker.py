"""Issue #26's reproduction with a real broker process: a stock producer (confluent-kafka, acks=all) writes 1,500
records to each of two partitions with segment.bytes 20000, the broker is killed (kill -9), 8 bytes are flipped
inside a batch in the middle of a sealed segment, and the broker restarts. Every acknowledged record outside that
batch is still fetched at its offset with its value, a fetch of the batch's offsets answers CORRUPT_MESSAGE (for
that partition only), the broker's log names the range, and nothing was cut from the segment.
"""

from __future__ import annotations

from pathlib import Path

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from kbroker.testing import BrokerProcess  # noqa: E402
from kbroker.wire_client import WireClient  # noqa: E402
from protocol.errors import ErrorCode  # noqa: E402
from protocol.messages.create_topics_request import CreateTopicsRequest  # noqa: E402
from protocol.messages.fetch_request import FetchRequest  # noqa: E402
from protocol.records import decode_records, iter_batches  # noqa: E402

TOPIC = "flipped"
RECORDS = 1_500
PARTITIONS = 2


def produce(bootstrap: str) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value of every acknowledged record."""
    acked: dict[tuple[int, int], bytes] = {}
    failures: list[str] = []

    def delivered(error: object, message: object) -> None:
        if error is None:
            acked[(message.partition(), message.offset())] = message.value()  # type: ignore[attr-defined]
        else:
            failures.append(str(error))

    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.num.messages": 20}
    )
    for i in range(RECORDS):
        for partition in range(PARTITIONS):
            value = f"p{partition}-{i:05d}-".encode() + b"v" * 80
            producer.produce(TOPIC, value=value, partition=partition, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    assert failures == []
    return acked


def fetch(client: WireClient, partition: int, offset: int) -> tuple[int, list[tuple[int, bytes | None]], int]:
    """(error code, (offset, value) of the records, high watermark) of one fetch."""
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=[
            FetchRequest.FetchTopic(
                topic=TOPIC,
                partitions=[
                    FetchRequest.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=64 << 10)
                ],
            )
        ],
    )
    answer = client.request(request, 11).responses[0].partitions[0]
    records: list[tuple[int, bytes | None]] = []
    for header, view in iter_batches(bytes(answer.records or b"")):
        records.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
    return answer.error_code, records, answer.high_watermark


def flip_inside_a_middle_batch(partition_dir: Path) -> tuple[Path, str, int, int]:
    """Flip 8 bytes inside the records of the middle batch of the second sealed segment; (the segment, the batch's
    byte range, its first and last offset)."""
    segments = sorted(partition_dir.glob("*.log"))
    assert len(segments) >= 4, segments
    segment = segments[1]
    data = bytearray(segment.read_bytes())
    batches = []
    position = 0
    for header, _ in iter_batches(data):
        batches.append((header, position))
        position += header.size
    assert len(batches) >= 5
    header, position = batches[len(batches) // 2]
    middle = position + header.size // 2
    for i in range(8):
        data[middle + i] ^= 0xFF
    segment.write_bytes(bytes(data))
    return segment, f"{position}..{position + header.size - 1}", header.base_offset, header.last_offset


def test_a_flipped_batch_in_a_sealed_segment_loses_only_its_own_records(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir).start()
    try:
        with WireClient(broker.bootstrap) as client:
            topic = CreateTopicsRequest.CreatableTopic(
                name=TOPIC,
                num_partitions=PARTITIONS,
                replication_factor=1,
                configs=[CreateTopicsRequest.CreatableTopicConfig(name="segment.bytes", value="20000")],
            )
            answer = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7)
            assert answer.topics[0].error_code == 0
        acked = produce(broker.bootstrap)
    finally:
        broker.kill()  # kill -9
    assert len(acked) == RECORDS * PARTITIONS
    segment, byte_range, first_bad, last_bad = flip_inside_a_middle_batch(data_dir / f"{TOPIC}-0")
    size = segment.stat().st_size

    again = BrokerProcess(data_dir).start()
    try:
        with WireClient(again.bootstrap) as client:
            for partition in range(PARTITIONS):
                lost = range(first_bad, last_bad + 1) if partition == 0 else range(0)
                wanted = {o: v for (p, o), v in acked.items() if p == partition and o not in lost}
                fetched: dict[int, bytes | None] = {}
                offset, corrupt_at = 0, None
                while offset < RECORDS:
                    code, records, high_watermark = fetch(client, partition, offset)
                    assert code != ErrorCode.NONE or high_watermark == RECORDS  # an error answer has -1
                    if code == ErrorCode.CORRUPT_MESSAGE:
                        assert corrupt_at is None and offset == first_bad and partition == 0
                        corrupt_at = offset
                        offset = last_bad + 1  # what the operator does: seek past the range the log names
                        continue
                    assert code == ErrorCode.NONE and records, (partition, offset, code)
                    fetched.update(records)
                    offset = records[-1][0] + 1
                assert fetched == wanted  # every other acknowledged record, at its offset, with its value
                if partition == 0:
                    assert corrupt_at == first_bad
                    for inside in (first_bad, last_bad):  # every offset of the range answers the error
                        assert fetch(client, 0, inside)[0] == ErrorCode.CORRUPT_MESSAGE
    finally:
        again.stop()
    log = again.log_path.read_text()
    assert f"{segment} bytes {byte_range} (offsets {first_bad}..{last_bad}) are corrupt: CRC mismatch" in log
    assert "truncating" not in log
    assert segment.stat().st_size == size  # nothing cut
