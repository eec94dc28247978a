"""The log-segment store: partitions as directories of segments, topics as atomically written metadata.

One engine (PartitionLog over Segments, LogManager for the topics) over a backend (kbroker/storage/backend.py):
files in the data directory, or memory for fast handler tests (``LogManager.in_memory_store``).
"""

from kbroker.storage.api import PartitionEvent, PartitionEventListener
from kbroker.storage.log import AppendResult, LogConfig, OffsetOutOfRange, PartitionLog, ReadChunk
from kbroker.storage.manager import LogManager, TopicInfo, validate_topic_name
from kbroker.storage.segment import Segment

__all__ = [
    "AppendResult",
    "LogConfig",
    "LogManager",
    "OffsetOutOfRange",
    "PartitionEvent",
    "PartitionEventListener",
    "PartitionLog",
    "ReadChunk",
    "Segment",
    "TopicInfo",
    "validate_topic_name",
]
