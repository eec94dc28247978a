"""The consumer group protocol of KIP-848: ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69).

The state machine is kbroker/groups/consumer_group.py; these handlers translate requests and responses.

Authorization as Kafka 4.3's: a heartbeat needs READ on the group (else GROUP_AUTHORIZATION_FAILED) and DESCRIBE on
every topic it subscribes to by name (else TOPIC_AUTHORIZATION_FAILED, the member left as it was); a regex resolves
only to the topics the principal that sent it may DESCRIBE (others are never assigned, and refusing them is not
logged as a denial, as Kafka's coordinator filters them quietly). A describe
needs DESCRIBE per group (the refused groups come first, GROUP_AUTHORIZATION_FAILED), computes
``authorized_operations`` from the ACLs, and under an authorizer answers a group whose members' assignments name a
topic the principal may not DESCRIBE TOPIC_AUTHORIZATION_FAILED, without its members.
"""

from __future__ import annotations

import uuid

from kbroker.apis.context import RequestContext
from kbroker.groups.assignors import TopicAssignment
from kbroker.groups.consumer_group import ConsumerGroup, MemberHeartbeat
from kbroker.security.acls import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest
from protocol.messages.consumer_group_describe_response import ConsumerGroupDescribeResponse
from protocol.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest
from protocol.messages.consumer_group_heartbeat_response import ConsumerGroupHeartbeatResponse

AUTHORIZED_OPERATIONS_OMITTED = -(2**31)

CONSUMER_MEMBER = 1  # ConsumerGroupDescribe v1 MemberType: 0 classic, 1 consumer, -1 unknown
HIDDEN_TOPICS = "The group has described topic(s) that the client is not authorized to describe."


async def handle_consumer_group_heartbeat(
    ctx: RequestContext, request: ConsumerGroupHeartbeatRequest
) -> ConsumerGroupHeartbeatResponse:
    # As Kafka: the refusals carry a code and nothing else (no message, no member id).
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, request.group_id):
        return ConsumerGroupHeartbeatResponse(throttle_time_ms=0, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    if request.subscribed_topic_names and not all(
        ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, name) for name in set(request.subscribed_topic_names)
    ):
        return ConsumerGroupHeartbeatResponse(throttle_time_ms=0, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    try:
        ctx.groups.require_coordinator(request.group_id)
    except KafkaError as exc:
        return ConsumerGroupHeartbeatResponse(throttle_time_ms=0, error_code=exc.code)
    authorizer = ctx.services.authorizer
    principal, address = ctx.principal, ctx.client_address

    def may_describe_topic(name: str) -> bool:
        # The authorizer itself, not ctx.authorize: a topic filtered out of a regex is not a refused request.
        return authorizer is None or authorizer.authorize(
            principal, address, AclOperation.DESCRIBE, ResourceType.TOPIC, name
        )

    owned = (
        None
        if request.topic_partitions is None
        else [(tp.topic_id, list(tp.partitions)) for tp in request.topic_partitions]
    )
    heartbeat = MemberHeartbeat(
        version=ctx.api_version,
        group_id=request.group_id,
        member_id=request.member_id,
        member_epoch=request.member_epoch,
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        subscribed_topic_names=request.subscribed_topic_names,
        subscribed_topic_regex=request.subscribed_topic_regex if ctx.api_version >= 1 else None,
        may_describe_topic=may_describe_topic if authorizer is not None else None,
        server_assignor=request.server_assignor,
        owned=owned,
        client_id=ctx.client_id or "",
        client_host="/" + ctx.client_address,  # as Kafka shows it: the address without its port
    )
    result = await ctx.groups.consumer.heartbeat_committed(heartbeat)  # once its records are committed
    assignment = None
    if result.assignment is not None:
        assignment = ConsumerGroupHeartbeatResponse.Assignment(
            topic_partitions=[
                ConsumerGroupHeartbeatResponse.TopicPartitions(topic_id=topic_id, partitions=sorted(partitions))
                for topic_id, partitions in sorted(result.assignment.items(), key=lambda kv: str(kv[0]))
            ]
        )
    return ConsumerGroupHeartbeatResponse(
        throttle_time_ms=0,
        error_code=result.error_code,
        error_message=result.error_message,
        member_id=result.member_id,
        member_epoch=result.member_epoch,
        heartbeat_interval_ms=result.heartbeat_interval_ms,
        assignment=assignment,
    )


def _described_assignment(
    assignment: TopicAssignment, names: dict[uuid.UUID, str]
) -> ConsumerGroupDescribeResponse.Assignment:
    return ConsumerGroupDescribeResponse.Assignment(
        topic_partitions=[
            ConsumerGroupDescribeResponse.TopicPartitions(
                topic_id=topic_id, topic_name=names[topic_id], partitions=sorted(partitions)
            )
            for topic_id, partitions in sorted(assignment.items(), key=lambda kv: names.get(kv[0], ""))
            if topic_id in names  # a deleted topic has no name to give
        ]
    )


def _names_hidden_topic(ctx: RequestContext, described: ConsumerGroupDescribeResponse.DescribedGroup) -> bool:
    """Whether a member's assignment or target assignment names a topic the principal may not DESCRIBE."""
    names = {
        tp.topic_name
        for member in described.members
        for assignment in (member.assignment, member.target_assignment)
        for tp in assignment.topic_partitions
    }
    return not all(ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, name) for name in names)


