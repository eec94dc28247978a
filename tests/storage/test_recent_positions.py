"""A segment remembers where the batches it appended last start, so that a caught-up consumer's fetch (its
offset is the start of a batch appended since its previous fetch) finds its position without reading the
headers that follow the last index entry. What it remembers must never outlive the bytes: a truncation, a
recovery cut or a roll forgets it, and the answers stay those a scan of the file gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.segment import Segment
from protocol.records import Record, build_batch, decode_records, iter_batches

T0 = 1_700_000_000_000


def batch(size: int, records: int = 1) -> bytearray:
    values = [bytes([65 + size % 26]) * size for _ in range(records)]
    return bytearray(build_batch([Record(offset_delta=i, value=v) for i, v in enumerate(values)], base_timestamp=T0))


def open_log(path: Path, **config: int) -> PartitionLog:
    return PartitionLog("t", 0, path, LogConfig(**config), clean=True)  # type: ignore[arg-type]


def scanned_position(segment: Segment, offset: int) -> int:
    """Where ``offset``'s batch starts according to the index and the headers after it (no memory)."""
    if offset <= segment.base_offset:
        return 0
    if offset >= segment.next_offset:
        return segment.size
    return segment._position_from_index(offset)


def first_offsets(plog: PartitionLog, offset: int) -> list[int]:
    data = plog.read(offset, 1 << 20).read_bytes()
    return [header.base_offset + r.offset_delta for header, view in iter_batches(data) for r in decode_records(view)]


def test_a_recent_batch_is_found_without_reading_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plog = open_log(tmp_path, index_interval_bytes=1 << 20)  # one index entry: every lookup would scan from it
    bases = [plog.append(batch(100 + i), now_ms=T0).base_offset for i in range(40)]
    segment = plog.active
    expected = [scanned_position(segment, base) for base in bases]
    reads: list[int] = []
    original = Segment._pread

    def counting(self: Segment, size: int, position: int) -> bytes:
        reads.append(position)
        return original(self, size, position)

    monkeypatch.setattr(Segment, "_pread", counting)
    assert [segment.position_of(base) for base in bases] == expected
    assert reads == []
    chunk = plog.read(bases[-3], 1 << 20)
    assert (chunk.position, chunk.size, reads) == (expected[-3], segment.size - expected[-3], [])


def test_positions_after_a_truncation_are_those_of_the_new_batches(tmp_path: Path) -> None:
    plog = open_log(tmp_path, index_interval_bytes=1 << 20)
    for i in range(10):
        plog.append(batch(50 + 10 * i), now_ms=T0)
    plog.truncate_to(4)
    # The same offsets again, in batches of three records: offsets 5, 6, 8 and 9 no longer start a batch.
    rewritten = [plog.append(batch(300 + i, records=3), now_ms=T0).base_offset for i in range(2)]
    assert rewritten == [4, 7]
    segment = plog.active
    assert [segment.position_of(o) for o in range(11)] == [scanned_position(segment, o) for o in range(11)]
    assert first_offsets(plog, 5) == [4, 5, 6, 7, 8, 9]
    assert [len(v) for v in _values(plog, 9)] == [301, 301, 301]


def test_a_lookup_inside_a_batch_or_of_an_older_one_still_scans(tmp_path: Path) -> None:
    plog = open_log(tmp_path, index_interval_bytes=256)
    for i in range(100):
        plog.append(batch(20 + i % 7, records=3), now_ms=T0)
    segment = plog.active
    for offset in range(0, 300, 7):  # starts and middles of batches, long since forgotten or never remembered
        assert segment.position_of(offset) == scanned_position(segment, offset)
    assert first_offsets(plog, 298)[:2] == [297, 298]


def test_what_is_remembered_stays_bounded_and_a_roll_forgets_it(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_bytes=20_000)
    for _ in range(300):
        plog.append(batch(100), now_ms=T0)
        assert all(len(s._recent_positions) <= 64 for s in plog.segments)
    assert len(plog.segments) > 1
    assert all(not s._recent_positions for s in plog.segments[:-1])  # sealed: nothing remembered
    for offset in range(0, 300, 13):
        segment = next(s for s in reversed(plog.segments) if s.base_offset <= offset)
        assert segment.position_of(offset) == scanned_position(segment, offset)


def _values(plog: PartitionLog, offset: int) -> list[bytes]:
    data = plog.read(offset, 1 << 20).read_bytes()
    return [r.value or b"" for _, view in iter_batches(data) for r in decode_records(view)]
