"""Consumer group APIs: FindCoordinator (10), JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13),
DescribeGroups (15), ListGroups (16), DeleteGroups (42). The state machine lives in kbroker/groups.

Authorization as Kafka's: FindCoordinator needs DESCRIBE on the group or transactional id (else that key is
GROUP_/TRANSACTIONAL_ID_AUTHORIZATION_FAILED); JoinGroup, SyncGroup, Heartbeat and LeaveGroup need READ on the
group (else the request fails GROUP_AUTHORIZATION_FAILED); DescribeGroups needs DESCRIBE per group (the refused
ones come first) and computes ``authorized_operations`` from the ACLs; ListGroups lists every group to a
principal that may DESCRIBE the cluster, else only the groups it may DESCRIBE; DeleteGroups needs DELETE per group
(the refused ones come last, each once). DeleteGroups v3 adds a per-group error message, which Kafka 4.4 fills
only for failures of its coordinator itself or of a streams topology plugin, neither of which a single kbroker
has: like Kafka's, its answers for a missing group, a group with members or a refused one carry none.
"""

from __future__ import annotations

import logging

from kbroker.apis.context import RequestContext
from kbroker.apis.metadata import AUTHORIZED_OPERATIONS_NOT_REQUESTED
from kbroker.durable.files import StorageError
from kbroker.groups.coordinator import GroupState
from kbroker.groups.offsets import OFFSETS_TOPIC, OffsetStoreError
from kbroker.groups.router import GroupKind
from kbroker.java_hashing import coordinator_partition, java_hashmap_order, java_string_hash, java_topic_partition_hash
from kbroker.metadata.listener_view import alive_node
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from kbroker.transactions.state_log import TRANSACTION_TOPIC
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.delete_groups_request import DeleteGroupsRequest
from protocol.messages.delete_groups_response import DeleteGroupsResponse
from protocol.messages.describe_groups_request import DescribeGroupsRequest
from protocol.messages.describe_groups_response import DescribeGroupsResponse
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.find_coordinator_response import FindCoordinatorResponse
from protocol.messages.heartbeat_request import HeartbeatRequest
from protocol.messages.heartbeat_response import HeartbeatResponse
from protocol.messages.join_group_request import JoinGroupRequest
from protocol.messages.join_group_response import JoinGroupResponse
from protocol.messages.leave_group_request import LeaveGroupRequest
from protocol.messages.leave_group_response import LeaveGroupResponse
from protocol.messages.list_groups_request import ListGroupsRequest
from protocol.messages.list_groups_response import ListGroupsResponse
from protocol.messages.sync_group_request import SyncGroupRequest
from protocol.messages.sync_group_response import SyncGroupResponse

log = logging.getLogger("kbroker.groups")

GROUP_KEY = 0
TRANSACTION_KEY = 1
GROUP_DENIED = "Group authorization failed."  # Kafka's GroupAuthorizationException message
TRANSACTIONAL_ID_DENIED = "Transactional Id authorization failed."


def _require_group_read(ctx: RequestContext, group_id: str) -> None:
    """The checks of SyncGroup, Heartbeat and LeaveGroup: READ on the group, or the request fails; then that this
    broker coordinates it."""
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, group_id):
        raise KafkaError(ErrorCode.GROUP_AUTHORIZATION_FAILED, GROUP_DENIED)
    ctx.groups.require_coordinator(group_id)


def _coordinator_denial(ctx: RequestContext, key_type: int, key: str) -> tuple[ErrorCode, str] | None:
    """FindCoordinator's check of one key: DESCRIBE on the group or the transactional id."""
    if key_type == GROUP_KEY and not ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, key):
        return ErrorCode.GROUP_AUTHORIZATION_FAILED, GROUP_DENIED
    if key_type == TRANSACTION_KEY and not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_DENIED
    return None


