"""Broker-side compression (kbroker/storage/recompress.py) through the log's append over both backends, as Kafka's
LogValidator: every source codec to every compression.type, the rebuilt batch's bytes exact; in-place cases;
transactional and control batches; LogAppendTime; idempotent retries; timestamps and sizes checked on rebuilt
batches."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.config import BrokerConfig
from kbroker.storage import LogConfig, PartitionLog
from kbroker.storage.memory import MemoryBackend
from kbroker.storage.recompress import CODEC_OF_COMPRESSION_TYPE, TopicCompression
from protocol import compression
from protocol.compression import Codec
from protocol.errors import ErrorCode
from protocol.records import (
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TRANSACTIONAL_BIT,
    BatchHeader,
    Record,
    build_batch,
    compute_crc,
    decode_records,
    encode_record,
    iter_batches,
    validate_crc,
)

NOW = 1_700_000_000_000
PRODUCER_ID, EPOCH = 4242, 3
SOURCES = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]
TARGETS = ["uncompressed", "gzip", "snappy", "lz4", "zstd"]
LEVELS = {"gzip": 6, "snappy": None, "lz4": 0, "zstd": 3, "uncompressed": None}  # Kafka's defaults, as cramjam's

LogFactory = Callable[..., PartitionLog]


@pytest.fixture(params=["file", "memory"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    """``make_log(topic configs)``: an empty partition log over the backend under test."""

    def make(configs: dict[str, str]) -> PartitionLog:
        settings = LogConfig.from_topic_configs(configs)
        if request.param == "file":
            return PartitionLog("t", 0, tmp_path / "t-0", settings, clean=True)
        return PartitionLog("t", 0, Path("t-0"), settings, clean=True, backend=MemoryBackend(Path("t-0")))

    return make


def sample_records(count: int = 6) -> list[Record]:
    """Records as clients write them: offset delta = index, the first timestamp delta 0, attributes 0."""
    return [
        Record(
            offset_delta=i,
            timestamp_delta=3 * i,
            key=None if i == 2 else f"key-{i}".encode(),
            value=None if i == 4 else (f"value {i} " * 20).encode(),
            headers=[("h", str(i).encode()), ("empty", None)],
        )
        for i in range(count)
    ]


def client_batch(records: list[Record], codec: int, *, sequence: int = 0, transactional: bool = False) -> bytearray:
    return bytearray(
        build_batch(
            records,
            compression_type=codec,
            producer_id=PRODUCER_ID,
            producer_epoch=EPOCH,
            base_sequence=sequence,
            is_transactional=transactional,
            base_timestamp=NOW,
        )
    )


def expected_rebuild(
    records: list[Record],
    codec: int,
    level: int | None,
    *,
    base_offset: int = 0,
    base_timestamp: int = NOW,
    max_timestamp: int | None = None,
    sequence: int = 0,
    attributes: int = 0,
) -> bytes:
    """The batch Kafka's builder writes for these (already renumbered) records, independently of recompress.py."""
    payload = compression.compress(codec, b"".join(encode_record(r) for r in records), level)
    batch = bytearray(HEADER_SIZE)
    if max_timestamp is None:
        max_timestamp = base_timestamp + max(r.timestamp_delta for r in records)
    HEADER.pack_into(
        batch,
        0,
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(payload),
        0,  # the partition leader epoch of a log that never changed leader
        2,
        0,
        codec | attributes,
        len(records) - 1,
        base_timestamp,
        max_timestamp,
        PRODUCER_ID,
        EPOCH,
        sequence,
        len(records),
    )
    batch += payload
    struct.pack_into(">I", batch, 17, compute_crc(batch))
    return bytes(batch)


def as_stored(sent: bytes, base_offset: int) -> bytes:
    """A batch kept as sent: the log sets its base offset and partition leader epoch (0), outside the CRC."""
    data = bytearray(sent)
    struct.pack_into(">q", data, 0, base_offset)
    struct.pack_into(">i", data, 12, 0)
    return bytes(data)


def stored(log: PartitionLog) -> list[bytes]:
    return [bytes(view) for _, view in iter_batches(log.read(0, 1 << 24).read_bytes())]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("source", SOURCES, ids=[c.name.lower() for c in SOURCES])
