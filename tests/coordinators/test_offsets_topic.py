"""Committed offsets in __consumer_offsets (kbroker/groups/offsets.py over kbroker/coordinators/runtime.py): the
records are Kafka's, byte for byte as Kafka's own dump tool reads them, and the offsets are their replay."""

from __future__ import annotations

import logging
import subprocess
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat.apache_kafka import KAFKA_VERSION
from kbroker.coordinators.runtime import NO_PRODUCER
from kbroker.groups import offsets as offsets_module
from kbroker.groups.offsets import OFFSETS_TOPIC, CommittedOffset, OffsetStore
from kbroker.java_hashing import coordinator_partition
from kbroker.storage import LogManager, PartitionLog, TopicInfo
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.coordinator_frame import decode_coordinator_record, encode_coordinator_record
from protocol.coordinator_records import (
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
)
from protocol.coordinator_records.offset_commit_key import OffsetCommitKey
from protocol.coordinator_records.offset_commit_value import OffsetCommitValue
from protocol.messages.describe_log_dirs_request import DescribeLogDirsRequest
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.list_config_resources_request import ListConfigResourcesRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.records import decode_records, iter_batches
from tests.coordinators.older_kbroker import masked_partition

T0 = 1_700_000_000_000
PARTITIONS = 5


def batches(plog: PartitionLog) -> list[tuple[int, bool, bool, list[tuple[bytes | None, bytes | None]]]]:
    """(producer id, transactional, control, [(key, value)]) of each batch of the partition."""
    chunk = plog.read(plog.log_start_offset, 1 << 24, max_offset=plog.log_end_offset)
    return [
        (h.producer_id, h.is_transactional, h.is_control, [(r.key, r.value) for r in decode_records(b)])
        for h, b in iter_batches(chunk.read_bytes())
    ]


def group_log(store: OffsetStore, group: str) -> PartitionLog:
    plog = store.logs.get_partition(OFFSETS_TOPIC, coordinator_partition(group, PARTITIONS))
    assert plog is not None
    return plog


def test_a_commit_is_one_batch_of_kafkas_offset_commit_records_in_the_groups_partition(tmp_path: Path) -> None:
    store = OffsetStore.in_data_dir(tmp_path, partitions=PARTITIONS)
    assert store.logs.topic(OFFSETS_TOPIC) is None  # created when first needed
    store.commit("g", {("orders", 0): CommittedOffset(42, 3, "m", T0), ("orders", 1): CommittedOffset(7, -1, None, T0)})
    info = store.logs.topic(OFFSETS_TOPIC)
    assert info is not None and info.partitions == PARTITIONS
    assert store.logs.effective_configs(info)["cleanup.policy"] == "compact"
    [(producer, transactional, control, records)] = batches(group_log(store, "g"))
    assert (producer, transactional, control) == (NO_PRODUCER, False, False)
    decoded = [decode_coordinator_record("group", k, v) for k, v in records]
    assert [(r.record_type, r.value_version) for r in decoded] == [(1, 3), (1, 3)]
    key, value = decoded[0].key, decoded[0].value
    assert isinstance(key, OffsetCommitKey) and isinstance(value, OffsetCommitValue)
    assert (key.group, key.topic, key.partition) == ("g", "orders", 0)
    assert (value.offset, value.leader_epoch, value.metadata, value.commit_timestamp) == (42, 3, "m", T0)
    # Every other partition is empty: a group's records go to abs(hashCode) % partitions only.
    others = [p for p in range(PARTITIONS) if p != coordinator_partition("g", PARTITIONS)]
    assert all(store.logs.get_partition(OFFSETS_TOPIC, p).log_end_offset == 0 for p in others)  # type: ignore[union-attr]
    store.close()


