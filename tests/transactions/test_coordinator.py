"""The transaction coordinator's state machine on a fake clock, with fake partitions recording the markers:
InitProducerId (new ids, epoch bumps, fencing, KIP-360 recovery, epoch exhaustion), AddPartitions/AddOffsets,
EndTxn (TV1 and TV2), timeouts, id expiry, pending group offsets, failed markers retried, and a restart in each
state through the journal."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kbroker.groups.offsets import CommittedOffset, OffsetStore
from kbroker.java_hashing import coordinator_partition
from kbroker.storage import LogManager
from kbroker.transactions.coordinator import (
    MAX_EPOCH,
    ProducerIdAndEpoch,
    TransactionCoordinator,
    TransactionMetadata,
    TxnState,
)
from protocol.coordinator_frame import decode_coordinator_record
from protocol.errors import ErrorCode, KafkaError
from protocol.records import decode_records, iter_batches

TID = "txn-1"
TIMEOUT = 60_000


@dataclass
class Marker:
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


@dataclass(frozen=True)
class Producer:
    producer_id: int
    producer_epoch: int
    current_txn_start_offset: int


@dataclass
class FakePartition:
    markers: list[Marker] = field(default_factory=list)
    failing: bool = False
    open: dict[int, Producer] = field(default_factory=dict)  # producer id -> its open transaction here

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, now_ms: int | None = None
    ) -> object:
        if self.failing:
            raise OSError(28, "No space left on device")
        self.markers.append(Marker(producer_id, producer_epoch, commit, coordinator_epoch))
        self.open.pop(producer_id, None)
        return None

    def producers_view(self) -> list[Producer]:
        return list(self.open.values())

    def lose_last_marker(self, first_offset: int, data_epoch: int) -> None:
        """As log recovery cutting a torn marker off: the producer's transaction is open again."""
        marker = self.markers.pop()
        self.open[marker.producer_id] = Producer(marker.producer_id, data_epoch, first_offset)