def test_every_codec_to_every_compression_type(make_log: LogFactory, source: Codec, target: str) -> None:
    log = make_log({"compression.type": target})
    records = sample_records()
    first = client_batch(records, source)
    second = client_batch(records[:3], source, sequence=6)
    sent = [bytes(first), bytes(second)]
    assert log.append(first, now_ms=NOW).base_offset == 0
    assert log.append(second, now_ms=NOW).base_offset == 6
    batches = stored(log)
    codec = CODEC_OF_COMPRESSION_TYPE[target]
    if codec == source:  # in place: the producer's bytes, with the log's offsets
        assert batches == [as_stored(sent[0], 0), as_stored(sent[1], 6)]
    else:
        assert batches == [
            expected_rebuild(records, codec, LEVELS[target]),
            expected_rebuild(records[:3], codec, LEVELS[target], base_offset=6, sequence=6),
        ]
    for data in batches:
        header = BatchHeader.parse(data)
        assert validate_crc(data)
        assert header.compression == codec
        assert (header.producer_id, header.producer_epoch, header.is_transactional) == (PRODUCER_ID, EPOCH, False)
    # What a consumer reads: the same records, offsets and timestamps.
    read = [
        (h.base_offset + r.offset_delta, h.base_timestamp + r.timestamp_delta, r.key, r.value, r.headers)
        for h, view in iter_batches(b"".join(batches))
        for r in decode_records(view)
    ]
    wanted = [(r.offset_delta, NOW + r.timestamp_delta, r.key, r.value, r.headers) for r in records]
    wanted += [(6 + r.offset_delta, NOW + r.timestamp_delta, r.key, r.value, r.headers) for r in records[:3]]
    assert read == wanted
    assert log.log_end_offset == 9


def test_producer_keeps_every_batch_as_sent(make_log: LogFactory) -> None:
    log = make_log({"compression.type": "producer", "compression.zstd.level": "19"})
    for codec in SOURCES:
        log.append(client_batch(sample_records(2), codec, sequence=2 * codec), now_ms=NOW)
    assert [BatchHeader.parse(b).compression for b in stored(log)] == SOURCES


@pytest.mark.parametrize(
    ("target", "configs", "level"),
    [
        ("gzip", {"compression.gzip.level": "1"}, 1),
        ("gzip", {"compression.gzip.level": "9"}, 9),
        ("gzip", {}, 6),  # -1: zlib's default
        ("zstd", {"compression.zstd.level": "19"}, 19),
        ("zstd", {"compression.zstd.level": "-5"}, -5),
        ("lz4", {}, 0),  # Kafka's 9: lz4-java's fast compressor
        ("lz4", {"compression.lz4.level": "1"}, 2),  # LZ4HC level 1 is lz4's level 2
        ("lz4", {"compression.lz4.level": "12"}, 12),
        ("lz4", {"compression.lz4.level": "17"}, 17),  # lz4 counts it as 12
    ],
)
def test_levels(make_log: LogFactory, target: str, configs: dict[str, str], level: int) -> None:
    topic = {"compression.type": target, **configs}
    assert TopicCompression.from_topic_configs(topic).library_level() == level
    log = make_log(topic)
    records = sample_records(40)
    log.append(client_batch(records, Codec.NONE), now_ms=NOW)
    assert stored(log) == [expected_rebuild(records, CODEC_OF_COMPRESSION_TYPE[target], level)]


