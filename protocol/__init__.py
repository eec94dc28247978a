"""Kafka's wire protocol, sans I/O: bytes in, Python objects out, and back.

- ``protocol.messages``: every API's request and response, generated from Kafka's JSON schemas.
- ``protocol.metadata_records``, ``protocol.coordinator_records``: Kafka's metadata and coordinator record types,
  generated the same way; ``protocol.metadata_frame`` and ``protocol.coordinator_frame`` frame them as Kafka does
  in ``__cluster_metadata`` and in ``__consumer_offsets``/``__transaction_state``.
- ``protocol.framing``: size-prefixed frames, request and response headers.
- ``protocol.records``: RecordBatch v2 (header view, CRC, offsets, full record codec).
- ``protocol.compression``: gzip, snappy, lz4 and zstd, with bounded decompression.
- ``protocol.errors``: Kafka's error codes.
"""

from protocol.exceptions import DecodeError, EncodeError, UnsupportedVersionError

__all__ = ["DecodeError", "EncodeError", "UnsupportedVersionError"]