def test_offsets_are_the_replay_of_the_topic_after_a_restart(tmp_path: Path) -> None:
    store = OffsetStore.in_data_dir(tmp_path, partitions=PARTITIONS)
    store.commit("g", {("a", 0): CommittedOffset(1, 2, "x", T0), ("a", 1): CommittedOffset(5, -1, None, T0, T0 + 9)})
    store.commit("g", {("a", 0): CommittedOffset(10, 4, "y", T0 + 1)})
    store.commit("h", {("a", 0): CommittedOffset(3, -1, None, T0)})
    store.delete("h", [("a", 0)])
    store.close()
    again = OffsetStore.in_data_dir(tmp_path, partitions=PARTITIONS)
    assert again.get("g") == {
        ("a", 0): CommittedOffset(10, 4, "y", T0 + 1),
        ("a", 1): CommittedOffset(5, -1, "", T0, T0 + 9),  # v1 (with an expiry) has no leader epoch, as Kafka's
    }
    assert again.get("h") == {} and sorted(again.groups()) == ["g"]
    [*_, (_, _, _, [(key, value)])] = batches(group_log(again, "h"))
    assert value is None and decode_coordinator_record("group", key, None).key == OffsetCommitKey(
        group="h", topic="a", partition=0
    )
    again.close()


@pytest.mark.parametrize("commit", [True, False])
def test_transactional_offsets_are_pending_until_the_marker_and_survive_a_restart(tmp_path: Path, commit: bool) -> None:
    store = OffsetStore.in_data_dir(tmp_path, partitions=PARTITIONS)
    store.commit("g", {("a", 0): CommittedOffset(1, -1, None, T0)})
    store.commit_pending("g", 77, {("a", 0): CommittedOffset(9, -1, None, T0)}, producer_epoch=2)
    assert store.get("g")[("a", 0)].offset == 1 and store.has_pending("g", "a", 0)
    store.close()
    store = OffsetStore.in_data_dir(tmp_path, partitions=PARTITIONS)
    assert store.get("g")[("a", 0)].offset == 1 and store.has_pending("g", "a", 0)  # still pending after a restart
    store.complete_transaction("g", 77, commit)
    store.complete_transaction("g", 77, commit)  # again (a coordinator retrying): nothing more is written
    flags = [(p, t, c) for p, t, c, _ in batches(group_log(store, "g"))]
    assert flags == [(NO_PRODUCER, False, False), (77, True, False), (77, True, True)]
    store.close()
    store = OffsetStore.in_data_dir(tmp_path, partitions=PARTITIONS)
    assert store.get("g")[("a", 0)].offset == (9 if commit else 1) and not store.has_pending("g", "a", 0)
    store.close()


def test_kafkas_dump_tool_decodes_the_segment(tmp_path: Path) -> None:
    from tools import maven_artifacts

    classpath = maven_artifacts.classpath(f"kafka-tools-{KAFKA_VERSION}")
    store = OffsetStore.in_data_dir(tmp_path, partitions=PARTITIONS)
    store.commit("dumped", {("orders", 3): CommittedOffset(42, 7, "meta", T0)})
    store.delete("dumped", [("orders", 3)])
    store.close()
    segment = tmp_path / f"{OFFSETS_TOPIC}-{coordinator_partition('dumped', PARTITIONS)}" / "00000000000000000000.log"
    command = ["java", "-cp", classpath, "org.apache.kafka.tools.DumpLogSegments", "--offsets-decoder"]
    out = subprocess.run([*command, "--files", str(segment)], capture_output=True, text=True, timeout=120, check=True)
    key = 'key: {"type":"1","data":{"group":"dumped","topic":"orders","partition":3}}'
    value = (
        f'payload: {{"version":"3","data":{{"offset":42,"leaderEpoch":7,"metadata":"meta","commitTimestamp":{T0}}}}}'
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("| offset:")]
    assert len(lines) == 2
    assert key in lines[0] and value in lines[0]
    assert key in lines[1] and "payload: <DELETE>" in lines[1]


