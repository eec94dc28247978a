"""The storage contract: every case runs the one log engine (PartitionLog) over the file backend (in tmp_path) and
the memory backend (kbroker/storage/memory.py), which must give the same offsets, bytes, errors and events."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.storage import LogConfig, OffsetOutOfRange, PartitionLog
from kbroker.storage.api import PartitionEvent
from kbroker.storage.memory import MemoryBackend
from protocol.errors import ErrorCode, KafkaError
from protocol.records import BatchHeader, Record, build_batch, decode_records, iter_batches

T0 = 1_700_000_000_000
EVERYTHING = 1 << 20
APPEND_EVENT = PartitionEvent.APPENDED | PartitionEvent.HIGH_WATERMARK | PartitionEvent.STABLE_OFFSET

LogFactory = Callable[..., PartitionLog]


@pytest.fixture(params=["file", "memory"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    """``make_log(**config)``: an empty partition log of the engine under test, with LogConfig(**config)."""

    def make(**config: int | str) -> PartitionLog:
        settings = LogConfig(**config)  # type: ignore[arg-type]
        if request.param == "file":
            return PartitionLog("t", 0, tmp_path / "t-0", settings, clean=True)
        return PartitionLog("t", 0, Path("t-0"), settings, clean=True, backend=MemoryBackend(Path("t-0")))

    return make


def batch(
    values: list[bytes],
    *,
    timestamp: int = T0,
    producer_id: int = -1,
    epoch: int = -1,
    sequence: int = -1,
    step_ms: int = 1,
) -> bytearray:
    records = [Record(offset_delta=i, timestamp_delta=i * step_ms, key=b"k", value=v) for i, v in enumerate(values)]
    return bytearray(
        build_batch(
            records, base_timestamp=timestamp, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence
        )
    )


def values_of(data: bytes) -> list[tuple[int, bytes | None]]:
    out = []
    for header, view in iter_batches(data):
        out.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
    return out


def headers_of(data: bytes) -> list[BatchHeader]:
    return [header for header, _ in iter_batches(data)]


def consume_all(plog: PartitionLog, start: int, max_bytes: int = EVERYTHING) -> list[tuple[int, bytes | None]]:
    """Every record from ``start`` to the log end, read the way a consumer does (chunk after chunk)."""
    out: list[tuple[int, bytes | None]] = []
    position = start
    while position < plog.high_watermark:
        chunk = plog.read(position, max_bytes)
        assert chunk.size > 0
        out.extend((o, v) for o, v in values_of(chunk.read_bytes()) if o >= position)
        position = chunk.last_offset + 1
    return out


# --- append, read, offsets ---------------------------------------------------------------------------------


def test_append_assigns_offsets_and_reads_back_whole_batches(make_log: LogFactory) -> None:
    plog = make_log()
    first = plog.append(batch([b"a", b"b", b"c"]), now_ms=T0)
    second = plog.append(batch([b"d"]), now_ms=T0)
    assert (first.error_code, first.base_offset, first.log_append_time_ms, first.log_start_offset) == (
        ErrorCode.NONE,
        0,
        -1,
        0,
    )
    assert second.base_offset == 3
    assert (plog.log_start_offset, plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (0, 4, 4, 4)
    chunk = plog.read(0, EVERYTHING)
    assert values_of(chunk.read_bytes()) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    assert chunk.last_offset == 3
    assert chunk.size == len(chunk.read_bytes()) == len(batch([b"a", b"b", b"c"])) + len(batch([b"d"]))
    assert bytes(chunk.region()) == chunk.read_bytes()
    assert [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in headers_of(chunk.read_bytes())] == [
        (0, 2, 0),
        (3, 3, 0),
    ]
    # An offset inside a batch returns that whole batch; the log end is an empty read; beyond it is an error.
    assert values_of(plog.read(1, EVERYTHING).read_bytes())[0] == (0, b"a")
    empty = plog.read(4, EVERYTHING)
    assert (empty.size, empty.last_offset, empty.read_bytes()) == (0, -1, b"")
    with pytest.raises(OffsetOutOfRange) as raised:
        plog.read(5, EVERYTHING)
    assert raised.value.code == ErrorCode.OFFSET_OUT_OF_RANGE


def test_stored_bytes_are_the_batch_with_offsets_assigned(make_log: LogFactory) -> None:
    plog = make_log()
    plog.append(batch([b"x"]), now_ms=T0)
    sent = batch([b"y", b"z"], timestamp=T0 + 5)
    plog.append(sent, now_ms=T0)  # offsets are assigned in place: ``sent`` is what is stored
    assert plog.read(1, EVERYTHING).read_bytes() == bytes(sent)
    assert BatchHeader.parse(sent).base_offset == 1


def test_read_limits_give_whole_batches(make_log: LogFactory) -> None:
    plog = make_log()
    for i in range(5):
        plog.append(batch([bytes([65 + i]) * 100]), now_ms=T0)
    one = len(batch([b"A" * 100]))
    # max_bytes of 2.5 batches gives two whole batches, never a torn one.
    two = plog.read(0, one * 2 + one // 2)
    assert (values_of(two.read_bytes()), two.size, two.last_offset) == ([(0, b"A" * 100), (1, b"B" * 100)], 2 * one, 1)
    # Smaller than one batch: the first batch anyway (KIP-74), unless min_one_batch is off.
    forced = plog.read(0, 10)
    assert (forced.size, forced.last_offset) == (one, 0)
    assert plog.read(0, 10, min_one_batch=False).size == 0
    assert plog.read(2, 0).last_offset == 2
    # max_offset (the high watermark or last stable offset) bounds the read; at or past it nothing is read.
    bounded = plog.read(0, EVERYTHING, max_offset=3)
    assert ([o for o, _ in values_of(bounded.read_bytes())], bounded.last_offset) == ([0, 1, 2], 2)
    assert plog.read(3, EVERYTHING, max_offset=3).size == 0
    assert plog.read(1, EVERYTHING, max_offset=99).last_offset == 4


def test_max_offset_inside_a_batch_leaves_that_batch_out(make_log: LogFactory) -> None:
    plog = make_log()
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.append(batch([b"c", b"d"]), now_ms=T0)
    chunk = plog.read(0, EVERYTHING, max_offset=3)
    assert ([o for o, _ in values_of(chunk.read_bytes())], chunk.last_offset) == ([0, 1], 2)


def test_segments_roll_by_size_and_a_read_stays_in_one_segment(make_log: LogFactory) -> None:
    plog = make_log(segment_bytes=500, index_interval_bytes=1)
    for i in range(20):
        plog.append(batch([b"x" * 100, str(i).encode()]), now_ms=T0)
    size = len(batch([b"x" * 100, b"0"]))
    per_segment = 500 // size
    first = plog.read(0, EVERYTHING)
    assert (first.size, first.last_offset) == (per_segment * size, 2 * per_segment - 1)
    assert plog.size_bytes == sum(len(batch([b"x" * 100, str(i).encode()])) for i in range(20))
    expected = [(2 * i + j, v) for i in range(20) for j, v in enumerate([b"x" * 100, str(i).encode()])]
    assert consume_all(plog, 0) == expected
    assert consume_all(plog, 7, max_bytes=1) == expected[7:]


def test_segments_roll_by_age(make_log: LogFactory) -> None:
    plog = make_log(segment_ms=1000)
    created = int(time.time() * 1000)  # a segment's age counts from when it was created (the wall clock)
    plog.append(batch([b"a"]), now_ms=created)
    plog.append(batch([b"b"]), now_ms=created)
    plog.append(batch([b"c"]), now_ms=created + 60_000)  # the active segment is far older than segment.ms
    # A read returns the batches of one segment: the first two, then the third.
    assert plog.read(0, EVERYTHING).last_offset == 1
    assert plog.read(2, EVERYTHING).last_offset == 2


# --- validation and the idempotent producer -----------------------------------------------------------------


def test_idempotent_producer_duplicates_and_sequence_errors(make_log: LogFactory) -> None:
    plog = make_log()
    assert plog.append(batch([b"a", b"b"], producer_id=7, epoch=0, sequence=0), now_ms=T0).base_offset == 0
    assert plog.append(batch([b"c"], producer_id=7, epoch=0, sequence=2), now_ms=T0).base_offset == 2
    # A retry of the first batch is acknowledged with its original offset and not written again.
    retry = plog.append(batch([b"a", b"b"], producer_id=7, epoch=0, sequence=0), now_ms=T0)
    assert (retry.error_code, retry.base_offset, retry.log_start_offset) == (ErrorCode.NONE, 0, 0)
    assert plog.log_end_offset == 3
    gap = plog.append(batch([b"d"], producer_id=7, epoch=0, sequence=5), now_ms=T0)
    assert (gap.error_code, gap.base_offset) == (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert gap.error_message == "producer 7 sent sequence 5 after 2"
    new_epoch_not_at_zero = plog.append(batch([b"e"], producer_id=7, epoch=1, sequence=3), now_ms=T0)
    assert new_epoch_not_at_zero.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert plog.append(batch([b"f"], producer_id=7, epoch=1, sequence=0), now_ms=T0).base_offset == 3
    fenced = plog.append(batch([b"g"], producer_id=7, epoch=0, sequence=3), now_ms=T0)
    assert fenced.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    # Another producer is independent; an unknown producer may start at any sequence.
    assert plog.append(batch([b"h"], producer_id=8, epoch=0, sequence=41), now_ms=T0).base_offset == 4
    assert plog.log_end_offset == 5
    assert [v for _, v in values_of(plog.read(0, EVERYTHING).read_bytes())] == [b"a", b"b", b"c", b"f", b"h"]


def test_timestamp_and_framing_errors(make_log: LogFactory) -> None:
    plog = make_log(timestamp_before_max_ms=1000, timestamp_after_max_ms=1000)
    old = plog.append(batch([b"a"], timestamp=T0 - 5000), now_ms=T0)
    window = f"The timestamp should be within [{T0 - 1000}, {T0 + 1000}]"
    assert (old.error_code, old.error_message, old.record_errors) == (
        ErrorCode.INVALID_TIMESTAMP,
        "One or more records have been rejected due to invalid timestamp",
        ((0, f"Timestamp {T0 - 5000} of message with offset 0 is out of range. {window}"),),
    )
    # Each record is checked (Kafka's LogValidator), not only the batch's first and largest timestamps.
    late_second = plog.append(batch([b"a", b"b", b"c"], timestamp=T0, step_ms=-3000), now_ms=T0)
    assert (late_second.error_code, late_second.record_errors) == (
        ErrorCode.INVALID_TIMESTAMP,
        (
            (1, f"Timestamp {T0 - 3000} of message with offset 1 is out of range. {window}"),
            (2, f"Timestamp {T0 - 6000} of message with offset 2 is out of range. {window}"),
        ),
    )
    future = plog.append(batch([b"a"], timestamp=T0 + 5000), now_ms=T0)
    assert future.error_code == ErrorCode.INVALID_TIMESTAMP
    # LogAppendTime topics take any client timestamp and stamp the batch with the broker's time.
    stamped = plog.append(batch([b"a"], timestamp=T0 - 5000), now_ms=T0, timestamp_type_log_append=True)
    assert (stamped.error_code, stamped.base_offset, stamped.log_append_time_ms) == (ErrorCode.NONE, 0, T0)
    header = headers_of(plog.read(0, EVERYTHING).read_bytes())[0]
    assert (header.is_log_append_time, header.max_timestamp) == (True, T0)
    two = batch([b"a"]) + batch([b"b"])
    assert plog.append(two, now_ms=T0).error_code == ErrorCode.INVALID_RECORD
    assert plog.append(bytearray(b"\x00" * 10), now_ms=T0).error_code == ErrorCode.CORRUPT_MESSAGE
    assert plog.log_end_offset == 1


# --- timestamps ----------------------------------------------------------------------------------------------


def test_offset_for_timestamp_and_max_timestamp(make_log: LogFactory) -> None:
    plog = make_log(segment_bytes=300)
    assert plog.offset_for_timestamp(T0) is None and plog.max_timestamp() is None
    plog.append(batch([b"a", b"b", b"c"], timestamp=T0, step_ms=10), now_ms=T0)  # 0..2 at T0, +10, +20
    plog.append(batch([b"d" * 200], timestamp=T0 + 100), now_ms=T0)  # 3 at T0+100, a new segment
    plog.append(batch([b"e", b"f"], timestamp=T0 + 50, step_ms=100), now_ms=T0)  # 4 at +50, 5 at +150
    assert plog.offset_for_timestamp(T0 - 1) == (0, T0)
    assert plog.offset_for_timestamp(T0 + 11) == (2, T0 + 20)
    assert plog.offset_for_timestamp(T0 + 21) == (3, T0 + 100)
    assert plog.offset_for_timestamp(T0 + 101) == (5, T0 + 150)
    assert plog.offset_for_timestamp(T0 + 151) is None
    assert plog.max_timestamp() == (5, T0 + 150)
    # Records below the log start offset are not found any more.
    plog.delete_records(1)
    assert plog.offset_for_timestamp(T0) == (1, T0 + 10)


def test_offset_for_timestamp_looks_past_a_batch_that_matches_only_below_the_log_start(make_log: LogFactory) -> None:
    plog = make_log()
    plog.append(batch([b"a", b"b"], timestamp=T0 + 10, step_ms=10), now_ms=T0)  # 0 at +10, 1 at +20
    plog.append(batch([b"c", b"d"], timestamp=T0 + 5, step_ms=25), now_ms=T0)  # 2 at +5, 3 at +30
    plog.delete_records(2)
    assert plog.offset_for_timestamp(T0 + 15) == (3, T0 + 30)
    assert plog.offset_for_timestamp(T0) == (2, T0 + 5)


def test_max_timestamp_is_kafkas_first_record_whatever_the_log_start(make_log: LogFactory) -> None:
    """Kafka's rule (tests/kafka/test_max_timestamp_kafka.py compares it live): the first segment with the largest
    max timestamp, its first batch reaching it, that batch's first record carrying it, below the log start or not."""
    plog = make_log(segment_bytes=300)
    records = [Record(offset_delta=i, timestamp_delta=d, value=b"v") for i, d in enumerate((10, 90, 90))]
    plog.append(bytearray(build_batch(records, base_timestamp=T0)), now_ms=T0)  # 0..2: +10, +90, +90
    plog.append(batch([b"x" * 150], timestamp=T0 + 90), now_ms=T0)  # 3: +90, same segment
    plog.append(batch([b"y" * 150, b"z"], timestamp=T0 + 80, step_ms=10), now_ms=T0)  # 4: +80, 5: +90, a new one
    assert plog.max_timestamp() == (1, T0 + 90)
    plog.delete_records(2)
    assert plog.max_timestamp() == (1, T0 + 90)  # not the later duplicate at 2
    plog.delete_records(4)  # segment 0 goes: the next segment's first record at +90
    assert plog.max_timestamp() == (5, T0 + 90)
    plog.delete_records(5)
    assert plog.max_timestamp() == (5, T0 + 90)
    # A LogAppendTime batch: every record carries its timestamp, the first one answers.
    plog.append(batch([b"a", b"b"], timestamp=T0), now_ms=T0 + 500, timestamp_type_log_append=True)
    assert plog.max_timestamp() == (6, T0 + 500)
    plog.delete_records(7)
    assert plog.max_timestamp() == (6, T0 + 500)


