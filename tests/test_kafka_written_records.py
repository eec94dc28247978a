"""kbroker decodes every record of segments and a snapshot that Apache Kafka 4.3.1 wrote, exactly as Kafka's own
DumpLogSegments decodes them, and re-encodes each to Kafka's bytes.

The fixtures (tests/fixtures/kraft-4.3.1, made by tools/capture_kraft_fixtures.py) are a KRaft node's
``__cluster_metadata-0`` segment and newest snapshot, and its ``__consumer_offsets-0`` and ``__transaction_state-0``
segments after it created topics, configs, ACLs, a SCRAM user, a quota, producers, transactions and two groups;
beside each file, what DumpLogSegments printed for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protocol.coordinator_frame import decode_coordinator_record, encode_coordinator_record
from protocol.metadata_frame import MetadataBatch, encode_control_record, encode_metadata_record, iter_metadata_batches
from protocol.records import decode_records, iter_batches
from tests.kafka_json import DumpedBatch, group_metadata_json, kafka_json, metadata_type_name, parse_dump

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kraft-4.3.1"
CONTROL_NAMES = {  # how DumpLogSegments introduces each KRaft control message
    "LeaderChangeMessage": "LeaderChange:",
    "SnapshotHeaderRecord": "SnapshotHeader",
    "SnapshotFooterRecord": "SnapshotFooter",
    "KRaftVersionRecord": "KRaftVersion",
    "VotersRecord": "KRaftVoters",
}


def dumped(path: Path) -> list[DumpedBatch]:
    return parse_dump(path.with_name(path.name + ".dump").read_text())


def metadata_files() -> list[Path]:
    directory = FIXTURES / "cluster_metadata"
    return sorted(directory.glob("*.log")) + sorted(directory.glob("*.checkpoint"))


def check_metadata_file(path: Path) -> list[MetadataBatch]:
    data = path.read_bytes()
    ours = list(iter_metadata_batches(data))
    theirs = dumped(path)
    assert len(ours) == len(theirs) > 0
    raw = [decode_records(batch) for _, batch in iter_batches(data, strict=True)]
    for mine, kafka, records in zip(ours, theirs, raw, strict=True):
        assert kafka.valid
        assert (mine.base_offset, mine.last_offset, mine.leader_epoch, mine.is_control) == (
            kafka.base_offset,
            kafka.last_offset,
            kafka.leader_epoch,
            kafka.control,
        )
        if mine.is_control:
            assert len(mine.controls) == len(kafka.records)
            for message, record, line in zip(mine.controls, records, kafka.records, strict=True):
                assert encode_control_record(message) == (record.key, record.value)  # Kafka's bytes again
                if message.NAME in CONTROL_NAMES:
                    name, _, text = line.rest.strip().partition(" ")
                    assert name == CONTROL_NAMES[message.NAME]
                    assert parse_json(text) == kafka_json(message, 0)
            continue
        assert len(mine.records) == len(kafka.records)
        for decoded, record, line in zip(mine.records, records, kafka.records, strict=True):
            assert line.key is None and line.key_size == -1
            assert line.payload == {
                "type": metadata_type_name(decoded.message.NAME),
                "version": decoded.version,
                "data": kafka_json(decoded.message, decoded.version),
            }
            assert encode_metadata_record(decoded.message, decoded.version) == record.value  # Kafka's bytes again
    return ours


def parse_json(text: str) -> Any:
    import json

    return json.loads(text)


@pytest.mark.parametrize("path", metadata_files(), ids=lambda p: p.name)
def test_every_metadata_record_kafka_wrote_decodes_as_kafka_decodes_it(path: Path) -> None:
    check_metadata_file(path)


def test_the_metadata_log_holds_what_the_scenario_did() -> None:
    records = [
        r.message
        for path in sorted((FIXTURES / "cluster_metadata").glob("*.log"))
        for batch in iter_metadata_batches(path.read_bytes())
        for r in batch.records
    ]
    by_name: dict[str, list[Any]] = {}
    for record in records:
        by_name.setdefault(record.NAME, []).append(record)
    topics = {t.name: t.topic_id for t in by_name["TopicRecord"]}
    assert {"records-topic", "doomed-topic"} <= set(topics)
    assert [r.topic_id for r in by_name["RemoveTopicRecord"]] == [topics["doomed-topic"]]
    partitions = [p for p in by_name["PartitionRecord"] if p.topic_id == topics["records-topic"]]
    assert sorted(p.partition_id for p in partitions) == [0, 1] and all(p.replicas == [1] for p in partitions)
    configs = {(c.resource_type, c.resource_name, c.name): c.value for c in by_name["ConfigRecord"]}
    assert configs[(2, "records-topic", "retention.ms")] == "3600000"
    assert configs[(2, "records-topic", "cleanup.policy")] == "compact"
    assert configs[(4, "1", "log.cleaner.threads")] == "2"
    acls = by_name["AccessControlEntryRecord"]
    assert {(a.principal, a.resource_name) for a in acls} == {("User:alice", "records-topic"), ("User:bob", "grp-")}
    bob = next(a for a in acls if a.principal == "User:bob")
    assert [r.id for r in by_name["RemoveAccessControlEntryRecord"]] == [bob.id]
    (scram,) = by_name["UserScramCredentialRecord"]
    assert (scram.name, scram.mechanism, scram.iterations, scram.salt) == ("alice", 1, 8192, b"salt")
    (quota,) = by_name["ClientQuotaRecord"]
    assert (quota.entity[0].entity_type, quota.entity[0].entity_name, quota.key, quota.value) == (
        "user",
        "alice",
        "producer_byte_rate",
        1024.0,
    )
    assert by_name["ProducerIdsRecord"] and by_name["RegisterBrokerRecord"][0].broker_id == 1
    assert any(f.name == "metadata.version" for f in by_name["FeatureLevelRecord"])


def coordinator_lines(directory: str, coordinator: str) -> list[tuple[Any, Any, Any]]:
    """(decoded record, Kafka's key, Kafka's payload) for every record of a coordinator partition's segments."""
    found = []
    for path in sorted((FIXTURES / directory).glob("*.log")):
        data = path.read_bytes()
        kafka = dumped(path)
        batches = list(iter_batches(data, strict=True))
        assert len(batches) == len(kafka) > 0
        for (header, batch), dumped_batch in zip(batches, kafka, strict=True):
            assert header.is_control == dumped_batch.control and dumped_batch.valid
            if header.is_control:
                continue  # transaction markers
            records = decode_records(batch)
            for record, line in zip(records, dumped_batch.records, strict=True):
                decoded = decode_coordinator_record(coordinator, record.key, record.value)
                key, value = encode_coordinator_record(decoded.key, decoded.value, decoded.value_version)
                assert (key, value) == (record.key, record.value)  # Kafka's bytes again
                found.append((decoded, line.key, line.payload))
    return found


