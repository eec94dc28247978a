"""kbroker/storage/validation.py: the one check a batch passes before it is appended, code and message as Kafka."""

from __future__ import annotations

import struct

import pytest

from kbroker.storage.validation import validate_batch
from protocol import compression
from protocol.errors import ErrorCode, KafkaError
from protocol.records import (
    CONTROL_BIT,
    HEADER_SIZE,
    BatchHeader,
    Record,
    RecordsWalk,
    build_batch,
    compute_crc,
    encode_record,
    header_problem,
    validate_crc,
    walk_records,
)
from tests.records_loops import records_loops  # noqa: F401 (a fixture)

# Every test here runs with the C loops of protocol/_records_native.c and with the pure-Python ones.
pytestmark = pytest.mark.usefixtures("records_loops")


def _batch(count: int = 2) -> bytearray:
    records = [Record(offset_delta=i, timestamp_delta=0, key=b"k", value=b"v%d" % i) for i in range(count)]
    return bytearray(build_batch(records, base_timestamp=1_700_000_000_000))


def _rewrite(batch: bytearray, fmt: str, position: int, value: int, *, fix_crc: bool = True) -> bytearray:
    struct.pack_into(fmt, batch, position, value)
    if fix_crc:
        struct.pack_into(">I", batch, 17, compute_crc(batch))
    return batch


def _rejected(records: bytes | bytearray, max_bytes: int = 1 << 20) -> tuple[ErrorCode, str | None]:
    with pytest.raises(KafkaError) as caught:
        validate_batch(records, max_bytes)
    return caught.value.code, caught.value.message


def test_a_good_batch_gives_its_header() -> None:
    batch = _batch(3)
    header = validate_batch(batch, 1 << 20)
    assert (header.records_count, header.last_offset_delta, header.size) == (3, 2, len(batch))


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        (b"", (ErrorCode.CORRUPT_MESSAGE, "no record batch")),
        (b"\0" * 10, (ErrorCode.CORRUPT_MESSAGE, "10 bytes are too few for a batch")),
    ],
)
def test_too_short(records: bytes, expected: tuple[ErrorCode, str]) -> None:
    assert _rejected(records) == expected


def test_each_rejection_has_kafkas_code_and_a_message() -> None:
    assert _rejected(_rewrite(_batch(), ">b", 16, 1)) == (
        ErrorCode.CORRUPT_MESSAGE,
        "record batch magic 1 is not supported",
    )
    short = _batch()
    assert _rejected(_rewrite(short, ">i", 8, 10)) == (
        ErrorCode.CORRUPT_MESSAGE,
        "record batch length 10 does not fit the data",
    )
    assert _rejected(_rewrite(_batch(), ">i", 8, 10_000)) == (
        ErrorCode.CORRUPT_MESSAGE,
        "record batch length 10000 does not fit the data",
    )
    two = _batch() + _batch()
    assert _rejected(two) == (ErrorCode.INVALID_RECORD, "a produce request must hold exactly one batch per partition")
    big = _batch()
    assert _rejected(big, max_bytes=len(big) - 1) == (
        ErrorCode.MESSAGE_TOO_LARGE,
        f"batch of {len(big)} bytes exceeds {len(big) - 1}",
    )
    # Kafka answers INVALID_RECORD for a count of 0 (LogValidator), not CORRUPT_MESSAGE as kbroker did.
    assert _rejected(_rewrite(_rewrite(_batch(), ">i", 57, 0), ">i", 23, 0)) == (
        ErrorCode.INVALID_RECORD,
        "Invalid reported count for record batch: 0",
    )
    control = _batch()
    assert _rejected(_rewrite(control, ">h", 21, CONTROL_BIT)) == (
        ErrorCode.INVALID_RECORD,
        "Clients are not allowed to write control records",
    )
    flipped = _batch()
    flipped[-1] ^= 0xFF
    assert _rejected(flipped) == (ErrorCode.CORRUPT_MESSAGE, "batch CRC does not match its contents")


