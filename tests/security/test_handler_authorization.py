"""Every request handler under Kafka's StandardAuthorizer semantics (kbroker/security/authorizer.py): what each API
checks, which error a refusal answers (per topic, partition, group or request) and where, which topics are hidden
rather than refused, and ``authorized_operations`` computed from the ACLs.

Handlers are called directly (decoded requests, no sockets) on a broker with the in-memory log store, as
tests/broker/test_handlers_in_memory.py does; a request that fails as a whole (the handler raises KafkaError) is
checked through the error answer the connection would send (kbroker/apis/error_responses.py). The client is
``User:alice`` from 127.0.0.1; ``User:admin`` is a super user; ``allow.everyone.if.no.acl.found`` is false, so
alice may do only what her ACLs allow.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kbroker.apis import HANDLERS
from kbroker.apis.context import HandlerServices, RequestContext
from kbroker.apis.error_responses import error_response
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
from kbroker.security.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from kbroker.storage import LogManager
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.add_offsets_to_txn_request import AddOffsetsToTxnRequest
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.alter_client_quotas_request import AlterClientQuotasRequest
from protocol.messages.alter_configs_request import AlterConfigsRequest
from protocol.messages.alter_partition_reassignments_request import AlterPartitionReassignmentsRequest
from protocol.messages.alter_replica_log_dirs_request import AlterReplicaLogDirsRequest
from protocol.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest
from protocol.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest
from protocol.messages.create_partitions_request import CreatePartitionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.delete_groups_request import DeleteGroupsRequest
from protocol.messages.delete_records_request import DeleteRecordsRequest
from protocol.messages.delete_topics_request import DeleteTopicsRequest
from protocol.messages.describe_client_quotas_request import DescribeClientQuotasRequest
from protocol.messages.describe_cluster_request import DescribeClusterRequest
from protocol.messages.describe_configs_request import DescribeConfigsRequest
from protocol.messages.describe_groups_request import DescribeGroupsRequest
from protocol.messages.describe_log_dirs_request import DescribeLogDirsRequest
from protocol.messages.describe_producers_request import DescribeProducersRequest
from protocol.messages.describe_quorum_request import DescribeQuorumRequest
from protocol.messages.describe_topic_partitions_request import DescribeTopicPartitionsRequest
from protocol.messages.describe_transactions_request import DescribeTransactionsRequest
from protocol.messages.elect_leaders_request import ElectLeadersRequest
from protocol.messages.end_txn_request import EndTxnRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.heartbeat_request import HeartbeatRequest
from protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.messages.join_group_request import JoinGroupRequest
from protocol.messages.leave_group_request import LeaveGroupRequest
from protocol.messages.list_config_resources_request import ListConfigResourcesRequest
from protocol.messages.list_groups_request import ListGroupsRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.list_partition_reassignments_request import ListPartitionReassignmentsRequest
from protocol.messages.list_transactions_request import ListTransactionsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.offset_commit_request import OffsetCommitRequest
from protocol.messages.offset_delete_request import OffsetDeleteRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from protocol.messages.offset_for_leader_epoch_request import OffsetForLeaderEpochRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.messages.sync_group_request import SyncGroupRequest
from protocol.messages.txn_offset_commit_request import TxnOffsetCommitRequest
from protocol.messages.update_features_request import UpdateFeaturesRequest
from protocol.records import Record, build_batch

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ALICE = "User:alice"
ADMIN = "User:admin"
TAF = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GAF = ErrorCode.GROUP_AUTHORIZATION_FAILED
CAF = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
TIAF = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
ZERO = uuid.UUID(int=0)
NOT_REQUESTED = -(2**31)
Op = AclOperation
RT = ResourceType


def bits(*operations: AclOperation) -> int:
    return sum(1 << op for op in operations)


ALL_TOPIC_OPERATIONS = bits(Op.READ, Op.WRITE, Op.CREATE, Op.DELETE, Op.ALTER, Op.DESCRIBE, Op.DESCRIBE_CONFIGS)
ALL_TOPIC_OPERATIONS |= bits(Op.ALTER_CONFIGS)
ALL_CLUSTER_OPERATIONS = bits(
    Op.CREATE, Op.ALTER, Op.DESCRIBE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, Op.IDEMPOTENT_WRITE
)
ALL_GROUP_OPERATIONS = bits(Op.READ, Op.DESCRIBE, Op.DELETE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS)


def make_broker(path: Path, overrides: dict[str, str]) -> Broker:
    config = BrokerConfig({"num.partitions": "1", **overrides})
    return Broker(
        config, path / "data", Endpoint("localhost", 9092), logs=LogManager.in_memory_store(config.topic_defaults())
    )


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    secured = make_broker(
        tmp_path,
        {"authorizer.class.name": STANDARD, "super.users": ADMIN, "allow.everyone.if.no.acl.found": "false"},
    )
    try:
        run(lambda: secured.topics.create("allowed", 2, {}))
        run(lambda: secured.topics.create("denied", 1, {}))
        yield secured
    finally:
        secured.close()


def allow(
    broker: Broker,
    resource_type: ResourceType,
    name: str,
    *operations: AclOperation,
    pattern: PatternType = PatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> None:
    assert broker.authorizer is not None
    results = trio.run(
        broker.controller.create_acls,
        [AclBinding(resource_type, name, pattern, ALICE, "*", op, permission) for op in operations],
    )
    assert all(result.code == ErrorCode.NONE for result in results)


def run(call: Any) -> Any:
    return trio.run(call, clock=trio.testing.MockClock(autojump_threshold=0))


def send(broker: Broker, api_key: int, version: int, request: Any, principal: str = ALICE) -> Any:
    """The handler's answer, or the error answer the connection sends when it raises KafkaError."""
    context = RequestContext(
        services=HandlerServices.of(broker),
        api_key=api_key,
        api_version=version,
        correlation_id=1,
        client_id="authz-test",
        client_host="127.0.0.1:40000",
        connection_id=1,
        principal=principal,
    )
    try:
        return run(lambda: HANDLERS[api_key].handle(context, request))
    except KafkaError as exc:
        return error_response(api_key, version, request, exc.code, exc.message)


