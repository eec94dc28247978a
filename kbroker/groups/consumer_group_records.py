"""A KIP-848 consumer group's state as Kafka's ConsumerGroup* records in ``__consumer_offsets``.

Kafka's GroupMetadataManager writes a consumer group as five kinds of records (GroupCoordinatorRecordHelpers),
each keyed by the group (and member):

- ConsumerGroupMetadata (type 3): the group epoch;
- ConsumerGroupMemberMetadata (5): a member's subscription and client facts;
- ConsumerGroupTargetAssignmentMetadata (6): the assignment epoch; ConsumerGroupTargetAssignmentMember (7): one
  member's target partitions (only the members whose target changed are written, as Kafka writes the delta);
- ConsumerGroupCurrentMemberAssignment (8): a member's epochs, reconciliation state and partitions;
- ConsumerGroupRegularExpression (16): the topics a subscribed regex resolved to.

A member leaving writes the tombstones of its current assignment, target and metadata, then the bumped group epoch;
a deleted group the tombstones of its target epoch, (legacy) partition metadata and group epoch; a regex no member
subscribes with any more its tombstone. ``StoredConsumerGroup``
is what replaying those records leaves (the shard's view, kbroker/groups/offsets.py); the coordinator rebuilds a
group from it when its shard is loaded (kbroker/groups/consumer_group.py ``restore``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, cast

from kbroker.coordinators.runtime import CoordinatorRecord
from protocol import coordinator_records
from protocol.coordinator_frame import encode_coordinator_record

# The group coordinator's record types (protocol.coordinator_records.GROUP_RECORD_TYPES).
CONSUMER_GROUP_METADATA = 3
CONSUMER_GROUP_PARTITION_METADATA = 4
CONSUMER_GROUP_MEMBER_METADATA = 5
CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA = 6
CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER = 7
CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT = 8
CONSUMER_GROUP_REGULAR_EXPRESSION = 16
CONSUMER_GROUP_RECORD_TYPES = frozenset(
    {
        CONSUMER_GROUP_METADATA,
        CONSUMER_GROUP_PARTITION_METADATA,
        CONSUMER_GROUP_MEMBER_METADATA,
        CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA,
        CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
        CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
        CONSUMER_GROUP_REGULAR_EXPRESSION,
    }
)
VALUE_VERSION = 0  # every ConsumerGroup* value has this one version

# Kafka's MemberState values (org.apache.kafka.coordinator.group.modern.MemberState).
STATE_STABLE = 0
STATE_UNREVOKED_PARTITIONS = 1
STATE_UNRELEASED_PARTITIONS = 2

Partitions = Mapping[uuid.UUID, Iterable[int]]
V = TypeVar("V")


@dataclass(slots=True)
class StoredConsumerGroup:
    """A consumer group as its records left it: values by member id, and the group's two epochs."""

    group_id: str
    epoch: int = -1  # -1: no ConsumerGroupMetadata record (yet)
    metadata_hash: int = 0
    assignment_epoch: int = -1
    members: dict[str, coordinator_records.ConsumerGroupMemberMetadataValue] = field(default_factory=dict)
    targets: dict[str, coordinator_records.ConsumerGroupTargetAssignmentMemberValue] = field(default_factory=dict)
    current: dict[str, coordinator_records.ConsumerGroupCurrentMemberAssignmentValue] = field(default_factory=dict)
    regexes: dict[str, coordinator_records.ConsumerGroupRegularExpressionValue] = field(
        default_factory=dict
    )  # by regex

    def is_empty(self) -> bool:
        return (
            self.epoch < 0
            and self.assignment_epoch < 0
            and not (self.members or self.targets or self.current or self.regexes)
        )


class _GroupKey(Protocol):
    group_id: str


class _RegexKey(Protocol):
    group_id: str
    regular_expression: str


class _MemberKey(Protocol):
    group_id: str
    member_id: str


class _TopicPartitions(Protocol):
    topic_id: uuid.UUID
    partitions: list[int]


