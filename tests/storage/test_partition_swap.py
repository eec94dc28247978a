"""Segment swaps (the log cleaner's and recompression's way in): results, in-flight regions, crash recovery."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.segment import FileRegion, Segment
from protocol.records import BatchHeader, Record, build_batch, decode_records, iter_batches
from tests.storage.reading import stored_records

T0 = 1_700_000_000_000


def batch(value: bytes, count: int = 2) -> bytearray:
    records = [Record(offset_delta=i, timestamp_delta=i, key=b"k", value=value) for i in range(count)]
    return bytearray(build_batch(records, base_timestamp=T0))


BATCH_SIZE = len(batch(b"v0"))
CONFIG = LogConfig(segment_bytes=3 * BATCH_SIZE)


def open_log(path: Path, clean: bool = True) -> PartitionLog:
    return PartitionLog("t", 0, path, CONFIG, clean=clean)


def records_of(plog: PartitionLog) -> list[tuple[int, bytes | None]]:
    return [(header.base_offset + record.offset_delta, record.value) for header, record in stored_records(plog)]


def filled_log(path: Path) -> PartitionLog:
    """Offsets 0..19 in batches of two, three batches a segment: [0..5] [6..11] [12..17] [18..19]."""
    plog = open_log(path)
    for i in range(10):
        plog.append(batch(f"v{i}".encode()), now_ms=T0)
    assert [s.base_offset for s in plog.segments] == [0, 6, 12, 18]
    return plog


def batches_of(segment: Segment) -> Iterator[tuple[bytes, BatchHeader]]:
    for scanned in segment.scan():
        yield segment.read(scanned.position, scanned.header.size), scanned.header


def clean_into(plog: PartitionLog, sources: list[Segment], keep: Callable[[BatchHeader], bool]) -> Segment:
    """A replacement holding the kept batches of ``sources``, as the log cleaner would write it."""
    cleaned = plog.new_cleaned_segment(sources[0].base_offset)
    for source in sources:
        for data, header in batches_of(source):
            if keep(header):
                cleaned.append(data, header)
    return cleaned


def swap_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.endswith((".cleaned", ".swap")))


def test_swap_keeps_offsets_and_the_result_is_readable(tmp_path: Path) -> None:
    plog = filled_log(tmp_path)
    before = records_of(plog)
    replaced = plog.segments[0:2]
    merged = clean_into(plog, replaced, lambda h: True)
    assert merged.log_path.name == "00000000000000000000.log.cleaned"
    plog.swap_segments(replaced, [merged])
    assert [(s.base_offset, s.next_offset) for s in plog.segments] == [(0, 12), (12, 18), (18, 20)]
    assert records_of(plog) == before
    assert plog.read(7, 1 << 20).last_offset == 17 - 6  # offsets 6..11 now live in the merged segment
    assert sorted(p.name for p in tmp_path.glob("*.log")) == [
        "00000000000000000000.log",
        "00000000000000000012.log",
        "00000000000000000018.log",
    ]
    assert swap_files(tmp_path) == []
    assert plog.append(batch(b"after"), now_ms=T0).base_offset == 20
    plog.close()
    reopened = open_log(tmp_path)
    assert records_of(reopened) == [*before, (20, b"after"), (21, b"after")]


def test_compacted_replacement_leaves_gaps_that_reads_skip(tmp_path: Path) -> None:
    plog = filled_log(tmp_path)
    replaced = plog.segments[0:2]
    kept = clean_into(plog, replaced, lambda h: h.base_offset in (2, 8))
    plog.swap_segments(replaced, [kept])
    values = records_of(plog)
    assert values[:4] == [(2, b"v1"), (3, b"v1"), (8, b"v4"), (9, b"v4")]
    assert [o for o, _ in values[4:]] == list(range(12, 20))
    assert [o for o, _ in iter_offsets(plog.read(0, 1 << 20).read_bytes())] == [2, 3, 8, 9]
    assert [o for o, _ in iter_offsets(plog.read(5, 1 << 20).read_bytes())] == [8, 9]


def iter_offsets(data: bytes) -> list[tuple[int, bytes | None]]:
    return [(h.base_offset + r.offset_delta, r.value) for h, view in iter_batches(data) for r in decode_records(view)]


@pytest.mark.parametrize(
    ("replaced_slice", "problem"),
    [
        ((2, 4), "active segment"),
        ((0, 0), "nothing to replace"),
    ],
)
def test_swap_refuses_the_active_segment_and_empty_lists(
    tmp_path: Path, replaced_slice: tuple[int, int], problem: str
) -> None:
    plog = filled_log(tmp_path)
    replaced = plog.segments[replaced_slice[0] : replaced_slice[1]]
    replacement = clean_into(plog, plog.segments[0:1], lambda h: True)
    with pytest.raises(ValueError, match=problem):
        plog.swap_segments(replaced, [replacement])


def test_swap_refuses_segments_that_are_not_contiguous_or_replacements_that_overrun(tmp_path: Path) -> None:
    plog = filled_log(tmp_path)
    first, _, third = plog.segments[0:3]
    replacement = clean_into(plog, [first], lambda h: True)
    with pytest.raises(ValueError, match="contiguous"):
        plog.swap_segments([first, third], [replacement])
    replacement.delete()
    too_much = clean_into(plog, plog.segments[0:2], lambda h: True)
    with pytest.raises(ValueError, match="beyond the replaced segments"):
        plog.swap_segments([first], [too_much])
    assert records_of(plog)[0] == (0, b"v0")


def test_a_region_taken_before_the_swap_still_reads_the_old_bytes(tmp_path: Path) -> None:
    plog = filled_log(tmp_path)
    chunk = plog.read(0, 1 << 20)
    region = chunk.region()
    assert isinstance(region, FileRegion)
    old_bytes = chunk.read_bytes()
    assert len(old_bytes) == region.length == 3 * BATCH_SIZE
    replaced = plog.segments[0:2]
    plog.swap_segments(replaced, [clean_into(plog, replaced, lambda h: h.base_offset >= 4)])
    assert not (tmp_path / "00000000000000000006.log").exists()
    assert plog.read(0, 1 << 20).read_bytes() != old_bytes
    # The region's own descriptor still reaches the replaced (now unlinked) file.
    assert os.pread(region.fd, region.length, region.position) == old_bytes
    sender, receiver = socket.socketpair()
    try:
        sent = 0
        while sent < region.length:
            sent += os.sendfile(sender.fileno(), region.fd, region.position + sent, region.length - sent)
        received = b""
        while len(received) < region.length:
            received += receiver.recv(region.length - len(received))
    finally:
        sender.close()
        receiver.close()
        region.close()
    assert received == old_bytes


# --- crash recovery -------------------------------------------------------------------------------------


class Crash(Exception):
    """The process 'dies' here: the files stay exactly as the operations so far left them."""


def crash_after(monkeypatch: pytest.MonkeyPatch, operations: int) -> None:
    """Make the ``operations``+1-th rename or unlink raise, as if the broker died just before it."""
    done = [0]
    real_replace, real_unlink = os.replace, os.unlink

    def counted(real: Callable[..., None]) -> Callable[..., None]:
        def operation(*args: object, **kwargs: object) -> None:
            if done[0] == operations:
                raise Crash
            done[0] += 1
            real(*args, **kwargs)

        return operation

    monkeypatch.setattr(os, "replace", counted(real_replace))
    monkeypatch.setattr(os, "unlink", counted(real_unlink))


def test_a_crash_at_any_step_of_a_swap_leaves_the_old_or_the_new_segments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two replacements for three segments, dropping some batches, so old and new differ.
    def keep(header: BatchHeader) -> bool:
        return header.base_offset not in (2, 8, 14)

    reference = tmp_path / "reference"
    plog = filled_log(reference)
    old = records_of(plog)
    new = [(o, v) for o, v in old if o not in (2, 3, 8, 9, 14, 15)]
    outcomes: list[str] = []
    for operations in range(200):
        directory = tmp_path / f"crash-{operations}"
        plog = filled_log(directory)
        first, second, third = plog.segments[0:3]
        replacements = [clean_into(plog, [first, second], keep), clean_into(plog, [third], keep)]
        with monkeypatch.context() as patch:
            crash_after(patch, operations)
            try:
                plog.swap_segments([first, second, third], replacements)
                crashed = False
            except Crash:
                crashed = True
        plog.delete()  # only closes descriptors: what a dead process leaves is the files
        for segment in replacements:
            segment.close()
        reopened = open_log(directory, clean=False)
        got = records_of(reopened)
        assert got in (old, new), f"crash after {operations} operations"
        assert swap_files(directory) == []
        # Recovery is final: another restart sees the same.
        reopened.close()
        assert records_of(open_log(directory, clean=False)) == got
        outcomes.append("old" if got == old else "new")
        if not crashed:
            break
    else:
        pytest.fail("the swap never completed")
    # Crashes before the commit keep the old segments, after it the new ones; both happen.
    first_new = outcomes.index("new")
    assert outcomes[:first_new] == ["old"] * first_new and outcomes[first_new:] == ["new"] * (len(outcomes) - first_new)
    assert first_new > 1 and len(outcomes) - first_new > 2


def test_leftover_cleaned_files_are_deleted_on_open(tmp_path: Path) -> None:
    plog = filled_log(tmp_path)
    old = records_of(plog)
    replacement = clean_into(plog, plog.segments[0:2], lambda h: h.base_offset > 4)
    replacement.write_indexes()
    plog.delete()
    replacement.close()
    assert swap_files(tmp_path) == [
        "00000000000000000000.index.cleaned",
        "00000000000000000000.log.cleaned",
        "00000000000000000000.timeindex.cleaned",
    ]
    reopened = open_log(tmp_path, clean=False)
    assert records_of(reopened) == old and swap_files(tmp_path) == []


def test_leftover_swap_files_are_completed_on_open(tmp_path: Path) -> None:
    plog = filled_log(tmp_path)
    old = records_of(plog)
    replacement = clean_into(plog, plog.segments[0:2], lambda h: h.base_offset != 6)
    replacement.write_indexes()
    replacement.rename_suffix(".swap")  # renamed, and then the broker died before deleting the old ones
    plog.delete()
    replacement.close()
    reopened = open_log(tmp_path, clean=False)
    assert records_of(reopened) == [(o, v) for o, v in old if o not in (6, 7)]
    assert [(s.base_offset, s.next_offset) for s in reopened.segments] == [(0, 12), (12, 18), (18, 20)]
    assert swap_files(tmp_path) == [] and not (tmp_path / "00000000000000000006.log").exists()
    assert (tmp_path / "00000000000000000000.index").exists()
