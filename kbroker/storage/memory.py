"""The in-memory storage engine: the same partition logs and topic store as the disk engine, without files.

Fast unit tests of the request handlers use it (tests/broker/test_handlers_in_memory.py), and the storage
contract tests (tests/storage/test_storage_contract.py) run every case against it and the disk engine, so the
two answer alike: the same offsets, validation results, errors, reads, retention and DeleteRecords effects.

Batches are kept as bytes, offsets assigned, in "segments" that roll by segment.bytes and segment.ms exactly
as the disk engine's files do, because what a read returns (whole batches of one segment) and what retention
deletes (whole sealed segments) depend on where segments start. Nothing is durable: flushing is a no-op and a
closed store is gone.
"""

from __future__ import annotations

import logging
import uuid
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from kbroker.storage.api import PartitionEvent, PartitionEventListener
from kbroker.storage.leader_epochs import implicit_end_offset
from kbroker.storage.manager import TopicInfo, validate_topic_name
from kbroker.storage.partition import (
    PRODUCER_ID_EXPIRATION_MS,
    AppendResult,
    LogConfig,
    OffsetOutOfRange,
    admit_batch,
    first_matching_record,
    offset_of_max_timestamp,
    producer_answer,
    stored_form,
    wall_clock_ms,
)
from kbroker.storage.producer_state import ProducerStateTable, ProducerView
from kbroker.storage.txn_index import AbortedTransactions, AbortedTxn, read_marker
from protocol.errors import ErrorCode, KafkaError
from protocol.exceptions import DecodeError
from protocol.records import BatchHeader, assign_offsets, build_control_batch

log = logging.getLogger("kbroker.storage")

NO_TIMESTAMP = -1
NO_EPOCH_OFFSET = (-1, -1)  # OffsetsForLeaderEpoch's "undefined epoch, undefined offset"


@dataclass(frozen=True, slots=True)
class MemoryChunk:
    """Whole batches of one segment, already in memory; ``region()`` is the bytes themselves."""

    data: bytes
    last_offset: int

    @property
    def size(self) -> int:
        return len(self.data)

    def read_bytes(self) -> bytes:
        return self.data

    def region(self) -> bytes:
        return self.data


EMPTY_CHUNK = MemoryChunk(b"", -1)


@dataclass(slots=True)
class MemorySegment:
    """Batches (offsets assigned) from ``base_offset``, with their headers and cumulative positions."""

    base_offset: int
    created_ms: int
    batches: list[bytes] = field(default_factory=list)
    headers: list[BatchHeader] = field(default_factory=list)
    last_offsets: list[int] = field(default_factory=list)  # for bisecting by offset
    ends: list[int] = field(default_factory=list)  # position just after each batch
    max_timestamp: int = NO_TIMESTAMP
    modified_ms: int = 0  # wall clock of the last append, as a file's modification time

    @property
    def size(self) -> int:
        return self.ends[-1] if self.ends else 0

    @property
    def next_offset(self) -> int:
        return self.last_offsets[-1] + 1 if self.last_offsets else self.base_offset

    def append(self, batch: bytes, header: BatchHeader) -> None:
        self.batches.append(batch)
        self.headers.append(header)
        self.last_offsets.append(header.last_offset)
        self.ends.append(self.size + len(batch))
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        self.modified_ms = wall_clock_ms()

    def largest_timestamp(self) -> int:
        """As Segment.largest_timestamp: the largest record timestamp, else when the segment was last written."""
        return self.max_timestamp if self.max_timestamp >= 0 else max(self.created_ms, self.modified_ms)

    def keep_first(self, count: int) -> None:
        """Drop every batch after the first ``count`` (truncation)."""
        for column in (self.batches, self.headers, self.last_offsets, self.ends):
            del column[count:]
        self.max_timestamp = max((h.max_timestamp for h in self.headers), default=NO_TIMESTAMP)

    def index_of(self, offset: int) -> int:
        """Index of the first batch whose last offset is at least ``offset`` (len(batches) if none)."""
        return bisect_left(self.last_offsets, offset)

    def position(self, index: int) -> int:
        return self.ends[index - 1] if index > 0 else 0

    def first_batch_at_timestamp(self, timestamp: int) -> int | None:
        """Index of the first batch whose max timestamp is at least ``timestamp``."""
        if self.max_timestamp < timestamp:
            return None
        return next((i for i, h in enumerate(self.headers) if h.max_timestamp >= timestamp), None)


