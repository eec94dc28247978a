"""Snapshots of the metadata image: written by the controller after enough bytes of the log (Kafka's
metadata.log.max.record.bytes.between.snapshots) or a time bound, loaded at the next start with only the log after
them replayed, older ones and the log they alone covered deleted by Kafka's retention rules, and a damaged one set
aside for the log (or start-up stopped with one line naming it when the log no longer covers it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from kbroker.metadata.controller import Listener, LocalController, MetadataCache
from kbroker.metadata.image import ConfigResourceType, MetadataImage, MetadataImageBuilder
from kbroker.metadata.log import DAMAGED_SUFFIX, MetadataLog, MetadataLogError
from kbroker.metadata.snapshots import SnapshotPolicy, image_records
from kbroker.security.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.messages.alter_configs_request import AlterConfigsRequest
from protocol.messages.create_acls_request import CreateAclsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from tests.metadata.sample_records import sample_records

NODE = 3
LISTENERS = [Listener("PLAINTEXT", "localhost", 9092, 0)]
ACL = AclBinding(
    ResourceType.TOPIC, "orders", PatternType.LITERAL, "User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW
)
EVERY_COMMIT = SnapshotPolicy(max_bytes_between=1)  # any batch is enough bytes


def open_controller(data_dir: Path, policy: SnapshotPolicy, *, segment_bytes: int = 1 << 30) -> LocalController:
    controller = LocalController(NODE, MetadataCache(), MetadataLog(data_dir, segment_bytes=segment_bytes), policy)
    controller.bootstrap()
    controller.register_broker(NODE, LISTENERS, {"metadata.version": (7, 30)})
    return controller


def close(controller: LocalController) -> None:
    assert controller.metadata_log is not None
    controller.metadata_log.close()


def make_changes(controller: LocalController, count: int = 1, first: int = 0) -> None:
    async def changes() -> None:
        for n in range(first, first + count):
            await controller.create_topic(f"orders-{n}", partitions=2, replication_factor=1, configs={})
            await controller.alter_configs(ConfigResourceType.TOPIC, f"orders-{n}", {"retention.ms": str(n + 1)})
        await controller.create_acls([ACL])

    trio.run(changes)


def state(image: MetadataImage) -> MetadataImage:
    """An image without its provenance and broker registrations (a restart registers the broker again)."""
    return image._replace(provenance=image.provenance._replace(offset=0, epoch=0), brokers={})


def snapshot_names(data_dir: Path) -> list[str]:
    return sorted(path.name for path in (data_dir / "__cluster_metadata-0").glob("*.checkpoint"))


def test_image_records_rebuild_the_image() -> None:
    builder = MetadataImageBuilder()
    for item in sample_records():
        builder.replay(item.message)
    published = builder.publish()
    assert published is not None
    image = published[0]
    again = MetadataImageBuilder()
    for item in image_records(image):
        again.replay(item.message)
    rebuilt = again.publish()
    assert rebuilt is not None and rebuilt[0] == image
    names = [type(item.message).__name__ for item in image_records(image)]
    assert names[0] == "FeatureLevelRecord"  # metadata.version first, as Kafka's image writes it


def test_a_restart_loads_the_newest_snapshot_and_replays_only_what_follows(tmp_path: Path) -> None:
    controller = open_controller(tmp_path, EVERY_COMMIT)
    make_changes(controller)
    assert snapshot_names(tmp_path)  # one per commit
    newest = controller.metadata_log.latest_snapshot_id() if controller.metadata_log else None
    assert newest is not None and newest.end_offset == controller.image.provenance.offset + 1
    before = controller.image
    close(controller)

    with MetadataLog(tmp_path) as metadata_log:
        replay = metadata_log.replay()
        assert replay.snapshot is not None and replay.snapshot.id == newest
        assert all(batch.last_offset >= newest.end_offset for batch in replay.batches)
    reopened = open_controller(tmp_path, SnapshotPolicy())
    assert reopened.loaded_snapshot
    assert state(reopened.image) == state(before)
    assert reopened.image.acls == before.acls and reopened.image.topics == before.topics
    close(reopened)


def test_no_snapshot_below_the_byte_bound_then_one_after_the_time_bound(tmp_path: Path) -> None:
    controller = open_controller(tmp_path, SnapshotPolicy(max_bytes_between=1 << 30, max_interval_ms=0))
    make_changes(controller, 3)
    assert snapshot_names(tmp_path) == []
    controller.snapshots = SnapshotPolicy(max_bytes_between=1 << 30, max_interval_ms=60_000)
    make_changes(controller, first=3)
    assert snapshot_names(tmp_path) == []  # within the minute
    controller._last_snapshot_ms -= 60_000  # as if the minute had passed
    make_changes(controller, first=4)  # its first commit finds the time bound passed, the others do not
    assert len(snapshot_names(tmp_path)) == 1
    close(controller)


def test_retention_deletes_older_snapshots_and_the_segments_they_alone_covered(tmp_path: Path) -> None:
    policy = SnapshotPolicy(max_bytes_between=1, retention_bytes=1)  # always over: keep only the newest
    controller = open_controller(tmp_path, policy, segment_bytes=600)
    make_changes(controller, 8)
    before = controller.image
    metadata_log = controller.metadata_log
    assert metadata_log is not None
    newest = metadata_log.latest_snapshot_id()
    assert newest is not None and snapshot_names(tmp_path) == [newest.file_name]
    assert metadata_log.log.log_start_offset == newest.end_offset
    segments = sorted((tmp_path / "__cluster_metadata-0").glob("*.log"))
    assert all(int(path.stem) >= metadata_log.log.segments[0].base_offset for path in segments)
    assert int(segments[0].stem) > 0  # the first segments went
    close(controller)
    reopened = open_controller(tmp_path, SnapshotPolicy())
    assert state(reopened.image) == state(before)
    close(reopened)


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_snapshot_is_set_aside_and_the_log_replayed(tmp_path: Path) -> None:
    controller = open_controller(tmp_path, EVERY_COMMIT)
    make_changes(controller, 2)
    before = controller.image
    close(controller)
    directory = tmp_path / "__cluster_metadata-0"
    newest = snapshot_names(tmp_path)[-1]
    damage(directory / newest)
    reopened = open_controller(tmp_path, SnapshotPolicy())
    assert state(reopened.image) == state(before)
    assert newest not in snapshot_names(tmp_path)
    assert (directory / (newest + DAMAGED_SUFFIX)).exists()  # kept for the operator
    close(reopened)


def test_a_damaged_snapshot_the_log_no_longer_covers_stops_start_up_with_one_line(tmp_path: Path) -> None:
    controller = open_controller(tmp_path, SnapshotPolicy(max_bytes_between=1, retention_bytes=1), segment_bytes=600)
    make_changes(controller, 8)
    close(controller)
    (newest,) = snapshot_names(tmp_path)
    path = tmp_path / "__cluster_metadata-0" / newest
    damage(path)
    with pytest.raises(MetadataLogError) as failure:
        open_controller(tmp_path, SnapshotPolicy())
    message = str(failure.value)
    assert str(path) in message and "\n" not in message
    assert "the metadata log starts at" in message
    assert path.exists()  # nothing set aside or deleted


# --- a broker restarted from a snapshot -----------------------------------------------------------------------

SNAPSHOT_EVERY_COMMIT = {
    "metadata.log.max.record.bytes.between.snapshots": "1",
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
}


def change_through_requests(client: WireClient) -> None:
    """A topic, a config override on it and an ACL, each through its request."""
    topic = CreateTopicsRequest.CreatableTopic(name="snapshotted", num_partitions=3, replication_factor=1)
    assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7).topics[0].error_code == 0
    resource = AlterConfigsRequest.AlterConfigsResource(
        resource_type=int(ConfigResourceType.TOPIC),
        resource_name="snapshotted",
        configs=[AlterConfigsRequest.AlterableConfig(name="retention.ms", value="12345")],
    )
    assert client.request(AlterConfigsRequest(resources=[resource]), 2).responses[0].error_code == 0
    creation = CreateAclsRequest.AclCreation(
        resource_type=int(ResourceType.TOPIC),
        resource_name="snapshotted",
        resource_pattern_type=int(PatternType.LITERAL),
        principal="User:alice",
        host="*",
        operation=int(AclOperation.READ),
        permission_type=int(AclPermissionType.ALLOW),
    )
    assert client.request(CreateAclsRequest(creations=[creation]), 3).results[0].error_code == 0


def test_a_broker_restarted_from_a_snapshot_has_the_same_image(tmp_path: Path) -> None:
    with RunningBroker(tmp_path, SNAPSHOT_EVERY_COMMIT) as running, WireClient(running.bootstrap) as client:
        change_through_requests(client)
        assert running.broker is not None
        before = running.broker.metadata.image
    assert snapshot_names(tmp_path)
    with MetadataLog(tmp_path) as metadata_log:
        newest = metadata_log.latest_snapshot_id()
        assert newest is not None and newest.end_offset == before.provenance.offset + 1
    with RunningBroker(tmp_path) as running:
        assert running.broker is not None
        assert running.broker.controller.loaded_snapshot
        after = running.broker.metadata.image
    assert after.topics == before.topics and after.configs == before.configs and after.acls == before.acls
    assert state(after) == state(before)
