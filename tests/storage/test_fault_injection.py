"""Faults of the file system under the storage and offsets code, through kbroker/durable/fs.py's seam.

A failed or short write leaves the segment (and the offsets journal) exactly as before, the append answers
KAFKA_STORAGE_ERROR and the next one lands at the same offset; a failed cut-back, a failed fsync or writes
that keep failing take the data directory offline for writes until a restart, while reads go on; nothing
acknowledged is lost or re-used across a restart. The property tests at the end run random operations with a
fault or a crash at a random step, then a power cut (unsynced bytes dropped) and recovery.
"""

from __future__ import annotations

import errno
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbroker.durable import fs
from kbroker.durable.files import StorageError, write_atomically
from kbroker.durable.fs import FaultKind, FaultyFileSystem, SimulatedCrash
from kbroker.durable.journal import Journal, JournalTailDamaged
from kbroker.groups.offsets import CommittedOffset, OffsetStore, OffsetStoreError
from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.log import LogDirHealth
from protocol.errors import ErrorCode, KafkaError
from protocol.records import Record, build_batch, decode_records, iter_batches

T0 = 1_700_000_000_000


def batch(*values: bytes) -> bytearray:
    records = [Record(offset_delta=i, timestamp_delta=0, key=None, value=v) for i, v in enumerate(values)]
    return bytearray(build_batch(records, base_timestamp=T0))


