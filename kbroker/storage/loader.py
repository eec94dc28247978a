"""Opening a partition log from its directory, as Kafka's LogLoader: recovery after a crash.

A segment swap a crash interrupted is undone or completed (see kbroker/storage/swap.py), the segments are
loaded (those below the recovery point trusted, the others validated batch by batch, CRC included; only the
end of the log may be cut, its bytes kept aside), corrupt ranges kept in place are reported, gaps between
segments are reported once, and the log start offset, the aborted transaction index, the leader epoch cache and
the producer state (from the newest usable snapshot plus the batches after it) are rebuilt or read back.
Only a file-backed log is ever loaded: a log kept in memory starts empty.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import TYPE_CHECKING

from kbroker.durable import fs
from kbroker.durable.files import DamagedFileError, StorageError, describe_error, fsync_directory, read_log_start_offset
from kbroker.storage.backend import LOG_START_OFFSET_FILE
from kbroker.storage.leader_epochs import CHECKPOINT_FILE, LeaderEpochCache
from kbroker.storage.producer_state import ProducerStateTable, snapshot_offsets
from kbroker.storage.segment import SEGMENT_FILE_SUFFIXES, ScannedBatch, Segment, wall_clock_ms
from kbroker.storage.swap import CLEANED_SUFFIX, SWAP_SUFFIX
from kbroker.storage.txn_index import AbortedTxn, read_marker, read_segment_file, write_segment_file
from protocol.exceptions import DecodeError

if TYPE_CHECKING:
    from kbroker.storage.log import PartitionLog

logger = logging.getLogger("kbroker.storage")


def load(log: PartitionLog, clean: bool, recovery_point: int) -> None:
    """Fill ``log`` (made empty) from its directory: an interrupted swap undone or completed, the segments loaded
    (those from the one holding ``recovery_point`` validated, unless the stop was ``clean``), the log start
    offset, the aborted transaction index and the producer state."""
    for stray in log.directory.glob("*.tmp"):
        fs.unlink(stray)
    swapped_from = _recover_interrupted_swap(log)
    bases = sorted(int(p.name[:-4]) for p in log.directory.glob("*.log") if p.name[:-4].isdigit())
    # Kafka recovers from the segment holding the recovery point: those before it were fsynced whole.
    first_unsynced = len(bases) if clean else max(bisect_right(bases, recovery_point) - 1, 0)
    if swapped_from is not None:
        # A swap completed here may have lost its replacements' index files, .txnindex included (renamed
        # after their logs): those segments are checked and their aborted index rebuilt from the markers.
        first_unsynced = min(first_unsynced, bisect_left(bases, swapped_from))
    created = wall_clock_ms()
    try:
        for i, base in enumerate(bases):
            segment = Segment(
                log.directory, base, log.config.index_interval_bytes, created, descriptors=log.descriptors
            )
            log.segments.append(segment)
            # Only the end of the log may be torn by a crash: a sealed segment was fsynced before the next
            # one was made, so bad bytes in it are corruption, kept in place (see Segment._recover).
            segment.load(trust_indexes=i < first_unsynced, tail_may_be_torn=i == len(bases) - 1)
            if i >= first_unsynced and not segment.fsync():
                # What was validated is made durable, so the recovery point may move past it.
                raise StorageError(f"cannot fsync {segment.log_path} after recovering it")
        _keep_corrupt_ranges(log)
    except BaseException:
        for segment in log.segments:
            segment.close()
        raise
    if not log.segments:
        log.segments.append(
            Segment(log.directory, 0, log.config.index_interval_bytes, created, descriptors=log.descriptors)
        )
    log.segments_changed()
    start_file = log.directory / LOG_START_OFFSET_FILE
    stored = _stored_log_start_offset(log, start_file)
    _report_gaps(log, stored)
    stored_start = stored if stored is not None else 0
    log.log_start_offset = max(stored_start, log.segments[0].base_offset)
    log.log_start_offset = min(log.log_start_offset, log.log_end_offset)
    rebuild_from = _load_txn_indexes(log, first_unsynced)
    rebuild_producer_state(log, rebuild_txn_index_from=rebuild_from)
    for segment in log.segments[:-1]:
        if segment.next_offset > rebuild_from:  # sealed and recovered: its file says what was rebuilt
            write_segment_file(log.directory, segment.base_offset, log.txn_entries_of(segment))


def _keep_corrupt_ranges(log: PartitionLog) -> None:
    """Once every segment is loaded: give a range that ends a sealed segment the offsets up to the next one,
    record each segment's ranges (so later starts check it again), and report each range, once per start."""
    for segment, following in zip(log.segments, log.segments[1:], strict=False):
        segment.set_corrupt_range_end(following.base_offset)
    for segment in log.segments:
        if not segment.corrupt_ranges and not segment.corrupt_ranges_path.exists():
            continue
        segment.save_corrupt_ranges()
        for corrupt in segment.corrupt_ranges:
            if corrupt.last_offset >= corrupt.first_offset:
                what_to_do = (
                    f"kept in place, the batches around them are served and a fetch of these offsets answers "
                    f"CORRUPT_MESSAGE; consumers continue once past them (seek to offset {corrupt.last_offset + 1},"
                    f" or delete the records before it with DeleteRecords)"
                )
            else:
                what_to_do = "kept in place and skipped"
            logger.error("%s-%d: %s; %s", log.topic, log.partition, corrupt.describe(segment.log_path), what_to_do)


