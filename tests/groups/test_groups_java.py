"""Classic consumer groups with Java kafka-clients 3.9.0 and 4.4.0 (group.protocol=classic).

Members run as separate JVMs (tests/groups/java/ClassicGroupMember.java, compiled once per version) so one
can be killed without a LeaveGroup. Covered: disjoint complete shares and fail-over; the AdminClient's
group calls; resuming after a broker restart; static membership without a rebalance; cooperative-sticky
rebalancing that revokes only the partitions that move.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from classic_scenarios import FAST_GROUPS, SESSION_MS, a_third_member_joins, assert_no_partition_owned_twice, failover
from member_processes import MemberProcess, create_topic, disjoint_and_complete, produce, run_program, wait_for

from kbroker.testing import RunningBroker

JAVA = Path(__file__).parent / "java"
SOURCE = JAVA / "ClassicGroupMember.java"
SHARED = JAVA / "GroupMembers.java"
VERSIONS = ["3.9.0", "4.4.0"]


@pytest.fixture(params=VERSIONS)
def java_version(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def java(java_version: str, java_program: Callable[..., list[str]]) -> list[str]:
    """The command that runs ClassicGroupMember on the parametrized kafka-clients version."""
    return java_program(SOURCE, java_version, SHARED)


def member_spawner(
    java: list[str], broker: RunningBroker, group: str, topic: str, assignor: str = "range"
) -> Callable[..., MemberProcess]:
    def spawn(name: str, instance: str = "-", session_ms: int = SESSION_MS) -> MemberProcess:
        command = [*java, broker.bootstrap, "member", group, topic, name, assignor, instance, str(session_ms)]
        return MemberProcess(command, name)

    return spawn


def admin(java: list[str], broker: RunningBroker, group: str, topic: str, *actions: str) -> list[dict]:
    return run_program([*java, broker.bootstrap, "admin", group, topic, *actions])


def test_java_members_fail_over_and_the_admin_client_manages_the_group(
    broker_factory, members: list[MemberProcess], java: list[str], java_version: str
) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    spawn = member_spawner(java, broker, "jc", "events")

    # While three members are running: describe and list the group.
    create_topic(broker.bootstrap, "events", 6)
    produce(broker.bootstrap, "events", 6, 10)
    members.extend(spawn(f"member-{i}") for i in range(3))
    wait_for(lambda: disjoint_and_complete(members, 6), members, "three disjoint shares")
    described, listed = admin(java, broker, "jc", "events", "describe", "list")
    for member in members:
        member.drain()
    assert (described["state"], described["assignor"], described["simple"]) == ("Stable", "range", False)
    by_client = {m["clientId"]: m for m in described["members"]}
    assert sorted(by_client) == ["member-0", "member-1", "member-2"]
    for member in members:
        view = by_client[member.name]
        assert view["partitions"] == member.assigned
        assert view["host"] == "/127.0.0.1" and view["instanceId"] is None
        member_ids = {e["memberId"] for e in member.events if e["event"] == "assigned"}
        assert view["memberId"] in member_ids
    assert {"groupId": "jc", "state": "Stable"} in listed["groups"]
    for member in members:
        member.stop()
    members.clear()

    # Fail-over: a fresh group of three; one closes, one is killed.
    failover(broker, member_spawner(java, broker, "jf", "events-2"), members, "events-2")
    survivor = members[2]
    survivor.close()
    wait_for(lambda: survivor.closed, members, "the survivor to close")

    # The group is empty now: offsets can be reset, deleted, and the group removed.
    events = admin(
        java,
        broker,
        "jf",
        "events-2",
        "describe",
        "offsets",
        "alter:0:3",
        "delete-offsets:1",
        "offsets",
        "delete-group",
        "list",
        "describe",
    )
    empty, offsets, altered, deleted_offsets, after, deleted_group, listed_after, gone = events
    assert (empty["state"], empty["members"]) == ("Empty", [])
    assert offsets["offsets"] == [[p, 20, ""] for p in range(6)]
    assert altered == {"event": "alter"} and deleted_offsets == {"event": "delete-offsets"}
    assert after["offsets"] == [[0, 3, "reset by admin"]] + [[p, 20, ""] for p in range(2, 6)]
    assert deleted_group == {"event": "delete-group"}
    assert "jf" not in {g["groupId"] for g in listed_after["groups"]}
    if java_version.startswith("3."):
        assert (gone["state"], gone["members"]) == ("Dead", [])
    else:  # Kafka 4 (KIP-1043): describing a group that does not exist is an error
        assert gone == {"event": "error", "action": "describe", "error": "GroupIdNotFoundException"}


def test_java_group_resumes_after_its_last_commit_across_a_broker_restart(broker_factory, java: list[str]) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    create_topic(broker.bootstrap, "resume", 1)
    produce(broker.bootstrap, "resume", 1, 20)

    def resume(count: int) -> list[int]:
        (event,) = run_program([*java, broker.bootstrap, "resume", "jr", "resume", str(count)])
        return event["values"]

    assert resume(8) == list(range(8))
    broker.restart()
    produce(broker.bootstrap, "resume", 1, 5, start=20)
    assert resume(17) == list(range(8, 25))


def test_java_static_member_comes_back_without_a_rebalance(
    broker_factory, members: list[MemberProcess], java: list[str]
) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    create_topic(broker.bootstrap, "static", 4)
    spawn = member_spawner(java, broker, "js", "static")
    # A long session: the restarted JVM must be back before it ends, or the group would rebalance.
    a, b = spawn("a", "instance-a", 30_000), spawn("b", "instance-b", 30_000)
    members.extend([a, b])
    wait_for(
        lambda: disjoint_and_complete([a, b], 4) and a.generation == b.generation,
        members,
        "two static members sharing four partitions",
    )
    shares, generation = {"a": a.assigned, "b": b.assigned}, a.generation
    b_events = len(b.events)
    # A static member's close sends no LeaveGroup (KIP-345): its place waits for it.
    a.close()
    wait_for(lambda: a.closed, members, "member a to close")
    again = spawn("a", "instance-a", 30_000)
    members.append(again)
    wait_for(lambda: again.assigned == shares["a"], members, "the restarted member to get its partitions back")
    assert again.generation == generation  # no rebalance: the same generation
    b.drain()
    assert [e["event"] for e in b.events[b_events:]] == []  # b saw no revocation, no new assignment
    group = broker.broker.groups.groups["js"]  # type: ignore[union-attr]
    assert group.generation_id == generation and group.state.value == "Stable"
    assert sorted(group.static_members) == ["instance-a", "instance-b"]


def test_java_cooperative_sticky_revokes_only_the_partitions_that_move(
    broker_factory, members: list[MemberProcess], java: list[str]
) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    create_topic(broker.bootstrap, "coop", 6)
    produce(broker.bootstrap, "coop", 6, 10)
    spawn = member_spawner(java, broker, "jcoop", "coop", "cooperative-sticky")
    joined = a_third_member_joins(spawn, members)
    for member in joined.first_two:
        before = joined.before[member.name]
        later = joined.later[member.name]
        revoked = [p for e in later if e["event"] == "revoked" for p in e["partitions"]]
        # Only the partition that moved to the newcomer was revoked; the others stayed put throughout.
        assert len(revoked) == 1 and set(revoked) <= joined.moved and set(revoked) <= before
        assert set(member.assigned) == before - set(revoked)
        assert not [e for e in later if e["event"] == "lost"]
    assert_no_partition_owned_twice(members)
    # Per generation, the partitions members reported as theirs never overlap.
    owners: dict[tuple[int, int], str] = {}
    for member in members:
        for event in member.events:
            if event["event"] == "assigned":
                for p in event["partitions"]:
                    owner = owners.setdefault((event["generation"], p), member.name)
                    assert owner == member.name, f"partition {p} owned by {owner} and {member.name} in one generation"
