"""Admin requests a kbroker broker forwards reach Apache Kafka 4.4's KRaft controller as the client's, not the
broker's: the controller runs Kafka's StandardAuthorizer with the broker's principal (User:ANONYMOUS, its PLAINTEXT
controller connection) a super user, and kbroker's SASL/PLAIN users get the controller's own verdicts. A user
without CREATE on the cluster is refused CreateTopics (TOPIC_AUTHORIZATION_FAILED) and CreateAcls
(CLUSTER_AUTHORIZATION_FAILED); once a super user grants it CREATE from its address, it creates topics; a user
granted CREATE only from another address stays refused (the envelope carries the client's address too).
IncrementalAlterConfigs and DeleteTopics (answered in part by the broker, or forwarded whole) and Metadata's
auto-creation are the controller's verdicts for the client as well; DescribeQuorum is the controller's answer."""

from __future__ import annotations

import base64
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from compat.apache_kafka import KafkaController, KafkaUnavailable
from compat.security import jaas_plain
from kbroker.apis import FORWARDABLE, HANDLERS
from kbroker.security.acls import AclOperation, AclPermissionType, PatternType, ResourceType
from kbroker.testing import BrokerProcess
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.alter_configs_request import AlterConfigsRequest
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_acls_request import CreateAclsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.create_topics_response import CreateTopicsResponse
from protocol.messages.delete_topics_request import DeleteTopicsRequest
from protocol.messages.describe_quorum_request import DescribeQuorumRequest
from protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest
from tests.kraft.conftest import KBROKER_LEVELS

NODE = 11
WITHIN = 120  # seconds: a bound against hanging, never a measure (2 busy cores)
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
TIERED_STORAGE_OFF = (  # Kafka 4.4's controller's words
    "Tiered Storage functionality is disabled in the broker. Topic cannot be configured with remote log storage."
)
USERS = (("admin", "admin-secret"), ("alice", "alice-secret"), ("bob", "bob-secret"))


@pytest.fixture
def secured_controller(tmp_path: Path) -> Iterator[KafkaController]:
    """Kafka's controller with ACLs on: the broker's principal and admin are super users, nobody else is."""
    controller = KafkaController(
        tmp_path / "controller",
        {"authorizer.class.name": STANDARD_AUTHORIZER, "super.users": "User:ANONYMOUS;User:admin"},
        features=KBROKER_LEVELS,
    )
    try:
        controller.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        yield controller
    finally:
        controller.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_broker(controller: KafkaController, tmp_path: Path, sasl_port: int) -> BrokerProcess:
    data_dir = tmp_path / "broker"
    data_dir.mkdir()
    directory_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    (data_dir / "meta.properties").write_text(
        f"node.id={NODE}\ndirectory.id={directory_id}\nversion=1\ncluster.id={controller.cluster_id}\n"
    )
    settings = {
        "process.roles": "broker",
        "node.id": str(NODE),
        "controller.quorum.bootstrap.servers": controller.bootstrap,
        "controller.listener.names": "CONTROLLER",
        "broker.heartbeat.interval.ms": "500",
        "listeners": f"PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas_plain(USERS),
        # No authorizer on kbroker: whatever refuses a forwarded request is the controller.
    }
    return BrokerProcess(data_dir, settings, log_level="INFO").start(timeout=WITHIN)


def signed_in(port: int, user: str) -> WireClient:
    """A connection to kbroker's SASL_PLAINTEXT listener, authenticated as ``user``."""
    password = dict(USERS)[user]
    client = WireClient(f"127.0.0.1:{port}", timeout=WITHIN, client_id=f"{user}-app")
    assert client.request(SaslHandshakeRequest(mechanism="PLAIN"), 1).error_code == ErrorCode.NONE
    answer = client.request(SaslAuthenticateRequest(auth_bytes=f"\0{user}\0{password}".encode()), 2)
    assert answer.error_code == ErrorCode.NONE, answer.error_message
    return client


def create_topic(client: WireClient, name: str, *, validate_only: bool = False) -> tuple[int, str | None]:
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=1, replication_factor=1)
    answer = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=30000, validate_only=validate_only), 7)
    assert isinstance(answer, CreateTopicsResponse)
    [result] = answer.topics
    return result.error_code, result.error_message