def records(*, transactional: bool = False) -> bytes:
    batch = build_batch(
        [Record(offset_delta=0, timestamp_delta=0, key=b"k", value=b"v")],
        base_timestamp=1_700_000_000_000,
        producer_id=7 if transactional else -1,
        producer_epoch=0 if transactional else -1,
        base_sequence=0 if transactional else -1,
        is_transactional=transactional,
    )
    return bytes(batch)


# --- Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, DeleteRecords, DescribeProducers ---------------------


def produce_request(topics: list[str], transactional_id: str | None = None, *, transactional: bool = False) -> Any:
    return ProduceRequest(
        transactional_id=transactional_id,
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=name,
                partition_data=[
                    ProduceRequest.PartitionProduceData(index=0, records=records(transactional=transactional))
                ],
            )
            for name in topics
        ],
    )


def test_produce_needs_write_per_topic_before_existence(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "allowed", Op.WRITE)
    answer = send(broker, 0, 9, produce_request(["allowed", "denied", "ghost"]))
    codes = [
        (t.name, t.partition_responses[0].error_code, t.partition_responses[0].base_offset) for t in answer.responses
    ]
    assert codes == [("allowed", ErrorCode.NONE, 0), ("denied", TAF, -1), ("ghost", TAF, -1)]
    assert broker.topics.topic("ghost") is None


def test_produce_transactional_records_need_write_on_the_transactional_id(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "allowed", Op.WRITE)
    answer = send(broker, 0, 9, produce_request(["allowed"], "txn", transactional=True))
    partition = answer.responses[0].partition_responses[0]
    assert (partition.error_code, partition.error_message) == (TIAF, "Transactional Id authorization failed.")
    # Without transactional records the transactional id is not looked at (Kafka's hasTransactionalRecords).
    answer = send(broker, 0, 9, produce_request(["allowed"], "txn"))
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.NONE


def fetch_request(topics: list[str], replica_id: int = -1) -> FetchRequest:
    return FetchRequest(
        replica_id=replica_id,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[
            FetchRequest.FetchTopic(
                topic=name,
                partitions=[FetchRequest.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1024)],
            )
            for name in topics
        ],
    )


def test_fetch_needs_read_per_topic_and_a_follower_cluster_action(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "allowed", Op.READ)
    answer = send(broker, 1, 4, fetch_request(["denied", "allowed", "ghost"]))
    # Kafka's order: the partitions it reads, then the refused and unknown ones in request order.
    assert [(t.topic, t.partitions[0].error_code) for t in answer.responses] == [
        ("allowed", ErrorCode.NONE),
        ("denied", TAF),
        ("ghost", TAF),
    ]
    refused = answer.responses[1].partitions[0]
    assert (refused.high_watermark, refused.log_start_offset, refused.records) == (-1, -1, b"")
    follower = send(broker, 1, 4, fetch_request(["allowed"], replica_id=0))
    assert follower.responses[0].partitions[0].error_code == TAF
    allow(broker, RT.CLUSTER, "kafka-cluster", Op.CLUSTER_ACTION)
    follower = send(broker, 1, 4, fetch_request(["denied"], replica_id=0))
    # Authorized; then, as Kafka, refused by the replica layer: a one-replica partition has no follower 0.
    assert follower.responses[0].partitions[0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_list_offsets_and_leader_epochs_need_describe(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "allowed", Op.DESCRIBE)
    request = ListOffsetsRequest(
        replica_id=-1,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name=name, partitions=[ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)]
            )
            for name in ("ghost", "allowed")
        ],
    )
    answer = send(broker, 2, 7, request)
    assert [(t.name, p.error_code, p.offset, p.timestamp) for t in answer.topics for p in t.partitions] == [
        ("allowed", ErrorCode.NONE, 0, -1),
        ("ghost", TAF, -1, -1),
    ]
    epochs = OffsetForLeaderEpochRequest(
        replica_id=-1,
        topics=[
            OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
                topic=name,
                partitions=[
                    OffsetForLeaderEpochRequest.OffsetForLeaderPartition(
                        partition=0, current_leader_epoch=-1, leader_epoch=0
                    )
                ],
            )
            for name in ("denied", "allowed")
        ],
    )
    answer = send(broker, 23, 4, epochs)
    assert [(t.topic, p.error_code, p.leader_epoch, p.end_offset) for t in answer.topics for p in t.partitions] == [
        ("allowed", ErrorCode.NONE, 0, 0),
        ("denied", TAF, -1, -1),
    ]
    allow(broker, RT.CLUSTER, "kafka-cluster", Op.CLUSTER_ACTION)  # a replica may ask about every topic
    assert send(broker, 23, 4, epochs).topics[1].partitions[0].error_code == ErrorCode.NONE


