"""Every client family through broker failures of a kbroker cluster (issue #29): an idempotent acks=all producer and
a consumer group member run while each broker in turn gets a controlled shutdown and a restart (a rolling restart,
the ISR full again before the next), then while a partition leader is killed with SIGKILL and restarted.

Safety only, never timing (2 busy cores): every acknowledged record is in the topic once, at the offset it was
acknowledged with, in send order per partition (the idempotent producer's retries add no duplicate); the group
member reads every acknowledged record, and reads one again only after a rewind to the group's committed offset,
never below it; the committed offset of a partition, read back after every commit, never goes back.

The clients are the compat suite's adapters (compat/clients), each family in processes of its own: one for the
producer, one for the consumer, driven from threads of the test while its main thread takes brokers down. All
families run at once, each with a topic and a group of its own, through one rolling restart and one leader kill
(one disturbance instead of one per family keeps the module short); each family's properties are checked afterwards
and a failure names the family."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from compat.clients import ClientUnavailable, all_client_specs
from compat.clients.api import ClientError
from compat.clients.remote import ClientProcessError, RemoteClient
from kbroker.pytest_plugin import KbrokerCluster
from tools.faultsuite.workload import committed_offsets

FAMILIES = ["java-3.9", "java-4.4", "confluent-kafka", "kafka-python-3", "kafka-python-2", "aiokafka"]
SPECS = {spec.name: spec for spec in all_client_specs() if spec.name in FAMILIES}
PARTITIONS = 3
BATCH = 10  # records per producer_send: each call returns once all of them are acknowledged (or failed)
PAUSE = 0.2  # seconds between batches: a modest stream, the machine is shared
WITHIN = 120.0  # seconds: a bound against hanging on 2 busy cores, not a measure
SETTLE = 15.0  # seconds of traffic let through each degraded state (a bound on a wait, nothing asserted on it)
CONSUMER_SETTINGS = {"session_timeout_ms": 30000, "heartbeat_interval_ms": 1000}


def wait_for(what: str, found: Callable[[], Any], within: float = WITHIN, accept: Callable[[Any], bool] = bool) -> Any:
    deadline = time.monotonic() + within
    while not accept(answer := found()):
        assert time.monotonic() < deadline, f"no {what} within {within:g} s"
        time.sleep(0.2)
    return answer


def number(record: dict[str, Any]) -> int:
    return int(record["value"])


@dataclass
class Producing:
    """The producer's side: what was acknowledged, where; the batches that failed (their records may or may not
    have been written, each at most once)."""

    acknowledged: dict[int, tuple[int, int]] = field(default_factory=dict)  # number -> (partition, offset)
    failed: list[tuple[list[int], str]] = field(default_factory=list)  # (numbers, error)
    next_number: int = 0
    crashed: str | None = None


@dataclass
class Consuming:
    """The group member's side: every record in the order read, the committed offsets read back after each commit,
    and the commits that failed on the way (a rebalance, a moving coordinator)."""

    read: list[dict[str, Any]] = field(default_factory=list)
    committed: list[dict[int, int]] = field(default_factory=list)
    rewinds_below_commit: list[str] = field(default_factory=list)
    commit_errors: list[str] = field(default_factory=list)
    crashed: str | None = None


class Workload:
    """The producer and consumer threads of one family's run."""

    def __init__(self, producer: RemoteClient, consumer: RemoteClient, bootstrap: str, topic: str, group: str):
        self.producer, self.consumer, self.bootstrap = producer, consumer, bootstrap
        self.topic, self.group = topic, group
        self.producing, self.consuming = Producing(), Consuming()
        self.started = time.monotonic()
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        self.threads = [
            threading.Thread(target=self._produce, name="producer", daemon=True),
            threading.Thread(target=self._consume, name="consumer", daemon=True),
        ]

    def __enter__(self) -> Workload:
        self.handle = self.producer.producer_open(settings={"idempotent": True})
        self.member = self.consumer.consumer_open(group=self.group, topics=[self.topic], settings=CONSUMER_SETTINGS)
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_producing.set()
        self.stop_consuming.set()
        for thread in self.threads:
            thread.join(WITHIN + 60)

    def _produce(self) -> None:
        try:
            self._produce_until_stopped()
        except Exception as exc:  # reported by the test, not lost in a thread
            self.producing.crashed = repr(exc)

    def _produce_until_stopped(self) -> None:
        state = self.producing
        while not self.stop_producing.is_set():
            numbers = list(range(state.next_number, state.next_number + BATCH))
            state.next_number += BATCH
            records = [{"key": str(n), "value": str(n), "partition": n % PARTITIONS} for n in numbers]
            try:
                placed = self.producer.call("producer_send", timeout=WITHIN + 60, handle=self.handle, topic=self.topic,
                                            records=records)  # fmt: skip
            except ClientError as exc:
                state.failed.append((numbers, f"{self.at()} {exc}"))
                continue
            except ClientProcessError as exc:
                state.crashed = str(exc)
                return
            for n, (partition, offset) in zip(numbers, placed, strict=True):
                state.acknowledged[n] = (partition, offset)
            time.sleep(PAUSE)

    def at(self) -> str:
        """Seconds since the start, to place an event among the steps in a failure's message."""
        return f"{time.monotonic() - self.started:.1f}s"

    def produced(self) -> int:
        return len(self.producing.acknowledged)

    def _consume(self) -> None:
        try:
            self._consume_until_stopped()
        except Exception as exc:  # reported by the test, not lost in a thread
            self.consuming.crashed = repr(exc)

    def _consume_until_stopped(self) -> None:
        state = self.consuming
        last_committed: dict[int, int] = {}
        while not self.stop_consuming.is_set():
            try:
                polled = self.consumer.consumer_poll(handle=self.member, timeout_ms=500)["records"]
            except ClientError as exc:  # a poll's records are not handed over then: the run cannot be checked
                state.crashed = f"{self.at()} poll: {exc}"
                return
            except ClientProcessError as exc:
                state.crashed = str(exc)
                return
            for record in polled:
                partition, offset = record["partition"], record["offset"]
                if offset < last_committed.get(partition, 0):
                    state.rewinds_below_commit.append(
                        f"partition {partition} read at {offset} after {last_committed[partition]} was committed"
                    )
                state.read.append(record)
            try:
                self.consumer.consumer_commit(handle=self.member)
            except ClientError as exc:  # a rebalance or a moving coordinator: the next commit covers it
                state.commit_errors.append(f"{self.at()} {exc}")
                continue
            except ClientProcessError as exc:
                state.crashed = str(exc)
                return
            # Read back right after the commit: no later read may find a partition's committed offset lower.
            seen = wait_for(
                "an OffsetFetch answer",
                lambda: committed_offsets(self.bootstrap, self.group, self.topic, PARTITIONS),
                accept=lambda answer: answer is not None,
            )
            state.committed.append(seen)
            last_committed.update(seen)

    def consumed_through(self, ends: dict[int, int]) -> bool:
        """Whether the member has read every partition up to these end offsets and committed them."""
        if self.consuming.crashed or not self.consuming.committed:
            return bool(self.consuming.crashed)
        last = self.consuming.committed[-1]
        return all(last.get(p, 0) >= end for p, end in ends.items())


