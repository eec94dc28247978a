"""Incremental (cooperative) rebalancing with librdkafka (confluent-kafka), classic protocol.

The assignor runs in the client, so the coordinator only has to get the protocol right: with
cooperative-sticky a newcomer makes the others give up just the partitions that move (a second rebalance
hands them over), while the eager range assignor takes every partition away first. Either way no
partition is owned by two members at the same time.
"""

from __future__ import annotations

import pytest
from classic_scenarios import FAST_GROUPS, a_third_member_joins, assert_no_partition_owned_twice, python_member
from member_processes import MemberProcess, create_topic, produce

from kbroker.testing import RunningBroker


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_a_joining_member_takes_only_the_partitions_that_move(
    broker_factory, members: list[MemberProcess], assignor: str
) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    create_topic(broker.bootstrap, "coop", 6)
    produce(broker.bootstrap, "coop", 6, 10)

    def spawn(name: str) -> MemberProcess:
        return python_member("confluent", broker, "cg", "coop", name, "--assignor", assignor)

    joined = a_third_member_joins(spawn, members, records=60)
    for member in joined.first_two:
        later = joined.later[member.name]
        revoked = {p for e in later if e["event"] == "revoked" for p in e["partitions"]}
        kept = set(member.assigned or [])
        if assignor == "cooperative-sticky":
            # Only what the newcomer takes is revoked; the rest is never interrupted.
            assert len(revoked) == 1 and revoked <= joined.moved and kept == joined.before[member.name] - revoked
            assert not {p for e in later if e["event"] == "added" for p in e["partitions"]}
        else:
            # Eager: everything is revoked before the new assignment is handed out.
            assert revoked == joined.before[member.name]
    assert_no_partition_owned_twice(members)
    # Every record was read; nothing committed was read again.
    committed = [r for m in members for r in m.records]
    assert sorted(set(committed)) == [(p, o) for p in range(6) for o in range(10)]
    assert len(committed) == len(set(committed))
