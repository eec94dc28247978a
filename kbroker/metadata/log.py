"""The local metadata log: ``__cluster_metadata-0`` in the data directory, in Kafka's KRaft layout.

The log is an ordinary partition log (kbroker/storage's engine: segments, indexes, leader-epoch-checkpoint)
whose batches are metadata batches (protocol/metadata_frame.py): data batches of Kafka's metadata records and
KRaft's control batches. Beside it, as Kafka keeps them:

- snapshots, ``<end offset:020>-<epoch:010>.checkpoint``: a control batch with a SnapshotHeaderRecord (and,
  under kraft.version 1, the KRaftVersionRecord and VotersRecord), the records of the image as of ``end
  offset`` (exclusive) in data batches with offsets from 0, and a control batch with a SnapshotFooterRecord;
  each written whole under a temporary name and renamed, so a crash leaves no partial snapshot behind;
- ``quorum-state``: the KRaft election state (leader, epoch, vote) as Kafka's FileQuorumStateStore writes it;
- ``partition.metadata``: the metadata topic's fixed id, as Kafka writes it.

The records include salted SCRAM hashes: the directory is readable by the broker's user only (0700) and so are
its files (0600), those an older kbroker created looser included, tightened whenever the log opens, rolls or
closes.

A leader-epoch-checkpoint that is missing beside segments is rebuilt from their batches' epochs before the log
opens, so kbroker also opens a ``__cluster_metadata-0`` copied from Kafka without it.

Reading it back (``replay``) starts from the newest snapshot and goes on with the log's batches after it. A
snapshot that cannot be read is set aside (renamed ``*.checkpoint.damaged``, kept for the operator) and the next
older one, or the log from its start, is replayed instead; when the log no longer holds what the damaged snapshot
covered, start-up stops with one line naming it. Once a newer snapshot covers them, older snapshots and the
segments wholly below it are deleted as Kafka's KafkaMetadataLog retention deletes them (``clean``). Every
append is fsynced before it returns: a metadata record is committed once it is on disk (a single voter is its
own majority). Everything fails with a one-line MetadataLogError (a StorageError) naming the file.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from kbroker.durable.files import StorageError, write_atomically
from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.leader_epochs import CHECKPOINT_FILE as LEADER_EPOCH_CHECKPOINT
from kbroker.storage.leader_epochs import LeaderEpochCache
from protocol._codec import Message
from protocol.errors import KafkaError
from protocol.exceptions import DecodeError, EncodeError
from protocol.messages.leader_change_message import LeaderChangeMessage
from protocol.metadata_frame import (
    MAX_BATCH_BYTES,
    MetadataBatch,
    MetadataRecord,
    build_control_batch,
    build_metadata_batch,
    build_metadata_batches,
    iter_metadata_batches,
)
from protocol.records import BatchHeader, iter_batches

if TYPE_CHECKING:
    from protocol.messages.snapshot_header_record import SnapshotHeaderRecord

log = logging.getLogger("kbroker.metadata")

METADATA_TOPIC = "__cluster_metadata"
METADATA_PARTITION = 0
SNAPSHOT_SUFFIX = ".checkpoint"
QUORUM_STATE_FILE = "quorum-state"
PARTITION_METADATA_FILE = "partition.metadata"
# Kafka names the metadata topic with a fixed id, Uuid.METADATA_TOPIC_ID (1), written as Kafka writes ids.
PARTITION_METADATA = "version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ\n"
QUORUM_STATE_VERSION = 0  # Kafka's data_version for a static voter set (kraft.version 0)
_SNAPSHOT_NAME = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
# Kafka's leftovers of a snapshot being written or deleted, which it removes at start-up as well (``.tmp``:
# kbroker's own, write_atomically's).
_SNAPSHOT_LEFTOVERS = ("*.checkpoint.part", "*.checkpoint.deleted", "*.checkpoint.tmp")
DAMAGED_SUFFIX = ".damaged"  # a snapshot that could not be read, set aside
_READ_BYTES = 1 << 20
SEGMENT_BYTES = 1 << 30  # Kafka's metadata.log.segment.bytes default
PRIVATE_DIRECTORY = 0o700  # the log holds salted SCRAM hashes: the broker's user only
PRIVATE_FILE = 0o600


class MetadataLogError(StorageError):
    """The metadata log or a snapshot cannot be written or read; the message is one line naming the file."""


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class SnapshotId(NamedTuple):
    """Kafka's OffsetAndEpoch of a snapshot: it holds the records below ``end_offset``, the last in ``epoch``."""

    end_offset: int
    epoch: int

    @property
    def file_name(self) -> str:
        return f"{self.end_offset:020d}-{self.epoch:010d}{SNAPSHOT_SUFFIX}"

    @classmethod
    def from_file_name(cls, name: str) -> SnapshotId | None:
        match = _SNAPSHOT_NAME.match(name)
        return cls(int(match[1]), int(match[2])) if match else None


