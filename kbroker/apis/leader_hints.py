"""KIP-951: a NOT_LEADER_OR_FOLLOWER answer names the partition's current leader, so a client can go there at once.

Produce (v10+, NOT_LEADER_OR_FOLLOWER) and Fetch (v16+, NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH) answers
carry the leader's id and epoch per partition, and the response lists the endpoints of those leaders on the
request's listener, as Kafka's KafkaApis.getCurrentLeader: the leader this broker's replica knows, else the
metadata image's; the endpoint only for a registered, unfenced leader with that listener.
"""

from __future__ import annotations

from typing import NamedTuple

from kbroker.apis.context import RequestContext
from kbroker.metadata.image import BrokerEndpoint
from protocol.errors import KafkaError

NO_LEADER = (-1, -1)


class LeaderHint(NamedTuple):
    leader_id: int
    leader_epoch: int
    endpoint: BrokerEndpoint | None  # on the request's listener; None when the leader cannot be reached
    rack: str | None


def current_leader(ctx: RequestContext, topic: str, index: int) -> LeaderHint:
    leader_id, leader_epoch = NO_LEADER
    try:
        partition = ctx.replicas.partition(topic, index)
    except KafkaError:  # its files cannot be opened: the image still knows its leader
        partition = None
    if partition is not None:
        leader_id, leader_epoch = partition.leader_id, partition.registered_leader_epoch
    else:
        registration = ctx.topics.registration(topic, index)
        if registration is not None:
            leader_id, leader_epoch = registration.leader, registration.leader_epoch
    broker = ctx.topics.image.brokers.get(leader_id)
    if broker is None or broker.fenced:
        return LeaderHint(leader_id, leader_epoch, None, None)
    return LeaderHint(leader_id, leader_epoch, broker.endpoints.get(ctx.listener), broker.rack)
