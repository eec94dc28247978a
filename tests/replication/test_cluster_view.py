"""What clients see of a cluster of several brokers, answered from the metadata image as Kafka's KRaftMetadataCache
answers it: Metadata and DescribeCluster list the registered, unfenced brokers with an endpoint on the request's
listener; partitions name their leader, epochs, replicas, ISR and offline replicas (LEADER_NOT_AVAILABLE without a
leader, LISTENER_NOT_FOUND for a leader without the listener); a produce or fetch of a partition another broker
leads, which this broker holds no replica of, is NOT_LEADER_OR_FOLLOWER naming that leader (KIP-951);
FindCoordinator names the leader of the key's internal partition, and the coordinator's requests on another
broker answer NOT_COORDINATOR. One broker (node 0) in memory, the others registered in its image."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.apis.cluster import handle_describe_cluster, handle_describe_topic_partitions
from kbroker.apis.fetch import handle_fetch
from kbroker.apis.groups import handle_find_coordinator, handle_join_group
from kbroker.apis.list_offsets import handle_list_offsets
from kbroker.apis.metadata import handle_metadata
from kbroker.apis.produce import handle_produce
from kbroker.apis.producer_ids import handle_init_producer_id
from kbroker.apis.topics import handle_create_topics
from kbroker.broker import Broker
from kbroker.groups.offsets import OFFSETS_TOPIC
from kbroker.java_hashing import coordinator_partition
from kbroker.metadata.controller import LocalController, record
from kbroker.transactions.state_log import TRANSACTION_TOPIC
from protocol._codec import Message
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.describe_cluster_request import DescribeClusterRequest
from protocol.messages.describe_topic_partitions_request import DescribeTopicPartitionsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.messages.join_group_request import JoinGroupRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.metadata_response import MetadataResponse
from protocol.messages.produce_request import ProduceRequest
from protocol.metadata_records.partition_change_record import PartitionChangeRecord
from protocol.metadata_records.register_broker_record import BrokerEndpoint, RegisterBrokerRecord
from protocol.metadata_records.unfence_broker_record import UnfenceBrokerRecord
from tests.broker.test_handlers_in_memory import batch, context, run
from tests.replication.conftest import NODE, in_memory_broker

RACKED, FENCED, INTERNAL_ONLY, UNKNOWN = 1, 2, 3, 9
TOPIC = "spread"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    internal_partitions = {"offsets.topic.num.partitions": "2", "transaction.state.log.num.partitions": "2"}
    with in_memory_broker(tmp_path / "data", internal_partitions) as broker:
        register(broker, RACKED, "PLAINTEXT", "racked.example", 19001, rack="r1")
        register(broker, FENCED, "PLAINTEXT", "fenced.example", 19002, fenced=True)
        register(broker, INTERNAL_ONLY, "INTERNAL", "internal.example", 19003)
        yield broker


def commit(broker: Broker, *records: Message) -> None:
    """Commit ``records`` through the broker's controller (so later controller operations build on them) and
    publish them, as a KRaft controller quorum's committed records reach its brokers."""
    assert isinstance(broker.controller, LocalController)
    broker.controller.commit_now([record(r) for r in records], transaction="test")


def register(
    broker: Broker,
    broker_id: int,
    listener: str,
    host: str,
    port: int,
    *,
    rack: str | None = None,
    fenced: bool = False,
) -> None:
    """A broker registered (and unfenced unless ``fenced``) as a KRaft controller records it."""
    endpoint = BrokerEndpoint(name=listener, host=host, port=port, security_protocol=0)
    registration = RegisterBrokerRecord(
        broker_id=broker_id,
        incarnation_id=uuid.UUID(int=broker_id + 100),
        broker_epoch=broker_id + 10,
        end_points=[endpoint],
        features=[],
        rack=rack,
        fenced=True,
        log_dirs=[],
    )
    if fenced:
        commit(broker, registration)
    else:
        commit(broker, registration, UnfenceBrokerRecord(id=broker_id, epoch=broker_id + 10))


def create(broker: Broker, name: str, partitions: int) -> None:
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1)
    answer = run(lambda: handle_create_topics(context(broker, 19, 7), CreateTopicsRequest(topics=[topic])))
    assert answer.topics[0].error_code == ErrorCode.NONE


