"""The aborted transaction index of a partition, and its per-segment ``.txnindex`` files in Kafka's layout.

Each aborted transaction is one entry: the producer id, the first offset of its data, the offset of its abort
marker (``last_offset``) and the last stable offset just after the marker was written. Entries are kept in
marker order for the whole partition (both engines); a read_committed Fetch asks which of them overlap the
offsets it returns, with Kafka's rule (TransactionIndex.collectAbortedTxns): an entry is returned when its
marker is at or after the fetch offset and its data starts before the upper bound, and the search stops at the
first entry whose last stable offset reaches the upper bound (every aborted transaction overlapping the range
was completed before it).

On disk (the disk engine) each segment's entries, those whose marker lies in the segment, are a file
``<base offset>.txnindex`` of 34-byte entries: version (int16) = 0, producer id (int64), first offset (int64),
last offset (int64), last stable offset (int64), as Kafka writes it. A sealed segment's file is written
(fsynced) when it is rolled, before the next segment exists, and the active segment's at clean shutdown, so a
segment below the recovery point always has a durable file; the others are rebuilt from the control batches
on recovery. A segment with no aborted transaction has no file.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from kbroker.durable import fs
from kbroker.durable.files import DamagedFileError, write_atomically
from protocol.exceptions import DecodeError
from protocol.records import ControlRecordType, decode_records, parse_control_record

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")  # Kafka's AbortedTxn: version, producer id, first, last, last stable offset
ENTRY_VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int  # the offset of the abort marker
    last_stable_offset: int  # the partition's last stable offset once the marker was written


def read_marker(batch: bytes | bytearray | memoryview) -> tuple[bool, int]:
    """(commit, coordinator epoch) of a control batch; DecodeError if it is not a transaction marker."""
    records = decode_records(batch)
    if not records:
        raise DecodeError("control batch without a record")
    kind, coordinator_epoch = parse_control_record(records[0])
    return kind == ControlRecordType.COMMIT, coordinator_epoch


def txn_index_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}{TXN_INDEX_SUFFIX}"


def encode_entries(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(
        ENTRY.pack(ENTRY_VERSION, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset) for e in entries
    )


def decode_entries(path: Path, data: bytes, base_offset: int, next_offset: int) -> list[AbortedTxn]:
    """The entries of a segment's file; DamagedFileError when they cannot belong to the segment."""
    if len(data) % ENTRY.size:
        raise DamagedFileError(path, f"{len(data)} bytes is not a whole number of {ENTRY.size}-byte entries")
    entries: list[AbortedTxn] = []
    for position in range(0, len(data), ENTRY.size):
        version, producer_id, first, last, stable = ENTRY.unpack_from(data, position)
        if version != ENTRY_VERSION:
            raise DamagedFileError(path, f"entry at byte {position} has version {version}, not {ENTRY_VERSION}")
        if not base_offset <= last < next_offset or first > last or producer_id < 0:
            raise DamagedFileError(
                path, f"entry at byte {position} (offsets {first}..{last}) is not in offsets {base_offset}.."
            )
        if entries and last <= entries[-1].last_offset:
            raise DamagedFileError(path, f"entry at byte {position} is not after the one before it")
        entries.append(AbortedTxn(producer_id, first, last, stable))
    return entries


class AbortedTransactions:
    """Every aborted transaction of a partition whose marker is still in the log, in marker order."""

    def __init__(self) -> None:
        self.entries: list[AbortedTxn] = []
        self._last_offsets: list[int] = []  # for bisecting by marker offset

    def add(self, entry: AbortedTxn) -> None:
        if self._last_offsets and entry.last_offset <= self._last_offsets[-1]:
            raise ValueError(f"aborted transaction marker at {entry.last_offset} is not after {self._last_offsets[-1]}")
        self.entries.append(entry)
        self._last_offsets.append(entry.last_offset)

    def replace_range(self, start: int, end: int, entries: list[AbortedTxn]) -> None:
        """Put ``entries`` (in order, markers in [start, end)) in place of those with markers in [start, end)."""
        low, high = bisect_left(self._last_offsets, start), bisect_left(self._last_offsets, end)
        self.entries[low:high] = entries
        self._last_offsets[low:high] = [e.last_offset for e in entries]

    def in_range(self, start: int, end: int) -> list[AbortedTxn]:
        """The entries whose markers are in [start, end): one segment's."""
        return self.entries[bisect_left(self._last_offsets, start) : bisect_left(self._last_offsets, end)]

    def drop_before(self, offset: int) -> None:
        """Forget entries whose markers are before ``offset`` (their segment was deleted)."""
        cut = bisect_left(self._last_offsets, offset)
        del self.entries[:cut]
        del self._last_offsets[:cut]

    def drop_from(self, offset: int) -> None:
        """Forget entries whose markers are at or after ``offset`` (truncation)."""
        cut = bisect_left(self._last_offsets, offset)
        del self.entries[cut:]
        del self._last_offsets[cut:]

    def collect(self, segment_base: int, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping [fetch_offset, upper_bound).

        ``segment_base``: the base offset of the segment holding ``fetch_offset``; Kafka searches from that
        segment's first entry. Its entries with markers before ``fetch_offset`` are skipped here: none can be
        returned, and none can end the search (a last stable offset recorded before the fetch offset, with no
        transaction open from the upper bound on, is below the upper bound), so the answer is the same.
        """
        found = []
        entries = self.entries
        for i in range(bisect_left(self._last_offsets, max(segment_base, fetch_offset)), len(entries)):
            entry = entries[i]
            if entry.first_offset < upper_bound:
                found.append((entry.producer_id, entry.first_offset))
            if entry.last_stable_offset >= upper_bound:
                break
        return found


def write_segment_file(directory: Path, base_offset: int, entries: list[AbortedTxn]) -> None:
    """Make ``<base>.txnindex`` hold ``entries`` durably (fsynced, atomic); no entries, no file."""
    path = txn_index_path(directory, base_offset)
    if entries:
        write_atomically(path, encode_entries(entries))
    else:
        fs.unlink_if_exists(path)


def read_segment_file(directory: Path, base_offset: int, next_offset: int) -> list[AbortedTxn]:
    """The entries of a sealed segment's file (none if there is no file); DamagedFileError if it is damaged."""
    path = txn_index_path(directory, base_offset)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return decode_entries(path, data, base_offset, next_offset)
