"""Kafka's four record-batch codecs, through cramjam (one Rust-backed package for all of them).

Decompression is bounded: output goes into a buffer that grows geometrically up to ``max_size``, and
cramjam stops with an error the moment a buffer is full, so a small hostile batch cannot make us allocate
more than the limit. Snappy comes in two shapes: the xerial framing the Java client writes (a magic
header then length-prefixed raw blocks) and plain raw snappy; both are read, xerial is written.

LZ4 is written as a frame of independent 64 KB blocks: Kafka's Java reader (Lz4BlockInputStream) refuses a
frame whose blocks are linked ("Dependent block stream is unsupported"), which is cramjam's one-shot default.
Levels are the libraries' own (zlib 1-9, LZ4F where below 2 is the fast compressor and 2-12 LZ4HC, zstd's);
kbroker/storage/recompress.py maps Kafka's compression.*.level onto them.
"""

from __future__ import annotations

import struct
import threading
from enum import IntEnum
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from protocol.exceptions import DecodeError

if TYPE_CHECKING:
    import cramjam


@cache
def _cramjam() -> ModuleType:
    """cramjam, imported with the first compressed batch: its Rust library is over a megabyte of a broker's memory
    that a broker never sent a compressed batch does not need."""
    import cramjam

    return cramjam


class Codec(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = struct.Struct(">8sii")
_XERIAL_VERSION = 1
_XERIAL_COMPATIBLE = 1
_XERIAL_BLOCK = 32 * 1024  # snappy-java's default block size
_INT32 = struct.Struct(">i")
_MIN_BUFFER = 64 * 1024


class _StreamCodec(Protocol):
    """What is used here of a cramjam codec module (gzip, lz4 and zstd have the same functions)."""

    def compress(self, data: bytes, level: int | None = None) -> cramjam.Buffer: ...

    def decompress_into(self, input: bytes, output: bytearray) -> int: ...


_STREAM_CODECS: dict[int, str] = {Codec.GZIP: "gzip", Codec.LZ4: "lz4", Codec.ZSTD: "zstd"}  # cramjam's modules


def _stream_codec(codec: int) -> _StreamCodec | None:
    name = _STREAM_CODECS.get(codec)
    module: _StreamCodec | None = getattr(_cramjam(), name) if name is not None else None
    return module


def compress(codec: int, data: bytes | bytearray | memoryview, level: int | None = None) -> bytes:
    """``data`` compressed with ``codec``; ``level`` is the library's (None: its default; snappy has none)."""
    if codec == Codec.NONE:
        return bytes(data)
    if codec == Codec.SNAPPY:
        return _xerial_compress(data)
    if codec == Codec.LZ4:
        return _lz4_frame(data, level)
    module = _stream_codec(codec)
    if module is None:
        raise ValueError(f"unknown compression codec {codec}")
    return bytes(module.compress(bytes(data), level=level))


def _lz4_frame(data: bytes | bytearray | memoryview, level: int | None) -> bytes:
    """An LZ4 frame every Kafka client reads: independent blocks (block checksums, which Kafka's reader checks)."""
    compressor = _cramjam().lz4.Compressor(level=level, content_checksum=False, block_linked=False)
    compressor.compress(bytes(data))
    return bytes(compressor.finish())


def decompress(codec: int, data: bytes | bytearray | memoryview, max_size: int) -> bytes:
    """Decompressed bytes, or DecodeError if they are corrupt or would exceed ``max_size``."""
    if codec == Codec.NONE:
        return bytes(data)
    if codec == Codec.SNAPPY:
        data = bytes(data)
        if data[:8] == XERIAL_MAGIC:
            return _xerial_decompress(data, max_size)
        return _raw_snappy(data, max_size)
    module = _stream_codec(codec)
    if module is None:
        raise DecodeError(f"unknown compression codec {codec}")
    return _bounded(module, bytes(data), max_size)


def _bounded(module: _StreamCodec, data: bytes, max_size: int) -> bytes:
    size = min(max_size + 1, max(_MIN_BUFFER, 4 * len(data)))
    while True:
        out = _scratch(size)
        try:
            written = module.decompress_into(data, out)
        except _cramjam().DecompressionError as exc:
            if "failed to write whole buffer" not in str(exc):
                raise DecodeError(f"corrupt compressed data: {exc}") from exc
            written = len(out)
        except Exception as exc:  # cramjam raises a few other types on garbage input
            raise DecodeError(f"corrupt compressed data: {exc}") from exc
        if written > max_size:
            raise DecodeError(f"decompressed data exceeds the limit of {max_size} bytes")
        if written < len(out):
            return bytes(memoryview(out)[:written])
        if size > max_size:
            raise DecodeError(f"decompressed data exceeds the limit of {max_size} bytes")
        size = min(max_size + 1, max(size, len(out)) * 4)


_SCRATCH_KEPT = 16 << 20  # a thread keeps its decompression buffer up to this size
_scratch_buffers = threading.local()


def _scratch(size: int) -> bytearray:
    """A buffer of at least ``size`` bytes to decompress into, the thread's own and reused: a fresh one would
    cost more to allocate (mapped, zeroed and faulted in) than the decompression itself."""
    kept: bytearray | None = getattr(_scratch_buffers, "buffer", None)
    if kept is not None and len(kept) >= size:
        return kept
    buffer = bytearray(size)
    if size <= _SCRATCH_KEPT:
        _scratch_buffers.buffer = buffer
    return buffer


def _snappy_length(data: bytes) -> int:
    """The uncompressed length a raw snappy block declares in its varint preamble."""
    value = shift = 0
    for byte in data[:5]:
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value
        shift += 7
    raise DecodeError("snappy block has a bad length preamble")


def _raw_snappy(data: bytes, max_size: int) -> bytes:
    if _snappy_length(data) > max_size:
        raise DecodeError(f"decompressed data exceeds the limit of {max_size} bytes")
    try:
        return bytes(_cramjam().snappy.decompress_raw(data))
    except Exception as exc:
        raise DecodeError(f"corrupt snappy data: {exc}") from exc


def _xerial_decompress(data: bytes, max_size: int) -> bytes:
    if len(data) < _XERIAL_HEADER.size:
        raise DecodeError("truncated xerial snappy header")
    out = bytearray()
    pos = _XERIAL_HEADER.size
    while pos < len(data):
        if pos + 4 > len(data):
            raise DecodeError("truncated xerial snappy block length")
        (length,) = _INT32.unpack_from(data, pos)
        pos += 4
        if length < 0 or pos + length > len(data):
            raise DecodeError(f"xerial snappy block length {length} is invalid")
        out += _raw_snappy(data[pos : pos + length], max_size - len(out))
        pos += length
    return bytes(out)


def _xerial_compress(data: bytes | bytearray | memoryview) -> bytes:
    view = memoryview(bytes(data))
    out = bytearray(_XERIAL_HEADER.pack(XERIAL_MAGIC, _XERIAL_VERSION, _XERIAL_COMPATIBLE))
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(_cramjam().snappy.compress_raw(bytes(view[start : start + _XERIAL_BLOCK])))
        out += _INT32.pack(len(block))
        out += block
    return bytes(out)
