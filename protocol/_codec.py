"""Runtime primitives shared by the generated message codecs in protocol/messages.

The generated code reads with ``struct.unpack_from`` at explicit positions and writes by extending a
``bytearray``; this module holds the pieces that are not a single struct call (varints, strings,
arrays, tagged fields) and the ``Message`` base class.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Sized
from typing import Any, ClassVar, NoReturn, Protocol, Self

from protocol.exceptions import DecodeError, EncodeError, UnsupportedVersionError

Buffer = bytes | bytearray | memoryview

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
UINT16 = struct.Struct(">H")
FLOAT64 = struct.Struct(">d")
ZERO_UUID = uuid.UUID(int=0)
_uuid_from_bytes = uuid.UUID
_new_object = object.__new__
UNSET: Any = object()  # "argument not given" in generated constructors, where None is a value

# Exceptions a truncated or malformed buffer can provoke inside generated code; all become DecodeError.
DECODE_FAILURES = (struct.error, IndexError, UnicodeDecodeError, ValueError, TypeError, OverflowError)


def read_uvarint(buf: Buffer, pos: int) -> tuple[int, int]:
    """An unsigned LEB128 varint (Kafka's compact lengths and tag numbers), at most 5 bytes."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    value = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise DecodeError("unsigned varint longer than 5 bytes")


def write_uvarint(out: bytearray, value: int) -> None:
    if value < 0:
        raise EncodeError(f"unsigned varint cannot hold {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def uvarint_bytes(value: int) -> bytes:
    out = bytearray()
    write_uvarint(out, value)
    return bytes(out)


def _check_length(buf: Buffer, pos: int, length: int) -> int:
    end = pos + length
    if end > len(buf):
        raise DecodeError(f"length {length} at position {pos} runs past the end of the buffer ({len(buf)})")
    return end


# --- strings -------------------------------------------------------------------------------------------


def read_string(buf: Buffer, pos: int) -> tuple[str, int]:
    (n,) = INT16.unpack_from(buf, pos)
    pos += 2
    if n < 0:
        raise DecodeError("null string in a non-nullable field")
    end = _check_length(buf, pos, n)
    return str(buf[pos:end], "utf-8"), end


def read_nullable_string(buf: Buffer, pos: int) -> tuple[str | None, int]:
    (n,) = INT16.unpack_from(buf, pos)
    pos += 2
    if n < 0:
        if n != -1:
            raise DecodeError(f"invalid string length {n}")
        return None, pos
    end = _check_length(buf, pos, n)
    return str(buf[pos:end], "utf-8"), end


def read_compact_string(buf: Buffer, pos: int) -> tuple[str, int]:
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise DecodeError("null string in a non-nullable field")
    end = _check_length(buf, pos, n - 1)
    return str(buf[pos:end], "utf-8"), end


def read_compact_nullable_string(buf: Buffer, pos: int) -> tuple[str | None, int]:
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = _check_length(buf, pos, n - 1)
    return str(buf[pos:end], "utf-8"), end


def write_string(out: bytearray, value: str) -> None:
    data = value.encode()
    if len(data) > 0x7FFF:
        raise EncodeError("string longer than 32767 bytes")
    out += INT16.pack(len(data))
    out += data


def write_nullable_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out += b"\xff\xff"
    else:
        write_string(out, value)


def write_compact_string(out: bytearray, value: str) -> None:
    data = value.encode()
    write_uvarint(out, len(data) + 1)
    out += data


def write_compact_nullable_string(out: bytearray, value: str | None) -> None:
    if value is None:
        out.append(0)
    else:
        write_compact_string(out, value)


# --- bytes (and records, which are nullable bytes on the wire) -----------------------------------------


def read_bytes(buf: Buffer, pos: int) -> tuple[bytes, int]:
    (n,) = INT32.unpack_from(buf, pos)
    pos += 4
    if n < 0:
        raise DecodeError("null bytes in a non-nullable field")
    end = _check_length(buf, pos, n)
    return bytes(buf[pos:end]), end


def read_nullable_bytes(buf: Buffer, pos: int) -> tuple[bytes | None, int]:
    (n,) = INT32.unpack_from(buf, pos)
    pos += 4
    if n < 0:
        if n != -1:
            raise DecodeError(f"invalid bytes length {n}")
        return None, pos
    end = _check_length(buf, pos, n)
    return bytes(buf[pos:end]), end


def read_compact_bytes(buf: Buffer, pos: int) -> tuple[bytes, int]:
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        raise DecodeError("null bytes in a non-nullable field")
    end = _check_length(buf, pos, n - 1)
    return bytes(buf[pos:end]), end


def read_compact_nullable_bytes(buf: Buffer, pos: int) -> tuple[bytes | None, int]:
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = _check_length(buf, pos, n - 1)
    return bytes(buf[pos:end]), end


def read_records(buf: Buffer, pos: int) -> tuple[memoryview | None, int]:
    """Records (nullable bytes) as a view into ``buf``: writable when ``buf`` is a bytearray."""
    (n,) = INT32.unpack_from(buf, pos)
    pos += 4
    if n < 0:
        if n != -1:
            raise DecodeError(f"invalid records length {n}")
        return None, pos
    end = _check_length(buf, pos, n)
    return memoryview(buf)[pos:end], end


def read_compact_records(buf: Buffer, pos: int) -> tuple[memoryview | None, int]:
    n, pos = read_uvarint(buf, pos)
    if n == 0:
        return None, pos
    end = _check_length(buf, pos, n - 1)
    return memoryview(buf)[pos:end], end


def write_bytes(out: bytearray, value: Buffer) -> None:
    out += INT32.pack(len(value))
    out += value


def write_nullable_bytes(out: bytearray, value: Buffer | None) -> None:
    if value is None:
        out += b"\xff\xff\xff\xff"
    else:
        write_bytes(out, value)


def write_compact_bytes(out: bytearray, value: Buffer) -> None:
    write_uvarint(out, len(value) + 1)
    out += value


def write_compact_nullable_bytes(out: bytearray, value: Buffer | None) -> None:
    if value is None:
        out.append(0)
    else:
        write_compact_bytes(out, value)


# --- records -------------------------------------------------------------------------------------------


class Region(Protocol):
    """Records the transport sends itself (the broker's file regions): a length, and the bytes on demand."""

    def __len__(self) -> int: ...

    def __bytes__(self) -> bytes: ...


# What a response's records field may hold: bytes, or a region spliced in when it is sent.
Records = Buffer | Region


class SplicedOutput(bytearray):
    """Encoded bytes with gaps where record fields go that the transport sends itself.

    A records value that is not a buffer but has a length (the broker's file regions) is not copied in:
    its position and object are kept in ``splices`` so that the transport can send the bytes before it,
    then the region (with sendfile, say), then the rest. ``spliced_length`` is what the gaps add up to.
    """

    __slots__ = ("splices", "spliced_length")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.splices: list[tuple[int, Sized]] = []
        self.spliced_length = 0


def _put_records(out: bytearray, value: Records) -> None:
    if isinstance(value, bytes | bytearray | memoryview):
        out += value
    elif isinstance(out, SplicedOutput):
        out.splices.append((len(out), value))
        out.spliced_length += len(value)
    else:
        out += bytes(value)


def write_records(out: bytearray, value: Records | None) -> None:
    if value is None:
        out += b"\xff\xff\xff\xff"
    else:
        out += INT32.pack(len(value))
        _put_records(out, value)


def write_compact_records(out: bytearray, value: Records | None) -> None:
    if value is None:
        out.append(0)
    else:
        write_uvarint(out, len(value) + 1)
        _put_records(out, value)


# --- arrays --------------------------------------------------------------------------------------------


def read_array_length(buf: Buffer, pos: int) -> tuple[int, int]:
    """Element count of a classic array, -1 for null. Every element takes at least one byte, so a count
    larger than the bytes left is rejected before anything is allocated for it."""
    (n,) = INT32.unpack_from(buf, pos)
    pos += 4
    if n > len(buf) - pos or n < -1:
        raise DecodeError(f"array length {n} at position {pos - 4} is impossible")
    return n, pos


def read_compact_array_length(buf: Buffer, pos: int) -> tuple[int, int]:
    n, pos = read_uvarint(buf, pos)
    n -= 1
    if n > len(buf) - pos:
        raise DecodeError(f"array length {n} at position {pos} is impossible")
    return n, pos


def read_primitive_array(buf: Buffer, pos: int, count: int, item: struct.Struct) -> tuple[list[Any], int]:
    size = count * item.size
    _check_length(buf, pos, size)
    values = list(struct.unpack_from(f">{count}{item.format[1:]}", buf, pos))
    return values, pos + size


def write_primitive_array(out: bytearray, values: list[Any], item: struct.Struct) -> None:
    out += struct.pack(f">{len(values)}{item.format[1:]}", *values)


def read_uuid(buf: Buffer, pos: int) -> tuple[uuid.UUID, int]:
    end = _check_length(buf, pos, 16)
    return _uuid_from_bytes(bytes=bytes(buf[pos:end])), end


# --- tagged fields -------------------------------------------------------------------------------------


def read_unknown_tagged_fields(buf: Buffer, pos: int) -> tuple[dict[int, bytes] | None, int]:
    """The tagged-field section of a struct that knows no tags in this version: kept to re-encode."""
    if buf[pos] == 0:
        return None, pos + 1
    count, pos = read_uvarint(buf, pos)
    unknown: dict[int, bytes] = {}
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        end = _check_length(buf, pos, size)
        unknown[tag] = bytes(buf[pos:end])
        pos = end
    return unknown, pos


def write_tagged_fields(out: bytearray, fields: list[tuple[int, Buffer]]) -> None:
    """Tagged fields go out sorted by tag number, each as tag, size, then its bytes."""
    if len(fields) > 1:
        fields.sort(key=lambda item: item[0])
    write_uvarint(out, len(fields))
    for tag, data in fields:
        write_uvarint(out, tag)
        write_uvarint(out, len(data))
        out += data


def check_tag_end(pos: int, end: int, tag: int) -> None:
    if pos != end:
        raise DecodeError(f"tagged field {tag} has a size that does not match its content")


# --- the base class of every generated message and struct ----------------------------------------------


class Struct:
    """Base of generated structs: slots, defaults, value equality and a readable repr."""

    __slots__: tuple[str, ...] = ()  # each generated class lists its fields (and unknown_tagged_fields)
    FIELDS: ClassVar[tuple[str, ...]] = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    # Mutable with value equality, so unhashable. Python's own idiom; typeshed declares object.__hash__ a
    # method, so mypy rejects None here.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__name__}({inner})"

    def to_dict(self) -> dict[str, Any]:
        """Field values as plain data (nested structs become dicts); for logs, tests and tools."""
        return {name: _plain(getattr(self, name)) for name in self.FIELDS}


def _plain(value: Any) -> Any:
    if isinstance(value, Struct):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


Decoder = Callable[[Buffer, int], tuple[Any, int]]
Encoder = Callable[[Any, bytearray], None]


def unsupported_version(*_: object) -> NoReturn:
    """The DECODERS and ENCODERS entry of a version below a message's first (decode and encode check first)."""
    raise UnsupportedVersionError("no codec for this version")


class Message(Struct):
    """Base of top-level messages (requests, responses, headers, data): versioned decode and encode."""

    __slots__ = ()
    NAME: ClassVar[str] = ""
    API_KEY: ClassVar[int] = -1
    VALID_VERSIONS: ClassVar[tuple[int, int]] = (0, 0)
    FLEXIBLE_VERSIONS: ClassVar[tuple[int, int] | None] = None
    DECODERS: ClassVar[tuple[Decoder, ...]] = ()  # by version
    ENCODERS: ClassVar[tuple[Encoder, ...]] = ()

    @classmethod
    def is_flexible(cls, version: int) -> bool:
        flexible = cls.FLEXIBLE_VERSIONS
        return flexible is not None and flexible[0] <= version <= flexible[1]

    @classmethod
    def supports(cls, version: int) -> bool:
        return cls.VALID_VERSIONS[0] <= version <= cls.VALID_VERSIONS[1]

    @classmethod
    def decode(cls, buf: Buffer, version: int, pos: int = 0) -> tuple[Self, int]:
        """Decode one message of ``version`` at ``pos``; returns it and the position after it."""
        if not cls.VALID_VERSIONS[0] <= version <= cls.VALID_VERSIONS[1]:
            raise UnsupportedVersionError(f"{cls.NAME} has no version {version}")
        try:
            return cls.DECODERS[version](buf, pos)
        except DecodeError:
            raise
        except DECODE_FAILURES as exc:
            raise DecodeError(f"malformed {cls.NAME} v{version}: {exc}") from exc

    def encode_into(self, out: bytearray, version: int) -> None:
        if not self.VALID_VERSIONS[0] <= version <= self.VALID_VERSIONS[1]:
            raise UnsupportedVersionError(f"{self.NAME} has no version {version}")
        try:
            self.ENCODERS[version](self, out)
        except EncodeError:
            raise
        except (struct.error, AttributeError, TypeError, ValueError) as exc:
            raise EncodeError(f"cannot encode {self.NAME} v{version}: {exc}") from exc

    def encode(self, version: int) -> bytes:
        out = bytearray()
        self.encode_into(out, version)
        return bytes(out)


new_object = _new_object