class MemoryPartitionLog:
    """One partition's log in memory; the same public surface and answers as the disk PartitionLog."""

    def __init__(self, topic: str, partition: int, config: LogConfig, *, now_ms: int | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.config = config
        self.segments: list[MemorySegment] = [MemorySegment(0, wall_clock_ms() if now_ms is None else now_ms)]
        self._bases: list[int] = [0]
        self.producers = ProducerStateTable()
        self.aborted = AbortedTransactions()  # as the disk engine's .txnindex entries, without the files
        self.log_start_offset = 0
        self._high_watermark = 0
        self._last_stable_offset = 0
        self._leader_epoch = 0
        self._epochs: list[tuple[int, int]] = []  # (epoch, start offset), both increasing
        self._listeners: list[PartitionEventListener] = []
        # A single node is its whole ISR: an append is replicated once written. Replication turns this off
        # and moves the high watermark with update_high_watermark.
        self.high_watermark_follows_appends = True

    # --- offsets ---

    @property
    def active(self) -> MemorySegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def last_stable_offset(self) -> int:
        return self._last_stable_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping [start, end), as the disk engine."""
        segment_base = self._bases[max(bisect_right(self._bases, start_offset) - 1, 0)]
        return self.aborted.collect(segment_base, start_offset, end_offset)

    def ongoing_transactions(self) -> dict[int, int]:
        return dict(self.producers.ongoing)

    def producers_view(self) -> list[ProducerView]:
        return self.producers.views()

    def _stable_offset_for(self, high_watermark: int) -> int:
        first_open = self.producers.first_ongoing_offset()
        if first_open is None:
            return high_watermark
        # As Kafka: an open transaction whose first records retention deleted holds it at the log start.
        return min(high_watermark, max(first_open, self.log_start_offset))

    def update_high_watermark(self, offset: int) -> bool:
        """Move the high watermark towards ``offset`` (clamped to the log, never backwards)."""
        target = min(max(offset, self.log_start_offset), self.log_end_offset)
        if target <= self._high_watermark:
            return False
        self._fire(self._move_high_watermark(target))
        return True

    def _move_high_watermark(self, offset: int) -> PartitionEvent:
        """Set the high watermark (and the stable offset: below it and the first open transaction); the flags."""
        changed = PartitionEvent(0)
        if offset != self._high_watermark:
            self._high_watermark = offset
            changed |= PartitionEvent.HIGH_WATERMARK
        stable = self._stable_offset_for(offset)
        if stable != self._last_stable_offset:
            self._last_stable_offset = stable
            changed |= PartitionEvent.STABLE_OFFSET
        return changed

    # --- leader epochs ---

    @property
    def leader_epoch(self) -> int:
        return self._leader_epoch

    def assign_leader_epoch(self, epoch: int) -> None:
        if epoch <= self._leader_epoch:
            raise KafkaError(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"leader epoch {epoch} of {self.topic}-{self.partition} is not above the current {self._leader_epoch}",
            )
        self._leader_epoch = epoch
        self._record_epoch(epoch, self.log_end_offset)

    def _record_epoch(self, epoch: int, start_offset: int) -> None:
        # As Kafka's cache: entries that a new one contradicts (a later epoch or a later start) go.
        self._epochs = [(e, s) for e, s in self._epochs if e < epoch and s < start_offset]
        self._epochs.append((epoch, start_offset))

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's LeaderEpochFileCache.endOffsetFor: (epoch, the offset where it ends) for OffsetsForLeaderEpoch.

        The latest epoch ends at the log end; an older one where the next known epoch starts, answered with
        the largest known epoch at or below it; one below the first entry with the first entry's start (the
        earliest offset the log vouches for); an unknown epoch (-1, above the latest, none known) with (-1, -1).
        """
        if not self._epochs:
            # Nothing appended yet: Kafka's cache holds (current epoch, log end) from when the leader took over.
            return implicit_end_offset(epoch, self._leader_epoch, self.log_end_offset)
        if epoch < 0:
            return NO_EPOCH_OFFSET
        if self._epochs[-1][0] == epoch:
            return epoch, self.log_end_offset
        epochs = [e for e, _ in self._epochs]
        higher = bisect_right(epochs, epoch)
        if higher == len(epochs):
            return NO_EPOCH_OFFSET
        if higher == 0:
            return epoch, self._epochs[0][1]
        return self._epochs[higher - 1][0], self._epochs[higher][1]

    # --- appending ---

    def append(
        self,
        batch: bytearray | memoryview,
        header: BatchHeader | None = None,
        *,
        now_ms: int | None = None,
        timestamp_type_log_append: bool = False,
    ) -> AppendResult:
        """Append one record batch, given its header if the caller validated it (kbroker/storage/validation.py)."""
        if now_ms is None:
            now_ms = wall_clock_ms()
        admitted = admit_batch(
            batch, header, self.config, now_ms, timestamp_type_log_append, f"{self.topic}-{self.partition}"
        )
        if isinstance(admitted, AppendResult):
            return admitted
        header = admitted
        answer = producer_answer(self.producers, header, self.log_start_offset)
        if answer is not None:
            return answer
        if self.config.compression.codec is not None:  # compression.type=producer (the default) skips this
            form = stored_form(batch, header, self.config)
            if isinstance(form, AppendResult):
                return form
            batch, header = form
        self._maybe_roll(len(batch), now_ms)
        base_offset = self.log_end_offset
        if not self._epochs or self._epochs[-1][0] != self._leader_epoch:  # first batch of this epoch
            self._record_epoch(self._leader_epoch, base_offset)
        append_time = now_ms if timestamp_type_log_append else None
        assign_offsets(batch, base_offset, partition_leader_epoch=self._leader_epoch, log_append_time_ms=append_time)
        stored = bytes(batch)
        header = BatchHeader.parse(stored)
        self.active.append(stored, header)
        if header.producer_id >= 0:
            self.producers.record(header)
        moved = PartitionEvent(0)
        if self.high_watermark_follows_appends:
            moved = self._move_high_watermark(self.log_end_offset)
        self._fire(PartitionEvent.APPENDED | moved)
        return AppendResult(
            base_offset=base_offset,
            log_append_time_ms=append_time if append_time is not None else -1,
            log_start_offset=self.log_start_offset,
        )

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        now_ms: int | None = None,
        *,
        transaction_version: int = 1,
    ) -> AppendResult:
        """Write a commit or abort marker ending the producer's transaction, as PartitionLog.append_marker."""
        now_ms = wall_clock_ms() if now_ms is None else now_ms
        check = self.producers.check_marker(
            producer_id, producer_epoch, coordinator_epoch, transaction_version=transaction_version
        )
        if check.error_code != ErrorCode.NONE:
            return AppendResult(check.error_code, check.error_message)
        batch = bytearray(build_control_batch(producer_id, producer_epoch, commit, coordinator_epoch, 0, now_ms))
        self._maybe_roll(len(batch), now_ms)
        base_offset = self.log_end_offset
        if not self._epochs or self._epochs[-1][0] != self._leader_epoch:
            self._record_epoch(self._leader_epoch, base_offset)
        log_append = self.config.message_timestamp_type == "LogAppendTime"
        assign_offsets(
            batch,
            base_offset,
            partition_leader_epoch=self._leader_epoch,
            log_append_time_ms=now_ms if log_append else None,
        )
        stored = bytes(batch)
        header = BatchHeader.parse(stored)
        self.active.append(stored, header)
        stable_after = self.producers.stable_offset_after_marker(producer_id, base_offset)
        first = self.producers.complete_txn(producer_id, producer_epoch, coordinator_epoch, header.max_timestamp)
        if first is not None and not commit:
            self.aborted.add(AbortedTxn(producer_id, first, base_offset, stable_after))
        target = self.log_end_offset if self.high_watermark_follows_appends else self._high_watermark
        self._fire(PartitionEvent.APPENDED | self._move_high_watermark(target))
        return AppendResult(
            base_offset=base_offset,
            log_append_time_ms=now_ms if log_append else -1,
            log_start_offset=self.log_start_offset,
        )

    def _maybe_roll(self, incoming: int, now: int) -> None:
        active = self.active
        if active.size == 0:
            return
        too_big = active.size + incoming > self.config.segment_bytes
        too_old = now - active.created_ms >= self.config.segment_ms
        if too_big or too_old:
            self.roll(now)

    def roll(self, now: int | None = None) -> MemorySegment:
        """Start a new segment at the log end (the active one stays if it is empty)."""
        old = self.active
        if old.size == 0:
            return old
        now = wall_clock_ms() if now is None else now
        segment = MemorySegment(old.next_offset, now)
        self.segments.append(segment)
        self._bases.append(segment.base_offset)
        self.producers.expire(now - PRODUCER_ID_EXPIRATION_MS)
        return segment

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is at least ``offset`` (a straddling batch goes whole)."""
        if offset >= self.log_end_offset:
            return
        if offset < self.log_start_offset:
            raise OffsetOutOfRange(
                f"cannot truncate {self.topic}-{self.partition} to {offset}, below its log start "
                f"offset {self.log_start_offset}"
            )
        i = max(bisect_right(self._bases, offset) - 1, 0)
        while self.segments[i].next_offset <= offset:
            i += 1  # the offset is in a gap after a segment's last batch
        cut = self.segments[i]
        cut.keep_first(cut.index_of(offset))
        new_end = cut.next_offset
        del self.segments[i + 1 :]  # the cut segment stays, even if empty, as the disk engine's does
        del self._bases[i + 1 :]
        self.log_start_offset = min(self.log_start_offset, new_end)
        self._high_watermark = min(self._high_watermark, new_end)
        self._epochs = [(e, s) for e, s in self._epochs if s < new_end]
        self.aborted.drop_from(new_end)
        self.producers = ProducerStateTable()
        for segment in self.segments:
            for header, stored in zip(segment.headers, segment.batches, strict=True):
                if header.producer_id < 0:
                    continue
                if not header.is_control:
                    self.producers.record(header)
                    continue
                try:
                    _, coordinator_epoch = read_marker(stored)
                except DecodeError:
                    continue
                self.producers.complete_txn(
                    header.producer_id, header.producer_epoch, coordinator_epoch, header.max_timestamp
                )
        self._last_stable_offset = self._stable_offset_for(self._high_watermark)

    # --- flushing (nothing to make durable) ---

    @property
    def needs_flush(self) -> bool:
        return False

    def flush_due(self, now: int) -> bool:
        return False

    def flush(self) -> None:
        pass

    def sync(self) -> bool:
        return True

    # --- reading ---

    def read(
        self, offset: int, max_bytes: int, *, max_offset: int | None = None, min_one_batch: bool = True
    ) -> MemoryChunk:
        """Whole batches of one segment from ``offset``, up to ``max_bytes``, as PartitionLog.read."""
        end_offset = self.log_end_offset
        if offset < self.log_start_offset or offset > end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside {self.log_start_offset}..{end_offset} of {self.topic}-{self.partition}"
            )
        upper = end_offset if max_offset is None else min(max_offset, end_offset)
        if offset >= upper:
            return EMPTY_CHUNK
        i = max(bisect_right(self._bases, offset) - 1, 0)
        while i < len(self.segments) and self.segments[i].next_offset <= offset:
            i += 1
        if i == len(self.segments):
            return EMPTY_CHUNK
        segment = self.segments[i]
        first = segment.index_of(offset)
        stop = len(segment.batches) if upper >= segment.next_offset else segment.index_of(upper)
        if stop <= first:
            return EMPTY_CHUNK
        start = segment.position(first)
        if segment.position(stop) - start <= max_bytes:
            data = b"".join(segment.batches[first:stop])
            return MemoryChunk(data, min(upper, segment.next_offset) - 1)
        # The batches that fit whole: the first ``fitting`` end at or before start + max_bytes.
        fitting = bisect_right(segment.ends, start + max(max_bytes, 0), first, stop)
        if fitting > first:
            return MemoryChunk(b"".join(segment.batches[first:fitting]), segment.last_offsets[fitting - 1])
        if not min_one_batch:
            return EMPTY_CHUNK
        return MemoryChunk(segment.batches[first], segment.last_offsets[first])

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """The first record with a timestamp at least ``timestamp``: (offset, its timestamp), or None."""
        for segment in self.segments:
            first = segment.first_batch_at_timestamp(timestamp)
            if first is None:
                continue
            # Usually the first batch holds it; not when its matching records are all below the log start.
            for index in range(first, len(segment.headers)):
                header = segment.headers[index]
                if header.max_timestamp < timestamp or header.last_offset < self.log_start_offset:
                    continue
                found = self._record_at_timestamp(segment, index, lambda ts: ts >= timestamp)
                if found is not None:
                    return found
        return None

    def max_timestamp(self) -> tuple[int, int] | None:
        """ListOffsets MAX_TIMESTAMP by Kafka's rule, as PartitionLog.max_timestamp (the log start plays no part)."""
        if not self.segments:
            return None
        best = self.segments[0]
        for segment in self.segments[1:]:
            if segment.max_timestamp > best.max_timestamp:
                best = segment
        index = best.first_batch_at_timestamp(best.max_timestamp)
        if index is None:
            return None
        header = best.headers[index]
        offset = offset_of_max_timestamp(header, best.batches[index], f"{self.topic}-{self.partition}")
        return None if offset is None else (offset, header.max_timestamp)

    def _record_at_timestamp(
        self, segment: MemorySegment, index: int, match: Callable[[int], bool]
    ) -> tuple[int, int] | None:
        header = segment.headers[index]
        where = f"{self.topic}-{self.partition}"
        return first_matching_record(header, segment.batches[index], self.log_start_offset, match, where)

    # --- deleting ---

    def delete_records(self, offset: int) -> None:
        """Move the log start offset to ``offset`` (DeleteRecords) and drop the segments wholly before it but the
        active one, as PartitionLog.delete_records."""
        if offset <= self.log_start_offset:
            return
        self._set_log_start_offset(min(offset, self.log_end_offset))
        self._delete_segments_before(self.log_start_offset, keep_active=True)

    def _set_log_start_offset(self, offset: int) -> None:
        self.log_start_offset = offset
        # As Kafka's truncateFromStart: the newest epoch that started before the new log start now starts there.
        before = [(e, s) for e, s in self._epochs if s < offset]
        if before and not any(s == offset for _, s in self._epochs):
            self._epochs = [(before[-1][0], offset), *((e, s) for e, s in self._epochs if s > offset)]
        else:
            self._epochs = [(e, s) for e, s in self._epochs if s >= offset]
        # As Kafka: the high watermark is never below the log start; the stable offset may move with it.
        self._move_high_watermark(max(self._high_watermark, offset))

    def _delete_segments_before(self, offset: int, *, keep_active: bool = False) -> list[MemorySegment]:
        doomed = []
        while self.segments and self.segments[0].next_offset <= offset and self.segments[0].size > 0:
            if len(self.segments) == 1:
                if keep_active:
                    break
                self.roll()
            doomed.append(self.segments.pop(0))
            self._bases.pop(0)
        if doomed:
            self.aborted.drop_before(self.segments[0].base_offset)  # the deleted segments' index entries go
        return doomed

    def apply_retention(self, now: int) -> list[MemorySegment]:
        """Delete whole segments past retention.ms or beyond retention.bytes, and those DeleteRecords left wholly
        below the log start (once they are not the active one); returns what was deleted."""
        if "delete" not in self.config.cleanup_policy:
            return self._delete_segments_before(self.log_start_offset, keep_active=True)
        new_start = self.log_start_offset
        retention_ms = self.config.retention_ms
        if retention_ms >= 0:
            for segment in self.segments:
                if segment.size == 0 or now - segment.largest_timestamp() <= retention_ms:
                    break
                new_start = segment.next_offset
        retention_bytes = self.config.retention_bytes
        if retention_bytes >= 0:
            excess = self.size_bytes - retention_bytes
            for segment in self.segments[:-1]:  # the active segment is never deleted for size
                if excess - segment.size < 0:
                    break
                excess -= segment.size
                new_start = max(new_start, segment.next_offset)
        if new_start <= self.log_start_offset:
            return self._delete_segments_before(self.log_start_offset, keep_active=True)
        self._set_log_start_offset(new_start)
        return self._delete_segments_before(new_start)

    # --- events ---

    def subscribe(self, listener: PartitionEventListener) -> Callable[[], None]:
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _fire(self, changed: PartitionEvent) -> None:
        if not changed:
            return
        for listener in list(self._listeners):
            try:
                listener(changed)
            except Exception:
                log.exception("%s-%d: a partition event listener failed", self.topic, self.partition)

    # --- lifecycle ---

    def update_config(self, config: LogConfig) -> None:
        self.config = config

    def close(self) -> None:
        self._listeners.clear()

    def delete(self) -> None:
        self._listeners.clear()


