"""Metadata (key 3): brokers, cluster id and topic layout; auto-creates topics when allowed.

Authorization as Kafka's: a topic needs DESCRIBE to be listed (an all-topics answer leaves the others out, a
named one is TOPIC_AUTHORIZATION_FAILED whether it exists or not), auto-creation needs CREATE on the cluster or
the topic, and ``authorized_operations`` (v8+) are computed from the ACLs.
"""

from __future__ import annotations

import logging
import uuid

from kbroker.apis.context import CloseConnection, RequestContext
from kbroker.apis.turns import Turns
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from kbroker.storage import TopicInfo, validate_topic_name
from kbroker.topics import INTERNAL_TOPICS
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.metadata_response import MetadataResponse

AUTHORIZED_OPERATIONS_NOT_REQUESTED = -(2**31)
AUTO_CREATE_VERSION = 7  # the CreateTopics version a Kafka 4.4 controller reads newest
AUTO_CREATE_TIMEOUT_MS = 30000  # Kafka's request.timeout.ms default, which its auto-creation sends
log = logging.getLogger("kbroker.topics")
NO_TOPIC_ID = uuid.UUID(int=0)


async def _auto_create(ctx: RequestContext, name: str) -> TopicInfo | None:
    """Auto-create ``name``. Under a KRaft quorum, as Kafka's AutoTopicCreationManager: a CreateTopics with the
    Metadata request's client id and correlation id, in an Envelope with the client's principal (the controller
    authorizes the client too); a refusal leaves the topic unknown, as in Kafka."""
    if not ctx.topics.controller.forwards_requests or name in INTERNAL_TOPICS:
        return await ctx.topics.auto_create(name)
    if not ctx.config["auto.create.topics.enable"]:
        return None
    from kbroker.apis.forwarded import forward_to_controller
    from protocol.messages.create_topics_request import CreateTopicsRequest

    topic = CreateTopicsRequest.CreatableTopic(
        name=name,
        num_partitions=ctx.config["num.partitions"],
        replication_factor=ctx.config["default.replication.factor"],
    )
    request = CreateTopicsRequest(topics=[topic], timeout_ms=AUTO_CREATE_TIMEOUT_MS)
    try:
        answer = await forward_to_controller(ctx, request, api_version=AUTO_CREATE_VERSION)
    except (KafkaError, CloseConnection) as exc:
        log.info("auto-creating topic %s through the controller quorum failed: %s", name, exc)
        return None
    [result] = answer.topics
    if result.error_code not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
        log.info("the controller quorum refused to auto-create topic %s: %s", name, ErrorCode(result.error_code).name)
        return None
    return ctx.topics.topic(name) or ctx.topics.in_image(name)


def topic_operations(ctx: RequestContext, name: str, with_operations: bool) -> int:
    """A topic's ``authorized_operations`` bit field if asked for (every supported one without an authorizer)."""
    if not with_operations:
        return AUTHORIZED_OPERATIONS_NOT_REQUESTED
    return ctx.authorized_operations(ResourceType.TOPIC, name)


def topic_metadata(
    ctx: RequestContext, info: TopicInfo, with_operations: bool
) -> MetadataResponse.MetadataResponseTopic:
    partitions = []
    for index in range(info.partitions):
        registration = ctx.topics.registration(info.name, index)
        if registration is None:  # not in the image (yet): no leader to name
            partitions.append(
                MetadataResponse.MetadataResponsePartition(
                    error_code=ErrorCode.LEADER_NOT_AVAILABLE,
                    partition_index=index,
                    leader_id=-1,
                    leader_epoch=-1,
                    replica_nodes=[],
                    isr_nodes=[],
                    offline_replicas=[],
                )
            )
            continue
        partitions.append(
            MetadataResponse.MetadataResponsePartition(
                error_code=ErrorCode.NONE,
                partition_index=index,
                leader_id=registration.leader,
                leader_epoch=registration.leader_epoch,
                replica_nodes=list(registration.replicas),
                isr_nodes=list(registration.isr),
                offline_replicas=[],
            )
        )
    return MetadataResponse.MetadataResponseTopic(
        error_code=ErrorCode.NONE,
        name=info.name,
        topic_id=info.topic_id,
        is_internal=info.name in INTERNAL_TOPICS,
        partitions=partitions,
        topic_authorized_operations=topic_operations(ctx, info.name, with_operations),
    )


