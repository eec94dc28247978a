"""Log compaction: Kafka's log cleaner for partitions whose ``cleanup.policy`` includes ``compact``.

A pass over one partition, as Kafka's Cleaner does it:

1. The cleanable section is [first dirty offset, first uncleanable offset): the first dirty offset is where the
   previous pass stopped (the ``cleaner-offset-checkpoint`` file, Kafka's layout, in the data directory), the
   first uncleanable offset the lowest of the active segment's base, the last stable offset (no open
   transaction is ever cleaned) and the first segment holding records newer than ``min.compaction.lag.ms``.
   A partition is cleaned when its dirty ratio (cleanable bytes / bytes from the log start to the first
   uncleanable offset) reaches ``min.cleanable.dirty.ratio``, or when its oldest dirty record is older than
   ``max.compaction.lag.ms``; the dirtiest partition goes first.
2. An offset map (key -> its latest offset) is built over the cleanable section, bounded by
   ``log.cleaner.dedupe.buffer.size``; records of aborted transactions and control batches add nothing. When
   the map is full the pass stops there: the rest waits for the next pass.
3. Every sealed segment from the log start up to where the map stops is rewritten, in groups of consecutive
   segments holding at most ``segment.bytes``: a record stays if it is the latest for its key (or beyond the
   map); a tombstone (null value) stays until its batch's delete horizon (set, Kafka's KIP-534, to the time
   of the pass that first kept it plus ``delete.retention.ms``); records of aborted transactions go, their
   abort markers stay while any of their batches was seen in the pass and then until their own delete
   horizon, a commit marker likewise once no batch of its transaction is left; the last batch of each
   producer the log still tracks stays (emptied of its records if need be) so that idempotent sequence
   numbers survive. Batches keep their offsets, producer fields and codec; a batch losing records is
   rebuilt holding the rest. Offsets never change: the cleaned log has gaps, which readers skip.
4. The replacement segments (``.cleaned``, written and fsynced by the pass) are swapped in by
   PartitionLog.swap_segments on the event loop (``.swap``, then the final names: a crash at any point leaves
   the old segments or the new ones), together with their aborted transaction index files. A fetch already
   sending from a replaced segment keeps reading its old bytes.

Where: the broker runs passes in a worker process (kbroker/storage/cleaner_worker.py) from a ``CleanJob``, a
picklable copy of what a pass needs, taken on the event loop; the pass reads the sealed segments' files and
writes ``.cleaned`` ones, and the loop opens them (``materialize``) and swaps them in. ``PartitionCleaner`` runs
the same pass in the calling thread (tests).

Memory: the offset map keeps each key (or, for a key longer than 16 bytes, its MD5 digest) with its offset in a
dict; ``OffsetMap.BYTES_PER_ENTRY`` is what CPython takes for one, so the number of keys per pass is the
dedupe buffer divided by that (Kafka's map takes 24 bytes per key: it holds ~5x more keys in the same memory).
I/O is throttled to ``log.cleaner.io.max.bytes.per.second`` (bytes read plus written).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kbroker.durable.files import DamagedFileError, StorageError, write_atomically
from kbroker.storage.checkpoints import read_offset_checkpoint, write_offset_checkpoint
from kbroker.storage.descriptors import DescriptorCache
from kbroker.storage.segment import SEGMENT_FILE_SUFFIXES, Segment, wall_clock_ms
from kbroker.storage.swap import CLEANED_SUFFIX
from kbroker.storage.txn_index import AbortedTxn, encode_entries, read_marker
from protocol import compression
from protocol.exceptions import DecodeError
from protocol.records import (
    COMPRESSION_MASK,
    DELETE_HORIZON_BIT,
    HEADER,
    HEADER_SIZE,
    BatchHeader,
    RawRecord,
    iter_batches,
    iter_raw_records,
    map_record_keys,
    rebuild_batch,
    record_with_timestamp_delta,
    retained_records,
)

if TYPE_CHECKING:
    from kbroker.storage.log import PartitionLog

log = logging.getLogger("kbroker.cleaner")

CLEANER_CHECKPOINT_FILE = "cleaner-offset-checkpoint"
READ_CHUNK = 1 << 20  # bytes read from a segment at a time (Kafka's log.cleaner.io.buffer.size is 512 KiB)
MAX_SHORT_KEY = 16  # keys up to this long are kept as they are; longer ones as their MD5 digest and a mark,
LONG_KEY_MARK = b"\x00"  # 17 bytes then, so that no short key (a digest written as a key) can stand for one


class CleanerAborted(Exception):
    """The pass was stopped (shutdown) or its partition changed under it; nothing was swapped in."""


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """The broker's log.cleaner.* settings."""

    enabled: bool = True
    dedupe_buffer_bytes: int = 134_217_728
    load_factor: float = 0.9
    io_max_bytes_per_second: float = float("inf")
    backoff_ms: int = 15_000


