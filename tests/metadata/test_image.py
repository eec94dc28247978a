"""The metadata image: Kafka's metadata records applied one by one, the image after each delta, and what a delta
changes for one broker's replicas; then the metadata log a real Kafka 4.3.1 wrote, replayed into an image."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kbroker.metadata.image import (
    AclEntry,
    ConfigResourceType,
    ImageError,
    LeaderRecoveryState,
    MetadataDelta,
    MetadataImage,
    MetadataImageBuilder,
    PartitionRegistration,
    ScramCredential,
    ScramMechanism,
)
from protocol._codec import Message
from protocol.metadata_frame import iter_metadata_batches
from protocol.metadata_records.abort_transaction_record import AbortTransactionRecord
from protocol.metadata_records.access_control_entry_record import AccessControlEntryRecord
from protocol.metadata_records.begin_transaction_record import BeginTransactionRecord
from protocol.metadata_records.broker_registration_change_record import BrokerRegistrationChangeRecord
from protocol.metadata_records.clear_elr_record import ClearElrRecord
from protocol.metadata_records.client_quota_record import ClientQuotaRecord, EntityData
from protocol.metadata_records.config_record import ConfigRecord
from protocol.metadata_records.end_transaction_record import EndTransactionRecord
from protocol.metadata_records.feature_level_record import FeatureLevelRecord
from protocol.metadata_records.fence_broker_record import FenceBrokerRecord
from protocol.metadata_records.no_op_record import NoOpRecord
from protocol.metadata_records.partition_change_record import PartitionChangeRecord
from protocol.metadata_records.partition_record import PartitionRecord
from protocol.metadata_records.producer_ids_record import ProducerIdsRecord
from protocol.metadata_records.register_broker_record import BrokerEndpoint, RegisterBrokerRecord
from protocol.metadata_records.register_controller_record import ControllerEndpoint, RegisterControllerRecord
from protocol.metadata_records.remove_access_control_entry_record import RemoveAccessControlEntryRecord
from protocol.metadata_records.remove_topic_record import RemoveTopicRecord
from protocol.metadata_records.remove_user_scram_credential_record import RemoveUserScramCredentialRecord
from protocol.metadata_records.topic_record import TopicRecord
from protocol.metadata_records.unfence_broker_record import UnfenceBrokerRecord
from protocol.metadata_records.unregister_broker_record import UnregisterBrokerRecord
from protocol.metadata_records.unregister_controller_record import UnregisterControllerRecord
from protocol.metadata_records.user_scram_credential_record import UserScramCredentialRecord

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "kraft-4.3.1" / "cluster_metadata"
ORDERS = uuid.UUID("6f1d1c3e-2b6a-4b8e-9d6f-0c1b2a3d4e5f")
CLICKS = uuid.UUID("11111111-2222-3333-4444-555555555555")


def apply(image: MetadataImage, *records: Message) -> MetadataImage:
    delta = MetadataDelta(image)
    for offset, record in enumerate(records, start=image.provenance.offset + 1):
        delta.replay(record, offset, 1)
    return delta.apply()


def partition(topic_id: uuid.UUID, index: int, replicas: list[int], leader: int) -> PartitionRecord:
    return PartitionRecord(
        partition_id=index,
        topic_id=topic_id,
        replicas=replicas,
        isr=list(replicas),
        removing_replicas=[],
        adding_replicas=[],
        leader=leader,
        leader_epoch=0,
        partition_epoch=0,
    )


def orders_topic() -> MetadataImage:
    return apply(
        MetadataImage(),
        TopicRecord(name="orders", topic_id=ORDERS),
        partition(ORDERS, 0, [1, 2, 3], 1),
        partition(ORDERS, 1, [2, 3, 1], 2),
        ConfigRecord(
            resource_type=ConfigResourceType.TOPIC, resource_name="orders", name="retention.ms", value="60000"
        ),
    )


def test_a_topic_and_its_partitions_as_registered() -> None:
    image = orders_topic()
    topic = image.topics.get("orders")
    assert topic is not None and topic.topic_id == ORDERS and image.topics.by_id[ORDERS] is topic
    assert dict(topic.partitions) == {
        0: PartitionRegistration(replicas=(1, 2, 3), isr=(1, 2, 3), leader=1, leader_epoch=0, partition_epoch=0),
        1: PartitionRegistration(replicas=(2, 3, 1), isr=(2, 3, 1), leader=2, leader_epoch=0, partition_epoch=0),
    }
    assert dict(image.config(ConfigResourceType.TOPIC, "orders")) == {"retention.ms": "60000"}
    assert image.provenance.offset == 3 and image.provenance.epoch == 1


def test_a_new_leader_bumps_the_leader_epoch_and_every_change_the_partition_epoch() -> None:
    before = orders_topic()
    shrunk = apply(before, PartitionChangeRecord(partition_id=0, topic_id=ORDERS, isr=[1, 2]))
    assert shrunk.topics.partition("orders", 0) == PartitionRegistration(
        replicas=(1, 2, 3), isr=(1, 2), leader=1, leader_epoch=0, partition_epoch=1
    )
    moved = apply(shrunk, PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=2, isr=[2]))
    assert moved.topics.partition("orders", 0) == PartitionRegistration(
        replicas=(1, 2, 3), isr=(2,), leader=2, leader_epoch=1, partition_epoch=2
    )
    offline = apply(moved, PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=-1, leader_recovery_state=1))
    registration = offline.topics.partition("orders", 0)
    assert registration is not None and not registration.has_leader()
    assert (registration.leader_epoch, registration.partition_epoch) == (2, 3)
    assert registration.leader_recovery_state is LeaderRecoveryState.RECOVERING
    # Images are values: the earlier ones did not change, and the other partition is the same object.
    assert before.topics.partition("orders", 0) == PartitionRegistration(
        replicas=(1, 2, 3), isr=(1, 2, 3), leader=1, leader_epoch=0, partition_epoch=0
    )
    assert offline.topics.partition("orders", 1) is before.topics.partition("orders", 1)


def test_removing_a_topic_removes_its_partitions_and_configs_and_a_name_can_come_back() -> None:
    image = apply(orders_topic(), RemoveTopicRecord(topic_id=ORDERS))
    assert image.topics.get("orders") is None and ORDERS not in image.topics.by_id
    assert dict(image.config(ConfigResourceType.TOPIC, "orders")) == {}
    again = apply(image, TopicRecord(name="orders", topic_id=CLICKS), partition(CLICKS, 0, [1], 1))
    topic = again.topics.get("orders")
    assert topic is not None and topic.topic_id == CLICKS and list(topic.partitions) == [0]


def test_records_that_do_not_fit_the_image_are_refused() -> None:
    image = orders_topic()
    with pytest.raises(ImageError, match="topic id"):
        apply(image, partition(CLICKS, 0, [1], 1))
    with pytest.raises(ImageError, match="orders-7"):
        apply(image, PartitionChangeRecord(partition_id=7, topic_id=ORDERS, isr=[1]))
    with pytest.raises(ImageError, match="exists"):
        apply(image, TopicRecord(name="again", topic_id=ORDERS))
    with pytest.raises(ImageError, match="does not exist"):
        apply(image, RemoveTopicRecord(topic_id=CLICKS))
    with pytest.raises(ImageError, match="back"):
        apply(
            apply(image, ProducerIdsRecord(broker_id=1, broker_epoch=5, next_producer_id=2000)),
            ProducerIdsRecord(broker_id=1, broker_epoch=5, next_producer_id=1000),
        )


def test_every_kafka_metadata_record_type_is_replayed_and_each_handler_names_one() -> None:
    """The image dispatches by class name (the record modules load when a record is decoded, not at start-up), so a
    misspelt or missing name would only show when that record arrives."""
    from kbroker.metadata.image import _REPLAY
    from protocol.metadata_records import RECORD_TYPE_BY_NAME

    assert set(_REPLAY) == set(RECORD_TYPE_BY_NAME)
    with pytest.raises(ImageError, match="no image applies Message"):
        MetadataDelta(MetadataImage()).replay(Message())


def register(broker_id: int, epoch: int, port: int) -> RegisterBrokerRecord:
    return RegisterBrokerRecord(
        broker_id=broker_id,
        incarnation_id=uuid.UUID(int=broker_id),
        broker_epoch=epoch,
        end_points=[BrokerEndpoint(name="PLAINTEXT", host="127.0.0.1", port=port, security_protocol=0)],
        features=[],
        rack=None,
        fenced=True,
        log_dirs=[],
    )


def test_brokers_register_unfence_fence_shut_down_and_leave() -> None:
    image = apply(MetadataImage(), register(1, 10, 9092), register(2, 11, 9093))
    assert image.brokers[1].fenced and image.brokers[1].endpoints["PLAINTEXT"].port == 9092
    image = apply(
        image,
        UnfenceBrokerRecord(id=1, epoch=10),
        BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=11, fenced=-1),
    )
    assert (image.brokers[1].fenced, image.brokers[2].fenced) == (False, False)
    image = apply(
        image,
        FenceBrokerRecord(id=1, epoch=10),
        BrokerRegistrationChangeRecord(broker_id=2, broker_epoch=11, fenced=0, in_controlled_shutdown=1),
    )
    assert (image.brokers[1].fenced, image.brokers[2].fenced, image.brokers[2].in_controlled_shutdown) == (
        True,
        False,
        True,
    )
    with pytest.raises(ImageError, match="broker 1 epoch 9"):
        apply(image, UnfenceBrokerRecord(id=1, epoch=9))  # a stale registration's epoch
    image = apply(image, UnregisterBrokerRecord(broker_id=1, broker_epoch=10))
    assert list(image.brokers) == [2]
    # A broker registering again replaces its old registration.
    image = apply(image, register(2, 20, 9094))
    assert (image.brokers[2].epoch, image.brokers[2].endpoints["PLAINTEXT"].port, image.brokers[2].fenced) == (
        20,
        9094,
        True,
    )


def test_controllers_register_and_leave() -> None:
    endpoint = ControllerEndpoint(name="CONTROLLER", host="127.0.0.1", port=9093, security_protocol=0)
    image = apply(
        MetadataImage(),
        RegisterControllerRecord(
            controller_id=3000, incarnation_id=uuid.UUID(int=3), end_points=[endpoint], features=[]
        ),
        RegisterControllerRecord(
            controller_id=3001, incarnation_id=uuid.UUID(int=4), end_points=[endpoint], features=[]
        ),
    )
    assert image.controllers[3000].endpoints["CONTROLLER"].port == 9093 and list(image.controllers) == [3000, 3001]
    image = apply(image, UnregisterControllerRecord(controller_id=3000))  # new in Kafka 4.4
    assert list(image.controllers) == [3001]
    with pytest.raises(ImageError, match="controller 3000"):
        apply(image, UnregisterControllerRecord(controller_id=3000))


def test_features_configs_acls_scram_and_quotas() -> None:
    acl_id = uuid.UUID(int=7)
    image = apply(
        MetadataImage(),
        FeatureLevelRecord(name="metadata.version", feature_level=27),
        FeatureLevelRecord(name="transaction.version", feature_level=2),
        ConfigRecord(resource_type=ConfigResourceType.BROKER, resource_name="", name="log.retention.ms", value="1000"),
        ConfigRecord(resource_type=ConfigResourceType.BROKER, resource_name="1", name="log.retention.ms", value="2000"),
        ConfigRecord(
            resource_type=ConfigResourceType.GROUP, resource_name="g", name="consumer.session.timeout.ms", value="45000"
        ),
        AccessControlEntryRecord(
            id=acl_id,
            resource_type=2,
            resource_name="orders",
            pattern_type=3,
            principal="User:alice",
            host="*",
            operation=3,
            permission_type=3,
        ),
        UserScramCredentialRecord(
            name="alice", mechanism=1, salt=b"s", stored_key=b"k", server_key=b"v", iterations=4096
        ),
        ClientQuotaRecord(
            entity=[EntityData(entity_type="user", entity_name="alice")], key="producer_byte_rate", value=1024.0
        ),
        ClientQuotaRecord(
            entity=[
                EntityData(entity_type="user", entity_name=None),
                EntityData(entity_type="client-id", entity_name="app"),
            ],
            key="consumer_byte_rate",
            value=2048.0,
        ),
        ProducerIdsRecord(broker_id=1, broker_epoch=5, next_producer_id=1000),
    )
    assert image.metadata_version == 27 and dict(image.features) == {"metadata.version": 27, "transaction.version": 2}
    assert dict(image.config(ConfigResourceType.BROKER, "")) == {"log.retention.ms": "1000"}
    assert dict(image.config(ConfigResourceType.BROKER, "1")) == {"log.retention.ms": "2000"}
    assert dict(image.config(ConfigResourceType.GROUP, "g")) == {"consumer.session.timeout.ms": "45000"}
    assert dict(image.acls) == {acl_id: AclEntry(2, "orders", 3, "User:alice", "*", 3, 3)}
    assert dict(image.scram_credentials) == {
        ("alice", ScramMechanism.SCRAM_SHA_256): ScramCredential(b"s", b"k", b"v", 4096)
    }
    assert {entity: dict(values) for entity, values in image.client_quotas.items()} == {
        (("user", "alice"),): {"producer_byte_rate": 1024.0},
        (("client-id", "app"), ("user", None)): {"consumer_byte_rate": 2048.0},
    }
    assert image.next_producer_id == 1000

    image = apply(
        image,
        FeatureLevelRecord(name="transaction.version", feature_level=0),  # level 0: the feature is gone
        ConfigRecord(resource_type=ConfigResourceType.BROKER, resource_name="1", name="log.retention.ms", value=None),
        RemoveAccessControlEntryRecord(id=acl_id),
        RemoveUserScramCredentialRecord(name="alice", mechanism=1),
        ClientQuotaRecord(
            entity=[EntityData(entity_type="user", entity_name="alice")], key="producer_byte_rate", remove=True
        ),
    )
    assert dict(image.features) == {"metadata.version": 27}
    assert (
        dict(image.config(ConfigResourceType.BROKER, "1")) == {}
        and (ConfigResourceType.BROKER, "1") not in image.configs
    )
    assert dict(image.acls) == {} and dict(image.scram_credentials) == {}
    assert list(image.client_quotas) == [(("client-id", "app"), ("user", None))]
    with pytest.raises(ImageError, match="ACL"):
        apply(image, RemoveAccessControlEntryRecord(id=acl_id))


def test_clear_elr_clears_one_topic_or_all() -> None:
    image = apply(
        orders_topic(),
        PartitionChangeRecord(partition_id=0, topic_id=ORDERS, eligible_leader_replicas=[2], last_known_elr=[3]),
        PartitionChangeRecord(partition_id=1, topic_id=ORDERS, eligible_leader_replicas=[3]),
    )
    cleared = apply(image, ClearElrRecord(topic_name="orders"))
    for index in (0, 1):
        registration = cleared.topics.partition("orders", index)
        assert registration is not None
        assert (registration.eligible_leader_replicas, registration.last_known_elr) == ((), ())
    assert apply(image, ClearElrRecord(topic_name="elsewhere")).topics.partition("orders", 0) == image.topics.partition(
        "orders", 0
    )


def test_local_changes_name_what_this_broker_now_leads_follows_and_no_longer_holds() -> None:
    image = orders_topic()
    delta = MetadataDelta(image)
    delta.replay(PartitionChangeRecord(partition_id=0, topic_id=ORDERS, leader=2))
    delta.replay(PartitionChangeRecord(partition_id=1, topic_id=ORDERS, replicas=[2, 3], isr=[2, 3]))
    delta.replay(TopicRecord(name="clicks", topic_id=CLICKS))
    delta.replay(partition(CLICKS, 0, [1, 2], 1))
    for_one = delta.local_changes(1)
    assert set(for_one.leaders) == {("clicks", 0)}
    assert set(for_one.followers) == {("orders", 0)}
    assert for_one.deletes == {("orders", 1)}
    for_two = delta.local_changes(2)
    assert set(for_two.leaders) == {("orders", 0), ("orders", 1)} and set(for_two.followers) == {("clicks", 0)}
    gone = MetadataDelta(delta.apply())
    gone.replay(RemoveTopicRecord(topic_id=CLICKS))
    assert gone.local_changes(2).deletes == {("clicks", 0)} and gone.local_changes(3).deletes == set()


def test_a_metadata_transaction_is_published_whole_or_not_at_all() -> None:
    builder = MetadataImageBuilder()
    builder.replay(FeatureLevelRecord(name="metadata.version", feature_level=27), 0, 1)
    published = builder.publish()
    assert published is not None and published[0].metadata_version == 27
    assert builder.publish() is None  # nothing new

    builder.replay(BeginTransactionRecord(name="create orders"), 1, 1)
    builder.replay(TopicRecord(name="orders", topic_id=ORDERS), 2, 1)
    assert builder.publish() is None and builder.image.topics.get("orders") is None  # half a transaction
    builder.replay(partition(ORDERS, 0, [1], 1), 3, 1)
    builder.replay(EndTransactionRecord(), 4, 1)
    published = builder.publish()
    assert published is not None
    image, delta = published
    assert image.topics.partition("orders", 0) is not None and image.provenance.offset == 4
    assert set(delta.local_changes(1).leaders) == {("orders", 0)}

    builder.replay(BeginTransactionRecord(name="drop"), 5, 1)
    builder.replay(RemoveTopicRecord(topic_id=ORDERS), 6, 1)
    builder.replay(AbortTransactionRecord(reason="changed my mind"), 7, 1)
    published = builder.publish()  # the aborted records are dropped; the image only moves past them
    assert published is not None and published[0].provenance.offset == 7
    assert published[0].topics.get("orders") is not None and published[1].local_changes(1).deletes == set()
    builder.replay(NoOpRecord(), 8, 1)  # moves the offset only
    published = builder.publish()
    assert published is not None and published[0].provenance.offset == 8 and published[0].topics.get("orders")
    with pytest.raises(ImageError, match="outside"):
        builder.replay(EndTransactionRecord(), 9, 1)


def test_kafka_4_3_metadata_log_replays_into_an_image() -> None:
    """The metadata log and snapshot Apache Kafka 4.3.1 wrote (tests/fixtures/kraft-4.3.1): every record applies,
    and the image from the log alone is the image from the snapshot at the same offset."""
    builder = MetadataImageBuilder()
    for batch in iter_metadata_batches((FIXTURE / "00000000000000000000.log").read_bytes()):
        for offset, record in enumerate(batch.records, start=batch.base_offset):
            builder.replay(record.message, offset, batch.leader_epoch)
        builder.publish()
    from_log = builder.image
    assert from_log.metadata_version > 0 and list(from_log.brokers) == [1] and list(from_log.controllers) == [1]
    # What the fixture's Kafka was asked to do (its .dump beside it lists the records).
    assert set(from_log.topics.by_name) == {"records-topic", "__consumer_offsets", "__transaction_state"}
    assert dict(from_log.config(ConfigResourceType.TOPIC, "records-topic")) == {
        "retention.ms": "3600000",
        "cleanup.policy": "compact",
    }
    assert from_log.config(ConfigResourceType.BROKER, "1")["log.cleaner.threads"] == "2"
    assert from_log.config(ConfigResourceType.BROKER, "")["min.insync.replicas"] == "1"
    assert [(acl.principal, acl.resource_name) for acl in from_log.acls.values()] == [("User:alice", "records-topic")]
    assert list(from_log.scram_credentials) == [("alice", ScramMechanism.SCRAM_SHA_256)]
    assert {entity: dict(values) for entity, values in from_log.client_quotas.items()} == {
        (("user", "alice"),): {"producer_byte_rate": 1024.0}
    }
    for topic in from_log.topics.by_name.values():
        for registration in topic.partitions.values():
            # The broker shut down last: its partitions lost their leader and kept it as an eligible one (ELR).
            assert set(registration.isr) <= set(registration.replicas) == {1}
            assert registration.leader in (-1, 1) and registration.leader_epoch >= 0

    snapshot = MetadataImageBuilder()
    snapshot_file = next(FIXTURE.glob("*.checkpoint"))
    for batch in iter_metadata_batches(snapshot_file.read_bytes()):
        for record in batch.records:
            snapshot.replay(record.message)
        snapshot.publish()
    snapshot_end = int(snapshot_file.name.split("-")[0])
    replayed_to_snapshot = MetadataImageBuilder()
    for batch in iter_metadata_batches((FIXTURE / "00000000000000000000.log").read_bytes()):
        for offset, record in enumerate(batch.records, start=batch.base_offset):
            if offset < snapshot_end:
                replayed_to_snapshot.replay(record.message)
        replayed_to_snapshot.publish()
    mine, kafkas = replayed_to_snapshot.image, snapshot.image
    assert dict(mine.topics.by_name) == dict(kafkas.topics.by_name)
    assert dict(mine.brokers) == dict(kafkas.brokers)
    assert dict(mine.features) == dict(kafkas.features)
    assert mine.configs == kafkas.configs and mine.acls == kafkas.acls
    assert mine.scram_credentials == kafkas.scram_credentials and mine.client_quotas == kafkas.client_quotas
    assert mine.next_producer_id == kafkas.next_producer_id
