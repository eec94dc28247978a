"""The log-segment store: partitions as directories of segments, topics as atomically written metadata.

kbroker/storage/api.py is the interface (PartitionStore, LogStore, Chunk) that both engines satisfy: the disk
engine (PartitionLog, LogManager) and the in-memory one (MemoryPartitionLog, MemoryLogStore).
"""

from kbroker.storage.api import AnyLogStore, Chunk, LogStore, PartitionEvent, PartitionEventListener, PartitionStore
from kbroker.storage.manager import LogManager, TopicInfo, validate_topic_name
from kbroker.storage.memory import MemoryChunk, MemoryLogStore, MemoryPartitionLog
from kbroker.storage.partition import AppendResult, LogConfig, OffsetOutOfRange, PartitionLog, ReadChunk
from kbroker.storage.segment import Segment

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
