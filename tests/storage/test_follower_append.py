"""Appending as a follower (PartitionLog.append_as_follower, Kafka's appendAsFollower), over both backends of the one
log engine: a leader's batches are kept byte for byte with their offsets and epochs, the epoch cache, producer
state and aborted transactions follow them, and what does not fit the log is refused before anything is written."""

from __future__ import annotations

from pathlib import Path

from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.api import PartitionEvent
from kbroker.storage.memory import MemoryBackend
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch
from tests.storage.test_storage_contract import EVERYTHING, T0, LogFactory, batch, make_log, values_of

__all__ = ["make_log"]  # the fixture, one log engine over each backend


def leader_log() -> PartitionLog:
    return PartitionLog("l", 0, Path("l-0"), LogConfig(), clean=True, backend=MemoryBackend(Path("l-0")))


def leader_bytes() -> tuple[PartitionLog, bytes]:
    """A leader's log: epoch 0 (offsets 0-1), then epoch 4 with an aborted transaction of producer 9 (offsets
    2-3, its abort marker at 4) and a last record (5); and all its bytes as a fetch reads them."""
    leader = leader_log()
    leader.append(batch([b"a", b"b"]), now_ms=T0)
    leader.assign_leader_epoch(4)
    records = bytearray(
        build_batch(
            [Record(offset_delta=i, timestamp_delta=i, key=b"k", value=v) for i, v in enumerate([b"t1", b"t2"])],
            producer_id=9,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
            base_timestamp=T0,
        )
    )
    assert leader.append(records, now_ms=T0).error_code == ErrorCode.NONE
    assert leader.append_marker(9, 0, commit=False, coordinator_epoch=1, now_ms=T0).error_code == ErrorCode.NONE
    leader.append(batch([b"c"]), now_ms=T0)
    return leader, leader.read(0, EVERYTHING).read_bytes()


def test_a_followers_log_keeps_the_leaders_batches_offsets_and_epochs(make_log: LogFactory) -> None:
    leader, fetched = leader_bytes()
    follower = make_log()
    follower.high_watermark_follows_appends = False
    seen: list[PartitionEvent] = []
    follower.subscribe(seen.append)
    result = follower.append_as_follower(fetched, now_ms=T0)
    assert (result.error_code, result.base_offset, follower.log_end_offset) == (ErrorCode.NONE, 0, 6)
    assert follower.read(0, EVERYTHING).read_bytes() == fetched  # byte for byte
    assert seen == [PartitionEvent.APPENDED]  # the high watermark is the leader's to give
    assert follower.high_watermark == 0
    for epoch in range(6):
        assert follower.end_offset_for_epoch(epoch) == leader.end_offset_for_epoch(epoch)
    assert follower.end_offset_for_epoch(0) == (0, 2)
    assert follower.leader_epoch == 4
    assert follower.aborted_transactions(0, 6) == [(9, 2)] == leader.aborted_transactions(0, 6)
    assert follower.ongoing_transactions() == {}
    # Its abort marker (offset 4) is above the high watermark: the transaction is not stable yet, as on Kafka.
    follower.set_high_watermark(3)
    assert (follower.high_watermark, follower.last_stable_offset) == (3, 2)
    follower.set_high_watermark(100)  # the leader's, bounded by this log
    assert (follower.high_watermark, follower.last_stable_offset) == (6, 6)
    follower.set_high_watermark(5)  # a follower takes the leader's value, even a lower one
    assert (follower.high_watermark, follower.last_stable_offset) == (5, 5)


def test_a_follower_appends_in_pieces_and_after_a_truncation(make_log: LogFactory) -> None:
    _, fetched = leader_bytes()
    follower = make_log()
    follower.high_watermark_follows_appends = False
    first_batch_size = int.from_bytes(fetched[8:12], "big") + 12
    # A fetch answer may end inside a batch: that part waits for the next fetch.
    result = follower.append_as_follower(fetched[: first_batch_size + 30], now_ms=T0)
    assert (result.error_code, follower.log_end_offset) == (ErrorCode.NONE, 2)
    assert follower.append_as_follower(fetched[first_batch_size:], now_ms=T0).base_offset == 2
    assert follower.log_end_offset == 6
    assert follower.append_as_follower(b"", now_ms=T0).base_offset == 6  # nothing new
    follower.truncate_to(2)
    assert (follower.log_end_offset, follower.aborted_transactions(0, 6)) == (2, [])
    assert follower.end_offset_for_epoch(4) == (-1, -1)  # epoch 4 started after the cut: forgotten
    assert follower.end_offset_for_epoch(0) == (0, 2)
    assert follower.append_as_follower(fetched[first_batch_size:], now_ms=T0).base_offset == 2
    assert values_of(follower.read(0, EVERYTHING).read_bytes())[-1] == (5, b"c")


def test_batches_that_do_not_fit_the_log_are_refused_before_anything_is_written(make_log: LogFactory) -> None:
    _, fetched = leader_bytes()
    follower = make_log()
    follower.high_watermark_follows_appends = False
    assert follower.append_as_follower(fetched, now_ms=T0).error_code == ErrorCode.NONE
    again = follower.append_as_follower(fetched, now_ms=T0)  # offsets below the log end
    assert (again.error_code, follower.log_end_offset) == (ErrorCode.OFFSET_OUT_OF_RANGE, 6)
    damaged = bytearray(fetched)
    damaged[-1] ^= 0xFF  # the last batch's CRC no longer matches
    follower.truncate_to(0)
    refused = follower.append_as_follower(damaged, now_ms=T0)
    assert (refused.error_code, follower.log_end_offset, follower.size_bytes) == (ErrorCode.CORRUPT_MESSAGE, 0, 0)
    follower.update_config(LogConfig(max_message_bytes=50))
    too_big = follower.append_as_follower(fetched, now_ms=T0)
    assert (too_big.error_code, follower.log_end_offset) == (ErrorCode.MESSAGE_TOO_LARGE, 0)
