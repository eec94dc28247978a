"""The KIP-848 consumer group state machine and its assignors, driven directly with a fake clock.

Exact assignments, epochs and error codes; above all, that a partition is only handed to a member once
its previous owner has revoked it (no partition is ever owned by two members).
"""

from __future__ import annotations

import uuid

import pytest

from kbroker.groups.assignors import MemberSpec, RangeAssignor, TopicMetadata, UniformAssignor
from kbroker.groups.consumer_group import (
    ConsumerGroupCoordinator,
    ConsumerGroupState,
    HeartbeatResult,
    MemberHeartbeat,
    MemberState,
)
from kbroker.groups.coordinator import Group, GroupCoordinator, Member
from protocol.errors import ErrorCode

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
SESSION_MS = 45_000
REBALANCE_MS = 30_000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Harness:
    def __init__(self, *, max_size: int = 1000, assignors: tuple[str, ...] = ("uniform", "range")) -> None:
        self.clock = Clock()
        self.topics: dict[str, TopicMetadata] = {"orders": TopicMetadata(T1, "orders", 6)}
        self.classic = GroupCoordinator(
            min_session_timeout_ms=6000, max_session_timeout_ms=300000, initial_rebalance_delay_ms=0, clock=self.clock
        )
        self.coordinator = ConsumerGroupCoordinator(
            topics=lambda: list(self.topics.values()),
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=5000,
            max_size=max_size,
            assignors=assignors,
            classic=self.classic,
            clock=self.clock,
        )

    def join(self, member_id: str, topics: list[str] | None = None, **extra: object) -> HeartbeatResult:
        fields: dict = {
            "version": 1,
            "group_id": "g",
            "member_id": member_id,
            "member_epoch": 0,
            "rebalance_timeout_ms": REBALANCE_MS,
            "subscribed_topic_names": ["orders"] if topics is None else topics,
            "owned": [],
        }
        fields.update(extra)
        return self.coordinator.heartbeat(MemberHeartbeat(**fields))

    def beat(self, member_id: str, epoch: int, owned: dict[uuid.UUID, set[int]] | None, **extra: object):
        owned_list = None if owned is None else [(t, sorted(p)) for t, p in owned.items()]
        result = self.coordinator.heartbeat(
            MemberHeartbeat(version=1, group_id="g", member_id=member_id, member_epoch=epoch, owned=owned_list, **extra)
        )
        self.check_single_ownership()
        return result

    def check_single_ownership(self) -> None:
        seen: dict[tuple[uuid.UUID, int], str] = {}
        for group in self.coordinator.groups.values():
            for member in group.members.values():
                for assignment in (member.assigned, member.pending_revocation):
                    for topic_id, partitions in assignment.items():
                        for partition in partitions:
                            key = (topic_id, partition)
                            assert key not in seen, f"{key} owned by {seen[key]} and {member.member_id}"
                            seen[key] = member.member_id

    @property
    def group(self):
        return self.coordinator.groups["g"]


# --- assignors -----------------------------------------------------------------------------------------

TOPICS = {T1: TopicMetadata(T1, "orders", 6), T2: TopicMetadata(T2, "payments", 3)}


def test_uniform_fresh_assignment_is_round_robin_by_member_id() -> None:
    members = [MemberSpec(m, frozenset({T1})) for m in ("c", "a", "b")]
    assert UniformAssignor().assign(members, TOPICS) == {"a": {T1: {0, 3}}, "b": {T1: {1, 4}}, "c": {T1: {2, 5}}}


def test_uniform_is_sticky_when_a_member_joins() -> None:
    members = [
        MemberSpec("a", frozenset({T1}), {T1: {0, 1, 2}}),
        MemberSpec("b", frozenset({T1}), {T1: {3, 4, 5}}),
        MemberSpec("c", frozenset({T1})),
    ]
    assert UniformAssignor().assign(members, TOPICS) == {"a": {T1: {0, 1}}, "b": {T1: {3, 4}}, "c": {T1: {2, 5}}}


