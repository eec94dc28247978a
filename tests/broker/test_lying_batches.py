"""Batches whose header lies (issue #15, item 3): each shape is refused with Kafka's code and message, over the
wire and at the log, and nothing of it reaches the log: later good batches get consecutive offsets, ListOffsets
by timestamp answers, and a restart, clean or unclean, keeps every acknowledged record.

``LYING_SHAPES`` is shared with tests/kafka/test_lying_batches_kafka.py, which sends the same bytes to Apache
Kafka 4.3 and asserts its codes are these.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.storage import LogConfig, PartitionLog
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol import compression
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import (
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    Record,
    compute_crc,
    decode_records,
    encode_record,
    iter_batches,
)

GZIP, LZ4, ZSTD = 1, 3, 4
PREMATURE_EOF = "Incorrect declared batch size, premature EOF reached"
REMAINING = "Incorrect declared batch size, records still remaining in file"
OUT_OF_ORDER = "the records of a compressed batch must have offset deltas 0 to count - 1 in order"


def records_bytes(count: int, deltas: list[int] | None = None, timestamp_deltas: list[int] | None = None) -> bytes:
    """``count`` encoded records (not a batch) with the given offset and timestamp deltas (0..n-1 and 0s)."""
    deltas = list(range(count)) if deltas is None else deltas
    timestamp_deltas = [0] * count if timestamp_deltas is None else timestamp_deltas
    return b"".join(
        encode_record(Record(offset_delta=d, timestamp_delta=t, value=b"v%d" % i))
        for i, (d, t) in enumerate(zip(deltas, timestamp_deltas, strict=True))
    )


def lying_batch(
    body: bytes,
    count: int,
    last_offset_delta: int,
    *,
    base_timestamp: int,
    max_timestamp: int | None = None,
    attributes: int = 0,
    producer_id: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
) -> bytes:
    """A batch around ``body`` with exactly the header fields given and a correct CRC: the header lies, the
    checksum does not, so only the validator's consistency checks can catch it."""
    batch = bytearray(HEADER_SIZE)
    HEADER.pack_into(
        batch,
        0,
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(body),
        -1,
        2,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        base_timestamp if max_timestamp is None else max_timestamp,
        producer_id,
        0 if producer_id >= 0 else -1,
        base_sequence,
        count,
    )
    batch += body
    struct.pack_into(">I", batch, 17, compute_crc(batch))
    return bytes(batch)


Shape = Callable[[int], bytes]  # now (ms) -> the batch


def _compressed(codec: int, count: int, deltas: list[int] | None = None, *, claimed: int | None = None) -> Shape:
    def build(now: int) -> bytes:
        claimed_count = count if claimed is None else claimed
        body = compression.compress(codec, records_bytes(count, deltas))
        return lying_batch(body, claimed_count, claimed_count - 1, base_timestamp=now, attributes=codec)

    return build