# --- choosing what to clean --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CleanableSection:
    """What a pass over one partition may clean, and how dirty it is."""

    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    dirty_bytes: int
    overdue: bool  # older than max.compaction.lag.ms: cleaned whatever the ratio

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def cleanable_section(plog: PartitionLog, checkpoint: int | None, now_ms: int) -> CleanableSection:
    """Kafka's LogCleanerManager.cleanableOffsets and dirty ratio for ``plog``, from its cleaner ``checkpoint``."""
    config = plog.config
    first_dirty = plog.log_start_offset
    if checkpoint is not None and plog.log_start_offset <= checkpoint <= plog.log_end_offset:
        first_dirty = checkpoint  # a checkpoint outside the log (records deleted, log truncated) starts over
    sealed = plog.segments[:-1]
    bounds = [plog.active.base_offset, plog.last_stable_offset]
    # A segment holding corrupt ranges is never rewritten (its bytes stay as recovery found them), and the keys
    # of the records after it cannot be mapped over it: cleaning stops before it, as Kafka stops cleaning a log
    # whose batches it cannot read. DeleteRecords past it (or retention) lets cleaning go on.
    damaged = next((s.base_offset for s in sealed if s.corrupt_ranges), None)
    if damaged is not None:
        bounds.append(damaged)
    if config.min_compaction_lag_ms > 0:
        for segment in sealed:
            young = segment.largest_timestamp() > now_ms - config.min_compaction_lag_ms
            if segment.next_offset > first_dirty and young:
                bounds.append(segment.base_offset)
                break
    first_uncleanable = max(first_dirty, min(bounds))
    clean_bytes = sum(s.size for s in sealed if s.next_offset <= first_dirty)
    dirty = [s for s in sealed if s.next_offset > first_dirty and s.base_offset < first_uncleanable]
    dirty_bytes = sum(s.size for s in dirty)
    overdue = False
    if dirty and config.max_compaction_lag_ms < 2**63 - 1:
        oldest = dirty[0].first_batch_timestamp
        overdue = oldest >= 0 and now_ms - oldest > config.max_compaction_lag_ms
    return CleanableSection(first_dirty, first_uncleanable, clean_bytes, dirty_bytes, overdue)


def wants_cleaning(plog: PartitionLog, section: CleanableSection) -> bool:
    if section.dirty_bytes == 0:
        return False
    return section.overdue or section.dirty_ratio >= plog.config.min_cleanable_dirty_ratio


# --- the offset map ----------------------------------------------------------------------------------------


def _long_key_slot(key: bytes) -> bytes:
    """The map's key for a key longer than MAX_SHORT_KEY."""
    return hashlib.md5(key, usedforsecurity=False).digest() + LONG_KEY_MARK


