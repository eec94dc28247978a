"""Broker-side compression: a topic's compression.type other than ``producer``, as Kafka 4.3's LogValidator does it.

Kafka's rules (LogValidator.validateMessagesAndAssignOffsetsCompressed, KIP-390 for the levels):

- ``producer`` keeps every batch as the producer sent it; any other value names the codec the log stores.
- A batch already in that codec is kept (in place: the log only sets its offsets, leader epoch and max
  timestamp). So is an uncompressed control batch: markers are never compressed (kbroker writes its markers
  without coming here). Every other batch is rebuilt: its records are read and written into one new batch in
  the topic's codec at the topic's level, uncompressed -> compressed, compressed -> uncompressed or between codecs.
- The rebuilt batch keeps the producer id, epoch and base sequence and the transactional flag (so idempotent
  duplicate detection is unchanged); the log gives it its offsets and partition leader epoch as for any batch.
  Its records are Kafka's builder's: attributes 0, offset deltas 0..n-1 (a batch whose inner offsets were not
  in order is rebuilt like any other, so it is accepted here), timestamps relative to the first record's (the
  batch's base timestamp), the max timestamp the largest record timestamp. A LogAppendTime topic then sets the
  type and the append time as the max timestamp, as for every batch.
- A rebuilt batch larger than max.message.bytes is refused (MESSAGE_TOO_LARGE, Kafka's RecordTooLargeException);
  a record timestamp below -1 fails Kafka's builder (UNKNOWN_SERVER_ERROR).

What a rebuild costs: the records are decompressed, then compressed in the target codec. Records that are
already byte for byte what Kafka's builder writes (every client's: attributes 0, offset delta = index, the first
record's timestamp delta 0) are recompressed as they are, after one pass that reads three small fields of
each; only other batches are decoded record by record and encoded again.

Levels (KIP-390): gzip 1-9 or -1 (zlib's default, 6); zstd -131072..22 (0 is zstd's default, 3); lz4 1-17,
where Kafka's default 9 means lz4-java's fast compressor and any other level LZ4HC at that level. cramjam's
LZ4 frame level is below 2 the same fast compressor and 2-12 LZ4HC (above 12 counts as 12, as in lz4's own
LZ4HC, which lz4-java wraps); LZ4HC level 1 is lz4's level 2, so Kafka's 1 is written as 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from kbroker.storage.validation import decompressed_records
from protocol import compression
from protocol.compression import Codec
from protocol.errors import ErrorCode, KafkaError
from protocol.exceptions import DecodeError
from protocol.records import (
    DEFAULT_MAX_DECOMPRESSED,
    HEADER_SIZE,
    TRANSACTIONAL_BIT,
    BatchHeader,
    Record,
    builder_timestamp_deltas,
    decode_records,
    encode_record,
)
from protocol.records import rebuild_batch as batch_like

NO_TIMESTAMP = -1
PRODUCER = "producer"
CODEC_OF_COMPRESSION_TYPE: dict[str, int | None] = {
    PRODUCER: None,
    "uncompressed": Codec.NONE,
    "gzip": Codec.GZIP,
    "snappy": Codec.SNAPPY,
    "lz4": Codec.LZ4,
    "zstd": Codec.ZSTD,
}
KAFKA_LZ4_FAST_LEVEL = 9  # Kafka's default lz4 level, written with lz4-java's fast compressor
_LZ4F_FAST = 0  # an LZ4 frame level below LZ4HC's range: lz4's fast compressor, acceleration 1
_LZ4HC_LOWEST = 2  # LZ4HC levels below 2 are level 2 in lz4
_GZIP_DEFAULT = 6  # zlib's Z_DEFAULT_COMPRESSION, Kafka's -1


class TopicCompression(NamedTuple):
    """compression.type and compression.*.level of a topic (Kafka's defaults)."""

    codec: int | None = None  # the codec the log stores; None: the producer's (compression.type=producer)
    gzip_level: int = -1
    lz4_level: int = KAFKA_LZ4_FAST_LEVEL
    zstd_level: int = 3

    @classmethod
    def from_topic_configs(cls, configs: Mapping[str, str]) -> TopicCompression:
        """From effective topic configs (already validated by kbroker/config_registry.py)."""
        base = cls()
        return cls(
            codec=CODEC_OF_COMPRESSION_TYPE[configs.get("compression.type", PRODUCER).strip()],
            gzip_level=int(configs.get("compression.gzip.level", base.gzip_level)),
            lz4_level=int(configs.get("compression.lz4.level", base.lz4_level)),
            zstd_level=int(configs.get("compression.zstd.level", base.zstd_level)),
        )

    def rebuilds(self, header: BatchHeader) -> bool:
        """Whether a batch with ``header`` is rebuilt in the topic's codec rather than kept as sent."""
        if self.codec is None or header.compression == self.codec:
            return False
        return not (header.is_control and header.compression == Codec.NONE)

    def library_level(self) -> int | None:
        """The topic's level for its codec, as cramjam takes it (None: snappy and uncompressed have none)."""
        if self.codec == Codec.GZIP:
            return _GZIP_DEFAULT if self.gzip_level == -1 else self.gzip_level
        if self.codec == Codec.ZSTD:
            return self.zstd_level
        if self.codec == Codec.LZ4:
            if self.lz4_level == KAFKA_LZ4_FAST_LEVEL:
                return _LZ4F_FAST
            return max(self.lz4_level, _LZ4HC_LOWEST)
        return None


def rebuild_batch(
    batch: bytes | bytearray | memoryview,
    header: BatchHeader,
    target: TopicCompression,
    max_batch_bytes: int,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
) -> tuple[bytearray, BatchHeader]:
    """``batch`` (one validated client batch) rebuilt in ``target``'s codec, or KafkaError.

    The new batch has base offset 0 and the source's partition leader epoch: the log assigns both, as it does
    for a batch kept as sent. Its max timestamp is the records' (CreateTime); a LogAppendTime log sets its own.
    """
    if target.codec is None:
        raise ValueError("compression.type=producer keeps batches as sent")
    body = decompressed_records(batch, header, max_decompressed)
    count = header.records_count
    deltas = None if header.is_log_append_time else builder_timestamp_deltas(body, count)
    if deltas is not None:
        records: bytes | memoryview = body
        base_timestamp = header.base_timestamp
        lowest, highest = base_timestamp + deltas[0], base_timestamp + deltas[1]
    else:
        records, base_timestamp, lowest, highest = _reencoded(batch, header, max_decompressed)
    if lowest < NO_TIMESTAMP:
        raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"Invalid negative timestamp {lowest}")
    payload = compression.compress(target.codec, records, target.library_level())
    size = HEADER_SIZE + len(payload)
    if size > max_batch_bytes:
        raise KafkaError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"Message batch size is {size} bytes in append, which exceeds the maximum configured size of "
            f"{max_batch_bytes}.",
        )
    renumbered = header._replace(base_offset=0, last_offset_delta=count - 1)  # offsets 0..count-1, as rebuilt
    attributes = target.codec | (TRANSACTIONAL_BIT if header.is_transactional else 0)
    rebuilt = batch_like(
        renumbered,
        payload,
        count,
        base_timestamp=base_timestamp,
        max_timestamp=max(NO_TIMESTAMP, highest),
        attributes=attributes,
    )
    return rebuilt, BatchHeader.parse(rebuilt)


def _reencoded(
    batch: bytes | bytearray | memoryview, header: BatchHeader, max_decompressed: int
) -> tuple[bytes, int, int, int]:
    """The records encoded as Kafka's builder writes them: (records, base timestamp, smallest, largest timestamp).

    A record's timestamp is what a reader of the source batch sees: the max timestamp for every record of a
    batch a client marked LogAppendTime, else the base timestamp plus its delta.
    """
    try:
        decoded = decode_records(batch, max_decompressed)
    except DecodeError as exc:
        raise KafkaError(ErrorCode.INVALID_RECORD, str(exc)) from None
    if header.is_log_append_time:
        timestamps = [header.max_timestamp] * len(decoded)
    else:
        timestamps = [header.base_timestamp + record.timestamp_delta for record in decoded]
    base = timestamps[0]
    records = b"".join(
        encode_record(Record(index, timestamp - base, record.key, record.value, record.headers))
        for index, (record, timestamp) in enumerate(zip(decoded, timestamps, strict=True))
    )
    return records, base, min(timestamps), max(timestamps)
