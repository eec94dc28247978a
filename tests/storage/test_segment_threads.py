"""Segment's thread-safety contract: flush (fsync) in a worker thread while the event loop changes the log."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.segment import Segment
from protocol.records import BatchHeader, Record, assign_offsets, build_batch
from tests.storage.threads import run_in_thread

T0 = 1_700_000_000_000


def batch(count: int = 1) -> bytearray:
    records = [Record(offset_delta=i, timestamp_delta=0, key=None, value=b"x" * 50) for i in range(count)]
    return bytearray(build_batch(records, base_timestamp=T0))


def numbered(offset: int) -> tuple[bytearray, BatchHeader]:
    data = batch()
    assign_offsets(data, offset, partition_leader_epoch=0)
    return data, BatchHeader.parse(data)


class BlockedFsync:
    """Replaces os.fsync: a worker thread's fsync waits until released, so the test can act meanwhile.

    The test's own thread (the "event loop") fsyncs without waiting, as for metadata files.
    """

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.synced_fds: list[int] = []
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        if threading.current_thread() is threading.main_thread():
            self._real(fd)
            return
        self.entered.set()
        assert self.release.wait(10)
        os.fstat(fd)  # raises EBADF if the descriptor was closed under the fsync
        self.synced_fds.append(fd)
        self._real(fd)


@pytest.fixture
def blocked_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[BlockedFsync]:
    blocker = BlockedFsync()
    monkeypatch.setattr(os, "fsync", blocker)
    yield blocker
    blocker.release.set()


def test_bytes_written_during_an_fsync_stay_dirty(tmp_path: Path, blocked_fsync: BlockedFsync) -> None:
    segment = Segment(tmp_path, 0, 4096, T0)
    segment.append(*numbered(0))
    thread, errors = run_in_thread(segment.fsync)
    assert blocked_fsync.entered.wait(10)
    segment.append(*numbered(1))  # written after the fsync read the generation
    blocked_fsync.release.set()
    thread.join(10)
    assert errors == []
    assert segment.dirty  # the second batch may not be on disk yet
    assert segment.fsync() is True
    assert not segment.dirty
    segment.close()


def test_close_during_an_fsync_is_finished_by_the_fsync(tmp_path: Path, blocked_fsync: BlockedFsync) -> None:
    segment = Segment(tmp_path, 0, 4096, T0)
    segment.append(*numbered(0))
    fd = segment._fd
    thread, errors = run_in_thread(segment.fsync)
    assert blocked_fsync.entered.wait(10)
    segment.close()
    os.fstat(fd)  # still open: the fsync is using it
    assert segment.closed
    blocked_fsync.release.set()
    thread.join(10)
    assert errors == [] and blocked_fsync.synced_fds == [fd]
    assert segment._fd == -1
    with pytest.raises(OSError):
        os.fstat(fd)
    assert segment.fsync() is True  # a closed segment has nothing left to sync
    assert blocked_fsync.synced_fds == [fd]


def test_flush_counts_only_messages_appended_before_it(tmp_path: Path, blocked_fsync: BlockedFsync) -> None:
    plog = PartitionLog("t", 0, tmp_path, LogConfig(flush_messages=5, flush_ms=1000), clean=True)
    plog.append(batch(3), now_ms=T0)
    thread, errors = run_in_thread(plog.flush)
    assert blocked_fsync.entered.wait(10)
    plog.append(batch(4), now_ms=T0)  # while the flush runs
    blocked_fsync.release.set()
    thread.join(10)
    assert errors == []
    # The 3 messages before the flush are flushed; the 4 after are not forgotten.
    assert not plog.needs_flush
    plog.append(batch(1), now_ms=T0)
    assert plog.needs_flush
    assert plog.flush_due(T0 + 10**15)
    plog.flush()
    assert not plog.needs_flush and not plog.flush_due(T0 + 10**15)
    assert not any(s.dirty for s in plog.segments)


def test_flush_in_a_thread_racing_appends_rolls_truncation_and_deletion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync
    fsynced: list[int] = []

    def checked_fsync(fd: int) -> None:
        os.fstat(fd)  # EBADF here would be an fsync of a closed descriptor
        fsynced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", checked_fsync)
    size = len(batch())
    plog = PartitionLog("t", 0, tmp_path, LogConfig(segment_bytes=8 * size), clean=True)
    stop = threading.Event()

    def flush_forever() -> None:
        while not stop.is_set():
            plog.flush()

    thread, errors = run_in_thread(flush_forever)
    appended = 0
    try:
        for i in range(400):
            assert plog.append(batch(), now_ms=T0).error_code == 0
            appended += 1
            if i % 97 == 96:
                plog.truncate_to(plog.log_end_offset - 3)  # deletes the newest segment(s) or cuts one
                appended -= 3
            if i % 151 == 150:
                plog.delete_records(plog.log_end_offset - 5)  # deletes the oldest segments
    finally:
        stop.set()
        thread.join(30)
    assert errors == []
    assert not thread.is_alive()
    assert len(fsynced) > 0
    assert plog.log_end_offset == appended
    # Everything written since the thread's last flush is still counted; a last flush covers every byte.
    plog.flush()
    assert not plog.needs_flush and plog._unflushed_messages == 0
    assert not any(s.dirty for s in plog.segments)
    assert sum(s.size for s in plog.segments) == plog.size_bytes == (plog.log_end_offset - plog.log_start_offset) * size