def grant_create_on_cluster(client: WireClient, user: str, host: str) -> list[tuple[int, str | None]]:
    creation = CreateAclsRequest.AclCreation(
        resource_type=ResourceType.CLUSTER,
        resource_name="kafka-cluster",
        resource_pattern_type=PatternType.LITERAL,
        principal=f"User:{user}",
        host=host,
        operation=AclOperation.CREATE,
        permission_type=AclPermissionType.ALLOW,
    )
    answer = client.request(CreateAclsRequest(creations=[creation]), 3)
    return [(result.error_code, result.error_message) for result in answer.results]


def auto_created(client: WireClient, name: str, *, allow: bool = True) -> list[tuple[str | None, int, int]]:
    """Metadata for ``name``, auto-creating it if ``allow``: (name, error, partitions)."""
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=name)], allow_auto_topic_creation=allow)
    return [(t.name, t.error_code, len(t.partitions)) for t in client.request(request, 12).topics]


def test_the_controller_authorizes_forwarded_requests_as_the_client(
    secured_controller: KafkaController, tmp_path: Path
) -> None:
    sasl_port = free_port()
    broker = start_broker(secured_controller, tmp_path, sasl_port)
    try:
        with signed_in(sasl_port, "alice") as alice, signed_in(sasl_port, "bob") as bob:
            # Without an ACL: the controller refuses alice (as the broker, a super user, it would have created it).
            assert create_topic(alice, "alice-orders") == (
                ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                "Authorization failed.",
            )
            assert [code for code, _ in grant_create_on_cluster(alice, "alice", "*")] == [
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            ]

            # A super user grants alice CREATE from 127.0.0.1 and bob CREATE from another address only (the
            # controller's answer as it wrote it: an empty message, not a null one).
            with signed_in(sasl_port, "admin") as admin:
                assert grant_create_on_cluster(admin, "alice", "127.0.0.1") == [(ErrorCode.NONE, "")]
                assert grant_create_on_cluster(admin, "bob", "10.0.0.1") == [(ErrorCode.NONE, "")]

            # The controller's authorizer has the ACLs once its metadata publisher applied them (soon after the
            # commit the answer waited for): asked without creating anything until then.
            deadline = time.monotonic() + WITHIN
            while create_topic(alice, "alice-orders", validate_only=True)[0] != ErrorCode.NONE:
                assert time.monotonic() < deadline, "the controller never allowed alice's CREATE"
                time.sleep(0.2)
            assert create_topic(alice, "alice-orders") == (ErrorCode.NONE, None)
            metadata = alice.request(
                MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="alice-orders")]), 12
            )
            assert [(t.name, t.error_code, len(t.partitions)) for t in metadata.topics] == [("alice-orders", 0, 1)]

            # bob's ACL names another host: the controller matched it against bob's address, not the broker's.
            assert create_topic(bob, "bob-orders") == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")

            # Metadata's auto-creation is the client's too (Kafka's AutoTopicCreationManager sends it in an
            # Envelope): alice's topic is created, bob's is not (kbroker, without an authorizer, would have).
            assert auto_created(alice, "alice-auto") == [("alice-auto", ErrorCode.NONE, 1)]
            assert auto_created(bob, "bob-auto") == [("bob-auto", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0)]
            assert auto_created(alice, "bob-auto", allow=False) == [
                ("bob-auto", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0)
            ]

            # Forwarded whole (DeleteTopics) or re-encoded with the client's header (IncrementalAlterConfigs):
            # bob may neither delete nor reconfigure alice's topic.
            deleted = bob.request(DeleteTopicsRequest(topic_names=["alice-orders"], timeout_ms=30000), 5)
            assert [(r.name, r.error_code) for r in deleted.responses] == [
                ("alice-orders", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            ]
            alter = IncrementalAlterConfigsRequest
            change = alter(
                resources=[
                    alter.AlterConfigsResource(
                        resource_type=2,
                        resource_name="alice-orders",
                        configs=[alter.AlterableConfig(name="retention.ms", config_operation=0, value="60000")],
                    )
                ]
            )
            [refused] = bob.request(change, 1).responses
            assert (refused.error_code, refused.resource_name) == (ErrorCode.TOPIC_AUTHORIZATION_FAILED, "alice-orders")
            with signed_in(sasl_port, "admin") as admin:
                [changed] = admin.request(change, 1).responses
                assert (changed.error_code, changed.error_message) == (ErrorCode.NONE, None)
                # Answered in part by the broker (another broker's id, as Kafka's ConfigAdminManager; a value
                # kbroker cannot apply), the rest by the controller: the answers in the request's order.
                legacy = AlterConfigsRequest
                two = legacy(
                    resources=[
                        legacy.AlterConfigsResource(
                            resource_type=4,
                            resource_name="999",
                            configs=[legacy.AlterableConfig(name="log.cleaner.threads", value="2")],
                        ),
                        legacy.AlterConfigsResource(
                            resource_type=2,
                            resource_name="alice-orders",
                            configs=[legacy.AlterableConfig(name="retention.ms", value="70000")],
                        ),
                    ]
                )
                answers = [(r.resource_name, r.error_code, r.error_message) for r in admin.request(two, 2).responses]
                assert answers == [
                    ("999", ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected {NODE}, but received 999"),
                    ("alice-orders", ErrorCode.NONE, None),
                ]
                # CreateTopics goes whole: what kbroker cannot apply, the controller (tiered storage off) refuses.
                topic = CreateTopicsRequest.CreatableTopic
                tiered = CreateTopicsRequest.CreatableTopicConfig(name="remote.storage.enable", value="true")
                mixed = CreateTopicsRequest(
                    topics=[
                        topic(name="tiered", num_partitions=1, replication_factor=1, configs=[tiered]),
                        topic(name="plain", num_partitions=1, replication_factor=1),
                    ],
                    timeout_ms=30000,
                )
                created = admin.request(mixed, 7).topics
                assert [(t.name, t.error_code, t.error_message) for t in created] == [
                    ("tiered", ErrorCode.INVALID_CONFIG, TIERED_STORAGE_OFF),
                    ("plain", ErrorCode.NONE, None),
                ]
                deleted = admin.request(DeleteTopicsRequest(topic_names=["alice-orders"], timeout_ms=30000), 5)
                assert [(r.name, r.error_code) for r in deleted.responses] == [("alice-orders", ErrorCode.NONE)]

        # DescribeQuorum is forwarded too: kbroker answers the controller quorum's own description (its voter, its
        # leader, this broker among the observers), not a single node's.
        quorum = DescribeQuorumRequest(
            topics=[
                DescribeQuorumRequest.TopicData(
                    topic_name="__cluster_metadata", partitions=[DescribeQuorumRequest.PartitionData(partition_index=0)]
                )
            ]
        )
        with signed_in(sasl_port, "admin") as admin:
            described = admin.request(quorum, 2)
        [[partition]] = [topic.partitions for topic in described.topics]
        assert (described.error_code, partition.error_code) == (ErrorCode.NONE, ErrorCode.NONE)
        assert (partition.leader_id, [v.replica_id for v in partition.current_voters]) == (
            secured_controller.node_id,
            [secured_controller.node_id],
        )
        assert NODE in [observer.replica_id for observer in partition.observers]

        # ApiVersions: the forwarded APIs in the versions both kbroker and the controller serve, as Kafka's broker.
        hello = ApiVersionsRequest(client_software_name="test", client_software_version="1")
        with WireClient(secured_controller.bootstrap) as direct:
            theirs = {a.api_key: (a.min_version, a.max_version) for a in direct.request(hello, 3).api_keys}
        with signed_in(sasl_port, "bob") as bob:
            ours = {a.api_key: (a.min_version, a.max_version) for a in bob.request(hello, 3).api_keys}
        expected = {}
        for key in FORWARDABLE:
            low, high = theirs.get(key, (0, -1))
            low, high = max(low, HANDLERS[key].min_version), min(high, HANDLERS[key].max_version)
            if low <= high:
                expected[key] = (low, high)
        assert {key: versions for key, versions in ours.items() if key in FORWARDABLE} == expected
        assert {19, 20, 30, 31, 33, 37, 44, 49, 51, 55, 57} <= set(expected)
    finally:
        broker.stop(timeout=WITHIN)
