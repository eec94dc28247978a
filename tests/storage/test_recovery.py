"""Recovery after an unclean stop: only the end of the log is cut, its bytes kept aside; a corrupt batch with valid
batches after it is kept in place, reported, and answers CORRUPT_MESSAGE while the rest is served (issue #26)."""

from __future__ import annotations

import logging
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.durable import fs
from kbroker.durable.fs import FaultyFileSystem, SimulatedCrash
from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.backend import LOG_START_OFFSET_FILE
from kbroker.storage.cleaner import CleanerSettings, PartitionCleaner, cleanable_section
from protocol.errors import ErrorCode, KafkaError
from protocol.records import Record, build_batch, decode_records, iter_batches

T0 = 1_700_000_000_000
BATCH_SIZE = 72  # one record with a 4-byte value
CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=150)  # 13 batches a segment
COUNT = 39  # segments 0..12, 13..25 and the active 26..38


def batch(index: int, *, key: bytes | None = None, producer: tuple[int, int] | None = None) -> bytearray:
    pid, sequence = producer if producer is not None else (-1, -1)
    return bytearray(
        build_batch(
            [Record(key=key, value=f"r{index:03d}".encode())],
            base_timestamp=T0 + index,
            producer_id=pid,
            producer_epoch=0 if producer else -1,
            base_sequence=sequence,
        )
    )


def open_log(directory: Path, *, clean: bool, config: LogConfig = CONFIG) -> PartitionLog:
    return PartitionLog("t", 0, directory, config, clean=clean)


def crashed_log(directory: Path, count: int = COUNT, config: LogConfig = CONFIG, **kwargs: bool) -> None:
    """``count`` batches of one record, flushed, then a crash (no index files for the active segment)."""
    plog = open_log(directory, clean=True, config=config)
    for i in range(count):
        assert plog.append(batch(i, **kwargs), now_ms=T0).base_offset == i  # type: ignore[arg-type]
    plog.flush()
    plog.delete()


def segment_file(directory: Path, base: int) -> Path:
    return directory / f"{base:020d}.log"


def expected(count: int = COUNT) -> list[tuple[int, bytes]]:
    return [(i, f"r{i:03d}".encode()) for i in range(count)]


