"""Metadata (key 3): brokers, cluster id and topic layout; auto-creates topics when allowed.

Everything is the metadata image's, as clients of the request's listener see it (kbroker/metadata/listener_view.py,
Kafka's KRaftMetadataCache): every registered, unfenced broker with its endpoint on that listener and its rack; each
partition's leader, leader epoch, replicas, ISR and offline replicas, LEADER_NOT_AVAILABLE without a leader and
LISTENER_NOT_FOUND (v6+) for a leader without that listener; a controller id that is any unfenced broker, chosen at
random as a KRaft broker chooses it.

Authorization as Kafka's: a topic needs DESCRIBE to be listed (an all-topics answer leaves the others out, a
named one is TOPIC_AUTHORIZATION_FAILED whether it exists or not), auto-creation needs CREATE on the cluster or
the topic, and ``authorized_operations`` (v8+) are computed from the ACLs.
"""

from __future__ import annotations

import logging
import uuid

from kbroker.apis.context import CloseConnection, RequestContext
from kbroker.apis.turns import Turns
from kbroker.metadata.image import TopicImage
from kbroker.metadata.listener_view import broker_nodes, partition_view, random_alive_broker
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
LISTENER_NOT_FOUND_VERSION = 6  # before it, a leader without the request's listener is LEADER_NOT_AVAILABLE


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
    ctx: RequestContext, topic: TopicImage, with_operations: bool
) -> MetadataResponse.MetadataResponseTopic:
    """A topic as the image has it, its leaders and replicas as clients of the request's listener reach them."""
    image = ctx.topics.image
    only_reachable = ctx.api_version == 0  # as Kafka: v0 leaves out replicas it cannot reach
    listener_error = ctx.api_version >= LISTENER_NOT_FOUND_VERSION
    partitions = []
    for index in sorted(topic.partitions):
        view = partition_view(
            image, topic.partitions[index], ctx.listener, only_reachable=only_reachable, listener_error=listener_error
        )
        partitions.append(
            MetadataResponse.MetadataResponsePartition(
                error_code=view.error,
                partition_index=index,
                leader_id=view.leader_id,
                leader_epoch=view.leader_epoch,
                replica_nodes=view.replicas,
                isr_nodes=view.isr,
                offline_replicas=view.offline_replicas,
            )
        )
    return MetadataResponse.MetadataResponseTopic(
        error_code=ErrorCode.NONE,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.name in INTERNAL_TOPICS,
        partitions=partitions,
        topic_authorized_operations=topic_operations(ctx, topic.name, with_operations),
    )


def _created_topic(
    ctx: RequestContext, info: TopicInfo, with_operations: bool
) -> MetadataResponse.MetadataResponseTopic:
    """A topic just created whose registration the image does not have yet: no leader to name."""
    partitions = [
        MetadataResponse.MetadataResponsePartition(
            error_code=ErrorCode.LEADER_NOT_AVAILABLE,
            partition_index=index,
            leader_id=-1,
            leader_epoch=-1,
            replica_nodes=[],
            isr_nodes=[],
            offline_replicas=[],
        )
        for index in range(info.partitions)
    ]
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
        by_name = ctx.topics.image.topics.by_name
        for name in sorted(by_name):
            listed = by_name[name]
            if ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, name):
                topics.append(topic_metadata(ctx, listed, with_operations))
            await turns.step(1 + len(listed.partitions))
    else:
        may_create_any = None  # CREATE on the cluster, asked once and only if a topic would be auto-created
        for wanted in requested:
            await turns.step()
            image_topics = ctx.topics.image.topics
            if wanted.name is None:
                found = image_topics.by_id.get(wanted.topic_id)
                if found is None:
                    topics.append(_error_topic(None, ErrorCode.UNKNOWN_TOPIC_ID, wanted.topic_id))
                    continue
                if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, found.name):
                    # Topic ids are not secret: Kafka answers with the id and without the name.
                    denied_describe.append(_error_topic(None, ErrorCode.TOPIC_AUTHORIZATION_FAILED, found.topic_id))
                    continue
            else:
                if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, wanted.name):
                    denied_describe.append(_error_topic(wanted.name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                    continue
                found = image_topics.by_name.get(wanted.name)
                if found is None:
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
                    info = await _auto_create(ctx, wanted.name) if allow_create else None
                    if info is None:
                        operations = topic_operations(ctx, wanted.name, with_operations)
                        topics.append(_error_topic(wanted.name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None, operations))
                        continue
                    found = ctx.topics.image.topics.by_name.get(wanted.name)
                    if found is None:  # created, its registration not in this broker's image yet
                        topics.append(_created_topic(ctx, info, with_operations))
                        continue
            topics.append(topic_metadata(ctx, found, with_operations))
            await turns.step(len(found.partitions))
    cluster_operations = AUTHORIZED_OPERATIONS_NOT_REQUESTED
    if 8 <= version <= 10 and request.include_cluster_authorized_operations:
        # As Kafka: 0 for a principal that may not describe the cluster.
        cluster_operations = (
            ctx.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)
            if ctx.authorize(AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
            else 0
        )
    image = ctx.topics.image
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[
            MetadataResponse.MetadataResponseBroker(
                node_id=node.node_id, host=node.host, port=node.port, rack=node.rack
            )
            for node in broker_nodes(image, ctx.listener)
        ],
        cluster_id=ctx.cluster.cluster_id,
        controller_id=random_alive_broker(image),
        topics=topics + denied_create + denied_describe,
        cluster_authorized_operations=cluster_operations,
        error_code=ErrorCode.NONE,
    )
