"""The log cleaner (kbroker/storage/cleaner.py): what a pass keeps, what it drops, and that a crash or a reader
during the swap never sees a broken log."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.cleaner import (
    CleanerAborted,
    CleanerCheckpoints,
    CleanerSettings,
    CleanJob,
    CleanResult,
    OffsetMap,
    PartitionCleaner,
    cleanable_section,
    materialize,
    wants_cleaning,
)
from kbroker.storage.cleaner_worker import frame, read_frame
from kbroker.storage.segment import FileRegion
from protocol.records import BatchHeader, Record, build_batch, decode_records, iter_batches
from tests.storage.reading import stored_records
from tests.storage.test_partition_swap import Crash, crash_after

T0 = 1_700_000_000_000
DAY = 86_400_000
CONFIG = LogConfig(segment_bytes=600, cleanup_policy="compact", delete_retention_ms=DAY, min_cleanable_dirty_ratio=0.01)
SETTINGS = CleanerSettings()


def batch(
    *pairs: tuple[bytes | None, bytes | None],
    timestamp: int = T0,
    compression: int = 0,
    producer: tuple[int, int, int] | None = None,
    transactional: bool = False,
) -> bytearray:
    records = [Record(offset_delta=i, timestamp_delta=i, key=k, value=v) for i, (k, v) in enumerate(pairs)]
    pid, epoch, sequence = producer if producer is not None else (-1, -1, -1)
    return bytearray(
        build_batch(
            records,
            base_timestamp=timestamp,
            compression_type=compression,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=sequence,
            is_transactional=transactional,
        )
    )


def open_log(path: Path, config: LogConfig = CONFIG, *, clean: bool = True) -> PartitionLog:
    return PartitionLog("t", 0, path, config, clean=clean)


def contents(plog: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record from the log start, as a consumer reading everything sees them."""
    return [(h.base_offset + r.offset_delta, r.key, r.value) for h, r in stored_records(plog) if not h.is_control]


def headers(plog: PartitionLog) -> list[BatchHeader]:
    return [h for s in plog.segments for h, _ in iter_batches(s.read(0, s.size))]


def clean(plog: PartitionLog, now: int, settings: CleanerSettings = SETTINGS, checkpoint: int | None = None) -> int:
    """One pass, swapped in as the service does; the next pass's start offset."""
    section = cleanable_section(plog, checkpoint, now)
    result = PartitionCleaner(plog, section, settings, now).run()
    swap(plog, result)
    return result.end_offset


def swap(plog: PartitionLog, result: CleanResult) -> None:
    if result.replacements:
        plog.swap_segments(result.replaced, result.replacements, prepared=True, aborted=result.aborted)


def changelog(path: Path, rounds: int = 10, keys: int = 5, config: LogConfig = CONFIG) -> PartitionLog:
    """``rounds`` updates of ``keys`` keys, one batch per round, then one more round in the active segment."""
    plog = open_log(path, config)
    for r in range(rounds + 1):
        plog.append(batch(*[(f"k{k}".encode(), f"r{r}".encode()) for k in range(keys)]), now_ms=T0)
        if r == rounds - 1:
            plog.roll(T0)
    return plog


def latest(path_contents: list[tuple[int, bytes | None, bytes | None]]) -> dict[bytes | None, bytes | None]:
    values: dict[bytes | None, bytes | None] = {}
    for _, key, value in path_contents:
        values[key] = value
    return values


def test_a_pass_keeps_the_latest_record_of_each_key_at_its_offset_and_leaves_the_active_segment(
    tmp_path: Path,
) -> None:
    plog = changelog(tmp_path)
    before = contents(plog)
    active_bytes = plog.active.read(0, plog.active.size)
    end = clean(plog, T0)
    assert end == plog.active.base_offset == 50
    after = contents(plog)
    # The last round before the active segment stays (offsets 45..49), every older one goes.
    assert after == [(o, k, v) for o, k, v in before if o >= 45]
    assert latest(after) == latest(before)
    assert plog.active.read(0, plog.active.size) == active_bytes
    assert plog.log_start_offset == 0 and plog.log_end_offset == 55
    # A reader at an offset that was compacted away gets the next record; offsets never change.
    assert next(iter_batches(plog.read(3, 1 << 20).read_bytes()))[0].base_offset == 45
    plog.close()
    assert contents(open_log(tmp_path)) == after


