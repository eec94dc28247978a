"""Produce (key 0): validate record batches without decoding their records, then append them.

Batches stay opaque bytes: the header and CRC are checked, offsets are assigned in place by the log, and
the bytes go to disk as received. Records are only decoded where a feature needs them.
"""

from __future__ import annotations

import logging
import time

import trio

from kbroker.apis.context import RequestContext
from protocol.errors import ErrorCode
from protocol.messages.produce_request import ProduceRequest
from protocol.messages.produce_response import ProduceResponse
from protocol.records import CONTROL_BIT, HEADER_SIZE, LOG_OVERHEAD, BatchHeader, validate_crc

log = logging.getLogger("kbroker.produce")

PartitionResponse = ProduceResponse.PartitionProduceResponse


def _error(index: int, code: ErrorCode, message: str | None = None) -> PartitionResponse:
    return PartitionResponse(index=index, error_code=code, base_offset=-1, error_message=message)


def validate_records(
    records: bytes | bytearray | memoryview, max_batch_bytes: int
) -> tuple[ErrorCode, str | None, BatchHeader | None]:
    """Kafka's checks on a produce payload that need only the batch header and CRC; the header if it passes.

    A produce request carries exactly one batch per partition (magic 2), as Kafka requires.
    """
    size = len(records)
    if size < HEADER_SIZE:
        return (
            ErrorCode.CORRUPT_MESSAGE,
            "no record batch" if not size else f"{size} bytes are too few for a batch",
            None,
        )
    header = BatchHeader.parse(records)
    if header.magic != 2:
        return ErrorCode.CORRUPT_MESSAGE, f"record batch magic {header.magic} is not supported", None
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or header.size > size:
        return ErrorCode.CORRUPT_MESSAGE, f"record batch length {header.batch_length} does not fit the data", None
    if header.size != size:
        return ErrorCode.INVALID_RECORD, "a produce request must hold exactly one batch per partition", None
    if size > max_batch_bytes:
        return ErrorCode.MESSAGE_TOO_LARGE, f"batch of {size} bytes exceeds {max_batch_bytes}", None
    if header.records_count <= 0:
        return ErrorCode.CORRUPT_MESSAGE, "batch holds no records", None
    if header.attributes & CONTROL_BIT:
        return ErrorCode.INVALID_RECORD, "clients may not write control batches", None
    if not validate_crc(records):
        return ErrorCode.CORRUPT_MESSAGE, "batch CRC does not match its contents", None
    return ErrorCode.NONE, None, header


async def handle_produce(ctx: RequestContext, request: ProduceRequest) -> ProduceResponse | None:
    broker = ctx.broker
    acks = request.acks
    now_ms = int(time.time() * 1000)
    by_id = ctx.api_version >= 13
    topics: list[ProduceResponse.TopicProduceResponse] = []
    to_flush = []
    for topic_data in request.topic_data:
        info = broker.logs.topic_by_id(topic_data.topic_id) if by_id else broker.topic(topic_data.name)
        results: list[PartitionResponse] = []
        for part in topic_data.partition_data:
            if acks not in (-1, 0, 1):
                results.append(_error(part.index, ErrorCode.INVALID_REQUIRED_ACKS))
                continue
            if info is None:
                code = ErrorCode.UNKNOWN_TOPIC_ID if by_id else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                results.append(_error(part.index, code))
                continue
            plog = broker.partition(info.name, part.index)
            if plog is None:
                results.append(_error(part.index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            records = part.records
            if not isinstance(records, bytearray) and (not isinstance(records, memoryview) or records.readonly):
                records = bytearray(records or b"")  # offsets are assigned in place
            code, message, header = validate_records(records, plog.config.max_message_bytes)
            if header is None:
                log.debug("rejecting produce to %s-%d: %s", info.name, part.index, message)
                results.append(_error(part.index, code, message))
                continue
            result = plog.append(
                records,
                header,
                now_ms=now_ms,
                timestamp_type_log_append=plog.config.message_timestamp_type == "LogAppendTime",
            )
            if result.error_code != ErrorCode.NONE:
                results.append(_error(part.index, ErrorCode(result.error_code), result.error_message))
                continue
            if plog.needs_flush:
                to_flush.append(plog)
            broker.notify_append(info.name, part.index)
            results.append(
                PartitionResponse(
                    index=part.index,
                    error_code=ErrorCode.NONE,
                    base_offset=result.base_offset,
                    log_append_time_ms=result.log_append_time_ms,
                    log_start_offset=result.log_start_offset,
                )
            )
        topics.append(
            ProduceResponse.TopicProduceResponse(
                name=topic_data.name, topic_id=topic_data.topic_id, partition_responses=results
            )
        )
    if to_flush:
        # flush.messages reached: fsync before acknowledging, off the event loop.
        def flush_all() -> None:
            for plog in to_flush:
                plog.flush()

        await trio.to_thread.run_sync(flush_all)
    if acks == 0:
        return None
    return ProduceResponse(responses=topics, throttle_time_ms=0)
