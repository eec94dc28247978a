"""What kbroker did before it followed Kafka's coordinator hash, to make the data directories it wrote."""

from __future__ import annotations

from kbroker.java_hashing import java_string_hash


def masked_partition(key: str, partitions: int) -> int:
    """Where kbroker put a group or transactional id before: the partitioner's sign-bit mask of Java's
    String.hashCode rather than Kafka's Utils.abs (they differ for every negative hash)."""
    return (java_string_hash(key) & 0x7FFFFFFF) % partitions
