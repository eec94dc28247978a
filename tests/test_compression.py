"""The four codecs, Kafka's framings of them, and bounded decompression."""

from __future__ import annotations

import gzip
import struct

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_codec

from protocol import compression
from protocol.compression import XERIAL_MAGIC, Codec
from protocol.exceptions import DecodeError

CODECS = [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]
LIMIT = 1 << 20


@pytest.mark.parametrize("codec", CODECS)
@given(data=st.binary(max_size=100_000))
@settings(max_examples=25)
def test_round_trip(codec: Codec, data: bytes) -> None:
    assert compression.decompress(codec, compression.compress(codec, data), LIMIT) == data


def test_reads_the_formats_other_implementations_write() -> None:
    payload = b"kafka " * 20_000
    assert compression.decompress(Codec.GZIP, gzip.compress(payload), LIMIT) == payload
    assert (
        compression.decompress(Codec.SNAPPY, kafka_codec.snappy_encode(payload, xerial_compatible=True), LIMIT)
        == payload
    )
    assert compression.decompress(Codec.SNAPPY, kafka_codec.snappy_encode(payload), LIMIT) == payload
    assert compression.decompress(Codec.LZ4, kafka_codec.lz4_encode(payload), LIMIT) == payload
    assert compression.decompress(Codec.ZSTD, kafka_codec.zstd_encode(payload), LIMIT) == payload


def test_writes_xerial_snappy_that_kafka_python_reads() -> None:
    payload = bytes(range(256)) * 1000  # several 32 KiB blocks
    framed = compression.compress(Codec.SNAPPY, payload)
    assert framed.startswith(XERIAL_MAGIC)
    assert kafka_codec.snappy_decode(framed) == payload


@pytest.mark.parametrize("codec", CODECS)
def test_decompression_bombs_stop_at_the_limit(codec: Codec) -> None:
    source = bytes(50 * LIMIT)  # 50 MiB of zeros
    bomb = compression.compress(codec, source)
    assert len(bomb) * 20 < len(source)
    with pytest.raises(DecodeError, match="exceeds"):
        compression.decompress(codec, bomb, LIMIT)


def test_raw_snappy_declaring_a_huge_length_is_refused_before_decoding() -> None:
    with pytest.raises(DecodeError):
        compression.decompress(Codec.SNAPPY, b"\xff\xff\xff\xff\x0f" + b"\x00" * 10, LIMIT)


def test_xerial_block_lengths_are_checked() -> None:
    header = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
    with pytest.raises(DecodeError):
        compression.decompress(Codec.SNAPPY, header + struct.pack(">i", 10**9) + b"abc", LIMIT)
    with pytest.raises(DecodeError):
        compression.decompress(Codec.SNAPPY, header + b"\x00\x00", LIMIT)
    many = header + b"".join(
        struct.pack(">i", len(b)) + b for b in [bytes(cramjam.snappy.compress_raw(bytes(LIMIT // 2)))] * 3
    )
    with pytest.raises(DecodeError):
        compression.decompress(Codec.SNAPPY, many, LIMIT)


@pytest.mark.parametrize("codec", CODECS)
@given(data=st.binary(max_size=2000))
@settings(max_examples=100)
def test_garbage_only_raises_decode_error(codec: Codec, data: bytes) -> None:
    try:
        compression.decompress(codec, data, LIMIT)
    except DecodeError:
        pass
