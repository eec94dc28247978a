"""Checked metadata files (kbroker/durable/files.py): round trips, every kind of damage refused with the file
named, single bit flips caught everywhere, and the formats of older kbrokers read and rewritten."""

from __future__ import annotations

import json
import re
import struct
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.durable.files import (
    CHECKED_MAGIC,
    LEGACY_VERSION,
    DamagedFileError,
    encode_checked,
    read_checked,
    read_checked_json,
    read_log_start_offset,
    read_offset_file,
    write_checked,
    write_checked_json,
    write_log_start_offset,
    write_offset_file,
)
from kbroker.storage import LogConfig, LogManager, PartitionLog
from kbroker.storage.backend import LOG_START_OFFSET_FILE
from kbroker.storage.manager import TOPICS_FILE
from kbroker.storage.producer_state import SNAPSHOT_SUFFIX, BatchMetadata, ProducerEntry, ProducerStateTable
from protocol.records import Record, build_batch, crc32c


def damaged(path: Path) -> pytest.RaisesExc[DamagedFileError]:
    """Expect a DamagedFileError whose one-line message starts by naming ``path``."""
    return pytest.raises(DamagedFileError, match="^" + re.escape(f"damaged file {path}: ") + r"[^\n]+$")


def flip_every_bit(path: Path, read: Callable[[], object]) -> int:
    """Flip each bit of ``path`` in turn; every flip must make ``read`` raise DamagedFileError naming the file."""
    original = path.read_bytes()
    for position in range(len(original)):
        for bit in range(8):
            flipped = bytearray(original)
            flipped[position] ^= 1 << bit
            path.write_bytes(flipped)
            with damaged(path):
                read()
    path.write_bytes(original)
    return len(original) * 8


# --- the binary checked file --------------------------------------------------------------------------------


