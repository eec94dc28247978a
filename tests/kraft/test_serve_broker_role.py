"""``kbroker serve`` with Kafka's broker settings (process.roles=broker, node.id, controller.quorum.bootstrap.servers,
controller.listener.names) runs as a broker under a real controller-only Apache Kafka 4.4: it registers and is
unfenced, admin requests on its listener reach the controller and answer with its codes and messages, the topics
it creates are led by it, records round-trip through it, and SIGTERM is a controlled shutdown the controller sees.

The controller's view is read as any observer of its quorum reads it: a metadata follower of this test's own."""

from __future__ import annotations

import base64
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from compat.apache_kafka import KafkaController, KafkaUnavailable
from kbroker.config import BrokerConfig, ConfigError
from kbroker.config_registry import REGISTRY
from kbroker.kraft.metadata_follower import MetadataFollower
from kbroker.kraft.quorum import QuorumView, parse_voters
from kbroker.metadata.controller import MetadataCache
from kbroker.metadata.image import AclEntry, ConfigResourceType, MetadataImage
from kbroker.metadata.image import ScramMechanism as ImageScramMechanism
from kbroker.testing import BrokerProcess
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.alter_client_quotas_request import AlterClientQuotasRequest
from protocol.messages.alter_configs_request import AlterConfigsRequest
from protocol.messages.create_partitions_request import CreatePartitionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.delete_topics_request import DeleteTopicsRequest
from protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.metadata_response import MetadataResponse
from tests.kraft.conftest import KBROKER_LEVELS, broker_role_settings

NODE = 7
WITHIN = 120  # seconds: a bound against hanging, never a measure (2 busy cores)


def format_data_dir(data_dir: Path, cluster_id: str, node_id: int) -> None:
    """What ``kafka-storage format -t CLUSTER_ID -c broker.properties`` writes in a broker's log directory."""
    data_dir.mkdir(parents=True)
    directory_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    (data_dir / "meta.properties").write_text(
        f"#\n#Written by kafka-storage format\nnode.id={node_id}\ndirectory.id={directory_id}\nversion=1\n"
        f"cluster.id={cluster_id}\n"
    )


def broker_settings(controller: KafkaController) -> dict[str, str]:
    return broker_role_settings(controller, NODE)  # one broker: internal topics of one replica, as Kafka's


def controller_image(controller: KafkaController, until: Callable[[MetadataImage], bool]) -> MetadataImage:
    """The quorum's committed metadata as an observer follows it, once ``until`` holds for it."""
    cache = MetadataCache()
    quorum = QuorumView(list(parse_voters(controller.voters).values()), client_id="kbroker-test-observer")
    follower = MetadataFollower(quorum, cache, node_id=9999, cluster_id=controller.cluster_id, max_wait_ms=100)

    async def main() -> None:
        with trio.fail_after(WITHIN):
            async with trio.open_nursery() as nursery:
                await nursery.start(follower.run)
                while not (follower.caught_up.is_set() and until(cache.image)):
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
        await quorum.aclose()

    trio.run(main)
    return cache.image


