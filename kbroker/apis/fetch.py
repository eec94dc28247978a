"""Fetch (key 1): serve record batches from segment files as they are, with long polling.

A fetch that finds fewer than min_bytes waits until max_wait_ms for an append to one of its partitions;
appends wake it through the broker's per-partition watchers, so nothing polls. Fetch sessions (KIP-227)
are answered sessionless: session id 0 tells the client to keep sending full fetch requests.
"""

from __future__ import annotations

import uuid

import trio

from kbroker.apis.context import RequestContext
from kbroker.storage import OffsetOutOfRange
from protocol.errors import ErrorCode
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse

READ_COMMITTED = 1
FINAL_EPOCH = -1
PartitionData = FetchResponse.PartitionData


def _partition_error(index: int, code: ErrorCode) -> PartitionData:
    return PartitionData(partition_index=index, error_code=code, high_watermark=-1, records=None)


async def handle_fetch(ctx: RequestContext, request: FetchRequest) -> FetchResponse:
    version = ctx.api_version
    if version >= 7:
        if request.session_id != 0:
            return FetchResponse(error_code=ErrorCode.FETCH_SESSION_ID_NOT_FOUND, session_id=0)
        if request.session_epoch not in (0, FINAL_EPOCH):
            return FetchResponse(error_code=ErrorCode.INVALID_FETCH_SESSION_EPOCH, session_id=0)
    deadline = trio.current_time() + max(request.max_wait_ms, 0) / 1000
    keys = _partition_keys(ctx, request)
    while True:
        response, total_bytes, has_error = _read_all(ctx, request)
        if (
            total_bytes >= request.min_bytes
            or has_error
            or trio.current_time() >= deadline
            or ctx.broker.draining
            or not keys
        ):
            return response
        event = ctx.broker.watch(keys)
        try:
            with trio.move_on_at(deadline):
                await event.wait()
        finally:
            ctx.broker.unwatch(keys, event)


def _topic_name(ctx: RequestContext, topic: FetchRequest.FetchTopic) -> str | None:
    if ctx.api_version >= 13:
        info = ctx.broker.logs.topic_by_id(topic.topic_id)
        return info.name if info is not None else None
    return topic.topic


def _partition_keys(ctx: RequestContext, request: FetchRequest) -> list[tuple[str, int]]:
    keys = []
    for topic in request.topics:
        name = _topic_name(ctx, topic)
        if name is not None:
            keys.extend((name, p.partition) for p in topic.partitions)
    return keys


def _read_all(ctx: RequestContext, request: FetchRequest) -> tuple[FetchResponse, int, bool]:
    broker = ctx.broker
    read_committed = request.isolation_level == READ_COMMITTED
    remaining = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
    total = 0
    has_error = False
    topics = []
    for topic in request.topics:
        name = _topic_name(ctx, topic)
        partitions = []
        for part in topic.partitions:
            if name is None:
                code = ErrorCode.UNKNOWN_TOPIC_ID if ctx.api_version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                partitions.append(_partition_error(part.partition, code))
                has_error = True
                continue
            plog = broker.partition(name, part.partition)
            if plog is None:
                partitions.append(_partition_error(part.partition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                has_error = True
                continue
            high_watermark = plog.high_watermark
            stable = plog.last_stable_offset
            upper = stable if read_committed else high_watermark
            data = PartitionData(
                partition_index=part.partition,
                error_code=ErrorCode.NONE,
                high_watermark=high_watermark,
                last_stable_offset=stable,
                log_start_offset=plog.log_start_offset,
                aborted_transactions=None,
                records=b"",
            )
            limit = min(part.partition_max_bytes, remaining)
            try:
                # KIP-74: the first partition with data returns at least one whole batch, whatever the limits.
                chunk = plog.read(part.fetch_offset, limit, max_offset=upper, min_one_batch=total == 0)
            except OffsetOutOfRange:
                data.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                data.records = None
                has_error = True
                partitions.append(data)
                continue
            data.records = chunk.region()  # sent from the segment file as it is (sendfile)
            if read_committed and chunk.size:
                aborted = plog.aborted_transactions(part.fetch_offset, chunk.last_offset + 1)
                data.aborted_transactions = [
                    FetchResponse.AbortedTransaction(producer_id=pid, first_offset=first) for pid, first in aborted
                ]
            total += chunk.size
            remaining -= chunk.size
            partitions.append(data)
        topics.append(
            FetchResponse.FetchableTopicResponse(
                topic=name or topic.topic, topic_id=topic.topic_id or uuid.UUID(int=0), partitions=partitions
            )
        )
    response = FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, session_id=0, responses=topics)
    return response, total, has_error
