"""The one place a record batch is checked before it is appended (Kafka's LogValidator and the checks before it).

Produce and every other writer hand a batch here before the log assigns its offsets (recovery scans of
stored batches use protocol.records.header_problem, which is deliberately looser: see its docstring). The
order, the error codes and the messages are Kafka 4.3's, as its broker answers and logs them (Kafka puts
the text in its log, not in the Produce response; kbroker sends it as the partition's error message):

1. framing (CORRUPT_MESSAGE), one batch per partition, base offset 0, max.message.bytes, the CRC;
2. the header against itself (INVALID_RECORD): the offset range, the count, control batches, a producer id
   without a sequence;
3. the records against the header: Kafka iterates every record of every batch it appends, so kbroker walks
   them too (protocol.records.walk_records: lengths, fields and headers, no copies). A compressed batch is
   decompressed for that walk within ``max_decompressed`` bytes, as Kafka decompresses it;
4. each record's timestamp against message.timestamp.before.max.ms / after.max.ms on a CreateTime topic
   (INVALID_TIMESTAMP with one record error per record out of the window, Kafka's texts): the walk gives the
   smallest and largest timestamps, and only a batch that falls outside is decoded to name its records;
5. the max timestamp, which Kafka does not trust but recomputes from the records (and a client's
   LogAppendTime bit, which it clears): the batch is corrected in place and its CRC recomputed.

A batch the topic's compression.type will rebuild in another codec (``target_codec``, see
kbroker/storage/recompress.py) gets the same checks but for two: Kafka rebuilds it whatever its inner offset
deltas, and the rebuild sets the max timestamp, so it is not corrected here.
"""

from __future__ import annotations

from typing import NamedTuple

from protocol import compression
from protocol.errors import ErrorCode, KafkaError
from protocol.exceptions import DecodeError
from protocol.records import (
    DEFAULT_MAX_DECOMPRESSED,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    RecordsWalk,
    decode_records,
    keyless_record_indexes,
    set_max_timestamp,
    validate_crc,
    walk_records,
)

NO_TIMESTAMP = -1
INVALID_TIMESTAMPS = "One or more records have been rejected due to invalid timestamp"


class RecordValidationError(KafkaError):
    """A batch refused for some of its records: Kafka's answer names each (batch index, message)."""

    def __init__(self, code: ErrorCode, message: str, record_errors: list[tuple[int, str]]) -> None:
        super().__init__(code, message)
        self.record_errors = record_errors


class TimestampWindow(NamedTuple):
    """The CreateTime timestamps a topic accepts now: [now - before.max.ms, now + after.max.ms]."""

    earliest: int
    latest: int

    @classmethod
    def around(cls, now_ms: int, before_max_ms: int, after_max_ms: int) -> TimestampWindow:
        return cls(now_ms - before_max_ms, now_ms + after_max_ms)


_KNOWN_CODECS = frozenset(int(codec) for codec in compression.Codec)


def validate_batch(
    records: bytes | bytearray | memoryview,
    max_batch_bytes: int,
    *,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    timestamps: TimestampWindow | None = None,
    target_codec: int | None = None,
) -> BatchHeader:
    """The header of ``records`` if it is exactly one well-formed batch a client may write; KafkaError otherwise.

    A produce request carries exactly one batch (magic 2) per partition, as Kafka requires. A batch whose max
    timestamp (or timestamp type) disagrees with its records is corrected in place, so ``records`` must be
    writable for such a batch (a read-only one is refused); the header returned describes the corrected batch.
    With ``timestamps`` (a CreateTime topic) every record's timestamp must be in the window. ``target_codec``
    is the codec the topic stores (None: compression.type=producer); a batch in another codec is left for the
    log to rebuild, unchanged here.
    """
    size = len(records)
    if size < HEADER_SIZE:
        raise KafkaError(
            ErrorCode.CORRUPT_MESSAGE, "no record batch" if not size else f"{size} bytes are too few for a batch"
        )
    header = BatchHeader.parse(records)
    if header.magic != 2:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, f"record batch magic {header.magic} is not supported")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or header.size > size:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, f"record batch length {header.batch_length} does not fit the data")
    if header.size != size:
        raise KafkaError(ErrorCode.INVALID_RECORD, "a produce request must hold exactly one batch per partition")
    if header.base_offset != 0:
        raise KafkaError(
            ErrorCode.INVALID_RECORD,
            f"The baseOffset of the record batch in the append should be 0, but it is {header.base_offset}",
        )
    if size > max_batch_bytes:
        raise KafkaError(ErrorCode.MESSAGE_TOO_LARGE, f"batch of {size} bytes exceeds {max_batch_bytes}")
    if not validate_crc(records):
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch CRC does not match its contents")
    if header.compression not in _KNOWN_CODECS:
        # Kafka fails on CompressionType.forId with an IllegalArgumentException: UNKNOWN_SERVER_ERROR.
        raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"Unknown compression type id: {header.compression}")
    _check_header(header)
    rebuilt = target_codec is not None and target_codec != header.compression
    walk = _walk(records, header, max_decompressed, rebuilt)
    if timestamps is not None and not header.is_log_append_time:
        earliest, latest = (
            header.base_timestamp + walk.min_timestamp_delta,
            header.base_timestamp + walk.max_timestamp_delta,
        )
        if earliest < timestamps.earliest or latest > timestamps.latest:
            _check_each_timestamp(records, header, timestamps, max_decompressed)
    if rebuilt:
        return header
    return _settle_max_timestamp(records, header, walk.max_timestamp_delta)