def test_delete_records_needs_delete_and_describe_producers_read(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "allowed", Op.DELETE, Op.READ)
    request = DeleteRecordsRequest(
        timeout_ms=5000,
        topics=[
            DeleteRecordsRequest.DeleteRecordsTopic(
                name=name, partitions=[DeleteRecordsRequest.DeleteRecordsPartition(partition_index=0, offset=0)]
            )
            for name in ("allowed", "denied")
        ],
    )
    answer = send(broker, 21, 2, request)
    assert [(t.name, t.partitions[0].error_code, t.partitions[0].low_watermark) for t in answer.topics] == [
        ("allowed", ErrorCode.NONE, 0),
        ("denied", TAF, -1),
    ]
    producers = DescribeProducersRequest(
        topics=[DescribeProducersRequest.TopicRequest(name=n, partition_indexes=[0]) for n in ("allowed", "ghost")]
    )
    answer = send(broker, 61, 0, producers)
    assert [(t.name, t.partitions[0].error_code, t.partitions[0].error_message) for t in answer.topics] == [
        ("allowed", ErrorCode.NONE, None),
        ("ghost", TAF, "Topic authorization failed."),
    ]


# --- Metadata, DescribeCluster, DescribeTopicPartitions ------------------------------------------------------


def metadata(names: list[str] | None, version: int = 10, **options: Any) -> MetadataRequest:
    topics = None if names is None else [MetadataRequest.MetadataRequestTopic(name=n) for n in names]
    return MetadataRequest(topics=topics, **options)


def test_metadata_hides_and_refuses_topics_without_describe(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "allowed", Op.READ)  # READ implies DESCRIBE
    listing = send(broker, 3, 10, metadata(None, include_topic_authorized_operations=True))
    assert [(t.name, t.topic_authorized_operations) for t in listing.topics] == [
        ("allowed", bits(Op.READ, Op.DESCRIBE))
    ]
    named = send(broker, 3, 10, metadata(["ghost", "allowed", "denied"], allow_auto_topic_creation=False))
    assert [(t.error_code, t.name, t.topic_id, len(t.partitions)) for t in named.topics] == [
        (ErrorCode.NONE, "allowed", broker.topics.topic("allowed").topic_id, 2),  # type: ignore[union-attr]
        (TAF, "ghost", ZERO, 0),
        (TAF, "denied", ZERO, 0),
    ]
    assert all(t.topic_authorized_operations == NOT_REQUESTED for t in named.topics)


def test_metadata_by_topic_id_refuses_with_the_id_and_no_name(broker: Broker) -> None:
    info = broker.topics.topic("denied")
    assert info is not None
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=None, topic_id=info.topic_id)])
    (topic,) = send(broker, 3, 12, request).topics
    assert (topic.error_code, topic.name, topic.topic_id) == (TAF, None, info.topic_id)


def test_metadata_auto_creation_needs_create_on_the_cluster_or_the_topic(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "auto-", Op.DESCRIBE, pattern=PatternType.PREFIXED)
    refused = send(broker, 3, 10, metadata(["auto-one"], allow_auto_topic_creation=True))
    assert [(t.error_code, t.name) for t in refused.topics] == [(TAF, "auto-one")]
    assert broker.topics.topic("auto-one") is None
    allow(broker, RT.TOPIC, "auto-one", Op.CREATE)
    created = send(broker, 3, 10, metadata(["auto-one"], allow_auto_topic_creation=True))
    assert [(t.error_code, t.name, len(t.partitions)) for t in created.topics] == [(ErrorCode.NONE, "auto-one", 1)]
    allow(broker, RT.CLUSTER, "kafka-cluster", Op.CREATE)
    created = send(broker, 3, 10, metadata(["auto-two"], allow_auto_topic_creation=True))
    assert [(t.error_code, t.name) for t in created.topics] == [(ErrorCode.NONE, "auto-two")]
    # Not allowed to create and not asked to: unknown, as without an authorizer.
    missing = send(broker, 3, 10, metadata(["auto-three"], allow_auto_topic_creation=False))
    assert [(t.error_code, t.name) for t in missing.topics] == [(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "auto-three")]


def test_cluster_authorized_operations(broker: Broker) -> None:
    ask = metadata([], include_cluster_authorized_operations=True)
    assert send(broker, 3, 10, ask).cluster_authorized_operations == 0  # no DESCRIBE on the cluster
    describe = DescribeClusterRequest(include_cluster_authorized_operations=True)
    assert send(broker, 60, 1, describe).cluster_authorized_operations == 0
    allow(broker, RT.CLUSTER, "kafka-cluster", Op.ALTER, Op.IDEMPOTENT_WRITE)  # ALTER implies DESCRIBE
    expected = bits(Op.ALTER, Op.DESCRIBE, Op.IDEMPOTENT_WRITE)
    assert send(broker, 3, 10, ask).cluster_authorized_operations == expected
    assert send(broker, 60, 1, describe).cluster_authorized_operations == expected
    assert send(broker, 3, 10, ask, ADMIN).cluster_authorized_operations == ALL_CLUSTER_OPERATIONS
    unasked = DescribeClusterRequest(include_cluster_authorized_operations=False)
    assert send(broker, 60, 1, unasked).cluster_authorized_operations == NOT_REQUESTED


def test_without_an_authorizer_every_supported_operation_is_reported(tmp_path: Path) -> None:
    open_broker = make_broker(tmp_path, {})
    try:
        run(lambda: open_broker.topics.create("t", 1, {}))
        answer = send(
            open_broker,
            3,
            10,
            metadata(["t"], include_cluster_authorized_operations=True, include_topic_authorized_operations=True),
        )
        assert answer.topics[0].topic_authorized_operations == ALL_TOPIC_OPERATIONS
        assert answer.cluster_authorized_operations == ALL_CLUSTER_OPERATIONS
        groups = send(open_broker, 15, 5, DescribeGroupsRequest(groups=["g"], include_authorized_operations=True))
        assert groups.groups[0].authorized_operations == ALL_GROUP_OPERATIONS
    finally:
        open_broker.close()


