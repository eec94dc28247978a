"""Committed offsets, kept in Kafka's ``__consumer_offsets`` topic as Kafka keeps them.

``__consumer_offsets`` is an internal topic of ``offsets.topic.num.partitions`` partitions (default 50,
cleanup.policy=compact, segment.bytes ``offsets.topic.segment.bytes``), created by the broker when first needed
(the first FindCoordinator for a group, as Kafka, or the first commit). A group's offsets live in partition
``abs(hashCode(group id)) % partitions`` (Kafka's hash, ``coordinator_partition``). Each commit is an OffsetCommit
record in Kafka's format (kbroker's records decode with Kafka's ``kafka-dump-log --offsets-decoder``): key
OffsetCommitKey (group, topic, partition), value OffsetCommitValue (offset, leader epoch, metadata, commit and
expire timestamps); a deleted or expired offset is the key's tombstone, which compaction eventually removes.

The offsets in memory are the replay of those partitions (kbroker/coordinators/runtime.py): each partition is a
shard, loaded by replaying it when the store opens (a single node leads every partition). A write is appended
before it changes anything in memory, so a write that fails (a full disk, an offline data directory) changes
nothing and raises OffsetStoreError, which OffsetCommit answers as Kafka's coordinator answers a failed append
to ``__consumer_offsets`` (NOT_COORDINATOR). With log.flush.interval.messages=1 a commit is fsynced before it is
applied, as a produce is before it is acknowledged.

Transactional commits (TxnOffsetCommit) are appended as a transactional batch of the producer and stay pending,
invisible to OffsetFetch, until the transaction coordinator writes the transaction's commit or abort marker to
the group's partition (``complete_transaction``): a commit applies them, an abort drops them, as Kafka's group
coordinator does when the marker reaches ``__consumer_offsets``. A pending transaction at restart stays pending
until the transaction coordinator ends it.

Older kbrokers kept the offsets in a journal, ``__consumer_offsets/offsets.journal``; it is migrated into the
topic once at start-up (kbroker/coordinators/migration.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kbroker.coordinators.runtime import NO_PRODUCER, CoordinatorRecord, CoordinatorRuntime, Transaction
from kbroker.durable.files import StorageError
from kbroker.groups.consumer_group_records import (
    CONSUMER_GROUP_RECORD_TYPES,
    StoredConsumerGroup,
    replay_consumer_group_record,
)
from kbroker.java_hashing import coordinator_partition
from protocol import coordinator_records
from protocol.coordinator_frame import UnknownRecordType, decode_coordinator_record, encode_coordinator_record
from protocol.errors import KafkaError
from protocol.exceptions import DecodeError

if TYPE_CHECKING:
    from kbroker.groups.coordinator import Group
    from kbroker.replication import ReplicaManager
    from kbroker.storage import LogManager

log = logging.getLogger("kbroker.groups")

OFFSETS_TOPIC = "__consumer_offsets"
DEFAULT_PARTITIONS = 50
DEFAULT_SEGMENT_BYTES = 104857600
OFFSET_COMMIT = 1  # the group coordinator's record types (protocol.coordinator_records.GROUP_RECORD_TYPES)
GROUP_METADATA = 2
# Kafka's coordinator writes OffsetCommitValue v1 when the commit has an expire timestamp (OffsetCommit v2-4's
# retention_time_ms), else v3 (with the leader epoch).
_VALUE_WITH_EXPIRY = 1
_VALUE_WITH_EPOCH = 3
GROUP_METADATA_VERSION = 3  # what Kafka 4's coordinator writes (with static members' group.instance.id)
# The epoch transaction markers carry, as the transaction coordinator's (kbroker/transactions/coordinator.py).
MARKER_COORDINATOR_EPOCH = 0


class OffsetStoreError(StorageError):
    """A change could not be made durable; the offsets in memory are as they were."""


@dataclass(slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp: int
    expire_timestamp: int = -1  # set by OffsetCommit v2-4 retention_time_ms; -1 means group-based expiry


def _consumer_group_of(key: bytes, value: bytes) -> str | None:
    """The group id of a ConsumerGroup* record (None if it does not decode: it stays where it is)."""
    try:
        record = decode_coordinator_record("group", key, value)
    except DecodeError:
        return None
    group = getattr(record.key, "group_id", None)
    return group if isinstance(group, str) else None


def offset_commit_record(group: str, topic: str, partition: int, c: CommittedOffset | None) -> CoordinatorRecord:
    """The OffsetCommit record of a commit, or (None) the tombstone of the group's offset for the partition."""
    key = coordinator_records.OffsetCommitKey(group=group, topic=topic, partition=partition)
    if c is None:
        return encode_coordinator_record(key, None)
    value = coordinator_records.OffsetCommitValue(
        offset=c.offset,
        leader_epoch=c.leader_epoch,
        metadata=c.metadata or "",  # Kafka stores a null metadata as "" (OffsetAndMetadata.NO_METADATA)
        commit_timestamp=c.commit_timestamp,
        expire_timestamp=c.expire_timestamp,
    )
    version = _VALUE_WITH_EXPIRY if c.expire_timestamp >= 0 else _VALUE_WITH_EPOCH
    return encode_coordinator_record(key, value, version)


