"""RecordBatch v2 (magic 2), sans I/O.

The broker's hot path only needs the 61-byte batch header: ``BatchHeader`` reads it with one struct call
and never touches the records, so its cost does not depend on how many records a batch holds. Full
record decoding and encoding are here too, for features that need them and for tests.

Layout (big-endian): baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 |
crc uint32 | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 |
producerId int64 | producerEpoch int16 | baseSequence int32 | recordsCount int32 | records.
The CRC-32C covers everything from attributes to the end, so the base offset and the partition leader
epoch can be rewritten without recomputing it, but a LogAppendTime max timestamp cannot.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from types import ModuleType
from typing import NamedTuple

from protocol import compression
from protocol.exceptions import DecodeError


def _load_crc32c() -> Callable[..., int]:
    """The crc32c package's C function, loaded without running the package's __init__: that reads the
    installed version through importlib.metadata and imports its command line, about 15 ms of every broker
    start-up for a function it does not need. The same extension module, registered under its own name (a
    later ``import crc32c`` reuses it); the plain import if the package is laid out differently."""
    import importlib.machinery
    import importlib.util
    import os.path
    import sys

    name = "crc32c._crc32c"
    try:
        module = sys.modules.get(name)
        if module is None:
            package = importlib.util.find_spec("crc32c")
            locations = package.submodule_search_locations if package is not None else None
            paths = [
                os.path.join(location, f"_crc32c{suffix}")
                for location in locations or ()
                for suffix in importlib.machinery.EXTENSION_SUFFIXES
            ]
            path = next(path for path in paths if os.path.isfile(path))
            loader = importlib.machinery.ExtensionFileLoader(name, path)
            spec = importlib.util.spec_from_file_location(name, path, loader=loader)
            assert spec is not None
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            sys.modules[name] = module
        function: Callable[..., int] = module.crc32c
        return function
    except (ImportError, StopIteration, AttributeError, AssertionError, OSError):
        from crc32c import crc32c as function_from_package

        return function_from_package


crc32c = _load_crc32c()


def _load_native() -> ModuleType | None:
    """protocol._records_native, the C build of this module's per-record loops (protocol/_records_native.c),
    or None: not built (``pip install -e .`` on a machine without a compiler), or KBROKER_PURE_PYTHON=1 set."""
    if os.environ.get("KBROKER_PURE_PYTHON", "") not in ("", "0"):
        return None
    import importlib

    try:
        return importlib.import_module("protocol._records_native")
    except ImportError:
        return None


# The per-record loops below ask this first; it answers every valid batch and leaves the rest (anything that
# fails, which the Python loops word) to them. Tests set it to None to run the Python loops.
_native = _load_native()

HEADER = struct.Struct(">qiiBIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # base offset and batch length precede what batch length counts
CRC_START = 21  # attributes onwards
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")
_MAGIC_AT = 16
_ATTRIBUTES_AT = 21
_MAX_TIMESTAMP_AT = 35

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40

NO_PRODUCER_ID = -1
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024


class BatchHeader(NamedTuple):
    """The 61-byte header of a RecordBatch (magic 2). A named tuple: parsed on every produce and every scan."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
        try:
            return cls._make(HEADER.unpack_from(data, pos))
        except struct.error as exc:
            raise DecodeError(f"record batch header truncated: {exc}") from exc

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_BIT)

    @property
    def size(self) -> int:
        """Bytes the whole batch takes, including the offset and length fields."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) % (2**31)


def header_problem(header: BatchHeader) -> str | None:
    """What makes a header unusable as a stored batch, wherever it is read (produce, recovery, scans); None if fine.

    Only the header's own fields are checked: whether the batch fits the bytes around it, and its CRC, are the
    caller's to check because they need the data. Deliberately looser than kbroker/storage/validation.py,
    which refuses what a client may not write: a stored batch may hold fewer records than its offset range,
    or none (compaction keeps the range), and recovery must not cut the log, and every acknowledged record
    after it, at such a batch. Kafka's LogSegment.recover checks no more than size, CRC and offsets either.
    """
    if header.magic != 2:
        return f"record batch magic {header.magic} is not supported"
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        return f"record batch length {header.batch_length} is smaller than a batch header"
    if header.last_offset_delta < 0 or header.base_offset < 0:
        return "negative offsets"
    return None


def iter_batches(
    data: bytes | bytearray | memoryview, *, strict: bool = False
) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Split a records blob into (header, whole-batch view) pairs.

    A trailing partial batch (a Fetch response may end with one) ends the iteration, or raises
    DecodeError when ``strict``. Magic other than 2 is always an error: formats v0 and v1 are not supported.
    """
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    end = len(view)
    pos = 0
    while pos < end:
        if end - pos < HEADER_SIZE:
            if strict:
                raise DecodeError(f"{end - pos} trailing bytes are too few for a record batch")
            return
        (_, batch_length) = _OFFSET_AND_LENGTH.unpack_from(view, pos)
        if batch_length < HEADER_SIZE - LOG_OVERHEAD:
            raise DecodeError(f"record batch length {batch_length} is smaller than a batch header")
        magic = view[pos + _MAGIC_AT]
        if magic != 2:
            raise DecodeError(f"record batch magic {magic} is not supported (only magic 2, Kafka 0.11+)")
        size = batch_length + LOG_OVERHEAD
        if pos + size > end:
            if strict:
                raise DecodeError(f"record batch of {size} bytes runs past the end of the data")
            return
        header = BatchHeader(*HEADER.unpack_from(view, pos))
        yield header, view[pos : pos + size]
        pos += size


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    return crc32c(memoryview(batch)[CRC_START:])


