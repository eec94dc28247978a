"""Transactions on the partition side: transactional batches, commit/abort markers, the last stable offset and
the aborted transaction index, over both backends (the contract cases) and across restarts of a file-backed log
(clean, and unclean as after kill -9: rebuilt from the control batches and the producer snapshots)."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.api import PartitionEvent
from kbroker.storage.memory import MemoryBackend
from kbroker.storage.producer_state import ProducerStateTable
from kbroker.storage.txn_index import AbortedTxn, txn_index_path
from protocol.errors import ErrorCode
from protocol.records import (
    BatchHeader,
    Record,
    build_batch,
    build_control_batch,
    compute_crc,
    decode_records,
    iter_batches,
)

T0 = 1_700_000_000_000
EVERYTHING = 1 << 20
P1, P2, P3 = 1000, 2000, 3000
COORDINATOR_EPOCH = 5

LogFactory = Callable[..., PartitionLog]


@pytest.fixture(params=["file", "memory"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    def make(**config: int | str) -> PartitionLog:
        settings = LogConfig(**config)  # type: ignore[arg-type]
        if request.param == "file":
            return PartitionLog("t", 0, tmp_path / "t-0", settings, clean=True)
        return PartitionLog("t", 0, Path("t-0"), settings, clean=True, backend=MemoryBackend(Path("t-0")))

    return make


def txn_batch(values: list[bytes], producer_id: int, sequence: int, *, epoch: int = 0, txn: bool = True) -> bytearray:
    records = [Record(offset_delta=i, timestamp_delta=i, key=None, value=v) for i, v in enumerate(values)]
    return bytearray(
        build_batch(
            records,
            base_timestamp=T0,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=sequence,
            is_transactional=txn,
        )
    )


def plain(values: list[bytes], timestamp: int = T0) -> bytearray:
    records = [Record(offset_delta=i, timestamp_delta=0, key=None, value=v) for i, v in enumerate(values)]
    return bytearray(build_batch(records, base_timestamp=timestamp))


def append(plog: PartitionLog, data: bytearray) -> int:
    result = plog.append(data, now_ms=T0)
    assert result.error_code == ErrorCode.NONE, result.error_message
    return result.base_offset


def marker(plog: PartitionLog, producer_id: int, commit: bool, *, epoch: int = 0) -> int:
    result = plog.append_marker(producer_id, epoch, commit, COORDINATOR_EPOCH, T0)
    assert result.error_code == ErrorCode.NONE, result.error_message
    return result.base_offset


def offsets(plog: PartitionLog) -> tuple[int, int, int]:
    return plog.log_end_offset, plog.high_watermark, plog.last_stable_offset


def committed_view(plog: PartitionLog, start: int = 0) -> list[bytes | None]:
    """What a read_committed consumer keeps: records below the last stable offset, without aborted ones and
    control batches (the client's filtering, from the aborted list the log gives)."""
    chunk = plog.read(start, EVERYTHING, max_offset=plog.last_stable_offset)
    aborted = {pid: first for pid, first in plog.aborted_transactions(start, chunk.last_offset + 1)}
    dropping: set[int] = set()
    out: list[bytes | None] = []
    for header, view in iter_batches(chunk.read_bytes()):
        pid = header.producer_id
        if pid in aborted and aborted[pid] <= header.base_offset:
            dropping.add(pid)
            del aborted[pid]
        if header.is_control:
            dropping.discard(pid)
            continue
        if pid in dropping:
            continue
        out.extend(r.value for r in decode_records(view))
    return out


def interleaved(plog: PartitionLog) -> None:
    """P1 txn 0..1, plain 2, P2 txn 3..4, P1 5 | P1 commits at 6, P2 aborts at 7, plain 8."""
    assert append(plog, txn_batch([b"p1-a", b"p1-b"], P1, 0)) == 0
    assert append(plog, plain([b"plain-1"])) == 2
    assert append(plog, txn_batch([b"p2-a", b"p2-b"], P2, 0)) == 3
    assert append(plog, txn_batch([b"p1-c"], P1, 2)) == 5
    assert offsets(plog) == (6, 6, 0)
    assert plog.ongoing_transactions() == {P1: 0, P2: 3}
    assert marker(plog, P1, commit=True) == 6
    assert offsets(plog) == (7, 7, 3)
    assert plog.ongoing_transactions() == {P2: 3}
    assert marker(plog, P2, commit=False) == 7
    assert offsets(plog) == (8, 8, 8)
    assert append(plog, plain([b"plain-2"])) == 8


# --- contract: both engines ------------------------------------------------------------------------------


def test_last_stable_offset_with_interleaved_transactional_producers(make_log: LogFactory) -> None:
    plog = make_log()
    interleaved(plog)
    assert plog.ongoing_transactions() == {}
    assert plog.aborted_transactions(0, 9) == [(P2, 3)]
    assert committed_view(plog) == [b"p1-a", b"p1-b", b"plain-1", b"p1-c", b"plain-2"]


def test_reads_stop_at_the_first_open_transaction(make_log: LogFactory) -> None:
    plog = make_log()
    append(plog, plain([b"a", b"b"]))
    append(plog, txn_batch([b"t"], P1, 0))
    append(plog, plain([b"c"]))
    assert offsets(plog) == (4, 4, 2)
    chunk = plog.read(0, EVERYTHING, max_offset=plog.last_stable_offset)
    assert [h.base_offset for h, _ in iter_batches(chunk.read_bytes())] == [0]
    assert chunk.last_offset == 1
    assert plog.read(2, EVERYTHING, max_offset=plog.last_stable_offset).size == 0
    marker(plog, P1, commit=True)
    assert offsets(plog) == (5, 5, 5)
    assert committed_view(plog) == [b"a", b"b", b"t", b"c"]


def test_markers_are_written_as_kafka_writes_them(make_log: LogFactory) -> None:
    plog = make_log()
    append(plog, txn_batch([b"x"], P1, 0, epoch=3))
    assert marker(plog, P1, commit=False, epoch=3) == 1
    plog.append_marker(P1, 3, True, COORDINATOR_EPOCH, T0 + 7)
    data = plog.read(1, EVERYTHING).read_bytes()
    batches = list(iter_batches(data))
    assert len(batches) == 2
    for (header, view), (kind, base, ts) in zip(batches, [(0, 1, T0), (1, 2, T0 + 7)], strict=True):
        assert header.attributes == 0x30  # control and transactional
        assert (header.producer_id, header.producer_epoch, header.base_sequence) == (P1, 3, -1)
        assert (header.base_offset, header.records_count, header.max_timestamp) == (base, 1, ts)
        (record,) = decode_records(view)
        assert record.key == struct.pack(">hh", 0, kind)
        assert record.value == struct.pack(">hi", 0, COORDINATOR_EPOCH)
        expected = bytearray(build_control_batch(P1, 3, kind == 1, COORDINATOR_EPOCH, base, ts))
        struct.pack_into(">i", expected, 12, 0)  # the partition leader epoch the log stamps
        struct.pack_into(">I", expected, 17, compute_crc(expected))
        assert bytes(view) == bytes(expected)


def test_marker_checks(make_log: LogFactory) -> None:
    plog = make_log()
    append(plog, txn_batch([b"x"], P1, 0, epoch=2))
    older = plog.append_marker(P1, 1, True, COORDINATOR_EPOCH, T0)
    assert older.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    same_tv2 = plog.append_marker(P1, 2, True, COORDINATOR_EPOCH, T0, transaction_version=2)
    assert same_tv2.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert offsets(plog) == (1, 1, 0)  # nothing written
    assert marker(plog, P1, commit=True, epoch=2) == 1
    fenced = plog.append_marker(P1, 2, False, COORDINATOR_EPOCH - 1, T0)
    assert fenced.error_code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    # TV2: the coordinator bumped the epoch; the marker carries the new one and the next transaction uses it.
    append(plog, txn_batch([b"y"], P1, 1, epoch=2))
    bumped = plog.append_marker(P1, 3, False, COORDINATOR_EPOCH, T0, transaction_version=2)
    assert (bumped.error_code, bumped.base_offset) == (ErrorCode.NONE, 3)
    assert plog.aborted_transactions(0, 4) == [(P1, 2)]
    assert append(plog, txn_batch([b"z"], P1, 0, epoch=3)) == 4
    # A marker for a producer with no open transaction here is written, and changes no index.
    assert marker(plog, P3, commit=False) == 5
    assert plog.aborted_transactions(0, 6) == [(P1, 2)]
    assert plog.ongoing_transactions() == {P1: 4}


def test_a_plain_batch_inside_an_open_transaction_is_invalid_txn_state(make_log: LogFactory) -> None:
    plog = make_log()
    append(plog, txn_batch([b"x"], P1, 0))
    refused = plog.append(txn_batch([b"y"], P1, 1, txn=False), now_ms=T0)
    assert refused.error_code == ErrorCode.INVALID_TXN_STATE
    assert plog.log_end_offset == 1
    marker(plog, P1, commit=True)
    assert append(plog, txn_batch([b"y"], P1, 1, txn=False)) == 2  # idempotent again once it ended


def test_duplicates_of_transactional_batches_are_answered_with_the_first_offsets(make_log: LogFactory) -> None:
    plog = make_log()
    append(plog, txn_batch([b"a", b"b"], P1, 0))
    again = plog.append(txn_batch([b"a", b"b"], P1, 0), now_ms=T0)
    assert (again.error_code, again.base_offset, plog.log_end_offset) == (ErrorCode.NONE, 0, 2)


def test_stable_offset_events(make_log: LogFactory) -> None:
    plog = make_log()
    events: list[PartitionEvent] = []
    plog.subscribe(events.append)
    append(plog, txn_batch([b"x"], P1, 0))
    assert events == [PartitionEvent.APPENDED | PartitionEvent.HIGH_WATERMARK]  # the stable offset stays at 0
    marker(plog, P1, commit=False)
    assert events[-1] == PartitionEvent.APPENDED | PartitionEvent.HIGH_WATERMARK | PartitionEvent.STABLE_OFFSET
    assert plog.last_stable_offset == 2


def test_stable_offset_waits_for_the_high_watermark_to_pass_the_marker(make_log: LogFactory) -> None:
    plog = make_log()
    plog.high_watermark_follows_appends = False
    append(plog, plain([b"a"]))
    append(plog, txn_batch([b"t"], P1, 0))
    assert plog.update_high_watermark(2)
    assert offsets(plog) == (2, 2, 1)
    events: list[PartitionEvent] = []
    plog.subscribe(events.append)
    marker(plog, P1, commit=True)
    # As Kafka's unreplicated transactions: stable only once the high watermark has passed its marker.
    assert offsets(plog) == (3, 2, 1)
    assert events == [PartitionEvent.APPENDED]
    assert plog.update_high_watermark(3)
    assert offsets(plog) == (3, 3, 3)
    assert events[-1] == PartitionEvent.HIGH_WATERMARK | PartitionEvent.STABLE_OFFSET


def test_aborted_transactions_follow_kafkas_overlap_rule(make_log: LogFactory) -> None:
    plog = make_log()
    # P1 0..1 and P2 2 open together; P1 aborts at 3 (P2 still open: last stable 2), P2 aborts at 4 (5),
    # P3 5 aborts at 6 (7), a plain record at 7.
    append(plog, txn_batch([b"a", b"b"], P1, 0))
    append(plog, txn_batch([b"c"], P2, 0))
    marker(plog, P1, commit=False)
    marker(plog, P2, commit=False)
    append(plog, txn_batch([b"d"], P3, 0))
    marker(plog, P3, commit=False)
    append(plog, plain([b"e"]))
    assert plog.aborted_transactions(0, 8) == [(P1, 0), (P2, 2), (P3, 5)]
    # P1's entry recorded a last stable offset of 2: nothing aborted later can start before 2, so the search
    # stops there (Kafka's rule).
    assert plog.aborted_transactions(0, 2) == [(P1, 0)]
    assert plog.aborted_transactions(4, 8) == [(P2, 2), (P3, 5)]
    assert plog.aborted_transactions(5, 6) == [(P3, 5)]
    assert plog.aborted_transactions(7, 8) == []
    assert committed_view(plog) == [b"e"]


def test_retention_deletes_segments_holding_an_open_transaction_and_their_aborted_entries(
    make_log: LogFactory,
) -> None:
    sizes = len(txn_batch([b"x"], P1, 0)) + len(build_control_batch(P1, 0, False, COORDINATOR_EPOCH))
    plog = make_log(segment_bytes=sizes, retention_ms=1000)
    append(plog, txn_batch([b"x"], P1, 0))  # 0
    marker(plog, P1, commit=False)  # 1
    append(plog, txn_batch([b"y"], P2, 0))  # 2: P2's transaction stays open
    append(plog, plain([b"z"]))  # 3
    append(plog, plain([b"w"], timestamp=T0 + 10_000))  # 4: a third segment, not expired
    assert [(s.base_offset, s.next_offset) for s in plog.segments] == [(0, 2), (2, 4), (4, 5)]  # type: ignore[attr-defined]
    assert plog.aborted_transactions(0, 5) == [(P1, 0)]
    assert offsets(plog) == (5, 5, 2)
    # Kafka deletes by the high watermark, not the stable offset: both sealed segments go.
    deleted = plog.apply_retention(T0 + 10_000)
    assert len(deleted) == 2
    assert plog.log_start_offset == 4
    assert plog.aborted_transactions(4, 5) == []
    assert plog.last_stable_offset == 4  # held at the log start by P2's transaction, as Kafka
    assert marker(plog, P2, commit=True) == 5
    assert plog.last_stable_offset == 6


def test_truncation_reopens_a_transaction_whose_marker_it_removed(make_log: LogFactory) -> None:
    plog = make_log()
    append(plog, txn_batch([b"x"], P1, 0))
    marker(plog, P1, commit=False)
    append(plog, plain([b"y"]))
    plog.truncate_to(1)
    assert offsets(plog) == (1, 1, 0)
    assert plog.ongoing_transactions() == {P1: 0}
    assert plog.aborted_transactions(0, 1) == []
    assert marker(plog, P1, commit=True) == 1
    assert offsets(plog) == (2, 2, 2)


def test_producers_view(make_log: LogFactory) -> None:
    plog = make_log()
    append(plog, txn_batch([b"x", b"y"], P1, 0, epoch=4))
    append(plog, txn_batch([b"z"], P2, 0, epoch=1))
    marker(plog, P2, commit=True, epoch=1)
    views = plog.producers_view()
    assert [(v.producer_id, v.producer_epoch, v.last_sequence, v.coordinator_epoch) for v in views] == [
        (P1, 4, 1, -1),
        (P2, 1, 0, COORDINATOR_EPOCH),
    ]
    assert [v.current_txn_start_offset for v in views] == [0, -1]


# --- file backend: files and restarts --------------------------------------------------------------------


def open_disk(path: Path, *, clean: bool, recovery_point: int = 0, **config: int | str) -> PartitionLog:
    return PartitionLog("t", 0, path, LogConfig(**config), clean=clean, recovery_point=recovery_point)  # type: ignore[arg-type]


def crash(plog: PartitionLog) -> None:
    """kill -9: the files stay as written, nothing of close() runs."""
    for segment in plog.segments:
        segment.close()


def several_segments(path: Path) -> PartitionLog:
    """Aborted transactions in three segments, one of them spanning a roll, and one transaction left open."""
    one = len(txn_batch([b"x"], P1, 0))
    plog = open_disk(path, clean=True, segment_bytes=one * 3)
    interleaved(plog)  # 0..8: P1 committed, P2 (3..4) aborted at 7
    append(plog, txn_batch([b"q"], P3, 0))  # 9
    append(plog, plain([b"r"]))  # 10
    marker(plog, P3, commit=False)  # 11
    append(plog, txn_batch([b"s"], P1, 3))  # 12: left open
    return plog


EXPECTED_ABORTED = [(P2, 3), (P3, 9)]


def test_txnindex_files_hold_kafkas_34_byte_entries(tmp_path: Path) -> None:
    plog = several_segments(tmp_path)
    by_segment = {
        s.base_offset: txn_index_path(tmp_path, s.base_offset).read_bytes()
        for s in plog.segments[:-1]
        if txn_index_path(tmp_path, s.base_offset).exists()
    }
    entries = plog.aborted.entries
    assert entries == [AbortedTxn(P2, 3, 7, 8), AbortedTxn(P3, 9, 11, 12)]
    expected_files = {}
    for entry in entries:
        base = max(s.base_offset for s in plog.segments if s.base_offset <= entry.last_offset)
        if base != plog.active.base_offset:
            expected_files[base] = expected_files.get(base, b"") + struct.pack(
                ">hqqqq", 0, entry.producer_id, entry.first_offset, entry.last_offset, entry.last_stable_offset
            )
    assert by_segment == expected_files
    assert by_segment  # at least one sealed segment holds an abort


def test_clean_restart_keeps_the_index_the_open_transaction_and_the_stable_offset(tmp_path: Path) -> None:
    plog = several_segments(tmp_path)
    before = (offsets(plog), plog.aborted.entries, plog.ongoing_transactions())
    assert before[0] == (13, 13, 12)
    plog.close()
    reopened = open_disk(tmp_path, clean=True, segment_bytes=len(txn_batch([b"x"], P1, 0)) * 3)
    assert (offsets(reopened), reopened.aborted.entries, reopened.ongoing_transactions()) == before
    assert reopened.aborted_transactions(0, 13) == EXPECTED_ABORTED
    assert marker(reopened, P1, commit=True) == 13
    assert reopened.last_stable_offset == 14


@pytest.mark.parametrize("recovery_point", [0, 6, 12])
def test_unclean_restart_rebuilds_the_index_and_the_stable_offset(tmp_path: Path, recovery_point: int) -> None:
    plog = several_segments(tmp_path)
    entries, ongoing = plog.aborted.entries, plog.ongoing_transactions()
    crash(plog)
    for path in tmp_path.glob("*.txnindex"):  # what was not fsynced may be anything: rebuilt, not trusted
        if int(path.name.split(".")[0]) >= recovery_point:
            path.write_bytes(b"garbage")
    reopened = open_disk(
        tmp_path, clean=False, recovery_point=recovery_point, segment_bytes=len(txn_batch([b"x"], P1, 0)) * 3
    )
    assert offsets(reopened) == (13, 13, 12)
    assert reopened.aborted.entries == entries
    assert reopened.ongoing_transactions() == ongoing
    assert reopened.aborted_transactions(0, 13) == EXPECTED_ABORTED
    # And the rebuilt sealed segments' files are right again for the next start.
    reopened.close()
    again = open_disk(tmp_path, clean=True)
    assert again.aborted.entries == entries


def test_unclean_restart_without_snapshots_reads_the_whole_log(tmp_path: Path) -> None:
    plog = several_segments(tmp_path)
    entries = plog.aborted.entries
    crash(plog)
    for path in tmp_path.glob("*.snapshot"):
        path.unlink()
    for path in tmp_path.glob("*.txnindex"):
        path.unlink()
    reopened = open_disk(tmp_path, clean=False, recovery_point=0)
    assert (offsets(reopened), reopened.aborted.entries) == ((13, 13, 12), entries)
    assert reopened.ongoing_transactions() == {P1: 12}


def test_a_damaged_txnindex_below_the_recovery_point_is_rebuilt(tmp_path: Path) -> None:
    plog = several_segments(tmp_path)
    entries = plog.aborted.entries
    plog.close()
    damaged = sorted(p for p in tmp_path.glob("*.txnindex") if p.stat().st_size == 34)[0]
    damaged.write_bytes(damaged.read_bytes()[:-3])
    reopened = open_disk(tmp_path, clean=True)
    assert reopened.aborted.entries == entries
    assert damaged.stat().st_size == 34


def test_retention_deletes_the_txnindex_files_with_their_segments(tmp_path: Path) -> None:
    plog = several_segments(tmp_path)
    files_before = {p.name for p in tmp_path.glob("*.txnindex")}
    assert files_before
    plog.delete_records(plog.active.base_offset)
    assert list(tmp_path.glob("*.txnindex")) == []
    assert plog.aborted.entries == []  # both markers were in the deleted segments
    assert plog.aborted_transactions(plog.log_start_offset, plog.log_end_offset) == []


def test_producer_snapshot_round_trip_keeps_transactions(tmp_path: Path) -> None:
    table = ProducerStateTable()
    table.record(BatchHeader.parse(txn_batch_at(P1, 40, epoch=2)))
    table.record(BatchHeader.parse(txn_batch_at(P2, 41, epoch=0)))
    assert table.complete_txn(P2, 0, 9, T0) == 41
    table.write_snapshot(tmp_path, 50)
    loaded = ProducerStateTable.load_snapshot(tmp_path, 50)
    assert loaded.ongoing == {P1: 40}
    assert [(v.producer_id, v.coordinator_epoch, v.current_txn_start_offset) for v in loaded.views()] == [
        (P1, -1, 40),
        (P2, 9, -1),
    ]


def test_a_producer_with_an_open_transaction_never_expires() -> None:
    table = ProducerStateTable()
    table.record(BatchHeader.parse(txn_batch_at(P1, 0, epoch=0)))
    table.record(BatchHeader.parse(txn_batch_at(P2, 1, epoch=0, txn=False)))
    assert table.expire(T0 + 10**9) == 1
    assert list(table.producers) == [P1]


def txn_batch_at(producer_id: int, offset: int, *, epoch: int, txn: bool = True) -> bytearray:
    data = txn_batch([b"v"], producer_id, 0, epoch=epoch, txn=txn)
    struct.pack_into(">q", data, 0, offset)
    return data


def kafka_collect(entries: list[AbortedTxn], segment_base: int, start: int, upper: int) -> list[tuple[int, int]]:
    """TransactionIndex.collectAbortedTxns over the segments from ``segment_base``, literally."""
    found = []
    for entry in entries:
        if entry.last_offset < segment_base:
            continue
        if entry.last_offset >= start and entry.first_offset < upper:
            found.append((entry.producer_id, entry.first_offset))
        if entry.last_stable_offset >= upper:
            break
    return found


def test_aborted_lookup_answers_as_kafkas_scan_on_random_workloads(tmp_path: Path) -> None:
    rng = random.Random(16)
    plog = open_disk(tmp_path, clean=True, segment_bytes=1000)
    sequences = {pid: 0 for pid in (P1, P2, P3)}
    for _ in range(400):
        pid = rng.choice([P1, P2, P3])
        if pid in plog.ongoing_transactions() and rng.random() < 0.3:
            marker(plog, pid, commit=rng.random() < 0.5)
        elif rng.random() < 0.2:
            append(plog, plain([b"p"]))
        else:
            count = rng.randint(1, 3)
            append(plog, txn_batch([b"t"] * count, pid, sequences[pid]))
            sequences[pid] += count
    entries = plog.aborted.entries
    assert len(entries) > 20 and len(plog.segments) > 5
    end = plog.log_end_offset
    for _ in range(2000):
        start = rng.randrange(end)
        upper = rng.randrange(start + 1, end + 1)
        base = max(s.base_offset for s in plog.segments if s.base_offset <= start)
        assert plog.aborted_transactions(start, upper) == kafka_collect(entries, base, start, upper), (start, upper)


def test_markers_on_a_log_append_time_topic_carry_the_append_time(make_log: LogFactory) -> None:
    plog = make_log(message_timestamp_type="LogAppendTime")
    result = plog.append_marker(P1, 0, True, COORDINATOR_EPOCH, T0 + 5)
    assert (result.error_code, result.base_offset, result.log_append_time_ms) == (ErrorCode.NONE, 0, T0 + 5)
    ((header, _),) = list(iter_batches(plog.read(0, EVERYTHING).read_bytes()))
    assert (header.is_log_append_time, header.is_control, header.max_timestamp) == (True, True, T0 + 5)
