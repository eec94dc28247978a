"""Shared pieces of the live classic-group tests: starting Python members, and the checks every client
must pass (fail-over without re-reading committed records, no partition owned by two members at once, a
third member joining two). The member processes themselves are in member_processes.py."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from member_processes import MemberProcess, create_topic, disjoint_and_complete, produce, wait_for

from compat.clients import kafka_python2_path, python_env
from kbroker.testing import RunningBroker

HERE = Path(__file__).parent
PYTHON_MEMBER = HERE / "classic_member.py"
# Short sessions so a killed member is noticed quickly; the broker's minimum is lowered to allow them.
SESSION_MS = 4000
FAST_GROUPS = {"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000"}


def python_member(
    client: str,
    broker: RunningBroker,
    group: str,
    topic: str,
    name: str,
    *extra: str,
    env: dict[str, str] | None = None,
    session_ms: int = SESSION_MS,
) -> MemberProcess:
    """classic_member.py with ``client`` (kafka-python, aiokafka or confluent) as a member of ``group``."""
    command = [sys.executable, str(PYTHON_MEMBER), client, broker.bootstrap, group, topic, name]
    return MemberProcess([*command, "--session-ms", str(session_ms), *extra], name, env)


def ownership_intervals(member: MemberProcess) -> dict[int, list[tuple[int, int]]]:
    """Per partition, the [from, to) times (monotonic ns) the member owned it, from its rebalance callbacks."""
    owned: dict[int, int] = {}
    intervals: dict[int, list[tuple[int, int]]] = {}
    for event in member.events:
        if event["event"] == "added":
            for p in event["partitions"]:
                owned.setdefault(p, event["t"])
        elif event["event"] in ("revoked", "lost"):
            for p in event["partitions"]:
                if p in owned:
                    intervals.setdefault(p, []).append((owned.pop(p), event["t"]))
        elif event["event"] == "closing":  # it reads nothing more; the group may move its partitions on
            for p, start in owned.items():
                intervals.setdefault(p, []).append((start, event["t"]))
            owned.clear()
    end = member.killed_at if member.killed_at is not None else time.monotonic_ns()
    for p, start in owned.items():
        intervals.setdefault(p, []).append((start, end))
    return intervals


def assert_no_partition_owned_twice(members: list[MemberProcess]) -> None:
    """No two members ever owned the same partition at the same time (one clock for all processes)."""
    per_member = [(m.name, ownership_intervals(m)) for m in members]
    for i, (name_a, owned_a) in enumerate(per_member):
        for name_b, owned_b in per_member[i + 1 :]:
            for partition, spans_a in owned_a.items():
                for a_from, a_to in spans_a:
                    for b_from, b_to in owned_b.get(partition, []):
                        assert not (a_from < b_to and b_from < a_to), (
                            f"partition {partition} owned by {name_a} and {name_b} at once"
                        )


def failover(
    broker: RunningBroker, spawn: Callable[[str], MemberProcess], members: list[MemberProcess], topic: str
) -> None:
    """Three members share six partitions; one closes, one is killed; the survivor ends up with everything
    (through session-timeout expiry, long before any rebalance timeout), and nothing that was committed is
    read twice."""
    create_topic(broker.bootstrap, topic, 6)
    produce(broker.bootstrap, topic, 6, 10)
    members.extend(spawn(f"member-{i}") for i in range(3))
    wait_for(
        lambda: (
            disjoint_and_complete(members, 6)
            and sorted(len(m.assigned or []) for m in members) == [2, 2, 2]
            and len(set(sum((m.records for m in members), []))) == 60
        ),
        members,
        "three disjoint shares of two partitions and all 60 records",
    )
    leaving, killed, survivor = members
    leaving.close()
    killed.kill()
    produce(broker.bootstrap, topic, 6, 10, start=60)
    wait_for(lambda: leaving.closed, members, "the closing member to leave")
    wait_for(
        lambda: survivor.assigned == list(range(6)) and len(set(sum((m.records for m in members), []))) == 120,
        members,
        "the survivor to own every partition and read every record",
    )
    committed = [record for m in members for record in m.records]
    assert len(committed) == len(set(committed)), "a committed record was read (and committed) twice"
    assert sorted(committed) == [(p, o) for p in range(6) for o in range(20)]
    assert_no_partition_owned_twice(members)


@dataclass
class ThirdMemberJoined:
    """The first two members, what each owned before a third joined and its events since (by name), and
    the newcomer's share."""

    first_two: tuple[MemberProcess, MemberProcess]
    before: dict[str, set[int]]
    later: dict[str, list[dict[str, Any]]]
    moved: set[int]


def a_third_member_joins(
    spawn: Callable[[str], MemberProcess], members: list[MemberProcess], records: int | None = None
) -> ThirdMemberJoined:
    """Members "first" and "second" share six partitions three and three (and, given ``records``, have
    committed that many distinct records); then "third" joins and the group settles on two each."""
    first, second = spawn("first"), spawn("second")
    members.extend([first, second])
    wait_for(
        lambda: (
            disjoint_and_complete([first, second], 6)
            and [len(first.assigned or []), len(second.assigned or [])] == [3, 3]
            and (records is None or len(set(first.records + second.records)) == records)
        ),
        members,
        "two members with three partitions each" + ("" if records is None else f" and {records} records"),
    )
    before = {m.name: set(m.assigned or []) for m in (first, second)}
    marks = {m.name: len(m.events) for m in (first, second)}
    third = spawn("third")
    members.append(third)
    wait_for(
        lambda: disjoint_and_complete(members, 6) and sorted(len(m.assigned or []) for m in members) == [2, 2, 2],
        members,
        "three members with two partitions each",
    )
    later = {m.name: m.events[marks[m.name] :] for m in (first, second)}
    return ThirdMemberJoined((first, second), before, later, set(third.assigned or []))


# --- kafka-python 2.x -------------------------------------------------------------------------------------


def kafka_python2_env() -> dict[str, str]:
    """An environment whose PYTHONPATH finds kafka-python 2.x first (the compat suite's cached install)."""
    return python_env(kafka_python2_path())
