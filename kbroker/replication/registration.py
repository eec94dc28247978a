"""Who leads a partition and who is in sync: the one input the replica layer acts on.

A registration is what Kafka's metadata image holds for a partition (its PartitionRegistration): the replicas,
the in-sync replicas, the leader, the leader epoch and the partition epoch. A ``LeadershipSource`` answers it for
each partition, and the ReplicaManager applies the answer (become leader, become follower, stop). Nothing in
kbroker/replication decides leadership itself. The broker's source is its MetadataCache (kbroker/metadata/
controller.py: the newest image's ``PartitionRegistration``, which is a ``Registration``), and each delta's
``LocalChanges`` are applied as they are published. ``SingleNodeLeadership`` (this node leads every partition,
alone in its ISR, in epoch 0) serves a replica layer without an image.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import NamedTuple, Protocol

NO_LEADER = -1


class Registration(Protocol):
    """What the replica layer reads of a partition's registration."""

    @property
    def replicas(self) -> tuple[int, ...]: ...  # every replica's broker id, the preferred leader first
    @property
    def isr(self) -> tuple[int, ...]: ...  # the in-sync replicas, the leader among them
    @property
    def leader(self) -> int: ...  # NO_LEADER when none
    @property
    def leader_epoch(self) -> int: ...
    @property
    def partition_epoch(self) -> int: ...


class LocalChanges(Protocol):
    """What a metadata delta changes for this broker's replicas (the image's LocalChanges)."""

    @property
    def leaders(self) -> Mapping[tuple[str, int], Registration]: ...
    @property
    def followers(self) -> Mapping[tuple[str, int], Registration]: ...
    @property
    def deletes(self) -> Set[tuple[str, int]]: ...


class LeadershipSource(Protocol):
    def partition(self, topic: str, index: int, /) -> Registration | None:
        """The partition's registration; None when this source does not know the partition."""
        ...


class StaticRegistration(NamedTuple):
    """A registration given directly rather than read from a metadata image."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int


class SingleNodeLeadership:
    """A cluster of one: ``node_id`` leads every partition, its only replica and whole ISR, in epoch 0."""

    def __init__(self, node_id: int) -> None:
        self._registration = StaticRegistration((node_id,), (node_id,), node_id, 0, 0)  # shared: immutable

    def partition(self, topic: str, index: int, /) -> Registration | None:
        return self._registration
