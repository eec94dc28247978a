"""DescribeCluster (60) and DescribeTopicPartitions (75): what Java's admin client asks first.

Authorization as Kafka's: DescribeCluster's ``cluster_authorized_operations`` are computed from the ACLs (0 for a
principal that may not DESCRIBE the cluster); DescribeTopicPartitions lists only topics the principal may
DESCRIBE (a named one it may not is TOPIC_AUTHORIZATION_FAILED, after the others, whether it exists or not) and
gives each listed topic's ``topic_authorized_operations``.

Both answer from the metadata image as the request's listener sees it (kbroker/metadata/listener_view.py):
DescribeCluster lists every registered, unfenced broker with its endpoint on that listener and its rack (the fenced
ones too, marked, when v2 asks for them) and any unfenced broker as controller, as a KRaft broker does;
DescribeTopicPartitions gives each partition's leader (when registered with that listener), epochs, replicas, ISR,
ELR and offline replicas.
"""

from __future__ import annotations

import uuid

from kbroker.apis.context import RequestContext
from kbroker.apis.metadata import AUTHORIZED_OPERATIONS_NOT_REQUESTED
from kbroker.metadata.listener_view import broker_node, broker_nodes, offline_replicas, random_alive_broker
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from kbroker.topics import INTERNAL_TOPICS
from protocol.errors import ErrorCode
from protocol.messages.describe_cluster_request import DescribeClusterRequest
from protocol.messages.describe_cluster_response import DescribeClusterResponse
from protocol.messages.describe_topic_partitions_request import DescribeTopicPartitionsRequest
from protocol.messages.describe_topic_partitions_response import DescribeTopicPartitionsResponse

BROKERS_ENDPOINT = 1
CONTROLLERS_ENDPOINT = 2

TopicResult = DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponseTopic
PartitionResult = DescribeTopicPartitionsResponse.DescribeTopicPartitionsResponsePartition


async def handle_describe_cluster(ctx: RequestContext, request: DescribeClusterRequest) -> DescribeClusterResponse:
    if ctx.api_version >= 1 and request.endpoint_type != BROKERS_ENDPOINT:
        # Kafka's answers: a controller endpoint is the wrong kind of endpoint to ask, anything else unknown.
        if request.endpoint_type == CONTROLLERS_ENDPOINT:
            code = ErrorCode.MISMATCHED_ENDPOINT_TYPE
            message = "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type CONTROLLER"
        else:
            code, message = ErrorCode.UNSUPPORTED_ENDPOINT_TYPE, f"Unsupported endpoint type {request.endpoint_type}"
        return DescribeClusterResponse(
            error_code=code, error_message=message, endpoint_type=BROKERS_ENDPOINT, cluster_id=""
        )
    image = ctx.topics.image
    include_fenced = ctx.api_version >= 2 and request.include_fenced_brokers
    return DescribeClusterResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        endpoint_type=BROKERS_ENDPOINT,
        cluster_id=ctx.cluster.cluster_id,
        controller_id=random_alive_broker(image),
        brokers=[
            DescribeClusterResponse.DescribeClusterBroker(
                broker_id=node.node_id, host=node.host, port=node.port, rack=node.rack, is_fenced=node.fenced
            )
            for node in broker_nodes(image, ctx.listener, include_fenced=include_fenced)
        ],
        cluster_authorized_operations=_cluster_operations(ctx, request.include_cluster_authorized_operations),
    )


def _cluster_operations(ctx: RequestContext, requested: bool) -> int:
    if not requested:
        return AUTHORIZED_OPERATIONS_NOT_REQUESTED
    if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        return 0
    return ctx.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)


async def handle_describe_topic_partitions(
    ctx: RequestContext, request: DescribeTopicPartitionsRequest
) -> DescribeTopicPartitionsResponse:
    # An empty list means every topic; topics come back sorted by name so a cursor can resume.
    every_topic = not request.topics
    image = ctx.topics.image
    names = sorted({t.name for t in request.topics}) if request.topics else sorted(image.topics.by_name)
    cursor = request.cursor
    if cursor is not None:
        names = [n for n in names if n >= cursor.topic_name]
    # Not listed (every topic) or answered TOPIC_AUTHORIZATION_FAILED after the others (named ones), existing or not.
    denied = [n for n in names if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, n)]
    if denied:
        names = [n for n in names if n not in set(denied)]
    budget = max(request.response_partition_limit, 1)
    topics: list[TopicResult] = []
    next_cursor = None
    for name in names:
        info = image.topics.by_name.get(name)
        if info is None:
            topics.append(
                TopicResult(
                    error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    name=name,
                    topic_id=uuid.UUID(int=0),
                    partitions=[],
                    topic_authorized_operations=ctx.authorized_operations(ResourceType.TOPIC, name),
                )
            )
            continue
        first = cursor.partition_index if cursor is not None and cursor.topic_name == name else 0
        if budget == 0:
            next_cursor = DescribeTopicPartitionsResponse.Cursor(topic_name=name, partition_index=first)
            break
        count = len(info.partitions)
        last = min(count, first + budget)
        partitions = []
        for index in range(first, last):
            registration = info.partitions.get(index)
            if registration is None:
                continue
            # As Kafka: the leader named if it is registered with this listener, without an error either way.
            leader = broker_node(image, registration.leader, ctx.listener)
            partitions.append(
                PartitionResult(
                    error_code=ErrorCode.NONE,
                    partition_index=index,
                    leader_id=registration.leader if leader is not None else -1,
                    leader_epoch=registration.leader_epoch,
                    replica_nodes=list(registration.replicas),
                    isr_nodes=list(registration.isr),
                    eligible_leader_replicas=list(registration.eligible_leader_replicas),
                    last_known_elr=list(registration.last_known_elr),
                    offline_replicas=offline_replicas(image, registration, ctx.listener),
                )
            )
        budget -= len(partitions)
        topics.append(
            TopicResult(
                error_code=ErrorCode.NONE,
                name=name,
                topic_id=info.topic_id,
                is_internal=name in INTERNAL_TOPICS,
                partitions=partitions,
                topic_authorized_operations=ctx.authorized_operations(ResourceType.TOPIC, name),
            )
        )
        if last < count:
            next_cursor = DescribeTopicPartitionsResponse.Cursor(topic_name=name, partition_index=last)
            break
    if not every_topic:
        topics += [
            TopicResult(
                error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=name, topic_id=uuid.UUID(int=0), partitions=[]
            )
            for name in denied
        ]
    return DescribeTopicPartitionsResponse(throttle_time_ms=0, topics=topics, next_cursor=next_cursor)