def test_uniform_with_different_subscriptions_balances_what_each_may_take() -> None:
    members = [MemberSpec("a", frozenset({T1})), MemberSpec("b", frozenset({T1, T2}))]
    small = {T1: TopicMetadata(T1, "orders", 3), T2: TOPICS[T2]}
    assert UniformAssignor().assign(members, small) == {"a": {T1: {0, 1, 2}}, "b": {T2: {0, 1, 2}}}


def test_uniform_drops_partitions_of_unsubscribed_or_deleted_topics() -> None:
    members = [MemberSpec("a", frozenset({T1}), {T1: {0, 9}, T2: {0}})]
    assert UniformAssignor().assign(members, TOPICS) == {"a": {T1: {0, 1, 2, 3, 4, 5}}}


def test_range_gives_contiguous_ranges_per_topic() -> None:
    members = [MemberSpec("b", frozenset({T1, T2})), MemberSpec("a", frozenset({T1, T2}))]
    assert RangeAssignor().assign(members, TOPICS) == {"a": {T1: {0, 1, 2}, T2: {0, 1}}, "b": {T1: {3, 4, 5}, T2: {2}}}


def test_range_only_counts_subscribers_of_each_topic() -> None:
    members = [MemberSpec("a", frozenset({T1})), MemberSpec("b", frozenset({T1, T2}))]
    assert RangeAssignor().assign(members, TOPICS) == {"a": {T1: {0, 1, 2}}, "b": {T1: {3, 4, 5}, T2: {0, 1, 2}}}


# --- joining and reconciling ---------------------------------------------------------------------------


def test_first_member_gets_everything_and_the_group_is_stable() -> None:
    h = Harness()
    result = h.join("m1")
    assert (result.error_code, result.member_id, result.member_epoch) == (ErrorCode.NONE, "m1", 1)
    assert result.heartbeat_interval_ms == 5000
    assert result.assignment == {T1: {0, 1, 2, 3, 4, 5}}
    assert (h.group.group_epoch, h.group.assignment_epoch, h.group.state) == (1, 1, ConsumerGroupState.STABLE)
    # A heartbeat with nothing new carries no assignment.
    again = h.beat("m1", 1, {T1: set(range(6))})
    assert (again.member_epoch, again.assignment) == (1, None)


def test_partitions_move_only_after_the_previous_owner_revoked_them() -> None:
    h = Harness()
    h.join("m1")
    joined = h.join("m2")
    # m2 is at the new epoch but gets nothing yet: m1 still owns every partition.
    assert (joined.member_epoch, joined.assignment) == (2, {})
    assert h.group.members["m2"].state == MemberState.UNRELEASED_PARTITIONS
    assert h.group.state == ConsumerGroupState.RECONCILING
    assert h.group.target == {"m1": {T1: {0, 1, 2}}, "m2": {T1: {3, 4, 5}}}

    # m1 learns it keeps 0-2: it stays at epoch 1 until it stops reporting 3-5.
    told = h.beat("m1", 1, {T1: set(range(6))})
    assert (told.member_epoch, told.assignment) == (1, {T1: {0, 1, 2}})
    assert h.group.members["m1"].state == MemberState.UNREVOKED_PARTITIONS
    assert h.group.members["m1"].pending_revocation == {T1: {3, 4, 5}}
    still = h.beat("m1", 1, {T1: set(range(6))})
    assert (still.member_epoch, still.assignment) == (1, None)
    waiting = h.beat("m2", 2, {})
    assert (waiting.member_epoch, waiting.assignment) == (2, None)  # 3-5 are not released yet

    revoked = h.beat("m1", 1, {T1: {0, 1, 2}})
    assert (revoked.member_epoch, revoked.assignment) == (2, None)  # same partitions, new epoch
    granted = h.beat("m2", 2, {})
    assert (granted.member_epoch, granted.assignment) == (2, {T1: {3, 4, 5}})
    assert h.group.state == ConsumerGroupState.STABLE


