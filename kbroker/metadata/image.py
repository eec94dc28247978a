"""The metadata image: the whole cluster's state as one immutable value, built by applying Kafka's metadata records.

Everything a handler needs to know about the cluster (brokers and their endpoints, topics, partitions with their
replicas, leader, epochs and ISR, configs, ACLs, SCRAM credentials, client quotas, finalized features, the next
producer id block) is read from one ``MetadataImage``. Nothing else holds these facts: a single node's own
controller and, in a cluster, Kafka's KRaft controller quorum both describe changes as records of
``__cluster_metadata`` (protocol/metadata_records), and ``MetadataDelta`` applies them to an image to make the
next one, as Kafka's MetadataDelta does. An image is never changed in place: a reader that holds one sees one
consistent state for as long as it holds it.

Applying a record follows Kafka's image classes (org.apache.kafka.image): a PartitionChangeRecord that names a
leader bumps the leader epoch, every one bumps the partition epoch; a RemoveTopicRecord drops the topic's
configs with it; a feature at level 0 is removed; records between BeginTransactionRecord and EndTransactionRecord
are published together or, after AbortTransactionRecord, not at all (``MetadataImageBuilder``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from enum import IntEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from protocol._codec import Message

if TYPE_CHECKING:
    from protocol.metadata_records.access_control_entry_record import AccessControlEntryRecord
    from protocol.metadata_records.broker_registration_change_record import BrokerRegistrationChangeRecord
    from protocol.metadata_records.clear_elr_record import ClearElrRecord
    from protocol.metadata_records.client_quota_record import ClientQuotaRecord
    from protocol.metadata_records.config_record import ConfigRecord
    from protocol.metadata_records.delegation_token_record import DelegationTokenRecord
    from protocol.metadata_records.feature_level_record import FeatureLevelRecord
    from protocol.metadata_records.fence_broker_record import FenceBrokerRecord
    from protocol.metadata_records.partition_change_record import PartitionChangeRecord
    from protocol.metadata_records.partition_record import PartitionRecord
    from protocol.metadata_records.producer_ids_record import ProducerIdsRecord
    from protocol.metadata_records.register_broker_record import RegisterBrokerRecord
    from protocol.metadata_records.register_controller_record import RegisterControllerRecord
    from protocol.metadata_records.remove_access_control_entry_record import RemoveAccessControlEntryRecord
    from protocol.metadata_records.remove_delegation_token_record import RemoveDelegationTokenRecord
    from protocol.metadata_records.remove_topic_record import RemoveTopicRecord
    from protocol.metadata_records.remove_user_scram_credential_record import RemoveUserScramCredentialRecord
    from protocol.metadata_records.topic_record import TopicRecord
    from protocol.metadata_records.unfence_broker_record import UnfenceBrokerRecord
    from protocol.metadata_records.unregister_broker_record import UnregisterBrokerRecord
    from protocol.metadata_records.unregister_controller_record import UnregisterControllerRecord
    from protocol.metadata_records.user_scram_credential_record import UserScramCredentialRecord

NO_LEADER = -1
NO_LEADER_CHANGE = -2  # PartitionChangeRecord.leader when the leader stays
METADATA_VERSION_FEATURE = "metadata.version"


class ImageError(Exception):
    """A record that cannot apply to the image it follows (a partition of an unknown topic, a change to an
    unknown partition or broker): the metadata log is not what it claims to be."""


class ConfigResourceType(IntEnum):
    """ConfigRecord.resource_type: Kafka's ConfigResource.Type ids."""

    TOPIC = 2
    BROKER = 4
    BROKER_LOGGER = 8
    CLIENT_METRICS = 16
    GROUP = 32


class ScramMechanism(IntEnum):
    """UserScramCredentialRecord.mechanism: Kafka's ScramMechanism ids."""

    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2


class LeaderRecoveryState(IntEnum):
    RECOVERED = 0
    RECOVERING = 1


def _frozen(mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(mapping))


EMPTY: Mapping[Any, Any] = MappingProxyType({})


