"""Incremental (cooperative) rebalancing with librdkafka (confluent-kafka), classic protocol.

The assignor runs in the client, so the coordinator only has to get the protocol right: with
cooperative-sticky a newcomer makes the others give up just the partitions that move (a second rebalance
hands them over), while the eager range assignor takes every partition away first. Either way no
partition is owned by two members at the same time.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from classic_scenarios import (
    FAST_GROUPS,
    MemberProcess,
    assert_no_partition_owned_twice,
    create_topic,
    disjoint_and_complete,
    produce,
    python_member,
    wait_for,
)

from kbroker.testing import RunningBroker


@pytest.fixture
def members() -> Iterator[list[MemberProcess]]:
    started: list[MemberProcess] = []
    yield started
    for member in started:
        member.stop()


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_a_joining_member_takes_only_the_partitions_that_move(
    broker_factory, members: list[MemberProcess], assignor: str
) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    create_topic(broker.bootstrap, "coop", 6)
    produce(broker.bootstrap, "coop", 6, 10)

    def spawn(name: str) -> MemberProcess:
        return python_member("confluent", broker, "cg", "coop", name, "--assignor", assignor)

    first, second = spawn("first"), spawn("second")
    members.extend([first, second])
    wait_for(
        lambda: (
            disjoint_and_complete([first, second], 6)
            and [len(first.assigned or []), len(second.assigned or [])] == [3, 3]
            and len(set(first.records + second.records)) == 60
        ),
        members,
        "two members with three partitions each and every record",
    )
    before = {"first": set(first.assigned or []), "second": set(second.assigned or [])}
    marks = {"first": len(first.events), "second": len(second.events)}
    third = spawn("third")
    members.append(third)
    wait_for(
        lambda: disjoint_and_complete(members, 6) and sorted(len(m.assigned or []) for m in members) == [2, 2, 2],
        members,
        "three members with two partitions each",
    )
    moved = set(third.assigned or [])
    for member in (first, second):
        later = member.events[marks[member.name] :]
        revoked = {p for e in later if e["event"] == "revoked" for p in e["partitions"]}
        kept = set(member.assigned or [])
        if assignor == "cooperative-sticky":
            # Only what the newcomer takes is revoked; the rest is never interrupted.
            assert len(revoked) == 1 and revoked <= moved and kept == before[member.name] - revoked
            assert not {p for e in later if e["event"] == "added" for p in e["partitions"]}
        else:
            # Eager: everything is revoked before the new assignment is handed out.
            assert revoked == before[member.name]
    assert_no_partition_owned_twice(members)
    # Every record was read; nothing committed was read again.
    committed = [r for m in members for r in m.records]
    assert sorted(set(committed)) == [(p, o) for p in range(6) for o in range(10)]
    assert len(committed) == len(set(committed))
