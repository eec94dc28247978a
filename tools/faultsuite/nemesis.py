"""The fault suite's nemesis: faults from a seeded schedule, each written to the history, on a cluster of
tests/cluster/kraft_cluster.py (kbroker's brokers or Apache Kafka's, under one Kafka KRaft controller, each
broker behind a fault proxy).

The faults (``FAULTS``), each held for a while and then healed:

- ``kill-leader`` / ``kill-follower``: SIGKILL of the leader (or a follower) of a partition of the topic, started
  again on the same data when healed;
- ``kill-controller``: SIGKILL of the controller quorum's only voter, started again when healed;
- ``pause-leader``: SIGSTOP of a leader for longer than replica.lag.time.max.ms and the broker session timeout
  (the controller fences it and elects another), then SIGCONT: a zombie that wakes up believing it leads;
- ``isolate``: one broker cut off from the other brokers (their replica fetches, both ways, through the proxies)
  while clients and the controller still reach it;
- ``isolate-kill-leader``: a leader cut off from the other brokers for less than replica.lag.time.max.ms (its
  followers are still in its ISR, so it cannot acknowledge acks=all), then killed: a follower of that ISR takes
  over without what the leader wrote meanwhile, and the old leader comes back with a tail to truncate;
- ``restart``: SIGTERM of a broker (a controlled shutdown moves leadership away), started again;
- ``elect``: preferred-leader election of every partition (ElectLeaders), leader churn after earlier faults;
- ``restart-all``: SIGKILL of every broker at once, all started again;
- ``pair``: two of the single-broker faults at once, on different brokers.

``run`` draws faults until its time is over, then heals everything. Which broker a fault hits is drawn from the
seed too, among the brokers the controller's image says lead or follow (the image, not the fault, is random).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tools.faultsuite.history import INFO, NEMESIS, OK, History

if TYPE_CHECKING:
    from tests.cluster.kraft_cluster import KRaftCluster, QuorumBroker

SINGLE = ("kill-leader", "kill-follower", "pause-leader", "isolate", "restart", "isolate-kill-leader")
FAULTS = (*SINGLE, "kill-controller", "elect", "restart-all", "pair")
CUT_BEFORE_KILL_SECONDS = 2.0  # isolate-kill-leader: less than the suite's replica.lag.time.max.ms (4 s)
Heal = Callable[[], object]


class Nemesis:
    def __init__(
        self,
        cluster: KRaftCluster,
        history: History,
        topic: str,
        seed: int,
        *,
        faults: tuple[str, ...] = FAULTS,
        hold: tuple[float, float] = (3.0, 8.0),
        quiet: tuple[float, float] = (2.0, 5.0),
        pause_seconds: float = 12.0,
    ) -> None:
        self.cluster, self.history, self.topic = cluster, history, topic
        self.random = random.Random(seed)
        self.faults, self.hold, self.quiet, self.pause_seconds = faults, hold, quiet, pause_seconds
        self._stop = threading.Event()
        self.count: dict[str, int] = {}

    def run(self, seconds: float) -> None:
        """Faults one after another for ``seconds`` (the one under way is finished and healed)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self._stop.is_set():
            self._stop.wait(self.random.uniform(*self.quiet))
            if time.monotonic() >= deadline or self._stop.is_set():
                break
            name = self.random.choice(self.faults)
            self.count[name] = self.count.get(name, 0) + 1
            self.inject(name)

    def stop(self) -> None:
        self._stop.set()

    def inject(self, name: str) -> None:
        """One fault: written when it begins, held, healed, written when healed (``info`` if healing failed)."""
        invoked = self.history.invoke(NEMESIS, "fault", fault=name)
        heals: list[Heal] = []
        try:
            if name == "pair":
                first, second = self.random.sample(SINGLE, 2)
                used: set[int] = set()
                heals.append(self._single(first, used))
                heals.append(self._single(second, used))
                self._stop.wait(self.random.uniform(*self.hold))
            elif name in SINGLE:
                heals.append(self._single(name, set()))
                if name != "pause-leader":  # a pause is held for its own, longer time
                    self._stop.wait(self.random.uniform(*self.hold))
            elif name == "kill-controller":
                self.cluster.controller.kill()
                self._stop.wait(self.random.uniform(*self.hold))
                heals.append(self.cluster.controller.start)
            elif name == "elect":
                self._elect_preferred()
            elif name == "restart-all":
                for broker in self.cluster.brokers:
                    if broker.running:
                        broker.kill()
                heals.append(self.cluster.restore)
            else:
                raise ValueError(f"no fault named {name!r}: one of {', '.join(FAULTS)}")
        finally:
            outcome, error = OK, ""
            for heal in reversed(heals):
                try:
                    heal()
                except Exception as exc:  # the run goes on: restore() at the end tries again
                    outcome, error = INFO, f"{type(exc).__name__}: {exc}"
            self.history.complete(invoked, outcome, **({"error": error} if error else {}))

    def heal_all(self) -> None:
        """Every broker running, resumed, reachable and unfenced, and the controller up."""
        for broker in self.cluster.brokers:
            if broker.running:
                _signal(broker, signal.SIGCONT)
        if self.cluster.controller.process is None:
            self.cluster.controller.start()
        self.cluster.restore()

    def elect_preferred(self) -> None:
        """Each partition back to its preferred leader (what auto.leader.rebalance.enable does in time): a former
        leader leads again and the final read reads from it."""
        self.count["elect"] = self.count.get("elect", 0) + 1
        invoked = self.history.invoke(NEMESIS, "fault", fault="elect")
        self._elect_preferred()
        self.history.complete(invoked, OK)

    # --- single-broker faults -------------------------------------------------------------------------------

    def _single(self, name: str, used: set[int]) -> Heal:
        """Inject ``name`` on a broker not in ``used`` (then added to it); return what heals it."""
        if name in ("kill-leader", "kill-follower", "restart"):
            broker = self._pick(used, leader={"kill-leader": True, "kill-follower": False}.get(name))
            if name == "restart":
                broker.stop()  # SIGTERM: a controlled shutdown
            else:
                broker.kill()
            return broker.start
        if name == "pause-leader":
            broker = self._pick(used, leader=True)
            _signal(broker, signal.SIGSTOP)
            self._stop.wait(self.pause_seconds)
            return lambda: _signal(broker, signal.SIGCONT)
        if name in ("isolate", "isolate-kill-leader"):
            broker = self._pick(used, leader=None if name == "isolate" else True)
            others = [other for other in self.cluster.brokers if other is not broker]
            for other in others:
                self.cluster.cut(broker, other)
                self.cluster.cut(other, broker)

            def heal() -> None:
                for other in others:
                    other.proxy.unblock(broker.name)
                    broker.proxy.unblock(other.name)
                if not broker.running:
                    broker.start()

            if name == "isolate-kill-leader":
                self._stop.wait(CUT_BEFORE_KILL_SECONDS)
                broker.kill()
            return heal
        raise ValueError(f"no single-broker fault named {name!r}")

    def _pick(self, used: set[int], *, leader: bool | None) -> QuorumBroker:
        """A running broker not yet used: a leader (True) or a follower (False) of one of the topic's partitions
        as the controller's image has it, or any (None); any running one when none of those is left."""
        image = self.cluster.observe().image
        running = [broker for broker in self.cluster.brokers if broker.running and broker.node_id not in used]
        if not running:
            raise RuntimeError("no running broker left to fault")
        wanted: set[int] = set()
        topic = image.topics.by_name.get(self.topic) if leader is not None else None
        if topic is not None:
            for registration in topic.partitions.values():
                if leader:
                    wanted.add(registration.leader)
                else:
                    wanted.update(r for r in registration.replicas if r != registration.leader)
        candidates = [broker for broker in running if broker.node_id in wanted] or running
        broker = self.random.choice(sorted(candidates, key=lambda b: b.node_id))
        used.add(broker.node_id)
        return broker

    def _elect_preferred(self) -> None:
        from confluent_kafka import ElectionType, TopicPartition
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(
            {"bootstrap.servers": self.cluster.bootstrap, "socket.connection.setup.timeout.ms": 5000, "log_level": 0}
        )
        image = self.cluster.observe().image
        topic = image.topics.by_name.get(self.topic)
        partitions = [] if topic is None else [TopicPartition(self.topic, index) for index in sorted(topic.partitions)]
        if partitions:
            # No request_timeout: confluent-kafka 2.16's binding fails on any keyword argument to elect_leaders.
            future = admin.elect_leaders(ElectionType.PREFERRED, partitions)
            try:
                future.result(timeout=30)
            except Exception:  # ELECTION_NOT_NEEDED and the like: the churn is best-effort
                pass


def _signal(broker: QuorumBroker, signum: signal.Signals) -> None:
    try:
        os.kill(broker.pid, signum)
    except (ProcessLookupError, AssertionError):  # not running (any more): nothing to stop or continue
        pass
