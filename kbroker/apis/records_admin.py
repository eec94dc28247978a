"""DeleteRecords (21): move a partition's log start offset forward.

Authorization as Kafka's: DELETE on each topic, else its partitions are TOPIC_AUTHORIZATION_FAILED whether the
topic exists or not. A topic whose cleanup.policy lacks ``delete`` (compact only) answers POLICY_VIOLATION before
the offset is looked at, as Kafka's Partition.deleteRecordsOnLeader does. Only the partition's leader deletes,
up to its high watermark (the partition as the replica layer holds it, kbroker/replication).
"""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from kbroker.apis.turns import Turns
from kbroker.security.acls import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.delete_records_request import DeleteRecordsRequest
from protocol.messages.delete_records_response import DeleteRecordsResponse

HIGH_WATERMARK = -1  # an offset of -1 means "up to the high watermark"


async def handle_delete_records(ctx: RequestContext, request: DeleteRecordsRequest) -> DeleteRecordsResponse:
    topics = []
    turns = Turns()  # many partitions: other connections run as it goes (kbroker/apis/turns.py)
    for topic in request.topics:
        partitions = []
        deletable = ctx.authorize(AclOperation.DELETE, ResourceType.TOPIC, topic.name)
        for part in topic.partitions:
            await turns.step()
            result = DeleteRecordsResponse.DeleteRecordsPartitionResult(
                partition_index=part.partition_index, low_watermark=-1, error_code=ErrorCode.NONE
            )
            partitions.append(result)
            if not deletable:
                result.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                partition = ctx.replicas.partition(topic.name, part.partition_index)
            except KafkaError as exc:  # a partition whose files cannot be opened (KAFKA_STORAGE_ERROR)
                result.error_code = exc.code
                continue
            if partition is None:
                result.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if not partition.is_leader:  # as Kafka's deleteRecordsOnLeader
                result.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                continue
            plog = partition.log
            if "delete" not in plog.config.cleanup_policy.split(","):
                result.error_code = ErrorCode.POLICY_VIOLATION
                continue
            offset = plog.high_watermark if part.offset == HIGH_WATERMARK else part.offset
            if offset < 0 or offset > plog.high_watermark:
                result.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                continue
            if offset > plog.log_start_offset:
                try:
                    plog.delete_records(offset)
                except KafkaError as exc:  # the new log start could not be made durable: nothing moved
                    result.error_code = exc.code
                    continue
            result.low_watermark = plog.log_start_offset
        topics.append(DeleteRecordsResponse.DeleteRecordsTopicResult(name=topic.name, partitions=partitions))
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)
