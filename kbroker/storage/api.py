"""The storage interface: what the broker and the request handlers may ask of a partition log and of the store.

Two engines implement it: the disk engine (kbroker/storage/partition.py PartitionLog, manager.py LogManager)
and the in-memory engine (kbroker/storage/memory.py), which fast unit tests of handlers use. Everything is a
typing Protocol, so neither engine inherits from anything here; mypy checks that both conform (see
``_conformance`` at the bottom). Disk-only operations (segment swaps for compaction, rolls, the segments
themselves) are deliberately not part of it.

This module imports nothing from the engines at run time, so they can import ``PartitionEvent`` from here.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from kbroker.storage.manager import TopicInfo
    from kbroker.storage.partition import AppendResult, LogConfig
    from kbroker.storage.producer_state import ProducerView
    from kbroker.storage.segment import FileRegion
    from protocol.records import BatchHeader


class PartitionEvent(enum.Flag):
    """What changed in a partition; a listener gets the flags of one change together."""

    APPENDED = enum.auto()  # the log end offset moved forward
    HIGH_WATERMARK = enum.auto()  # the high watermark moved forward
    STABLE_OFFSET = enum.auto()  # the last stable offset moved forward


# Every combination of the flags, made once: ``|`` or a call on a Flag runs Python code (a microsecond or two),
# and every append sends an event. ``PARTITION_EVENTS[bits]`` is the event of those bits.
PARTITION_EVENTS = tuple(PartitionEvent(bits) for bits in range(1 << len(PartitionEvent)))


PartitionEventListener = Callable[[PartitionEvent], None]


class Chunk(Protocol):
    """Whole batches returned by a read: how many bytes, the highest offset they may hold, and the bytes."""

    @property
    def size(self) -> int: ...

    @property
    def last_offset(self) -> int: ...

    def read_bytes(self) -> bytes:
        """The bytes, read into memory."""
        ...

    def region(self) -> FileRegion | bytes:
        """The bytes as a fetch response sends them: a file region (sendfile) or plain bytes."""
        ...


class PartitionStore(Protocol):
    """The log of one partition and its offsets: log start <= last stable <= high watermark <= log end."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def config(self) -> LogConfig: ...

    # --- offsets ---

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int:
        """The next offset to be assigned."""
        ...

    @property
    def high_watermark(self) -> int:
        """Offsets below it are replicated (on a single node: written); consumers read up to it."""
        ...

    @property
    def last_stable_offset(self) -> int:
        """Offsets below it belong to no open transaction; read_committed consumers read up to it."""
        ...

    # True on a single node: every append moves the high watermark to the log end. Replication sets it False
    # and moves the high watermark itself with update_high_watermark.
    high_watermark_follows_appends: bool

    def update_high_watermark(self, offset: int) -> bool:
        """Move the high watermark forward (clamped to the log); whether it moved."""
        ...

    @property
    def size_bytes(self) -> int: ...

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted transactions overlapping the offsets, for read_committed fetches."""
        ...

    def ongoing_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction in this partition."""
        ...

    def producers_view(self) -> list[ProducerView]:
        """Every producer the partition knows (DescribeProducers)."""
        ...

    # --- leader epochs ---

    @property
    def leader_epoch(self) -> int: ...

    def assign_leader_epoch(self, epoch: int) -> None:
        """Start a new leader epoch (greater than the current one, else KafkaError FENCED_LEADER_EPOCH)."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: (largest epoch <= ``epoch``, where it ends), or (-1, -1)."""
        ...

    # --- writing ---

    def append(
        self,
        batch: bytearray | memoryview,
        header: BatchHeader | None = None,
        *,
        now_ms: int | None = None,
        timestamp_type_log_append: bool = False,
    ) -> AppendResult:
        """Append one validated batch, assigning its offsets in place; errors are in the result."""
        ...

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
        """Write a transaction's commit or abort marker (WriteTxnMarkers); errors are in the result.

        INVALID_PRODUCER_EPOCH for an older producer epoch (with ``transaction_version`` 2, not newer),
        TRANSACTION_COORDINATOR_FENCED for an older coordinator epoch. The last stable offset moves
        (PartitionEvent.STABLE_OFFSET) and an abort joins the aborted transaction index.
        """
        ...

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is at least ``offset``."""
        ...

    def delete_records(self, offset: int) -> None:
        """Move the log start offset forward to ``offset`` (DeleteRecords)."""
        ...

    def apply_retention(self, now: int) -> Sequence[object]:
        """Drop what retention.ms / retention.bytes allow; what was dropped (its length is logged)."""
        ...

    # --- reading ---

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None, min_one_batch: bool = True) -> Chunk:
        """Whole batches from ``offset``; OffsetOutOfRange outside log start..log end."""
        ...

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None: ...

    def max_timestamp(self) -> tuple[int, int] | None: ...

    # --- events ---

    def subscribe(self, listener: PartitionEventListener) -> Callable[[], None]:
        """Call ``listener`` after each change; the returned callable unsubscribes."""
        ...

    # --- durability and lifecycle ---

    @property
    def needs_flush(self) -> bool: ...

    def flush_due(self, now: int) -> bool: ...

    def flush(self) -> None: ...

    def sync(self) -> bool:
        """``flush``, and whether everything appended before it is durable (False: the data dir went offline)."""
        ...

    def update_config(self, config: LogConfig) -> None: ...

    def close(self) -> None: ...

    def delete(self) -> None: ...


PartitionT = TypeVar("PartitionT", bound=PartitionStore)


class LogStore(Protocol[PartitionT]):
    """Every topic of the broker: metadata and partition logs.

    Generic in its partition type because partitions built by ``build_partitions`` go back into
    ``commit_topic`` / ``commit_partitions`` of the same store; users that do not care write ``LogStore[Any]``.
    """

    # --- metadata ---

    def topic(self, name: str) -> TopicInfo | None: ...

    def topic_by_id(self, topic_id: uuid.UUID | None) -> TopicInfo | None: ...

    def topics(self) -> list[TopicInfo]:
        """Every topic, by name."""
        ...

    def effective_configs(self, info: TopicInfo) -> dict[str, str]: ...

    def log_config(self, info: TopicInfo) -> LogConfig: ...

    def is_pending(self, name: str) -> bool:
        """Whether a topic of this name is being created."""
        ...

    # --- topic changes (plan, build, commit: the building may run in a worker thread) ---

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo: ...

    def plan_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo: ...

    def build_partitions(self, info: TopicInfo, first: int, total: int | None = None) -> list[PartitionT]: ...

    def commit_topic(self, info: TopicInfo, logs: list[PartitionT]) -> TopicInfo: ...

    def abandon(self, info: TopicInfo) -> None: ...

    def commit_partitions(self, info: TopicInfo, logs: list[PartitionT]) -> TopicInfo: ...

    def add_partitions(self, name: str, total: int) -> TopicInfo: ...

    def delete_topic(self, name: str) -> None: ...

    def alter_topic_config(self, name: str, configs: dict[str, str]) -> TopicInfo: ...

    # --- partitions ---

    def get_partition(self, topic: str, partition: int) -> PartitionT | None:
        """The partition's log; None if the topic or partition does not exist; KafkaError if it cannot be opened."""
        ...

    def all_partitions(self) -> list[PartitionT]: ...

    def apply_retention(self, now_ms: int) -> Sequence[object]: ...

    def due_for_flush(self, now_ms: int) -> list[PartitionT]: ...

    def checkpoint_recovery_points(self) -> None:
        """Persist what is fsynced, so recovery after a crash need not check it again (may run in a thread)."""

    def close(self) -> None: ...


AnyLogStore = LogStore[Any]  # what the broker holds: either engine


if TYPE_CHECKING:

    def _conformance() -> None:
        """Checked by mypy only: both engines satisfy the Protocols (an assignment fails if one drifts)."""
        from kbroker.storage.manager import LogManager
        from kbroker.storage.memory import MemoryChunk, MemoryLogStore, MemoryPartitionLog
        from kbroker.storage.partition import PartitionLog, ReadChunk

        def disk_partition(plog: PartitionLog) -> PartitionStore:
            return plog

        def memory_partition(plog: MemoryPartitionLog) -> PartitionStore:
            return plog

        def disk_chunk(chunk: ReadChunk) -> Chunk:
            return chunk

        def memory_chunk(chunk: MemoryChunk) -> Chunk:
            return chunk

        def disk_store(store: LogManager) -> LogStore[PartitionLog]:
            return store

        def memory_store(store: MemoryLogStore) -> LogStore[MemoryPartitionLog]:
            return store