def test_only_superseded_records_go_within_a_batch_and_compressed_batches_keep_their_codec(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch((b"a", b"1"), (b"b", b"1"), (b"c", b"1"), compression=4), now_ms=T0)  # zstd
    plog.append(batch((b"b", b"2")), now_ms=T0)
    plog.roll(T0)
    plog.append(batch((b"x", b"x")), now_ms=T0)
    clean(plog, T0)
    assert contents(plog) == [(0, b"a", b"1"), (2, b"c", b"1"), (3, b"b", b"2"), (4, b"x", b"x")]
    first = headers(plog)[0]
    # The rebuilt batch keeps its offset range, codec and base timestamp, and holds two records.
    assert (first.base_offset, first.last_offset_delta, first.compression, first.records_count) == (0, 2, 4, 2)
    assert first.base_timestamp == T0 and first.max_timestamp == T0 + 2


def test_tombstones_stay_until_delete_retention_after_the_pass_that_kept_them(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch((b"a", b"1"), (b"b", b"1")), now_ms=T0)
    plog.append(batch((b"a", None)), now_ms=T0)  # a tombstone for a
    plog.roll(T0)
    plog.append(batch((b"c", b"1")), now_ms=T0)
    clean(plog, T0)
    assert contents(plog) == [(1, b"b", b"1"), (2, b"a", None), (3, b"c", b"1")]
    tombstone = headers(plog)[1]
    assert tombstone.has_delete_horizon and tombstone.base_timestamp == T0 + DAY  # KIP-534's delete horizon
    # Its record keeps its own timestamp under the new base timestamp.
    stored = plog.read(2, 1 << 20).read_bytes()[: tombstone.size]
    assert [tombstone.base_timestamp + r.timestamp_delta for r in decode_records(stored)] == [T0]
    # Before the horizon another pass keeps it; after it the tombstone goes.
    plog.append(batch((b"d", b"1")), now_ms=T0)
    plog.roll(T0)
    plog.append(batch((b"e", b"1")), now_ms=T0)
    clean(plog, T0 + DAY - 1, checkpoint=0)
    assert (2, b"a", None) in contents(plog)
    clean(plog, T0 + DAY, checkpoint=0)
    assert contents(plog) == [(1, b"b", b"1"), (3, b"c", b"1"), (4, b"d", b"1"), (5, b"e", b"1")]


def test_the_dirty_ratio_and_the_compaction_lags_decide_what_is_cleanable(tmp_path: Path) -> None:
    config = CONFIG._replace(min_cleanable_dirty_ratio=0.6, min_compaction_lag_ms=1000)
    plog = changelog(tmp_path, config=config)
    # Each round's records have timestamps T0..T0+4: they are cleanable once T0+1004 is 1000 ms ago.
    section = cleanable_section(plog, None, T0 + 1005)
    assert (section.first_dirty, section.first_uncleanable, section.clean_bytes) == (0, 50, 0)
    assert section.dirty_ratio == 1.0 and wants_cleaning(plog, section)
    # Records younger than min.compaction.lag.ms are not cleanable: nothing is before their segment.
    young = cleanable_section(plog, None, T0 + 1003)
    assert young.first_uncleanable == 0 and not wants_cleaning(plog, young)
    end = clean(plog, T0 + 1005)
    after = cleanable_section(plog, end, T0 + 1005)
    assert (after.first_dirty, after.dirty_bytes) == (50, 0) and not wants_cleaning(plog, after)
    # One more sealed round: dirty but below the ratio, until max.compaction.lag.ms makes it overdue.
    plog.roll(T0)
    plog.append(batch((b"k0", b"new")), now_ms=T0)
    section = cleanable_section(plog, end, T0 + 1005)
    assert 0 < section.dirty_ratio < 0.6 and not wants_cleaning(plog, section)
    plog.update_config(config._replace(max_compaction_lag_ms=500))
    overdue = cleanable_section(plog, end, T0 + 1005)
    assert overdue.overdue and wants_cleaning(plog, overdue)


def test_an_open_transaction_bounds_the_cleanable_section(tmp_path: Path) -> None:
    plog = changelog(tmp_path, rounds=2)
    plog.append(batch((b"k0", b"txn"), producer=(7, 0, 0), transactional=True), now_ms=T0)
    plog.roll(T0)
    plog.append(batch((b"k1", b"z")), now_ms=T0)
    section = cleanable_section(plog, None, T0)
    assert section.first_uncleanable == plog.last_stable_offset == 15