def replay_consumer_group_record(
    groups: dict[str, StoredConsumerGroup], record_type: int, key: object, value: object | None
) -> None:
    """Apply one decoded ConsumerGroup* record (a None value: its tombstone) to ``groups``."""
    if record_type == CONSUMER_GROUP_PARTITION_METADATA:
        return  # Kafka 4.1+ no longer writes it (the metadata hash replaced it); an older writer's is not needed
    group_id = cast(_GroupKey, key).group_id
    group = groups.get(group_id)
    if group is None:
        if value is None:
            return
        group = groups[group_id] = StoredConsumerGroup(group_id)
    if record_type == CONSUMER_GROUP_METADATA:
        if value is None:
            group.epoch, group.metadata_hash = -1, 0
        else:
            assert isinstance(value, coordinator_records.ConsumerGroupMetadataValue)
            group.epoch, group.metadata_hash = value.epoch, value.metadata_hash
    elif record_type == CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA:
        if value is None:
            group.assignment_epoch = -1
        else:
            assert isinstance(value, coordinator_records.ConsumerGroupTargetAssignmentMetadataValue)
            group.assignment_epoch = value.assignment_epoch
    elif record_type == CONSUMER_GROUP_REGULAR_EXPRESSION:
        regex = cast(_RegexKey, key).regular_expression
        _put(group.regexes, regex, value, coordinator_records.ConsumerGroupRegularExpressionValue)
    else:
        member_id = cast(_MemberKey, key).member_id
        if record_type == CONSUMER_GROUP_MEMBER_METADATA:
            _put(group.members, member_id, value, coordinator_records.ConsumerGroupMemberMetadataValue)
        elif record_type == CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER:
            _put(group.targets, member_id, value, coordinator_records.ConsumerGroupTargetAssignmentMemberValue)
        else:
            _put(group.current, member_id, value, coordinator_records.ConsumerGroupCurrentMemberAssignmentValue)
    if group.is_empty():
        del groups[group_id]


def _put(by_member: dict[str, V], member_id: str, value: object | None, value_type: type[V]) -> None:
    if value is None:
        by_member.pop(member_id, None)
    else:
        assert isinstance(value, value_type)
        by_member[member_id] = value


# --- the records ------------------------------------------------------------------------------------------


def metadata_hash(topics: Iterable[tuple[uuid.UUID, str, int]]) -> int:
    """A 64-bit digest of the subscribed topics (id, name, partition count), stored in ConsumerGroupMetadataValue's
    metadata_hash so a load sees whether the topics changed while the broker was down (Kafka's KIP-1101 field;
    kbroker's digest is its own, only kbroker reads it back)."""
    digest = hashlib.blake2b(digest_size=8)
    for topic_id, name, partitions in sorted(topics, key=lambda t: t[1]):
        digest.update(topic_id.bytes + name.encode() + b"\0" + partitions.to_bytes(4, "big"))
    return int.from_bytes(digest.digest(), "big", signed=True) or 1  # 0 means "not computed" to Kafka


def group_epoch_record(group_id: str, epoch: int, topics_hash: int) -> CoordinatorRecord:
    value = coordinator_records.ConsumerGroupMetadataValue(epoch=epoch, metadata_hash=topics_hash)
    return encode_coordinator_record(
        coordinator_records.ConsumerGroupMetadataKey(group_id=group_id), value, VALUE_VERSION
    )


def group_epoch_tombstone(group_id: str) -> CoordinatorRecord:
    return encode_coordinator_record(coordinator_records.ConsumerGroupMetadataKey(group_id=group_id), None)


def partition_metadata_tombstone(group_id: str) -> CoordinatorRecord:
    """Kafka still writes it when a group is deleted (a group an older Kafka wrote may have the record)."""
    return encode_coordinator_record(coordinator_records.ConsumerGroupPartitionMetadataKey(group_id=group_id), None)


def member_metadata_record(
    group_id: str,
    member_id: str,
    *,
    instance_id: str | None,
    rack_id: str | None,
    client_id: str,
    client_host: str,
    subscribed_topic_names: Iterable[str],
    subscribed_topic_regex: str | None,
    rebalance_timeout_ms: int,
    server_assignor: str | None,
) -> CoordinatorRecord:
    value = coordinator_records.ConsumerGroupMemberMetadataValue(
        instance_id=instance_id,
        rack_id=rack_id,
        client_id=client_id,
        client_host=client_host,
        subscribed_topic_names=sorted(subscribed_topic_names),  # as Kafka sorts them
        subscribed_topic_regex=subscribed_topic_regex,
        rebalance_timeout_ms=rebalance_timeout_ms,
        server_assignor=server_assignor,
        classic_member_metadata=None,  # members here are consumer-protocol members only
    )
    key = coordinator_records.ConsumerGroupMemberMetadataKey(group_id=group_id, member_id=member_id)
    return encode_coordinator_record(key, value, VALUE_VERSION)


def member_metadata_tombstone(group_id: str, member_id: str) -> CoordinatorRecord:
    return encode_coordinator_record(
        coordinator_records.ConsumerGroupMemberMetadataKey(group_id=group_id, member_id=member_id), None
    )


def target_assignment_epoch_record(group_id: str, assignment_epoch: int, timestamp_ms: int) -> CoordinatorRecord:
    value = coordinator_records.ConsumerGroupTargetAssignmentMetadataValue(
        assignment_epoch=assignment_epoch, assignment_timestamp=timestamp_ms
    )
    return encode_coordinator_record(
        coordinator_records.ConsumerGroupTargetAssignmentMetadataKey(group_id=group_id), value, VALUE_VERSION
    )