def test_describe_topic_partitions_filters_and_refuses(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "allowed", Op.DESCRIBE)
    every = send(broker, 75, 0, DescribeTopicPartitionsRequest(topics=[], response_partition_limit=100))
    assert [(t.name, t.error_code, t.topic_authorized_operations) for t in every.topics] == [
        ("allowed", ErrorCode.NONE, bits(Op.DESCRIBE))
    ]
    named = DescribeTopicPartitionsRequest(
        topics=[DescribeTopicPartitionsRequest.TopicRequest(name=n) for n in ("denied", "allowed")],
        response_partition_limit=100,
    )
    answer = send(broker, 75, 0, named)
    assert [(t.name, t.error_code, t.topic_id, len(t.partitions)) for t in answer.topics] == [
        ("allowed", ErrorCode.NONE, broker.topics.topic("allowed").topic_id, 2),  # type: ignore[union-attr]
        ("denied", TAF, ZERO, 0),
    ]


# --- CreateTopics, DeleteTopics, CreatePartitions ------------------------------------------------------------


def test_create_topics_needs_create_and_shows_configs_only_with_describe_configs(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "mine", Op.CREATE)
    allow(broker, RT.TOPIC, "shown", Op.CREATE, Op.DESCRIBE_CONFIGS)
    request = CreateTopicsRequest(
        timeout_ms=5000,
        topics=[
            CreateTopicsRequest.CreatableTopic(name=n, num_partitions=1, replication_factor=1)
            for n in ("theirs", "mine", "shown")
        ],
    )
    answer = send(broker, 19, 7, request)
    summary = [
        (t.name, t.error_code, t.error_message, t.topic_config_error_code, bool(t.configs)) for t in answer.topics
    ]
    assert summary == [
        ("mine", ErrorCode.NONE, None, TAF, False),
        ("shown", ErrorCode.NONE, None, ErrorCode.NONE, True),
        ("theirs", TAF, "Authorization failed.", ErrorCode.NONE, False),
    ]
    assert (answer.topics[0].num_partitions, answer.topics[2].num_partitions) == (1, -1)
    assert broker.topics.topic("theirs") is None and broker.topics.topic("mine") is not None


def test_delete_topics_refuses_before_existence_and_hides_names_by_id(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "allowed", Op.DESCRIBE)  # may see it, not delete it
    denied = broker.topics.topic("denied")
    assert denied is not None
    by_name = send(broker, 20, 5, DeleteTopicsRequest(topic_names=["allowed", "ghost"], timeout_ms=5000))
    assert [(r.name, r.error_code, r.error_message) for r in by_name.responses] == [
        ("allowed", TAF, "Topic authorization failed."),
        ("ghost", TAF, "Topic authorization failed."),
    ]
    by_id = DeleteTopicsRequest(topics=[DeleteTopicsRequest.DeleteTopicState(name=None, topic_id=denied.topic_id)])
    (result,) = send(broker, 20, 6, by_id).responses
    assert (result.name, result.topic_id, result.error_code) == (None, denied.topic_id, TAF)
    allow(broker, RT.TOPIC, "allowed", Op.DELETE)
    (deleted,) = send(broker, 20, 5, DeleteTopicsRequest(topic_names=["allowed"], timeout_ms=5000)).responses
    assert deleted.error_code == ErrorCode.NONE and broker.topics.topic("allowed") is None


def test_create_partitions_needs_alter(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "allowed", Op.ALTER)
    request = CreatePartitionsRequest(
        timeout_ms=5000,
        topics=[
            CreatePartitionsRequest.CreatePartitionsTopic(name=n, count=3, assignments=None)
            for n in ("allowed", "ghost")
        ],
    )
    answer = send(broker, 37, 3, request)
    assert [(r.name, r.error_code, r.error_message) for r in answer.results] == [
        ("ghost", TAF, None),
        ("allowed", ErrorCode.NONE, None),
    ]


# --- groups and committed offsets -----------------------------------------------------------------------------


def test_find_coordinator_needs_describe_per_key(broker: Broker) -> None:
    allow(broker, RT.GROUP, "g", Op.DESCRIBE)
    groups = send(broker, 10, 4, FindCoordinatorRequest(key_type=0, coordinator_keys=["g", "h"]))
    assert [(c.key, c.error_code, c.node_id, c.error_message) for c in groups.coordinators] == [
        ("g", ErrorCode.NONE, broker.node_id, None),
        ("h", GAF, -1, ""),
    ]
    txn = send(broker, 10, 4, FindCoordinatorRequest(key_type=1, coordinator_keys=["t"]))
    assert [(c.error_code, c.host, c.port) for c in txn.coordinators] == [(TIAF, "", -1)]
    old = send(broker, 10, 3, FindCoordinatorRequest(key="h", key_type=0))
    assert (old.error_code, old.error_message, old.node_id) == (GAF, "Group authorization failed.", -1)


