"""Where a partition log's bytes live: the backend under the one log engine (PartitionLog, Segment).

PartitionLog keeps every semantic of a log (offsets, watermarks, producer state, markers, retention, swaps);
what it stores goes through its backend:

- ``FileBackend``: the partition's directory, as Kafka lays it out. Segments are files (sent with sendfile on
  fetch), and the side files (``.txnindex``, producer snapshots, the log start offset) are written durably;
  writes, fsyncs, truncations, renames and unlinks go through the ``fs`` seam, so fault injection reaches them.
- ``MemoryBackend`` (kbroker/storage/memory.py): segments keep their bytes in memory and nothing is durable, for
  fast unit tests of handlers; a fetch then answers bytes instead of a file region.

Only a file-backed log is ever reopened, so recovery (kbroker/storage/loader.py) reads the directory itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kbroker.durable import fs
from kbroker.durable.files import fsync_directory, write_log_start_offset
from kbroker.storage.descriptors import DescriptorCache
from kbroker.storage.producer_state import SNAPSHOT_SUFFIX, snapshot_offsets
from kbroker.storage.segment import SEGMENT_FILE_SUFFIXES, Segment
from kbroker.storage.txn_index import txn_index_path, write_segment_file

if TYPE_CHECKING:
    from kbroker.storage.producer_state import ProducerStateTable
    from kbroker.storage.txn_index import AbortedTxn

LOG_START_OFFSET_FILE = "log-start-offset"


class LogBackend(Protocol):
    """What a partition log stores, and how; one per partition log."""

    @property
    def durable(self) -> bool:
        """Whether what is written survives a restart (the log is reopened from it)."""
        ...

    def new_segment(self, base_offset: int, index_interval_bytes: int, created_ms: int, suffix: str = "") -> Segment:
        """An empty segment (``suffix``: a replacement being written, see PartitionLog.swap_segments)."""
        ...

    def discard_replacement(self, base_offset: int, suffix: str) -> None:
        """Remove what an abandoned replacement at ``base_offset`` left behind."""
        ...

    def pending_replacements(self, suffix: str) -> set[str]:
        """The log names of replacement segments carrying ``suffix``."""
        ...

    def save_txn_index(self, base_offset: int, entries: list[AbortedTxn]) -> None: ...

    def remove_txn_index(self, base_offset: int) -> None: ...

    def save_producer_snapshot(self, producers: ProducerStateTable, offset: int) -> None: ...

    def remove_producer_snapshots_from(self, offset: int) -> None: ...

    def save_log_start_offset(self, offset: int) -> None: ...

    def sync_directory(self) -> None:
        """Make the creations, renames and deletions so far durable."""
        ...


class FileBackend:
    """A partition log in its directory: segments as files through the broker's descriptor cache."""

    durable = True

    def __init__(self, directory: Path, descriptors: DescriptorCache) -> None:
        self.directory = directory
        self.descriptors = descriptors

    def new_segment(self, base_offset: int, index_interval_bytes: int, created_ms: int, suffix: str = "") -> Segment:
        return Segment(self.directory, base_offset, index_interval_bytes, created_ms, suffix, self.descriptors)

    def discard_replacement(self, base_offset: int, suffix: str) -> None:
        for kind in SEGMENT_FILE_SUFFIXES:
            (self.directory / f"{base_offset:020d}{kind}{suffix}").unlink(missing_ok=True)

    def pending_replacements(self, suffix: str) -> set[str]:
        return {p.name for p in self.directory.glob("*.log" + suffix)}

    def save_txn_index(self, base_offset: int, entries: list[AbortedTxn]) -> None:
        write_segment_file(self.directory, base_offset, entries)

    def remove_txn_index(self, base_offset: int) -> None:
        fs.unlink_if_exists(txn_index_path(self.directory, base_offset))

    def save_producer_snapshot(self, producers: ProducerStateTable, offset: int) -> None:
        producers.write_snapshot(self.directory, offset)

    def remove_producer_snapshots_from(self, offset: int) -> None:
        for snapshot in snapshot_offsets(self.directory):
            if snapshot >= offset:
                (self.directory / f"{snapshot:020d}{SNAPSHOT_SUFFIX}").unlink(missing_ok=True)

    def save_log_start_offset(self, offset: int) -> None:
        # Durable (file and directory fsynced) before DeleteRecords answers: a crash must not bring records back.
        write_log_start_offset(self.directory / LOG_START_OFFSET_FILE, offset)

    def sync_directory(self) -> None:
        fsync_directory(self.directory)
