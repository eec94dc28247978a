"""Damaged files in the data directory: nothing is deleted on a guess, and each case is one clear line.

Indexes that disagree with the log are rebuilt from it, never trusted to cut data; an unclean start validates
every segment from the recovery point (Kafka's recovery-point-offset-checkpoint); a broken batch found while
serving answers CORRUPT_MESSAGE; a gap between segments is reported; partition directories that do not match
the metadata are moved aside as Kafka's stray logs; a missing topics.json is rebuilt from the partitions.
"""

from __future__ import annotations

import json
import logging
import struct
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.durable.files import DamagedFileError, StorageError
from kbroker.storage import LogConfig, LogManager, PartitionLog
from kbroker.storage.checkpoints import RECOVERY_POINT_FILE, read_offset_checkpoint
from kbroker.storage.manager import CLEAN_SHUTDOWN_FILE, PARTITION_METADATA_FILE
from protocol.errors import ErrorCode, KafkaError
from protocol.records import Record, build_batch, decode_records, iter_batches

T0 = 1_700_000_000_000
BATCH_SIZE = 72  # one record with a 4-byte value
# 13 batches a segment, an index entry every 3 batches.
CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=150)
COUNT = 39  # three full segments: 0..12, 13..25 and 26..38 (the active one)
_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
LENGTH_FIELD = 8  # batch length: after the 8-byte base offset


def batch(index: int) -> bytearray:
    return bytearray(build_batch([Record(value=f"r{index:03d}".encode())], base_timestamp=T0 + index))


def open_log(directory: Path, *, clean: bool = True, recovery_point: int = 0) -> PartitionLog:
    return PartitionLog("t", 0, directory, CONFIG, clean=clean, recovery_point=recovery_point)


def filled(directory: Path, count: int = COUNT) -> PartitionLog:
    plog = open_log(directory)
    for i in range(count):
        assert plog.append(batch(i), now_ms=T0).base_offset == i
    return plog


def expected(count: int = COUNT) -> list[tuple[int, bytes]]:
    return [(i, f"r{i:03d}".encode()) for i in range(count)]


def records(plog: PartitionLog) -> list[tuple[int, bytes | None]]:
    """Every record, read one batch at a time from every offset (each read looks its position up)."""
    out: list[tuple[int, bytes | None]] = []
    for offset in range(plog.log_start_offset, plog.high_watermark):
        for header, view in iter_batches(plog.read(offset, 1).read_bytes()):
            out.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
    return sorted(set(out))


def log_files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*.log"))}


def segment_path(directory: Path, base: int, suffix: str) -> Path:
    return directory / f"{base:020d}{suffix}"


# --- index files that disagree with the log -------------------------------------------------------------------


def _rewrite_entries(path: Path, entry: struct.Struct, change: Callable[[list[list[int]]], None]) -> None:
    entries = [list(fields) for fields in entry.iter_unpack(path.read_bytes())]
    change(entries)
    path.write_bytes(b"".join(entry.pack(*fields) for fields in entries))


def _last(field: int, delta: int) -> Callable[[list[list[int]]], None]:
    def change(entries: list[list[int]]) -> None:
        entries[-1][field] += delta

    return change


