"""Kafka's framing of the records in ``__cluster_metadata`` (KRaft's log and snapshots), sans I/O.

A metadata record is a record of a data batch, with a null key and this value (Kafka's MetadataRecordSerde,
AbstractApiMessageSerde, ApiMessageAndVersion):

    frame version (unsigned varint, always 1) | record type (unsigned varint, the schema's apiKey) |
    record version (unsigned varint) | the record, encoded at that version (protocol/metadata_records)

Frame version 0 belonged to KRaft's preview in Kafka 2.8, which Kafka no longer reads; neither does this.

KRaft's own records travel in control batches (no producer, the control bit set): LeaderChangeMessage,
SnapshotHeaderRecord, SnapshotFooterRecord, KRaftVersionRecord and VotersRecord. Their key is the control
record key (int16 version 0, int16 control type) and their value the message at version 0, unprefixed
(ControlRecordUtils). Transaction markers (types 0 and 1) are protocol.records' business, not KRaft's.
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Iterable, Iterator, Sequence
from enum import IntEnum
from functools import cache
from typing import NamedTuple

from protocol._codec import Buffer, Message, read_uvarint, write_uvarint
from protocol.exceptions import DecodeError, EncodeError, UnsupportedVersionError
from protocol.metadata_records import RECORD_TYPES
from protocol.records import (
    HEADER_SIZE,
    BatchHeader,
    Record,
    build_batch,
    decode_records,
    iter_batches,
    validate_crc,
)

FRAME_VERSION = 1
_CONTROL_KEY = struct.Struct(">hh")
CONTROL_KEY_VERSION = 0
CONTROL_MESSAGE_VERSION = 0  # every KRaft control message is written and read at version 0 (ControlRecordUtils)
_MAX_VARINT_FIELD = 0x7FFF  # frame version, type and version are shorts in Kafka: larger values are refused
MAX_BATCH_BYTES = 8 * 1024 * 1024  # KRaft's largest batch (KafkaRaftClient.MAX_BATCH_SIZE_BYTES)
# A record's framing around its value, at most: length, attributes, timestamp and offset deltas, null key,
# value length, header count (varints of at most 5 bytes each but the attributes byte).
_RECORD_OVERHEAD = 5 + 1 + 5 + 5 + 1 + 5 + 1


class MetadataRecord(NamedTuple):
    """A metadata record and the version it is (or is to be) encoded at: Kafka's ApiMessageAndVersion."""

    message: Message
    version: int


class KRaftControlType(IntEnum):
    """The control record types of KRaft's log (Kafka's ControlRecordType, without the transaction markers)."""

    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


# Each control message's class by name, its module imported when one is first read or written (a broker that
# never takes a snapshot never loads the snapshot records).
CONTROL_MESSAGE_NAMES: dict[KRaftControlType, tuple[str, str]] = {
    KRaftControlType.LEADER_CHANGE: ("leader_change_message", "LeaderChangeMessage"),
    KRaftControlType.SNAPSHOT_HEADER: ("snapshot_header_record", "SnapshotHeaderRecord"),
    KRaftControlType.SNAPSHOT_FOOTER: ("snapshot_footer_record", "SnapshotFooterRecord"),
    KRaftControlType.KRAFT_VERSION: ("k_raft_version_record", "KRaftVersionRecord"),
    KRaftControlType.KRAFT_VOTERS: ("voters_record", "VotersRecord"),
}
_CONTROL_TYPE_OF: dict[str, KRaftControlType] = {name: kind for kind, (_, name) in CONTROL_MESSAGE_NAMES.items()}


@cache
def control_message_class(kind: KRaftControlType) -> type[Message]:
    """The generated class of a KRaft control message (protocol/messages)."""
    module, name = CONTROL_MESSAGE_NAMES[kind]
    cls: type[Message] = getattr(importlib.import_module(f"protocol.messages.{module}"), name)
    return cls


# --- one record ----------------------------------------------------------------------------------------


