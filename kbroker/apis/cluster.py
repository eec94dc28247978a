"""DescribeCluster (60) and DescribeTopicPartitions (75): what Java's admin client asks first.

Authorization as Kafka's: DescribeCluster's ``cluster_authorized_operations`` are computed from the ACLs (0 for a
principal that may not DESCRIBE the cluster); DescribeTopicPartitions lists only topics the principal may
DESCRIBE (a named one it may not is TOPIC_AUTHORIZATION_FAILED, after the others, whether it exists or not) and
gives each listed topic's ``topic_authorized_operations``.
"""

from __future__ import annotations

import uuid

from kbroker.apis.context import RequestContext
from kbroker.apis.metadata import AUTHORIZED_OPERATIONS_NOT_REQUESTED
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
    return DescribeClusterResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        endpoint_type=BROKERS_ENDPOINT,
        cluster_id=ctx.cluster.cluster_id,
        controller_id=ctx.cluster.node_id,
        brokers=[
            DescribeClusterResponse.DescribeClusterBroker(
                broker_id=ctx.cluster.node_id,
                host=ctx.advertised.host,
                port=ctx.advertised.port,
                rack=None,
                is_fenced=False,
            )
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
    names = sorted({t.name for t in request.topics}) if request.topics else sorted(i.name for i in ctx.topics.all())
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
        info = ctx.topics.topic(name)
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
        last = min(info.partitions, first + budget)
        partitions = []
        for index in range(first, last):
            registration = ctx.topics.registration(name, index)
            partitions.append(
                PartitionResult(
                    error_code=ErrorCode.NONE if registration is not None else ErrorCode.LEADER_NOT_AVAILABLE,
                    partition_index=index,
                    leader_id=registration.leader if registration is not None else -1,
                    leader_epoch=registration.leader_epoch if registration is not None else -1,
                    replica_nodes=list(registration.replicas) if registration is not None else [],
                    isr_nodes=list(registration.isr) if registration is not None else [],
                    eligible_leader_replicas=list(registration.eligible_leader_replicas)
                    if registration is not None
                    else [],
                    last_known_elr=list(registration.last_known_elr) if registration is not None else [],
                    offline_replicas=[],
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
        if last < info.partitions:
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
