"""Committed offsets: OffsetCommit (8), OffsetFetch (9) and OffsetDelete (47).

Authorization as Kafka's: OffsetCommit needs READ on the group (else the whole request fails
GROUP_AUTHORIZATION_FAILED) and READ on each topic (else its partitions are TOPIC_AUTHORIZATION_FAILED, before
existence or membership are checked); OffsetFetch needs DESCRIBE on each group (else that group is
GROUP_AUTHORIZATION_FAILED) and shows only topics the principal may DESCRIBE: named ones it may not are answered
TOPIC_AUTHORIZATION_FAILED after the others, and a fetch of every partition leaves them out; OffsetDelete needs
DELETE on the group and READ on each topic.
"""

from __future__ import annotations

import time
from typing import TypeVar

from kbroker.apis.context import RequestContext
from kbroker.apis.turns import Turns
from kbroker.coordinators.runtime import write_error_answer
from kbroker.groups.offsets import CommittedOffset, OffsetStoreError
from kbroker.security.acls import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.offset_commit_request import OffsetCommitRequest
from protocol.messages.offset_commit_response import OffsetCommitResponse
from protocol.messages.offset_delete_request import OffsetDeleteRequest
from protocol.messages.offset_delete_response import OffsetDeleteResponse
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from protocol.messages.offset_fetch_response import OffsetFetchResponse

NO_GENERATION = -1
DEFAULT_RETENTION = -1
GROUP_DENIED = "Group authorization failed."  # Kafka's GroupAuthorizationException message for a whole request


def _may_describe_topic(ctx: RequestContext, name: str) -> bool:
    return ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, name)


def _commit_check(ctx: RequestContext, request: OffsetCommitRequest) -> ErrorCode:
    """Kafka's validation of who may commit, by the group's kind (kbroker.groups.router)."""
    return ctx.groups.validate_offset_commit(
        request.group_id,
        request.member_id,
        request.group_instance_id if ctx.api_version >= 7 else None,
        request.generation_id_or_member_epoch,
        ctx.api_version,
    )


async def handle_offset_commit(ctx: RequestContext, request: OffsetCommitRequest) -> OffsetCommitResponse:
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, request.group_id):
        raise KafkaError(ErrorCode.GROUP_AUTHORIZATION_FAILED, GROUP_DENIED)
    ctx.groups.require_coordinator(request.group_id)
    check = _commit_check(ctx, request)
    now = int(time.time() * 1000)
    retention = request.retention_time_ms if 2 <= ctx.api_version <= 4 else DEFAULT_RETENTION
    max_metadata = ctx.config["offset.metadata.max.bytes"]
    commits: dict[tuple[str, int], CommittedOffset] = {}
    topics: list[OffsetCommitResponse.OffsetCommitResponseTopic] = []
    unreadable: list[OffsetCommitResponse.OffsetCommitResponseTopic] = []  # Kafka answers these first
    turns = Turns()  # many partitions: other connections run as it goes (kbroker/apis/turns.py)
    for topic in request.topics:
        info = ctx.topics.topic(topic.name)
        readable = ctx.authorize(AclOperation.READ, ResourceType.TOPIC, topic.name)
        partitions = []
        for part in topic.partitions:
            await turns.step()
            code = check if readable else ErrorCode.TOPIC_AUTHORIZATION_FAILED
            if code == ErrorCode.NONE:
                if info is None or not 0 <= part.partition_index < info.partitions:
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif part.committed_metadata is not None and len(part.committed_metadata.encode()) > max_metadata:
                    code = ErrorCode.OFFSET_METADATA_TOO_LARGE
                else:
                    epoch = part.committed_leader_epoch if ctx.api_version >= 6 else -1
                    commits[(topic.name, part.partition_index)] = CommittedOffset(
                        part.committed_offset,
                        epoch,
                        part.committed_metadata,
                        now,
                        now + retention if retention >= 0 else -1,
                    )
            partitions.append(
                OffsetCommitResponse.OffsetCommitResponsePartition(
                    partition_index=part.partition_index, error_code=code
                )
            )
        answer = OffsetCommitResponse.OffsetCommitResponseTopic(name=topic.name, partitions=partitions)
        (topics if readable else unreadable).append(answer)
    topics = unreadable + topics
    if commits:
        failure = ErrorCode.NONE
        try:
            end_offset = ctx.groups.offsets.commit(request.group_id, commits)
            await ctx.groups.offsets.committed(request.group_id, end_offset)  # answered once committed
        except OffsetStoreError:  # logged by the store; nothing was committed
            # Kafka's coordinator answers a failed append to __consumer_offsets (KAFKA_STORAGE_ERROR) so: the
            # client finds the coordinator again and retries.
            failure = ErrorCode.NOT_COORDINATOR
        except KafkaError as exc:  # written but not committed: the error as Kafka maps it (a timeout too)
            failure = write_error_answer(exc.code)
        if failure != ErrorCode.NONE:
            for topic_response in topics:
                for partition in topic_response.partitions:
                    if partition.error_code == ErrorCode.NONE:
                        partition.error_code = failure
    return OffsetCommitResponse(throttle_time_ms=0, topics=topics)


