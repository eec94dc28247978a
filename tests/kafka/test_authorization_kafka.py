"""Authorization in every handler, compared with Apache Kafka 4.4 and its StandardAuthorizer: the same ACLs on
both brokers, the same requests, the same answers (codes, messages, which topics and groups are listed).

On PLAINTEXT every client is ``User:ANONYMOUS``, and so are Kafka's own node's requests to its controller, so the
brokers run with ``allow.everyone.if.no.acl.found=true`` (a resource without ACLs is open) and ``super.users``
naming nobody the test uses. The topics, offsets and ACLs are made before the ACLs close anything: one CreateAcls
request gives ANONYMOUS CLUSTER_ACTION on the cluster (which Kafka's node needs for itself; it also makes every
other cluster operation refused to ANONYMOUS, since the cluster now has ACLs), CREATE on Kafka's internal topics
(which its node creates as ANONYMOUS), READ on ``readonly``, CREATE on ``quiet-*``, and gives ``User:bob`` the
``closed`` topic, the ``secret-*`` topics, the ``closed-group`` group and the ``closed-txn`` transactional id, so
that ANONYMOUS may do nothing with them. Kafka applies ACLs a moment after answering, so the test waits until its
Metadata hides ``closed``.

Answers are compared as tuples of the fields that matter (not topic ids, ports or cluster ids); where Kafka lists
in the order of a Java hash set (its controller's CreateTopics and DeleteTopics, for instance), one name is asked
at a time or the answer is sorted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka, KafkaUnavailable
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.add_offsets_to_txn_request import AddOffsetsToTxnRequest
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.alter_client_quotas_request import AlterClientQuotasRequest
from protocol.messages.alter_configs_request import AlterConfigsRequest
from protocol.messages.alter_partition_reassignments_request import AlterPartitionReassignmentsRequest
from protocol.messages.alter_replica_log_dirs_request import AlterReplicaLogDirsRequest
from protocol.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest
from protocol.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest
from protocol.messages.create_acls_request import CreateAclsRequest
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
SETTINGS = {
    "authorizer.class.name": STANDARD,
    "allow.everyone.if.no.acl.found": "true",
    "super.users": "User:admin",
    "num.partitions": "1",
}
ANONYMOUS = "User:ANONYMOUS"
BOB = "User:bob"
# Codes: resource types TOPIC 2 GROUP 3 CLUSTER 4 TRANSACTIONAL_ID 5; patterns LITERAL 3 PREFIXED 4; operations
# ALL 2 READ 3 CREATE 5 CLUSTER_ACTION 9; permission ALLOW 3.
ACLS = [
    (4, "kafka-cluster", 3, ANONYMOUS, 9),
    (2, "__consumer_offsets", 3, ANONYMOUS, 5),
    (2, "__transaction_state", 3, ANONYMOUS, 5),
    (2, "readonly", 3, ANONYMOUS, 3),
    (2, "quiet-", 4, ANONYMOUS, 5),
    (2, "closed", 3, BOB, 2),
    (2, "secret-", 4, BOB, 2),
    (3, "closed-group", 3, BOB, 2),
    (5, "closed-txn", 3, BOB, 2),
]


def commit_request(group: str, topics: list[str]) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        topics=[
            OffsetCommitRequest.OffsetCommitRequestTopic(
                name=name,
                partitions=[OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=3)],
            )
            for name in topics
        ],
    )


def prepare(client: WireClient) -> None:
    """Topics and offsets while everything is open, then the ACLs that close some of them."""
    topics = CreateTopicsRequest(
        timeout_ms=30000,
        topics=[
            CreateTopicsRequest.CreatableTopic(name=name, num_partitions=1, replication_factor=1)
            for name in ("open", "readonly", "closed")
        ],
    )
    created = client.request(topics, 7)
    assert [t.error_code for t in created.topics] == [ErrorCode.NONE] * 3
    for group in ("open-group", "closed-group"):
        deadline = time.monotonic() + 60
        while True:  # Kafka creates its offsets topic when a coordinator is first looked for
            found = client.request(FindCoordinatorRequest(key_type=0, coordinator_keys=[group]), 4).coordinators[0]
            if found.error_code == ErrorCode.NONE or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        while True:  # and its first commit waits for that topic's partition to be loaded
            answer = client.request(commit_request(group, ["open", "closed"]), 9)
            codes = {p.error_code for t in answer.topics for p in t.partitions}
            if codes == {ErrorCode.NONE} or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert codes == {ErrorCode.NONE}
    creations = [
        CreateAclsRequest.AclCreation(
            resource_type=rtype,
            resource_name=name,
            resource_pattern_type=pattern,
            principal=principal,
            host="*",
            operation=operation,
            permission_type=3,
        )
        for rtype, name, pattern, principal, operation in ACLS
    ]
    answer = client.request(CreateAclsRequest(creations=creations), 3)
    assert [r.error_code for r in answer.results] == [ErrorCode.NONE] * len(ACLS)


def visible_topics(client: WireClient) -> set[str]:
    return {t.name for t in client.request(MetadataRequest(topics=None), 12).topics if t.name is not None}


@pytest.fixture(scope="module")
def clients(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, WireClient]]:
    try:
        kafka = ApacheKafka(tmp_path_factory.mktemp("kafka-authz"), SETTINGS, heap="512m").start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        with RunningBroker(tmp_path_factory.mktemp("kbroker-authz"), {**SETTINGS, "node.id": "1"}) as running:
            opened = {"kafka": WireClient(kafka.bootstrap), "kbroker": WireClient(running.bootstrap)}
            try:
                for client in opened.values():
                    prepare(client)
                deadline = time.monotonic() + 30
                while "closed" in visible_topics(opened["kafka"]) and time.monotonic() < deadline:
                    time.sleep(0.1)
                for client in opened.values():  # the ACLs are in force on both
                    assert visible_topics(client) >= {"open", "readonly"}
                    assert "closed" not in visible_topics(client)
                yield opened
            finally:
                for client in opened.values():
                    client.close()
    finally:
        kafka.stop()


def one_batch() -> bytes:
    return bytes(
        build_batch([Record(offset_delta=0, timestamp_delta=0, key=b"k", value=b"v")], base_timestamp=1_700_000_000_000)
    )


def topic_names(names: list[str]) -> list[MetadataRequest.MetadataRequestTopic]:
    return [MetadataRequest.MetadataRequestTopic(name=name) for name in names]


def partition_codes(topics: Any, name: str = "name", partitions: str = "partitions") -> list[tuple[str, int]]:
    return [(getattr(t, name), p.error_code) for t in topics for p in getattr(t, partitions)]


# Each scenario sends requests through one client and returns what is compared.
SCENARIOS: dict[str, Callable[[WireClient], Any]] = {}


def scenario(function: Callable[[WireClient], Any]) -> Callable[[WireClient], Any]:
    SCENARIOS[function.__name__] = function
    return function


@scenario
def metadata_all_topics(client: WireClient) -> Any:
    answer = client.request(MetadataRequest(topics=None, include_topic_authorized_operations=True), 12)
    return sorted((t.name, t.error_code, t.topic_authorized_operations) for t in answer.topics)


@scenario
def metadata_named_topics(client: WireClient) -> Any:
    request = MetadataRequest(
        topics=topic_names(["closed", "secret-ghost", "readonly", "ghost"]),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=True,
        include_topic_authorized_operations=True,
    )
    answer = client.request(request, 10)
    topics = [(t.name, t.error_code, len(t.partitions), t.topic_authorized_operations) for t in answer.topics]
    return topics, answer.cluster_authorized_operations


@scenario
def metadata_auto_creation_refused(client: WireClient) -> Any:
    answer = client.request(MetadataRequest(topics=topic_names(["quiet-one"]), allow_auto_topic_creation=True), 10)
    return [(t.name, t.error_code, t.topic_id.int == 0) for t in answer.topics]


@scenario
def produce(client: WireClient) -> Any:
    request = ProduceRequest(
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=name, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=one_batch())]
            )
            for name in ("readonly", "closed", "secret-ghost")
        ],
    )
    answer = client.request(request, 9)
    return sorted(partition_codes(answer.responses, partitions="partition_responses"))


@scenario
def fetch(client: WireClient) -> Any:
    request = FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[
            FetchRequest.FetchTopic(
                topic=name,
                partitions=[FetchRequest.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1024)],
            )
            for name in ("closed", "readonly", "secret-ghost")
        ],
    )
    answer = client.request(request, 12)
    return [(t.topic, p.error_code, p.high_watermark) for t in answer.responses for p in t.partitions]


@scenario
def list_offsets_and_epochs(client: WireClient) -> Any:
    offsets = ListOffsetsRequest(
        replica_id=-1,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name=name, partitions=[ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-2)]
            )
            for name in ("closed", "readonly")
        ],
    )
    listed = client.request(offsets, 7)
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
            for name in ("closed", "readonly")
        ],
    )
    ended = client.request(epochs, 4)
    return (
        [(t.name, p.error_code, p.offset) for t in listed.topics for p in t.partitions],
        [(t.topic, p.error_code, p.end_offset) for t in ended.topics for p in t.partitions],
    )


@scenario
def offset_commit(client: WireClient) -> Any:
    refused = client.request(commit_request("closed-group", ["open"]), 9)
    mixed = client.request(commit_request("open-group", ["open", "closed", "secret-ghost"]), 9)
    return partition_codes(refused.topics), partition_codes(mixed.topics)


@scenario
def offset_fetch(client: WireClient) -> Any:
    request = OffsetFetchRequest(
        groups=[
            OffsetFetchRequest.OffsetFetchRequestGroup(
                group_id=group,
                topics=[
                    OffsetFetchRequest.OffsetFetchRequestTopics(name=name, partition_indexes=[0])
                    for name in ("closed", "open")
                ],
            )
            for group in ("open-group", "closed-group")
        ]
        + [OffsetFetchRequest.OffsetFetchRequestGroup(group_id="open-group", topics=None)],
    )
    answer = client.request(request, 8)
    return [
        (
            g.group_id,
            g.error_code,
            [(t.name, p.error_code, p.committed_offset) for t in g.topics for p in t.partitions],
        )
        for g in answer.groups
    ]


@scenario
def find_coordinator(client: WireClient) -> Any:
    groups = client.request(FindCoordinatorRequest(key_type=0, coordinator_keys=["closed-group"]), 4)
    txns = client.request(FindCoordinatorRequest(key_type=1, coordinator_keys=["closed-txn"]), 4)
    old = client.request(FindCoordinatorRequest(key="closed-group", key_type=0), 3)
    return (
        [
            (c.key, c.error_code, c.error_message, c.node_id, c.host, c.port)
            for c in groups.coordinators + txns.coordinators
        ],
        (old.error_code, old.error_message, old.node_id, old.host, old.port),
    )


@scenario
def join_group(client: WireClient) -> Any:
    request = JoinGroupRequest(
        group_id="closed-group",
        session_timeout_ms=10000,
        rebalance_timeout_ms=10000,
        member_id="",
        protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")],
    )
    answer = client.request(request, 9)
    return answer.error_code, answer.generation_id, answer.member_id, answer.protocol_name, answer.leader


@scenario
def describe_list_delete_groups(client: WireClient) -> Any:
    described = client.request(
        DescribeGroupsRequest(groups=["closed-group", "open-group"], include_authorized_operations=True), 5
    )
    listed = client.request(ListGroupsRequest(), 4)
    deleted = client.request(DeleteGroupsRequest(groups_names=["closed-group"]), 2)
    return (
        [
            (g.group_id, g.error_code, g.error_message, g.group_state, g.protocol_type, g.authorized_operations)
            for g in described.groups
        ],
        sorted(g.group_id for g in listed.groups),
        [(r.group_id, r.error_code) for r in deleted.results],
    )


@scenario
def consumer_group_heartbeat(client: WireClient) -> Any:
    request = ConsumerGroupHeartbeatRequest(
        group_id="closed-group",
        member_id="m-1",
        member_epoch=0,
        rebalance_timeout_ms=5000,
        subscribed_topic_names=["open"],
        topic_partitions=[],
    )
    answer = client.request(request, 0)
    return answer.error_code, answer.error_message, answer.member_id, answer.member_epoch


@scenario
def consumer_group_regex_subscription(client: WireClient) -> Any:
    """A regex resolves only to the topics the subscribing principal may DESCRIBE: ``closed`` matches but is never
    assigned (Kafka resolves regexes in the background, so the member heartbeats until its assignment has topics)."""
    member_id = uuid.uuid4().hex
    request = ConsumerGroupHeartbeatRequest(
        group_id="regex-group",
        member_id=member_id,
        member_epoch=0,
        rebalance_timeout_ms=5000,
        subscribed_topic_regex="clo.*|open|readonly",
        topic_partitions=[],
    )
    assigned: dict[uuid.UUID, list[int]] = {}
    deadline = time.monotonic() + 30
    while True:
        answer = client.request(request, 1)
        assert answer.error_code == ErrorCode.NONE, answer
        if answer.assignment is not None:
            assigned = {tp.topic_id: list(tp.partitions) for tp in answer.assignment.topic_partitions}
        request.member_epoch = answer.member_epoch
        request.topic_partitions = [
            ConsumerGroupHeartbeatRequest.TopicPartitions(topic_id=topic_id, partitions=partitions)
            for topic_id, partitions in assigned.items()
        ]
        if len(assigned) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    # Metadata hides ``closed`` from this principal: had its id been assigned, it would show as "?".
    names = {t.topic_id: t.name for t in client.request(MetadataRequest(topics=None), 12).topics}
    left = ConsumerGroupHeartbeatRequest(group_id="regex-group", member_id=member_id, member_epoch=-1)
    assert client.request(left, 1).error_code == ErrorCode.NONE
    return sorted((names.get(topic_id, "?"), partitions) for topic_id, partitions in assigned.items())


@scenario
def create_topics(client: WireClient) -> Any:
    results = []
    for name in ("secret-new", "quiet-new"):
        request = CreateTopicsRequest(
            timeout_ms=30000,
            validate_only=True,
            topics=[CreateTopicsRequest.CreatableTopic(name=name, num_partitions=1, replication_factor=1)],
        )
        (topic,) = client.request(request, 7).topics
        results.append(
            (topic.name, topic.error_code, topic.error_message, topic.topic_config_error_code, topic.configs)
        )
    return results


@scenario
def delete_topics_and_partitions(client: WireClient) -> Any:
    deleted = [
        client.request(DeleteTopicsRequest(topic_names=[name], timeout_ms=30000), 5).responses[0]
        for name in ("readonly", "secret-ghost")
    ]
    grown = client.request(
        CreatePartitionsRequest(
            timeout_ms=30000,
            validate_only=True,
            topics=[CreatePartitionsRequest.CreatePartitionsTopic(name="readonly", count=2, assignments=None)],
        ),
        3,
    )
    records = client.request(
        DeleteRecordsRequest(
            timeout_ms=5000,
            topics=[
                DeleteRecordsRequest.DeleteRecordsTopic(
                    name="readonly",
                    partitions=[DeleteRecordsRequest.DeleteRecordsPartition(partition_index=0, offset=0)],
                )
            ],
        ),
        2,
    )
    return (
        [(r.name, r.error_code, r.error_message) for r in deleted],
        [(r.name, r.error_code, r.error_message) for r in grown.results],
        [(t.name, p.error_code, p.low_watermark) for t in records.topics for p in t.partitions],
    )


@scenario
def init_producer_id(client: WireClient) -> Any:
    transactional = client.request(
        InitProducerIdRequest(transactional_id="closed-txn", transaction_timeout_ms=60000), 4
    )
    return transactional.error_code, transactional.producer_id, transactional.producer_epoch


@scenario
def transactions_admin(client: WireClient) -> Any:
    described = client.request(DescribeTransactionsRequest(transactional_ids=["closed-txn"]), 0)
    return [
        (s.transactional_id, s.error_code, s.transaction_state, s.producer_id, s.topics)
        for s in described.transaction_states
    ]


@scenario
def describe_producers(client: WireClient) -> Any:
    request = DescribeProducersRequest(
        topics=[DescribeProducersRequest.TopicRequest(name=name, partition_indexes=[0]) for name in ("closed", "open")]
    )
    answer = client.request(request, 0)
    return [(t.name, p.error_code, p.error_message) for t in answer.topics for p in t.partitions]


@scenario
def configs(client: WireClient) -> Any:
    described = client.request(
        DescribeConfigsRequest(
            resources=[
                DescribeConfigsRequest.DescribeConfigsResource(
                    resource_type=rt, resource_name=name, configuration_keys=[]
                )
                for rt, name in ((2, "closed"), (4, "1"), (2, "secret-ghost"))
            ]
        ),
        4,
    )
    altered = client.request(
        IncrementalAlterConfigsRequest(
            resources=[
                IncrementalAlterConfigsRequest.AlterConfigsResource(resource_type=2, resource_name="closed", configs=[])
            ]
        ),
        1,
    )
    return (
        sorted((r.resource_type, r.resource_name, r.error_code, r.error_message) for r in described.results),
        [(r.resource_name, r.error_code, r.error_message) for r in altered.responses],
    )


@scenario
def cluster_level(client: WireClient) -> Any:
    cluster = client.request(DescribeClusterRequest(include_cluster_authorized_operations=True), 1)
    logs = client.request(DescribeLogDirsRequest(topics=None), 4)
    quotas = client.request(DescribeClientQuotasRequest(components=[], strict=False), 1)
    elected = client.request(
        ElectLeadersRequest(
            election_type=0,
            timeout_ms=5000,
            topic_partitions=[ElectLeadersRequest.TopicPartitions(topic="open", partitions=[0])],
        ),
        2,
    )
    return (
        (cluster.error_code, cluster.cluster_authorized_operations),
        (logs.error_code, logs.results),
        (quotas.error_code, quotas.error_message, quotas.entries),
        (elected.error_code, [p.error_code for r in elected.replica_election_results for p in r.partition_result]),
    )


@scenario
def describe_topic_partitions(client: WireClient) -> Any:
    request = DescribeTopicPartitionsRequest(
        topics=[
            DescribeTopicPartitionsRequest.TopicRequest(name=name)
            for name in ("closed", "readonly", "secret-ghost", "ghost")
        ],
        response_partition_limit=100,
    )
    answer = client.request(request, 0)
    return [(t.name, t.error_code, len(t.partitions), t.topic_authorized_operations) for t in answer.topics]


@scenario
def classic_group_refusals(client: WireClient) -> Any:
    sync = client.request(
        SyncGroupRequest(
            group_id="closed-group",
            generation_id=1,
            member_id="m",
            protocol_type="consumer",
            protocol_name="range",
            assignments=[],
        ),
        5,
    )
    incomplete = client.request(  # from v5 the protocol is mandatory, checked before authorization
        SyncGroupRequest(group_id="closed-group", generation_id=1, member_id="m", assignments=[]), 5
    )
    beat = client.request(HeartbeatRequest(group_id="closed-group", generation_id=1, member_id="m"), 4)
    leave = client.request(
        LeaveGroupRequest(group_id="closed-group", members=[LeaveGroupRequest.MemberIdentity(member_id="m")]), 5
    )
    return (
        (sync.error_code, sync.protocol_type, sync.protocol_name, sync.assignment),
        (incomplete.error_code, incomplete.protocol_type, incomplete.protocol_name),
        beat.error_code,
        (leave.error_code, [(m.member_id, m.error_code) for m in leave.members]),
    )


@scenario
def offset_delete(client: WireClient) -> Any:
    def request(group: str) -> OffsetDeleteRequest:
        return OffsetDeleteRequest(
            group_id=group,
            topics=[
                OffsetDeleteRequest.OffsetDeleteRequestTopic(
                    name=name, partitions=[OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=0)]
                )
                for name in ("closed",)
            ],
        )

    refused = client.request(request("closed-group"), 0)
    mixed = client.request(request("open-group"), 0)
    return (
        (refused.error_code, partition_codes(refused.topics)),
        (mixed.error_code, partition_codes(mixed.topics)),
    )


@scenario
def consumer_group_describe(client: WireClient) -> Any:
    answer = client.request(
        ConsumerGroupDescribeRequest(group_ids=["closed-group"], include_authorized_operations=True), 0
    )
    return [(g.group_id, g.error_code, g.error_message, g.group_state, g.authorized_operations) for g in answer.groups]


@scenario
def transaction_refusals(client: WireClient) -> Any:
    add = client.request(
        AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="closed-txn",
            v3_and_below_producer_id=1,
            v3_and_below_producer_epoch=0,
            v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name="open", partitions=[0])],
        ),
        3,
    )
    offsets = client.request(
        AddOffsetsToTxnRequest(transactional_id="closed-txn", producer_id=1, producer_epoch=0, group_id="g"), 3
    )
    end = client.request(
        EndTxnRequest(transactional_id="closed-txn", producer_id=1, producer_epoch=0, committed=True), 3
    )
    commit = client.request(
        TxnOffsetCommitRequest(
            transactional_id="closed-txn",
            group_id="open-group",
            producer_id=1,
            producer_epoch=0,
            topics=[
                TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(
                    name="open",
                    partitions=[
                        TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=1)
                    ],
                )
            ],
        ),
        3,
    )
    listed = client.request(ListTransactionsRequest(state_filters=[], producer_id_filters=[], duration_filter=-1), 1)
    return (
        [(t.name, p.partition_error_code) for t in add.results_by_topic_v3_and_below for p in t.results_by_partition],
        offsets.error_code,
        (end.error_code, end.producer_id, end.producer_epoch),
        partition_codes(commit.topics),
        (listed.error_code, [t.transactional_id for t in listed.transaction_states]),
    )


@scenario
def cluster_alterations(client: WireClient) -> Any:
    legacy = client.request(
        AlterConfigsRequest(
            resources=[AlterConfigsRequest.AlterConfigsResource(resource_type=4, resource_name="", configs=[])]
        ),
        2,
    )
    quotas = client.request(
        AlterClientQuotasRequest(
            entries=[
                AlterClientQuotasRequest.EntryData(
                    entity=[AlterClientQuotasRequest.EntityData(entity_type="user", entity_name="bob")],
                    ops=[AlterClientQuotasRequest.OpData(key="producer_byte_rate", value=1024.0, remove=False)],
                )
            ],
            validate_only=True,
        ),
        1,
    )
    moved = client.request(
        AlterReplicaLogDirsRequest(
            dirs=[
                AlterReplicaLogDirsRequest.AlterReplicaLogDir(
                    path="/nowhere",
                    topics=[AlterReplicaLogDirsRequest.AlterReplicaLogDirTopic(name="open", partitions=[0])],
                )
            ]
        ),
        2,
    )
    reassigned = client.request(
        AlterPartitionReassignmentsRequest(
            timeout_ms=5000,
            topics=[
                AlterPartitionReassignmentsRequest.ReassignableTopic(
                    name="open",
                    partitions=[
                        AlterPartitionReassignmentsRequest.ReassignablePartition(partition_index=0, replicas=None)
                    ],
                )
            ],
        ),
        0,
    )
    incremental = client.request(
        IncrementalAlterConfigsRequest(
            resources=[
                IncrementalAlterConfigsRequest.AlterConfigsResource(resource_type=4, resource_name="", configs=[])
            ]
        ),
        1,
    )
    listed = client.request(ListPartitionReassignmentsRequest(timeout_ms=5000, topics=None), 0)
    features = client.request(UpdateFeaturesRequest(timeout_ms=5000, feature_updates=[], validate_only=True), 1)
    resources = client.request(ListConfigResourcesRequest(resource_types=[]), 1)
    return (
        [(r.error_code, r.error_message) for r in legacy.responses],
        [(r.error_code, r.error_message) for r in incremental.responses],
        [e.error_code for e in quotas.entries],
        partition_codes(moved.results, name="topic_name"),
        (reassigned.error_code, partition_codes(reassigned.responses)),
        (listed.error_code, listed.topics),
        (features.error_code, features.results),
        (resources.error_code, resources.config_resources),
    )


@scenario
def describe_quorum(client: WireClient) -> Any:
    answer = client.request(
        DescribeQuorumRequest(
            topics=[
                DescribeQuorumRequest.TopicData(
                    topic_name="__cluster_metadata",
                    partitions=[DescribeQuorumRequest.PartitionData(partition_index=0)],
                )
            ]
        ),
        2,
    )
    return answer.error_code, answer.topics


@scenario
def idempotent_producer_id(client: WireClient) -> Any:
    # No IDEMPOTENT_WRITE on the cluster (which has ACLs), but some topic may be written (KIP-679).
    deadline = time.monotonic() + 30
    while True:  # Kafka's first producer id waits for its block (COORDINATOR_LOAD_IN_PROGRESS, retriable)
        answer = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000), 4)
        if answer.error_code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS or time.monotonic() > deadline:
            return answer.error_code, answer.producer_epoch
        time.sleep(0.2)


@scenario
def metadata_by_topic_id(client: WireClient) -> Any:
    everything = client.request(MetadataRequest(topics=None), 12)
    assert everything.topics
    answer = client.request(
        MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=None, topic_id=uuid.uuid4())]), 12
    )
    return [(t.name, t.error_code) for t in answer.topics]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_answer_as_kafka(clients: dict[str, WireClient], name: str) -> None:
    run = SCENARIOS[name]
    kafka, kbroker = run(clients["kafka"]), run(clients["kbroker"])
    assert kbroker == kafka


def test_without_an_authorizer_every_supported_operation(apache_kafka: ApacheKafka, broker: RunningBroker) -> None:
    """No authorizer: Kafka reports every operation a resource type supports (a group's include DESCRIBE_CONFIGS
    and ALTER_CONFIGS in Kafka 4.3)."""

    def operations(client: WireClient) -> Any:
        topic = f"ops-{uuid.uuid4().hex[:8]}"
        created = CreateTopicsRequest(
            timeout_ms=30000,
            topics=[CreateTopicsRequest.CreatableTopic(name=topic, num_partitions=1, replication_factor=1)],
        )
        assert client.request(created, 7).topics[0].error_code == ErrorCode.NONE
        metadata = client.request(
            MetadataRequest(
                topics=topic_names([topic]),
                include_cluster_authorized_operations=True,
                include_topic_authorized_operations=True,
            ),
            10,
        )
        cluster = client.request(DescribeClusterRequest(include_cluster_authorized_operations=True), 1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # Kafka's group coordinator first needs its offsets topic
            found = client.request(FindCoordinatorRequest(key_type=0, coordinator_keys=["nobody"]), 4)
            if found.coordinators[0].error_code == ErrorCode.NONE:
                break
            time.sleep(0.2)
        not_ready = (
            ErrorCode.NOT_COORDINATOR,
            ErrorCode.COORDINATOR_NOT_AVAILABLE,
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        )
        while True:  # then loads it: Kafka 4.4's coordinator is not ready yet a moment after FindCoordinator found it
            groups = client.request(DescribeGroupsRequest(groups=["nobody"], include_authorized_operations=True), 5)
            loading = groups.groups[0].error_code in not_ready
            if not loading or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        return (
            metadata.topics[0].topic_authorized_operations,
            metadata.cluster_authorized_operations,
            cluster.cluster_authorized_operations,
            [(g.error_code, g.group_state, g.authorized_operations) for g in groups.groups],
        )

    with WireClient(apache_kafka.bootstrap) as kafka, WireClient(broker.bootstrap) as kbroker:
        assert operations(kbroker) == operations(kafka)
