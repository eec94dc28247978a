"""Server-side partition assignors of the consumer group protocol (KIP-848): ``uniform`` and ``range``.

An assignor maps each member to the partitions it should own (the *target* assignment). It only
decides; handing partitions over safely (revoke before assign) is the reconciliation in
consumer_group.py. Both assignors are deterministic: members are ordered by member id and topics by
name, so the same input always gives the same assignment.

- ``uniform`` (Kafka's default): spreads every subscribed partition so member counts differ by at most
  one where subscriptions allow, and is sticky: a member keeps the partitions of its previous target
  assignment unless balance requires moving them.
- ``range``: per topic, the members subscribed to it (by member id) get contiguous ranges, the first
  ``partitions % members`` one partition more; topics with equal partition counts are co-partitioned.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

TopicAssignment = dict[uuid.UUID, set[int]]  # topic id -> partitions


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    topic_id: uuid.UUID
    name: str
    partitions: int


@dataclass(slots=True)
class MemberSpec:
    """What an assignor knows of a member: its subscribed topics (resolved to ids) and its previous target."""

    member_id: str
    topics: frozenset[uuid.UUID]
    previous: TopicAssignment = field(default_factory=dict)


class Assignor(Protocol):
    name: str

    def assign(
        self, members: list[MemberSpec], topics: Mapping[uuid.UUID, TopicMetadata]
    ) -> dict[str, TopicAssignment]: ...


def _ordered_topics(members: list[MemberSpec], topics: Mapping[uuid.UUID, TopicMetadata]) -> list[TopicMetadata]:
    subscribed = {topic_id for m in members for topic_id in m.topics if topic_id in topics}
    return sorted((topics[t] for t in subscribed), key=lambda t: t.name)


class UniformAssignor:
    name = "uniform"

    def assign(
        self, members: list[MemberSpec], topics: Mapping[uuid.UUID, TopicMetadata]
    ) -> dict[str, TopicAssignment]:
        ordered = sorted(members, key=lambda m: m.member_id)
        owner: dict[tuple[uuid.UUID, int], str] = {}
        owned: dict[str, list[tuple[uuid.UUID, int]]] = {m.member_id: [] for m in ordered}
        eligible: dict[str, frozenset[uuid.UUID]] = {m.member_id: m.topics for m in ordered}

        # 1. Stickiness: keep previous partitions that still exist and are still subscribed.
        for member in ordered:
            for topic_id, partitions in sorted(member.previous.items(), key=lambda kv: str(kv[0])):
                meta = topics.get(topic_id)
                if meta is None or topic_id not in member.topics:
                    continue
                for partition in sorted(partitions):
                    key = (topic_id, partition)
                    if partition < meta.partitions and key not in owner:
                        owner[key] = member.member_id
                        owned[member.member_id].append(key)

        # 2. Unowned partitions, in (topic name, partition) order, to the least loaded subscribed member.
        for meta in _ordered_topics(ordered, topics):
            candidates = [m.member_id for m in ordered if meta.topic_id in m.topics]
            for partition in range(meta.partitions):
                key = (meta.topic_id, partition)
                if key in owner:
                    continue
                chosen = min(candidates, key=lambda mid: len(owned[mid]))  # ties: lowest member id
                owner[key] = chosen
                owned[chosen].append(key)

        # 3. Balance: move a partition from the most to the least loaded member that can take it while
        #    their counts differ by more than one. Each move lowers the sum of squared counts, so this ends.
        moved = True
        while moved:
            moved = False
            for receiver in sorted(ordered, key=lambda m: (len(owned[m.member_id]), m.member_id)):
                giver_order = sorted(ordered, key=lambda m: (-len(owned[m.member_id]), m.member_id))
                for giver in giver_order:
                    if len(owned[giver.member_id]) <= len(owned[receiver.member_id]) + 1:
                        break
                    movable = [k for k in owned[giver.member_id] if k[0] in eligible[receiver.member_id]]
                    if movable:
                        key = movable[-1]  # the most recently added: keeps older (sticky) partitions in place
                        owned[giver.member_id].remove(key)
                        owned[receiver.member_id].append(key)
                        owner[key] = receiver.member_id
                        moved = True
                        break
                if moved:
                    break

        return {member_id: _to_assignment(keys) for member_id, keys in owned.items()}


class RangeAssignor:
    name = "range"

    def assign(
        self, members: list[MemberSpec], topics: Mapping[uuid.UUID, TopicMetadata]
    ) -> dict[str, TopicAssignment]:
        ordered = sorted(members, key=lambda m: m.member_id)
        result: dict[str, TopicAssignment] = {m.member_id: {} for m in ordered}
        for meta in _ordered_topics(ordered, topics):
            subscribers = [m.member_id for m in ordered if meta.topic_id in m.topics]
            quota, extra = divmod(meta.partitions, len(subscribers))
            start = 0
            for index, member_id in enumerate(subscribers):
                count = quota + (1 if index < extra else 0)
                if count:
                    result[member_id][meta.topic_id] = set(range(start, start + count))
                start += count
        return result


def _to_assignment(keys: list[tuple[uuid.UUID, int]]) -> TopicAssignment:
    assignment: TopicAssignment = {}
    for topic_id, partition in keys:
        assignment.setdefault(topic_id, set()).add(partition)
    return assignment


ASSIGNORS: dict[str, Assignor] = {a.name: a for a in (UniformAssignor(), RangeAssignor())}