def test_max_timestamp_of_records_without_timestamps(make_log: LogFactory) -> None:
    plog = make_log()
    plog.append(batch([b"a", b"b"], timestamp=-1, step_ms=0), now_ms=T0)
    assert plog.max_timestamp() == (0, -1)  # as Kafka: no segment has more than -1, its first record answers


# --- deleting --------------------------------------------------------------------------------------------------


def test_delete_records_moves_the_log_start(make_log: LogFactory) -> None:
    plog = make_log()
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.append(batch([b"c", b"d"]), now_ms=T0)
    plog.delete_records(1)
    assert (plog.log_start_offset, plog.high_watermark, plog.log_end_offset) == (1, 4, 4)
    with pytest.raises(OffsetOutOfRange):
        plog.read(0, EVERYTHING)
    # A read at the log start gets the whole batch holding it (the consumer skips offset 0).
    assert values_of(plog.read(1, EVERYTHING).read_bytes())[:2] == [(0, b"a"), (1, b"b")]
    plog.delete_records(1)  # not forward: nothing changes
    plog.delete_records(4)  # everything
    assert (plog.log_start_offset, plog.log_end_offset) == (4, 4)
    assert plog.read(4, EVERYTHING).size == 0
    result = plog.append(batch([b"e"]), now_ms=T0)
    assert (result.base_offset, result.log_start_offset) == (4, 4)
    assert values_of(plog.read(4, EVERYTHING).read_bytes()) == [(4, b"e")]