def test_kbroker_serve_as_a_broker_of_a_kafka_controller_quorum(controller: KafkaController, tmp_path: Path) -> None:
    data_dir = tmp_path / "broker"
    format_data_dir(data_dir, controller.cluster_id, NODE)
    # Its copy of the metadata log snapshotted at every batch and trimmed to the newest snapshot (Kafka's keys).
    snapshotting = {"metadata.log.max.record.bytes.between.snapshots": "1", "metadata.max.retention.bytes": "1"}
    broker = BrokerProcess(data_dir, broker_settings(controller) | snapshotting, log_level="INFO").start(timeout=WITHIN)
    try:
        # Registered with its listener and unfenced, in the controller's own metadata.
        image = controller_image(controller, lambda i: NODE in i.brokers and not i.brokers[NODE].fenced)
        endpoint = image.brokers[NODE].endpoints["PLAINTEXT"]
        assert (endpoint.host, endpoint.port) == ("127.0.0.1", broker.port)

        # A topic created through kbroker's listener is the controller's, led by this broker.
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        futures = admin.create_topics([NewTopic("orders", num_partitions=2, replication_factor=1)])
        futures["orders"].result(timeout=WITHIN)
        image = controller_image(controller, lambda i: i.topics.get("orders") is not None)
        topic = image.topics.by_name["orders"]
        assert {index: (p.leader, p.replicas, p.leader_epoch) for index, p in topic.partitions.items()} == {
            0: (NODE, (NODE,), 0),
            1: (NODE, (NODE,), 0),
        }
        with WireClient(broker.bootstrap) as client:
            metadata = client.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="orders")]), 12)
        assert [(b.node_id, b.port) for b in metadata.brokers] == [(NODE, broker.port)]
        assert metadata.cluster_id == controller.cluster_id
        [described] = metadata.topics
        assert (described.error_code, described.topic_id) == (0, topic.topic_id)
        assert sorted((p.partition_index, p.leader_id, p.leader_epoch, p.error_code) for p in described.partitions) == [
            (0, NODE, 0, 0),
            (1, NODE, 0, 0),
        ]

        # The same name again: the controller's refusal, code and message, reaches the client.
        again = CreateTopicsRequest.CreatableTopic(name="orders", num_partitions=1, replication_factor=1)
        with WireClient(broker.bootstrap) as client:
            answer = client.request(CreateTopicsRequest(topics=[again], timeout_ms=30000), 7)
        [result] = answer.topics
        assert (result.error_code, result.error_message) == (
            ErrorCode.TOPIC_ALREADY_EXISTS,
            "Topic 'orders' already exists.",
        )

        # Produce, then consume: exact records at their offsets.
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "enable.idempotence": True})
        delivered: list[tuple[int | None, int | None]] = []
        for index in range(5):
            producer.produce(
                "orders",
                key=f"k{index}".encode(),
                value=f"v{index}".encode(),
                partition=index % 2,
                on_delivery=lambda err, msg: delivered.append((msg.partition(), msg.offset())) if err is None else None,
            )
        assert producer.flush(WITHIN) == 0
        assert sorted(delivered) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
        assert consume_all(broker.bootstrap, 5) == [
            (0, 0, b"k0", b"v0"),
            (0, 1, b"k2", b"v2"),
            (0, 2, b"k4", b"v4"),
            (1, 0, b"k1", b"v1"),
            (1, 1, b"k3", b"v3"),
        ]
    finally:
        broker.stop(timeout=WITHIN)

    # SIGTERM was a controlled shutdown: the controller moved leadership off the broker (no other replica, so
    # each partition is leaderless with this broker as its eligible leader replica) and fenced it.

    def left_under_control(image: MetadataImage) -> bool:
        partitions = image.topics.by_name["orders"].partitions.values()
        return all(p.leader == -1 for p in partitions) and image.brokers[NODE].fenced

    image = controller_image(controller, left_under_control)
    for registration in image.topics.by_name["orders"].partitions.values():
        assert (registration.leader, registration.isr, registration.eligible_leader_replicas) == (-1, (), (NODE,))
        assert registration.leader_epoch == 1
    assert "controlled shutdown allowed by the controller quorum" in broker.log_path.read_text()

    # A restart reads back the metadata it kept in its own __cluster_metadata-0 (its newest snapshot, the older
    # ones and the log before it deleted) and fetches on from its end; its partitions' logs are the image's
    # (nothing set aside), the controller elects it again from the ELR, and the records are all there.
    snapshots = sorted((data_dir / "__cluster_metadata-0").glob("*.checkpoint"))
    assert len(snapshots) == 1, snapshots
    assert int(snapshots[0].name.split("-")[0]) > 0
    assert "wrote snapshot" in broker.log_path.read_text()
    broker.start(timeout=WITHIN)
    try:
        image = controller_image(
            controller, lambda i: all(p.leader == NODE for p in i.topics.by_name["orders"].partitions.values())
        )
        assert [p.leader_epoch for p in image.topics.by_name["orders"].partitions.values()] == [2, 2]
        resumed = [line for line in broker.log_path.read_text().splitlines() if "resuming __cluster_metadata-0" in line]
        assert len(resumed) == 1 and int(resumed[0].split(" at offset ")[1].split(",")[0]) > 0
        assert consume_all(broker.bootstrap, 5) == [
            (0, 0, b"k0", b"v0"),
            (0, 1, b"k2", b"v2"),
            (0, 2, b"k4", b"v4"),
            (1, 0, b"k1", b"v1"),
            (1, 1, b"k3", b"v3"),
        ]
        assert not list(data_dir.glob("*quarantine*")) and not list(data_dir.glob("orders-*.*"))
    finally:
        broker.stop(timeout=WITHIN)