async def _internal_topic_exists(ctx: RequestContext, topic: str, partitions: int, configs: dict[str, str]) -> bool:
    """Whether the image has the internal topic; if not, it is created as Kafka does on the first FindCoordinator
    for a group or transactional id. Under a KRaft quorum that is asked of the background creation and the answer
    is COORDINATOR_NOT_AVAILABLE at once (the client retries); a single node creates it here (its files in a worker
    thread). False while it is missing, failing, or being created by another request."""
    if ctx.topics.image.topics.get(topic) is not None:
        return True
    creation = ctx.topics.internal_creation
    if creation is not None:
        creation.request(topic, partitions, configs)
        return False
    try:
        await ctx.topics.create(topic, partitions, configs)
    except KafkaError:  # being created by another request
        return False
    except (OSError, StorageError) as exc:
        log.error("cannot create %s: %s", topic, exc)
        return False
    return ctx.topics.image.topics.get(topic) is not None


def _shard_loaded(ctx: RequestContext, key_type: int, key: str) -> bool:
    """This broker leads the key's partition: its shard is loaded (now, if it was not yet)."""
    try:
        if key_type == GROUP_KEY:
            ctx.groups.offsets.ensure_topic()
            return ctx.groups.offsets.ensure_shard(key)
        ctx.transactions.ensure_topic()
        return ctx.transactions.ensure_shard(key)
    except (OffsetStoreError, OSError, StorageError, KafkaError):
        return False


NO_COORDINATOR = (-1, "", -1)


def _coordinator_of(
    ctx: RequestContext, key_type: int, key: str, topic_exists: bool
) -> tuple[ErrorCode, int, str, int]:
    """Who coordinates ``key``, as the image says (Kafka's getCoordinator): the leader of its group's
    __consumer_offsets partition, or of its transactional id's __transaction_state partition, named by its
    endpoint on the request's listener; COORDINATOR_NOT_AVAILABLE while the topic is missing (``topic_exists``),
    the partition has no leader or that leader no endpoint there. This broker answers for itself only once the
    shard is loaded."""
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        return (ErrorCode.INVALID_REQUEST, *NO_COORDINATOR)
    image = ctx.topics.image
    topic = image.topics.get(OFFSETS_TOPIC if key_type == GROUP_KEY else TRANSACTION_TOPIC)
    if not topic_exists or topic is None:
        return (ErrorCode.COORDINATOR_NOT_AVAILABLE, *NO_COORDINATOR)  # Kafka's answer while the topic is missing
    registration = topic.partitions.get(coordinator_partition(key, len(topic.partitions)))
    if registration is None or registration.leader < 0:
        return (ErrorCode.COORDINATOR_NOT_AVAILABLE, *NO_COORDINATOR)  # and while its partition has no leader
    leader = alive_node(image, registration.leader, ctx.listener)
    if leader is None:
        return (ErrorCode.COORDINATOR_NOT_AVAILABLE, *NO_COORDINATOR)
    if leader.node_id == ctx.cluster.node_id and not _shard_loaded(ctx, key_type, key):
        return (ErrorCode.COORDINATOR_NOT_AVAILABLE, *NO_COORDINATOR)
    return ErrorCode.NONE, leader.node_id, leader.host, leader.port


def _coordinator_message(code: ErrorCode, key_type: int) -> str | None:
    if code == ErrorCode.NONE:
        return None
    if code == ErrorCode.INVALID_REQUEST:
        return f"unknown key type {key_type}"
    return "The coordinator is not available."


