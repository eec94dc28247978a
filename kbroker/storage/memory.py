"""The memory backend: the one log engine (PartitionLog over Segments) with its bytes kept in memory.

Fast unit tests of the request handlers use it (``LogManager.in_memory``, tests/broker/test_handlers_in_memory.py),
and the storage contract tests run every case over it and the file backend. Only where bytes are kept differs:
a segment's log is a bytearray, its index files are bytes, fsync has nothing to do, and the side files of the
log (``.txnindex``, producer snapshots, the log start offset, the leader epoch checkpoint) are not written,
since a log kept in memory is never reopened. Offsets, reads, retention, markers and swaps are PartitionLog's
and Segment's own code. A read answers the bytes themselves where the file backend answers a file region.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kbroker.storage.descriptors import DescriptorCache
from kbroker.storage.segment import Segment, wall_clock_ms

if TYPE_CHECKING:
    from kbroker.storage.producer_state import ProducerStateTable
    from kbroker.storage.txn_index import AbortedTxn
    from protocol.records import BatchHeader


class MemorySegment(Segment):
    """A segment whose log file is a bytearray; everything but the file operations is Segment's."""

    def _create_file(self, descriptors: DescriptorCache | None) -> int:
        self._data = bytearray()
        self._index_files: tuple[bytes, bytes] | None = None
        self._written_ms = -1  # wall clock of the last write, as a file's modification time
        return 0

    def append(self, batch: bytes | bytearray | memoryview, header: BatchHeader) -> int:
        position = self.size
        self._data += batch
        self._written_ms = wall_clock_ms()
        self._appended(batch, header, position)
        return position

    def _pread(self, size: int, position: int) -> bytes:
        return bytes(self._data[position : position + size])

    def _truncate_file(self, size: int) -> None:
        del self._data[size:]

    def region(self, position: int, size: int) -> bytes:
        return self._pread(size, position)

    def _modified_ms(self) -> int:
        return max(self._written_ms, self.created_ms)

    def _write_index_files(self, index: bytes, time_index: bytes) -> None:
        self._index_files = (index, time_index)

    def has_index_files(self) -> bool:
        return self._index_files is not None

    @property
    def dirty(self) -> bool:
        return False

    def fsync(self) -> bool:
        return True

    def close(self) -> None:
        self._close_requested = True

    def rename_suffix(self, suffix: str) -> None:
        self._set_paths(suffix)
        self.suffix = suffix

    def delete(self) -> None:
        self.close()  # the bytes stay readable for a read already answered with them

    def adopt(self, descriptors: DescriptorCache) -> None:
        pass


class MemoryBackend:
    """A partition log kept in memory (see the module docstring); ``directory`` only names its segments."""

    durable = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._replacements: list[Segment] = []  # made for swaps, while they carry a suffix

    def new_segment(self, base_offset: int, index_interval_bytes: int, created_ms: int, suffix: str = "") -> Segment:
        segment = MemorySegment(self.directory, base_offset, index_interval_bytes, created_ms, suffix)
        if suffix:
            self._replacements.append(segment)
        return segment

    def discard_replacement(self, base_offset: int, suffix: str) -> None:
        self._prune()

    def pending_replacements(self, suffix: str) -> set[str]:
        self._prune()
        return {s.log_path.name for s in self._replacements if s.suffix == suffix}

    def _prune(self) -> None:
        self._replacements = [s for s in self._replacements if s.suffix and not s.closed]

    def save_txn_index(self, base_offset: int, entries: list[AbortedTxn]) -> None:
        pass

    def remove_txn_index(self, base_offset: int) -> None:
        pass

    def save_producer_snapshot(self, producers: ProducerStateTable, offset: int) -> None:
        pass

    def remove_producer_snapshots_from(self, offset: int) -> None:
        pass

    def save_log_start_offset(self, offset: int) -> None:
        pass

    def sync_directory(self) -> None:
        pass