def test_aborted_records_go_and_their_marker_stays_until_no_batch_is_left_then_its_horizon(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch((b"a", b"committed"), producer=(7, 0, 0), transactional=True), now_ms=T0)
    plog.append_marker(7, 0, True, 0, T0)  # offset 1
    plog.append(batch((b"a", b"aborted"), (b"b", b"aborted"), producer=(7, 0, 1), transactional=True), now_ms=T0)
    plog.append_marker(7, 0, False, 0, T0)  # offset 4
    plog.append(batch((b"c", b"plain")), now_ms=T0)  # offset 5: the producer's last batch is before it
    plog.roll(T0)
    plog.append(batch((b"z", b"active")), now_ms=T0)
    assert [(e.producer_id, e.first_offset, e.last_offset) for e in plog.aborted.entries] == [(7, 2, 4)]
    clean(plog, T0)
    assert contents(plog) == [(0, b"a", b"committed"), (5, b"c", b"plain"), (6, b"z", b"active")]
    kinds = [(h.base_offset, h.is_control, h.records_count) for h in headers(plog)]
    # The aborted batch (the producer's last data batch) stays emptied: its sequence numbers are needed.
    assert kinds == [(0, False, 1), (1, True, 1), (2, False, 0), (4, True, 1), (5, False, 1), (6, False, 1)]
    assert plog.aborted_transactions(0, 7) == [(7, 2)]  # the marker stays, and its index entry
    # While the emptied batch is the producer's last it stays, and so does the marker: a pass that sees a
    # batch of an aborted transaction keeps its marker (Kafka's rule). A later transaction releases both.
    clean(plog, T0, checkpoint=0)
    assert [h.base_offset for h in headers(plog) if h.is_control] == [1, 4]
    plog.append(batch((b"d", b"later"), producer=(7, 0, 3), transactional=True), now_ms=T0)  # offset 7
    plog.append_marker(7, 0, True, 0, T0)  # offset 8
    plog.roll(T0)
    plog.append(batch((b"z", b"active")), now_ms=T0)
    clean(plog, T0, checkpoint=0)  # drops the emptied batch; the marker stays as this pass saw the batch
    assert [(h.base_offset, h.is_control) for h in headers(plog)][:3] == [(0, False), (1, True), (4, True)]
    # The next pass sees no batch of the aborted transaction: the marker gets its horizon, then goes.
    clean(plog, T0 + 1, checkpoint=0)
    marker = [h for h in headers(plog) if h.base_offset == 4][0]
    assert marker.has_delete_horizon and marker.base_timestamp == T0 + 1 + DAY
    clean(plog, T0 + 2 + DAY, checkpoint=0)
    # The commit markers stay: their transactions' data is there.
    assert [h.base_offset for h in headers(plog) if h.is_control] == [1, 8]
    assert plog.aborted_transactions(0, 10) == []
    assert not (tmp_path / "00000000000000000000.txnindex").exists()
    expected = [(0, b"a", b"committed"), (5, b"c", b"plain"), (6, b"z", b"active"), (7, b"d", b"later")]
    assert contents(plog)[:4] == expected
    plog.close()
    reopened = open_log(tmp_path, clean=False)
    assert reopened.aborted_transactions(0, 10) == []
    assert contents(reopened)[:4] == expected


def test_the_last_batch_of_a_producer_stays_so_a_retry_is_still_a_duplicate_after_recovery(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch((b"a", b"1"), producer=(9, 0, 0)), now_ms=T0)
    plog.append(batch((b"a", b"2")), now_ms=T0)  # supersedes the producer's only record
    plog.roll(T0)
    plog.append(batch((b"b", b"x")), now_ms=T0)
    clean(plog, T0)
    first = headers(plog)[0]
    assert (first.base_offset, first.records_count, first.producer_id, first.base_sequence) == (0, 0, 9, 0)
    plog.close()
    reopened = open_log(tmp_path, clean=False)
    for name in tmp_path.glob("*.snapshot"):
        name.unlink()  # rebuilt from the log alone
    reopened.close()
    reopened = open_log(tmp_path, clean=False)
    retry = reopened.append(batch((b"a", b"1"), producer=(9, 0, 0)), now_ms=T0)
    assert retry.base_offset == 0 and reopened.log_end_offset == 3


def test_a_small_offset_map_cleans_in_several_passes(tmp_path: Path) -> None:
    plog = changelog(tmp_path)
    before = contents(plog)
    three_keys = CleanerSettings(dedupe_buffer_bytes=3 * OffsetMap.BYTES_PER_ENTRY, load_factor=1.0)
    ends = []
    checkpoint = None
    while checkpoint != 50:
        checkpoint = clean(plog, T0, three_keys, checkpoint)
        ends.append(checkpoint)
        assert latest(contents(plog)) == latest(before)  # never a latest value lost
    # Five keys a round, three per pass: every pass stops where the map is full, and the next goes on.
    assert len(ends) > 3 and ends == sorted(set(ends))
    clean(plog, T0, CleanerSettings(), checkpoint=0)
    assert [o for o, _, _ in contents(plog)] == list(range(45, 55))