async def handle_find_coordinator(ctx: RequestContext, request: FindCoordinatorRequest) -> FindCoordinatorResponse:
    """The coordinator of a group is the leader of its __consumer_offsets partition (of a transactional id, of
    its __transaction_state partition), as the metadata image registers it."""
    key_type = request.key_type if ctx.api_version >= 1 else GROUP_KEY
    if key_type == GROUP_KEY:
        offsets = ctx.groups.offsets
        topic_ready = await _internal_topic_exists(
            ctx, OFFSETS_TOPIC, offsets.configured_partitions, offsets.topic_configs()
        )
    elif key_type == TRANSACTION_KEY:
        coordinator = ctx.transactions
        topic_ready = await _internal_topic_exists(
            ctx, TRANSACTION_TOPIC, coordinator.configured_partitions, coordinator.topic_configs()
        )
    else:
        topic_ready = False
    if ctx.api_version >= 4:  # batched (KIP-699)
        coordinators = []
        for key in request.coordinator_keys:
            denial = _coordinator_denial(ctx, key_type, key)
            if denial is not None:  # as Kafka: the code and an empty message
                coordinators.append(
                    FindCoordinatorResponse.Coordinator(
                        key=key, node_id=-1, host="", port=-1, error_code=denial[0], error_message=""
                    )
                )
                continue
            code, node, host, port = _coordinator_of(ctx, key_type, key, topic_ready)
            coordinators.append(
                FindCoordinatorResponse.Coordinator(
                    key=key,
                    node_id=node,
                    host=host,
                    port=port,
                    error_code=code,
                    error_message=_coordinator_message(code, key_type),
                )
            )
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)
    denial = _coordinator_denial(ctx, key_type, request.key)
    if denial is not None:
        raise KafkaError(*denial)
    code, node, host, port = _coordinator_of(ctx, key_type, request.key, topic_ready)
    if code != ErrorCode.NONE:
        return FindCoordinatorResponse(
            throttle_time_ms=0,
            error_code=code,
            error_message=_coordinator_message(code, key_type),
            node_id=-1,
            host="",
            port=-1,
        )
    return FindCoordinatorResponse(
        throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, node_id=node, host=host, port=port
    )


async def handle_join_group(ctx: RequestContext, request: JoinGroupRequest) -> JoinGroupResponse:
    version = ctx.api_version
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, request.group_id):
        # Kafka's JoinGroupRequest.getErrorResponse: no protocol name (null from v7), unknown ids and generation.
        return JoinGroupResponse(
            throttle_time_ms=0,
            error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
            generation_id=-1,
            protocol_name=None if version >= 7 else "",
            leader="",
            member_id="",
            members=[],
        )
    ctx.groups.require_coordinator(request.group_id)
    # One namespace for both protocols: a consumer group with members keeps its id (kbroker.groups.router).
    if not ctx.groups.admit_classic_join(request.group_id):
        return JoinGroupResponse(
            throttle_time_ms=0,
            error_code=ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
            generation_id=-1,
            protocol_name=None if version >= 7 else "",
            leader="",
            member_id=request.member_id,
            members=[],
        )
    rebalance_timeout = request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
    result = await ctx.groups.classic.join(
        request.group_id,
        request.member_id,
        request.group_instance_id if version >= 5 else None,
        ctx.client_id or "",
        "/" + ctx.client_host.rpartition(":")[0],  # Kafka reports the client's address without its port
        request.session_timeout_ms,
        rebalance_timeout,
        request.protocol_type,
        [(p.name, p.metadata) for p in request.protocols],
        require_known_member_id=version >= 4,
        supports_skip_assignment=version >= 9,
    )
    return JoinGroupResponse(
        throttle_time_ms=0,
        error_code=result.error_code,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name if result.protocol_name is not None or version >= 7 else "",
        leader=result.leader,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=[
            JoinGroupResponse.JoinGroupResponseMember(member_id=m, group_instance_id=i, metadata=md)
            for m, i, md in result.members
        ],
    )


