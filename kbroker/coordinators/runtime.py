"""A small CoordinatorRuntime, as Kafka's: coordinator state kept as the replay of an internal topic's partitions.

A coordinator's state is split into shards, one per partition of its internal topic (``__consumer_offsets``,
``__transaction_state``). An operation runs against one shard's state and returns the records that describe its
change and the response to give; the runtime appends the records as one batch to the shard's partition, replays
them into the shard (so the state in memory is always the replay of the log, one code path for writes and
loading), and the response is given once the batch is committed: once the partition's high watermark has passed
it. Writes go through the replica layer (kbroker/replication: the partition's ``append_as_leader``, its
``acks_reached`` as an acks=all produce waits) when the runtime is given it; on a single node the high watermark
follows appends, so a write is committed at once. A write not committed within ``COMMIT_TIMEOUT_SECONDS``
(Kafka's offsets.commit.timeout.ms default) answers REQUEST_TIMED_OUT.

A failed append changes nothing: the records are replayed only once written. With flush.messages reached
(log.flush.interval.messages=1) the partition is fsynced before they are replayed, as a produce is before it is
acknowledged.

A shard is loaded by replaying its partition from the log start when this broker becomes the partition's leader
(told by the replica layer, which applies the metadata image's registrations; and for every partition the
image gives this broker when the coordinator starts) and unloaded when it stops being leader. Records of a
transaction (TxnOffsetCommit) are written as a transactional batch of the producer, and the transaction's end as
Kafka's commit or abort marker; the shard sees both in order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, NamedTuple, Protocol, TypeVar

from kbroker.storage import PartitionLog
from kbroker.storage.segment import wall_clock_ms
from protocol.errors import ErrorCode, KafkaError
from protocol.records import (
    BatchHeader,
    ControlRecordType,
    Record,
    build_batch,
    decode_records,
    iter_batches,
    parse_control_record,
)

if TYPE_CHECKING:
    from kbroker.replication import Partition, ReplicaManager

log = logging.getLogger("kbroker.coordinators")

# (key, value) of one coordinator record; a None value is a tombstone.
CoordinatorRecord = tuple[bytes, bytes | None]
NO_PRODUCER = -1
_LOAD_READ_BYTES = 1 << 20
COMMIT_TIMEOUT_SECONDS = 5.0
ALL_REPLICAS = -1  # coordinator records are written as with acks=all


class CoordinatorShard(Protocol):
    """The state of one partition of a coordinator's topic, rebuilt by replaying its records in order."""

    def replay(
        self, offset: int, producer_id: int, producer_epoch: int, key: bytes | None, value: bytes | None
    ) -> None:
        """Apply one record; ``producer_id`` and its epoch: the transaction's producer (NO_PRODUCER outside one)."""
        ...

    def replay_end_transaction(self, producer_id: int, commit: bool, offset: int = -1) -> None:
        """Apply a transaction marker (at ``offset``): the producer's records replayed so far are committed or
        aborted."""
        ...


S = TypeVar("S", bound=CoordinatorShard)
R = TypeVar("R")


class Transaction(NamedTuple):
    """The producer whose transaction a batch belongs to (TxnOffsetCommit)."""

    producer_id: int
    producer_epoch: int


@dataclass(slots=True)
class _Answer:
    """Where the replica layer's acks=all wait puts its outcome."""

    error_code: int = ErrorCode.NONE


class Written(NamedTuple, Generic[R]):
    """An operation's response, and the offset after its batch (what the high watermark must pass)."""

    response: R
    end_offset: int


