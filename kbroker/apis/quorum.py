"""DescribeQuorum (key 55), versions 0-2: the KRaft quorum of the metadata log, as a Kafka 4.3 node in combined
mode (broker and controller in one process) answers it through its broker listener: one voter, itself, the
leader, and no observers.

The log end offset, which is also the high watermark on a single voter, is one past the last record of the
metadata image (__cluster_metadata-0, kbroker/metadata/log.py), and the leader epoch that of its last record: each
start opens a new epoch of the log, as each restart of a Kafka node elects it again. Only ``__cluster_metadata``
partition 0, asked alone, is described; any other request gets UNKNOWN_TOPIC_OR_PARTITION for every partition it
names, with Kafka's message, as Kafka answers.

- v0: leader, epoch, high watermark, voters and observers with their log end offsets.
- v1: each replica's last fetch and last caught-up times: the leader reports now for both, as Kafka's does.
- v2: error messages (empty, not null, on success, as Kafka sends), the voters' directory ids (unknown: the zero
  uuid, as a Kafka with a static voter set reports) and the voters' endpoints: Kafka names its controller
  listener; kbroker has none and names the listeners it serves, as advertised.
"""

from __future__ import annotations

import time
import uuid

from kbroker.apis.context import RequestContext
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.describe_quorum_request import DescribeQuorumRequest
from protocol.messages.describe_quorum_response import DescribeQuorumResponse

METADATA_TOPIC = "__cluster_metadata"
METADATA_PARTITION = 0
NOT_HOSTED_MESSAGE = "This server does not host this topic-partition."
UNKNOWN_DIRECTORY_ID = uuid.UUID(int=0)


def metadata_log_end_offset(ctx: RequestContext) -> int:
    return ctx.topics.image.provenance.offset + 1


def _asks_for_the_metadata_partition(request: DescribeQuorumRequest) -> bool:
    if len(request.topics) != 1 or len(request.topics[0].partitions) != 1:
        return False
    topic = request.topics[0]
    return topic.topic_name == METADATA_TOPIC and topic.partitions[0].partition_index == METADATA_PARTITION


async def handle_describe_quorum(ctx: RequestContext, request: DescribeQuorumRequest) -> DescribeQuorumResponse:
    # As Kafka's controller: DESCRIBE on the cluster, else the request fails (its message names the request object).
    if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    if not _asks_for_the_metadata_partition(request):
        return DescribeQuorumResponse(
            error_code=ErrorCode.NONE,
            topics=[
                DescribeQuorumResponse.TopicData(
                    topic_name=topic.topic_name,
                    partitions=[
                        DescribeQuorumResponse.PartitionData(
                            partition_index=p.partition_index,
                            error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            error_message=NOT_HOSTED_MESSAGE,
                        )
                        for p in topic.partitions
                    ],
                )
                for topic in request.topics
            ],
        )
    node = ctx.cluster.node_id
    end_offset = metadata_log_end_offset(ctx)
    now_ms = int(time.time() * 1000)
    voter = DescribeQuorumResponse.ReplicaState(
        replica_id=node,
        replica_directory_id=UNKNOWN_DIRECTORY_ID,
        log_end_offset=end_offset,
        last_fetch_timestamp=now_ms,
        last_caught_up_timestamp=now_ms,
    )
    partition = DescribeQuorumResponse.PartitionData(
        partition_index=METADATA_PARTITION,
        error_code=ErrorCode.NONE,
        leader_id=node,
        leader_epoch=max(ctx.topics.image.provenance.epoch, 0),
        high_watermark=end_offset,
        current_voters=[voter],
        observers=[],
    )
    endpoints = [
        DescribeQuorumResponse.Listener(name=name, host=address.host, port=address.port)
        for name, address in ((name, ctx.cluster.advertised_for(name)) for name, _ in ctx.cluster.listeners)
    ]
    return DescribeQuorumResponse(
        error_code=ErrorCode.NONE,
        topics=[DescribeQuorumResponse.TopicData(topic_name=METADATA_TOPIC, partitions=[partition])],
        nodes=[DescribeQuorumResponse.Node(node_id=node, listeners=endpoints)],
    )