def place(broker: Broker, name: str, index: int, replicas: list[int], leader: int) -> None:
    """Give a partition these replicas (all in sync) and leader, as the controller would record a reassignment."""
    topic_id = broker.metadata.image.topics.by_name[name].topic_id
    commit(
        broker,
        PartitionChangeRecord(partition_id=index, topic_id=topic_id, leader=leader, replicas=replicas, isr=replicas),
    )


@pytest.fixture
def spread(broker: Broker) -> Broker:
    """TOPIC's partitions: 0 on node 0 itself, 1 led by the racked broker (node 0 a follower), 2 led by the broker
    with no PLAINTEXT listener, 3 without a leader, 4 led by the fenced broker with an unknown replica."""
    create(broker, TOPIC, 5)
    place(broker, TOPIC, 1, [RACKED, NODE], RACKED)
    place(broker, TOPIC, 2, [INTERNAL_ONLY], INTERNAL_ONLY)
    place(broker, TOPIC, 3, [RACKED], -1)
    place(broker, TOPIC, 4, [FENCED, UNKNOWN], FENCED)
    return broker


def metadata(broker: Broker, version: int) -> MetadataResponse:
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)])
    answer: MetadataResponse = run(lambda: handle_metadata(context(broker, 3, version), request))
    return answer


def partitions(answer: MetadataResponse) -> list[tuple[int, int, int, int, list[int], list[int], list[int]]]:
    [topic] = answer.topics
    return [
        (p.partition_index, p.error_code, p.leader_id, p.leader_epoch, p.replica_nodes, p.isr_nodes, p.offline_replicas)
        for p in topic.partitions
    ]


def test_metadata_lists_the_unfenced_brokers_of_the_listener_and_each_partitions_leader(spread: Broker) -> None:
    answer = metadata(spread, 12)
    # The fenced broker and the one without a PLAINTEXT listener are not listed; the rack is the registration's.
    assert [(b.node_id, b.host, b.port, b.rack) for b in answer.brokers] == [
        (NODE, "localhost", 9092, None),
        (RACKED, "racked.example", 19001, "r1"),
    ]
    # As a KRaft broker: any unfenced broker, chosen at random, listener or not.
    assert answer.controller_id in (NODE, RACKED, INTERNAL_ONLY)
    assert partitions(answer) == [
        (0, ErrorCode.NONE, NODE, 0, [NODE], [NODE], []),
        (1, ErrorCode.NONE, RACKED, 1, [RACKED, NODE], [RACKED, NODE], []),
        (2, ErrorCode.LISTENER_NOT_FOUND, -1, 1, [INTERNAL_ONLY], [INTERNAL_ONLY], [INTERNAL_ONLY]),
        (3, ErrorCode.LEADER_NOT_AVAILABLE, -1, 1, [RACKED], [RACKED], []),
        # As Kafka's: a fenced leader is still named; its replicas on fenced or unknown brokers are offline.
        (4, ErrorCode.NONE, FENCED, 1, [FENCED, UNKNOWN], [FENCED, UNKNOWN], [FENCED, UNKNOWN]),
    ]
    # Before v6 a leader without the listener is LEADER_NOT_AVAILABLE; v0 lists only reachable replicas.
    assert partitions(metadata(spread, 5))[2][1] == ErrorCode.LEADER_NOT_AVAILABLE
    oldest = partitions(metadata(spread, 0))
    assert oldest[1] == (1, ErrorCode.NONE, RACKED, 1, [RACKED, NODE], [RACKED, NODE], [])
    assert oldest[4] == (4, ErrorCode.REPLICA_NOT_AVAILABLE, FENCED, 1, [], [], [FENCED, UNKNOWN])


def test_metadata_on_another_listener_names_that_listeners_endpoints(spread: Broker) -> None:
    ctx = context(spread, 3, 12)
    ctx.listener = "INTERNAL"
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)])
    answer = run(lambda: handle_metadata(ctx, request))
    assert [(b.node_id, b.host, b.port) for b in answer.brokers] == [(INTERNAL_ONLY, "internal.example", 19003)]
    assert [(p.partition_index, p.error_code, p.leader_id) for p in answer.topics[0].partitions][:3] == [
        (0, ErrorCode.LISTENER_NOT_FOUND, -1),
        (1, ErrorCode.LISTENER_NOT_FOUND, -1),
        (2, ErrorCode.NONE, INTERNAL_ONLY),
    ]