def contents(plog: PartitionLog) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record from the log start, read as a consumer would."""
    out: list[tuple[int, bytes | None]] = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20).read_bytes()
        if not data:
            break
        for header, view in iter_batches(data):
            out.extend((header.base_offset + r.offset_delta, r.value) for r in decode_records(view))
            offset = header.next_offset
    return [(o, v) for o, v in out if o >= plog.log_start_offset]


def open_log(
    directory: Path, *, clean: bool = False, health: LogDirHealth | None = None, **config: int
) -> PartitionLog:
    return PartitionLog("t", 0, directory, LogConfig(**config), clean=clean, health=health)


@pytest.fixture
def faulty() -> Iterator[FaultyFileSystem]:
    with fs.installed(FaultyFileSystem()) as double:
        yield double


def next_step(double: FaultyFileSystem) -> int:
    return double.steps + 1


# --- appends ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["enospc", "short"])
def test_a_failed_append_leaves_the_segment_as_it_was_and_the_next_lands_at_the_same_offset(
    tmp_path: Path, faulty: FaultyFileSystem, kind: FaultKind
) -> None:
    plog = open_log(tmp_path)
    assert plog.append(batch(b"a", b"b"), now_ms=T0).base_offset == 0
    segment_file = plog.active.log_path
    before = segment_file.read_bytes()

    faulty.faults[next_step(faulty)] = kind
    failed = plog.append(batch(b"lost"), now_ms=T0)
    assert failed.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert failed.error_message is not None and str(segment_file) in failed.error_message
    assert [(step, op) for step, op, _ in faulty.injected] == [(faulty.injected[0][0], "write")]
    assert segment_file.read_bytes() == before  # not a byte of the failed batch is left
    assert (plog.log_end_offset, plog.high_watermark, plog.active.size) == (2, 2, len(before))
    assert contents(plog) == [(0, b"a"), (1, b"b")]  # reads go on

    assert plog.append(batch(b"c"), now_ms=T0).base_offset == 2  # space returned: the same offset
    assert contents(plog) == [(0, b"a"), (1, b"b"), (2, b"c")]
    plog.close()
    assert contents(open_log(tmp_path)) == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_a_partial_write_that_cannot_be_cut_off_takes_the_directory_offline_until_a_restart(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    health = LogDirHealth(tmp_path)
    plog = open_log(tmp_path / "t-0", health=health)
    other = PartitionLog("u", 0, tmp_path / "u-0", LogConfig(), clean=False, health=health)
    assert plog.append(batch(b"a"), now_ms=T0).base_offset == 0
    faulty.faults[next_step(faulty)] = "short"
    faulty.fail_truncates = True
    failed = plog.append(batch(b"torn" * 100), now_ms=T0)
    assert failed.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert health.offline and "could not be cut off" in (health.offline_reason or "")
    assert plog.active.log_path.stat().st_size > plog.active.size  # the junk is there, past the log end

    faulty.fail_truncates = False
    for log_ in (plog, other):  # the space is back, but the directory stays offline: no append anywhere
        refused = log_.append(batch(b"x"), now_ms=T0)
        assert refused.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        assert refused.error_message == f"{log_.topic}-0: data directory {tmp_path} is offline"
    with pytest.raises(KafkaError) as deleted:
        plog.delete_records(1)
    assert deleted.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert contents(plog) == [(0, b"a")]  # reads go on, and never reach the junk
    plog.close()
    other.close()

    restarted = open_log(tmp_path / "t-0")  # not clean (the marker is not written while offline)
    assert contents(restarted) == [(0, b"a")]  # the torn tail is cut by recovery
    assert restarted.append(batch(b"b"), now_ms=T0).base_offset == 1  # offset 1 was never acknowledged


def test_writes_that_keep_failing_take_the_directory_offline_and_a_success_resets_the_count(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    plog = open_log(tmp_path)
    limit = LogDirHealth.FAILURE_LIMIT
    faulty.disk_full = True
    for _ in range(limit - 1):
        assert plog.append(batch(b"x"), now_ms=T0).error_code == ErrorCode.KAFKA_STORAGE_ERROR
    faulty.disk_full = False
    assert plog.append(batch(b"a"), now_ms=T0).base_offset == 0
    assert plog.health.failures_in_a_row == 0
    faulty.disk_full = True
    for _ in range(limit):
        assert plog.append(batch(b"x"), now_ms=T0).error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert plog.health.offline
    faulty.disk_full = False
    assert plog.append(batch(b"b"), now_ms=T0).error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert contents(plog) == [(0, b"a")]


def test_a_failed_fsync_is_fatal_for_the_directory_and_nothing_is_acknowledged_as_flushed(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    plog = open_log(tmp_path, flush_messages=1)
    assert plog.append(batch(b"a"), now_ms=T0).base_offset == 0
    assert plog.needs_flush
    faulty.faults[next_step(faulty)] = "fsync"
    assert plog.sync() is False
    assert plog.needs_flush  # the message still counts as not flushed
    assert plog.health.offline and "fsync of" in (plog.health.offline_reason or "")
    assert plog.sync() is False  # no second chance: the page cache may already have dropped the data
    assert plog.append(batch(b"b"), now_ms=T0).error_code == ErrorCode.KAFKA_STORAGE_ERROR


def test_a_failed_roll_keeps_the_old_segment_active_and_the_append_retries(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    plog = open_log(tmp_path, segment_bytes=200)
    first = batch(b"x" * 100)
    assert plog.append(first, now_ms=T0).base_offset == 0
    # The roll writes the index files first (write_atomically: a write of the .index.tmp): fill the disk there.
    faulty.disk_full = True
    failed = plog.append(batch(b"y" * 100), now_ms=T0)
    assert failed.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert failed.error_message is not None and failed.error_message.startswith("roll of t-0 at offset 1 failed: ")
    assert len(plog.segments) == 1 and not list(tmp_path.glob("*.tmp"))
    faulty.disk_full = False
    assert plog.append(batch(b"y" * 100), now_ms=T0).base_offset == 1
    assert [s.base_offset for s in plog.segments] == [0, 1]
    assert contents(plog) == [(0, b"x" * 100), (1, b"y" * 100)]


def test_delete_records_that_cannot_be_written_moves_nothing(tmp_path: Path, faulty: FaultyFileSystem) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(b"a", b"b", b"c"), now_ms=T0)
    faulty.disk_full = True
    with pytest.raises(KafkaError) as failed:
        plog.delete_records(2)
    assert failed.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert plog.log_start_offset == 0
    faulty.disk_full = False
    plog.close()
    assert open_log(tmp_path).log_start_offset == 0


def test_write_atomically_leaves_the_old_file_on_any_failure(tmp_path: Path, faulty: FaultyFileSystem) -> None:
    target = tmp_path / "state"
    write_atomically(target, b"old")
    # Its steps: the write of the temporary file, its fsync, the rename.
    faults: list[tuple[FaultKind, int]] = [("enospc", 0), ("short", 0), ("fsync", 1), ("rename", 2)]
    for kind, step_offset in faults:
        faulty.faults[next_step(faulty) + step_offset] = kind
        with pytest.raises(OSError):
            write_atomically(target, b"new content")
        assert target.read_bytes() == b"old"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]  # no .tmp left behind
    assert [op for _, op, _ in faulty.injected] == ["write", "write", "fsync", "replace"]


# --- the offsets journal ----------------------------------------------------------------------------------------


def test_a_failed_journal_append_is_cut_back_and_a_torn_one_is_skipped_keeping_later_records(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    journal = Journal(tmp_path / "j", "test")
    journal.open()
    journal.append([b"one"])
    size = (tmp_path / "j").stat().st_size
    faulty.faults[next_step(faulty)] = "short"
    with pytest.raises(OSError) as full:
        journal.append([b"lost" * 50])
    assert full.value.errno == errno.ENOSPC
    assert (tmp_path / "j").stat().st_size == size
    faulty.faults[next_step(faulty)] = "short"
    faulty.fail_truncates = True
    with pytest.raises(JournalTailDamaged, match="it will be skipped when the journal is read"):
        journal.append([b"torn" * 50])
    faulty.fail_truncates = False
    assert (tmp_path / "j").stat().st_size > size  # half a record stays
    journal.append([b"two"])
    journal.close()
    replayed = Journal(tmp_path / "j", "test")
    assert list(replayed.replay()) == [b"one", b"two"]
    assert replayed.damaged_regions == 1


def commit(store: OffsetStore, group: str, partition: int, offset: int) -> None:
    store.commit(group, {("t", partition): CommittedOffset(offset, -1, None, T0)})


def committed(store: OffsetStore, group: str) -> dict[int, int]:
    return {p: c.offset for (_, p), c in store.get(group).items()}


def test_a_commit_that_cannot_be_written_changes_nothing(tmp_path: Path, faulty: FaultyFileSystem) -> None:
    store = OffsetStore.in_data_dir(tmp_path, partitions=1)
    commit(store, "g", 0, 5)
    faulty.disk_full = True
    with pytest.raises(OffsetStoreError):
        commit(store, "g", 0, 9)
    with pytest.raises(OffsetStoreError):
        store.delete("g", [("t", 0)])
    with pytest.raises(OffsetStoreError):
        store.delete_group("g")
    assert store.expire("g", T0 + 1, T0 + 1) == 0  # a background expiry logs and tries again later
    assert committed(store, "g") == {0: 5}
    faulty.disk_full = False
    commit(store, "g", 1, 7)
    store.close()
    assert committed(OffsetStore.in_data_dir(tmp_path, partitions=1), "g") == {0: 5, 1: 7}


def test_with_flush_messages_1_a_commit_is_fsynced_before_it_applies_and_a_failed_fsync_is_fatal(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    store = OffsetStore.in_data_dir(tmp_path, partitions=1, flush_messages=1)
    commit(store, "g", 0, 5)
    segment = tmp_path / "__consumer_offsets-0" / "00000000000000000000.log"
    assert faulty.durable_length(segment) == segment.stat().st_size  # durable before the answer
    faulty.faults[next_step(faulty) + 1] = "fsync"  # the write, then its fsync
    with pytest.raises(OffsetStoreError):
        commit(store, "g", 0, 6)
    assert committed(store, "g") == {0: 5}
    assert store.logs.dir_health.offline
    with pytest.raises(OffsetStoreError, match="offline"):
        commit(store, "g", 1, 1)
    store.close()
    faulty.power_cut()
    assert committed(OffsetStore.in_data_dir(tmp_path, partitions=1), "g") == {0: 5}  # the unsynced one was lost


# --- property tests: random operations, a fault at a random step, a power cut, recovery -------------------------

CRASHES: list[FaultKind] = ["crash", "crash_after"]
# A fault on the Nth operation of its kind: ENOSPC or a short write on a write, an error on an fsync, rename or
# truncate, or a crash before or after any of them.
fault = st.one_of(
    st.tuples(st.just("write"), st.integers(1, 16), st.sampled_from(["enospc", "short", *CRASHES])),
    st.tuples(st.just("fsync"), st.integers(1, 16), st.sampled_from(["fsync", *CRASHES])),
    st.tuples(st.just("replace"), st.integers(1, 8), st.sampled_from(["rename", *CRASHES])),
    st.tuples(st.just("ftruncate"), st.integers(1, 3), st.sampled_from(["truncate", *CRASHES])),
    st.tuples(st.just("unlink"), st.integers(1, 4), st.sampled_from(CRASHES)),
)

operation = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 4)),
    st.tuples(st.just("append"), st.integers(1, 4)),
    st.tuples(st.just("commit"), st.integers(0, 2)),
    st.tuples(st.just("delete_records"), st.integers(0, 100)),
    st.tuples(st.just("roll"), st.just(0)),
)


class Model:
    """What was acknowledged, and what was attempted without an acknowledgement."""

    def __init__(self) -> None:
        self.acked: dict[int, bytes] = {}  # offset -> value
        self.acked_end = 0
        self.attempted_values: set[bytes] = set()
        self.acked_start = 0
        self.attempted_start = 0
        self.commits: dict[int, int] = {}  # partition -> last acknowledged offset
        self.pending_commits: dict[int, set[int]] = {}  # partition -> offsets tried after it, not acknowledged


def run_operations(
    directory: Path, ops: list[tuple[str, int]], model: Model, *, durable: bool, double: FaultyFileSystem
) -> None:
    """Apply ``ops`` until a crash; a produce counts as acknowledged as the handler would answer it."""
    config = {"segment_bytes": 300, "flush_messages": 1 if durable else 2**63 - 1}
    plog: PartitionLog | None = None
    store: OffsetStore | None = None
    counter = 0
    try:
        try:
            plog = open_log(directory / "t-0", **config)
            store = OffsetStore.in_data_dir(directory / "offsets", partitions=1, flush_messages=1 if durable else None)
        except (OSError, StorageError):
            ops = []  # the broker did not start: nothing is acknowledged
        for kind, argument in ops:
            if kind == "append":
                counter += 1
                values = [f"v{counter}.{i}".encode() for i in range(argument)]
                model.attempted_values.update(values)  # before: a crash inside the append may leave them on disk
                result = plog.append(batch(*values), now_ms=T0)
                ok = result.error_code == ErrorCode.NONE and (not durable or plog.sync())
                if ok:
                    assert result.base_offset == model.acked_end  # never re-used, never skipped
                    model.acked.update({result.base_offset + i: v for i, v in enumerate(values)})
                    model.acked_end = result.base_offset + len(values)
            elif kind == "commit":
                counter += 1
                # Tried but not acknowledged until commit returns: a crash inside it may leave it on disk.
                model.pending_commits.setdefault(argument, set()).add(counter)
                try:
                    commit(store, "g", argument, counter)
                except OffsetStoreError:
                    pass
                else:
                    model.commits[argument] = counter
                    model.pending_commits.pop(argument, None)
            elif kind == "delete_records":
                target = min(plog.log_start_offset + argument % 5, plog.high_watermark)
                if target <= plog.log_start_offset:
                    continue
                model.attempted_start = max(model.attempted_start, target)
                try:
                    plog.delete_records(target)
                except KafkaError:
                    continue
                model.acked_start = max(model.acked_start, target)
            else:
                try:
                    plog.roll(T0)
                except (OSError, StorageError):
                    pass  # the old segment stays active; a later append rolls
    except SimulatedCrash:
        pass
    # The process is gone: descriptors close, nothing more is written (no clean shutdown).
    for segment in plog.segments if plog is not None else []:
        segment.close()
    for offsets_log in store.logs.open_partitions() if store is not None else []:
        for segment in offsets_log.segments:
            segment.close()


def check_recovery(directory: Path, model: Model) -> None:
    plog = open_log(directory / "t-0", segment_bytes=300)
    records = dict(contents(plog))
    start = plog.log_start_offset
    assert model.acked_start <= start <= max(model.attempted_start, model.acked_start)
    for offset, value in model.acked.items():
        if offset >= start:
            assert records.get(offset) == value, f"acknowledged offset {offset} lost or changed"
    for offset, value in records.items():
        if offset not in model.acked:
            assert offset >= model.acked_end and value in model.attempted_values
    # The next append goes after everything acknowledged: no offset is used twice.
    assert plog.append(batch(b"after"), now_ms=T0).base_offset >= model.acked_end
    plog.close()
    store = OffsetStore.in_data_dir(directory / "offsets", partitions=1)
    found = committed(store, "g")
    for partition in set(model.commits) | set(model.pending_commits):
        allowed = model.pending_commits.get(partition, set()) | (
            {model.commits[partition]} if partition in model.commits else {None}  # type: ignore[arg-type]
        )
        assert found.get(partition) in allowed, f"partition {partition}: {found.get(partition)} not in {allowed}"
    store.close()


def run_case(ops: list[tuple[str, int]], faults: list[tuple[str, int, FaultKind]], *, durable: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        model = Model()
        double = FaultyFileSystem(nth={(operation, n): kind for operation, n, kind in faults})
        with fs.installed(double):
            run_operations(directory, ops, model, durable=durable, double=double)
        if durable:
            double.power_cut()  # what was not fsynced is gone; what was acknowledged was fsynced
        check_recovery(directory, model)


PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


@PROPERTY_SETTINGS
@given(
    ops=st.lists(operation, min_size=1, max_size=16),
    faults=st.lists(fault, min_size=1, max_size=3),
)
def test_a_power_cut_after_any_fault_keeps_exactly_what_was_acknowledged_when_every_write_is_fsynced(
    ops: list[tuple[str, int]], faults: list[tuple[str, int, FaultKind]]
) -> None:
    run_case(ops, faults, durable=True)


@PROPERTY_SETTINGS
@given(
    ops=st.lists(operation, min_size=1, max_size=16),
    faults=st.lists(fault, min_size=1, max_size=3),
)
def test_a_crash_after_any_fault_keeps_exactly_what_was_acknowledged_with_the_default_flush_policy(
    ops: list[tuple[str, int]], faults: list[tuple[str, int, FaultKind]]
) -> None:
    run_case(ops, faults, durable=False)


# Every fault that fits the operation, at every step of one workload (the "crash and recover at every step").
WORKLOAD: list[tuple[str, int]] = [
    ("append", 2),
    ("commit", 0),
    ("append", 3),
    ("append", 1),
    ("delete_records", 2),
    ("commit", 1),
    ("append", 4),
    ("roll", 0),
    ("append", 2),
    ("commit", 0),
    ("append", 1),
]
FITTING: dict[str, list[FaultKind]] = {
    "write": ["enospc", "short"],
    "fsync": ["fsync"],
    "replace": ["rename"],
    "ftruncate": ["truncate"],
    "unlink": [],
}


@pytest.mark.parametrize("durable", [True, False], ids=["fsync-every-write-then-power-cut", "default-policy-crash"])
def test_every_fault_at_every_step_of_a_workload_keeps_exactly_what_was_acknowledged(durable: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dry_run = FaultyFileSystem()
        with fs.installed(dry_run):
            run_operations(Path(tmp), WORKLOAD, Model(), durable=durable, double=dry_run)
    assert dry_run.steps > 40 and set(dry_run.operations) >= {"write", "fsync", "replace"}
    cases = 0
    for step, operation in enumerate(dry_run.operations, 1):
        for kind in [*FITTING[operation], "crash", "crash_after"]:
            with tempfile.TemporaryDirectory() as tmp:
                model = Model()
                double = FaultyFileSystem(faults={step: kind})
                with fs.installed(double):
                    run_operations(Path(tmp), WORKLOAD, model, durable=durable, double=double)
                assert double.injected == [(step, operation, kind)]
                if durable:
                    double.power_cut()
                check_recovery(Path(tmp), model)
                cases += 1
    assert cases == sum(len(FITTING[op]) + 2 for op in dry_run.operations)
