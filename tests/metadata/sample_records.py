"""One of each kind of metadata record a single node's image is made of, with recognisable values: what the
metadata log tests write, replay and have Kafka's dump tool read back."""

from __future__ import annotations

import uuid

from protocol.metadata_frame import MetadataRecord
from protocol.metadata_records.access_control_entry_record import AccessControlEntryRecord
from protocol.metadata_records.client_quota_record import ClientQuotaRecord
from protocol.metadata_records.config_record import ConfigRecord
from protocol.metadata_records.feature_level_record import FeatureLevelRecord
from protocol.metadata_records.partition_record import PartitionRecord
from protocol.metadata_records.producer_ids_record import ProducerIdsRecord
from protocol.metadata_records.register_broker_record import RegisterBrokerRecord
from protocol.metadata_records.remove_topic_record import RemoveTopicRecord
from protocol.metadata_records.topic_record import TopicRecord
from protocol.metadata_records.user_scram_credential_record import UserScramCredentialRecord

TOPIC_ID = uuid.UUID("3f1c2b4a-5d6e-4f70-8192-a3b4c5d6e7f8")
DOOMED_ID = uuid.UUID("0a0b0c0d-0e0f-4011-8213-141516171819")
INCARNATION = uuid.UUID("11111111-2222-4333-8444-555555555555")
DIRECTORY = uuid.UUID("99999999-8888-4777-8666-555555555555")
TOPIC = 2  # ConfigResource types: TOPIC, BROKER
BROKER = 4


def sample_records() -> list[MetadataRecord]:
    return [
        MetadataRecord(FeatureLevelRecord(name="metadata.version", feature_level=27), 0),
        MetadataRecord(
            RegisterBrokerRecord(
                broker_id=1,
                incarnation_id=INCARNATION,
                broker_epoch=7,
                end_points=[
                    RegisterBrokerRecord.BrokerEndpoint(
                        name="PLAINTEXT", host="localhost", port=9092, security_protocol=0
                    )
                ],
                features=[
                    RegisterBrokerRecord.BrokerFeature(
                        name="metadata.version", min_supported_version=7, max_supported_version=27
                    )
                ],
                rack=None,
                fenced=False,
                log_dirs=[DIRECTORY],
            ),
            3,
        ),
        MetadataRecord(TopicRecord(name="orders", topic_id=TOPIC_ID), 0),
        MetadataRecord(
            PartitionRecord(
                partition_id=0,
                topic_id=TOPIC_ID,
                replicas=[1],
                isr=[1],
                leader=1,
                leader_epoch=0,
                partition_epoch=0,
                directories=[DIRECTORY],
            ),
            1,
        ),
        MetadataRecord(
            ConfigRecord(resource_type=TOPIC, resource_name="orders", name="retention.ms", value="3600000"), 0
        ),
        MetadataRecord(ConfigRecord(resource_type=BROKER, resource_name="", name="log.cleaner.threads", value="2"), 0),
        MetadataRecord(
            AccessControlEntryRecord(
                id=uuid.UUID("aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"),
                resource_type=2,  # TOPIC
                resource_name="orders",
                pattern_type=3,  # LITERAL
                principal="User:alice",
                host="*",
                operation=3,  # READ
                permission_type=3,  # ALLOW
            ),
            0,
        ),
        MetadataRecord(
            UserScramCredentialRecord(
                name="alice",
                mechanism=1,  # SCRAM-SHA-256
                salt=b"salt-of-alice",
                stored_key=bytes(range(32)),
                server_key=bytes(range(32, 64)),
                iterations=8192,
            ),
            0,
        ),
        MetadataRecord(
            ClientQuotaRecord(
                entity=[ClientQuotaRecord.EntityData(entity_type="user", entity_name="alice")],
                key="producer_byte_rate",
                value=1024.0,
                remove=False,
            ),
            0,
        ),
        MetadataRecord(ProducerIdsRecord(broker_id=1, broker_epoch=7, next_producer_id=1000), 0),
        MetadataRecord(TopicRecord(name="doomed", topic_id=DOOMED_ID), 0),
        MetadataRecord(RemoveTopicRecord(topic_id=DOOMED_ID), 0),
    ]
