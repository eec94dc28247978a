"""The single node's own controller: validation with Kafka's errors, records committed to the metadata log and
applied to the image, the image published to the broker's components, and all of it back after a reopen."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import trio

from kbroker.durable.files import StorageError
from kbroker.metadata.controller import Listener, LocalController, MetadataCache, record
from kbroker.metadata.image import ConfigResourceType, MetadataDelta, MetadataImage
from kbroker.metadata.log import MetadataLog
from protocol.errors import ErrorCode, KafkaError
from protocol.metadata_records.begin_transaction_record import BeginTransactionRecord
from protocol.metadata_records.topic_record import TopicRecord

NODE = 3
LISTENERS = [Listener("PLAINTEXT", "localhost", 9092, 0)]


def open_controller(data_dir: Path | None) -> LocalController:
    cache = MetadataCache()
    controller = LocalController(NODE, cache, MetadataLog(data_dir) if data_dir is not None else None)
    controller.bootstrap()
    controller.register_broker(NODE, LISTENERS, {"metadata.version": (7, 30)})
    return controller


def close(controller: LocalController) -> None:
    if controller.metadata_log is not None:
        controller.metadata_log.close()


def test_created_topic_is_in_the_image_and_in_the_log_after_a_reopen(tmp_path: Path) -> None:
    controller = open_controller(tmp_path)
    published: list[tuple[MetadataImage, MetadataDelta]] = []
    controller.cache.subscribe(lambda image, delta: published.append((image, delta)))

    topic = trio.run(
        lambda: controller.create_topic(
            "orders", partitions=2, replication_factor=1, configs={"cleanup.policy": "compact"}
        )
    )

    image = controller.image
    assert image.metadata_version == 30
    assert image.brokers[NODE].endpoints["PLAINTEXT"].port == 9092
    assert not image.brokers[NODE].fenced
    assert image.topics.get("orders") == topic
    assert sorted(topic.partitions) == [0, 1]
    for partition in topic.partitions.values():
        assert (partition.replicas, partition.isr, partition.leader, partition.leader_epoch) == (
            (NODE,),
            (NODE,),
            NODE,
            0,
        )
    assert image.config(ConfigResourceType.TOPIC, "orders") == {"cleanup.policy": "compact"}
    # One publication, whose delta makes this node lead both partitions.
    assert len(published) == 1
    assert sorted(published[0][1].local_changes(NODE).leaders) == [("orders", 0), ("orders", 1)]
    close(controller)

    reopened = open_controller(tmp_path)
    assert reopened.image.topics.get("orders") == topic
    assert reopened.image.config(ConfigResourceType.TOPIC, "orders") == {"cleanup.policy": "compact"}
    # Each start is a new epoch of the metadata log, and a new registration.
    assert reopened.metadata_log is not None and reopened.metadata_log.leader_epoch == 2
    assert reopened.image.brokers[NODE].epoch > image.brokers[NODE].epoch
    close(reopened)


def test_growth_config_changes_and_deletion(tmp_path: Path) -> None:
    controller = open_controller(tmp_path)

    async def scenario() -> None:
        topic = await controller.create_topic("t", partitions=1, replication_factor=1, configs={})
        grown = await controller.create_partitions("t", 3)
        assert sorted(grown.partitions) == [0, 1, 2]
        await controller.alter_configs(ConfigResourceType.TOPIC, "t", {"retention.ms": "10", "segment.ms": None})
        assert controller.image.config(ConfigResourceType.TOPIC, "t") == {"retention.ms": "10"}
        await controller.alter_configs(ConfigResourceType.TOPIC, "t", {"retention.ms": None})
        assert controller.image.config(ConfigResourceType.TOPIC, "t") == {}
        deleted = []
        controller.cache.subscribe(lambda image, delta: deleted.extend(sorted(delta.local_changes(NODE).deletes)))
        await controller.delete_topic(topic.topic_id)
        assert controller.image.topics.get("t") is None
        assert deleted == [("t", 0), ("t", 1), ("t", 2)]

    trio.run(scenario)
    close(controller)
    reopened = open_controller(tmp_path)
    assert reopened.image.topics.get("t") is None
    close(reopened)


@pytest.mark.parametrize(
    ("kwargs", "code", "message"),
    [
        ({"name": "a/b"}, ErrorCode.INVALID_TOPIC_EXCEPTION, "contains a character other than"),
        ({"name": "taken"}, ErrorCode.TOPIC_ALREADY_EXISTS, "Topic 'taken' already exists."),
        ({"partitions": 0}, ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0"),
        ({"replication_factor": 0}, ErrorCode.INVALID_REPLICATION_FACTOR, "Replication factor must be larger"),
        (
            {"replication_factor": 2},
            ErrorCode.INVALID_REPLICATION_FACTOR,
            "The target replication factor of 2 cannot be reached because only 1 broker(s) are registered.",
        ),
        (
            {"partitions": -1, "replication_factor": -1, "assignments": [[NODE], [7]]},
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            "includes broker 7, but no broker with that ID is registered.",
        ),
        (
            {"assignments": [[NODE]]},
            ErrorCode.INVALID_REQUEST,
            "Both numPartitions or replicationFactor and replicasAssignments were set.",
        ),
    ],
)
def test_refused_creations_write_nothing(kwargs: dict[str, object], code: ErrorCode, message: str) -> None:
    controller = open_controller(None)
    trio.run(lambda: controller.create_topic("taken", partitions=1, replication_factor=1, configs={}))
    before = controller.image
    arguments: dict[str, object] = {"name": "new", "partitions": 1, "replication_factor": 1, "configs": {}, **kwargs}

    async def create() -> None:
        await controller.create_topic(**arguments)  # type: ignore[arg-type]

    with pytest.raises(KafkaError) as refused:
        trio.run(create)
    assert refused.value.code == code
    assert message in (refused.value.message or "")
    assert controller.image is before


def test_partition_growth_and_deletion_errors() -> None:
    controller = open_controller(None)

    async def scenario() -> None:
        await controller.create_topic("t", partitions=2, replication_factor=1, configs={})
        for total, text in ((2, "Topic already has 2 partitions."), (1, "higher than the requested 1.")):
            with pytest.raises(KafkaError) as refused:
                await controller.create_partitions("t", total)
            assert refused.value.code == ErrorCode.INVALID_PARTITIONS and text in (refused.value.message or "")
        with pytest.raises(KafkaError) as unknown:
            await controller.create_partitions("nope", 3)
        assert unknown.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        with pytest.raises(KafkaError) as unknown_id:
            await controller.delete_topic(uuid.uuid4())
        assert unknown_id.value.code == ErrorCode.UNKNOWN_TOPIC_ID
        with pytest.raises(KafkaError) as unknown_config:
            await controller.alter_configs(ConfigResourceType.TOPIC, "nope", {"retention.ms": "1"})
        assert unknown_config.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        validated = await controller.create_partitions("t", 4, validate_only=True)
        assert sorted(validated.partitions) == [0, 1]

    trio.run(scenario)


def test_producer_id_blocks_are_never_handed_out_twice(tmp_path: Path) -> None:
    controller = open_controller(tmp_path)
    epoch = controller.image.brokers[NODE].epoch
    first = trio.run(lambda: controller.allocate_producer_ids(NODE, epoch))
    with pytest.raises(KafkaError) as stale:
        trio.run(lambda: controller.allocate_producer_ids(NODE, epoch - 1))
    assert stale.value.code == ErrorCode.STALE_BROKER_EPOCH
    close(controller)
    reopened = open_controller(tmp_path)
    second = trio.run(lambda: reopened.allocate_producer_ids(NODE, reopened.image.brokers[NODE].epoch))
    assert (first.start, second.start) == (0, first.stop)
    close(reopened)


def test_migration_keeps_topic_ids_and_an_interrupted_one_is_aborted_and_redone(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    controller = open_controller(tmp_path)
    assert controller.metadata_log is not None
    # A crash in the middle of a migration: its transaction begun, never ended.
    controller.metadata_log.append(
        [
            record(BeginTransactionRecord(name="migration of the topic catalog")),
            record(TopicRecord(name="old", topic_id=topic_id)),
        ]
    )
    close(controller)

    reopened = open_controller(tmp_path)
    assert reopened.image.topics.get("old") is None  # the half transaction was aborted
    assert reopened.migrate_topics([("old", topic_id, 2, {"retention.ms": "5"})]) == 1
    assert reopened.migrate_topics([("old", topic_id, 2, {"retention.ms": "5"})]) == 0  # idempotent
    with pytest.raises(StorageError, match="in the metadata log"):
        reopened.migrate_topics([("old", uuid.uuid4(), 2, {})])
    close(reopened)

    again = open_controller(tmp_path)
    topic = again.image.topics.get("old")
    assert topic is not None and topic.topic_id == topic_id and sorted(topic.partitions) == [0, 1]
    assert again.image.config(ConfigResourceType.TOPIC, "old") == {"retention.ms": "5"}
    close(again)
