"""CreateTopics (19), DeleteTopics (20) and CreatePartitions (37).

Authorization as Kafka's controller does it: CreateTopics needs CREATE on the cluster or on each topic (else
TOPIC_AUTHORIZATION_FAILED "Authorization failed.", after the others) and answers a created topic's configs only
to a principal that may DESCRIBE_CONFIGS it (else topic_config_error_code TOPIC_AUTHORIZATION_FAILED);
DeleteTopics needs DELETE on the cluster or the topic, and a topic the principal may not DESCRIBE is refused
before its existence is looked at (named by id, it is answered without its name), while one it may DESCRIBE but
not DELETE is told absent if it is; CreatePartitions needs ALTER
on each topic (the refused ones first, without a message).

Under a KRaft quorum all three go to Kafka's controller whole, in an Envelope with the client's principal, and
the controller checks and authorizes them (kbroker/apis/forwarded.py).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter

from kbroker.apis.context import RequestContext
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from kbroker.storage import validate_topic_name
from kbroker.topic_config import validate_topic_configs, warn_unapplied
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.create_partitions_request import CreatePartitionsRequest
from protocol.messages.create_partitions_response import CreatePartitionsResponse
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.create_topics_response import CreateTopicsResponse
from protocol.messages.delete_topics_request import DeleteTopicsRequest
from protocol.messages.delete_topics_response import DeleteTopicsResponse

log = logging.getLogger("kbroker.topics")
# As Kafka's controller (KAFKA-17870, KAFKA-19673): one request may add at most this many partitions.
MAX_PARTITIONS_PER_REQUEST = 10_000
EXCESSIVE_PARTITIONS = "Excessively large number of partitions per request."
ZERO_UUID = uuid.UUID(int=0)
TopicResult = CreateTopicsResponse.CreatableTopicResult
TOPIC_DENIED = "Topic authorization failed."  # Kafka's ApiError(TOPIC_AUTHORIZATION_FAILED) message
UNKNOWN_TOPIC = "This server does not host this topic-partition."  # Kafka's ApiError(UNKNOWN_TOPIC_OR_PARTITION)


def _check_assignments(topic: CreateTopicsRequest.CreatableTopic) -> tuple[ErrorCode, str] | None:
    """The request's shape; whether the brokers it names can take the replicas is the controller's to say."""
    if topic.num_partitions != -1 or topic.replication_factor != -1:
        return ErrorCode.INVALID_REQUEST, (
            "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at "
            "the same time."
        )
    indexes = sorted(a.partition_index for a in topic.assignments)
    if indexes != list(range(len(indexes))):
        return ErrorCode.INVALID_REPLICA_ASSIGNMENT, "Partitions should be a consecutive 0-based integer sequence"
    return None


async def handle_create_topics(ctx: RequestContext, request: CreateTopicsRequest) -> CreateTopicsResponse:
    from kbroker.apis.configs import broker_layers, describe_topic_configs  # configs imports topic helpers

    counts = Counter(topic.name for topic in request.topics)
    default_partitions = ctx.config["num.partitions"]
    requested = sum(
        len(t.assignments) if t.assignments else (default_partitions if t.num_partitions == -1 else t.num_partitions)
        for t in request.topics
    )
    if requested > MAX_PARTITIONS_PER_REQUEST:
        return CreateTopicsResponse(
            throttle_time_ms=0,
            topics=[
                TopicResult(
                    name=t.name,
                    topic_id=ZERO_UUID,
                    error_code=ErrorCode.POLICY_VIOLATION,
                    error_message=EXCESSIVE_PARTITIONS,
                )
                for t in request.topics
            ],
        )
    results: list[TopicResult] = []
    refused: list[TopicResult] = []  # as Kafka's controller: the topics the principal may not create come last
    may_create_all = ctx.authorize(AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
    for topic in request.topics:
        result = TopicResult(name=topic.name, topic_id=ZERO_UUID, error_code=ErrorCode.NONE, error_message=None)
        if (
            counts[topic.name] == 1
            and not may_create_all
            and not ctx.authorize(AclOperation.CREATE, ResourceType.TOPIC, topic.name)
        ):
            result.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            result.error_message = "Authorization failed."
            refused.append(result)
            continue
        results.append(result)

        def fail(code: ErrorCode, message: str | None, result: TopicResult = result) -> None:
            result.error_code = code
            result.error_message = message

        if counts[topic.name] > 1:
            fail(ErrorCode.INVALID_REQUEST, f"Create topics request from client contains duplicate topic {topic.name}")
            continue
        name_problem = validate_topic_name(topic.name)
        if name_problem is not None:
            fail(ErrorCode.INVALID_TOPIC_EXCEPTION, name_problem)
            continue
        if ctx.topics.exists_or_pending(topic.name):
            fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{topic.name}' already exists.")
            continue
        assignments = [a.broker_ids for a in sorted(topic.assignments, key=lambda a: a.partition_index)] or None
        if topic.assignments:
            problem = _check_assignments(topic)
            if problem is not None:
                fail(*problem)
                continue
            partitions = len(topic.assignments)
        else:
            partitions = ctx.config["num.partitions"] if topic.num_partitions == -1 else topic.num_partitions
        # The controller's checks of partitions and replicas, before the configs are looked at.
        try:
            await ctx.topics.check_create(topic.name, partitions, topic.replication_factor, assignments)
        except KafkaError as exc:
            fail(exc.code, exc.message)
            continue
        # Every entry is checked, a repeated name's earlier null included, before later entries win.
        null_named = next((c.name for c in topic.configs if c.value is None), None)
        if null_named is not None:
            fail(ErrorCode.INVALID_CONFIG, f"Null value not supported for topic config {null_named}")
            continue
        configs = {c.name: c.value for c in topic.configs if c.value is not None}
        config_problem = validate_topic_configs(configs)
        if config_problem is not None:
            fail(ErrorCode.INVALID_CONFIG, config_problem)
            continue
        if request.validate_only:
            topic_id = ZERO_UUID
        else:
            try:
                info = await ctx.topics.create(
                    topic.name,
                    partitions,
                    configs,
                    replication_factor=topic.replication_factor,
                    assignments=assignments,
                )
            except KafkaError as exc:  # another request created it meanwhile
                fail(exc.code, exc.message)
                continue
            topic_id = info.topic_id
            log.info("created topic %s with %d partitions", topic.name, partitions)
            warn_unapplied(topic.name, configs)
        result.topic_id = topic_id
        result.num_partitions = partitions
        created = ctx.topics.registration(topic.name, 0)
        result.replication_factor = len(created.replicas) if created is not None else 1
        if not ctx.authorize(AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, topic.name):
            result.topic_config_error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            continue
        result.configs = [
            CreateTopicsResponse.CreatableTopicConfigs(
                name=entry.name,
                value=entry.value,
                read_only=entry.read_only,
                config_source=entry.config_source,
                is_sensitive=False,
            )
            for entry in describe_topic_configs(broker_layers(ctx), configs, include_synonyms=False)
        ]
    return CreateTopicsResponse(throttle_time_ms=0, topics=results + refused)


async def handle_delete_topics(ctx: RequestContext, request: DeleteTopicsRequest) -> DeleteTopicsResponse:
    if ctx.api_version >= 6:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    else:
        wanted = [(name, ZERO_UUID) for name in request.topic_names]
    results = []
    may_delete_all = ctx.authorize(AclOperation.DELETE, ResourceType.CLUSTER, CLUSTER_NAME)
    for name, topic_id in wanted:
        result = DeleteTopicsResponse.DeletableTopicResult(name=name, topic_id=topic_id, error_code=ErrorCode.NONE)
        results.append(result)
        if name is not None and topic_id != ZERO_UUID:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = "Topic name and topic id must not both be set."
            continue
        info = ctx.topics.topic(name) if name is not None else ctx.topics.topic_by_id(topic_id)
        resolved = name if name is not None else (info.name if info is not None else None)
        if resolved is not None and not may_delete_all:
            describable = ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, resolved)
            # As Kafka's controller: a topic the principal may describe is told absent before refused deletion.
            if not describable or (
                info is not None and not ctx.authorize(AclOperation.DELETE, ResourceType.TOPIC, resolved)
            ):
                # Named by id, a topic the principal may not describe keeps its name to itself.
                result.name = resolved if name is not None or describable else None
                result.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                result.error_message = TOPIC_DENIED
                continue
        if info is None:
            result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name is not None else ErrorCode.UNKNOWN_TOPIC_ID
            # Kafka 4.3's message for an absent name (v5+ carry messages); the absent id's is not checked yet.
            result.error_message = UNKNOWN_TOPIC if name is not None else None
            continue
        result.name, result.topic_id = info.name, info.topic_id
        if not ctx.config["delete.topic.enable"]:
            result.error_code = ErrorCode.TOPIC_DELETION_DISABLED
            result.error_message = "Topic deletion is disabled."
            continue
        try:
            await ctx.topics.delete(info.name)
        except KafkaError as exc:  # deleted by another request meanwhile
            result.error_code, result.error_message = exc.code, exc.message
            continue
        log.info("deleted topic %s", info.name)
    return DeleteTopicsResponse(throttle_time_ms=0, responses=results)


async def handle_create_partitions(ctx: RequestContext, request: CreatePartitionsRequest) -> CreatePartitionsResponse:
    counts = Counter(topic.name for topic in request.topics)
    results = []
    new_partitions = 0
    for topic in request.topics:
        info = ctx.topics.topic(topic.name)
        new_partitions += max(topic.count - (info.partitions if info is not None else 0), 0)
    if new_partitions > MAX_PARTITIONS_PER_REQUEST:
        return CreatePartitionsResponse(
            throttle_time_ms=0,
            results=[
                CreatePartitionsResponse.CreatePartitionsTopicResult(
                    name=t.name, error_code=ErrorCode.POLICY_VIOLATION, error_message=EXCESSIVE_PARTITIONS
                )
                for t in request.topics
            ],
        )
    refused = []  # as Kafka's controller: the topics the principal may not ALTER come first, without a message
    for topic in request.topics:
        result = CreatePartitionsResponse.CreatePartitionsTopicResult(
            name=topic.name, error_code=ErrorCode.NONE, error_message=None
        )
        if counts[topic.name] == 1 and not ctx.authorize(AclOperation.ALTER, ResourceType.TOPIC, topic.name):
            result.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            refused.append(result)
            continue
        results.append(result)
        if counts[topic.name] > 1:
            result.error_code, result.error_message = ErrorCode.INVALID_REQUEST, "Duplicate topic in request."
        else:  # an unknown topic or a count that is no increase is the controller's to refuse, in its words
            assignments = [a.broker_ids for a in topic.assignments] if topic.assignments is not None else None
            try:
                await ctx.topics.add_partitions(
                    topic.name, topic.count, assignments, validate_only=request.validate_only
                )
            except KafkaError as exc:  # unknown, not an increase, a refused assignment, ...
                result.error_code, result.error_message = exc.code, exc.message
                continue
            if not request.validate_only:
                log.info("topic %s now has %d partitions", topic.name, topic.count)
    return CreatePartitionsResponse(throttle_time_ms=0, results=refused + results)