def test_delete_records_to_the_log_end_keeps_the_active_segment_until_it_rolls(make_log: LogFactory) -> None:
    """As Kafka: a segment is deleted for lying below the log start only once it has a next one, so the records
    of the active segment still answer MAX_TIMESTAMP; after a roll, the next retention check deletes it."""
    plog = make_log(segment_bytes=300)
    plog.append(batch([b"a", b"b"], timestamp=T0 + 20, step_ms=-10), now_ms=T0)  # 0 at +20, 1 at +10
    plog.delete_records(2)
    assert (plog.log_start_offset, plog.log_end_offset, plog.read(2, EVERYTHING).size) == (2, 2, 0)
    assert plog.max_timestamp() == (0, T0 + 20)
    assert plog.apply_retention(T0) == []
    plog.append(batch([b"c"], timestamp=T0), now_ms=T0)  # 2, same segment
    assert consume_all(plog, 2) == [(2, b"c")]
    plog.delete_records(3)
    plog.append(batch([b"d" * 200], timestamp=T0), now_ms=T0)  # 3 rolls a new segment
    assert plog.max_timestamp() == (0, T0 + 20)
    assert [segment.base_offset for segment in plog.apply_retention(T0)] == [0]
    assert plog.max_timestamp() == (3, T0)
    assert consume_all(plog, 3) == [(3, b"d" * 200)]