async def handle_sync_group(ctx: RequestContext, request: SyncGroupRequest) -> SyncGroupResponse:
    version = ctx.api_version
    if version >= 5 and (request.protocol_type is None or request.protocol_name is None):
        # As Kafka: from v5 both are mandatory, checked before authorization.
        raise KafkaError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    _require_group_read(ctx, request.group_id)
    result = await ctx.groups.classic.sync(
        request.group_id,
        request.generation_id,
        request.member_id,
        request.group_instance_id if version >= 3 else None,
        request.protocol_type if version >= 5 else None,
        request.protocol_name if version >= 5 else None,
        {a.member_id: a.assignment for a in request.assignments},
    )
    return SyncGroupResponse(
        throttle_time_ms=0,
        error_code=result.error_code,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


async def handle_heartbeat(ctx: RequestContext, request: HeartbeatRequest) -> HeartbeatResponse:
    try:
        _require_group_read(ctx, request.group_id)
    except KafkaError as exc:
        if exc.code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            raise
        # As Kafka's GroupCoordinatorService: a heartbeat while the group's partition loads succeeds blindly (the
        # member is not told to rejoin a group its coordinator has not read back yet).
        return HeartbeatResponse(throttle_time_ms=0, error_code=ErrorCode.NONE)
    instance = request.group_instance_id if ctx.api_version >= 3 else None
    code = ctx.groups.classic.heartbeat(request.group_id, request.generation_id, request.member_id, instance)
    return HeartbeatResponse(throttle_time_ms=0, error_code=code)


async def handle_leave_group(ctx: RequestContext, request: LeaveGroupRequest) -> LeaveGroupResponse:
    _require_group_read(ctx, request.group_id)
    if ctx.api_version < 3:
        top, codes = await ctx.groups.classic.leave_committed(request.group_id, [(request.member_id, None)])
        # v0-2 have one error: the group's, else the member's (Kafka's LeaveGroupResponse).
        code = top if top != ErrorCode.NONE else next((c for c in codes if c != ErrorCode.NONE), ErrorCode.NONE)
        return LeaveGroupResponse(throttle_time_ms=0, error_code=code)
    identities = [(m.member_id, m.group_instance_id) for m in request.members]
    top, codes = await ctx.groups.classic.leave_committed(request.group_id, identities)
    results = [
        LeaveGroupResponse.MemberResponse(member_id=member_id, group_instance_id=instance_id, error_code=code)
        for (member_id, instance_id), code in zip(identities, codes, strict=False)
    ]
    return LeaveGroupResponse(throttle_time_ms=0, error_code=top, members=results)


async def handle_list_groups(ctx: RequestContext, request: ListGroupsRequest) -> ListGroupsResponse:
    states = {s.lower() for s in request.states_filter} if ctx.api_version >= 4 and request.states_filter else None
    types = {t.lower() for t in request.types_filter} if ctx.api_version >= 5 and request.types_filter else None
    every_group = ctx.authorize(AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME)
    try:
        groups = ctx.groups.list_groups()
    except KafkaError as exc:  # as Kafka's: the error and no groups (a partition led here is still loading)
        return ListGroupsResponse(throttle_time_ms=0, error_code=exc.code, groups=[])
    listed = [
        ListGroupsResponse.ListedGroup(
            group_id=entry.group_id,
            protocol_type=entry.protocol_type,
            group_state=entry.state,
            group_type=entry.group_type,
        )
        for entry in groups
        if (states is None or entry.state.lower() in states)
        and (types is None or entry.group_type in types)
        and (every_group or ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, entry.group_id))
    ]
    return ListGroupsResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, groups=listed)


def _undescribed(group_id: str, code: ErrorCode, message: str | None = None) -> DescribeGroupsResponse.DescribedGroup:
    """A group DescribeGroups answers with its id and an error only."""
    return DescribeGroupsResponse.DescribedGroup(
        error_code=code,
        error_message=message,
        group_id=group_id,
        group_state="",
        protocol_type="",
        protocol_data="",
        members=[],
        authorized_operations=AUTHORIZED_OPERATIONS_NOT_REQUESTED,
    )


