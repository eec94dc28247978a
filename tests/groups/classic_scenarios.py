"""Shared pieces of the live classic-group tests: member processes, waiting, and the checks every client
must pass (disjoint complete shares, fail-over without re-reading committed records, no partition owned
by two members at once)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from compat.clients import kafka_python2_path, python_env
from kbroker.testing import RunningBroker

HERE = Path(__file__).parent
PYTHON_MEMBER = HERE / "classic_member.py"
WAIT_SECONDS = 60  # a bound for anything to happen, never a speed check; below every rebalance timeout
# Short sessions so a killed member is noticed quickly; the broker's minimum is lowered to allow them.
SESSION_MS = 4000
FAST_GROUPS = {"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000"}


class MemberProcess:
    """A group member in a child process printing JSON lines; a reader thread collects them."""

    def __init__(self, command: list[str], name: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self.assigned: list[int] | None = None
        self.generation: int | None = None
        self.records: list[tuple[int, int]] = []  # committed
        self.consumed: list[tuple[int, int]] = []  # read, committed or not
        self.closed = False
        self.killed_at: int | None = None
        self.stderr_tail: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self._events.put(json.loads(line))

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr_tail = (self.stderr_tail + [line])[-60:]

    def drain(self) -> None:
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return
            self.events.append(event)
            kind = event["event"]
            if kind == "assigned":
                self.assigned = event["partitions"]
                self.generation = event.get("generation")
            elif kind == "records":
                self.records.extend((p, o) for p, o in event["records"])
            elif kind == "consumed":
                self.consumed.extend((p, o) for p, o in event["records"])
            elif kind == "closed":
                self.closed = True

    def close(self) -> None:
        """Ask the member to close its consumer (a LeaveGroup for dynamic members)."""
        assert self.process.stdin is not None
        self.process.stdin.write("close\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        """SIGKILL: no LeaveGroup, the coordinator only notices when the session times out."""
        self.killed_at = time.monotonic_ns()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.alive:
            self.process.kill()
            self.process.wait(10)


def wait_for(
    condition: Callable[[], bool], members: list[MemberProcess], what: str, timeout: float = WAIT_SECONDS
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for member in members:
            member.drain()
        if condition():
            return
        time.sleep(0.05)
    state = {m.name: (m.assigned, len(m.records), m.process.poll()) for m in members}
    logs = "".join(line for m in members for line in m.stderr_tail[-15:])
    raise AssertionError(f"timed out waiting for {what}: {state}\n{logs}")


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(10)


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, start: int = 0) -> None:
    """``per_partition`` records on each partition, values ``start``, ``start + 1``, ... round robin."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(partitions * per_partition):
        producer.produce(topic, value=f"{start + i}".encode(), partition=i % partitions)
    assert producer.flush(10) == 0


def disjoint_and_complete(members: list[MemberProcess], partitions: int) -> bool:
    shares = [m.assigned or [] for m in members]
    return all(shares) and sorted(sum(shares, [])) == list(range(partitions))


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


# --- kafka-python 2.x -------------------------------------------------------------------------------------


def kafka_python2_env() -> dict[str, str]:
    """An environment whose PYTHONPATH finds kafka-python 2.x first (the compat suite's cached install)."""
    return python_env(kafka_python2_path())


def python_member(
    client: str,
    broker: RunningBroker,
    group: str,
    topic: str,
    name: str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> MemberProcess:
    command = [sys.executable, str(PYTHON_MEMBER), client, broker.bootstrap, group, topic, name]
    return MemberProcess([*command, "--session-ms", str(SESSION_MS), *extra], name, env)