def test_describe_cluster_lists_the_same_brokers_and_the_fenced_ones_when_asked(spread: Broker) -> None:
    answer = run(lambda: handle_describe_cluster(context(spread, 60, 1), DescribeClusterRequest()))
    assert [(b.broker_id, b.host, b.port, b.rack, b.is_fenced) for b in answer.brokers] == [
        (NODE, "localhost", 9092, None, False),
        (RACKED, "racked.example", 19001, "r1", False),
    ]
    assert answer.controller_id in (NODE, RACKED, INTERNAL_ONLY)
    with_fenced = DescribeClusterRequest(include_fenced_brokers=True)
    answer = run(lambda: handle_describe_cluster(context(spread, 60, 2), with_fenced))
    assert [(b.broker_id, b.is_fenced) for b in answer.brokers] == [(NODE, False), (RACKED, False), (FENCED, True)]


def test_describe_topic_partitions_names_leaders_registered_with_the_listener(spread: Broker) -> None:
    request = DescribeTopicPartitionsRequest(topics=[DescribeTopicPartitionsRequest.TopicRequest(name=TOPIC)])
    answer = run(lambda: handle_describe_topic_partitions(context(spread, 75, 0), request))
    [topic] = answer.topics
    assert [
        (p.partition_index, p.error_code, p.leader_id, p.leader_epoch, p.offline_replicas) for p in topic.partitions
    ] == [
        (0, ErrorCode.NONE, NODE, 0, []),
        (1, ErrorCode.NONE, RACKED, 1, []),
        (2, ErrorCode.NONE, -1, 1, [INTERNAL_ONLY]),
        (3, ErrorCode.NONE, -1, 1, []),
        (4, ErrorCode.NONE, FENCED, 1, [FENCED, UNKNOWN]),
    ]