class OffsetMap:
    """Key -> the offset of its latest record in the section mapped, up to a fixed number of keys."""

    BYTES_PER_ENTRY = 128  # a dict slot, a key of up to 16 bytes and an int offset, as CPython stores them

    def __init__(self, memory_bytes: int, load_factor: float = 0.9) -> None:
        self.capacity = max(1, int(memory_bytes * load_factor) // self.BYTES_PER_ENTRY)
        self.slots: dict[bytes, int] = {}  # a key (or its digest, see slot) -> its latest offset
        self.latest_offset = -1  # the last offset whose record was mapped (or looked at: control, aborted)

    def __len__(self) -> int:
        return len(self.slots)

    @staticmethod
    def slot(key: bytes) -> bytes:
        return key if len(key) <= MAX_SHORT_KEY else _long_key_slot(key)

    def put(self, key: bytes, offset: int) -> None:
        self.slots[self.slot(key)] = offset
        self.latest_offset = offset

    def get(self, key: bytes) -> int:
        return self.slots.get(self.slot(key), -1)


# --- transactions seen while cleaning (Kafka's CleanedTransactionMetadata) ---------------------------------


@dataclass(slots=True)
class _AbortedInProgress:
    entry: AbortedTxn
    batch_seen: bool = False


class TransactionTracker:
    """Which batches belong to aborted transactions, and which markers may go, reading a log in offset order."""

    def __init__(self, aborted: list[AbortedTxn]) -> None:
        self._upcoming = deque(sorted(aborted, key=lambda e: e.first_offset))
        self._aborted: dict[int, _AbortedInProgress] = {}  # producer id -> its aborted transaction under way
        self._committed: set[int] = set()  # producers whose transaction under way had a batch seen
        self.kept_aborted: list[AbortedTxn] = []  # entries whose abort markers stay (for the new index)

    def _reach(self, offset: int) -> None:
        while self._upcoming and self._upcoming[0].first_offset <= offset:
            entry = self._upcoming.popleft()
            self._aborted[entry.producer_id] = _AbortedInProgress(entry)

    def data_batch(self, header: BatchHeader) -> bool:
        """Whether the (non-control) batch belongs to an aborted transaction, and is dropped."""
        self._reach(header.last_offset)
        if not header.is_transactional:
            return False
        ongoing = self._aborted.get(header.producer_id)
        if ongoing is not None:
            ongoing.batch_seen = True
            return True
        self._committed.add(header.producer_id)
        return False

    def marker(self, header: BatchHeader, commit: bool | None) -> bool:
        """Whether the control batch may go once its delete horizon passes (``commit`` None: unreadable, kept).

        An abort marker stays while this pass saw batches of its transaction (they are being removed now) and
        keeps its index entry; a commit marker stays while its transaction still has batches.
        """
        self._reach(header.last_offset)
        if commit is None:
            return False
        if not commit:
            ongoing = self._aborted.pop(header.producer_id, None)
            if ongoing is not None and ongoing.batch_seen:
                self.kept_aborted.append(ongoing.entry)
                return False
            return True
        if header.producer_id in self._committed:
            self._committed.discard(header.producer_id)
            return False
        return True


# --- reading segments outside the event loop -----------------------------------------------------------------


class Throttler:
    """Holds the pass to ``rate`` bytes a second (read plus written), sleeping in its thread."""

    def __init__(self, rate: float, stop: threading.Event) -> None:
        self.rate = rate
        self.stop = stop
        self.started = time.monotonic()
        self.bytes = 0

    def account(self, size: int) -> None:
        if self.stop.is_set():
            raise CleanerAborted("the cleaner is stopping")
        self.bytes += size
        if self.rate == float("inf"):
            return
        ahead = self.bytes / self.rate - (time.monotonic() - self.started)
        if ahead > 0.01:
            if self.stop.wait(ahead):
                raise CleanerAborted("the cleaner is stopping")


@dataclass(frozen=True, slots=True)
class SourceSegment:
    """A sealed segment a pass reads, by its file: a worker (thread or process) opens it itself."""

    directory: Path
    base_offset: int
    next_offset: int
    size: int

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.base_offset:020d}.log"