def test_a_lost_response_is_forgiven_once() -> None:
    h = Harness()
    h.join("m1")
    h.join("m2")
    h.beat("m1", 1, {T1: set(range(6))})
    h.beat("m1", 1, {T1: {0, 1, 2}})  # now epoch 2; suppose the client missed that answer
    retry = h.beat("m1", 1, {T1: {0, 1, 2}})
    assert (retry.error_code, retry.member_epoch) == (ErrorCode.NONE, 2)
    # A previous epoch with partitions outside the assignment, or an epoch from the future, is fenced.
    assert h.beat("m1", 1, {T1: {0, 1, 2, 3}}).error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert h.beat("m1", 7, {T1: {0, 1, 2}}).error_code == ErrorCode.FENCED_MEMBER_EPOCH


def test_rejoining_with_epoch_zero_releases_the_members_partitions() -> None:
    h = Harness()
    h.join("m1")
    h.join("m2")
    h.beat("m1", 1, {T1: set(range(6))})
    h.beat("m1", 1, {T1: {0, 1, 2}})
    h.beat("m2", 2, {})
    h.beat("m2", 2, {T1: {3, 4, 5}})
    # m2 was fenced client-side and rejoins with epoch 0 and no partitions: it gets its target back.
    rejoined = h.join("m2")
    assert (rejoined.error_code, rejoined.member_epoch, rejoined.assignment) == (ErrorCode.NONE, 2, {T1: {3, 4, 5}})


# --- leaving, expiry, fencing --------------------------------------------------------------------------


def test_leaving_frees_the_partitions_for_the_rest() -> None:
    h = Harness()
    h.join("m1")
    h.join("m2")
    h.beat("m1", 1, {T1: set(range(6))})
    h.beat("m1", 1, {T1: {0, 1, 2}})
    h.beat("m2", 2, {})
    left = h.beat("m2", -1, {T1: {3, 4, 5}})
    assert (left.error_code, left.member_id, left.member_epoch) == (ErrorCode.NONE, "m2", -1)
    assert list(h.group.members) == ["m1"] and h.group.group_epoch == 3
    after = h.beat("m1", 2, {T1: {0, 1, 2}})
    assert (after.member_epoch, after.assignment) == (3, {T1: {0, 1, 2, 3, 4, 5}})
    assert h.beat("m2", 2, {}).error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_silent_member_expires_after_the_session_timeout() -> None:
    h = Harness()
    h.join("m1")
    h.join("m2")
    h.beat("m1", 1, {T1: set(range(6))})
    h.beat("m1", 1, {T1: {0, 1, 2}})
    h.beat("m2", 2, {})
    h.clock.advance(SESSION_MS / 1000 - 1)
    h.beat("m1", 2, {T1: {0, 1, 2}})
    h.coordinator.tick()
    assert set(h.group.members) == {"m1", "m2"}
    h.clock.advance(1)
    h.coordinator.tick()
    assert set(h.group.members) == {"m1"}  # m2's session ran out; m1 heartbeated 1 s ago
    after = h.beat("m1", 2, {T1: {0, 1, 2}})
    assert (after.member_epoch, after.assignment) == (3, {T1: set(range(6))})


def test_a_group_config_sets_the_groups_session_timeout_and_heartbeat_interval() -> None:
    h = Harness()
    configs = {"g": {"consumer.session.timeout.ms": "50000", "consumer.heartbeat.interval.ms": "6000"}}
    h.coordinator.group_configs = lambda group_id: configs.get(group_id, {})
    assert h.join("m1").heartbeat_interval_ms == 6000
    h.clock.advance(49)
    h.coordinator.tick()
    assert set(h.group.members) == {"m1"}  # past the broker's 45 s, within the group's 50 s
    h.clock.advance(1)
    h.coordinator.tick()
    assert set(h.group.members) == set()
    del configs["g"]  # a removed group config: the broker's defaults again, from the next heartbeat
    assert h.join("m2").heartbeat_interval_ms == 5000
    h.clock.advance(SESSION_MS / 1000)
    h.coordinator.tick()
    assert set(h.group.members) == set()


