"""Broker configuration: Kafka's server.properties keys, typed, defaulted and validated at start-up.

Only keys kbroker acts on are accepted, plus a short list of Kafka keys that have no meaning for a
single-process broker (thread pools, ZooKeeper, ...), which are accepted with a warning so an existing
server.properties can be reused. Anything else is an error naming the key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("kbroker.config")

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


class ConfigError(ValueError):
    """A configuration problem worth a one-line message at start-up, not a traceback."""


class _int:  # noqa: N801 - used like the other parser functions
    """Parses an integer in low..high; Kafka's config type is INT up to 2**31-1, else LONG."""

    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high
        self.type_name = "INT" if high <= INT_MAX else "LONG"

    def __call__(self, text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ConfigError(f"expected an integer, got {text!r}") from None
        if not self.low <= value <= self.high:
            raise ConfigError(f"{value} is outside {self.low}..{self.high}")
        return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigError(f"expected true or false, got {text!r}")
    return lowered == "true"


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        if value not in options:
            raise ConfigError(f"expected one of {', '.join(options)}, got {text!r}")
        return value

    return parse


def _string(text: str) -> str:
    return text.strip()


def _assignors(text: str) -> str:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in ("uniform", "range")]
    if not names or unknown:
        raise ConfigError(f"expected a list of uniform, range; got {text!r}")
    return ",".join(names)


def _consumer_group_problems(values: Mapping[str, Any]) -> list[str]:
    """Kafka's cross-checks of the group.consumer.* settings (GroupCoordinatorConfig)."""
    prefix = "group.consumer."
    session, heartbeat = values[prefix + "session.timeout.ms"], values[prefix + "heartbeat.interval.ms"]
    checks = [
        (
            values[prefix + "max.session.timeout.ms"] >= values[prefix + "min.session.timeout.ms"],
            "group.consumer.max.session.timeout.ms must be >= group.consumer.min.session.timeout.ms",
        ),
        (
            session >= values[prefix + "min.session.timeout.ms"],
            "group.consumer.session.timeout.ms must be >= group.consumer.min.session.timeout.ms",
        ),
        (
            session <= values[prefix + "max.session.timeout.ms"],
            "group.consumer.session.timeout.ms must be <= group.consumer.max.session.timeout.ms",
        ),
        (
            values[prefix + "max.heartbeat.interval.ms"] >= values[prefix + "min.heartbeat.interval.ms"],
            "group.consumer.max.heartbeat.interval.ms must be >= group.consumer.min.heartbeat.interval.ms",
        ),
        (
            heartbeat >= values[prefix + "min.heartbeat.interval.ms"],
            "group.consumer.heartbeat.interval.ms must be >= group.consumer.min.heartbeat.interval.ms",
        ),
        (
            heartbeat <= values[prefix + "max.heartbeat.interval.ms"],
            "group.consumer.heartbeat.interval.ms must be <= group.consumer.max.heartbeat.interval.ms",
        ),
        (heartbeat < session, "group.consumer.heartbeat.interval.ms must be < group.consumer.session.timeout.ms"),
    ]
    return [message for ok, message in checks if not ok]


@dataclass(frozen=True)
class Key:
    name: str
    parse: Callable[[str], Any]
    default: str
    doc: str
    topic_config: str | None = None  # the topic-level key this broker key is the default for
    kind: str = ""  # Kafka's config type (DescribeConfigs v3+) where the parser does not say it
    null_default: bool = False  # Kafka's default is null (derived from another key): described as null when unset

    @property
    def type_name(self) -> str:
        """Kafka's config type name: BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST, CLASS or PASSWORD."""
        if self.kind:
            return self.kind
        if self.parse is _bool:
            return "BOOLEAN"
        if isinstance(self.parse, _int):
            return self.parse.type_name
        return "STRING"


