"""Kafka's framing of coordinator records (``__consumer_offsets``, ``__transaction_state``,
``__share_group_state``), sans I/O.

Each record of those partitions is one coordinator record (Kafka's CoordinatorRecordSerde):

    key   = record type (int16, the key schema's apiKey) | key struct, at version 0
    value = value version (int16) | value struct, at that version; a null value is a tombstone

Record types are numbered per coordinator (protocol.coordinator_records): type 0 is LegacyOffsetCommit to the
group coordinator, TransactionLog to the transaction coordinator and ShareSnapshot to the share coordinator.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from protocol._codec import Buffer, Message
from protocol.coordinator_records import RECORD_TYPES_BY_COORDINATOR, CoordinatorRecordType
from protocol.exceptions import DecodeError, EncodeError, UnsupportedVersionError

_INT16 = struct.Struct(">h")
KEY_VERSION = 0  # every coordinator key struct has this one version: the record type says what it is
_BY_KEY_NAME: dict[str, CoordinatorRecordType] = {
    record_type.key_class_name: record_type
    for record_types in RECORD_TYPES_BY_COORDINATOR.values()
    for record_type in record_types.values()
}


class UnknownRecordType(DecodeError):
    """A record type this coordinator does not know (Kafka's loader skips such records; a newer broker's)."""

    def __init__(self, coordinator: str, record_type: int) -> None:
        super().__init__(f"unknown {coordinator} coordinator record type {record_type}")
        self.record_type = record_type


class CoordinatorRecord(NamedTuple):
    """A decoded coordinator record: its key, and its value with that value's version (None, -1: a tombstone)."""

    record_type: int
    key: Message
    value: Message | None
    value_version: int


def record_type_of(key: Message) -> CoordinatorRecordType:
    record_type = _BY_KEY_NAME.get(type(key).__name__)
    if record_type is None or record_type.key_class() is not type(key):
        raise EncodeError(f"{type(key).__name__} is not a coordinator record key")
    return record_type


def encode_coordinator_record(
    key: Message, value: Message | None, value_version: int = -1
) -> tuple[bytes, bytes | None]:
    """The key and value bytes of a coordinator record; ``value`` None writes the key's tombstone."""
    record_type = record_type_of(key)
    key_bytes = bytearray(_INT16.pack(record_type.record_type))
    key.encode_into(key_bytes, KEY_VERSION)
    if value is None:
        return bytes(key_bytes), None
    if type(value) is not record_type.value_class():
        raise EncodeError(f"{record_type.key_class_name} takes a {record_type.value_class_name}, not {value.NAME}")
    low, high = record_type.value_stable_versions
    if not low <= value_version <= high:
        raise EncodeError(f"{value.NAME} cannot be written at version {value_version} (versions {low} to {high})")
    value_bytes = bytearray(_INT16.pack(value_version))
    value.encode_into(value_bytes, value_version)
    return bytes(key_bytes), bytes(value_bytes)


def _naming(exc: DecodeError, name: str, version: int) -> DecodeError:
    """The error with the record it happened in named (the codec names it only for some failures)."""
    return exc if name in str(exc) else DecodeError(f"{name} v{version}: {exc}")


def decode_coordinator_record(coordinator: str, key: Buffer | None, value: Buffer | None) -> CoordinatorRecord:
    """The record a coordinator partition's record holds; ``coordinator`` is group, transaction or share.

    UnknownRecordType (a DecodeError) for a record type the coordinator does not know; DecodeError for the rest.
    """
    record_types = RECORD_TYPES_BY_COORDINATOR.get(coordinator)
    if record_types is None:
        raise ValueError(f"no coordinator named {coordinator!r}")
    if key is None or len(key) < _INT16.size:
        raise DecodeError(f"{coordinator} coordinator record without a record type in its key")
    (type_number,) = _INT16.unpack_from(key)
    record_type = record_types.get(type_number)
    if record_type is None:
        raise UnknownRecordType(coordinator, type_number)
    try:
        key_message, end = record_type.key_class().decode(key, KEY_VERSION, _INT16.size)
    except DecodeError as exc:
        raise _naming(exc, record_type.key_class_name, KEY_VERSION) from None
    if end != len(key):
        raise DecodeError(f"{len(key) - end} bytes after the {record_type.key_class_name}")
    if value is None:
        return CoordinatorRecord(type_number, key_message, None, -1)
    if len(value) < _INT16.size:
        raise DecodeError(f"{record_type.value_class_name} without its version")
    (version,) = _INT16.unpack_from(value)
    try:
        value_message, end = record_type.value_class().decode(value, version, _INT16.size)
    except UnsupportedVersionError:
        low, high = record_type.value_versions
        raise DecodeError(
            f"{record_type.value_class_name} has no version {version} (versions {low} to {high})"
        ) from None
    except DecodeError as exc:
        raise _naming(exc, record_type.value_class_name, version) from None
    if end != len(value):
        raise DecodeError(f"{len(value) - end} bytes after {record_type.value_class_name} v{version}")
    return CoordinatorRecord(type_number, key_message, value_message, version)