def test_every_offsets_record_kafka_wrote_decodes_as_kafka_decodes_it() -> None:
    lines = coordinator_lines("consumer_offsets", "group")
    for decoded, key, payload in lines:
        assert key == {"type": str(decoded.record_type), "data": kafka_json(decoded.key, 0)}
        if decoded.value is None:
            assert payload == "<DELETE>"
        elif decoded.key.NAME == "GroupMetadataKey":  # the members' subscriptions and assignments printed decoded
            data = group_metadata_json(decoded.value, decoded.value_version)
            assert payload == {"version": str(decoded.value_version), "data": data}
        else:
            data = kafka_json(decoded.value, decoded.value_version)
            assert payload == {"version": str(decoded.value_version), "data": data}
    names = {decoded.key.NAME for decoded, _, _ in lines}
    assert {
        "OffsetCommitKey",
        "GroupMetadataKey",
        "ConsumerGroupMetadataKey",
        "ConsumerGroupMemberMetadataKey",
    } <= names
    commits = {
        (d.key.group, d.key.topic, d.key.partition): d.value.offset
        for d, _, _ in lines
        if d.key.NAME == "OffsetCommitKey" and d.value is not None
    }
    # Partition 0 holds three records, the transactional one and its commit marker (offsets 0-4), partition 1 three
    # records: each group committed its position, the consumer-protocol one's already past the marker.
    assert commits == {
        ("classic-group", "records-topic", 0): 4,
        ("classic-group", "records-topic", 1): 3,
        ("consumer-group", "records-topic", 0): 5,
        ("consumer-group", "records-topic", 1): 3,
    }


def test_every_transaction_log_record_kafka_wrote_decodes() -> None:
    lines = coordinator_lines("transaction_state", "transaction")
    states = [d.value.transaction_status for d, _, _ in lines if d.key.transactional_id == "records-txn"]
    assert states and all(d.key.NAME == "TransactionLogKey" for d, _, _ in lines)
    assert states[-1] == 4  # CompleteCommit (TransactionState's id)
