"""The bounded set of open segment files (kbroker/storage/descriptors.py): eviction order and capacity, a
descriptor in use by an fsync never closed, sendfile regions and unsynced writes surviving eviction, closed
segments never reopened, flushes in a worker thread racing evictions, and segments made off the event loop."""

from __future__ import annotations

import errno
import gc
import os
import resource
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.descriptors import MIN_CAPACITY, ClosedSegmentError, DescriptorCache, default_capacity
from kbroker.storage.segment import FileRegion, Segment
from protocol.records import BatchHeader, Record, assign_offsets, build_batch, decode_records, iter_batches
from tests.storage.threads import run_in_thread

T0 = 1_700_000_000_000


def batch(value: bytes = b"x" * 50, count: int = 1) -> bytearray:
    records = [Record(offset_delta=i, timestamp_delta=0, key=None, value=value) for i in range(count)]
    return bytearray(build_batch(records, base_timestamp=T0))


def numbered(offset: int, value: bytes = b"x" * 50) -> tuple[bytearray, BatchHeader]:
    data = batch(value)
    assign_offsets(data, offset, partition_leader_epoch=0)
    return data, BatchHeader.parse(data)


def segment_with(cache: DescriptorCache, directory: Path, base: int, value: bytes) -> tuple[Segment, bytes]:
    directory.mkdir(exist_ok=True)
    segment = Segment(directory, base, 4096, T0, descriptors=cache)
    data, header = numbered(base, value)
    segment.append(data, header)
    return segment, bytes(data)


def values_of(plog: PartitionLog) -> list[tuple[int, bytes | None]]:
    """Every record of the log as (offset, value), read through PartitionLog.read."""
    out: list[tuple[int, bytes | None]] = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        for header, view in iter_batches(plog.read(offset, 1 << 20).read_bytes()):
            out.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
            offset = header.last_offset + 1
    return out


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_the_least_recently_used_descriptor_is_evicted_and_reopened_on_use(tmp_path: Path) -> None:
    cache = DescriptorCache(3)
    a, a_bytes = segment_with(cache, tmp_path / "a", 0, b"a" * 40)
    b, b_bytes = segment_with(cache, tmp_path / "b", 0, b"b" * 40)
    c, c_bytes = segment_with(cache, tmp_path / "c", 0, b"c" * 40)
    assert cache.order() == [a, b, c] and cache.opens == 3 and cache.evictions == 0
    assert a.read(0, len(a_bytes)) == a_bytes  # a becomes the most recent
    assert cache.order() == [b, c, a]
    b_fd = b._fd
    d, d_bytes = segment_with(cache, tmp_path / "d", 0, b"d" * 40)
    assert cache.order() == [c, a, d] and len(cache) == 3 and cache.evictions == 1
    assert b._fd == -1 and not cache.holds(b)
    # b's descriptor number may have been reused by d's file: b must not read through it any more.
    assert b.read(0, len(b_bytes)) == b_bytes  # reopened, evicting c
    assert cache.order() == [a, d, b] and cache.opens == 5 and cache.evictions == 2
    assert c._fd == -1 and b._fd >= 0 and b_fd in (b._fd, d._fd) or not is_open(b_fd)
    # Appending to an evicted segment reopens it in append mode: the batch goes after the first.
    data, header = numbered(1, b"c" * 40)
    assert c.append(data, header) == len(c_bytes)
    assert c.read(0, c.size) == c_bytes + bytes(data)
    assert (tmp_path / "c" / c.log_path.name).read_bytes() == c_bytes + bytes(data)
    assert [s.read(0, s.size) for s in (a, d)] == [a_bytes, d_bytes]
    assert len(cache) == 3
    for segment in (a, b, c, d):
        segment.close()
    assert len(cache) == 0