def test_records_kafka_would_write_otherwise_are_rebuilt(make_log: LogFactory) -> None:
    """Offset deltas out of order (even compressed: Kafka rebuilds it when the codec changes), a first timestamp
    delta that is not 0 and record attributes are rewritten as Kafka's builder writes records."""
    log = make_log({"compression.type": "gzip"})
    odd = [
        Record(offset_delta=5, timestamp_delta=10, key=b"a", value=b"1", attributes=0x40),
        Record(offset_delta=3, timestamp_delta=7, key=b"b", value=b"2"),
        Record(offset_delta=9, timestamp_delta=12, key=b"c", value=b"3"),
    ]
    batch = bytearray(build_batch(odd, compression_type=Codec.LZ4, base_timestamp=NOW))
    struct.pack_into(">i", batch, 23, 2)  # last offset delta = count - 1, as validation requires
    struct.pack_into(">I", batch, 17, compute_crc(batch))
    sequence_less = log.append(batch, now_ms=NOW)
    assert sequence_less.error_code == ErrorCode.NONE
    renumbered = [
        Record(offset_delta=0, timestamp_delta=0, key=b"a", value=b"1"),
        Record(offset_delta=1, timestamp_delta=-3, key=b"b", value=b"2"),
        Record(offset_delta=2, timestamp_delta=2, key=b"c", value=b"3"),
    ]
    [data] = stored(log)
    expected = bytearray(expected_rebuild(renumbered, Codec.GZIP, 6, base_timestamp=NOW + 10))
    HEADER.pack_into(  # this batch has no producer id
        expected, 0, *BatchHeader.parse(expected)._replace(producer_id=-1, producer_epoch=-1, base_sequence=-1)
    )
    struct.pack_into(">I", expected, 17, compute_crc(expected))
    assert data == bytes(expected)
    assert BatchHeader.parse(data).max_timestamp == NOW + 12


def test_same_codec_with_inner_offsets_out_of_order_is_refused_as_kafka(make_log: LogFactory) -> None:
    log = make_log({"compression.type": "lz4"})
    odd = [Record(offset_delta=1, key=b"a", value=b"1"), Record(offset_delta=0, key=b"b", value=b"2")]
    answer = log.append(bytearray(build_batch(odd, compression_type=Codec.LZ4, base_timestamp=NOW)), now_ms=NOW)
    assert answer.error_code == ErrorCode.UNKNOWN_SERVER_ERROR


def test_transactional_batches_keep_their_flag_and_markers_stay_uncompressed(make_log: LogFactory) -> None:
    log = make_log({"compression.type": "zstd"})
    records = sample_records(3)
    assert log.append(client_batch(records, Codec.LZ4, transactional=True), now_ms=NOW).base_offset == 0
    assert log.append_marker(PRODUCER_ID, EPOCH, True, 0, now_ms=NOW + 5).base_offset == 3
    data, marker = stored(log)
    assert data == expected_rebuild(records, Codec.ZSTD, 3, attributes=TRANSACTIONAL_BIT)
    marker_header = BatchHeader.parse(marker)
    assert marker_header.is_control and marker_header.compression == Codec.NONE
    assert log.last_stable_offset == 4


def test_log_append_time_on_a_rebuilt_batch(make_log: LogFactory) -> None:
    """Kafka's builder keeps the record timestamps (deltas from the first) and stamps the batch LogAppendTime with
    the append time as its max timestamp; the produce answer carries the append time."""
    log = make_log({"compression.type": "zstd", "message.timestamp.type": "LogAppendTime"})
    records = sample_records(4)
    append_time = NOW + 60_000
    answer = log.append(client_batch(records, Codec.SNAPPY), now_ms=append_time, timestamp_type_log_append=True)
    assert (answer.error_code, answer.base_offset, answer.log_append_time_ms) == (ErrorCode.NONE, 0, append_time)
    [data] = stored(log)
    expected = bytearray(expected_rebuild(records, Codec.ZSTD, 3, max_timestamp=append_time))
    struct.pack_into(">h", expected, 21, Codec.ZSTD | 0x08)  # the LogAppendTime bit
    struct.pack_into(">I", expected, 17, compute_crc(expected))
    assert data == bytes(expected)
    assert log.offset_for_timestamp(append_time) == (0, append_time)
    assert log.offset_for_timestamp(append_time + 1) is None
    assert log.max_timestamp() == (0, append_time)