def validate_crc(batch: bytes | bytearray | memoryview) -> bool:
    (stored,) = _UINT32.unpack_from(batch, 17)
    return stored == compute_crc(batch)


def assign_offsets(
    batch: bytearray | memoryview,
    base_offset: int,
    *,
    partition_leader_epoch: int | None = None,
    log_append_time_ms: int | None = None,
) -> None:
    """Rewrite a batch in place as the log stores it; the CRC stays correct."""
    _INT64.pack_into(batch, 0, base_offset)
    if partition_leader_epoch is not None:
        _INT32.pack_into(batch, 12, partition_leader_epoch)
    if log_append_time_ms is not None:
        (attributes,) = _INT16.unpack_from(batch, _ATTRIBUTES_AT)
        _INT16.pack_into(batch, _ATTRIBUTES_AT, attributes | TIMESTAMP_TYPE_BIT)
        _INT64.pack_into(batch, _MAX_TIMESTAMP_AT, log_append_time_ms)
        _UINT32.pack_into(batch, 17, compute_crc(batch))


# --- records -------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Record:
    offset_delta: int = 0
    timestamp_delta: int = 0
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    attributes: int = 0


def _read_varint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Zigzag-encoded signed varint, at most 10 bytes."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise DecodeError("varint runs past the end of the record")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise DecodeError("varint longer than 10 bytes")
    return (result >> 1) ^ -(result & 1), pos