KEYS: dict[str, Key] = {
    k.name: k
    for k in [
        Key("node.id", _int(0, INT_MAX), "0", "This broker's id."),
        Key("num.partitions", _int(1, 100_000), "1", "Partitions of an auto-created topic."),
        Key("default.replication.factor", _int(1, 1), "1", "Replication factor of auto-created topics."),
        Key("auto.create.topics.enable", _bool, "true", "Create a topic on first Metadata or Produce."),
        Key("delete.topic.enable", _bool, "true", "Allow DeleteTopics."),
        Key(
            "max.incremental.fetch.session.cache.slots",
            _int(0, INT_MAX),
            "1000",
            "Incremental fetch sessions (KIP-227) kept at once.",
        ),
        Key("message.max.bytes", _int(0, INT_MAX), "1048588", "Largest record batch accepted.", "max.message.bytes"),
        Key("log.segment.bytes", _int(14, INT_MAX), "1073741824", "Segment size before rolling.", "segment.bytes"),
        Key(
            "log.roll.ms",
            _int(1, LONG_MAX),
            "604800000",
            "Segment age before rolling (unset: log.roll.hours).",
            "segment.ms",
            null_default=True,
        ),
        Key("log.roll.hours", _int(1, INT_MAX), "168", "Segment age before rolling, in hours (log.roll.ms wins)."),
        Key(
            "log.retention.ms",
            _int(-1, LONG_MAX),
            "604800000",
            "Age after which segments are deleted (unset: log.retention.minutes, then log.retention.hours).",
            "retention.ms",
            null_default=True,
        ),
        Key(
            "log.retention.minutes",
            _int(-1, INT_MAX),
            "",
            "Age after which segments are deleted, in minutes (log.retention.ms wins).",
            null_default=True,
        ),
        Key(
            "log.retention.hours",
            _int(-1, INT_MAX),
            "168",
            "Age after which segments are deleted, in hours (log.retention.ms and log.retention.minutes win).",
        ),
        Key(
            "log.retention.bytes",
            _int(-1, LONG_MAX),
            "-1",
            "Partition size above which old segments go.",
            "retention.bytes",
        ),
        Key("log.retention.check.interval.ms", _int(1, LONG_MAX), "300000", "How often retention runs."),
        Key(
            "log.index.interval.bytes",
            _int(0, INT_MAX),
            "4096",
            "Bytes between offset index entries.",
            "index.interval.bytes",
        ),
        Key(
            "log.flush.interval.messages",
            _int(1, LONG_MAX),
            str(LONG_MAX),
            "Records appended before a partition is fsynced (1: before each acknowledgement).",
            "flush.messages",
        ),
        Key(
            "log.flush.interval.ms",
            _int(0, LONG_MAX),
            str(LONG_MAX),
            "Longest time data stays unflushed.",
            "flush.ms",
            null_default=True,
        ),
        Key(
            "log.message.timestamp.type",
            _choice("CreateTime", "LogAppendTime"),
            "CreateTime",
            "Which timestamp records keep.",
            "message.timestamp.type",
        ),
        Key(
            "log.message.timestamp.before.max.ms",
            _int(0, LONG_MAX),
            str(LONG_MAX),
            "How far in the past a batch's timestamp may be.",
            "message.timestamp.before.max.ms",
        ),
        Key(
            "log.message.timestamp.after.max.ms",
            _int(0, LONG_MAX),
            "3600000",
            "How far in the future a batch's timestamp may be.",
            "message.timestamp.after.max.ms",
        ),
        Key(
            "log.cleanup.policy",
            _choice("delete", "compact", "compact,delete", "delete,compact"),
            "delete",
            "Retention policy of topics.",
            "cleanup.policy",
            kind="LIST",
        ),
        Key(
            "min.insync.replicas",
            _int(1, INT_MAX),
            "1",
            "Replicas that must acknowledge acks=all.",
            "min.insync.replicas",
        ),
        Key(
            "compression.type",
            _choice("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"),
            "producer",
            "Codec batches are stored with.",
            "compression.type",
        ),
        Key("socket.request.max.bytes", _int(1, INT_MAX), "104857600", "Largest request frame accepted."),
        Key("offsets.retention.minutes", _int(1, INT_MAX), "10080", "How long empty groups keep offsets."),
        Key("offsets.topic.num.partitions", _int(1, 1000), "50", "Partitions of the committed-offsets log."),
        Key(
            "group.initial.rebalance.delay.ms",
            _int(0, INT_MAX),
            "3000",
            "Wait for more members before the first rebalance of an empty group.",
        ),
        Key("offsets.retention.check.interval.ms", _int(1, LONG_MAX), "600000", "How often expired offsets go."),
        Key("offset.metadata.max.bytes", _int(0, INT_MAX), "4096", "Largest metadata string of a commit."),
        Key("group.min.session.timeout.ms", _int(0, INT_MAX), "6000", "Smallest session timeout allowed."),
        Key("group.max.session.timeout.ms", _int(0, INT_MAX), "1800000", "Largest session timeout allowed."),
        Key("group.max.size", _int(1, INT_MAX), str(INT_MAX), "Most members of a classic group (KIP-389)."),
        Key(
            "group.consumer.session.timeout.ms",
            _int(1, INT_MAX),
            "45000",
            "Session timeout of consumer-protocol members.",
        ),
        Key(
            "group.consumer.min.session.timeout.ms",
            _int(1, INT_MAX),
            "45000",
            "Smallest consumer-protocol session timeout.",
        ),
        Key(
            "group.consumer.max.session.timeout.ms",
            _int(1, INT_MAX),
            "60000",
            "Largest consumer-protocol session timeout.",
        ),
        Key(
            "group.consumer.heartbeat.interval.ms",
            _int(1, INT_MAX),
            "5000",
            "Heartbeat interval given to consumer-protocol members.",
        ),
        Key(
            "group.consumer.min.heartbeat.interval.ms",
            _int(1, INT_MAX),
            "5000",
            "Smallest consumer-protocol heartbeat interval.",
        ),
        Key(
            "group.consumer.max.heartbeat.interval.ms",
            _int(1, INT_MAX),
            "15000",
            "Largest consumer-protocol heartbeat interval.",
        ),
        Key("group.consumer.max.size", _int(1, INT_MAX), str(INT_MAX), "Most members of a consumer-protocol group."),
        Key(
            "group.consumer.assignors",
            _assignors,
            "uniform,range",
            "Server-side assignors (KIP-848); the first is the default.",
            kind="LIST",
        ),
        Key("transactional.id.expiration.ms", _int(1, INT_MAX), "604800000", "Idle transactional ids expire."),
        Key("transaction.max.timeout.ms", _int(1, INT_MAX), "900000", "Largest transaction timeout."),
        Key(
            "advertised.listeners",
            _string,
            "",
            "host:port clients are told to connect to (unset: the listener).",
            kind="LIST",
            null_default=True,
        ),
        Key(
            "listeners",
            _string,
            "PLAINTEXT://127.0.0.1:9092",
            "host:port to listen on (PLAINTEXT://host:port also accepted).",
            kind="LIST",
        ),
        Key("log.dirs", _string, "", "The data directory.", kind="LIST", null_default=True),
        Key("log.dir", _string, "kbroker-data", "The data directory (log.dirs wins).", kind="LIST"),
    ]
}

