"""Topic-level configuration: Kafka's topic config names, their broker-level synonyms and validation.

Used by CreateTopics, AlterConfigs, IncrementalAlterConfigs and DescribeConfigs. A topic's effective
value is its own override, else the broker's setting of the synonym, else Kafka's default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kbroker.config import BrokerConfig

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


@dataclass(frozen=True)
class TopicConfigKey:
    name: str
    default: str
    check: Callable[[str], str | None]
    broker_synonym: str | None = None
    type_name: str = "LONG"  # DescribeConfigs v3+ config type name


_KEYS = [
    TopicConfigKey("cleanup.policy", "delete", _cleanup_policy, "log.cleanup.policy", "LIST"),
    TopicConfigKey(
        "compression.type",
        "producer",
        _one_of("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
        "compression.type",
        "STRING",
    ),
    TopicConfigKey("delete.retention.ms", "86400000", _int_range(0, LONG_MAX)),
    TopicConfigKey("file.delete.delay.ms", "60000", _int_range(0, LONG_MAX)),
    TopicConfigKey("flush.messages", str(LONG_MAX), _int_range(1, LONG_MAX), "log.flush.interval.messages"),
    TopicConfigKey("flush.ms", str(LONG_MAX), _int_range(0, LONG_MAX), "log.flush.interval.ms"),
    TopicConfigKey("index.interval.bytes", "4096", _int_range(0, INT_MAX), "log.index.interval.bytes", "INT"),
    TopicConfigKey("max.compaction.lag.ms", str(LONG_MAX), _int_range(1, LONG_MAX)),
    TopicConfigKey("max.message.bytes", "1048588", _int_range(0, INT_MAX), "message.max.bytes", "INT"),
    TopicConfigKey("message.timestamp.after.max.ms", str(LONG_MAX), _int_range(0, LONG_MAX)),
    TopicConfigKey("message.timestamp.before.max.ms", str(LONG_MAX), _int_range(0, LONG_MAX)),
    TopicConfigKey(
        "message.timestamp.type",
        "CreateTime",
        _one_of("CreateTime", "LogAppendTime"),
        "log.message.timestamp.type",
        "STRING",
    ),
    TopicConfigKey("min.cleanable.dirty.ratio", "0.5", _ratio, None, "DOUBLE"),
    TopicConfigKey("min.compaction.lag.ms", "0", _int_range(0, LONG_MAX)),
    TopicConfigKey("min.insync.replicas", "1", _int_range(1, INT_MAX), "min.insync.replicas", "INT"),
    TopicConfigKey("preallocate", "false", _bool, None, "BOOLEAN"),
    TopicConfigKey("retention.bytes", "-1", _int_range(-1, LONG_MAX), "log.retention.bytes"),
    TopicConfigKey("retention.ms", "604800000", _int_range(-1, LONG_MAX), "log.retention.ms"),
    TopicConfigKey("segment.bytes", "1073741824", _int_range(14, INT_MAX), "log.segment.bytes", "INT"),
    TopicConfigKey("segment.index.bytes", "10485760", _int_range(4, INT_MAX), None, "INT"),
    TopicConfigKey("segment.jitter.ms", "0", _int_range(0, LONG_MAX)),
    TopicConfigKey("segment.ms", "604800000", _int_range(1, LONG_MAX), "log.roll.ms"),
    TopicConfigKey("unclean.leader.election.enable", "false", _bool, None, "BOOLEAN"),
    TopicConfigKey("follower.replication.throttled.replicas", "", _any, None, "LIST"),
    TopicConfigKey("leader.replication.throttled.replicas", "", _any, None, "LIST"),
    TopicConfigKey("remote.storage.enable", "false", _bool, None, "BOOLEAN"),
    TopicConfigKey("local.retention.ms", "-2", _int_range(-2, LONG_MAX)),
    TopicConfigKey("local.retention.bytes", "-2", _int_range(-2, LONG_MAX)),
]
TOPIC_CONFIG_KEYS: dict[str, TopicConfigKey] = {key.name: key for key in _KEYS}


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


def broker_default(config: BrokerConfig, key: TopicConfigKey) -> tuple[str, bool]:
    """The broker-level value for a topic config and whether the broker set it explicitly."""
    if key.broker_synonym is not None:
        return str(config[key.broker_synonym]), not config.is_default(key.broker_synonym)
    return key.default, False