async def _fetch_group(
    ctx: RequestContext,
    group_id: str,
    wanted: list[tuple[str, list[int]]] | None,
    turns: Turns,
    require_stable: bool = False,
) -> list[tuple[str, list[tuple[int, CommittedOffset | None, ErrorCode]]]]:
    """Each wanted partition's committed offset; with ``require_stable`` (KIP-447) a partition that an open
    transaction holds an offset for, or whose newest offset is not yet replicated, answers UNSTABLE_OFFSET_COMMIT
    and no offset, so the client retries.
    Topics the principal may not DESCRIBE: left out of every partition, TOPIC_AUTHORIZATION_FAILED (last) if named."""
    offsets = ctx.groups.offsets
    committed = offsets.committed_offsets(group_id)  # as of the last committed offset, as Kafka reads
    # A stable read also waits for what is written and not yet replicated: a transaction's commit marker applied
    # here ends its pending offsets before the ISR has it, and until then the committed view is the older offset.
    latest = offsets.get(group_id) if require_stable else {}
    denied: list[tuple[str, list[int]]] = []
    if wanted is None:  # every partition the group has committed
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(committed):
            by_topic.setdefault(topic, []).append(partition)
        wanted = [(topic, partitions) for topic, partitions in by_topic.items() if _may_describe_topic(ctx, topic)]
    else:
        denied = [entry for entry in wanted if not _may_describe_topic(ctx, entry[0])]
        if denied:
            denied_ids = {id(entry) for entry in denied}  # by identity: a list scan per topic is quadratic
            wanted = [entry for entry in wanted if id(entry) not in denied_ids]
    result = []
    for topic, partitions in wanted:
        rows: list[tuple[int, CommittedOffset | None, ErrorCode]] = []
        for partition in partitions:
            await turns.step()
            if require_stable and (
                offsets.has_pending(group_id, topic, partition)
                or latest.get((topic, partition)) != committed.get((topic, partition))
            ):
                rows.append((partition, None, ErrorCode.UNSTABLE_OFFSET_COMMIT))
            else:
                rows.append((partition, committed.get((topic, partition)), ErrorCode.NONE))
        result.append((topic, rows))
    for topic, partitions in denied:
        result.append((topic, [(partition, None, ErrorCode.TOPIC_AUTHORIZATION_FAILED) for partition in partitions]))
    return result


_Answer = TypeVar(
    "_Answer", OffsetFetchResponse.OffsetFetchResponsePartitions, OffsetFetchResponse.OffsetFetchResponsePartition
)


async def _answers(
    answer: type[_Answer], rows: list[tuple[int, CommittedOffset | None, ErrorCode]], turns: Turns
) -> list[_Answer]:
    """A topic's partitions as OffsetFetch answers them (v8+ and the older layout have the same fields)."""
    out = []
    for partition, committed, code in rows:
        out.append(
            answer(
                partition_index=partition,
                committed_offset=committed.offset if committed else -1,
                committed_leader_epoch=committed.leader_epoch if committed else -1,
                metadata=committed.metadata if committed else "",
                error_code=code,
            )
        )
        await turns.step()
    return out