def test_retention_by_bytes_deletes_whole_sealed_segments(make_log: LogFactory) -> None:
    plog = make_log(segment_bytes=500, retention_bytes=1000)
    for i in range(20):
        plog.append(batch([b"x" * 100, str(i % 10).encode()]), now_ms=T0)
    size = len(batch([b"x" * 100, b"0"]))
    per_segment = 500 // size
    segments = -(-20 // per_segment)
    total = 20 * size
    # Whole sealed segments go while what remains stays at or above retention.bytes.
    droppable = 0
    while droppable < segments - 1 and total - (droppable + 1) * per_segment * size >= 1000:
        droppable += 1
    deleted = plog.apply_retention(T0)
    assert len(deleted) == droppable > 0
    assert plog.log_start_offset == 2 * per_segment * droppable
    assert plog.size_bytes == total - droppable * per_segment * size
    assert consume_all(plog, plog.log_start_offset)[0][0] == plog.log_start_offset
    assert plog.apply_retention(T0) == []  # nothing more to delete


def test_retention_by_time_deletes_everything_old_and_appends_continue(make_log: LogFactory) -> None:
    plog = make_log(retention_ms=1000, segment_bytes=500)
    for _ in range(6):
        plog.append(batch([b"x" * 100], timestamp=T0), now_ms=T0)
    assert plog.apply_retention(T0 + 1000) == []  # exactly retention.ms old: kept
    assert len(plog.apply_retention(T0 + 1001)) == 3  # two batches a segment
    assert (plog.log_start_offset, plog.log_end_offset, plog.size_bytes) == (6, 6, 0)
    assert plog.append(batch([b"y"]), now_ms=T0 + 2000).base_offset == 6
    assert values_of(plog.read(6, EVERYTHING).read_bytes()) == [(6, b"y")]


def test_retention_by_time_ages_records_without_timestamps_by_when_they_were_written(make_log: LogFactory) -> None:
    """Records with timestamp -1 (NO_TIMESTAMP, which CreateTime accepts): Kafka ages their segment by its file's
    modification time (LogSegment.largestTimestamp). kbroker took -1 for the age and deleted them at once."""
    plog = make_log(retention_ms=60_000, segment_bytes=500)
    for _ in range(4):
        plog.append(batch([b"x" * 100, b"y"], timestamp=-1, step_ms=0), now_ms=T0)
    written = int(time.time() * 1000)
    assert plog.apply_retention(written) == []
    assert (plog.log_start_offset, plog.log_end_offset) == (0, 8)
    assert plog.apply_retention(written + 30_000) == []
    assert len(plog.apply_retention(written + 120_000)) == 2  # a minute after the last write: gone
    assert (plog.log_start_offset, plog.log_end_offset) == (8, 8)


def test_retention_respects_cleanup_policy_compact(make_log: LogFactory) -> None:
    plog = make_log(retention_ms=0, cleanup_policy="compact", segment_bytes=200)
    for _ in range(4):
        plog.append(batch([b"x" * 100]), now_ms=T0)
    assert plog.apply_retention(T0 + 10_000) == []
    assert plog.log_start_offset == 0


# --- partition state: high watermark, stable offset, events -----------------------------------------------------


def test_high_watermark_and_stable_offset_follow_appends_on_a_single_node(make_log: LogFactory) -> None:
    plog = make_log()
    assert (plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (0, 0, 0)
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    assert (plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (2, 2, 2)
    # Never beyond the log end, never backwards.
    assert plog.update_high_watermark(10) is False
    assert plog.update_high_watermark(1) is False
    assert (plog.high_watermark, plog.last_stable_offset) == (2, 2)


def test_a_replicated_high_watermark_moves_only_when_told(make_log: LogFactory) -> None:
    plog = make_log()
    seen: list[tuple[PartitionEvent, int, int]] = []
    plog.subscribe(lambda event: seen.append((event, plog.high_watermark, plog.last_stable_offset)))
    plog.high_watermark_follows_appends = False  # as replication will: followers must have it first
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.append(batch([b"c", b"d"]), now_ms=T0)
    assert (plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (4, 0, 0)
    assert seen == [(PartitionEvent.APPENDED, 0, 0), (PartitionEvent.APPENDED, 0, 0)]
    # A fetch bounded by the high watermark sees nothing yet, then up to where it moved.
    assert plog.read(0, EVERYTHING, max_offset=plog.high_watermark).size == 0
    assert plog.update_high_watermark(2) is True
    assert (plog.high_watermark, plog.last_stable_offset) == (2, 2)
    assert seen[-1] == (PartitionEvent.HIGH_WATERMARK | PartitionEvent.STABLE_OFFSET, 2, 2)
    assert values_of(plog.read(0, EVERYTHING, max_offset=plog.high_watermark).read_bytes()) == [(0, b"a"), (1, b"b")]
    assert plog.update_high_watermark(1) is False  # never backwards
    assert plog.update_high_watermark(99) is True  # clamped to the log end
    assert (plog.high_watermark, len(seen)) == (4, 4)
    assert plog.update_high_watermark(99) is False
    assert len(seen) == 4


def test_events_fire_once_per_append_with_their_flags(make_log: LogFactory) -> None:
    plog = make_log()
    seen: list[tuple[PartitionEvent, int, int]] = []
    unsubscribe = plog.subscribe(lambda event: seen.append((event, plog.log_end_offset, plog.high_watermark)))
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    # Listeners run after the state changed, with every flag of the change at once.
    assert seen == [(APPEND_EVENT, 2, 2)]
    plog.append(batch([b"c"], producer_id=1, epoch=0, sequence=0), now_ms=T0)
    plog.append(batch([b"c"], producer_id=1, epoch=0, sequence=0), now_ms=T0)  # duplicate: nothing written
    plog.append(batch([b"d"]), now_ms=T0)
    plog.append(bytearray(b"\x00" * 10), now_ms=T0)  # refused: nothing written
    assert seen == [(APPEND_EVENT, 2, 2), (APPEND_EVENT, 3, 3), (APPEND_EVENT, 4, 4)]
    # Retention and DeleteRecords do not fire (nobody waits for offsets to go down).
    plog.delete_records(1)
    assert len(seen) == 3
    unsubscribe()
    unsubscribe()  # idempotent
    plog.append(batch([b"e"]), now_ms=T0)
    assert len(seen) == 3


def test_a_raising_listener_does_not_stop_the_others(make_log: LogFactory, caplog: pytest.LogCaptureFixture) -> None:
    plog = make_log()
    calls: list[str] = []

    def broken(event: PartitionEvent) -> None:
        calls.append("broken")
        raise RuntimeError("listener bug")

    plog.subscribe(broken)
    plog.subscribe(lambda event: calls.append("second"))
    result = plog.append(batch([b"a"]), now_ms=T0)
    assert result.error_code == ErrorCode.NONE and result.base_offset == 0
    assert calls == ["broken", "second"]
    assert "listener bug" in caplog.text


# --- truncation --------------------------------------------------------------------------------------------------


def test_truncate_to_removes_whole_batches_and_appends_continue(make_log: LogFactory) -> None:
    plog = make_log()
    for i in range(3):  # offsets 0-1, 2-3, 4-5
        plog.append(batch([b"a%d" % i, b"b%d" % i]), now_ms=T0)
    seen: list[PartitionEvent] = []
    plog.subscribe(seen.append)
    plog.truncate_to(100)  # at or past the log end: nothing happens
    assert plog.log_end_offset == 6
    plog.truncate_to(3)  # inside the second batch: it goes whole
    assert (plog.log_end_offset, plog.high_watermark, plog.last_stable_offset) == (2, 2, 2)
    assert seen == []  # truncation does not fire
    assert values_of(plog.read(0, EVERYTHING).read_bytes()) == [(0, b"a0"), (1, b"b0")]
    with pytest.raises(OffsetOutOfRange):
        plog.read(3, EVERYTHING)
    assert plog.append(batch([b"c"]), now_ms=T0).base_offset == 2
    assert values_of(plog.read(0, EVERYTHING).read_bytes()) == [(0, b"a0"), (1, b"b0"), (2, b"c")]
    plog.truncate_to(0)
    assert (plog.log_end_offset, plog.high_watermark, plog.size_bytes) == (0, 0, 0)
    assert plog.append(batch([b"d"]), now_ms=T0).base_offset == 0


def test_truncate_to_across_segments(make_log: LogFactory) -> None:
    plog = make_log(segment_bytes=300)
    for i in range(10):
        plog.append(batch([b"x" * 100, str(i).encode()]), now_ms=T0)
    plog.truncate_to(5)  # the batch 4-5 straddles offset 5
    assert (plog.log_end_offset, plog.high_watermark) == (4, 4)
    assert consume_all(plog, 0) == [(0, b"x" * 100), (1, b"0"), (2, b"x" * 100), (3, b"1")]
    assert plog.append(batch([b"y"]), now_ms=T0).base_offset == 4
    assert consume_all(plog, 3) == [(3, b"1"), (4, b"y")]
    assert plog.max_timestamp() == (1, T0 + 1)  # what was cut off no longer counts


def test_truncate_to_a_segment_boundary(make_log: LogFactory) -> None:
    plog = make_log(segment_bytes=300)  # one two-record batch a segment
    for i in range(4):
        plog.append(batch([b"x" * 100, str(i).encode()]), now_ms=T0)
    plog.truncate_to(4)  # the first offset of the third segment
    assert (plog.log_end_offset, plog.high_watermark) == (4, 4)
    assert plog.append(batch([b"y"]), now_ms=T0).base_offset == 4
    assert plog.read(0, EVERYTHING).last_offset == 1  # still one segment a read
    assert consume_all(plog, 0) == [(0, b"x" * 100), (1, b"0"), (2, b"x" * 100), (3, b"1"), (4, b"y")]


def test_truncate_to_below_the_log_start_is_refused(make_log: LogFactory) -> None:
    plog = make_log()
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.append(batch([b"c", b"d"]), now_ms=T0)
    plog.delete_records(2)
    with pytest.raises(KafkaError) as raised:
        plog.truncate_to(1)
    assert raised.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert (plog.log_start_offset, plog.log_end_offset) == (2, 4)


def test_truncate_to_rebuilds_the_producer_state(make_log: LogFactory) -> None:
    plog = make_log()
    for sequence in (0, 2, 4):  # offsets 0-1, 2-3, 4-5
        plog.append(batch([b"a", b"b"], producer_id=5, epoch=0, sequence=sequence), now_ms=T0)
    plog.truncate_to(2)
    # Sequence 2 was cut off with its batch: it is new again, not a duplicate of the batch at offset 2.
    again = plog.append(batch([b"c", b"d"], producer_id=5, epoch=0, sequence=2), now_ms=T0)
    assert (again.error_code, again.base_offset, plog.log_end_offset) == (ErrorCode.NONE, 2, 4)
    duplicate = plog.append(batch([b"a", b"b"], producer_id=5, epoch=0, sequence=0), now_ms=T0)
    assert (duplicate.base_offset, plog.log_end_offset) == (0, 4)
    too_far = plog.append(batch([b"e"], producer_id=5, epoch=0, sequence=6), now_ms=T0)
    assert too_far.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


# --- leader epochs --------------------------------------------------------------------------------------------


def test_leader_epochs_stamp_batches_and_answer_end_offsets(make_log: LogFactory) -> None:
    plog = make_log()
    assert plog.leader_epoch == 0
    # Nothing written: as Kafka's cache once a leader took over an empty log, the current epoch ends at 0.
    assert plog.end_offset_for_epoch(0) == (0, 0)
    assert plog.end_offset_for_epoch(1) == (-1, -1)
    plog.append(batch([b"a", b"b"]), now_ms=T0)  # epoch 0 from offset 0
    plog.assign_leader_epoch(3)  # epoch 3 from offset 2
    plog.append(batch([b"c"]), now_ms=T0)
    plog.assign_leader_epoch(5)  # epoch 5 from offset 3
    plog.append(batch([b"d", b"e"]), now_ms=T0)
    assert plog.leader_epoch == 5
    epochs = [h.partition_leader_epoch for h in headers_of(plog.read(0, EVERYTHING).read_bytes())]
    assert epochs == [0, 3, 5]
    assert plog.end_offset_for_epoch(0) == (0, 2)
    assert plog.end_offset_for_epoch(1) == (0, 2)  # the largest known epoch at or below 1 is 0
    assert plog.end_offset_for_epoch(3) == (3, 3)
    assert plog.end_offset_for_epoch(4) == (3, 3)
    assert plog.end_offset_for_epoch(5) == (5, 5)  # the current epoch ends at the log end
    assert plog.end_offset_for_epoch(6) == (-1, -1)
    assert plog.end_offset_for_epoch(-1) == (-1, -1)
    for stale in (5, 4, 0):
        with pytest.raises(KafkaError) as raised:
            plog.assign_leader_epoch(stale)
        assert raised.value.code == ErrorCode.FENCED_LEADER_EPOCH
    assert plog.leader_epoch == 5


def test_epoch_below_the_first_known_one(make_log: LogFactory) -> None:
    plog = make_log()
    plog.assign_leader_epoch(2)
    plog.append(batch([b"a"]), now_ms=T0)
    plog.assign_leader_epoch(4)
    plog.append(batch([b"b"]), now_ms=T0)
    # Kafka's answer for an epoch older than the cache: that epoch, ending where the first known one starts.
    assert plog.end_offset_for_epoch(1) == (1, 0)
    assert plog.end_offset_for_epoch(2) == (2, 1)
    assert plog.end_offset_for_epoch(4) == (4, 2)


def test_a_moved_log_start_moves_the_epochs_and_the_high_watermark(make_log: LogFactory) -> None:
    plog = make_log()
    plog.append(batch([b"a", b"b"]), now_ms=T0)  # epoch 0: 0-1
    plog.assign_leader_epoch(1)
    plog.append(batch([b"c", b"d"]), now_ms=T0)  # epoch 1: 2-3
    plog.assign_leader_epoch(2)
    plog.append(batch([b"e", b"f"]), now_ms=T0)  # epoch 2: 4-5
    plog.delete_records(3)  # as Kafka's truncateFromStart: epoch 0 goes, epoch 1 now starts at 3
    assert plog.end_offset_for_epoch(0) == (0, 3)  # below the first entry: where the log now starts
    assert plog.end_offset_for_epoch(1) == (1, 4)
    assert plog.end_offset_for_epoch(2) == (2, 6)
    plog.delete_records(4)  # an entry starts exactly there: epoch 1 goes, epoch 2 stays
    assert plog.end_offset_for_epoch(1) == (1, 4)
    assert plog.end_offset_for_epoch(2) == (2, 6)
    # A log start moved past a high watermark replication has not advanced yet takes it along, as in Kafka.
    plog.high_watermark_follows_appends = False
    plog.append(batch([b"g", b"h"]), now_ms=T0)
    assert (plog.high_watermark, plog.log_end_offset) == (6, 8)
    plog.delete_records(7)
    assert (plog.log_start_offset, plog.high_watermark, plog.last_stable_offset) == (7, 7, 7)


def test_truncation_forgets_epochs_that_started_after_the_cut(make_log: LogFactory) -> None:
    plog = make_log()
    plog.append(batch([b"a", b"b"]), now_ms=T0)  # epoch 0: 0-1
    plog.assign_leader_epoch(1)
    plog.append(batch([b"c", b"d"]), now_ms=T0)  # epoch 1: 2-3
    plog.truncate_to(2)
    assert plog.end_offset_for_epoch(0) == (0, 2)  # epoch 0 is the latest known again: it ends at the log end
    assert plog.end_offset_for_epoch(1) == (-1, -1)
    assert plog.leader_epoch == 1
    plog.append(batch([b"e"]), now_ms=T0)  # the current epoch starts again at its first batch
    assert plog.end_offset_for_epoch(0) == (0, 2)
    assert plog.end_offset_for_epoch(1) == (1, 3)
    assert headers_of(plog.read(2, EVERYTHING).read_bytes())[0].partition_leader_epoch == 1


# --- segment swaps ---------------------------------------------------------------------------------------------


def test_a_segment_swap_replaces_sealed_segments_and_reads_follow_it(make_log: LogFactory) -> None:
    """The log cleaner's way in, over either backend: replacements holding a subset of the offsets take the
    place of sealed segments, a second pending replacement is refused, and reads see the new segments."""
    size = len(batch([b"v0", b"w0"]))
    plog = make_log(segment_bytes=3 * size)
    for i in range(10):
        plog.append(batch([f"v{i}".encode(), f"w{i}".encode()]), now_ms=T0)
    assert [s.base_offset for s in plog.segments] == [0, 6, 12, 18]
    replaced = plog.segments[0:2]
    replacement = plog.new_cleaned_segment(0)
    for segment in replaced:
        for scanned in segment.scan():
            if scanned.header.base_offset % 4 == 0:  # keep the batches at offsets 0, 4 and 8
                replacement.append(segment.read(scanned.position, scanned.header.size), scanned.header)
    stray = plog.new_cleaned_segment(12)
    stray.append(*next((plog.segments[2].read(s.position, s.header.size), s.header) for s in plog.segments[2].scan()))
    with pytest.raises(ValueError, match="other cleaned segments are pending"):
        plog.swap_segments(replaced, [replacement])
    stray.delete()
    plog.swap_segments(replaced, [replacement])
    assert [(s.base_offset, s.next_offset, s.suffix) for s in plog.segments] == [
        (0, 10, ""),
        (12, 18, ""),
        (18, 20, ""),
    ]
    kept = [(0, b"v0"), (1, b"w0"), (4, b"v2"), (5, b"w2"), (8, b"v4"), (9, b"w4")]
    later = [(2 * i + j, f"{'vw'[j]}{i}".encode()) for i in range(6, 10) for j in range(2)]
    assert consume_all(plog, 0) == kept + later
    assert consume_all(plog, 2) == kept[2:] + later  # an offset the swap removed reads from the next one kept
    assert plog.read(6, EVERYTHING).last_offset == 9  # offsets 6..11 now live in the replacement