def test_produce_and_fetch_of_a_partition_with_no_replica_here_name_its_leader(spread: Broker) -> None:
    place(spread, TOPIC, 1, [RACKED], RACKED)  # node 0 no longer a replica of partition 1
    assert spread.replicas.partition(TOPIC, 1) is None
    data = [ProduceRequest.PartitionProduceData(index=1, records=batch([b"misdirected"]))]
    request = ProduceRequest(
        acks=1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=TOPIC, partition_data=data)]
    )
    answer = run(lambda: handle_produce(context(spread, 0, 11), request))
    assert answer is not None
    [refused] = answer.responses[0].partition_responses
    assert (refused.error_code, refused.base_offset) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)
    assert (refused.current_leader.leader_id, refused.current_leader.leader_epoch) == (RACKED, 2)
    assert [(n.node_id, n.host, n.port, n.rack) for n in answer.node_endpoints] == [
        (RACKED, "racked.example", 19001, "r1")
    ]
    # A partition that does not exist stays UNKNOWN_TOPIC_OR_PARTITION, naming nobody.
    missing = [ProduceRequest.PartitionProduceData(index=7, records=batch([b"nowhere"]))]
    request = ProduceRequest(
        acks=1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=TOPIC, partition_data=missing)]
    )
    answer = run(lambda: handle_produce(context(spread, 0, 11), request))
    assert answer is not None
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert answer.node_endpoints == []

    topic_id = spread.metadata.image.topics.by_name[TOPIC].topic_id
    fetch = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[
            FetchRequest.FetchTopic(
                topic_id=topic_id,
                partitions=[FetchRequest.FetchPartition(partition=1, fetch_offset=0, partition_max_bytes=1 << 20)],
            )
        ],
    )
    fetched = run(lambda: handle_fetch(context(spread, 1, 16), fetch))
    [data_answer] = fetched.responses[0].partitions
    assert data_answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert (data_answer.current_leader.leader_id, data_answer.current_leader.leader_epoch) == (RACKED, 2)
    assert [(n.node_id, n.host, n.port) for n in fetched.node_endpoints] == [(RACKED, "racked.example", 19001)]
    # ListOffsets of it: NOT_LEADER_OR_FOLLOWER too (of a partition that does not exist, UNKNOWN_TOPIC_OR_PARTITION).
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=i, timestamp=-1) for i in (1, 7)]
    offsets = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=TOPIC, partitions=wanted)]
    )
    listed = run(lambda: handle_list_offsets(context(spread, 2, 7), offsets)).topics[0].partitions
    assert [(p.partition_index, p.error_code) for p in listed] == [
        (1, ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]


def test_find_coordinator_names_the_internal_partitions_leader_and_others_answer_not_coordinator(
    broker: Broker,
) -> None:
    # The first FindCoordinator creates __consumer_offsets (placed by the controller); both partitions then led here.
    request = FindCoordinatorRequest(key_type=0, coordinator_keys=["g0", "g1"])
    run(lambda: handle_find_coordinator(context(broker, 10, 4), request))
    place(broker, OFFSETS_TOPIC, 0, [NODE], NODE)
    place(broker, OFFSETS_TOPIC, 1, [NODE], NODE)
    first = run(lambda: handle_find_coordinator(context(broker, 10, 4), request))
    assert [(c.error_code, c.node_id) for c in first.coordinators] == [(ErrorCode.NONE, NODE), (ErrorCode.NONE, NODE)]
    # The group's partition moves to the racked broker: its endpoint is named, and this broker's shard unloads.
    [elsewhere] = [g for g in ("g0", "g1", "g2", "g3") if coordinator_partition(g, 2) == 1][:1]
    [here] = [g for g in ("g0", "g1", "g2", "g3") if coordinator_partition(g, 2) == 0][:1]
    place(broker, OFFSETS_TOPIC, 1, [RACKED], RACKED)
    assert 1 not in broker.offsets.runtime.shards and 0 in broker.offsets.runtime.shards
    request = FindCoordinatorRequest(key_type=0, coordinator_keys=[here, elsewhere])
    answer = run(lambda: handle_find_coordinator(context(broker, 10, 4), request))
    assert [(c.key, c.error_code, c.node_id, c.host, c.port) for c in answer.coordinators] == [
        (here, ErrorCode.NONE, NODE, "localhost", 9092),
        (elsewhere, ErrorCode.NONE, RACKED, "racked.example", 19001),
    ]
    join = JoinGroupRequest(
        group_id=elsewhere,
        session_timeout_ms=10000,
        rebalance_timeout_ms=10000,
        member_id="",
        protocol_type="consumer",
    )
    with pytest.raises(KafkaError) as refused:
        run(lambda: handle_join_group(context(broker, 11, 9), join))
    assert refused.value.code == ErrorCode.NOT_COORDINATOR
    # A leaderless partition, or one led by a broker without this listener: not available, nobody named.
    place(broker, OFFSETS_TOPIC, 1, [RACKED], -1)
    answer = run(lambda: handle_find_coordinator(context(broker, 10, 4), request))
    assert [(c.error_code, c.node_id) for c in answer.coordinators] == [
        (ErrorCode.NONE, NODE),
        (ErrorCode.COORDINATOR_NOT_AVAILABLE, -1),
    ]
    place(broker, OFFSETS_TOPIC, 1, [INTERNAL_ONLY], INTERNAL_ONLY)
    answer = run(lambda: handle_find_coordinator(context(broker, 10, 4), request))
    assert answer.coordinators[1].error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE


def test_a_transactional_id_coordinated_elsewhere_answers_not_coordinator(broker: Broker) -> None:
    request = FindCoordinatorRequest(key_type=1, coordinator_keys=["t0"])
    run(lambda: handle_find_coordinator(context(broker, 10, 4), request))  # creates __transaction_state
    partition = broker.transactions.partition_for("t0")
    place(broker, TRANSACTION_TOPIC, partition, [NODE], NODE)
    answer = run(lambda: handle_find_coordinator(context(broker, 10, 4), request))
    assert [(c.error_code, c.node_id) for c in answer.coordinators] == [(ErrorCode.NONE, NODE)]
    init = InitProducerIdRequest(transactional_id="t0", transaction_timeout_ms=60000)
    assert run(lambda: handle_init_producer_id(context(broker, 22, 4), init)).error_code == ErrorCode.NONE
    place(broker, TRANSACTION_TOPIC, partition, [RACKED], RACKED)
    answer = run(lambda: handle_find_coordinator(context(broker, 10, 4), request))
    assert [(c.error_code, c.node_id, c.port) for c in answer.coordinators] == [(ErrorCode.NONE, RACKED, 19001)]
    assert run(lambda: handle_init_producer_id(context(broker, 22, 4), init)).error_code == ErrorCode.NOT_COORDINATOR
