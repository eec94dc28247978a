"""The transaction coordinator: Kafka's TransactionCoordinator and TransactionStateManager for one node.

Every transactional id has a TransactionMetadata: its producer id and epoch, the transaction timeout, the state of
its current transaction, and the partitions and consumer groups that transaction touched. The states are Kafka's::

    Empty ──AddPartitions──▶ Ongoing ──EndTxn(commit)──▶ PrepareCommit ──markers──▶ CompleteCommit
                               │  └────EndTxn(abort) / timeout / fencing──▶ PrepareAbort ──markers──▶ CompleteAbort
                               └─ InitProducerId of a new instance: PrepareEpochFence (the epoch bumped) ─▶ PrepareAbort

and Complete* go back to Ongoing when the next transaction adds a partition. PrepareEpochFence is only ever a
pending transition (Kafka never writes it either): it becomes PrepareAbort with the bumped epoch at once.

InitProducerId with a transactional id (Kafka's handleInitProducerId): a new id gets a fresh producer id at
epoch 0; a known one gets its epoch bumped, which fences the previous instance (its requests now answer
PRODUCER_FENCED). If the previous instance left a transaction Ongoing, it is aborted first and the answer is
CONCURRENT_TRANSACTIONS: the client retries and gets the epoch bumped once more, as Kafka does. KIP-360: a request
carrying the producer id and epoch it had (recovering from an abortable error) is bumped only if that epoch is
the current one, answered the current epoch if it is a retry of the last bump, else PRODUCER_FENCED. When the
epoch is exhausted (32766) a new producer id is allocated.

Transaction version 2 (KIP-890, EndTxn v5, which Java 4.x clients use when ApiVersions finalizes
transaction.version=2): EndTxn bumps the epoch itself, the markers carry the bumped epoch and the answer names it,
so each transaction has its own epoch; a retried EndTxn with the previous epoch is recognised. TV2 producers add
partitions implicitly: a Produce v12+ (``verify_partition(..., produce_version=12)``) or TxnOffsetCommit v5 adds
its partition or group to the transaction, instead of AddPartitionsToTxn / AddOffsetsToTxn.

Markers, and when EndTxn is answered: Kafka answers EndTxn once PrepareCommit/PrepareAbort is written to its
``__transaction_state`` log and sends the WriteTxnMarkers to the partition leaders afterwards; requests of the
same transactional id meanwhile answer CONCURRENT_TRANSACTIONS. For the partitions this broker leads, the
coordinator writes PrepareX to its journal, then appends the control batch to every partition of the transaction
(the partitions' ``append_marker``), applies or drops the group offsets committed in the transaction, writes
CompleteX, and only then answers: a read_committed consumer sees a committed transaction as soon as
commitTransaction returns. In a cluster, the markers of partitions (and groups' ``__consumer_offsets`` partitions)
that other brokers lead go to those leaders in WriteTxnMarkers (kbroker/transactions/remote.py), as Kafka's do:
EndTxn is answered once PrepareX is written, and CompleteX follows when the last leader wrote its marker. In a
cluster every transition is on the ISR of its ``__transaction_state`` partition before the request is answered
(``replicated``, Kafka's acks=-1 append), and no marker is written before its PrepareX is: a coordinator failing
over leaves its successor every decision a client was told of, and none it was not.
If a marker cannot be written (a full disk), EndTxn is still answered NONE (the decision
is made and persisted, as in Kafka) and the coordinator retries the markers on its timer; until they are all
written the id answers CONCURRENT_TRANSACTIONS.

Timers (registered with kbroker.groups.timers.CoordinatorTimers): an Ongoing transaction older than its
timeout is aborted with the epoch bumped (the producer is fenced, as Kafka's abortTimedOutTransactions); an id
idle (Empty or Complete*) for transactional.id.expiration.ms is forgotten; markers that failed are retried.

Persistence: each transition is a TransactionLog record in the id's partition of ``__transaction_state``, in
Kafka's format (kbroker/transactions/state_log.py), written through the coordinator runtime
(kbroker/coordinators/runtime.py); a tombstone when an id expires. A transition is written before it changes the
state in memory (the state is the replay of the topic), so a failed write changes nothing (the request answers
NOT_COORDINATOR, as Kafka answers a failed append to its transaction log, and the client finds the coordinator
again and retries). At start-up the topic is replayed: a transaction in PrepareCommit/PrepareAbort is completed
(its markers written again: a marker for a transaction the partition already ended is harmless) and an Ongoing one
keeps its deadline, measured from its start on the wall clock. Compaction keeps each id's last record. Each id
keeps its last completed transaction (producer id, marker epoch, outcome, partitions): after an unclean stop the
markers of those partitions that recovery cut off are written again (``reconcile_markers``).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import trio

from kbroker.coordinators.runtime import CoordinatorRecord, CoordinatorRuntime
from kbroker.durable.files import StorageError
from kbroker.groups.offsets import OFFSETS_TOPIC
from kbroker.groups.timers import CoordinatorTimers
from kbroker.java_hashing import coordinator_partition
from kbroker.storage import LogManager
from kbroker.transactions.state_log import (
    DEFAULT_PARTITIONS,
    DEFAULT_SEGMENT_BYTES,
    TRANSACTION_TOPIC,
    TransactionStateShard,
    transaction_record,
    transaction_tombstone,
    transaction_topic_configs,
)
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from kbroker.replication import ReplicaManager
    from kbroker.transactions.remote import RemoteMarker, RemoteTransactions

log = logging.getLogger("kbroker.transactions")

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32767  # Short.MaxValue
# Markers that could not be written are tried again this often (seconds).
MARKER_RETRY_SECONDS = 1.0


class TxnState(Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    DEAD = "Dead"

    @property
    def is_prepare(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def is_idle(self) -> bool:
        """No transaction in progress: the id may start one, or expire."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


class TransactionLogError(StorageError):
    """A transition could not be journalled; the state in memory is as it was."""


class OpenTransaction(Protocol):
    """A producer as a partition reports it (kbroker/storage's ProducerView)."""

    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...
    @property
    def current_txn_start_offset(self) -> int: ...


class MarkerTarget(Protocol):
    """What the coordinator needs of a partition (kbroker/storage's PartitionLog): appending a marker, and the
    producers it knows (to find the transactions it holds open)."""

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, now_ms: int | None = None
    ) -> Any: ...

    def producers_view(self) -> Iterable[OpenTransaction]: ...


class TransactionalOffsets(Protocol):
    """What the coordinator needs of the offset store: applying or dropping a transaction's pending offsets."""

    def complete_transaction(self, group: str, producer_id: int, commit: bool, coordinator_epoch: int = 0) -> None: ...

    def complete_partition_transaction(
        self, partition: int, producer_id: int, commit: bool, coordinator_epoch: int = 0
    ) -> None: ...