async def handle_describe_groups(ctx: RequestContext, request: DescribeGroupsRequest) -> DescribeGroupsResponse:
    described = []
    refused = []  # as Kafka: the groups the principal may not describe come first
    router = ctx.groups
    for group_id in request.groups:
        if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            refused.append(_undescribed(group_id, ErrorCode.GROUP_AUTHORIZATION_FAILED, GROUP_DENIED))
            continue
        code = router.coordinator_error(group_id)
        if code != ErrorCode.NONE:  # as Kafka: the group's id and the code, nothing else
            described.append(_undescribed(group_id, code))
            continue
        kind = router.kind(group_id)
        group = router.classic_group(group_id)
        if kind is GroupKind.CONSUMER:
            # Kafka (KIP-1043): DescribeGroups only describes classic groups; a consumer group reads as Dead,
            # with GROUP_ID_NOT_FOUND from v6. Clients use ConsumerGroupDescribe for it.
            described.append(
                DescribeGroupsResponse.DescribedGroup(
                    error_code=ErrorCode.GROUP_ID_NOT_FOUND if ctx.api_version >= 6 else ErrorCode.NONE,
                    error_message=f"Group {group_id} is not a classic group." if ctx.api_version >= 6 else None,
                    group_id=group_id,
                    group_state=GroupState.DEAD.value,
                    protocol_type="",
                    protocol_data="",
                    members=[],
                    authorized_operations=AUTHORIZED_OPERATIONS_NOT_REQUESTED,
                )
            )
            continue
        if group is None:
            if kind is GroupKind.OFFSETS_ONLY:
                state, code = GroupState.EMPTY.value, ErrorCode.NONE
            elif ctx.api_version >= 6:
                state, code = GroupState.DEAD.value, ErrorCode.GROUP_ID_NOT_FOUND
            else:
                state, code = GroupState.DEAD.value, ErrorCode.NONE
            described.append(
                DescribeGroupsResponse.DescribedGroup(
                    error_code=code,
                    error_message=None if code == ErrorCode.NONE else f"Group {group_id} not found.",
                    group_id=group_id,
                    group_state=state,
                    protocol_type="",
                    protocol_data="",
                    members=[],
                    authorized_operations=AUTHORIZED_OPERATIONS_NOT_REQUESTED,
                )
            )
            continue
        stable = group.state == GroupState.STABLE
        members = [
            DescribeGroupsResponse.DescribedGroupMember(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata_for(group.protocol_name) if stable and group.protocol_name else b"",
                member_assignment=m.assignment if stable else b"",
            )
            for m in group.members.values()
        ]
        described.append(
            DescribeGroupsResponse.DescribedGroup(
                error_code=ErrorCode.NONE,
                group_id=group_id,
                group_state=group.state.value,
                protocol_type=group.protocol_type or "",
                protocol_data=(group.protocol_name or "") if stable else "",  # Kafka: only once Stable
                members=members,
                authorized_operations=AUTHORIZED_OPERATIONS_NOT_REQUESTED,
            )
        )
    if ctx.api_version >= 3 and request.include_authorized_operations:
        for entry in described:
            if entry.error_code == ErrorCode.NONE:
                entry.authorized_operations = ctx.authorized_operations(ResourceType.GROUP, entry.group_id)
    return DescribeGroupsResponse(throttle_time_ms=0, groups=refused + described)


def _kafka_delete_order(ctx: RequestContext, answers: list[tuple[str, ErrorCode]]) -> list[tuple[str, ErrorCode]]:
    """DeleteGroups' results in Kafka 4.4's order: by coordinator partition as a java.util.HashMap of
    TopicPartition iterates, and within a partition as a HashMap of the group ids iterates (the share-group and
    streams steps before the shard collect every group's answer by id)."""
    by_partition: dict[int, list[tuple[str, ErrorCode]]] = {}
    for answer in answers:
        by_partition.setdefault(ctx.groups.offsets.partition_for(answer[0]), []).append(answer)
    ordered: list[tuple[str, ErrorCode]] = []
    for partition in java_hashmap_order(by_partition, lambda p: java_topic_partition_hash(OFFSETS_TOPIC, p)):
        ordered += java_hashmap_order(by_partition[partition], lambda a: java_string_hash(a[0]))
    return ordered


async def handle_delete_groups(ctx: RequestContext, request: DeleteGroupsRequest) -> DeleteGroupsResponse:
    allowed = [g for g in request.groups_names if ctx.authorize(AclOperation.DELETE, ResourceType.GROUP, g)]
    refused = [g for g in dict.fromkeys(request.groups_names) if g not in set(allowed)]
    not_here = {g: code for g in dict.fromkeys(allowed) if (code := ctx.groups.coordinator_error(g)) != ErrorCode.NONE}
    deleted = iter(await ctx.groups.delete_groups([g for g in allowed if g not in not_here]))
    answers = [(g, not_here[g] if g in not_here else next(deleted)) for g in allowed]
    results = [
        DeleteGroupsResponse.DeletableGroupResult(group_id=group_id, error_code=code)
        for group_id, code in _kafka_delete_order(ctx, answers)
    ]
    results += [
        DeleteGroupsResponse.DeletableGroupResult(group_id=group_id, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
        for group_id in refused
    ]
    return DeleteGroupsResponse(throttle_time_ms=0, results=results)