# Kafka keys with no meaning here: accepted (with a warning) so a Kafka server.properties still works.
IGNORED_KAFKA_KEYS = frozenset(
    {
        "broker.id",
        "process.roles",
        "controller.quorum.voters",
        "controller.quorum.bootstrap.servers",
        "num.network.threads",
        "num.io.threads",
        "num.recovery.threads.per.data.dir",
        "socket.send.buffer.bytes",
        "socket.receive.buffer.bytes",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "zookeeper.connect",
        "zookeeper.connection.timeout.ms",
        "num.replica.fetchers",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    }
)


# Kafka's listener keys besides listeners and advertised.listeners: accepted, kept as given and read by the
# listener parser (kbroker/server/listeners.py); not (yet) in KEYS, so DescribeConfigs does not list them.
LISTENER_KEYS = ("listener.security.protocol.map", "inter.broker.listener.name", "controller.listener.names")


def _scaled(value: int, unit_ms: int) -> int:
    return -1 if value < 0 else value * unit_ms  # a negative retention means unlimited, whatever the unit


def parse_properties(text: str, source: str = "config") -> dict[str, str]:
    """Java .properties essentials: key=value or key: value, # and ! comments, blank lines."""
    result: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        separator = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if separator <= 0:
            raise ConfigError(f"{source}:{number}: expected key=value, got {raw!r}")
        result[line[:separator].strip()] = line[separator + 1 :].strip()
    return result


class BrokerConfig:
    """Validated broker settings; ``config["log.segment.bytes"]`` gives the typed value."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._raw: dict[str, str] = {}
        self._values: dict[str, Any] = {}
        self.listener_settings: dict[str, str] = {}  # LISTENER_KEYS as given
        errors: list[str] = []
        for name, text in (values or {}).items():
            if name in IGNORED_KAFKA_KEYS:
                log.warning("ignoring %s: it has no meaning for kbroker", name)
                continue
            if name in LISTENER_KEYS:
                self.listener_settings[name] = text.strip()
                continue
            key = KEYS.get(name)
            if key is None:
                errors.append(f"unknown configuration key {name!r}")
                continue
            try:
                self._values[name] = key.parse(text)
                self._raw[name] = text.strip()
            except ConfigError as exc:
                errors.append(f"{name}: {exc}")
        if errors:
            raise ConfigError("; ".join(errors))
        for key in KEYS.values():
            if key.name not in self._values:
                self._values[key.name] = (
                    None if key.default == "" and isinstance(key.parse, _int) else key.parse(key.default)
                )
        # Kafka's derived settings: log.retention.ms, else .minutes, else .hours; log.roll.ms, else .hours.
        if "log.retention.ms" not in self._raw:
            minutes = self._values["log.retention.minutes"]
            hours = self._values["log.retention.hours"]
            self._values["log.retention.ms"] = (
                _scaled(minutes, 60_000) if minutes is not None else _scaled(hours, 3_600_000)
            )
        if "log.roll.ms" not in self._raw:
            self._values["log.roll.ms"] = self._values["log.roll.hours"] * 3_600_000
        problems = _consumer_group_problems(self._values)
        if problems:
            raise ConfigError("; ".join(problems))

    @classmethod
    def load(cls, path: Path | None, overrides: Iterable[str] = ()) -> BrokerConfig:
        values: dict[str, str] = {}
        if path is not None:
            try:
                text = path.read_text()
            except OSError as exc:
                raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
            values.update(parse_properties(text, str(path)))
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"--override expects key=value, got {item!r}")
            name, _, value = item.partition("=")
            values[name.strip()] = value
        return cls(values)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def is_default(self, name: str) -> bool:
        return name not in self._raw

    def describe_value(self, name: str) -> str:
        """The effective value as Kafka writes it in DescribeConfigs (booleans in lower case)."""
        value = self._values[name]
        if isinstance(value, bool):
            return "true" if value else "false"
        return "" if value is None else str(value)

    def items(self) -> Iterable[tuple[str, Any]]:
        return self._values.items()

    def topic_defaults(self) -> dict[str, str]:
        """Topic-level config names with this broker's values: what a topic gets unless overridden."""
        return {key.topic_config: str(self._values[key.name]) for key in KEYS.values() if key.topic_config}