def test_classic_group_requests_need_group_read(broker: Broker) -> None:
    join = JoinGroupRequest(
        group_id="g", session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="", protocol_type="consumer"
    )
    assert send(broker, 11, 9, join).error_code == GAF
    sync = SyncGroupRequest(
        group_id="g", generation_id=1, member_id="m", protocol_type="consumer", protocol_name="range", assignments=[]
    )
    assert send(broker, 14, 5, sync).error_code == GAF
    sync.protocol_name = None  # from v5 a missing protocol is refused first, as Kafka does
    assert send(broker, 14, 5, sync).error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert send(broker, 12, 4, HeartbeatRequest(group_id="g", generation_id=1, member_id="m")).error_code == GAF
    leave = LeaveGroupRequest(group_id="g", members=[LeaveGroupRequest.MemberIdentity(member_id="m")])
    assert send(broker, 13, 5, leave).error_code == GAF
    allow(broker, RT.GROUP, "g", Op.READ)
    # Allowed: the coordinator's own answer for a group it does not know.
    assert send(broker, 12, 4, HeartbeatRequest(group_id="g", generation_id=1, member_id="m")).error_code == (
        ErrorCode.UNKNOWN_MEMBER_ID
    )


def test_describe_list_and_delete_groups(broker: Broker) -> None:
    allow(broker, RT.GROUP, "seen", Op.DESCRIBE, Op.DELETE)
    for group in ("seen", "hidden"):
        broker.group_router.offsets.commit(group, {})
    described = send(
        broker, 15, 5, DescribeGroupsRequest(groups=["seen", "hidden"], include_authorized_operations=True)
    )
    assert [
        (g.group_id, g.error_code, g.error_message, g.group_state, g.authorized_operations) for g in described.groups
    ] == [
        ("hidden", GAF, "Group authorization failed.", "", NOT_REQUESTED),
        ("seen", ErrorCode.NONE, None, "Dead", bits(Op.DESCRIBE, Op.DELETE)),
    ]
    listed = send(broker, 16, 4, ListGroupsRequest())
    assert all(g.group_id != "hidden" for g in listed.groups)
    deleted = send(broker, 42, 2, DeleteGroupsRequest(groups_names=["hidden", "seen", "hidden"]))
    assert [(r.group_id, r.error_code) for r in deleted.results] == [
        ("seen", ErrorCode.GROUP_ID_NOT_FOUND),
        ("hidden", GAF),
    ]


def commit_request(group: str, topics: list[str]) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        topics=[
            OffsetCommitRequest.OffsetCommitRequestTopic(
                name=n,
                partitions=[OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=5)],
            )
            for n in topics
        ],
    )


def test_offset_commit_needs_group_read_then_topic_read(broker: Broker) -> None:
    refused = send(broker, 8, 9, commit_request("g", ["allowed"]))
    assert [(t.name, t.partitions[0].error_code) for t in refused.topics] == [("allowed", GAF)]
    allow(broker, RT.GROUP, "g", Op.READ)
    allow(broker, RT.TOPIC, "allowed", Op.READ)
    answer = send(broker, 8, 9, commit_request("g", ["allowed", "denied", "ghost"]))
    # As Kafka: the refused topics first (answered before the coordinator is asked).
    assert [(t.name, t.partitions[0].error_code) for t in answer.topics] == [
        ("denied", TAF),
        ("ghost", TAF),
        ("allowed", ErrorCode.NONE),
    ]
    assert set(broker.group_router.offsets.get("g")) == {("allowed", 0)}


def test_offset_fetch_refuses_or_hides_topics_without_describe(broker: Broker) -> None:
    allow(broker, RT.GROUP, "g", Op.READ)
    allow(broker, RT.TOPIC, "allowed", Op.READ)
    send(broker, 8, 9, commit_request("g", ["allowed"]), ADMIN)
    send(broker, 8, 9, commit_request("g", ["denied"]), ADMIN)
    named = OffsetFetchRequest(
        groups=[
            OffsetFetchRequest.OffsetFetchRequestGroup(
                group_id=group,
                topics=[
                    OffsetFetchRequest.OffsetFetchRequestTopics(name=n, partition_indexes=[0])
                    for n in ("denied", "allowed")
                ],
            )
            for group in ("g", "other")
        ]
    )
    answer = send(broker, 9, 8, named)
    group, other = answer.groups
    assert [(t.name, t.partitions[0].error_code, t.partitions[0].committed_offset) for t in group.topics] == [
        ("allowed", ErrorCode.NONE, 5),
        ("denied", TAF, -1),
    ]
    assert (other.group_id, other.error_code, other.topics) == ("other", GAF, [])
    every = OffsetFetchRequest(groups=[OffsetFetchRequest.OffsetFetchRequestGroup(group_id="g", topics=None)])
    assert [t.name for t in send(broker, 9, 8, every).groups[0].topics] == ["allowed"]
    legacy = send(broker, 9, 7, OffsetFetchRequest(group_id="other", topics=None))
    assert (legacy.error_code, legacy.topics) == (GAF, [])


def test_offset_delete_needs_group_delete_and_topic_read(broker: Broker) -> None:
    request = OffsetDeleteRequest(
        group_id="g",
        topics=[
            OffsetDeleteRequest.OffsetDeleteRequestTopic(
                name=n, partitions=[OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=0)]
            )
            for n in ("allowed", "denied")
        ],
    )
    assert (send(broker, 47, 0, request).error_code, send(broker, 47, 0, request).topics) == (GAF, [])
    allow(broker, RT.GROUP, "g", Op.DELETE)
    allow(broker, RT.TOPIC, "allowed", Op.READ)
    broker.group_router.offsets.commit("g", {})
    send(broker, 8, 9, commit_request("g", ["allowed"]), ADMIN)
    answer = send(broker, 47, 0, request)
    assert answer.error_code == ErrorCode.NONE
    assert [(t.name, t.partitions[0].error_code) for t in answer.topics] == [
        ("denied", TAF),
        ("allowed", ErrorCode.NONE),
    ]


