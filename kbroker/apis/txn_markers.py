"""WriteTxnMarkers (key 27) v1-2: append commit or abort markers to partitions.

The transaction coordinator sends it to the leaders of the partitions another broker leads (kbroker's, in a
cluster, through kbroker/transactions/remote.py; the markers of its own partitions it writes itself); it also comes
from an operator: Admin ``abortTransaction`` and
``kafka-transactions.sh abort`` (KIP-664) end a hanging transaction with it, naming the producer id, epoch and
coordinator epoch DescribeProducers reports. As Kafka, each partition's marker is appended as the coordinator's
would be: a marker from an older producer epoch is INVALID_PRODUCER_EPOCH (with transaction version 2, v2's field,
one not newer than the producer's), from an older coordinator epoch TRANSACTION_COORDINATOR_FENCED, and a marker
for a producer with no open transaction is written all the same; an unknown partition is
UNKNOWN_TOPIC_OR_PARTITION. A marker for a ``__consumer_offsets`` partition goes through the group coordinator's
shard of it, which applies or drops the transaction's pending offsets there. The answer has one entry per
producer id, as Kafka's (markers of the same producer are merged).

Authorization as Kafka's: ALTER on the cluster, or else CLUSTER_ACTION on it; otherwise every partition is
CLUSTER_AUTHORIZATION_FAILED and nothing is written.
"""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from kbroker.apis.leader_hints import no_replica_error
from kbroker.coordinators.runtime import Transaction
from kbroker.groups.offsets import OFFSETS_TOPIC
from kbroker.replication.manager import PendingAck
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.write_txn_markers_request import WriteTxnMarkersRequest
from protocol.messages.write_txn_markers_response import WriteTxnMarkersResponse

MarkerResult = WriteTxnMarkersResponse.WritableTxnMarkerResult
TopicResult = WriteTxnMarkersResponse.WritableTxnMarkerTopicResult
PartitionResult = WriteTxnMarkersResponse.WritableTxnMarkerPartitionResult
MARKER_TIMEOUT_MS = 30000  # Kafka's request.timeout.ms default, the timeout its WriteTxnMarkers appends wait with


def _may_write_markers(ctx: RequestContext) -> bool:
    authorizer = ctx.services.authorizer
    if authorizer is None:
        return True
    # ALTER is asked first without logging a denial (Kafka's logIfDenied = false), then CLUSTER_ACTION.
    if authorizer.authorize(ctx.principal, ctx.client_address, AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        return True
    return ctx.authorize(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME)


def _not_leading(ctx: RequestContext, topic: str, index: int) -> ErrorCode:
    """Why this broker may not append a marker to the partition (NONE if it leads it): markers go to leaders only,
    as any append (Kafka's getPartitionOrException, then appendRecordsToLeader), so a stale coordinator's marker
    never lands on a follower's log."""
    try:
        replica = ctx.topics.replicas.partition(topic, index)
    except KafkaError as exc:  # its files cannot be opened
        return exc.code
    if replica is None:
        return no_replica_error(ctx, topic, index)
    return ErrorCode.NONE if replica.is_leader else ErrorCode.NOT_LEADER_OR_FOLLOWER


def _write_marker(
    ctx: RequestContext, marker: WriteTxnMarkersRequest.WritableTxnMarker, topic: str, index: int
) -> ErrorCode:
    refusal = _not_leading(ctx, topic, index)
    if refusal != ErrorCode.NONE:
        return refusal
    if topic == OFFSETS_TOPIC and ctx.topics.topic(topic) is not None:
        # Through the group coordinator's shard, as Kafka's onTransactionCompleted: its pending offsets apply.
        try:
            ctx.groups.offsets.runtime.end_transaction(
                index,
                Transaction(marker.producer_id, marker.producer_epoch),
                marker.transaction_result,
                marker.coordinator_epoch,
            )
        except KafkaError as exc:
            return exc.code
        return ErrorCode.NONE
    try:
        plog = ctx.topics.partition(topic, index)
    except KafkaError as exc:  # its files cannot be opened
        return exc.code
    if plog is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    transaction_version = marker.transaction_version if ctx.api_version >= 2 else 0
    result = plog.append_marker(
        marker.producer_id,
        marker.producer_epoch,
        marker.transaction_result,
        marker.coordinator_epoch,
        transaction_version=max(transaction_version, 1),
    )
    return ErrorCode(result.error_code)


async def handle_write_txn_markers(ctx: RequestContext, request: WriteTxnMarkersRequest) -> WriteTxnMarkersResponse:
    authorized = _may_write_markers(ctx)
    replicas = ctx.topics.replicas
    # producer id -> topic -> partition -> answer, in the order first named (Kafka keys its answer by producer id)
    by_producer: dict[int, dict[str, dict[int, PartitionResult]]] = {}
    awaiting: list[PendingAck] = []  # markers written, answered once the ISR has them (Kafka appends with acks=-1)
    for marker in request.markers:
        topics = by_producer.setdefault(marker.producer_id, {})
        for topic in marker.topics:
            partitions = topics.setdefault(topic.name, {})
            for index in topic.partition_indexes:
                if not authorized:
                    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                else:
                    code = _write_marker(ctx, marker, topic.name, index)
                answer = partitions[index] = PartitionResult(partition_index=index, error_code=code)
                replica = replicas.held(topic.name, index) if code == ErrorCode.NONE else None
                if replica is not None and replica.log.high_watermark < replica.log.log_end_offset:
                    awaiting.append((replica, replica.log.log_end_offset, answer))
    if awaiting:  # followers must have the markers first (never on one node)
        await replicas.await_acks(awaiting, MARKER_TIMEOUT_MS)  # REQUEST_TIMED_OUT: the coordinator sends again
    return WriteTxnMarkersResponse(
        markers=[
            MarkerResult(
                producer_id=producer_id,
                topics=[TopicResult(name=name, partitions=list(answers.values())) for name, answers in topics.items()],
            )
            for producer_id, topics in by_producer.items()
        ]
    )
