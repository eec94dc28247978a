"""KIP-951: a NOT_LEADER_OR_FOLLOWER answer names the partition's current leader, so a client can go there at once.

Produce (v10+, NOT_LEADER_OR_FOLLOWER) and Fetch (v16+, NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH) answers
carry the leader's id and epoch per partition, and the response lists the endpoints of those leaders on the
request's listener, as Kafka's KafkaApis.getCurrentLeader: the leader this broker's replica knows, else the
metadata image's; the endpoint only for a registered, unfenced leader with that listener. A partition the image has
but this broker holds no replica of is NOT_LEADER_OR_FOLLOWER too (``no_replica_error``), named the same way.
"""

from __future__ import annotations

from typing import NamedTuple

from kbroker.apis.context import RequestContext
from kbroker.metadata.listener_view import Node, alive_node
from protocol.errors import ErrorCode, KafkaError

NO_LEADER = (-1, -1)


class LeaderHint(NamedTuple):
    leader_id: int
    leader_epoch: int
    endpoint: Node | None  # on the request's listener; None when the leader cannot be reached
    rack: str | None


def current_leader(ctx: RequestContext, topic: str, index: int) -> LeaderHint:
    leader_id, leader_epoch = NO_LEADER
    try:
        partition = ctx.replicas.partition(topic, index)
    except KafkaError:  # its files cannot be opened: the image still knows its leader
        partition = None
    if partition is not None and partition.registered_leader_epoch >= 0:
        leader_id, leader_epoch = partition.leader_id, partition.registered_leader_epoch
    else:  # no replica here (another broker's partition), or one no registration reached
        registration = ctx.topics.registration(topic, index)
        if registration is not None:
            leader_id, leader_epoch = registration.leader, registration.leader_epoch
    node = alive_node(ctx.topics.image, leader_id, ctx.listener)
    if node is None:
        return LeaderHint(leader_id, leader_epoch, None, None)
    return LeaderHint(leader_id, leader_epoch, node, node.rack)


def no_replica_error(ctx: RequestContext, topic: str, index: int) -> ErrorCode:
    """The answer for a partition this broker holds no replica of, as Kafka's ReplicaManager.getPartitionOrError:
    NOT_LEADER_OR_FOLLOWER if the image has it (the client looks for its leader, named from Produce v10 and Fetch
    v16), else UNKNOWN_TOPIC_OR_PARTITION."""
    if ctx.topics.registration(topic, index) is not None:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
