"""Partition state of the disk engine: HW / LSO / LEO, events, truncate_to and the leader epoch cache."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kbroker.storage import LogConfig, PartitionEvent, PartitionLog
from kbroker.storage.leader_epochs import CHECKPOINT_FILE, EpochEntry, LeaderEpochCache
from kbroker.storage.segment import Segment
from protocol.errors import ErrorCode, KafkaError
from protocol.records import BatchHeader, Record, assign_offsets, build_batch, iter_batches
from tests.storage.reading import stored_records

T0 = 1_700_000_000_000


def batch(
    values: list[bytes], *, timestamp: int = T0, producer_id: int = -1, epoch: int = -1, sequence: int = -1
) -> bytearray:
    records = [Record(offset_delta=i, timestamp_delta=i, key=b"k", value=v) for i, v in enumerate(values)]
    return bytearray(
        build_batch(
            records, base_timestamp=timestamp, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence
        )
    )


def offsets_in(plog: PartitionLog) -> list[int]:
    """Every record offset the log returns, reading from the log start to the end."""
    return [header.base_offset + record.offset_delta for header, record in stored_records(plog)]


def open_log(path: Path, clean: bool = True, **config: int | str) -> PartitionLog:
    return PartitionLog("t", 0, path, LogConfig(**config), clean=clean)  # type: ignore[arg-type]


BATCH_SIZE = len(batch([b"aa", b"bb"]))


def two_record_log(path: Path, batches: int = 10) -> PartitionLog:
    """``batches`` batches of two records, three batches per segment: [0..5] [6..11] [12..17] [18..]."""
    plog = open_log(path, segment_bytes=3 * BATCH_SIZE)
    for i in range(batches):
        assert plog.append(batch([b"aa", b"bb"], timestamp=T0 + i), now_ms=T0).base_offset == 2 * i
    return plog


# --- high watermark, last stable offset, log end offset -------------------------------------------------


def test_single_node_append_moves_hw_and_lso_to_the_log_end(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    assert (plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (0, 0, 0)
    plog.append(batch([b"a", b"b", b"c"]), now_ms=T0)
    assert (plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (3, 3, 3)
    # Never backwards, never beyond the log end.
    assert plog.update_high_watermark(1) is False
    assert plog.update_high_watermark(99) is False
    assert (plog.high_watermark, plog.last_stable_offset) == (3, 3)


def test_hw_and_lso_apart_from_leo_when_replication_moves_them(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.high_watermark_follows_appends = False
    events: list[PartitionEvent] = []
    plog.subscribe(events.append)
    plog.append(batch([b"a", b"b", b"c"]), now_ms=T0)
    plog.append(batch([b"d"]), now_ms=T0)
    assert (plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (4, 0, 0)
    assert events == [PartitionEvent.APPENDED, PartitionEvent.APPENDED]
    # A read bounded by the high watermark sees nothing yet.
    assert plog.read(0, 1 << 20, max_offset=plog.high_watermark).size == 0
    assert plog.update_high_watermark(3) is True
    assert (plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (4, 3, 3)
    assert plog.update_high_watermark(2) is False
    assert plog.update_high_watermark(3) is False
    assert plog.update_high_watermark(10) is True  # clamped to the log end
    assert (plog.high_watermark, plog.last_stable_offset) == (4, 4)
    moved = PartitionEvent.HIGH_WATERMARK | PartitionEvent.STABLE_OFFSET
    assert events == [PartitionEvent.APPENDED, PartitionEvent.APPENDED, moved, moved]


def test_hw_is_the_log_end_after_a_restart(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.high_watermark_follows_appends = False
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.close()
    reopened = open_log(tmp_path)
    assert (reopened.log_end_offset, reopened.high_watermark, reopened.last_stable_offset) == (2, 2, 2)


# --- events ---------------------------------------------------------------------------------------------


def test_events_fire_after_the_change_with_all_flags_once(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    seen: list[tuple[PartitionEvent, int, int, int]] = []
    plog.subscribe(lambda e: seen.append((e, plog.log_end_offset, plog.high_watermark, plog.last_stable_offset)))
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    everything = PartitionEvent.APPENDED | PartitionEvent.HIGH_WATERMARK | PartitionEvent.STABLE_OFFSET
    assert seen == [(everything, 2, 2, 2)]


def test_no_event_for_rejected_duplicate_truncation_or_retention(tmp_path: Path) -> None:
    plog = open_log(tmp_path, retention_ms=1000, segment_bytes=BATCH_SIZE)
    first = batch([b"a", b"b"], producer_id=7, epoch=0, sequence=0)
    assert plog.append(first, now_ms=T0).base_offset == 0
    plog.append(batch([b"c", b"d"]), now_ms=T0)
    plog.append(batch([b"e", b"f"]), now_ms=T0)
    events: list[PartitionEvent] = []
    plog.subscribe(events.append)
    # A retry of the first batch is acknowledged with its offsets and appends nothing.
    duplicate = plog.append(batch([b"a", b"b"], producer_id=7, epoch=0, sequence=0), now_ms=T0)
    assert (duplicate.error_code, duplicate.base_offset) == (ErrorCode.NONE, 0)
    plog.update_config(LogConfig(segment_bytes=BATCH_SIZE, retention_ms=1000, timestamp_before_max_ms=10))
    rejected = plog.append(batch([b"y"], timestamp=0), now_ms=T0)
    assert rejected.error_code == ErrorCode.INVALID_TIMESTAMP
    plog.truncate_to(4)
    assert plog.log_end_offset == 4
    assert [s.base_offset for s in plog.apply_retention(T0 + 10_000)] == [0, 2]
    assert plog.log_start_offset == 4
    assert events == []


def test_unsubscribe_is_idempotent_and_stops_events(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    first: list[PartitionEvent] = []
    second: list[PartitionEvent] = []
    stop_first = plog.subscribe(first.append)
    plog.subscribe(second.append)
    plog.append(batch([b"a"]), now_ms=T0)
    stop_first()
    stop_first()
    plog.append(batch([b"b"]), now_ms=T0)
    assert len(first) == 1 and len(second) == 2


def test_a_listener_may_unsubscribe_itself_while_called(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    calls: list[str] = []

    def once(event: PartitionEvent) -> None:
        calls.append("once")
        unsubscribe()

    unsubscribe = plog.subscribe(once)
    plog.subscribe(lambda e: calls.append("always"))
    plog.append(batch([b"a"]), now_ms=T0)
    plog.append(batch([b"b"]), now_ms=T0)
    assert calls == ["once", "always", "always"]


def test_a_raising_listener_is_logged_and_does_not_stop_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plog = open_log(tmp_path)
    later: list[PartitionEvent] = []

    def broken(event: PartitionEvent) -> None:
        raise RuntimeError("listener bug")

    plog.subscribe(broken)
    plog.subscribe(later.append)
    with caplog.at_level(logging.ERROR, logger="kbroker.storage"):
        result = plog.append(batch([b"a"]), now_ms=T0)
    assert (result.error_code, result.base_offset, plog.high_watermark) == (ErrorCode.NONE, 0, 1)
    assert len(later) == 1
    failures = [r for r in caplog.records if "listener failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert "listener bug" in str(failures[0].exc_info[1])


# --- truncate_to ----------------------------------------------------------------------------------------


def segment_ranges(plog: PartitionLog) -> list[tuple[int, int]]:
    return [(s.base_offset, s.next_offset) for s in plog.segments]


def test_truncate_inside_a_segment(tmp_path: Path) -> None:
    plog = two_record_log(tmp_path)
    assert segment_ranges(plog) == [(0, 6), (6, 12), (12, 18), (18, 20)]
    plog.truncate_to(8)
    assert segment_ranges(plog) == [(0, 6), (6, 8)]
    assert (plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (8, 8, 8)
    assert offsets_in(plog) == list(range(8))
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [
        "00000000000000000000.log",
        "00000000000000000006.log",
    ]
    assert plog.append(batch([b"z"]), now_ms=T0).base_offset == 8
    assert offsets_in(plog) == list(range(9))


def test_truncate_removes_a_straddling_batch_whole(tmp_path: Path) -> None:
    plog = two_record_log(tmp_path)
    plog.truncate_to(9)  # batch 8..9 holds offset 9
    assert (plog.log_end_offset, segment_ranges(plog)) == (8, [(0, 6), (6, 8)])
    plog.truncate_to(1)  # batch 0..1
    assert (plog.log_end_offset, segment_ranges(plog)) == (0, [(0, 0)])
    assert plog.segments[0].size == 0 and offsets_in(plog) == []
    assert plog.append(batch([b"z"]), now_ms=T0).base_offset == 0


def test_truncate_at_a_segment_boundary(tmp_path: Path) -> None:
    plog = two_record_log(tmp_path)
    plog.truncate_to(12)
    # As Kafka: the segment starting at the offset stays, empty, as the active segment.
    assert segment_ranges(plog) == [(0, 6), (6, 12), (12, 12)]
    assert plog.log_end_offset == 12 and plog.active.size == 0
    assert plog.append(batch([b"y", b"z"]), now_ms=T0).base_offset == 12
    assert segment_ranges(plog) == [(0, 6), (6, 12), (12, 14)]
    assert offsets_in(plog) == list(range(14))


def test_truncate_across_several_segments(tmp_path: Path) -> None:
    plog = two_record_log(tmp_path)
    plog.truncate_to(3)
    assert segment_ranges(plog) == [(0, 2)]
    assert offsets_in(plog) == [0, 1]
    assert [p.name for p in tmp_path.glob("*.log")] == ["00000000000000000000.log"]


def test_truncate_to_the_log_end_or_beyond_does_nothing(tmp_path: Path) -> None:
    plog = two_record_log(tmp_path, batches=2)
    size = plog.active.size
    plog.truncate_to(4)
    plog.truncate_to(100)
    assert (plog.log_end_offset, plog.active.size) == (4, size)


def test_truncate_below_the_log_start_offset_is_out_of_range(tmp_path: Path) -> None:
    plog = two_record_log(tmp_path)
    plog.delete_records(4)
    with pytest.raises(KafkaError) as raised:
        plog.truncate_to(3)
    assert raised.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert plog.log_end_offset == 20
    plog.truncate_to(4)
    assert (plog.log_start_offset, plog.log_end_offset) == (4, 4)


def test_truncate_through_the_log_start_batch_moves_the_log_start_down(tmp_path: Path) -> None:
    plog = two_record_log(tmp_path)
    plog.delete_records(5)  # inside batch 4..5
    plog.truncate_to(5)
    assert (plog.log_start_offset, plog.log_end_offset, plog.high_watermark) == (4, 4, 4)
    reopened = open_log(tmp_path, segment_bytes=3 * BATCH_SIZE)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (4, 4)


@pytest.mark.parametrize("clean", [True, False], ids=["clean-restart", "crash-restart"])
def test_truncation_survives_a_restart(tmp_path: Path, clean: bool) -> None:
    plog = two_record_log(tmp_path)
    plog.truncate_to(9)
    plog.append(batch([b"z"]), now_ms=T0)
    if clean:
        plog.close()
    reopened = open_log(tmp_path, clean=clean, segment_bytes=3 * BATCH_SIZE)
    assert segment_ranges(reopened) == [(0, 6), (6, 9)]
    assert offsets_in(reopened) == list(range(9))
    assert (reopened.log_end_offset, reopened.high_watermark, reopened.last_stable_offset) == (9, 9, 9)
    assert reopened.append(batch([b"after"]), now_ms=T0).base_offset == 9


def test_truncate_rebuilds_producer_state_and_drops_later_snapshots(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_bytes=2 * BATCH_SIZE)
    for sequence in range(0, 8, 2):  # offsets 0..1, 2..3 | 4..5, 6..7
        appended = plog.append(batch([b"aa", b"bb"], producer_id=7, epoch=0, sequence=sequence), now_ms=T0)
        assert appended.base_offset == sequence
    assert [s.base_offset for s in plog.segments] == [0, 4]
    assert sorted(p.name for p in tmp_path.glob("*.snapshot")) == ["00000000000000000004.snapshot"]
    plog.truncate_to(4)
    assert list(tmp_path.glob("*.snapshot")) == []
    # Sequence 4 was a duplicate before the truncation; now it is the next one and is written again.
    again = plog.append(batch([b"aa", b"bb"], producer_id=7, epoch=0, sequence=4), now_ms=T0)
    assert (again.error_code, again.base_offset) == (ErrorCode.NONE, 4)
    gap = plog.append(batch([b"aa"], producer_id=7, epoch=0, sequence=9), now_ms=T0)
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_segment_truncation_leaves_the_indexes_an_append_would_build(tmp_path: Path) -> None:
    # Timestamps that go up and down, and an index entry every few batches, so the largest timestamp of a
    # prefix is not always at an index entry.
    timestamps = [T0 + t for t in (5, 50, 20, 7, 60, 3, 61, 1, 90, 2, 30, 95)]
    sizes = len(batch([b"v"]))
    for cut in range(len(timestamps) + 1):
        directory = tmp_path / str(cut)
        directory.mkdir()
        segment = Segment(directory, 0, 2 * sizes + 1, T0)
        for i, ts in enumerate(timestamps):
            data = batch([b"v"], timestamp=ts)
            assign_offsets(data, i, partition_leader_epoch=0)
            segment.append(data, BatchHeader.parse(data))
        segment.truncate_to(cut)
        expected = Segment(directory, 0, 2 * sizes + 1, T0)
        expected.load(trust_indexes=False)
        assert (segment.size, segment.next_offset) == (expected.size, expected.next_offset) == (cut * sizes, cut)
        assert segment.max_timestamp == max(timestamps[:cut], default=-1) == expected.max_timestamp
        assert segment._index_offsets == expected._index_offsets
        assert segment._index_positions == expected._index_positions
        assert segment._time_timestamps == expected._time_timestamps
        assert segment._time_offsets == expected._time_offsets
        segment.close()
        expected.close()


def test_truncate_keeps_timestamp_lookups_right(tmp_path: Path) -> None:
    plog = open_log(tmp_path, index_interval_bytes=1)
    for i, ts in enumerate((10, 40, 20, 30)):
        plog.append(batch([b"v"], timestamp=T0 + ts), now_ms=T0 + 100)
        assert plog.log_end_offset == i + 1
    plog.truncate_to(2)
    assert plog.max_timestamp() == (1, T0 + 40)
    assert plog.offset_for_timestamp(T0 + 15) == (1, T0 + 40)
    assert plog.offset_for_timestamp(T0 + 41) is None


# --- leader epochs --------------------------------------------------------------------------------------


def epochs(plog: PartitionLog) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in plog.leader_epochs.entries]


def batch_epochs(plog: PartitionLog) -> list[int]:
    return [h.partition_leader_epoch for h, _ in iter_batches(plog.read(0, 1 << 20).read_bytes())]


def test_leader_epochs_are_assigned_recorded_and_written_into_batches(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    # Epoch 0 from the log start is assumed (what a log without the file has), not written.
    assert (plog.leader_epoch, epochs(plog)) == (0, [(0, 0)])
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    assert not (tmp_path / CHECKPOINT_FILE).exists()
    assert epochs(plog) == [(0, 0)]
    with pytest.raises(KafkaError) as raised:
        plog.assign_leader_epoch(0)
    assert raised.value.code == ErrorCode.FENCED_LEADER_EPOCH
    plog.assign_leader_epoch(3)
    plog.append(batch([b"c", b"d"]), now_ms=T0)
    plog.assign_leader_epoch(5)
    plog.append(batch([b"e"]), now_ms=T0)
    assert plog.leader_epoch == 5
    assert epochs(plog) == [(0, 0), (3, 2), (5, 4)]
    assert batch_epochs(plog) == [0, 3, 5]
    assert (tmp_path / CHECKPOINT_FILE).read_text() == "0\n3\n0 0\n3 2\n5 4\n"
    with pytest.raises(KafkaError):
        plog.assign_leader_epoch(4)


def test_end_offset_for_epoch(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    assert plog.end_offset_for_epoch(0) == (0, 0)  # nothing written: the current epoch, as Kafka's cache has it
    plog.assign_leader_epoch(2)
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.assign_leader_epoch(4)
    plog.append(batch([b"c", b"d"]), now_ms=T0)
    plog.assign_leader_epoch(7)
    plog.append(batch([b"e"]), now_ms=T0)
    assert epochs(plog) == [(2, 0), (4, 2), (7, 4)]
    assert plog.end_offset_for_epoch(-1) == (-1, -1)
    assert plog.end_offset_for_epoch(1) == (1, 0)  # below the first entry: the first entry's start
    assert plog.end_offset_for_epoch(2) == (2, 2)
    assert plog.end_offset_for_epoch(3) == (2, 2)  # the largest epoch <= 3 is 2, ending where 4 starts
    assert plog.end_offset_for_epoch(4) == (4, 4)
    assert plog.end_offset_for_epoch(6) == (4, 4)
    assert plog.end_offset_for_epoch(7) == (7, 5)  # the current epoch ends at the log end
    assert plog.end_offset_for_epoch(8) == (-1, -1)


def test_a_new_epoch_without_appends_replaces_the_previous_entry_at_the_same_offset(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch([b"a"]), now_ms=T0)
    plog.assign_leader_epoch(1)
    plog.assign_leader_epoch(2)
    assert epochs(plog) == [(0, 0), (2, 1)]
    assert plog.end_offset_for_epoch(1) == (0, 1)


def test_leader_epochs_persist_and_truncation_drops_later_entries(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.assign_leader_epoch(3)
    plog.append(batch([b"c", b"d"]), now_ms=T0)
    plog.assign_leader_epoch(5)
    plog.append(batch([b"e"]), now_ms=T0)
    plog.close()
    reopened = open_log(tmp_path)
    assert (reopened.leader_epoch, epochs(reopened)) == (5, [(0, 0), (3, 2), (5, 4)])
    reopened.truncate_to(3)  # removes batch 2..3: epochs 3 and 5 never wrote below offset 2
    assert epochs(reopened) == [(0, 0)]
    assert (tmp_path / CHECKPOINT_FILE).read_text() == "0\n1\n0 0\n"
    # Still leader in epoch 5: the next batch starts it again.
    reopened.append(batch([b"f"]), now_ms=T0)
    assert epochs(reopened) == [(0, 0), (5, 2)]
    assert batch_epochs(reopened) == [0, 5]
    reopened.close()
    assert epochs(open_log(tmp_path, clean=False)) == [(0, 0), (5, 2)]


def test_a_log_written_before_epochs_were_kept_is_epoch_zero_from_its_start(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.append(batch([b"c"]), now_ms=T0)
    plog.delete_records(2)
    plog.close()
    (tmp_path / CHECKPOINT_FILE).unlink()
    reopened = open_log(tmp_path)
    assert (reopened.leader_epoch, epochs(reopened)) == (0, [(0, 2)])
    assert reopened.end_offset_for_epoch(0) == (0, 3)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("1\n1\n0 0\n", "unsupported version"),
        ("0\n2\n0 0\n", "the count says 2 entries but 1 follow"),
        ("0\n1\n0 x\n", "line 3"),
        ("0\n2\n3 5\n1 9\n", "increasing order"),
        ("0\n", "expected a version line and a count line"),
        ("0\nmany\n", "expected the entry count"),
    ],
)
def test_a_damaged_checkpoint_is_rebuilt_from_the_batches_epochs(
    tmp_path: Path, content: str, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    # As Kafka's recovery assigns epochs from the batches' partition leader epochs: the partition stays available.
    plog = two_record_log(tmp_path, batches=2)  # offsets 0..3 in epoch 0
    plog.assign_leader_epoch(3)
    for _ in range(2):
        plog.append(batch([b"aa", b"bb"]), now_ms=T0)  # offsets 4..7 in epoch 3
    plog.assign_leader_epoch(5)  # an epoch that wrote nothing leaves no trace in the batches
    plog.close()
    path = tmp_path / CHECKPOINT_FILE
    path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        reopened = open_log(tmp_path, segment_bytes=3 * BATCH_SIZE)
    assert epochs(reopened) == [(0, 0), (3, 4)]
    assert reopened.end_offset_for_epoch(0) == (0, 4)
    assert f"t-0: damaged file {path}: " in caplog.text and problem in caplog.text
    assert LeaderEpochCache(path).entries == (EpochEntry(0, 0), EpochEntry(3, 4))  # rewritten
    assert offsets_in(reopened) == list(range(8))


def test_an_epoch_cache_rebuilt_after_deleterecords_starts_at_the_log_start(tmp_path: Path) -> None:
    plog = two_record_log(tmp_path, batches=4)  # offsets 0..7 in epoch 0, segments [0..5] [6..]
    plog.assign_leader_epoch(2)
    plog.append(batch([b"aa", b"bb"]), now_ms=T0)  # offsets 8, 9
    plog.delete_records(3)
    plog.close()
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"\x00garbage")
    reopened = open_log(tmp_path, segment_bytes=3 * BATCH_SIZE)
    assert epochs(reopened) == [(0, 3), (2, 8)]
    assert reopened.log_start_offset == 3


def test_checkpoint_file_round_trip(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path / CHECKPOINT_FILE)
    assert cache.entries == () and cache.latest_epoch == -1
    assert cache.assign(1, 10) is True
    assert cache.assign(1, 12) is False  # the same epoch starting later changes nothing
    assert cache.assign(1, 8) is True  # ... starting earlier replaces it
    assert cache.assign(4, 20) is True
    assert LeaderEpochCache(tmp_path / CHECKPOINT_FILE).entries == (EpochEntry(1, 8), EpochEntry(4, 20))
    assert cache.truncate_from_end(20) is True and cache.truncate_from_end(20) is False
    assert LeaderEpochCache(tmp_path / CHECKPOINT_FILE).entries == (EpochEntry(1, 8),)
