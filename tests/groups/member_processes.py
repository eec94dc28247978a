"""Group members in child processes (Python or Java programs printing JSON lines), waiting on them, and the
topics they read. Used by the live group tests of both protocols: a member in its own process can be
killed with SIGKILL, leaving its group without a word."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

WAIT_SECONDS = 60  # a bound for anything to happen, never a speed check; below every rebalance timeout


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
    condition: Callable[[], bool],
    members: list[MemberProcess],
    what: str,
    timeout: float = WAIT_SECONDS,
    describe: Callable[[], str] | None = None,
) -> None:
    """Wait until ``condition()`` holds, collecting the members' events meanwhile. On a timeout the error shows
    each member's state and last stderr lines, and ``describe()`` (the broker's side, say) when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for member in members:
            member.drain()
        if condition():
            return
        time.sleep(0.05)
    state = {m.name: (m.assigned, len(m.records), m.process.poll()) for m in members}
    logs = "".join(line for m in members for line in m.stderr_tail[-15:])
    broker_side = f"\n{describe()}" if describe is not None else ""
    raise AssertionError(f"timed out waiting for {what}: {state}\n{logs}{broker_side}")


def run_program(command: list[str]) -> list[dict[str, Any]]:
    """Run a program to its end (an admin action, a one-off consumer); the JSON lines it printed."""
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-4000:]
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def disjoint_and_complete(members: list[MemberProcess], partitions: int) -> bool:
    """Every member has a share, and the shares are ``partitions`` partitions, each in one share."""
    shares = [m.assigned or [] for m in members]
    return all(shares) and sorted(sum(shares, [])) == list(range(partitions))


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