class Topology:
    """Leaders and ISRs as Metadata shows them (confluent-kafka's AdminClient in the test process)."""

    def __init__(self, bootstrap: str) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap})

    def partitions(self, topic: str) -> dict[int, Any]:
        try:
            described = self.admin.list_topics(topic, timeout=10).topics.get(topic)
        except KafkaException:
            return {}
        if described is None or described.error is not None:
            return {}
        return dict(described.partitions)

    def all_in_sync(self, *topics: str) -> bool:
        """Every partition of these topics led and with all 3 replicas in its ISR."""
        for topic in topics:
            partitions = self.partitions(topic)
            if not partitions or any(p.leader < 0 or len(p.isrs) != 3 for p in partitions.values()):
                return False
        return True


def start_clients(family: str, bootstrap: str) -> tuple[RemoteClient, RemoteClient] | str:
    """The family's producer and consumer processes, or why the family cannot run here."""
    try:
        producer = SPECS[family].start(bootstrap)
    except ClientUnavailable as exc:
        return str(exc)
    try:
        return producer, SPECS[family].start(bootstrap)
    except ClientUnavailable as exc:
        producer.close()
        return str(exc)


def wait_for_more(workloads: list[Workload], count: int) -> None:
    """Let some traffic of every family through before the next step; a bound, nothing asserted (the step may
    stall it)."""
    goals = [(work, work.produced() + count) for work in workloads]
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline and any(
        work.produced() < goal and not work.producing.crashed for work, goal in goals
    ):
        time.sleep(0.1)


