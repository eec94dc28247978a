"""The log of one partition (Kafka's UnifiedLog): an ordered list of segments, the active one last.

Appends take a record batch as bytes, check it against the idempotent producer state, assign offsets in
place (the CRC does not cover them) and write it to the active segment; nothing decodes its records.
Reads return whole batches straight from the segments. Where the bytes live is the backend's business
(kbroker/storage/backend.py: files, or memory for handler tests); opening from disk is the loader's
(kbroker/storage/loader.py), and putting replacement segments in place the swap's (kbroker/storage/swap.py).

Partition state: the log end offset (next offset to assign), the high watermark (on a single node every
record is replicated once written, so the log moves it to the log end after each append; replication will
call update_high_watermark instead), the last stable offset (below the first open transaction) and the log
start offset are kept apart, with the leader epoch and its cache (leader_epochs.py). Whoever waits for
offsets to move (long-polling fetches) subscribes to PartitionEvents instead of being woken by the producer.

Opening after an unclean stop (loader.py) validates, CRC included, every segment from the one holding the
partition's recovery point (the offset below which all was fsynced, from recovery-point-offset-checkpoint), as
Kafka's recovery does; the segments before it are trusted. Kafka cuts the log at the first bad batch; here only a
torn end of the log is cut (its bytes kept in a ``.corrupt`` file first), and a bad batch with valid ones after it
stays in place as a corrupt range: reported at every start, its offsets answer CORRUPT_MESSAGE, the batches around
it are served. A batch that turns out broken while serving answers CORRUPT_MESSAGE, as Kafka's log read does, for
that partition only.

Threads: everything runs on the event loop except ``flush``, which may run in a worker thread while the loop
appends, rolls, truncates, swaps or deletes segments (see Segment's thread-safety contract).

Write failures (a full disk, an I/O error): an append either succeeds whole or leaves no trace (the segment is
cut back, nothing in memory moves) and answers KAFKA_STORAGE_ERROR; the next append tries again, so appends
resume at the right offset once space returns. The data directory is taken offline, as Kafka takes a log dir
offline, when its writes keep failing (``LogDirHealth.FAILURE_LIMIT`` failed writes in a row), when a failed
append cannot be undone, or when an fsync fails (Kafka treats that as fatal for the log dir: the page cache
may have dropped the data). Offline, every partition of the directory refuses appends, DeleteRecords and
retention with KAFKA_STORAGE_ERROR until the broker restarts and recovers the logs from disk. Reads go on:
Kafka stops serving the whole directory, but a single node has no other replica to serve them from, and
what is read (up to the in-memory log end, never past a failed write) is what was acknowledged.
"""

from __future__ import annotations

import errno
import logging
import threading
from bisect import bisect_right
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from kbroker.durable.files import (
    StorageError,
    describe_error,
)
from kbroker.storage import loader, swap
from kbroker.storage.api import PARTITION_EVENTS, PartitionEvent, PartitionEventListener
from kbroker.storage.backend import LOG_START_OFFSET_FILE, FileBackend, LogBackend
from kbroker.storage.descriptors import DescriptorCache
from kbroker.storage.leader_epochs import LeaderEpochCache, implicit_end_offset
from kbroker.storage.producer_state import ProducerStateTable, ProducerView
from kbroker.storage.recompress import TopicCompression, rebuild_batch
from kbroker.storage.segment import (
    FileRegion,
    Segment,
    SegmentTailDamaged,
    wall_clock_ms,
)
from kbroker.storage.swap import CLEANED_SUFFIX
from kbroker.storage.txn_index import (
    AbortedTransactions,
    AbortedTxn,
    read_marker,
)
from kbroker.storage.validation import (
    RecordValidationError,
    TimestampWindow,
    keyless_records,
    rejected_records_message,
    validate_batch,
)
from protocol.errors import ErrorCode, KafkaError
from protocol.exceptions import DecodeError
from protocol.records import (
    HEADER_SIZE,
    BatchHeader,
    assign_offsets,
    build_control_batch,
    decode_records,
    header_problem,
    iter_batches,
    validate_crc,
)

log = logging.getLogger("kbroker.storage")

LEADER_EPOCH = 0  # the epoch of a partition that never changed leader
PARTITION_METADATA_FILE = "partition.metadata"
PRODUCER_ID_EXPIRATION_MS = 86_400_000  # Kafka's producer.id.expiration.ms default
# The flags' bits, to combine an append's events as integers (PARTITION_EVENTS turns them into the event).
_APPENDED = PartitionEvent.APPENDED.value
_HIGH_WATERMARK = PartitionEvent.HIGH_WATERMARK.value
_STABLE_OFFSET = PartitionEvent.STABLE_OFFSET.value


class LogDirHealth:
    """Write failures of one data directory, shared by its partitions; offline (until a restart) when they
    keep failing, when a failed write could not be undone, or after a failed fsync.

    Each failure is logged once, one line with the path and the error; while the directory stays offline
    nothing more is logged. A write that failed because the process ran out of descriptors (EMFILE, ENFILE) is
    not counted: that is the process's limit, not the directory's fault, and it passes once connections close.
    """

    FAILURE_LIMIT = 10  # failed writes in a row (no write succeeding in between) before the directory goes offline

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offline_reason: str | None = None
        self.failures_in_a_row = 0

    @property
    def offline(self) -> bool:
        return self.offline_reason is not None

    def write_succeeded(self) -> None:
        self.failures_in_a_row = 0

    def write_failed(self, what: str, exc: BaseException, *, logged: bool = False) -> None:
        """A write that failed and was undone (nothing of it remains); ``logged``: the caller reported it."""
        if self.offline:
            return
        if not logged:
            log.error("%s failed: %s", what, describe_error(exc))
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS:
            return
        self.failures_in_a_row += 1
        if self.failures_in_a_row >= self.FAILURE_LIMIT:
            self.take_offline(
                f"{self.failures_in_a_row} writes in a row failed, the last: {what}: {describe_error(exc)}"
            )

    def take_offline(self, reason: str) -> None:
        if self.offline:
            return
        self.offline_reason = reason
        log.error("data directory %s is offline until the broker restarts: %s", self.path, reason)

    def storage_error(self, topic: str, partition: int) -> AppendResult:
        return AppendResult(
            ErrorCode.KAFKA_STORAGE_ERROR, f"{topic}-{partition}: data directory {self.path} is offline"
        )


