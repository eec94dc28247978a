"""The fault suite's clients: producers and consumers on threads, each operation written to the history.

Every value is a unique integer (one counter for the run), sent to one partition of the suite's topic:

- plain producers: idempotent, acks=all; one value per operation, waited for until its delivery report
  (``ok`` with its offset, or ``info`` on any error: an idempotent producer's failed delivery may still be in the
  log). A producer whose error is fatal is replaced.
- a transactional producer: a transaction of one to three values, committed (or, one time in ten, aborted on
  purpose). ``ok`` once ``commit_transaction`` returned, with the offsets the delivery reports gave; ``fail`` once
  ``abort_transaction`` returned; ``info`` when the end is unknown (a commit that kept failing, a fatal error).
  ``commit_at`` is when the commit was asked for.
- assigned consumers, one read_committed and one read_uncommitted, reading every partition from the start.
- group members (read_committed, subscribe) that commit what they read after each poll; an assignment change
  marks the next poll ``reset`` (the member may read again from the committed offsets).
- a reader of the group's committed offsets (FindCoordinator and OffsetFetch over kbroker's wire client, not
  librdkafka's admin client, which crashes on NOT_COORDINATOR: confluentinc/librdkafka#5040).

At the end, ``final_read`` reads every partition from the start to its high watermark with a fresh consumer at
each isolation level and writes it as polls marked ``final``: the checker then wants every acknowledged value.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from kbroker.wire_client import WireClient
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from tools.faultsuite.history import FAIL, INFO, OK, History

DELIVERY_SECONDS = 30.0  # librdkafka's message.timeout.ms below, and a margin: every send's fate is reported
POLL_SECONDS = 1.0
COMMON = {
    "client.id": "faultsuite",
    "socket.connection.setup.timeout.ms": 5000,
    "reconnect.backoff.max.ms": 1000,
    "log_level": 3,  # librdkafka's errors only: a broker going away is the point of the run, not news
    "log.connection.close": False,
}
PRODUCER = {
    **COMMON,
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 1,
    "message.timeout.ms": 25000,
    "request.timeout.ms": 5000,
}
CONSUMER = {
    **COMMON,
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "session.timeout.ms": 10000,
    "heartbeat.interval.ms": 1000,
    "fetch.wait.max.ms": 200,
}


class Workload:
    """The client threads of one run; ``stop()`` ends them after their current operation."""

    def __init__(
        self,
        history: History,
        bootstrap: str,
        topic: str,
        partitions: int,
        seed: int,
        *,
        producers: int = 2,
        transactional: int = 1,
        group_members: int = 2,
        group: str = "faultsuite",
    ) -> None:
        self.history, self.bootstrap, self.topic, self.partitions = history, bootstrap, topic, partitions
        self.group = group
        self.random = random.Random(seed)
        self._values = itertools.count(1)
        self._values_lock = threading.Lock()
        self._stop = threading.Event()
        self.errors: list[str] = []  # a thread that died of an unexpected error: the run is not valid
        plans: list[tuple[str, Callable[[str, random.Random], None]]] = []
        plans += [(f"producer-{i}", self._produce) for i in range(producers)]
        plans += [(f"txn-{i}", self._produce_transactions) for i in range(transactional)]
        plans += [("assigned-rc", self._read_assigned), ("assigned-ru", self._read_assigned)]
        plans += [(f"member-{i}", self._read_in_group) for i in range(group_members)]
        plans += [("committed", self._read_committed_offsets)]
        self.threads = [
            threading.Thread(target=self._guarded, args=(name, run, self.random.randrange(2**32)), name=name)
            for name, run in plans
        ]

    def start(self) -> Workload:
        for thread in self.threads:
            thread.start()
        return self

    def stop(self, timeout: float = DELIVERY_SECONDS + 30) -> None:
        self._stop.set()
        for thread in self.threads:
            thread.join(timeout)
        alive = [thread.name for thread in self.threads if thread.is_alive()]
        if alive:
            self.errors.append(f"client threads still running after {timeout:g} s: {', '.join(alive)}")

    def _guarded(self, name: str, run: Callable[[str, random.Random], None], seed: int) -> None:
        try:
            run(name, random.Random(seed))
        except Exception as exc:  # recorded and reported: the run's clients must not fail silently
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")

    def _next_value(self) -> int:
        with self._values_lock:
            return next(self._values)

    # --- producers ------------------------------------------------------------------------------------------

    def _produce(self, name: str, rng: random.Random) -> None:
        producer = Producer({**PRODUCER, "bootstrap.servers": self.bootstrap})
        while not self._stop.is_set():
            partition, value = rng.randrange(self.partitions), self._next_value()
            invoked = self.history.invoke(name, "send", [[partition, value]])
            reports: list[tuple[KafkaError | None, int]] = []
            try:
                producer.produce(
                    self.topic,
                    value=str(value).encode(),
                    partition=partition,
                    on_delivery=partial(_report_into, reports),
                )
            except KafkaException as exc:  # a fatal error already raised (e.g. a sequence the broker lost): unsent
                self.history.complete(invoked, FAIL, error=str(exc.args[0]))
                producer = Producer({**PRODUCER, "bootstrap.servers": self.bootstrap})
                continue
            deadline = time.monotonic() + DELIVERY_SECONDS
            while not reports and time.monotonic() < deadline:
                producer.poll(0.1)
            error = reports[0][0] if reports else None
            if reports and error is None:
                self.history.complete(invoked, OK, [[partition, value, reports[0][1]]])
            else:
                self.history.complete(invoked, INFO, error=str(error) if reports else "no delivery report")
                if error is not None and error.fatal():
                    producer = Producer({**PRODUCER, "bootstrap.servers": self.bootstrap})
        producer.flush(DELIVERY_SECONDS)

    def _transactional_producer(self, name: str) -> Producer:
        producer = Producer({**PRODUCER, "bootstrap.servers": self.bootstrap, "transactional.id": f"faultsuite-{name}"})
        while not self._stop.is_set():
            try:
                producer.init_transactions(DELIVERY_SECONDS)
                return producer
            except KafkaException as exc:
                if exc.args[0].fatal():
                    producer = Producer(
                        {**PRODUCER, "bootstrap.servers": self.bootstrap, "transactional.id": f"faultsuite-{name}"}
                    )
                time.sleep(0.5)
        return producer

    def _produce_transactions(self, name: str, rng: random.Random) -> None:
        producer = self._transactional_producer(name)
        while not self._stop.is_set():
            sends = [[rng.randrange(self.partitions), self._next_value()] for _ in range(rng.randint(1, 3))]
            invoked = self.history.invoke(name, "send", sends, txn=True)
            offsets: dict[int, int] = {}
            delivered = partial(_offset_into, offsets)
            commit_at: float | None = None
            try:
                producer.begin_transaction()
                for partition, value in sends:
                    producer.produce(self.topic, value=str(value).encode(), partition=partition, on_delivery=delivered)
                if rng.random() < 0.1:
                    producer.abort_transaction(DELIVERY_SECONDS)
                    self.history.complete(invoked, FAIL, aborted="on purpose")
                    continue
                commit_at = self.history.now()
                producer.commit_transaction(DELIVERY_SECONDS)
                triples = [[partition, value, offsets.get(value)] for partition, value in sends]
                self.history.complete(invoked, OK, triples, commit_at=commit_at)
            except KafkaException as exc:
                error = exc.args[0]
                more = {"error": str(error)} if commit_at is None else {"error": str(error), "commit_at": commit_at}
                if error.txn_requires_abort():
                    try:
                        producer.abort_transaction(DELIVERY_SECONDS)
                        self.history.complete(invoked, FAIL, **more)
                        continue
                    except KafkaException as abort_failure:
                        more["abort_error"] = str(abort_failure.args[0])
                self.history.complete(invoked, INFO, **more)
                # Whatever state the producer is in, a new one (same transactional id) fences it and ends its
                # transaction: the next InitProducerId aborts or completes what was open.
                producer = self._transactional_producer(name)
        producer.flush(DELIVERY_SECONDS)

    # --- consumers ------------------------------------------------------------------------------------------

    def _read_assigned(self, name: str, rng: random.Random) -> None:
        isolation = "read_committed" if name.endswith("rc") else "read_uncommitted"
        consumer = Consumer(
            {
                **CONSUMER,
                "bootstrap.servers": self.bootstrap,
                "group.id": f"unused-{name}",
                "isolation.level": isolation,
            }
        )
        assignment = [TopicPartition(self.topic, p, 0) for p in range(self.partitions)]
        invoked = self.history.invoke(name, "assign", list(range(self.partitions)))
        consumer.assign(assignment)
        self.history.complete(invoked, OK)
        try:
            while not self._stop.is_set():
                self._poll(name, consumer, isolation)
        finally:
            consumer.close()

    def _read_in_group(self, name: str, rng: random.Random) -> None:
        changed = threading.Event()
        consumer = Consumer(
            {
                **CONSUMER,
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "isolation.level": "read_committed",
            }
        )
        consumer.subscribe(
            [self.topic], on_assign=lambda c, parts: changed.set(), on_revoke=lambda c, parts: changed.set()
        )
        try:
            while not self._stop.is_set():
                read = self._poll(name, consumer, "read_committed", changed)
                if read:
                    self._commit(name, consumer, {p: records[-1][0] + 1 for p, records in read.items()})
        finally:
            consumer.close()

    def _poll(
        self, name: str, consumer: Consumer, isolation: str, changed: threading.Event | None = None
    ) -> dict[int, list[list[int]]]:
        invoked = self.history.invoke(name, "poll", isolation=isolation)
        read: dict[int, list[list[int]]] = {}
        try:
            messages = consumer.consume(200, POLL_SECONDS)
        except KafkaException as exc:
            self.history.complete(invoked, INFO, error=str(exc.args[0]))
            return read
        errors = []
        for message in messages:
            if message.error() is not None:
                errors.append(str(message.error()))
                continue
            partition, offset, value = _record(message)
            read.setdefault(partition, []).append([offset, value])
        more: dict[str, Any] = {"errors": errors} if errors else {}
        if changed is not None and changed.is_set():
            changed.clear()
            more["reset"] = True  # the assignment changed since the last poll: reading from committed offsets
        self.history.complete(invoked, OK, {str(p): records for p, records in read.items()}, **more)
        return read

    def _commit(self, name: str, consumer: Consumer, offsets: dict[int, int]) -> None:
        invoked = self.history.invoke(name, "commit", {str(p): o for p, o in offsets.items()}, group=self.group)
        wanted = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
        try:
            answered = consumer.commit(offsets=wanted, asynchronous=False) or []
        except KafkaException as exc:
            self.history.complete(invoked, INFO, error=str(exc.args[0]))
            return
        failed = [f"{tp.partition}: {tp.error}" for tp in answered if tp.error is not None]
        if failed:
            self.history.complete(invoked, INFO, error="; ".join(failed))
        else:
            self.history.complete(invoked, OK)

    def _read_committed_offsets(self, name: str, rng: random.Random) -> None:
        while not self._stop.wait(0.5):
            invoked = self.history.invoke(name, "committed", group=self.group)
            offsets = committed_offsets(self.bootstrap, self.group, self.topic, self.partitions)
            if offsets is None:
                self.history.complete(invoked, INFO)
            else:
                self.history.complete(invoked, OK, {str(p): o for p, o in offsets.items()})

    # --- the end --------------------------------------------------------------------------------------------

    def final_read(self, timeout: float = 120.0) -> None:
        """Every partition read to its high watermark at both isolation levels, as polls marked ``final``."""
        for isolation in ("read_uncommitted", "read_committed"):
            name = f"final-{isolation}"
            consumer = Consumer(
                {**CONSUMER, "bootstrap.servers": self.bootstrap, "group.id": name, "isolation.level": isolation}
            )
            try:
                ends = {}
                for partition in range(self.partitions):
                    _, high = consumer.get_watermark_offsets(TopicPartition(self.topic, partition), timeout=30)
                    ends[partition] = high
                invoked = self.history.invoke(name, "assign", list(range(self.partitions)))
                consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
                self.history.complete(invoked, OK)
                positions = dict.fromkeys(ends, 0)
                deadline = time.monotonic() + timeout
                while any(positions[p] < ends[p] for p in ends):
                    if time.monotonic() > deadline:
                        behind = {p: (positions[p], ends[p]) for p in ends if positions[p] < ends[p]}
                        raise TimeoutError(f"{name}: not read to the end within {timeout:g} s: {behind}")
                    invoked = self.history.invoke(name, "poll", isolation=isolation, final=True)
                    read: dict[str, list[list[int]]] = {}
                    for message in consumer.consume(500, POLL_SECONDS):
                        if message.error() is None:
                            partition, offset, value = _record(message)
                            read.setdefault(str(partition), []).append([offset, value])
                            positions[partition] = offset + 1
                    for partition in ends:  # read_committed skips markers and aborted records: ask where it is
                        position = consumer.position([TopicPartition(self.topic, partition)])[0].offset
                        if position >= 0:
                            positions[partition] = max(positions[partition], position)
                    self.history.complete(invoked, OK, read)
            finally:
                consumer.close()


def _record(message: Message) -> tuple[int, int, int]:
    """A consumed record's partition, offset and value (the suite's values are decimal integers)."""
    partition, offset, value = message.partition(), message.offset(), message.value()
    assert partition is not None and offset is not None and value is not None, "a record without a place or value"
    return partition, offset, int(value)


def _report_into(reports: list[tuple[KafkaError | None, int]], error: KafkaError | None, message: Any) -> None:
    """A delivery report, into the list of the send it belongs to (bound per send: a late one cannot stray)."""
    reports.append((error, message.offset()))


def _offset_into(offsets: dict[int, int], error: KafkaError | None, message: Any) -> None:
    """A transactional send's delivery report: its value's offset, into its own transaction's map."""
    if error is None:
        offsets[int(message.value())] = message.offset()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int] | None:
    """The group's committed offsets (FindCoordinator, then OffsetFetch at the coordinator); None when no broker
    answered without an error (the coordinator is moving)."""
    for address in bootstrap.split(","):
        try:
            with WireClient(address, timeout=5) as client:
                found = client.request(FindCoordinatorRequest(key=group, key_type=0), 3)
            if found.error_code:
                continue
            wanted = OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=list(range(partitions)))
            with WireClient(f"{found.host}:{found.port}", timeout=5) as client:
                answer = client.request(OffsetFetchRequest(group_id=group, topics=[wanted], require_stable=True), 7)
        except (OSError, ConnectionError):
            continue
        entries = [p for t in answer.topics for p in t.partitions]
        if answer.error_code or any(p.error_code for p in entries):
            continue
        return {p.partition_index: p.committed_offset for p in entries if p.committed_offset >= 0}
    return None