def test_offsets_committed_with_a_client_survive_a_broker_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with RunningBroker(data) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("orders", 2, 1)])["orders"].result(timeout=30)
        consumer = Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": "survivor", "enable.auto.commit": False}
        )
        consumer.commit(offsets=[TopicPartition("orders", 0, 11), TopicPartition("orders", 1, 22)], asynchronous=False)
        consumer.close()
    with RunningBroker(data) as broker:
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "survivor"})
        found = consumer.committed([TopicPartition("orders", 0), TopicPartition("orders", 1)], timeout=30)
        consumer.close()
        assert [(tp.partition, tp.offset) for tp in found] == [(0, 11), (1, 22)]
        with WireClient(broker.bootstrap) as client:
            topics = client.request(MetadataRequest(topics=None), 12).topics
            internal = {t.name: (t.is_internal, len(t.partitions)) for t in topics}
            assert internal == {"orders": (False, 2), OFFSETS_TOPIC: (True, 50)}
            dirs = client.request(DescribeLogDirsRequest(topics=None), 4).results
            in_dirs = {t.name: len(t.partitions) for d in dirs for t in d.topics}
            assert in_dirs == {"orders": 2, OFFSETS_TOPIC: 50}
            resources = client.request(ListConfigResourcesRequest(resource_types=[2]), 1).config_resources
            assert sorted(r.resource_name for r in resources) == [OFFSETS_TOPIC, "orders"]
    # The group's records are in its partition of the data directory, Kafka's partition for it.
    partition = data / f"{OFFSETS_TOPIC}-{coordinator_partition('survivor', 50)}"
    assert (partition / "00000000000000000000.log").stat().st_size > 0


def test_the_first_find_coordinator_creates_the_topic_with_the_configured_partitions(tmp_path: Path) -> None:
    overrides = {"offsets.topic.num.partitions": "3", "offsets.topic.segment.bytes": "1048576"}
    with RunningBroker(tmp_path / "data", overrides) as broker, WireClient(broker.bootstrap) as client:
        assert client.request(MetadataRequest(topics=None), 12).topics == []
        answer = client.request(FindCoordinatorRequest(key_type=0, coordinator_keys=["g"]), 4)
        assert [(c.error_code, c.node_id) for c in answer.coordinators] == [(0, broker.broker.node_id)]  # type: ignore[union-attr]
        [topic] = client.request(MetadataRequest(topics=None), 12).topics
        assert (topic.name, topic.is_internal, len(topic.partitions)) == (OFFSETS_TOPIC, True, 3)
        info = broker.broker.logs.topic(OFFSETS_TOPIC)  # type: ignore[union-attr]
        assert info is not None
        configs = broker.broker.logs.effective_configs(info)  # type: ignore[union-attr]
        assert (configs["cleanup.policy"], configs["segment.bytes"]) == ("compact", "1048576")


def test_deleting_the_topic_forgets_the_offsets_and_the_next_commit_creates_it_again(tmp_path: Path) -> None:
    """Kafka deletes __consumer_offsets when asked (DeleteTopics answers NONE): the groups' offsets go."""
    from protocol.messages.delete_topics_request import DeleteTopicsRequest
    from protocol.messages.offset_commit_request import OffsetCommitRequest
    from protocol.messages.offset_fetch_request import OffsetFetchRequest

    def commit(client: WireClient, offset: int) -> int:
        part = OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset)
        topic = OffsetCommitRequest.OffsetCommitRequestTopic(name="orders", partitions=[part])
        request = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1, member_id="", topics=[topic])
        return int(client.request(request, 8).topics[0].partitions[0].error_code)

    def fetched(client: WireClient) -> int:
        wanted = OffsetFetchRequest.OffsetFetchRequestTopic(name="orders", partition_indexes=[0])
        return int(
            client.request(OffsetFetchRequest(group_id="g", topics=[wanted]), 7)
            .topics[0]
            .partitions[0]
            .committed_offset
        )

    with RunningBroker(tmp_path / "data") as broker, WireClient(broker.bootstrap) as client:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("orders", 1, 1)])["orders"].result(timeout=30)
        assert (commit(client, 5), fetched(client)) == (0, 5)
        delete = DeleteTopicsRequest(
            topics=[DeleteTopicsRequest.DeleteTopicState(name=OFFSETS_TOPIC)], timeout_ms=10_000
        )
        assert client.request(delete, 6).responses[0].error_code == 0
        assert fetched(client) == -1
        assert (commit(client, 6), fetched(client)) == (0, 6)  # __consumer_offsets is there again
        assert broker.broker is not None and broker.broker.logs.topic(OFFSETS_TOPIC) is not None