def read_batches(segment: SourceSegment, throttle: Throttler) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Every batch of a sealed segment, read through a descriptor of the pass's own."""
    try:
        fd = os.open(segment.log_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CleanerAborted(f"{segment.log_path.name} was removed during the pass") from None
    try:
        position, end = 0, segment.size
        while position < end:
            chunk = os.pread(fd, min(READ_CHUNK, end - position), position)
            throttle.account(len(chunk))
            consumed = 0
            for header, batch in iter_batches(chunk):
                yield header, batch
                consumed += header.size
            if consumed == 0:  # one batch larger than a chunk
                if len(chunk) < HEADER_SIZE:
                    raise DecodeError(f"{segment.log_path}: {len(chunk)} bytes at {position} are not a batch")
                header = BatchHeader(*HEADER.unpack_from(chunk, 0))
                whole = os.pread(fd, header.size, position)
                if len(whole) != header.size:
                    raise DecodeError(f"{segment.log_path}: batch at position {position} is cut short")
                throttle.account(len(whole))
                yield header, memoryview(whole)
                consumed = header.size
            position += consumed
    finally:
        os.close(fd)


def _records_body(header: BatchHeader, batch: memoryview) -> bytes | memoryview:
    body = batch[HEADER_SIZE:]
    if header.compression:
        return compression.decompress(header.compression, body, 1 << 31)
    return body


def _marker_kind(batch: memoryview) -> bool | None:
    try:
        commit, _ = read_marker(batch)
    except DecodeError:
        return None
    return commit


# --- a pass ------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class CleanerStats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    keys_mapped: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True, slots=True)
class CleanJob:
    """Everything a pass needs, taken from the log on the event loop: a worker thread or process runs it
    (``run_job``) reading only the sealed segments' files and writing ``.cleaned`` ones beside them."""

    directory: Path
    name: str  # topic-partition, for messages
    section: CleanableSection
    settings: CleanerSettings
    now_ms: int
    sources: list[SourceSegment]  # the sealed segments below the first uncleanable offset
    aborted: list[AbortedTxn]
    last_batches: dict[int, int]  # producer id -> last offset of its last batch (kept for its sequence numbers)
    delete_retention_ms: int
    segment_bytes: int
    index_interval_bytes: int

    @classmethod
    def for_log(cls, plog: PartitionLog, section: CleanableSection, settings: CleanerSettings, now_ms: int) -> CleanJob:
        return cls(
            directory=plog.directory,
            name=f"{plog.topic}-{plog.partition}",
            section=section,
            settings=settings,
            now_ms=now_ms,
            sources=[
                SourceSegment(plog.directory, s.base_offset, s.next_offset, s.size)
                for s in plog.segments[:-1]
                if s.base_offset < section.first_uncleanable
            ],
            aborted=list(plog.aborted.entries),
            last_batches={
                pid: entry.batches[-1].last_offset for pid, entry in plog.producers.producers.items() if entry.batches
            },
            delete_retention_ms=plog.config.delete_retention_ms,
            segment_bytes=plog.config.segment_bytes,
            index_interval_bytes=plog.config.index_interval_bytes,
        )


@dataclass(frozen=True, slots=True)
class JobResult:
    """What a pass wrote: replacements (``<base>.log.cleaned`` and their index files, fsynced) for the sources
    with the ``replaced`` base offsets."""

    end_offset: int  # the next pass starts here (the new cleaner checkpoint)
    replaced: list[int]
    replacements: list[int]
    aborted: list[AbortedTxn]
    stats: CleanerStats


@dataclass(slots=True)
class CleanResult:
    """A pass's replacements for consecutive sealed segments, ready for PartitionLog.swap_segments."""

    end_offset: int  # the next pass starts here (the new cleaner checkpoint)
    replaced: list[Segment]
    replacements: list[Segment]  # never empty ones: what was left of wholly emptied segments joins a neighbour
    aborted: list[AbortedTxn]  # the aborted transaction index entries of the replaced offsets afterwards
    stats: CleanerStats


def build_offset_map(
    segments: list[SourceSegment],
    section: CleanableSection,
    aborted: list[AbortedTxn],
    offsets: OffsetMap,
    throttle: Throttler,
    stats: CleanerStats,
) -> int:
    """Map the keys of the cleanable section; the offset the map covers up to (exclusive)."""
    tracker = TransactionTracker([e for e in aborted if e.first_offset < section.first_uncleanable])
    start, stop = section.first_dirty, section.first_uncleanable
    covered = start
    for segment in segments:
        if segment.next_offset <= start:
            continue
        if segment.base_offset >= stop:
            break
        for header, batch in read_batches(segment, throttle):
            if header.base_offset >= stop:
                return covered
            if header.is_control:
                tracker.marker(header, _marker_kind(batch))
            elif not tracker.data_batch(header):
                # OffsetMap.put for every record of the batch, in one call (in C where protocol.records can).
                done = map_record_keys(
                    _records_body(header, batch),
                    header.records_count,
                    header.base_offset,
                    offsets.slots,
                    from_offset=start,
                    capacity=offsets.capacity,
                    max_short_key=MAX_SHORT_KEY,
                    long_key=_long_key_slot,
                )
                stats.keys_mapped += done.mapped
                if done.mapped:
                    offsets.latest_offset = done.latest_offset
                if done.stopped_at is not None:
                    return done.stopped_at  # the map holds the keys before this record
            covered = max(covered, header.next_offset)
    return covered


def group_segments(segments: list[SourceSegment], max_bytes: int) -> list[list[SourceSegment]]:
    """Consecutive segments in groups of at most ``max_bytes`` (each group at least one segment), whose offsets
    fit a segment's 32-bit relative index entries, as Kafka's groupSegmentsBySize."""
    groups: list[list[SourceSegment]] = []
    for segment in segments:
        if groups:
            group = groups[-1]
            size = sum(s.size for s in group) + segment.size
            if size <= max_bytes and segment.next_offset - group[0].base_offset <= 2**31 - 1:
                group.append(segment)
                continue
        groups.append([segment])
    return groups


def run_job(job: CleanJob, stop: threading.Event | None = None) -> JobResult:
    """The pass (any thread, or a worker process); ``stop`` set ends it with CleanerAborted. Whatever ends it
    early leaves no ``.cleaned`` file behind."""
    return _Pass(job, stop or threading.Event()).run()


def remove_cleaned_files(directory: Path) -> None:
    """Remove what an unfinished pass left (only the cleaner writes ``.cleaned`` files, one pass at a time)."""
    for path in directory.glob("*" + CLEANED_SUFFIX):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove %s: %s", path, exc)


def materialize(plog: PartitionLog, result: JobResult) -> CleanResult:
    """The log's segments a pass replaces and its replacements opened as segments (the log's descriptor cache;
    any thread, as topic creation opens segments): what swap_segments takes. CleanerAborted if the log no longer
    has the replaced segments (retention or DeleteRecords removed some meanwhile)."""
    by_base = {s.base_offset: s for s in plog.segments[:-1]}
    replaced = [by_base.get(base) for base in result.replaced]
    if any(segment is None for segment in replaced):
        raise CleanerAborted(f"{plog.topic}-{plog.partition} lost segments during the pass")
    replacements = []
    for base in result.replacements:
        segment = Segment(
            plog.directory, base, plog.config.index_interval_bytes, wall_clock_ms(), CLEANED_SUFFIX, plog.descriptors
        )
        segment.load(trust_indexes=True)
        replacements.append(segment)
    return CleanResult(
        result.end_offset, [s for s in replaced if s is not None], replacements, result.aborted, result.stats
    )


class PartitionCleaner:
    """One pass over one partition in the calling thread, up to the swap (which the event loop does)."""

    def __init__(self, plog: PartitionLog, section: CleanableSection, settings: CleanerSettings, now_ms: int) -> None:
        self.plog = plog
        self.job = CleanJob.for_log(plog, section, settings, now_ms)

    def run(self, stop: threading.Event | None = None) -> CleanResult:
        return materialize(self.plog, run_job(self.job, stop))


class _Pass:
    """The work of ``run_job``."""

    def __init__(self, job: CleanJob, stop: threading.Event) -> None:
        self.job = job
        self.section = job.section
        self.settings = job.settings
        self.now_ms = job.now_ms
        self.segments = job.sources
        self.aborted = job.aborted
        self.last_batches = job.last_batches
        self.delete_retention_ms = job.delete_retention_ms
        self.segment_bytes = job.segment_bytes
        self.index_interval_bytes = job.index_interval_bytes
        self.throttle = Throttler(job.settings.io_max_bytes_per_second, stop)
        self.stats = CleanerStats()
        self.written: list[Segment] = []

    def run(self) -> JobResult:
        try:
            return self._run()
        except BaseException:
            self.discard()
            raise
        finally:
            for segment in self.written:
                segment.close()

    def _run(self) -> JobResult:
        offsets = OffsetMap(self.settings.dedupe_buffer_bytes, self.settings.load_factor)
        end = build_offset_map(self.segments, self.section, self.aborted, offsets, self.throttle, self.stats)
        to_clean = [s for s in self.segments if s.base_offset < end]
        tracker = TransactionTracker(self.aborted)
        replacements: list[Segment] = []
        previous: list[SourceSegment] = []
        for group in group_segments(to_clean, self.segment_bytes):
            current = replacements[-1] if replacements else None
            # A replacement left empty by its group takes the next group's records (it is never swapped in
            # empty), unless their offsets would not fit its index; then it keeps an empty batch.
            if current is None or current.size > 0 or group[-1].next_offset - current.base_offset > 2**31 - 1:
                if current is not None and current.size == 0:
                    self._keep_end_of(previous[-1], current)
                replacements.append(self._new_segment(group[0].base_offset))
            replacement = replacements[-1]
            for segment in group:
                for header, batch in read_batches(segment, self.throttle):
                    self.stats.bytes_read += header.size
                    cleaned = self._clean_batch(header, batch, offsets, tracker)
                    if cleaned is not None:
                        replacement.append(cleaned, BatchHeader.parse(cleaned))
                        self.throttle.account(len(cleaned))
                        self.stats.bytes_written += len(cleaned)
            previous = group
        if len(replacements) > 1 and replacements[-1].size == 0:
            # The last groups kept nothing: the replacement before them ends earlier, and they go.
            self._remove(replacements.pop())
        elif replacements and replacements[-1].size == 0:
            # Nothing at all is left (every key deleted): one empty batch keeps the end of the offsets on disk.
            self._keep_end_of(to_clean[-1], replacements[-1])
        for i, replacement in enumerate(replacements):
            upper = replacements[i + 1].base_offset if i + 1 < len(replacements) else to_clean[-1].next_offset
            entries = [e for e in tracker.kept_aborted if replacement.base_offset <= e.last_offset < upper]
            self._seal(replacement, entries)
        return JobResult(
            end,
            [s.base_offset for s in to_clean],
            [s.base_offset for s in replacements],
            tracker.kept_aborted,
            self.stats,
        )

    def _new_segment(self, base_offset: int) -> Segment:
        directory = self.job.directory
        for suffix in SEGMENT_FILE_SUFFIXES:  # left over from a pass that was given up
            (directory / f"{base_offset:020d}{suffix}{CLEANED_SUFFIX}").unlink(missing_ok=True)
        # A descriptor cache of its own, on this thread; swap_segments hands the segment to the log's.
        segment = Segment(
            directory, base_offset, self.index_interval_bytes, wall_clock_ms(), CLEANED_SUFFIX, DescriptorCache(4)
        )
        self.written.append(segment)
        return segment

    def _remove(self, segment: Segment) -> None:
        segment.delete()
        self.written.remove(segment)

    def _keep_end_of(self, last: SourceSegment, replacement: Segment) -> None:
        final: tuple[BatchHeader, memoryview] | None = None
        for header, batch in read_batches(last, self.throttle):
            final = header, batch
        if final is None:
            raise CleanerAborted(f"{last.log_path.name} is empty")
        empty = empty_batch(final[0])
        replacement.append(empty, BatchHeader.parse(empty))

    def _seal(self, segment: Segment, aborted: list[AbortedTxn]) -> None:
        """Step 1 of the swap: the replacement and its index files durable, still named ``.cleaned``."""
        if not segment.fsync():
            raise StorageError(f"cannot fsync {segment.log_path}")
        segment.write_indexes()
        if aborted:
            write_atomically(segment.txn_index_path, encode_entries(aborted))

    def discard(self) -> None:
        """Remove what the pass wrote (it ends without a result)."""
        for segment in self.written:
            segment.close()
        remove_cleaned_files(self.job.directory)

    def _clean_batch(
        self, header: BatchHeader, batch: memoryview, offsets: OffsetMap, tracker: TransactionTracker
    ) -> bytearray | memoryview | None:
        """The batch as it stays in the log (itself, rebuilt with fewer records, or emptied), or None."""
        self.stats.records_read += max(header.records_count, 0)
        horizon = header.base_timestamp if header.has_delete_horizon else None
        if header.is_control:
            may_go = tracker.marker(header, _marker_kind(batch))
            if may_go and horizon is not None and horizon <= self.now_ms:
                return self._emptied(header)
            if may_go and horizon is None:
                return self._with_records(header, batch, None, set_horizon=True)
            self.stats.records_kept += header.records_count
            return batch
        if tracker.data_batch(header):
            return self._emptied(header)
        body = _records_body(header, batch)
        kept, tombstones = retained_records(
            body,
            header.records_count,
            header.base_offset,
            offsets.slots,
            mapped_up_to=offsets.latest_offset,
            retain_deletes=horizon is None or self.now_ms < horizon,
            max_short_key=MAX_SHORT_KEY,
            long_key=_long_key_slot,
        )
        self.stats.records_kept += len(kept)
        if not kept:
            return self._emptied(header)
        needs_horizon = tombstones and horizon is None
        if len(kept) == header.records_count and not needs_horizon:  # every record read: the count is theirs
            return batch
        return self._with_records(header, batch, kept, set_horizon=needs_horizon, body=body)

    def _emptied(self, header: BatchHeader) -> bytearray | None:
        """Nothing of the batch stays; its header does if it is its producer's last batch (sequence numbers)."""
        if header.producer_id >= 0 and self.last_batches.get(header.producer_id) == header.last_offset:
            return empty_batch(header)
        return None

    def _with_records(
        self,
        header: BatchHeader,
        batch: memoryview,
        chosen: list[RawRecord] | None,
        *,
        set_horizon: bool,
        body: bytes | memoryview | None = None,
    ) -> bytearray:
        """The batch rebuilt with the ``chosen`` records (all of them when None), with a delete horizon if asked;
        ``body``: its records, decompressed, if the caller has them."""
        if body is None:
            body = _records_body(header, batch)
        records = list(iter_raw_records(body, header.records_count)) if chosen is None else chosen
        attributes = header.attributes
        base_timestamp = header.base_timestamp
        if set_horizon:
            base_timestamp = self.now_ms + self.delete_retention_ms
            attributes |= DELETE_HORIZON_BIT
        parts = []
        max_timestamp = -1
        for record in records:
            timestamp = header.base_timestamp + record.timestamp_delta
            max_timestamp = max(max_timestamp, timestamp)
            if base_timestamp == header.base_timestamp:
                parts.append(bytes(body[record.start : record.end]))
            else:
                parts.append(record_with_timestamp_delta(body, record, timestamp - base_timestamp))
        if header.is_log_append_time or header.is_control:
            max_timestamp = header.max_timestamp
        payload = b"".join(parts)
        codec = attributes & COMPRESSION_MASK
        if codec:
            payload = compression.compress(codec, payload)
        return rebuild_batch(
            header,
            payload,
            len(records),
            base_timestamp=base_timestamp,
            max_timestamp=max_timestamp,
            attributes=attributes,
        )


def empty_batch(header: BatchHeader) -> bytearray:
    """A batch holding no record that keeps ``header``'s offsets and producer fields (Kafka's writeEmptyHeader)."""
    attributes = header.attributes & ~(COMPRESSION_MASK | DELETE_HORIZON_BIT)
    return rebuild_batch(
        header,
        b"",
        0,
        base_timestamp=header.max_timestamp,
        max_timestamp=header.max_timestamp,
        attributes=attributes,
    )


# --- cleaner checkpoints -----------------------------------------------------------------------------------


class CleanerCheckpoints:
    """Where each compacted partition's next pass starts (Kafka's ``cleaner-offset-checkpoint``)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / CLEANER_CHECKPOINT_FILE
        try:
            self.offsets = read_offset_checkpoint(self.path)
        except DamagedFileError as exc:
            log.warning("%s; every compacted partition is cleaned from its start", exc)
            self.offsets = {}

    def get(self, topic: str, partition: int) -> int | None:
        return self.offsets.get((topic, partition))

    def update(self, topic: str, partition: int, offset: int, *, live: set[tuple[str, int]]) -> None:
        """Record a pass's end; partitions not ``live`` any more (deleted topics) are dropped."""
        self.offsets = {tp: o for tp, o in self.offsets.items() if tp in live}
        self.offsets[(topic, partition)] = offset
        write_offset_checkpoint(self.path, self.offsets)


def describe(plog: PartitionLog, section: CleanableSection, result: CleanResult) -> str:
    """The pass in one log line; sizes are the replaced segments' and their replacements' (appends during the
    pass do not count)."""
    before = sum(s.size for s in result.replaced)
    after = sum(s.size for s in result.replacements)
    stats = result.stats
    mb = stats.bytes_read / 1e6
    return (
        f"cleaned {plog.topic}-{plog.partition} (dirty section {section.first_dirty}..{result.end_offset - 1}, "
        f"dirty ratio {section.dirty_ratio:.2f}): {mb:.1f} MB read in {stats.seconds:.2f} s "
        f"({mb / max(stats.seconds, 1e-6):.1f} MB/s), {stats.records_read} records read, {stats.records_kept} kept, "
        f"{stats.keys_mapped} keys mapped; cleaned segments {before} -> {after} bytes "
        f"({100 * (before - after) / max(before, 1):.1f}% smaller), log now {plog.size_bytes} bytes"
    )