class World:
    """A coordinator over fake partitions and a real offset store, on a fake wall clock."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.now = 1_000_000
        self.next_pid = 100
        self.partitions: dict[tuple[str, int], FakePartition] = {(t, p): FakePartition() for t in "ab" for p in (0, 1)}
        self.logs = LogManager(data_dir, {})  # __consumer_offsets and __transaction_state
        self.offsets = OffsetStore(self.logs, partitions=3)
        self.coordinator = self.start()

    def allocate(self) -> int:
        self.next_pid += 1
        return self.next_pid

    def start(self, reconcile_markers: bool = False, **settings: int) -> TransactionCoordinator:
        coordinator = TransactionCoordinator(
            self.data_dir,
            allocate_producer_id=self.allocate,
            partition=lambda t, p: self.partitions.get((t, p)),
            offsets=self.offsets,
            wall_clock_ms=lambda: self.now,
            logs=self.logs,
            state_partitions=3,
            offsets_partitions=3,
            **settings,  # type: ignore[arg-type]
        )
        coordinator.recover(reconcile_markers=reconcile_markers)
        return coordinator

    def restart(self, reconcile_markers: bool = False, **settings: int) -> TransactionCoordinator:
        self.coordinator.close()
        self.offsets.close()
        self.logs.close()
        self.logs = LogManager(self.data_dir, {})
        self.offsets = OffsetStore(self.logs, partitions=3)
        self.coordinator = self.start(reconcile_markers, **settings)
        return self.coordinator

    def markers(self, topic: str, partition: int) -> list[Marker]:
        return self.partitions[(topic, partition)].markers

    def state(self) -> TransactionMetadata:
        metadata = self.coordinator.get(TID)
        assert metadata is not None
        return metadata


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def init(world: World, expected: tuple[int, int] | None = None, timeout: int = TIMEOUT) -> ProducerIdAndEpoch:
    return world.coordinator.init_producer_id(TID, timeout, expected)


def test_a_new_id_gets_a_producer_id_at_epoch_0_and_a_new_instance_bumps_it(world: World) -> None:
    assert init(world) == ProducerIdAndEpoch(ErrorCode.NONE, 101, 0)
    assert init(world) == ProducerIdAndEpoch(ErrorCode.NONE, 101, 1)
    assert world.state().state is TxnState.EMPTY
    # The first instance is fenced everywhere.
    c = world.coordinator
    assert c.add_partitions(TID, 101, 0, [("a", 0)]) == ErrorCode.PRODUCER_FENCED
    assert c.end_transaction(TID, 101, 0, True).error == ErrorCode.PRODUCER_FENCED
    assert c.add_partitions(TID, 999, 1, [("a", 0)]) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert c.add_partitions("unknown", 101, 1, [("a", 0)]) == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert c.end_transaction("unknown", 101, 1, True).error == ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_timeout_and_empty_id_are_checked(world: World) -> None:
    c = world.coordinator
    assert init(world, timeout=0).error == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert init(world, timeout=900_001).error == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert init(world, timeout=900_000).error == ErrorCode.NONE
    assert c.init_producer_id("", TIMEOUT).error == ErrorCode.INVALID_REQUEST
    assert c.add_partitions("", 1, 0, []) == ErrorCode.INVALID_REQUEST
    assert c.end_transaction("", 1, 0, True).error == ErrorCode.INVALID_REQUEST


def test_commit_writes_markers_on_every_partition_and_applies_the_group_offsets(world: World) -> None:
    c = world.coordinator
    init(world)
    assert c.end_transaction(TID, 101, 0, True).error == ErrorCode.INVALID_TXN_STATE  # nothing begun
    assert c.add_partitions(TID, 101, 0, [("a", 0), ("b", 1)]) == ErrorCode.NONE
    assert world.state().state is TxnState.ONGOING and world.state().start_ms == world.now
    assert c.verify_partition(TID, 101, 0, "a", 0) == ErrorCode.NONE
    assert c.verify_partition(TID, 101, 0, "a", 1) == ErrorCode.INVALID_TXN_STATE
    assert c.verify_partition(TID, 101, 0, "a", 1, produce_version=11) == ErrorCode.TRANSACTION_ABORTABLE
    assert c.verify_partition(TID, 101, 7, "a", 0) == ErrorCode.INVALID_PRODUCER_EPOCH
    assert c.add_offsets(TID, 101, 0, "g") == ErrorCode.NONE
    assert c.verify_offset_commit(TID, 101, 0, "g", add=False) == ErrorCode.NONE
    assert c.verify_offset_commit(TID, 101, 0, "other", add=False) == ErrorCode.INVALID_TXN_STATE
    world.offsets.commit_pending("g", 101, {("a", 0): CommittedOffset(42, -1, None, world.now)})
    assert world.offsets.get("g") == {} and world.offsets.has_pending("g", "a", 0)

    assert c.end_transaction(TID, 101, 0, True) == ProducerIdAndEpoch(ErrorCode.NONE)
    assert world.markers("a", 0) == world.markers("b", 1) == [Marker(101, 0, True, 0)]
    assert world.markers("a", 1) == []
    assert world.state().state is TxnState.COMPLETE_COMMIT and world.state().partitions == frozenset()
    assert world.offsets.get("g")[("a", 0)].offset == 42 and not world.offsets.has_pending("g", "a", 0)
    # A retried commit succeeds, an abort now is the wrong state, a new transaction starts from CompleteCommit.
    assert c.end_transaction(TID, 101, 0, True).error == ErrorCode.NONE
    assert c.end_transaction(TID, 101, 0, False).error == ErrorCode.INVALID_TXN_STATE
    assert c.add_partitions(TID, 101, 0, [("a", 1)]) == ErrorCode.NONE
    assert c.end_transaction(TID, 101, 0, False).error == ErrorCode.NONE
    assert world.markers("a", 1) == [Marker(101, 0, False, 0)]
    assert world.markers("a", 0) == [Marker(101, 0, True, 0)]  # not part of the second transaction


def test_abort_drops_the_pending_offsets(world: World) -> None:
    c = world.coordinator
    world.offsets.commit("g", {("a", 0): CommittedOffset(5, -1, None, 0)})
    init(world)
    c.add_offsets(TID, 101, 0, "g")
    world.offsets.commit_pending("g", 101, {("a", 0): CommittedOffset(42, -1, None, 0)})
    assert c.end_transaction(TID, 101, 0, False).error == ErrorCode.NONE
    assert world.offsets.get("g")[("a", 0)].offset == 5 and world.offsets.pending == {}
    assert world.state().state is TxnState.COMPLETE_ABORT


def test_a_new_instance_aborts_the_open_transaction_first(world: World) -> None:
    c = world.coordinator
    init(world)
    c.add_partitions(TID, 101, 0, [("a", 0)])
    # The open transaction is aborted with the epoch bumped (the old instance fenced); the client must retry.
    assert init(world) == ProducerIdAndEpoch(ErrorCode.CONCURRENT_TRANSACTIONS)
    assert world.markers("a", 0) == [Marker(101, 1, False, 0)]
    assert world.state().state is TxnState.COMPLETE_ABORT
    assert c.end_transaction(TID, 101, 0, True).error == ErrorCode.PRODUCER_FENCED
    assert init(world) == ProducerIdAndEpoch(ErrorCode.NONE, 101, 2)


def test_kip_360_recovery_with_the_producer_id_and_epoch(world: World) -> None:
    init(world)
    init(world)  # epoch 1, last epoch -1 (a new instance)
    # The current instance recovering: bumped; a retry of that answer gets the same epoch; an old one is fenced.
    assert init(world, (101, 1)) == ProducerIdAndEpoch(ErrorCode.NONE, 101, 2)
    assert init(world, (101, 1)) == ProducerIdAndEpoch(ErrorCode.NONE, 101, 2)
    assert init(world, (101, 0)).error == ErrorCode.PRODUCER_FENCED
    assert init(world, (555, 2)).error == ErrorCode.PRODUCER_FENCED
    # An unknown id with a producer id to recover gets a new producer id.
    assert world.coordinator.init_producer_id("fresh", TIMEOUT, (7, 3)) == ProducerIdAndEpoch(ErrorCode.NONE, 102, 0)


def test_an_exhausted_epoch_moves_to_a_new_producer_id(world: World) -> None:
    init(world)
    world.coordinator.transactions[TID] = TransactionMetadata(TID, 101, MAX_EPOCH - 1, TIMEOUT)
    assert init(world) == ProducerIdAndEpoch(ErrorCode.NONE, 102, 0)
    assert world.state().previous_producer_id == 101


def test_transaction_version_2_bumps_the_epoch_at_every_end(world: World) -> None:
    c = world.coordinator
    init(world)
    # A TV2 producer adds partitions with Produce v12+ and groups with TxnOffsetCommit v5.
    assert c.verify_partition(TID, 101, 0, "a", 0, produce_version=12) == ErrorCode.NONE
    assert c.verify_offset_commit(TID, 101, 0, "g", add=True) == ErrorCode.NONE
    assert world.state().partitions == {("a", 0)} and world.state().groups == {"g"}
    assert c.end_transaction(TID, 101, 0, True, transaction_version=2) == ProducerIdAndEpoch(ErrorCode.NONE, 101, 1)
    assert world.markers("a", 0) == [Marker(101, 1, True, 0)]
    # The retry with the old epoch is recognised; with the new epoch a commit of nothing is the wrong state.
    assert c.end_transaction(TID, 101, 0, True, transaction_version=2) == ProducerIdAndEpoch(ErrorCode.NONE, 101, 1)
    assert c.end_transaction(TID, 101, 1, True, transaction_version=2).error == ErrorCode.INVALID_TXN_STATE
    # Aborting an empty transaction bumps the epoch too, without markers.
    assert c.end_transaction(TID, 101, 1, False, transaction_version=2) == ProducerIdAndEpoch(ErrorCode.NONE, 101, 2)
    assert world.markers("a", 0) == [Marker(101, 1, True, 0)]
    # At the end of the epochs the next transaction has a new producer id.
    world.coordinator.transactions[TID] = TransactionMetadata(TID, 101, MAX_EPOCH - 1, TIMEOUT)
    c.add_partitions(TID, 101, MAX_EPOCH - 1, [("b", 0)])
    assert c.end_transaction(TID, 101, MAX_EPOCH - 1, True, transaction_version=2) == ProducerIdAndEpoch(
        ErrorCode.NONE, 102, 0
    )
    assert world.markers("b", 0) == [Marker(101, MAX_EPOCH, True, 0)]
    assert (world.state().producer_id, world.state().producer_epoch) == (102, 0)


def test_a_timed_out_transaction_is_aborted_and_its_producer_fenced(world: World) -> None:
    c = world.coordinator
    init(world, timeout=10_000)
    c.add_partitions(TID, 101, 0, [("a", 0)])
    assert c.next_deadline_ms() == world.now + 10_000
    assert c.next_deadline(50.0) == pytest.approx(60.0)
    world.now += 9_999
    c.tick()
    assert world.state().state is TxnState.ONGOING
    world.now += 1
    c.tick()
    assert world.state().state is TxnState.COMPLETE_ABORT and world.state().producer_epoch == 1
    assert world.markers("a", 0) == [Marker(101, 1, False, 0)]
    assert c.add_partitions(TID, 101, 0, [("a", 0)]) == ErrorCode.PRODUCER_FENCED
    assert c.end_transaction(TID, 101, 0, True).error == ErrorCode.PRODUCER_FENCED


def test_an_idle_id_expires(world: World) -> None:
    c = world.restart(id_expiration_ms=5_000)
    init(world)
    assert c.next_deadline_ms() == world.now + 5_000
    world.now += 5_000
    c.tick()
    assert c.get(TID) is None and c.next_deadline_ms() is None
    assert world.restart().get(TID) is None  # the expiry was journalled


def test_markers_that_fail_are_retried_and_the_id_waits(world: World) -> None:
    c = world.coordinator
    init(world)
    c.add_partitions(TID, 101, 0, [("a", 0), ("a", 1)])
    world.partitions[("a", 1)].failing = True
    assert c.end_transaction(TID, 101, 0, True).error == ErrorCode.NONE  # the decision is persisted
    assert world.state().state is TxnState.PREPARE_COMMIT
    assert world.markers("a", 0) == [Marker(101, 0, True, 0)]
    assert init(world).error == ErrorCode.CONCURRENT_TRANSACTIONS
    assert c.end_transaction(TID, 101, 0, True).error == ErrorCode.CONCURRENT_TRANSACTIONS
    assert c.next_deadline_ms() == world.now + 1000
    world.partitions[("a", 1)].failing = False
    world.now += 1000
    c.tick()
    assert world.markers("a", 1) == [Marker(101, 0, True, 0)]
    assert world.markers("a", 0) == [Marker(101, 0, True, 0)]  # not written twice
    assert world.state().state is TxnState.COMPLETE_COMMIT


@pytest.mark.parametrize("state", ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit"])
def test_restart_in_each_state(world: World, state: str) -> None:
    c = world.coordinator
    init(world, timeout=10_000)
    if state != "Empty":
        c.add_partitions(TID, 101, 0, [("a", 0)])
        c.add_offsets(TID, 101, 0, "g")
        world.offsets.commit_pending("g", 101, {("a", 0): CommittedOffset(42, -1, None, 0)})
    if state.startswith("Prepare"):
        world.partitions[("a", 0)].failing = True  # the crash comes before the markers are written
        c.end_transaction(TID, 101, 0, state == "PrepareCommit")
        assert world.state().state.value == state
        world.partitions[("a", 0)].failing = False
    if state == "CompleteCommit":
        c.end_transaction(TID, 101, 0, True)
    before = world.state()
    c = world.restart()
    after = world.state()
    if state == "PrepareCommit":  # completed at start-up: markers, then the offsets applied
        assert after.state is TxnState.COMPLETE_COMMIT and world.markers("a", 0) == [Marker(101, 0, True, 0)]
        assert world.offsets.get("g")[("a", 0)].offset == 42
    elif state == "PrepareAbort":
        assert after.state is TxnState.COMPLETE_ABORT and world.markers("a", 0) == [Marker(101, 0, False, 0)]
        assert world.offsets.get("g") == {} and world.offsets.pending == {}
    else:
        assert after == before
    if state == "Ongoing":  # keeps its timeout from its start, and its pending offsets
        assert world.offsets.has_pending("g", "a", 0)
        assert c.next_deadline_ms() == before.start_ms + 10_000
        world.now = before.start_ms + 10_000
        c.tick()
        assert world.state().state is TxnState.COMPLETE_ABORT and world.markers("a", 0) == [Marker(101, 1, False, 0)]
        assert world.offsets.pending == {}
    assert init(world).error == ErrorCode.NONE  # the id goes on after the restart


def test_a_failed_write_changes_nothing(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    c = world.coordinator
    init(world)
    before = world.state()

    def full_disk(*args: object, **kwargs: object) -> None:
        raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, "No space left on device")

    monkeypatch.setattr(c.state_log, "write", full_disk)
    assert c.add_partitions(TID, 101, 0, [("a", 0)]) == ErrorCode.NOT_COORDINATOR
    assert init(world).error == ErrorCode.NOT_COORDINATOR
    assert world.state() == before


def test_each_transition_is_a_transaction_log_record_and_a_restart_replays_them(world: World) -> None:
    init(world)
    world.coordinator.add_partitions(TID, 101, 0, [("a", 0), ("b", 1)])
    ongoing = world.state()
    plog = world.logs.get_partition("__transaction_state", coordinator_partition(TID, 3))
    assert plog is not None
    chunk = plog.read(0, 1 << 20, max_offset=plog.log_end_offset)
    values = [
        decode_coordinator_record("transaction", r.key, r.value).value
        for _, batch in iter_batches(chunk.read_bytes())
        for r in decode_records(batch)
    ]
    assert [(v.transaction_status, v.producer_id, v.producer_epoch) for v in values] == [(0, 101, 0), (1, 101, 0)]  # type: ignore[union-attr]
    partitions = [(p.topic, p.partition_ids) for p in values[1].transaction_partitions]  # type: ignore[union-attr]
    assert partitions == [("a", [0]), ("b", [1])]
    world.restart()
    assert world.state() == ongoing


# --- markers lost to a crash (issue #26) ----------------------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False])
def test_a_lost_marker_of_the_last_completed_transaction_is_written_again_after_an_unclean_stop(
    world: World, commit: bool
) -> None:
    c = world.coordinator
    init(world)
    c.add_partitions(TID, 101, 0, [("a", 0), ("b", 1)])
    assert c.end_transaction(TID, 101, 0, commit).error == ErrorCode.NONE
    world.partitions[("a", 0)].lose_last_marker(first_offset=5, data_epoch=0)
    world.restart()  # a clean start: nothing is checked
    assert world.markers("a", 0) == [] and world.partitions[("a", 0)].open
    world.restart(reconcile_markers=True)
    assert world.markers("a", 0) == [Marker(101, 0, commit, 0)]
    assert world.markers("b", 1) == [Marker(101, 0, commit, 0)]  # written once, before the crash
    assert world.partitions[("a", 0)].open == {}
    assert world.state().state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)


def test_a_lost_tv2_marker_carries_the_bumped_epoch(world: World) -> None:
    c = world.coordinator
    init(world)
    c.add_partitions(TID, 101, 0, [("a", 0)])
    assert c.end_transaction(TID, 101, 0, True, transaction_version=2) == ProducerIdAndEpoch(ErrorCode.NONE, 101, 1)
    world.partitions[("a", 0)].lose_last_marker(first_offset=0, data_epoch=0)
    world.restart(reconcile_markers=True)
    assert world.markers("a", 0) == [Marker(101, 1, True, 0)]


def test_an_open_transaction_the_coordinator_no_longer_has_is_aborted_and_an_ongoing_one_is_left(
    world: World,
) -> None:
    c = world.coordinator
    init(world)
    c.add_partitions(TID, 101, 0, [("a", 0)])
    c.end_transaction(TID, 101, 0, True)
    world.partitions[("a", 0)].lose_last_marker(first_offset=0, data_epoch=0)
    init(world)  # a new instance (epoch 1) commits on b-0, then begins a transaction on a-1
    c.add_partitions(TID, 101, 1, [("b", 0)])
    c.end_transaction(TID, 101, 1, True)
    assert c.init_producer_id("other", TIMEOUT) == ProducerIdAndEpoch(ErrorCode.NONE, 102, 0)
    c.add_partitions("other", 102, 0, [("a", 0)])  # another id's commit on a-0 gets a-0 checked at restart
    c.end_transaction("other", 102, 0, True)
    del world.markers("a", 0)[:]
    c.add_partitions(TID, 101, 1, [("a", 1)])
    world.partitions[("a", 1)].open[101] = Producer(101, 1, 3)
    world.partitions[("b", 1)].open[555] = Producer(555, 0, 7)  # a producer this coordinator does not know
    world.restart(reconcile_markers=True)
    # a-0's transaction of TID was not its last completed one: the coordinator aborts it (at its epoch, 0).
    assert world.markers("a", 0) == [Marker(101, 0, False, 0)]
    assert world.markers("a", 1) == [] and world.state().state is TxnState.ONGOING  # its EndTxn will end it
    assert world.markers("b", 1) == [] and 555 in world.partitions[("b", 1)].open  # for find-hanging and abort


def test_a_lost_marker_that_cannot_be_written_again_is_retried(world: World) -> None:
    c = world.coordinator
    init(world)
    c.add_partitions(TID, 101, 0, [("a", 0)])
    c.end_transaction(TID, 101, 0, True)
    world.partitions[("a", 0)].lose_last_marker(first_offset=0, data_epoch=0)
    world.partitions[("a", 0)].failing = True  # a full disk at start-up
    c = world.restart(reconcile_markers=True)
    assert world.markers("a", 0) == [] and c.next_deadline_ms() == world.now + 1000
    world.partitions[("a", 0)].failing = False
    world.now += 1000
    c.tick()
    assert world.markers("a", 0) == [Marker(101, 0, True, 0)]
    assert c.next_deadline_ms() == world.state().last_update_ms + c.id_expiration_ms  # nothing left to retry


def test_markers_carry_the_coordinator_epoch_to_partitions_and_group_offsets(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every marker names the epoch the coordinator loaded its __transaction_state partition in, the group's
    offsets partition included: a constant 0 there was refused as a zombie's once a coordinator of a newer
    epoch (after a failover) had written a marker for the producer on that partition, and the transaction never
    completed."""
    c = world.coordinator
    monkeypatch.setattr(c.state_log, "coordinator_epoch", lambda partition: 4)
    init(world)
    assert c.add_partitions(TID, 101, 0, [("a", 0)]) == ErrorCode.NONE
    assert c.add_offsets(TID, 101, 0, "g") == ErrorCode.NONE
    world.offsets.commit_pending("g", 101, {("a", 0): CommittedOffset(42, -1, None, world.now)})
    assert c.end_transaction(TID, 101, 0, True) == ProducerIdAndEpoch(ErrorCode.NONE)
    assert world.markers("a", 0) == [Marker(101, 0, True, 4)]
    offsets_log = world.logs.get_partition("__consumer_offsets", coordinator_partition("g", 3))
    assert offsets_log is not None
    assert [(v.producer_id, v.coordinator_epoch) for v in offsets_log.producers.views()] == [(101, 4)]
    assert world.state().state is TxnState.COMPLETE_COMMIT