class Snapshot(NamedTuple):
    id: SnapshotId
    header: SnapshotHeaderRecord
    controls: tuple[Message, ...]  # the header batch's other control messages (KRaftVersionRecord, VotersRecord)
    records: tuple[MetadataRecord, ...]


class Replay(NamedTuple):
    """What the metadata log holds: the newest snapshot, then the log's batches after it."""

    snapshot: Snapshot | None
    batches: tuple[MetadataBatch, ...]
    end_offset: int  # the log's end: the offset the next record gets

    def records(self) -> Iterator[MetadataRecord]:
        """Every metadata record in order: the snapshot's, then the log's (control records left out)."""
        if self.snapshot is not None:
            yield from self.snapshot.records
        for batch in self.batches:
            yield from batch.records


class QuorumState(NamedTuple):
    """The KRaft election state of ``quorum-state`` (Kafka's QuorumStateData, data_version 0)."""

    leader_id: int
    leader_epoch: int
    voted_id: int
    applied_offset: int
    voters: tuple[int, ...]
    cluster_id: str = ""

    def to_json(self) -> str:
        document = {
            "clusterId": self.cluster_id,
            "leaderId": self.leader_id,
            "leaderEpoch": self.leader_epoch,
            "votedId": self.voted_id,
            "appliedOffset": self.applied_offset,
            "currentVoters": [{"voterId": voter} for voter in self.voters],
            "data_version": QUORUM_STATE_VERSION,
        }
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def from_json(cls, path: Path, text: str) -> QuorumState:
        try:
            document: Any = json.loads(text)
            if document.get("data_version") != QUORUM_STATE_VERSION:
                raise ValueError(f"data_version {document.get('data_version')} is not {QUORUM_STATE_VERSION}")
            return cls(
                leader_id=int(document["leaderId"]),
                leader_epoch=int(document["leaderEpoch"]),
                voted_id=int(document["votedId"]),
                applied_offset=int(document.get("appliedOffset", 0)),
                voters=tuple(int(voter["voterId"]) for voter in document.get("currentVoters") or ()),
                cluster_id=str(document.get("clusterId", "")),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise MetadataLogError(f"{path} is not a quorum-state file: {exc}") from None


class MetadataLog:
    """``__cluster_metadata-0`` under ``data_dir``: append, snapshot and replay Kafka's metadata records."""

    def __init__(self, data_dir: Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = Path(data_dir) / f"{METADATA_TOPIC}-{METADATA_PARTITION}"
        self.directory.mkdir(mode=PRIVATE_DIRECTORY, parents=True, exist_ok=True)
        self._make_private()
        for pattern in _SNAPSHOT_LEFTOVERS:
            for leftover in self.directory.glob(pattern):
                leftover.unlink()
        _restore_epoch_checkpoint(self.directory)
        if not (self.directory / PARTITION_METADATA_FILE).exists():
            write_atomically(
                self.directory / PARTITION_METADATA_FILE, PARTITION_METADATA, sync_directory=True, private=True
            )
        # Every batch is validated at open (CRC included): the log is small and nothing says the last stop was
        # clean; a torn end is cut as kbroker/storage cuts any partition's.
        self.log = PartitionLog(
            METADATA_TOPIC, METADATA_PARTITION, self.directory, LogConfig(segment_bytes=segment_bytes), clean=False
        )
        # Bytes of batches appended since the newest snapshot (counted by ``replay`` and each append): what
        # metadata.log.max.record.bytes.between.snapshots is measured against.
        self.bytes_since_snapshot = 0
        self.last_append_timestamp = -1  # the newest batch's timestamp: a snapshot's last contained timestamp
        self._make_private()

    def _make_private(self) -> None:
        """Only the owner may read the directory and its files (what the storage engine created meanwhile, an
        older kbroker's files)."""
        try:
            self.directory.chmod(PRIVATE_DIRECTORY)
            for path in self.directory.iterdir():
                if path.is_file() and path.stat().st_mode & 0o777 != PRIVATE_FILE:
                    path.chmod(PRIVATE_FILE)
        except OSError as exc:
            raise MetadataLogError(f"{self.directory}: cannot make it readable by its owner only: {exc}") from None

    def close(self) -> None:
        self.log.close()
        self._make_private()

    def __enter__(self) -> MetadataLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the log -----------------------------------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def leader_epoch(self) -> int:
        return self.log.leader_epoch

    def become_leader(self, epoch: int, node_id: int, voters: Sequence[int]) -> int:
        """Start ``epoch`` with ``node_id`` as leader, as KRaft's new leader does: quorum-state first, then a
        LeaderChangeMessage opens the epoch in the log. Returns its offset."""
        if epoch <= self.leader_epoch:
            raise MetadataLogError(f"{self.directory}: epoch {epoch} is not newer than {self.leader_epoch}")
        self.write_quorum_state(QuorumState(node_id, epoch, -1, 0, tuple(voters)))
        self.log.assign_leader_epoch(epoch)
        self._make_private()  # the leader-epoch-checkpoint just written
        message = LeaderChangeMessage(
            version=0,
            leader_id=node_id,
            voters=[LeaderChangeMessage.Voter(voter_id=voter) for voter in voters],
            granting_voters=[LeaderChangeMessage.Voter(voter_id=node_id)],
        )
        return self.append_control([message])

    def append(self, records: Sequence[MetadataRecord], *, timestamp_ms: int | None = None) -> int:
        """Append ``records`` as one batch in the current epoch, durably; returns the first record's offset."""
        if not records:
            raise ValueError("a metadata batch holds at least one record")
        try:
            batch = build_metadata_batch(
                records,
                leader_epoch=self.leader_epoch,
                timestamp_ms=wall_clock_ms() if timestamp_ms is None else timestamp_ms,
            )
        except EncodeError as exc:
            raise MetadataLogError(f"{self.directory}: {exc}") from None
        return self._append(batch)

    def append_control(self, messages: Sequence[Message], *, timestamp_ms: int | None = None) -> int:
        """Append KRaft control messages as one control batch, durably; returns the first one's offset."""
        batch = build_control_batch(
            messages,
            leader_epoch=self.leader_epoch,
            timestamp_ms=wall_clock_ms() if timestamp_ms is None else timestamp_ms,
        )
        return self._append(batch)

    def _append(self, batch: bytes) -> int:
        if len(batch) > MAX_BATCH_BYTES:
            raise MetadataLogError(f"{self.directory}: a batch of {len(batch)} bytes is over KRaft's {MAX_BATCH_BYTES}")
        segments = len(self.log.segments)
        header = BatchHeader.parse(batch)
        result = self.log.append(bytearray(batch), header)
        if result.error_code:
            raise MetadataLogError(f"{self.directory}: append failed: {result.error_message}")
        if not self.log.sync():
            raise MetadataLogError(f"{self.directory}: fsync failed, the data directory is offline")
        if len(self.log.segments) != segments:  # a roll made new files
            self._make_private()
        self.bytes_since_snapshot += len(batch)
        self.last_append_timestamp = header.max_timestamp
        return result.base_offset

    def append_committed(self, batch: bytes) -> None:
        """Append a batch the quorum's leader wrote and committed, as it is (a broker's copy of the log): its
        offsets and epoch are the leader's. Not fsynced here: the caller syncs once per fetch answer."""
        segments = len(self.log.segments)
        result = self.log.append_as_follower(batch)
        if result.error_code:
            raise MetadataLogError(f"{self.directory}: append failed: {result.error_message}")
        if len(self.log.segments) != segments:
            self._make_private()
        self.bytes_since_snapshot += len(batch)
        self.last_append_timestamp = BatchHeader.parse(batch).max_timestamp

    def read_batches(self, start_offset: int = 0) -> Iterator[MetadataBatch]:
        """The log's batches from the one holding ``start_offset`` to the end, decoded."""
        offset = start_offset
        while offset < self.log.log_end_offset:
            chunk = self.log.read(offset, _READ_BYTES)
            if chunk.size == 0:
                return
            try:
                for batch in iter_metadata_batches(chunk.read_bytes()):
                    yield batch
                    offset = batch.last_offset + 1
            except DecodeError as exc:
                raise MetadataLogError(f"{self.directory}: batch after offset {offset - 1}: {exc}") from None

    # --- snapshots ---------------------------------------------------------------------------------------

    def snapshot_ids(self) -> list[SnapshotId]:
        found = (SnapshotId.from_file_name(path.name) for path in self.directory.glob(f"*{SNAPSHOT_SUFFIX}"))
        return sorted(snapshot for snapshot in found if snapshot is not None)

    def latest_snapshot_id(self) -> SnapshotId | None:
        ids = self.snapshot_ids()
        return ids[-1] if ids else None

    def epoch_at(self, end_offset: int) -> int:
        """The epoch of the record just below ``end_offset`` (0 below the first record, as Kafka's bootstrap
        snapshot 0-0)."""
        epoch = 0
        for entry in self.log.leader_epochs.entries:
            if entry.start_offset < end_offset:
                epoch = entry.epoch
        return epoch

    def write_snapshot(
        self,
        records: Iterable[MetadataRecord],
        end_offset: int,
        *,
        last_contained_timestamp: int,
        controls: Sequence[Message] = (),
        timestamp_ms: int | None = None,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> SnapshotId:
        """Write the image as of ``end_offset`` (the records it holds, in order) as a snapshot; ``controls`` go
        after the header (KRaftVersionRecord and VotersRecord under kraft.version 1)."""
        if not 0 <= end_offset <= self.end_offset:
            raise MetadataLogError(f"{self.directory}: no snapshot at {end_offset}, the log ends at {self.end_offset}")
        snapshot_id = SnapshotId(end_offset, self.epoch_at(end_offset))
        now = wall_clock_ms() if timestamp_ms is None else timestamp_ms
        epoch = snapshot_id.epoch
        # The snapshot records' modules load with the first snapshot (most single nodes never take one).
        from protocol.messages.snapshot_footer_record import SnapshotFooterRecord
        from protocol.messages.snapshot_header_record import SnapshotHeaderRecord

        header = SnapshotHeaderRecord(version=0, last_contained_log_timestamp=last_contained_timestamp)
        parts = [build_control_batch([header, *controls], leader_epoch=epoch, timestamp_ms=now)]
        next_offset = 1 + len(controls)
        try:
            data = build_metadata_batches(
                records, leader_epoch=epoch, timestamp_ms=now, base_offset=next_offset, max_batch_bytes=max_batch_bytes
            )
        except EncodeError as exc:
            raise MetadataLogError(f"{self.directory}: snapshot {snapshot_id.file_name}: {exc}") from None
        parts += data
        if data:
            next_offset = BatchHeader.parse(data[-1]).next_offset
        footer = SnapshotFooterRecord(version=0)
        parts.append(build_control_batch([footer], leader_epoch=epoch, timestamp_ms=now, base_offset=next_offset))
        write_atomically(self.directory / snapshot_id.file_name, b"".join(parts), sync_directory=True, private=True)
        self.bytes_since_snapshot = 0
        return snapshot_id

    def read_snapshot(self, snapshot_id: SnapshotId) -> Snapshot:
        path = self.directory / snapshot_id.file_name
        try:
            return read_snapshot_file(path, snapshot_id)
        except FileNotFoundError:
            raise MetadataLogError(f"{path}: no such snapshot") from None

    # --- reading it all back -----------------------------------------------------------------------------

    def replay(self) -> Replay:
        """The newest snapshot that can be read and the log's batches after it: everything needed to rebuild the
        image. Snapshots that cannot be read are set aside when the log still covers them."""
        snapshot: Snapshot | None = None
        damaged: list[tuple[Path, MetadataLogError]] = []
        for snapshot_id in reversed(self.snapshot_ids()):
            try:
                snapshot = self.read_snapshot(snapshot_id)
                break
            except MetadataLogError as exc:
                damaged.append((self.directory / snapshot_id.file_name, exc))
        start = snapshot.id.end_offset if snapshot is not None else 0
        if start > self.end_offset:
            raise MetadataLogError(
                f"{self.directory}: snapshot {snapshot.id.file_name if snapshot else ''} is past the log's end "
                f"{self.end_offset}"
            )
        if start < self.log.log_start_offset:
            if damaged:
                raise MetadataLogError(
                    f"{damaged[0][1]}; the metadata log starts at {self.log.log_start_offset}, after what any other "
                    "snapshot covers: restore the snapshot from a backup"
                )
            raise MetadataLogError(
                f"{self.directory}: the log starts at {self.log.log_start_offset}, with no snapshot covering "
                f"the records before it"
            )
        for path, problem in damaged:
            log.warning(
                "%s; it is set aside as %s and the metadata log replayed instead", problem, path.name + DAMAGED_SUFFIX
            )
            os.replace(path, path.with_name(path.name + DAMAGED_SUFFIX))
        batches = tuple(batch for batch in self.read_batches(start) if batch.last_offset >= start)
        self.bytes_since_snapshot = sum(batch.size for batch in batches)
        if batches:
            self.last_append_timestamp = batches[-1].append_timestamp
        elif snapshot is not None:
            self.last_append_timestamp = snapshot.header.last_contained_log_timestamp
        return Replay(snapshot, batches, self.end_offset)

    # --- retention, as Kafka's KafkaMetadataLog.maybeClean ----------------------------------------------

    def clean(self, retention_bytes: int, retention_ms: int, now_ms: int | None = None) -> bool:
        """Delete snapshots older than the newest, with the log before the snapshot that follows each, while the
        log and the snapshots are over ``retention_bytes`` or the snapshot's last record is older than
        ``retention_ms`` (either below 1: no such bound). Returns whether anything went."""
        now = wall_clock_ms() if now_ms is None else now_ms
        cleaned = False
        if retention_bytes >= 1:
            sizes = {i: (self.directory / i.file_name).stat().st_size for i in self.snapshot_ids()}
            total = sum(sizes.values())

            def over_size(snapshot_id: SnapshotId) -> bool:
                nonlocal total
                if self.log.size_bytes + total <= retention_bytes:
                    return False
                total -= sizes[snapshot_id]
                return True

            cleaned |= self._clean_snapshots(over_size)
        if retention_ms >= 1:

            def too_old(snapshot_id: SnapshotId) -> bool:
                try:
                    timestamp = self.read_snapshot(snapshot_id).header.last_contained_log_timestamp
                except MetadataLogError:
                    return False
                return now - timestamp > retention_ms

            cleaned |= self._clean_snapshots(too_old)
        return cleaned

    def _clean_snapshots(self, expired: Callable[[SnapshotId], bool]) -> bool:
        """Kafka's cleanSnapshots: oldest first, while a snapshot is expired, the log before the next one goes."""
        snapshot_ids = self.snapshot_ids()
        cleaned = False
        for older, newer in pairwise(snapshot_ids):
            if not expired(older) or not self._delete_before_snapshot(newer):
                break
            cleaned = True
        return cleaned

    def _delete_before_snapshot(self, snapshot_id: SnapshotId) -> bool:
        """The log start moved up to the snapshot (segments wholly below it deleted, the active one kept) and the
        snapshots before it deleted."""
        if not self.log.log_start_offset < snapshot_id.end_offset <= self.end_offset:
            return False
        try:
            self.log.delete_records(snapshot_id.end_offset)
        except KafkaError as exc:
            raise MetadataLogError(f"{self.directory}: {exc}") from None
        for older in self.snapshot_ids():
            if older < snapshot_id:
                (self.directory / older.file_name).unlink(missing_ok=True)
                log.info(
                    "%s: deleted snapshot %s, older than %s", self.directory, older.file_name, snapshot_id.file_name
                )
        return True

    # --- quorum-state ------------------------------------------------------------------------------------

    def write_quorum_state(self, state: QuorumState) -> None:
        write_atomically(self.directory / QUORUM_STATE_FILE, state.to_json(), sync_directory=True, private=True)

    def quorum_state(self) -> QuorumState | None:
        path = self.directory / QUORUM_STATE_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise MetadataLogError(f"{path} cannot be read: {exc}") from None
        return QuorumState.from_json(path, text)


def _restore_epoch_checkpoint(directory: Path) -> None:
    """Rebuild a missing leader-epoch-checkpoint from the epochs the segments' batches carry, as Kafka's recovery
    does: the metadata log's epoch fences stale leaders, and the storage engine would take a log without the file
    for one in epoch 0 (a log copied without it, a crash before its first write)."""
    path = directory / LEADER_EPOCH_CHECKPOINT
    segments = sorted(path for path in directory.glob("*.log") if path.stem.isdigit())
    if path.exists() or not segments:
        return
    epochs: list[tuple[int, int]] = []
    for segment in segments:
        try:
            epochs += [(h.partition_leader_epoch, h.base_offset) for h, _ in iter_batches(segment.read_bytes())]
        except DecodeError:
            break  # the storage engine's recovery deals with the damage; the epochs before it stand
    if epochs:
        LeaderEpochCache.rebuilt(path, epochs, int(segments[0].stem))


def read_snapshot_file(path: Path, snapshot_id: SnapshotId | None = None) -> Snapshot:
    """A snapshot file read and checked: a header batch first, data batches, a footer batch last."""
    if snapshot_id is None:
        snapshot_id = SnapshotId.from_file_name(path.name)
        if snapshot_id is None:
            raise MetadataLogError(f"{path}: not a snapshot's name (<offset:020>-<epoch:010>.checkpoint)")
    try:
        batches = list(iter_metadata_batches(path.read_bytes()))
    except DecodeError as exc:
        raise MetadataLogError(f"snapshot {path}: {exc}") from None
    from protocol.messages.snapshot_footer_record import SnapshotFooterRecord
    from protocol.messages.snapshot_header_record import SnapshotHeaderRecord

    if not batches or not batches[0].is_control or not isinstance(batches[0].controls[0], SnapshotHeaderRecord):
        raise MetadataLogError(f"snapshot {path} does not start with a SnapshotHeaderRecord")
    last = batches[-1]
    if len(batches) < 2 or not last.is_control or not isinstance(last.controls[-1], SnapshotFooterRecord):
        raise MetadataLogError(f"snapshot {path} does not end with a SnapshotFooterRecord (cut short?)")
    if any(batch.is_control for batch in batches[1:-1]):
        raise MetadataLogError(f"snapshot {path} has a control batch between its header and footer")
    header = batches[0].controls[0]
    assert isinstance(header, SnapshotHeaderRecord)
    records = tuple(record for batch in batches[1:-1] for record in batch.records)
    return Snapshot(snapshot_id, header, batches[0].controls[1:], records)