def test_the_checkpoint_file_is_kafkas_layout_and_survives_a_restart(tmp_path: Path) -> None:
    checkpoints = CleanerCheckpoints(tmp_path)
    checkpoints.update("t", 0, 50, live={("t", 0), ("u", 1)})
    checkpoints.update("u", 1, 7, live={("t", 0), ("u", 1)})
    assert (tmp_path / "cleaner-offset-checkpoint").read_text() == "0\n2\nt 0 50\nu 1 7\n"
    checkpoints.update("t", 0, 60, live={("t", 0)})  # u was deleted
    assert CleanerCheckpoints(tmp_path).offsets == {("t", 0): 60}
    (tmp_path / "cleaner-offset-checkpoint").write_text("garbage")
    assert CleanerCheckpoints(tmp_path).offsets == {}


def test_a_stopped_pass_leaves_nothing_behind(tmp_path: Path) -> None:
    plog = changelog(tmp_path)
    before = contents(plog)
    stop = threading.Event()
    stop.set()
    cleaner = PartitionCleaner(plog, cleanable_section(plog, None, T0), SETTINGS, T0)
    with pytest.raises(CleanerAborted):
        cleaner.run(stop)
    assert [p.name for p in tmp_path.iterdir() if ".cleaned" in p.name] == []
    assert contents(plog) == before


def test_a_fetch_sending_from_a_replaced_segment_gets_its_old_bytes(tmp_path: Path) -> None:
    plog = changelog(tmp_path)
    chunk = plog.read(0, 1 << 20)
    region = chunk.region()
    assert isinstance(region, FileRegion)
    old = chunk.read_bytes()
    clean(plog, T0)
    assert plog.read(0, 1 << 20).read_bytes() != old
    try:
        assert os.pread(region.fd, region.length, region.position) == old
    finally:
        region.close()


def check_a_crash_at_each_step_of_the_swap(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    build: Callable[[Path], PartitionLog],
    observe: Callable[[PartitionLog], object],
) -> int:
    """Build a log and clean it once without a crash, then again for each file operation of the swap with a
    crash just before it: what ``observe`` sees of the log reopened after the crash is what it saw before the
    pass or after it. Returns how many operations the swap took."""
    reference = build(tmp_path / "reference")
    before = observe(reference)
    clean(reference, T0)
    after = observe(reference)
    assert after != before
    steps = 0
    while True:
        directory = tmp_path / f"crash-{steps}"
        plog = build(directory)
        result = PartitionCleaner(plog, cleanable_section(plog, None, T0), SETTINGS, T0).run()
        with monkeypatch.context() as patch:
            crash_after(patch, steps)
            try:
                swap(plog, result)
                finished = True
            except Crash:
                finished = False
        for segment in plog.segments:
            segment.close()
        assert observe(open_log(directory, clean=False)) in (before, after), f"crash after {steps} operations"
        if finished:
            return steps
        steps += 1


def test_a_crash_at_any_step_of_the_swap_leaves_the_old_or_the_cleaned_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps = check_a_crash_at_each_step_of_the_swap(tmp_path, monkeypatch, changelog, contents)
    assert steps >= 4  # renames to .swap, deletes, renames to the final names


def test_records_without_a_key_are_dropped_from_the_cleaned_section(tmp_path: Path) -> None:
    plog = open_log(tmp_path, CONFIG._replace(cleanup_policy="delete"))  # written before the topic was compacted
    plog.append(batch((None, b"keyless"), (b"a", b"1")), now_ms=T0)
    plog.roll(T0)
    plog.append(batch((b"b", b"1")), now_ms=T0)
    plog.update_config(CONFIG)
    clean(plog, T0)
    assert contents(plog) == [(1, b"a", b"1"), (2, b"b", b"1")]


def test_the_worker_process_runs_jobs_one_after_another_and_names_what_it_cannot_do(tmp_path: Path) -> None:
    plog = changelog(tmp_path)
    job = CleanJob.for_log(plog, cleanable_section(plog, None, T0), SETTINGS, T0)
    gone = replace(job, sources=[replace(job.sources[0], base_offset=1)])  # no such segment file
    frames = b"".join(frame(pickle.dumps(item)) for item in (gone, "not a job", job))
    done = subprocess.run(
        [sys.executable, "-m", "kbroker.storage.cleaner_worker"], input=frames, capture_output=True, check=True
    )
    stream = io.BytesIO(done.stdout)
    outcomes = []
    while (payload := read_frame(stream)) is not None:
        outcomes.append(pickle.loads(payload))
    assert [kind for kind, _ in outcomes] == ["aborted", "failed", "done"]
    assert "00000000000000000001.log was removed" in outcomes[0][1]
    assert outcomes[1][1] == "expected a CleanJob, got str"
    result = outcomes[2][1]
    assert (result.end_offset, result.replaced, result.replacements) == (50, [0, 25], [0])
    # What the worker wrote is swapped in as the in-process pass's would be.
    swap(plog, materialize(plog, result))
    assert [o for o, _, _ in contents(plog)] == list(range(45, 55))
