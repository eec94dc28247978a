"""Who leads a partition and who is in sync: the one input the replica layer acts on.

A ``PartitionRegistration`` is what Kafka's metadata image holds for a partition (its PartitionRegistration):
the replicas, the in-sync replicas, the leader, the leader epoch and the partition epoch. A ``LeadershipSource``
answers it for each partition, and the ReplicaManager applies the answer (become leader, become follower,
stop). Nothing in kbroker/replication decides leadership itself: today's source is ``SingleNodeLeadership``
(this node leads every partition, alone in its ISR, in epoch 0); the metadata image becomes the source later
without the layer changing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class PartitionRegistration:
    replicas: tuple[int, ...]  # every replica's broker id, the preferred leader first
    isr: tuple[int, ...]  # the in-sync replicas (the leader among them)
    leader: int  # NO_LEADER when none
    leader_epoch: int
    partition_epoch: int


class LeadershipSource(Protocol):
    def registration(self, topic: str, partition: int) -> PartitionRegistration | None:
        """The partition's registration; None when this source does not know the partition."""
        ...


class SingleNodeLeadership:
    """A cluster of one: ``node_id`` leads every partition, its only replica and whole ISR, in epoch 0."""

    def __init__(self, node_id: int) -> None:
        self._registration = PartitionRegistration((node_id,), (node_id,), node_id, 0, 0)  # shared: immutable

    def registration(self, topic: str, partition: int) -> PartitionRegistration | None:
        return self._registration
