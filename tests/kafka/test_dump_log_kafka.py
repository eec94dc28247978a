"""Kafka's own dump tool reads what kbroker writes: DumpLogSegments (``kafka-dump-log.sh``, from the kafka-tools
4.4.0 jars on Maven) decodes kbroker's metadata log (a running broker's topics, configs, ACLs, SCRAM users and
client quotas included) and snapshot with ``--cluster-metadata-decoder``, and segments
of coordinator records that kbroker encoded and wrote with its log engine with ``--offsets-decoder`` and
``--transaction-log-decoder``: every record, field for field as kbroker encoded it.

Each test starts one short-lived JVM: run them under the machine's JVM lock where there is one.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kbroker.metadata.log import MetadataLog
from kbroker.metadata.snapshots import image_records
from kbroker.storage import LogConfig, PartitionLog
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol._codec import Message
from protocol.coordinator_frame import encode_coordinator_record
from protocol.coordinator_records import RECORD_TYPES_BY_COORDINATOR
from protocol.coordinator_records.consumer_group_member_metadata_key import ConsumerGroupMemberMetadataKey
from protocol.coordinator_records.consumer_group_member_metadata_value import ConsumerGroupMemberMetadataValue
from protocol.coordinator_records.consumer_group_metadata_key import ConsumerGroupMetadataKey
from protocol.coordinator_records.consumer_group_metadata_value import ConsumerGroupMetadataValue
from protocol.coordinator_records.group_metadata_key import GroupMetadataKey
from protocol.coordinator_records.group_metadata_value import GroupMetadataValue
from protocol.coordinator_records.offset_commit_key import OffsetCommitKey
from protocol.coordinator_records.offset_commit_value import OffsetCommitValue
from protocol.coordinator_records.transaction_log_key import TransactionLogKey
from protocol.coordinator_records.transaction_log_value import TransactionLogValue
from protocol.messages.k_raft_version_record import KRaftVersionRecord
from protocol.messages.leader_change_message import LeaderChangeMessage
from protocol.messages.voters_record import VotersRecord
from protocol.metadata_frame import MetadataRecord
from protocol.metadata_records import RECORD_TYPES
from protocol.records import Record, build_batch
from tests.kafka_json import (
    DumpedBatch,
    group_metadata_json,
    kafka_json,
    metadata_type_name,
    parse_dump,
    transaction_log_value_json,
)
from tests.metadata.sample_records import TOPIC_ID, sample_records
from tests.metadata.test_snapshots import SNAPSHOT_EVERY_COMMIT, change_through_requests
from tests.record_strategies import record_strategy
from tools import maven_artifacts

KAFKA_TOOLS = "kafka-tools-4.4.0"  # tools/maven/kafka-tools-4.4.0.pom.xml
DUMP_LOG_SEGMENTS = "org.apache.kafka.tools.DumpLogSegments"
NOW = 1_760_000_000_000

Dump = Callable[[str, Path], list[DumpedBatch]]


@pytest.fixture(scope="module")
def dump() -> Dump:
    """``dump(decoder, file)``: DumpLogSegments' output for ``file``, parsed; it must exit 0 and print no error."""
    try:
        jars = maven_artifacts.prepare(KAFKA_TOOLS)
    except maven_artifacts.MavenUnavailable as exc:
        pytest.skip(f"{KAFKA_TOOLS} unavailable (python tools/maven_artifacts.py {KAFKA_TOOLS}): {exc}")
    classpath = ":".join(str(jar) for jar in sorted(jars.glob("*.jar")))
    java = ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m", "-Dfile.encoding=UTF-8"]
    java += ["-cp", classpath, DUMP_LOG_SEGMENTS]

    def run(decoder: str, path: Path) -> list[DumpedBatch]:
        done = subprocess.run(
            [*java, decoder, "--files", str(path)], capture_output=True, encoding="utf-8", timeout=180
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Error at" not in done.stdout and "Unknown record type" not in done.stdout, done.stdout
        assert "invalid bytes" not in done.stdout, done.stdout
        return parse_dump(done.stdout)

    return run


def metadata_payload(message: Message, version: int) -> dict:
    return {"type": metadata_type_name(message.NAME), "version": version, "data": kafka_json(message, version)}


def test_kafkas_dump_tool_reads_kbrokers_metadata_log(tmp_path: Path, dump: Dump) -> None:
    records = sample_records()
    with MetadataLog(tmp_path) as log:
        log.become_leader(1, node_id=1, voters=[1])
        log.append(records[:6], timestamp_ms=NOW)
        log.append(records[6:], timestamp_ms=NOW + 1)
        log.become_leader(2, node_id=1, voters=[1])
        end = log.end_offset
    batches = dump("--cluster-metadata-decoder", tmp_path / "__cluster_metadata-0" / "00000000000000000000.log")
    assert [(b.base_offset, b.last_offset, b.leader_epoch, b.control) for b in batches] == [
        (0, 0, 1, True),
        (1, 6, 1, False),
        (7, end - 2, 1, False),
        (end - 1, end - 1, 2, True),
    ]
    assert all(b.valid for b in batches)
    printed = [r.payload for b in batches if not b.control for r in b.records]
    assert printed == [metadata_payload(r.message, r.version) for r in records]
    assert [r.timestamp for r in batches[1].records] == [NOW] * 6
    leader_change = LeaderChangeMessage(
        leader_id=1,
        voters=[LeaderChangeMessage.Voter(voter_id=1)],
        granting_voters=[LeaderChangeMessage.Voter(voter_id=1)],
    )
    name, _, printed_json = batches[0].records[0].rest.strip().partition(" ")
    assert (name, json.loads(printed_json)) == ("LeaderChange:", kafka_json(leader_change, 0))


def test_kafkas_dump_tool_reads_kbrokers_snapshot(tmp_path: Path, dump: Dump) -> None:
    records = sample_records()
    with MetadataLog(tmp_path) as log:
        log.become_leader(3, node_id=1, voters=[1])
        log.append(records, timestamp_ms=NOW)
        snapshot_id = log.write_snapshot(records, log.end_offset, last_contained_timestamp=NOW, max_batch_bytes=400)
    batches = dump("--cluster-metadata-decoder", tmp_path / "__cluster_metadata-0" / snapshot_id.file_name)
    header, *data, footer = batches
    assert header.control and footer.control and not any(b.control for b in data) and len(data) > 1
    assert header.records[0].rest.strip() == f'SnapshotHeader {{"version":0,"lastContainedLogTimestamp":{NOW}}}'
    assert footer.records[0].rest.strip() == 'SnapshotFooter {"version":0}'
    assert {b.leader_epoch for b in batches} == {3}
    assert [r.payload for b in data for r in b.records] == [metadata_payload(r.message, r.version) for r in records]


def test_kafkas_dump_tool_decodes_the_snapshot_a_running_broker_wrote(tmp_path: Path, dump: Dump) -> None:
    with RunningBroker(tmp_path, SNAPSHOT_EVERY_COMMIT) as running, WireClient(running.bootstrap) as client:
        change_through_requests(client)  # a topic, a config and an ACL: each commit is followed by a snapshot
        assert running.broker is not None
        image = running.broker.metadata.image
    with MetadataLog(tmp_path) as log:
        snapshot_id = log.latest_snapshot_id()
    assert snapshot_id is not None and snapshot_id.end_offset == image.provenance.offset + 1
    header, *data, footer = dump(
        "--cluster-metadata-decoder", tmp_path / "__cluster_metadata-0" / snapshot_id.file_name
    )
    assert header.control and footer.control and data and not any(b.control for b in data)
    assert header.records[0].rest.strip().startswith("SnapshotHeader ")
    printed = [r.payload for b in data for r in b.records]
    assert printed == [metadata_payload(r.message, r.version) for r in image_records(image)]
    assert {"TOPIC_RECORD", "PARTITION_RECORD", "CONFIG_RECORD", "ACCESS_CONTROL_ENTRY_RECORD"} <= {
        p["type"] for p in printed
    }


def test_kafkas_dump_tool_reads_the_kraft_version_and_voters_of_a_snapshot_header(tmp_path: Path, dump: Dump) -> None:
    voters = VotersRecord(
        voters=[
            VotersRecord.Voter(
                voter_id=1,
                voter_directory_id=uuid.UUID(int=7),
                endpoints=[VotersRecord.Endpoint(name="CONTROLLER", host="localhost", port=9093)],
                k_raft_version_feature=VotersRecord.KRaftVersionFeature(
                    min_supported_version=0, max_supported_version=1
                ),
            )
        ]
    )
    controls = [KRaftVersionRecord(k_raft_version=1), voters]
    with MetadataLog(tmp_path) as log:
        snapshot_id = log.write_snapshot(sample_records()[:1], 0, last_contained_timestamp=0, controls=controls)
    header, _, _ = dump("--cluster-metadata-decoder", tmp_path / "__cluster_metadata-0" / snapshot_id.file_name)
    printed = [line.rest.strip().partition(" ") for line in header.records]
    assert [(name, json.loads(text)) for name, _, text in printed[1:]] == [
        ("KRaftVersion", kafka_json(controls[0], 0)),
        ("KRaftVoters", kafka_json(voters, 0)),
    ]


def coordinator_segment(tmp_path: Path, name: str, entries: list[tuple[Message, Message | None, int]]) -> Path:
    """A segment of ``name``-0 holding ``entries`` (key, value, value version), written with kbroker's log."""
    records = []
    for i, (key, value, version) in enumerate(entries):
        key_bytes, value_bytes = encode_coordinator_record(key, value, version)
        records.append(Record(offset_delta=i, key=key_bytes, value=value_bytes))
    log = PartitionLog(name, 0, tmp_path / f"{name}-0", LogConfig(cleanup_policy="compact"), clean=True)
    assert log.append(bytearray(build_batch(records, base_timestamp=NOW))).error_code == 0
    log.close()
    return tmp_path / f"{name}-0" / "00000000000000000000.log"


def test_kafkas_dump_tool_reads_kbrokers_offset_commits_and_groups(tmp_path: Path, dump: Dump) -> None:
    entries: list[tuple[Message, Message | None, int]] = [
        (
            OffsetCommitKey(group="shop", topic="orders", partition=0),
            OffsetCommitValue(offset=42, leader_epoch=3, metadata="m", commit_timestamp=NOW),
            3,
        ),
        (
            OffsetCommitKey(group="shop", topic="orders", partition=1),
            OffsetCommitValue(offset=7, leader_epoch=0, metadata="", commit_timestamp=NOW, topic_id=TOPIC_ID),
            4,
        ),
        (
            OffsetCommitKey(group="old", topic="orders", partition=0),
            OffsetCommitValue(offset=1, metadata="", commit_timestamp=NOW, expire_timestamp=NOW + 1000),
            1,
        ),
        (
            GroupMetadataKey(group="shop"),
            GroupMetadataValue(
                protocol_type="console", generation=2, protocol="range", leader="m-1", current_state_timestamp=NOW
            ),
            3,
        ),
        (ConsumerGroupMetadataKey(group_id="next"), ConsumerGroupMetadataValue(epoch=5), 0),
        (
            ConsumerGroupMemberMetadataKey(group_id="next", member_id="member-1"),
            ConsumerGroupMemberMetadataValue(
                client_id="c", client_host="/127.0.0.1", subscribed_topic_names=["orders"], rebalance_timeout_ms=30000
            ),
            0,
        ),
        (OffsetCommitKey(group="old", topic="orders", partition=0), None, -1),  # a tombstone
    ]
    (batch,) = dump("--offsets-decoder", coordinator_segment(tmp_path, "__consumer_offsets", entries))
    assert len(batch.records) == len(entries)
    for (key, value, version), line in zip(entries, batch.records, strict=True):
        record_type = int.from_bytes(encode_coordinator_record(key, None)[0][:2], "big")
        assert line.key == {"type": str(record_type), "data": kafka_json(key, 0)}
        expected = "<DELETE>" if value is None else {"version": str(version), "data": kafka_json(value, version)}
        assert line.payload == expected
    assert batch.records[1].payload["data"]["topicId"] == "PxwrSl1uT3CBkqO0xdbn-A"  # a tagged field, as Kafka reads it


def test_kafkas_dump_tool_reads_kbrokers_transaction_log(tmp_path: Path, dump: Dump) -> None:
    value = TransactionLogValue(
        producer_id=1000,
        producer_epoch=2,
        transaction_timeout_ms=60000,
        transaction_status=4,  # CompleteCommit
        transaction_partitions=[TransactionLogValue.PartitionsSchema(topic="orders", partition_ids=[0, 1])],
        transaction_last_update_timestamp_ms=NOW,
        transaction_start_timestamp_ms=NOW - 5,
        client_transaction_version=2,
    )
    entries: list[tuple[Message, Message | None, int]] = [
        (TransactionLogKey(transactional_id="txn-" + uuid.UUID(int=1).hex[:4]), value, 1),
        (TransactionLogKey(transactional_id="gone"), None, -1),
    ]
    (batch,) = dump("--transaction-log-decoder", coordinator_segment(tmp_path, "__transaction_state", entries))
    assert len(batch.records) == 2
    for (key, value_, version), line in zip(entries, batch.records, strict=True):
        assert line.key == {"type": "0", "data": kafka_json(key, 0)}
        expected = (
            "<DELETE>"
            if value_ is None
            else {"version": str(version), "data": transaction_log_value_json(value_, version)}
        )
        assert line.payload == expected


# --- every record type and version, with every field drawn ----------------------------------------------

DIFFERENTIAL = settings(
    max_examples=3,  # one JVM each: every record type and version is in each example
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: each step would start a JVM
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
DECODERS = {
    "group": "--offsets-decoder",
    "transaction": "--transaction-log-decoder",
    "share": "--share-group-state-decoder",
}


@DIFFERENTIAL
@given(data=st.data())
def test_kafka_decodes_every_metadata_record_type_and_version_kbroker_encodes(dump: Dump, data: st.DataObject) -> None:
    records = [
        MetadataRecord(data.draw(record_strategy(kind.name, version), label=f"{kind.name} v{version}"), version)
        for kind in RECORD_TYPES.values()
        for version in range(kind.stable_versions[0], kind.stable_versions[1] + 1)
    ]
    with tempfile.TemporaryDirectory() as scratch, MetadataLog(Path(scratch)) as log:
        log.become_leader(1, node_id=1, voters=[1])
        log.append(records, timestamp_ms=NOW)
        batches = dump("--cluster-metadata-decoder", log.directory / "00000000000000000000.log")
    printed = [r.payload for b in batches if not b.control for r in b.records]
    assert printed == [metadata_payload(r.message, r.version) for r in records]


def test_kafka_prints_an_infinite_quota_value_as_a_quoted_word(dump: Dump) -> None:
    """A float64 JSON has no number for (hypothesis draws them): Jackson writes "Infinity" and "-Infinity"."""
    from protocol.metadata_records import ClientQuotaRecord

    entity = [ClientQuotaRecord.EntityData(entity_type="user", entity_name="alice")]
    records = [
        MetadataRecord(ClientQuotaRecord(entity=entity, key="producer_byte_rate", value=value, remove=False), 0)
        for value in (float("inf"), float("-inf"), 1024.0)
    ]
    with tempfile.TemporaryDirectory() as scratch, MetadataLog(Path(scratch)) as log:
        log.become_leader(1, node_id=1, voters=[1])
        log.append(records, timestamp_ms=NOW)
        batches = dump("--cluster-metadata-decoder", log.directory / "00000000000000000000.log")
    printed = [r.payload for b in batches if not b.control for r in b.records]
    assert [payload["data"]["value"] for payload in printed] == ["Infinity", "-Infinity", 1024.0]
    assert printed == [metadata_payload(r.message, r.version) for r in records]


@pytest.mark.parametrize("coordinator", sorted(DECODERS))
@DIFFERENTIAL
@given(data=st.data())
def test_kafka_decodes_every_coordinator_record_type_and_version_kbroker_encodes(
    dump: Dump, coordinator: str, data: st.DataObject
) -> None:
    entries: list[tuple[Message, Message | None, int]] = []
    for kind in RECORD_TYPES_BY_COORDINATOR[coordinator].values():
        low, high = kind.value_stable_versions
        for version in range(low, high + 1):
            key = data.draw(record_strategy(kind.key_class_name, 0), label=kind.key_class_name)
            value = data.draw(
                record_strategy(kind.value_class_name, version), label=f"{kind.value_class_name} v{version}"
            )
            entries.append((key, value, version))
        entries.append((key, None, -1))  # and a tombstone of each type
    with tempfile.TemporaryDirectory() as scratch:
        (batch,) = dump(DECODERS[coordinator], coordinator_segment(Path(scratch), f"__{coordinator}-records", entries))
    assert len(batch.records) == len(entries)
    for (key, value, version), line in zip(entries, batch.records, strict=True):
        record_type = int.from_bytes(encode_coordinator_record(key, None)[0][:2], "big")
        assert line.key == {"type": str(record_type), "data": kafka_json(key, 0)}
        if value is None:
            assert line.payload == "<DELETE>"
        else:
            as_json = {
                "GroupMetadataValue": group_metadata_json,
                "TransactionLogValue": transaction_log_value_json,
            }.get(value.NAME, kafka_json)
            assert line.payload == {"version": str(version), "data": as_json(value, version)}


def test_kafkas_dump_tool_reads_the_metadata_log_a_running_broker_wrote(tmp_path: Path, dump: Dump) -> None:
    """Migrated topics (an older kbroker's data directory), a topic created, grown, configured and deleted by
    requests: the broker's own __cluster_metadata-0 as Kafka's tool prints it."""
    from kbroker.testing import RunningBroker
    from kbroker.wire_client import WireClient
    from protocol.messages.create_partitions_request import CreatePartitionsRequest
    from protocol.messages.create_topics_request import CreateTopicsRequest
    from protocol.messages.delete_topics_request import DeleteTopicsRequest
    from protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest
    from tests.metadata.test_migration import EXPECTED, older_data_dir

    data_dir = older_data_dir(tmp_path)
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        topic = CreateTopicsRequest.CreatableTopic(name="fresh", num_partitions=1, replication_factor=1)
        created = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0]
        assert created.error_code == 0
        grow = CreatePartitionsRequest.CreatePartitionsTopic(name="fresh", count=2, assignments=None)
        assert client.request(CreatePartitionsRequest(topics=[grow], timeout_ms=5000), 3).results[0].error_code == 0
        change = IncrementalAlterConfigsRequest.AlterConfigsResource(
            resource_type=2,
            resource_name="fresh",
            configs=[
                IncrementalAlterConfigsRequest.AlterableConfig(name="retention.ms", config_operation=0, value="9")
            ],
        )
        assert client.request(IncrementalAlterConfigsRequest(resources=[change]), 1).responses[0].error_code == 0
        deleted = client.request(DeleteTopicsRequest(topic_names=["clicks"], timeout_ms=5000), 4).responses[0]
        assert deleted.error_code == 0
        node = broker.broker.node_id if broker.broker is not None else -1
    batches = dump("--cluster-metadata-decoder", data_dir / "__cluster_metadata-0" / "00000000000000000000.log")
    assert all(b.valid for b in batches)
    printed = [r.payload for b in batches if not b.control for r in b.records]
    kinds = [p["type"] for p in printed]
    assert kinds[0] == "FEATURE_LEVEL_RECORD" and printed[0]["data"]["featureLevel"] == 30
    # The migration, in one metadata transaction, before this broker registered.
    begin, end = kinds.index("BEGIN_TRANSACTION_RECORD"), kinds.index("END_TRANSACTION_RECORD")
    migrated = {p["data"]["name"] for p in printed[begin:end] if p["type"] == "TOPIC_RECORD"}
    assert migrated == set(EXPECTED)
    assert kinds[end + 1] == "REGISTER_BROKER_RECORD" and printed[end + 1]["data"]["brokerId"] == node
    # The older kbroker's producer-id-block, moved after the registration it names.
    assert kinds[end + 2] == "PRODUCER_IDS_RECORD" and printed[end + 2]["data"]["brokerId"] == node
    assert kinds[end + 3 :] == [
        "TOPIC_RECORD",
        "PARTITION_RECORD",
        "PARTITION_RECORD",
        "CONFIG_RECORD",
        "REMOVE_TOPIC_RECORD",
    ]
    assert printed[end + 6]["data"] == {
        "resourceType": 2,
        "resourceName": "fresh",
        "name": "retention.ms",
        "value": "9",
    }
    assert [p["data"]["partitionId"] for p in printed[end + 4 : end + 6]] == [0, 1]


def test_kafkas_dump_tool_reads_acls_scram_users_and_quotas_a_running_broker_wrote(tmp_path: Path, dump: Dump) -> None:
    """A topic with a config, an ACL, a SCRAM user (set, then one mechanism deleted) and a client quota made by
    requests on a fresh kbroker: Kafka's tool decodes each record of its __cluster_metadata-0, field for field."""
    from kbroker.security.sasl.scram import SCRAM_SHA_256, SCRAM_SHA_512, salted_password
    from kbroker.testing import RunningBroker
    from kbroker.wire_client import WireClient
    from protocol.messages.alter_client_quotas_request import AlterClientQuotasRequest as Quotas
    from protocol.messages.alter_user_scram_credentials_request import AlterUserScramCredentialsRequest as Scram
    from protocol.messages.create_acls_request import CreateAclsRequest
    from protocol.messages.create_topics_request import CreateTopicsRequest

    secured = {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
    }
    with RunningBroker(tmp_path, secured) as broker, WireClient(broker.bootstrap) as client:
        config = CreateTopicsRequest.CreatableTopicConfig(name="cleanup.policy", value="compact")
        topic = CreateTopicsRequest.CreatableTopic(
            name="audit", num_partitions=1, replication_factor=1, configs=[config]
        )
        assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0
        acl = CreateAclsRequest.AclCreation(
            resource_type=2,
            resource_name="audit",
            resource_pattern_type=3,
            principal="User:alice",
            host="*",
            operation=3,
            permission_type=3,
        )
        assert [r.error_code for r in client.request(CreateAclsRequest(creations=[acl]), 3).results] == [0]
        upsertions = [
            Scram.ScramCredentialUpsertion(
                name="alice",
                mechanism=scram.type,
                iterations=iterations,
                salt=b"salt",
                salted_password=salted_password(scram, "pw", b"salt", iterations),
            )
            for scram, iterations in ((SCRAM_SHA_256, 4096), (SCRAM_SHA_512, 8192))
        ]
        for upsertion in upsertions:
            answer = client.request(Scram(deletions=[], upsertions=[upsertion]), 0)
            assert [r.error_code for r in answer.results] == [0]
        deletion = Scram.ScramCredentialDeletion(name="alice", mechanism=SCRAM_SHA_256.type)
        assert [r.error_code for r in client.request(Scram(deletions=[deletion], upsertions=[]), 0).results] == [0]
        entry = Quotas.EntryData(
            entity=[Quotas.EntityData(entity_type="user", entity_name="alice")],
            ops=[Quotas.OpData(key="producer_byte_rate", value=1024.0)],
        )
        assert [e.error_code for e in client.request(Quotas(entries=[entry]), 1).entries] == [0]
    with MetadataLog(tmp_path) as metadata_log:
        written = [r for r in metadata_log.replay().records()]
    batches = dump("--cluster-metadata-decoder", tmp_path / "__cluster_metadata-0" / "00000000000000000000.log")
    assert all(b.valid for b in batches)
    printed = [r.payload for b in batches if not b.control for r in b.records]
    assert printed == [metadata_payload(r.message, r.version) for r in written]
    kinds = [p["type"] for p in printed]
    begin = kinds.index("TOPIC_RECORD")
    assert kinds[begin:] == [
        "TOPIC_RECORD",
        "CONFIG_RECORD",
        "PARTITION_RECORD",
        "ACCESS_CONTROL_ENTRY_RECORD",
        "USER_SCRAM_CREDENTIAL_RECORD",
        "USER_SCRAM_CREDENTIAL_RECORD",
        "REMOVE_USER_SCRAM_CREDENTIAL_RECORD",
        "CLIENT_QUOTA_RECORD",
    ]
    topic_id = printed[begin]["data"]["topicId"]
    assert printed[begin]["data"] == {"name": "audit", "topicId": topic_id}
    assert printed[begin + 1]["data"] == {
        "resourceType": 2,
        "resourceName": "audit",
        "name": "cleanup.policy",
        "value": "compact",
    }
    acl_data = printed[begin + 3]["data"]
    assert {k: v for k, v in acl_data.items() if k != "id"} == {
        "resourceType": 2,
        "resourceName": "audit",
        "patternType": 3,
        "principal": "User:alice",
        "host": "*",
        "operation": 3,
        "permissionType": 3,
    }
    users = [
        (p["data"]["name"], p["data"]["mechanism"], p["data"]["iterations"]) for p in printed[begin + 4 : begin + 6]
    ]
    assert users == [("alice", 1, 4096), ("alice", 2, 8192)]
    assert "saltedPassword" not in printed[begin + 4]["data"] and printed[begin + 4]["data"]["salt"] == "c2FsdA=="
    assert printed[begin + 6]["data"] == {"name": "alice", "mechanism": 1}
    assert printed[begin + 7]["data"] == {
        "entity": [{"entityType": "user", "entityName": "alice"}],
        "key": "producer_byte_rate",
        "value": 1024.0,
        "remove": False,
    }