# A change to a group's offsets at a log offset not known to be committed: (log offset, group, topic partition,
# the committed offset it replaced or None).
OffsetChange = tuple[int, str, tuple[str, int], CommittedOffset | None]


@dataclass
class OffsetsShard:
    """The committed offsets of the groups of one __consumer_offsets partition: the replay of its records.

    ``offsets`` is the latest state, every record replayed (what writes are checked against, as Kafka's shards
    are). Reads answer the state as of the partition's last committed offset (its high watermark), as Kafka's
    CoordinatorRuntime reads its timeline there: the changes replayed at or after it are kept, oldest first, so
    a read undoes them; they are forgotten once the high watermark passes them. On a single node the high
    watermark follows every append, so nothing waits there; with followers a commit is seen once they have it.
    """

    partition: int
    offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = field(default_factory=dict)
    # Every record below this log offset is committed; changes replayed below it are not kept.
    committed_offset: int = 0
    uncommitted: list[OffsetChange] = field(default_factory=list)
    # Offsets committed in a transaction not yet ended: (group, producer id) -> offsets, and the producer's epoch.
    pending: dict[tuple[str, int], dict[tuple[str, int], CommittedOffset]] = field(default_factory=dict)
    producer_epochs: dict[int, int] = field(default_factory=dict)
    # Each classic group's last generation (its GroupMetadata record).
    groups: dict[str, coordinator_records.GroupMetadataValue] = field(default_factory=dict)
    # The KIP-848 consumer groups' ConsumerGroup* records, the last value of each key, kept as written: the
    # coordinator's own state is in memory, these are decoded only when it is rebuilt (a load, a failed write).
    consumer_group_records: dict[bytes, bytes] = field(default_factory=dict)
    skipped: int = 0  # records this version cannot use (logged once each load)

    def replay(
        self, offset: int, producer_id: int, producer_epoch: int, key: bytes | None, value: bytes | None
    ) -> None:
        if key is not None and len(key) >= 2 and int.from_bytes(key[:2], "big") in CONSUMER_GROUP_RECORD_TYPES:
            if value is None:
                self.consumer_group_records.pop(key, None)
            else:
                self.consumer_group_records[key] = value
            return
        try:
            record = decode_coordinator_record("group", key, value)
        except UnknownRecordType:
            return  # a record type of another coordinator version: Kafka's loader skips it too
        except DecodeError as exc:
            self.skipped += 1
            log.warning(
                "%s-%d offset %d: skipping a record that does not decode: %s",
                OFFSETS_TOPIC,
                self.partition,
                offset,
                exc,
            )
            return
        if record.record_type == GROUP_METADATA:
            assert isinstance(record.key, coordinator_records.GroupMetadataKey)
            if record.value is None:
                self.groups.pop(record.key.group, None)
            else:
                assert isinstance(record.value, coordinator_records.GroupMetadataValue)
                self.groups[record.key.group] = record.value
            return
        if record.record_type != OFFSET_COMMIT:
            return  # a share or streams group's record: not kept by this store
        k = record.key
        assert isinstance(k, coordinator_records.OffsetCommitKey)
        tp = (k.topic, k.partition)
        if producer_id != NO_PRODUCER:
            self.producer_epochs[producer_id] = producer_epoch
            pending = self.pending.setdefault((k.group, producer_id), {})
            if record.value is None:
                pending.pop(tp, None)
            else:
                pending[tp] = _committed(record.value)
            return
        self._set(offset, k.group, tp, None if record.value is None else _committed(record.value))

    def replay_end_transaction(self, producer_id: int, commit: bool, offset: int = -1) -> None:
        for group, pid in [key for key in self.pending if key[1] == producer_id]:
            offsets = self.pending.pop((group, pid))
            if commit:
                for tp, committed in offsets.items():
                    self._set(offset, group, tp, committed)
        self.producer_epochs.pop(producer_id, None)

    def _set(self, offset: int, group: str, tp: tuple[str, int], committed: CommittedOffset | None) -> None:
        """The group's offset for ``tp`` is ``committed`` (None: removed) from log offset ``offset`` on."""
        group_offsets = self.offsets.get(group)
        previous = group_offsets.get(tp) if group_offsets is not None else None
        if offset >= self.committed_offset:
            self.uncommitted.append((offset, group, tp, previous))
        if committed is not None:
            self.offsets.setdefault(group, {})[tp] = committed
        elif group_offsets is not None:
            group_offsets.pop(tp, None)
            if not group_offsets:
                del self.offsets[group]

    def forget_before(self, committed_offset: int) -> None:
        """Every record below ``committed_offset`` is committed: its changes need no undoing any more."""
        if committed_offset <= self.committed_offset:
            return
        self.committed_offset = committed_offset
        kept = 0
        while kept < len(self.uncommitted) and self.uncommitted[kept][0] < committed_offset:
            kept += 1
        if kept:
            del self.uncommitted[:kept]

    def offsets_at(self, group: str, committed_offset: int) -> dict[tuple[str, int], CommittedOffset]:
        """The group's offsets as of ``committed_offset`` (the partition's high watermark): the latest state with
        the changes at or after it undone, newest first."""
        self.forget_before(committed_offset)
        latest = self.offsets.get(group, {})
        if not self.uncommitted:
            return latest
        view = dict(latest)
        for _, changed_group, tp, previous in reversed(self.uncommitted):
            if changed_group != group:
                continue
            if previous is None:
                view.pop(tp, None)
            else:
                view[tp] = previous
        return view


