"""Segment swaps: replacement segments (the log cleaner's, recompression's) put in place of sealed ones, each
step durable before the next so that a crash at any point leaves the old segments or the new ones, never a mix
(kbroker/storage/loader.py finishes or undoes an interrupted swap at the next start).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kbroker.durable.files import StorageError, describe_error
from kbroker.storage.segment import Segment

if TYPE_CHECKING:
    from kbroker.storage.log import PartitionLog
    from kbroker.storage.txn_index import AbortedTxn

logger = logging.getLogger("kbroker.storage")

CLEANED_SUFFIX = ".cleaned"  # a replacement segment being written, not part of the log yet
SWAP_SUFFIX = ".swap"  # a replacement segment committed to take the place of the segments it covers


class SegmentSwapInterrupted(StorageError):
    """A segment swap failed after it began renaming files: the data directory was taken offline, and the next
    start's recovery undoes or completes the swap. The caller must leave the files as they are."""


def swap_segments(
    log: PartitionLog,
    replaced: list[Segment],
    replacements: list[Segment],
    *,
    prepared: bool = False,
    aborted: list[AbortedTxn] | None = None,
) -> None:
    """Put ``replacements`` (from new_cleaned_segment) in place of the contiguous sealed ``replaced``.

    The replacements hold the same offsets (or a subset: compaction drops records) and the first starts
    at the first replaced base offset. Steps, each durable before the next, as Kafka's:
    1. replacements fsynced with their indexes, still named ``.cleaned``;
    2. renamed ``.cleaned`` -> ``.swap``, the last log rename being the commit point;
    3. the replaced segments' files deleted;
    4. replacements renamed to their final names.
    A crash before the commit leaves the old segments (open deletes ``.cleaned`` and ``.swap``), after
    it the new ones (open completes 3 and 4). Regions already taken from a replaced segment keep
    reading its old bytes: they hold their own descriptors.

    Recovery after the commit deletes the replaced segments whose base offsets lie within the replacements'
    offsets; a replaced segment wholly after them (the cleaner removed every record it held) may survive a
    crash there, which leaves a valid log, only less compacted, until the next cleaning.

    ``prepared``: step 1 was done by the caller (the log cleaner, in its worker thread), the replacements
    made with a descriptor cache of their own, which they leave for the log's here. ``aborted``: the
    aborted transaction index entries with markers in the replaced offsets once swapped (the cleaner drops
    those whose markers it removed); their ``.txnindex.cleaned`` files, if any, were written by the caller
    and are renamed with the segments. Without it the entries stay as they were.
    """
    _check_swap(log, replaced, replacements)
    if not prepared:
        for segment in replacements:
            if not segment.fsync():
                raise StorageError(f"cannot fsync {segment.log_path} before swapping it in")
            segment.write_indexes()
    log.backend.sync_directory()  # a failure up to here changed nothing: the caller removes the replacements
    try:
        for segment in replacements:
            segment.rename_suffix(SWAP_SUFFIX)
        log.backend.sync_directory()  # committed
    except (OSError, StorageError) as exc:
        # Some files may carry .swap now: only a restart's recovery may decide (it undoes the swap while a
        # .logger.cleaned is left, else completes it), so nothing more is written here until then.
        raise _swap_interrupted(log, exc) from exc
    # Committed: the replacements are the log from now on, in memory at once (reads use their descriptors,
    # which the renames below do not disturb).
    first = log.segments.index(replaced[0])
    log.segments[first : first + len(replaced)] = replacements
    log.segments_changed()
    if prepared:
        for segment in replacements:
            segment.adopt(log.descriptors)
    if aborted is not None:
        log.aborted.replace_range(replaced[0].base_offset, replaced[-1].next_offset, aborted)
    try:
        for segment in replaced:
            segment.delete()
        log.backend.sync_directory()
        for segment in replacements:
            segment.rename_suffix("")
        log.backend.sync_directory()
        _rewrite_txn_index_files(log, replaced, replacements)
    except (OSError, StorageError) as exc:
        raise _swap_interrupted(log, exc) from exc  # a restart completes the swap from the .swap files
    logger.info(
        "%s-%d: swapped %d segment(s) at offset %d for %d",
        log.topic,
        log.partition,
        len(replaced),
        replaced[0].base_offset,
        len(replacements),
    )


def _swap_interrupted(log: PartitionLog, exc: BaseException) -> SegmentSwapInterrupted:
    problem = f"segment swap of {log.topic}-{log.partition} failed part-way: {describe_error(exc)}"
    log.health.take_offline(problem)
    return SegmentSwapInterrupted(problem)


def _rewrite_txn_index_files(log: PartitionLog, replaced: list[Segment], replacements: list[Segment]) -> None:
    """The aborted index entries stay (the offsets are the same); their files follow the new segments."""
    kept = {s.base_offset for s in replacements}
    for segment in replaced:
        if segment.base_offset not in kept:
            log.backend.remove_txn_index(segment.base_offset)
    for i, segment in enumerate(replacements):
        # A replacement covers offsets up to the next one's base (compaction may leave gaps).
        end = replacements[i + 1].base_offset if i + 1 < len(replacements) else replaced[-1].next_offset
        log.backend.save_txn_index(segment.base_offset, log.aborted.in_range(segment.base_offset, end))


def _check_swap(log: PartitionLog, replaced: list[Segment], replacements: list[Segment]) -> None:
    def refuse(problem: str) -> ValueError:
        return ValueError(f"cannot swap segments of {log.topic}-{log.partition}: {problem}")

    if not replaced or not replacements:
        raise refuse("nothing to replace or nothing to replace it with")
    if any(s is log.active for s in replaced):
        raise refuse("the active segment cannot be replaced")
    ids = [id(s) for s in log.segments]
    if replaced[0] not in log.segments:
        raise refuse("a replaced segment is not part of the log")
    first = ids.index(id(replaced[0]))
    if [id(s) for s in replaced] != ids[first : first + len(replaced)]:
        raise refuse("the replaced segments are not contiguous segments of the log, in order")
    if any(s.suffix != CLEANED_SUFFIX or s.closed for s in replacements):
        raise refuse("replacements must be open segments made by new_cleaned_segment")
    pending = log.backend.pending_replacements(CLEANED_SUFFIX)
    if pending != {s.log_path.name for s in replacements}:
        # Recovery reads any .cleaned file as part of an uncommitted swap, so no others may exist.
        raise refuse(f"other cleaned segments are pending: {sorted(pending)}")
    if replacements[0].base_offset != replaced[0].base_offset:
        raise refuse("the first replacement must start at the first replaced base offset")
    previous_end = replaced[0].base_offset
    for segment in replacements:
        if segment.base_offset < previous_end or segment.size == 0:
            raise refuse("replacements must be non-empty, in order and not overlap")
        previous_end = segment.next_offset
    if previous_end > replaced[-1].next_offset:
        raise refuse("the replacements hold offsets beyond the replaced segments")