def test_a_member_that_does_not_revoke_within_its_rebalance_timeout_is_fenced() -> None:
    h = Harness()
    h.join("m1")
    h.join("m2")
    h.beat("m1", 1, {T1: set(range(6))})  # told to give up 3-5
    for _ in range(3):  # keeps heartbeating, keeps the partitions
        h.clock.advance(REBALANCE_MS / 1000 / 3)
        h.beat("m1", 1, {T1: set(range(6))})
        h.beat("m2", 2, {})
        h.coordinator.tick()
    assert set(h.group.members) == {"m2"}
    taken = h.beat("m2", 2, {})
    assert (taken.member_epoch, taken.assignment) == (3, {T1: set(range(6))})
    assert h.beat("m1", 1, {T1: set(range(6))}).error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_static_member_leaves_temporarily_and_its_replacement_takes_over() -> None:
    h = Harness()
    h.join("m1", instance_id="host-1")
    h.join("m2")
    h.beat("m1", 1, {T1: set(range(6))})
    h.beat("m1", 1, {T1: {0, 1, 2}})
    h.beat("m2", 2, {})
    bounced = h.beat("m1", -2, {T1: {0, 1, 2}}, instance_id="host-1")
    assert (bounced.error_code, bounced.member_epoch) == (ErrorCode.NONE, -2)
    # Still owned while it is away: nobody else gets 0-2, and the group epoch did not move.
    assert h.group.group_epoch == 2 and h.beat("m2", 2, {T1: {3, 4, 5}}).assignment is None
    back = h.join("m1-again", instance_id="host-1")
    assert (back.error_code, back.member_epoch, back.assignment) == (ErrorCode.NONE, 2, {T1: {0, 1, 2}})
    assert set(h.group.members) == {"m1-again", "m2"}
    # The instance id is taken now: another member using it is refused.
    assert h.join("m3", instance_id="host-1").error_code == ErrorCode.UNRELEASED_INSTANCE_ID
    assert h.beat("m1", 2, {}, instance_id="host-1").error_code == ErrorCode.FENCED_INSTANCE_ID


def test_static_member_that_never_returns_expires() -> None:
    h = Harness()
    h.join("m1", instance_id="host-1")
    h.beat("m1", -2, {T1: set(range(6))}, instance_id="host-1")
    h.join("m2")
    assert h.group.members["m2"].assigned == {}  # host-1 still holds everything
    h.clock.advance(SESSION_MS / 1000)
    h.beat("m2", 2, {})
    h.coordinator.tick()
    assert set(h.group.members) == {"m2"} and h.group.static_members == {}
    assert h.beat("m2", 2, {}).assignment == {T1: set(range(6))}


# --- subscriptions -------------------------------------------------------------------------------------


def test_regex_subscription_picks_up_topics_created_later() -> None:
    h = Harness()
    h.topics["orders-eu"] = TopicMetadata(T2, "orders-eu", 2)
    joined = h.join("m1", topics=None, subscribed_topic_names=None, subscribed_topic_regex="orders-.*")
    assert joined.assignment == {T2: {0, 1}}
    later = uuid.UUID(int=3)
    h.topics["orders-us"] = TopicMetadata(later, "orders-us", 1)
    grown = h.beat("m1", 1, {T2: {0, 1}})
    assert (grown.member_epoch, grown.assignment) == (2, {T2: {0, 1}, later: {0}})
    assert h.group.subscribed_topic_names() == {"orders-eu", "orders-us"}


def test_topic_named_before_it_exists_is_assigned_once_created() -> None:
    h = Harness()
    assert h.join("m1", topics=["later"]).assignment == {}
    h.topics["later"] = TopicMetadata(T2, "later", 2)
    assert h.beat("m1", 1, {}).assignment == {T2: {0, 1}}


def test_partitions_added_to_a_topic_are_assigned() -> None:
    h = Harness()
    h.join("m1")
    h.topics["orders"] = TopicMetadata(T1, "orders", 8)
    assert h.beat("m1", 1, {T1: set(range(6))}).assignment == {T1: set(range(8))}


def test_the_range_assignor_is_used_when_members_ask_for_it() -> None:
    h = Harness()
    h.join("m1", server_assignor="range")
    h.join("m2", server_assignor="range")
    assert h.group.target == {"m1": {T1: {0, 1, 2}}, "m2": {T1: {3, 4, 5}}}
    assert h.coordinator.preferred_assignor(h.group) == "range"