def test_consumer_group_heartbeat_and_describe(broker: Broker) -> None:
    heartbeat = ConsumerGroupHeartbeatRequest(
        group_id="cg",
        member_id="member-one",
        member_epoch=0,
        rebalance_timeout_ms=5000,
        subscribed_topic_names=["allowed"],
        topic_partitions=[],
    )
    refused = send(broker, 68, 0, heartbeat)
    assert (refused.error_code, refused.error_message, refused.member_id) == (GAF, None, None)
    allow(broker, RT.GROUP, "cg", Op.READ)
    assert send(broker, 68, 0, heartbeat).error_code == TAF  # no DESCRIBE on the subscribed topic
    allow(broker, RT.TOPIC, "allowed", Op.DESCRIBE)
    joined = send(broker, 68, 0, heartbeat)
    assert (joined.error_code, joined.member_epoch) == (ErrorCode.NONE, 1)
    describe = ConsumerGroupDescribeRequest(group_ids=["nope", "cg"], include_authorized_operations=True)
    answer = send(broker, 69, 0, describe)
    assert [(g.group_id, g.error_code, g.authorized_operations) for g in answer.groups] == [
        ("nope", GAF, NOT_REQUESTED),
        ("cg", ErrorCode.NONE, bits(Op.READ, Op.DESCRIBE)),
    ]
    assert [m.member_id for m in answer.groups[1].members] == [joined.member_id]


def test_consumer_group_describe_hides_a_group_assigned_a_hidden_topic(broker: Broker) -> None:
    allow(broker, RT.GROUP, "cg", Op.READ)
    allow(broker, RT.TOPIC, "denied", Op.DESCRIBE)
    heartbeat = ConsumerGroupHeartbeatRequest(
        group_id="cg",
        member_id="member-two",
        member_epoch=0,
        rebalance_timeout_ms=5000,
        subscribed_topic_names=["denied"],
        topic_partitions=[],
    )
    assert send(broker, 68, 0, heartbeat).error_code == ErrorCode.NONE
    allow(broker, RT.TOPIC, "denied", Op.DESCRIBE, permission=AclPermissionType.DENY)
    (group,) = send(broker, 69, 0, ConsumerGroupDescribeRequest(group_ids=["cg"])).groups
    assert (group.error_code, group.error_message, group.members) == (
        TAF,
        "The group has described topic(s) that the client is not authorized to describe.",
        [],
    )


