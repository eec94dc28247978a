"""One log segment: a ``.log`` file of record batches plus its sparse offset and time indexes.

The batches are stored exactly as the partition log hands them over (offsets already assigned). The
indexes live in memory while the broker runs and are written next to the log, in Kafka's layout, when the
segment is sealed and at a clean shutdown:

- ``.index``: 8-byte entries (int32 offset relative to the segment's base offset, int32 file position),
  one per ``index.interval.bytes`` of log, for the last offset of the batch at that position;
- ``.timeindex``: 12-byte entries (int64 timestamp, int32 relative offset), added alongside when the
  largest timestamp seen so far grows.

Index files are checked against the log, never trusted to cut it: at load the first and last entries must
point at batches ending at their offsets (the others are checked by the lookup that uses them, on the batch
it reads anyway), and a file that is missing or disagrees is rebuilt from the batch headers.

A segment being written by the log cleaner has its files named with a suffix (``.log.cleaned`` ...) until the
partition log swaps it in (see PartitionLog.swap_segments).

Recovery (``load`` of a segment that may hold unsynced writes) checks every batch's CRC and that offsets go up.
A bad batch followed by valid ones (found by ``_next_valid_batch``) is corruption, not a torn write: its bytes
stay where they are, as a CorruptRange that scans step over and reads refuse, listed in
``<base>.log.corrupt-ranges`` so that every later start checks the segment again rather than trusting it. Only
the end of the log may be torn by a crash: bytes cut there are first copied, fsynced, to
``<base>.log.<from>-<to>.corrupt`` beside the segment (a name neither Kafka's loader nor kbroker's reads).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kbroker.durable import fs
from kbroker.durable.files import (
    DamagedFileError,
    StorageError,
    fsync_directory,
    write_atomically,
    write_checked_json,
)
from kbroker.storage.descriptors import ClosedSegmentError, DescriptorCache
from protocol.exceptions import DecodeError
from protocol.records import HEADER, HEADER_SIZE, BatchHeader, header_problem, validate_crc

log = logging.getLogger("kbroker.storage")

_INDEX_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_SCAN_CHUNK = 1 << 20  # recovery and index rebuilds read everything
_LOOKUP_CHUNK = 16 << 10  # lookups near an index entry read a few headers
# Positions of the batches this segment appended last, by base offset: where a caught-up consumer's next fetch
# starts, found without reading the headers after the last index entry. Forgotten whole when full (re-learnt
# from the next appends), so a segment holds at most this many.
_RECENT_APPENDS = 64
NO_TIMESTAMP = -1
SEGMENT_FILE_SUFFIXES = (".log", ".index", ".timeindex", ".txnindex")
_MISSING = "missing"  # _load_index_files: no index files (a segment never sealed, or files removed)
CORRUPT_RANGES_SUFFIX = ".log.corrupt-ranges"  # the damage recovery kept in place (see the module docstring)
CORRUPT_SUFFIX = ".corrupt"  # bytes recovery cut from the end of the log, kept aside
_MAGIC_AT = 16  # where a batch header holds its magic byte
_MAX_RELATIVE_OFFSET = 2**31 - 1  # index entries hold offsets relative to the segment's base as int32


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


@dataclass(slots=True)
class ScannedBatch:
    position: int
    header: BatchHeader


class CorruptRange(NamedTuple):
    """Bytes of a segment that are not a valid batch, kept in place because valid batches follow them.

    ``first_offset``..``last_offset``: the offsets they stand for, from the end of the batch before to the start
    of the batch after (none when ``last_offset`` < ``first_offset``). A range ending a sealed segment gets its
    ``last_offset`` from the next segment's base offset (PartitionLog sets it; -1 until then).
    """

    position: int
    end: int
    first_offset: int
    last_offset: int
    problem: str

    def holds(self, offset: int) -> bool:
        return self.first_offset <= offset <= self.last_offset

    def describe(self, log_path: Path) -> str:
        offsets = (
            f"offsets {self.first_offset}..{self.last_offset}"
            if self.last_offset >= self.first_offset
            else "no offsets"
        )
        return f"{log_path} bytes {self.position}..{self.end - 1} ({offsets}) are corrupt: {self.problem}"


class SegmentTailDamaged(StorageError):
    """A failed append could not be undone: the segment file holds bytes that are not part of the log."""


class _StaleIndexEntry(DecodeError):
    """An offset index entry that does not point at the batch it names (the indexes are then rebuilt)."""


class FileRegion:
    """Bytes of a segment file to send as they are (with sendfile), not read into memory.

    It holds a descriptor of its own, so retention may delete the segment while a response is being sent;
    ``close`` releases it (the transport calls it once the bytes are sent, garbage collection otherwise).
    ``lender``: the DescriptorCache that counts such descriptors against its budget (Segment.region).
    """

    __slots__ = ("fd", "position", "length", "lender")

    def __init__(self, fd: int, position: int, length: int, lender: DescriptorCache | None = None) -> None:
        self.fd = -1  # so close (and __del__) are safe if dup fails
        self.lender = lender
        self.fd = os.dup(fd)
        if lender is not None:
            lender.lend(self.fd)
        self.position = position
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __bytes__(self) -> bytes:
        data = os.pread(self.fd, self.length, self.position)
        if len(data) != self.length:
            raise OSError(f"segment region {self.position}+{self.length} was cut short")
        return data

    def close(self) -> None:
        fd = self.fd
        if fd >= 0:
            self.fd = -1
            if self.lender is not None:
                self.lender.returned(fd)  # before the close: the number cannot be reused until then
            os.close(fd)

    def __del__(self) -> None:
        self.close()


class Segment:
    """A segment's files and in-memory indexes.

    Thread-safety contract: everything is called from the event loop, except ``fsync`` (and the ``dirty``
    property), which a worker thread may call at any time, concurrently with appends, truncation, renames and
    ``close``/``delete`` on the event loop. For that:
    - the descriptor is closed only when no fsync is using it (a close during an fsync is finished by the
      fsync), so an fsync never reaches a closed descriptor, nor one the process has reused for another file;
    - writes bump a generation counter *after* the bytes are written, and an fsync records the generation it
      read *before* syncing, so it never marks as synced bytes written while it ran.

    The descriptor comes from the broker's DescriptorCache (kbroker/storage/descriptors.py): it may be closed
    between two uses (evicted; never while an fsync uses it) and is reopened, without O_CREAT, on the next;
    an fsync of a segment evicted while dirty opens the file for itself. A closed segment is never reopened.
    """

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        index_interval_bytes: int,
        created_ms: int,
        suffix: str = "",
        descriptors: DescriptorCache | None = None,
    ) -> None:
        """``descriptors``: the broker's cache of open segment files (a segment alone gets one of its own)."""
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.suffix = suffix
        self._set_paths(suffix)
        self._fd_lock = threading.Lock()  # guards _fd's lifetime, the fsync bookkeeping and the counters below
        self._fsyncs_running = 0
        self._close_requested = False
        self._written_generation = 0  # bumped by every change to the log file (event loop only)
        self._synced_generation = 0  # the newest generation known to be on disk
        self._fd = -1  # -1 while evicted from (or never yet opened through) the descriptor cache
        self.size = self._create_file(descriptors)
        self.next_offset = base_offset
        self.created_ms = created_ms
        self.max_timestamp = NO_TIMESTAMP
        self._index_offsets = array("q")  # absolute last offsets of indexed batches
        self._index_positions = array("q")
        self._time_timestamps = array("q")
        self._time_offsets = array("q")
        self._bytes_since_index = index_interval_bytes  # so the first batch is always indexed
        self._recent_positions: dict[int, int] = {}  # base offset -> position of batches appended last
        self.corrupt_ranges: list[CorruptRange] = []
        self._skips: dict[int, int] = {}  # position of each corrupt range -> its end, for scans to step over

    def _set_paths(self, suffix: str) -> None:
        name = segment_name(self.base_offset)
        self.log_path = self.directory / (name + ".log" + suffix)
        self.index_path = self.directory / (name + ".index" + suffix)
        self.time_index_path = self.directory / (name + ".timeindex" + suffix)
        # Written by the partition (txn_index.py), not here; listed so that swaps rename it with the segment.
        self.txn_index_path = self.directory / (name + ".txnindex" + suffix)
        self.corrupt_ranges_path = self.directory / (name + CORRUPT_RANGES_SUFFIX + suffix)

    @property
    def dirty(self) -> bool:
        """Whether bytes were written (or cut) since the last completed fsync."""
        return self._written_generation != self._synced_generation

    def _create_file(self, descriptors: DescriptorCache | None) -> int:
        """Create (or open) the log file through the descriptor cache; its size."""
        self._descriptors = descriptors if descriptors is not None else DescriptorCache()
        self._touch = self._descriptors.touch  # marks this segment most recently used (one C call, no frame)
        self._fd, size = self._descriptors.create(self)
        return size

    # --- the descriptor (see kbroker/storage/descriptors.py) ----------------------------------------------

    def _descriptor(self) -> int:
        """The log file's descriptor for the event loop to use now: reopened if it was evicted.

        Used at once and not kept across anything that may open another segment (which may evict this one).
        """
        fd = self._fd
        if fd < 0:
            return self._descriptors.reopen(self)
        try:
            self._touch(self)
        except KeyError:  # it has a descriptor but left the cache: closed, its fsync still finishing
            raise ClosedSegmentError(self.log_path) from None
        return fd

    def _pread(self, size: int, position: int) -> bytes:
        fd = self._fd
        if fd < 0:
            return self._descriptors.pread(self, size, position)
        try:
            self._touch(self)
        except KeyError:
            raise ClosedSegmentError(self.log_path) from None
        return os.pread(fd, size, position)

    def _open_descriptor(self, flags: int) -> int:
        """Open the log file as this segment's descriptor (DescriptorCache only); a closed segment refuses."""
        with self._fd_lock:
            if self._close_requested:
                raise ClosedSegmentError(self.log_path)
            if self._fd < 0:
                self._fd = os.open(self.log_path, flags, 0o644)
            return self._fd

    def _open_transient(self) -> int:
        """A descriptor of the caller's own (to close when done), for a thread that may not use the cache."""
        with self._fd_lock:  # rename_suffix holds it too: log_path names the file as it is on disk
            if self._close_requested:
                raise ClosedSegmentError(self.log_path)
            return os.open(self.log_path, os.O_RDONLY | os.O_CLOEXEC)

    def _release_descriptor(self) -> bool:
        """Close the descriptor for the cache to reuse, unless an fsync is using it; whether it was closed.

        Nothing written is lost (the bytes are the file's); a dirty segment stays dirty, so the next flush
        opens the file again to fsync it.
        """
        with self._fd_lock:
            if self._fsyncs_running:
                return False
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            return True

    # --- opening ----------------------------------------------------------------------------------------

    def load(self, *, trust_indexes: bool, tail_may_be_torn: bool = True) -> int:
        """Bring the in-memory state in line with the files; returns bytes truncated from a torn tail.

        With ``trust_indexes`` (a segment below the recovery point, or any after a clean shutdown: its bytes
        were fsynced) the index files are loaded and checked against the log, rebuilt from the batch headers
        when missing or wrong (never used to cut data), and only the batches after the last index entry are
        read. Such a segment is never cut: batches that stop before the end of its file are damage, not a
        torn write: it is checked whole as below, but nothing is cut, and damage at the end of the log (where the
        offsets it held are unknown) raises DamagedFileError naming the file and position (the bytes stay for the
        operator).
        Otherwise (recovery after an unclean stop), or when the segment is known to hold corrupt ranges, every
        batch is read and its CRC checked and the indexes are rebuilt (``_recover``): a bad batch with valid ones
        after it becomes a CorruptRange, bad bytes at the end are cut (moved aside) only if ``tail_may_be_torn``
        (the last segment of the log, not trusted), else kept as a range too.
        """
        if not trust_indexes or self.corrupt_ranges_path.exists():
            # A segment known to hold corrupt ranges is checked again: they are found from the bytes themselves.
            return self._recover(tail_may_be_torn=tail_may_be_torn and not trust_indexes)
        index_problem = self._load_index_files()
        if index_problem is not None:
            self._clear_indexes()
            if index_problem != _MISSING:
                log.warning("%s; rebuilding the indexes from the log", index_problem)
        time_index_loaded = bool(self._time_timestamps)
        start = self._resume_after_last_entry()
        good_end, problem = self._scan_tail(start, check_crc=False)
        if good_end != self.size:
            damage = DamagedFileError(
                self.log_path,
                f"{problem}; the batches before position {good_end} are intact, the {self.size - good_end} bytes "
                "from there were fsynced and are left as they are",
            )
            self._recover(tail_may_be_torn=False)  # fsynced: never cut; valid batches after the damage are served
            tail = self.corrupt_ranges[-1] if self.corrupt_ranges else None
            if tail_may_be_torn and (tail is None or tail.end == self.size):
                # The end of the log: the offsets the damaged bytes held are unknown, and appending after them
                # could give those offsets to new records. The operator decides.
                raise damage
            return 0
        time_problem = self._time_index_problem(time_index_loaded)
        if time_problem is not None:
            log.warning("%s: %s; rebuilding the indexes from the log", self.time_index_path, time_problem)
            self._clear_indexes()
            self._scan_tail(0, check_crc=False)
            index_problem = time_problem
        if index_problem is not None and self.has_index_files():
            self.write_indexes()  # the next start finds them right
        return 0

    # --- recovery ---------------------------------------------------------------------------------------

    def _recover(self, *, tail_may_be_torn: bool) -> int:
        """Check every batch (CRC, offsets going up), index the valid ones and find the corrupt ranges; returns the
        bytes cut from a torn tail (kept aside first, see ``_cut_tail``)."""
        self._clear_indexes()
        self._set_corrupt_ranges([])
        ranges: list[CorruptRange] = []
        position, expected, truncated = 0, self.base_offset, 0
        while True:
            position, expected, problem = self._validate_from(position, expected)
            if problem is None:
                break
            for prefix in (f"{self.log_path} position {position}: ", f"{self.log_path}: "):
                problem = problem.removeprefix(prefix)  # the range names the file and position
            found = self._next_valid_batch(position, expected)
            if found is None:
                if tail_may_be_torn:
                    truncated = self._cut_tail(position, expected, problem)
                else:
                    ranges.append(CorruptRange(position, self.size, expected, -1, problem))
                break
            resumed, after = found
            ranges.append(CorruptRange(position, resumed, expected, after.base_offset - 1, problem))
            self._bytes_since_index = self.index_interval_bytes  # index the batch after the range
            position = resumed
        self._set_corrupt_ranges(ranges)
        return truncated

    def _validate_from(self, position: int, expected: int) -> tuple[int, int, str | None]:
        """Index the valid batches from ``position``: (where they end, the next offset, why the next batch is not
        valid or None at the end of the file)."""
        try:
            for scanned in self.scan(position, check_crc=True):
                header = scanned.header
                if header.base_offset < expected or header.last_offset - self.base_offset > _MAX_RELATIVE_OFFSET:
                    problem = f"offsets {header.base_offset}..{header.last_offset} do not follow offset {expected - 1}"
                    return scanned.position, expected, problem
                self._track(header, scanned.position)
                position, expected = scanned.position + header.size, header.next_offset
        except DecodeError as exc:
            return position, expected, str(exc)
        return position, expected, None

    def _valid_batch_at(self, position: int, expected: int) -> BatchHeader | None:
        """The header of a whole batch at ``position`` with a good CRC and offsets from ``expected`` on, else None."""
        header = self._header_at(position)
        if header is None or header.base_offset < expected:
            return None
        if header.last_offset - self.base_offset > _MAX_RELATIVE_OFFSET:
            return None
        body = self._pread(header.size, position)
        return header if len(body) == header.size and validate_crc(body) else None

    def _resumes_at(self, position: int, expected: int) -> BatchHeader | None:
        """Whether the log plausibly resumes at ``position`` after bad bytes: a valid batch there, followed by the end
        of the file or by another batch that is valid too or whose base offset follows on exactly (a batch inside
        a record's value may pass a CRC check, but seldom sits right before another)."""
        header = self._valid_batch_at(position, expected)
        if header is None:
            return None
        following = position + header.size
        if following == self.size:
            return header
        successor = self._header_at(following)
        if successor is None:
            return None
        if (
            successor.base_offset == header.next_offset
            or self._valid_batch_at(following, header.next_offset) is not None
        ):
            return header
        return None

    def _next_valid_batch(self, bad: int, expected: int) -> tuple[int, BatchHeader] | None:
        """Where the log resumes after the bad batch at ``bad`` and the batch there, or None if nothing valid follows.

        The bad batch's own length is tried first (bytes flipped inside its records leave it right); then every
        position after it that holds a magic byte is tried, reading the file once, in chunks.
        """
        header = self._header_at(bad)
        by_length = bad + header.size if header is not None else -1
        resumed = self._resumes_at(by_length, expected) if 0 < by_length < self.size else None
        if resumed is not None:
            return by_length, resumed
        chunk_start = bad + 1
        while chunk_start + HEADER_SIZE <= self.size:
            chunk = self._pread(min(_SCAN_CHUNK, self.size - chunk_start), chunk_start)
            at = chunk.find(2, _MAGIC_AT)
            while 0 <= at and at - _MAGIC_AT + HEADER_SIZE <= len(chunk):
                candidate = chunk_start + at - _MAGIC_AT
                # Most candidates fail on their header alone, read from the chunk (no system call).
                header = BatchHeader(*HEADER.unpack_from(chunk, at - _MAGIC_AT))
                plausible = (
                    header_problem(header) is None
                    and expected <= header.base_offset
                    and header.last_offset - self.base_offset <= _MAX_RELATIVE_OFFSET
                    and candidate + header.size <= self.size
                )
                resumed = self._resumes_at(candidate, expected) if plausible and candidate != by_length else None
                if resumed is not None:
                    return candidate, resumed
                at = chunk.find(2, at + 1)
            chunk_start += max(len(chunk) - HEADER_SIZE + 1, 1)  # overlap: a header may straddle two chunks
        return None

    def _cut_tail(self, position: int, expected: int, problem: str) -> int:
        """Cut the torn or corrupt end of the log at ``position``, its bytes first kept (fsynced) in a file aside:
        a crash before the cut leaves them in both places, and the next recovery finds the copy and cuts."""
        length = self.size - position
        aside = self._keep_aside(position)
        log.warning(
            "%s: truncating %d bytes of a torn or corrupt tail (%s); they held %s and are kept in %s",
            self.log_path,
            length,
            problem,
            self._offsets_by_headers(position, expected),
            aside,
        )
        fs.ftruncate(self._descriptor(), position)
        self.size = position
        self._written_generation += 1
        self._recent_positions.clear()
        return length

    def _keep_aside(self, position: int) -> Path:
        """Copy the bytes from ``position`` to the end to a new ``.corrupt`` file (file and directory fsynced), or
        find the copy a recovery that crashed before its cut made; its path."""
        stem = f"{self.log_path.name}.{position}-{self.size - 1}"
        attempt = 0
        while True:
            path = self.directory / (stem + (f".{attempt}" if attempt else "") + CORRUPT_SUFFIX)
            if not path.exists():
                break
            if self._holds_tail(path, position):
                return path
            attempt += 1
        tmp = path.with_name(path.name + ".tmp")  # removed by the next start if a crash leaves it
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            try:
                for at in range(position, self.size, _SCAN_CHUNK):
                    fs.write_all(fd, self._pread(min(_SCAN_CHUNK, self.size - at), at))
                fs.fsync(fd)
            finally:
                os.close(fd)
            fs.replace(tmp, path)
        except OSError:  # a full disk: nothing is cut, and the partition reports the error
            tmp.unlink(missing_ok=True)
            raise
        fsync_directory(self.directory)
        return path

    def _holds_tail(self, path: Path, position: int) -> bool:
        """Whether ``path`` holds exactly the bytes of the log from ``position`` to its end."""
        if path.stat().st_size != self.size - position:
            return False
        with open(path, "rb") as kept:
            for at in range(position, self.size, _SCAN_CHUNK):
                if kept.read(_SCAN_CHUNK) != self._pread(min(_SCAN_CHUNK, self.size - at), at):
                    return False
        return True

    def _offsets_by_headers(self, position: int, expected: int) -> str:
        """The offsets the bytes from ``position`` held, as far as their batch headers tell."""
        first, last = expected, -1
        while position + HEADER_SIZE <= self.size:
            header = BatchHeader(*HEADER.unpack_from(self._pread(HEADER_SIZE, position)))
            if header_problem(header) is not None or header.base_offset < expected:
                break
            last, expected = header.last_offset, header.next_offset
            position += header.size
        if last < 0:
            return f"offsets from {first} on (no readable header)"
        return f"offsets {first}..{last} by their headers"

    def _set_corrupt_ranges(self, ranges: list[CorruptRange]) -> None:
        self.corrupt_ranges = ranges
        self._skips = {r.position: r.end for r in ranges}

    def set_corrupt_range_end(self, next_base_offset: int) -> None:
        """The next segment starts at ``next_base_offset``: a range ending this segment stands for the offsets up to
        it (PartitionLog calls this once every segment is loaded)."""
        ranges = self.corrupt_ranges
        if ranges and ranges[-1].last_offset < 0 and ranges[-1].end == self.size:
            last = max(next_base_offset, ranges[-1].first_offset) - 1
            ranges[-1] = ranges[-1]._replace(last_offset=last)

    def save_corrupt_ranges(self) -> None:
        """Write (or remove, if there are none) the list of corrupt ranges: its presence makes every start check
        the segment again rather than trust it."""
        if not self.corrupt_ranges:
            fs.unlink_if_exists(self.corrupt_ranges_path)
            return
        ranges = [[r.position, r.end, r.first_offset, r.last_offset, r.problem] for r in self.corrupt_ranges]
        write_checked_json(self.corrupt_ranges_path, "corrupt-ranges", 1, {"ranges": ranges})

    def corrupt_range_at(self, offset: int) -> CorruptRange | None:
        for corrupt in self.corrupt_ranges:
            if corrupt.holds(offset):
                return corrupt
        return None

    def corrupt_position_after(self, position: int) -> int | None:
        """Where the first corrupt range at or after ``position`` starts (reads stop there), or None."""
        for corrupt in self.corrupt_ranges:
            if corrupt.position >= position:
                return corrupt.position
        return None

    def _resume_after_last_entry(self) -> int:
        """Drop the last index entry (its batch and those after it are read again); where to read from."""
        if not self._index_positions:
            return 0
        # The time index's last entry is the segment's largest timestamp when the files were written.
        self.max_timestamp = int(self._time_timestamps[-1]) if self._time_timestamps else NO_TIMESTAMP
        start = int(self._index_positions.pop())
        popped = self._index_offsets.pop()
        while self._time_offsets and self._time_offsets[-1] >= popped:
            self._time_offsets.pop()
            self._time_timestamps.pop()
        return start

    def _clear_indexes(self) -> None:
        for arr in (self._index_offsets, self._index_positions, self._time_timestamps, self._time_offsets):
            del arr[:]
        self._recent_positions.clear()
        self.max_timestamp = NO_TIMESTAMP
        self._bytes_since_index = self.index_interval_bytes

    def _header_at(self, position: int) -> BatchHeader | None:
        """The batch header at ``position`` if one is there (structurally sound, inside the file), else None."""
        data = self._pread(HEADER_SIZE, position)
        if len(data) < HEADER_SIZE:
            return None
        header = BatchHeader(*HEADER.unpack_from(data))
        if header_problem(header) is not None or position + header.size > self.size:
            return None
        return header

    def _entry_matches_log(self, entry: int) -> bool:
        """Whether offset index entry ``entry`` points at a batch whose last offset is the entry's offset."""
        header = self._header_at(int(self._index_positions[entry]))
        return header is not None and header.last_offset == self._index_offsets[entry]

    def _load_index_files(self) -> str | None:
        """Load the index files; None if they are usable, else what is wrong, naming the file (the arrays are
        then partial).

        Checked against the log: entries in order and inside the file, the first at position 0 and the last
        pointing at a batch that ends at its offset (the tail is read from there); the other entries are
        checked when a lookup uses them (_entry_matches_log), as reading every one would cost a read each.
        """
        try:
            index = self.index_path.read_bytes()
            time_index = self.time_index_path.read_bytes()
        except FileNotFoundError:
            return _MISSING
        if len(index) % _INDEX_ENTRY.size or len(time_index) % _TIME_ENTRY.size:
            return f"{self.index_path}: an index file is not a whole number of entries"
        last_offset, last_position = self.base_offset - 1, -1
        for relative, position in _INDEX_ENTRY.iter_unpack(index):
            offset = self.base_offset + relative
            if offset <= last_offset or position <= last_position:
                return f"{self.index_path}: entry (offset {offset}, position {position}) is out of order"
            if position + HEADER_SIZE > self.size:
                return f"{self.index_path}: entry (offset {offset}, position {position}) is past the end of the log"
            self._index_offsets.append(offset)
            self._index_positions.append(position)
            last_offset, last_position = offset, position
        if self._index_positions:
            if self._index_positions[0] != 0 or not self._entry_matches_log(0):
                return f"{self.index_path}: the first entry is not the segment's first batch"
            if not self._entry_matches_log(len(self._index_positions) - 1):
                return f"{self.index_path}: the last entry (offset {last_offset}, position {last_position}) is wrong"
        elif self.size:
            return f"{self.index_path}: no entries for a segment holding batches"
        last_timestamp, last_time_offset = NO_TIMESTAMP, self.base_offset - 1
        for timestamp, relative in _TIME_ENTRY.iter_unpack(time_index):
            if timestamp < last_timestamp or self.base_offset + relative < last_time_offset:
                return f"{self.time_index_path}: out of order"
            self._time_timestamps.append(timestamp)
            self._time_offsets.append(self.base_offset + relative)
            last_timestamp, last_time_offset = timestamp, self.base_offset + relative
        return None

    def _time_index_problem(self, loaded: bool) -> str | None:
        """What is wrong with the time index loaded beside a good offset index, or None.

        Its last entry (T, o) is the segment's largest timestamp, which retention acts on: a lost or lowered
        one would delete the segment early. Cheap checks that catch that: o is an offset of the segment, and
        neither the batch holding o nor the first batch has a timestamp above T. ``loaded``: the file had entries.
        """
        first = self._header_at(0) if self.size else None
        if not loaded and first is not None and first.max_timestamp > NO_TIMESTAMP:
            return "it has no entries for batches with timestamps"
        if not self._time_timestamps:
            return None
        timestamp, offset = int(self._time_timestamps[-1]), int(self._time_offsets[-1])
        if not self.base_offset <= offset < self.next_offset:
            return f"its last entry's offset {offset} is outside {self.base_offset}..{self.next_offset - 1}"
        try:
            holding = self.position_of(offset)
        except DecodeError:
            return None  # a broken batch on the way: reported when a read meets it, not taken for an index problem
        for position in (0, holding):
            header = self._header_at(position)
            if header is None or header.max_timestamp > timestamp:
                return f"its last entry's timestamp {timestamp} is below the timestamps of the log"
        return None

    def _scan_tail(self, start: int, *, check_crc: bool) -> tuple[int, str | None]:
        """Read batches from ``start`` to the end, indexing them: where the last good one ends, and why the
        scan stopped before the end of the file (None if it did not)."""
        position = start
        try:
            for scanned in self.scan(start, check_crc=check_crc):
                self._track(scanned.header, scanned.position)
                position = scanned.position + scanned.header.size
        except DecodeError as exc:
            return position, str(exc)
        return position, None

    def _rebuild_indexes(self, why: str) -> None:
        """Rebuild the in-memory indexes from the batch headers (an index entry did not match the log).

        The log end stays what appends made it; a log that is itself broken raises DecodeError.
        """
        log.warning("%s; rebuilding the indexes from the log", why)
        next_offset, max_timestamp = self.next_offset, self.max_timestamp
        self._clear_indexes()
        _, problem = self._scan_tail(0, check_crc=False)
        self.next_offset, self.max_timestamp = next_offset, max(max_timestamp, self.max_timestamp)
        if problem is not None:
            raise DecodeError(problem)
        if self.has_index_files():
            self.write_indexes()

    # --- scanning ---------------------------------------------------------------------------------------

    def scan(
        self,
        start: int = 0,
        end: int | None = None,
        *,
        check_crc: bool = False,
        stop_on_error: bool = False,
        chunk_size: int = _SCAN_CHUNK,
    ) -> Iterator[ScannedBatch]:
        """Batch headers from ``start`` (a batch boundary) up to ``end``, read ``chunk_size`` bytes at a time.

        A batch that is cut short, has a bad header or (with ``check_crc``) a bad CRC ends the scan when
        ``stop_on_error``, and raises DecodeError otherwise. Corrupt ranges found by recovery are stepped over.
        """
        end = self.size if end is None else end
        position = start
        skips = self._skips
        while position < end:
            if position in skips:
                position = skips[position]
                continue
            chunk = self._pread(min(max(chunk_size, HEADER_SIZE), end - position), position)
            offset_in_chunk = 0
            progressed = False
            while offset_in_chunk + HEADER_SIZE <= len(chunk):
                if skips and position in skips:
                    progressed = True  # the outer loop steps over the range
                    break
                header = BatchHeader(*HEADER.unpack_from(chunk, offset_in_chunk))
                problem = header_problem(header)
                if problem is None and position + header.size > end:
                    problem = "batch runs past the end of the segment"
                if problem is None and check_crc:
                    body: bytes | memoryview
                    if offset_in_chunk + header.size <= len(chunk):
                        body = memoryview(chunk)[offset_in_chunk : offset_in_chunk + header.size]
                    else:
                        body = self._pread(header.size, position)
                    if len(body) != header.size or not validate_crc(body):
                        problem = "CRC mismatch"
                if problem is not None:
                    if stop_on_error:
                        log.warning("%s: bad batch at position %d: %s", self.log_path, position, problem)
                        return
                    raise DecodeError(f"{self.log_path} position {position}: {problem}")
                yield ScannedBatch(position, header)
                position += header.size
                offset_in_chunk += header.size
                progressed = True
            if not progressed:
                if end - position >= HEADER_SIZE and len(chunk) >= HEADER_SIZE:
                    continue  # the header straddled the chunk; re-read from the batch start
                if stop_on_error:
                    log.warning("%s: %d trailing bytes are not a batch", self.log_path, end - position)
                    return
                raise DecodeError(f"{self.log_path}: {end - position} trailing bytes are not a batch")

    # --- appending --------------------------------------------------------------------------------------

    def append(self, batch: bytes | bytearray | memoryview, header: BatchHeader) -> int:
        """Write one batch (offsets already assigned); returns its file position.

        All or nothing: if the write fails (a full disk) or is cut short, the file is cut back to where it
        was and the OSError raised, with nothing in memory changed. If even that cut fails, the file has
        bytes after ``size`` that are not a batch: SegmentTailDamaged, and no more may be appended.
        """
        position = self.size
        fd = self._descriptor()  # a reopen that fails (ClosedSegmentError, EMFILE) has written nothing
        try:
            fs.write_all(fd, batch)
        except OSError as exc:
            self._cut_back(position, exc)
            raise
        self._appended(batch, header, position)
        return position

    def _appended(self, batch: bytes | bytearray | memoryview, header: BatchHeader, position: int) -> None:
        """Account for a batch just written at ``position``."""
        self.size += len(batch)
        self._written_generation += 1  # after the write: an fsync that reads it covers these bytes
        self._track(header, position)
        recent = self._recent_positions
        if len(recent) >= _RECENT_APPENDS:
            recent.clear()
        recent[header.base_offset] = position

    def _cut_back(self, size: int, cause: OSError) -> None:
        """Undo a failed append: the file back to ``size`` bytes (the descriptor appends, so writes follow it)."""
        self._written_generation += 1  # the file changed under any fsync running now
        try:
            fs.ftruncate(self._descriptor(), size)
        except OSError as exc:
            raise SegmentTailDamaged(
                f"{self.log_path}: an append failed ({cause.strerror or cause}) and the partial batch could not "
                f"be cut off ({exc.strerror or exc}); bytes after position {size} are not part of the log"
            ) from None

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is at least ``offset`` (a batch holding it goes whole).

        The file is cut (not fsynced: the caller does that) and the in-memory indexes trimmed so that they
        are exactly what appending the remaining batches would have built.
        """
        cut = self.position_of(offset)
        for corrupt in self.corrupt_ranges:
            if corrupt.last_offset >= offset:  # it may hold offsets from ``offset`` on: it goes whole, as a batch
                cut = min(cut, corrupt.position)
        if cut >= self.size:
            return
        self._truncate_file(cut)
        self.size = cut
        self._written_generation += 1
        self._recent_positions.clear()
        if self.corrupt_ranges:  # ``cut`` is a valid batch's position: each range is wholly before or after it
            self._set_corrupt_ranges([r for r in self.corrupt_ranges if r.end <= cut])
            self.save_corrupt_ranges()
        keep = bisect_right(self._index_positions, cut - 1)  # index entries of batches before the cut
        del self._index_offsets[keep:]
        del self._index_positions[keep:]
        # Rebuild from the last index entry still kept: the time index entries up to it give the largest
        # timestamp up to that batch, and re-reading the batches after it restores everything else.
        restart, self.next_offset = 0, self.base_offset
        self.max_timestamp = NO_TIMESTAMP
        self._bytes_since_index = self.index_interval_bytes
        if keep:
            last_indexed = int(self._index_offsets[-1])
            while self._time_offsets and self._time_offsets[-1] > last_indexed:
                self._time_offsets.pop()
                self._time_timestamps.pop()
            self.max_timestamp = int(self._time_timestamps[-1]) if self._time_timestamps else NO_TIMESTAMP
            position = int(self._index_positions[-1])
            header = BatchHeader.parse(self._pread(HEADER_SIZE, position))
            restart, self.next_offset = position + header.size, header.next_offset
            self._bytes_since_index = header.size
        else:
            del self._time_offsets[:]
            del self._time_timestamps[:]
        self._scan_tail(restart, check_crc=False)
        if self.corrupt_ranges and self.corrupt_ranges[-1].end == cut:  # the offsets it stands for stay taken
            self.next_offset = max(self.next_offset, self.corrupt_ranges[-1].last_offset + 1)

    def _truncate_file(self, size: int) -> None:
        fs.ftruncate(self._descriptor(), size)

    def _track(self, header: BatchHeader, position: int) -> None:
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
        if self._bytes_since_index >= self.index_interval_bytes:
            self._index_offsets.append(header.last_offset)
            self._index_positions.append(position)
            self._bytes_since_index = 0
            # (T, o): every record up to offset o has a timestamp <= T, the largest seen so far.
            if self.max_timestamp > (self._time_timestamps[-1] if self._time_timestamps else NO_TIMESTAMP):
                self._time_timestamps.append(self.max_timestamp)
                self._time_offsets.append(header.last_offset)
        self._bytes_since_index += header.size
        self.next_offset = header.next_offset

    @property
    def first_batch_timestamp(self) -> int:
        """The max timestamp of the segment's first batch (its first time index entry), or NO_TIMESTAMP."""
        return int(self._time_timestamps[0]) if self._time_timestamps else NO_TIMESTAMP

    # --- reading ----------------------------------------------------------------------------------------

    def position_of(self, offset: int) -> int:
        """File position of the first batch whose last offset is at least ``offset`` (or the size)."""
        if offset <= self.base_offset:
            return 0
        if offset >= self.next_offset:
            return self.size
        recent = self._recent_positions.get(offset)
        if recent is not None:  # the batch starting at ``offset``: every batch before it ends below it
            return recent
        try:
            return self._position_from_index(offset)
        except _StaleIndexEntry as stale:
            self._rebuild_indexes(str(stale))
            return self._position_from_index(offset)

    def _position_from_index(self, offset: int) -> int:
        # The last indexed batch that ends before ``offset``; the one we want starts at or after it.
        i = bisect_right(self._index_offsets, offset - 1)
        start = int(self._index_positions[i - 1]) if i else 0
        for scanned in self._scan_from_entry(i - 1, start):
            if scanned.header.last_offset >= offset:
                return scanned.position
        return self.size

    def _scan_from_entry(self, entry: int, origin: int) -> Iterator[ScannedBatch]:
        """Batch headers from ``origin``, the position of index entry ``entry`` (-1: none, any boundary).

        The first batch read must be the one the entry names (checked for free: it is read anyway), else
        _StaleIndexEntry, for the caller to rebuild the indexes and look again: an entry never misleads a read.
        """
        batches = self.scan(origin, chunk_size=_LOOKUP_CHUNK)
        if entry < 0:
            yield from batches
            return
        try:
            first = next(batches, None)
        except DecodeError:
            first = None
        named = int(self._index_offsets[entry])
        if first is None or first.header.last_offset != named:
            raise _StaleIndexEntry(
                f"{self.index_path}: entry {entry} (offset {named}, position {origin}) does not point at that batch"
            )
        yield first
        yield from batches

    def last_boundary(self, start: int, limit: int) -> tuple[int, int]:
        """The end of the last whole batch between ``start`` (a batch boundary) and ``limit``, and its last offset.

        Returns (start, -1) when not even the first batch fits. The index gives a batch boundary near
        ``limit``, so only the few headers after it are read.
        """
        try:
            return self._last_boundary_from_index(start, limit)
        except _StaleIndexEntry as stale:
            self._rebuild_indexes(str(stale))
            return self._last_boundary_from_index(start, limit)

    def _last_boundary_from_index(self, start: int, limit: int) -> tuple[int, int]:
        i = bisect_right(self._index_positions, limit)
        use_entry = bool(i) and self._index_positions[i - 1] > start
        origin = int(self._index_positions[i - 1]) if use_entry else start
        end, last_offset = origin, -1
        for scanned in self._scan_from_entry(i - 1 if use_entry else -1, origin):
            if scanned.position + scanned.header.size > limit:
                if last_offset < 0 and origin > start:
                    last_offset = scanned.header.base_offset - 1  # the batch before ``origin`` ends there
                break
            end = scanned.position + scanned.header.size
            last_offset = scanned.header.last_offset
        else:
            if last_offset < 0 and origin > start:
                last_offset = self.next_offset - 1  # ``origin`` is the end of the segment
        return end, last_offset

    def read(self, position: int, size: int) -> bytes:
        return self._pread(size, position)

    def region(self, position: int, size: int) -> FileRegion | bytes:
        """The bytes as a FileRegion (sent with sendfile), or read into memory when the broker's regions already
        hold their budget of descriptors (a fetch of a thousand partitions would otherwise take a thousand)."""
        if self._descriptors.regions_exhausted:
            return self._pread(size, position)
        fd = self._descriptor()
        try:
            return FileRegion(fd, position, size, self._descriptors)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            return self._pread(size, position)  # no descriptor to spare: the bytes themselves

    def largest_timestamp(self) -> int:
        """Kafka's LogSegment.largestTimestamp, by which retention.ms and the compaction lag age a segment: its
        largest record timestamp or, when its records carry none (-1, which CreateTime accepts), when its file was
        last modified. A segment whose file cannot be looked at counts as modified now: nothing is deleted on a
        guess."""
        if self.max_timestamp >= 0:
            return self.max_timestamp
        return self._modified_ms()

    def _modified_ms(self) -> int:
        try:
            return os.stat(self.log_path).st_mtime_ns // 1_000_000
        except OSError:
            return int(time.time() * 1000)

    def first_batch_at_timestamp(self, timestamp: int) -> BatchHeader | None:
        """The first batch whose max timestamp is at least ``timestamp``, or None."""
        if self.max_timestamp < timestamp:
            return None
        # Records before a time index entry (T, o) have timestamps <= T; start from the last T < timestamp.
        i = bisect_right(self._time_timestamps, timestamp - 1)
        start = self.position_of(int(self._time_offsets[i - 1])) if i else 0
        for scanned in self.scan(start, chunk_size=_LOOKUP_CHUNK):
            if scanned.header.max_timestamp >= timestamp:
                return scanned.header
        return None

    def batch_at(self, base_offset: int) -> bytes | None:
        """The whole batch that starts at ``base_offset``."""
        position = self.position_of(base_offset)
        if position >= self.size:
            return None
        header = BatchHeader.parse(self._pread(HEADER_SIZE, position))
        return self._pread(header.size, position)

    # --- lifecycle --------------------------------------------------------------------------------------

    def write_indexes(self) -> None:
        """Write the index files (written whole, then renamed into place)."""
        self._recent_positions.clear()  # a roll seals the segment with this: a sealed one remembers none
        index = bytearray()
        for offset, position in zip(self._index_offsets, self._index_positions, strict=True):
            index += _INDEX_ENTRY.pack(offset - self.base_offset, position)
        time_index = bytearray()
        for timestamp, offset in zip(self._time_timestamps, self._time_offsets, strict=True):
            time_index += _TIME_ENTRY.pack(timestamp, offset - self.base_offset)
        if self.max_timestamp > (self._time_timestamps[-1] if self._time_timestamps else NO_TIMESTAMP):
            # Kafka's final entry on roll: the segment's largest timestamp, so retention can read it back.
            time_index += _TIME_ENTRY.pack(self.max_timestamp, self.next_offset - 1 - self.base_offset)
        self._write_index_files(bytes(index), bytes(time_index))

    def _write_index_files(self, index: bytes, time_index: bytes) -> None:
        write_atomically(self.index_path, index)
        write_atomically(self.time_index_path, time_index)

    def has_index_files(self) -> bool:
        """Whether the index files were written (at a roll or a clean shutdown)."""
        return self.index_path.exists()

    def fsync(self) -> bool:
        """fsync the log file (any thread); returns False if it failed. A closed segment has nothing to sync.

        A segment whose descriptor the cache evicted while it was dirty still owes the fsync: the file is
        opened for it (under the lock, so not while a rename or delete is half done) and closed after.
        """
        with self._fd_lock:
            if self._close_requested or (self._fd < 0 and not self.dirty):
                return True
            fd, transient = self._fd, False
            if fd < 0:
                try:
                    fd, transient = os.open(self.log_path, os.O_RDONLY | os.O_CLOEXEC), True
                except OSError as exc:
                    log.error("fsync of %s failed: cannot open it: %s", self.log_path, exc)
                    return False
            generation = self._written_generation  # read before syncing: later writes stay dirty
            self._fsyncs_running += 1
        synced = False
        try:
            fs.fsync(fd)
            synced = True
        except OSError as exc:
            log.error("fsync of %s failed: %s", self.log_path, exc)
        finally:
            if transient:
                os.close(fd)
            with self._fd_lock:
                self._fsyncs_running -= 1
                if synced:
                    self._synced_generation = max(self._synced_generation, generation)
                if self._close_requested and self._fsyncs_running == 0:
                    self._close_descriptor()
        return synced

    def _close_descriptor(self) -> None:
        # Called with _fd_lock held.
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        """Release the file for good (it is never reopened); if an fsync is using it, the fsync closes it."""
        self._descriptors.forget(self)
        with self._fd_lock:
            self._close_requested = True
            if self._fsyncs_running == 0:
                self._close_descriptor()

    @property
    def closed(self) -> bool:
        return self._close_requested

    def rename_suffix(self, suffix: str) -> None:
        """Rename the segment's files to carry ``suffix`` ("" for the final names). The descriptor stays valid.

        The log file goes first: recovery decides from the log file's name, and a leftover index file
        is only an index to rebuild.
        """
        with self._fd_lock:  # an fsync opening an evicted segment's file sees the paths as they are on disk
            old = self._paths()
            self._set_paths(suffix)
            for source, target in zip(old, self._paths(), strict=True):
                if source.exists():
                    fs.replace(source, target)
            self.suffix = suffix

    def delete(self) -> None:
        self.close()
        for path in self._paths():
            fs.unlink_if_exists(path)
        fs.unlink_if_exists(self.corrupt_ranges_path)  # after the log: a crash between leaves a segment checked again

    def _paths(self) -> tuple[Path, Path, Path, Path]:
        return (self.log_path, self.index_path, self.time_index_path, self.txn_index_path)

    @contextmanager
    def reader(self) -> Iterator[int]:
        """A descriptor of the caller's own for reading the log file from any thread, closed on exit (the log
        cleaner reads sealed segments in a worker thread); ClosedSegmentError if the segment is closed."""
        fd = self._open_transient()
        try:
            yield fd
        finally:
            os.close(fd)

    def adopt(self, descriptors: DescriptorCache) -> None:
        """Move a segment made with a descriptor cache of its own (the log cleaner writes replacements in a
        worker thread) to ``descriptors``, the broker's, on that cache's thread: its descriptor is closed now
        and reopened through the broker's cache on first use."""
        self._descriptors.forget(self)
        with self._fd_lock:
            if self._fsyncs_running == 0:
                self._close_descriptor()
        self._descriptors = descriptors
        self._touch = descriptors.touch

    def __repr__(self) -> str:
        return f"Segment({self.log_path.name}, offsets {self.base_offset}..{self.next_offset - 1}, {self.size} B)"