def encode_metadata_record(message: Message, version: int) -> bytes:
    """The value of the record that carries ``message`` at ``version`` in ``__cluster_metadata``."""
    record_type = RECORD_TYPES.get(message.API_KEY)
    if record_type is None or record_type.name != message.NAME:
        raise EncodeError(f"{type(message).__name__} is not a metadata record")
    low, high = record_type.stable_versions
    if not low <= version <= high:
        raise EncodeError(f"{message.NAME} cannot be written at version {version} (versions {low} to {high})")
    out = bytearray()
    write_uvarint(out, FRAME_VERSION)
    write_uvarint(out, message.API_KEY)
    write_uvarint(out, version)
    message.encode_into(out, version)
    return bytes(out)


def _read_short_uvarint(value: Buffer, pos: int, what: str) -> tuple[int, int]:
    try:
        number, pos = read_uvarint(value, pos)
    except IndexError:
        raise DecodeError(f"metadata record ends before its {what}") from None
    if number > _MAX_VARINT_FIELD:
        raise DecodeError(f"metadata record {what} {number} is too large")
    return number, pos


def decode_metadata_record(value: Buffer | None) -> MetadataRecord:
    """The record a ``__cluster_metadata`` record's value carries; DecodeError says what is wrong with it."""
    if value is None:
        raise DecodeError("metadata record without a value")
    frame_version, pos = _read_short_uvarint(value, 0, "frame version")
    if frame_version == 0:
        raise DecodeError("metadata record with frame version 0 (KRaft's preview in Kafka 2.8) cannot be read")
    if frame_version != FRAME_VERSION:
        raise DecodeError(f"metadata record with unknown frame version {frame_version} (only {FRAME_VERSION})")
    api_key, pos = _read_short_uvarint(value, pos, "type")
    version, pos = _read_short_uvarint(value, pos, "version")
    record_type = RECORD_TYPES.get(api_key)
    if record_type is None:
        raise DecodeError(f"unknown metadata record type {api_key}")
    cls = record_type.record_class()
    try:
        message, end = cls.decode(value, version, pos)
    except UnsupportedVersionError:
        low, high = record_type.valid_versions
        raise DecodeError(f"{record_type.name} has no version {version} (versions {low} to {high})") from None
    except DecodeError as exc:
        raise _naming(exc, record_type.name, version) from None
    if end != len(value):
        raise DecodeError(f"{len(value) - end} bytes after {record_type.name} v{version}")
    return MetadataRecord(message, version)


def _naming(exc: DecodeError, name: str, version: int) -> DecodeError:
    """The error with the record it happened in named (the codec names it only for some failures)."""
    return exc if name in str(exc) else DecodeError(f"{name} v{version}: {exc}")


# --- KRaft's control records ---------------------------------------------------------------------------


def encode_control_record(message: Message) -> tuple[bytes, bytes]:
    """The key and value of the control record that carries one of KRaft's control messages."""
    kind = _CONTROL_TYPE_OF.get(type(message).__name__)
    if kind is None:
        raise EncodeError(f"{type(message).__name__} is not a KRaft control message")
    return _CONTROL_KEY.pack(CONTROL_KEY_VERSION, kind), message.encode(CONTROL_MESSAGE_VERSION)


def control_type(key: Buffer | None) -> int:
    """The control type a control record's key names (Kafka reads any key version as version 0)."""
    if key is None or len(key) < _CONTROL_KEY.size:
        raise DecodeError("control record key shorter than 4 bytes")
    version, kind = _CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise DecodeError(f"control record key version {version} is negative")
    return int(kind)


def decode_control_record(key: Buffer | None, value: Buffer | None) -> Message:
    """The KRaft control message of a control record; DecodeError for another control type or a bad value."""
    kind = control_type(key)
    try:
        cls = control_message_class(KRaftControlType(kind))
    except ValueError:
        raise DecodeError(f"control record type {kind} is not one of KRaft's") from None
    if value is None:
        raise DecodeError(f"{cls.NAME} control record without a value")
    try:
        message, end = cls.decode(value, CONTROL_MESSAGE_VERSION)
    except DecodeError as exc:
        raise _naming(exc, cls.NAME, CONTROL_MESSAGE_VERSION) from None
    if end != len(value):
        raise DecodeError(f"{len(value) - end} bytes after {cls.NAME}")
    return message


# --- batches -------------------------------------------------------------------------------------------


