"""What the clients of one listener see of the cluster, read from a metadata image (Kafka's KRaftMetadataCache).

Metadata, DescribeCluster, DescribeTopicPartitions, FindCoordinator and the KIP-951 leader hints all answer from
here, so a broker names every broker, leader and endpoint the same way, as the image has them and never as "this
node": a broker is listed with its endpoint on the listener the request came in on (a broker without that listener
is not listed); ``alive`` brokers are the registered, unfenced ones. As Kafka's, a partition's leader is named
whenever it is registered with that listener, fenced or not (the controller moves leadership off a fenced broker
when it can); a replica is offline when its broker is unknown, fenced, without the listener, or its registered log
directory is not among the broker's online ones.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from typing import NamedTuple

from kbroker.metadata.image import BrokerRegistration, MetadataImage, PartitionRegistration
from protocol.errors import ErrorCode

NO_LEADER = -1
# Kafka's DirectoryId: a replica whose directory is not (yet) assigned or is migrating counts as online; LOST not.
_UNASSIGNED_DIRECTORY = uuid.UUID(int=0)
_LOST_DIRECTORY = uuid.UUID(int=1)
_MIGRATING_DIRECTORY = uuid.UUID(int=2)


class Node(NamedTuple):
    """A broker as clients of one listener reach it (Kafka's Node)."""

    node_id: int
    host: str
    port: int
    rack: str | None
    fenced: bool


class PartitionView(NamedTuple):
    """One partition as Metadata answers it."""

    error: ErrorCode
    leader_id: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline_replicas: list[int]


def _node(broker: BrokerRegistration, listener: str) -> Node | None:
    endpoint = broker.endpoints.get(listener)
    if endpoint is None:
        return None
    return Node(broker.broker_id, endpoint.host, endpoint.port, broker.rack, broker.fenced)


def broker_node(image: MetadataImage, broker_id: int, listener: str) -> Node | None:
    """The registered broker's endpoint on ``listener``, fenced or not; None if it is unknown or lacks it."""
    broker = image.brokers.get(broker_id)
    return None if broker is None else _node(broker, listener)


def alive_node(image: MetadataImage, broker_id: int, listener: str) -> Node | None:
    """The broker's endpoint on ``listener`` if it is registered and unfenced (Kafka's getAliveBrokerNode)."""
    broker = image.brokers.get(broker_id)
    return None if broker is None or broker.fenced else _node(broker, listener)


def broker_nodes(image: MetadataImage, listener: str, *, include_fenced: bool = False) -> list[Node]:
    """Every registered broker with an endpoint on ``listener``, by id: the unfenced ones (Kafka's
    getAliveBrokerNodes), or all of them with ``include_fenced`` (getBrokerNodes, DescribeCluster v2)."""
    nodes = []
    for broker_id in sorted(image.brokers):
        broker = image.brokers[broker_id]
        if broker.fenced and not include_fenced:
            continue
        node = _node(broker, listener)
        if node is not None:
            nodes.append(node)
    return nodes


def random_alive_broker(image: MetadataImage) -> int:
    """The controller id a KRaft broker gives clients: any unfenced broker, chosen at random as Kafka does
    (admin requests sent to it are forwarded to the active controller); -1 when none is."""
    alive = [broker_id for broker_id, broker in image.brokers.items() if not broker.fenced]
    return random.choice(alive) if alive else -1


def _replica_offline(broker: BrokerRegistration, partition: PartitionRegistration, listener: str) -> bool:
    if broker.fenced or listener not in broker.endpoints:
        return True
    if not partition.directories or not broker.log_dirs:
        return False  # no directory assignment (an older metadata version): assumed online, as Kafka does
    directory = partition.directories[partition.replicas.index(broker.broker_id)]
    if directory in (_UNASSIGNED_DIRECTORY, _MIGRATING_DIRECTORY):
        return False
    return directory == _LOST_DIRECTORY or directory not in broker.log_dirs


def offline_replicas(image: MetadataImage, partition: PartitionRegistration, listener: str) -> list[int]:
    """The replicas clients of ``listener`` cannot reach (Kafka's getOfflineReplicas)."""
    offline = []
    for broker_id in partition.replicas:
        broker = image.brokers.get(broker_id)
        if broker is None or _replica_offline(broker, partition, listener):
            offline.append(broker_id)
    return offline


def _reachable(image: MetadataImage, broker_ids: Sequence[int], listener: str) -> list[int]:
    return [broker_id for broker_id in broker_ids if alive_node(image, broker_id, listener) is not None]


def partition_view(
    image: MetadataImage,
    partition: PartitionRegistration,
    listener: str,
    *,
    only_reachable: bool = False,
    listener_error: bool = True,
) -> PartitionView:
    """A partition as Metadata answers it on ``listener`` (Kafka's getPartitionMetadata). A leader not registered
    (-1 included) is LEADER_NOT_AVAILABLE; a registered one without the listener LISTENER_NOT_FOUND (Metadata v6+,
    ``listener_error``; LEADER_NOT_AVAILABLE before); either way without a leader id but with the leader epoch.
    ``only_reachable`` (Metadata v0) lists only the replicas and ISR members reachable on the listener, and a
    partition missing some is REPLICA_NOT_AVAILABLE."""
    if only_reachable:
        replicas, isr = _reachable(image, partition.replicas, listener), _reachable(image, partition.isr, listener)
    else:
        replicas, isr = list(partition.replicas), list(partition.isr)
    offline = offline_replicas(image, partition, listener)
    if broker_node(image, partition.leader, listener) is None:
        if partition.leader in image.brokers and listener_error:
            error = ErrorCode.LISTENER_NOT_FOUND
        else:
            error = ErrorCode.LEADER_NOT_AVAILABLE
        return PartitionView(error, NO_LEADER, partition.leader_epoch, replicas, isr, offline)
    if len(replicas) < len(partition.replicas) or len(isr) < len(partition.isr):
        error = ErrorCode.REPLICA_NOT_AVAILABLE
    else:
        error = ErrorCode.NONE
    return PartitionView(error, partition.leader, partition.leader_epoch, replicas, isr, offline)
