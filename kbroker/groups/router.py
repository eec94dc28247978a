"""One namespace of group ids, three owners: which kind a group id is, and the checks that depend on it.

A group id belongs to the KIP-848 consumer group coordinator (kbroker.groups.consumer_group), to the classic
coordinator (kbroker.groups.coordinator), or to neither but still has committed offsets (a manual-assign
consumer, an admin offset commit): an offsets-only group, which Kafka lists and describes as an Empty classic
group. The handlers (kbroker/apis) and the broker ask the router instead of probing each coordinator.

The kind of an id changes over its life: an offsets-only group becomes classic when a member joins it, an
empty classic group becomes a consumer group when a consumer-protocol member heartbeats, and an empty
consumer group becomes classic when a classic member joins. A group with members keeps its kind. The router
decides the classic direction (``admit_classic_join``); for the consumer direction the consumer coordinator asks
the classic one through a one-method interface (kbroker.groups.consumer_group.OtherGroupKinds), since it must
decide inside its heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import trio

from kbroker.coordinators.runtime import write_error_answer
from kbroker.groups.consumer_group import ConsumerGroup, ConsumerGroupCoordinator
from kbroker.groups.coordinator import Group, GroupCoordinator, GroupState
from kbroker.groups.offsets import OffsetStore, OffsetStoreError
from protocol.errors import ErrorCode, KafkaError


class GroupKind(Enum):
    CLASSIC = "classic"
    CONSUMER = "consumer"
    OFFSETS_ONLY = "offsets-only"
    UNKNOWN = "unknown"

    @property
    def group_type(self) -> str:
        """The type ListGroups v5 reports (KIP-848): an offsets-only group is a classic one."""
        return "consumer" if self is GroupKind.CONSUMER else "classic"


@dataclass(frozen=True, slots=True)
class GroupListing:
    """One row of ListGroups."""

    group_id: str
    kind: GroupKind
    state: str
    protocol_type: str

    @property
    def group_type(self) -> str:
        return self.kind.group_type


class GroupRouter:
    def __init__(self, classic: GroupCoordinator, consumer: ConsumerGroupCoordinator, offsets: OffsetStore) -> None:
        self.classic = classic
        self.consumer = consumer
        self.offsets = offsets

    # --- which kind -------------------------------------------------------------------------------------

    def require_coordinator(self, group_id: str) -> None:
        """The check of every request to a group's coordinator, as Kafka's CoordinatorRuntime makes it: KafkaError
        NOT_COORDINATOR when another broker leads the group's __consumer_offsets partition (its groups were
        unloaded here; the client finds the coordinator again), COORDINATOR_LOAD_IN_PROGRESS while this broker
        leads it but has not loaded its shard (the client retries here). Without the second, a request in that
        window would see the group missing: an OffsetCommit answered GROUP_ID_NOT_FOUND, a JoinGroup starting
        the group over."""
        if self.offsets.coordinated_elsewhere(group_id):
            raise KafkaError(ErrorCode.NOT_COORDINATOR, f"this broker is not the coordinator of group {group_id}")
        if self.offsets.loading(group_id):
            raise KafkaError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"the coordinator of group {group_id} is still loading it"
            )

    def coordinator_error(self, group_id: str) -> ErrorCode:
        """``require_coordinator`` as a code, for the APIs that answer each group of a request on its own."""
        try:
            self.require_coordinator(group_id)
        except KafkaError as exc:
            return exc.code
        return ErrorCode.NONE

    def kind(self, group_id: str) -> GroupKind:
        if group_id in self.consumer.groups:
            return GroupKind.CONSUMER
        if group_id in self.classic.groups:
            return GroupKind.CLASSIC
        if self.offsets.has_group(group_id):
            return GroupKind.OFFSETS_ONLY
        return GroupKind.UNKNOWN

    def is_known(self, group_id: str) -> bool:
        return self.kind(group_id) is not GroupKind.UNKNOWN

    def classic_group(self, group_id: str) -> Group | None:
        return self.classic.groups.get(group_id)

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        return self.consumer.groups.get(group_id)

    def has_members(self, group_id: str) -> bool:
        """Whether the group has members under either protocol."""
        return self.classic.has_members(group_id) or self.consumer.has_members(group_id)

    def group_ids(self) -> list[str]:
        """Every known group id, sorted."""
        return sorted(set(self.classic.groups) | set(self.offsets.offsets) | set(self.consumer.groups))

    def list_groups(self) -> list[GroupListing]:
        """Every known group with its kind, state and protocol type, sorted by id: those of the partitions this
        broker coordinates. KafkaError COORDINATOR_LOAD_IN_PROGRESS while one of them is not loaded yet, as
        Kafka's coordinator runtime fails the whole ListGroups then (its groups would be missing from the list);
        the partitions other brokers lead are theirs to list."""
        if self.offsets.loading_any():
            raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "a group coordinator partition is loading")
        listed = []
        for group_id in self.group_ids():
            consumer_group = self.consumer.groups.get(group_id)
            if consumer_group is not None:  # KIP-848 group: protocol type "consumer", its own states
                listed.append(GroupListing(group_id, GroupKind.CONSUMER, consumer_group.state.value, "consumer"))
                continue
            group = self.classic.groups.get(group_id)
            if group is None:
                listed.append(GroupListing(group_id, GroupKind.OFFSETS_ONLY, GroupState.EMPTY.value, ""))
            else:
                listed.append(GroupListing(group_id, GroupKind.CLASSIC, group.state.value, group.protocol_type or ""))
        return listed

    # --- the checks that depend on the kind -----------------------------------------------------------

    def admit_classic_join(self, group_id: str) -> bool:
        """Whether a JoinGroup (classic protocol) may go to the classic coordinator.

        Kafka 4 would admit a classic member into a consumer group (mixed groups); kbroker does not, so the
        id stays with the consumer group while it has members. An empty consumer group becomes a classic one.
        """
        if self.kind(group_id) is not GroupKind.CONSUMER:
            return True
        if self.consumer.has_members(group_id):
            return False
        self.consumer.delete(group_id)
        return True

    def validate_offset_commit(
        self, group_id: str, member_id: str, group_instance_id: str | None, generation_or_epoch: int, api_version: int
    ) -> ErrorCode:
        """Who may commit offsets for ``group_id``: member epochs for a consumer group, else Kafka's classic rules.

        OffsetCommit v0 has neither member id nor generation; the classic checks see "" and -1 then.
        """
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        if self.kind(group_id) is GroupKind.CONSUMER:
            check = self.consumer.validate_offset_commit(group_id, member_id, generation_or_epoch, api_version)
            assert check is not None  # a consumer group
            return check
        return self.classic.validate_offset_commit(
            group_id,
            member_id if api_version >= 1 else "",
            group_instance_id,
            generation_or_epoch if api_version >= 1 else -1,
            api_version,
            group_has_offsets=self.offsets.has_group(group_id),
        )

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+: a consumer group checks the member's epoch; other kinds have nothing to check."""
        if self.kind(group_id) is not GroupKind.CONSUMER:
            return ErrorCode.NONE
        return self.consumer.validate_offset_fetch(group_id, member_id, member_epoch)

    async def delete_groups(self, group_ids: list[str]) -> list[ErrorCode]:
        """DeleteGroups: each group (if empty) and its committed offsets. Which ids exist is decided once, before
        any is deleted, so an id named twice is answered NONE twice.

        Answered once the tombstones are committed, as Kafka's coordinator deletes the groups of each
        __consumer_offsets partition in one write answered at its commit: if a partition's cannot be committed,
        every group of it in the request is answered the error as Kafka maps it (the deletions stand, as Kafka
        does not undo a write whose commit failed)."""
        known = set(self.group_ids())
        codes = [self._delete(g) if g in known else ErrorCode.GROUP_ID_NOT_FOUND for g in group_ids]
        # Each partition a group was deleted from: one of its groups, and the partition's end offset now, after the
        # tombstones (nothing else was written since).
        written: dict[int, tuple[str, int]] = {}
        for group_id, code in zip(group_ids, codes, strict=True):
            if code == ErrorCode.NONE:
                written.setdefault(self.offsets.partition_for(group_id), (group_id, self.offsets.end_offset(group_id)))
        failed: dict[int, ErrorCode] = {}

        async def commit_of(partition: int, group_id: str, end_offset: int) -> None:
            try:
                await self.offsets.committed(group_id, end_offset)
            except KafkaError as exc:
                failed[partition] = write_error_answer(exc.code)

        async with trio.open_nursery() as nursery:  # the partitions' commits awaited together, as Kafka's
            for partition, (group_id, end_offset) in written.items():
                nursery.start_soon(commit_of, partition, group_id, end_offset)
        if not failed:
            return codes
        return [failed.get(self.offsets.partition_for(g), code) for g, code in zip(group_ids, codes, strict=True)]

    def delete(self, group_id: str) -> ErrorCode:
        """Delete one group (if empty) and its committed offsets."""
        if not self.is_known(group_id):
            return ErrorCode.GROUP_ID_NOT_FOUND
        return self._delete(group_id)

    def _delete(self, group_id: str) -> ErrorCode:
        if self.kind(group_id) is GroupKind.CONSUMER:
            code = self.consumer.delete(group_id)
        else:
            code = self.classic.delete(group_id)
        if code == ErrorCode.NONE:
            try:
                self.offsets.delete_group(group_id)
            except OffsetStoreError:  # the offsets stay (logged by the store); as Kafka maps a failed write
                return ErrorCode.NOT_COORDINATOR
        return code