def build_metadata_batch(
    records: Sequence[MetadataRecord], *, leader_epoch: int, timestamp_ms: int, base_offset: int = 0
) -> bytes:
    """One data batch of metadata records, as KRaft's batch accumulator writes it: no producer, no keys, one
    timestamp for all, the leader's epoch as the partition leader epoch."""
    values = [encode_metadata_record(record.message, record.version) for record in records]
    return _data_batch(values, leader_epoch, timestamp_ms, base_offset)


def build_metadata_batches(
    records: Iterable[MetadataRecord],
    *,
    leader_epoch: int,
    timestamp_ms: int,
    base_offset: int = 0,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> list[bytes]:
    """Data batches holding ``records`` in order, each cut before it would pass ``max_batch_bytes`` (a record
    larger than that gets a batch of its own), with consecutive offsets from ``base_offset``."""
    batches: list[bytes] = []
    values: list[bytes] = []
    size = 0
    for record in records:
        value = encode_metadata_record(record.message, record.version)
        if values and size + len(value) + _RECORD_OVERHEAD > max_batch_bytes - HEADER_SIZE:
            batches.append(_data_batch(values, leader_epoch, timestamp_ms, base_offset))
            base_offset += len(values)
            values, size = [], 0
        values.append(value)
        size += len(value) + _RECORD_OVERHEAD
    if values:
        batches.append(_data_batch(values, leader_epoch, timestamp_ms, base_offset))
    return batches


def _data_batch(values: list[bytes], leader_epoch: int, timestamp_ms: int, base_offset: int) -> bytes:
    return build_batch(
        [Record(offset_delta=i, value=value) for i, value in enumerate(values)],
        base_offset=base_offset,
        partition_leader_epoch=leader_epoch,
        base_timestamp=timestamp_ms,
    )


def build_control_batch(
    messages: Sequence[Message], *, leader_epoch: int, timestamp_ms: int, base_offset: int = 0
) -> bytes:
    """One control batch of KRaft control messages (a snapshot's header batch holds several)."""
    records = []
    for i, message in enumerate(messages):
        key, value = encode_control_record(message)
        records.append(Record(offset_delta=i, key=key, value=value))
    return build_batch(
        records,
        base_offset=base_offset,
        partition_leader_epoch=leader_epoch,
        base_timestamp=timestamp_ms,
        is_control=True,
    )


class MetadataBatch(NamedTuple):
    """One batch of ``__cluster_metadata`` decoded: metadata records, or KRaft control messages."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    append_timestamp: int  # the batch's max timestamp, as Kafka's Batch.appendTimestamp
    size: int  # bytes the batch takes in the log
    records: tuple[MetadataRecord, ...] = ()
    controls: tuple[Message, ...] = ()

    @property
    def is_control(self) -> bool:
        return bool(self.controls)


def decode_metadata_batch(batch: Buffer, header: BatchHeader | None = None) -> MetadataBatch:
    """Every record of one whole batch (CRC checked), decoded; DecodeError names the first problem."""
    if header is None:
        header = BatchHeader.parse(batch)
    if not validate_crc(batch):
        raise DecodeError(f"record batch at offset {header.base_offset} fails its CRC check")
    if header.is_transactional or header.producer_id >= 0:
        raise DecodeError(f"record batch at offset {header.base_offset} has a producer: not a metadata batch")
    records = decode_records(batch)
    common = (header.base_offset, header.last_offset, header.partition_leader_epoch, header.max_timestamp)
    if header.is_control:
        controls = tuple(decode_control_record(record.key, record.value) for record in records)
        return MetadataBatch(*common, header.size, controls=controls)
    for record in records:
        if record.key is not None:
            raise DecodeError(f"metadata record at offset {header.base_offset + record.offset_delta} has a key")
    return MetadataBatch(*common, header.size, records=tuple(decode_metadata_record(r.value) for r in records))


def iter_metadata_batches(data: Buffer) -> Iterator[MetadataBatch]:
    """The batches of a ``__cluster_metadata`` segment or snapshot file's bytes, in order. A trailing partial
    batch (a torn write) raises DecodeError: the caller decides whether the log's end may be cut there."""
    for header, batch in iter_batches(data, strict=True):
        yield decode_metadata_batch(batch, header)