def _describe(ctx: RequestContext, group: ConsumerGroup) -> ConsumerGroupDescribeResponse.DescribedGroup:
    coordinator = ctx.groups.consumer
    names = dict(coordinator.topic_names())
    members = [
        ConsumerGroupDescribeResponse.Member(
            member_id=m.member_id,
            instance_id=m.instance_id,
            rack_id=m.rack_id,
            member_epoch=m.member_epoch,
            client_id=m.client_id,
            client_host=m.client_host,
            subscribed_topic_names=list(m.subscribed_topic_names),
            subscribed_topic_regex=m.subscribed_topic_regex,
            assignment=_described_assignment(m.assigned, names),
            target_assignment=_described_assignment(group.target.get(m.member_id, {}), names),
            member_type=CONSUMER_MEMBER,  # v1 (KIP-1099); classic members never join these groups here
        )
        for m in group.members.values()
    ]
    return ConsumerGroupDescribeResponse.DescribedGroup(
        error_code=ErrorCode.NONE,
        group_id=group.group_id,
        group_state=group.state.value,
        group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        assignor_name=coordinator.preferred_assignor(group),
        members=members,
        authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
    )


async def handle_consumer_group_describe(
    ctx: RequestContext, request: ConsumerGroupDescribeRequest
) -> ConsumerGroupDescribeResponse:
    described = []
    refused = []  # as Kafka: the groups the principal may not describe come first
    authorizing = ctx.services.authorizer is not None
    for group_id in request.group_ids:
        if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            refused.append(
                ConsumerGroupDescribeResponse.DescribedGroup(
                    error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, group_id=group_id, members=[]
                )
            )
            continue
        router = ctx.groups
        code = router.coordinator_error(group_id)
        if code != ErrorCode.NONE:  # as Kafka: the group's id and the code, nothing else
            described.append(
                ConsumerGroupDescribeResponse.DescribedGroup(error_code=code, group_id=group_id, members=[])
            )
            continue
        group = router.consumer_group(group_id)
        if group is not None:
            answer = _describe(ctx, group)
            if request.include_authorized_operations:
                answer.authorized_operations = ctx.authorized_operations(ResourceType.GROUP, group_id)
            if authorizing and _names_hidden_topic(ctx, answer):
                answer = ConsumerGroupDescribeResponse.DescribedGroup(
                    error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    error_message=HIDDEN_TOPICS,
                    group_id=group_id,
                    members=[],
                )
            described.append(answer)
            continue
        known_elsewhere = router.is_known(group_id)  # a classic or offsets-only group
        described.append(
            ConsumerGroupDescribeResponse.DescribedGroup(
                error_code=ErrorCode.GROUP_ID_NOT_FOUND,
                error_message=(
                    f"Group {group_id} is not a consumer group" if known_elsewhere else f"Group {group_id} not found."
                ),
                group_id=group_id,
                members=[],
                authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
            )
        )
    return ConsumerGroupDescribeResponse(throttle_time_ms=0, groups=refused + described)