_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


class OffsetOutOfRange(KafkaError):
    """A read below the log start offset or beyond the log end offset."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.OFFSET_OUT_OF_RANGE, message)


class LogConfig(NamedTuple):
    """The topic settings a partition log acts on, parsed from effective topic configs."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 86_400_000
    retention_ms: int = 7 * 86_400_000
    retention_bytes: int = -1
    max_message_bytes: int = 1_048_588
    message_timestamp_type: str = "CreateTime"
    timestamp_before_max_ms: int = 2**63 - 1
    timestamp_after_max_ms: int = 2**63 - 1
    flush_messages: int = 2**63 - 1
    flush_ms: int = 2**63 - 1
    index_interval_bytes: int = 4096
    cleanup_policy: str = "delete"
    compression: TopicCompression = TopicCompression()  # compression.type and its levels
    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    min_cleanable_dirty_ratio: float = 0.5
    min_insync_replicas: int = 1  # read by the replica layer (acks=all), not by the log

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy

    @classmethod
    def from_topic_configs(cls, configs: dict[str, str]) -> LogConfig:
        def number(key: str, default: int) -> int:
            return int(configs[key]) if key in configs else default

        base = cls()
        return cls(
            segment_bytes=number("segment.bytes", base.segment_bytes),
            segment_ms=number("segment.ms", base.segment_ms),
            retention_ms=number("retention.ms", base.retention_ms),
            retention_bytes=number("retention.bytes", base.retention_bytes),
            max_message_bytes=number("max.message.bytes", base.max_message_bytes),
            message_timestamp_type=configs.get("message.timestamp.type", base.message_timestamp_type),
            timestamp_before_max_ms=number("message.timestamp.before.max.ms", base.timestamp_before_max_ms),
            timestamp_after_max_ms=number("message.timestamp.after.max.ms", base.timestamp_after_max_ms),
            flush_messages=number("flush.messages", base.flush_messages),
            flush_ms=number("flush.ms", base.flush_ms),
            index_interval_bytes=number("index.interval.bytes", base.index_interval_bytes),
            cleanup_policy=configs.get("cleanup.policy", base.cleanup_policy),
            compression=TopicCompression.from_topic_configs(configs),
            delete_retention_ms=number("delete.retention.ms", base.delete_retention_ms),
            min_compaction_lag_ms=number("min.compaction.lag.ms", base.min_compaction_lag_ms),
            max_compaction_lag_ms=number("max.compaction.lag.ms", base.max_compaction_lag_ms),
            min_cleanable_dirty_ratio=float(configs.get("min.cleanable.dirty.ratio", base.min_cleanable_dirty_ratio)),
            min_insync_replicas=number("min.insync.replicas", base.min_insync_replicas),
        )

    def timestamp_window(self, now_ms: int) -> TimestampWindow | None:
        """The record timestamps a CreateTime topic accepts now; None for LogAppendTime (the broker sets them)."""
        if self.message_timestamp_type == "LogAppendTime":
            return None
        return TimestampWindow.around(now_ms, self.timestamp_before_max_ms, self.timestamp_after_max_ms)


class AppendResult(NamedTuple):
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str | None = None
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    record_errors: tuple[tuple[int, str], ...] = ()  # (batch index, message) of each record refused


class ReadChunk(NamedTuple):
    """Whole batches in one segment: where they are, and an upper bound of the offsets they hold.

    Nothing is read until asked: a fetch response sends the region straight from the file.
    """

    segment: Segment | None
    position: int
    size: int
    last_offset: int

    def read_bytes(self) -> bytes:
        if self.segment is None or self.size == 0:
            return b""
        return self.segment.read(self.position, self.size)

    def region(self) -> FileRegion | bytes:
        """The bytes as a region of the file that stays readable if the segment is deleted meanwhile."""
        if self.segment is None or self.size == 0:
            return b""
        return self.segment.region(self.position, self.size)


EMPTY_CHUNK = ReadChunk(None, 0, 0, -1)


def admit_batch(
    batch: bytearray | memoryview,
    header: BatchHeader | None,
    config: LogConfig,
    now_ms: int,
    log_append_time: bool,
    partition_name: str = "",
) -> BatchHeader | AppendResult:
    """The header of a batch either engine may append, or its refusal: a batch given without a header goes
    through the validator (kbroker/storage/validation.py) with the topic's limits; one with a header was
    validated by the caller, and only the framing is checked. A compacted topic refuses records without a key
    (``partition_name`` names the partition in the refusal, as Kafka's does)."""
    if header is None:
        try:
            window = None if log_append_time else config.timestamp_window(now_ms)
            header = validate_batch(
                batch, config.max_message_bytes, timestamps=window, target_codec=config.compression.codec
            )
        except RecordValidationError as exc:
            return AppendResult(exc.code, exc.message, record_errors=tuple(exc.record_errors))
        except KafkaError as exc:
            return AppendResult(exc.code, exc.message)
    if header.size != len(batch):
        return AppendResult(ErrorCode.INVALID_RECORD, "a produce request must hold exactly one batch per partition")
    if config.compacted and not header.is_control:
        try:
            keyless = keyless_records(batch, header)
        except DecodeError as exc:  # a key longer than its record: Kafka's InvalidRecordException
            return AppendResult(ErrorCode.INVALID_RECORD, str(exc))
        except KafkaError as exc:
            return AppendResult(exc.code, exc.message)
        if keyless:
            problem = f"Compacted topic cannot accept message without key in topic partition {partition_name}."
            return AppendResult(
                ErrorCode.INVALID_RECORD,
                rejected_records_message([problem] * len(keyless), keyless),
                record_errors=tuple((index, problem) for index in keyless),
            )
    return header


def stored_form(
    batch: bytearray | memoryview, header: BatchHeader, config: LogConfig
) -> tuple[bytearray | memoryview, BatchHeader] | AppendResult:
    """The batch as the log keeps it: rebuilt in the topic's codec when compression.type asks for another one
    (kbroker/storage/recompress.py), else the batch itself; or the refusal of a rebuilt batch."""
    if not config.compression.rebuilds(header):
        return batch, header
    try:
        return rebuild_batch(batch, header, config.compression, config.max_message_bytes)
    except KafkaError as exc:
        return AppendResult(exc.code, exc.message)


