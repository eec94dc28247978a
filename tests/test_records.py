"""RecordBatch v2: header view, CRC, offset assignment, record codec, control batches.

Cross-checked both ways against kafka-python's independent DefaultRecordBatch implementation, with
hypothesis generating the records.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from protocol.compression import Codec
from protocol.exceptions import DecodeError
from protocol.records import (
    HEADER_SIZE,
    BatchHeader,
    ControlRecordType,
    Record,
    assign_offsets,
    build_batch,
    build_control_batch,
    decode_records,
    encode_record,
    iter_batches,
    iter_raw_records,
    keyless_record_indexes,
    parse_control_record,
    validate_crc,
)
from tests.records_loops import records_loops  # noqa: F401 (a fixture)

# Every test here runs with the C loops of protocol/_records_native.c and with the pure-Python ones.
pytestmark = pytest.mark.usefixtures("records_loops")

CODECS = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]
optional_bytes = st.none() | st.binary(max_size=300)
headers = st.lists(st.tuples(st.text(max_size=20), optional_bytes), max_size=4)
records_strategy = st.lists(
    st.tuples(optional_bytes, optional_bytes, headers, st.integers(0, 10**6)), min_size=1, max_size=20
)


def make_records(raw: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]) -> list[Record]:
    return [
        Record(offset_delta=i, timestamp_delta=ts, key=k, value=v, headers=h) for i, (k, v, h, ts) in enumerate(raw)
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_build_and_decode_round_trip(codec: Codec) -> None:
    records = [
        Record(offset_delta=0, timestamp_delta=0, key=None, value=b"v0"),
        Record(offset_delta=1, timestamp_delta=5, key=b"k1", value=None, headers=[("h", b"x"), ("n", None)]),
        Record(offset_delta=2, timestamp_delta=9, key=b"", value=b"v2" * 1000),
    ]
    data = build_batch(
        records,
        base_offset=40,
        compression_type=codec,
        producer_id=9,
        producer_epoch=2,
        base_sequence=11,
        base_timestamp=1000,
    )
    header = BatchHeader.parse(data)
    assert (header.base_offset, header.records_count, header.compression) == (40, 3, codec)
    assert (header.last_offset, header.next_offset, header.last_sequence) == (42, 43, 13)
    assert (header.base_timestamp, header.max_timestamp) == (1000, 1009)
    assert (header.producer_id, header.producer_epoch) == (9, 2)
    assert header.size == len(data) and validate_crc(data)
    assert decode_records(data) == records


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(raw=records_strategy, codec=st.sampled_from(CODECS), base_ts=st.integers(0, 2**40))
def test_kafka_python_reads_what_we_write(raw, codec, base_ts) -> None:  # noqa: ANN001
    records = make_records(raw)
    data = build_batch(records, base_offset=7, compression_type=codec, base_timestamp=base_ts)
    theirs = DefaultRecordBatch(bytearray(data))
    assert theirs.validate_crc()
    got = list(theirs)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in got] == [
        (7 + i, base_ts + ts, k, v) for i, (k, v, _, ts) in enumerate(raw)
    ]
    assert [list(r.headers) for r in got] == [[(n, v) for n, v in h] for _, _, h, _ in raw]


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(raw=records_strategy, codec=st.sampled_from(CODECS), idempotent=st.booleans())
def test_we_read_what_kafka_python_writes(raw, codec, idempotent) -> None:  # noqa: ANN001
    pid, epoch, seq = (4242, 3, 17) if idempotent else (-1, -1, -1)
    builder = DefaultRecordBatchBuilder(2, int(codec), False, pid, epoch, seq, 1 << 24)
    base_ts = 1_700_000_000_000
    for i, (k, v, h, ts) in enumerate(raw):
        builder.append(i, timestamp=base_ts + ts, key=k, value=v, headers=h)
    data = bytes(builder.build())
    header = BatchHeader.parse(data)
    # kafka-python leaves a batch uncompressed when compressing would not make it smaller.
    assert header.compression in (codec, Codec.NONE) and header.records_count == len(raw)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (pid, epoch, seq)
    assert validate_crc(data)
    decoded = decode_records(data)
    assert [
        (r.offset_delta, header.base_timestamp + r.timestamp_delta, r.key, r.value, r.headers) for r in decoded
    ] == [(i, base_ts + ts, k, v, list(h)) for i, (k, v, h, ts) in enumerate(raw)]


def test_assign_offsets_keeps_crc_and_log_append_time_recomputes_it() -> None:
    data = bytearray(build_batch([Record(value=b"a"), Record(offset_delta=1, value=b"b")], base_timestamp=5))
    assign_offsets(data, 1234, partition_leader_epoch=7)
    header = BatchHeader.parse(data)
    assert (header.base_offset, header.partition_leader_epoch) == (1234, 7) and validate_crc(data)
    assign_offsets(data, 1234, log_append_time_ms=99_000)
    header = BatchHeader.parse(data)
    assert header.is_log_append_time and header.max_timestamp == 99_000 and validate_crc(data)
    theirs = DefaultRecordBatch(bytearray(data))
    assert theirs.validate_crc() and [r.timestamp for r in theirs] == [99_000, 99_000]


def test_header_view_does_not_depend_on_record_count() -> None:
    small = build_batch([Record(offset_delta=i, value=b"x" * 1000) for i in range(10)], base_timestamp=1)
    big = build_batch([Record(offset_delta=i, value=b"x") for i in range(10_000)], base_timestamp=1)
    assert BatchHeader.parse(small).records_count == 10
    assert BatchHeader.parse(big).records_count == 10_000
    assert BatchHeader.parse(big).last_offset_delta == 9_999


def test_iter_batches_splits_and_tolerates_a_partial_tail() -> None:
    one = build_batch([Record(value=b"a")], base_offset=0, base_timestamp=1)
    two = build_batch([Record(value=b"b")], base_offset=1, base_timestamp=1)
    blob = one + two + two[:30]
    assert [h.base_offset for h, _ in iter_batches(blob)] == [0, 1]
    with pytest.raises(DecodeError):
        list(iter_batches(blob, strict=True))


def test_control_batches() -> None:
    data = build_control_batch(producer_id=5, producer_epoch=1, commit=True, coordinator_epoch=3, timestamp_ms=10)
    header = BatchHeader.parse(data)
    assert header.is_control and header.is_transactional and validate_crc(data)
    (record,) = decode_records(data)
    assert parse_control_record(record) == (ControlRecordType.COMMIT, 3)
    theirs = DefaultRecordBatch(bytearray(data))
    assert theirs.is_control_batch and theirs.is_transactional
    abort = decode_records(build_control_batch(5, 1, commit=False, coordinator_epoch=0))[0]
    assert parse_control_record(abort)[0] == ControlRecordType.ABORT


def test_bad_crc_is_detected() -> None:
    data = bytearray(build_batch([Record(value=b"payload")], base_timestamp=1))
    data[-2] ^= 1
    assert not validate_crc(data)


def test_magic_other_than_two_is_refused() -> None:
    data = bytearray(build_batch([Record(value=b"v")], base_timestamp=1))
    data[16] = 1
    with pytest.raises(DecodeError, match="magic"):
        list(iter_batches(data))
    with pytest.raises(DecodeError):
        decode_records(data)


@settings(max_examples=300)
@given(st.binary(max_size=400))
def test_fuzz_random_bytes_only_raise_decode_error(data: bytes) -> None:
    for parse in (lambda d: list(iter_batches(d, strict=True)), decode_records, BatchHeader.parse):
        try:
            parse(data)
        except DecodeError:
            pass


@settings(max_examples=300)
@given(
    codec=st.sampled_from(CODECS),
    position=st.integers(0, 10_000),
    value=st.integers(0, 255),
    cut=st.integers(0, 10_000),
)
def test_fuzz_mutated_batches_only_raise_decode_error(codec: Codec, position: int, value: int, cut: int) -> None:
    data = bytearray(
        build_batch(
            [Record(offset_delta=i, key=b"k", value=b"v" * i, headers=[("h", b"1")]) for i in range(5)],
            compression_type=codec,
            base_timestamp=1,
        )
    )
    data[position % len(data)] = value
    data = data[: max(HEADER_SIZE - 5, len(data) - cut % 50)]
    try:
        decode_records(data)
    except DecodeError:
        pass


def test_huge_record_count_and_lengths_are_refused_without_allocating() -> None:
    data = bytearray(build_batch([Record(value=b"v")], base_timestamp=1))
    struct.pack_into(">i", data, 57, 2**31 - 1)  # records count
    with pytest.raises(DecodeError):
        decode_records(data)
    data = bytearray(build_batch([Record(value=b"v")], base_timestamp=1))
    struct.pack_into(">i", data, 8, 2**31 - 1)  # batch length
    with pytest.raises(DecodeError):
        decode_records(data)


def test_keyless_record_indexes_and_raw_records_read_keys_whatever_the_varint_widths() -> None:
    records = [
        Record(offset_delta=0, timestamp_delta=0, key=b"a", value=b"1"),
        Record(offset_delta=1, timestamp_delta=70_000, key=None, value=b"2" * 300),  # 3-byte delta, long value
        Record(offset_delta=200, timestamp_delta=-5, key=b"k" * 200, value=None),  # 2-byte offset delta and key
        Record(offset_delta=3, timestamp_delta=1, key=None, value=None),
    ]
    body = b"".join(encode_record(r) for r in records)
    assert keyless_record_indexes(body, 4) == [1, 3]
    raw = list(iter_raw_records(body, 4))
    assert [(r.offset_delta, r.timestamp_delta, r.key, r.has_value) for r in raw] == [
        (0, 0, b"a", True),
        (1, 70_000, None, True),
        (200, -5, b"k" * 200, False),
        (3, 1, None, False),
    ]
    assert b"".join(body[r.start : r.end] for r in raw) == body
    for broken in (body[:-1], body + b"\x00"):
        with pytest.raises(DecodeError):
            keyless_record_indexes(broken, 4)
        with pytest.raises(DecodeError):
            list(iter_raw_records(broken, 4))