# label -> (batch builder, Kafka 4.3's code, the message Kafka logs for it and kbroker answers)
LYING_SHAPES: dict[str, tuple[Shape, ErrorCode, str]] = {
    "last offset delta -1": (
        lambda now: lying_batch(records_bytes(3), 3, -1, base_timestamp=now),
        ErrorCode.INVALID_RECORD,
        "Batch has an invalid offset range: [0, -1]",
    ),
    "last offset delta past the count": (
        lambda now: lying_batch(records_bytes(3), 3, 5, base_timestamp=now),
        ErrorCode.INVALID_RECORD,
        "Inconsistent batch offset range [0, 5] and count of records 3",
    ),
    "last offset delta short of the count": (
        lambda now: lying_batch(records_bytes(3), 3, 1, base_timestamp=now),
        ErrorCode.INVALID_RECORD,
        "Inconsistent batch offset range [0, 1] and count of records 3",
    ),
    "count 0": (
        lambda now: lying_batch(records_bytes(1), 0, 0, base_timestamp=now),
        ErrorCode.INVALID_RECORD,
        "Invalid reported count for record batch: 0",
    ),
    "count -1": (
        lambda now: lying_batch(records_bytes(1), -1, 0, base_timestamp=now),
        ErrorCode.INVALID_RECORD,
        "Invalid reported count for record batch: -1",
    ),
    "count and delta larger than the records": (
        lambda now: lying_batch(records_bytes(3), 5, 4, base_timestamp=now),
        ErrorCode.INVALID_RECORD,
        PREMATURE_EOF,
    ),
    "count and delta smaller than the records": (
        lambda now: lying_batch(records_bytes(3), 2, 1, base_timestamp=now),
        ErrorCode.INVALID_RECORD,
        REMAINING,
    ),
    "bytes after the last record": (
        lambda now: lying_batch(records_bytes(3) + b"\0\0\0", 3, 2, base_timestamp=now),
        ErrorCode.INVALID_RECORD,
        REMAINING,
    ),
    "a record length past the batch": (
        lambda now: lying_batch(bytes([0x7E]) + records_bytes(1)[1:], 1, 0, base_timestamp=now),
        ErrorCode.INVALID_RECORD,
        "Invalid record size: expected 63 bytes in record payload, but instead the buffer has only 8 remaining bytes.",
    ),
    "base offset not 0": (
        lambda now: lying_batch(records_bytes(1), 1, 0, base_timestamp=now, base_offset=5),
        ErrorCode.INVALID_RECORD,
        "The baseOffset of the record batch in the append should be 0, but it is 5",
    ),
    "producer id without a sequence": (
        lambda now: lying_batch(records_bytes(1), 1, 0, base_timestamp=now, producer_id=1000),
        ErrorCode.INVALID_RECORD,
        "Invalid sequence number -1 in record batch with producerId 1000",
    ),
    "unknown compression codec": (
        lambda now: lying_batch(records_bytes(1), 1, 0, base_timestamp=now, attributes=5),
        ErrorCode.UNKNOWN_SERVER_ERROR,
        "Unknown compression type id: 5",
    ),
    "gzip: count larger than the records": (
        _compressed(GZIP, 3, claimed=5),
        ErrorCode.INVALID_RECORD,
        PREMATURE_EOF,
    ),
    "zstd: count smaller than the records": (
        _compressed(ZSTD, 3, claimed=2),
        ErrorCode.INVALID_RECORD,
        REMAINING,
    ),
    "gzip: inner offset deltas all 0": (
        _compressed(GZIP, 3, [0, 0, 0]),
        ErrorCode.UNKNOWN_SERVER_ERROR,
        OUT_OF_ORDER,
    ),
    "lz4: inner offset deltas reversed": (
        _compressed(LZ4, 3, [2, 1, 0]),
        ErrorCode.UNKNOWN_SERVER_ERROR,
        OUT_OF_ORDER,
    ),
    "gzip: not gzip": (
        lambda now: lying_batch(b"\x1f\x8b" + b"\0" * 30, 1, 0, base_timestamp=now, attributes=GZIP),
        ErrorCode.UNKNOWN_SERVER_ERROR,
        "Failed to decompress record stream: corrupt compressed data: invalid gzip header",
    ),
}

# Refused for the whole request before any log sees it: a transactional batch with no transactional id.
REQUEST_SHAPES: dict[str, tuple[Shape, ErrorCode, str]] = {
    "transactional batch without a transactional id": (
        lambda now: lying_batch(
            records_bytes(1), 1, 0, base_timestamp=now, producer_id=1000, base_sequence=0, attributes=0x10
        ),
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        "Transactional Id authorization failed.",
    ),
}

# Shapes Kafka accepts (and kbroker with it): the max timestamp is recomputed from the records, a client's
# LogAppendTime bit is cleared, inner offset deltas of an uncompressed batch are not looked at.
# label -> (builder, the stored batch's (max timestamp - now, LogAppendTime bit))
ACCEPTED_SHAPES: dict[str, tuple[Shape, tuple[int, bool]]] = {
    "max timestamp below the base": (
        lambda now: lying_batch(
            records_bytes(2, timestamp_deltas=[0, 7]), 2, 1, base_timestamp=now, max_timestamp=now - 1000
        ),
        (7, False),
    ),
    "max timestamp above the records": (
        lambda now: lying_batch(records_bytes(1), 1, 0, base_timestamp=now, max_timestamp=now + 1000),
        (0, False),
    ),
    "LogAppendTime bit from a client": (
        lambda now: lying_batch(records_bytes(1), 1, 0, base_timestamp=now, max_timestamp=now + 3, attributes=0x08),
        (3, False),
    ),
    "uncompressed inner offset deltas all 0": (
        lambda now: lying_batch(records_bytes(3, [0, 0, 0]), 3, 2, base_timestamp=now),
        (0, False),
    ),
}


# --- over the wire ------------------------------------------------------------------------------------


def produce(client: WireClient, topic: str, batch: bytes) -> tuple[int, str | None, int]:
    request = ProduceRequest(
        acks=-1,
        timeout_ms=10_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
            )
        ],
    )
    answer = client.request(request, 9).responses[0].partition_responses[0]
    return answer.error_code, answer.error_message, answer.base_offset


def offset_for_timestamp(client: WireClient, topic: str, timestamp: int) -> tuple[int, int, int]:
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=timestamp)]
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=wanted)]
    )
    answer = client.request(request, 7).topics[0].partitions[0]
    return answer.error_code, answer.offset, answer.timestamp


