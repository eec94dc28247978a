"""The replicas this broker holds: Kafka's ReplicaManager, between the request handlers and the logs.

It owns a ``Partition`` (kbroker/replication/partition.py) per partition log it was asked for, made on first
use (logs open lazily) and told its role by the ``LeadershipSource`` (kbroker/replication/registration.py);
``apply`` takes a new registration (become leader, become follower) and ``stop`` drops a replica. Produce and
fetch reach the logs through it (``RequestContext.replicas``): appends as leader with Kafka's acks semantics
(``await_acks`` waits, on the partitions' events, until the high watermark passes each batch, or answers
REQUEST_TIMED_OUT at the produce timeout), and fetches read up to the high watermark (consumers) or the log end
(replicas, whose position is recorded).

The ISR changes the leaders propose (a follower caught up, or lagging past replica.lag.time.max.ms, see
partition.py) are sent to the controller here, one at a time, as Kafka's AlterPartitionManager sends them: the
followers' fetches propose expansions as they come, and ``run`` checks for lagging followers every half
replica.lag.time.max.ms (Kafka's isr-expiration task). The controller answers by publishing the new
registration, which ``apply_delta`` applies like any other.

A follower fetches from its leader through the replica fetchers (kbroker/replication/fetcher.py), when the
ReplicaManager is given a ``ReplicaFetcherManager``: each registration that makes a partition a follower moves it
to its leader's fetcher, and one that makes it lead, leaves it leaderless or stops it takes it out. A follower's
log is opened as its registration arrives (a leader's opens lazily, on first use), and the fetchers run in
``run``'s nursery.

Under a KRaft quorum a restarted broker's image, replayed from its own metadata log, may be stale: the
ReplicaManager is then made with ``acting=False`` and holds its replicas without a role (no leader, no fetching,
no truncation, no coordinator shard) until the broker has caught up with the quorum; ``start_acting`` then gives
it the current image as one delta, as Kafka's broker publishes its first image only after its initial catch-up.

The high watermarks are checkpointed in ``replication-offset-checkpoint`` (Kafka's file and layout) every
replica.high.watermark.checkpoint.interval.ms and at shutdown; a log reopened after a restart starts from its
checkpointed high watermark (bounded by its log), and one the file does not name from its log start, as Kafka's.
A leader with no other replica then moves it to its log end at once. A damaged file stops start-up with one
line, where Kafka takes the log directory offline (and a broker whose only directory is offline stops).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

import trio

from kbroker.replication.fetcher import ReplicaFetcherManager
from kbroker.replication.partition import (
    REPLICA_LAG_TIME_MAX_MS,
    IsrEligibility,
    IsrProposal,
    Partition,
    always_eligible,
)
from kbroker.replication.registration import LeadershipSource, LocalChanges, Registration
from kbroker.storage import LogManager, PartitionEvent, PartitionLog
from kbroker.storage.checkpoints import read_offset_checkpoint, write_offset_checkpoint
from protocol.errors import ErrorCode, KafkaError

log = logging.getLogger("kbroker.replication")

HIGH_WATERMARK_FILE = "replication-offset-checkpoint"

TopicPartition = tuple[str, int]


class Answer(Protocol):
    """Where a waiting partition's outcome goes (a produce response's partition answer)."""

    error_code: int


# One acks=all partition still waiting: its replica, the offset its high watermark must reach, its answer.
PendingAck = tuple[Partition, int, Answer]
# Sends one partition's ISR change to the controller (Kafka's AlterPartition); raises KafkaError if refused.
AlterPartition = Callable[[Partition, IsrProposal], Awaitable[None]]


def read_high_watermarks(data_dir: Path) -> dict[TopicPartition, int]:
    """The checkpointed high watermarks ({} without the file); DamagedFileError for a damaged one."""
    return read_offset_checkpoint(data_dir / HIGH_WATERMARK_FILE)


def _now_ms() -> int:
    return int(time.time() * 1000)


class ReplicaManager:
    def __init__(
        self,
        logs: LogManager,
        local_broker_id: int,
        leadership: LeadershipSource,
        data_dir: Path,
        *,
        checkpointed: Mapping[TopicPartition, int] | None = None,
        checkpoint_interval_ms: int = 5000,
        lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS,
        alter_partition: AlterPartition | None = None,
        eligible: IsrEligibility = always_eligible,
        clock: Callable[[], int] = _now_ms,
        fetchers: ReplicaFetcherManager | None = None,
        acting: bool = True,
    ) -> None:
        """``alter_partition``: where ISR changes go (None: the ISR is only what registrations say);
        ``eligible``: which brokers may join an ISR; ``clock``: wall-clock milliseconds (follower lag);
        ``fetchers``: where followers fetch from their leaders (None: followers only take what they are given);
        ``acting``: False to hold every replica without a role until ``start_acting`` (see there)."""
        self.logs = logs
        # Whether registrations are acted on: a broker under a KRaft quorum replays an image that may be stale (it
        # may still lead partitions it lost while down), so, as Kafka's broker installs its metadata publishers only
        # once caught up with the quorum, its replicas take no role, fetch nothing and truncate nothing until then.
        self.acting = acting
        self.local_broker_id = local_broker_id
        self.leadership = leadership
        self.checkpoint_path = data_dir / HIGH_WATERMARK_FILE
        self.checkpoint_interval_ms = checkpoint_interval_ms
        # What the file said at start-up, kept for partitions not opened this run (so rewriting loses none).
        self._checkpointed = dict(checkpointed or {})
        self._partitions: dict[TopicPartition, Partition] = {}
        self._leadership_listeners: set[Callable[[], None]] = set()  # acks=all waits, woken by a change of role
        # Told of each change of role a registration or a stop makes (the coordinator runtimes load and unload).
        self._role_listeners: list[Callable[[Partition], None]] = []
        self.lag_time_max_ms = lag_time_max_ms
        self.clock = clock
        self._alter_partition = alter_partition
        self._eligible = eligible
        self._proposals: dict[TopicPartition, Partition] = {}  # ISR changes proposed, not yet sent
        # ISR changes the controller accepted and refused (Kafka's IsrShrinksPerSec, IsrExpandsPerSec and
        # FailedIsrUpdatesPerSec meters, counted as its Partition marks them: once the controller answered).
        self.isr_shrinks = 0
        self.isr_expands = 0
        self.failed_isr_updates = 0
        self._proposed = trio.Event()  # set when one is added
        self.fetchers = fetchers
        self._followers_to_open: set[TopicPartition] = set()  # followed partitions whose logs are not open yet
        self._to_open = trio.Event()  # set when one is added, or a delta gives this broker partitions
        # Makes the files of partitions an image gave this broker (the topic service's; None: logs in memory).
        self.build_logs: Callable[[], Awaitable[None]] | None = None

    def held(self, topic: str, index: int) -> Partition | None:
        """The replica of a partition if it is held already (no log is opened)."""
        return self._partitions.get((topic, index))

    # --- partitions ----------------------------------------------------------------------------------

    def partition(self, topic: str, index: int) -> Partition | None:
        """The replica of a partition (its log opened on first use); None if there is no such partition, or the
        image places it on other brokers only.

        Raises KafkaError KAFKA_STORAGE_ERROR if its files cannot be opened.
        """
        partition = self._partitions.get((topic, index))
        if partition is not None:
            return partition
        if not self._assigned_here(topic, index):
            return None  # another broker's partition: no replica here, its log not opened (nor made)
        plog = self.logs.get_partition(topic, index)
        if plog is None:
            return None
        return self._partitions.get((topic, index)) or self.adopt(plog)

    def adopt(self, plog: PartitionLog) -> Partition:
        """Hold ``plog``'s replica and give it the role its registration says (called as a log is opened)."""
        key = (plog.topic, plog.partition)
        partition = self._partitions.get(key)
        if partition is not None and partition.log is plog:
            return partition
        partition = Partition(
            plog.topic,
            plog.partition,
            plog,
            self.local_broker_id,
            lag_time_max_ms=self.lag_time_max_ms,
            eligible=self._eligible,
            submit=self._submit if self._alter_partition is not None else None,
        )
        self._partitions[key] = partition
        registration = self.leadership.partition(plog.topic, plog.partition)
        if self.acting and registration is not None and self.local_broker_id in registration.replicas:
            self._apply(partition, registration)
        return partition

    def _assigned_here(self, topic: str, index: int) -> bool:
        """Whether this broker is one of the partition's registered replicas (a partition the leadership source
        does not know yet is taken as this broker's: its registration comes when the log is opened)."""
        registration = self.leadership.partition(topic, index)
        return registration is None or self.local_broker_id in registration.replicas

    def apply(self, topic: str, index: int, registration: Registration) -> None:
        """A new registration for a partition: become its leader or a follower (Kafka's applyDelta)."""
        partition = self.partition(topic, index)
        if partition is not None and self.acting:
            self._apply(partition, registration)
            self._role_changed(partition)
            self._leadership_changed()

    def apply_delta(self, changes: LocalChanges) -> None:
        """A metadata delta's changes to this broker's replicas, as Kafka's ReplicaManager.applyDelta: the
        partitions held become leader or follower as registered, and those no longer here stop. A partition
        whose log is not open yet takes its registration from the leadership source when it is opened. Until the
        replicas act (``start_acting``) only the stops are applied: the image they start from covers the rest."""
        if not self.acting:
            for topic, index in sorted(changes.deletes):
                self.stop(topic, index)
            return
        changed = False
        for registrations in (changes.leaders, changes.followers):
            for key, registration in registrations.items():
                partition = self._partitions.get(key)
                if partition is not None:
                    self._apply(partition, registration)
                    self._role_changed(partition)
                    changed = True
                elif registrations is changes.followers:
                    self._followers_to_open.add(key)
        if changes.leaders or changes.followers:
            self._to_open.set()
        for topic, index in sorted(changes.deletes):
            self.stop(topic, index)
        if changed:
            self._leadership_changed()

    def on_role_change(self, listener: Callable[[Partition], None]) -> None:
        """Call ``listener`` with each partition a registration or a stop changes (a stopped one is a follower
        without a leader)."""
        self._role_listeners.append(listener)

    def _role_changed(self, partition: Partition) -> None:
        for listener in self._role_listeners:
            listener(partition)

    def _apply(self, partition: Partition, registration: Registration) -> None:
        if registration.leader == self.local_broker_id:
            partition.make_leader(registration, self.clock())
            if self.fetchers is not None:
                self.fetchers.unfollow(partition.topic, partition.index)
        else:
            partition.make_follower(registration)
            if self.fetchers is not None:
                self.fetchers.follow(partition)  # a leaderless one is taken out of its fetcher

    def open_followers(self, keys: Iterable[TopicPartition]) -> None:
        """Open these followed partitions' logs (in ``run``), so their fetchers start: a follower's log must be
        open to fetch into (the broker names those its image makes it follow at start-up)."""
        self._followers_to_open.update(keys)
        if self._followers_to_open and self.acting:
            self._to_open.set()

    def start_acting(self, changes: LocalChanges) -> None:
        """Act on registrations from now on, starting from ``changes``: every partition the current image places on
        this broker, as one delta from an empty image (Kafka's loader publishes its first image so). The replicas
        held meanwhile take their current registration once; those it does not name are no longer here and stop;
        followed partitions not held yet are opened and fetch from their current leaders."""
        if self.acting:
            return
        self.acting = True
        placed = changes.leaders.keys() | changes.followers.keys()
        for topic, index in sorted(self._partitions.keys() - placed):
            self.stop(topic, index)
        self.apply_delta(changes)
        if self._followers_to_open:
            self._to_open.set()

    async def _open_followed(self) -> None:
        """Open the followed partitions' logs as registrations name them (after the delta is applied whole, when
        the log store knows a new topic too, and the files of new partitions are made); opening one applies its
        registration, which starts its fetching."""
        while True:
            await self._to_open.wait()
            self._to_open = trio.Event()
            if self.build_logs is not None:
                await self.build_logs()
            still_building: list[TopicPartition] = []
            while self._followers_to_open:
                topic, index = self._followers_to_open.pop()
                if (topic, index) in self._partitions:
                    continue
                try:
                    if self.partition(topic, index) is None and self.logs.is_building(topic, index):
                        # A create on this broker is making its files: opened once they are (open_followers).
                        still_building.append((topic, index))
                except KafkaError as exc:
                    log.error("%s-%d: the follower's log cannot be opened: %s", topic, index, exc.message)
                await trio.sleep(0)  # many partitions: other tasks run between them
            self._followers_to_open.update(still_building)

    def stop(self, topic: str, index: int) -> None:
        """Stop being a replica of the partition (deleted, or moved away); its log is left to the log store."""
        stopped = self._partitions.pop((topic, index), None)
        self._followers_to_open.discard((topic, index))
        if self.fetchers is not None:
            self.fetchers.unfollow(topic, index)
        if stopped is not None:
            stopped.stop()
            self._role_changed(stopped)
            self._leadership_changed()
        self._checkpointed.pop((topic, index), None)

    def stop_topic(self, topic: str, partitions: int) -> None:
        for index in range(partitions):
            self.stop(topic, index)

    def _leadership_changed(self) -> None:
        for wake in list(self._leadership_listeners):
            wake()

    # --- ISR changes ----------------------------------------------------------------------------------

    def _submit(self, partition: Partition) -> None:
        self._proposals[(partition.topic, partition.index)] = partition
        self._proposed.set()

    def maybe_shrink_isrs(self, now_ms: int | None = None) -> int:
        """Propose ISRs without the followers lagging past replica.lag.time.max.ms; how many were proposed."""
        now = self.clock() if now_ms is None else now_ms
        proposed = 0
        for partition in list(self._partitions.values()):
            if partition.remote and partition.maybe_shrink_isr(now):
                proposed += 1
        return proposed

    async def send_isr_changes(self) -> None:
        """Send every ISR change proposed so far to the controller, one at a time. A refused one is logged and
        dropped (the partition keeps its registered ISR and proposes again when it still needs to). The
        controller publishes an accepted one before it answers, so its registration is applied by then."""
        self._proposed = trio.Event()
        assert self._alter_partition is not None or not self._proposals
        while self._proposals:
            key = next(iter(self._proposals))
            partition = self._proposals.pop(key)
            proposal = partition.pending_isr
            if proposal is None or self._partitions.get(key) is not partition or self._alter_partition is None:
                continue
            before = len(partition.isr)
            try:
                await self._alter_partition(partition, proposal)
                if len(proposal.isr) < before:
                    self.isr_shrinks += 1
                else:
                    self.isr_expands += 1
            except KafkaError as exc:
                self.failed_isr_updates += 1
                log.warning(
                    "%s-%d: the controller refused the ISR %s: %s %s",
                    partition.topic,
                    partition.index,
                    list(proposal.broker_ids),
                    exc.code.name,
                    exc.message,
                )
            finally:
                partition.isr_change_ended(proposal)

    async def _propagate_isr_changes(self) -> None:
        """Send ISR changes as they are proposed, and look for lagging followers every half lag time."""
        interval = self.lag_time_max_ms / 2 / 1000
        next_check = trio.current_time() + interval
        while True:
            with trio.move_on_at(next_check):
                await self._proposed.wait()
            if trio.current_time() >= next_check:
                self.maybe_shrink_isrs()
                next_check = trio.current_time() + interval
            await self.send_isr_changes()

    # --- acks=all ------------------------------------------------------------------------------------

    async def await_acks(self, pending: list[PendingAck], timeout_ms: int) -> None:
        """Wait until each partition's high watermark reaches its offset (its answer's error code becomes NONE,
        or NOT_ENOUGH_REPLICAS_AFTER_APPEND / NOT_LEADER_OR_FOLLOWER as Kafka's DelayedProduce decides), or the
        timeout: the answers still waiting get REQUEST_TIMED_OUT."""
        moved = trio.Event()

        def wake() -> None:
            moved.set()

        def on_change(event: PartitionEvent) -> None:
            if event & PartitionEvent.HIGH_WATERMARK:
                moved.set()

        unsubscribes = [partition.log.subscribe(on_change) for partition, _, _ in pending]
        self._leadership_listeners.add(wake)
        try:
            with trio.move_on_after(max(timeout_ms, 0) / 1000):
                while True:
                    pending = self._settle(pending)
                    if not pending:
                        return
                    await moved.wait()
                    moved = trio.Event()
        finally:
            self._leadership_listeners.discard(wake)
            for unsubscribe in unsubscribes:
                unsubscribe()
        for _, _, answer in pending:
            answer.error_code = ErrorCode.REQUEST_TIMED_OUT

    @staticmethod
    def _settle(pending: list[PendingAck]) -> list[PendingAck]:
        waiting = []
        for item in pending:
            partition, required_offset, answer = item
            reached = partition.acks_reached(required_offset)
            if reached is None:
                waiting.append(item)
            else:
                answer.error_code = reached
        return waiting

    # --- the high-watermark checkpoint ---------------------------------------------------------------

    def high_watermarks(self) -> dict[TopicPartition, int]:
        """What the checkpoint holds: each replica's high watermark, and the start-up entries of partitions not
        opened since (while their topic exists)."""
        entries = {}
        for (topic, index), offset in self._checkpointed.items():
            info = self.logs.topic(topic)
            if info is not None and index < info.partitions:
                entries[(topic, index)] = offset
        for key, partition in self._partitions.items():
            entries[key] = partition.log.high_watermark
        return entries

    def checkpoint(self, entries: Mapping[TopicPartition, int] | None = None) -> None:
        """Write replication-offset-checkpoint (atomically; may run in a worker thread given ``entries``)."""
        write_offset_checkpoint(self.checkpoint_path, self.high_watermarks() if entries is None else entries)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Checkpoint the high watermarks every replica.high.watermark.checkpoint.interval.ms, send ISR changes to
        the controller (when it has one to send them to), and run the followers' fetchers (when there are)."""
        async with trio.open_nursery() as nursery:
            if self._alter_partition is not None:
                nursery.start_soon(self._propagate_isr_changes)
            if self.fetchers is not None:
                await nursery.start(self.fetchers.run)
                nursery.start_soon(self._open_followed)
            nursery.start_soon(self._checkpoint_periodically)
            task_status.started()

    async def _checkpoint_periodically(self) -> None:
        """A write that fails is logged (once until one succeeds again) and tried at the next interval."""
        failing = False
        written: dict[TopicPartition, int] | None = None  # what the file holds, as this run last wrote it
        while True:
            await trio.sleep(self.checkpoint_interval_ms / 1000)
            entries = self.high_watermarks()  # read on the event loop, written in a worker thread
            if entries == written:
                continue  # the file already says this: an idle broker (or one only read from) writes nothing
            try:
                await trio.to_thread.run_sync(self.checkpoint, entries)
            except OSError as exc:
                if not failing:
                    log.error("cannot write %s, tried again later: %s", self.checkpoint_path, exc)
                failing = True
                continue
            written = entries
            if failing:
                log.warning("writing %s works again", self.checkpoint_path)
            failing = False

    def close(self) -> None:
        """Checkpoint the high watermarks one last time (before the logs close, as Kafka's shutdown does)."""
        try:
            self.checkpoint()
        except OSError as exc:  # the previous checkpoint stays: high watermarks restart lower, nothing is lost
            log.error("cannot write %s: %s", self.checkpoint_path, exc)
