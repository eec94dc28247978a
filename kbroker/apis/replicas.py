"""ElectLeaders (key 43), versions 0-2, AlterPartitionReassignments (key 45), versions 0-1, and
ListPartitionReassignments (key 46), version 0: replica placement, answered as Kafka 4.3 answers for a cluster of
one broker, where every partition has one replica, this node, which is its leader.

ElectLeaders: there is never a better leader to elect, so each existing partition is answered
ELECTION_NOT_NEEDED and an unknown topic or partition UNKNOWN_TOPIC_OR_PARTITION, with Kafka's messages. A null
list means every partition: Kafka then leaves out the partitions that needed no election, so each topic comes
back with no partitions. Partitions and topics are answered as the request lists them, repeats included.
An election type other than 0 (preferred) or 1 (unclean) is INVALID_REQUEST for the request and every
partition; a timeout_ms of 0 or less is REQUEST_TIMED_OUT for both, as Kafka's controller answers a request
whose deadline has passed before it is looked at. An empty (not null) list is answered NONE whatever its type
and timeout: Kafka's broker answers it without asking its controller.
- v0: preferred elections only, no top-level error code.
- v1: election_type and the top-level error code.
- v2: the flexible encoding.

AlterPartitionReassignments: the one replica set a partition can have is [this node], so a reassignment to it
completes at once (NONE) and anything else is refused with Kafka's checks and messages, in Kafka's order: an
unknown topic or partition; a cancellation (null replicas) when nothing is in progress,
NO_REASSIGNMENT_IN_PROGRESS; an empty list; then, over the replicas in ascending order, a broker that is not
registered or a broker named twice (INVALID_REPLICA_ASSIGNMENT). A timeout_ms of 0 or less is REQUEST_TIMED_OUT,
as for ElectLeaders, except for a request with no topics, which Kafka answers NONE at once with an empty (not
null) top-level message.
- v0: the flexible encoding from the start.
- v1: allow_replication_factor_change, echoed in the answer (no valid reassignment changes the factor here).

ListPartitionReassignments: nothing is ever in progress, so the answer is empty for any request, as Kafka's
once a reassignment has completed (and for unknown topics too).

Authorization as Kafka's controller: ElectLeaders and AlterPartitionReassignments need ALTER on the cluster,
ListPartitionReassignments DESCRIBE, else the request fails CLUSTER_AUTHORIZATION_FAILED (Kafka's message names
the request object itself, so none is given here).
"""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.alter_partition_reassignments_request import AlterPartitionReassignmentsRequest
from protocol.messages.alter_partition_reassignments_response import AlterPartitionReassignmentsResponse
from protocol.messages.elect_leaders_request import ElectLeadersRequest
from protocol.messages.elect_leaders_response import ElectLeadersResponse
from protocol.messages.list_partition_reassignments_request import ListPartitionReassignmentsRequest
from protocol.messages.list_partition_reassignments_response import ListPartitionReassignmentsResponse

PREFERRED, UNCLEAN = 0, 1
ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."

ElectionResult = ElectLeadersResponse.PartitionResult
ReassignmentResult = AlterPartitionReassignmentsResponse.ReassignablePartitionResponse


def _require_cluster(ctx: RequestContext, operation: AclOperation) -> None:
    if not ctx.authorize(operation, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)


def _has_partition(ctx: RequestContext, topic: str, index: int) -> bool:
    info = ctx.topics.topic(topic)
    return info is not None and 0 <= index < info.partitions


def _election_result(ctx: RequestContext, topic: str, index: int) -> ElectionResult:
    if ctx.topics.topic(topic) is None:
        code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such topic as {topic}"
    elif not _has_partition(ctx, topic, index):
        code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such partition as {topic}-{index}"
    else:
        code, message = ErrorCode.ELECTION_NOT_NEEDED, ELECTION_NOT_NEEDED_MESSAGE
    return ElectionResult(partition_id=index, error_code=code, error_message=message)