def _check_each_timestamp(
    records: bytes | bytearray | memoryview, header: BatchHeader, window: TimestampWindow, max_decompressed: int
) -> None:
    """Kafka's LogValidator.validateTimestamp for each record, once the walk saw one may be out of the window."""
    errors = []
    for index, record in enumerate(decode_records(records, max_decompressed)):
        timestamp = header.base_timestamp + record.timestamp_delta
        if timestamp != NO_TIMESTAMP and not window.earliest <= timestamp <= window.latest:
            errors.append(
                (
                    index,
                    f"Timestamp {timestamp} of message with offset {index} is out of range. The timestamp should be "
                    f"within [{window.earliest}, {window.latest}]",
                )
            )
    if errors:
        raise RecordValidationError(ErrorCode.INVALID_TIMESTAMP, INVALID_TIMESTAMPS, errors)


def _check_header(header: BatchHeader) -> None:
    """LogValidator.validateBatch for a client's batch: the header's own fields against each other."""
    last_offset = header.base_offset + header.last_offset_delta
    if header.last_offset_delta < 0:
        raise KafkaError(
            ErrorCode.INVALID_RECORD,
            f"Batch has an invalid offset range: [{header.base_offset}, {last_offset}]",
        )
    if header.records_count <= 0:
        raise KafkaError(ErrorCode.INVALID_RECORD, f"Invalid reported count for record batch: {header.records_count}")
    if header.records_count != header.last_offset_delta + 1:
        raise KafkaError(
            ErrorCode.INVALID_RECORD,
            f"Inconsistent batch offset range [{header.base_offset}, {last_offset}] "
            f"and count of records {header.records_count}",
        )
    if header.is_control:
        raise KafkaError(ErrorCode.INVALID_RECORD, "Clients are not allowed to write control records")
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise KafkaError(
            ErrorCode.INVALID_RECORD,
            f"Invalid sequence number {header.base_sequence} in record batch with producerId {header.producer_id}",
        )


def decompressed_records(
    batch: bytes | bytearray | memoryview, header: BatchHeader, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED
) -> bytes | memoryview:
    """A batch's records, decompressed if need be; one that cannot be is Kafka's UNKNOWN_SERVER_ERROR."""
    body: bytes | memoryview = memoryview(batch)[HEADER_SIZE : header.size]
    if header.compression:
        try:
            body = compression.decompress(header.compression, body, max_decompressed)
        except DecodeError as exc:  # Kafka: a KafkaException from the decompressing stream
            raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"Failed to decompress record stream: {exc}") from None
    return body


def _walk(
    records: bytes | bytearray | memoryview, header: BatchHeader, max_decompressed: int, rebuilt: bool
) -> RecordsWalk:
    body = decompressed_records(records, header, max_decompressed)
    try:
        walk = walk_records(body, header.records_count, check_offsets=bool(header.compression))
    except DecodeError as exc:
        raise KafkaError(ErrorCode.INVALID_RECORD, str(exc)) from None
    if header.compression and not walk.offset_deltas_in_order and not rebuilt:
        # Kafka must rebuild such a batch with fresh inner offsets; 4.3 fails doing it when the codec stays (the
        # records it read for validation skipped their keys), so it answers UNKNOWN_SERVER_ERROR. kbroker refuses
        # it the same. A batch recompressed anyway is read whole and rebuilt: Kafka accepts it, and so does kbroker.
        raise KafkaError(
            ErrorCode.UNKNOWN_SERVER_ERROR,
            "the records of a compressed batch must have offset deltas 0 to count - 1 in order",
        )
    return walk


def _settle_max_timestamp(
    records: bytes | bytearray | memoryview, header: BatchHeader, max_timestamp_delta: int
) -> BatchHeader:
    """Kafka's max timestamp: the largest record timestamp (or none); a client's LogAppendTime bit is cleared."""
    if header.is_log_append_time:
        # Every record's timestamp is the header's max timestamp; Kafka keeps it and makes the type CreateTime.
        wanted = header.max_timestamp
    else:
        wanted = max(NO_TIMESTAMP, header.base_timestamp + max_timestamp_delta)
    if wanted == header.max_timestamp and not header.is_log_append_time:
        return header
    if isinstance(records, bytes) or (isinstance(records, memoryview) and records.readonly):
        raise KafkaError(
            ErrorCode.INVALID_RECORD,
            f"max timestamp {header.max_timestamp} does not match the records' {wanted} (read-only batch)",
        )
    set_max_timestamp(records, wanted, log_append_time=False)
    return BatchHeader.parse(records)


def keyless_records(batch: bytes | bytearray | memoryview, header: BatchHeader) -> list[int]:
    """The indexes of the records without a key (which a compacted topic refuses), decompressing if need be."""
    return keyless_record_indexes(decompressed_records(batch, header), header.records_count)


def rejected_records_message(problems: list[str], indexes: list[int]) -> str:
    """Kafka's message for a batch refused for some of its records (LogValidator.processRecordErrors)."""
    pairs = list(zip(indexes, problems, strict=True))[:3]
    shown = ", ".join(f"RecordError(batchIndex={index}, message='{problem}')" for index, problem in pairs)
    return (
        f"One or more records have been rejected due to {len(indexes)} record errors in total, and only showing "
        f"the first three errors at most: [{shown}]"
    )