def good(now: int, *values: bytes) -> bytes:
    return lying_batch(
        b"".join(encode_record(Record(offset_delta=i, value=v)) for i, v in enumerate(values)),
        len(values),
        len(values) - 1,
        base_timestamp=now,
    )


def test_each_lying_batch_is_refused_over_the_wire_and_leaves_the_log_as_it_was(broker: RunningBroker) -> None:
    now = int(time.time() * 1000)
    with WireClient(broker.bootstrap) as client:
        topic = CreateTopicsRequest.CreatableTopic(name="lies", num_partitions=1, replication_factor=1)
        assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7).topics[0].error_code == 0
        assert produce(client, "lies", good(now, b"a", b"b"))[::2] == (ErrorCode.NONE, 0)
        refused = {label: produce(client, "lies", build(now)) for label, (build, _, _) in LYING_SHAPES.items()}
        assert refused == {label: (code, message, -1) for label, (_, code, message) in LYING_SHAPES.items()}
        # Nothing of them took an offset: the next good batch follows the first one.
        assert produce(client, "lies", good(now + 10, b"c"))[::2] == (ErrorCode.NONE, 2)
        assert offset_for_timestamp(client, "lies", now + 5) == (ErrorCode.NONE, 2, now + 10)
        assert offset_for_timestamp(client, "lies", now) == (ErrorCode.NONE, 0, now)


# --- at the log, across restarts ---------------------------------------------------------------------


def stored(plog: PartitionLog) -> list[tuple[int, bytes | None]]:
    """Every record of the log, segment after segment, as (offset, value)."""
    found: list[tuple[int, bytes | None]] = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        for header, view in iter_batches(plog.read(offset, 1 << 20).read_bytes()):
            found.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
            offset = header.next_offset
    return found


@pytest.mark.parametrize("clean", [True, False], ids=["clean restart", "unclean restart"])
def test_a_restart_keeps_every_acknowledged_record_around_the_refusals(tmp_path: Path, clean: bool) -> None:
    now = int(time.time() * 1000)
    plog = PartitionLog("t", 0, tmp_path, LogConfig(segment_bytes=400), clean=True)
    acknowledged: list[tuple[int, bytes | None]] = []
    for index, (label, (build, code, message)) in enumerate(LYING_SHAPES.items()):
        value = b"good-%d" % index
        result = plog.append(bytearray(good(now, value)), now_ms=now)
        assert result.error_code == ErrorCode.NONE
        acknowledged.append((result.base_offset, value))
        end, size = plog.log_end_offset, plog.size_bytes
        refused = plog.append(bytearray(build(now)), now_ms=now)
        assert (refused.error_code, refused.error_message) == (code, message), label
        assert (plog.log_end_offset, plog.size_bytes) == (end, size), label
    assert [offset for offset, _ in acknowledged] == list(range(len(LYING_SHAPES)))
    assert stored(plog) == acknowledged
    if clean:
        plog.close()
    # Unclean: the files are left as a kill would leave them and recovery scans every batch again.
    again = PartitionLog("t", 0, tmp_path, LogConfig(segment_bytes=400), clean=clean)
    assert stored(again) == acknowledged
    assert again.append(bytearray(good(now, b"after")), now_ms=now).base_offset == len(acknowledged)
    again.close()


def test_accepted_shapes_are_stored_as_kafka_stores_them(tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    plog = PartitionLog("t", 0, tmp_path, LogConfig(), clean=True)
    for label, (build, (max_after_now, log_append_time)) in ACCEPTED_SHAPES.items():
        result = plog.append(bytearray(build(now)), now_ms=now)
        assert result.error_code == ErrorCode.NONE, label
        header = BatchHeader.parse(plog.read(result.base_offset, 1 << 20).read_bytes())
        assert (header.max_timestamp - now, header.is_log_append_time) == (max_after_now, log_append_time), label
    # The max timestamps are the records' own: ListOffsets by timestamp finds the second record of the first.
    assert plog.offset_for_timestamp(now + 1) == (1, now + 7)
    plog.close()


def test_a_transactional_batch_without_a_transactional_id_is_refused_for_the_whole_request(tmp_path: Path) -> None:
    ((build, code, message),) = REQUEST_SHAPES.values()
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        topic = CreateTopicsRequest.CreatableTopic(name="txn", num_partitions=1, replication_factor=1)
        assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0
        now = int(time.time() * 1000)
        assert produce(client, "txn", build(now)) == (code, message, -1)
        assert offset_for_timestamp(client, "txn", -1) == (ErrorCode.NONE, 0, -1)  # nothing was written