def test_an_operators_marker_for_a_consumer_offsets_partition_applies_the_pending_offsets(tmp_path: Path) -> None:
    """WriteTxnMarkers (kafka-transactions.sh abort, Admin abortTransaction) to __consumer_offsets goes through the
    group coordinator's shard, as Kafka's onTransactionCompleted: the transaction's offsets apply (or go)."""
    from protocol.messages.offset_fetch_request import OffsetFetchRequest
    from protocol.messages.write_txn_markers_request import WriteTxnMarkersRequest

    with RunningBroker(tmp_path / "data", {"offsets.topic.num.partitions": str(PARTITIONS)}) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("orders", 1, 1)])["orders"].result(timeout=30)
        assert broker.broker is not None
        store = broker.broker.offsets
        pending = {("orders", 0): CommittedOffset(12, -1, None, T0)}
        broker.call(lambda: store.commit_pending("g", 88, pending, producer_epoch=3))  # on the broker's event loop
        topic = WriteTxnMarkersRequest.WritableTxnMarkerTopic(
            name=OFFSETS_TOPIC, partition_indexes=[coordinator_partition("g", PARTITIONS)]
        )
        marker = WriteTxnMarkersRequest.WritableTxnMarker(
            producer_id=88, producer_epoch=3, transaction_result=True, topics=[topic], coordinator_epoch=0
        )
        wanted = OffsetFetchRequest.OffsetFetchRequestTopic(name="orders", partition_indexes=[0])
        with WireClient(broker.bootstrap) as client:
            answer = client.request(WriteTxnMarkersRequest(markers=[marker]), 1)
            assert [p.error_code for p in answer.markers[0].topics[0].partitions] == [0]
            fetched = client.request(OffsetFetchRequest(group_id="g", topics=[wanted]), 7)
            assert fetched.topics[0].partitions[0].committed_offset == 12
        assert not store.has_pending("g", "orders", 0)


def test_auto_creation_makes_the_internal_topics_as_their_coordinators_would(tmp_path: Path) -> None:
    overrides = {"offsets.topic.num.partitions": "3", "transaction.state.log.num.partitions": "2"}
    with RunningBroker(tmp_path / "data", overrides) as broker, WireClient(broker.bootstrap) as client:
        names = [OFFSETS_TOPIC, "__transaction_state"]
        wanted = [MetadataRequest.MetadataRequestTopic(name=name) for name in names]
        client.request(MetadataRequest(topics=wanted, allow_auto_topic_creation=True), 12)
        topics = {
            t.name: (t.is_internal, len(t.partitions)) for t in client.request(MetadataRequest(topics=None), 12).topics
        }
        assert topics == {OFFSETS_TOPIC: (True, 3), "__transaction_state": (True, 2)}
        assert broker.broker is not None
        for name in names:
            info = broker.broker.logs.topic(name)
            assert info is not None and broker.broker.logs.effective_configs(info)["cleanup.policy"] == "compact"
        answer = client.request(FindCoordinatorRequest(key_type=0, coordinator_keys=["g"]), 4)
        assert [c.error_code for c in answer.coordinators] == [0]  # its shards load on the topic made by Metadata


