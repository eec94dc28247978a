"""The append-only journal (kbroker/durable/journal.py): framing, torn and corrupt records skipped with the later
ones kept, rewriting. (Older kbrokers journalled committed offsets in it; their migration is tested in
tests/coordinators/test_offsets_topic.py.)"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from kbroker.durable.files import DamagedFileError
from kbroker.durable.journal import FILE_MAGIC, RECORD_MAGIC, Journal, encode_header, encode_record
from protocol.records import crc32c

RECORD_OVERHEAD = 12


def journal_with(path: Path, payloads: list[bytes], kind: str = "test") -> Journal:
    journal = Journal(path, kind)
    journal.open()
    journal.append(payloads)
    journal.close()
    return journal


def replayed(path: Path, kind: str = "test") -> tuple[list[bytes], int]:
    journal = Journal(path, kind)
    return list(journal.replay()), journal.damaged_regions


# --- the journal ----------------------------------------------------------------------------------------------


def test_layout_of_header_and_records(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal_with(path, [b"one", b""])
    header = FILE_MAGIC + b"\x00\x01" + b"\x04" + b"test"
    header += struct.pack(">I", crc32c(header))
    one = RECORD_MAGIC + b"\x00\x00\x00\x03" + struct.pack(">I", crc32c(b"one", crc32c(b"\x00\x00\x00\x03")))
    empty = RECORD_MAGIC + b"\x00\x00\x00\x00" + struct.pack(">I", crc32c(b"\x00\x00\x00\x00"))
    assert path.read_bytes() == header + one + b"one" + empty
    assert encode_header("test", 1) == header
    assert replayed(path) == ([b"one", b""], 0)


def test_appends_after_reopen_follow_in_order(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal_with(path, [b"a", b"b"])
    journal_with(path, [b"c"])
    assert replayed(path) == ([b"a", b"b", b"c"], 0)


def test_a_missing_or_empty_journal_replays_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j"
    assert replayed(path) == ([], 0)
    path.write_bytes(b"")
    assert replayed(path) == ([], 0)


def test_torn_last_record_is_skipped_at_every_cut(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "j"
    journal_with(path, [b"first", b"second"])
    whole = path.read_bytes()
    last_start = len(whole) - RECORD_OVERHEAD - len(b"second")
    for cut in range(last_start + 1, len(whole)):
        path.write_bytes(whole[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
            assert replayed(path) == ([b"first"], 1)
        assert [r.getMessage() for r in caplog.records] == [
            f"{path}: skipping {cut - last_start} bytes at byte {last_start}: "
            "a torn or corrupt last record (a write cut by a crash?)"
        ]
    path.write_bytes(whole[:last_start])
    assert replayed(path) == ([b"first"], 0)


@pytest.mark.parametrize("damaged_part", ["magic", "length", "crc", "payload"])
def test_a_corrupt_record_in_the_middle_is_skipped_and_the_later_ones_kept(
    tmp_path: Path, damaged_part: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j"
    journal_with(path, [b"first", b"second", b"third"])
    data = bytearray(path.read_bytes())
    second = data.index(RECORD_MAGIC + struct.pack(">I", 6))
    offset_in_record = {"magic": 1, "length": 6, "crc": 9, "payload": 14}[damaged_part]
    data[second + offset_in_record] ^= 0x40
    path.write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        assert replayed(path) == ([b"first", b"third"], 1)
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: skipping {RECORD_OVERHEAD + 6} damaged bytes at byte {second} (a torn or corrupt record); "
        "the records after them are kept"
    ]


def test_a_payload_holding_the_record_magic_does_not_confuse_resynchronisation(tmp_path: Path) -> None:
    path = tmp_path / "j"
    tricky = b"x" + RECORD_MAGIC + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x00" + b"y"
    journal_with(path, [b"first", tricky, b"third"])
    assert replayed(path) == ([b"first", tricky, b"third"], 0)
    data = bytearray(path.read_bytes())
    data[data.index(b"first") + len(b"first") + 5] ^= 0x01  # the length of the tricky record
    path.write_bytes(data)
    assert replayed(path) == ([b"first", b"third"], 1)


def test_bytes_appended_by_something_else_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal_with(path, [b"first"])
    with open(path, "ab") as f:
        f.write(b"\xff{not a record\n")
    journal_with(path, [b"later"])
    assert replayed(path) == ([b"first", b"later"], 1)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (encode_header("other", 1) + encode_record(b"a"), "is a 'other' journal, expected 'test'"),
        (encode_header("test", 2) + encode_record(b"a"), "test journal version 2 is not supported (reads 1)"),
        (encode_header("test", 1)[:-1], "short file: 14 bytes, cut inside the journal header"),
        (FILE_MAGIC + b"\x00", "short file: 5 bytes, cut inside the journal header"),
        (b"\x00" + encode_header("test", 1)[1:], "not a kbroker test journal (no journal header)"),
        (
            encode_header("test", 1)[:-1] + bytes([encode_header("test", 1)[-1] ^ 0x01]) + encode_record(b"a"),
            "checksum mismatch in the journal header",
        ),
    ],
)
def test_a_damaged_header_names_the_file(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "j"
    path.write_bytes(content)
    with pytest.raises(DamagedFileError) as info:
        replayed(path)
    assert str(info.value) == f"damaged file {path}: {problem}"


def test_an_older_record_version_is_readable_when_declared(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal_with(path, [b"v1 record"])
    journal = Journal(path, "test", version=2, readable_versions=(1, 2))
    assert (list(journal.replay()), journal.file_version) == ([b"v1 record"], 1)
    journal.rewrite([b"v2 record"])
    assert path.read_bytes() == encode_header("test", 2) + encode_record(b"v2 record")


def test_rewrite_replaces_the_journal_and_later_appends_go_to_the_new_file(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = Journal(path, "test")
    journal.open()
    journal.append([b"a", b"b", b"c"], sync=True)
    journal.rewrite([b"live"])
    journal.append([b"after"])
    journal.close()
    assert path.read_bytes() == encode_header("test", 1) + encode_record(b"live") + encode_record(b"after")
    assert not path.with_name("j.tmp").exists()


# --- the offsets store ----------------------------------------------------------------------------------------