async def handle_elect_leaders(ctx: RequestContext, request: ElectLeadersRequest) -> ElectLeadersResponse:
    _require_cluster(ctx, AclOperation.ALTER)
    if request.topic_partitions == []:  # Kafka answers at once, without looking at the timeout or the type
        return ElectLeadersResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, replica_election_results=[])
    failed: tuple[ErrorCode, str | None] | None = None
    if request.timeout_ms <= 0:
        failed = (ErrorCode.REQUEST_TIMED_OUT, None)
    elif request.election_type not in (PREFERRED, UNCLEAN):
        failed = (ErrorCode.INVALID_REQUEST, f"Unknown election type {request.election_type}")
    results = []
    if request.topic_partitions is None:  # every partition: none needed an election, so none is listed
        if failed is None:
            results = [ElectLeadersResponse.ReplicaElectionResult(topic=info.name) for info in ctx.topics.all()]
    else:
        for topic in request.topic_partitions:
            if failed is not None:
                code, message = failed
                partitions = [
                    ElectionResult(partition_id=p, error_code=code, error_message=message) for p in topic.partitions
                ]
            else:
                partitions = [_election_result(ctx, topic.topic, p) for p in topic.partitions]
            results.append(ElectLeadersResponse.ReplicaElectionResult(topic=topic.topic, partition_result=partitions))
    return ElectLeadersResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE if failed is None else failed[0],
        replica_election_results=results,
    )


def _reassignment_result(ctx: RequestContext, topic: str, index: int, replicas: list[int] | None) -> ReassignmentResult:
    code, message = ErrorCode.NONE, None
    if ctx.topics.topic(topic) is None:
        code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find a topic named {topic}."
    elif not _has_partition(ctx, topic, index):
        code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Unable to find partition {topic}:{index}."
    elif replicas is None:
        code = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
    elif not replicas:
        code = ErrorCode.INVALID_REPLICA_ASSIGNMENT
        message = "The manual partition assignment includes an empty replica list."
    else:
        previous = None
        for broker in sorted(replicas):
            if broker != ctx.cluster.node_id:
                code = ErrorCode.INVALID_REPLICA_ASSIGNMENT
                message = f"The manual partition assignment includes broker {broker}, but no such broker is registered."
                break
            if broker == previous:
                code = ErrorCode.INVALID_REPLICA_ASSIGNMENT
                message = f"The manual partition assignment includes the broker {broker} more than once."
                break
            previous = broker
    return ReassignmentResult(partition_index=index, error_code=code, error_message=message)


async def handle_alter_partition_reassignments(
    ctx: RequestContext, request: AlterPartitionReassignmentsRequest
) -> AlterPartitionReassignmentsResponse:
    _require_cluster(ctx, AclOperation.ALTER)
    if not request.topics:  # Kafka answers at once, without looking at the timeout
        return AlterPartitionReassignmentsResponse(
            throttle_time_ms=0,
            allow_replication_factor_change=request.allow_replication_factor_change,
            error_code=ErrorCode.NONE,
            error_message="",
            responses=[],
        )
    timed_out = request.timeout_ms <= 0
    responses = []
    for topic in request.topics:
        if timed_out:
            partitions = [
                ReassignmentResult(
                    partition_index=p.partition_index, error_code=ErrorCode.REQUEST_TIMED_OUT, error_message=None
                )
                for p in topic.partitions
            ]
        else:
            partitions = [
                _reassignment_result(ctx, topic.name, p.partition_index, p.replicas) for p in topic.partitions
            ]
        responses.append(
            AlterPartitionReassignmentsResponse.ReassignableTopicResponse(name=topic.name, partitions=partitions)
        )
    return AlterPartitionReassignmentsResponse(
        throttle_time_ms=0,
        allow_replication_factor_change=request.allow_replication_factor_change,
        error_code=ErrorCode.REQUEST_TIMED_OUT if timed_out else ErrorCode.NONE,
        error_message=None,
        responses=responses,
    )


async def handle_list_partition_reassignments(
    ctx: RequestContext, request: ListPartitionReassignmentsRequest
) -> ListPartitionReassignmentsResponse:
    _require_cluster(ctx, AclOperation.DESCRIBE)
    return ListPartitionReassignmentsResponse(
        throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, topics=[]
    )
