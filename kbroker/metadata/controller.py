"""The controller: the one writer of cluster metadata, and the broker-side cache of the image it publishes.

Every change to the cluster's state (topics, partitions, configs, broker registrations, producer id blocks, ACLs,
SCRAM credentials, client quotas, finalized features) goes through one ``Controller``: it validates the change
against the current image as Kafka's QuorumController does (ReplicationControlManager,
ConfigurationControlManager, AclControlManager, ScramControlManager, ClientQuotaControlManager,
FeatureControlManager, ProducerIdControlManager: the same error codes and messages), describes it as Kafka's
metadata records, commits them to the metadata log and applies them to the image. Nothing outside this module
knows which node the controller runs on: a single node is its own controller (``LocalController``), and a cluster
swaps in Kafka's KRaft quorum behind the same interface. What every broker asks of its controller is ``Controller``;
the admin operations a client's request makes (ACLs, SCRAM, quotas, configs, features, partitions, deletions) are
``AdminController``'s, a single node's own: under Kafka's quorum those requests are forwarded whole.

The broker side holds the newest image in a ``MetadataCache`` and tells its components (the log manager, ...) of
every new image and the delta that made it, as Kafka's MetadataPublishers are told.
"""

from __future__ import annotations

import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import trio

from kbroker.durable.files import StorageError
from kbroker.metadata.features import DEFAULT_LEVELS, SUPPORTED_LEVELS, first_refusal
from kbroker.metadata.image import (
    ConfigResourceType,
    ImageError,
    MetadataDelta,
    MetadataImage,
    MetadataImageBuilder,
    PartitionRegistration,
    TopicImage,
)
from kbroker.metadata.log import MetadataLog, wall_clock_ms
from kbroker.metadata.snapshots import SnapshotPolicy, write_snapshot
from kbroker.security.acls import AclBinding, AclBindingFilter
from kbroker.storage.manager import validate_topic_name
from protocol import metadata_records
from protocol._codec import Message
from protocol.errors import ErrorCode, KafkaError
from protocol.metadata_frame import MetadataRecord

if TYPE_CHECKING:
    from kbroker.quotas import QuotaAlterResult, QuotaEntry
    from kbroker.security.authorizer import AclResult
    from kbroker.security.scram_credentials import AlterResult as ScramAlterResult
    from kbroker.security.scram_credentials import Upsertion

log = logging.getLogger("kbroker.metadata")

# The metadata.version a Kafka 4.3 cluster is formatted at (its storage tool's default).
METADATA_VERSION_LEVEL = 30
# Kafka's SecurityProtocol ids, as RegisterBrokerRecord.BrokerEndpoint carries them.
SECURITY_PROTOCOL_IDS = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdControlManager hands out blocks of this many ids
INT64_MAX = (1 << 63) - 1


def record(message: Message) -> MetadataRecord:
    """``message`` at the newest version kbroker encodes (every one Kafka 4.3 writes at metadata.version 30)."""
    return MetadataRecord(message, type(message).VALID_VERSIONS[1])


class Listener(NamedTuple):
    """One of a broker's endpoints as it registers it (RegisterBrokerRecord.BrokerEndpoint)."""

    name: str
    host: str
    port: int
    security_protocol: int


Publisher = Callable[[MetadataImage, MetadataDelta], None]


class MetadataCache:
    """The broker's view of the cluster: the newest image, and the components told of each new one."""

    def __init__(self, image: MetadataImage | None = None) -> None:
        self.image = image if image is not None else MetadataImage()
        self._publishers: list[Publisher] = []

    def partition(self, topic: str, index: int, /) -> PartitionRegistration | None:
        """The partition's registration in the newest image: the cache is the replica layer's LeadershipSource."""
        return self.image.topics.partition(topic, index)

    def subscribe(self, publisher: Publisher) -> None:
        """Tell ``publisher`` of every image published from now on (in subscription order)."""
        self._publishers.append(publisher)

    def publish(self, image: MetadataImage, delta: MetadataDelta) -> None:
        self.image = image
        for publisher in self._publishers:
            publisher(image, delta)