class CompletedTransaction(NamedTuple):
    """The last transaction of an id that completed: the markers it wrote. Kept so that a restart after a crash
    that lost a marker (a torn tail cut by log recovery) can write it again with the outcome decided."""

    producer_id: int
    marker_epoch: int  # the epoch the markers carry (TV2: the bumped one)
    commit: bool
    partitions: frozenset[tuple[str, int]]

    def to_record(self) -> dict[str, Any]:
        return {
            "pid": self.producer_id,
            "epoch": self.marker_epoch,
            "commit": self.commit,
            "partitions": sorted([t, p] for t, p in self.partitions),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> CompletedTransaction:
        return cls(
            producer_id=int(record["pid"]),
            marker_epoch=int(record["epoch"]),
            commit=bool(record["commit"]),
            partitions=frozenset((str(t), int(p)) for t, p in record["partitions"]),
        )


class TransactionMetadata(NamedTuple):
    """One transactional id, as Kafka's TransactionMetadata (and its __transaction_state record)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    previous_producer_id: int = NO_PRODUCER_ID
    next_producer_id: int = NO_PRODUCER_ID  # TV2: the id the producer moves to when its epoch is exhausted
    partitions: frozenset[tuple[str, int]] = frozenset()
    groups: frozenset[str] = frozenset()  # consumer groups with offsets pending in this transaction
    start_ms: int = -1
    last_update_ms: int = -1
    transaction_version: int = 1  # 2 once the client ended a transaction with EndTxn v5
    last_completed: CompletedTransaction | None = None

    @property
    def epoch_exhausted(self) -> bool:
        return self.producer_epoch >= MAX_EPOCH - 1

    def to_record(self) -> dict[str, Any]:
        return {
            "id": self.transactional_id,
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "last_epoch": self.last_producer_epoch,
            "prev_pid": self.previous_producer_id,
            "next_pid": self.next_producer_id,
            "timeout": self.timeout_ms,
            "state": self.state.value,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "groups": sorted(self.groups),
            "start": self.start_ms,
            "update": self.last_update_ms,
            "tv": self.transaction_version,
            **({"done": self.last_completed.to_record()} if self.last_completed is not None else {}),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TransactionMetadata:
        return cls(
            transactional_id=str(record["id"]),
            producer_id=int(record["pid"]),
            producer_epoch=int(record["epoch"]),
            timeout_ms=int(record["timeout"]),
            state=TxnState(record["state"]),
            last_producer_epoch=int(record["last_epoch"]),
            previous_producer_id=int(record["prev_pid"]),
            next_producer_id=int(record["next_pid"]),
            partitions=frozenset((str(t), int(p)) for t, p in record["partitions"]),
            groups=frozenset(str(g) for g in record["groups"]),
            start_ms=int(record["start"]),
            last_update_ms=int(record["update"]),
            transaction_version=int(record.get("tv", 1)),
            last_completed=CompletedTransaction.from_record(record["done"]) if "done" in record else None,
        )


class ProducerIdAndEpoch(NamedTuple):
    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


class _Repair(NamedTuple):
    """A marker reconciliation owes a partition (written again after a crash lost it); retried on the timer."""

    transactional_id: str
    producer_id: int
    marker_epoch: int
    commit: bool


@dataclass(slots=True)
class _PendingMarkers:
    """Markers of a PrepareX transaction not yet written (a write failed, or PrepareX is not yet replicated):
    retried on the timer."""

    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    # In a cluster: the end of PrepareX in the id's __transaction_state partition, which the ISR must have before
    # any marker is written (-1: nothing to wait for).
    after: int = -1


# A failed replication of __transaction_state as the client gets it (Kafka's TransactionStateManager).
_REPLICATION_ERRORS = {
    ErrorCode.NOT_COORDINATOR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
}


class TransactionCoordinator:
    """Transactional ids and their transactions; every method is synchronous and answers a Kafka error code."""

    def __init__(
        self,
        data_dir: Path,
        *,
        allocate_producer_id: Callable[[], int],
        partition: Callable[[str, int], MarkerTarget | None],
        offsets: TransactionalOffsets,
        max_timeout_ms: int = 900_000,
        id_expiration_ms: int = 604_800_000,
        wall_clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        runtime: CoordinatorTimers | None = None,
        logs: LogManager | None = None,
        state_partitions: int = DEFAULT_PARTITIONS,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        offsets_partitions: int = 50,
        replicas: ReplicaManager | None = None,
    ) -> None:
        """``logs``: where __transaction_state lives (the broker's log manager; by default one of its own in
        ``data_dir``, closed with the coordinator). ``state_partitions``, ``segment_bytes``:
        transaction.state.log.num.partitions and .segment.bytes, used when the topic is created.
        ``offsets_partitions``: __consumer_offsets' partition count, to list a transaction's groups as Kafka does.
        ``replicas``: the replica layer the records are written through (None: the logs directly)."""
        self.max_timeout_ms = max_timeout_ms
        self.id_expiration_ms = id_expiration_ms
        self._allocate_producer_id = allocate_producer_id
        self._partition = partition
        self._offsets = offsets
        self._now_ms = wall_clock_ms
        self._runtime = runtime
        self._replicas = replicas
        # Markers for partitions other brokers lead go through this (set by the broker in a cluster; None: every
        # partition is local).
        self.remote: RemoteTransactions | None = None
        # Whether this broker may act as a coordinator yet: under a KRaft quorum, once its metadata image is
        # current (a restarted broker replays an image in which it may still lead partitions it lost). Until then
        # the timers (timeouts, markers) wait.
        self.acting: Callable[[], bool] = lambda: True
        self.transactions: dict[str, TransactionMetadata] = {}
        self._pending_markers: dict[str, _PendingMarkers] = {}
        self._pending_repairs: dict[tuple[str, int], _Repair] = {}  # markers a crash lost that failed again
        self._written_end: dict[int, int] = {}  # each __transaction_state partition's end after this leader's writes
        self._marker_retry_ms = 0  # wall time of the next retry of markers that failed
        # Each id's timer (a timeout or an expiry) by wall time: a heap whose superseded entries are skipped.
        self._timers: list[tuple[int, str]] = []
        self._timer_at: dict[str, int] = {}
        self._backoff_until_ms = 0  # after a failed journal write, timers wait until then
        self._owns_logs = logs is None
        self.logs = logs if logs is not None else LogManager(data_dir, {})
        self.configured_partitions = state_partitions
        self.segment_bytes = segment_bytes
        self.offsets_partitions = offsets_partitions
        self.state_log: CoordinatorRuntime[TransactionStateShard] = CoordinatorRuntime(
            TRANSACTION_TOPIC,
            self.logs.get_partition,
            lambda p: TransactionStateShard(p, self._apply),
            replicas=replicas,
            loaded=self._partition_loaded,
            unloaded=self._forget_partition,
        )
        # How the topic is created when needed at once: the broker's topic service (through the controller); the
        # log manager directly for a coordinator of its own.
        self.create_topic: Callable[[str, int, dict[str, str]], object] = self.logs.create_topic
        self._loaded = False  # every shard loaded
        self._not_loaded: set[int] = set()  # partitions that could not be loaded yet (each logged once)
        # The partition each id's state was replayed from (its own, or where an older kbroker kept it).
        self._state_partition: dict[str, int] = {}
        if self.logs.topic(TRANSACTION_TOPIC) is not None:
            self._load()
        if runtime is not None:
            runtime.register(self)

    # --- persistence -----------------------------------------------------------------------------------

    @property
    def partition_count(self) -> int:
        info = self.logs.topic(TRANSACTION_TOPIC)
        return info.partitions if info is not None else self.configured_partitions

    def partition_for(self, transactional_id: str) -> int:
        """The id's __transaction_state partition, as Kafka's (the same hash as a group's)."""
        return coordinator_partition(transactional_id, self.partition_count)

    def topic_configs(self) -> dict[str, str]:
        return transaction_topic_configs(self.segment_bytes)

    def ensure_topic(self) -> None:
        """Create __transaction_state if it does not exist (FindCoordinator creates it first, in a worker thread),
        and load its shards; StorageError or KafkaError if its files cannot be made."""
        if self.logs.topic(TRANSACTION_TOPIC) is None:
            self.create_topic(TRANSACTION_TOPIC, self.configured_partitions, self.topic_configs())
            log.info("created %s with %d partitions", TRANSACTION_TOPIC, self.configured_partitions)
        # A shard missing since (a reload on leading its partition again failed, or its log was not open when
        # leadership came) is loaded by its partition's next use (``ensure_shard``, as in kbroker/groups/offsets.py).
        if not self._loaded:
            self._load()

    def ensure_shard(self, transactional_id: str) -> bool:
        """The id's shard is loaded here (loaded now if this broker leads its partition and it was not)."""
        return self.state_log.load_if_led(self.partition_for(transactional_id))

    def coordinated_elsewhere(self, transactional_id: str) -> bool:
        """Another broker leads the id's __transaction_state partition (or none does), as the metadata image says:
        its requests here answer NOT_COORDINATOR, and the client finds the coordinator again."""
        return self.state_log.led_elsewhere(self.partition_for(transactional_id))

    def offsets_partition_of(self, group: str) -> int:
        """The group's __consumer_offsets partition, where its transactional offsets get their marker."""
        return coordinator_partition(group, self.offsets_partitions)

    def coordinator_node(self, transactional_id: str) -> int:
        """The broker the image makes the id's coordinator: its __transaction_state partition's leader (-1: none)."""
        leader = self._leader_of(TRANSACTION_TOPIC, self.partition_for(transactional_id))
        return -1 if leader is None else leader

    def _apply(self, transactional_id: str, record: dict[str, Any] | None, partition: int) -> None:
        """A record of ``partition`` of __transaction_state replayed (at load, or once written): the id's state, or
        its end. An older kbroker may have kept the id in another partition than Kafka's hash gives it (see
        ``_rehome_misplaced``): a record there counts only while the id's own partition has given none."""
        home = self.partition_for(transactional_id)
        source = self._state_partition.get(transactional_id)
        if partition != home and source == home:
            return  # the old copy, replayed after the id's own: the own one is newer
        if record is None:
            if source in (None, partition):
                self.transactions.pop(transactional_id, None)
                self._state_partition.pop(transactional_id, None)
        else:
            self.transactions[transactional_id] = TransactionMetadata.from_record(record)
            self._state_partition[transactional_id] = partition

    def _partition_loaded(self, partition: int) -> None:
        """Its shard was loaded (at start-up, or on becoming the partition's leader): as Kafka's coordinator after
        loading, its ids' timeouts and expiries are armed, and a transaction it holds in PrepareCommit/PrepareAbort
        has its markers written again on the timer (a previous leader may have stopped halfway)."""
        now = self._now_ms()
        for transactional_id, metadata in self.transactions.items():
            if self.partition_for(transactional_id) != partition:
                continue
            self._set_timer(transactional_id, metadata)
            if metadata.state.is_prepare and transactional_id not in self._pending_markers:
                owed = _PendingMarkers(set(metadata.partitions), set(metadata.groups))
                self._pending_markers[transactional_id] = owed
                self._marker_retry_ms = now  # due at once
        if self._runtime is not None:
            self._runtime.wake()

    def _forget_partition(self, partition: int) -> None:
        """Its shard was unloaded (this broker no longer leads it): its ids' states, timers and owed markers go
        with it, as on Kafka (the new leader's coordinator takes them over from the log)."""
        self._written_end.pop(partition, None)
        for transactional_id in [t for t in self.transactions if self.partition_for(t) == partition]:
            del self.transactions[transactional_id]
            self._state_partition.pop(transactional_id, None)
            self._timer_at.pop(transactional_id, None)
            self._pending_markers.pop(transactional_id, None)

    def load_led_shards(self) -> None:
        """Load the shards of the partitions this broker leads, not loaded yet: called once its replica layer acts
        on a current image (under a KRaft quorum, nothing is loaded from the image a restart replays)."""
        if self.logs.topic(TRANSACTION_TOPIC) is not None and not self._loaded:
            self._load()

    def _load(self) -> None:
        """Load the shards not loaded yet; a partition whose files are still being made (the topic was just
        created) or cannot be read is tried again by the next ``ensure_topic``, its ids answering NOT_COORDINATOR
        meanwhile."""
        if not self.state_log.acting:
            return  # ``load_led_shards`` loads them once leadership is current
        missing = False
        for partition in range(self.partition_count):
            if partition in self.state_log.shards or not self.state_log.leads(partition):
                continue  # loaded, or another broker's to coordinate
            try:
                self.state_log.load(partition)
            except KafkaError as exc:
                if partition not in self._not_loaded:
                    self._not_loaded.add(partition)
                    log.warning("%s-%d is not loaded (tried again on use): %s", TRANSACTION_TOPIC, partition, exc)
                missing = True
                continue
            self._not_loaded.discard(partition)
        self._loaded = not missing
        if self._loaded:
            self._rehome_misplaced()
        if self.transactions:
            log.info("%s: %d transactional id(s) loaded", TRANSACTION_TOPIC, len(self.transactions))

    def _append(self, partition: int, records: list[CoordinatorRecord]) -> None:
        self.state_log.write(partition, lambda _: (records, None))

    def _rehome_misplaced(self) -> None:
        """Move each id an older kbroker kept in another partition to the one Kafka's hash gives it: those kbrokers
        made a negative hash non-negative with the partitioner's sign-bit mask rather than Kafka's Utils.abs. Its
        state is written to its own partition, then tombstoned in the old one (``_apply`` then keeps the own
        partition's state, in whatever order the two are replayed). Only between partitions this broker leads (a
        single node's data directory: brokers of a cluster always agreed with Kafka)."""
        moved: list[str] = []
        homes: set[int] = set()
        for partition, shard in list(self.state_log.shards.items()):
            for transactional_id in sorted(shard.ids):
                home = self.partition_for(transactional_id)
                if home == partition or home not in self.state_log.shards:
                    continue
                metadata = self.transactions.get(transactional_id)
                try:
                    if metadata is not None and self._state_partition.get(transactional_id) == partition:
                        self._append(home, [transaction_record(metadata.to_record(), self.offsets_partitions)])
                    self._append(partition, [transaction_tombstone(transactional_id)])
                except KafkaError as exc:
                    log.error("%s: moving %r to its partition failed: %s", TRANSACTION_TOPIC, transactional_id, exc)
                    return
                moved.append(transactional_id)
                homes.add(home)
        for home in sorted(homes):
            self._partition_loaded(home)  # the timers and owed markers of the ids now kept there
        if moved:
            log.info(
                "%s: moved %d transactional id(s) an older kbroker kept in another partition to Kafka's: %s",
                TRANSACTION_TOPIC,
                len(moved),
                ", ".join(moved[:10]) + (" ..." if len(moved) > 10 else ""),
            )

    def recover(self, *, reconcile_markers: bool = False) -> None:
        """Complete the transactions a crash left in PrepareCommit/PrepareAbort (their markers written again); with
        ``reconcile_markers`` (after an unclean shutdown) also write the markers the partitions lost."""
        for metadata in list(self.transactions.values()):
            if metadata.state.is_prepare:
                log.info(
                    "completing transaction of %r (%s) left by the last run",
                    metadata.transactional_id,
                    metadata.state.value,
                )
                self._write_markers_and_complete(metadata, set(metadata.partitions), set(metadata.groups))
        if reconcile_markers:
            self.reconcile_markers()

    def reconcile_markers(self) -> int:
        """Write again the markers of completed transactions that the partitions do not hold; how many were written.

        The coordinator journals CompleteCommit/CompleteAbort after the markers are appended, but neither is
        fsynced at each transaction: a crash can leave the journal saying complete while log recovery cut the
        marker off a partition's torn tail. That partition then holds the transaction open for ever (the last
        stable offset stuck, every other transactional producer's records invisible to read_committed). Kafka's
        coordinator keeps sending markers until they are durable; here, at start-up, the partitions of each id's
        last completed transaction (what a crash loses: the newest writes) are checked, and every transaction they
        hold open that the coordinator does not consider ongoing there is ended: with the decided outcome if it is
        that last completed transaction, else aborted, the outcome of an older one being unknown (as an operator's
        ``kafka-transactions.sh abort`` would). A marker that cannot be written is retried on the timer. A
        transaction of a producer the coordinator does not know, or on a partition not checked, is left for an
        operator: ``kbroker transactions find-hanging`` lists it and ``kbroker transactions abort`` ends it
        (KIP-664).
        """
        by_producer: dict[int, TransactionMetadata] = {}
        partitions: set[tuple[str, int]] = set()
        for metadata in self.transactions.values():
            done = metadata.last_completed
            if done is not None:
                partitions |= done.partitions
                by_producer.setdefault(done.producer_id, metadata)
            if metadata.previous_producer_id != NO_PRODUCER_ID:
                by_producer.setdefault(metadata.previous_producer_id, metadata)
            by_producer[metadata.producer_id] = metadata
        written = 0
        now = self._now_ms()
        for topic, index in sorted(partitions):
            try:
                target = self._partition(topic, index)
                views = list(target.producers_view()) if target is not None else []
            except (KafkaError, OSError, StorageError) as exc:
                log.warning("%s-%d: its open transactions cannot be checked: %s", topic, index, exc)
                continue
            for view in views:
                if view.current_txn_start_offset < 0:
                    continue
                owner = by_producer.get(view.producer_id)
                if owner is None:
                    continue
                owed = self._owed_marker(owner, view, (topic, index))
                if owed is None:
                    continue
                commit, epoch = owed
                log.warning(
                    "%s-%d: the transaction of producer %d (transactional id %r) starting at offset %d has no marker; "
                    "writing its %s marker again",
                    topic,
                    index,
                    view.producer_id,
                    owner.transactional_id,
                    view.current_txn_start_offset,
                    "commit" if commit else "abort",
                )
                repair = _Repair(owner.transactional_id, view.producer_id, epoch, commit)
                if self._repair(topic, index, repair, now):
                    written += 1
        return written

    def _repair(self, topic: str, index: int, repair: _Repair, now: int) -> bool:
        """Write a marker reconciliation owes; False if it failed and waits for a retry on the timer."""
        written = self._write_marker_for(
            repair.transactional_id, repair.producer_id, repair.marker_epoch, topic, index, repair.commit, now
        )
        if written:
            self._pending_repairs.pop((topic, index), None)
            return True
        self._pending_repairs[(topic, index)] = repair
        self._schedule_marker_retry(now)
        return False

    @staticmethod
    def _owed_marker(
        metadata: TransactionMetadata, view: OpenTransaction, partition: tuple[str, int]
    ) -> tuple[bool, int] | None:
        """The marker (commit?, epoch) owed to a transaction a partition holds open; None if it is still ongoing."""
        if view.producer_id == metadata.producer_id and partition in metadata.partitions:
            if metadata.state.is_prepare:
                return None  # its markers are being written (retried on the timer)
            if metadata.state is TxnState.ONGOING and view.producer_epoch >= metadata.producer_epoch:
                return None  # the transaction in progress: its EndTxn or timeout writes the marker
        done = metadata.last_completed
        if (
            done is not None
            and done.producer_id == view.producer_id
            and partition in done.partitions
            and view.producer_epoch <= done.marker_epoch
        ):
            return done.commit, done.marker_epoch
        return False, view.producer_epoch

    def _persist(self, metadata: TransactionMetadata | None, transactional_id: str) -> None:
        """Write ``metadata`` (None: the id is gone) to the id's __transaction_state partition, which makes it the
        id's state; TransactionLogError if the write fails, and then nothing changed."""
        if metadata is not None:
            records = [transaction_record(metadata.to_record(), self.offsets_partitions)]
        else:
            records = [transaction_tombstone(transactional_id)]
        try:
            self.ensure_topic()
            partition = self.partition_for(transactional_id)
            self.state_log.load_if_led(partition)
            written = self.state_log.write(partition, lambda shard: (records, None))
        except (OSError, StorageError, KafkaError) as exc:
            log.error("%s: writing the state of %r failed: %s", TRANSACTION_TOPIC, transactional_id, exc)
            raise TransactionLogError(f"writing {TRANSACTION_TOPIC} failed: {exc}") from None
        self._written_end[partition] = written.end_offset
        self._set_timer(transactional_id, metadata)

    async def replicated(self, transactional_id: str) -> ErrorCode:
        """Wait until the ISR has what the id's __transaction_state partition holds, as Kafka answers a transaction
        request only once its transition is appended with acks=-1: a coordinator failing over must leave its
        successor every transition a client was told of. NONE, or the error the client gets then (NOT_COORDINATOR
        if this broker stopped leading the partition, COORDINATOR_NOT_AVAILABLE if the ISR is too small or the
        wait timed out). At once on a single node."""
        if self._replicas is None:
            return ErrorCode.NONE
        partition = self.partition_for(transactional_id)
        end = self._written_end.get(partition)
        if end is None:
            return ErrorCode.NONE
        try:
            await self.state_log.committed(partition, end)
        except KafkaError as exc:
            log.info("%s-%d: %r not replicated: %s", TRANSACTION_TOPIC, partition, transactional_id, exc.message)
            return _REPLICATION_ERRORS.get(exc.code, ErrorCode.UNKNOWN_SERVER_ERROR)
        return ErrorCode.NONE

    def _state_replicated(self, transactional_id: str, end: int) -> bool:
        """The ISR (at least min.insync.replicas of it) has the id's __transaction_state partition up to ``end``."""
        if self._replicas is None or end < 0:
            return True
        replica = self._replicas.partition(TRANSACTION_TOPIC, self.partition_for(transactional_id))
        return replica is not None and replica.acks_reached(end) == ErrorCode.NONE

    def write_prepared_markers(self, transactional_id: str) -> None:
        """EndTxn's PrepareX is replicated: write its markers now rather than on the next timer."""
        pending = self._pending_markers.get(transactional_id)
        metadata = self.transactions.get(transactional_id)
        if pending is None or metadata is None or not metadata.state.is_prepare:
            return
        if self._state_replicated(transactional_id, pending.after):
            pending.after = -1
            self._write_markers_and_complete(metadata, pending.partitions, pending.groups)

    def _markers_after_replication(self, metadata: TransactionMetadata) -> bool:
        """In a cluster, PrepareX just written: its markers wait until the ISR has it (Kafka sends them from the
        append's completion), so a successor coordinator that never saw the decision finds no marker of it; True
        if so deferred (written by ``write_prepared_markers`` or the timer)."""
        end = self._written_end.get(self.partition_for(metadata.transactional_id), -1)
        if self._state_replicated(metadata.transactional_id, end):
            return False  # already (a single node's own log): written at once
        owed = _PendingMarkers(set(metadata.partitions), set(metadata.groups), after=end)
        self._pending_markers[metadata.transactional_id] = owed
        self._schedule_marker_retry(self._now_ms())
        return True

    def flush(self) -> None:
        for partition in range(self.partition_count):
            plog = self.logs.get_partition(TRANSACTION_TOPIC, partition) if self._loaded else None
            if plog is not None and not plog.sync():
                raise StorageError(f"fsync of {TRANSACTION_TOPIC}-{partition} failed")

    def close(self) -> None:
        """Forget the shards; the partitions close with the broker's logs (or here, with a log manager of its own)."""
        self.state_log.shards.clear()
        self._loaded = False
        if self._owns_logs:
            self.logs.close()

    # --- InitProducerId ----------------------------------------------------------------------------------

    def valid_timeout(self, timeout_ms: int) -> bool:
        return 0 < timeout_ms <= self.max_timeout_ms

    def init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None = None
    ) -> ProducerIdAndEpoch:
        """InitProducerId with a transactional id; ``expected`` is the (producer id, epoch) of KIP-360."""
        if not transactional_id:
            return ProducerIdAndEpoch(ErrorCode.INVALID_REQUEST)
        if self.coordinated_elsewhere(transactional_id):
            return ProducerIdAndEpoch(ErrorCode.NOT_COORDINATOR)
        if not self.valid_timeout(timeout_ms):
            return ProducerIdAndEpoch(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        now = self._now_ms()
        metadata = self.transactions.get(transactional_id)
        if metadata is None:
            # A new id: epoch -1 until the bump below makes it 0 (Kafka creates it the same way).
            metadata = TransactionMetadata(
                transactional_id, self._allocate_producer_id(), NO_PRODUCER_EPOCH, timeout_ms, last_update_ms=now
            )
        if transactional_id in self._pending_markers:
            return ProducerIdAndEpoch(ErrorCode.CONCURRENT_TRANSACTIONS)
        if expected is not None and not self._is_valid_producer_id(metadata, expected):
            return ProducerIdAndEpoch(ErrorCode.PRODUCER_FENCED)
        try:
            if metadata.state.is_prepare:
                return ProducerIdAndEpoch(ErrorCode.CONCURRENT_TRANSACTIONS)
            if metadata.state is TxnState.ONGOING:
                # Abort the previous instance's transaction, fencing it; the client retries and is bumped again.
                self._fence_and_abort(metadata)
                return ProducerIdAndEpoch(ErrorCode.CONCURRENT_TRANSACTIONS)
            if metadata.epoch_exhausted and (expected is None or expected[1] == metadata.producer_epoch):
                rotated = metadata._replace(
                    producer_id=self._allocate_producer_id(),
                    producer_epoch=0,
                    last_producer_epoch=metadata.producer_epoch if expected is not None else NO_PRODUCER_EPOCH,
                    previous_producer_id=metadata.producer_id,
                    next_producer_id=NO_PRODUCER_ID,
                    timeout_ms=timeout_ms,
                    state=TxnState.EMPTY,
                    partitions=frozenset(),
                    groups=frozenset(),
                    start_ms=-1,
                    last_update_ms=now,
                )
                self._persist(rotated, transactional_id)
                return ProducerIdAndEpoch(ErrorCode.NONE, rotated.producer_id, rotated.producer_epoch)
            bumped = self._increment_epoch(metadata, expected)
            if isinstance(bumped, ErrorCode):
                return ProducerIdAndEpoch(bumped)
            epoch, last_epoch = bumped
            new = metadata._replace(
                producer_epoch=epoch,
                last_producer_epoch=last_epoch,
                next_producer_id=NO_PRODUCER_ID,
                timeout_ms=timeout_ms,
                state=TxnState.EMPTY,
                partitions=frozenset(),
                groups=frozenset(),
                start_ms=-1,
                last_update_ms=now,
            )
            self._persist(new, transactional_id)
        except TransactionLogError:
            return ProducerIdAndEpoch(ErrorCode.NOT_COORDINATOR)
        log.debug("transactional id %r: producer id %d epoch %d", transactional_id, new.producer_id, epoch)
        return ProducerIdAndEpoch(ErrorCode.NONE, new.producer_id, new.producer_epoch)

    @staticmethod
    def _is_valid_producer_id(metadata: TransactionMetadata, expected: tuple[int, int]) -> bool:
        """Kafka's isValidProducerId: a new id, the current producer id, or a retry across a producer id rotation."""
        producer_id, epoch = expected
        return (
            metadata.producer_epoch == NO_PRODUCER_EPOCH
            or producer_id == metadata.producer_id
            or (producer_id == metadata.previous_producer_id and epoch >= MAX_EPOCH - 1)
        )

    @staticmethod
    def _increment_epoch(
        metadata: TransactionMetadata, expected: tuple[int, int] | None
    ) -> tuple[int, int] | ErrorCode:
        """Kafka's prepareIncrementProducerEpoch: (new epoch, last epoch), or PRODUCER_FENCED."""
        bumped = metadata.producer_epoch + 1
        if expected is None:
            return bumped, NO_PRODUCER_EPOCH  # a new instance: always bump
        expected_epoch = expected[1]
        if metadata.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == metadata.producer_epoch:
            return bumped, metadata.producer_epoch  # the same instance continuing after an abortable error
        if expected_epoch == metadata.last_producer_epoch:
            return metadata.producer_epoch, metadata.last_producer_epoch  # a retry of a bump that succeeded
        return ErrorCode.PRODUCER_FENCED

    # --- the producer's checks -------------------------------------------------------------------------

    def _check_producer(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> TransactionMetadata | ErrorCode:
        """The id's metadata if this producer is its current one and no transaction is completing."""
        if not transactional_id:
            return ErrorCode.INVALID_REQUEST
        if self.coordinated_elsewhere(transactional_id):
            return ErrorCode.NOT_COORDINATOR
        metadata = self.transactions.get(transactional_id)
        if metadata is None or metadata.producer_id != producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING
        if metadata.producer_epoch != producer_epoch:
            return ErrorCode.PRODUCER_FENCED
        if metadata.state.is_prepare or transactional_id in self._pending_markers:
            return ErrorCode.CONCURRENT_TRANSACTIONS
        return metadata

    def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Iterable[tuple[str, int]]
    ) -> ErrorCode:
        """AddPartitionsToTxn: the partitions become part of the transaction (which starts if none is Ongoing)."""
        return self._add(transactional_id, producer_id, producer_epoch, frozenset(partitions), frozenset())

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str) -> ErrorCode:
        """AddOffsetsToTxn: the group's offsets committed in the transaction are applied when it commits."""
        return self._add(transactional_id, producer_id, producer_epoch, frozenset(), frozenset([group_id]))

    def _add(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: frozenset[tuple[str, int]],
        groups: frozenset[str],
    ) -> ErrorCode:
        metadata = self._check_producer(transactional_id, producer_id, producer_epoch)
        if isinstance(metadata, ErrorCode):
            return metadata
        if metadata.state is TxnState.ONGOING and partitions <= metadata.partitions and groups <= metadata.groups:
            return ErrorCode.NONE  # nothing new: nothing to write
        now = self._now_ms()
        if metadata.state is TxnState.ONGOING:
            new = metadata._replace(
                partitions=metadata.partitions | partitions,
                groups=metadata.groups | groups,
                last_update_ms=now,
            )
        else:  # Empty or Complete*: a new transaction starts now
            new = metadata._replace(
                state=TxnState.ONGOING, partitions=partitions, groups=groups, start_ms=now, last_update_ms=now
            )
        try:
            self._persist(new, transactional_id)
        except TransactionLogError:
            return ErrorCode.NOT_COORDINATOR
        self._wake(new)
        return ErrorCode.NONE

    def verify_partition(
        self,
        transactional_id: str | None,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
        *,
        produce_version: int | None = None,
    ) -> ErrorCode:
        """What Produce answers for a transactional batch (KIP-890 verification), as Kafka's
        AddPartitionsToTxnManager maps the coordinator's answer: NONE if the partition is in the producer's ongoing
        transaction. A TV2 producer (Produce v12+) adds the partition here instead of with AddPartitionsToTxn.
        Otherwise INVALID_TXN_STATE (TRANSACTION_ABORTABLE from Produce v11, which knows it), INVALID_PRODUCER_EPOCH
        for a fenced epoch, INVALID_PRODUCER_ID_MAPPING for another producer id, NOT_ENOUGH_REPLICAS (retriable)
        while a transaction completes."""
        if not transactional_id:
            return ErrorCode.INVALID_TXN_STATE
        if produce_version is not None and produce_version >= 12:
            code = self.add_partitions(transactional_id, producer_id, producer_epoch, [(topic, partition)])
        else:
            metadata = self._check_producer(transactional_id, producer_id, producer_epoch)
            if isinstance(metadata, ErrorCode):
                code = metadata
            elif metadata.state is TxnState.ONGOING and (topic, partition) in metadata.partitions:
                code = ErrorCode.NONE
            else:
                code = ErrorCode.TRANSACTION_ABORTABLE
        if code == ErrorCode.PRODUCER_FENCED:
            return ErrorCode.INVALID_PRODUCER_EPOCH
        if code in (ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.NOT_COORDINATOR):
            return ErrorCode.NOT_ENOUGH_REPLICAS
        if code == ErrorCode.TRANSACTION_ABORTABLE and (produce_version is None or produce_version < 11):
            return ErrorCode.INVALID_TXN_STATE  # what older clients understand
        return code

    def verify_offset_commit(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str, *, add: bool
    ) -> ErrorCode:
        """TxnOffsetCommit: NONE if the group is part of the producer's ongoing transaction; ``add`` (TxnOffsetCommit
        v5, a TV2 client) adds it as AddOffsetsToTxn would."""
        if add:
            code = self.add_offsets(transactional_id, producer_id, producer_epoch, group_id)
        else:
            metadata = self._check_producer(transactional_id, producer_id, producer_epoch)
            if isinstance(metadata, ErrorCode):
                code = metadata
            elif metadata.state is TxnState.ONGOING and group_id in metadata.groups:
                code = ErrorCode.NONE
            else:
                code = ErrorCode.INVALID_TXN_STATE
        if code == ErrorCode.PRODUCER_FENCED:
            return ErrorCode.INVALID_PRODUCER_EPOCH  # as Kafka's verification answers the group coordinator
        return code

    # --- EndTxn ----------------------------------------------------------------------------------------

    def end_transaction(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        *,
        transaction_version: int = 1,
    ) -> ProducerIdAndEpoch:
        """EndTxn: commit or abort (Kafka's endTransaction). With transaction version 2 (EndTxn v5) the epoch is
        bumped and the answer names the producer id and epoch the next transaction uses."""
        if not transactional_id:
            return ProducerIdAndEpoch(ErrorCode.INVALID_REQUEST)
        if self.coordinated_elsewhere(transactional_id):
            return ProducerIdAndEpoch(ErrorCode.NOT_COORDINATOR)
        metadata = self.transactions.get(transactional_id)
        if metadata is None:
            return ProducerIdAndEpoch(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        tv2 = transaction_version >= 2
        state = metadata.state
        # TV2: a retry of an EndTxn that already bumped the epoch (or moved to a new producer id) carries the old one.
        retry_on_bump = tv2 and producer_id == metadata.producer_id and producer_epoch == metadata.producer_epoch - 1
        retry_on_overflow = (
            tv2
            and producer_id == metadata.previous_producer_id
            and producer_epoch >= MAX_EPOCH - 1
            and metadata.producer_epoch == 0
        )
        is_retry = (retry_on_bump or retry_on_overflow) and (state.is_prepare or state.is_idle)
        if producer_id != metadata.producer_id and not retry_on_overflow:
            return ProducerIdAndEpoch(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if producer_epoch != metadata.producer_epoch and not is_retry:
            return ProducerIdAndEpoch(ErrorCode.PRODUCER_FENCED)
        if transactional_id in self._pending_markers:
            return ProducerIdAndEpoch(ErrorCode.CONCURRENT_TRANSACTIONS)
        wanted = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        if state is TxnState.ONGOING:
            return self._end(metadata, preparing, tv2)
        if state is preparing:
            return ProducerIdAndEpoch(ErrorCode.CONCURRENT_TRANSACTIONS)
        if state is wanted:
            if not tv2 or is_retry:
                return self._answer(ErrorCode.NONE, metadata, tv2)  # a retry of an EndTxn that succeeded
            if commit:
                return self._invalid(metadata, commit)
            return self._end(metadata, preparing, tv2)  # TV2: an abort after an abort is a new, empty transaction
        if tv2 and not commit and state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT) and not is_retry:
            return self._end(metadata, preparing, tv2)  # TV2 aborts an empty transaction (bumping the epoch)
        return self._invalid(metadata, commit)

    @staticmethod
    def _invalid(metadata: TransactionMetadata, commit: bool) -> ProducerIdAndEpoch:
        log.debug(
            "transactional id %r: EndTxn(%s) in state %s",
            metadata.transactional_id,
            "commit" if commit else "abort",
            metadata.state.value,
        )
        return ProducerIdAndEpoch(ErrorCode.INVALID_TXN_STATE)

    @staticmethod
    def _answer(error: ErrorCode, metadata: TransactionMetadata, tv2: bool) -> ProducerIdAndEpoch:
        if not tv2:
            return ProducerIdAndEpoch(error)
        if metadata.next_producer_id != NO_PRODUCER_ID:
            return ProducerIdAndEpoch(error, metadata.next_producer_id, 0)
        return ProducerIdAndEpoch(error, metadata.producer_id, metadata.producer_epoch)

    def _end(self, metadata: TransactionMetadata, preparing: TxnState, tv2: bool) -> ProducerIdAndEpoch:
        now = self._now_ms()
        if tv2:
            # KIP-890: every transaction ends with an epoch bump; the markers carry the bumped epoch.
            next_producer_id = self._allocate_producer_id() if metadata.epoch_exhausted else NO_PRODUCER_ID
            prepared = metadata._replace(
                state=preparing,
                producer_epoch=metadata.producer_epoch + 1,
                last_producer_epoch=metadata.producer_epoch,
                next_producer_id=next_producer_id,
                last_update_ms=now,
                transaction_version=2,
            )
        else:
            prepared = metadata._replace(state=preparing, last_update_ms=now, transaction_version=1)
        try:
            self._persist(prepared, metadata.transactional_id)
        except TransactionLogError:
            return ProducerIdAndEpoch(ErrorCode.NOT_COORDINATOR)
        if self._markers_after_replication(prepared):
            return self._answer(ErrorCode.NONE, prepared, tv2)
        completed = self._write_markers_and_complete(prepared, set(prepared.partitions), set(prepared.groups))
        # The decision is persisted: the answer is NONE even if some markers wait for a retry (as Kafka).
        return self._answer(ErrorCode.NONE, completed or prepared, tv2)

    def _fence_and_abort(self, metadata: TransactionMetadata) -> None:
        """Abort an Ongoing transaction with the epoch bumped (Kafka's PrepareEpochFence, then PrepareAbort), so
        the producer that started it is fenced: a new instance took over, or the transaction timed out."""
        fenced_epoch = metadata.producer_epoch + 1 if metadata.producer_epoch < MAX_EPOCH else metadata.producer_epoch
        aborting = metadata._replace(
            state=TxnState.PREPARE_ABORT,
            producer_epoch=fenced_epoch,
            last_producer_epoch=NO_PRODUCER_EPOCH,
            last_update_ms=self._now_ms(),
        )
        self._persist(aborting, metadata.transactional_id)
        if not self._markers_after_replication(aborting):
            self._write_markers_and_complete(aborting, set(aborting.partitions), set(aborting.groups))

    def _write_markers_and_complete(
        self, metadata: TransactionMetadata, partitions: set[tuple[str, int]], groups: set[str]
    ) -> TransactionMetadata | None:
        """Write the markers still owed, then CompleteCommit/CompleteAbort; None if some must be retried."""
        commit = metadata.state is TxnState.PREPARE_COMMIT
        now = self._now_ms()
        for topic, index in sorted(partitions):
            if self._write_marker(metadata, topic, index, commit, now):
                partitions.discard((topic, index))
        for group in sorted(groups):
            if self._send_group_marker(metadata, group, commit):
                continue  # its __consumer_offsets partition is led elsewhere: done when that broker wrote it
            try:
                self._offsets.complete_transaction(
                    group, metadata.producer_id, commit, self._coordinator_epoch(metadata.transactional_id)
                )
            except StorageError as exc:
                log.warning(
                    "transactional id %r: offsets of group %r not completed yet: %s",
                    metadata.transactional_id,
                    group,
                    exc,
                )
                continue
            groups.discard(group)
        if partitions or groups:
            self._pending_markers[metadata.transactional_id] = _PendingMarkers(partitions, groups)
            self._schedule_marker_retry(now)
            return None
        self._pending_markers.pop(metadata.transactional_id, None)
        completed = metadata._replace(
            state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
            partitions=frozenset(),
            groups=frozenset(),
            last_update_ms=now,
            last_completed=CompletedTransaction(
                metadata.producer_id, metadata.producer_epoch, commit, metadata.partitions
            ),
        )
        if metadata.next_producer_id != NO_PRODUCER_ID:  # TV2 with the epoch exhausted: move to the new id
            completed = completed._replace(
                producer_id=metadata.next_producer_id,
                producer_epoch=0,
                previous_producer_id=metadata.producer_id,
                last_producer_epoch=NO_PRODUCER_EPOCH,
                next_producer_id=NO_PRODUCER_ID,
            )
        try:
            self._persist(completed, metadata.transactional_id)
        except TransactionLogError:
            # The markers are written; the completion is retried (writing them again is harmless).
            self._pending_markers[metadata.transactional_id] = _PendingMarkers()
            self._schedule_marker_retry(now)
            return None
        return completed

    def _write_marker(self, metadata: TransactionMetadata, topic: str, index: int, commit: bool, now: int) -> bool:
        """Append one marker; False if it must be retried."""
        return self._write_marker_for(
            metadata.transactional_id,
            metadata.producer_id,
            metadata.producer_epoch,
            topic,
            index,
            commit,
            now,
            transaction_version=metadata.transaction_version,
        )

    def _write_marker_for(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        topic: str,
        index: int,
        commit: bool,
        now: int,
        *,
        transaction_version: int = 1,
    ) -> bool:
        leader = self._leader_of(topic, index)
        if self.remote is not None and leader is not None:
            # In a cluster: WriteTxnMarkers to its leader until written, this broker included (as Kafka's marker
            # channel does), so the marker is appended as leader and counts once the ISR has it; after which
            # ``remote_marker_written`` takes it off what this transaction owes.
            self.remote.send(
                self._remote_marker(transactional_id, producer_id, epoch, commit, topic, index, transaction_version)
            )
            return False
        if topic == OFFSETS_TOPIC and leader is not None:
            # Added by a TxnOffsetCommit verified from another broker (transaction version 2): the marker goes
            # through the group coordinator's shard, which applies or drops the pending offsets there.
            try:
                self._offsets.complete_partition_transaction(
                    index, producer_id, commit, self._coordinator_epoch(transactional_id)
                )
            except StorageError as exc:
                log.warning("transactional id %r: %s-%d not completed yet: %s", transactional_id, topic, index, exc)
                return False
            return True
        try:
            target = self._partition(topic, index)
            if target is None:
                return True  # the topic was deleted: Kafka drops the markers of unknown partitions too
            coordinator_epoch = self.state_log.coordinator_epoch(self.partition_for(transactional_id))
            result = target.append_marker(producer_id, epoch, commit, coordinator_epoch, now)
        except KafkaError as exc:
            code, message = exc.code, exc.message
        except (OSError, StorageError) as exc:
            code, message = ErrorCode.KAFKA_STORAGE_ERROR, str(exc)
        else:
            code = getattr(result, "error_code", ErrorCode.NONE)
            message = getattr(result, "error_message", None)
        if code == ErrorCode.NONE:
            return True
        if code in (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION):
            # The partition knows a newer epoch of this producer (or is gone): as Kafka, the marker is dropped.
            log.warning(
                "transactional id %r: %s marker for %s-%d not written: %s",
                transactional_id,
                "commit" if commit else "abort",
                topic,
                index,
                code.name,
            )
            return True
        log.warning(
            "transactional id %r: %s marker for %s-%d failed (%s: %s); retrying",
            transactional_id,
            "commit" if commit else "abort",
            topic,
            index,
            code.name,
            message,
        )
        return False

    def _coordinator_epoch(self, transactional_id: str) -> int:
        """The epoch this broker coordinates the id in, which its markers carry (Kafka's coordinatorEpoch)."""
        return self.state_log.coordinator_epoch(self.partition_for(transactional_id))

    def _leader_of(self, topic: str, index: int) -> int | None:
        """The partition's leader in the metadata image (-1: none now); None without a replica layer or for a
        partition the image does not have."""
        if self._replicas is None:
            return None
        registration = self._replicas.leadership.partition(topic, index)
        return None if registration is None else registration.leader

    def _remote_marker(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        commit: bool,
        topic: str,
        index: int,
        transaction_version: int,
    ) -> RemoteMarker:
        from kbroker.transactions.remote import RemoteMarker

        coordinator_epoch = self.state_log.coordinator_epoch(self.partition_for(transactional_id))
        return RemoteMarker(
            transactional_id, producer_id, epoch, commit, coordinator_epoch, transaction_version, topic, index
        )

    def _send_group_marker(self, metadata: TransactionMetadata, group: str, commit: bool) -> bool:
        """In a cluster a group's offsets partition gets its marker from its leader, this broker included (Kafka
        writes the marker to the group's __consumer_offsets partition like any other); False if there is no
        replica layer (a single node completes it itself)."""
        index = coordinator_partition(group, self.offsets_partitions)
        leader = self._leader_of(OFFSETS_TOPIC, index)
        if self.remote is None or leader is None:
            return False
        marker = self._remote_marker(
            metadata.transactional_id,
            metadata.producer_id,
            metadata.producer_epoch,
            commit,
            OFFSETS_TOPIC,
            index,
            metadata.transaction_version,
        )
        self.remote.send(marker)
        return True

    def owes_marker(self, marker: RemoteMarker) -> bool:
        """This broker still coordinates the marker's transactional id, in the coordinator epoch the marker carries
        (Kafka cancels a marker whose coordinator lost the partition or loaded it again since)."""
        partition = self.partition_for(marker.transactional_id)
        return (
            partition in self.state_log.shards
            and self.state_log.coordinator_epoch(partition) == marker.coordinator_epoch
        )

    def remote_marker_written(self, marker: RemoteMarker) -> None:
        """Another broker wrote (or, as Kafka, dropped) a marker sent to it: the transaction that owed it completes
        once nothing else is owed."""
        key = (marker.topic, marker.partition)
        repair = self._pending_repairs.get(key)
        if repair is not None and (repair.transactional_id, repair.producer_id) == (
            marker.transactional_id,
            marker.producer_id,
        ):
            del self._pending_repairs[key]
        transactional_id = marker.transactional_id
        pending = self._pending_markers.get(transactional_id)
        metadata = self.transactions.get(transactional_id)
        if (
            pending is None
            or metadata is None
            or not metadata.state.is_prepare
            or (metadata.producer_id, metadata.producer_epoch) != (marker.producer_id, marker.producer_epoch)
        ):
            return  # a marker of a transaction already completed (a resend), or of another coordinator's now
        pending.partitions.discard(key)
        if marker.topic == OFFSETS_TOPIC:
            pending.groups = {
                g for g in pending.groups if coordinator_partition(g, self.offsets_partitions) != marker.partition
            }
        if not pending.partitions and not pending.groups:
            self._write_markers_and_complete(metadata, pending.partitions, pending.groups)

    def _schedule_marker_retry(self, now: int) -> None:
        self._marker_retry_ms = now + int(MARKER_RETRY_SECONDS * 1000)
        if self._runtime is not None:
            self._runtime.wake()

    # --- timers ----------------------------------------------------------------------------------------

    def _deadline_ms(self, metadata: TransactionMetadata) -> int | None:
        if metadata.state is TxnState.ONGOING:
            return metadata.start_ms + metadata.timeout_ms
        if metadata.state.is_idle:
            return metadata.last_update_ms + self.id_expiration_ms
        return None

    def _set_timer(self, transactional_id: str, metadata: TransactionMetadata | None) -> None:
        """Keep the id's timer in step with its state (a heap with stale entries skipped, not a scan of every id)."""
        deadline = None if metadata is None else self._deadline_ms(metadata)
        if deadline is None:
            self._timer_at.pop(transactional_id, None)
            return
        if self._timer_at.get(transactional_id) == deadline:
            return
        self._timer_at[transactional_id] = deadline
        heapq.heappush(self._timers, (deadline, transactional_id))
        if len(self._timers) > 2 * len(self._timer_at) + 1000:  # mostly stale entries: rebuild
            self._timers = [(at, tid) for tid, at in self._timer_at.items()]
            heapq.heapify(self._timers)

    def _earliest_timer(self) -> tuple[int, str] | None:
        while self._timers:
            deadline, transactional_id = self._timers[0]
            if self._timer_at.get(transactional_id) == deadline:
                return deadline, transactional_id
            heapq.heappop(self._timers)  # superseded by a later transition
        return None

    def next_deadline_ms(self) -> int | None:
        """The wall-clock time of the earliest timer: a transaction timeout, an id expiry, a marker retry."""
        deadlines = []
        earliest = self._earliest_timer()
        if earliest is not None:
            deadlines.append(earliest[0])
        if self._pending_markers or self._pending_repairs:
            deadlines.append(self._marker_retry_ms)
        if not deadlines:
            return None
        return max(min(deadlines), self._backoff_until_ms)  # after a failed write, not before the back-off

    def next_deadline(self, now: float) -> float | None:
        """The runtime's clock (seconds) at which the earliest timer is due."""
        due_ms = self.next_deadline_ms()
        if due_ms is None:
            return None
        return now + max(0, due_ms - self._now_ms()) / 1000

    def tick(self, now: float | None = None) -> None:
        """Fire the due timers: retry markers, abort timed-out transactions, forget expired ids."""
        now_ms = self._now_ms()
        if now_ms < self._backoff_until_ms:
            return
        if not self.acting():
            self._backoff_until_ms = now_ms + int(MARKER_RETRY_SECONDS * 1000)
            return
        if self._pending_repairs and self._marker_retry_ms <= now_ms:
            for (topic, index), repair in list(self._pending_repairs.items()):
                self._repair(topic, index, repair, now_ms)
        if self._pending_markers and self._marker_retry_ms <= now_ms:
            for transactional_id, pending in list(self._pending_markers.items()):
                metadata = self.transactions.get(transactional_id)
                if metadata is None or not metadata.state.is_prepare:
                    self._pending_markers.pop(transactional_id, None)
                    continue
                if not self._state_replicated(transactional_id, pending.after):
                    self._schedule_marker_retry(now_ms)  # PrepareX not on the ISR yet: looked at again
                    continue
                pending.after = -1
                self._write_markers_and_complete(metadata, pending.partitions, pending.groups)
        while (earliest := self._earliest_timer()) is not None and earliest[0] <= now_ms:
            transactional_id = earliest[1]
            heapq.heappop(self._timers)
            del self._timer_at[transactional_id]
            metadata = self.transactions.get(transactional_id)
            if metadata is None or transactional_id in self._pending_markers:
                continue
            try:
                if metadata.state is TxnState.ONGOING:
                    log.info(
                        "transactional id %r: transaction timed out after %d ms; aborting it",
                        transactional_id,
                        metadata.timeout_ms,
                    )
                    self._fence_and_abort(metadata)
                elif metadata.state.is_idle:
                    log.info("transactional id %r expired", transactional_id)
                    self._persist(None, transactional_id)
            except TransactionLogError:  # logged; the timers wait a moment before trying again
                self._set_timer(transactional_id, metadata)
                self._backoff_until_ms = now_ms + int(MARKER_RETRY_SECONDS * 1000)
                return

    def _wake(self, metadata: TransactionMetadata) -> None:
        """A new transaction's timeout may be earlier than what the runtime waits for: tell it (a comparison when
        it plans to wake earlier anyway)."""
        deadline = self._deadline_ms(metadata)
        if self._runtime is None or deadline is None:
            return
        try:
            runtime_now = trio.current_time()
        except RuntimeError:  # not in trio (a test driving the coordinator by hand): look now
            self._runtime.wake()
            return
        self._runtime.wake(at=runtime_now + max(0, deadline - self._now_ms()) / 1000)

    # --- views -----------------------------------------------------------------------------------------

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        return self.transactions.get(transactional_id)
