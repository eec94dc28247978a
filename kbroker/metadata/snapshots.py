"""Snapshots of the metadata image: the records that rebuild it, and when the controller writes one.

``image_records`` describes an image as Kafka's MetadataImage.write does, section by section in Kafka's order
(features with metadata.version first, the cluster's brokers and controllers, topics with their partitions,
configs, client quotas, the next producer id block, ACLs, SCRAM credentials, delegation tokens): replaying them
on an empty image gives the same image. The metadata log writes them between a SnapshotHeaderRecord and a
SnapshotFooterRecord as ``<end offset>-<epoch>.checkpoint`` (kbroker/metadata/log.py), the file Kafka's
RecordsSnapshotWriter writes and its dump tool reads.

``SnapshotPolicy`` is Kafka's SnapshotGenerator and KafkaMetadataLog retention, with Kafka's keys and defaults:
a snapshot once metadata.log.max.record.bytes.between.snapshots bytes of batches were appended since the last
one, or once metadata.log.max.snapshot.interval.ms passed with anything appended (both looked at as each change
is committed, as Kafka's generator looks at each published image); after it, older snapshots and the log
segments they alone cover go while the log and its snapshots are over metadata.max.retention.bytes, or the older
snapshots' last records are older than metadata.max.retention.ms.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, NamedTuple

from kbroker.durable.files import StorageError
from kbroker.metadata.image import METADATA_VERSION_FEATURE, MetadataImage
from protocol import metadata_records
from protocol._codec import Message
from protocol.metadata_frame import MetadataRecord

if TYPE_CHECKING:
    from kbroker.config import BrokerConfig
    from kbroker.metadata.log import MetadataLog

log = logging.getLogger("kbroker.metadata")


class SnapshotPolicy(NamedTuple):
    """When to write a snapshot and how long older ones (and the log they cover) are kept; Kafka's defaults."""

    max_bytes_between: int = 20 * 1024 * 1024  # metadata.log.max.record.bytes.between.snapshots
    max_interval_ms: int = 60 * 60 * 1000  # metadata.log.max.snapshot.interval.ms (0: no time bound)
    retention_bytes: int = 100 * 1024 * 1024  # metadata.max.retention.bytes (below 1: no size bound)
    retention_ms: int = 7 * 24 * 60 * 60 * 1000  # metadata.max.retention.ms (below 1: no time bound)

    @classmethod
    def from_config(cls, config: BrokerConfig) -> SnapshotPolicy:
        """The policy Kafka's keys in ``config`` set (a controller's and a broker's alike)."""
        return cls(
            max_bytes_between=config["metadata.log.max.record.bytes.between.snapshots"],
            max_interval_ms=config["metadata.log.max.snapshot.interval.ms"],
            retention_bytes=config["metadata.max.retention.bytes"],
            retention_ms=config["metadata.max.retention.ms"],
        )

    def due(self, bytes_since: int, ms_since: int) -> bool:
        if bytes_since <= 0:
            return False
        return bytes_since >= self.max_bytes_between or 0 < self.max_interval_ms <= ms_since


def write_snapshot(metadata_log: MetadataLog, image: MetadataImage, policy: SnapshotPolicy) -> None:
    """Snapshot ``image`` (published at the log's end, nothing appended meanwhile) into ``metadata_log``, then let
    the log's retention delete what older snapshots alone covered. A failure is logged: what asked for it stands,
    and the next bound asks again."""
    if image.is_empty():
        return
    try:
        snapshot_id = metadata_log.write_snapshot(
            image_records(image),
            image.provenance.offset + 1,
            last_contained_timestamp=metadata_log.last_append_timestamp,
        )
        log.info("%s: wrote snapshot %s", metadata_log.directory, snapshot_id.file_name)
        metadata_log.clean(policy.retention_bytes, policy.retention_ms)
    except (StorageError, OSError) as exc:
        metadata_log.bytes_since_snapshot = 0  # not again at every append: at the next bound
        log.warning("%s: no snapshot of the metadata image: %s", metadata_log.directory, exc)


def _newest(message: Message) -> MetadataRecord:
    return MetadataRecord(message, type(message).VALID_VERSIONS[1])


