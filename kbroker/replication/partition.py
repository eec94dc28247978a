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
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kbroker.replication.registration import NO_LEADER, Registration
from kbroker.storage import AppendResult, PartitionLog
from protocol.errors import ErrorCode
from protocol.records import BatchHeader

UNKNOWN_OFFSET = -1


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
                 "isr", "remote", "_registered_epoch", "_name")  # fmt: skip

    def __init__(self, topic: str, index: int, log: PartitionLog, local_broker_id: int) -> None:
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
        self._registered_epoch = -1  # the leader epoch of the registration last applied
        self._name = f"{topic}-{index}"

    def __repr__(self) -> str:
        return f"Partition({self._name}, {self.role.value}, epoch {self.leader_epoch}, isr {list(self.isr)})"

    # --- state ---------------------------------------------------------------------------------------

    @property
    def leader_epoch(self) -> int:
        """As leader the log's epoch (the registration's, started at the log end when it became leader); as
        follower the registration's (the log learns epochs from the leader's batches)."""
        return self.log.leader_epoch if self.role is Role.LEADER else self._registered_epoch

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
    def under_min_isr(self) -> bool:
        return self.role is Role.LEADER and len(self.isr) < self.effective_min_isr

    # --- changes of leadership -------------------------------------------------------------------------

    def make_leader(self, registration: Registration, now_ms: int) -> bool:
        """Lead the partition as ``registration`` says; whether the high watermark moved."""
        new_epoch = registration.leader_epoch > self.log.leader_epoch
        if new_epoch:
            self.log.assign_leader_epoch(registration.leader_epoch)  # the epoch starts at the log end
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
        return self.maybe_increment_high_watermark()

    def make_follower(self, registration: Registration) -> None:
        """Follow ``registration.leader``: the high watermark moves only as the leader says (a replica fetcher)."""
        self.role = Role.FOLLOWER
        self.remote = {}
        self._take(registration)
        self.log.high_watermark_follows_appends = False

    def stop(self) -> None:
        """No longer a replica here: whoever still holds it (a waiting acks=all) is answered as by a non-leader."""
        self.role = Role.FOLLOWER
        self.leader_id = NO_LEADER
        self.remote = {}

    def _take(self, registration: Registration) -> None:
        self._registered_epoch = registration.leader_epoch
        self.leader_id = registration.leader
        self.partition_epoch = registration.partition_epoch
        self.replicas = registration.replicas
        self.isr = registration.isr

    def maybe_increment_high_watermark(self) -> bool:
        """As leader: move the high watermark to the smallest log end offset of the ISR (Kafka's
        maybeIncrementLeaderHW, without the ISR expansion a controller decides); whether it moved."""
        if self.role is not Role.LEADER or self.under_min_isr:
            return False
        log = self.log
        high_watermark = log.log_end_offset
        for broker_id in self.isr:
            state = self.remote.get(broker_id)
            if state is not None and state.log_end_offset < high_watermark:
                high_watermark = state.log_end_offset
        return log.update_high_watermark(high_watermark)

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
            self.maybe_increment_high_watermark()  # the ISR may be the leader alone
        return result

    def acks_reached(self, required_offset: int) -> ErrorCode | None:
        """For acks=all: None while the high watermark is below ``required_offset``, then NONE, or
        NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank below min.insync.replicas meanwhile (Kafka's
        checkEnoughReplicasReachOffset); NOT_LEADER_OR_FOLLOWER once no longer leader."""
        if self.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if self.log.high_watermark < required_offset:
            return None
        if len(self.isr) < self.effective_min_isr:
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return ErrorCode.NONE

    # --- fetches -------------------------------------------------------------------------------------

    def fetch_error(self, replica_id: int, current_leader_epoch: int) -> ErrorCode:
        """Why a fetch may not read this replica (NONE if it may), in Kafka's order: the fetcher's epoch, then
        leadership, then, for a replica's fetch, whether it is one of the partition's replicas."""
        if current_leader_epoch >= 0:
            epoch_error = leader_epoch_error(current_leader_epoch, self.leader_epoch)
            if epoch_error != ErrorCode.NONE:
                return epoch_error
        if self.role is not Role.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if replica_id >= 0 and replica_id not in self.remote:
            # As Kafka's followerReplicaOrThrow: a fetcher that knows the epoch is told to retry with it.
            return ErrorCode.UNKNOWN_LEADER_EPOCH if current_leader_epoch >= 0 else ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    def record_follower_fetch(
        self, replica_id: int, fetch_offset: int, log_start_offset: int, now_ms: int, leader_log_end_offset: int
    ) -> bool:
        """A follower fetched from ``fetch_offset``: its log ends there. Whether the high watermark moved."""
        state = self.remote.get(replica_id)
        if state is None:
            return False
        state.record_fetch(fetch_offset, log_start_offset, now_ms, leader_log_end_offset)
        return self.maybe_increment_high_watermark()
