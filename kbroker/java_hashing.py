"""Java's hashes and java.util.HashMap's iteration order, as Kafka's answers and partition choices depend on them.

Kafka picks a group's or transactional id's coordinator partition from Java's String.hashCode, and builds many
answers from HashMaps, so their order is the maps' bucket order. Brokers of both implementations in one cluster
must agree on the partition, and clients compare answers with Kafka's, so these reproduce Java exactly. The module
imports nothing heavy: the broker's start-up path reaches it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import TypeVar

K = TypeVar("K")

_INT_MIN_UNSIGNED = 0x80000000


def java_string_hash(text: str | None) -> int:
    """Java's String.hashCode (0 for null), as an unsigned 32-bit value."""
    if text is None:
        return 0
    value = 0
    encoded = text.encode("utf-16-be", "surrogatepass")
    for index in range(0, len(encoded), 2):
        value = (31 * value + (encoded[index] << 8 | encoded[index + 1])) & 0xFFFFFFFF
    return value


def java_topic_partition_hash(topic: str, partition: int) -> int:
    """Kafka's TopicPartition.hashCode, as an unsigned 32-bit value."""
    return (31 * (31 + partition) + java_string_hash(topic)) & 0xFFFFFFFF


@lru_cache(maxsize=1 << 14)  # every offset commit and transactional request asks; the hash is a Python loop
def coordinator_partition(key: str, partitions: int) -> int:
    """The internal topic partition of a group id or transactional id, as Kafka's coordinators compute it (their
    partitionFor): Java's String.hashCode made non-negative by Utils.abs (the absolute value, 0 for
    Integer.MIN_VALUE; not the partitioner's sign-bit mask, which differs for every negative hash), modulo the
    partition count. Brokers of both implementations in one cluster must agree on it, or an id would have two
    coordinators."""
    code = java_string_hash(key)
    if code >= _INT_MIN_UNSIGNED:
        code = 0 if code == _INT_MIN_UNSIGNED else 0x100000000 - code  # |the signed value|
    return code % partitions


def _table_size_for(capacity: int) -> int:
    size = 1
    while size < capacity:
        size <<= 1
    return size


def java_hashmap_order(keys: Iterable[K], hash_of: Callable[[K], int], initial_capacity: int = 16) -> list[K]:
    """``keys`` (distinct, in insertion order) in the iteration order of a java.util.HashMap created with
    ``initial_capacity`` and filled with them in this order: by bucket (the hash with its high half folded in,
    modulo the table size, which doubles past a 0.75 load factor), then by insertion within a bucket."""
    items: Sequence[K] = keys if isinstance(keys, Sequence) else list(keys)
    capacity = _table_size_for(initial_capacity)
    while len(items) > int(capacity * 0.75):
        capacity <<= 1

    def bucket(key: K) -> int:
        h = hash_of(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(items, key=bucket)  # stable: a bucket keeps insertion order


def copied_map_capacity(size: int) -> int:
    """The table size of ``new HashMap<>(map)`` for a map of ``size`` entries."""
    return _table_size_for(int(size / 0.75 + 1.0))
