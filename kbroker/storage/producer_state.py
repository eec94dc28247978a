"""Idempotent producer state of one partition: epochs, sequence numbers and recent batches per producer.

Kafka's rules (ProducerStateManager / ProducerAppendInfo):
- an epoch older than the producer's current one is fenced (INVALID_PRODUCER_EPOCH for a client's write);
- a new epoch must start at sequence 0, unless the broker knows nothing about the producer;
- within an epoch each batch must start right after the last one (wrapping at 2^31 - 1);
- a batch whose sequence range matches one of the producer's last five batches is a duplicate (a retry):
  it is acknowledged with the offsets it was first written at and not written again.

Transactions (KIP-98): a producer's first transactional batch after a marker starts its transaction here
(``current_txn_first_offset``); its commit or abort marker ends it. A non-transactional batch while its
transaction is open is INVALID_TXN_STATE. A marker from an older producer epoch is INVALID_PRODUCER_EPOCH (with
transaction version 2 the coordinator bumps the epoch, so the marker's must be newer), one from an older
coordinator epoch TRANSACTION_COORDINATOR_FENCED. A producer with an open transaction never expires.

The state is rebuilt after a restart from a snapshot written at clean shutdown and at each segment roll (the
newest few are kept), plus the batches after the snapshot's offset. A snapshot is a checked file
(kbroker/durable/files.py) whose payload is JSON: ``{producer id: {"epoch", "last_timestamp", "batches":
[[first seq, last seq, first offset, last offset, timestamp], ...], "coordinator_epoch", "txn_first_offset"}}``
(the last two as Kafka's snapshot holds them; -1 when absent, as in snapshots of older kbrokers).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from kbroker.durable.files import LEGACY_VERSION, DamagedFileError, read_checked, write_checked
from protocol.errors import ErrorCode
from protocol.records import BatchHeader

RETAINED_BATCHES = 5  # Kafka keeps metadata of the last five batches per producer (max.in.flight <= 5)
NO_EPOCH = -1
MAX_EPOCH = 32767  # Short.MAX_VALUE
INT32_MAX = 2**31 - 1
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_KIND = "producer-snapshot"
SNAPSHOT_FORMAT_VERSION = 1  # a JSON payload in a checked file; bare JSON before that (LEGACY_VERSION)
KEPT_SNAPSHOTS = 3  # recovery from an older segment than the newest snapshot's needs an older snapshot
NO_OFFSET = -1


@dataclass(slots=True)
class BatchMetadata:
    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int = NO_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=RETAINED_BATCHES))
    last_timestamp: int = -1
    coordinator_epoch: int = -1  # of the last marker written for the producer
    current_txn_first_offset: int = NO_OFFSET  # the first offset of its open transaction here, or -1

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else -1


class SequenceCheck(NamedTuple):
    """What the log should do with a batch: append it, answer with a duplicate's offsets, or reject it."""

    error_code: ErrorCode = ErrorCode.NONE
    error_message: str | None = None
    duplicate_of: BatchMetadata | None = None


APPEND = SequenceCheck()