@dataclass
class Outcome:
    """One family's run, checked after the shared disturbance."""

    work: Workload
    ends: dict[int, int] = field(default_factory=dict)
    topic_now: dict[int, list[dict[str, Any]]] = field(default_factory=dict)


def finish(work: Workload) -> Outcome:
    """Stop the family's producer, send a last record to each partition (the whole cluster is back: it must be
    acknowledged), wait for the member to read and commit everything, then read the topic back."""
    outcome = Outcome(work)
    work.stop_producing.set()
    work.threads[0].join(WITHIN + 60)
    last = list(range(work.producing.next_number, work.producing.next_number + PARTITIONS))
    final = work.producer.producer_send(handle=work.handle, topic=work.topic, records=[
        {"key": str(n), "value": str(n), "partition": n % PARTITIONS} for n in last
    ])  # fmt: skip
    work.producing.acknowledged.update((n, (p, o)) for n, (p, o) in zip(last, final, strict=True))
    outcome.ends = {p: offset + 1 for p, offset in final}
    wait_for("the member to read and commit everything", lambda: work.consumed_through(outcome.ends))
    work.stop_consuming.set()
    work.threads[1].join(WITHIN + 60)
    outcome.topic_now = {p: work.consumer.read(topic=work.topic, partition=p, offset=0, count=outcome.ends[p],
                                               settings={"timeout_ms": 20000}) for p in range(PARTITIONS)}  # fmt: skip
    return outcome


def check(family: str, outcome: Outcome, steps: list[str]) -> None:
    """The family's safety properties; an AssertionError names what broke."""
    work, ends, topic_now = outcome.work, outcome.ends, outcome.topic_now
    producing, consuming = work.producing, work.consuming
    summary = (
        f"{len(producing.acknowledged)} acknowledged, {len(producing.failed)} batches failed "
        f"{[e for _, e in producing.failed][:3]}, {len(consuming.read)} read, {len(consuming.committed)} commits, "
        f"commit errors {consuming.commit_errors[:3]}; {steps}"
    )
    print(f"{family}: {summary}")
    assert producing.crashed is None and consuming.crashed is None, (
        f"{producing.crashed} {consuming.crashed}; {summary}"
    )

    # The topic: each partition holds its records in send order, each number once, every acknowledged one at the
    # offset it was acknowledged with; a number of a failed batch at most once.
    failed = {n for numbers, _ in producing.failed for n in numbers}
    at: dict[tuple[int, int], int] = {}
    for p, records in topic_now.items():
        offsets = [r["offset"] for r in records]
        assert offsets == list(range(ends[p])), f"partition {p}: offsets {offsets[:5]}...{offsets[-5:]}; {summary}"
        numbers = [number(r) for r in records]
        assert numbers == sorted(set(numbers)), f"partition {p} out of order or twice: {numbers}; {summary}"
        assert all(n % PARTITIONS == p for n in numbers), summary
        at.update(((p, r["offset"]), number(r)) for r in records)
    in_topic = set(at.values())
    assert len(in_topic) == len(at), summary  # no number in two partitions
    assert in_topic <= set(producing.acknowledged) | failed, summary
    misplaced = {n: at.get(place) for n, place in producing.acknowledged.items() if at.get(place) != n}
    assert misplaced == {}, f"acknowledged numbers not at their offsets: {misplaced}; {summary}"

    # The member: every record read is the topic's at that offset; every acknowledged one read; a record read again
    # only after a rewind to the committed offset, never below it.
    assert all(at.get((r["partition"], r["offset"])) == number(r) for r in consuming.read), summary
    assert set(producing.acknowledged.values()) <= {(r["partition"], r["offset"]) for r in consuming.read}, summary
    assert consuming.rewinds_below_commit == [], f"{consuming.rewinds_below_commit[:3]}; {summary}"
    # Committed offsets, read back after each commit, never go back; the last one is each partition's end.
    for earlier, later in zip(consuming.committed, consuming.committed[1:], strict=False):
        went_back = {p: (earlier[p], later.get(p)) for p in earlier if later.get(p, -1) < earlier[p]}
        assert went_back == {}, f"committed offsets went back: {went_back}; {summary}"
    assert consuming.committed[-1] == ends, summary