def consume_all(bootstrap: str, count: int) -> list[tuple[int | None, int | None, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of the first ``count`` records of orders' two partitions, sorted."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition("orders", 0, 0), TopicPartition("orders", 1, 0)])
    read: list[tuple[int | None, int | None, bytes | None, bytes | None]] = []
    for _ in range(200):
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read.append((message.partition(), message.offset(), message.key(), message.value()))
        if len(read) == count:
            break
    consumer.close()
    return sorted(read, key=lambda item: (item[0] or 0, item[1] or 0))


def test_broker_role_settings_are_checked_in_one_line() -> None:
    with pytest.raises(ConfigError) as missing:
        BrokerConfig({"process.roles": "broker", "node.id": "1"})
    assert str(missing.value) == (
        "process.roles=broker needs controller.quorum.bootstrap.servers (host:port,...) or controller.quorum.voters "
        "(id@host:port,...) naming the KRaft controllers"
    )
    with pytest.raises(ConfigError) as unnamed:
        BrokerConfig({"process.roles": "broker", "controller.quorum.bootstrap.servers": "localhost:9093"})
    assert str(unnamed.value) == (
        "process.roles=broker needs node.id and controller.listener.names (as Kafka's broker does)"
    )
    with pytest.raises(ConfigError) as refused:
        BrokerConfig({"process.roles": "controller", "controller.quorum.voters": "1@localhost:9093"})
    assert str(refused.value) == (
        "process.roles=controller is not supported: kbroker implements the KRaft broker role only; run Apache "
        "Kafka's controller (process.roles=controller) and start kbroker with process.roles=broker and "
        "controller.quorum.bootstrap.servers naming it"
    )
    # Kafka's stock server.properties (a combined node) still starts a single node, its own controller, warned.
    combined = BrokerConfig({"process.roles": "broker,controller", "controller.quorum.voters": "1@localhost:9093"})
    assert combined["process.roles"] == "broker,controller"
    quorum = {"process.roles": "broker", "node.id": "1", "controller.listener.names": "CONTROLLER"}
    with pytest.raises(ConfigError) as bad:
        BrokerConfig({**quorum, "controller.quorum.voters": "localhost:9093"})
    assert str(bad.value) == "controller.quorum.voters: 'localhost:9093' is not id@host:port"
    # A secured controller listener is taken (its stores are read as the broker starts: tests/kraft/
    # test_node_security.py).
    secured = BrokerConfig(
        {
            **quorum,
            "controller.quorum.bootstrap.servers": "localhost:9093",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL",
        }
    )
    assert secured.listener_settings["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:SSL"
    configured = BrokerConfig({**quorum, "controller.quorum.bootstrap.servers": "localhost:9093"})
    assert configured["process.roles"] == "broker"


def test_an_unformatted_data_directory_is_refused_in_one_line(controller: KafkaController, tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "unformatted", broker_settings(controller))
    with pytest.raises(RuntimeError) as failed:
        broker.start(timeout=WITHIN)
    assert "meta.properties is missing: a broker under a KRaft controller quorum needs" in str(failed.value)
    assert "(kbroker format -t CLUSTER_ID -c broker.properties, or Kafka's kafka-storage format)" in str(failed.value)
    assert "Traceback" not in str(failed.value)


def test_a_broker_no_controller_registers_stops_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as unused:  # a port nothing listens on: no controller there
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    data_dir = tmp_path / "broker"
    format_data_dir(data_dir, "4js_AsWOQCGxVNNYUSFQNg", NODE)
    settings = {
        "process.roles": "broker",
        "node.id": str(NODE),
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "initial.broker.registration.timeout.ms": "1500",
    }
    with pytest.raises(RuntimeError) as failed:
        BrokerProcess(data_dir, settings).start(timeout=WITHIN)
    output = str(failed.value)
    assert "exited with 1" in output
    assert (
        f"kbroker: no KRaft controller at 127.0.0.1:{port} registered broker {NODE} within 1.5 s "
        "(initial.broker.registration.timeout.ms; is the controller quorum running, and are these its controller "
        "listeners?)"
    ) in output
    assert "Traceback" not in output


def test_admin_requests_on_kbrokers_listener_are_the_controllers(controller: KafkaController, tmp_path: Path) -> None:
    node = NODE + 1
    data_dir = tmp_path / "broker"
    format_data_dir(data_dir, controller.cluster_id, node)
    broker = BrokerProcess(data_dir, {**broker_settings(controller), "node.id": str(node)}).start(timeout=WITHIN)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("grown", num_partitions=1, replication_factor=1)])["grown"].result(WITHIN)

        # CreatePartitions: the controller places the new partitions; kbroker's Metadata shows them at once.
        admin.create_partitions([NewPartitions("grown", 3)])["grown"].result(WITHIN)
        image = controller_image(controller, lambda i: len(i.topics.by_name["grown"].partitions) == 3)
        assert {p.leader for p in image.topics.by_name["grown"].partitions.values()} == {node}
        assert sorted(p.partition_index for p in topic_metadata(broker, "grown").partitions) == [0, 1, 2]
        # Refusals are the controller's: kbroker answers what the controller itself answers the same request.
        shrink = CreatePartitionsRequest(
            topics=[CreatePartitionsRequest.CreatePartitionsTopic(name="grown", count=2, assignments=None)],
            timeout_ms=30000,
        )
        too_many = CreateTopicsRequest(
            topics=[CreateTopicsRequest.CreatableTopic(name="wide", num_partitions=1, replication_factor=3)],
            timeout_ms=30000,
            validate_only=True,
        )
        topic = CreateTopicsRequest.CreatableTopic
        config = CreateTopicsRequest.CreatableTopicConfig
        refused_topics = CreateTopicsRequest(
            topics=[
                topic(name="bad name", num_partitions=1, replication_factor=1),
                topic(name="no-partitions", num_partitions=0, replication_factor=1),
                topic(
                    name="bad-policy",
                    num_partitions=1,
                    replication_factor=1,
                    configs=[config(name="cleanup.policy", value="nope")],
                ),
            ],
            timeout_ms=30000,
            validate_only=True,
        )
        alter = IncrementalAlterConfigsRequest
        refused_configs = [  # one resource a request (Kafka answers a repeated resource as a whole)
            alter(
                resources=[
                    alter.AlterConfigsResource(
                        resource_type=2,
                        resource_name=name,
                        configs=[alter.AlterableConfig(name=key, config_operation=operation, value=value)],
                    )
                ]
            )
            for name, key, operation, value in (
                ("grown", "retention.ms", 0, "abc"),  # SET a value that is no number
                ("grown", "no.such.key", 0, "1"),
                ("nope", "retention.ms", 0, "1"),  # no such topic
                ("grown", "retention.ms", 2, "2"),  # APPEND to a config that is no list
            )
        ]
        legacy = AlterConfigsRequest
        replaced = [
            legacy(
                resources=[
                    legacy.AlterConfigsResource(
                        resource_type=2,
                        resource_name=name,
                        configs=[legacy.AlterableConfig(name="retention.ms", value=value)],
                    )
                ]
            )
            for name, value in (("grown", "abc"), ("nope", "1"))
        ]
        unknown_id = DeleteTopicsRequest(
            topics=[DeleteTopicsRequest.DeleteTopicState(topic_id=uuid.uuid4())], timeout_ms=30000
        )
        answers = {}
        for name, address in (("kbroker", broker.bootstrap), ("controller", controller.bootstrap)):
            with WireClient(address) as client:
                [shrunk] = client.request(shrink, 3).results
                [wide] = client.request(too_many, 7).topics
                created = client.request(refused_topics, 7).topics
                altered = [client.request(request, 1).responses[0] for request in refused_configs]
                altered += [client.request(request, 2).responses[0] for request in replaced]
                [deleted] = client.request(unknown_id, 6).responses
            answers[name] = [
                (shrunk.error_code, shrunk.error_message),
                (wide.error_code, wide.error_message),
                *((t.error_code, t.error_message) for t in created),
                *((r.error_code, r.error_message) for r in altered),
                (deleted.error_code, deleted.error_message),
            ]
        assert answers["kbroker"] == answers["controller"]
        assert [code for code, _ in answers["kbroker"]] == [
            ErrorCode.INVALID_PARTITIONS,
            ErrorCode.INVALID_REPLICATION_FACTOR,
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            ErrorCode.INVALID_PARTITIONS,
            ErrorCode.INVALID_CONFIG,
            ErrorCode.INVALID_CONFIG,
            ErrorCode.INVALID_CONFIG,
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.INVALID_CONFIG,
            ErrorCode.INVALID_CONFIG,
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.UNKNOWN_TOPIC_ID,
        ]
        # What kbroker does not have is refused by kbroker (Kafka's controller would accept it), and not applied.
        tiered = alter(
            resources=[
                alter.AlterConfigsResource(
                    resource_type=2,
                    resource_name="grown",
                    configs=[alter.AlterableConfig(name="remote.storage.enable", config_operation=0, value="true")],
                )
            ]
        )
        with WireClient(broker.bootstrap) as client:
            [answer] = client.request(tiered, 1).responses
        reason = REGISTRY["remote.storage.enable"].reason
        assert (answer.error_code, answer.error_message) == (
            ErrorCode.INVALID_CONFIG,
            f"Invalid value true for configuration remote.storage.enable: {reason}",
        )

        # IncrementalAlterConfigs: the controller's config record, seen by kbroker's DescribeConfigs.
        change = ConfigEntry("retention.ms", "123456", incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource(ConfigResource.Type.TOPIC, "grown", incremental_configs=[change])
        admin.incremental_alter_configs([resource])[resource].result(WITHIN)
        image = controller_image(controller, lambda i: bool(i.config(ConfigResourceType.TOPIC, "grown")))
        assert dict(image.config(ConfigResourceType.TOPIC, "grown")) == {"retention.ms": "123456"}
        described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "grown")])
        [entries] = [future.result(WITHIN) for future in described.values()]
        assert entries["retention.ms"].value == "123456"

        # A transactional producer's id comes from a block the controller allocated to this broker.
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tx-1"})
        producer.init_transactions(WITHIN)
        producer.begin_transaction()
        producer.produce("grown", value=b"in a transaction", partition=0)
        producer.commit_transaction(WITHIN)
        image = controller_image(controller, lambda i: i.next_producer_id > 0)
        assert image.next_producer_id >= 1000  # one block of Kafka's 1000 ids at least

        # DeleteTopics: gone from the controller's metadata and from kbroker's.
        admin.delete_topics(["grown"])["grown"].result(WITHIN)
        controller_image(controller, lambda i: i.topics.get("grown") is None)
        assert topic_metadata(broker, "grown").error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    finally:
        broker.stop(timeout=WITHIN)