# --- errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"member_id": ""}, ErrorCode.INVALID_REQUEST),  # v1: the client names itself (KIP-1082)
        ({"group_id": " "}, ErrorCode.INVALID_REQUEST),
        ({"rebalance_timeout_ms": -1}, ErrorCode.INVALID_REQUEST),
        ({"owned": None}, ErrorCode.INVALID_REQUEST),
        ({"subscribed_topic_names": None}, ErrorCode.INVALID_REQUEST),
        ({"member_epoch": -3}, ErrorCode.INVALID_REQUEST),
        ({"server_assignor": "sticky"}, ErrorCode.UNSUPPORTED_ASSIGNOR),
        ({"subscribed_topic_regex": "orders-("}, ErrorCode.INVALID_REGULAR_EXPRESSION),
    ],
)
def test_invalid_joins_are_refused(fields: dict, code: ErrorCode) -> None:
    h = Harness()
    result = h.join(str(fields.pop("member_id", "m1")), **fields)
    assert (result.error_code, result.member_id, result.member_epoch) == (code, None, 0)
    assert result.error_message
    assert "g" not in h.coordinator.groups


def test_v0_members_get_their_id_from_the_coordinator() -> None:
    h = Harness()
    result = h.join("", version=0)
    assert result.error_code == ErrorCode.NONE and len(result.member_id) == 22
    assert list(h.group.members) == [result.member_id]


def test_unknown_members_and_groups() -> None:
    h = Harness()
    assert h.beat("ghost", 3, {}).error_code == ErrorCode.UNKNOWN_MEMBER_ID  # no such group (e.g. after a restart)
    h.join("m1")
    assert h.beat("ghost", 3, {}).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.beat("ghost", -1, {}).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    gone = h.coordinator.heartbeat(MemberHeartbeat(version=1, group_id="nope", member_id="x", member_epoch=-1))
    assert gone.error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_group_max_size() -> None:
    h = Harness(max_size=2)
    h.join("m1")
    h.join("m2")
    assert h.join("m3").error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert h.beat("m2", 2, {}).error_code == ErrorCode.NONE  # members already in are fine


def test_classic_group_with_members_keeps_its_id() -> None:
    h = Harness()
    classic = h.classic.groups["g"] = Group("g")
    classic.members["old"] = Member("old", None, "c", "/h", 10000, 10000, "consumer", [("range", b"")])
    result = h.join("m1")
    assert result.error_code == ErrorCode.GROUP_ID_NOT_FOUND and "g" not in h.coordinator.groups
    del classic.members["old"]  # empty now: it becomes a consumer group
    assert h.join("m1").error_code == ErrorCode.NONE and "g" not in h.classic.groups


# --- offsets ---------------------------------------------------------------------------------------------


def test_offset_commit_and_fetch_checks_use_member_epochs() -> None:
    h = Harness()
    assert h.coordinator.validate_offset_commit("other", "x", 5, 9) is None  # not a consumer group
    h.join("m1")
    check = h.coordinator.validate_offset_commit
    assert check("g", "m1", 1, 9) == ErrorCode.NONE
    assert check("g", "m1", 0, 9) == ErrorCode.STALE_MEMBER_EPOCH
    assert check("g", "m1", 1, 8) == ErrorCode.UNSUPPORTED_VERSION
    assert check("g", "nobody", 1, 9) == ErrorCode.UNKNOWN_MEMBER_ID
    assert check("g", "", -1, 9) == ErrorCode.UNKNOWN_MEMBER_ID  # an admin commit while members are active
    fetch = h.coordinator.validate_offset_fetch
    assert fetch("g", None, -1) == ErrorCode.NONE
    assert fetch("g", "m1", 1) == ErrorCode.NONE
    assert fetch("g", "m1", 2) == ErrorCode.STALE_MEMBER_EPOCH
    assert fetch("g", "nobody", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    h.beat("m1", -1, {})
    assert check("g", "", -1, 9) == ErrorCode.NONE  # empty group: admin commits allowed
    assert h.coordinator.delete("g") == ErrorCode.NONE and h.coordinator.delete("g") == ErrorCode.GROUP_ID_NOT_FOUND