def image_records(image: MetadataImage) -> Iterator[MetadataRecord]:
    """The records that rebuild ``image`` from an empty one, in Kafka's order."""
    features = sorted(image.features.items(), key=lambda item: item[0] != METADATA_VERSION_FEATURE)
    for name, level in features:
        yield _newest(metadata_records.FeatureLevelRecord(name=name, feature_level=level))
    for broker in image.brokers.values():
        yield _newest(
            metadata_records.RegisterBrokerRecord(
                broker_id=broker.broker_id,
                is_migrating_zk_broker=False,
                incarnation_id=broker.incarnation_id,
                broker_epoch=broker.epoch,
                end_points=[
                    metadata_records.RegisterBrokerRecord.BrokerEndpoint(
                        name=e.listener, host=e.host, port=e.port, security_protocol=e.security_protocol
                    )
                    for e in broker.endpoints.values()
                ],
                features=[
                    metadata_records.RegisterBrokerRecord.BrokerFeature(
                        name=name, min_supported_version=low, max_supported_version=high
                    )
                    for name, (low, high) in broker.supported_features.items()
                ],
                rack=broker.rack,
                fenced=broker.fenced,
                in_controlled_shutdown=broker.in_controlled_shutdown,
                log_dirs=list(broker.log_dirs),
            )
        )
    for controller in image.controllers.values():
        yield _newest(
            metadata_records.RegisterControllerRecord(
                controller_id=controller.controller_id,
                incarnation_id=controller.incarnation_id,
                zk_migration_ready=False,
                end_points=[
                    metadata_records.RegisterControllerRecord.ControllerEndpoint(
                        name=e.listener, host=e.host, port=e.port, security_protocol=e.security_protocol
                    )
                    for e in controller.endpoints.values()
                ],
                features=[],
            )
        )
    for topic in image.topics.by_id.values():
        yield _newest(metadata_records.TopicRecord(name=topic.name, topic_id=topic.topic_id))
        for index, partition in sorted(topic.partitions.items()):
            yield _newest(
                metadata_records.PartitionRecord(
                    partition_id=index,
                    topic_id=topic.topic_id,
                    replicas=list(partition.replicas),
                    isr=list(partition.isr),
                    removing_replicas=list(partition.removing_replicas),
                    adding_replicas=list(partition.adding_replicas),
                    leader=partition.leader,
                    leader_recovery_state=int(partition.leader_recovery_state),
                    leader_epoch=partition.leader_epoch,
                    partition_epoch=partition.partition_epoch,
                    directories=list(partition.directories),
                    eligible_leader_replicas=list(partition.eligible_leader_replicas),
                    last_known_elr=list(partition.last_known_elr),
                )
            )
    for (resource_type, resource_name), values in image.configs.items():
        for key, value in values.items():
            yield _newest(
                metadata_records.ConfigRecord(
                    resource_type=int(resource_type), resource_name=resource_name, name=key, value=value
                )
            )
    for entity, quotas in image.client_quotas.items():
        entity_data = [
            metadata_records.ClientQuotaRecord.EntityData(entity_type=kind, entity_name=name) for kind, name in entity
        ]
        for key, quota in quotas.items():
            yield _newest(metadata_records.ClientQuotaRecord(entity=entity_data, key=key, value=quota, remove=False))
    if image.next_producer_id > 0:
        # As Kafka's ProducerIdsImage: the block's owner is not part of the image.
        yield _newest(
            metadata_records.ProducerIdsRecord(broker_id=-1, broker_epoch=-1, next_producer_id=image.next_producer_id)
        )
    for acl_id, acl in image.acls.items():
        yield _newest(
            metadata_records.AccessControlEntryRecord(
                id=acl_id,
                resource_type=acl.resource_type,
                resource_name=acl.resource_name,
                pattern_type=acl.pattern_type,
                principal=acl.principal,
                host=acl.host,
                operation=acl.operation,
                permission_type=acl.permission_type,
            )
        )
    for (user, mechanism), credential in image.scram_credentials.items():
        yield _newest(
            metadata_records.UserScramCredentialRecord(
                name=user,
                mechanism=int(mechanism),
                salt=credential.salt,
                stored_key=credential.stored_key,
                server_key=credential.server_key,
                iterations=credential.iterations,
            )
        )
    for token in image.delegation_tokens.values():
        yield _newest(token)
