"""The partition log: appends, reads, segment rolls, indexes, recovery, retention and producer state."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbroker.storage import LogConfig, OffsetOutOfRange, PartitionLog
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch, decode_records, iter_batches

T0 = 1_700_000_000_000


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


def open_log(path: Path, clean: bool = True, **config: int | str) -> PartitionLog:
    return PartitionLog("t", 0, path, LogConfig(**config), clean=clean)  # type: ignore[arg-type]


def test_append_assigns_consecutive_offsets_and_reads_back(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    assert plog.append(batch([b"a", b"b", b"c"]), now_ms=T0).base_offset == 0
    assert plog.append(batch([b"d"]), now_ms=T0).base_offset == 3
    assert plog.high_watermark == 4 and plog.log_start_offset == 0
    chunk = plog.read(0, 1 << 20)
    assert values_of(chunk.read_bytes()) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    assert chunk.last_offset == 3
    # An offset inside a batch returns that whole batch.
    assert values_of(plog.read(1, 1 << 20).read_bytes())[0] == (0, b"a")
    assert plog.read(4, 1 << 20).read_bytes() == b""
    with pytest.raises(OffsetOutOfRange):
        plog.read(5, 1 << 20)


def test_read_limits_whole_batches_and_min_one_batch(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    for i in range(5):
        plog.append(batch([bytes([65 + i]) * 100]), now_ms=T0)
    one = len(plog.read(0, 1 << 20).read_bytes()) // 5
    # max_bytes of 2.5 batches gives two whole batches, never a torn one.
    assert values_of(plog.read(0, one * 2 + one // 2).read_bytes()) == [(0, b"A" * 100), (1, b"B" * 100)]
    # Smaller than one batch: the first batch anyway (KIP-74), unless min_one_batch is off.
    assert len(plog.read(0, 10).read_bytes()) == one
    assert plog.read(0, 10, min_one_batch=False).read_bytes() == b""
    # max_offset (the last stable offset or high watermark) bounds the read.
    assert [o for o, _ in values_of(plog.read(0, 1 << 20, max_offset=3).read_bytes())] == [0, 1, 2]


def test_segments_roll_by_size_and_reads_cross_them(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_bytes=500, index_interval_bytes=1)
    for i in range(20):
        plog.append(batch([b"x" * 100, str(i).encode()]), now_ms=T0)
    assert len(plog.segments) > 5
    names = sorted(p.name for p in tmp_path.glob("*.log"))
    assert names[0] == "00000000000000000000.log" and len(names) == len(plog.segments)
    assert all(s.size <= 500 for s in plog.segments)
    collected: list[tuple[int, bytes | None]] = []
    offset = 0
    while offset < plog.high_watermark:
        chunk = plog.read(offset, 1 << 20)
        collected.extend(values_of(chunk.read_bytes()))
        offset = chunk.last_offset + 1
    assert [o for o, _ in collected] == list(range(40))
    assert collected[-1] == (39, b"19")
    # Sealed segments have their index files.
    assert (tmp_path / "00000000000000000000.index").stat().st_size > 0
    assert (tmp_path / "00000000000000000000.timeindex").stat().st_size > 0


def test_segment_rolls_by_time(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_ms=1000)
    plog.append(batch([b"a"]), now_ms=T0)
    plog.segments[0].created_ms = T0
    plog.append(batch([b"b"]), now_ms=T0 + 500)
    assert len(plog.segments) == 1
    plog.append(batch([b"c"]), now_ms=T0 + 1000)
    assert [s.base_offset for s in plog.segments] == [0, 2]


def test_clean_reopen_keeps_everything(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_bytes=400, index_interval_bytes=1)
    for i in range(10):
        plog.append(batch([str(i).encode() * 50], timestamp=T0 + i * 1000), now_ms=T0)
    plog.close()
    again = open_log(tmp_path, segment_bytes=400, index_interval_bytes=1)
    assert again.high_watermark == 10
    assert [v for _, v in values_of(again.read(7, 1 << 20).read_bytes())][0] == b"7" * 50
    assert again.offset_for_timestamp(T0 + 4500) == (5, T0 + 5000)
    assert again.append(batch([b"next"]), now_ms=T0).base_offset == 10


def test_torn_tail_is_truncated_on_unclean_start(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch([b"one"]), now_ms=T0)
    plog.append(batch([b"two"]), now_ms=T0)
    good_size = plog.active.size
    plog.append(batch([b"three"]), now_ms=T0)
    plog.flush()
    log_file = tmp_path / "00000000000000000000.log"
    # A crash in the middle of writing the third batch.
    with open(log_file, "r+b") as f:
        f.truncate(good_size + 30)
    recovered = open_log(tmp_path, clean=False)
    assert recovered.high_watermark == 2
    assert log_file.stat().st_size == good_size
    assert recovered.append(batch([b"three again"]), now_ms=T0).base_offset == 2
    assert values_of(recovered.read(0, 1 << 20).read_bytes())[-1] == (2, b"three again")


def test_bad_crc_in_the_tail_is_truncated(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch([b"one"]), now_ms=T0)
    first_size = plog.active.size
    plog.append(batch([b"two"]), now_ms=T0)
    plog.flush()
    log_file = tmp_path / "00000000000000000000.log"
    data = bytearray(log_file.read_bytes())
    data[-1] ^= 0xFF  # flip a bit in the second batch's last record
    log_file.write_bytes(bytes(data))
    recovered = open_log(tmp_path, clean=False)
    assert recovered.high_watermark == 1
    assert log_file.stat().st_size == first_size


def test_missing_index_files_are_rebuilt(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_bytes=300, index_interval_bytes=1)
    for i in range(8):
        plog.append(batch([str(i).encode() * 40], timestamp=T0 + i), now_ms=T0)
    plog.close()
    for index in tmp_path.glob("*index"):
        index.write_bytes(b"\x00\x01\x02")  # not a whole number of entries: rebuilt from the log
    again = open_log(tmp_path, segment_bytes=300, index_interval_bytes=1)
    assert again.high_watermark == 8
    assert values_of(again.read(5, 1 << 20).read_bytes())[0] == (5, b"5" * 40)
    assert again.offset_for_timestamp(T0 + 6) == (6, T0 + 6)


def test_offset_for_timestamp_finds_the_record_inside_a_batch(tmp_path: Path) -> None:
    plog = open_log(tmp_path, index_interval_bytes=1)
    plog.append(batch([b"a", b"b", b"c"], timestamp=T0, step_ms=100), now_ms=T0)  # T0, +100, +200
    plog.append(batch([b"d", b"e"], timestamp=T0 + 1000, step_ms=100), now_ms=T0)
    assert plog.offset_for_timestamp(T0) == (0, T0)
    assert plog.offset_for_timestamp(T0 + 150) == (2, T0 + 200)
    assert plog.offset_for_timestamp(T0 + 201) == (3, T0 + 1000)
    assert plog.offset_for_timestamp(T0 + 1100) == (4, T0 + 1100)
    assert plog.offset_for_timestamp(T0 + 1101) is None
    assert plog.max_timestamp() == (4, T0 + 1100)


def test_log_append_time_stamps_the_batch(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    result = plog.append(batch([b"a", b"b"], timestamp=5), now_ms=T0, timestamp_type_log_append=True)
    assert result.log_append_time_ms == T0
    header, view = next(iter_batches(plog.read(0, 1 << 20).read_bytes(), strict=True))
    assert header.is_log_append_time and header.max_timestamp == T0
    assert plog.offset_for_timestamp(T0) == (0, T0)


def test_retention_by_time_deletes_old_segments_and_moves_log_start(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_bytes=200, retention_ms=10_000)
    for i in range(6):
        plog.append(batch([b"v" * 60], timestamp=T0 + i * 5_000), now_ms=T0)
    bases = [s.base_offset for s in plog.segments]
    assert bases == [0, 1, 2, 3, 4, 5]
    deleted = plog.apply_retention(T0 + 5 * 5_000)  # kept: now - max timestamp <= retention.ms
    assert [s.base_offset for s in deleted] == [0, 1, 2]
    assert plog.log_start_offset == 3
    assert not (tmp_path / "00000000000000000000.log").exists()
    with pytest.raises(OffsetOutOfRange):
        plog.read(2, 1 << 20)
    assert values_of(plog.read(3, 1 << 20).read_bytes())[0][0] == 3
    # The log start offset survives a restart.
    plog.close()
    assert open_log(tmp_path, segment_bytes=200).log_start_offset == 3


def test_retention_by_time_can_empty_the_log_but_keeps_offsets(tmp_path: Path) -> None:
    plog = open_log(tmp_path, retention_ms=1000)
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    plog.apply_retention(T0 + 10_000)
    assert plog.log_start_offset == 2 and plog.high_watermark == 2
    assert plog.append(batch([b"c"]), now_ms=T0).base_offset == 2


def test_retention_by_size_keeps_the_newest_segments(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_bytes=200, retention_bytes=300)
    for _ in range(6):
        plog.append(batch([b"v" * 60]), now_ms=T0)
    size = plog.segments[0].size
    plog.apply_retention(T0)
    assert plog.size_bytes <= 300 + size
    assert plog.size_bytes - plog.segments[0].size < 300
    assert plog.log_start_offset == plog.segments[0].base_offset > 0


def test_delete_records_moves_log_start_offset(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_bytes=200)
    for _ in range(5):
        plog.append(batch([b"v" * 60]), now_ms=T0)
    plog.delete_records(3)
    assert plog.log_start_offset == 3
    assert plog.segments[0].base_offset == 3
    with pytest.raises(OffsetOutOfRange):
        plog.read(2, 100)


def test_idempotent_producer_duplicates_and_sequence_errors(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    pid = 1000
    assert plog.append(batch([b"a", b"b"], producer_id=pid, epoch=0, sequence=0), now_ms=T0).base_offset == 0
    assert plog.append(batch([b"c"], producer_id=pid, epoch=0, sequence=2), now_ms=T0).base_offset == 2
    # A retry of the first batch: acknowledged with its original offset and not written again.
    retry = plog.append(batch([b"a", b"b"], producer_id=pid, epoch=0, sequence=0), now_ms=T0)
    assert retry.error_code == ErrorCode.NONE and retry.base_offset == 0
    assert plog.high_watermark == 3
    gap = plog.append(batch([b"e"], producer_id=pid, epoch=0, sequence=5), now_ms=T0)
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    # A bumped epoch starts again at 0; the old epoch is then fenced.
    assert plog.append(batch([b"f"], producer_id=pid, epoch=1, sequence=0), now_ms=T0).base_offset == 3
    fenced = plog.append(batch([b"g"], producer_id=pid, epoch=0, sequence=3), now_ms=T0)
    assert fenced.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    bad_start = plog.append(batch([b"h"], producer_id=pid, epoch=2, sequence=7), now_ms=T0)
    assert bad_start.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    # An unknown producer may start at any sequence (its state may have expired).
    assert plog.append(batch([b"i"], producer_id=2000, epoch=0, sequence=42), now_ms=T0).error_code == ErrorCode.NONE


@pytest.mark.parametrize("clean", [True, False])
def test_producer_state_survives_restart(tmp_path: Path, clean: bool) -> None:
    plog = open_log(tmp_path, segment_bytes=300)
    for seq in range(6):
        plog.append(batch([b"v" * 50], producer_id=7, epoch=3, sequence=seq), now_ms=T0)
    if clean:
        plog.close()
    else:
        plog.flush()
    again = open_log(tmp_path, clean=clean, segment_bytes=300)
    retry = again.append(batch([b"v" * 50], producer_id=7, epoch=3, sequence=5), now_ms=T0)
    assert retry.base_offset == 5 and again.high_watermark == 6
    assert again.append(batch([b"w"], producer_id=7, epoch=3, sequence=9), now_ms=T0).error_code == (
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    assert again.append(batch([b"w"], producer_id=7, epoch=2, sequence=0), now_ms=T0).error_code == (
        ErrorCode.INVALID_PRODUCER_EPOCH
    )
    assert again.append(batch([b"w"], producer_id=7, epoch=3, sequence=6), now_ms=T0).base_offset == 6


def test_flush_messages_marks_the_log_for_fsync(tmp_path: Path) -> None:
    plog = open_log(tmp_path, flush_messages=3)
    plog.append(batch([b"a", b"b"]), now_ms=T0)
    assert not plog.needs_flush
    plog.append(batch([b"c"]), now_ms=T0)
    assert plog.needs_flush
    plog.flush()
    assert not plog.needs_flush and not plog.active.dirty


def test_timestamp_bounds_are_enforced(tmp_path: Path) -> None:
    plog = open_log(tmp_path, timestamp_before_max_ms=1000, timestamp_after_max_ms=1000)
    assert plog.append(batch([b"old"], timestamp=T0 - 5000), now_ms=T0).error_code == ErrorCode.INVALID_TIMESTAMP
    assert plog.append(batch([b"new"], timestamp=T0 + 5000), now_ms=T0).error_code == ErrorCode.INVALID_TIMESTAMP
    assert plog.append(batch([b"ok"], timestamp=T0), now_ms=T0).error_code == ErrorCode.NONE


def test_two_batches_in_one_append_are_refused(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    result = plog.append(batch([b"a"]) + batch([b"b"]), now_ms=T0)
    assert result.error_code == ErrorCode.INVALID_RECORD and plog.high_watermark == 0


@pytest.mark.parametrize("index_interval_bytes", [1, 150, 4096])
def test_read_cuts_at_the_last_whole_batch_under_the_limit_whatever_the_index(
    tmp_path: Path, index_interval_bytes: int
) -> None:
    # Batches of different sizes; every limit must end the read exactly after the last batch that fits.
    plog = open_log(tmp_path, index_interval_bytes=index_interval_bytes)
    sizes = []
    for i in range(30):
        values = [bytes([65 + i % 26]) * (10 + 37 * (i % 7))] * (1 + i % 3)
        plog.append(batch(values), now_ms=T0)
        sizes.append(len(batch(values)))
    ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    everything = plog.read(0, 1 << 20).read_bytes()
    for limit in range(sizes[0], ends[-1] + 1, 13):
        chunk = plog.read(0, limit)
        expected_end = max(e for e in ends if e <= limit)
        assert chunk.size == expected_end
        assert chunk.read_bytes() == everything[:expected_end]
        last = max(h.last_offset for h, _ in iter_batches(everything[:expected_end]))
        assert chunk.last_offset >= last  # an upper bound of the offsets it holds (used for aborted transactions)
        assert chunk.last_offset < plog.log_end_offset


def test_a_read_region_stays_readable_after_its_segment_is_deleted(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_bytes=300, retention_bytes=1)
    for i in range(6):
        plog.append(batch([bytes([97 + i]) * 100]), now_ms=T0)
    chunk = plog.read(0, 1 << 20)
    expected = chunk.read_bytes()
    region = chunk.region()
    assert len(region) == len(expected) > 0
    assert plog.apply_retention(T0)
    assert plog.log_start_offset > 0 and not any(tmp_path.glob("00000000000000000000.*"))
    assert bytes(region) == expected  # its own descriptor outlives the deleted file
    region.close()