def test_checked_file_layout_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_checked(path, "thing", 3, b"payload")
    described = b"\x05thing" + b"\x00\x03" + b"\x00\x00\x00\x07"
    crc = crc32c(b"payload", crc32c(described))
    assert path.read_bytes() == CHECKED_MAGIC + described + struct.pack(">I", crc) + b"payload"
    assert read_checked(path, "thing", (3,)) == (3, b"payload")
    assert not path.with_name("f.tmp").exists()
    write_checked(path, "thing", 3, b"")
    assert read_checked(path, "thing", (1, 3)) == (3, b"")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "short file: 0 bytes, cut inside the header"),
        (CHECKED_MAGIC[:3], "short file: 3 bytes, cut inside the header"),
        (encode_checked("thing", 1, b"abc")[:12], "short file: 12 bytes, cut inside the header"),
        (encode_checked("thing", 1, b"abc")[:-1], "short file: payload of 3 bytes, only 2 present"),
        (encode_checked("thing", 1, b"abc") + b"\n", "1 bytes after the payload of 3 bytes"),
        (encode_checked("other", 1, b"abc"), "is a 'other' file, expected 'thing'"),
        (encode_checked("thing", 7, b"abc"), "thing format version 7 is not supported (this kbroker reads 1, 2)"),
        (b"12345", "not a kbroker thing file (no header)"),
    ],
)
def test_every_kind_of_damage_names_the_file(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "f"
    path.write_bytes(content)
    with pytest.raises(DamagedFileError) as info:
        read_checked(path, "thing", (1, 2))
    assert str(info.value) == f"damaged file {path}: {problem}"
    assert info.value.path == path


def test_checksum_mismatch_is_reported_with_both_values(tmp_path: Path) -> None:
    path = tmp_path / "f"
    data = bytearray(encode_checked("thing", 1, b"abc"))
    data[-1] ^= 0x01  # "abc" -> "abb"
    path.write_bytes(data)
    stored = struct.unpack_from(">I", data, len(data) - 7)[0]
    computed = crc32c(b"abb", crc32c(bytes(data[4:-7])))
    with pytest.raises(DamagedFileError) as info:
        read_checked(path, "thing", (1,))
    assert info.value.problem == f"checksum mismatch (crc32c stored {stored:#010x}, computed {computed:#010x})"


def test_a_file_without_header_is_legacy_only_when_the_reader_accepts_it(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"17\n")
    assert read_checked(path, "thing", (LEGACY_VERSION, 1)) == (LEGACY_VERSION, b"17\n")
    with damaged(path):
        read_checked(path, "thing", (1,))


def test_every_bit_flip_of_a_checked_file_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_checked(path, "thing", 1, b'{"a": [1, 2]}')
    assert flip_every_bit(path, lambda: read_checked(path, "thing", (1,))) == 8 * 33


# --- offsets in small files -------------------------------------------------------------------------------


def test_log_start_offset_round_trip_and_every_bit_flip(tmp_path: Path) -> None:
    path = tmp_path / LOG_START_OFFSET_FILE
    write_log_start_offset(path, 2**40 + 5)
    assert read_log_start_offset(path) == 2**40 + 5
    assert read_checked(path, "log-start-offset", (1,)) == (1, struct.pack(">q", 2**40 + 5))
    # Legacy decimal text is accepted too, so a flip in the magic must not turn the file into a "legacy" one.
    flip_every_bit(path, lambda: read_log_start_offset(path))
    assert read_log_start_offset(path) == 2**40 + 5


def test_offset_file_of_another_kind_or_negative_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_offset_file(path, "producer-id-block", 1000)
    with pytest.raises(DamagedFileError) as info:
        read_log_start_offset(path)
    assert info.value.problem == "is a 'producer-id-block' file, expected 'log-start-offset'"
    write_checked(path, "log-start-offset", 1, struct.pack(">q", -1))
    with pytest.raises(DamagedFileError) as info:
        read_log_start_offset(path)
    assert info.value.problem == "negative offset -1"
    write_checked(path, "log-start-offset", 1, b"\x00" * 4)
    with pytest.raises(DamagedFileError) as info:
        read_log_start_offset(path)
    assert info.value.problem == "expected an 8-byte offset, found 4 bytes"


def test_legacy_offset_files_are_read_and_rewritten(tmp_path: Path) -> None:
    start = tmp_path / LOG_START_OFFSET_FILE
    start.write_text("42")  # as kbroker wrote it before checked files
    assert read_log_start_offset(start) == 42
    assert read_checked(start, "log-start-offset", (1,)) == (1, struct.pack(">q", 42))
    block = tmp_path / "producer-id-block"
    block.write_text("3000\n")
    assert read_offset_file(block, "producer-id-block", "the next producer id") == 3000
    assert block.read_bytes().startswith(CHECKED_MAGIC)
    assert read_offset_file(block, "producer-id-block", "the next producer id") == 3000
    block.write_text("12x")
    with pytest.raises(DamagedFileError) as info:
        read_offset_file(block, "producer-id-block", "the next producer id")
    assert info.value.problem == "expected the next producer id, found '12x'"


def one_batch(value: bytes) -> bytearray:
    return bytearray(build_batch([Record(offset_delta=0, timestamp_delta=0, key=None, value=value)]))


def test_delete_records_persists_the_log_start_offset_checked(tmp_path: Path) -> None:
    plog = PartitionLog("t", 0, tmp_path, LogConfig(), clean=True)
    for value in (b"a", b"b", b"c"):
        plog.append(one_batch(value))
    plog.delete_records(2)
    assert read_checked(tmp_path / LOG_START_OFFSET_FILE, "log-start-offset", (1,)) == (1, struct.pack(">q", 2))
    plog.close()
    again = PartitionLog("t", 0, tmp_path, LogConfig(), clean=True)
    assert (again.log_start_offset, again.log_end_offset) == (2, 3)
    again.close()


def test_a_legacy_log_start_offset_file_is_used_and_rewritten(tmp_path: Path) -> None:
    plog = PartitionLog("t", 0, tmp_path, LogConfig(), clean=True)
    for value in (b"a", b"b", b"c"):
        plog.append(one_batch(value))
    plog.close()
    (tmp_path / LOG_START_OFFSET_FILE).write_text("1")
    again = PartitionLog("t", 0, tmp_path, LogConfig(), clean=True)
    assert again.log_start_offset == 1
    assert read_checked(tmp_path / LOG_START_OFFSET_FILE, "log-start-offset", (1,)) == (1, struct.pack(">q", 1))
    again.close()


# --- checked JSON (topics.json) -------------------------------------------------------------------------------


def test_checked_json_round_trip_keeps_the_document_readable(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    write_checked_json(path, "things", 2, {"items": {"a": [1, "é"]}})
    assert read_checked_json(path, "things", (2,)) == (2, {"items": {"a": [1, "é"]}})
    raw = json.loads(path.read_text())
    described = {"kind": "things", "version": 2, "items": {"a": [1, "é"]}}
    canonical = json.dumps(described, sort_keys=True, separators=(",", ":")).encode()
    assert raw == {**described, "crc32c": crc32c(canonical)}


@pytest.mark.parametrize(
    ("document", "seal", "problem"),
    [
        ({"kind": "things", "version": 2, "items": {}, "crc32c": 1}, False, "checksum mismatch (crc32c stored 1, "),
        ({"kind": "things", "version": 2, "items": {}}, False, "checksum mismatch (crc32c stored None, "),
        ({"kind": "other", "version": 2, "items": {}}, True, "is a 'other' file, expected 'things'"),
        ({"kind": "things", "version": 9}, True, "things format version 9 is not supported (this kbroker reads 2)"),
        ({"kind": "things", "version": 0}, True, "things format version 0 is not supported (this kbroker reads 2)"),
        ({"kind": "things", "version": "2"}, True, "things format version '2' is not supported (this kbroker reads 2)"),
        ({"version": 1, "items": {}}, False, "not a kbroker things file (no kind and crc32c members)"),
    ],
)
def test_checked_json_damage_names_the_file(
    tmp_path: Path, document: dict[str, object], seal: bool, problem: str
) -> None:
    path = tmp_path / "doc.json"
    if seal:  # an intact checksum, so the kind or the version is what is wrong
        document = {**document, "crc32c": crc32c(json.dumps(document, sort_keys=True, separators=(",", ":")).encode())}
    path.write_text(json.dumps(document))
    with pytest.raises(DamagedFileError) as info:
        read_checked_json(path, "things", (2,))
    assert str(info.value).startswith(f"damaged file {path}: {problem}")


def test_every_bit_flip_of_topics_json_is_caught(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, {})
    manager.create_topic("t", 2, {"retention.ms": "5"})
    manager.close()
    path = tmp_path / TOPICS_FILE
    flip_every_bit(path, lambda: LogManager(tmp_path, {}))
    assert LogManager(tmp_path, {}).topic("t").partitions == 2  # type: ignore[union-attr]


def test_a_legacy_topics_json_is_read_and_rewritten(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    legacy = {"version": 1, "topics": {"t": {"id": str(topic_id), "partitions": 3, "configs": {"segment.ms": "9"}}}}
    (tmp_path / TOPICS_FILE).write_text(json.dumps(legacy, indent=1))
    manager = LogManager(tmp_path, {})
    info = manager.topic("t")
    assert info is not None and (info.topic_id, info.partitions, info.configs) == (topic_id, 3, {"segment.ms": "9"})
    manager.close()
    version, document = read_checked_json(tmp_path / TOPICS_FILE, "topics", (2,))
    assert (version, document) == (2, {"topics": legacy["topics"]})


# --- producer snapshots ---------------------------------------------------------------------------------------


def a_table() -> ProducerStateTable:
    table = ProducerStateTable()
    entry = ProducerEntry(epoch=3, last_timestamp=1234)
    entry.batches.append(BatchMetadata(0, 4, 10, 14, 1200))
    entry.batches.append(BatchMetadata(5, 5, 20, 20, 1234))
    table.producers[7] = entry
    return table


def snapshot_state(table: ProducerStateTable) -> dict[int, tuple[int, int, list[BatchMetadata]]]:
    return {pid: (e.epoch, e.last_timestamp, list(e.batches)) for pid, e in table.producers.items()}


def test_producer_snapshot_round_trip_and_every_bit_flip(tmp_path: Path) -> None:
    a_table().write_snapshot(tmp_path, 20)
    path = tmp_path / f"{20:020d}{SNAPSHOT_SUFFIX}"
    assert path.read_bytes().startswith(CHECKED_MAGIC)
    assert snapshot_state(ProducerStateTable.load_snapshot(tmp_path, 20)) == snapshot_state(a_table())
    flip_every_bit(path, lambda: ProducerStateTable.load_snapshot(tmp_path, 20))


def test_a_legacy_producer_snapshot_is_read_and_rewritten(tmp_path: Path) -> None:
    path = tmp_path / f"{20:020d}{SNAPSHOT_SUFFIX}"
    path.write_text('{"7":{"epoch":3,"last_timestamp":1234,"batches":[[0,4,10,14,1200],[5,5,20,20,1234]]}}')
    assert snapshot_state(ProducerStateTable.load_snapshot(tmp_path, 20)) == snapshot_state(a_table())
    version, _ = read_checked(path, "producer-snapshot", (1,))
    assert version == 1
    assert snapshot_state(ProducerStateTable.load_snapshot(tmp_path, 20)) == snapshot_state(a_table())