class Controller(ABC):
    """The operations every broker asks of the controller (its own topics, producer id blocks, registration, ISR
    changes); each answers once its records are committed and applied to the image, or raises KafkaError with
    Kafka's error code and message and changes nothing."""

    # True for a controller elsewhere (Kafka's KRaft quorum) that checks requests itself, in its own words: the
    # handlers then leave Kafka's checks to it, as Kafka's broker forwards the request whole.
    forwards_requests = False

    @abstractmethod
    async def create_topic(
        self,
        name: str,
        *,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        assignments: Sequence[Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> TopicImage:
        """Create a topic: ``partitions`` of ``replication_factor`` replicas placed by the controller, or the
        replicas ``assignments`` names per partition (then ``partitions`` and ``replication_factor`` are -1)."""

    def create_topic_now(
        self, name: str, *, partitions: int, replication_factor: int, configs: Mapping[str, str]
    ) -> TopicImage:
        """``create_topic``, committed before it returns, on the calling thread: for an internal topic a
        coordinator needs at once (an older data directory migrated at start-up, an offset commit before any
        FindCoordinator). Only a controller in this process can; others raise KafkaError, which callers answer as
        a coordinator not yet available (clients retry, and FindCoordinator creates the topic asynchronously)."""
        raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{name} is created through FindCoordinator")

    @abstractmethod
    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> range:
        """The next block of producer ids for ``broker_id``."""

    def allocate_producer_ids_now(self, broker_id: int, broker_epoch: int) -> range:
        """``allocate_producer_ids``, committed before it returns, on the calling thread (InitProducerId hands an
        id out without waiting). A controller that cannot raises KafkaError COORDINATOR_LOAD_IN_PROGRESS, which
        Kafka's broker answers while its next block is on its way (clients retry)."""
        raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "Producer ID block is not available yet")

    def controller_api_versions(self) -> Mapping[int, tuple[int, int]] | None:
        """The versions of each API the active controller serves, for a controller elsewhere once known (a broker
        advertises the forwarded APIs in the versions both serve, as Kafka's does); None here."""
        return None

    async def forward(
        self,
        request_frame: bytes | bytearray,
        *,
        api_key: int,
        api_version: int,
        principal: str,
        client_host: str,
        changes: bool = True,
    ) -> Message:
        """The controller's answer to a client's whole request (its header and body as received), which the
        controller handles as ``principal`` from ``client_host`` (Kafka's Envelope); a request that ``changes``
        metadata answers once the change is in the image. Only for a controller that ``forwards_requests``."""
        raise NotImplementedError

    @abstractmethod
    def register_broker(
        self, broker_id: int, listeners: Sequence[Listener], features: Mapping[str, tuple[int, int]]
    ) -> int:
        """Register (or re-register) a broker with its listeners and supported features; returns its epoch."""

    @abstractmethod
    async def alter_partition(
        self,
        broker_id: int,
        broker_epoch: int,
        topic_id: uuid.UUID,
        index: int,
        *,
        leader_epoch: int,
        partition_epoch: int,
        isr: Sequence[tuple[int, int]],
    ) -> PartitionRegistration:
        """A partition leader's ISR change (one partition of Kafka's AlterPartition v3): ``isr`` as (broker id,
        broker epoch or -1) pairs, in the leader and partition epochs the leader knows. Returns the partition's
        registration after it (the same one if the ISR is already that); KafkaError with Kafka's code if refused
        (STALE_BROKER_EPOCH, UNKNOWN_TOPIC_ID, FENCED_LEADER_EPOCH, INVALID_UPDATE_VERSION, INELIGIBLE_REPLICA...)."""


class AdminController(Controller):
    """A controller that also serves the admin requests a client sends it (a single node's own): under Kafka's
    KRaft quorum those requests go to Kafka's controller whole (kbroker/apis/forwarded.py), so a broker there has
    only the operations of ``Controller``."""

    @abstractmethod
    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        assignments: Sequence[Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> TopicImage:
        """Grow a topic to ``total`` partitions."""

    @abstractmethod
    async def delete_topic(self, topic_id: uuid.UUID) -> TopicImage:
        """Delete a topic (the topic as it was is returned)."""

    @abstractmethod
    async def alter_configs(
        self, resource_type: ConfigResourceType, name: str, changes: Mapping[str, str | None]
    ) -> None:
        """Set (a value) or remove (None) configs of one resource; a broker is named by its id, the cluster
        default by ""."""

    @abstractmethod
    async def update_features(self, updates: Mapping[str, tuple[int, int]], *, validate_only: bool = False) -> None:
        """Finalize each feature (name -> (level, upgrade type)) at its level, all or none: KafkaError
        INVALID_UPDATE_VERSION with Kafka's message names the first refused."""

    @abstractmethod
    async def create_acls(self, bindings: Sequence[AclBinding]) -> list[AclResult]:
        """Add ``bindings``: one result each, in order (an ACL already there is a success that adds nothing)."""

    @abstractmethod
    async def delete_acls(self, filters: Sequence[AclBindingFilter]) -> list[list[AclBinding] | AclResult]:
        """Remove every ACL each filter selects: per filter, the ACLs it selected (each sees the ACLs as they were
        before the call) or the error refusing it."""

    @abstractmethod
    async def alter_user_scram_credentials(
        self, deletions: Sequence[tuple[str, int]], upsertions: Sequence[Upsertion]
    ) -> list[ScramAlterResult]:
        """Delete (user, mechanism) credentials and upsert others, all valid ones at once: one result per user
        named, in Kafka's order, refusals with Kafka's codes and messages."""

    @abstractmethod
    async def alter_client_quotas(
        self, entries: Sequence[QuotaEntry], validate_only: bool, resolvable: Callable[[str], bool]
    ) -> list[QuotaAlterResult]:
        """Set and remove client quotas of entities (Kafka's ClientQuotaControlManager): one result per distinct
        entity; ``resolvable`` says whether an IP entity's name is an address or a host name that resolves."""


class LocalController(AdminController):
    """The controller of a single node: its own quorum of one, committing to the local metadata log.

    Operations are serialized (one lock): each validates against the image the previous one left, so two
    requests cannot both create one name. A commit is fsynced in a worker thread before it is applied. After a
    commit the image is snapshotted when ``snapshots`` says one is due (kbroker/metadata/snapshots.py).
    """

    def __init__(
        self,
        node_id: int,
        cache: MetadataCache,
        metadata_log: MetadataLog | None,
        snapshots: SnapshotPolicy | None = None,
    ) -> None:
        """``metadata_log`` None: nothing is persisted (a broker kept in memory, in unit tests)."""
        self.node_id = node_id
        self.cache = cache
        self.metadata_log = metadata_log
        self.snapshots = snapshots if snapshots is not None else SnapshotPolicy()
        self._last_snapshot_ms = wall_clock_ms()  # as Kafka's generator: the time bound counts from start-up
        self._builder = MetadataImageBuilder(cache.image)
        self._lock = trio.Lock()
        self._next_offset = 0  # where records go without a log
        # Which features a FeatureLevelRecord of the log (or its snapshot) named at start-up: a log an older
        # kbroker wrote names only metadata.version (its other features were in finalized-features.json).
        self.replayed_features: set[str] = set()
        self.loaded_snapshot = False
        if metadata_log is not None:
            self._replay(metadata_log)

    @property
    def image(self) -> MetadataImage:
        return self.cache.image

    # --- start-up ------------------------------------------------------------------------------------------

    def _replay(self, metadata_log: MetadataLog) -> None:
        try:
            replay = metadata_log.replay()
            if replay.snapshot is not None:
                self.loaded_snapshot = True
                end = replay.snapshot.id.end_offset
                for index, item in enumerate(replay.snapshot.records):
                    if isinstance(item.message, metadata_records.FeatureLevelRecord):
                        self.replayed_features.add(item.message.name)
                    self._builder.replay(item.message, end - len(replay.snapshot.records) + index, -1)
            transaction_start = -1
            for batch in replay.batches:
                for index, item in enumerate(batch.records):
                    if isinstance(item.message, metadata_records.BeginTransactionRecord):
                        transaction_start = batch.base_offset + index
                    elif isinstance(item.message, metadata_records.FeatureLevelRecord):
                        self.replayed_features.add(item.message.name)
                    self._builder.replay(item.message, batch.base_offset + index, batch.leader_epoch)
        except ImageError as exc:
            raise StorageError(f"{metadata_log.directory}: {exc}") from None
        published = self._builder.publish()
        if published is not None:
            self.cache.publish(*published)
        epoch = metadata_log.leader_epoch
        metadata_log.become_leader(max(epoch, 0) + 1, self.node_id, [self.node_id])
        if self._builder.in_transaction:
            # As Kafka's controller on becoming leader: a transaction the previous leader left open is aborted.
            log.warning(
                "%s: the metadata transaction begun at offset %d was never ended (an interrupted start-up or "
                "migration); it is aborted",
                metadata_log.directory,
                transaction_start,
            )
            self._commit_now([record(metadata_records.AbortTransactionRecord(reason="the leader changed"))])

    def bootstrap(self) -> None:
        """A new metadata log's first records, as Kafka's storage tool formats them: the metadata version and the
        default level of each other feature."""
        if self.image.metadata_version == 0:
            levels = {"metadata.version": METADATA_VERSION_LEVEL, **DEFAULT_LEVELS}
            self._commit_now(
                [
                    record(metadata_records.FeatureLevelRecord(name=name, feature_level=lv))
                    for name, lv in levels.items()
                ]
            )

    def migrate_features(self, levels: Mapping[str, int]) -> int:
        """Finalize the features kept elsewhere before (name -> level; a feature not named is at 0), in one batch;
        returns how many levels changed."""
        records = [
            record(metadata_records.FeatureLevelRecord(name=name, feature_level=levels.get(name, 0)))
            for name in SUPPORTED_LEVELS
            if self.image.features.get(name, 0) != levels.get(name, 0)
        ]
        if records:
            self._commit_now(records)
        return len(records)

    def migrate_producer_ids(self, next_producer_id: int, broker_id: int) -> bool:
        """Move the next producer id block's start up to ``next_producer_id`` (what an older kbroker handed out
        below); False if the image's is already there."""
        if next_producer_id <= self.image.next_producer_id:
            return False
        broker = self.image.brokers[broker_id]
        self._commit_now(
            [
                record(
                    metadata_records.ProducerIdsRecord(
                        broker_id=broker_id, broker_epoch=broker.epoch, next_producer_id=next_producer_id
                    )
                )
            ]
        )
        return True

    def register_broker(
        self, broker_id: int, listeners: Sequence[Listener], features: Mapping[str, tuple[int, int]]
    ) -> int:
        # As Kafka's ClusterControlManager: the broker epoch is the offset of its registration record.
        epoch = self._end_offset()
        registration = metadata_records.RegisterBrokerRecord(
            broker_id=broker_id,
            is_migrating_zk_broker=False,
            incarnation_id=uuid.uuid4(),
            broker_epoch=epoch,
            end_points=[
                metadata_records.RegisterBrokerRecord.BrokerEndpoint(
                    name=listener.name,
                    host=listener.host,
                    port=listener.port,
                    security_protocol=listener.security_protocol,
                )
                for listener in listeners
            ],
            features=[
                metadata_records.RegisterBrokerRecord.BrokerFeature(
                    name=name, min_supported_version=low, max_supported_version=high
                )
                for name, (low, high) in sorted(features.items())
            ],
            rack=None,
            fenced=False,  # a single node's broker is caught up with its own metadata at once
            in_controlled_shutdown=False,
            log_dirs=[],
        )
        self._commit_now([record(registration)])
        return epoch

    def migrate_topics(self, topics: Iterable[tuple[str, uuid.UUID, int, Mapping[str, str]]]) -> int:
        """Write topics kept elsewhere before (name, topic id, partition count, config overrides) into the
        metadata log with their ids, in one metadata transaction; those already there with the same id are
        skipped. Returns how many were written. Raises StorageError when a name is in the image with another id."""
        records: list[MetadataRecord] = []
        written = 0
        for name, topic_id, partitions, configs in topics:
            known = self.image.topics.get(name)
            if known is not None:
                if known.topic_id != topic_id:
                    raise StorageError(f"topic {name!r} is {topic_id} there but {known.topic_id} in the metadata log")
                continue
            if topic_id in self.image.topics.by_id:
                raise StorageError(f"topic id {topic_id} of {name!r} is another topic's in the metadata log")
            records.extend(self._topic_records(name, topic_id, [[self.node_id]] * partitions, configs))
            written += 1
        if records:
            self._commit_now(
                [record(metadata_records.BeginTransactionRecord(name="migration of the topic catalog")), *records]
                + [record(metadata_records.EndTransactionRecord())]
            )
        return written

    def migrate_acls(self, bindings: Iterable[AclBinding]) -> int:
        """Write ACLs kept elsewhere before into the metadata log in one metadata transaction, skipping those
        already there; returns how many were written."""
        from kbroker.security.authorizer import acl_binding_of  # imported by the first ACL change, as the authorizer

        known = {acl_binding_of(entry) for entry in self.image.acls.values()}
        records = [self._acl_record(binding) for binding in dict.fromkeys(bindings) if binding not in known]
        if records:
            self._commit_now(
                [record(metadata_records.BeginTransactionRecord(name="migration of the ACL file")), *records]
                + [record(metadata_records.EndTransactionRecord())]
            )
        return len(records)

    def commit_now(self, records: Sequence[MetadataRecord], *, transaction: str) -> None:
        """Commit ``records`` before returning, on the calling thread, in one metadata transaction (named
        ``transaction``) when there are several: for start-up, before requests are served (a migration, the
        command line's users)."""
        if len(records) > 1:
            records = [
                record(metadata_records.BeginTransactionRecord(name=transaction)),
                *records,
                record(metadata_records.EndTransactionRecord()),
            ]
        self._commit_now(records)

    # --- operations --------------------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        *,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        assignments: Sequence[Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> TopicImage:
        async with self._lock:
            topic_id, records = self._new_topic(name, partitions, replication_factor, configs, assignments)
            if validate_only:
                return TopicImage(name, topic_id)
            await self._commit(records)
            return self._topic(name)

    def create_topic_now(
        self, name: str, *, partitions: int, replication_factor: int, configs: Mapping[str, str]
    ) -> TopicImage:
        if self._lock.locked():  # an asynchronous change is between its append and its apply: not now
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the metadata log is busy; try again")
        _, records = self._new_topic(name, partitions, replication_factor, configs, None)
        self._commit_now(records)
        return self._topic(name)

    def _new_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        assignments: Sequence[Sequence[int]] | None,
    ) -> tuple[uuid.UUID, list[MetadataRecord]]:
        """The records that create topic ``name``, as QuorumController checks it; KafkaError if it may not."""
        problem = validate_topic_name(name)
        if problem is not None:
            raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if self.image.topics.get(name) is not None:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        if assignments:
            if partitions != -1 or replication_factor != -1:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST,
                    "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be "
                    "used at the same time.",
                )
            replicas = [list(brokers) for brokers in assignments]
            for index, brokers in enumerate(replicas):
                self._check_assignment(index, brokers)
        else:
            if partitions <= 0:
                raise KafkaError(
                    ErrorCode.INVALID_PARTITIONS,
                    "Number of partitions must be larger than 0, or -1 to use the default value.",
                )
            replicas = self._place(0, partitions, replication_factor)
        topic_id = uuid.uuid4()
        return topic_id, self._topic_records(name, topic_id, replicas, configs)

    async def create_partitions(
        self,
        name: str,
        total: int,
        *,
        assignments: Sequence[Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> TopicImage:
        async with self._lock:
            topic = self.image.topics.get(name)
            if topic is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
            current = len(topic.partitions)
            if total <= current:
                raise KafkaError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"Topic currently has {current} partitions, which is higher than the requested {total}."
                    if total < current
                    else f"Topic already has {current} partitions.",
                )
            if assignments is not None:
                if len(assignments) != total - current:
                    raise KafkaError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"Attempted to add {total - current} additional partition(s), but only {len(assignments)} "
                        "assignment(s) were specified.",
                    )
                replicas = [list(brokers) for brokers in assignments]
                for index, brokers in enumerate(replicas, start=current):
                    self._check_assignment(index, brokers)
            else:
                replication_factor = len(topic.partitions[0].replicas) if topic.partitions else 1
                replicas = self._place(current, total - current, replication_factor)
            records = [
                self._partition_record(topic.topic_id, index, brokers)
                for index, brokers in enumerate(replicas, start=current)
            ]
            if not validate_only:
                await self._commit(records)
            return self._topic(name)

    async def delete_topic(self, topic_id: uuid.UUID) -> TopicImage:
        async with self._lock:
            topic = self.image.topics.by_id.get(topic_id)
            if topic is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID, f"No topic with id {topic_id}.")
            await self._commit([record(metadata_records.RemoveTopicRecord(topic_id=topic_id))])
            return topic

    async def alter_configs(
        self, resource_type: ConfigResourceType, name: str, changes: Mapping[str, str | None]
    ) -> None:
        async with self._lock:
            if resource_type == ConfigResourceType.TOPIC and self.image.topics.get(name) is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name} does not exist.")
            current = self.image.config(resource_type, name)
            records = [
                record(
                    metadata_records.ConfigRecord(
                        resource_type=resource_type, resource_name=name, name=key, value=value
                    )
                )
                for key, value in changes.items()
                if current.get(key) != value
            ]
            if records:
                await self._commit(records)

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> range:
        async with self._lock:
            block, records = self._producer_id_block(broker_id, broker_epoch)
            await self._commit(records)
            return block

    def allocate_producer_ids_now(self, broker_id: int, broker_epoch: int) -> range:
        if self._lock.locked():  # an asynchronous change is between its append and its apply: not now
            return super().allocate_producer_ids_now(broker_id, broker_epoch)
        block, records = self._producer_id_block(broker_id, broker_epoch)
        self._commit_now(records)
        return block

    def _producer_id_block(self, broker_id: int, broker_epoch: int) -> tuple[range, list[MetadataRecord]]:
        """The next block and its record, as Kafka's ProducerIdControlManager checks and describes it."""
        broker = self.image.brokers.get(broker_id)
        if broker is None or broker.epoch != broker_epoch:
            raise KafkaError(
                ErrorCode.STALE_BROKER_EPOCH, f"Unexpected broker epoch {broker_epoch} of broker {broker_id}."
            )
        start = self.image.next_producer_id
        if start > INT64_MAX - PRODUCER_ID_BLOCK_SIZE:
            raise KafkaError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                "Exhausted all producerIds as the next block's end producerId has exceeded the int64 type limit",
            )
        end = start + PRODUCER_ID_BLOCK_SIZE
        producer_ids = metadata_records.ProducerIdsRecord(
            broker_id=broker_id, broker_epoch=broker_epoch, next_producer_id=end
        )
        return range(start, end), [record(producer_ids)]

    async def update_features(self, updates: Mapping[str, tuple[int, int]], *, validate_only: bool = False) -> None:
        # As Kafka's FeatureControlManager: every update checked against the finalized levels, then one
        # FeatureLevelRecord per level that changes (none for a level it already has).
        async with self._lock:
            # Kafka's map of the brokers' features iterates small ids in ascending order.
            brokers = {
                broker_id: self.image.brokers[broker_id].supported_features for broker_id in sorted(self.image.brokers)
            }
            refusal = first_refusal(updates, self.image.features, self.node_id, brokers)
            if refusal is not None:
                raise KafkaError(ErrorCode.INVALID_UPDATE_VERSION, refusal)
            records = [
                record(metadata_records.FeatureLevelRecord(name=name, feature_level=level))
                for name, (level, _) in updates.items()
                if self.image.features.get(name, 0) != level
            ]
            if records and not validate_only:
                await self._commit(records)

    async def alter_partition(
        self,
        broker_id: int,
        broker_epoch: int,
        topic_id: uuid.UUID,
        index: int,
        *,
        leader_epoch: int,
        partition_epoch: int,
        isr: Sequence[tuple[int, int]],
    ) -> PartitionRegistration:
        # As Kafka's ReplicationControlManager.alterPartition and validateAlterPartitionData, in their order.
        async with self._lock:
            broker = self.image.brokers.get(broker_id)
            if broker is None or broker.epoch != broker_epoch:
                raise KafkaError(
                    ErrorCode.STALE_BROKER_EPOCH, f"Expected broker epoch of broker {broker_id}, got {broker_epoch}."
                )
            topic = self.image.topics.by_id.get(topic_id)
            if topic is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID, f"No topic with id {topic_id}.")
            partition = topic.partitions.get(index)
            if partition is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No partition {topic.name}-{index}.")
            problem = self._isr_change_problem(topic.name, index, partition, broker_id, leader_epoch, partition_epoch)
            if problem is not None:
                raise KafkaError(*problem)
            new_isr = [member for member, _ in isr]
            if len(set(new_isr)) != len(new_isr) or not set(new_isr) <= set(partition.replicas):
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"Invalid ISR {new_isr} for {topic.name}-{index}.")
            if partition.leader not in new_isr:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST, f"The ISR {new_isr} of {topic.name}-{index} does not include its leader."
                )
            ineligible = self._ineligible_for_isr(isr)
            if ineligible:
                raise KafkaError(
                    ErrorCode.INELIGIBLE_REPLICA,
                    f"The new ISR {new_isr} of {topic.name}-{index} has ineligible replicas: {', '.join(ineligible)}.",
                )
            if tuple(new_isr) != partition.isr:
                change = metadata_records.PartitionChangeRecord(partition_id=index, topic_id=topic_id, isr=new_isr)
                await self._commit([record(change)])
            registration = self.image.topics.by_id[topic_id].partitions[index]
            return registration

    @staticmethod
    def _isr_change_problem(
        name: str,
        index: int,
        partition: PartitionRegistration,
        broker_id: int,
        leader_epoch: int,
        partition_epoch: int,
    ) -> tuple[ErrorCode, str] | None:
        where = f"{name}-{index}"
        if leader_epoch > partition.leader_epoch or partition_epoch > partition.partition_epoch:
            return ErrorCode.NOT_CONTROLLER, f"The epochs of {where} are newer than the controller's."
        if leader_epoch < partition.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH, f"The leader epoch of {where} is {partition.leader_epoch}."
        if broker_id != partition.leader:
            return ErrorCode.INVALID_REQUEST, f"The leader of {where} is {partition.leader}, not {broker_id}."
        if partition_epoch < partition.partition_epoch:
            return ErrorCode.INVALID_UPDATE_VERSION, f"The partition epoch of {where} is {partition.partition_epoch}."
        return None

    def _ineligible_for_isr(self, isr: Sequence[tuple[int, int]]) -> list[str]:
        """Kafka's ineligibleReplicasForIsr: unregistered, shutting down, fenced, or another broker epoch."""
        ineligible = []
        for broker_id, broker_epoch in isr:
            broker = self.image.brokers.get(broker_id)
            if broker is None:
                ineligible.append(f"{broker_id} (not registered)")
            elif broker.in_controlled_shutdown:
                ineligible.append(f"{broker_id} (shutting down)")
            elif broker.fenced:
                ineligible.append(f"{broker_id} (fenced)")
            elif broker_epoch != -1 and broker_epoch != broker.epoch:
                ineligible.append(f"{broker_id} (broker epoch {broker_epoch}, registered {broker.epoch})")
        return ineligible

    async def create_acls(self, bindings: Sequence[AclBinding]) -> list[AclResult]:
        # As Kafka's AclControlManager.createAcls: each binding validated on its own; a valid one already in the
        # image (or earlier in this request) adds no record.
        from kbroker.security.authorizer import AclResult, acl_binding_of, new_acl_refusal

        async with self._lock:
            known = {acl_binding_of(entry) for entry in self.image.acls.values()}
            results: list[AclResult] = []
            records: list[MetadataRecord] = []
            for binding in bindings:
                refusal = new_acl_refusal(binding)
                if refusal is not None:
                    results.append(refusal)
                    continue
                if binding not in known:
                    known.add(binding)
                    records.append(self._acl_record(binding))
                results.append(AclResult(ErrorCode.NONE))
            if records:
                await self._commit(records)
            return results

    async def delete_acls(self, filters: Sequence[AclBindingFilter]) -> list[list[AclBinding] | AclResult]:
        from kbroker.security.authorizer import AclResult, acl_binding_of, acl_order

        async with self._lock:
            stored = sorted(
                ((acl_binding_of(entry), acl_id) for acl_id, entry in self.image.acls.items()),
                key=lambda pair: (acl_order(pair[0]), pair[1]),
            )
            answers: list[list[AclBinding] | AclResult] = []
            doomed: dict[uuid.UUID, None] = {}
            for binding_filter in filters:
                problem = binding_filter.unknown_problem()
                if problem is not None:
                    answers.append(AclResult(ErrorCode.INVALID_REQUEST, problem))
                    continue
                matched = [(binding, acl_id) for binding, acl_id in stored if binding_filter.matches(binding)]
                doomed.update(dict.fromkeys(acl_id for _, acl_id in matched))
                answers.append([binding for binding, _ in matched])
            if doomed:
                await self._commit(
                    [record(metadata_records.RemoveAccessControlEntryRecord(id=acl_id)) for acl_id in doomed]
                )
            return answers

    async def alter_user_scram_credentials(
        self, deletions: Sequence[tuple[str, int]], upsertions: Sequence[Upsertion]
    ) -> list[ScramAlterResult]:
        # As Kafka's ScramControlManager (kbroker/security/scram_credentials.py, imported by the first change).
        from kbroker.security.scram_credentials import alter_records

        async with self._lock:
            results, records = alter_records(self.image, deletions, upsertions)
            if records:
                await self._commit(records)
            return results

    async def alter_client_quotas(
        self, entries: Sequence[QuotaEntry], validate_only: bool, resolvable: Callable[[str], bool]
    ) -> list[QuotaAlterResult]:
        # As Kafka's ClientQuotaControlManager (kbroker/quotas.py).
        from kbroker.quotas import alter_records

        async with self._lock:
            results, records = alter_records(self.image, entries, resolvable)
            if records and not validate_only:
                await self._commit(records)
            return results

    @staticmethod
    def _acl_record(binding: AclBinding) -> MetadataRecord:
        from kbroker.security.authorizer import acl_entry_of

        entry = acl_entry_of(binding)
        return record(
            metadata_records.AccessControlEntryRecord(
                id=uuid.uuid4(),
                resource_type=entry.resource_type,
                resource_name=entry.resource_name,
                pattern_type=entry.pattern_type,
                principal=entry.principal,
                host=entry.host,
                operation=entry.operation,
                permission_type=entry.permission_type,
            )
        )

    # --- validation and placement, as Kafka's ReplicationControlManager ------------------------------------

    def _usable_brokers(self) -> list[int]:
        return sorted(b.broker_id for b in self.image.brokers.values() if not b.fenced)

    def _check_assignment(self, index: int, brokers: Sequence[int]) -> None:
        if not brokers:
            raise KafkaError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"The manual partition assignment for partition {index} is empty."
            )
        if len(set(brokers)) != len(brokers):
            raise KafkaError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"The manual partition assignment for partition {index} includes a duplicate broker.",
            )
        registered = self.image.brokers
        for broker_id in brokers:
            if broker_id not in registered:
                raise KafkaError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"The manual partition assignment includes broker {broker_id}, but no broker with that ID is "
                    "registered.",
                )

    def _place(self, first: int, count: int, replication_factor: int) -> list[list[int]]:
        """Replicas for ``count`` new partitions: each a run of distinct brokers, their starts striped across the
        brokers so leaders spread evenly (Kafka's StripedReplicaPlacer, without racks)."""
        if replication_factor <= 0:
            raise KafkaError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                "Replication factor must be larger than 0, or -1 to use the default value.",
            )
        brokers = self._usable_brokers()
        if replication_factor > len(brokers):
            raise KafkaError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"Unable to replicate the partition {replication_factor} time(s): The target replication factor of "
                f"{replication_factor} cannot be reached because only {len(brokers)} broker(s) are registered.",
            )
        return [
            [brokers[(index + offset) % len(brokers)] for offset in range(replication_factor)]
            for index in range(first, first + count)
        ]

    # --- records ---------------------------------------------------------------------------------------------

    def _topic_records(
        self, name: str, topic_id: uuid.UUID, replicas: Sequence[Sequence[int]], configs: Mapping[str, str]
    ) -> list[MetadataRecord]:
        records = [record(metadata_records.TopicRecord(name=name, topic_id=topic_id))]
        records.extend(
            record(
                metadata_records.ConfigRecord(
                    resource_type=ConfigResourceType.TOPIC, resource_name=name, name=key, value=value
                )
            )
            for key, value in configs.items()
        )
        records.extend(self._partition_record(topic_id, index, brokers) for index, brokers in enumerate(replicas))
        return records

    @staticmethod
    def _partition_record(topic_id: uuid.UUID, index: int, brokers: Sequence[int]) -> MetadataRecord:
        return record(
            metadata_records.PartitionRecord(
                partition_id=index,
                topic_id=topic_id,
                replicas=list(brokers),
                isr=list(brokers),
                removing_replicas=[],
                adding_replicas=[],
                leader=brokers[0],
                leader_recovery_state=0,
                leader_epoch=0,
                partition_epoch=0,
                directories=[],
                eligible_leader_replicas=[],
                last_known_elr=[],
            )
        )

    def _topic(self, name: str) -> TopicImage:
        topic = self.image.topics.get(name)
        assert topic is not None  # just committed, under the lock
        return topic

    # --- commit ------------------------------------------------------------------------------------------------

    def _end_offset(self) -> int:
        return self.metadata_log.end_offset if self.metadata_log is not None else self._next_offset

    def _check(self, records: Sequence[MetadataRecord]) -> None:
        """Apply ``records`` to a scratch delta first: what would not apply is never written."""
        delta = MetadataDelta(self.image)
        try:
            for item in records:
                delta.replay(item.message, -1, -1)
        except ImageError as exc:
            raise KafkaError(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"the controller built records that do not apply: {exc}"
            ) from None

    def _apply(self, offset: int, records: Sequence[MetadataRecord]) -> None:
        epoch = self.metadata_log.leader_epoch if self.metadata_log is not None else 0
        for index, item in enumerate(records):
            self._builder.replay(item.message, offset + index, epoch)
        self._next_offset = offset + len(records)
        published = self._builder.publish()
        if published is not None:
            self.cache.publish(*published)

    def _commit_now(self, records: Sequence[MetadataRecord]) -> None:
        """Commit on the calling thread (start-up, before requests are served)."""
        self._check(records)
        offset = self._next_offset if self.metadata_log is None else self.metadata_log.append(records)
        self._apply(offset, records)
        if self._snapshot_due():
            self.write_snapshot()

    async def _commit(self, records: Sequence[MetadataRecord]) -> None:
        """Commit (the append and its fsync in a worker thread), then apply; the caller holds the lock."""
        self._check(records)
        if self.metadata_log is None:
            offset = self._next_offset
        else:
            try:
                offset = await trio.to_thread.run_sync(self.metadata_log.append, records, abandon_on_cancel=False)
            except StorageError as exc:
                log.error("cannot commit metadata: %s", exc)
                raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot commit metadata: {exc}") from None
        self._apply(offset, records)
        if self._snapshot_due():
            await trio.to_thread.run_sync(self.write_snapshot, abandon_on_cancel=False)

    # --- snapshots -------------------------------------------------------------------------------------------

    def _snapshot_due(self) -> bool:
        if self.metadata_log is None or self._builder.in_transaction:
            return False
        return self.snapshots.due(self.metadata_log.bytes_since_snapshot, wall_clock_ms() - self._last_snapshot_ms)

    def write_snapshot(self) -> None:
        """Snapshot the current image (no change may be committed meanwhile: the caller holds the lock, or runs
        before requests are served), then let the log's retention delete what older snapshots alone covered. A
        failure is logged: the commit that asked for it stands, and the next commit asks again."""
        if self.metadata_log is None:
            return
        self._last_snapshot_ms = wall_clock_ms()
        write_snapshot(self.metadata_log, self.image, self.snapshots)
