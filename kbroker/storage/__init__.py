"""The log-segment store: partitions as directories of segments, topics as atomically written metadata.

kbroker/storage/api.py is the interface (PartitionStore, LogStore, Chunk) that both engines satisfy: the disk
engine (PartitionLog, LogManager) and the in-memory one (MemoryPartitionLog, MemoryLogStore).
"""

from kbroker.storage.api import AnyLogStore, Chunk, LogStore, PartitionEvent, PartitionEventListener, PartitionStore
from kbroker.storage.manager import LogManager, TopicInfo, validate_topic_name
from kbroker.storage.partition import AppendResult, LogConfig, OffsetOutOfRange, PartitionLog, ReadChunk
from kbroker.storage.segment import Segment

_MEMORY_ENGINE = ("MemoryChunk", "MemoryLogStore", "MemoryPartitionLog")


def __getattr__(name: str) -> object:
    # The in-memory engine is for tests: a broker does not import it at start-up.
    if name in _MEMORY_ENGINE:
        from kbroker.storage import memory

        return getattr(memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AnyLogStore",
    "AppendResult",
    "Chunk",
    "LogConfig",
    "LogManager",
    "LogStore",
    "MemoryChunk",
    "MemoryLogStore",
    "MemoryPartitionLog",
    "OffsetOutOfRange",
    "PartitionEvent",
    "PartitionEventListener",
    "PartitionLog",
    "PartitionStore",
    "ReadChunk",
    "Segment",
    "TopicInfo",
    "validate_topic_name",
]
