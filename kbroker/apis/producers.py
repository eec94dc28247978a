"""DescribeProducers (key 61), version 0: the producers a partition's log knows (KIP-664).

What Admin ``describeProducers`` and ``kafka-transactions.sh describe-producers`` show: for each partition, every
producer with state in its log (idempotent or transactional): id, epoch, last sequence and timestamp, the
coordinator epoch of its last marker, and the first offset of its ongoing transaction (-1 if none) — the
producer that holds back the last stable offset is found here. A partition that does not exist answers
UNKNOWN_TOPIC_OR_PARTITION; one whose files cannot be opened, KAFKA_STORAGE_ERROR. As Kafka, a topic needs READ:
its partitions are TOPIC_AUTHORIZATION_FAILED otherwise, whether it exists or not.
"""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from kbroker.security.acls import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.describe_producers_request import DescribeProducersRequest
from protocol.messages.describe_producers_response import DescribeProducersResponse

PartitionResponse = DescribeProducersResponse.PartitionResponse
ProducerState = DescribeProducersResponse.ProducerState
TOPIC_DENIED = "Topic authorization failed."  # Kafka's ApiError(TOPIC_AUTHORIZATION_FAILED) message


async def handle_describe_producers(
    ctx: RequestContext, request: DescribeProducersRequest
) -> DescribeProducersResponse:
    topics = []
    for topic in request.topics:
        partitions = []
        readable = ctx.authorize(AclOperation.READ, ResourceType.TOPIC, topic.name)
        for index in topic.partition_indexes:
            answer = PartitionResponse(partition_index=index, error_code=ErrorCode.NONE, active_producers=[])
            partitions.append(answer)
            if not readable:
                answer.error_code, answer.error_message = ErrorCode.TOPIC_AUTHORIZATION_FAILED, TOPIC_DENIED
                continue
            try:
                plog = ctx.topics.partition(topic.name, index)
            except KafkaError as exc:  # a partition whose files cannot be opened (KAFKA_STORAGE_ERROR)
                answer.error_code, answer.error_message = exc.code, exc.message
                continue
            if plog is None:
                answer.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if ctx.topics.topic(topic.name) is None:  # Kafka words only an unknown topic so
                    answer.error_message = "This server does not host this topic-partition."
                continue
            answer.active_producers = [
                ProducerState(
                    producer_id=view.producer_id,
                    producer_epoch=view.producer_epoch,
                    last_sequence=view.last_sequence,
                    last_timestamp=view.last_timestamp,
                    coordinator_epoch=view.coordinator_epoch,
                    current_txn_start_offset=view.current_txn_start_offset,
                )
                for view in plog.producers_view()
            ]
        topics.append(DescribeProducersResponse.TopicResponse(name=topic.name, partitions=partitions))
    return DescribeProducersResponse(throttle_time_ms=0, topics=topics)
