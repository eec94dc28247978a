"""One partition as a replica: its log, its role, and, as leader, where every other replica is.

Kafka's Partition (kafka.cluster.Partition): the leader knows each remote replica's log end offset (where its
last fetch started) and when it was last caught up; the high watermark is the smallest log end offset among the
in-sync replicas, and it does not move while the ISR is smaller than the effective min.insync.replicas (the
topic's setting capped by the replica count, Kafka's ``effectiveMinIsr``: a topic with one replica and
min.insync.replicas=2 accepts acks=all, as Kafka does). acks=all is refused with NOT_ENOUGH_REPLICAS when the
ISR is smaller than that, before anything is written.

A partition without remote replicas (a single node's) leaves the high watermark to its log, which moves it to
the log end after each append (``high_watermark_follows_appends``): nothing is computed per append.

Leader epochs live in the log (its epoch cache); becoming leader in a newer epoch starts that epoch at the log
end, as Kafka's leader does.

The ISR changes as Kafka's leader changes it: a follower whose fetches reach the high watermark, from within the
current leader epoch, is proposed for the ISR (maybeExpandIsr); one that has not been caught up for
replica.lag.time.max.ms is proposed out of it (maybeShrinkIsr). A proposal (an AlterPartition) goes to the
controller through the ReplicaManager; while it is in flight no other is made and the high watermark counts
the larger of the two ISRs (Kafka's "maximal" ISR, KIP-497); the registration the controller publishes ends
it. Followers not in the ISR but caught up and eligible (registered, unfenced, not shutting down, fetching with
the broker epoch the image has) hold the high watermark too, so they can join (Kafka's maybeIncrementLeaderHW).

As follower, batches fetched from the leader are appended with their offsets and epochs, the log is truncated
where it diverges from the leader's, and the high watermark is the leader's (bounded by the log end).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from kbroker.replication.registration import NO_LEADER, Registration
from kbroker.storage import AppendResult, OffsetOutOfRange, PartitionLog
from protocol.errors import ErrorCode
from protocol.records import BatchHeader

log = logging.getLogger("kbroker.replication")

UNKNOWN_OFFSET = -1
NO_BROKER_EPOCH = -1  # a fetch or ISR member without a broker epoch: not checked (Kafka's -1)
REPLICA_LAG_TIME_MAX_MS = 30_000  # Kafka's replica.lag.time.max.ms default

# Whether a broker may join an ISR (Kafka's isReplicaIsrEligible): given its id and the broker epoch its fetches
# carried, registered in the image, unfenced, not in controlled shutdown, and with that epoch.
IsrEligibility = Callable[[int, int], bool]


def always_eligible(broker_id: int, broker_epoch: int) -> bool:
    return True


class IsrProposal(NamedTuple):
    """An ISR change the leader asks the controller for (one partition of Kafka's AlterPartition): the ISR it
    wants, each member with the broker epoch its fetches carried, in the registration's epochs."""

    leader_epoch: int
    partition_epoch: int
    isr: tuple[tuple[int, int], ...]  # (broker id, broker epoch or NO_BROKER_EPOCH)

    @property
    def broker_ids(self) -> tuple[int, ...]:
        return tuple(broker_id for broker_id, _ in self.isr)


def leader_epoch_error(current_leader_epoch: int, leader_epoch: int) -> ErrorCode:
    """Kafka's check of a client's view of the partition's leader epoch (-1: the client does not know it)."""
    if current_leader_epoch < 0 or current_leader_epoch == leader_epoch:
        return ErrorCode.NONE
    return ErrorCode.FENCED_LEADER_EPOCH if current_leader_epoch < leader_epoch else ErrorCode.UNKNOWN_LEADER_EPOCH


class Role(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(slots=True)
class ReplicaState:
    """What the leader knows of a remote replica, from its fetches (Kafka's Replica state)."""

    broker_id: int
    log_end_offset: int = UNKNOWN_OFFSET  # where its last fetch started
    log_start_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = 0  # when it last had everything the leader had
    last_fetch_time_ms: int = 0
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    broker_epoch: int | None = None  # the broker epoch its last fetch carried (None: it has not fetched)

    def is_caught_up(self, leader_log_end_offset: int, now_ms: int, lag_time_max_ms: int) -> bool:
        """Kafka's isCaughtUp: it has the leader's log end, or had it within ``lag_time_max_ms``."""
        return self.log_end_offset == leader_log_end_offset or now_ms - self.last_caught_up_time_ms <= lag_time_max_ms

    def record_fetch(self, fetch_offset: int, log_start_offset: int, now_ms: int, leader_log_end_offset: int) -> None:
        # As Kafka's Replica.updateFetchStateOrThrow: caught up now if it asked from the leader's end, or as of
        # its previous fetch if it reached what the leader had then.
        if fetch_offset >= leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.log_end_offset = fetch_offset
        self.log_start_offset = log_start_offset
        self.last_fetch_leader_log_end_offset = leader_log_end_offset
        self.last_fetch_time_ms = now_ms


class Partition:
    __slots__ = ("topic", "index", "log", "local_broker_id", "role", "leader_id", "partition_epoch", "replicas",
                 "isr", "remote", "pending_isr", "lag_time_max_ms", "_registered_epoch", "_name",
                 "_epoch_start_offset", "_eligible", "_submit")  # fmt: skip

    def __init__(
        self,
        topic: str,
        index: int,
        log: PartitionLog,
        local_broker_id: int,
        *,
        lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS,
        eligible: IsrEligibility = always_eligible,
        submit: Callable[[Partition], None] | None = None,
    ) -> None:
        """``eligible``: who may join the ISR (the image's brokers); ``submit``: where an ISR proposal goes (the
        ReplicaManager sends it to the controller); without one, ISR changes are never proposed."""
        self.topic = topic
        self.index = index
        self.log = log
        self.local_broker_id = local_broker_id
        self.role = Role.FOLLOWER
        self.leader_id = NO_LEADER
        self.partition_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.isr: tuple[int, ...] = ()
        self.remote: dict[int, ReplicaState] = {}  # as leader: every other replica (none on a single node)
        self.pending_isr: IsrProposal | None = None  # an ISR change sent to the controller, not yet registered
        self.lag_time_max_ms = lag_time_max_ms
        self._registered_epoch = -1  # the leader epoch of the registration last applied
        self._name = f"{topic}-{index}"
        self._epoch_start_offset = UNKNOWN_OFFSET  # as leader: the log end when its leader epoch began
        self._eligible = eligible
        self._submit = submit

    def __repr__(self) -> str:
        return f"Partition({self._name}, {self.role.value}, epoch {self.leader_epoch}, isr {list(self.isr)})"

    # --- state ---------------------------------------------------------------------------------------

    @property
    def leader_epoch(self) -> int:
        """As leader the log's epoch (the registration's, started at the log end when it became leader); as
        follower the registration's (the log learns epochs from the leader's batches)."""
        return self.log.leader_epoch if self.role is Role.LEADER else self._registered_epoch

    @property
    def registered_leader_epoch(self) -> int:
        """The leader epoch of the registration last applied (Kafka's Partition.getLeaderEpoch)."""
        return self._registered_epoch

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def effective_min_isr(self) -> int:
        """min.insync.replicas capped by the replica count (Kafka's effectiveMinIsr)."""
        return min(self.log.config.min_insync_replicas, len(self.remote) + 1)

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR, with the members an in-flight expansion adds (Kafka's maximalIsr: a shrink in flight still
        counts the members it removes)."""
        pending = self.pending_isr
        if pending is None:
            return self.isr
        return self.isr + tuple(broker_id for broker_id in pending.broker_ids if broker_id not in self.isr)

    @property
    def under_min_isr(self) -> bool:
        return self.role is Role.LEADER and len(self.isr) < self.effective_min_isr

    @property
    def at_min_isr(self) -> bool:
        return self.role is Role.LEADER and len(self.isr) == self.effective_min_isr

    @property
    def under_replicated(self) -> bool:
        """As leader, fewer in-sync replicas than replicas (Kafka's isUnderReplicated)."""
        return self.role is Role.LEADER and len(self.isr) < len(self.replicas)

    # --- changes of leadership -------------------------------------------------------------------------

    def make_leader(self, registration: Registration, now_ms: int) -> bool:
        """Lead the partition as ``registration`` says; whether the high watermark moved."""
        new_epoch = registration.leader_epoch > self.log.leader_epoch
        if new_epoch:
            self.log.assign_leader_epoch(registration.leader_epoch)  # the epoch starts at the log end
        if new_epoch or self.role is not Role.LEADER:
            self._epoch_start_offset = self.log.log_end_offset
        local = self.local_broker_id
        remote = {}
        for broker_id in registration.replicas:
            if broker_id == local:
                continue
            state = self.remote.get(broker_id) if self.role is Role.LEADER and not new_epoch else None
            if state is None:
                # As Kafka: a follower starts unknown; one in the ISR counts as caught up from now.
                state = ReplicaState(broker_id, last_caught_up_time_ms=now_ms if broker_id in registration.isr else 0)
            remote[broker_id] = state
        self.remote = remote
        self.role = Role.LEADER
        self._take(registration)
        # Alone, the log keeps its high watermark at its end; with followers it is computed here from theirs.
        self.log.high_watermark_follows_appends = not remote
        return self.maybe_increment_high_watermark(now_ms)

    def make_follower(self, registration: Registration) -> None:
        """Follow ``registration.leader``: the high watermark moves only as the leader says (a replica fetcher)."""
        self.role = Role.FOLLOWER
        self.remote = {}
        self._take(registration)
        self.pending_isr = None
        self.log.high_watermark_follows_appends = False

    def stop(self) -> None:
        """No longer a replica here: whoever still holds it (a waiting acks=all) is answered as by a non-leader."""
        self.role = Role.FOLLOWER
        self.leader_id = NO_LEADER
        self.remote = {}
        self.pending_isr = None

    def _take(self, registration: Registration) -> None:
        self._registered_epoch = registration.leader_epoch
        self.leader_id = registration.leader
        self.partition_epoch = registration.partition_epoch
        self.replicas = registration.replicas
        self.isr = registration.isr
        pending = self.pending_isr
        if pending is not None and (
            registration.partition_epoch > pending.partition_epoch or registration.leader_epoch > pending.leader_epoch
        ):
            self.pending_isr = None  # the controller decided (this change, or another one): it is no longer in flight

    def maybe_increment_high_watermark(self, now_ms: int) -> bool:
        """As leader: move the high watermark to the smallest log end offset of the maximal ISR and of the
        followers caught up enough to join it (Kafka's maybeIncrementLeaderHW); not while under min ISR.
        Whether it moved."""
        if self.role is not Role.LEADER or self.under_min_isr:
            return False
        log = self.log
        leader_end = log.log_end_offset
        high_watermark = leader_end
        isr = self.maximal_isr
        for broker_id, state in self.remote.items():
            if state.log_end_offset < high_watermark and (
                broker_id in isr
                or (
                    state.is_caught_up(leader_end, now_ms, self.lag_time_max_ms)
                    and state.broker_epoch is not None
                    and self._eligible(broker_id, state.broker_epoch)
                )
            ):
                high_watermark = state.log_end_offset
        return log.update_high_watermark(high_watermark)

    # --- the ISR ---------------------------------------------------------------------------------------

    def _propose(self, isr: tuple[int, ...]) -> None:
        members = tuple(
            (broker_id, NO_BROKER_EPOCH if broker_id == self.local_broker_id else self._broker_epoch_of(broker_id))
            for broker_id in isr
        )
        self.pending_isr = IsrProposal(self._registered_epoch, self.partition_epoch, members)
        assert self._submit is not None
        self._submit(self)

    def _broker_epoch_of(self, broker_id: int) -> int:
        state = self.remote.get(broker_id)
        epoch = None if state is None else state.broker_epoch
        return NO_BROKER_EPOCH if epoch is None else epoch

    def _maybe_expand_isr(self, broker_id: int, state: ReplicaState) -> None:
        """Propose ``broker_id`` for the ISR when it has the high watermark and reached the current leader epoch
        (Kafka's maybeExpandIsr: a replica behind the epoch's start could lose committed records as leader)."""
        if (
            self._submit is None
            or self.pending_isr is not None
            or broker_id in self.isr
            or state.log_end_offset < self.log.high_watermark
            or state.log_end_offset < self._epoch_start_offset
            or not self._eligible(broker_id, NO_BROKER_EPOCH if state.broker_epoch is None else state.broker_epoch)
        ):
            return
        log.info("%s: expanding the ISR %s with follower %d at offset %d", self._name, list(self.isr), broker_id,
                 state.log_end_offset)  # fmt: skip
        self._propose((*self.isr, broker_id))

    def out_of_sync_replicas(self, now_ms: int) -> list[int]:
        """The ISR's followers not caught up within replica.lag.time.max.ms (Kafka's getOutOfSyncReplicas); none
        while an ISR change is in flight."""
        if self.role is not Role.LEADER or self.pending_isr is not None:
            return []
        leader_end = self.log.log_end_offset
        lagging = []
        for broker_id in self.isr:
            if broker_id == self.local_broker_id:
                continue
            state = self.remote.get(broker_id)
            if state is None or not state.is_caught_up(leader_end, now_ms, self.lag_time_max_ms):
                lagging.append(broker_id)
        return lagging

    def maybe_shrink_isr(self, now_ms: int) -> bool:
        """Propose an ISR without the followers out of sync (Kafka's maybeShrinkIsr); whether one was proposed."""
        if self._submit is None:
            return False
        lagging = self.out_of_sync_replicas(now_ms)
        if not lagging:
            return False
        log.info(
            "%s: shrinking the ISR %s without %s (high watermark %d, log end %d)",
            self._name,
            list(self.isr),
            lagging,
            self.log.high_watermark,
            self.log.log_end_offset,
        )
        self._propose(tuple(broker_id for broker_id in self.isr if broker_id not in lagging))
        return True

    def isr_change_ended(self, proposal: IsrProposal) -> None:
        """The controller answered ``proposal``: no longer in flight. Its registration, if it made one, was applied
        already; refused (or changing nothing), the ISR stays the registered one and the next fetch or check may
        propose again."""
        if self.pending_isr is proposal:
            self.pending_isr = None

    # --- appends -------------------------------------------------------------------------------------

    def append_as_leader(
        self,
        batch: bytearray | memoryview,
        header: BatchHeader,
        required_acks: int,
        *,
        now_ms: int,
        timestamp_type_log_append: bool = False,
    ) -> AppendResult:
        """Append a validated batch as leader; refusals (not leader, too small an ISR for acks=all) are answers."""
        if self.role is not Role.LEADER:
            return AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, log_start_offset=self.log.log_start_offset)
        remote = self.remote
        if remote and required_acks == -1 and len(self.isr) < self.effective_min_isr:
            # As Kafka: nothing is written when the write could not be made safe (its message is not sent).
            return AppendResult(ErrorCode.NOT_ENOUGH_REPLICAS, log_start_offset=self.log.log_start_offset)
        result = self.log.append(batch, header, now_ms=now_ms, timestamp_type_log_append=timestamp_type_log_append)
        if remote and result.error_code == ErrorCode.NONE:
            self.maybe_increment_high_watermark(now_ms)  # the ISR may be the leader alone
        return result

    def acks_reached(self, required_offset: int) -> ErrorCode | None:
        """For acks=all: None while the high watermark is below ``required_offset``, then NONE, or
        NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR (the maximal one) shrank below min.insync.replicas meanwhile
        (Kafka's checkEnoughReplicasReachOffset); NOT_LEADER_OR_FOLLOWER once no longer leader."""
        if self.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if self.log.high_watermark < required_offset:
            return None
        if len(self.maximal_isr) < self.effective_min_isr:
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return ErrorCode.NONE

    def append_as_follower(self, records: bytes | bytearray | memoryview, now_ms: int | None = None) -> AppendResult:
        """Append batches fetched from the leader with their offsets and epochs (Kafka's
        appendRecordsToFollowerOrFutureReplica); NOT_LEADER_OR_FOLLOWER on a leader."""
        if self.role is Role.LEADER:
            return AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, log_start_offset=self.log.log_start_offset)
        return self.log.append_as_follower(records, now_ms)

    def update_follower_high_watermark(self, leader_high_watermark: int) -> None:
        """As follower: the high watermark the leader's fetch answer carried, bounded by this log's end."""
        if self.role is not Role.LEADER:
            self.log.set_high_watermark(leader_high_watermark)

    def truncation_offset(self, diverging_epoch: int, diverging_end_offset: int) -> int:
        """Where a follower cuts its log when the leader answered a fetch with a diverging epoch (Kafka's
        AbstractFetcherThread.getOffsetTruncationState): the end of that epoch here if this log knows it, else
        the end of this log's largest epoch below it, never past the log end."""
        log_end = self.log.log_end_offset
        if diverging_end_offset < 0:
            return self.log.high_watermark
        if diverging_epoch < 0:
            return min(diverging_end_offset, log_end)
        epoch, end_offset = self.log.end_offset_for_epoch(diverging_epoch)
        if epoch < 0 or end_offset < 0:
            return min(diverging_end_offset, log_end)
        if epoch != diverging_epoch:
            return min(end_offset, log_end)
        return min(diverging_end_offset, end_offset, log_end)

    def truncate_to(self, offset: int) -> None:
        """As follower: drop everything from ``offset`` (the batch holding it goes whole)."""
        self.log.truncate_to(offset)

    # --- fetches -------------------------------------------------------------------------------------

    def fetch_error(self, replica_id: int, current_leader_epoch: int, leader_only: bool = True) -> ErrorCode:
        """Why a fetch may not read this replica (NONE if it may), in Kafka's order: the fetcher's epoch, then
        leadership (unless not ``leader_only``: a consumer's Fetch v11+ may read a follower, up to its high
        watermark, as Kafka's fetchOnlyLeader), then, for a replica's fetch, whether it is one of the partition's
        replicas."""
        if current_leader_epoch >= 0:
            epoch_error = leader_epoch_error(current_leader_epoch, self.leader_epoch)
            if epoch_error != ErrorCode.NONE:
                return epoch_error
        if self.role is not Role.LEADER and leader_only:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if replica_id >= 0 and replica_id not in self.remote:
            # As Kafka's followerReplicaOrThrow: a fetcher that knows the epoch is told to retry with it.
            return ErrorCode.UNKNOWN_LEADER_EPOCH if current_leader_epoch >= 0 else ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    def diverging_epoch(self, last_fetched_epoch: int, fetch_offset: int) -> tuple[int, int] | None:
        """For a fetch that names the epoch of the last batch it has (Fetch v12+): (epoch, end offset) of this
        log where the fetcher's log diverges from it, or None when it does not (Kafka's Partition.readRecords).
        OffsetOutOfRange when this log cannot tell (an epoch newer than its own) or the offset is below its start.
        """
        log = self.log
        if last_fetched_epoch == log.leader_epoch and log.log_start_offset <= fetch_offset <= log.log_end_offset:
            return None  # the fetcher is in the current epoch, within the log: the common case, answered at once
        epoch, end_offset = log.end_offset_for_epoch(last_fetched_epoch)
        if epoch < 0 or end_offset < 0:
            raise OffsetOutOfRange(
                f"Could not determine the end offset of the last fetched epoch {last_fetched_epoch} of {self._name}"
            )
        if fetch_offset < log.log_start_offset:
            raise OffsetOutOfRange(
                f"Received request for offset {fetch_offset} for partition {self._name}, but we only have log "
                f"segments in the range {log.log_start_offset} to {log.log_end_offset}."
            )
        if epoch < last_fetched_epoch or end_offset < fetch_offset:
            return epoch, end_offset
        return None

    def record_follower_fetch(
        self,
        replica_id: int,
        fetch_offset: int,
        log_start_offset: int,
        now_ms: int,
        leader_log_end_offset: int,
        broker_epoch: int = NO_BROKER_EPOCH,
    ) -> bool:
        """A follower fetched from ``fetch_offset``: its log ends there (Kafka's updateFollowerFetchState). It may
        be proposed for the ISR; whether the high watermark moved."""
        state = self.remote.get(replica_id)
        if state is None:
            return False
        previous_end = state.log_end_offset
        state.record_fetch(fetch_offset, log_start_offset, now_ms, leader_log_end_offset)
        state.broker_epoch = broker_epoch
        self._maybe_expand_isr(replica_id, state)
        if previous_end == state.log_end_offset:
            return False
        return self.maybe_increment_high_watermark(now_ms)
