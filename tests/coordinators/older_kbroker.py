"""What kbroker did before it followed Kafka's coordinator hash, to make the data directories it wrote."""

from __future__ import annotations

import struct


def masked_partition(key: str, partitions: int) -> int:
    """Where kbroker put a group or transactional id before: the partitioner's sign-bit mask of Java's
    String.hashCode rather than Kafka's Utils.abs (they differ for every negative hash)."""
    code = 0
    for (unit,) in struct.iter_unpack(">H", key.encode("utf-16-be")):
        code = (31 * code + unit) & 0xFFFFFFFF
    return (code & 0x7FFFFFFF) % partitions
