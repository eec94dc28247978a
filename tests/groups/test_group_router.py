"""kbroker.groups.router: one place that says which kind a group id is (classic, consumer, offsets-only, unknown)."""

from __future__ import annotations

import uuid
from pathlib import Path

import trio
import trio.testing

from kbroker.groups.assignors import TopicMetadata
from kbroker.groups.consumer_group import ConsumerGroupCoordinator, MemberHeartbeat, new_member_id
from kbroker.groups.coordinator import GroupCoordinator, JoinResult
from kbroker.groups.offsets import CommittedOffset, OffsetStore
from kbroker.groups.router import GroupKind, GroupRouter
from protocol.errors import ErrorCode

TOPIC = TopicMetadata(uuid.UUID(int=1), "orders", 3)


class Harness:
    def __init__(self, data_dir: Path) -> None:
        self.now = 100.0
        self.classic = GroupCoordinator(
            min_session_timeout_ms=1000,
            max_session_timeout_ms=60_000,
            initial_rebalance_delay_ms=0,
            clock=lambda: self.now,
        )
        self.consumer = ConsumerGroupCoordinator(
            topics=lambda: [TOPIC],
            session_timeout_ms=45_000,
            heartbeat_interval_ms=5000,
            max_size=100,
            assignors=["uniform"],
            classic=self.classic,
            clock=lambda: self.now,
        )
        self.offsets = OffsetStore.in_data_dir(data_dir, partitions=3)
        self.router = GroupRouter(self.classic, self.consumer, self.offsets)

    def commit(self, group_id: str) -> None:
        self.offsets.commit(group_id, {("orders", 0): CommittedOffset(5, -1, None, 0, -1)})

    def consumer_join(self, group_id: str) -> str:
        member_id = new_member_id()
        result = self.consumer.heartbeat(
            MemberHeartbeat(
                version=1,
                group_id=group_id,
                member_id=member_id,
                member_epoch=0,
                rebalance_timeout_ms=30_000,
                subscribed_topic_names=["orders"],
                owned=[],
            )
        )
        assert result.error_code == ErrorCode.NONE
        return member_id

    def consumer_leave(self, group_id: str, member_id: str) -> None:
        self.consumer.heartbeat(MemberHeartbeat(version=1, group_id=group_id, member_id=member_id, member_epoch=-1))

    async def classic_join(self, group_id: str) -> JoinResult:
        """Join a classic group as its only member and wait for the join phase to complete."""
        results: list[JoinResult] = []

        async def join(member_id: str) -> None:
            results.append(
                await self.classic.join(
                    group_id, member_id, None, "client", "/127.0.0.1", 10_000, 10_000, "consumer", [("range", b"")],
                    require_known_member_id=False,
                )
            )  # fmt: skip

        async with trio.open_nursery() as nursery:
            nursery.start_soon(join, "")
            await trio.testing.wait_all_tasks_blocked()
            self.now += 1
            self.classic.tick()
        return results[0]


def test_an_unknown_group(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    assert h.router.kind("g") is GroupKind.UNKNOWN
    assert not h.router.is_known("g")
    assert h.router.list_groups() == []
    assert h.router.delete("g") == ErrorCode.GROUP_ID_NOT_FOUND
    assert h.router.validate_offset_fetch("g", "m", 3) == ErrorCode.NONE
    # A "simple" group (assign() consumer, admin) may commit without a generation, not with one.
    assert h.router.validate_offset_commit("g", "", None, -1, 9) == ErrorCode.NONE
    assert h.router.validate_offset_commit("g", "m", None, 2, 9) == ErrorCode.GROUP_ID_NOT_FOUND
    assert h.router.validate_offset_commit("", "", None, -1, 9) == ErrorCode.INVALID_GROUP_ID


def test_an_offsets_only_group_is_listed_as_an_empty_classic_group(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.commit("manual")
    assert h.router.kind("manual") is GroupKind.OFFSETS_ONLY
    [listing] = h.router.list_groups()
    assert (listing.group_id, listing.kind, listing.state, listing.protocol_type) == (
        "manual",
        GroupKind.OFFSETS_ONLY,
        "Empty",
        "",
    )
    assert listing.group_type == "classic"
    assert h.router.validate_offset_commit("manual", "", None, -1, 9) == ErrorCode.NONE
    assert h.router.validate_offset_commit("manual", "m", None, 1, 9) == ErrorCode.UNKNOWN_MEMBER_ID
    assert trio.run(h.router.delete_groups, ["manual", "manual", "other"]) == [
        ErrorCode.NONE,
        ErrorCode.NONE,
        ErrorCode.GROUP_ID_NOT_FOUND,
    ]
    assert not h.offsets.has_group("manual")
    assert h.router.kind("manual") is GroupKind.UNKNOWN


def test_an_offsets_only_group_becomes_classic_when_a_member_joins(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.commit("g")
    assert h.router.kind("g") is GroupKind.OFFSETS_ONLY

    async def main() -> None:
        result = await h.classic_join("g")
        assert result.error_code == ErrorCode.NONE

    trio.run(main)
    assert h.router.kind("g") is GroupKind.CLASSIC
    assert h.router.has_members("g")
    [listing] = h.router.list_groups()
    assert (listing.kind, listing.protocol_type, listing.group_type) == (GroupKind.CLASSIC, "consumer", "classic")
    assert h.router.delete("g") == ErrorCode.NON_EMPTY_GROUP
    assert h.offsets.has_group("g")
    # A consumer-protocol member cannot take the id while the classic group has members.
    assert h.router.admit_classic_join("g")


def test_a_consumer_group(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    member = h.consumer_join("cg")
    assert h.router.kind("cg") is GroupKind.CONSUMER
    assert h.router.consumer_group("cg") is not None
    assert h.router.classic_group("cg") is None
    assert h.router.has_members("cg")
    [listing] = h.router.list_groups()
    assert (listing.kind, listing.protocol_type, listing.group_type) == (GroupKind.CONSUMER, "consumer", "consumer")
    epoch = h.consumer.groups["cg"].members[member].member_epoch
    assert h.router.validate_offset_commit("cg", member, None, epoch, 9) == ErrorCode.NONE
    assert h.router.validate_offset_commit("cg", member, None, epoch + 1, 9) == ErrorCode.STALE_MEMBER_EPOCH
    assert h.router.validate_offset_commit("cg", member, None, epoch, 8) == ErrorCode.UNSUPPORTED_VERSION
    assert h.router.validate_offset_fetch("cg", "nobody", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.router.delete("cg") == ErrorCode.NON_EMPTY_GROUP


def test_consumer_and_classic_groups_share_one_namespace(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    member = h.consumer_join("shared")
    # A JoinGroup for a consumer group with members is refused; the id stays the consumer group's.
    assert not h.router.admit_classic_join("shared")
    assert h.router.kind("shared") is GroupKind.CONSUMER

    async def main() -> None:
        assert (await h.classic_join("classic")).error_code == ErrorCode.NONE

    trio.run(main)
    assert [(g.group_id, g.kind) for g in h.router.list_groups()] == [
        ("classic", GroupKind.CLASSIC),
        ("shared", GroupKind.CONSUMER),
    ]
    # Once the consumer group is empty, a classic member may take the id: the consumer group goes.
    h.consumer_leave("shared", member)
    assert not h.router.has_members("shared")
    assert h.router.admit_classic_join("shared")
    assert h.router.kind("shared") is GroupKind.UNKNOWN
