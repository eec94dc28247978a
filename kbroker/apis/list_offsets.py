"""ListOffsets (key 2): earliest, latest, max timestamp and offsets by timestamp through the time index.

The partition is read through the replica layer (kbroker/replication) as a consumer reads it: from its leader
(else NOT_LEADER_OR_FOLLOWER), latest being the high watermark (the last stable offset for read_committed); for
a replica (replica_id >= 0, a follower whose fetch offset is out of range) latest is the log end, as Kafka's.

Authorization as Kafka's: each topic needs DESCRIBE; the partitions of one that does not are answered
TOPIC_AUTHORIZATION_FAILED after all the others, whether the topic exists or not.
"""

from __future__ import annotations

from collections import Counter

from kbroker.apis.context import RequestContext
from kbroker.apis.leader_hints import no_replica_error
from kbroker.apis.turns import Turns
from kbroker.security.acls import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.list_offsets_response import ListOffsetsResponse

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6
READ_COMMITTED = 1
CONSUMER = -1  # the replica id offsets are read as: from the leader, up to the high watermark

PartitionResponse = ListOffsetsResponse.ListOffsetsPartitionResponse


async def handle_list_offsets(ctx: RequestContext, request: ListOffsetsRequest) -> ListOffsetsResponse:
    read_committed = ctx.api_version >= 2 and request.isolation_level == READ_COMMITTED
    denied = [t for t in request.topics if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, t.name)]
    denied_ids = {id(t) for t in denied}
    unauthorized = [
        ListOffsetsResponse.ListOffsetsTopicResponse(
            name=topic.name,
            partitions=[
                PartitionResponse(
                    partition_index=p.partition_index,
                    error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    timestamp=-1,
                    offset=-1,
                )
                for p in topic.partitions
            ],
        )
        for topic in denied
    ]
    topics = []
    turns = Turns()  # many partitions: other connections run as it goes (kbroker/apis/turns.py)
    # As Kafka: a partition asked for more than once gets one INVALID_REQUEST answer instead.
    seen: Counter[tuple[str, int]] = Counter()
    for topic in request.topics:
        seen.update((topic.name, part.partition_index) for part in topic.partitions)
        await turns.step(len(topic.partitions))
    duplicates: dict[str, list[PartitionResponse]] = {}
    refused_once: set[tuple[str, int]] = set()  # the duplicates already answered (a set: there may be 100,000s)
    for topic in request.topics:
        if id(topic) in denied_ids:
            continue
        partitions = []
        for part in topic.partitions:
            await turns.step()
            response = PartitionResponse(partition_index=part.partition_index, timestamp=-1, offset=-1)
            key = (topic.name, part.partition_index)
            if seen[key] > 1:
                if key not in refused_once:
                    refused_once.add(key)
                    response.error_code = ErrorCode.INVALID_REQUEST
                    duplicates.setdefault(topic.name, []).append(response)
                continue
            try:
                partition = ctx.replicas.partition(topic.name, part.partition_index)
            except KafkaError as exc:  # a partition whose files cannot be opened (KAFKA_STORAGE_ERROR)
                response.error_code = exc.code
                partitions.append(response)
                continue
            if partition is None:  # NOT_LEADER_OR_FOLLOWER if another broker holds it, as Kafka
                response.error_code = no_replica_error(ctx, topic.name, part.partition_index)
                partitions.append(response)
                continue
            refusal = partition.fetch_error(CONSUMER, part.current_leader_epoch)  # the epoch, then leadership
            if refusal != ErrorCode.NONE:
                response.error_code = refusal
                partitions.append(response)
                continue
            plog = partition.log
            response.leader_epoch = plog.leader_epoch
            timestamp = part.timestamp
            if timestamp == LATEST:
                if request.replica_id >= 0:  # a follower resetting its position: the log end, as Kafka's
                    response.offset = plog.log_end_offset
                else:
                    response.offset = plog.last_stable_offset if read_committed else plog.high_watermark
            elif timestamp in (EARLIEST, EARLIEST_LOCAL):
                response.offset = plog.log_start_offset
            elif timestamp == MAX_TIMESTAMP:
                found = plog.max_timestamp()
                if found is not None:
                    response.offset, response.timestamp = found
            elif timestamp in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
                # No tiered storage: nothing has been uploaded, so there is no such offset.
                response.offset = -1
            elif timestamp >= 0:
                found = plog.offset_for_timestamp(timestamp)
                if found is not None:
                    offset, found_timestamp = found
                    upper = plog.last_stable_offset if read_committed else plog.high_watermark
                    if offset < upper:
                        response.offset, response.timestamp = offset, found_timestamp
            else:
                response.error_code = ErrorCode.INVALID_REQUEST
            if response.offset == -1:
                response.leader_epoch = -1  # as Kafka: no offset found, no epoch
            partitions.append(response)
        if partitions:
            topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=topic.name, partitions=partitions))
    for name, refused in duplicates.items():
        topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=name, partitions=refused))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics + unauthorized)