def _middle_position_inside_a_batch(entries: list[list[int]]) -> None:
    entries[len(entries) // 2][1] += 20


def _out_of_order(entries: list[list[int]]) -> None:
    entries[-1], entries[-2] = entries[-2], entries[-1]


INDEX_DAMAGE = {
    "last offset one too high": _last(0, 1),
    "last offset one too low": _last(0, -1),
    "last position one too far": _last(1, 1),
    "last position inside a batch": _last(1, 20),
    "last position past the end of the log": _last(1, 10_000),
    "middle position inside a batch": _middle_position_inside_a_batch,
    "entries out of order": _out_of_order,
}


@pytest.mark.parametrize("segment", ["sealed", "active"])
@pytest.mark.parametrize("damage", INDEX_DAMAGE)
def test_a_wrong_index_entry_never_cuts_data(
    tmp_path: Path, segment: str, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    plog = filled(tmp_path)
    bases = [s.base_offset for s in plog.segments]
    assert bases == [0, 13, 26]
    plog.close()
    before = log_files(tmp_path)
    index = segment_path(tmp_path, bases[0] if segment == "sealed" else bases[-1], ".index")
    _rewrite_entries(index, _ENTRY, INDEX_DAMAGE[damage])

    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        again = open_log(tmp_path)
        assert records(again) == expected()
    assert f"{index}: " in caplog.text and "rebuilding the indexes from the log" in caplog.text
    assert log_files(tmp_path) == before  # not a byte cut
    assert again.append(batch(COUNT), now_ms=T0).base_offset == COUNT
    again.close()
    assert records(open_log(tmp_path)) == expected(COUNT + 1)


def _lowered(entries: list[list[int]]) -> None:
    entries[-1][0] = T0 - 86_400_000


def _emptied(entries: list[list[int]]) -> None:
    entries.clear()


def _offset_past_the_segment(entries: list[list[int]]) -> None:
    entries[-1][1] += 100


def _one_below_the_largest(entries: list[list[int]]) -> None:
    entries[-1][0] -= 1


# Each with whether the index is rebuilt (a warning): a wrong entry for the batches read again at start-up
# (those from the last offset index entry on) is replaced by what they say, without a rebuild.
TIME_INDEX_DAMAGE = {
    "last timestamp lowered by a day": (_lowered, True),
    "last timestamp one below the largest": (_one_below_the_largest, False),
    "no entries": (_emptied, True),
    "last offset past the segment": (_offset_past_the_segment, False),
}


@pytest.mark.parametrize("damage", TIME_INDEX_DAMAGE)
def test_a_wrong_time_index_is_never_believed_so_retention_does_not_delete_early(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    plog = filled(tmp_path)
    plog.close()
    before = log_files(tmp_path)
    time_index = segment_path(tmp_path, 0, ".timeindex")
    change, rebuilt = TIME_INDEX_DAMAGE[damage]
    _rewrite_entries(time_index, _TIME_ENTRY, change)

    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        again = PartitionLog("t", 0, tmp_path, CONFIG._replace(retention_ms=3_600_000), clean=True)
    assert (f"{time_index}: " in caplog.text) == rebuilt
    assert [s.max_timestamp for s in again.segments] == [T0 + 12, T0 + 25, T0 + 38]
    assert again.apply_retention(T0 + 60_000) == []  # an hour of retention: all of it is a minute old
    assert again.offset_for_timestamp(T0 + 5) == (5, T0 + 5)
    assert records(again) == expected() and log_files(tmp_path) == before


# --- segments whose batches do not run to the end ---------------------------------------------------------------


def _break_length(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position + LENGTH_FIELD : position + LENGTH_FIELD + 4] = struct.pack(">i", 5)
    path.write_bytes(bytes(data))


def test_a_fsynced_segment_with_a_broken_batch_is_not_cut_but_reported(tmp_path: Path) -> None:
    plog = filled(tmp_path)
    plog.close()
    active = segment_path(tmp_path, 26, ".log")
    _break_length(active, 12 * BATCH_SIZE)  # offset 38, at the active segment's last index entry
    before = log_files(tmp_path)
    with pytest.raises(DamagedFileError) as info:
        open_log(tmp_path)
    assert str(info.value) == (
        f"damaged file {active}: {active} position {12 * BATCH_SIZE}: record batch length 5 is smaller than a batch "
        f"header; the batches before position {12 * BATCH_SIZE} are intact, the {BATCH_SIZE} bytes from there "
        "were fsynced and are left as they are"
    )
    assert log_files(tmp_path) == before


def test_the_manager_answers_a_storage_error_for_a_damaged_fsynced_segment(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, {"segment.bytes": "1000", "index.interval.bytes": "150"})
    logs.create_topic("t", 2, {})
    for partition in (0, 1):
        plog = logs.get_partition("t", partition)
        assert plog is not None
        for i in range(3):
            plog.append(batch(i), now_ms=T0)
    logs.close()
    segment = tmp_path / "t-0" / "00000000000000000000.log"
    _break_length(segment, 2 * BATCH_SIZE)
    before = segment.read_bytes()
    again = LogManager(tmp_path, {})
    with pytest.raises(KafkaError) as info:
        again.get_partition("t", 0)
    assert info.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert (info.value.message or "").startswith(f"t-0 cannot be opened: damaged file {segment}: {segment} position ")
    assert again.get_partition("t", 1).high_watermark == 3  # type: ignore[union-attr]
    assert segment.read_bytes() == before


def test_a_broken_batch_found_while_serving_answers_corrupt_message_once_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plog = filled(tmp_path)
    plog.close()
    sealed = segment_path(tmp_path, 13, ".log")
    _break_length(sealed, 4 * BATCH_SIZE)  # offset 17: between index entries, so loading does not read it
    before = log_files(tmp_path)
    again = open_log(tmp_path)
    assert [v for _, v in _values(again, 16)] == [b"r016"]
    with caplog.at_level(logging.ERROR, logger="kbroker.storage"):
        for _ in range(2):
            with pytest.raises(KafkaError) as info:
                again.read(17, 1 << 20)
            assert info.value.code == ErrorCode.CORRUPT_MESSAGE
    problem = f"{sealed} position {4 * BATCH_SIZE}: record batch length 5 is smaller than a batch header"
    assert info.value.message == f"t-0 cannot be read: {problem}"
    assert caplog.text.count(problem) == 1  # logged once, not on every fetch
    assert [v for _, v in _values(again, 30)] == [b"r030"]  # the rest of the log is served
    assert log_files(tmp_path) == before


def _values(plog: PartitionLog, offset: int) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    for header, view in iter_batches(plog.read(offset, 1).read_bytes()):
        out.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
    return out


# --- recovery from the recovery point ---------------------------------------------------------------------------


def _flip_value_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position + BATCH_SIZE - 2] ^= 0xFF  # inside the record: only the CRC can tell
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("recovery_point", "kept"), [(0, 20), (13, 20), (20, 20), (26, 26)])
def test_an_unclean_start_validates_every_segment_from_the_recovery_point(
    tmp_path: Path, recovery_point: int, kept: int, caplog: pytest.LogCaptureFixture
) -> None:
    plog = filled(tmp_path)
    plog.flush()
    plog.delete()  # a crash: descriptors closed, no indexes written for the active segment
    middle = segment_path(tmp_path, 13, ".log")
    _flip_value_byte(middle, 7 * BATCH_SIZE)  # offset 20, in the sealed middle segment
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        again = open_log(tmp_path, clean=False, recovery_point=recovery_point)
    if kept == 26:
        # Below the recovery point everything was fsynced: trusted, not read (Kafka's recovery does the same).
        assert middle.stat().st_size == 13 * BATCH_SIZE
        assert again.high_watermark == COUNT
        return
    # From the segment holding the recovery point on, every batch's CRC is checked. The bad batch has valid ones
    # after it, so it is corruption, not a torn write: nothing is cut, the rest is served, and its offset answers
    # CORRUPT_MESSAGE.
    assert middle.stat().st_size == 13 * BATCH_SIZE
    assert [r for r in records_around_damage(again) if r[0] != 20] == [r for r in expected() if r[0] != 20]
    with pytest.raises(KafkaError) as info:
        again.read(20, 1 << 20)
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE
    found = f"{middle} bytes {7 * BATCH_SIZE}..{8 * BATCH_SIZE - 1} (offsets 20..20) are corrupt: CRC mismatch"
    assert f"t-0: {found}; kept in place" in caplog.text
    assert "truncating" not in caplog.text and "missing" not in caplog.text
    assert again.append(batch(COUNT), now_ms=T0).base_offset == COUNT


def records_around_damage(plog: PartitionLog) -> list[tuple[int, bytes | None]]:
    """``records``, but offsets that answer CORRUPT_MESSAGE are left out."""
    out: list[tuple[int, bytes | None]] = []
    for offset in range(plog.log_start_offset, plog.high_watermark):
        try:
            data = plog.read(offset, 1).read_bytes()
        except KafkaError as exc:
            assert exc.code == ErrorCode.CORRUPT_MESSAGE
            continue
        for header, view in iter_batches(data):
            out.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
    return sorted(set(out))


def test_a_missing_middle_segment_is_reported_with_its_offsets_and_the_rest_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    filled(tmp_path).close()
    for suffix in (".log", ".index", ".timeindex"):
        segment_path(tmp_path, 13, suffix).unlink()
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        again = open_log(tmp_path)
    first, last = segment_path(tmp_path, 0, ".log"), segment_path(tmp_path, 26, ".log")
    assert f"t-0: offsets 13..25 are missing between {first} and {last}" in caplog.text
    assert records(again) == expected(13) + expected(COUNT)[26:]
    # A fetch in the gap gets the batches after it, as from Apache Kafka 4.3 (which loads such a log without
    # a word: measured with a middle segment deleted, a fetch at a missing offset answered the next segment).
    assert _values(again, 13)[0] == (26, b"r026")
    assert again.append(batch(COUNT), now_ms=T0).base_offset == COUNT


def test_recovery_points_are_checkpointed_in_kafkas_layout(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, {"segment.bytes": "1000"})
    logs.create_topic("t", 2, {})
    plog = logs.get_partition("t", 0)
    assert plog is not None
    for i in range(15):
        plog.append(batch(i), now_ms=T0)
    checkpoint = tmp_path / RECOVERY_POINT_FILE
    logs.checkpoint_recovery_points()
    # Rolled at 13 (the first segment fsynced then), the active segment holds writes not yet fsynced.
    assert checkpoint.read_text() == "0\n2\nt 0 13\nt 1 0\n"
    plog.flush()
    logs.checkpoint_recovery_points()
    assert checkpoint.read_text() == "0\n2\nt 0 15\nt 1 0\n"
    logs.close()
    assert read_offset_checkpoint(checkpoint) == {("t", 0): 15, ("t", 1): 0}


def test_an_unclean_start_of_the_manager_uses_the_checkpoint(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, {"segment.bytes": "1000"})
    logs.create_topic("t", 1, {})
    plog = logs.get_partition("t", 0)
    assert plog is not None
    for i in range(COUNT):
        plog.append(batch(i), now_ms=T0)
    plog.flush()
    logs.checkpoint_recovery_points()  # 39: everything fsynced
    plog.delete()  # a crash: no clean-shutdown marker
    _flip_value_byte(tmp_path / "t-0" / "00000000000000000013.log", 7 * BATCH_SIZE)
    again = LogManager(tmp_path, {"segment.bytes": "1000"})
    assert not again.clean_start
    reopened = again.get_partition("t", 0)
    assert reopened is not None and reopened.high_watermark == COUNT  # below the recovery point: trusted
    again.close()


def test_a_damaged_checkpoint_is_reported_and_every_segment_validated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logs = LogManager(tmp_path, {"segment.bytes": "1000"})
    logs.create_topic("t", 1, {})
    plog = logs.get_partition("t", 0)
    assert plog is not None
    for i in range(COUNT):
        plog.append(batch(i), now_ms=T0)
    plog.flush()
    logs.checkpoint_recovery_points()
    plog.delete()
    checkpoint = tmp_path / RECOVERY_POINT_FILE
    checkpoint.write_text("0\n2\nt 0 39\n")  # cut short
    _flip_value_byte(tmp_path / "t-0" / "00000000000000000013.log", 7 * BATCH_SIZE)
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        again = LogManager(tmp_path, {"segment.bytes": "1000"})
        reopened = again.get_partition("t", 0)
    assert f"damaged file {checkpoint}: 1 entries, but the file says 2 (cut short?)" in caplog.text
    assert reopened is not None
    assert [(r.first_offset, r.last_offset) for r in reopened.segments[1].corrupt_ranges] == [(20, 20)]


def test_partitions_not_opened_after_an_unclean_start_are_still_recovered_next_time(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, {})
    logs.create_topic("t", 2, {})
    logs.close()
    (tmp_path / CLEAN_SHUTDOWN_FILE).unlink()  # as after a crash
    unclean = LogManager(tmp_path, {})
    assert unclean.get_partition("t", 0) is not None  # t-1 is never opened, so never recovered
    unclean.close()
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    again = LogManager(tmp_path, {})
    assert not again.clean_start
    again.get_partition("t", 0)
    again.get_partition("t", 1)
    again.close()
    assert LogManager(tmp_path, {}).clean_start


# --- partition directories and topics.json ----------------------------------------------------------------------


def _manager_with_records(data_dir: Path, topics: dict[str, int]) -> dict[str, uuid.UUID]:
    logs = LogManager(data_dir, {})
    ids = {}
    for name, partitions in topics.items():
        ids[name] = logs.create_topic(name, partitions, {}).topic_id
        for index in range(partitions):
            plog = logs.get_partition(name, index)
            assert plog is not None
            plog.append(batch(index), now_ms=T0)
    logs.close()
    return ids


def _strays(data_dir: Path, name: str) -> list[Path]:
    return sorted(data_dir.glob(f"{name}.*-stray"))


def test_a_directory_of_another_topic_id_is_moved_aside_with_its_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _manager_with_records(tmp_path, {"t": 1})
    directory = tmp_path / "t-0"
    other = "00000000-0000-0000-0000-000000000001"
    (directory / PARTITION_METADATA_FILE).write_text(f"version: 0\ntopic_id: {other}\n")
    data = log_files(directory)
    logs = LogManager(tmp_path, {})
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        plog = logs.get_partition("t", 0)
    assert plog is not None and plog.high_watermark == 0  # the topic's own partition starts empty
    [stray] = _strays(tmp_path, "t-0")
    assert log_files(stray) == data  # the other topic's records, kept
    topic_id = logs.topic("t").topic_id  # type: ignore[union-attr]
    assert (
        f"moved {directory} aside to {stray}: its {PARTITION_METADATA_FILE} names topic id {other}, t is {topic_id}; "
        "kbroker does not delete it" in caplog.text
    )
    logs.close()
    LogManager(tmp_path, {}).close()
    assert _strays(tmp_path, "t-0") == [stray]  # never removed later


def test_directories_the_metadata_does_not_know_are_moved_aside_at_start_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _manager_with_records(tmp_path, {"known": 1, "gone": 2})
    document = json.loads((tmp_path / "topics.json").read_text())
    del document["topics"]["gone"]
    document["topics"]["known"]["partitions"] = 1
    (tmp_path / "topics.json").unlink()
    logs = LogManager(tmp_path, {})  # rebuilt from disk: both topics
    assert sorted(info.name for info in logs.topics()) == ["gone", "known"]
    logs.delete_topic("gone")
    logs.close()
    (tmp_path / "gone-1").mkdir()  # a directory left of a topic the metadata does not know
    (tmp_path / "gone-1" / "00000000000000000000.log").write_bytes(bytes(batch(1)))
    (tmp_path / "left-over.abc-delete").mkdir()  # an interrupted delete: still removed
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        LogManager(tmp_path, {}).close()
    [stray] = _strays(tmp_path, "gone-1")
    assert (stray / "00000000000000000000.log").read_bytes() == bytes(batch(1))
    assert f"moved {tmp_path / 'gone-1'} aside to {stray}: topic 'gone' is not in topics.json" in caplog.text
    assert not (tmp_path / "left-over.abc-delete").exists()


def test_a_deleted_topics_json_is_rebuilt_from_the_partition_directories(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ids = _manager_with_records(tmp_path, {"a": 3, "b": 1})
    before = {name: log_files(tmp_path / name) for name in ("a-0", "a-1", "a-2", "b-0")}
    (tmp_path / "topics.json").unlink()
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        logs = LogManager(tmp_path, {})
    assert [(info.name, info.topic_id, info.partitions) for info in logs.topics()] == [
        ("a", ids["a"], 3),
        ("b", ids["b"], 1),
    ]
    assert (
        f"{tmp_path / 'topics.json'} was missing: rebuilt it from the partition directories (a: 3 partition(s), "
        "b: 1 partition(s)); topic config overrides could not be recovered" in caplog.text
    )
    with pytest.raises(KafkaError) as exists:  # an auto-creation of the name finds it instead of wiping it
        logs.create_topic("a", 1, {})
    assert exists.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
    assert [logs.get_partition("a", i).high_watermark for i in range(3)] == [1, 1, 1]  # type: ignore[union-attr]
    logs.close()
    assert {name: log_files(tmp_path / name) for name in before} == before
    assert json.loads((tmp_path / "topics.json").read_text())["topics"]["a"]["id"] == str(ids["a"])


def test_a_topics_json_that_cannot_be_rebuilt_unambiguously_stops_start_up(tmp_path: Path) -> None:
    _manager_with_records(tmp_path, {"a": 2})
    (tmp_path / "topics.json").unlink()
    other = "00000000-0000-0000-0000-000000000002"
    (tmp_path / "a-1" / PARTITION_METADATA_FILE).write_text(f"version: 0\ntopic_id: {other}\n")
    with pytest.raises(StorageError) as info:
        LogManager(tmp_path, {})
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'topics.json'} is missing and cannot be rebuilt: the directories of ")
    assert f"{other}: {tmp_path / 'a-1'}" in message and "\n" not in message
    assert not (tmp_path / "topics.json").exists() and (tmp_path / "a-0").is_dir() and (tmp_path / "a-1").is_dir()


def test_a_directory_in_the_way_of_a_new_topic_is_moved_aside(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, {})
    (tmp_path / "t-0").mkdir()  # appeared after start-up
    (tmp_path / "t-0" / "00000000000000000000.log").write_bytes(bytes(batch(0)))
    logs.create_topic("t", 1, {})
    [stray] = _strays(tmp_path, "t-0")
    assert (stray / "00000000000000000000.log").read_bytes() == bytes(batch(0))
    assert logs.get_partition("t", 0).high_watermark == 0  # type: ignore[union-attr]
    logs.close()