def _stored_log_start_offset(log: PartitionLog, path: Path) -> int | None:
    """The log start offset file's offset (None if there is none). A damaged one is Kafka's case of an unreadable
    log-start-offset-checkpoint: the log starts at its first segment's base offset, which loses nothing (the
    records that DeleteRecords or retention had removed from that segment become readable again)."""
    if not path.exists():
        return None
    try:
        return read_log_start_offset(path)  # a checked file; the legacy decimal text is read and rewritten
    except (DamagedFileError, OSError) as exc:
        logger.error(
            "%s-%d: the log start offset is unknown (%s); the log starts at its first segment's base offset %d, "
            "as Kafka does with an unreadable log-start-offset-checkpoint. Records deleted below the old log "
            "start offset in that segment are readable again: delete them again with DeleteRecords "
            "(kafka-delete-records.sh), which rewrites %s",
            log.topic,
            log.partition,
            exc,
            log.segments[0].base_offset,
            path,
        )
        return None


def load_leader_epochs(log: PartitionLog) -> LeaderEpochCache:
    """The leader epoch cache from its file; a damaged file is rebuilt from the log (and rewritten): the
    partition leader epoch each batch carries says which epoch wrote it, which Kafka's recovery reads too."""
    path = log.directory / CHECKPOINT_FILE
    try:
        return LeaderEpochCache(path)
    except (DamagedFileError, OSError) as exc:
        problem = describe_error(exc)
    batch_epochs = (
        (scanned.header.partition_leader_epoch, scanned.header.base_offset)
        for segment in log.segments
        for scanned in segment.scan(stop_on_error=True)  # a broken batch found later answers CORRUPT_MESSAGE
    )
    cache = LeaderEpochCache.rebuilt(path, batch_epochs, log.log_start_offset)
    logger.warning(
        "%s-%d: %s; rebuilt it from the partition leader epochs of the log's batches: %s",
        log.topic,
        log.partition,
        problem,
        ", ".join(f"epoch {e.epoch} from offset {e.start_offset}" for e in cache.entries) or "no epochs yet",
    )
    return cache


def _load_txn_indexes(log: PartitionLog, first_unsynced: int) -> int:
    """Read the .txnindex files of the segments below the recovery point (fsynced when they were rolled);
    the offset from which the index must be rebuilt from control batches (the others, or a damaged file's)."""
    for i, segment in enumerate(log.segments[:first_unsynced]):
        try:
            entries = read_segment_file(log.directory, segment.base_offset, segment.next_offset)
        except (OSError, DamagedFileError) as exc:
            logger.warning("%s-%d: rebuilding the aborted transaction index: %s", log.topic, log.partition, exc)
            return segment.base_offset
        for entry in entries:
            log.aborted.add(entry)
        if i == len(log.segments) - 1:
            return log.log_end_offset  # a clean stop: every segment's file was written
    return log.segments[min(first_unsynced, len(log.segments) - 1)].base_offset


def _report_gaps(log: PartitionLog, stored_start: int | None) -> None:
    """Log offsets missing between segments (a segment file deleted or cut by recovery), with the paths.

    Kafka's LogLoader neither reports nor repairs such a gap, and reads skip it; the same here, but said
    once at start-up. A compacted log has gaps by design, so only a log that is not compacted is checked.
    """
    if "compact" in log.config.cleanup_policy:
        return
    if stored_start is not None and stored_start < log.segments[0].base_offset:
        logger.warning(
            "%s-%d: offsets %d..%d are missing: the log starts at %s, its log start offset is %d",
            log.topic,
            log.partition,
            stored_start,
            log.segments[0].base_offset - 1,
            log.segments[0].log_path,
            stored_start,
        )
    for before, after in zip(log.segments, log.segments[1:], strict=False):
        tail = before.corrupt_ranges[-1] if before.corrupt_ranges else None
        if tail is not None and tail.end == before.size and tail.last_offset == after.base_offset - 1:
            continue  # corrupt bytes stand for these offsets: reported as such
        if before.next_offset < after.base_offset:
            logger.warning(
                "%s-%d: offsets %d..%d are missing between %s and %s (a segment file was removed or cut)",
                log.topic,
                log.partition,
                before.next_offset,
                after.base_offset - 1,
                before.log_path,
                after.log_path,
            )


