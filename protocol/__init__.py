"""Kafka's wire protocol, sans I/O: bytes in, Python objects out, and back.

- ``protocol.messages``: every API's request and response, generated from Kafka's JSON schemas.
- ``protocol.framing``: size-prefixed frames, request and response headers.
- ``protocol.records``: RecordBatch v2 (header view, CRC, offsets, full record codec).
- ``protocol.compression``: gzip, snappy, lz4 and zstd, with bounded decompression.
- ``protocol.errors``: Kafka's error codes.
"""

from protocol.exceptions import DecodeError, EncodeError, UnsupportedVersionError

__all__ = ["DecodeError", "EncodeError", "UnsupportedVersionError"]