class ProducerView(NamedTuple):
    """One producer as DescribeProducers reports it (Kafka's DescribeProducersResponse ProducerState)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


def _in_sequence(last_sequence: int, next_sequence: int) -> bool:
    return next_sequence == last_sequence + 1 or (next_sequence == 0 and last_sequence == INT32_MAX)


class ProducerStateTable:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}
        self.ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction

    def first_ongoing_offset(self) -> int | None:
        """The first offset of the earliest open transaction (what holds the last stable offset back)."""
        return min(self.ongoing.values()) if self.ongoing else None

    def stable_offset_after_marker(self, producer_id: int, marker_offset: int) -> int:
        """Kafka's last stable offset recorded with an aborted transaction: the earliest other open one, or
        just after the marker."""
        others = [first for pid, first in self.ongoing.items() if pid != producer_id]
        return min(others) if others else marker_offset + 1

    def check(self, header: BatchHeader) -> SequenceCheck:
        """Kafka's checks for a batch from an idempotent producer, before it is written."""
        entry = self.producers.get(header.producer_id)
        if entry is None or entry.epoch == NO_EPOCH:
            return APPEND  # unknown producer (new, or its state expired): any sequence is accepted
        epoch = header.producer_epoch
        if epoch < entry.epoch:
            return SequenceCheck(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"epoch {epoch} of producer {header.producer_id} is older than its current epoch {entry.epoch}",
            )
        if epoch == entry.epoch:
            for batch in entry.batches:
                if batch.first_sequence == header.base_sequence and batch.last_sequence == header.last_sequence:
                    return SequenceCheck(duplicate_of=batch)
            if header.base_sequence >= 0 and not _in_sequence(entry.last_sequence, header.base_sequence):
                return SequenceCheck(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"producer {header.producer_id} sent sequence {header.base_sequence} after {entry.last_sequence}",
                )
        elif header.base_sequence not in (0, -1):
            return SequenceCheck(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"a new epoch {epoch} of producer {header.producer_id} must start at sequence 0, "
                f"not {header.base_sequence}",
            )
        if entry.current_txn_first_offset != NO_OFFSET and not header.is_transactional:
            return SequenceCheck(
                ErrorCode.INVALID_TXN_STATE,
                f"Expected transactional write from producer {header.producer_id}: its transaction "
                f"started at offset {entry.current_txn_first_offset}",
            )
        return APPEND

    def record(self, header: BatchHeader) -> None:
        """Update the table with a batch that was written (offsets assigned)."""
        entry = self.producers.get(header.producer_id)
        if entry is None:
            entry = self.producers[header.producer_id] = ProducerEntry()
        if header.producer_epoch != entry.epoch:
            entry.epoch = header.producer_epoch
            entry.batches.clear()
        if header.base_sequence >= 0:
            entry.batches.append(
                BatchMetadata(
                    header.base_sequence,
                    header.last_sequence,
                    header.base_offset,
                    header.last_offset,
                    header.max_timestamp,
                )
            )
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        if header.is_transactional and entry.current_txn_first_offset == NO_OFFSET:
            entry.current_txn_first_offset = header.base_offset  # the producer's transaction starts here
            self.ongoing[header.producer_id] = header.base_offset

    def check_marker(
        self, producer_id: int, producer_epoch: int, coordinator_epoch: int, *, transaction_version: int = 1
    ) -> SequenceCheck:
        """Kafka's checks of a commit or abort marker before it is written (ProducerAppendInfo.appendEndTxnMarker)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return APPEND
        # Transaction version 2 bumps the epoch at every commit or abort: the marker carries the new one.
        too_old = producer_epoch <= entry.epoch if transaction_version >= 2 else producer_epoch < entry.epoch
        # As Kafka: a TV2 marker at the current epoch with no transaction open is a retry, written all the same.
        retried = producer_epoch == entry.epoch and (
            entry.current_txn_first_offset == NO_OFFSET or entry.epoch == MAX_EPOCH
        )
        if entry.epoch != NO_EPOCH and too_old and not retried:
            return SequenceCheck(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"marker epoch {producer_epoch} of producer {producer_id} is not valid after its epoch {entry.epoch}",
            )
        if coordinator_epoch < entry.coordinator_epoch:
            return SequenceCheck(
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"Invalid coordinator epoch for producerId {producer_id}: {coordinator_epoch} (zombie), "
                f"{entry.coordinator_epoch} (current)",
            )
        return APPEND

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, timestamp: int) -> int | None:
        """Record a written marker: the producer's transaction ends; its first offset, None if none was open."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry()
        if producer_epoch != entry.epoch:
            entry.epoch = producer_epoch
            entry.batches.clear()
        first = entry.current_txn_first_offset
        entry.current_txn_first_offset = NO_OFFSET
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = max(entry.last_timestamp, timestamp)
        self.ongoing.pop(producer_id, None)
        return None if first == NO_OFFSET else first

    def views(self) -> list[ProducerView]:
        return [
            ProducerView(
                pid, e.epoch, e.last_sequence, e.last_timestamp, e.coordinator_epoch, e.current_txn_first_offset
            )
            for pid, e in sorted(self.producers.items())
        ]

    def expire(self, older_than_ms: int) -> int:
        """Forget producers that have not written since ``older_than_ms`` (producer.id.expiration.ms)."""
        stale = [
            pid
            for pid, entry in self.producers.items()
            if entry.last_timestamp < older_than_ms and entry.current_txn_first_offset == NO_OFFSET
        ]
        for pid in stale:
            del self.producers[pid]
        return len(stale)

    # --- snapshots ----------------------------------------------------------------------------------

    def write_snapshot(self, directory: Path, offset: int) -> None:
        """Save the table as it is at ``offset`` (a checked, fsynced file); only the newest few are kept."""
        path = directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"
        write_checked(path, SNAPSHOT_KIND, SNAPSHOT_FORMAT_VERSION, self._encode())
        older = [old for old in snapshot_offsets(directory) if old < offset]
        for old in older[: max(len(older) - (KEPT_SNAPSHOTS - 1), 0)]:
            (directory / f"{old:020d}{SNAPSHOT_SUFFIX}").unlink(missing_ok=True)

    def _encode(self) -> bytes:
        document = {
            str(pid): {
                "epoch": entry.epoch,
                "last_timestamp": entry.last_timestamp,
                "batches": [
                    [b.first_sequence, b.last_sequence, b.first_offset, b.last_offset, b.timestamp]
                    for b in entry.batches
                ],
                "coordinator_epoch": entry.coordinator_epoch,
                "txn_first_offset": entry.current_txn_first_offset,
            }
            for pid, entry in self.producers.items()
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def load_snapshot(cls, directory: Path, offset: int) -> ProducerStateTable:
        """The table saved at ``offset``; DamagedFileError (naming the file) if it cannot be read back.

        A snapshot from an older kbroker (bare JSON, no header) is read and rewritten in the current format.
        """
        path = directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"
        version, payload = read_checked(path, SNAPSHOT_KIND, (LEGACY_VERSION, SNAPSHOT_FORMAT_VERSION))
        table = cls._decode(path, payload)
        if version == LEGACY_VERSION:
            write_checked(path, SNAPSHOT_KIND, SNAPSHOT_FORMAT_VERSION, table._encode())
        return table

    @classmethod
    def _decode(cls, path: Path, payload: bytes) -> ProducerStateTable:
        table = cls()
        try:
            raw = json.loads(payload)
        except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
            raise DamagedFileError(path, "not valid JSON") from None
        try:
            for pid, item in raw.items():
                entry = ProducerEntry(
                    epoch=int(item["epoch"]),
                    last_timestamp=int(item["last_timestamp"]),
                    coordinator_epoch=int(item.get("coordinator_epoch", -1)),
                    current_txn_first_offset=int(item.get("txn_first_offset", NO_OFFSET)),
                )
                for values in item["batches"]:
                    entry.batches.append(BatchMetadata(*(int(v) for v in values)))
                table.producers[int(pid)] = entry
                if entry.current_txn_first_offset != NO_OFFSET:
                    table.ongoing[int(pid)] = entry.current_txn_first_offset
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise DamagedFileError(path, f"unexpected content ({type(exc).__name__}: {exc})") from None
        return table


def snapshot_offsets(directory: Path) -> list[int]:
    offsets = []
    for path in directory.glob("*" + SNAPSHOT_SUFFIX):
        try:
            offsets.append(int(path.name[: -len(SNAPSHOT_SUFFIX)]))
        except ValueError:
            continue
    return sorted(offsets)
