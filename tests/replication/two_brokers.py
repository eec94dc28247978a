"""A second broker in a single broker's metadata image, as a KRaft controller would register it: what the replica
layer's tests use to give a partition a follower without running a cluster.

``register_broker`` goes through the broker's controller (a RegisterBrokerRecord, unfenced; ``register_other``
publishes those records itself), ``create_replicated`` creates a topic whose partitions name their replicas
(TopicRecord, PartitionRecord with ISR = replicas, leader the first), and ``publish`` applies records to the image
at once, in the calling task, as a broker applies what its controller quorum committed (a leader change, an ISR
change made elsewhere; ``move_leader`` moves a partition's leadership between the two brokers).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from kbroker.broker import Broker
from kbroker.metadata.controller import METADATA_VERSION_LEVEL, Listener
from kbroker.metadata.image import MetadataDelta, MetadataImage, PartitionRegistration, TopicImage
from protocol._codec import Message
from protocol.metadata_records.partition_change_record import PartitionChangeRecord
from protocol.metadata_records.register_broker_record import BrokerEndpoint, RegisterBrokerRecord
from protocol.metadata_records.unfence_broker_record import UnfenceBrokerRecord
from tests.replication.conftest import NODE

OTHER = 1
OTHER_HOST = "other.example"
OTHER_PORT = 19093


def register_broker(broker: Broker, broker_id: int = OTHER, host: str = OTHER_HOST, port: int = OTHER_PORT) -> int:
    """Register broker ``broker_id`` (unfenced) with a PLAINTEXT listener; its broker epoch."""
    features = {"metadata.version": (7, METADATA_VERSION_LEVEL)}
    return broker.controller.register_broker(broker_id, [Listener("PLAINTEXT", host, port, 0)], features)


async def create_replicated(
    broker: Broker, name: str, replicas: Sequence[Sequence[int]], configs: dict[str, str] | None = None
) -> TopicImage:
    """Create topic ``name`` through the controller, partition i on the brokers ``replicas[i]`` (leader first)."""
    return await broker.controller.create_topic(
        name, partitions=-1, replication_factor=-1, configs=configs or {}, assignments=replicas
    )


def publish(broker: Broker, *records: Message) -> MetadataImage:
    """Apply ``records`` to the broker's image and publish the result at once."""
    delta = MetadataDelta(broker.metadata.image)
    for record in records:
        delta.replay(record)
    image = delta.apply()
    broker.metadata.publish(image, delta)
    return image


def change_partition(
    broker: Broker, topic: str, index: int, *, leader: int | None = None, isr: Sequence[int] | None = None
) -> PartitionRegistration:
    """A PartitionChangeRecord for ``topic``-``index`` (a new leader bumps the leader epoch); the new registration."""
    topic_id = broker.metadata.image.topics.by_name[topic].topic_id
    change = PartitionChangeRecord(
        partition_id=index,
        topic_id=topic_id,
        leader=-2 if leader is None else leader,
        isr=None if isr is None else list(isr),
    )
    registration = publish(broker, change).topics.partition(topic, index)
    assert registration is not None
    return registration


def registration(broker: Broker, topic: str, index: int = 0) -> PartitionRegistration:
    found = broker.metadata.image.topics.partition(topic, index)
    assert found is not None
    return found


def register_other(broker: Broker) -> None:
    """Broker ``OTHER`` registered and unfenced by the records a controller commits (not through ``broker``'s
    controller)."""
    endpoint = BrokerEndpoint(name="PLAINTEXT", host=OTHER_HOST, port=OTHER_PORT, security_protocol=0)
    register = RegisterBrokerRecord(
        broker_id=OTHER,
        incarnation_id=uuid.UUID(int=OTHER + 1),
        broker_epoch=5,
        end_points=[endpoint],
        features=[],
        rack=None,
        fenced=True,
        log_dirs=[],
    )
    publish(broker, register, UnfenceBrokerRecord(id=OTHER, epoch=5))


def move_leader(broker: Broker, topic: str, index: int, leader: int) -> int:
    """Make ``leader`` the partition's leader (both brokers replicas, both in sync); the image's new epoch."""
    topic_id = broker.metadata.image.topics.by_name[topic].topic_id
    change = PartitionChangeRecord(
        partition_id=index, topic_id=topic_id, leader=leader, replicas=[NODE, OTHER], isr=[NODE, OTHER]
    )
    moved = publish(broker, change).topics.partition(topic, index)
    assert moved is not None and moved.leader == leader
    return moved.leader_epoch
