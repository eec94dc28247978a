"""Classic consumer groups with aiokafka, kafka-python 2.x and confluent-kafka (in child processes, so one
can be killed): three members on six partitions get disjoint complete shares; one closes and one is killed
and the survivor owns everything within the session timeout, reading nothing committed twice; and a group
resumes exactly after its last commit across a broker restart."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from classic_scenarios import FAST_GROUPS, failover, kafka_python2_env, python_member
from member_processes import MemberProcess, create_topic, produce, wait_for

from compat.clients import KAFKA_PYTHON_2
from kbroker.testing import RunningBroker

CLIENTS = ["aiokafka", "kafka-python-2", "confluent"]


def spawner(client: str, broker: RunningBroker, group: str, topic: str) -> Callable[..., MemberProcess]:
    env = kafka_python2_env() if client == "kafka-python-2" else None
    name = "kafka-python" if client == "kafka-python-2" else client

    def spawn(member_name: str, *extra: str) -> MemberProcess:
        return python_member(name, broker, group, topic, member_name, *extra, env=env)

    return spawn


@pytest.mark.parametrize("client", CLIENTS)
def test_three_members_fail_over_without_reading_committed_records_twice(
    broker_factory, members: list[MemberProcess], client: str
) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    spawn = spawner(client, broker, "trio", "events")
    failover(broker, spawn, members, "events")
    # The version the child really ran (kafka-python 2.x comes first on its PYTHONPATH).
    version = next(e for e in members[0].events if e["event"] == "client")["version"]
    expected = {"kafka-python-2": KAFKA_PYTHON_2, "aiokafka": "0.", "confluent": "2."}[client]
    assert version.startswith(expected), version


@pytest.mark.parametrize("client", CLIENTS)
def test_a_group_resumes_after_its_last_commit_across_a_broker_restart(
    broker_factory, members: list[MemberProcess], client: str
) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    create_topic(broker.bootstrap, "resume", 2)
    produce(broker.bootstrap, "resume", 2, 10)
    spawn = spawner(client, broker, "resumers", "resume")
    first = spawn("first", "--max-records", "3", "--stop-after", "8")
    members.append(first)
    wait_for(lambda: first.closed, members, "the first consumer to commit 8+ records and close")
    first_committed = sorted(first.records)
    assert 8 <= len(first_committed) < 20

    broker.restart()
    produce(broker.bootstrap, "resume", 2, 5, start=20)
    remaining = 30 - len(first_committed)
    second = spawn("second", "--max-records", "3", "--stop-after", str(remaining))
    members.append(second)
    wait_for(lambda: second.closed, members, "the second consumer to read the rest")
    # It started exactly after each partition's last commit: together, every record exactly once.
    assert sorted(first_committed + second.records) == [(p, o) for p in range(2) for o in range(15)]
    for partition in range(2):
        read_first = [o for p, o in first_committed if p == partition]
        read_second = [o for p, o in second.records if p == partition]
        assert read_second[0] == (max(read_first) + 1 if read_first else 0)
