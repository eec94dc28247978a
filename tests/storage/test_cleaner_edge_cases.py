"""The log cleaner where it is easiest to get wrong: keys that could stand for each other in the offset map,
records it could not read, a swap failing part-way, and a crash during a swap that carries an aborted
transaction index."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

import kbroker.storage.backend as backend_module
from kbroker.services import LogCleanerService
from kbroker.storage import PartitionLog
from kbroker.storage.cleaner import CleanerCheckpoints, cleanable_section, run_job
from protocol.errors import ErrorCode
from protocol.records import BatchHeader, Record, build_batch, rebuild_batch
from tests.storage.test_log_cleaner import (
    SETTINGS,
    T0,
    batch,
    check_a_crash_at_each_step_of_the_swap,
    clean,
    contents,
    open_log,
)


def test_a_16_byte_key_equal_to_the_md5_of_a_long_key_does_not_delete_that_key(tmp_path: Path) -> None:
    """Short keys are mapped as they are and long ones by their MD5 digest plus a mark byte, so a producer
    writing a long key's digest as a key does not supersede that key's latest record."""
    plog = open_log(tmp_path)
    long_key = b"customer-000000000042"  # 21 bytes
    plog.append(batch((long_key, b"latest value")), now_ms=T0)
    plog.append(batch((hashlib.md5(long_key).digest(), b"other key")), now_ms=T0)
    plog.roll(T0)
    plog.append(batch((b"x", b"x")), now_ms=T0)
    clean(plog, T0)
    assert (0, long_key, b"latest value") in contents(plog)


def _record_with_key_length(zigzag_key_length: int) -> bytes:
    inner = bytes([0, 0, 0, zigzag_key_length, 2]) + b"v" + bytes([0])  # attrs, ts, offset, key len, value, headers
    return bytes([len(inner) << 1]) + inner


def test_a_record_the_cleaner_could_not_read_is_refused_by_a_compacted_topic(tmp_path: Path) -> None:
    """Any negative key length is a null key, as Kafka's DefaultRecord reads it (refused on a compacted topic),
    and a key longer than its record is INVALID_RECORD: nothing admitted can stop a later pass."""
    plog = open_log(tmp_path)
    like = BatchHeader.parse(
        build_batch([Record(offset_delta=0, timestamp_delta=0, key=b"k", value=b"v")], base_timestamp=T0)
    )

    def append_with_key_length(zigzag: int) -> tuple[int, str | None]:
        records = _record_with_key_length(zigzag)
        bad = bytearray(rebuild_batch(like, records, 1, base_timestamp=T0, max_timestamp=T0, attributes=0))
        answer = plog.append(bad, now_ms=T0)
        return answer.error_code, answer.error_message

    code, message = append_with_key_length(3)  # -2
    assert code == ErrorCode.INVALID_RECORD and message is not None
    assert "Compacted topic cannot accept message without key in topic partition t-0." in message
    assert append_with_key_length(8) == (ErrorCode.INVALID_RECORD, "Found invalid record structure")  # 4 bytes
    assert plog.log_end_offset == 0


def test_a_swap_failing_after_the_segments_were_swapped_in_leaves_the_log_readable(tmp_path: Path, monkeypatch) -> None:
    """A swap that fails after it began renaming (here: writing the .txnindex files, ENOSPC) takes the data
    directory offline and leaves the replacements in the log, readable: the service does not close them."""
    data_dir = tmp_path
    plog = open_log(data_dir / "t-0")
    for r in range(4):
        plog.append(batch((b"k", f"v{r}".encode())), now_ms=T0)
    plog.roll(T0)
    plog.append(batch((b"k", b"v4")), now_ms=T0)

    logs = SimpleNamespace(
        data_dir=data_dir,
        compacted_partitions=lambda: [plog],
        get_partition=lambda t, p: plog,
        open_partitions=lambda: [plog],
    )
    config = {
        "log.cleaner.enable": True,
        "log.cleaner.dedupe.buffer.size": SETTINGS.dedupe_buffer_bytes,
        "log.cleaner.io.buffer.load.factor": 0.9,
        "log.cleaner.io.max.bytes.per.second": float("inf"),
        "log.cleaner.backoff.ms": 15_000,
    }
    service = LogCleanerService(SimpleNamespace(config=config, logs=logs))
    service.checkpoints = CleanerCheckpoints(data_dir)

    async def in_thread(job):
        return run_job(job)

    monkeypatch.setattr(service, "_run_worker", in_thread)

    def failing_write(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(backend_module, "write_segment_file", failing_write)
    assert cleanable_section(plog, None, T0).dirty_bytes > 0
    trio.run(service.clean_dirtiest, logs)
    monkeypatch.undo()
    assert plog.health.offline  # a restart completes the swap from the .swap files
    assert [v for _, _, v in contents(plog)] == [b"v3", b"v4"]  # reads go on, from the replacement


def test_a_crash_during_a_swap_keeps_the_aborted_transaction_index_of_the_log_it_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whichever log a crash leaves (old or cleaned), its aborted transaction index is the one that log needs:
    an index file renamed after its log is rebuilt from the markers at the next start."""

    def build(directory: Path) -> PartitionLog:
        plog = open_log(directory)
        plog.append(batch((b"a", b"1"), producer=(7, 0, 0), transactional=True), now_ms=T0)
        plog.append_marker(7, 0, False, 0, T0)  # aborted: its data goes, its marker stays (seen in the pass)
        plog.append(batch((b"a", b"2"), producer=(8, 0, 0)), now_ms=T0)
        plog.append(batch((b"a", b"3")), now_ms=T0)
        plog.roll(T0)
        plog.append(batch((b"z", b"active")), now_ms=T0)
        return plog

    def observe(plog: PartitionLog) -> object:
        return contents(plog), plog.aborted_transactions(0, 10)

    check_a_crash_at_each_step_of_the_swap(tmp_path, monkeypatch, build, observe)
    cleaned = build(tmp_path / "cleaned")
    clean(cleaned, T0)
    assert cleaned.aborted_transactions(0, 10) == [(7, 0)]  # the marker and its entry stay after the pass