class MemoryLogStore:
    """Every topic and partition in memory; the LogManager's answers, errors included, without a data directory."""

    def __init__(self, topic_defaults: dict[str, str] | None = None) -> None:
        self.topic_defaults = dict(topic_defaults or {})
        self._topics: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        self._partitions: dict[tuple[str, int], MemoryPartitionLog] = {}
        self._pending: set[str] = set()

    # --- metadata ---

    def topic(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID | None) -> TopicInfo | None:
        return self._by_id.get(topic_id) if topic_id is not None else None

    def topics(self) -> list[TopicInfo]:
        return sorted(self._topics.values(), key=lambda info: info.name)

    def effective_configs(self, info: TopicInfo) -> dict[str, str]:
        return {**self.topic_defaults, **info.configs}

    def log_config(self, info: TopicInfo) -> LogConfig:
        return LogConfig.from_topic_configs(self.effective_configs(info))

    def is_pending(self, name: str) -> bool:
        return name in self._pending

    def _known(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
        return info

    # --- topic changes ---

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        info = self.plan_topic(name, partitions, configs)
        return self.commit_topic(info, self.build_partitions(info, 0))

    def plan_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        if name in self._topics or name in self._pending:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        problem = validate_topic_name(name)
        if problem is not None:
            raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        self._pending.add(name)
        return TopicInfo(name, uuid.uuid4(), partitions, dict(configs))

    def build_partitions(self, info: TopicInfo, first: int, total: int | None = None) -> list[MemoryPartitionLog]:
        config = self.log_config(info)
        last = info.partitions if total is None else total
        return [MemoryPartitionLog(info.name, index, config) for index in range(first, last)]

    def commit_topic(self, info: TopicInfo, logs: list[MemoryPartitionLog]) -> TopicInfo:
        self._pending.discard(info.name)
        self._topics[info.name] = info
        self._by_id[info.topic_id] = info
        for plog in logs:
            self._partitions[(info.name, plog.partition)] = plog
        return info

    def abandon(self, info: TopicInfo) -> None:
        self._pending.discard(info.name)

    def commit_partitions(self, info: TopicInfo, logs: list[MemoryPartitionLog]) -> TopicInfo:
        for plog in logs:
            self._partitions[(info.name, plog.partition)] = plog
        if logs:
            info.partitions = max(info.partitions, logs[-1].partition + 1)
        return info

    def add_partitions(self, name: str, total: int) -> TopicInfo:
        info = self._known(name)
        if total <= info.partitions:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, f"topic {name} already has {info.partitions} partitions")
        return self.commit_partitions(info, self.build_partitions(info, info.partitions, total))

    def delete_topic(self, name: str) -> None:
        info = self._known(name)
        del self._topics[name]
        self._by_id.pop(info.topic_id, None)
        for index in range(info.partitions):
            plog = self._partitions.pop((name, index), None)
            if plog is not None:
                plog.delete()

    def alter_topic_config(self, name: str, configs: dict[str, str]) -> TopicInfo:
        info = self._known(name)
        info.configs = dict(configs)
        config = self.log_config(info)
        for index in range(info.partitions):
            plog = self._partitions.get((name, index))
            if plog is not None:
                plog.update_config(config)
        return info

    # --- partitions ---

    def get_partition(self, topic: str, partition: int) -> MemoryPartitionLog | None:
        return self._partitions.get((topic, partition))

    def open_partitions(self) -> list[MemoryPartitionLog]:
        return list(self._partitions.values())

    def all_partitions(self) -> list[MemoryPartitionLog]:
        return [
            plog
            for info in self.topics()
            for index in range(info.partitions)
            if (plog := self._partitions.get((info.name, index))) is not None
        ]

    def apply_retention(self, now_ms: int) -> list[MemorySegment]:
        deleted: list[MemorySegment] = []
        for plog in self.all_partitions():
            deleted.extend(plog.apply_retention(now_ms))
        return deleted

    def due_for_flush(self, now_ms: int) -> list[MemoryPartitionLog]:
        return [plog for plog in self._partitions.values() if plog.flush_due(now_ms)]

    def checkpoint_recovery_points(self) -> None:
        """Nothing survives a restart here, so there is nothing to recover."""

    def close(self) -> None:
        for plog in self._partitions.values():
            plog.close()
        self._partitions.clear()