def _recover_interrupted_swap(log: PartitionLog) -> int | None:
    """Finish or undo a segment swap that a crash interrupted (see swap_segments for the steps).

    Any ``.logger.cleaned`` left means the swap had not committed: the replacements are deleted and the old
    segments, untouched until then, stay. Only ``.logger.swap`` files mean it had: the old segments they
    cover are deleted and the replacements take their final names. Returns the first offset of a swap it
    completed, or None.
    """
    cleaned_logs = sorted(log.directory.glob("*.log" + CLEANED_SUFFIX))
    swap_logs = sorted(log.directory.glob("*.log" + SWAP_SUFFIX))
    if cleaned_logs:
        for path in [*log.directory.glob("*" + CLEANED_SUFFIX), *log.directory.glob("*" + SWAP_SUFFIX)]:
            path.unlink()
        logger.warning("%s: removed a segment swap that had not completed", log.directory)
        fsync_directory(log.directory)
        return None
    swap_bases = [int(p.name.split(".")[0]) for p in swap_logs]
    # Index files whose log was renamed ahead of them; the indexes are rebuilt below or on load.
    for stray in log.directory.glob("*" + CLEANED_SUFFIX):
        stray.unlink()
    for stray in log.directory.glob("*" + SWAP_SUFFIX):
        if int(stray.name.split(".")[0]) not in swap_bases:
            stray.unlink()
    if not swap_logs:
        return None
    replacements = []
    for base in swap_bases:
        segment = Segment(
            log.directory, base, log.config.index_interval_bytes, wall_clock_ms(), SWAP_SUFFIX, log.descriptors
        )
        segment.load(trust_indexes=False)
        replacements.append(segment)
    covered_from, covered_to = replacements[0].base_offset, max(s.next_offset for s in replacements)
    for path in list(log.directory.glob("*.log")):
        base_text = path.name[:-4]
        if base_text.isdigit() and covered_from <= int(base_text) < covered_to:
            for suffix in SEGMENT_FILE_SUFFIXES:
                (log.directory / (base_text + suffix)).unlink(missing_ok=True)
    fsync_directory(log.directory)
    for segment in replacements:
        segment.write_indexes()
        segment.rename_suffix("")
        segment.close()
    fsync_directory(log.directory)
    logger.warning("%s: completed an interrupted segment swap of offsets %d..", log.directory, covered_from)
    return covered_from


def rebuild_producer_state(log: PartitionLog, *, rebuild_txn_index_from: int | None = None) -> None:
    """Producer state from the newest usable snapshot plus the batches after it (markers end transactions).

    ``rebuild_txn_index_from``: the aborted transaction index is rebuilt from the markers at and after it
    (recovery), so the snapshot used is one at or before it, or none (the whole log is read).
    """
    end = log.log_end_offset
    floor = end if rebuild_txn_index_from is None else min(rebuild_txn_index_from, end)
    usable = [o for o in snapshot_offsets(log.directory) if o <= floor]
    start = 0
    if usable:
        try:
            log.producers = ProducerStateTable.load_snapshot(log.directory, usable[-1])
            start = usable[-1]
        except (OSError, DamagedFileError) as exc:
            logger.warning("unreadable producer snapshot, rebuilding it from the log: %s", exc)
            log.producers = ProducerStateTable()
    rebuilt: list[AbortedTxn] = []
    for segment in log.segments:
        if segment.next_offset <= start:
            continue
        for scanned in segment.scan(segment.position_of(start)):
            header = scanned.header
            if header.producer_id < 0:
                continue
            if not header.is_control:
                log.producers.record(header)
                continue
            marker = _marker_of(log, segment, scanned)
            if marker is None:
                continue
            commit, coordinator_epoch = marker
            stable = log.producers.stable_offset_after_marker(header.producer_id, header.base_offset)
            first = log.producers.complete_txn(
                header.producer_id, header.producer_epoch, coordinator_epoch, header.max_timestamp
            )
            if rebuild_txn_index_from is not None and header.base_offset >= rebuild_txn_index_from:
                if first is not None and not commit:
                    rebuilt.append(AbortedTxn(header.producer_id, first, header.base_offset, stable))
    if rebuild_txn_index_from is not None:
        log.aborted.replace_range(rebuild_txn_index_from, end + 1, rebuilt)


def _marker_of(log: PartitionLog, segment: Segment, scanned: ScannedBatch) -> tuple[bool, int] | None:
    """(commit, coordinator epoch) of a control batch; None (logged) if it cannot be read as a marker."""
    try:
        return read_marker(segment.read(scanned.position, scanned.header.size))
    except DecodeError as exc:
        logger.warning(
            "%s-%d: control batch at offset %d is not a transaction marker: %s",
            log.topic,
            log.partition,
            scanned.header.base_offset,
            exc,
        )
        return None