def topic_metadata(broker: BrokerProcess, name: str) -> MetadataResponse.MetadataResponseTopic:
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=name)], allow_auto_topic_creation=False)
    with WireClient(broker.bootstrap) as client:
        [topic] = client.request(request, 12).topics
    return topic


STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def test_acls_created_and_deleted_on_kbroker_are_the_controllers(tmp_path: Path) -> None:
    """CreateAcls and DeleteAcls reach a controller running Kafka's StandardAuthorizer (kbroker's requests come as
    the broker's own principal, a super user there, as Kafka's inter-broker principal is)."""
    secured = KafkaController(
        tmp_path / "controller",
        {"authorizer.class.name": STANDARD_AUTHORIZER, "super.users": "User:ANONYMOUS"},
        features=KBROKER_LEVELS,
    )
    try:
        secured.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        data_dir = tmp_path / "broker"
        format_data_dir(data_dir, secured.cluster_id, NODE)
        settings = {**broker_settings(secured), "authorizer.class.name": STANDARD_AUTHORIZER}
        broker = BrokerProcess(data_dir, {**settings, "super.users": "User:ANONYMOUS"}).start(timeout=WITHIN)
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            binding = AclBinding(
                ResourceType.TOPIC,
                "orders",
                ResourcePatternType.PREFIXED,
                "User:alice",
                "*",
                AclOperation.READ,
                AclPermissionType.ALLOW,
            )
            [created] = admin.create_acls([binding]).values()
            created.result(WITHIN)
            wanted = AclEntry(2, "orders", 4, "User:alice", "*", 3, 3)  # TOPIC, PREFIXED, READ, ALLOW
            image = controller_image(secured, lambda i: wanted in i.acls.values())
            assert list(image.acls.values()) == [wanted]
            # Alice's ACLs on any resource (None: any name or host, which confluent-kafka's annotations leave out).
            anything: Any = None
            every = AclBindingFilter(
                ResourceType.ANY,
                anything,
                ResourcePatternType.ANY,
                "User:alice",
                anything,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
            listed = admin.describe_acls(every)
            assert listed.result(WITHIN) == [binding]

            [deleted] = admin.delete_acls([every]).values()
            assert deleted.result(WITHIN) == [binding]
            controller_image(secured, lambda i: not i.acls)
        finally:
            broker.stop(timeout=WITHIN)
    finally:
        secured.stop()


def test_scram_credentials_and_client_quotas_set_on_kbroker_are_the_controllers(
    controller: KafkaController, tmp_path: Path
) -> None:
    node = NODE + 2
    data_dir = tmp_path / "broker"
    format_data_dir(data_dir, controller.cluster_id, node)
    broker = BrokerProcess(data_dir, {**broker_settings(controller), "node.id": str(node)}).start(timeout=WITHIN)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        upsert = UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"pw")
        admin.alter_user_scram_credentials([upsert])["alice"].result(WITHIN)
        image = controller_image(controller, lambda i: ("alice", 1) in i.scram_credentials)
        assert image.scram_credentials[("alice", ImageScramMechanism.SCRAM_SHA_256)].iterations == 8192
        described = admin.describe_user_scram_credentials(["alice"])
        assert isinstance(described, dict)
        assert [(c.mechanism, c.iterations) for c in described["alice"].result(WITHIN).scram_credential_infos] == [
            (ScramMechanism.SCRAM_SHA_256, 8192)
        ]
        admin.alter_user_scram_credentials([UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_256)])[
            "alice"
        ].result(WITHIN)
        controller_image(controller, lambda i: ("alice", 1) not in i.scram_credentials)

        q = AlterClientQuotasRequest
        quota = q(
            entries=[
                q.EntryData(
                    entity=[q.EntityData(entity_type="client-id", entity_name="reporting")],
                    ops=[q.OpData(key="producer_byte_rate", value=1024.0)],
                )
            ]
        )
        with WireClient(broker.bootstrap) as client:
            [entry] = client.request(quota, 1).entries
        assert (entry.error_code, entry.error_message) == (0, None)
        image = controller_image(controller, lambda i: bool(i.client_quotas))
        assert {entity: dict(values) for entity, values in image.client_quotas.items()} == {
            (("client-id", "reporting"),): {"producer_byte_rate": 1024.0}
        }
        # A refusal is the controller's: the same request sent to it answers the same.
        bad = q(
            entries=[
                q.EntryData(
                    entity=[q.EntityData(entity_type="client-id", entity_name="reporting")],
                    ops=[q.OpData(key="no_such_quota", value=1.0)],
                )
            ]
        )
        answers = []
        for address in (broker.bootstrap, controller.bootstrap):
            with WireClient(address) as client:
                [refused] = client.request(bad, 1).entries
            answers.append((refused.error_code, refused.error_message))
        assert answers[0] == answers[1] and answers[0][0] == ErrorCode.INVALID_REQUEST
    finally:
        broker.stop(timeout=WITHIN)


