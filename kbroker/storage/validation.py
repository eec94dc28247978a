"""The one place a record batch is checked before it is appended (Kafka's LogValidator, header-level part).

Produce and every other writer hand a batch here before the log assigns its offsets (recovery scans of
stored batches use protocol.records.header_problem). Only the header and the CRC are read: records are
decoded where a feature needs them, not here.
"""

from __future__ import annotations

from protocol.errors import ErrorCode, KafkaError
from protocol.records import CONTROL_BIT, HEADER_SIZE, LOG_OVERHEAD, BatchHeader, validate_crc


def validate_batch(records: bytes | bytearray | memoryview, max_batch_bytes: int) -> BatchHeader:
    """The header of ``records`` if it is exactly one well-formed batch a client may write; KafkaError otherwise.

    A produce request carries exactly one batch (magic 2) per partition, as Kafka requires. Codes and order
    follow Kafka: CORRUPT_MESSAGE for bytes that are not a valid batch, INVALID_RECORD for a valid batch that
    may not be written, MESSAGE_TOO_LARGE past ``max_batch_bytes`` (max.message.bytes).
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
    if size > max_batch_bytes:
        raise KafkaError(ErrorCode.MESSAGE_TOO_LARGE, f"batch of {size} bytes exceeds {max_batch_bytes}")
    if header.records_count <= 0:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch holds no records")
    if header.attributes & CONTROL_BIT:
        raise KafkaError(ErrorCode.INVALID_RECORD, "clients may not write control batches")
    if not validate_crc(records):
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "batch CRC does not match its contents")
    return header