def fetch_each_offset(plog: PartitionLog) -> tuple[list[tuple[int, bytes | None]], list[int]]:
    """(offset, value) of every record, each offset fetched on its own; and the offsets that answer CORRUPT_MESSAGE."""
    found: set[tuple[int, bytes | None]] = set()
    corrupt: list[int] = []
    for offset in range(plog.log_start_offset, plog.high_watermark):
        try:
            data = plog.read(offset, 1).read_bytes()
        except KafkaError as exc:
            assert exc.code == ErrorCode.CORRUPT_MESSAGE, exc
            corrupt.append(offset)
            continue
        for header, view in iter_batches(data):
            found.update((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
    return sorted(found), corrupt


def consume(plog: PartitionLog, offset: int = 0) -> tuple[list[int], int | None]:
    """Offsets a consumer reads from ``offset`` with 1 MB fetches, and where it meets CORRUPT_MESSAGE (None: never)."""
    offsets: list[int] = []
    while offset < plog.high_watermark:
        try:
            chunk = plog.read(offset, 1 << 20)
        except KafkaError as exc:
            assert exc.code == ErrorCode.CORRUPT_MESSAGE
            return offsets, offset
        batches = list(iter_batches(chunk.read_bytes()))
        assert batches, f"nothing at {offset}"
        for header, view in batches:
            offsets.extend(header.base_offset + r.offset_delta for r in decode_records(view))
        offset = batches[-1][0].next_offset
    return offsets, None


def aside_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.corrupt"))}


def log_sizes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(directory.glob("*.log"))}


def edit(path: Path, change: Callable[[bytearray], None]) -> None:
    data = bytearray(path.read_bytes())
    change(data)
    path.write_bytes(bytes(data))


# --- the end of the log: cut, but kept aside --------------------------------------------------------------------


@pytest.mark.parametrize(("kept", "held"), [(30, "offsets from 5 on (no readable header)"), (65, "offsets 5..5")])
def test_a_torn_tail_is_kept_aside_then_cut(
    tmp_path: Path, kept: int, held: str, caplog: pytest.LogCaptureFixture
) -> None:
    crashed_log(tmp_path, 6)
    log_file = segment_file(tmp_path, 0)
    whole = log_file.read_bytes()
    torn = whole[: 5 * BATCH_SIZE + kept]  # the crash stopped the sixth batch's write part-way
    log_file.write_bytes(torn)
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        recovered = open_log(tmp_path, clean=False)
    aside = tmp_path / f"00000000000000000000.log.{5 * BATCH_SIZE}-{5 * BATCH_SIZE + kept - 1}.corrupt"
    assert aside_files(tmp_path) == {aside.name: torn[5 * BATCH_SIZE :]}  # exactly the bytes cut
    assert log_file.read_bytes() == whole[: 5 * BATCH_SIZE]
    assert f"{log_file}: truncating {kept} bytes of a torn or corrupt tail" in caplog.text
    assert f"they held {held}" in caplog.text and f"are kept in {aside}" in caplog.text
    assert fetch_each_offset(recovered) == (expected(5), [])
    assert recovered.append(batch(5), now_ms=T0).base_offset == 5
    recovered.close()
    again = open_log(tmp_path, clean=False)  # the kept file is not mistaken for part of the log
    assert fetch_each_offset(again) == (expected(6), [])
    assert aside_files(tmp_path) == {aside.name: torn[5 * BATCH_SIZE :]}


def test_bad_batches_at_the_end_of_the_log_are_kept_aside_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crashed_log(tmp_path, 6)
    log_file = segment_file(tmp_path, 0)
    original = log_file.read_bytes()

    def flip_last_two(data: bytearray) -> None:
        data[-2] ^= 0xFF
        data[-2 - BATCH_SIZE] ^= 0xFF

    edit(log_file, flip_last_two)
    damaged = log_file.read_bytes()
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        recovered = open_log(tmp_path, clean=False)
    assert list(aside_files(tmp_path).values()) == [damaged[4 * BATCH_SIZE :]]
    assert log_file.read_bytes() == original[: 4 * BATCH_SIZE]
    assert "they held offsets 4..5 by their headers" in caplog.text
    assert fetch_each_offset(recovered) == (expected(4), [])


@pytest.mark.parametrize("when", ["crash", "crash_after"])
def test_a_crash_at_any_step_of_the_recovery_loses_neither_the_log_nor_the_bytes_cut(tmp_path: Path, when: str) -> None:
    pristine = tmp_path / "pristine"
    crashed_log(pristine, 6)
    log_file = segment_file(pristine, 0)
    log_file.write_bytes(log_file.read_bytes()[: 5 * BATCH_SIZE + 40])
    torn_tail = log_file.read_bytes()[5 * BATCH_SIZE :]
    step = 0
    while True:
        step += 1
        directory = tmp_path / f"step{step}"
        shutil.copytree(pristine, directory)
        double = FaultyFileSystem(faults={step: when})  # type: ignore[dict-item]
        with fs.installed(double):
            try:
                open_log(directory, clean=False).delete()
            except SimulatedCrash:
                pass
        double.power_cut()
        # Either the segment still holds the bytes or they are kept aside (or both): the next start finishes.
        segment_bytes = segment_file(directory, 0).read_bytes()
        assert segment_bytes.endswith(torn_tail) or torn_tail in aside_files(directory).values()
        recovered = open_log(directory, clean=False)
        assert fetch_each_offset(recovered) == (expected(5), [])
        assert list(aside_files(directory).values()) == [torn_tail]
        assert not list(directory.glob("*.tmp"))
        recovered.close()
        if not double.injected:
            break  # the whole recovery ran without reaching the step
    assert step > 5


# --- a corrupt batch with valid batches after it: kept, reported, served around --------------------------------


def _flip_value(position: int) -> Callable[[bytearray], None]:
    def change(data: bytearray) -> None:
        for i in range(8):  # 8 bytes inside the record (the reproduction): only the CRC can tell
            data[position + BATCH_SIZE - 10 + i] ^= 0xFF

    return change


def _wrong_length(position: int) -> Callable[[bytearray], None]:
    def change(data: bytearray) -> None:  # still a plausible length: the next batch must be searched for
        (length,) = struct.unpack_from(">i", data, position + 8)
        struct.pack_into(">i", data, position + 8, length + 7)

    return change


def _offset_going_back(position: int) -> Callable[[bytearray], None]:
    def change(data: bytearray) -> None:  # the base offset is outside the CRC: only the order of offsets tells
        (base,) = struct.unpack_from(">q", data, position)
        struct.pack_into(">q", data, position, base - 3)

    return change


def _two_in_a_row(position: int) -> Callable[[bytearray], None]:
    def change(data: bytearray) -> None:
        _flip_value(position)(data)
        _wrong_length(position + BATCH_SIZE)(data)

    return change


DAMAGE = {
    "8 bytes flipped in a record": (_flip_value, 1, "CRC mismatch"),
    "a wrong length": (_wrong_length, 1, "CRC mismatch"),
    "a base offset going back": (_offset_going_back, 1, "offsets 17..17 do not follow offset 19"),
    "two batches in a row": (_two_in_a_row, 2, "CRC mismatch"),
}


@pytest.mark.parametrize("segment", [13, 26])  # sealed, active
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_corrupt_batch_keeps_the_batches_after_it(
    tmp_path: Path, segment: int, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    crashed_log(tmp_path)
    make, count, problem = DAMAGE[damage]
    bad = segment + 7  # offset 20 or 33, in the middle of its segment
    log_file = segment_file(tmp_path, segment)
    edit(log_file, make(7 * BATCH_SIZE))
    sizes = log_sizes(tmp_path)
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        recovered = open_log(tmp_path, clean=False)
    lost = list(range(bad, bad + count))
    problem = problem.replace("17..17", f"{bad - 3}..{bad - 3}").replace("19", str(bad - 1))
    found = (
        f"t-0: {log_file} bytes {7 * BATCH_SIZE}..{(7 + count) * BATCH_SIZE - 1} (offsets {bad}..{bad + count - 1}) "
        f"are corrupt: {problem}; kept in place"
    )
    assert found in caplog.text and f"seek to offset {bad + count}" in caplog.text
    assert "truncating" not in caplog.text and "missing" not in caplog.text
    assert log_sizes(tmp_path) == sizes and aside_files(tmp_path) == {}  # nothing cut, nothing moved
    # Every other record is served at its offset; the corrupt ones answer CORRUPT_MESSAGE.
    assert fetch_each_offset(recovered) == ([r for r in expected() if r[0] not in lost], lost)
    # A consumer reads up to the range, then gets CORRUPT_MESSAGE; seeking past it, it reads the rest.
    assert consume(recovered) == (list(range(bad)), bad)
    assert consume(recovered, bad + count) == (list(range(bad + count, COUNT)), None)
    with pytest.raises(KafkaError) as info:
        recovered.read(bad, 1 << 20)
    assert info.value.message is not None and f"the next readable offset is {bad + count}" in info.value.message
    assert recovered.offset_for_timestamp(T0 + bad) == (bad + count, T0 + bad + count)
    assert recovered.append(batch(COUNT), now_ms=T0).base_offset == COUNT
    recovered.close()
    # Remembered: a clean start (which trusts the files) still knows the range, and so does the next crash.
    for clean in (True, False):
        again = open_log(tmp_path, clean=clean)
        assert fetch_each_offset(again) == ([r for r in expected(COUNT + 1) if r[0] not in lost], lost)
        again.close()
    assert (tmp_path / f"{segment:020d}.log.corrupt-ranges").exists()


def test_a_corrupt_end_of_a_sealed_segment_stands_for_the_offsets_up_to_the_next(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crashed_log(tmp_path)
    log_file = segment_file(tmp_path, 0)
    edit(log_file, _flip_value(12 * BATCH_SIZE))  # offset 12, the sealed segment's last batch
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        recovered = open_log(tmp_path, clean=False)
    assert log_file.stat().st_size == 13 * BATCH_SIZE and aside_files(tmp_path) == {}
    assert f"{log_file} bytes {12 * BATCH_SIZE}..{13 * BATCH_SIZE - 1} (offsets 12..12) are corrupt" in caplog.text
    assert "missing" not in caplog.text
    assert fetch_each_offset(recovered) == ([r for r in expected() if r[0] != 12], [12])
    assert consume(recovered) == (list(range(12)), 12)


def test_a_segment_below_the_recovery_point_is_still_trusted_and_never_cut(tmp_path: Path) -> None:
    crashed_log(tmp_path)
    edit(segment_file(tmp_path, 0), _flip_value(5 * BATCH_SIZE))
    recovered = PartitionLog("t", 0, tmp_path, CONFIG, clean=False, recovery_point=26)
    assert not recovered.segments[0].corrupt_ranges  # not read: fsynced (Kafka's recovery does the same)
    assert log_sizes(tmp_path)["00000000000000000000.log"] == 13 * BATCH_SIZE


# --- what else meets a corrupt range ---------------------------------------------------------------------------


def test_retention_deletes_a_damaged_segment_with_its_list_of_ranges(tmp_path: Path) -> None:
    crashed_log(tmp_path)
    edit(segment_file(tmp_path, 0), _flip_value(7 * BATCH_SIZE))
    recovered = open_log(tmp_path, clean=False)
    ranges = tmp_path / "00000000000000000000.log.corrupt-ranges"
    assert ranges.exists()
    recovered.delete_records(13)  # the operator's way past it
    assert recovered.segments[0].base_offset == 13
    assert not segment_file(tmp_path, 0).exists() and not ranges.exists()
    assert consume(recovered, 13) == (list(range(13, COUNT)), None)


def test_the_cleaner_stops_before_a_damaged_segment_and_keeps_every_record(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=1000, cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
    plog = open_log(tmp_path, clean=True, config=config)
    for i in range(COUNT):  # keys k0..k5 again and again: plenty to clean
        plog.append(batch(i, key=f"k{i % 6}".encode()), now_ms=T0)
    plog.flush()
    plog.delete()
    keyed_size = len(batch(0, key=b"k0"))
    edit(segment_file(tmp_path, 13), _flip_value(3 * keyed_size))  # offset 16
    damaged = segment_file(tmp_path, 13).read_bytes()
    recovered = open_log(tmp_path, clean=False, config=config)
    before, corrupt = fetch_each_offset(recovered)
    assert corrupt == [16]
    section = cleanable_section(recovered, None, T0)
    assert section.first_uncleanable == 13
    result = PartitionCleaner(recovered, section, CleanerSettings(), T0).run()
    if result.replacements:
        recovered.swap_segments(result.replaced, result.replacements, prepared=True, aborted=result.aborted)
    after, corrupt_after = fetch_each_offset(recovered)
    assert corrupt_after == [16]
    assert [r for r in after if r[0] >= 13] == [r for r in before if r[0] >= 13]  # the damaged segment and on: as is
    assert segment_file(tmp_path, 13).read_bytes() == damaged
    assert result.replaced and all(s.base_offset < 13 for s in result.replaced)  # what came before was cleaned


def test_an_idempotent_producer_goes_on_after_a_corrupt_range(tmp_path: Path) -> None:
    plog = open_log(tmp_path, clean=True)
    for i in range(10):
        assert plog.append(batch(i, producer=(7, i)), now_ms=T0).base_offset == i
    plog.flush()
    plog.delete()
    edit(segment_file(tmp_path, 0), _flip_value(4 * BATCH_SIZE))
    recovered = open_log(tmp_path, clean=False)
    assert fetch_each_offset(recovered)[1] == [4]
    retried = recovered.append(batch(9, producer=(7, 9)), now_ms=T0)
    assert (retried.error_code, retried.base_offset) == (ErrorCode.NONE, 9)  # a duplicate, answered, not written
    assert recovered.append(batch(10, producer=(7, 10)), now_ms=T0).base_offset == 10


# --- the log start offset file ---------------------------------------------------------------------------------


def test_a_damaged_log_start_offset_file_starts_the_log_at_its_first_segment(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plog = open_log(tmp_path, clean=True)
    for i in range(20):
        plog.append(batch(i), now_ms=T0)
    plog.delete_records(15)  # segment 0..12 goes, the log starts inside 13..25
    plog.close()
    start_file = tmp_path / LOG_START_OFFSET_FILE
    edit(start_file, lambda data: data.__setitem__(-1, data[-1] ^ 0xFF))
    with caplog.at_level(logging.ERROR, logger="kbroker.storage"):
        again = open_log(tmp_path, clean=True)
    # Kafka's answer to an unreadable log-start-offset-checkpoint: the first segment's base offset; nothing lost.
    assert again.log_start_offset == 13
    assert f"damaged file {start_file}: checksum mismatch" in caplog.text
    assert "starts at its first segment's base offset 13" in caplog.text and "DeleteRecords" in caplog.text
    assert fetch_each_offset(again) == (expected(20)[13:], [])
    again.delete_records(15)  # the operator's fix: the file is rewritten
    again.close()
    assert open_log(tmp_path, clean=True).log_start_offset == 15


@pytest.mark.parametrize(("offset", "ranges_left"), [(20, []), (21, [(20, 20)]), (22, [(20, 20)])])
def test_truncating_into_a_corrupt_range_removes_it_whole(
    tmp_path: Path, offset: int, ranges_left: list[tuple[int, int]]
) -> None:
    crashed_log(tmp_path)
    edit(segment_file(tmp_path, 13), _flip_value(7 * BATCH_SIZE))  # offset 20
    recovered = open_log(tmp_path, clean=False)
    recovered.truncate_to(offset)  # a follower dropping what its leader does not have
    end = offset if ranges_left else 20
    assert recovered.log_end_offset == end
    assert [(r.first_offset, r.last_offset) for r in recovered.active.corrupt_ranges] == ranges_left
    assert (tmp_path / "00000000000000000013.log.corrupt-ranges").exists() == bool(ranges_left)
    assert recovered.append(batch(end), now_ms=T0).base_offset == end
    lost = [20] if ranges_left else []
    assert fetch_each_offset(recovered) == ([r for r in expected(end + 1) if r[0] not in lost], lost)


def test_a_full_disk_while_keeping_a_torn_tail_aside_cuts_nothing(tmp_path: Path) -> None:
    crashed_log(tmp_path, 6)
    log_file = segment_file(tmp_path, 0)
    log_file.write_bytes(log_file.read_bytes()[: 5 * BATCH_SIZE + 40])
    torn = log_file.read_bytes()
    with fs.installed(FaultyFileSystem(disk_full=True)), pytest.raises(OSError, match="No space left"):
        open_log(tmp_path, clean=False)
    assert log_file.read_bytes() == torn and aside_files(tmp_path) == {} and not list(tmp_path.glob("*.tmp"))
    recovered = open_log(tmp_path, clean=False)  # space again: the next start does it
    assert fetch_each_offset(recovered) == (expected(5), [])
    assert list(aside_files(tmp_path).values()) == [torn[5 * BATCH_SIZE :]]


def test_damage_found_in_a_fsynced_sealed_segment_is_kept_and_served_around(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plog = open_log(tmp_path, clean=True)
    for i in range(COUNT):
        plog.append(batch(i), now_ms=T0)
    plog.close()  # a clean stop: every segment is trusted, only the batches after its last index entry are read
    sealed = segment_file(tmp_path, 13)
    edit(sealed, lambda data: struct.pack_into(">i", data, 12 * BATCH_SIZE + 8, 5))  # offset 25, the last batch
    before = sealed.read_bytes()
    with caplog.at_level(logging.ERROR, logger="kbroker.storage"):
        again = open_log(tmp_path, clean=True)
    assert f"{sealed} bytes {12 * BATCH_SIZE}..{13 * BATCH_SIZE - 1} (offsets 25..25) are corrupt" in caplog.text
    assert fetch_each_offset(again) == ([r for r in expected() if r[0] != 25], [25])
    assert sealed.read_bytes() == before