class CoordinatorRuntime(Generic[S]):
    """Shards of one coordinator, each keyed by a partition of ``topic``."""

    def __init__(
        self,
        topic: str,
        partition_log: Callable[[str, int], PartitionLog | None],
        new_shard: Callable[[int], S],
        *,
        replicas: ReplicaManager | None = None,
        loaded: Callable[[int], None] | None = None,
        unloaded: Callable[[int], None] | None = None,
    ) -> None:
        """``replicas``: the replica layer the records are written through, whose changes of leadership load and
        unload shards; without it (unit tests) the logs are written directly, a single node's own replicas.
        ``loaded``: told of each partition whose shard was loaded (timers and pending work the coordinator keeps
        beside it are set up again); ``unloaded``: of each whose shard is dropped."""
        self.topic = topic
        self._replicas = replicas
        self._partition_log = partition_log
        self._new_shard = new_shard
        self._loaded = loaded
        self._unloaded = unloaded
        self.shards: dict[int, S] = {}
        self.shard_epochs: dict[int, int] = {}  # the leader epoch each shard was loaded in (-1: no replica layer)
        if replicas is not None:
            replicas.on_role_change(self._role_changed)

    # --- leadership ------------------------------------------------------------------------------------

    def load(self, partition: int) -> S:
        """This broker leads ``partition``: a new shard, the replay of the partition from its log start."""
        plog = self._log(partition)
        replica = self._replica(partition)
        if replica is not None and not replica.is_leader:
            raise KafkaError(ErrorCode.NOT_COORDINATOR, f"this broker does not lead {self.topic}-{partition}")
        shard = self._new_shard(partition)
        offset = plog.log_start_offset
        end = plog.log_end_offset
        while offset < end:
            chunk = plog.read(offset, _LOAD_READ_BYTES, max_offset=end)
            if chunk.size == 0:
                break
            for header, batch in iter_batches(chunk.read_bytes()):
                if header.is_control:
                    marker, _ = parse_control_record(decode_records(batch)[0])
                    commit = marker == ControlRecordType.COMMIT
                    shard.replay_end_transaction(header.producer_id, commit, header.base_offset)
                    continue
                producer = header.producer_id if header.is_transactional else NO_PRODUCER
                for record in decode_records(batch):
                    offset = header.base_offset + record.offset_delta
                    shard.replay(offset, producer, header.producer_epoch, record.key, record.value)
            offset = chunk.last_offset + 1
        self.shards[partition] = shard
        self.shard_epochs[partition] = replica.leader_epoch if replica is not None else -1
        if self._loaded is not None:
            self._loaded(partition)
        return shard

    def coordinator_epoch(self, partition: int) -> int:
        """The epoch this broker coordinates ``partition``'s keys in: the partition's leader epoch when its shard
        was loaded (Kafka's coordinatorEpoch, written in transaction markers so a zombie coordinator's are
        refused); 0 without a replica layer."""
        return max(self.shard_epochs.get(partition, 0), 0)

    def unload(self, partition: int) -> None:
        """This broker no longer leads ``partition``: its shard is dropped (requests for it: NOT_COORDINATOR)."""
        self.shard_epochs.pop(partition, None)
        if self.shards.pop(partition, None) is not None and self._unloaded is not None:
            self._unloaded(partition)

    def _role_changed(self, replica: Partition) -> None:
        """The replica layer applied a registration (or stopped a replica): as Kafka's coordinator, a shard is
        loaded when this broker becomes its partition's leader (again from the log, in a newer leader epoch) and
        unloaded when it stops leading it."""
        if replica.topic != self.topic:
            return
        index = replica.index
        if not replica.is_leader:
            self.unload(index)
            return
        if self.shard_epochs.get(index) == replica.leader_epoch:
            return
        self.unload(index)
        try:
            self.load(index)
        except KafkaError as exc:  # its coordinator's next use loads it (FindCoordinator, a commit)
            log.warning("%s-%d is not loaded (tried again on use): %s", self.topic, index, exc)

    def load_if_led(self, partition: int) -> bool:
        """Load ``partition``'s shard now if this broker leads it and it is not loaded (its log was not open when
        leadership came, its files were still being made, or a reload failed); whether it is loaded. Only what
        this broker leads is loaded: another broker's partitions are that broker's coordinator's."""
        if partition in self.shards:
            return True
        if not self.leads(partition):
            return False
        try:
            self.load(partition)
        except KafkaError as exc:
            log.debug("%s-%d is not loaded yet: %s", self.topic, partition, exc)
            return False
        return True

    def loading(self, partition: int) -> bool:
        """This broker is to coordinate ``partition``'s keys but its shard is not loaded, nor loadable now (the
        replica is not leader yet, its log not open yet): Kafka's coordinator context in its LOADING state, whose
        requests are answered COORDINATOR_LOAD_IN_PROGRESS (the client retries the same coordinator). A partition
        that neither the image registers nor this broker holds yet is not loading: its topic is still to create."""
        if self.load_if_led(partition):
            return False
        if self._replicas is not None:
            return self.leads(partition)
        return self._partition_log(self.topic, partition) is not None

    def shard(self, partition: int) -> S:
        shard = self.shards.get(partition)
        if shard is None:
            raise KafkaError(ErrorCode.NOT_COORDINATOR, f"{self.topic}-{partition} is not loaded on this broker")
        return shard

    # --- writes ----------------------------------------------------------------------------------------

    def write(
        self,
        partition: int,
        operation: Callable[[S], tuple[list[CoordinatorRecord], R]],
        *,
        transaction: Transaction | None = None,
    ) -> Written[R]:
        """Run ``operation`` on the shard, append its records as one batch and replay them into the shard.

        KafkaError (NOT_COORDINATOR if the shard is not loaded, else the append's error) with nothing changed
        if the records could not be written (or fsynced, when flush.messages asks for it).
        """
        shard = self.shard(partition)
        records, response = operation(shard)
        if not records:
            return Written(response, -1)
        plog = self._log(partition)
        producer_id = transaction.producer_id if transaction is not None else NO_PRODUCER
        producer_epoch = transaction.producer_epoch if transaction is not None else -1
        batch = build_batch(
            [Record(offset_delta=i, key=key, value=value) for i, (key, value) in enumerate(records)],
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=_next_sequence(plog, transaction) if transaction is not None else -1,
            is_transactional=transaction is not None,
        )
        # Built here, so not validated again (Kafka's coordinator appends skip the produce validation too).
        header = BatchHeader.parse(batch)
        replica = self._replica(partition)
        if replica is not None:
            result = replica.append_as_leader(bytearray(batch), header, ALL_REPLICAS, now_ms=wall_clock_ms())
        else:
            result = plog.append(bytearray(batch), header)
        if result.error_code != ErrorCode.NONE:
            code = ErrorCode(result.error_code)
            raise KafkaError(code, result.error_message or f"append to {self.topic}-{partition} failed: {code.name}")
        self._sync_if_due(plog)
        for i, (key, value) in enumerate(records):
            shard.replay(result.base_offset + i, producer_id, producer_epoch, key, value)
        return Written(response, result.base_offset + len(records))

    def end_transaction(self, partition: int, transaction: Transaction, commit: bool, coordinator_epoch: int) -> int:
        """Write the transaction's commit or abort marker and replay it; returns the offset after it."""
        shard = self.shard(partition)
        plog = self._log(partition)
        result = plog.append_marker(transaction.producer_id, transaction.producer_epoch, commit, coordinator_epoch)
        if result.error_code != ErrorCode.NONE:
            raise KafkaError(result.error_code, result.error_message or f"marker to {self.topic}-{partition} failed")
        self._sync_if_due(plog)
        shard.replay_end_transaction(transaction.producer_id, commit, result.base_offset)
        return result.base_offset + 1

    async def committed(self, partition: int, end_offset: int) -> None:
        """Return once the partition's high watermark reached ``end_offset`` (at once on a single node): through
        the replica layer, the wait of an acks=all produce.

        KafkaError: NOT_COORDINATOR if this broker stopped leading the partition meanwhile, the replica layer's
        NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below min.insync.replicas, REQUEST_TIMED_OUT after
        COMMIT_TIMEOUT_SECONDS."""
        replica = self._replica(partition)
        if replica is None:
            plog = self._log(partition)
            if plog.high_watermark < end_offset:  # only a replica layer holds the high watermark back
                raise KafkaError(ErrorCode.NOT_COORDINATOR, f"{self.topic}-{partition} has no replica here")
            return
        assert self._replicas is not None
        code = replica.acks_reached(end_offset)  # a single node: at once, without setting up the wait
        if code is None:
            answer = _Answer()
            await self._replicas.await_acks([(replica, end_offset, answer)], int(COMMIT_TIMEOUT_SECONDS * 1000))
            code = ErrorCode(answer.error_code)
        if code == ErrorCode.NOT_LEADER_OR_FOLLOWER:
            code = ErrorCode.NOT_COORDINATOR
        if code != ErrorCode.NONE:
            raise KafkaError(code, f"{self.topic}-{partition}: the write was not committed ({code.name})")

    async def schedule_write(
        self,
        partition: int,
        operation: Callable[[S], tuple[list[CoordinatorRecord], R]],
        *,
        transaction: Transaction | None = None,
    ) -> R:
        """``write``, answered once its batch is committed."""
        written = self.write(partition, operation, transaction=transaction)
        if written.end_offset >= 0:
            await self.committed(partition, written.end_offset)
        return written.response

    # --- helpers ---------------------------------------------------------------------------------------

    def led_elsewhere(self, partition: int) -> bool:
        """The metadata image registers ``partition`` with another leader (or none): its keys are not this
        broker's to coordinate (NOT_COORDINATOR), whether or not this broker holds a replica of it. A partition the
        image does not have yet (its topic is still to create) is not another's."""
        if self._replicas is None:
            return False  # no replica layer: a single node's own logs
        registration = self._replicas.leadership.partition(self.topic, partition)
        return registration is not None and registration.leader != self._replicas.local_broker_id

    def leads(self, partition: int) -> bool:
        """This broker may hold ``partition``'s shard: the image makes it the leader and the replica layer acts on
        it (always, without a replica layer)."""
        if self._replicas is None:
            return True
        if not self._replicas.acting:
            return False  # the image may be stale (a restart under a KRaft quorum, not caught up yet)
        registration = self._replicas.leadership.partition(self.topic, partition)
        return registration is not None and registration.leader == self._replicas.local_broker_id

    @property
    def acting(self) -> bool:
        """Whether leadership is acted on yet (see ReplicaManager.acting); always without a replica layer."""
        return self._replicas is None or self._replicas.acting

    def _replica(self, partition: int) -> Partition | None:
        return self._replicas.partition(self.topic, partition) if self._replicas is not None else None

    def _log(self, partition: int) -> PartitionLog:
        plog = self._partition_log(self.topic, partition)
        if plog is None:
            raise KafkaError(ErrorCode.NOT_COORDINATOR, f"{self.topic}-{partition} does not exist")
        return plog

    def _sync_if_due(self, plog: PartitionLog) -> None:
        if plog.needs_flush and not plog.sync():
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"fsync of {plog.topic}-{plog.partition} failed; its data directory is offline until a restart",
            )


# How an operation whose write failed (its append, or the wait for its commit) is answered: Kafka's
# CoordinatorOperationExceptionHelper.handleOperationException, and the classic group coordinator's
# appendGroupMetadataErrorToResponseError, which maps the same codes. Other codes are answered as they are.
_WRITE_ERROR_ANSWERS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.UNKNOWN_SERVER_ERROR,
}


def write_error_answer(code: int) -> ErrorCode:
    """The code a coordinator operation answers when its write failed with ``code``."""
    return _WRITE_ERROR_ANSWERS.get(ErrorCode(code), ErrorCode(code))


def _next_sequence(plog: PartitionLog, transaction: Transaction) -> int:
    """The sequence the producer's next batch in ``plog`` takes: a transactional batch needs one, and the log
    takes a batch repeating one of the producer's last sequences for a retry and does not write it."""
    entry = plog.producers.producers.get(transaction.producer_id)
    if entry is None or entry.epoch != transaction.producer_epoch:
        return 0
    return entry.last_sequence + 1 if entry.last_sequence < 2**31 - 1 else 0