def _error_topic(
    name: str | None,
    error: ErrorCode,
    topic_id: uuid.UUID | None = None,
    operations: int = AUTHORIZED_OPERATIONS_NOT_REQUESTED,
) -> MetadataResponse.MetadataResponseTopic:
    return MetadataResponse.MetadataResponseTopic(
        error_code=error,
        name=name,
        topic_id=topic_id or uuid.UUID(int=0),
        partitions=[],
        topic_authorized_operations=operations,
    )


async def handle_metadata(ctx: RequestContext, request: MetadataRequest) -> MetadataResponse:
    version = ctx.api_version
    with_operations = version >= 8 and request.include_topic_authorized_operations
    # v0 has no null: an empty list asks for every topic. From v1 on, null means all and [] means none.
    all_topics = request.topics is None or (version == 0 and not request.topics)
    allow_create = request.allow_auto_topic_creation if version >= 4 else True
    topics: list[MetadataResponse.MetadataResponseTopic] = []
    # As Kafka: topics the principal may not DESCRIBE are left out of an all-topics answer and answered
    # TOPIC_AUTHORIZATION_FAILED (without a topic id) when named, before their existence is looked at, so that
    # it is not disclosed; those it may describe but not create (CREATE on the cluster or the topic) when
    # auto-creation would create them are TOPIC_AUTHORIZATION_FAILED too. Both come after the others.
    denied_create: list[MetadataResponse.MetadataResponseTopic] = []
    denied_describe: list[MetadataResponse.MetadataResponseTopic] = []
    requested = request.topics or []  # the named topics (when not all_topics)
    turns = Turns()  # many topics: other connections run as it goes (kbroker/apis/turns.py)
    by_id_too_early = version < 12 and any(t.name is None or t.topic_id not in (None, NO_TOPIC_ID) for t in requested)
    if by_id_too_early:
        # As Kafka: v10 and v11 carry topic ids and nullable names in the schema, but only v12 may use them.
        topics = [_error_topic(t.name or "", ErrorCode.INVALID_REQUEST) for t in requested]
    elif all_topics:
        for listed in ctx.topics.all():
            if ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, listed.name):
                topics.append(topic_metadata(ctx, listed, with_operations))
            await turns.step(1 + listed.partitions)
    else:
        may_create_any = None  # CREATE on the cluster, asked once and only if a topic would be auto-created
        for wanted in requested:
            await turns.step()
            if wanted.name is None:
                info = ctx.topics.topic_by_id(wanted.topic_id)
                if info is None:
                    topics.append(_error_topic(None, ErrorCode.UNKNOWN_TOPIC_ID, wanted.topic_id))
                    continue
                if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, info.name):
                    # Topic ids are not secret: Kafka answers with the id and without the name.
                    denied_describe.append(_error_topic(None, ErrorCode.TOPIC_AUTHORIZATION_FAILED, info.topic_id))
                    continue
            else:
                if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, wanted.name):
                    denied_describe.append(_error_topic(wanted.name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                    continue
                info = ctx.topics.topic(wanted.name)
                if info is None:
                    if allow_create and ctx.config["auto.create.topics.enable"]:
                        if may_create_any is None:
                            may_create_any = ctx.authorize(AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
                        if not may_create_any and not ctx.authorize(
                            AclOperation.CREATE, ResourceType.TOPIC, wanted.name
                        ):
                            denied_create.append(_error_topic(wanted.name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                            continue
                    if validate_topic_name(wanted.name) is not None:
                        operations = topic_operations(ctx, wanted.name, with_operations)
                        topics.append(_error_topic(wanted.name, ErrorCode.INVALID_TOPIC_EXCEPTION, None, operations))
                        continue
                    if allow_create:
                        info = await _auto_create(ctx, wanted.name)
                    if info is None:
                        operations = topic_operations(ctx, wanted.name, with_operations)
                        topics.append(_error_topic(wanted.name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None, operations))
                        continue
            topics.append(topic_metadata(ctx, info, with_operations))
            await turns.step(info.partitions)
    cluster_operations = AUTHORIZED_OPERATIONS_NOT_REQUESTED
    if 8 <= version <= 10 and request.include_cluster_authorized_operations:
        # As Kafka: 0 for a principal that may not describe the cluster.
        cluster_operations = (
            ctx.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)
            if ctx.authorize(AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
            else 0
        )
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[
            MetadataResponse.MetadataResponseBroker(
                node_id=ctx.cluster.node_id, host=ctx.advertised.host, port=ctx.advertised.port, rack=None
            )
        ],
        cluster_id=ctx.cluster.cluster_id,
        controller_id=ctx.cluster.node_id,
        topics=topics + denied_create + denied_describe,
        cluster_authorized_operations=cluster_operations,
        error_code=ErrorCode.NONE,
    )
