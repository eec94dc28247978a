"""The leader epoch cache of one partition: which leader epoch started at which offset.

Kafka keeps it per partition as ``leader-epoch-checkpoint``, a text file in the partition directory::

    0                 <- format version
    2                 <- number of entries
    0 0               <- epoch, start offset of its first batch
    3 1500

Followers use it (through OffsetsForLeaderEpoch) to find where their log diverges from the leader's, and
consumers to detect truncation. The semantics here are Kafka's LeaderEpochFileCache: entries are strictly
increasing in both epoch and start offset, ``assign`` drops entries that would break that order, and
``end_offset_for`` answers OffsetsForLeaderEpoch. The file is rewritten whole (atomically, fsynced) on every
change; changes are rare (a new leader epoch, a truncation).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from kbroker.durable.files import DamagedFileError, write_atomically

CHECKPOINT_FILE = "leader-epoch-checkpoint"
CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class EpochEntry(NamedTuple):
    """Leader epoch ``epoch`` wrote its first batch at ``start_offset``."""

    epoch: int
    start_offset: int


def _parse_checkpoint(path: Path, text: str) -> list[EpochEntry]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file ends with a newline
    if len(lines) < 2:
        raise DamagedFileError(path, "expected a version line and a count line")
    if lines[0].strip() != str(CHECKPOINT_VERSION):
        raise DamagedFileError(path, f"unsupported version {lines[0][:20]!r}, expected {CHECKPOINT_VERSION}")
    count_text = lines[1].strip()
    if not (count_text.isascii() and count_text.isdigit()):
        raise DamagedFileError(path, f"expected the entry count, found {count_text[:20]!r}")
    if int(count_text) != len(lines) - 2:
        raise DamagedFileError(path, f"the count says {int(count_text)} entries but {len(lines) - 2} follow")
    entries: list[EpochEntry] = []
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split()
        if len(fields) != 2 or not all(f.isascii() and f.isdigit() for f in fields):
            raise DamagedFileError(path, f"line {number} is not '<epoch> <start offset>': {line[:40]!r}")
        entry = EpochEntry(int(fields[0]), int(fields[1]))
        if entries and (entry.epoch <= entries[-1].epoch or entry.start_offset < entries[-1].start_offset):
            raise DamagedFileError(path, f"line {number}: entries are not in increasing order")
        entries.append(entry)
    return entries


def implicit_end_offset(requested_epoch: int, leader_epoch: int, log_end_offset: int) -> tuple[int, int]:
    """``end_offset_for`` of a cache whose only entry is (``leader_epoch``, ``log_end_offset``): what Kafka's cache
    holds once a leader takes over an empty log (or one it has not appended to yet), before anything is written."""
    if requested_epoch < 0 or requested_epoch > leader_epoch:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    return requested_epoch, log_end_offset  # the current epoch, or one below the first entry: it starts here


class LeaderEpochCache:
    """Ordered (epoch, start offset) entries, persisted to ``path`` on every change.

    A missing file is an empty cache (a new partition, or one written before kbroker kept epochs); a file
    that cannot be parsed raises DamagedFileError naming it.
    """

    def __init__(self, path: Path | None) -> None:
        """``path`` None: a log kept in memory, whose cache is never written."""
        self.path = path
        self._entries: list[EpochEntry] = []
        if path is None:
            return
        try:
            text = path.read_text(encoding="ascii")
        except FileNotFoundError:
            return
        except UnicodeDecodeError:
            raise DamagedFileError(path, "not ASCII text") from None
        self._entries = _parse_checkpoint(path, text)

    @classmethod
    def rebuilt(cls, path: Path, batch_epochs: Iterable[tuple[int, int]], log_start_offset: int) -> LeaderEpochCache:
        """The cache of a log whose file is lost or damaged, from its batches' (partition leader epoch, base offset)
        in offset order, as Kafka's recovery assigns them: each newer epoch starts at its first batch. Written."""
        cache = cls.__new__(cls)
        cache.path = path
        cache._entries = []
        for epoch, base_offset in batch_epochs:
            if epoch >= 0 and epoch > cache.latest_epoch:
                cache._entries.append(EpochEntry(epoch, base_offset))
        if not cache.truncate_from_start(log_start_offset):
            cache._write()
        return cache

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The newest epoch in the cache, or -1 when it is empty."""
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def assume_first(self, epoch: int, start_offset: int) -> None:
        """An empty cache's first entry, kept in memory only: a log without a checkpoint file is in its first
        epoch from its start, which the next open assumes again, so nothing needs writing (and fsyncing)."""
        if self._entries:
            raise ValueError("the cache already has entries")
        self._entries.append(EpochEntry(epoch, start_offset))

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; returns whether the cache changed.

        As Kafka: nothing changes if ``epoch`` is already the latest and starts no later; otherwise entries
        with an epoch >= ``epoch`` or a start offset >= ``start_offset`` are replaced by the new one.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"epoch {epoch} and start offset {start_offset} must not be negative")
        if self._entries:
            latest = self._entries[-1]
            if latest.epoch == epoch and latest.start_offset <= start_offset:
                return False
        while self._entries and (self._entries[-1].epoch >= epoch or self._entries[-1].start_offset >= start_offset):
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        self._write()
        return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch answer: (epoch, end offset) for ``requested_epoch``.

        - the latest epoch ends at the log end offset;
        - an older epoch known to the cache: (the largest epoch <= requested, start of the next epoch);
        - an epoch below the first entry: (requested, start of the first entry), the earliest offset the
          log can vouch for (older data has been deleted);
        - an unknown epoch (-1, above the latest, or an empty cache): (-1, -1).
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested_epoch == self._entries[-1].epoch:
            return requested_epoch, log_end_offset
        higher = next((e for e in self._entries if e.epoch > requested_epoch), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        floor = next((e for e in reversed(self._entries) if e.epoch <= requested_epoch), None)
        if floor is None:
            return requested_epoch, higher.start_offset
        return floor.epoch, higher.start_offset

    def truncate_from_end(self, end_offset: int) -> bool:
        """Drop entries starting at or after ``end_offset`` (the log was truncated there)."""
        kept = [e for e in self._entries if e.start_offset < end_offset]
        if len(kept) == len(self._entries):
            return False
        self._entries = kept
        self._write()
        return True

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at ``start_offset`` (DeleteRecords, retention): as Kafka's truncateFromStart, entries
        that start before it go, and the newest of them is kept as starting at ``start_offset`` (its epoch still
        covers the offsets from there) unless an entry starts exactly there."""
        before = [e for e in self._entries if e.start_offset < start_offset]
        if not before:
            return False
        after = [e for e in self._entries if e.start_offset >= start_offset]
        if not after or after[0].start_offset != start_offset:
            after.insert(0, EpochEntry(before[-1].epoch, start_offset))
        self._entries = after
        self._write()
        return True

    def clear(self) -> None:
        """Forget every entry (a follower that dropped its whole log, as Kafka's clearAndFlush)."""
        self._entries = []
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        lines = [str(CHECKPOINT_VERSION), str(len(self._entries))]
        lines += [f"{e.epoch} {e.start_offset}" for e in self._entries]
        write_atomically(self.path, "\n".join(lines) + "\n", sync_directory=True)