def test_shards_whose_files_were_still_being_made_are_loaded_on_the_next_use(tmp_path: Path) -> None:
    """The topic is in the image before its files exist (the controller commits, then a worker thread makes 50
    partitions): a FindCoordinator meanwhile must not leave those shards unloaded for good."""
    logs = LogManager(tmp_path, {}, catalog=[])
    info = TopicInfo(OFFSETS_TOPIC, uuid.uuid4(), 3, {"cleanup.policy": "compact"})
    new = logs.register_topic(info)  # as the image's publisher does: the partitions are being built
    store = OffsetStore(logs, partitions=3)
    group = "early"
    assert store.runtime.shards == {}  # nothing loadable yet
    logs.finish_building(info, new, logs.build_partitions(info, new.start, new.stop))
    store.ensure_topic()  # the next FindCoordinator
    assert sorted(store.runtime.shards) == [0, 1, 2]
    store.commit(group, {("orders", 0): CommittedOffset(5, -1, None, 0)})
    assert store.get(group)[("orders", 0)].offset == 5
    store.close()
    logs.close()


def test_groups_an_older_kbroker_kept_in_another_partition_move_to_kafkas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    group = "group-100"  # Java hash -1484205661
    old, own = masked_partition(group, PARTITIONS), coordinator_partition(group, PARTITIONS)
    assert (old, own) == (2, 1)
    member = ConsumerGroupMemberMetadataKey(group_id=group, member_id="m1")
    with monkeypatch.context() as older_kbroker:
        older_kbroker.setattr(offsets_module, "coordinator_partition", masked_partition)
        store = OffsetStore.in_data_dir(tmp_path, partitions=PARTITIONS)
        store.commit(group, {("a", 0): CommittedOffset(7, 1, "m", T0), ("a", 1): CommittedOffset(9, -1, None, T0)})
        store.commit("g", {("a", 0): CommittedOffset(3, -1, None, T0)})  # a positive hash: placed alike
        store.write_consumer_group(
            group,
            [
                encode_coordinator_record(
                    ConsumerGroupMetadataKey(group_id=group), ConsumerGroupMetadataValue(epoch=4), 0
                ),
                encode_coordinator_record(member, ConsumerGroupMemberMetadataValue(client_id="c"), 0),
            ],
        )
        store.close()
    assert group_log_at(tmp_path, old)  # the older kbroker's records are in the other partition

    with caplog.at_level(logging.INFO, logger="kbroker.groups"):
        moved = OffsetStore.in_data_dir(tmp_path, partitions=PARTITIONS)
        moved.ensure_topic()
    assert f"moved 1 group(s) an older kbroker kept in another partition to Kafka's: {group}" in caplog.text
    expected = {("a", 0): CommittedOffset(7, 1, "m", T0), ("a", 1): CommittedOffset(9, -1, "", T0)}
    assert moved.get(group) == expected and moved.committed_offsets(group) == expected
    assert moved.get("g") == {("a", 0): CommittedOffset(3, -1, "", T0)}
    stored = moved.stored_consumer_group(group)
    assert stored is not None and (stored.epoch, sorted(stored.members)) == (4, ["m1"])
    # The old partition's last batch tombstones every moved key; its own partition holds them.
    old_log = moved.logs.get_partition(OFFSETS_TOPIC, old)
    assert old_log is not None
    [*_, (_, _, _, tombstones)] = batches(old_log)
    assert len(tombstones) == 4 and all(value is None for _, value in tombstones)
    moved.close()

    # A restart replays both partitions and moves nothing again.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kbroker.groups"):
        again = OffsetStore.in_data_dir(tmp_path, partitions=PARTITIONS)
        again.ensure_topic()
    assert "moved" not in caplog.text
    assert again.get(group) == expected and sorted(again.groups()) == ["g", group]
    again.close()


def group_log_at(
    data_dir: Path, partition: int
) -> list[tuple[int, bool, bool, list[tuple[bytes | None, bytes | None]]]]:
    logs = LogManager(data_dir, {})
    try:
        plog = logs.get_partition(OFFSETS_TOPIC, partition)
        assert plog is not None
        return batches(plog)
    finally:
        logs.close()