def test_kafkas_broker_properties_runs_kbroker_as_that_broker(controller: KafkaController, tmp_path: Path) -> None:
    """The keys of Kafka's own config/broker.properties, only its addresses and directory changed, start kbroker
    as that broker: its listener registered, its node id in Metadata, its data directory the formatted one."""
    node = NODE + 3
    with socket.socket() as probe:  # a free port for the fixed listener the file names
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data_dir = tmp_path / "kraft-broker-logs"
    format_data_dir(data_dir, controller.cluster_id, node)
    properties = tmp_path / "broker.properties"
    properties.write_text(
        "process.roles=broker\n"
        f"node.id={node}\n"
        f"controller.quorum.bootstrap.servers={controller.bootstrap}\n"
        f"listeners=PLAINTEXT://127.0.0.1:{port}\n"
        "inter.broker.listener.name=PLAINTEXT\n"
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n"
        "controller.listener.names=CONTROLLER\n"
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
        "SASL_SSL:SASL_SSL\n"
        "num.network.threads=3\nnum.io.threads=8\nsocket.send.buffer.bytes=102400\nsocket.receive.buffer.bytes=102400\n"
        "socket.request.max.bytes=104857600\n"
        f"log.dirs={data_dir}\n"
        "num.partitions=1\nnum.recovery.threads.per.data.dir=1\noffsets.topic.replication.factor=1\n"
        "transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n"
        "share.coordinator.state.topic.replication.factor=1\nshare.coordinator.state.topic.min.isr=1\n"
        "log.retention.hours=168\nlog.segment.bytes=1073741824\nlog.retention.check.interval.ms=300000\n"
    )
    ready = tmp_path / "ready"
    command = [sys.executable, "-m", "kbroker", "serve", "--config", str(properties), "--ready-file", str(ready)]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WITHIN
        while not ready.exists():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "kbroker did not become ready"
            time.sleep(0.05)
        assert ready.read_text().strip() == f"127.0.0.1:{port}"
        with WireClient(f"127.0.0.1:{port}") as client:
            metadata = client.request(MetadataRequest(topics=[], allow_auto_topic_creation=False), 12)
        assert ([b.node_id for b in metadata.brokers], metadata.cluster_id) == ([node], controller.cluster_id)
        image = controller_image(controller, lambda i: node in i.brokers and not i.brokers[node].fenced)
        assert image.brokers[node].endpoints["PLAINTEXT"].port == port
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=WITHIN)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr and " ERROR " not in stderr
    # Under the quorum the internal topics' replication settings apply: not warned about as on a single node.
    assert "offsets.topic.replication.factor=1 is accepted but not applied" not in stderr
    assert "transaction.state.log.replication.factor=1 is accepted but not applied" not in stderr
    assert "transaction.state.log.min.isr=1 is accepted but not applied" not in stderr


