"""Metadata (key 3): brokers, cluster id and topic layout; auto-creates topics when allowed."""

from __future__ import annotations

import uuid

from kbroker.apis.context import RequestContext
from kbroker.storage import TopicInfo, validate_topic_name
from protocol.errors import ErrorCode
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.metadata_response import MetadataResponse

AUTHORIZED_OPERATIONS_NOT_REQUESTED = -(2**31)
NO_TOPIC_ID = uuid.UUID(int=0)
# ACL operation codes a topic supports (READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8,
# DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11); without authorization every one of them is allowed.
TOPIC_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
CLUSTER_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))  # no WRITE on a cluster


def topic_metadata(
    ctx: RequestContext, info: TopicInfo, with_operations: bool
) -> MetadataResponse.MetadataResponseTopic:
    node = ctx.cluster.node_id
    return MetadataResponse.MetadataResponseTopic(
        error_code=ErrorCode.NONE,
        name=info.name,
        topic_id=info.topic_id,
        is_internal=False,
        partitions=[
            MetadataResponse.MetadataResponsePartition(
                error_code=ErrorCode.NONE,
                partition_index=index,
                leader_id=node,
                leader_epoch=0,
                replica_nodes=[node],
                isr_nodes=[node],
                offline_replicas=[],
            )
            for index in range(info.partitions)
        ],
        topic_authorized_operations=TOPIC_OPERATIONS if with_operations else AUTHORIZED_OPERATIONS_NOT_REQUESTED,
    )


def _error_topic(
    name: str | None, error: ErrorCode, topic_id: uuid.UUID | None = None, with_operations: bool = False
) -> MetadataResponse.MetadataResponseTopic:
    return MetadataResponse.MetadataResponseTopic(
        error_code=error,
        name=name,
        topic_id=topic_id or uuid.UUID(int=0),
        partitions=[],
        topic_authorized_operations=TOPIC_OPERATIONS if with_operations else AUTHORIZED_OPERATIONS_NOT_REQUESTED,
    )


async def handle_metadata(ctx: RequestContext, request: MetadataRequest) -> MetadataResponse:
    version = ctx.api_version
    with_operations = version >= 8 and request.include_topic_authorized_operations
    # v0 has no null: an empty list asks for every topic. From v1 on, null means all and [] means none.
    all_topics = request.topics is None or (version == 0 and not request.topics)
    allow_create = request.allow_auto_topic_creation if version >= 4 else True
    topics: list[MetadataResponse.MetadataResponseTopic] = []
    requested = request.topics or []  # the named topics (when not all_topics)
    by_id_too_early = version < 12 and any(t.name is None or t.topic_id not in (None, NO_TOPIC_ID) for t in requested)
    if by_id_too_early:
        # As Kafka: v10 and v11 carry topic ids and nullable names in the schema, but only v12 may use them.
        topics = [_error_topic(t.name or "", ErrorCode.INVALID_REQUEST) for t in requested]
    elif all_topics:
        topics = [topic_metadata(ctx, info, with_operations) for info in ctx.topics.all()]
    else:
        for wanted in requested:
            if wanted.name is None:
                info = ctx.topics.topic_by_id(wanted.topic_id)
                if info is None:
                    topics.append(_error_topic(None, ErrorCode.UNKNOWN_TOPIC_ID, wanted.topic_id))
                    continue
            else:
                info = ctx.topics.topic(wanted.name)
                if info is None:
                    if validate_topic_name(wanted.name) is not None:
                        topics.append(
                            _error_topic(wanted.name, ErrorCode.INVALID_TOPIC_EXCEPTION, None, with_operations)
                        )
                        continue
                    if allow_create:
                        info = await ctx.topics.auto_create(wanted.name)
                    if info is None:
                        topics.append(
                            _error_topic(wanted.name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None, with_operations)
                        )
                        continue
            topics.append(topic_metadata(ctx, info, with_operations))
    cluster_operations = AUTHORIZED_OPERATIONS_NOT_REQUESTED
    if 8 <= version <= 10 and request.include_cluster_authorized_operations:
        cluster_operations = CLUSTER_OPERATIONS
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[
            MetadataResponse.MetadataResponseBroker(
                node_id=ctx.cluster.node_id, host=ctx.advertised.host, port=ctx.advertised.port, rack=None
            )
        ],
        cluster_id=ctx.cluster.cluster_id,
        controller_id=ctx.cluster.node_id,
        topics=topics,
        cluster_authorized_operations=cluster_operations,
        error_code=ErrorCode.NONE,
    )