def _committed(value: object) -> CommittedOffset:
    assert isinstance(value, coordinator_records.OffsetCommitValue)
    return CommittedOffset(
        value.offset, value.leader_epoch, value.metadata, value.commit_timestamp, value.expire_timestamp
    )


class OffsetStore:
    """Committed offsets of every group, as shards of ``__consumer_offsets`` (one per partition)."""

    def __init__(
        self,
        logs: LogManager,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        replicas: ReplicaManager | None = None,
    ) -> None:
        """``partitions``, ``segment_bytes``: offsets.topic.num.partitions and offsets.topic.segment.bytes, used
        when the topic is created; an existing topic keeps its own. ``replicas``: the replica layer the records
        are written through (None: the logs directly)."""
        self.logs = logs
        self.configured_partitions = partitions
        self.segment_bytes = segment_bytes
        self.runtime: CoordinatorRuntime[OffsetsShard] = CoordinatorRuntime(
            OFFSETS_TOPIC,
            logs.get_partition,
            self._new_shard,
            replicas=replicas,
            loaded=self._shard_loaded,
            unloaded=self._shard_unloaded,
        )
        # The group coordinators, told of each shard loaded (its groups rebuilt from the records) and unloaded
        # (its groups dropped) after they started: (on load, on unload) by partition.
        self.shard_listeners: list[tuple[Callable[[int], None], Callable[[int], None]]] = []
        self._owns_logs = False
        # How the topic is created when a commit needs it at once: the broker's topic service (through the
        # controller, kbroker/topics.py create_now); the log manager directly for a store of its own.
        self.create_topic: Callable[[str, int, dict[str, str]], object] = logs.create_topic
        self._loaded = False  # every shard loaded (a single node leads every partition)
        self._not_loaded: set[int] = set()  # partitions that could not be loaded yet (each logged once)
        if logs.topic(OFFSETS_TOPIC) is not None:
            self._load_all()

    @classmethod
    def in_data_dir(
        cls, data_dir: Path, *, partitions: int = DEFAULT_PARTITIONS, flush_messages: int | None = None
    ) -> OffsetStore:
        """A store over a log manager of its own in ``data_dir``, closed with it (tests and tools; the broker
        gives its own). ``flush_messages``: the topics' flush.messages (1: each write fsynced before it applies)."""
        from kbroker.storage import LogManager

        defaults = {} if flush_messages is None else {"flush.messages": str(flush_messages)}
        store = cls(LogManager(data_dir, defaults), partitions=partitions)
        store._owns_logs = True
        return store

    # --- the topic -------------------------------------------------------------------------------------

    @property
    def partition_count(self) -> int:
        info = self.logs.topic(OFFSETS_TOPIC)
        return info.partitions if info is not None else self.configured_partitions

    def partition_for(self, group: str) -> int:
        return coordinator_partition(group, self.partition_count)

    def topic_configs(self) -> dict[str, str]:
        """The configs __consumer_offsets is created with, as Kafka's."""
        return {"cleanup.policy": "compact", "segment.bytes": str(self.segment_bytes), "compression.type": "producer"}

    def ensure_topic(self) -> None:
        """Create __consumer_offsets if it does not exist yet, here on the event loop (FindCoordinator creates it
        first, in a worker thread, as Kafka does on the first FindCoordinator for a group), and load its shards.

        OffsetStoreError if its files cannot be made."""
        if self.logs.topic(OFFSETS_TOPIC) is None:
            try:
                self.create_topic(OFFSETS_TOPIC, self.configured_partitions, self.topic_configs())
            except (OSError, StorageError, KafkaError) as exc:
                raise OffsetStoreError(f"cannot create {OFFSETS_TOPIC}: {exc}") from None
            log.info("created %s with %d partitions", OFFSETS_TOPIC, self.configured_partitions)
        # A shard missing since (a reload on leading its partition again failed, or its log was not open when
        # leadership came) is loaded by its partition's next use (``ensure_shard``).
        if not self._loaded:
            self._load_all()

    def ensure_shard(self, group: str) -> bool:
        """The group's shard is loaded here (loaded now if this broker leads its partition and it was not)."""
        return self.runtime.load_if_led(self.partition_for(group))

    def load_led_shards(self) -> None:
        """Load the shards of the partitions this broker leads, not loaded yet: called once its replica layer acts
        on a current image (under a KRaft quorum, nothing is loaded from the image a restart replays)."""
        if self.logs.topic(OFFSETS_TOPIC) is not None and not self._loaded:
            self._load_all()

    def _load_all(self) -> None:
        """Load the shards not loaded yet of the partitions this broker leads (another broker's are its own
        coordinator's). A partition whose files are still being made (the topic was just created) or cannot be read
        is tried again by the next ``ensure_topic`` or use of one of its groups."""
        if not self.runtime.acting:
            return  # ``load_led_shards`` loads them once leadership is current
        missing = False
        for partition in range(self.partition_count):
            if partition in self.runtime.shards or not self.runtime.leads(partition):
                continue
            try:
                shard = self.runtime.load(partition)
            except KafkaError as exc:  # not yet loadable: its groups answer NOT_COORDINATOR meanwhile
                if partition not in self._not_loaded:
                    self._not_loaded.add(partition)
                    log.warning("%s-%d is not loaded (tried again on use): %s", OFFSETS_TOPIC, partition, exc)
                missing = True
                continue
            self._not_loaded.discard(partition)
            if shard.skipped:
                log.warning("%s-%d: %d record(s) skipped while loading", OFFSETS_TOPIC, partition, shard.skipped)
        self._loaded = not missing
        if self._loaded:
            self._rehome_misplaced()

    def _append(self, partition: int, records: list[CoordinatorRecord]) -> None:
        self.runtime.write(partition, lambda _: (records, None))

    def _rehome_misplaced(self) -> None:
        """Move each group an older kbroker kept in another partition to the one Kafka's hash gives it. Those
        kbrokers made a negative hash non-negative with the partitioner's sign-bit mask rather than Kafka's
        Utils.abs, so about half the groups of a data directory they wrote are elsewhere. The group's committed
        offsets, classic generation and consumer group records are written to its partition first, then
        tombstoned where they were: a stop in between leaves both, and the next load moves them again (what the
        group's own partition already holds is newer, written since: only the old copy is removed then). Only
        between partitions this broker leads (a single node's data directory: brokers of a cluster always
        agreed with Kafka)."""
        moved: set[str] = set()
        for shard in list(self._shards()):
            to_home: dict[int, list[CoordinatorRecord]] = {}
            tombstones: list[CoordinatorRecord] = []

            def misplaced(group: str, source: OffsetsShard = shard) -> int | None:
                home = self.partition_for(group)
                return home if home != source.partition and home in self.runtime.shards else None

            for group, offsets in shard.offsets.items():
                if (home := misplaced(group)) is not None:
                    newer = self.runtime.shards[home].offsets.get(group, {})
                    for (topic, index), committed in offsets.items():
                        if (topic, index) not in newer:
                            to_home.setdefault(home, []).append(offset_commit_record(group, topic, index, committed))
                        tombstones.append(offset_commit_record(group, topic, index, None))
                    moved.add(group)
            for group, value in shard.groups.items():
                if (home := misplaced(group)) is not None:
                    key = coordinator_records.GroupMetadataKey(group=group)
                    if group not in self.runtime.shards[home].groups:
                        record = encode_coordinator_record(key, value, GROUP_METADATA_VERSION)
                        to_home.setdefault(home, []).append(record)
                    tombstones.append(encode_coordinator_record(key, None))
                    moved.add(group)
            for raw_key, raw_value in shard.consumer_group_records.items():
                owner = _consumer_group_of(raw_key, raw_value)
                if owner is not None and (home := misplaced(owner)) is not None:
                    if raw_key not in self.runtime.shards[home].consumer_group_records:
                        to_home.setdefault(home, []).append((raw_key, raw_value))
                    tombstones.append((raw_key, None))
                    moved.add(owner)
            if not tombstones:
                continue
            try:
                for home, records in to_home.items():
                    self._append(home, records)
                self._append(shard.partition, tombstones)
            except KafkaError as exc:
                log.error("%s-%d: moving groups to their partitions failed: %s", OFFSETS_TOPIC, shard.partition, exc)
                return
        if moved:
            log.info(
                "%s: moved %d group(s) an older kbroker kept in another partition to Kafka's: %s",
                OFFSETS_TOPIC,
                len(moved),
                ", ".join(sorted(moved)[:10]) + (" ..." if len(moved) > 10 else ""),
            )

    def _shard_loaded(self, partition: int) -> None:
        for on_load, _ in self.shard_listeners:
            on_load(partition)

    def _shard_unloaded(self, partition: int) -> None:
        for _, on_unload in self.shard_listeners:
            on_unload(partition)

    def coordinated_elsewhere(self, group: str) -> bool:
        """Another broker leads the group's __consumer_offsets partition (or none does), as the metadata image
        says, whether or not this broker holds a replica of it."""
        return self.runtime.led_elsewhere(self.partition_for(group))

    def loading(self, group: str) -> bool:
        """This broker is the group's coordinator but its shard is not loaded yet (loaded now if it can be)."""
        return self.runtime.loading(self.partition_for(group))

    def loading_any(self) -> bool:
        """Some partition this broker coordinates is not loaded yet (loaded now if it can be): Kafka's ListGroups,
        which reads every shard of its coordinator runtime, then fails whole."""
        return any(self.runtime.loading(partition) for partition in range(self.partition_count))

    def serve_groups(
        self, restore: Callable[[int | None], None], unload: Callable[[Callable[[str], bool]], None]
    ) -> None:
        """A group coordinator's groups follow the shards, as Kafka's coordinator loads and unloads them:
        ``restore`` rebuilds those of every loaded shard (None) now, then those of each shard loaded later;
        ``unload`` drops those of each shard unloaded (given which group ids were in it)."""
        restore(None)
        self.shard_listeners.append((restore, lambda p: unload(lambda group: self.partition_for(group) == p)))

    def _new_shard(self, partition: int) -> OffsetsShard:
        """A shard about to be loaded: the records below the high watermark are committed as they replay."""
        return OffsetsShard(partition, committed_offset=self._high_watermark(partition))

    def _high_watermark(self, partition: int) -> int:
        plog = self.logs.get_partition(OFFSETS_TOPIC, partition)
        return plog.high_watermark if plog is not None else 0

    def _shard_of(self, group: str) -> OffsetsShard | None:
        return self.runtime.shards.get(self.partition_for(group))

    def _write(self, group: str, records: list[CoordinatorRecord], transaction: Transaction | None = None) -> int:
        """Append the group's records to its partition (creating the topic if needed); the offset after them.

        OffsetStoreError, nothing changed, if they could not be written."""
        if not records:
            return -1
        self.ensure_topic()
        partition = self.partition_for(group)
        self.runtime.load_if_led(partition)
        try:
            written = self.runtime.write(partition, lambda shard: (records, None), transaction=transaction)
        except KafkaError as exc:
            log.error("%s-%d: writing %d record(s) failed: %s", OFFSETS_TOPIC, partition, len(records), exc)
            raise OffsetStoreError(f"writing {OFFSETS_TOPIC}-{partition} failed: {exc}") from None
        return written.end_offset

    def end_offset(self, group: str) -> int:
        """The offset after the last record written to the group's partition (-1: no log of it here): what an
        operation that just wrote there waits to be committed, as Kafka's runtime keys a write's answer (which so
        also waits for the writes before it)."""
        plog = self.logs.get_partition(OFFSETS_TOPIC, self.partition_for(group))
        return plog.log_end_offset if plog is not None else -1

    async def committed(self, group: str, end_offset: int) -> None:
        """Wait until the write that returned ``end_offset`` is committed (at once on a single node)."""
        if end_offset >= 0:
            partition = self.partition_for(group)
            await self.runtime.committed(partition, end_offset)
            shard = self.runtime.shards.get(partition)
            if shard is not None:
                shard.forget_before(self._high_watermark(partition))

    # --- views -----------------------------------------------------------------------------------------

    @property
    def offsets(self) -> dict[str, dict[tuple[str, int], CommittedOffset]]:
        """Every group's committed offsets (a merged view of the shards)."""
        return {group: o for shard in self._shards() for group, o in shard.offsets.items()}

    @property
    def pending(self) -> dict[tuple[str, int], dict[tuple[str, int], CommittedOffset]]:
        return {key: o for shard in self._shards() for key, o in shard.pending.items()}

    def _shards(self) -> Iterator[OffsetsShard]:
        return iter(list(self.runtime.shards.values()))

    # --- API ------------------------------------------------------------------------------------------

    def commit(self, group: str, commits: dict[tuple[str, int], CommittedOffset]) -> int:
        """Append the commits, then apply them; OffsetStoreError (nothing applied) if they could not be written.
        Returns the offset after them, for ``committed``."""
        return self._write(group, [offset_commit_record(group, t, p, c) for (t, p), c in commits.items()])

    def commit_pending(
        self,
        group: str,
        producer_id: int,
        commits: dict[tuple[str, int], CommittedOffset],
        producer_epoch: int = 0,
    ) -> int:
        """TxnOffsetCommit: append the commits in the producer's transaction (invisible until it commits);
        OffsetStoreError (nothing recorded) if they could not be written."""
        records = [offset_commit_record(group, t, p, c) for (t, p), c in commits.items()]
        return self._write(group, records, Transaction(producer_id, producer_epoch))

    def complete_transaction(
        self, group: str, producer_id: int, commit: bool, coordinator_epoch: int = MARKER_COORDINATOR_EPOCH
    ) -> None:
        """The producer's transaction ended: write its marker to the group's partition, which applies (commit) or
        drops (abort) its pending offsets there. Called by the transaction coordinator for each group of the
        transaction, again after a restart if it did not complete: a second call finds nothing pending and writes
        nothing."""
        shard = self._shard_of(group)
        if shard is None or (group, producer_id) not in shard.pending:
            return
        transaction = Transaction(producer_id, shard.producer_epochs.get(producer_id, 0))
        try:
            self.runtime.end_transaction(shard.partition, transaction, commit, coordinator_epoch)
        except KafkaError as exc:
            log.error("%s-%d: writing a transaction marker failed: %s", OFFSETS_TOPIC, shard.partition, exc)
            raise OffsetStoreError(f"writing {OFFSETS_TOPIC}-{shard.partition} failed: {exc}") from None

    def complete_partition_transaction(
        self, partition: int, producer_id: int, commit: bool, coordinator_epoch: int = MARKER_COORDINATOR_EPOCH
    ) -> None:
        """As ``complete_transaction``, for a transaction that named the partition rather than a group (a
        TxnOffsetCommit added it through a coordinator on another broker)."""
        shard = self.runtime.shards.get(partition)
        if shard is None or not any(pending_producer == producer_id for _, pending_producer in shard.pending):
            return
        transaction = Transaction(producer_id, shard.producer_epochs.get(producer_id, 0))
        try:
            self.runtime.end_transaction(partition, transaction, commit, coordinator_epoch)
        except KafkaError as exc:
            log.error("%s-%d: writing a transaction marker failed: %s", OFFSETS_TOPIC, partition, exc)
            raise OffsetStoreError(f"writing {OFFSETS_TOPIC}-{partition} failed: {exc}") from None

    def has_pending(self, group: str, topic: str, partition: int) -> bool:
        """Whether a transaction not yet ended holds an offset for the partition (OffsetFetch's require_stable
        answers UNSTABLE_OFFSET_COMMIT then, KIP-447)."""
        shard = self._shard_of(group)
        return shard is not None and any(
            g == group and (topic, partition) in offsets for (g, _), offsets in shard.pending.items()
        )

    def get(self, group: str) -> dict[tuple[str, int], CommittedOffset]:
        """The group's latest offsets, every record written included (what a write is checked against)."""
        shard = self._shard_of(group)
        return shard.offsets.get(group, {}) if shard is not None else {}

    def committed_offsets(self, group: str) -> dict[tuple[str, int], CommittedOffset]:
        """The group's offsets as of its partition's last committed offset: what OffsetFetch answers."""
        shard = self._shard_of(group)
        if shard is None:
            return {}
        return shard.offsets_at(group, self._high_watermark(shard.partition))

    def has_group(self, group: str) -> bool:
        return bool(self.get(group))

    def groups(self) -> list[str]:
        """Every group with committed offsets."""
        return [group for shard in self._shards() for group in shard.offsets]

    def delete(self, group: str, keys: list[tuple[str, int]]) -> int:
        """Write tombstones for, then forget, the group's offsets for ``keys``; the offset after them (-1: nothing
        written), for ``committed``. OffsetStoreError (nothing forgotten) on failure."""
        group_offsets = self.get(group)
        removed = [k for k in dict.fromkeys(keys) if k in group_offsets]
        return self._write(group, [offset_commit_record(group, t, p, None) for t, p in removed])

    def delete_group(self, group: str) -> None:
        """Write tombstones for, then forget, the group's offsets (and its GroupMetadata, as Kafka's
        DeleteGroups); OffsetStoreError (nothing forgotten) on failure."""
        records = [offset_commit_record(group, t, p, None) for t, p in self.get(group)]
        shard = self._shard_of(group)
        if shard is not None and group in shard.groups:
            records.append(encode_coordinator_record(coordinator_records.GroupMetadataKey(group=group), None))
        self._write(group, records)

    def delete_topic(self, topic: str) -> None:
        """Forget the offsets of a deleted topic. Best effort: a failure is logged and those offsets stay (as
        Kafka's, they go when their group expires or is deleted)."""
        if topic == OFFSETS_TOPIC:  # Kafka allows it: every group's offsets (and stored membership) go with it
            log.warning("%s was deleted: the committed offsets of every group are gone", OFFSETS_TOPIC)
            for partition in list(self.runtime.shards):
                self.runtime.unload(partition)
            self._loaded = False
            return
        for group in self.groups():
            try:
                self.delete(group, [k for k in self.get(group) if k[0] == topic])
            except OffsetStoreError as exc:
                log.warning("offsets of deleted topic %s kept for group %s: %s", topic, group, exc)

    def expire(self, group: str, older_than_ms: int, now_ms: int, base_ms: int | None = None) -> int:
        """Drop the group's offsets that aged past ``older_than_ms`` (or past their own expiry).

        An offset ages from its commit, or from ``base_ms`` if that is later: the moment its group became
        empty (KIP-211), so a group that stopped committing while it still had members keeps its offsets.
        """
        stale = [
            key
            for key, c in self.get(group).items()
            if (c.expire_timestamp >= 0 and c.expire_timestamp <= now_ms)
            or (c.expire_timestamp < 0 and max(c.commit_timestamp, base_ms or -1) < older_than_ms)
        ]
        try:
            self.delete(group, stale)
        except OffsetStoreError:  # logged; the next expiry check tries again
            return 0
        return len(stale)

    # --- classic group membership (Kafka's GroupMetadata records) ----------------------------------------

    def store_group(self, group: Group) -> int:
        """Write the classic group's generation; the offset after its record (for ``committed``). OffsetStoreError
        (nothing written) on failure."""
        protocol = group.protocol_name
        members = [
            coordinator_records.GroupMetadataValue.MemberMetadata(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout=m.rebalance_timeout_ms,
                session_timeout=m.session_timeout_ms,
                subscription=m.metadata_for(protocol) if protocol is not None else b"",
                assignment=m.assignment,
            )
            for m in group.members.values()
        ]
        value = coordinator_records.GroupMetadataValue(
            protocol_type=group.protocol_type or "",
            generation=group.generation_id,
            protocol=protocol,
            leader=group.leader_id,
            current_state_timestamp=group.state_since_ms,
            members=members,
        )
        key = coordinator_records.GroupMetadataKey(group=group.group_id)
        return self._write(group.group_id, [encode_coordinator_record(key, value, GROUP_METADATA_VERSION)])

    def remove_group(self, group_id: str) -> None:
        """Write the group's GroupMetadata tombstone, if it has a record; OffsetStoreError on failure."""
        shard = self._shard_of(group_id)
        if shard is not None and group_id in shard.groups:
            self._write(
                group_id, [encode_coordinator_record(coordinator_records.GroupMetadataKey(group=group_id), None)]
            )

    def stored_groups(self, partition: int | None = None) -> list[Group]:
        """The classic groups (of every loaded shard, or of ``partition``'s) as their last GroupMetadata records
        left them: Stable with their members (whose sessions start again), or Empty, as Kafka's coordinator loads
        them."""
        from kbroker.groups.coordinator import Group, GroupState, Member

        groups = []
        for shard in self._shards_of(partition):
            for group_id, value in shard.groups.items():
                protocol = value.protocol
                members = {
                    m.member_id: Member(
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        session_timeout_ms=m.session_timeout,
                        rebalance_timeout_ms=m.rebalance_timeout if m.rebalance_timeout >= 0 else m.session_timeout,
                        protocol_type=value.protocol_type,
                        protocols=[(protocol, m.subscription)] if protocol is not None else [],
                        assignment=m.assignment,
                    )
                    for m in value.members
                }
                group = Group(
                    group_id,
                    state=GroupState.STABLE if members else GroupState.EMPTY,
                    generation_id=value.generation,
                    protocol_type=value.protocol_type or None,
                    protocol_name=protocol if members else None,
                    leader_id=value.leader if members else None,
                    members=members,
                    static_members={m.group_instance_id: m.member_id for m in members.values() if m.group_instance_id},
                )
                if value.current_state_timestamp >= 0:
                    group.state_since_ms = value.current_state_timestamp
                groups.append(group)
        return groups

    # --- KIP-848 consumer groups (Kafka's ConsumerGroup* records) ----------------------------------------

    def write_consumer_group(self, group_id: str, records: list[CoordinatorRecord]) -> int:
        """Append a consumer group's records to its partition as one batch; the offset after them, for
        ``committed`` (-1 without records). OffsetStoreError (nothing written) on failure."""
        return self._write(group_id, records)

    def stored_consumer_groups(self, partition: int | None = None) -> list[StoredConsumerGroup]:
        """Every consumer group (of every loaded shard, or of ``partition``'s) as its records left it, for the
        coordinator to rebuild at a load."""
        return [group for shard in self._shards_of(partition) for group in self._decoded(shard).values()]

    def _shards_of(self, partition: int | None) -> list[OffsetsShard]:
        if partition is None:
            return list(self._shards())
        shard = self.runtime.shards.get(partition)
        return [] if shard is None else [shard]

    def stored_consumer_group(self, group_id: str) -> StoredConsumerGroup | None:
        shard = self._shard_of(group_id)
        return self._decoded(shard).get(group_id) if shard is not None else None

    @staticmethod
    def _decoded(shard: OffsetsShard) -> dict[str, StoredConsumerGroup]:
        groups: dict[str, StoredConsumerGroup] = {}
        for key, value in shard.consumer_group_records.items():
            try:
                record = decode_coordinator_record("group", key, value)
            except DecodeError as exc:
                log.warning(
                    "%s-%d: skipping a consumer group record that does not decode: %s",
                    OFFSETS_TOPIC,
                    shard.partition,
                    exc,
                )
                continue
            replay_consumer_group_record(groups, record.record_type, record.key, record.value)
        return groups

    def close(self) -> None:
        """Forget the shards; the partitions are closed (and fsynced) with the other logs by the log manager."""
        self.runtime.shards.clear()
        self._loaded = False
        if self._owns_logs:
            self.logs.close()
