"""Where the common clients put a keyed record by default, so a test can predict a record's partition.

Clients disagree, as their documentation says:

- Java kafka-clients (BuiltInPartitioner), kafka-python and aiokafka (DefaultPartitioner, ports of the Java
  one): ``toPositive(murmur2(key)) % partitions``.
- librdkafka and so confluent-kafka and kcat: ``partitioner=consistent_random`` by default, which is
  ``crc32(key) % partitions`` for a non-empty key (random for an empty or null one). Setting
  ``partitioner=murmur2_random`` makes librdkafka agree with Java.

Records without a key are spread differently by each client (sticky batches in Java since KIP-480, random
elsewhere) and are not predictable.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

_MASK = 0xFFFFFFFF
_M = 0x5BD1E995


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2, seed 0x9747b28c) as an unsigned 32-bit int."""
    h = (0x9747B28C ^ len(data)) & _MASK
    whole = len(data) & ~3
    for start in range(0, whole, 4):
        k = (int.from_bytes(data[start : start + 4], "little") * _M) & _MASK
        k = ((k ^ (k >> 24)) * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[whole:]
    if tail:
        h ^= int.from_bytes(tail, "little")  # the Java switch's fall-through, byte by byte
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def java_partition(key: bytes, partitions: int) -> int:
    """The partition Java kafka-clients, kafka-python and aiokafka choose for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def librdkafka_partition(key: bytes, partitions: int) -> int:
    """The partition librdkafka's default consistent_random partitioner chooses for a non-empty ``key``."""
    if not key:
        raise ValueError("consistent_random picks a random partition for an empty key")
    return zlib.crc32(key) % partitions


DEFAULT_PARTITIONERS: dict[str, Callable[[bytes, int], int]] = {
    "murmur2": java_partition,
    "consistent_random": librdkafka_partition,
}
