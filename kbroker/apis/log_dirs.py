"""DescribeLogDirs (key 35), versions 1-5, and AlterReplicaLogDirs (key 34), versions 1-2: the broker's one log
directory (its data directory) and the partitions in it.

kbroker keeps every partition in one data directory (``log.dirs``' first entry, else ``log.dir``), named as
Kafka names a log dir: its absolute path.

DescribeLogDirs lists that directory with each partition asked for (null: every partition) that exists: its
size (the sum of its segment files, as Kafka's), offset_lag (log end offset minus high watermark: 0 on one node)
and is_future_key false (no replica is being moved). A topic or partition that does not exist is left out, as
Kafka leaves it out, and so is a topic none of whose partitions exist; partitions come once each, by index.
- v1: the per-directory answer.
- v2: the flexible encoding.
- v3: a top-level error code (Kafka's is for a missing cluster authorization only: 0 here).
- v4: total_bytes and usable_bytes of the volume, from statvfs (blocks and blocks available to an unprivileged
  user, times the fragment size, as Java's File.getTotalSpace/getUsableSpace).
- v5: is_cordoned (KIP-1066), false: kbroker never cordons its directory.

AlterReplicaLogDirs asks to move partitions to other directories. With one directory there is nothing to move:
a partition asked into that directory (the path exactly as DescribeLogDirs gives it) is answered NONE, an
unknown partition there UNKNOWN_TOPIC_OR_PARTITION, and any other path LOG_DIR_NOT_FOUND for every partition
asked into it, known or not, as Kafka answers. A partition named twice is answered once (the last path counts).
- v1: the per-partition answer.
- v2: the flexible encoding.

Authorization as Kafka's: DescribeLogDirs needs DESCRIBE on the cluster (else no directories and, from v3, the
top-level CLUSTER_AUTHORIZATION_FAILED); AlterReplicaLogDirs ALTER on the cluster (else every partition
CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import os

from kbroker.apis.context import RequestContext
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.alter_replica_log_dirs_request import AlterReplicaLogDirsRequest
from protocol.messages.alter_replica_log_dirs_response import AlterReplicaLogDirsResponse
from protocol.messages.describe_log_dirs_request import DescribeLogDirsRequest
from protocol.messages.describe_log_dirs_response import DescribeLogDirsResponse

TopicResult = DescribeLogDirsResponse.DescribeLogDirsTopic
PartitionResult = DescribeLogDirsResponse.DescribeLogDirsPartition


def log_dir(ctx: RequestContext) -> str:
    """The broker's log directory as Kafka names one: its absolute path."""
    return os.path.abspath(ctx.cluster.data_dir)


def volume_bytes(path: str) -> tuple[int, int]:
    """(total, usable) bytes of the volume holding ``path``, as Java's File.getTotalSpace/getUsableSpace."""
    volume = os.statvfs(path)
    return volume.f_blocks * volume.f_frsize, volume.f_bavail * volume.f_frsize


def _wanted_partitions(ctx: RequestContext, request: DescribeLogDirsRequest) -> dict[str, list[int]]:
    """Topic -> the indexes asked for (each once, in order), only of topics that exist."""
    if request.topics is None:
        return {info.name: list(range(info.partitions)) for info in ctx.topics.all()}
    wanted: dict[str, set[int]] = {}
    for topic in request.topics:
        info = ctx.topics.topic(topic.topic)
        if info is not None:
            wanted.setdefault(info.name, set()).update(p for p in topic.partitions if 0 <= p < info.partitions)
    return {name: sorted(indexes) for name, indexes in sorted(wanted.items())}


async def handle_describe_log_dirs(ctx: RequestContext, request: DescribeLogDirsRequest) -> DescribeLogDirsResponse:
    if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        return DescribeLogDirsResponse(
            throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, results=[]
        )
    topics = []
    for name, indexes in _wanted_partitions(ctx, request).items():
        partitions = []
        for index in indexes:
            try:
                plog = ctx.topics.partition(name, index)
            except KafkaError:  # its files cannot be opened: Kafka would not list it in an online directory
                continue
            if plog is None:  # deleted meanwhile
                continue
            partitions.append(
                PartitionResult(
                    partition_index=index,
                    partition_size=plog.size_bytes,
                    offset_lag=max(0, plog.log_end_offset - plog.high_watermark),
                    is_future_key=False,
                )
            )
        if partitions:
            topics.append(TopicResult(name=name, partitions=partitions))
    path = log_dir(ctx)
    total_bytes, usable_bytes = volume_bytes(path)
    result = DescribeLogDirsResponse.DescribeLogDirsResult(
        error_code=ErrorCode.NONE,
        log_dir=path,
        topics=topics,
        total_bytes=total_bytes,
        usable_bytes=usable_bytes,
        is_cordoned=False,
    )
    return DescribeLogDirsResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, results=[result])


async def handle_alter_replica_log_dirs(
    ctx: RequestContext, request: AlterReplicaLogDirsRequest
) -> AlterReplicaLogDirsResponse:
    if not ctx.authorize(AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
    destination: dict[tuple[str, int], str] = {}  # (topic, partition) -> path; a later entry replaces an earlier
    for directory in request.dirs:
        for topic in directory.topics:
            for index in topic.partitions:
                destination[(topic.name, index)] = directory.path
    ours = log_dir(ctx)
    by_topic: dict[str, list[AlterReplicaLogDirsResponse.AlterReplicaLogDirPartitionResult]] = {}
    for (name, index), path in destination.items():
        if path != ours:
            code = ErrorCode.LOG_DIR_NOT_FOUND
        else:
            info = ctx.topics.topic(name)
            exists = info is not None and 0 <= index < info.partitions
            code = ErrorCode.NONE if exists else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        by_topic.setdefault(name, []).append(
            AlterReplicaLogDirsResponse.AlterReplicaLogDirPartitionResult(partition_index=index, error_code=code)
        )
    return AlterReplicaLogDirsResponse(
        throttle_time_ms=0,
        results=[
            AlterReplicaLogDirsResponse.AlterReplicaLogDirTopicResult(topic_name=name, partitions=partitions)
            for name, partitions in by_topic.items()
        ],
    )