def in_parallel(function: Callable[[str], Any], families: list[str]) -> dict[str, Any]:
    """``function(family)`` for every family at once (client processes start and finish concurrently); an
    exception is returned as its repr."""
    results: dict[str, Any] = {}

    def run(family: str) -> None:
        try:
            results[family] = function(family)
        except Exception as exc:  # reported per family by the test
            results[family] = repr(exc)

    threads = [threading.Thread(target=run, args=(family,), daemon=True) for family in families]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WITHIN + 120)
    return results


def test_every_family_through_one_rolling_restart_and_leader_kill(kbroker_cluster: KbrokerCluster) -> None:
    """All families produce and consume at once, each with its own topic and group, through one rolling restart and
    one leader kill; each family's properties are checked afterwards and failures reported per family."""
    cluster = kbroker_cluster
    topics = {family: f"failover-{family}" for family in FAMILIES}
    topology = Topology(cluster.bootstrap)
    created = topology.admin.create_topics([
        NewTopic(topic, num_partitions=PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
        for topic in topics.values()
    ])  # fmt: skip
    for future in created.values():
        future.result(WITHIN)
    wait_for("a full ISR", lambda: topology.all_in_sync(*topics.values()))

    clients = in_parallel(lambda family: start_clients(family, cluster.bootstrap), FAMILIES)
    unavailable = {family: why for family, why in clients.items() if isinstance(why, str)}
    running = [family for family in FAMILIES if family not in unavailable]
    if not running:
        pytest.skip(f"no client family available: {unavailable}")
    workloads: dict[str, Workload] = {}
    outcomes: dict[str, Outcome | str] = {}
    steps: list[str] = []
    started = time.monotonic()

    def at() -> str:
        return f"{time.monotonic() - started:.1f}s"

    try:
        for family in running:
            producer, consumer = clients[family]
            work = Workload(producer, consumer, cluster.bootstrap, topics[family], f"failover-group-{family}")
            workloads[family] = work.__enter__()
        every = list(workloads.values())
        wait_for_more(every, 50)
        in_sync = (*topics.values(), "__consumer_offsets")
        # (a) A rolling restart: each broker a controlled shutdown, back, the ISR full again before the next.
        for broker in cluster.brokers:
            broker.stop()
            steps.append(f"{at()} stopped broker {broker.node_id}")
            wait_for_more(every, 30)
            broker.start()
            wait_for("a full ISR again", lambda: topology.all_in_sync(*in_sync))
            steps.append(f"{at()} restarted broker {broker.node_id}")
            wait_for_more(every, 30)
        # (b) kill -9 of the leader of partition 0 of the first family's topic, then a restart.
        first = topics[running[0]]
        leader = cluster.broker(wait_for("a leader", lambda: topology.partitions(first)[0].leader))
        leader.kill()
        steps.append(f"{at()} killed broker {leader.node_id}")
        wait_for_more(every, 30)
        leader.start()
        wait_for("a full ISR again", lambda: topology.all_in_sync(*in_sync))
        steps.append(f"{at()} killed and restarted leader {leader.node_id}")
        wait_for_more(every, 50)
        outcomes = in_parallel(lambda family: finish(workloads[family]), running)
    finally:
        for work in workloads.values():
            work.__exit__(None, None, None)
        for family in running:
            for client in clients[family]:
                client.close()

    failures: dict[str, str] = {}
    for family in running:
        outcome = outcomes.get(family, "not finished")
        if isinstance(outcome, str):
            failures[family] = f"finishing the run: {outcome}; {workloads[family].producing.crashed}"
            continue
        try:
            check(family, outcome, steps)
        except AssertionError as exc:
            failures[family] = str(exc)
    assert failures == {}, "\n".join(f"{family}: {failure}" for family, failure in failures.items())
    if unavailable:
        pytest.skip(f"checked {running}; not available here: {unavailable}")