class PartitionRegistration(NamedTuple):
    """A partition as the controller registered it (Kafka's PartitionRegistration)."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    removing_replicas: tuple[int, ...] = ()
    adding_replicas: tuple[int, ...] = ()
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED
    directories: tuple[uuid.UUID, ...] = ()
    eligible_leader_replicas: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()

    @classmethod
    def from_record(cls, record: PartitionRecord) -> PartitionRegistration:
        return cls(
            replicas=tuple(record.replicas),
            isr=tuple(record.isr),
            leader=record.leader,
            leader_epoch=record.leader_epoch,
            partition_epoch=record.partition_epoch,
            removing_replicas=tuple(record.removing_replicas),
            adding_replicas=tuple(record.adding_replicas),
            leader_recovery_state=LeaderRecoveryState(record.leader_recovery_state),
            directories=tuple(record.directories or ()),
            eligible_leader_replicas=tuple(record.eligible_leader_replicas or ()),
            last_known_elr=tuple(record.last_known_elr or ()),
        )

    def merge(self, change: PartitionChangeRecord) -> PartitionRegistration:
        """The registration after ``change``: fields it leaves null stay; a new leader bumps the leader epoch;
        every change bumps the partition epoch."""
        leader, leader_epoch = self.leader, self.leader_epoch
        if change.leader != NO_LEADER_CHANGE:
            leader, leader_epoch = change.leader, self.leader_epoch + 1
        recovery = self.leader_recovery_state
        if change.leader_recovery_state >= 0:
            recovery = LeaderRecoveryState(change.leader_recovery_state)
        return PartitionRegistration(
            replicas=self.replicas if change.replicas is None else tuple(change.replicas),
            isr=self.isr if change.isr is None else tuple(change.isr),
            leader=leader,
            leader_epoch=leader_epoch,
            partition_epoch=self.partition_epoch + 1,
            removing_replicas=self.removing_replicas
            if change.removing_replicas is None
            else tuple(change.removing_replicas),
            adding_replicas=self.adding_replicas if change.adding_replicas is None else tuple(change.adding_replicas),
            leader_recovery_state=recovery,
            directories=self.directories if change.directories is None else tuple(change.directories),
            eligible_leader_replicas=self.eligible_leader_replicas
            if change.eligible_leader_replicas is None
            else tuple(change.eligible_leader_replicas),
            last_known_elr=self.last_known_elr if change.last_known_elr is None else tuple(change.last_known_elr),
        )

    def has_leader(self) -> bool:
        return self.leader >= 0


class TopicImage(NamedTuple):
    name: str
    topic_id: uuid.UUID
    partitions: Mapping[int, PartitionRegistration] = EMPTY


class TopicsImage(NamedTuple):
    by_id: Mapping[uuid.UUID, TopicImage] = EMPTY
    by_name: Mapping[str, TopicImage] = EMPTY

    def get(self, name: str) -> TopicImage | None:
        return self.by_name.get(name)

    def partition(self, name: str, index: int) -> PartitionRegistration | None:
        topic = self.by_name.get(name)
        return None if topic is None else topic.partitions.get(index)


class BrokerEndpoint(NamedTuple):
    listener: str
    host: str
    port: int
    security_protocol: int


class BrokerRegistration(NamedTuple):
    """A broker as it registered (Kafka's BrokerRegistration): its endpoints by listener name and its state."""

    broker_id: int
    epoch: int
    incarnation_id: uuid.UUID
    endpoints: Mapping[str, BrokerEndpoint]
    rack: str | None
    fenced: bool
    in_controlled_shutdown: bool
    supported_features: Mapping[str, tuple[int, int]] = EMPTY
    log_dirs: tuple[uuid.UUID, ...] = ()

    @classmethod
    def from_record(cls, record: RegisterBrokerRecord) -> BrokerRegistration:
        return cls(
            broker_id=record.broker_id,
            epoch=record.broker_epoch,
            incarnation_id=record.incarnation_id,
            endpoints=_frozen(
                {e.name: BrokerEndpoint(e.name, e.host, e.port, e.security_protocol) for e in record.end_points}
            ),
            rack=record.rack,
            fenced=record.fenced,
            in_controlled_shutdown=record.in_controlled_shutdown,
            supported_features=_frozen(
                {f.name: (f.min_supported_version, f.max_supported_version) for f in record.features}
            ),
            log_dirs=tuple(record.log_dirs),
        )


class ControllerRegistration(NamedTuple):
    controller_id: int
    incarnation_id: uuid.UUID
    endpoints: Mapping[str, BrokerEndpoint]


class AclEntry(NamedTuple):
    """An ACL binding as AccessControlEntryRecord holds it (Kafka's StandardAcl)."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int


class ScramCredential(NamedTuple):
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


# A client quota entity: its (entity type, name) pairs, sorted; a None name is the default entity of that type.
QuotaEntity = tuple[tuple[str, str | None], ...]


def quota_entity(pairs: Iterable[tuple[str, str | None]]) -> QuotaEntity:
    return tuple(sorted(pairs, key=lambda pair: pair[0]))


class MetadataProvenance(NamedTuple):
    """Where an image stands in the metadata log: the offset and epoch of the last record it includes."""

    offset: int = -1
    epoch: int = -1


class MetadataImage(NamedTuple):
    provenance: MetadataProvenance = MetadataProvenance()
    features: Mapping[str, int] = EMPTY
    brokers: Mapping[int, BrokerRegistration] = EMPTY
    controllers: Mapping[int, ControllerRegistration] = EMPTY
    topics: TopicsImage = TopicsImage()
    configs: Mapping[tuple[ConfigResourceType, str], Mapping[str, str]] = EMPTY
    acls: Mapping[uuid.UUID, AclEntry] = EMPTY
    scram_credentials: Mapping[tuple[str, ScramMechanism], ScramCredential] = EMPTY
    client_quotas: Mapping[QuotaEntity, Mapping[str, float]] = EMPTY
    next_producer_id: int = 0
    delegation_tokens: Mapping[str, DelegationTokenRecord] = EMPTY

    def is_empty(self) -> bool:
        return self.provenance.offset < 0

    @property
    def metadata_version(self) -> int:
        return self.features.get(METADATA_VERSION_FEATURE, 0)

    def config(self, resource_type: ConfigResourceType, name: str) -> Mapping[str, str]:
        """The configs set on one resource (for a broker: its id as a string; the cluster default: "")."""
        return self.configs.get((resource_type, name), EMPTY)


class LocalChanges:
    """What a delta changes for one broker's replicas (Kafka's LocalReplicaChanges)."""

    __slots__ = ("leaders", "followers", "deletes")

    def __init__(self) -> None:
        self.leaders: dict[tuple[str, int], PartitionRegistration] = {}
        self.followers: dict[tuple[str, int], PartitionRegistration] = {}
        self.deletes: set[tuple[str, int]] = set()


class MetadataDelta:
    """Records applied on top of an image; ``apply`` gives the next image. Only the sections records touch are
    copied (a section is copied whole: Kafka uses persistent maps here; a dict copy is fine at kbroker's sizes)."""

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self._features: dict[str, int] | None = None
        self._brokers: dict[int, BrokerRegistration] | None = None
        self._controllers: dict[int, ControllerRegistration] | None = None
        self._topics: dict[uuid.UUID, TopicImage] | None = None
        self._changed_partitions: dict[uuid.UUID, dict[int, PartitionRegistration]] = {}
        self._removed_topics: dict[uuid.UUID, TopicImage] = {}
        self._configs: dict[tuple[ConfigResourceType, str], dict[str, str]] | None = None
        self._acls: dict[uuid.UUID, AclEntry] | None = None
        self._scram: dict[tuple[str, ScramMechanism], ScramCredential] | None = None
        self._quotas: dict[QuotaEntity, dict[str, float]] | None = None
        self._tokens: dict[str, DelegationTokenRecord] | None = None
        self._next_producer_id = image.next_producer_id
        self._provenance = image.provenance

    # --- sections, copied on first write -------------------------------------------------------------------------

    def _topics_map(self) -> dict[uuid.UUID, TopicImage]:
        if self._topics is None:
            self._topics = dict(self.image.topics.by_id)
        return self._topics

    def _configs_map(self) -> dict[tuple[ConfigResourceType, str], dict[str, str]]:
        if self._configs is None:
            self._configs = {key: dict(values) for key, values in self.image.configs.items()}
        return self._configs

    def _brokers_map(self) -> dict[int, BrokerRegistration]:
        if self._brokers is None:
            self._brokers = dict(self.image.brokers)
        return self._brokers

    def _broker(self, broker_id: int, epoch: int, record: Message) -> BrokerRegistration:
        broker = self._brokers_map().get(broker_id)
        if broker is None or broker.epoch != epoch:
            raise ImageError(f"{type(record).__name__} for broker {broker_id} epoch {epoch}, which is not registered")
        return broker

    def _partitions_of(
        self, topic_id: uuid.UUID, record: Message
    ) -> tuple[TopicImage, dict[int, PartitionRegistration]]:
        topic = self._topics_map().get(topic_id)
        if topic is None:
            raise ImageError(f"{type(record).__name__} for topic id {topic_id}, which does not exist")
        changed = self._changed_partitions.setdefault(topic_id, {})
        return topic, changed

    # --- replay ---------------------------------------------------------------------------------------------------

    def replay(self, record: Message, offset: int = -1, epoch: int = -1) -> None:
        """Apply one record (at ``offset`` of the metadata log, written in leader ``epoch``)."""
        handler = _REPLAY.get(type(record).__name__)
        if handler is None:
            raise ImageError(f"no image applies {type(record).__name__}")
        handler(self, record)
        if offset >= 0:
            self._provenance = MetadataProvenance(offset, epoch)

    def _topic(self, record: TopicRecord) -> None:
        topics = self._topics_map()
        if record.topic_id in topics:
            raise ImageError(f"TopicRecord for {record.name}: topic id {record.topic_id} exists")
        topics[record.topic_id] = TopicImage(record.name, record.topic_id)
        self._removed_topics.pop(record.topic_id, None)

    def _partition(self, record: PartitionRecord) -> None:
        _, changed = self._partitions_of(record.topic_id, record)
        changed[record.partition_id] = PartitionRegistration.from_record(record)

    def _partition_change(self, record: PartitionChangeRecord) -> None:
        topic, changed = self._partitions_of(record.topic_id, record)
        current = changed.get(record.partition_id) or topic.partitions.get(record.partition_id)
        if current is None:
            raise ImageError(f"PartitionChangeRecord for {topic.name}-{record.partition_id}, which does not exist")
        changed[record.partition_id] = current.merge(record)

    def _remove_topic(self, record: RemoveTopicRecord) -> None:
        topic = self._topics_map().pop(record.topic_id, None)
        if topic is None:
            raise ImageError(f"RemoveTopicRecord for topic id {record.topic_id}, which does not exist")
        self._changed_partitions.pop(record.topic_id, None)
        self._removed_topics[record.topic_id] = topic
        self._configs_map().pop((ConfigResourceType.TOPIC, topic.name), None)

    def _clear_elr(self, record: ClearElrRecord) -> None:
        for topic in list(self._topics_map().values()):
            if record.topic_name and topic.name != record.topic_name:
                continue
            changed = self._changed_partitions.setdefault(topic.topic_id, {})
            for index, partition in {**topic.partitions, **changed}.items():
                if partition.eligible_leader_replicas or partition.last_known_elr:
                    changed[index] = partition._replace(eligible_leader_replicas=(), last_known_elr=())

    def _config(self, record: ConfigRecord) -> None:
        key = (ConfigResourceType(record.resource_type), record.resource_name)
        configs = self._configs_map()
        values = configs.setdefault(key, {})
        if record.value is None:
            values.pop(record.name, None)
            if not values:
                del configs[key]
        else:
            values[record.name] = record.value

    def _feature(self, record: FeatureLevelRecord) -> None:
        if self._features is None:
            self._features = dict(self.image.features)
        if record.feature_level == 0:
            self._features.pop(record.name, None)
        else:
            self._features[record.name] = record.feature_level

    def _register_broker(self, record: RegisterBrokerRecord) -> None:
        self._brokers_map()[record.broker_id] = BrokerRegistration.from_record(record)

    def _unregister_broker(self, record: UnregisterBrokerRecord) -> None:
        self._broker(record.broker_id, record.broker_epoch, record)
        del self._brokers_map()[record.broker_id]

    def _fence(self, record: FenceBrokerRecord) -> None:
        broker = self._broker(record.id, record.epoch, record)
        self._brokers_map()[record.id] = broker._replace(fenced=True)

    def _unfence(self, record: UnfenceBrokerRecord) -> None:
        broker = self._broker(record.id, record.epoch, record)
        self._brokers_map()[record.id] = broker._replace(fenced=False)

    def _broker_change(self, record: BrokerRegistrationChangeRecord) -> None:
        broker = self._broker(record.broker_id, record.broker_epoch, record)
        fenced = {1: True, -1: False}.get(record.fenced, broker.fenced)  # BrokerRegistrationFencingChange
        shutdown = True if record.in_controlled_shutdown == 1 else broker.in_controlled_shutdown
        log_dirs = broker.log_dirs if not record.log_dirs else tuple(record.log_dirs)
        self._brokers_map()[record.broker_id] = broker._replace(
            fenced=fenced, in_controlled_shutdown=shutdown, log_dirs=log_dirs
        )

    def _register_controller(self, record: RegisterControllerRecord) -> None:
        if self._controllers is None:
            self._controllers = dict(self.image.controllers)
        endpoints = {e.name: BrokerEndpoint(e.name, e.host, e.port, e.security_protocol) for e in record.end_points}
        self._controllers[record.controller_id] = ControllerRegistration(
            record.controller_id, record.incarnation_id, _frozen(endpoints)
        )

    def _unregister_controller(self, record: UnregisterControllerRecord) -> None:
        if self._controllers is None:
            self._controllers = dict(self.image.controllers)
        if self._controllers.pop(record.controller_id, None) is None:
            raise ImageError(
                f"UnregisterControllerRecord for controller {record.controller_id}, which is not registered"
            )

    def _acl(self, record: AccessControlEntryRecord) -> None:
        if self._acls is None:
            self._acls = dict(self.image.acls)
        self._acls[record.id] = AclEntry(
            record.resource_type,
            record.resource_name,
            record.pattern_type,
            record.principal,
            record.host,
            record.operation,
            record.permission_type,
        )

    def _remove_acl(self, record: RemoveAccessControlEntryRecord) -> None:
        if self._acls is None:
            self._acls = dict(self.image.acls)
        if self._acls.pop(record.id, None) is None:
            raise ImageError(f"RemoveAccessControlEntryRecord for ACL {record.id}, which does not exist")

    def _scram_map(self) -> dict[tuple[str, ScramMechanism], ScramCredential]:
        if self._scram is None:
            self._scram = dict(self.image.scram_credentials)
        return self._scram

    def _scram_credential(self, record: UserScramCredentialRecord) -> None:
        key = (record.name, ScramMechanism(record.mechanism))
        self._scram_map()[key] = ScramCredential(record.salt, record.stored_key, record.server_key, record.iterations)

    def _remove_scram(self, record: RemoveUserScramCredentialRecord) -> None:
        self._scram_map().pop((record.name, ScramMechanism(record.mechanism)), None)

    def _client_quota(self, record: ClientQuotaRecord) -> None:
        if self._quotas is None:
            self._quotas = {entity: dict(values) for entity, values in self.image.client_quotas.items()}
        entity = quota_entity((e.entity_type, e.entity_name) for e in record.entity)
        values = self._quotas.setdefault(entity, {})
        if record.remove:
            values.pop(record.key, None)
            if not values:
                del self._quotas[entity]
        else:
            values[record.key] = record.value

    def _producer_ids(self, record: ProducerIdsRecord) -> None:
        if record.next_producer_id < self._next_producer_id:
            raise ImageError(
                f"ProducerIdsRecord moves the next producer id back from {self._next_producer_id} to "
                f"{record.next_producer_id}"
            )
        self._next_producer_id = record.next_producer_id

    def _delegation_token(self, record: DelegationTokenRecord) -> None:
        if self._tokens is None:
            self._tokens = dict(self.image.delegation_tokens)
        self._tokens[record.token_id] = record

    def _remove_delegation_token(self, record: RemoveDelegationTokenRecord) -> None:
        if self._tokens is None:
            self._tokens = dict(self.image.delegation_tokens)
        self._tokens.pop(record.token_id, None)

    def _nothing(self, record: Message) -> None:
        """NoOpRecord (the controller's heartbeat into the log), the ZooKeeper migration state and the markers of
        metadata transactions: no state of their own."""

    # --- results --------------------------------------------------------------------------------------------------

    def apply(self) -> MetadataImage:
        image = self.image
        topics = image.topics
        if self._topics is not None or self._changed_partitions:
            by_id = self._topics_map()
            for topic_id, changed in self._changed_partitions.items():
                if changed and topic_id in by_id:
                    topic = by_id[topic_id]
                    by_id[topic_id] = topic._replace(partitions=_frozen({**topic.partitions, **changed}))
            topics = TopicsImage(_frozen(by_id), _frozen({t.name: t for t in by_id.values()}))
        return MetadataImage(
            provenance=self._provenance,
            features=image.features if self._features is None else _frozen(self._features),
            brokers=image.brokers if self._brokers is None else _frozen(self._brokers),
            controllers=image.controllers if self._controllers is None else _frozen(self._controllers),
            topics=topics,
            configs=image.configs
            if self._configs is None
            else _frozen({key: _frozen(values) for key, values in self._configs.items()}),
            acls=image.acls if self._acls is None else _frozen(self._acls),
            scram_credentials=image.scram_credentials if self._scram is None else _frozen(self._scram),
            client_quotas=image.client_quotas
            if self._quotas is None
            else _frozen({entity: _frozen(values) for entity, values in self._quotas.items()}),
            next_producer_id=self._next_producer_id,
            delegation_tokens=image.delegation_tokens if self._tokens is None else _frozen(self._tokens),
        )

    def is_empty(self) -> bool:
        """Nothing replayed: not even a record that only moves the image's offset (NoOpRecord)."""
        sections = (
            self._features,
            self._brokers,
            self._controllers,
            self._topics,
            self._configs,
            self._acls,
            self._scram,
            self._quotas,
            self._tokens,
        )
        return (
            all(section is None for section in sections)
            and not self._changed_partitions
            and self._next_producer_id == self.image.next_producer_id
            and self._provenance == self.image.provenance
        )

    def changed_configs(self) -> list[tuple[ConfigResourceType, str]]:
        """The resources whose configs this delta changes (set, altered or removed)."""
        if self._configs is None:
            return []
        before = self.image.configs
        return [key for key in {*before, *self._configs} if dict(before.get(key, EMPTY)) != self._configs.get(key, {})]

    def removed_topics(self) -> list[TopicImage]:
        return list(self._removed_topics.values())

    def changed_partitions(self) -> Iterator[tuple[TopicImage, int, PartitionRegistration]]:
        topics = self._topics_map() if self._topics is not None else self.image.topics.by_id
        for topic_id, changed in self._changed_partitions.items():
            topic = topics.get(topic_id)
            if topic is not None:
                for index, partition in changed.items():
                    yield topic, index, partition

    def local_changes(self, broker_id: int) -> LocalChanges:
        """The partitions this delta makes ``broker_id`` lead or follow, and those it no longer holds a replica
        of (removed topics and reassignments away from it), as Kafka's TopicsDelta.localChanges."""
        changes = LocalChanges()
        for topic in self._removed_topics.values():
            for index, partition in topic.partitions.items():
                if broker_id in partition.replicas:
                    changes.deletes.add((topic.name, index))
        for topic, index, partition in self.changed_partitions():
            key = (topic.name, index)
            if broker_id in partition.replicas:
                target = changes.leaders if partition.leader == broker_id else changes.followers
                target[key] = partition
            else:
                before = self.image.topics.by_id.get(topic.topic_id)
                previous = None if before is None else before.partitions.get(index)
                if previous is not None and broker_id in previous.replicas:
                    changes.deletes.add(key)
        return changes


# By class name: the record classes' modules are imported when a record is decoded, not with this one.
_REPLAY: dict[str, Any] = {
    "TopicRecord": MetadataDelta._topic,
    "PartitionRecord": MetadataDelta._partition,
    "PartitionChangeRecord": MetadataDelta._partition_change,
    "RemoveTopicRecord": MetadataDelta._remove_topic,
    "ClearElrRecord": MetadataDelta._clear_elr,
    "ConfigRecord": MetadataDelta._config,
    "FeatureLevelRecord": MetadataDelta._feature,
    "RegisterBrokerRecord": MetadataDelta._register_broker,
    "UnregisterBrokerRecord": MetadataDelta._unregister_broker,
    "FenceBrokerRecord": MetadataDelta._fence,
    "UnfenceBrokerRecord": MetadataDelta._unfence,
    "BrokerRegistrationChangeRecord": MetadataDelta._broker_change,
    "RegisterControllerRecord": MetadataDelta._register_controller,
    "UnregisterControllerRecord": MetadataDelta._unregister_controller,
    "AccessControlEntryRecord": MetadataDelta._acl,
    "RemoveAccessControlEntryRecord": MetadataDelta._remove_acl,
    "UserScramCredentialRecord": MetadataDelta._scram_credential,
    "RemoveUserScramCredentialRecord": MetadataDelta._remove_scram,
    "ClientQuotaRecord": MetadataDelta._client_quota,
    "ProducerIdsRecord": MetadataDelta._producer_ids,
    "DelegationTokenRecord": MetadataDelta._delegation_token,
    "RemoveDelegationTokenRecord": MetadataDelta._remove_delegation_token,
    "NoOpRecord": MetadataDelta._nothing,
    "ZkMigrationStateRecord": MetadataDelta._nothing,
    # Metadata transactions are MetadataImageBuilder's: to a delta they only move the offset.
    "BeginTransactionRecord": MetadataDelta._nothing,
    "EndTransactionRecord": MetadataDelta._nothing,
    "AbortTransactionRecord": MetadataDelta._nothing,
}


class MetadataImageBuilder:
    """Applies the records of the metadata log in order and publishes images, honouring metadata transactions
    (KIP-868): records after BeginTransactionRecord are published with EndTransactionRecord, and dropped at
    AbortTransactionRecord, so no reader sees half of a transaction."""

    def __init__(self, image: MetadataImage | None = None) -> None:
        self.image = image if image is not None else MetadataImage()  # the last published image
        self._delta = MetadataDelta(self.image)
        self._in_transaction = False

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    def replay(self, record: Message, offset: int = -1, epoch: int = -1) -> None:
        kind = type(record).__name__
        if kind == "BeginTransactionRecord":
            if self._in_transaction:
                raise ImageError("BeginTransactionRecord inside a metadata transaction")
            self._in_transaction = True
        elif kind == "EndTransactionRecord":
            if not self._in_transaction:
                raise ImageError("EndTransactionRecord outside a metadata transaction")
            self._in_transaction = False
        elif kind == "AbortTransactionRecord":
            if not self._in_transaction:
                raise ImageError("AbortTransactionRecord outside a metadata transaction")
            self._in_transaction = False
            self._delta = MetadataDelta(self.image)  # what the transaction replayed is dropped
        self._delta.replay(record, offset, epoch)

    def publish(self) -> tuple[MetadataImage, MetadataDelta] | None:
        """The new image and the delta that made it, when records were applied outside an open transaction."""
        if self._in_transaction:
            return None
        delta = self._delta
        if delta.is_empty():
            return None
        self.image = delta.apply()
        self._delta = MetadataDelta(self.image)
        return self.image, delta