def producer_answer(producers: ProducerStateTable, header: BatchHeader, log_start_offset: int) -> AppendResult | None:
    """The idempotent producer checks (kbroker/storage/producer_state.py) for a batch: None to append it, else the
    answer without appending: an error, or a retried batch's first offsets."""
    if header.producer_id < 0:
        return None
    check = producers.check(header)
    if check.error_code != ErrorCode.NONE:
        return AppendResult(check.error_code, check.error_message)
    if check.duplicate_of is not None:
        return AppendResult(
            base_offset=check.duplicate_of.first_offset, log_append_time_ms=-1, log_start_offset=log_start_offset
        )
    return None


def first_matching_record(
    header: BatchHeader, batch: bytes | None, log_start_offset: int, match: Callable[[int], bool], where: str
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record of ``batch`` at or above the log start whose timestamp ``match``es.

    A LogAppendTime batch has one timestamp for all its records, so its records need not be read (``batch`` may
    be None); a batch that cannot be decoded answers its own first offset and max timestamp, as a best effort.
    """
    if header.is_log_append_time:
        return max(header.base_offset, log_start_offset), header.max_timestamp
    if batch is None:
        return None
    try:
        records = decode_records(batch)
    except DecodeError as exc:
        log.warning("%s: cannot decode batch at %d: %s", where, header.base_offset, exc)
        return header.base_offset, header.max_timestamp
    for record in records:
        timestamp = header.base_timestamp + record.timestamp_delta
        offset = header.base_offset + record.offset_delta
        if match(timestamp) and offset >= log_start_offset:
            return offset, timestamp
    return None


def offset_of_max_timestamp(header: BatchHeader, batch: bytes | None, where: str) -> int | None:
    """Kafka's RecordBatch.offsetOfMaxTimestamp: the offset of the batch's first record whose timestamp is its max
    timestamp, whatever the log start offset (first_matching_record with no lower bound)."""
    found = first_matching_record(header, batch, 0, lambda timestamp: timestamp == header.max_timestamp, where)
    return None if found is None else found[0]


class PartitionLog:
    def __init__(
        self,
        topic: str,
        partition: int,
        directory: Path,
        config: LogConfig,
        *,
        clean: bool,
        health: LogDirHealth | None = None,
        recovery_point: int = 0,
        descriptors: DescriptorCache | None = None,
        backend: LogBackend | None = None,
        high_watermark: int | None = None,
    ) -> None:
        """``clean``: the broker stopped cleanly, every segment and index is trusted. Otherwise the segments from
        the one holding ``recovery_point`` (everything below it was fsynced: the recovery-point-offset-checkpoint)
        are validated batch by batch, CRC included, as Kafka's recovery; unlike it, only the end of the log is cut
        (its bytes kept aside), and a corrupt batch followed by valid ones is kept and reported (Segment._recover).

        ``backend``: where the bytes live (kbroker/storage/backend.py); by default files in ``directory``. A log
        whose backend is not durable starts empty (``directory`` only names it).
        ``high_watermark``: where the high watermark starts, bounded by the log (the replica layer's
        replication-offset-checkpoint); None: at the log end, as a log on its own is its whole ISR."""
        self.topic = topic
        self.partition = partition
        self._name = f"{topic}-{partition}"  # as refusals name it (made once, not for every append)
        self.directory = directory
        self.config = config
        # Shared by every partition of the data directory (LogManager passes it); a lone log has its own.
        self.health = health if health is not None else LogDirHealth(directory.parent)
        # The broker's open segment files, a bounded set (LogManager passes it); a lone log has its own.
        self.descriptors = descriptors if descriptors is not None else DescriptorCache()
        self.backend: LogBackend = backend if backend is not None else FileBackend(directory, self.descriptors)
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self.producers = ProducerStateTable()
        self.aborted = AbortedTransactions()  # the .txnindex entries of every segment (txn_index.py)
        # Message counts for flush.messages: appends bump one on the loop, flush (any thread) the other.
        self._appended_messages = 0
        self._flushed_messages = 0
        self._flush_lock = threading.Lock()
        self._last_flush_ms = wall_clock_ms()
        self.log_start_offset = 0
        self._high_watermark = 0
        self._last_stable_offset = 0
        self._listeners: dict[int, PartitionEventListener] = {}
        self._next_listener_id = 0
        # Transactions ended by a marker the high watermark has not passed yet, (first offset, marker offset) in
        # marker order: they stay unstable until it has (Kafka's unreplicated transactions). Only with followers.
        self._unreplicated_txns: list[tuple[int, int]] = []
        # A single node is its whole ISR: an append is replicated once written. Replication turns this off
        # and moves the high watermark with update_high_watermark.
        self.high_watermark_follows_appends = True
        self._reported_damage: set[str] = set()  # problems of segments found while serving, each logged once
        if self.backend.durable:
            directory.mkdir(parents=True, exist_ok=True)
            loader.load(self, clean, recovery_point)
            self.leader_epochs = loader.load_leader_epochs(self)
        else:
            self.segments = [self.backend.new_segment(0, config.index_interval_bytes, wall_clock_ms())]
            self._bases = [0]
            self.leader_epochs = LeaderEpochCache(None)
        if not self.leader_epochs.entries:
            # Kafka writes the first entry when the replica becomes leader. Epoch 0 from the log start is what a
            # log without the file has (one written before epochs were kept too), so it is only assumed, and the
            # first append does not write and fsync a file on the event loop (a new 1,000-partition topic's first
            # produce took a second and a half doing that); the file is written when another epoch begins.
            self.leader_epochs.assume_first(LEADER_EPOCH, self.log_start_offset)
        self.leader_epoch = max(self.leader_epochs.latest_epoch, LEADER_EPOCH)
        end = self.log_end_offset
        self._high_watermark = end if high_watermark is None else max(self.log_start_offset, min(high_watermark, end))
        self._last_stable_offset = self._stable_offset_for(self._high_watermark)

    # --- segments -----------------------------------------------------------------------------------

    def segments_changed(self) -> None:
        """The list of segments was replaced (loading, a swap): the base offsets that reads bisect follow it."""
        self._bases = [s.base_offset for s in self.segments]

    def txn_entries_of(self, segment: Segment) -> list[AbortedTxn]:
        return self.aborted.in_range(segment.base_offset, segment.next_offset)

    @property
    def recovery_point(self) -> int:
        """The offset below which everything is on disk (fsynced): the base of the first segment with writes not
        yet fsynced, else the log end. Any thread (flush runs in one)."""
        for segment in list(self.segments):
            if segment.dirty:
                return segment.base_offset
        return self.log_end_offset

    # --- offsets -------------------------------------------------------------------------------------

    @property
    def active(self) -> Segment:
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

    def _first_open_transaction_offset(self) -> int | None:
        return self.producers.first_ongoing_offset()

    def _stable_offset_for(self, high_watermark: int) -> int:
        first_open = self._first_open_transaction_offset()
        if self._unreplicated_txns:
            pending = self._unreplicated_txns
            while pending and pending[0][1] < high_watermark:
                pending.pop(0)
            if pending:
                first_unreplicated = min(first for first, _ in pending)
                first_open = first_unreplicated if first_open is None else min(first_open, first_unreplicated)
        if first_open is None:
            return high_watermark
        # As Kafka: an open transaction whose first records retention deleted holds it at the log start.
        return min(high_watermark, max(first_open, self.log_start_offset))

    def update_high_watermark(self, offset: int) -> bool:
        """Move the high watermark up to ``offset`` (clamped to the log); returns whether it moved."""
        offset = max(self.log_start_offset, min(offset, self.log_end_offset))
        if offset <= self._high_watermark:
            return False
        self._emit(self._advance_high_watermark(offset))
        return True

    def _advance_high_watermark(self, offset: int) -> PartitionEvent:
        """Set the high watermark (and the stable offset with it); the events that apply, not yet sent."""
        changed = 0
        if offset != self._high_watermark:
            self._high_watermark = offset
            changed = _HIGH_WATERMARK
        stable = self._stable_offset_for(offset)
        if stable != self._last_stable_offset:
            self._last_stable_offset = stable
            changed |= _STABLE_OFFSET
        return PARTITION_EVENTS[changed]

    def set_high_watermark(self, offset: int) -> None:
        """A follower's high watermark, as its leader said (clamped to the log): it may also go down, as
        Kafka's follower takes the leader's value after a truncation."""
        offset = max(self.log_start_offset, min(offset, self.log_end_offset))
        self._emit(self._advance_high_watermark(offset))

    # --- leader epochs -------------------------------------------------------------------------------

    def assign_leader_epoch(self, epoch: int) -> None:
        """Start leader epoch ``epoch`` at the log end (as Kafka's leader does on becoming leader)."""
        if epoch <= self.leader_epoch:
            raise KafkaError(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"leader epoch {epoch} of {self.topic}-{self.partition} is not newer than {self.leader_epoch}",
            )
        self.leader_epoch = epoch
        self.leader_epochs.assign(epoch, self.log_end_offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: (the largest epoch <= ``epoch``, where it ends), or (-1, -1)."""
        if not self.leader_epochs.entries:
            # Nothing appended yet: Kafka's cache holds (current epoch, log end) from when the leader took over.
            return implicit_end_offset(epoch, self.leader_epoch, self.log_end_offset)
        return self.leader_epochs.end_offset_for(epoch, self.log_end_offset)

    # --- events --------------------------------------------------------------------------------------

    def subscribe(self, listener: PartitionEventListener) -> Callable[[], None]:
        """Call ``listener`` after each change (on the thread making it); the returned callable unsubscribes."""
        key = self._next_listener_id
        self._next_listener_id += 1
        self._listeners[key] = listener

        def unsubscribe() -> None:
            self._listeners.pop(key, None)

        return unsubscribe

    def _emit(self, event: PartitionEvent) -> None:
        if not event:
            return
        for listener in list(self._listeners.values()):  # a listener may unsubscribe while called
            try:
                listener(event)
            except Exception:
                log.exception("%s-%d: a partition event listener failed", self.topic, self.partition)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping [start, end), as Kafka's
        collectAbortedTransactions: from the entries of the segment holding ``start_offset`` on."""
        segment_base = self._bases[self._segment_index_for(start_offset)]
        return self.aborted.collect(segment_base, start_offset, end_offset)

    def ongoing_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction in this partition."""
        return dict(self.producers.ongoing)

    def has_ongoing_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """The producer has a transaction open here at this epoch (Kafka's hasOngoingTransaction: such a batch
        needs no verification by the transaction coordinator)."""
        entry = self.producers.producers.get(producer_id)
        return (
            entry is not None and entry.epoch == producer_epoch and self.producers.ongoing.get(producer_id) is not None
        )

    def producers_view(self) -> list[ProducerView]:
        """Every producer this partition knows, as DescribeProducers reports them."""
        return self.producers.views()

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # --- appending -----------------------------------------------------------------------------------

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
        admitted = admit_batch(batch, header, self.config, now_ms, timestamp_type_log_append, self._name)
        if isinstance(admitted, AppendResult):
            return admitted
        header = admitted
        if self.health.offline:
            return self.health.storage_error(self.topic, self.partition)
        answer = producer_answer(self.producers, header, self.log_start_offset)
        if answer is not None:
            return answer
        if self.config.compression.codec is not None:  # compression.type=producer (the default) skips this
            form = stored_form(batch, header, self.config)
            if isinstance(form, AppendResult):
                return form
            batch, header = form
        base_offset = self.log_end_offset
        append_time = now_ms if timestamp_type_log_append else None
        epoch = self.leader_epoch
        assign_offsets(batch, base_offset, partition_leader_epoch=epoch, log_append_time_ms=append_time)
        header = BatchHeader.parse(batch)
        failure = self._write_batch(batch, header, now_ms)
        if failure is not None:
            return failure
        if header.producer_id >= 0:
            self.producers.record(header)
        self._appended_messages += header.records_count
        result = AppendResult(
            base_offset=base_offset,
            log_append_time_ms=append_time if append_time is not None else -1,
            log_start_offset=self.log_start_offset,
        )
        moved = 0
        if self.high_watermark_follows_appends:
            moved = self._advance_high_watermark(self.log_end_offset)._value_
        self._emit(PARTITION_EVENTS[_APPENDED | moved])
        return result

    def _write_batch(self, batch: bytearray | memoryview, header: BatchHeader, now_ms: int) -> AppendResult | None:
        """Roll if due and write the batch: None when written, else the failure answer (nothing was written)."""
        rolling = True  # what failed, named only if something does (not formatted for every append)
        try:
            self._maybe_roll(len(batch), now_ms)  # a failed roll leaves the old segment active
            rolling = False
            if self.leader_epochs.latest_epoch != header.partition_leader_epoch:
                # The first batch of this epoch (Kafka does it here too); a failed append leaves it harmless.
                self.leader_epochs.assign(header.partition_leader_epoch, header.base_offset)
            self.active.append(batch, header)  # all or nothing, or SegmentTailDamaged
        except SegmentTailDamaged as exc:
            self.health.take_offline(str(exc))
            return self.health.storage_error(self.topic, self.partition)
        except (OSError, StorageError) as exc:
            what = (
                f"roll of {self.topic}-{self.partition} at offset {header.base_offset}"
                if rolling
                else f"append to {self.active.log_path}"
            )
            self.health.write_failed(what, exc)
            return AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, f"{what} failed: {describe_error(exc)}")
        self.health.write_succeeded()
        return None

    def _maybe_roll(self, incoming: int, now: int) -> None:
        active = self.active
        if active.size == 0:
            return
        too_big = active.size + incoming > self.config.segment_bytes
        segment_ms = self.config.segment_ms
        if self.config.compacted:  # as Kafka: a record must leave the active segment within max.compaction.lag.ms
            segment_ms = min(segment_ms, self.config.max_compaction_lag_ms)
        too_old = now - active.created_ms >= segment_ms
        if too_big or too_old:
            self.roll(now)

    def roll(self, now: int | None = None) -> Segment:
        """Seal the active segment (indexes written, data fsynced) and start a new one at the log end."""
        old = self.active
        if old.size == 0:
            return old
        if not old.fsync():
            # Kafka treats a failed fsync as fatal for the log dir: the page cache may have dropped the data.
            self.health.take_offline(f"fsync of {old.log_path} failed")
            raise StorageError(f"cannot roll {self.topic}-{self.partition}: fsync of {old.log_path} failed")
        old.write_indexes()  # on failure the old segment stays active and its index files are rebuilt if needed
        # Durable before the next segment exists: a segment below the recovery point is trusted with its file.
        self.backend.save_txn_index(old.base_offset, self.txn_entries_of(old))
        segment = self.backend.new_segment(old.next_offset, self.config.index_interval_bytes, now or wall_clock_ms())
        self.segments.append(segment)
        self._bases.append(segment.base_offset)
        self.producers.expire((now or wall_clock_ms()) - PRODUCER_ID_EXPIRATION_MS)
        try:
            self.backend.save_producer_snapshot(self.producers, segment.base_offset)
        except OSError as exc:  # the roll is done; a missing snapshot only means rebuilding from the log
            log.warning("%s-%d: producer snapshot not written: %s", self.topic, self.partition, describe_error(exc))
        log.debug("%s-%d: rolled segment at offset %d", self.topic, self.partition, segment.base_offset)
        return segment

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
        """Write a commit or abort marker (a control batch as Kafka's) ending the producer's transaction here.

        An abort is added to the aborted transaction index; the last stable offset moves past the transaction.
        A marker for a producer with no open transaction is written all the same, as Kafka does.
        """
        if now_ms is None:
            now_ms = wall_clock_ms()
        if self.health.offline:
            return self.health.storage_error(self.topic, self.partition)
        check = self.producers.check_marker(
            producer_id, producer_epoch, coordinator_epoch, transaction_version=transaction_version
        )
        if check.error_code != ErrorCode.NONE:
            return AppendResult(check.error_code, check.error_message)
        base_offset = self.log_end_offset
        log_append = self.config.message_timestamp_type == "LogAppendTime"
        batch = bytearray(build_control_batch(producer_id, producer_epoch, commit, coordinator_epoch, 0, now_ms))
        assign_offsets(
            batch,
            base_offset,
            partition_leader_epoch=self.leader_epoch,
            log_append_time_ms=now_ms if log_append else None,
        )
        header = BatchHeader.parse(batch)
        failure = self._write_batch(batch, header, now_ms)
        if failure is not None:
            return failure
        stable_after = self.producers.stable_offset_after_marker(producer_id, base_offset)
        first = self.producers.complete_txn(producer_id, producer_epoch, coordinator_epoch, header.max_timestamp)
        if first is not None and not commit:
            self.aborted.add(AbortedTxn(producer_id, first, base_offset, stable_after))
        if first is not None and not self.high_watermark_follows_appends:
            self._unreplicated_txns.append((first, base_offset))
        self._appended_messages += 1
        if self.high_watermark_follows_appends:
            moved = self._advance_high_watermark(self.log_end_offset)
        else:
            moved = self._advance_high_watermark(self._high_watermark)  # the stable offset may move alone
        self._emit(PARTITION_EVENTS[_APPENDED | moved._value_])
        return AppendResult(
            base_offset=base_offset,
            log_append_time_ms=now_ms if log_append else -1,
            log_start_offset=self.log_start_offset,
        )

    def append_as_follower(self, records: bytes | bytearray | memoryview, now_ms: int | None = None) -> AppendResult:
        """Append the batches a leader's fetch answer holds as they are (Kafka's appendAsFollower): their offsets,
        leader epochs and timestamps are the leader's, the epoch cache learns each new epoch from its first batch,
        and producer state and transaction markers are applied without the leader's checks (they were made
        there). A trailing partial batch (a fetch answer may end with one) is left for the next fetch.

        Every batch is checked before anything is written: framing and CRC (CORRUPT_MESSAGE), size
        (MESSAGE_TOO_LARGE), offsets increasing from the log end (OFFSET_OUT_OF_RANGE, Kafka's
        UnexpectedAppendOffsetException and OffsetsOutOfOrderException). The answer's base offset is the first
        batch's; nothing to append answers the log end. The high watermark is left to ``set_high_watermark``.
        """
        if now_ms is None:
            now_ms = wall_clock_ms()
        if self.health.offline:
            return self.health.storage_error(self.topic, self.partition)
        batches: list[tuple[BatchHeader, memoryview, tuple[bool, int] | None]] = []
        expected = self.log_end_offset
        try:
            for header, view in iter_batches(records):
                problem = header_problem(header)
                if problem is None and not validate_crc(view):
                    problem = f"the CRC of the batch at offset {header.base_offset} does not match its bytes"
                if problem is not None:
                    return AppendResult(ErrorCode.CORRUPT_MESSAGE, f"{self._name}: {problem}")
                if header.size > self.config.max_message_bytes:
                    return AppendResult(
                        ErrorCode.MESSAGE_TOO_LARGE,
                        f"the batch at offset {header.base_offset} is {header.size} bytes, larger than "
                        f"max.message.bytes {self.config.max_message_bytes}",
                    )
                if header.base_offset < expected:
                    return AppendResult(
                        ErrorCode.OFFSET_OUT_OF_RANGE,
                        f"{self._name}: a batch at offset {header.base_offset} cannot follow offset {expected - 1}",
                    )
                marker = read_marker(view) if header.is_control and header.producer_id >= 0 else None
                batches.append((header, view, marker))
                expected = header.next_offset
        except DecodeError as exc:
            return AppendResult(ErrorCode.CORRUPT_MESSAGE, f"{self._name}: {exc}")
        if not batches:
            return AppendResult(base_offset=self.log_end_offset, log_start_offset=self.log_start_offset)
        for header, view, marker in batches:
            failure = self._write_batch(view, header, now_ms)
            if failure is not None:  # the batches before it stay: each write is whole
                return failure
            if header.partition_leader_epoch > self.leader_epoch:
                self.leader_epoch = header.partition_leader_epoch
            self._appended_messages += header.records_count
            if header.producer_id < 0:
                continue
            if marker is None:
                if not header.is_control:
                    self.producers.record(header)
                continue
            commit, coordinator_epoch = marker
            stable_after = self.producers.stable_offset_after_marker(header.producer_id, header.base_offset)
            first = self.producers.complete_txn(
                header.producer_id, header.producer_epoch, coordinator_epoch, header.max_timestamp
            )
            if first is not None and not commit:
                self.aborted.add(AbortedTxn(header.producer_id, first, header.base_offset, stable_after))
            if first is not None:
                self._unreplicated_txns.append((first, header.base_offset))
        moved = self._advance_high_watermark(self._high_watermark)  # a marker may move the stable offset alone
        self._emit(PARTITION_EVENTS[_APPENDED | moved._value_])
        return AppendResult(base_offset=batches[0][0].base_offset, log_start_offset=self.log_start_offset)

    # --- flushing ------------------------------------------------------------------------------------

    @property
    def _unflushed_messages(self) -> int:
        return self._appended_messages - self._flushed_messages

    @property
    def needs_flush(self) -> bool:
        return self._unflushed_messages >= self.config.flush_messages

    def flush_due(self, now: int) -> bool:
        return self._unflushed_messages > 0 and now - self._last_flush_ms >= self.config.flush_ms

    def flush(self) -> None:
        """fsync what was written; safe to call from a worker thread while the event loop changes the log."""
        self.sync()

    def sync(self) -> bool:
        """``flush``, returning whether everything appended before it is on disk (False: the directory went offline).

        Only the messages appended before it started count as flushed: those were written to segments
        that are in the list copied below, or were sealed (fsynced) at a roll, or are gone. A failed fsync
        takes the data directory offline (Kafka's rule): what it should have synced may be lost already.
        """
        if self.health.offline:
            return False
        appended = self._appended_messages
        started_ms = wall_clock_ms()
        for segment in list(self.segments):  # copied at once under the GIL; the loop may change the list
            if segment.dirty and not segment.fsync():
                self.health.take_offline(f"fsync of {segment.log_path} failed")
                return False  # the counts stay: nothing after this is acknowledged as flushed
        with self._flush_lock:
            self._flushed_messages = max(self._flushed_messages, appended)
            self._last_flush_ms = max(self._last_flush_ms, started_ms)
        return True

    # --- reading -------------------------------------------------------------------------------------

    def _segment_index_for(self, offset: int) -> int:
        i = bisect_right(self._bases, offset) - 1
        return max(i, 0)

    def read(
        self, offset: int, max_bytes: int, *, max_offset: int | None = None, min_one_batch: bool = True
    ) -> ReadChunk:
        """Whole batches from ``offset`` (which may fall inside the first one), up to ``max_bytes``.

        Batches at or beyond ``max_offset`` (the high watermark or last stable offset) are left out. With
        ``min_one_batch`` the first batch is returned whole even when it is larger than ``max_bytes``.

        A structurally broken batch on the way (a bad length field) is CORRUPT_MESSAGE, as Kafka answers the
        CorruptRecordException its log read raises; a failing disk read is KAFKA_STORAGE_ERROR. Either is
        logged once with the segment's path; other partitions are not affected.
        """
        try:
            return self._read(offset, max_bytes, max_offset=max_offset, min_one_batch=min_one_batch)
        except DecodeError as exc:
            raise self._read_failed(ErrorCode.CORRUPT_MESSAGE, str(exc)) from None
        except OSError as exc:
            raise self._read_failed(ErrorCode.KAFKA_STORAGE_ERROR, f"{describe_error(exc)}") from None

    def _read_failed(self, code: ErrorCode, problem: str) -> KafkaError:
        if problem not in self._reported_damage:
            self._reported_damage.add(problem)
            log.error("%s-%d cannot be read: %s", self.topic, self.partition, problem)
        return KafkaError(code, f"{self.topic}-{self.partition} cannot be read: {problem}")

    def _read(self, offset: int, max_bytes: int, *, max_offset: int | None, min_one_batch: bool) -> ReadChunk:
        end_offset = self.log_end_offset
        if offset < self.log_start_offset or offset > end_offset:
            raise OffsetOutOfRange(
                f"offset {offset} is outside {self.log_start_offset}..{end_offset} of {self.topic}-{self.partition}"
            )
        upper = end_offset if max_offset is None else min(max_offset, end_offset)
        if offset >= upper:
            return EMPTY_CHUNK
        i = self._segment_index_for(offset)
        corrupt = self.segments[i].corrupt_range_at(offset)
        if corrupt is not None:
            raise DecodeError(
                f"{corrupt.describe(self.segments[i].log_path)} (found at start-up; the next readable offset is "
                f"{corrupt.last_offset + 1})"
            )
        while i < len(self.segments) and self.segments[i].next_offset <= offset:
            i += 1  # the offset is in a gap after a segment's last batch
        if i == len(self.segments):
            return EMPTY_CHUNK
        segment = self.segments[i]
        start = segment.position_of(offset)
        end = segment.size if upper >= segment.next_offset else segment.position_of(upper)
        corrupt_from = segment.corrupt_position_after(start)
        if corrupt_from is not None:
            end = min(end, corrupt_from)  # the batches before a corrupt range; the next read answers its error
        if end <= start:
            return EMPTY_CHUNK
        if end - start <= max_bytes:
            # All of it fits; both ends are batch boundaries, so nothing needs reading.
            return ReadChunk(segment, start, end - start, min(upper, segment.next_offset) - 1)
        boundary, last_offset = segment.last_boundary(start, start + max(max_bytes, 0))
        if boundary > start:
            return ReadChunk(segment, start, boundary - start, last_offset)
        if not min_one_batch:
            return EMPTY_CHUNK
        first = BatchHeader.parse(segment.read(start, HEADER_SIZE))
        return ReadChunk(segment, start, first.size, first.last_offset)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """The first record with a timestamp at least ``timestamp``: (offset, its timestamp), or None."""
        for segment in self.segments:
            first = segment.first_batch_at_timestamp(timestamp)
            if first is None:
                continue
            # Usually the first batch holds it; not when its matching records are all below the log start.
            for scanned in segment.scan(segment.position_of(first.base_offset)):
                header = scanned.header
                if header.max_timestamp < timestamp or header.last_offset < self.log_start_offset:
                    continue
                found = self._record_at_timestamp(segment, header, lambda ts: ts >= timestamp)
                if found is not None:
                    return found
        return None

    def max_timestamp(self) -> tuple[int, int] | None:
        """ListOffsets MAX_TIMESTAMP as Kafka's UnifiedLog answers it: (offset, timestamp) of the first record
        carrying the max timestamp of the first batch reaching the max timestamp of the first segment with the
        largest one; None for an empty log. As in Kafka the log start offset plays no part: after DeleteRecords
        within that segment the answer may lie below it (until the segment itself is deleted)."""
        if not self.segments:
            return None
        best = self.segments[0]
        for segment in self.segments[1:]:
            if segment.max_timestamp > best.max_timestamp:
                best = segment
        header = best.first_batch_at_timestamp(best.max_timestamp)
        if header is None:
            return None
        offset = offset_of_max_timestamp(header, best.batch_at(header.base_offset), f"{self.topic}-{self.partition}")
        return None if offset is None else (offset, header.max_timestamp)

    def _record_at_timestamp(
        self, segment: Segment, header: BatchHeader, match: Callable[[int], bool]
    ) -> tuple[int, int] | None:
        batch = None if header.is_log_append_time else segment.batch_at(header.base_offset)
        return first_matching_record(header, batch, self.log_start_offset, match, f"{self.topic}-{self.partition}")

    # --- deleting ------------------------------------------------------------------------------------

    def delete_records(self, offset: int) -> None:
        """Move the log start offset to ``offset`` (DeleteRecords) and drop the segments wholly before it but the
        active one: as in Kafka, that stays, whatever it holds, until rolled (then apply_retention deletes it)."""
        if offset <= self.log_start_offset:
            return
        if self.health.offline:
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR, self.health.storage_error(self.topic, self.partition).error_message
            )
        try:
            self._set_log_start_offset(min(offset, self.log_end_offset))
        except OSError as exc:  # the log start offset file is as it was: nothing moved
            what = f"DeleteRecords on {self.topic}-{self.partition} (writing {self.directory / LOG_START_OFFSET_FILE})"
            self.health.write_failed(what, exc)
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"{what} failed: {describe_error(exc)}") from None
        self._delete_segments_quietly(self.log_start_offset, keep_active=True)

    def _delete_segments_quietly(self, offset: int, *, keep_active: bool = False) -> list[Segment]:
        """Delete segments wholly before the (already durable) log start ``offset``; a failure is only logged:
        the segments are below the log start, never read, and deleted again at the next attempt."""
        try:
            return self._delete_segments_before(offset, keep_active=keep_active)
        except (OSError, StorageError) as exc:
            log.warning(
                "%s-%d: segments before offset %d not deleted yet: %s",
                self.topic,
                self.partition,
                offset,
                describe_error(exc),
            )
            return []

    def _set_log_start_offset(self, offset: int) -> None:
        # Durable (file and directory fsynced) before DeleteRecords answers: a crash must not bring records back.
        self.backend.save_log_start_offset(offset)
        self.log_start_offset = offset
        self.leader_epochs.truncate_from_start(offset)
        # As Kafka: the high watermark is never below the log start; the stable offset may move with it.
        self._emit(self._advance_high_watermark(max(self._high_watermark, offset)))

    def _delete_segments_before(self, offset: int, *, keep_active: bool = False) -> list[Segment]:
        doomed = []
        while self.segments and self.segments[0].next_offset <= offset and self.segments[0].size > 0:
            if len(self.segments) == 1:
                if keep_active:
                    break
                self.roll()
            doomed.append(self.segments.pop(0))
            self._bases.pop(0)
        for segment in doomed:
            segment.delete()
            self.backend.remove_txn_index(segment.base_offset)  # the aborted index goes too
            log.info("%s-%d: deleted %s", self.topic, self.partition, segment)
        if doomed:
            self.aborted.drop_before(self.segments[0].base_offset)
        return doomed

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is at least ``offset`` (a batch holding ``offset`` goes whole).

        For replication (a follower dropping what the leader does not have). Durable before it returns.
        Nothing waits for offsets to go down, so no event is sent. At or past the log end nothing is cut but an
        epoch starting at the log end (begun as leader, nothing appended in it), as Kafka's truncateTo: kept,
        it would make the follower's last epoch one its leader never had, and every fetch diverge again.
        """
        if offset >= self.log_end_offset:
            self.leader_epochs.truncate_from_end(self.log_end_offset)
            return
        if offset < self.log_start_offset:
            raise OffsetOutOfRange(
                f"cannot truncate {self.topic}-{self.partition} to {offset}, below its log start offset "
                f"{self.log_start_offset}"
            )
        keep = bisect_right(self._bases, offset) - 1  # the segment holding ``offset``; 0 at the log start
        # Newest first, so a crash part-way leaves a shorter prefix of the log, never a gap.
        for segment in reversed(self.segments[keep + 1 :]):
            segment.delete()
            self.backend.remove_txn_index(segment.base_offset)
        del self.segments[keep + 1 :]
        del self._bases[keep + 1 :]
        cut = self.segments[keep]
        cut.truncate_to(offset)
        if not cut.fsync():
            self.health.take_offline(f"fsync of {cut.log_path} failed")
            raise StorageError(f"cannot fsync {cut.log_path} after truncating it to offset {offset}")
        if cut.has_index_files():
            cut.write_indexes()  # a sealed segment's index files would point past the cut
        self.backend.sync_directory()
        end = self.log_end_offset
        log.info("%s-%d: truncated to offset %d (log end offset %d)", self.topic, self.partition, offset, end)
        if end < self.log_start_offset:  # the cut removed a batch that held the log start offset
            self._set_log_start_offset(end)
        self._high_watermark = min(self._high_watermark, end)
        self.leader_epochs.truncate_from_end(end)
        self.backend.remove_producer_snapshots_from(end)
        self.aborted.drop_from(end)
        self.backend.save_txn_index(cut.base_offset, self.txn_entries_of(cut))
        self.producers = ProducerStateTable()
        loader.rebuild_producer_state(self)
        self._unreplicated_txns = [txn for txn in self._unreplicated_txns if txn[1] < end]
        self._last_stable_offset = self._stable_offset_for(self._high_watermark)  # open transactions rebuilt

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every batch and start the log empty at ``offset`` (Kafka's truncateFullyAndStartAt: a follower
        whose log ends before its leader's log start). The epoch cache is cleared; its next batch starts one.
        Durable before it returns: the segments are deleted newest first, then the new one exists, then the log
        start offset is saved (a crash part-way leaves a shorter log, which fetching from the leader repairs)."""
        for segment in reversed(self.segments):
            segment.delete()
            self.backend.remove_txn_index(segment.base_offset)
        self.segments = [self.backend.new_segment(offset, self.config.index_interval_bytes, wall_clock_ms())]
        self._bases = [offset]
        self.backend.sync_directory()
        self.backend.save_log_start_offset(offset)
        self.log_start_offset = offset
        self.leader_epochs.clear()
        self.backend.remove_producer_snapshots_from(0)
        self.aborted.drop_from(0)
        self.producers = ProducerStateTable()
        self._unreplicated_txns = []
        self._high_watermark = offset
        self._last_stable_offset = offset
        log.info("%s-%d: truncated fully, the log starts at offset %d", self.topic, self.partition, offset)

    # --- segment swaps (log cleaner, recompression) --------------------------------------------------

    def new_cleaned_segment(self, base_offset: int) -> Segment:
        """An empty replacement segment (``<base>.log.cleaned``) for the caller to fill, then swap in."""
        self.backend.discard_replacement(base_offset, CLEANED_SUFFIX)  # left over from an attempt given up
        return self.backend.new_segment(base_offset, self.config.index_interval_bytes, wall_clock_ms(), CLEANED_SUFFIX)

    def swap_segments(
        self,
        replaced: list[Segment],
        replacements: list[Segment],
        *,
        prepared: bool = False,
        aborted: list[AbortedTxn] | None = None,
    ) -> None:
        """Put ``replacements`` (from new_cleaned_segment) in place of the contiguous sealed ``replaced``, each
        step durable before the next (kbroker/storage/swap.py); SegmentSwapInterrupted if it failed part-way."""
        swap.swap_segments(self, replaced, replacements, prepared=prepared, aborted=aborted)

    def apply_retention(self, now: int) -> list[Segment]:
        """Delete whole segments past retention.ms or beyond retention.bytes, and those DeleteRecords left wholly
        below the log start (once they are not the active one); returns what was deleted."""
        if self.health.offline:
            return []
        if "delete" not in self.config.cleanup_policy:
            return self._delete_segments_quietly(self.log_start_offset, keep_active=True)
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
            return self._delete_segments_quietly(self.log_start_offset, keep_active=True)
        try:
            self._set_log_start_offset(new_start)
        except OSError as exc:
            self.health.write_failed(f"retention of {self.topic}-{self.partition}", exc)
            return []
        return self._delete_segments_quietly(new_start)

    # --- lifecycle -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Clean shutdown: data fsynced, indexes and a producer snapshot written, files closed.

        If the directory is offline, or any of that fails, the files are only closed: the next start recovers
        the log from its batches (LogManager then writes no clean-shutdown marker).
        """
        try:
            if not self.health.offline:
                if not self.sync():
                    raise StorageError(f"fsync of {self.topic}-{self.partition} failed")
                self.active.write_indexes()
                self.backend.save_txn_index(self.active.base_offset, self.txn_entries_of(self.active))
                self.backend.save_producer_snapshot(self.producers, self.log_end_offset)
        except (OSError, StorageError) as exc:
            self.health.take_offline(f"closing {self.topic}-{self.partition} failed: {describe_error(exc)}")
        finally:
            for segment in self.segments:
                segment.close()

    def delete(self) -> None:
        for segment in self.segments:
            segment.close()

    def update_config(self, config: LogConfig) -> None:
        self.config = config
        for segment in self.segments:
            segment.index_interval_bytes = config.index_interval_bytes