def test_lookups_scans_and_regions_of_an_evicted_segment(tmp_path: Path) -> None:
    cache = DescriptorCache(1)
    first = Segment(tmp_path, 0, 1, T0, descriptors=cache)  # every batch indexed
    written = b""
    for offset in range(20):
        data, header = numbered(offset, b"%03d" % offset)
        first.append(data, header)
        written += bytes(data)
    other, _ = segment_with(cache, tmp_path / "other", 0, b"o")
    assert first._fd == -1
    region = first.region(0, len(written))  # reopened for the region, which holds a descriptor of its own
    assert first._fd >= 0 and other._fd == -1
    other.read(0, 10)  # evicts first again
    assert first._fd == -1
    assert bytes(region) == written
    with (tmp_path / "sent").open("wb") as target:
        assert os.sendfile(target.fileno(), region.fd, region.position, region.length) == len(written)
    assert (tmp_path / "sent").read_bytes() == written
    region.close()
    other.read(0, 10)
    position = first.position_of(13)
    other.read(0, 10)
    assert [s.header.base_offset for s in first.scan(position)] == list(range(13, 20))
    other.read(0, 10)
    found = first.batch_at(7)
    assert found is not None and BatchHeader.parse(found).base_offset == 7
    first.close()
    other.close()


def test_default_capacity_is_half_the_soft_open_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        assert default_capacity() == 128
        assert DescriptorCache().capacity == 128
        resource.setrlimit(resource.RLIMIT_NOFILE, (10, hard))
        assert default_capacity() == MIN_CAPACITY
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert DescriptorCache(5).capacity == 5
    with pytest.raises(ValueError, match="at least 1"):
        DescriptorCache(0)


