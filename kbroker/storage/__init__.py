"""The log-segment store: partitions as directories of segments, topics as atomically written metadata."""

from kbroker.storage.manager import LogManager, TopicInfo, validate_topic_name
from kbroker.storage.partition import AppendResult, LogConfig, OffsetOutOfRange, PartitionLog, ReadChunk
from kbroker.storage.segment import Segment

__all__ = [
    "AppendResult",
    "LogConfig",
    "LogManager",
    "OffsetOutOfRange",
    "PartitionLog",
    "ReadChunk",
    "Segment",
    "TopicInfo",
    "validate_topic_name",
]
