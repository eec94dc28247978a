"""protocol/metadata_frame.py and protocol/coordinator_frame.py: Kafka's framing of metadata and coordinator
records, round-tripped for every record type and version with hypothesis, and refused with one clear DecodeError
when the bytes are wrong. Decoding what Kafka itself wrote is tests/test_kafka_written_records.py."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.coordinator_frame import (
    CoordinatorRecord,
    UnknownRecordType,
    decode_coordinator_record,
    encode_coordinator_record,
)
from protocol.coordinator_records import RECORD_TYPES_BY_COORDINATOR
from protocol.coordinator_records.group_metadata_key import GroupMetadataKey
from protocol.coordinator_records.offset_commit_key import OffsetCommitKey
from protocol.coordinator_records.offset_commit_value import OffsetCommitValue
from protocol.coordinator_records.share_snapshot_key import ShareSnapshotKey
from protocol.coordinator_records.transaction_log_key import TransactionLogKey
from protocol.exceptions import DecodeError, EncodeError
from protocol.messages.leader_change_message import LeaderChangeMessage
from protocol.messages.snapshot_footer_record import SnapshotFooterRecord
from protocol.messages.snapshot_header_record import SnapshotHeaderRecord
from protocol.messages.voters_record import VotersRecord
from protocol.metadata_frame import (
    MetadataRecord,
    build_control_batch,
    build_metadata_batch,
    build_metadata_batches,
    decode_control_record,
    decode_metadata_batch,
    decode_metadata_record,
    encode_control_record,
    encode_metadata_record,
    iter_metadata_batches,
)
from protocol.metadata_records import RECORD_TYPES
from protocol.metadata_records.config_record import ConfigRecord
from protocol.metadata_records.partition_record import PartitionRecord
from protocol.metadata_records.topic_record import TopicRecord
from protocol.records import Record, build_batch
from tests.record_strategies import record_strategy

TOPIC_ID = uuid.UUID("6c6d3a0e-8b8f-4f67-9d4d-5f0e1f4f7a11")
ROUND_TRIPS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])

METADATA_CASES = [
    (r.name, v) for r in RECORD_TYPES.values() for v in range(r.stable_versions[0], r.stable_versions[1] + 1)
]
COORDINATOR_CASES = [
    (coordinator, t.record_type, v)
    for coordinator, types in RECORD_TYPES_BY_COORDINATOR.items()
    for t in types.values()
    for v in range(t.value_stable_versions[0], t.value_stable_versions[1] + 1)
]


# --- metadata records ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,version", METADATA_CASES, ids=[f"{n}-v{v}" for n, v in METADATA_CASES])
@ROUND_TRIPS
@given(data=st.data())
def test_every_metadata_record_round_trips_through_its_frame(name: str, version: int, data: st.DataObject) -> None:
    record = data.draw(record_strategy(name, version))
    value = encode_metadata_record(record, version)
    assert value[0] == 1  # the frame version
    decoded = decode_metadata_record(value)
    assert decoded == MetadataRecord(record, version)
    assert encode_metadata_record(decoded.message, version) == value


def test_a_topic_record_is_framed_as_kafka_frames_it() -> None:
    value = encode_metadata_record(TopicRecord(name="foo", topic_id=TOPIC_ID), 0)
    # frame version 1, type 2, version 0; compact string "foo"; the uuid; no tagged fields.
    assert value == bytes([1, 2, 0, 4]) + b"foo" + TOPIC_ID.bytes + b"\x00"


def test_a_multi_byte_record_type_varint_is_read() -> None:
    # ZkMigrationStateRecord is type 21, one byte; a type of 300 takes two: unknown, but read as a number.
    with pytest.raises(DecodeError, match="unknown metadata record type 300"):
        decode_metadata_record(bytes([1, 0xAC, 0x02, 0]))


@pytest.mark.parametrize(
    "value,problem",
    [
        (None, "without a value"),
        (b"", "ends before its frame version"),
        (bytes([0, 2, 0]), "frame version 0"),
        (bytes([2, 2, 0]), "unknown frame version 2"),
        (bytes([1]), "ends before its type"),
        (bytes([1, 2]), "ends before its version"),
        (bytes([1, 6, 0, 0]), "unknown metadata record type 6"),  # 6 is unassigned
        (bytes([1, 2, 1, 0]), "TopicRecord has no version 1"),
        (bytes([1, 2, 0, 4]) + b"fo", "TopicRecord v0: length 3 at position 4 runs past the end"),  # cut short
        (bytes([1, 0xFF, 0xFF, 0x03, 0]), "type 65535 is too large"),
        (bytes([1, 0x80, 0x80, 0x80, 0x80, 0x80]), "longer than 5 bytes"),
    ],
)
def test_a_bad_metadata_record_value_is_one_decode_error(value: bytes | None, problem: str) -> None:
    with pytest.raises(DecodeError, match=problem):
        decode_metadata_record(value)


def test_bytes_after_a_metadata_record_are_refused() -> None:
    value = encode_metadata_record(ConfigRecord(resource_type=2, resource_name="t", name="a", value="b"), 0)
    with pytest.raises(DecodeError, match="1 bytes after ConfigRecord v0"):
        decode_metadata_record(value + b"\x00")


def test_only_metadata_records_at_their_versions_are_encoded() -> None:
    with pytest.raises(EncodeError, match="not a metadata record"):
        encode_metadata_record(LeaderChangeMessage(), 0)
    with pytest.raises(EncodeError, match="not a metadata record"):
        encode_metadata_record(OffsetCommitKey(), 0)
    with pytest.raises(EncodeError, match="PartitionRecord cannot be written at version 3"):
        encode_metadata_record(PartitionRecord(), 3)


# --- KRaft control records -----------------------------------------------------------------------------


def test_control_messages_round_trip_with_kafkas_control_keys() -> None:
    leader_change = LeaderChangeMessage(
        leader_id=1,
        voters=[LeaderChangeMessage.Voter(voter_id=1)],
        granting_voters=[LeaderChangeMessage.Voter(voter_id=1)],
    )
    for message, control_type in (
        (leader_change, 2),
        (SnapshotHeaderRecord(last_contained_log_timestamp=1234), 3),
        (SnapshotFooterRecord(), 4),
        (VotersRecord(voters=[VotersRecord.Voter(voter_id=1, voter_directory_id=TOPIC_ID)]), 6),
    ):
        key, value = encode_control_record(message)
        assert key == struct.pack(">hh", 0, control_type)
        assert value == message.encode(0)  # unprefixed, at version 0
        assert decode_control_record(key, value) == message


@pytest.mark.parametrize(
    "key,value,problem",
    [
        (None, b"", "shorter than 4 bytes"),
        (b"\x00\x00\x00", b"", "shorter than 4 bytes"),
        (struct.pack(">hh", -1, 2), b"", "version -1 is negative"),
        (struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 5), "type 1 is not one of KRaft's"),  # a COMMIT marker
        (struct.pack(">hh", 0, 9), b"", "type 9 is not one of KRaft's"),
        (struct.pack(">hh", 0, 4), None, "SnapshotFooterRecord control record without a value"),
        (struct.pack(">hh", 0, 4), SnapshotFooterRecord().encode(0) + b"x", "1 bytes after SnapshotFooterRecord"),
    ],
)
def test_a_bad_control_record_is_one_decode_error(key: bytes | None, value: bytes | None, problem: str) -> None:
    with pytest.raises(DecodeError, match=problem):
        decode_control_record(key, value)


def test_a_key_version_above_zero_is_read_as_version_zero_as_kafka_does() -> None:
    assert decode_control_record(struct.pack(">hh", 3, 4), SnapshotFooterRecord().encode(0)) == SnapshotFooterRecord()


# --- batches -------------------------------------------------------------------------------------------


def _records(count: int) -> list[MetadataRecord]:
    return [
        MetadataRecord(ConfigRecord(resource_type=2, resource_name=f"topic-{i}", name="retention.ms", value=str(i)), 0)
        for i in range(count)
    ]


def test_a_metadata_batch_round_trips_with_its_offsets_epoch_and_time() -> None:
    records = [MetadataRecord(TopicRecord(name="t", topic_id=TOPIC_ID), 0), *_records(2)]
    batch = build_metadata_batch(records, leader_epoch=7, timestamp_ms=1_700_000_000_000, base_offset=40)
    decoded = decode_metadata_batch(batch)
    assert (decoded.base_offset, decoded.last_offset, decoded.leader_epoch) == (40, 42, 7)
    assert decoded.append_timestamp == 1_700_000_000_000 and decoded.size == len(batch)
    assert decoded.records == tuple(records) and not decoded.is_control


def test_a_control_batch_round_trips() -> None:
    messages = [SnapshotHeaderRecord(last_contained_log_timestamp=5), VotersRecord()]
    batch = build_control_batch(messages, leader_epoch=2, timestamp_ms=10)
    decoded = decode_metadata_batch(batch)
    assert decoded.is_control and decoded.controls == tuple(messages) and decoded.records == ()


def test_records_are_split_into_batches_with_consecutive_offsets() -> None:
    records = _records(40)
    one_value = len(encode_metadata_record(records[0].message, 0))
    batches = build_metadata_batches(records, leader_epoch=3, timestamp_ms=1, base_offset=100, max_batch_bytes=400)
    assert len(batches) > 3 and all(len(b) <= 400 for b in batches)
    decoded = list(iter_metadata_batches(b"".join(batches)))
    assert [r for b in decoded for r in b.records] == records
    assert decoded[0].base_offset == 100 and decoded[-1].last_offset == 139
    assert all(a.last_offset + 1 == b.base_offset for a, b in zip(decoded, decoded[1:], strict=False))
    assert one_value * len(decoded[0].records) < 400  # each batch was filled to near its limit
    assert len(build_metadata_batches(records, leader_epoch=3, timestamp_ms=1)) == 1


def test_a_record_larger_than_the_limit_gets_a_batch_of_its_own() -> None:
    big = MetadataRecord(ConfigRecord(resource_type=2, resource_name="t", name="x", value="v" * 1000), 0)
    batches = build_metadata_batches(
        [*_records(1), big, *_records(1)], leader_epoch=0, timestamp_ms=1, max_batch_bytes=300
    )
    assert [len(decode_metadata_batch(b).records) for b in batches] == [1, 1, 1]


def test_a_damaged_or_foreign_batch_is_refused() -> None:
    batch = bytearray(build_metadata_batch(_records(1), leader_epoch=1, timestamp_ms=1))
    batch[-3] ^= 0xFF
    with pytest.raises(DecodeError, match="fails its CRC check"):
        decode_metadata_batch(batch)
    produced = build_batch([Record(value=encode_metadata_record(*_records(1)[0]))], producer_id=5, producer_epoch=0)
    with pytest.raises(DecodeError, match="has a producer"):
        decode_metadata_batch(produced)
    keyed = build_batch([Record(key=b"k", value=encode_metadata_record(*_records(1)[0]))], base_offset=9)
    with pytest.raises(DecodeError, match="metadata record at offset 9 has a key"):
        decode_metadata_batch(keyed)
    whole = build_metadata_batch(_records(1), leader_epoch=1, timestamp_ms=1)
    with pytest.raises(DecodeError, match="runs past the end"):
        list(iter_metadata_batches(whole + whole[:70]))


# --- coordinator records -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "coordinator,record_type,version", COORDINATOR_CASES, ids=[f"{c}-{t}-v{v}" for c, t, v in COORDINATOR_CASES]
)
@ROUND_TRIPS
@given(data=st.data())
def test_every_coordinator_record_round_trips(
    coordinator: str, record_type: int, version: int, data: st.DataObject
) -> None:
    kind = RECORD_TYPES_BY_COORDINATOR[coordinator][record_type]
    key = data.draw(record_strategy(kind.key_class_name, 0))
    value = data.draw(record_strategy(kind.value_class_name, version))
    key_bytes, value_bytes = encode_coordinator_record(key, value, version)
    assert key_bytes[:2] == struct.pack(">h", record_type)
    assert value_bytes is not None and value_bytes[:2] == struct.pack(">h", version)
    assert decode_coordinator_record(coordinator, key_bytes, value_bytes) == CoordinatorRecord(
        record_type, key, value, version
    )
    tombstone = encode_coordinator_record(key, None)
    assert tombstone == (key_bytes, None)
    assert decode_coordinator_record(coordinator, key_bytes, None) == CoordinatorRecord(record_type, key, None, -1)


def test_an_offset_commit_is_framed_as_kafka_frames_it() -> None:
    key, value = encode_coordinator_record(
        OffsetCommitKey(group="g", topic="t", partition=3),
        OffsetCommitValue(offset=42, leader_epoch=5, metadata="m", commit_timestamp=1000),
        3,
    )
    assert key == struct.pack(">hh", 1, 1) + b"g" + struct.pack(">h", 1) + b"t" + struct.pack(">i", 3)
    expected = struct.pack(">hqih", 3, 42, 5, 1) + b"m" + struct.pack(">q", 1000)
    assert value == expected


def test_record_types_are_numbered_per_coordinator() -> None:
    key, _ = encode_coordinator_record(TransactionLogKey(transactional_id="tx"), None)
    assert decode_coordinator_record("transaction", key, None).key == TransactionLogKey(transactional_id="tx")
    share_key, _ = encode_coordinator_record(ShareSnapshotKey(group_id="g", topic_id=TOPIC_ID, partition=1), None)
    assert share_key[:2] == key[:2] == b"\x00\x00"  # type 0 to both, and to the group coordinator a third thing
    with pytest.raises(DecodeError):
        decode_coordinator_record("group", key, None)


def test_bad_coordinator_records_are_one_decode_error() -> None:
    key, value = encode_coordinator_record(GroupMetadataKey(group="g"), None)
    with pytest.raises(UnknownRecordType, match="unknown group coordinator record type 9") as unknown:
        decode_coordinator_record("group", struct.pack(">h", 9) + key[2:], None)
    assert unknown.value.record_type == 9
    with pytest.raises(UnknownRecordType, match="unknown transaction coordinator record type 1"):
        decode_coordinator_record("transaction", struct.pack(">h", 1) + b"\x00\x00", None)
    with pytest.raises(DecodeError, match="without a record type"):
        decode_coordinator_record("group", b"\x00", None)
    with pytest.raises(DecodeError, match="1 bytes after the GroupMetadataKey"):
        decode_coordinator_record("group", key + b"\x00", None)
    offsets_key, offsets_value = encode_coordinator_record(OffsetCommitKey(group="g"), OffsetCommitValue(), 1)
    assert offsets_value is not None
    with pytest.raises(DecodeError, match="OffsetCommitValue has no version 5"):
        decode_coordinator_record("group", offsets_key, struct.pack(">h", 5) + offsets_value[2:])
    with pytest.raises(DecodeError, match="OffsetCommitValue without its version"):
        decode_coordinator_record("group", offsets_key, b"\x00")
    with pytest.raises(DecodeError, match="malformed OffsetCommitValue"):
        decode_coordinator_record("group", offsets_key, offsets_value[:-3])
    with pytest.raises(ValueError, match="no coordinator named 'offsets'"):
        decode_coordinator_record("offsets", offsets_key, offsets_value)


def test_only_coordinator_records_at_their_versions_are_encoded() -> None:
    with pytest.raises(EncodeError, match="TopicRecord is not a coordinator record key"):
        encode_coordinator_record(TopicRecord(), None)
    with pytest.raises(EncodeError, match="OffsetCommitKey takes a OffsetCommitValue, not TopicRecord"):
        encode_coordinator_record(OffsetCommitKey(), TopicRecord(), 0)
    with pytest.raises(EncodeError, match="OffsetCommitValue cannot be written at version 5"):
        encode_coordinator_record(OffsetCommitKey(), OffsetCommitValue(), 5)
    with pytest.raises(EncodeError, match="cannot be written at version -1"):
        encode_coordinator_record(OffsetCommitKey(), OffsetCommitValue())


def test_a_tagged_nullable_struct_is_framed_as_kafkas_generated_code_frames_it() -> None:
    # Inside a tagged field a nullable struct's marker is a varint (0 null, 1 present), not the int8 of a plain
    # field; and a null whose schema default is not "null" is written, not left out (ConsumerGroupMemberMetadataValue
    # as Kafka 4.3.1 wrote it for a consumer-protocol member).
    from protocol.coordinator_records.consumer_group_member_metadata_value import (
        ConsumerGroupMemberMetadataValue as Member,
    )

    plain = Member(client_id="c", client_host="h", subscribed_topic_names=[], rebalance_timeout_ms=1)
    assert plain.classic_member_metadata == Member.ClassicMemberMetadata()  # the schema's default: an empty struct
    empty_tags = plain.encode(0)
    assert empty_tags.endswith(b"\x00")  # the default is not written
    null = Member(
        client_id="c", client_host="h", subscribed_topic_names=[], rebalance_timeout_ms=1, classic_member_metadata=None
    )
    encoded = null.encode(0)
    assert encoded == empty_tags[:-1] + bytes([1, 0, 1, 0])  # one tagged field: tag 0, size 1, marker 0
    assert Member.decode(encoded, 0)[0].classic_member_metadata is None
    classic = Member.ClassicMemberMetadata(session_timeout_ms=45000, supported_protocols=[])
    present = Member(client_id="c", client_host="h", subscribed_topic_names=[], classic_member_metadata=classic)
    # One tagged field: tag 0, size 7, marker 1, then the struct: session timeout, an empty array, no tags.
    assert present.encode(0).endswith(bytes([1, 0, 7, 1]) + struct.pack(">i", 45000) + b"\x01\x00")
    assert Member.decode(present.encode(0), 0)[0].classic_member_metadata == classic