class BlockedFsync:
    """Replaces os.fsync: a worker thread's fsync waits until released (the main thread's does not)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.synced: list[str] = []  # the file each worker fsync synced
        self._real = os.fsync

    def __call__(self, fd: int) -> None:
        if threading.current_thread() is threading.main_thread():
            self._real(fd)
            return
        self.entered.set()
        assert self.release.wait(10)
        self.synced.append(os.readlink(f"/proc/self/fd/{fd}"))  # EBADF (an error) if it was closed meanwhile
        self._real(fd)


@pytest.fixture
def blocked_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[BlockedFsync]:
    blocker = BlockedFsync()
    monkeypatch.setattr(os, "fsync", blocker)
    yield blocker
    blocker.release.set()


def test_a_descriptor_an_fsync_is_using_is_not_evicted(tmp_path: Path, blocked_fsync: BlockedFsync) -> None:
    cache = DescriptorCache(1)
    busy, _ = segment_with(cache, tmp_path / "busy", 0, b"b")
    busy_fd = busy._fd
    thread, errors = run_in_thread(busy.fsync)
    assert blocked_fsync.entered.wait(10)
    other, _ = segment_with(cache, tmp_path / "other", 0, b"o")  # the cache is full, and its only entry busy
    assert busy._fd == busy_fd and is_open(busy_fd)
    assert cache.order() == [busy, other] and cache.evictions == 0  # over capacity rather than closing it
    blocked_fsync.release.set()
    thread.join(10)
    assert errors == [] and blocked_fsync.synced == [str(busy.log_path)]
    assert not busy.dirty
    third, _ = segment_with(cache, tmp_path / "third", 0, b"t")  # back to capacity: both others go
    assert cache.order() == [third] and busy._fd == -1 and other._fd == -1
    for segment in (busy, other, third):
        segment.close()


def test_an_evicted_dirty_segment_still_owes_its_fsync(tmp_path: Path, blocked_fsync: BlockedFsync) -> None:
    cache = DescriptorCache(1)
    dirty, dirty_bytes = segment_with(cache, tmp_path / "dirty", 0, b"d")
    assert dirty.dirty
    other, _ = segment_with(cache, tmp_path / "other", 0, b"o")
    assert dirty._fd == -1 and dirty.dirty  # closed, the fsync still owed
    thread, errors = run_in_thread(dirty.fsync)  # a flush in a worker: the file is opened for it
    assert blocked_fsync.entered.wait(10)
    assert dirty._fd == -1 and cache.order() == [other]  # the flush's descriptor is its own, not the cache's
    blocked_fsync.release.set()
    thread.join(10)
    assert errors == [] and blocked_fsync.synced == [str(dirty.log_path)]
    assert not dirty.dirty
    assert dirty.log_path.read_bytes() == dirty_bytes
    blocked_fsync.synced.clear()
    thread, errors = run_in_thread(dirty.fsync)  # clean and evicted: nothing to open, nothing to sync
    thread.join(10)
    assert errors == [] and blocked_fsync.synced == []
    for segment in (dirty, other):
        segment.close()


def test_a_closed_or_deleted_segment_is_never_reopened(tmp_path: Path) -> None:
    cache = DescriptorCache(1)
    deleted, deleted_bytes = segment_with(cache, tmp_path / "deleted", 0, b"x")
    other, _ = segment_with(cache, tmp_path / "other", 0, b"o")
    assert deleted._fd == -1
    deleted.delete()
    for read in (lambda: deleted.read(0, 10), lambda: deleted.region(0, 10), lambda: deleted.scan(0).__next__()):
        with pytest.raises(ClosedSegmentError) as refused:
            read()
        assert refused.value.errno == errno.EBADF and refused.value.filename == str(deleted.log_path)
    data, header = numbered(1)
    with pytest.raises(ClosedSegmentError):
        deleted.append(data, header)
    assert not deleted.log_path.exists()  # not resurrected
    assert deleted.fsync() is True and cache.order() == [other]
    # Closed while holding its descriptor: refused too, and the file stays as it was.
    other.close()
    with pytest.raises(ClosedSegmentError):
        other.read(0, 10)
    assert len(cache) == 0
    # A segment's file removed behind its back (not through it) is not re-created by a reopen either.
    lost, _ = segment_with(cache, tmp_path / "lost", 0, b"l")
    evictor, _ = segment_with(cache, tmp_path / "evictor", 0, b"e")
    lost.log_path.unlink()
    with pytest.raises(FileNotFoundError):
        lost.read(0, 10)
    assert not lost.log_path.exists()
    assert len(deleted_bytes) > 0
    lost.close()
    evictor.close()


def test_a_renamed_segment_reopens_under_its_new_name(tmp_path: Path) -> None:
    cache = DescriptorCache(1)
    swapped = Segment(tmp_path, 0, 4096, T0, ".cleaned", cache)
    data, header = numbered(0)
    swapped.append(data, header)
    other, _ = segment_with(cache, tmp_path / "other", 0, b"o")
    swapped.rename_suffix("")
    assert swapped.log_path == tmp_path / "00000000000000000000.log"
    assert swapped.read(0, swapped.size) == bytes(data)
    assert swapped.fsync() is True and not swapped.dirty
    swapped.close()
    other.close()


def test_out_of_descriptors_on_reopen_gives_one_back_and_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = DescriptorCache(3)
    a, a_bytes = segment_with(cache, tmp_path / "a", 0, b"a")
    b, _ = segment_with(cache, tmp_path / "b", 0, b"b")
    c, _ = segment_with(cache, tmp_path / "c", 0, b"c")
    cache._make_room(c, 1)  # as if a had been evicted earlier
    cache._lru.pop(a, None)
    assert a._fd == -1 and cache.order() == [b, c]
    real_open = os.open
    failures = [OSError(errno.EMFILE, "Too many open files")]

    def open_failing_once(path: object, flags: int, *args: int) -> int:
        if failures:  # sockets took every descriptor left
            raise failures.pop()
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_failing_once)
    assert a.read(0, len(a_bytes)) == a_bytes  # b was given back, then the open retried
    assert cache.order() == [c, a] and b._fd == -1
    failures.extend([OSError(errno.EMFILE, "Too many open files")] * 3)
    cache2 = DescriptorCache(1)
    with pytest.raises(OSError) as failed:  # nothing of its own to give back: the error stands
        Segment(tmp_path / "a", 99, 4096, T0, descriptors=cache2)
    assert failed.value.errno == errno.EMFILE
    for segment in (a, b, c):
        segment.close()


def test_segments_made_off_the_owner_thread_hold_no_descriptor(tmp_path: Path) -> None:
    cache = DescriptorCache(2)
    seed = PartitionLog("t", 0, tmp_path / "t-0", LogConfig(), clean=True, descriptors=cache)
    for value in (b"one", b"two"):
        assert seed.append(batch(value), now_ms=T0).error_code == 0
    seed.close()
    built: list[PartitionLog] = []
    read_in_worker: list[tuple[int, bytes | None]] = []
    opened_before = cache.opens

    def build() -> None:  # as LogManager.build_partitions does, in a worker thread
        built.append(PartitionLog("t", 0, tmp_path / "t-0", LogConfig(), clean=True, descriptors=cache))
        built.append(PartitionLog("t", 1, tmp_path / "t-1", LogConfig(), clean=True, descriptors=cache))
        read_in_worker.extend(values_of(built[0]))

    thread, errors = run_in_thread(build)
    thread.join(30)
    assert errors == [] and read_in_worker == [(0, b"one"), (1, b"two")]
    existing, new = built[0], built[1]
    assert cache.opens == opened_before and len(cache) == 0  # read with descriptors of the worker's own
    assert [s._fd for s in existing.segments + new.segments] == [-1, -1]
    assert new.append(batch(b"three"), now_ms=T0).error_code == 0  # the event loop opens it through the cache
    assert existing.append(batch(b"four"), now_ms=T0).error_code == 0
    assert values_of(existing) == [(0, b"one"), (1, b"two"), (2, b"four")]
    assert values_of(new) == [(0, b"three")]
    assert cache.order() == [existing.active, new.active]  # new was read last
    existing.close()
    new.close()


def test_flushes_in_a_thread_racing_evictions_lose_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync = os.fsync
    synced: list[str] = []

    def checked_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")  # EBADF here: an fsync of a closed descriptor
        if threading.current_thread() is not threading.main_thread():
            synced.append(path)  # the flushes' (the main thread also syncs index and metadata files)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", checked_fsync)
    cache = DescriptorCache(2)
    size = len(batch())
    logs = [
        PartitionLog("t", p, tmp_path / f"t-{p}", LogConfig(segment_bytes=6 * size), clean=True, descriptors=cache)
        for p in range(5)
    ]
    stop = threading.Event()

    def flush_forever() -> None:
        while not stop.is_set():
            for plog in logs:
                plog.flush()

    thread, errors = run_in_thread(flush_forever)
    try:
        for i in range(300):
            plog = logs[(i * 7) % 5]
            assert plog.append(batch(b"%05d" % i), now_ms=T0).error_code == 0
            if i % 11 == 0:
                reader = logs[(i * 3) % 5]
                reader.read(reader.log_start_offset, 1 << 20)  # reopens an evicted segment
    finally:
        stop.set()
        thread.join(30)
    assert errors == [] and not thread.is_alive()
    assert len(cache) <= 2 and cache.evictions > 100
    assert synced and all(path.endswith(".log") and "/t-" in path for path in synced)
    for plog in logs:
        plog.flush()
        assert not any(s.dirty for s in plog.segments)
    for p, plog in enumerate(logs):  # partition p got the appends i with (i * 7) % 5 == p, in order
        expected = [b"%05d" % i for i in range(300) if (i * 7) % 5 == p]
        assert values_of(plog) == list(enumerate(expected))
        plog.close()
    for p in range(5):  # what was written is in the files, in order
        reopened = PartitionLog("t", p, tmp_path / f"t-{p}", LogConfig(segment_bytes=6 * size), clean=False)
        assert reopened.log_end_offset == 60
        reopened.close()


def test_regions_beyond_their_descriptor_budget_are_read_into_memory(tmp_path: Path) -> None:
    cache = DescriptorCache(8)
    assert cache.region_budget == 2
    segments = [segment_with(cache, tmp_path / str(n), 0, b"%d" % n * 30) for n in range(4)]
    regions = [segment.region(0, len(data)) for segment, data in segments]
    assert [type(r).__name__ for r in regions] == ["FileRegion", "FileRegion", "bytes", "bytes"]
    assert [bytes(r) for r in regions] == [data for _, data in segments]
    first = regions[0]
    assert isinstance(first, FileRegion)
    first.close()  # its descriptor is given back: the next read is a region again
    again = segments[3][0].region(0, 10)
    assert isinstance(again, FileRegion) and cache.regions_exhausted
    del regions, again  # closed by garbage collection: given back too
    gc.collect()
    assert not cache.regions_exhausted
    assert isinstance(segments[2][0].region(0, 10), FileRegion)
    for segment, _ in segments:
        segment.close()