async def handle_offset_fetch(ctx: RequestContext, request: OffsetFetchRequest) -> OffsetFetchResponse:
    version = ctx.api_version
    turns = Turns()  # many partitions: other connections run as it goes (kbroker/apis/turns.py)
    if version >= 8:
        groups = []
        for group in request.groups:
            if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, group.group_id):
                groups.append(
                    OffsetFetchResponse.OffsetFetchResponseGroup(
                        group_id=group.group_id, topics=[], error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED
                    )
                )
                continue
            try:
                ctx.groups.require_coordinator(group.group_id)
            except KafkaError as exc:  # each group its own coordinator, as Kafka answers a batched fetch
                groups.append(
                    OffsetFetchResponse.OffsetFetchResponseGroup(
                        group_id=group.group_id, topics=[], error_code=exc.code
                    )
                )
                continue
            if version >= 9:
                check = ctx.groups.validate_offset_fetch(group.group_id, group.member_id, group.member_epoch)
                if check != ErrorCode.NONE:
                    groups.append(
                        OffsetFetchResponse.OffsetFetchResponseGroup(
                            group_id=group.group_id, topics=[], error_code=check
                        )
                    )
                    continue
            wanted = None if group.topics is None else [(t.name, list(t.partition_indexes)) for t in group.topics]
            topics = [
                OffsetFetchResponse.OffsetFetchResponseTopics(
                    name=topic,
                    partitions=await _answers(OffsetFetchResponse.OffsetFetchResponsePartitions, rows, turns),
                )
                for topic, rows in await _fetch_group(ctx, group.group_id, wanted, turns, request.require_stable)
            ]
            groups.append(
                OffsetFetchResponse.OffsetFetchResponseGroup(
                    group_id=group.group_id, topics=topics, error_code=ErrorCode.NONE
                )
            )
        return OffsetFetchResponse(throttle_time_ms=0, groups=groups)
    if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.GROUP, request.group_id):
        raise KafkaError(ErrorCode.GROUP_AUTHORIZATION_FAILED, GROUP_DENIED)
    ctx.groups.require_coordinator(request.group_id)
    wanted = None if request.topics is None else [(t.name, list(t.partition_indexes)) for t in request.topics]
    stable = version >= 7 and request.require_stable
    legacy_topics = [  # before v8: one group, its topics at the top level
        OffsetFetchResponse.OffsetFetchResponseTopic(
            name=topic, partitions=await _answers(OffsetFetchResponse.OffsetFetchResponsePartition, rows, turns)
        )
        for topic, rows in await _fetch_group(ctx, request.group_id, wanted, turns, stable)
    ]
    return OffsetFetchResponse(throttle_time_ms=0, topics=legacy_topics, error_code=ErrorCode.NONE)


async def handle_offset_delete(ctx: RequestContext, request: OffsetDeleteRequest) -> OffsetDeleteResponse:
    if not ctx.authorize(AclOperation.DELETE, ResourceType.GROUP, request.group_id):
        raise KafkaError(ErrorCode.GROUP_AUTHORIZATION_FAILED, GROUP_DENIED)
    # Topics the principal may not READ are answered so whatever the group's state, as Kafka answers them
    # before asking the coordinator.
    unreadable = [
        OffsetDeleteResponse.OffsetDeleteResponseTopic(
            name=topic.name,
            partitions=[
                OffsetDeleteResponse.OffsetDeleteResponsePartition(
                    partition_index=part.partition_index, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED
                )
                for part in topic.partitions
            ],
        )
        for topic in request.topics
        if not ctx.authorize(AclOperation.READ, ResourceType.TOPIC, topic.name)
    ]
    unreadable_names = {topic.name for topic in unreadable}
    router = ctx.groups
    code = router.coordinator_error(request.group_id)
    if code != ErrorCode.NONE:
        return OffsetDeleteResponse(error_code=code, throttle_time_ms=0, topics=unreadable)
    if not router.is_known(request.group_id):
        return OffsetDeleteResponse(error_code=ErrorCode.GROUP_ID_NOT_FOUND, throttle_time_ms=0, topics=unreadable)
    subscribed: set[str] = set()
    group = router.classic_group(request.group_id)
    consumer_group = router.consumer_group(request.group_id)
    if consumer_group is not None:
        subscribed = consumer_group.subscribed_topic_names()
    elif group is not None and group.members:
        group_topics = group.subscribed_topics()
        if group_topics is None:
            return OffsetDeleteResponse(error_code=ErrorCode.NON_EMPTY_GROUP, throttle_time_ms=0, topics=unreadable)
        subscribed = group_topics
    topics = []
    doomed = []
    for topic in request.topics:
        if topic.name in unreadable_names:
            continue
        partitions = []
        for part in topic.partitions:
            if topic.name in subscribed:
                code = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            elif ctx.topics.topic(topic.name) is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                code = ErrorCode.NONE
                doomed.append((topic.name, part.partition_index))
            partitions.append(
                OffsetDeleteResponse.OffsetDeleteResponsePartition(
                    partition_index=part.partition_index, error_code=code
                )
            )
        topics.append(OffsetDeleteResponse.OffsetDeleteResponseTopic(name=topic.name, partitions=partitions))
    try:
        end_offset = ctx.groups.offsets.delete(request.group_id, doomed)
    except OffsetStoreError:  # nothing was deleted; as Kafka maps a failed __consumer_offsets write
        return OffsetDeleteResponse(error_code=ErrorCode.NOT_COORDINATOR, throttle_time_ms=0, topics=[])
    try:
        # Answered once the tombstones are committed, as Kafka's coordinator answers its writes; if they cannot
        # be, the error as Kafka maps it, alone (the offsets stay deleted: Kafka does not undo such a write).
        await ctx.groups.offsets.committed(request.group_id, end_offset)
    except KafkaError as exc:
        return OffsetDeleteResponse(error_code=write_error_answer(exc.code), throttle_time_ms=0, topics=[])
    return OffsetDeleteResponse(error_code=ErrorCode.NONE, throttle_time_ms=0, topics=unreadable + topics)
