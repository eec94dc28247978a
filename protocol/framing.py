"""Kafka's framing and message headers, sans I/O.

Every message on the wire is a big-endian int32 size followed by that many bytes. A request starts with a
request header (v1, or v2 for flexible API versions); a response with a response header (v0, or v1 for
flexible versions), except that ApiVersions responses always use header v0 so that a client which sent
a version the broker does not know can still read the answer (KIP-511).
"""

from __future__ import annotations

import mmap
import struct
from collections import deque
from dataclasses import dataclass
from typing import Any

from protocol._codec import DECODE_FAILURES, Buffer, SplicedOutput, read_uvarint
from protocol.exceptions import DecodeError, UnsupportedVersionError
from protocol.messages import APIS, ApiSchema
from protocol.messages.request_header import RequestHeader
from protocol.messages.response_header import ResponseHeader

API_VERSIONS_KEY = 18
_SIZE = struct.Struct(">i")
_HEADER_START = struct.Struct(">hhi")


def request_header_version(api: ApiSchema | None, api_version: int) -> int:
    return 2 if api is not None and api.is_flexible(api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == API_VERSIONS_KEY:
        return 0
    api = APIS.get(api_key)
    return 1 if api is not None and api.is_flexible(api_version) else 0


@dataclass(slots=True)
class Request:
    """A decoded request frame: its header, and its body when the API and version are known."""

    header: RequestHeader
    api: ApiSchema | None
    body: Any | None  # None when the API key or version is not supported
    trailing_bytes: int = 0  # bytes after the body; Kafka ignores them, and librdkafka sends some

    @property
    def api_key(self) -> int:
        return self.header.request_api_key

    @property
    def api_version(self) -> int:
        return self.header.request_api_version

    @property
    def correlation_id(self) -> int:
        return self.header.correlation_id


def peek_request_header(frame: Buffer) -> tuple[int, int, int]:
    """API key, API version and correlation id: readable from any request, even a malformed one."""
    try:
        return _HEADER_START.unpack_from(frame, 0)
    except struct.error as exc:
        raise DecodeError(f"request of {len(frame)} bytes is too short for a header") from exc


def decode_request(frame: Buffer) -> Request:
    """Decode one request frame (without its size prefix).

    An unknown API key or an unsupported version gives a Request whose body is None, so the caller can
    answer with UNSUPPORTED_VERSION; malformed bytes raise DecodeError.
    """
    api_key, api_version, _ = peek_request_header(frame)
    api = APIS.get(api_key)
    supported = api is not None and api.valid_versions[0] <= api_version <= api.valid_versions[1]
    if api is not None and not supported and api_key == API_VERSIONS_KEY:
        # KIP-511: a newer ApiVersions than ours is still flexible; the header must be readable.
        header_version = 2 if api_version > api.valid_versions[1] else 1
    else:
        header_version = request_header_version(api if supported else None, api_version)
    header, pos = RequestHeader.decode(frame, header_version)
    if not supported:
        return Request(header, api, None)
    assert api is not None
    body, end = api.request_type().decode(frame, api_version, pos)
    return Request(header, api, body, len(frame) - end)


PRODUCE_KEY = 0
_PRODUCE_FLEXIBLE = 9  # compact lengths and tagged fields from this version
_PRODUCE_TOPIC_IDS = 13  # topics named by id from this version
_INT16 = struct.Struct(">h")


def produce_partitions(frame: Buffer, enough: int) -> int:
    """How many partitions a Produce request frame names, counted until there are ``enough``.

    Far cheaper than decoding: record sets are skipped by their length, nothing is built. A large Produce is
    usually a few large record sets (quick to decode), sometimes a great many small ones (slow): this tells
    which. An unreadable frame counts as ``enough``; decoding it reports what is wrong.
    """
    try:
        _, version, _ = peek_request_header(frame)
        produce = APIS[PRODUCE_KEY]
        if not produce.valid_versions[0] <= version <= produce.valid_versions[1]:
            return 0  # its body is not decoded at all
        _, pos = RequestHeader.decode(frame, request_header_version(produce, version))
        flexible = version >= _PRODUCE_FLEXIBLE
        pos = _skip_string(frame, pos, flexible) + 6  # transactional_id, acks, timeout_ms
        topics, pos = _array_length(frame, pos, flexible)
        count = 0
        for _ in range(topics):
            pos = pos + 16 if version >= _PRODUCE_TOPIC_IDS else _skip_string(frame, pos, flexible)
            partitions, pos = _array_length(frame, pos, flexible)
            count += partitions
            if count >= enough:
                return count
            for _ in range(partitions):
                pos = _skip_string(frame, pos + 4, flexible, long=True)  # index, then the records' length
                if flexible:
                    pos = _skip_tagged_fields(frame, pos)
            if flexible:
                pos = _skip_tagged_fields(frame, pos)
        return count
    except (DecodeError, *DECODE_FAILURES):
        return enough


def _skip_string(frame: Buffer, pos: int, flexible: bool, long: bool = False) -> int:
    """Past a (nullable) string or byte field: compact, else with an int16 (``long``: int32) length."""
    if flexible:
        length, pos = read_uvarint(frame, pos)
        return pos + max(length - 1, 0)
    if long:
        (length,) = _SIZE.unpack_from(frame, pos)
        return pos + 4 + max(length, 0)
    (length,) = _INT16.unpack_from(frame, pos)
    return pos + 2 + max(length, 0)


def _array_length(frame: Buffer, pos: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        length, pos = read_uvarint(frame, pos)
        return length - 1, pos
    (length,) = _SIZE.unpack_from(frame, pos)
    return length, pos + 4


def _skip_tagged_fields(frame: Buffer, pos: int) -> int:
    count, pos = read_uvarint(frame, pos)
    for _ in range(count):
        _, pos = read_uvarint(frame, pos)
        size, pos = read_uvarint(frame, pos)
        pos += size
    return pos


def encode_request(body: Any, api_version: int, correlation_id: int, client_id: str | None = "kbroker") -> bytes:
    """A whole request frame, size prefix included (for clients and tests)."""
    api = APIS[body.API_KEY]
    if not api.valid_versions[0] <= api_version <= api.valid_versions[1]:
        raise UnsupportedVersionError(f"{api.name} has no version {api_version}")
    out = bytearray(4)
    header = RequestHeader(
        request_api_key=body.API_KEY,
        request_api_version=api_version,
        correlation_id=correlation_id,
        client_id=client_id,
    )
    header.encode_into(out, request_header_version(api, api_version))
    body.encode_into(out, api_version)
    _SIZE.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def encode_response(body: Any, api_key: int, api_version: int, correlation_id: int) -> SplicedOutput:
    """A whole response frame, size prefix included.

    Records given as regions rather than bytes are left out of the bytes and listed in ``splices``;
    the size prefix counts them, and the transport sends them in place (see SplicedOutput).
    """
    out = SplicedOutput(4)
    out += _SIZE.pack(correlation_id)
    if response_header_version(api_key, api_version) == 1:
        out.append(0)  # no tagged fields in the response header
    body.encode_into(out, api_version)
    _SIZE.pack_into(out, 0, len(out) - 4 + out.spliced_length)
    return out


def decode_response(frame: Buffer, api_key: int, api_version: int) -> tuple[int, Any]:
    """Correlation id and body of a response frame without its size prefix (for clients and tests)."""
    header, pos = ResponseHeader.decode(frame, response_header_version(api_key, api_version))
    body, end = APIS[api_key].response_type().decode(frame, api_version, pos)
    if end != len(frame):
        raise DecodeError(f"response has {len(frame) - end} trailing bytes")
    return header.correlation_id, body


class FrameTooLarge(DecodeError):
    """A size prefix above the configured limit (socket.request.max.bytes)."""


# A large frame's first block: no more than that is allocated before its bytes arrive. It then doubles each time
# it fills, by 4 MiB at most, so a frame never holds more than twice what was received and never more than 4 MiB
# beyond it (plus this block): a size prefix announcing 100 MB followed by one byte costs 64 KiB, not the
# megabyte it once did, and the request memory pool (kbroker/server/memory.py) can count what is held.
_FIRST_LARGE_ALLOCATION = 64 * 1024
_MAX_GROWTH = 4 * 1024 * 1024


def _zero_source() -> memoryview:
    """Zeros to grow a frame with. A read-only anonymous mapping reads as the kernel's one zero page: no memory
    is held for it, and growing from it costs one copy, where ``bytes(n)`` cost a fresh mapping, its page faults
    and its zeroing at every growth (most of a 1 MiB produce request's receive cost)."""
    try:
        return memoryview(mmap.mmap(-1, _MAX_GROWTH, prot=mmap.PROT_READ))
    except (AttributeError, OSError):  # no PROT_READ (Windows): plain zeros
        return memoryview(bytes(_MAX_GROWTH))


_ZEROS = _zero_source()


class FrameBuffer:
    """Splits a byte stream into frames (without their size prefix), copying payload bytes at most once.

    Sans-I/O and made for ``recv_into``: the caller reads from its stream into :meth:`read_buffer`, reports
    how many bytes arrived with :meth:`commit`, then takes frames with :meth:`next_frame`. Small frames are
    gathered in one reusable chunk and copied out; a frame larger than the chunk gets a buffer of its own
    that the stream is read into directly, so a 1 MiB produce request is never copied in user space.
    Frames are ``bytearray``: record batches inside them can have their offsets assigned in place.
    """

    def __init__(self, max_frame_size: int = 100 * 1024 * 1024, chunk_size: int = 16 * 1024) -> None:
        self._max = max_frame_size
        self._chunk = bytearray(chunk_size)
        self._start = 0  # unconsumed bytes are _chunk[_start:_end]
        self._end = 0
        self._frame: bytearray | None = None  # a large frame being filled straight from the stream
        self._frame_size = 0  # what it will hold; it grows towards that as bytes arrive
        self._filled = 0
        self._ready: deque[bytearray] = deque()  # frames completed inside feed()

    @property
    def max_frame_size(self) -> int:
        return self._max

    @max_frame_size.setter
    def max_frame_size(self, size: int) -> None:
        """A new limit for the frames whose size prefix is yet to be read (SASL: raised once authenticated)."""
        self._max = size

    def read_buffer(self) -> memoryview:
        """Where the next bytes from the stream go (never empty); release it before asking again."""
        if self._frame is not None and self._filled == self._frame_size:
            self._ready.append(self._take_large())  # complete but not taken yet
        if self._frame is None and self._end == len(self._chunk):
            self._compact()
            if self._end == len(self._chunk):
                # Full of bytes nobody took yet: take the frames (or start the large one) to make room.
                while (frame := self._pull()) is not None:
                    self._ready.append(frame)
        if self._frame is not None:
            if self._filled == len(self._frame):
                # Grown as bytes arrive, not allocated whole from the size prefix: four bytes claiming
                # 100 MB must not cost 100 MB.
                self._frame += _ZEROS[: min(len(self._frame), _MAX_GROWTH, self._frame_size - len(self._frame))]
            return memoryview(self._frame)[self._filled :]
        return memoryview(self._chunk)[self._end :]

    def commit(self, count: int) -> None:
        """``count`` bytes were written at the start of the last :meth:`read_buffer`."""
        if self._frame is not None:
            self._filled += count
        else:
            self._end += count

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` in, for callers that already hold the bytes (a client, a test)."""
        view = memoryview(data).cast("B")
        while view:
            target = self.read_buffer()
            count = min(len(target), len(view))
            target[:count] = view[:count]
            target.release()  # the frame buffer may grow on the next read_buffer()
            self.commit(count)
            view = view[count:]
            # Take complete frames now so the chunk always has room for the rest.
            while (frame := self._pull()) is not None:
                self._ready.append(frame)

    def next_frame(self) -> bytearray | None:
        """The next complete frame, or None until more bytes arrive."""
        return self._ready.popleft() if self._ready else self._pull()

    def _pull(self) -> bytearray | None:
        if self._frame is not None:
            return self._take_large() if self._filled == self._frame_size else None
        return self._next_small()

    def _next_small(self) -> bytearray | None:
        available = self._end - self._start
        if available < 4:
            return None
        (size,) = _SIZE.unpack_from(self._chunk, self._start)
        if size < 0 or size > self._max:
            raise FrameTooLarge(f"frame size {size} is outside 0..{self._max}")
        body = self._start + 4
        if available - 4 >= size:
            frame = self._chunk[body : body + size]
            self._start = body + size
            if self._start == self._end:
                self._start = self._end = 0
            return frame
        if 4 + size > len(self._chunk):
            # Too large for the chunk: give it its own buffer and read the rest of it straight in.
            frame = bytearray(min(size, max(_FIRST_LARGE_ALLOCATION, available - 4)))
            frame[: available - 4] = self._chunk[body : self._end]
            self._frame, self._frame_size, self._filled = frame, size, available - 4
            self._start = self._end = 0
        elif self._start + 4 + size > len(self._chunk):
            self._compact()
        return None

    def _take_large(self) -> bytearray:
        frame = self._frame
        assert frame is not None
        self._frame, self._frame_size, self._filled = None, 0, 0
        return frame

    def _compact(self) -> None:
        unconsumed = self._end - self._start
        self._chunk[:unconsumed] = self._chunk[self._start : self._end]
        self._start, self._end = 0, unconsumed

    @property
    def unfilled(self) -> int:
        """Bytes allocated for the large frame being received that have not arrived yet (at most as many as
        have, plus the first block)."""
        return len(self._frame) - self._filled if self._frame is not None else 0

    @property
    def midframe(self) -> bool:
        """Part of a frame is here and the rest is still to come (meaningful once next_frame() returned None)."""
        return self._frame is not None or self._end > self._start

    @property
    def pending(self) -> int:
        """Bytes received that are not yet part of a frame handed out."""
        completed = sum(len(f) + 4 for f in self._ready)
        return completed + (self._end - self._start) + (self._filled + 4 if self._frame is not None else 0)


__all__ = [
    "Request",
    "FrameBuffer",
    "FrameTooLarge",
    "SplicedOutput",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "peek_request_header",
    "produce_partitions",
    "request_header_version",
    "response_header_version",
]
