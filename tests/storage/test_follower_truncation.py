"""A follower's truncations (kbroker/replication/fetcher.py asks for them), over both backends of the one log
engine: truncating at the log end drops an epoch begun there and never written in (Kafka's truncateTo), and
truncate_fully_and_start_at empties a log to start at its leader's log start (Kafka's truncateFullyAndStartAt)."""

from __future__ import annotations

from pathlib import Path

from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.leader_epochs import EpochEntry
from protocol.errors import ErrorCode
from protocol.records import assign_offsets
from tests.storage.test_follower_append import leader_bytes
from tests.storage.test_storage_contract import EVERYTHING, T0, LogFactory, batch, make_log, values_of

__all__ = ["make_log"]  # the fixture, one log engine over each backend


def test_truncating_at_the_log_end_drops_an_epoch_begun_there_and_nothing_else(make_log: LogFactory) -> None:
    plog = make_log()
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.assign_leader_epoch(3)  # led in epoch 3 from offset 2, nothing written in it
    assert plog.leader_epochs.entries == (EpochEntry(0, 0), EpochEntry(3, 2))
    plog.truncate_to(7)  # past the log end: nothing to cut but that epoch
    assert plog.leader_epochs.entries == (EpochEntry(0, 0),)
    assert plog.log_end_offset == 2 and values_of(plog.read(0, EVERYTHING).read_bytes()) == [(0, b"a"), (1, b"b")]
    plog.truncate_to(2)  # an epoch with records is kept
    assert plog.leader_epochs.entries == (EpochEntry(0, 0),)


def test_a_log_emptied_to_start_at_its_leaders_log_start_takes_the_leaders_batches_from_there(
    make_log: LogFactory,
) -> None:
    _, fetched = leader_bytes()
    plog = make_log()
    plog.high_watermark_follows_appends = False
    assert plog.append_as_follower(fetched, now_ms=T0).error_code == ErrorCode.NONE
    plog.set_high_watermark(6)
    assert (plog.log_end_offset, plog.aborted_transactions(0, 6) != []) == (6, True)

    plog.truncate_fully_and_start_at(100)
    assert (plog.log_start_offset, plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (
        100,
        100,
        100,
        100,
    )
    assert [(s.base_offset, s.next_offset) for s in plog.segments] == [(100, 100)]
    assert plog.leader_epochs.entries == ()
    assert plog.aborted_transactions(0, 200) == [] and plog.producers_view() == []

    later = batch([b"x", b"y"])
    assign_offsets(later, 100, partition_leader_epoch=7)
    assert plog.append_as_follower(later, now_ms=T0).base_offset == 100
    assert values_of(plog.read(100, EVERYTHING).read_bytes()) == [(100, b"x"), (101, b"y")]
    assert plog.leader_epochs.entries == (EpochEntry(7, 100),)
    assert plog.end_offset_for_epoch(7) == (7, 102)


def test_a_log_emptied_to_start_elsewhere_reopens_there(tmp_path: Path) -> None:
    plog = PartitionLog("t", 0, tmp_path / "t-0", LogConfig(), clean=True)
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.truncate_fully_and_start_at(50)
    later = batch([b"x"])
    assign_offsets(later, 50, partition_leader_epoch=2)
    assert plog.append_as_follower(later, now_ms=T0).error_code == ErrorCode.NONE
    plog.close()
    reopened = PartitionLog("t", 0, tmp_path / "t-0", LogConfig(), clean=False)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (50, 51)
    assert values_of(reopened.read(50, EVERYTHING).read_bytes()) == [(50, b"x")]
    assert reopened.leader_epochs.entries == (EpochEntry(2, 50),)