def test_header_problem_is_the_structural_check_recovery_uses() -> None:
    header = BatchHeader.parse(_batch())
    assert header_problem(header) is None
    assert header_problem(header._replace(magic=0)) == "record batch magic 0 is not supported"
    assert header_problem(header._replace(batch_length=HEADER_SIZE - 13)) == (
        f"record batch length {HEADER_SIZE - 13} is smaller than a batch header"
    )
    assert header_problem(header._replace(last_offset_delta=-1)) == "negative offsets"
    assert header_problem(header._replace(base_offset=-5)) == "negative offsets"


# --- the records walk and the max timestamp ------------------------------------------------------------


@pytest.mark.parametrize("codec", [0, 3], ids=["uncompressed", "lz4"])
@pytest.mark.parametrize(
    ("count", "value_size", "timestamp_step"),
    [(1, 1, 0), (70, 200, 1), (9000, 1, 0), (3, 20_000, 100_000), (5, 10, -3)],
    ids=["one", "two-byte varints", "offset deltas past 8191", "long lengths and deltas", "negative deltas"],
)
def test_the_walk_takes_every_well_formed_batch(codec: int, count: int, value_size: int, timestamp_step: int) -> None:
    base = 1_700_000_000_000
    records = [
        Record(offset_delta=i, timestamp_delta=i * timestamp_step, value=b"x" * value_size) for i in range(count)
    ]
    batch = bytearray(build_batch(records, base_timestamp=base, compression_type=codec))
    header = validate_batch(batch, 1 << 30)
    expected_max = base + max(0, (count - 1) * timestamp_step)
    assert (header.records_count, header.max_timestamp) == (count, expected_max)
    body = bytes(batch[HEADER_SIZE:]) if not codec else compression.decompress(codec, batch[HEADER_SIZE:], 1 << 30)
    deltas = [r.timestamp_delta for r in records]
    assert walk_records(body, count) == RecordsWalk(max(deltas), True, min(deltas))


def test_out_of_order_offset_deltas_are_seen_past_the_fast_walk() -> None:
    records = [Record(offset_delta=i, value=b"v") for i in range(100)]
    records[80].offset_delta = 81  # a two-byte delta that is not its index
    body = b"".join(encode_record(r) for r in records)
    assert walk_records(body, 100) == RecordsWalk(0, False)
    assert walk_records(body, 100, check_offsets=False) == RecordsWalk(0, True)


def test_a_lying_max_timestamp_is_corrected_in_place_or_refused_when_read_only() -> None:
    batch = _rewrite(_batch(), ">q", 35, 1_700_000_009_999)  # max timestamp claims more than the records
    header = validate_batch(batch, 1 << 20)
    assert header.max_timestamp == 1_700_000_000_000 == BatchHeader.parse(batch).max_timestamp
    assert validate_crc(batch)
    lying = bytes(_rewrite(_batch(), ">q", 35, 1_700_000_009_999))
    assert _rejected(lying) == (
        ErrorCode.INVALID_RECORD,
        "max timestamp 1700000009999 does not match the records' 1700000000000 (read-only batch)",
    )


def test_recovery_is_not_stricter_than_storage_needs() -> None:
    """A stored batch may hold fewer records than its offset range (compaction keeps the range) or none: the
    recovery scan's header check must not cut the log there, while the validator refuses it from a client."""
    header = BatchHeader.parse(_batch(3))
    for stored in (header._replace(records_count=1), header._replace(records_count=0)):
        assert header_problem(stored) is None
    compacted = _rewrite(_batch(3), ">i", 57, 1)
    assert _rejected(compacted) == (
        ErrorCode.INVALID_RECORD,
        "Inconsistent batch offset range [0, 2] and count of records 1",
    )


def test_three_byte_offset_deltas_stay_on_the_fast_walk_and_out_of_order_ones_are_seen() -> None:
    records = [Record(offset_delta=i, value=b"v") for i in range(20_000)]
    body = b"".join(encode_record(r) for r in records)
    assert walk_records(body, 20_000) == RecordsWalk(0, True, 0)
    records[17_000].offset_delta = 17_001  # a three-byte delta that is not its index
    body = b"".join(encode_record(r) for r in records)
    assert walk_records(body, 20_000) == RecordsWalk(0, False, 0)