def test_consumer_group_regex_resolves_only_to_describable_topics(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka 4.3: a regex member is assigned only the matching topics its principal may DESCRIBE; the topics left
    out are not refusals of the request, so nothing is logged as a denial."""
    allow(broker, RT.GROUP, "cg", Op.READ)
    allow(broker, RT.TOPIC, "allowed", Op.DESCRIBE)
    ids = {info.name: info.topic_id for info in broker.topics.all()}
    heartbeat = ConsumerGroupHeartbeatRequest(
        group_id="cg",
        member_id="regex-member",
        member_epoch=0,
        rebalance_timeout_ms=5000,
        subscribed_topic_regex="allowed|denied",
        topic_partitions=[],
    )
    with caplog.at_level("INFO", logger="kbroker.authorizer"):
        joined = send(broker, 68, 1, heartbeat)
    assert (joined.error_code, joined.member_epoch) == (ErrorCode.NONE, 1)
    assert [(tp.topic_id, tp.partitions) for tp in joined.assignment.topic_partitions] == [(ids["allowed"], [0, 1])]
    assert [r for r in caplog.records if r.name == "kbroker.authorizer"] == []
    # A later grant counts on the member's next heartbeat, which does not repeat the regex.
    allow(broker, RT.TOPIC, "denied", Op.DESCRIBE)
    owned = [ConsumerGroupHeartbeatRequest.TopicPartitions(topic_id=ids["allowed"], partitions=[0, 1])]
    again = ConsumerGroupHeartbeatRequest(group_id="cg", member_id="regex-member", member_epoch=1)
    again.topic_partitions = owned
    later = send(broker, 68, 1, again)
    assert later.member_epoch == 2
    assigned = sorted((str(tp.topic_id), tp.partitions) for tp in later.assignment.topic_partitions)
    assert assigned == sorted([(str(ids["allowed"]), [0, 1]), (str(ids["denied"]), [0])])


# --- producer ids and transactions -----------------------------------------------------------------------------


def test_init_producer_id(broker: Broker) -> None:
    idempotent = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000)
    assert send(broker, 22, 4, idempotent).error_code == CAF
    allow(broker, RT.TOPIC, "some-", Op.WRITE, pattern=PatternType.PREFIXED)  # WRITE on any topic is enough
    answer = send(broker, 22, 4, idempotent)
    assert (answer.error_code, answer.producer_epoch) == (ErrorCode.NONE, 0)
    transactional = InitProducerIdRequest(transactional_id="txn", transaction_timeout_ms=60000)
    answer = send(broker, 22, 4, transactional)
    assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (TIAF, -1, -1)


def test_transaction_requests_need_write_on_the_transactional_id(broker: Broker) -> None:
    add = AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="txn",
        v3_and_below_producer_id=1,
        v3_and_below_producer_epoch=0,
        v3_and_below_topics=[
            AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=n, partitions=[0]) for n in ("allowed", "denied")
        ],
    )
    codes = [
        (t.name, t.results_by_partition[0].partition_error_code)
        for t in send(broker, 24, 3, add).results_by_topic_v3_and_below
    ]
    assert codes == [("allowed", TIAF), ("denied", TIAF)]
    allow(broker, RT.TRANSACTIONAL_ID, "txn", Op.WRITE)
    allow(broker, RT.TOPIC, "allowed", Op.WRITE)
    codes = [
        (t.name, t.results_by_partition[0].partition_error_code)
        for t in send(broker, 24, 3, add).results_by_topic_v3_and_below
    ]
    assert codes == [("allowed", ErrorCode.OPERATION_NOT_ATTEMPTED), ("denied", TAF)]
    batched = AddPartitionsToTxnRequest(transactions=[])
    assert send(broker, 24, 4, batched).error_code == CAF  # v4+ come from brokers: CLUSTER_ACTION
    assert (
        send(
            broker,
            25,
            3,
            AddOffsetsToTxnRequest(transactional_id="other", producer_id=1, producer_epoch=0, group_id="g"),
        ).error_code
        == TIAF
    )
    assert (
        send(
            broker, 25, 3, AddOffsetsToTxnRequest(transactional_id="txn", producer_id=1, producer_epoch=0, group_id="g")
        ).error_code
        == GAF
    )
    end = send(broker, 26, 3, EndTxnRequest(transactional_id="other", producer_id=1, producer_epoch=0, committed=True))
    assert (end.error_code, end.producer_id, end.producer_epoch) == (TIAF, -1, -1)


def test_txn_offset_commit(broker: Broker) -> None:
    def request(transactional_id: str) -> TxnOffsetCommitRequest:
        return TxnOffsetCommitRequest(
            transactional_id=transactional_id,
            group_id="g",
            producer_id=1,
            producer_epoch=0,
            topics=[
                TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(
                    name=n,
                    partitions=[
                        TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=1)
                    ],
                )
                for n in ("allowed", "ghost")
            ],
        )

    def codes(answer: Any) -> list[tuple[str, int]]:
        return [(t.name, t.partitions[0].error_code) for t in answer.topics]

    assert codes(send(broker, 28, 3, request("txn"))) == [("allowed", TIAF), ("ghost", TIAF)]
    allow(broker, RT.TRANSACTIONAL_ID, "txn", Op.WRITE)
    assert codes(send(broker, 28, 3, request("txn"))) == [("allowed", GAF), ("ghost", GAF)]
    allow(broker, RT.GROUP, "g", Op.READ)
    allow(broker, RT.TOPIC, "allowed", Op.READ)
    # The allowed topic gets the coordinator's answer (no such transaction), the other the refusal.
    assert codes(send(broker, 28, 3, request("txn"))) == [
        ("allowed", ErrorCode.INVALID_PRODUCER_ID_MAPPING),
        ("ghost", TAF),
    ]


def test_transaction_admin_filters_and_refuses(broker: Broker) -> None:
    allow(broker, RT.TRANSACTIONAL_ID, "mine", Op.WRITE)
    allow(broker, RT.TRANSACTIONAL_ID, "theirs", Op.WRITE, permission=AclPermissionType.ALLOW)
    for transactional_id in ("mine", "theirs"):
        answer = send(
            broker, 22, 4, InitProducerIdRequest(transactional_id=transactional_id, transaction_timeout_ms=60000)
        )
        assert answer.error_code == ErrorCode.NONE
    allow(broker, RT.TRANSACTIONAL_ID, "theirs", Op.DESCRIBE, permission=AclPermissionType.DENY)
    listed = send(broker, 66, 1, ListTransactionsRequest(state_filters=[], producer_id_filters=[], duration_filter=-1))
    assert [s.transactional_id for s in listed.transaction_states] == ["mine"]
    described = send(broker, 65, 0, DescribeTransactionsRequest(transactional_ids=["theirs", "mine"]))
    assert [(s.transactional_id, s.error_code, s.transaction_state) for s in described.transaction_states] == [
        ("theirs", TIAF, ""),
        ("mine", ErrorCode.NONE, "Empty"),
    ]


# --- configs, quotas, log dirs, the cluster's own APIs ---------------------------------------------------------


def test_describe_and_alter_configs(broker: Broker) -> None:
    allow(broker, RT.TOPIC, "allowed", Op.DESCRIBE_CONFIGS)
    describe = DescribeConfigsRequest(
        resources=[
            DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=rtype, resource_name=name, configuration_keys=None
            )
            for rtype, name in ((2, "ghost"), (4, ""), (2, "allowed"))
        ]
    )
    answer = send(broker, 32, 4, describe)
    assert [(r.resource_name, r.error_code, r.error_message, bool(r.configs)) for r in answer.results] == [
        ("allowed", ErrorCode.NONE, None, True),
        ("ghost", TAF, "Topic authorization failed.", False),
        ("", CAF, "Cluster authorization failed.", False),
    ]
    alter = AlterConfigsRequest(
        resources=[
            AlterConfigsRequest.AlterConfigsResource(resource_type=rtype, resource_name=name, configs=[])
            for rtype, name in ((2, "allowed"), (4, "1"))
        ]
    )
    assert [(r.error_code, r.error_message) for r in send(broker, 33, 2, alter).responses] == [
        (TAF, "Topic authorization failed."),
        (CAF, None),  # Kafka 4.4 leaves out a message that is only the error's default
    ]
    incremental = IncrementalAlterConfigsRequest(
        resources=[
            IncrementalAlterConfigsRequest.AlterConfigsResource(resource_type=rtype, resource_name=name, configs=[])
            for rtype, name in ((2, "ghost"), (8, "1"))
        ]
    )
    assert [r.error_code for r in send(broker, 44, 1, incremental).responses] == [TAF, CAF]
    allow(broker, RT.TOPIC, "allowed", Op.ALTER_CONFIGS)
    assert send(broker, 33, 2, alter).responses[0].error_code == ErrorCode.NONE


def test_cluster_level_apis_refuse_without_their_cluster_operation(broker: Broker) -> None:
    assert send(broker, 48, 1, DescribeClientQuotasRequest(components=[], strict=False)).error_code == CAF
    quota = AlterClientQuotasRequest(
        entries=[
            AlterClientQuotasRequest.EntryData(
                entity=[AlterClientQuotasRequest.EntityData(entity_type="user", entity_name="bob")],
                ops=[AlterClientQuotasRequest.OpData(key="producer_byte_rate", value=1024.0, remove=False)],
            )
        ]
    )
    assert [e.error_code for e in send(broker, 49, 1, quota).entries] == [CAF]
    logs = send(broker, 35, 4, DescribeLogDirsRequest(topics=None))
    assert (logs.error_code, logs.results) == (CAF, [])
    move = AlterReplicaLogDirsRequest(
        dirs=[
            AlterReplicaLogDirsRequest.AlterReplicaLogDir(
                path="/x", topics=[AlterReplicaLogDirsRequest.AlterReplicaLogDirTopic(name="allowed", partitions=[0])]
            )
        ]
    )
    assert [p.error_code for t in send(broker, 34, 2, move).results for p in t.partitions] == [CAF]
    elect = ElectLeadersRequest(
        election_type=0,
        timeout_ms=1000,
        topic_partitions=[ElectLeadersRequest.TopicPartitions(topic="allowed", partitions=[0])],
    )
    elected = send(broker, 43, 2, elect)
    assert (elected.error_code, elected.replica_election_results[0].partition_result[0].error_code) == (CAF, CAF)
    reassign = AlterPartitionReassignmentsRequest(timeout_ms=1000, topics=[])
    assert send(broker, 45, 0, reassign).error_code == CAF
    assert send(broker, 46, 0, ListPartitionReassignmentsRequest(timeout_ms=1000, topics=None)).error_code == CAF
    quorum = DescribeQuorumRequest(
        topics=[
            DescribeQuorumRequest.TopicData(
                topic_name="__cluster_metadata", partitions=[DescribeQuorumRequest.PartitionData(partition_index=0)]
            )
        ]
    )
    assert send(broker, 55, 2, quorum).error_code == CAF
    assert send(broker, 57, 1, UpdateFeaturesRequest(timeout_ms=1000, feature_updates=[])).error_code == CAF
    assert send(broker, 74, 1, ListConfigResourcesRequest(resource_types=[])).error_code == CAF
    allow(broker, RT.CLUSTER, "kafka-cluster", Op.DESCRIBE, Op.DESCRIBE_CONFIGS)
    assert send(broker, 35, 4, DescribeLogDirsRequest(topics=None)).error_code == ErrorCode.NONE
    assert (
        send(broker, 46, 0, ListPartitionReassignmentsRequest(timeout_ms=1000, topics=None)).error_code
        == ErrorCode.NONE
    )
    assert send(broker, 48, 1, DescribeClientQuotasRequest(components=[], strict=False)).error_code == ErrorCode.NONE
    assert send(broker, 74, 1, ListConfigResourcesRequest(resource_types=[])).error_code == ErrorCode.NONE


def test_super_users_and_deny_over_allow(broker: Broker) -> None:
    assert send(broker, 0, 9, produce_request(["denied"]), ADMIN).responses[0].partition_responses[0].error_code == 0
    allow(broker, RT.TOPIC, "*", Op.ALL)
    allow(broker, RT.TOPIC, "denied", Op.WRITE, permission=AclPermissionType.DENY)
    answer = send(broker, 0, 9, produce_request(["allowed", "denied"]))
    assert [t.partition_responses[0].error_code for t in answer.responses] == [ErrorCode.NONE, TAF]
    listing = send(broker, 3, 10, metadata(None, include_topic_authorized_operations=True))
    operations = {t.name: t.topic_authorized_operations for t in listing.topics}
    assert operations == {"allowed": ALL_TOPIC_OPERATIONS, "denied": ALL_TOPIC_OPERATIONS & ~bits(Op.WRITE)}


def test_offset_fetch_sets_aside_30000_refused_topics_in_linear_time(broker: Broker) -> None:
    allow(broker, RT.GROUP, "g", Op.DESCRIBE)
    allow(broker, RT.TOPIC, "allowed", Op.DESCRIBE)
    names = [f"denied-{i}" for i in range(30_000)] + ["allowed"]
    request = OffsetFetchRequest(
        groups=[
            OffsetFetchRequest.OffsetFetchRequestGroup(
                group_id="g",
                topics=[OffsetFetchRequest.OffsetFetchRequestTopics(name=n, partition_indexes=[0]) for n in names],
            )
        ]
    )
    started = time.perf_counter()
    answer = send(broker, 9, 8, request)
    took = time.perf_counter() - started
    assert [(t.name, t.partitions[0].error_code) for t in answer.groups[0].topics] == [("allowed", ErrorCode.NONE)] + [
        (name, TAF) for name in names[:-1]
    ]
    assert took < 4.0  # 0.3 s; the refused were set aside by a list scan per topic: 8 s