def test_a_kbroker_broker_administers_topics_it_holds_no_replica_of(
    controller: KafkaController, tmp_path: Path
) -> None:
    """Two kbroker brokers under one controller: a topic placed on the second only is created, reconfigured and
    deleted through the first, which holds no replica of it."""
    first, second = NODE + 4, NODE + 5
    brokers = []
    try:
        for node in (first, second):
            data_dir = tmp_path / f"broker-{node}"
            format_data_dir(data_dir, controller.cluster_id, node)
            settings = {**broker_settings(controller), "node.id": str(node)}
            brokers.append(BrokerProcess(data_dir, settings).start(timeout=WITHIN))
        via = brokers[0].bootstrap
        placed = CreateTopicsRequest.CreatableTopic(
            name="elsewhere",
            num_partitions=-1,
            replication_factor=-1,
            assignments=[CreateTopicsRequest.CreatableReplicaAssignment(partition_index=0, broker_ids=[second])],
        )
        with WireClient(via) as client:
            [created] = client.request(CreateTopicsRequest(topics=[placed], timeout_ms=30000), 7).topics
        assert (created.error_code, created.error_message, created.num_partitions) == (0, None, 1)
        image = controller_image(controller, lambda i: i.topics.get("elsewhere") is not None)
        topic = image.topics.by_name["elsewhere"]
        assert created.topic_id == topic.topic_id
        assert [(p.leader, p.replicas) for p in topic.partitions.values()] == [(second, (second,))]

        alter = IncrementalAlterConfigsRequest
        change = alter.AlterConfigsResource(
            resource_type=2,
            resource_name="elsewhere",
            configs=[alter.AlterableConfig(name="retention.ms", config_operation=0, value="60000")],
        )
        with WireClient(via) as client:
            [altered] = client.request(alter(resources=[change]), 1).responses
        assert (altered.error_code, altered.error_message) == (0, None)
        image = controller_image(controller, lambda i: bool(i.config(ConfigResourceType.TOPIC, "elsewhere")))
        assert dict(image.config(ConfigResourceType.TOPIC, "elsewhere")) == {"retention.ms": "60000"}

        by_name = DeleteTopicsRequest.DeleteTopicState(name="elsewhere")
        with WireClient(via) as client:
            [deleted] = client.request(DeleteTopicsRequest(topics=[by_name], timeout_ms=30000), 6).responses
        assert (deleted.error_code, deleted.topic_id) == (0, topic.topic_id)
        controller_image(controller, lambda i: i.topics.get("elsewhere") is None)
    finally:
        for broker in brokers:
            broker.stop(timeout=WITHIN)


def test_a_request_made_while_the_controller_is_down_completes_once_it_is_back(tmp_path: Path) -> None:
    """The broker rides out a controller restart: its follower and heartbeats reconnect, and a CreateTopics sent
    while no controller answered is forwarded once one does (within the request timeout)."""
    restarting = KafkaController(tmp_path / "controller", features=KBROKER_LEVELS)
    try:
        restarting.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        data_dir = tmp_path / "broker"
        format_data_dir(data_dir, restarting.cluster_id, NODE)
        broker = BrokerProcess(data_dir, broker_settings(restarting)).start(timeout=WITHIN)
        try:
            restarting.stop()
            restarted = threading.Timer(2.0, restarting.start)
            restarted.start()
            topic = CreateTopicsRequest.CreatableTopic(name="after-outage", num_partitions=1, replication_factor=1)
            with WireClient(broker.bootstrap, timeout=WITHIN) as client:
                [created] = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=30000), 7).topics
            restarted.join()
            assert (created.error_code, created.error_message) == (0, None)
            image = controller_image(restarting, lambda i: i.topics.get("after-outage") is not None)
            assert image.topics.by_name["after-outage"].topic_id == created.topic_id
        finally:
            broker.stop(timeout=WITHIN)
    finally:
        restarting.stop()
