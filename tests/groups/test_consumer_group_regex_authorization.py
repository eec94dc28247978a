"""A KIP-848 regex subscription resolves only to the topics the member that set it may DESCRIBE (Kafka 4.3).

The coordinator is driven directly with a fake clock; the member's ``may_describe_topic`` stands in for the
authorizer, and its answers change as ACLs would.
"""

from __future__ import annotations

import uuid

from kbroker.groups.assignors import TopicMetadata
from kbroker.groups.consumer_group import ConsumerGroupCoordinator, HeartbeatResult, MemberHeartbeat

OPEN = uuid.UUID(int=1)
CLOSED = uuid.UUID(int=2)
READONLY = uuid.UUID(int=3)
REGEX = "clo.*|open|readonly"


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


class Acls:
    """The topics a principal may DESCRIBE; ``asked`` records every question, to show when it is asked."""

    def __init__(self, *allowed: str) -> None:
        self.allowed = set(allowed)
        self.asked: list[str] = []

    def __call__(self, name: str) -> bool:
        self.asked.append(name)
        return name in self.allowed


def coordinator() -> tuple[ConsumerGroupCoordinator, dict[str, TopicMetadata]]:
    topics = {
        "open": TopicMetadata(OPEN, "open", 2),
        "closed": TopicMetadata(CLOSED, "closed", 1),
        "readonly": TopicMetadata(READONLY, "readonly", 1),
    }
    groups = ConsumerGroupCoordinator(
        topics=lambda: list(topics.values()),
        session_timeout_ms=45_000,
        heartbeat_interval_ms=5000,
        max_size=100,
        assignors=("uniform",),
        clock=Clock(),
    )
    return groups, topics


def join(groups: ConsumerGroupCoordinator, member_id: str, **subscription: object) -> HeartbeatResult:
    return groups.heartbeat(
        MemberHeartbeat(
            version=1,
            group_id="g",
            member_id=member_id,
            member_epoch=0,
            rebalance_timeout_ms=30_000,
            owned=[],
            **subscription,  # type: ignore[arg-type]
        )
    )


def beat(
    groups: ConsumerGroupCoordinator, member_id: str, epoch: int, owned: dict[uuid.UUID, set[int]], **extra: object
) -> HeartbeatResult:
    return groups.heartbeat(
        MemberHeartbeat(
            version=1,
            group_id="g",
            member_id=member_id,
            member_epoch=epoch,
            owned=[(topic_id, sorted(partitions)) for topic_id, partitions in owned.items()],
            **extra,  # type: ignore[arg-type]
        )
    )


def test_a_regex_resolves_only_to_topics_its_member_may_describe() -> None:
    groups, _ = coordinator()
    acls = Acls("open", "readonly")
    joined = join(groups, "m1", subscribed_topic_regex=REGEX, may_describe_topic=acls)
    assert (joined.member_epoch, joined.assignment) == (1, {OPEN: {0, 1}, READONLY: {0}})
    assert sorted(set(acls.asked)) == ["closed", "open", "readonly"]  # only names the regex matches
    assert groups.groups["g"].subscribed_topic_names() == {"open", "readonly"}


def test_without_a_filter_a_regex_resolves_to_every_match() -> None:
    groups, _ = coordinator()
    joined = join(groups, "m1", subscribed_topic_regex=REGEX)
    assert joined.assignment == {OPEN: {0, 1}, CLOSED: {0}, READONLY: {0}}


def test_another_members_subscription_by_name_does_not_reach_the_regex_member() -> None:
    """``closed`` is in the group's subscribed topics (bob names it), yet the regex member never gets it."""
    groups, topics = coordinator()
    topics["closed"] = TopicMetadata(CLOSED, "closed", 2)  # two partitions: shared out if both subscribed
    join(groups, "regex", subscribed_topic_regex="closed", may_describe_topic=Acls())
    join(groups, "bob", subscribed_topic_names=["closed"])
    group = groups.groups["g"]
    assert group.target == {"regex": {}, "bob": {CLOSED: {0, 1}}}
    assert beat(groups, "regex", 1, {}).assignment is None  # unchanged: nothing


def test_the_filter_is_kept_and_reasked_as_acls_and_topics_change() -> None:
    groups, topics = coordinator()
    acls = Acls("open")
    joined = join(groups, "m1", subscribed_topic_regex=REGEX, may_describe_topic=acls)
    assert joined.assignment == {OPEN: {0, 1}}
    # Heartbeats that do not repeat the regex keep the filter (no filter sent: not "allow everything").
    assert beat(groups, "m1", 1, {OPEN: {0, 1}}).assignment is None
    acls.allowed.add("closed")  # an ACL now grants DESCRIBE on closed
    granted = beat(groups, "m1", 1, {OPEN: {0, 1}})
    assert (granted.member_epoch, granted.assignment) == (2, {OPEN: {0, 1}, CLOSED: {0}})
    topics["clock"] = TopicMetadata(uuid.UUID(int=4), "clock", 1)  # matches, but may not be described
    assert beat(groups, "m1", 2, {OPEN: {0, 1}, CLOSED: {0}}).assignment is None
    assert groups.groups["g"].group_epoch == 2
    acls.allowed.discard("closed")  # the grant is withdrawn: closed is revoked
    revoked = beat(groups, "m1", 2, {OPEN: {0, 1}, CLOSED: {0}})
    assert (revoked.member_epoch, revoked.assignment) == (2, {OPEN: {0, 1}})
    assert groups.groups["g"].target["m1"] == {OPEN: {0, 1}}
    assert beat(groups, "m1", 2, {OPEN: {0, 1}}).member_epoch == 3


def test_the_regex_sent_again_carries_the_new_principals_rights() -> None:
    groups, _ = coordinator()
    join(groups, "m1", subscribed_topic_regex=REGEX, may_describe_topic=Acls("open"))
    again = beat(groups, "m1", 1, {OPEN: {0, 1}}, subscribed_topic_regex=REGEX, may_describe_topic=Acls("readonly"))
    assert again.assignment == {}  # open is revoked first, then readonly handed over
    assert groups.groups["g"].members["m1"].pending_revocation == {OPEN: {0, 1}}
    revoked = beat(groups, "m1", 1, {})
    assert (revoked.member_epoch, revoked.assignment) == (2, {READONLY: {0}})
    cleared = beat(groups, "m1", 2, {READONLY: {0}}, subscribed_topic_regex="", subscribed_topic_names=["open"])
    assert groups.groups["g"].members["m1"].may_describe_topic is None
    assert (cleared.member_epoch, cleared.assignment) == (2, {})
    assert beat(groups, "m1", 2, {}).assignment == {OPEN: {0, 1}}
