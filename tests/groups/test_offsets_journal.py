"""The append-only journal (kbroker/durable/journal.py) and the offsets store journalled in it: framing, torn
and corrupt records skipped with the later ones kept, compaction, and the JSON-lines journal of older kbrokers."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import pytest

from kbroker.durable.files import DamagedFileError
from kbroker.durable.journal import FILE_MAGIC, RECORD_MAGIC, Journal, encode_header, encode_record
from kbroker.groups import offsets as offsets_module
from kbroker.groups.offsets import CommittedOffset, OffsetStore
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


def committed(store: OffsetStore, group: str) -> dict[tuple[str, int], int]:
    return {key: c.offset for key, c in store.get(group).items()}


def commit(store: OffsetStore, group: str, partition: int, offset: int) -> None:
    store.commit(group, {("t", partition): CommittedOffset(offset, 4, f"m{offset}", 1000 + offset)})


def test_offsets_survive_a_restart_with_all_fields(tmp_path: Path) -> None:
    store = OffsetStore(tmp_path)
    store.commit("g", {("t", 0): CommittedOffset(5, 3, "meta", 111, 222), ("t", 1): CommittedOffset(6, -1, None, 7)})
    store.commit("h", {("u", 0): CommittedOffset(1, -1, None, 1)})
    store.delete("g", [("t", 1)])
    store.delete_group("h")
    store.close()
    again = OffsetStore(tmp_path)
    assert again.offsets == {"g": {("t", 0): CommittedOffset(5, 3, "meta", 111, 222)}}
    again.close()
    payloads, damaged_regions = replayed(store.path, "consumer-offsets")
    assert damaged_regions == 0 and len(payloads) == 5


def test_a_torn_last_commit_loses_only_that_commit(tmp_path: Path) -> None:
    store = OffsetStore(tmp_path)
    commit(store, "g", 0, 10)
    commit(store, "g", 1, 20)
    store.close()
    with open(store.path, "r+b") as f:
        f.truncate(store.path.stat().st_size - 3)
    again = OffsetStore(tmp_path)
    assert committed(again, "g") == {("t", 0): 10}
    commit(again, "g", 2, 30)  # the damage was rewritten away: nothing is skipped at the next start
    again.close()
    assert replayed(store.path, "consumer-offsets")[1] == 0
    third = OffsetStore(tmp_path)
    assert committed(third, "g") == {("t", 0): 10, ("t", 2): 30}
    third.close()


def test_a_corrupt_commit_in_the_middle_keeps_the_later_commits_after_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = OffsetStore(tmp_path)
    commit(store, "g", 0, 10)
    commit(store, "g", 1, 20)
    commit(store, "g", 2, 30)
    commit(store, "g", 0, 11)
    store.close()
    data = bytearray(store.path.read_bytes())
    data[data.index(b'"o":20') + 5] ^= 0x01  # 20 -> 21 inside the second record: its crc32c no longer matches
    store.path.write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="kbroker.storage"):
        again = OffsetStore(tmp_path)
    assert committed(again, "g") == {("t", 0): 11, ("t", 2): 30}
    assert len([r for r in caplog.records if "damaged bytes" in r.getMessage()]) == 1
    commit(again, "g", 3, 40)
    again.close()
    third = OffsetStore(tmp_path)
    assert committed(third, "g") == {("t", 0): 11, ("t", 2): 30, ("t", 3): 40}
    third.close()


def test_compaction_rewrites_the_live_offsets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offsets_module, "_COMPACT_MIN_RECORDS", 10)
    store = OffsetStore(tmp_path)
    for offset in range(11):
        commit(store, "g", 0, offset)  # the 11th record passes the minimum with 1 live offset: compaction
    commit(store, "g", 1, 100)
    store.close()
    payloads, _ = replayed(store.path, "consumer-offsets")
    assert [json.loads(p)["o"] for p in payloads] == [10, 100]
    again = OffsetStore(tmp_path)
    assert committed(again, "g") == {("t", 0): 10, ("t", 1): 100}
    again.close()


def test_a_legacy_json_lines_journal_is_read_and_rewritten(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "__consumer_offsets" / "offsets.journal"
    path.parent.mkdir()
    lines = [
        {"g": "g", "t": "t", "p": 0, "o": 5, "e": 2, "m": "x", "ts": 100, "x": -1},
        {"g": "g", "t": "t", "p": 1, "o": 6},  # the oldest kbrokers wrote fewer fields
        {"g": "h", "t": "t", "p": 0, "o": 1},
        {"g": "h", "delete_group": True},
        {"g": "g", "t": "t", "p": 1, "o": None},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"g": "g", "t": "t", "p": 2, "o')
    with caplog.at_level(logging.WARNING, logger="kbroker.groups"):
        store = OffsetStore(tmp_path)
    assert f"{path}: skipping unreadable line 6 (torn write?)" in caplog.text
    assert store.offsets == {"g": {("t", 0): CommittedOffset(5, 2, "x", 100, -1)}}
    store.close()
    assert path.read_bytes().startswith(FILE_MAGIC)
    again = OffsetStore(tmp_path)
    assert again.offsets == {"g": {("t", 0): CommittedOffset(5, 2, "x", 100, -1)}}
    again.close()


def test_a_journal_in_no_known_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "__consumer_offsets" / "offsets.journal"
    path.parent.mkdir()
    path.write_bytes(bytes([FILE_MAGIC[0] ^ 0x01]) + encode_header("consumer-offsets", 1)[1:])
    with pytest.raises(DamagedFileError) as info:
        OffsetStore(tmp_path)
    assert str(info.value) == f"damaged file {path}: neither an offsets journal nor the older JSON-lines format"
