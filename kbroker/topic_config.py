"""Topic-level configuration: Kafka's topic config names, their broker-level synonyms and validation.

Used by CreateTopics, AlterConfigs, IncrementalAlterConfigs and DescribeConfigs. A topic's effective
value is its own override, else the broker's setting of the synonym, else Kafka's default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


def _int_range(low: int, high: int) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        try:
            number = int(value)
        except ValueError:
            return f"{value!r} is not an integer"
        return None if low <= number <= high else f"{number} is outside {low}..{high}"

    return check


def _one_of(*options: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in options else f"{value!r} is not one of {', '.join(options)}"

    return check


def _ratio(value: str) -> str | None:
    try:
        number = float(value)
    except ValueError:
        return f"{value!r} is not a number"
    return None if 0 <= number <= 1 else f"{number} is outside 0..1"


def _bool(value: str) -> str | None:
    return None if value.lower() in ("true", "false") else f"{value!r} is not true or false"


def _cleanup_policy(value: str) -> str | None:
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        return f"{value!r} must be delete, compact or both"
    return None


def _any(value: str) -> str | None:
    return None


def _compression_level(low: int, high: int, *extra: int) -> Callable[[str], str | None]:
    in_range = _int_range(low, high)

    def check(value: str) -> str | None:
        problem = in_range(value)
        return None if problem is None or value.strip() in {str(e) for e in extra} else problem

    return check


@dataclass(frozen=True)
class TopicConfigKey:
    name: str
    default: str
    check: Callable[[str], str | None]
    # The broker-level synonym Kafka names for this key (DescribeConfigs). When it is a kbroker broker
    # setting (kbroker/config.py), the broker's value is the topic's default; otherwise Kafka's default is.
    synonym: str | None = None
    type_name: str = "LONG"  # DescribeConfigs v3+ config type name


_KEYS = [
    TopicConfigKey("cleanup.policy", "delete", _cleanup_policy, "log.cleanup.policy", "LIST"),
    # Levels apply when the broker recompresses, which kbroker does not (UNSUPPORTED.md): kept and reported.
    TopicConfigKey("compression.gzip.level", "-1", _compression_level(1, 9, -1), "compression.gzip.level", "INT"),
    TopicConfigKey("compression.lz4.level", "9", _compression_level(1, 17), "compression.lz4.level", "INT"),
    TopicConfigKey("compression.zstd.level", "3", _compression_level(-131072, 22), "compression.zstd.level", "INT"),
    TopicConfigKey(
        "compression.type",
        "producer",
        _one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
        "compression.type",
        "STRING",
    ),
    TopicConfigKey("delete.retention.ms", "86400000", _int_range(0, LONG_MAX), "log.cleaner.delete.retention.ms"),
    TopicConfigKey("file.delete.delay.ms", "60000", _int_range(0, LONG_MAX), "log.segment.delete.delay.ms"),
    TopicConfigKey("flush.messages", str(LONG_MAX), _int_range(1, LONG_MAX), "log.flush.interval.messages"),
    TopicConfigKey("flush.ms", str(LONG_MAX), _int_range(0, LONG_MAX), "log.flush.interval.ms"),
    TopicConfigKey("follower.replication.throttled.replicas", "", _any, None, "LIST"),
    TopicConfigKey("index.interval.bytes", "4096", _int_range(0, INT_MAX), "log.index.interval.bytes", "INT"),
    TopicConfigKey("leader.replication.throttled.replicas", "", _any, None, "LIST"),
    TopicConfigKey("local.retention.bytes", "-2", _int_range(-2, LONG_MAX), "log.local.retention.bytes"),
    TopicConfigKey("local.retention.ms", "-2", _int_range(-2, LONG_MAX), "log.local.retention.ms"),
    TopicConfigKey(
        "max.compaction.lag.ms", str(LONG_MAX), _int_range(1, LONG_MAX), "log.cleaner.max.compaction.lag.ms"
    ),
    TopicConfigKey("max.message.bytes", "1048588", _int_range(0, INT_MAX), "message.max.bytes", "INT"),
    TopicConfigKey(
        "message.timestamp.after.max.ms", "3600000", _int_range(0, LONG_MAX), "log.message.timestamp.after.max.ms"
    ),
    TopicConfigKey(
        "message.timestamp.before.max.ms", str(LONG_MAX), _int_range(0, LONG_MAX), "log.message.timestamp.before.max.ms"
    ),
    TopicConfigKey(
        "message.timestamp.type",
        "CreateTime",
        _one_of("CreateTime", "LogAppendTime"),
        "log.message.timestamp.type",
        "STRING",
    ),
    TopicConfigKey("min.cleanable.dirty.ratio", "0.5", _ratio, "log.cleaner.min.cleanable.ratio", "DOUBLE"),
    TopicConfigKey("min.compaction.lag.ms", "0", _int_range(0, LONG_MAX), "log.cleaner.min.compaction.lag.ms"),
    TopicConfigKey("min.insync.replicas", "1", _int_range(1, INT_MAX), "min.insync.replicas", "INT"),
    TopicConfigKey("preallocate", "false", _bool, "log.preallocate", "BOOLEAN"),
    TopicConfigKey("remote.log.copy.disable", "false", _bool, None, "BOOLEAN"),
    TopicConfigKey("remote.log.delete.on.disable", "false", _bool, None, "BOOLEAN"),
    TopicConfigKey("remote.storage.enable", "false", _bool, None, "BOOLEAN"),
    TopicConfigKey("retention.bytes", "-1", _int_range(-1, LONG_MAX), "log.retention.bytes"),
    TopicConfigKey("retention.ms", "604800000", _int_range(-1, LONG_MAX), "log.retention.ms"),
    TopicConfigKey("segment.bytes", "1073741824", _int_range(14, INT_MAX), "log.segment.bytes", "INT"),
    TopicConfigKey("segment.index.bytes", "10485760", _int_range(4, INT_MAX), "log.index.size.max.bytes", "INT"),
    TopicConfigKey("segment.jitter.ms", "0", _int_range(0, LONG_MAX)),  # log.roll.jitter.ms: no default in Kafka
    TopicConfigKey("segment.ms", "604800000", _int_range(1, LONG_MAX), "log.roll.ms"),
    TopicConfigKey("unclean.leader.election.enable", "false", _bool, "unclean.leader.election.enable", "BOOLEAN"),
]
TOPIC_CONFIG_KEYS: dict[str, TopicConfigKey] = {key.name: key for key in _KEYS}

# What DescribeConfigs answers when documentation is requested (kbroker's own words).
TOPIC_CONFIG_DOCS = {
    "cleanup.policy": "delete (drop old segments), compact (keep the last record per key), or both.",
    "compression.gzip.level": "gzip level when the broker compresses (kbroker stores batches as sent).",
    "compression.lz4.level": "lz4 level when the broker compresses (kbroker stores batches as sent).",
    "compression.type": "Codec of stored batches; producer keeps what the producer sent.",
    "compression.zstd.level": "zstd level when the broker compresses (kbroker stores batches as sent).",
    "delete.retention.ms": "How long delete markers stay in a compacted topic.",
    "file.delete.delay.ms": "Wait before a deleted segment's files are removed.",
    "flush.messages": "Records appended before the partition is fsynced (1: before each acknowledgement).",
    "flush.ms": "Longest time appended data stays unflushed.",
    "follower.replication.throttled.replicas": "Replicas throttled on followers (no replication in kbroker).",
    "index.interval.bytes": "Bytes between offset index entries.",
    "leader.replication.throttled.replicas": "Replicas throttled on the leader (no replication in kbroker).",
    "local.retention.bytes": "Local size kept with tiered storage (-2: retention.bytes).",
    "local.retention.ms": "Local age kept with tiered storage (-2: retention.ms).",
    "max.compaction.lag.ms": "Longest time a record stays uncompacted.",
    "max.message.bytes": "Largest record batch accepted.",
    "message.timestamp.after.max.ms": "How far in the future a batch's timestamp may be.",
    "message.timestamp.before.max.ms": "How far in the past a batch's timestamp may be.",
    "message.timestamp.type": "CreateTime (the producer's) or LogAppendTime (the broker's).",
    "min.cleanable.dirty.ratio": "Share of uncompacted log that triggers compaction.",
    "min.compaction.lag.ms": "Shortest time a record stays uncompacted.",
    "min.insync.replicas": "Replicas that must acknowledge acks=all.",
    "preallocate": "Preallocate segment files.",
    "remote.log.copy.disable": "Stop copying segments to the remote tier.",
    "remote.log.delete.on.disable": "Delete remote segments when tiered storage is turned off.",
    "remote.storage.enable": "Tiered storage (not supported by kbroker).",
    "retention.bytes": "Partition size above which old segments are deleted (-1: no limit).",
    "retention.ms": "Age after which segments are deleted (-1: no limit).",
    "segment.bytes": "Segment size before rolling.",
    "segment.index.bytes": "Size of a segment's offset index.",
    "segment.jitter.ms": "Random time subtracted from segment.ms.",
    "segment.ms": "Segment age before rolling.",
    "unclean.leader.election.enable": "Elect an out-of-sync replica as leader (single node: no effect).",
}


def validate_topic_configs(configs: Mapping[str, str | None]) -> str | None:
    """An error message for the first unknown key or bad value, or None when all are valid."""
    for name, value in configs.items():
        key = TOPIC_CONFIG_KEYS.get(name)
        if key is None:
            return f"Unknown topic config name: {name}"
        if value is None:
            return f"Null value not supported for topic config {name}"
        problem = key.check(value)
        if problem is not None:
            return f"Invalid value {value} for configuration {name}: {problem}"
    if "remote.storage.enable" in configs and configs["remote.storage.enable"] == "true":
        return "Tiered storage is not supported by kbroker"
    return None
