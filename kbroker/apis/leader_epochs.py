"""OffsetForLeaderEpoch (key 23), versions 2-4: where a leader epoch ends in a partition's log (KIP-101, KIP-320).

Consumers ask it after a leader change to check that their position is still on the log (a truncated
position is reset); replicas will ask it to find where to truncate. Each partition's answer comes from its
leader epoch cache (kbroker/storage/leader_epochs.py): the largest epoch at or below the one asked for and the
offset where it ends, (-1, -1) for an epoch the log does not know.

- v2: the request carries each partition's current_leader_epoch, checked as ListOffsets and Fetch check it
  (FENCED_LEADER_EPOCH below the partition's epoch, UNKNOWN_LEADER_EPOCH above it, -1 skips the check).
- v3: adds replica_id (-1 for a consumer, -2 for a debugging tool); a single node has no followers.
- v4: the flexible encoding (tagged fields).
Versions 0-1 are gone from Kafka 4 and not served.

Authorization as Kafka's (KIP-320): CLUSTER_ACTION on the cluster (a replica) or DESCRIBE on the topic (a
consumer); the partitions of a topic allowed neither are TOPIC_AUTHORIZATION_FAILED, after all the others.
"""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from kbroker.apis.leader_hints import no_replica_error
from kbroker.apis.turns import Turns
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.offset_for_leader_epoch_request import OffsetForLeaderEpochRequest
from protocol.messages.offset_for_leader_epoch_response import OffsetForLeaderEpochResponse

EpochEndOffset = OffsetForLeaderEpochResponse.EpochEndOffset
UNDEFINED = -1


def _failed(partition: int, code: ErrorCode) -> EpochEndOffset:
    return EpochEndOffset(error_code=code, partition=partition, leader_epoch=UNDEFINED, end_offset=UNDEFINED)


CONSUMER = -1  # answered as to a client: by the leader only


async def handle_offset_for_leader_epoch(
    ctx: RequestContext, request: OffsetForLeaderEpochRequest
) -> OffsetForLeaderEpochResponse:
    topics = []
    unauthorized = []
    replica = ctx.authorize(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME)
    turns = Turns()  # many partitions: other connections run as it goes (kbroker/apis/turns.py)
    for topic in request.topics:
        if not replica and not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, topic.topic):
            unauthorized.append(
                OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult(
                    topic=topic.topic,
                    partitions=[
                        _failed(part.partition, ErrorCode.TOPIC_AUTHORIZATION_FAILED) for part in topic.partitions
                    ],
                )
            )
            continue
        answers = []
        for part in topic.partitions:
            await turns.step()
            try:
                partition = ctx.replicas.partition(topic.topic, part.partition)
            except KafkaError as exc:  # a partition whose files cannot be opened (KAFKA_STORAGE_ERROR)
                answers.append(_failed(part.partition, exc.code))
                continue
            if partition is None:  # NOT_LEADER_OR_FOLLOWER if another broker holds it, as Kafka
                answers.append(_failed(part.partition, no_replica_error(ctx, topic.topic, part.partition)))
                continue
            # As Kafka's (fetchOnlyFromLeader): the epoch the image registered, then leadership.
            refusal = partition.fetch_error(CONSUMER, part.current_leader_epoch)
            if refusal != ErrorCode.NONE:
                answers.append(_failed(part.partition, refusal))
                continue
            epoch, end_offset = partition.log.end_offset_for_epoch(part.leader_epoch)
            answers.append(
                EpochEndOffset(
                    error_code=ErrorCode.NONE, partition=part.partition, leader_epoch=epoch, end_offset=end_offset
                )
            )
        topics.append(OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult(topic=topic.topic, partitions=answers))
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics + unauthorized)