def _short_varint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """``_read_varint`` with the one- and two-byte forms (the usual record lengths and deltas) done here."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    second = buf[pos + 1]
    if second < 0x80:
        raw = (b & 0x7F) | (second << 7)
        return (raw >> 1) ^ -(raw & 1), pos + 2
    return _read_varint(buf, pos, end)


def _write_varint(out: bytearray, value: int) -> None:
    zigzag = (value << 1) ^ (value >> 63)
    zigzag &= (1 << 64) - 1
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)


def _read_sized(buf: bytes | memoryview, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint(buf, pos, end)
    if length < 0:
        if length != -1:
            raise DecodeError(f"invalid length {length} in record")
        return None, pos
    if pos + length > end:
        raise DecodeError(f"length {length} runs past the end of the record")
    return bytes(buf[pos : pos + length]), pos + length


def _decode_record(buf: bytes | memoryview, pos: int, end: int) -> tuple[Record, int]:
    length, pos = _read_varint(buf, pos, end)
    if length <= 0 or pos + length > end:
        raise DecodeError(f"record length {length} is invalid here")
    record_end = pos + length
    attributes = buf[pos]
    pos += 1
    timestamp_delta, pos = _read_varint(buf, pos, record_end)
    offset_delta, pos = _read_varint(buf, pos, record_end)
    key, pos = _read_sized(buf, pos, record_end)
    value, pos = _read_sized(buf, pos, record_end)
    count, pos = _read_varint(buf, pos, record_end)
    if count < 0 or count > record_end - pos:
        raise DecodeError(f"header count {count} is invalid")
    headers = []
    for _ in range(count):
        name, pos = _read_sized(buf, pos, record_end)
        if name is None:
            raise DecodeError("record header with a null key")
        header_value, pos = _read_sized(buf, pos, record_end)
        try:
            headers.append((name.decode(), header_value))
        except UnicodeDecodeError as exc:
            raise DecodeError("record header key is not UTF-8") from exc
    if pos != record_end:
        raise DecodeError("record length does not match its contents")
    return Record(offset_delta, timestamp_delta, key, value, headers, attributes), pos


def decode_records(batch: bytes | bytearray | memoryview, max_size: int = DEFAULT_MAX_DECOMPRESSED) -> list[Record]:
    """Every record of one batch, decompressing with at most ``max_size`` bytes of output."""
    header = BatchHeader.parse(batch)
    if header.magic != 2:
        raise DecodeError(f"record batch magic {header.magic} is not supported")
    if header.size > len(batch):
        raise DecodeError("record batch truncated")
    body: bytes | memoryview = memoryview(batch)[HEADER_SIZE : header.size]
    if header.compression:
        body = compression.decompress(header.compression, body, max_size)
    count = header.records_count
    if count < 0 or count > len(body):
        raise DecodeError(f"record count {count} is impossible for {len(body)} bytes")
    records = []
    pos, end = 0, len(body)
    for _ in range(count):
        record, pos = _decode_record(body, pos, end)
        records.append(record)
    if pos != end:
        raise DecodeError(f"{end - pos} bytes after the last record")
    return records


# --- validation helpers: a walk over the records that checks their framing without building them ---------

# Kafka's own words (DefaultRecordBatch's record iterator, DefaultRecord.readFrom), which its log shows.
PREMATURE_EOF = "Incorrect declared batch size, premature EOF reached"
RECORDS_REMAINING = "Incorrect declared batch size, records still remaining in file"
INVALID_STRUCTURE = "Found invalid record structure"


class RecordsWalk(NamedTuple):
    """What a walk over one batch's records found: the largest and smallest timestamp deltas, whether offset
    deltas run 0..n-1."""

    max_timestamp_delta: int
    offset_deltas_in_order: bool
    min_timestamp_delta: int = 0


def walk_records(body: bytes | memoryview, count: int, *, check_offsets: bool = True) -> RecordsWalk:
    """Check that ``body`` (a batch's records, decompressed) is exactly ``count`` records, each within its length.

    The produce path's walk: per record its length, timestamp delta and offset delta are read and the rest
    is jumped over, so a batch whose count or lengths lie is caught at a fraction of a full decode's cost.
    Keys, values and headers inside a record are not checked (Kafka's full decode checks them too). Raises
    DecodeError with Kafka's message. The C loop (``_native``) answers any batch that passes; without it, or for
    one that fails, a tight Python loop handles the common shapes and anything else (long varints, negative
    deltas, an error) is walked again by the careful loop, which also words the error. Without
    ``check_offsets`` (an uncompressed batch: Kafka does not look at its offset deltas) the answer's
    ``offset_deltas_in_order`` is True whatever the deltas are.
    """
    if _native is not None:
        answer: RecordsWalk | None = _native.walk_records(body, count, check_offsets, RecordsWalk)
        if answer is not None:
            return answer
    try:
        walk = _fast_walk(body, count, check_offsets)
    except IndexError:  # ran off the end: the careful walk says where
        walk = None
    return walk if walk is not None else _careful_walk(body, count, check_offsets)


def _fast_walk(body: bytes | memoryview, count: int, check_offsets: bool) -> RecordsWalk | None:
    """The walk for records whose length and timestamp delta are one- or two-byte varints (a delta of 0 to
    8191 ms) and, with ``check_offsets``, whose offset delta is its index (up to 1,048,575); None where the
    careful walk must decide (and for a batch whose offset deltas are out of order, which it confirms)."""
    pos = 0
    max_timestamp_zigzag = 0
    min_timestamp_zigzag = 0x4000  # above any two-byte varint: the first record sets it
    for index in range(count):
        first = body[pos]
        if first < 0x80:
            zigzag = first
            pos += 1
        else:
            second = body[pos + 1]
            if second >= 0x80:
                return None
            zigzag = (first & 0x7F) | (second << 7)
            pos += 2
        if zigzag & 1 or zigzag < 6:  # a negative length, or too short for attributes and two deltas
            return None
        record_end = pos + (zigzag >> 1)
        first = body[pos + 1]  # the timestamp delta, after the attributes byte
        if first < 0x80:
            zigzag = first
            offset_at = pos + 2
        else:
            second = body[pos + 2]
            if second >= 0x80:
                return None
            zigzag = (first & 0x7F) | (second << 7)
            offset_at = pos + 3
        if zigzag & 1 or offset_at >= record_end:
            return None
        if zigzag > max_timestamp_zigzag:
            max_timestamp_zigzag = zigzag
        if zigzag < min_timestamp_zigzag:
            min_timestamp_zigzag = zigzag
        if check_offsets:
            expected = index << 1  # the zigzag form of the delta the index calls for
            if expected < 0x80:
                if body[offset_at] != expected:
                    return None
            elif expected < 0x4000:
                if body[offset_at] != (expected & 0x7F) | 0x80 or body[offset_at + 1] != expected >> 7:
                    return None
            elif (  # three bytes: a batch of up to 1,048,575 records (a 1 MB batch of small records has ~10,000)
                expected >= 0x200000
                or body[offset_at] != (expected & 0x7F) | 0x80
                or body[offset_at + 1] != ((expected >> 7) & 0x7F) | 0x80
                or body[offset_at + 2] != expected >> 14
            ):
                return None
        pos = record_end
    if pos != len(body):
        return None
    # Only even zigzags (deltas >= 0) get here, so the zigzag order is the deltas' order.
    return RecordsWalk(max_timestamp_zigzag >> 1, True, min_timestamp_zigzag >> 1 if count else 0)


def _careful_walk(body: bytes | memoryview, count: int, check_offsets: bool) -> RecordsWalk:
    end = len(body)
    pos = 0
    max_timestamp_delta = -(2**63)
    min_timestamp_delta = 2**63
    in_order = True
    for index in range(count):
        if pos >= end:
            raise DecodeError(PREMATURE_EOF)
        first = body[pos]
        if first < 0x80:
            length = (first >> 1) ^ -(first & 1)
            pos += 1
        elif pos + 1 < end and body[pos + 1] < 0x80:
            raw = (first & 0x7F) | (body[pos + 1] << 7)
            length = (raw >> 1) ^ -(raw & 1)
            pos += 2
        else:
            try:
                length, pos = _read_varint(body, pos, end)
            except DecodeError:
                raise DecodeError(PREMATURE_EOF) from None
        if length > end - pos:
            raise DecodeError(
                f"Invalid record size: expected {length} bytes in record payload, "
                f"but instead the buffer has only {end - pos} remaining bytes."
            )
        if length < 3:  # attributes, a timestamp delta and an offset delta at the least
            raise DecodeError(INVALID_STRUCTURE)
        record_end = pos + length
        at = pos + 1  # past the attributes byte
        first = body[at]
        if first < 0x80:
            timestamp_delta = (first >> 1) ^ -(first & 1)
            at += 1
        else:
            try:
                timestamp_delta, at = _read_varint(body, at, record_end)
            except DecodeError:
                raise DecodeError(INVALID_STRUCTURE) from None
        if at >= record_end:
            raise DecodeError(INVALID_STRUCTURE)
        first = body[at]
        if first < 0x80:
            offset_delta = (first >> 1) ^ -(first & 1)
        else:
            try:
                offset_delta, _ = _read_varint(body, at, record_end)
            except DecodeError:
                raise DecodeError(INVALID_STRUCTURE) from None
        if timestamp_delta > max_timestamp_delta:
            max_timestamp_delta = timestamp_delta
        if timestamp_delta < min_timestamp_delta:
            min_timestamp_delta = timestamp_delta
        if check_offsets and offset_delta != index:
            in_order = False
        pos = record_end
    if pos != end:
        raise DecodeError(RECORDS_REMAINING)
    return RecordsWalk(max_timestamp_delta, in_order, min_timestamp_delta if count else 0)


class RawRecord(NamedTuple):
    """One record of a batch as the log cleaner sees it: where its bytes are and what decides whether it stays."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    has_value: bool
    start: int  # the record's first byte (its length varint) in the batch's records
    body_start: int  # its attributes byte, just after the length
    delta_end: int  # just after its offset delta: key, value and headers follow
    end: int


def iter_raw_records(body: bytes | memoryview, count: int) -> Iterator[RawRecord]:
    """The ``count`` records of ``body`` (decompressed records of one batch) with their keys, reading no further
    into each record than its value's length. DecodeError if the records do not fit their lengths.

    The log cleaner reads every record twice per pass: lengths and deltas go through ``_short_varint``.
    """
    if _native is not None:
        records: list[RawRecord] | None = _native.raw_records(body, count, RawRecord)
        if records is not None:
            return iter(records)
    return _iter_raw_records(body, count)


def _iter_raw_records(body: bytes | memoryview, count: int) -> Iterator[RawRecord]:
    end = len(body)
    pos = 0
    try:
        for _ in range(count):
            start = pos
            length, pos = _short_varint(body, pos, end)
            record_end = pos + length
            if length < 3 or record_end > end:
                raise DecodeError(f"record length {length} is invalid here")
            body_start = pos
            at = pos + 1  # past the attributes
            timestamp_delta, at = _short_varint(body, at, record_end)
            offset_delta, at = _short_varint(body, at, record_end)
            delta_end = at
            b = body[at]
            if b < 0x80:
                key_length = (b >> 1) ^ -(b & 1)
                at += 1
            else:
                key_length, at = _read_varint(body, at, record_end)
            key = None
            if key_length >= 0:  # any negative length is a null key, as Kafka's DefaultRecord reads it
                if at + key_length > record_end:
                    raise DecodeError(INVALID_STRUCTURE)
                key = bytes(body[at : at + key_length])
                at += key_length
            b = body[at]
            if b < 0x80:
                has_value = not b & 1  # a negative (zigzag odd) length is a null value
            else:
                value_length, _ = _read_varint(body, at, record_end)
                has_value = value_length >= 0
            if at >= record_end:
                raise DecodeError("record fields run past its length")
            yield RawRecord(offset_delta, timestamp_delta, key, has_value, start, body_start, delta_end, record_end)
            pos = record_end
    except IndexError:
        raise DecodeError("record runs past the end of the batch") from None
    if pos != end:
        raise DecodeError(f"{end - pos} bytes after the last record")


class KeysMapped(NamedTuple):
    """What ``map_record_keys`` did with one batch."""

    stopped_at: int | None  # the offset of the first record the map had no room for; None if there was room
    mapped: int  # how many records it mapped
    latest_offset: int  # the offset of the last record it mapped; -1 for none


def map_record_keys(
    body: bytes | memoryview,
    count: int,
    base_offset: int,
    slots: dict[bytes, int],
    *,
    from_offset: int,
    capacity: int,
    max_short_key: int,
    long_key: Callable[[bytes], bytes],
) -> KeysMapped:
    """The log cleaner's offset map over the ``count`` records of ``body`` (a batch at ``base_offset``): for each
    record with a key at ``from_offset`` or later, in order, ``slots[key] = offset``, a key longer than
    ``max_short_key`` bytes stored as ``long_key(key)``. It stops at the first record whose key is new to a map
    that already holds ``capacity`` keys. DecodeError as ``iter_raw_records``, once the records before it are in.
    """
    if _native is not None:
        answer: KeysMapped | None = _native.map_record_keys(
            body, count, base_offset, slots, from_offset, capacity, max_short_key, long_key, KeysMapped
        )
        if answer is not None:
            return answer
    mapped, latest_offset = 0, -1
    for record in _iter_raw_records(body, count):
        key = record.key
        offset = base_offset + record.offset_delta
        if key is None or offset < from_offset:
            continue
        if len(key) > max_short_key:
            key = long_key(key)
        if len(slots) >= capacity and key not in slots:
            return KeysMapped(offset, mapped, latest_offset)
        slots[key] = latest_offset = offset
        mapped += 1
    return KeysMapped(None, mapped, latest_offset)


def retained_records(
    body: bytes | memoryview,
    count: int,
    base_offset: int,
    slots: dict[bytes, int],
    *,
    mapped_up_to: int,
    retain_deletes: bool,
    max_short_key: int,
    long_key: Callable[[bytes], bytes],
) -> tuple[list[RawRecord], bool]:
    """The records of ``body`` (a batch at ``base_offset``) the log cleaner keeps, and whether one of them is a
    tombstone (null value). Against ``slots`` (``map_record_keys``' map, which covers offsets up to
    ``mapped_up_to``) a record goes if it has no key, if its key has a later offset, or if it is a tombstone
    and not ``retain_deletes``; a record past the map stays. DecodeError as ``iter_raw_records``."""
    if _native is not None:
        answer: tuple[list[RawRecord], bool] | None = _native.retained_records(
            body, count, base_offset, slots, mapped_up_to, retain_deletes, max_short_key, long_key, RawRecord
        )
        if answer is not None:
            return answer
    kept: list[RawRecord] = []
    tombstones = False
    for record in _iter_raw_records(body, count):
        offset = base_offset + record.offset_delta
        if offset <= mapped_up_to:
            key = record.key
            if key is None:
                continue  # keyless, which a compacted topic cannot hold
            if len(key) > max_short_key:
                key = long_key(key)
            if slots.get(key, -1) > offset:
                continue  # superseded
            if not record.has_value and not retain_deletes:
                continue  # a tombstone past its delete horizon
        if not record.has_value:
            tombstones = True
        kept.append(record)
    return kept, tombstones


def builder_timestamp_deltas(body: bytes | memoryview, count: int) -> tuple[int, int] | None:
    """(smallest, largest) timestamp delta when the records are already what Kafka's builder writes (attributes
    0, offset delta = index, the first timestamp delta 0), so broker-side recompression can keep their bytes;
    None to re-encode them (kbroker/storage/recompress.py).

    Only each record's length, attributes and two deltas are read: the validator walked the framing already.
    """
    if _native is not None:
        answer: tuple[int, int] | bool | None = _native.builder_timestamp_deltas(body, count)
        if answer is False:  # read in C: not the builder's records
            return None
        if answer is not None:
            return answer  # type: ignore[return-value]  # never True
    return _builder_timestamp_deltas(body, count)


def _builder_timestamp_deltas(body: bytes | memoryview, count: int) -> tuple[int, int] | None:
    pos = 0
    lowest = highest = 0
    try:
        for index in range(count):
            length, pos = _trusted_varint(body, pos)
            end = pos + length
            if body[pos]:  # attributes: Kafka writes 0
                return None
            delta, pos = _trusted_varint(body, pos + 1)
            if index == 0:
                if delta:
                    return None
            elif delta > highest:
                highest = delta
            elif delta < lowest:
                lowest = delta
            offset_delta, _ = _trusted_varint(body, pos)
            if offset_delta != index:
                return None
            pos = end
    except IndexError:  # framing the walk would have refused: the careful path words the problem
        return None
    return lowest, highest


def _trusted_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos`` and the position after it, in records already walked (IndexError if not)."""
    byte = buf[pos]
    if byte < 0x80:  # nearly always: lengths under 64, small deltas
        return (byte >> 1) ^ -(byte & 1), pos + 1
    raw = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise IndexError("varint longer than 10 bytes")


def keyless_record_indexes(body: bytes | memoryview, count: int) -> list[int]:
    """The indexes of the records of ``body`` whose key is null (a compacted topic refuses them).

    The produce path's check for compacted topics, so it reads only what it must: each record's length, the
    two deltas it skips and its key length; the rest is jumped over. DecodeError if the records or a key do not
    fit their lengths.
    """
    if _native is not None:
        native_found: list[int] | None = _native.keyless_record_indexes(body, count)
        if native_found is not None:
            return native_found
    return _keyless_record_indexes(body, count)


def _keyless_record_indexes(body: bytes | memoryview, count: int) -> list[int]:
    found: list[int] = []
    end = len(body)
    pos = 0
    try:
        for index in range(count):
            length, pos = _short_varint(body, pos, end)
            record_end = pos + length
            if length < 3 or record_end > end:
                raise DecodeError(f"record length {length} is invalid here")
            at = pos + 1  # past the attributes
            for _ in range(2):  # the timestamp and offset deltas
                while body[at] >= 0x80:
                    at += 1
                at += 1
            key_length, at = _short_varint(body, at, record_end)
            if key_length < 0:  # null, as Kafka's DefaultRecord reads any negative length
                found.append(index)
            elif at + key_length > record_end:
                raise DecodeError(INVALID_STRUCTURE)
            pos = record_end
    except IndexError:
        raise DecodeError("record runs past the end of the batch") from None
    if pos != end:
        raise DecodeError(f"{end - pos} bytes after the last record")
    return found


def record_with_timestamp_delta(body: bytes | memoryview, record: RawRecord, timestamp_delta: int) -> bytes:
    """The record's bytes with another timestamp delta (its base timestamp changed), the rest as it was."""
    inner = bytearray()
    inner.append(body[record.body_start])  # attributes
    _write_varint(inner, timestamp_delta)
    _write_varint(inner, record.offset_delta)
    inner += body[record.delta_end : record.end]
    out = bytearray()
    _write_varint(out, len(inner))
    return bytes(out + inner)


def rebuild_batch(
    like: BatchHeader,
    records: bytes,
    records_count: int,
    *,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int,
) -> bytearray:
    """A batch with ``like``'s offsets, producer fields and leader epoch holding other (encoded, compressed as
    ``attributes`` say) records: the log cleaner's rewrite, which keeps a batch's offset range and sequence
    numbers whatever records it drops, and broker-side recompression's (``like`` renumbered from 0). Writable,
    so that the log can assign its offsets in place."""
    batch = bytearray(HEADER_SIZE)
    HEADER.pack_into(
        batch,
        0,
        like.base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(records),
        like.partition_leader_epoch,
        2,
        0,
        attributes,
        like.last_offset_delta,
        base_timestamp,
        max_timestamp,
        like.producer_id,
        like.producer_epoch,
        like.base_sequence,
        records_count,
    )
    batch += records
    _UINT32.pack_into(batch, 17, compute_crc(batch))
    return batch


def set_max_timestamp(batch: bytearray | memoryview, max_timestamp: int, *, log_append_time: bool) -> None:
    """Rewrite a batch's max timestamp and timestamp type in place and recompute its CRC (Kafka's setMaxTimestamp)."""
    (attributes,) = _INT16.unpack_from(batch, _ATTRIBUTES_AT)
    attributes = attributes | TIMESTAMP_TYPE_BIT if log_append_time else attributes & ~TIMESTAMP_TYPE_BIT
    _INT16.pack_into(batch, _ATTRIBUTES_AT, attributes)
    _INT64.pack_into(batch, _MAX_TIMESTAMP_AT, max_timestamp)
    _UINT32.pack_into(batch, 17, compute_crc(batch))


def encode_record(record: Record) -> bytes:
    body = bytearray()
    body.append(record.attributes)
    _write_varint(body, record.timestamp_delta)
    _write_varint(body, record.offset_delta)
    for data in (record.key, record.value):
        if data is None:
            _write_varint(body, -1)
        else:
            _write_varint(body, len(data))
            body += data
    _write_varint(body, len(record.headers))
    for name, value in record.headers:
        encoded = name.encode()
        _write_varint(body, len(encoded))
        body += encoded
        if value is None:
            _write_varint(body, -1)
        else:
            _write_varint(body, len(value))
            body += value
    out = bytearray()
    _write_varint(out, len(body))
    return bytes(out + body)


def build_batch(
    records: list[Record],
    *,
    base_offset: int = 0,
    compression_type: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = -1,
    base_timestamp: int | None = None,
    log_append_time: bool = False,
) -> bytes:
    """Encode records as one batch; record offset and timestamp deltas are taken as given."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    if base_timestamp is None:
        base_timestamp = int(time.time() * 1000)
    payload = b"".join(encode_record(r) for r in records)
    if compression_type:
        payload = compression.compress(compression_type, payload)
    attributes = compression_type & COMPRESSION_MASK
    if log_append_time:
        attributes |= TIMESTAMP_TYPE_BIT
    if is_transactional:
        attributes |= TRANSACTIONAL_BIT
    if is_control:
        attributes |= CONTROL_BIT
    last_offset_delta = max(r.offset_delta for r in records)
    max_timestamp = base_timestamp + max(r.timestamp_delta for r in records)
    batch = bytearray(HEADER_SIZE)
    HEADER.pack_into(
        batch,
        0,
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(payload),
        partition_leader_epoch,
        2,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    batch += payload
    _UINT32.pack_into(batch, 17, compute_crc(batch))
    return bytes(batch)


# --- control batches (transaction markers) ------------------------------------------------------------


class ControlRecordType(IntEnum):
    ABORT = 0
    COMMIT = 1


_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")


def build_control_batch(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    base_offset: int = 0,
    timestamp_ms: int | None = None,
) -> bytes:
    marker = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    record = Record(
        key=_CONTROL_KEY.pack(0, marker),
        value=_CONTROL_VALUE.pack(0, coordinator_epoch),
    )
    return build_batch(
        [record],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        is_control=True,
        base_timestamp=timestamp_ms,
    )


def parse_control_record(record: Record) -> tuple[ControlRecordType, int]:
    """The marker type and coordinator epoch of a control record."""
    if record.key is None or len(record.key) < 4:
        raise DecodeError("control record without a valid key")
    _, kind = _CONTROL_KEY.unpack_from(record.key)
    epoch = -1
    if record.value is not None and len(record.value) >= 6:
        _, epoch = _CONTROL_VALUE.unpack_from(record.value)
    try:
        return ControlRecordType(kind), epoch
    except ValueError as exc:
        raise DecodeError(f"unknown control record type {kind}") from exc