def test_a_client_log_append_time_batch_rebuilt_on_a_create_time_topic(make_log: LogFactory) -> None:
    """A reader of such a batch sees its max timestamp on every record; Kafka rebuilds the records with that."""
    log = make_log({"compression.type": "gzip"})
    records = sample_records(3)
    batch = bytearray(build_batch(records, base_timestamp=NOW, log_append_time=True))
    struct.pack_into(">q", batch, 35, NOW + 500)
    struct.pack_into(">I", batch, 17, compute_crc(batch))
    assert log.append(batch, now_ms=NOW).error_code == ErrorCode.NONE
    [data] = stored(log)
    flat = [Record(r.offset_delta, 0, r.key, r.value, r.headers) for r in records]
    expected = bytearray(expected_rebuild(flat, Codec.GZIP, 6, base_timestamp=NOW + 500))
    HEADER.pack_into(expected, 0, *BatchHeader.parse(expected)._replace(producer_id=-1, producer_epoch=-1))
    HEADER.pack_into(expected, 0, *BatchHeader.parse(expected)._replace(base_sequence=-1))
    struct.pack_into(">I", expected, 17, compute_crc(expected))
    assert data == bytes(expected)


def test_idempotent_retry_of_a_rebuilt_batch_is_a_duplicate(make_log: LogFactory) -> None:
    log = make_log({"compression.type": "gzip"})
    records = sample_records(5)
    assert log.append(client_batch(records, Codec.LZ4), now_ms=NOW).base_offset == 0
    assert log.append(client_batch(records[:2], Codec.LZ4, sequence=5), now_ms=NOW).base_offset == 5
    retry = log.append(client_batch(records, Codec.LZ4), now_ms=NOW)
    assert (retry.error_code, retry.base_offset) == (ErrorCode.NONE, 0)
    assert log.log_end_offset == 7
    gap = log.append(client_batch(records, Codec.LZ4, sequence=9), now_ms=NOW)
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert len(stored(log)) == 2


def test_timestamps_of_a_rebuilt_batch_are_checked(make_log: LogFactory) -> None:
    log = make_log({"compression.type": "zstd", "message.timestamp.after.max.ms": "5"})
    records = sample_records(4)  # timestamps NOW .. NOW + 9
    answer = log.append(client_batch(records, Codec.LZ4), now_ms=NOW)
    assert answer.error_code == ErrorCode.INVALID_TIMESTAMP
    assert [index for index, _ in answer.record_errors] == [2, 3]
    assert answer.record_errors[0][1] == (
        f"Timestamp {NOW + 6} of message with offset 2 is out of range. The timestamp should be within "
        f"[{NOW - (2**63 - 1)}, {NOW + 5}]"
    )
    assert log.log_end_offset == 0


def test_a_rebuilt_batch_above_max_message_bytes_is_refused(make_log: LogFactory) -> None:
    log = make_log({"compression.type": "uncompressed", "max.message.bytes": "2000"})
    records = [Record(offset_delta=i, key=None, value=b"z" * 500) for i in range(8)]  # 4 KB that zstd shrinks
    answer = log.append(client_batch(records, Codec.ZSTD), now_ms=NOW)
    size = HEADER_SIZE + sum(len(encode_record(r)) for r in records)
    assert (answer.error_code, answer.error_message) == (
        ErrorCode.MESSAGE_TOO_LARGE,
        f"Message batch size is {size} bytes in append, which exceeds the maximum configured size of 2000.",
    )
    assert log.log_end_offset == 0


def test_a_record_timestamp_below_minus_one_fails_the_rebuild(make_log: LogFactory) -> None:
    log = make_log({"compression.type": "gzip"})
    records = [Record(offset_delta=0, key=b"k", value=b"v"), Record(offset_delta=1, timestamp_delta=-5, value=b"w")]
    batch = bytearray(build_batch(records, base_timestamp=2))
    answer = log.append(batch, now_ms=NOW)
    assert (answer.error_code, answer.error_message) == (
        ErrorCode.UNKNOWN_SERVER_ERROR,
        "Invalid negative timestamp -3",
    )


def test_the_broker_default_applies_to_topics_without_their_own() -> None:
    defaults = BrokerConfig({"compression.type": "lz4", "compression.lz4.level": "3"}).topic_defaults()
    assert LogConfig.from_topic_configs(defaults).compression == TopicCompression(codec=Codec.LZ4, lz4_level=3)
    overridden = LogConfig.from_topic_configs({**defaults, "compression.type": "producer"})
    assert overridden.compression == TopicCompression(codec=None, lz4_level=3)