def target_assignment_epoch_tombstone(group_id: str) -> CoordinatorRecord:
    return encode_coordinator_record(
        coordinator_records.ConsumerGroupTargetAssignmentMetadataKey(group_id=group_id), None
    )


def target_assignment_record(group_id: str, member_id: str, partitions: Partitions) -> CoordinatorRecord:
    value = coordinator_records.ConsumerGroupTargetAssignmentMemberValue(
        topic_partitions=[
            coordinator_records.ConsumerGroupTargetAssignmentMemberValue.TopicPartition(
                topic_id=topic_id, partitions=sorted(parts)
            )
            for topic_id, parts in partitions.items()
        ]
    )
    key = coordinator_records.ConsumerGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id)
    return encode_coordinator_record(key, value, VALUE_VERSION)


def target_assignment_tombstone(group_id: str, member_id: str) -> CoordinatorRecord:
    key = coordinator_records.ConsumerGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id)
    return encode_coordinator_record(key, None)


def _topic_partitions(
    partitions: Partitions,
) -> list[coordinator_records.ConsumerGroupCurrentMemberAssignmentValue.TopicPartitions]:
    return [
        coordinator_records.ConsumerGroupCurrentMemberAssignmentValue.TopicPartitions(
            topic_id=topic_id, partitions=sorted(parts)
        )
        for topic_id, parts in partitions.items()
        if parts
    ]


def current_assignment_record(
    group_id: str,
    member_id: str,
    *,
    member_epoch: int,
    previous_member_epoch: int,
    state: int,
    assigned: Partitions,
    pending_revocation: Partitions,
) -> CoordinatorRecord:
    value = coordinator_records.ConsumerGroupCurrentMemberAssignmentValue(
        member_epoch=member_epoch,
        previous_member_epoch=previous_member_epoch,
        state=state,
        assigned_partitions=_topic_partitions(assigned),
        partitions_pending_revocation=_topic_partitions(pending_revocation),
    )
    key = coordinator_records.ConsumerGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member_id)
    return encode_coordinator_record(key, value, VALUE_VERSION)


def current_assignment_tombstone(group_id: str, member_id: str) -> CoordinatorRecord:
    key = coordinator_records.ConsumerGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member_id)
    return encode_coordinator_record(key, None)


def regex_record(group_id: str, regex: str, topics: Iterable[str], timestamp_ms: int) -> CoordinatorRecord:
    """The topics ``regex`` resolved to. Kafka's ``version`` is the metadata image's offset the resolution saw;
    kbroker resolves on every heartbeat and writes 0."""
    value = coordinator_records.ConsumerGroupRegularExpressionValue(
        topics=sorted(topics), version=0, timestamp=timestamp_ms
    )
    key = coordinator_records.ConsumerGroupRegularExpressionKey(group_id=group_id, regular_expression=regex)
    return encode_coordinator_record(key, value, VALUE_VERSION)


def regex_tombstone(group_id: str, regex: str) -> CoordinatorRecord:
    key = coordinator_records.ConsumerGroupRegularExpressionKey(group_id=group_id, regular_expression=regex)
    return encode_coordinator_record(key, None)


def member_tombstones(group_id: str, member_id: str) -> list[CoordinatorRecord]:
    """A member leaves (Kafka's removeMember): its current assignment, target and metadata go, in that order."""
    return [
        current_assignment_tombstone(group_id, member_id),
        target_assignment_tombstone(group_id, member_id),
        member_metadata_tombstone(group_id, member_id),
    ]


def group_tombstones(group_id: str, member_ids: Iterable[str] = ()) -> list[CoordinatorRecord]:
    """A group deleted (Kafka's ConsumerGroup.createGroupTombstoneRecords), members' records first."""
    ids = list(member_ids)
    return [
        *(current_assignment_tombstone(group_id, m) for m in ids),
        *(target_assignment_tombstone(group_id, m) for m in ids),
        target_assignment_epoch_tombstone(group_id),
        *(member_metadata_tombstone(group_id, m) for m in ids),
        partition_metadata_tombstone(group_id),
        group_epoch_tombstone(group_id),
    ]


def partitions_of(topic_partitions: Iterable[_TopicPartitions]) -> dict[uuid.UUID, set[int]]:
    """A record's topic partitions list as {topic id: partitions} (empty entries dropped)."""
    result: dict[uuid.UUID, set[int]] = {}
    for tp in topic_partitions:
        if tp.partitions:
            result.setdefault(tp.topic_id, set()).update(tp.partitions)
    return result
