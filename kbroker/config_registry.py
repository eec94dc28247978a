"""Every broker and topic config key kbroker knows, in one table.

Each entry gives Kafka's name, type and default, the validator (a parser that raises ConfigError with a
one-line reason), where the key applies (broker, topic, or both under one name), its synonym on the other
level, whether Kafka can change it at run time, and what kbroker does with it:

* IMPLEMENTED: the value is applied.
* WARNED: accepted and reported, but it has no effect here (no meaning on a single node, or the feature is
  not built yet and clients send the key anyway); setting it logs a warning with the reason.
* REFUSED: setting it is an error naming the reason (and the issue that will implement it).

``when`` narrows WARNED or REFUSED to some values (log.cleaner.threads above 1, remote.storage.enable=true).
kbroker/config.py (server.properties), kbroker/topic_config.py (topic overrides) and the DescribeConfigs
handler all read this table. kbroker/UNSUPPORTED.md lists what is warned or refused and why.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
SHORT_MAX = 2**15 - 1


class ConfigError(ValueError):
    """A configuration problem worth a one-line message, not a traceback."""


class Scope(Enum):
    BROKER = "broker"  # a server.properties key
    TOPIC = "topic"  # a topic override; its broker-level synonym, if any, is another entry
    BOTH = "both"  # the same name on both levels (min.insync.replicas): the broker's value is the topic default


class Status(Enum):
    IMPLEMENTED = "implemented"
    WARNED = "accepted with a warning"
    REFUSED = "refused"


# --- validators: text -> typed value, or ConfigError --------------------------------------------------------


class Int:
    """An integer in low..high; Kafka's type is INT up to 2**31-1, LONG above (SHORT when asked)."""

    def __init__(self, low: int, high: int, *extra: int, short: bool = False) -> None:
        self.low, self.high, self.extra = low, high, extra
        self.type_name = "SHORT" if short else "INT" if high <= INT_MAX else "LONG"

    def __call__(self, text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ConfigError(f"expected an integer, got {text!r}") from None
        if not self.low <= value <= self.high and value not in self.extra:
            raise ConfigError(f"{value} is outside {self.low}..{self.high}")
        return value


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigError(f"expected true or false, got {text!r}")
    return lowered == "true"


def parse_string(text: str) -> str:
    return text.strip()


def parse_ratio(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigError(f"expected a number, got {text!r}") from None
    if not 0 <= value <= 1:
        raise ConfigError(f"{value} is outside 0..1")
    return value


def choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip()
        if value not in options:
            raise ConfigError(f"expected one of {', '.join(options)}, got {text!r}")
        return value

    return parse


def list_of(*options: str, empty: bool = True) -> Callable[[str], str]:
    """A comma-separated list of the given words (any words when none are given)."""

    def parse(text: str) -> str:
        items = [item.strip() for item in text.split(",") if item.strip()]
        unknown = [item for item in items if options and item not in options]
        if unknown or (not items and not empty):
            raise ConfigError(f"expected a list of {', '.join(options)}; got {text!r}")
        return ",".join(items)

    return parse


def parse_positive_double(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ConfigError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise ConfigError(f"{text!r} must be above 0")
    return value


def parse_cleanup_policy(text: str) -> str:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        raise ConfigError(f"{text!r} must be delete, compact or both")
    return text.strip()


def parse_metrics_listen(text: str) -> str:
    """``HOST:PORT`` (IPv6 hosts in brackets, no host: every interface, port 0: any free port), or empty."""
    value = text.strip()
    if not value:
        return ""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"expected HOST:PORT, got {text!r}")
    return value


CODECS = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


class ConfigDef(NamedTuple):
    name: str
    type_name: str  # Kafka's ConfigType: BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST, CLASS, PASSWORD
    default: str  # Kafka's default as text ("" with null_default: Kafka's default is null)
    parse: Callable[[str], Any]  # the validator: the typed value, or ConfigError
    doc: str
    scope: Scope
    status: Status = Status.IMPLEMENTED
    reason: str = ""  # why it is warned or refused, naming the issue that will implement it
    when: Callable[[Any], bool] | None = None  # the values the status applies to (None: every value)
    # TOPIC: Kafka's broker-level synonym (its value is the topic's default); BROKER: the topic key this is the
    # default of; BOTH: the name itself.
    synonym: str | None = None
    dynamic: bool = False  # Kafka can change it at run time (topic keys: always; kbroker's broker keys: never)
    null_default: bool = False  # Kafka's default is null (derived from another key): described as null when unset
    described: bool = True  # a broker key kbroker lists in DescribeConfigs (topic keys: always)

    @property
    def broker(self) -> bool:
        return self.scope in (Scope.BROKER, Scope.BOTH)

    @property
    def topic(self) -> bool:
        return self.scope in (Scope.TOPIC, Scope.BOTH)

    @property
    def broker_synonym(self) -> str | None:
        """A topic key's broker-level synonym."""
        return self.name if self.scope is Scope.BOTH else self.synonym if self.scope is Scope.TOPIC else None

    @property
    def topic_config(self) -> str | None:
        """The topic key a broker key is the default for."""
        return self.name if self.scope is Scope.BOTH else self.synonym if self.scope is Scope.BROKER else None

    def status_of(self, value: Any) -> Status:
        """This key's status for one (parsed) value."""
        if self.status is Status.IMPLEMENTED or self.when is None or self.when(value):
            return self.status
        return Status.IMPLEMENTED


B, T, BOTH = Scope.BROKER, Scope.TOPIC, Scope.BOTH
WARNED, REFUSED = Status.WARNED, Status.REFUSED

_SINGLE_NODE = "no meaning on a single node"
_NO_POOLS = "no meaning for kbroker: one trio event loop serves every connection, there are no thread pools to size"
_NO_REPLICATION = f"{_SINGLE_NODE}: every partition has one replica"
_INTERNAL_REPLICATION = f"{_NO_REPLICATION} (applied with process.roles=broker, under Kafka's controllers)"
_KRAFT = f"{_SINGLE_NODE}: kbroker has no KRaft controller quorum"
_QUORUM_ONLY = f"{_SINGLE_NODE}, its own controller: applied with process.roles=broker, under Kafka's controllers"
_COMBINED_ROLES = (
    "a single kbroker node is its own controller; to join a KRaft controller quorum, run Apache Kafka's "
    "controllers and set process.roles=broker"
)
# Where the KRaft settings and the internal topics' replication apply: under Kafka's controllers
# (process.roles=broker), not on a single node.
QUORUM_KEYS = (
    "default.replication.factor",
    "controller.quorum.voters",
    "controller.quorum.bootstrap.servers",
    "offsets.topic.replication.factor",
    "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr",
    # how this broker connects to the controllers and the other brokers (kbroker/kraft/node_security.py)
    "security.inter.broker.protocol",
    "sasl.mechanism.inter.broker.protocol",
    "sasl.mechanism.controller.protocol",
)
# Warned for another reason on a broker under Kafka's controllers (process.roles=broker): what the controllers
# decide, from their own settings and the topics' configs, never from a broker's.
BROKER_ROLE_WARNINGS = {
    "unclean.leader.election.enable": (
        "the KRaft controller quorum elects leaders: set it on the controllers, or as a topic config"
    ),
}
CONTROLLER_ROLE_REFUSED = (
    "process.roles=controller is not supported: kbroker implements the KRaft broker role only; run Apache Kafka's "
    "controller (process.roles=controller) and start kbroker with process.roles=broker and "
    "controller.quorum.bootstrap.servers naming it"
)
_TIERED = "applies only to tiered storage, which kbroker does not have (remote.storage.enable is refused)"
_SHARE_GROUPS = "applies only to share groups (KIP-932), which kbroker does not have: no group writes to this topic"
_DECOMPRESSED_RECORD = (
    "not applied: kbroker bounds a batch's decompressed size, not each record's (Kafka 4.4 refuses a larger record "
    "with INVALID_RECORD)"
)
_LOAD_BUFFER = "not applied: kbroker loads __transaction_state a megabyte of whole batches at a time"
_TRANSACTION_TIMERS = (
    "not applied: kbroker aborts a timed-out transaction and forgets an expired transactional id at its deadline, "
    "not on a periodic scan"
)

CONFIG_DEFS: list[ConfigDef] = [
    # --- broker settings kbroker describes (DescribeConfigs on the broker lists exactly these) ---
    ConfigDef("node.id", "INT", "0", Int(0, INT_MAX), "This broker's id.", B),
    ConfigDef("num.partitions", "INT", "1", Int(1, 100_000), "Partitions of an auto-created topic.", B),
    ConfigDef(
        "default.replication.factor",
        "INT",
        "1",
        Int(1, INT_MAX),
        "Replication factor of auto-created topics.",
        B,
        WARNED,
        f"{_NO_REPLICATION} (applied with process.roles=broker, under Kafka's controllers)",
        when=lambda factor: factor > 1,
    ),
    ConfigDef("auto.create.topics.enable", "BOOLEAN", "true", parse_bool, "Create a topic on first Metadata.", B),
    ConfigDef("delete.topic.enable", "BOOLEAN", "true", parse_bool, "Allow DeleteTopics.", B),
    ConfigDef(
        "max.incremental.fetch.session.cache.slots",
        "INT",
        "1000",
        Int(0, INT_MAX),
        "Incremental fetch sessions (KIP-227) kept at once.",
        B,
    ),
    ConfigDef(
        "message.max.bytes",
        "INT",
        "1048588",
        Int(0, INT_MAX),
        "Largest record batch accepted.",
        B,
        synonym="max.message.bytes",
        dynamic=True,
    ),
    ConfigDef(
        "log.segment.bytes",
        "INT",
        "1073741824",
        Int(14, INT_MAX),
        "Segment size before rolling.",
        B,
        synonym="segment.bytes",
        dynamic=True,
    ),
    ConfigDef(
        "log.roll.ms",
        "LONG",
        "604800000",
        Int(1, LONG_MAX),
        "Segment age before rolling (unset: log.roll.hours).",
        B,
        synonym="segment.ms",
        dynamic=True,
        null_default=True,
    ),
    ConfigDef(
        "log.roll.hours", "INT", "168", Int(1, INT_MAX), "Segment age before rolling, in hours (log.roll.ms wins).", B
    ),
    ConfigDef(
        "log.retention.ms",
        "LONG",
        "604800000",
        Int(-1, LONG_MAX),
        "Age after which segments are deleted (unset: log.retention.minutes, then log.retention.hours).",
        B,
        synonym="retention.ms",
        dynamic=True,
        null_default=True,
    ),
    ConfigDef(
        "log.retention.minutes",
        "INT",
        "",
        Int(-1, INT_MAX),
        "Age after which segments are deleted, in minutes (log.retention.ms wins).",
        B,
        null_default=True,
    ),
    ConfigDef(
        "log.retention.hours",
        "INT",
        "168",
        Int(-1, INT_MAX),
        "Age after which segments are deleted, in hours (log.retention.ms and log.retention.minutes win).",
        B,
    ),
    ConfigDef(
        "log.retention.bytes",
        "LONG",
        "-1",
        Int(-1, LONG_MAX),
        "Partition size above which old segments go.",
        B,
        synonym="retention.bytes",
        dynamic=True,
    ),
    ConfigDef("log.retention.check.interval.ms", "LONG", "300000", Int(1, LONG_MAX), "How often retention runs.", B),
    # The metadata log's snapshots and retention (kbroker/metadata/snapshots.py), Kafka's keys and defaults.
    ConfigDef(
        "metadata.log.max.record.bytes.between.snapshots",
        "LONG",
        "20971520",
        Int(1, LONG_MAX),
        "Bytes appended to the metadata log after which the metadata image is snapshotted.",
        B,
        described=False,
    ),
    ConfigDef(
        "metadata.log.max.snapshot.interval.ms",
        "LONG",
        "3600000",
        Int(0, LONG_MAX),
        "Time after which the metadata image is snapshotted if the log grew (0: no time bound).",
        B,
        described=False,
    ),
    ConfigDef(
        "metadata.max.retention.bytes",
        "LONG",
        "104857600",
        Int(-1, LONG_MAX),
        "Size of the metadata log and its snapshots past which older snapshots and the log they cover are deleted.",
        B,
        described=False,
    ),
    ConfigDef(
        "metadata.max.retention.ms",
        "LONG",
        "604800000",
        Int(-1, LONG_MAX),
        "Age past which older metadata snapshots and the log they cover are deleted.",
        B,
        described=False,
    ),
    ConfigDef("log.cleaner.enable", "BOOLEAN", "true", parse_bool, "Run the log cleaner (compaction).", B),
    ConfigDef(
        "log.cleaner.backoff.ms", "LONG", "15000", Int(0, LONG_MAX), "Sleep of the cleaner when nothing is dirty.", B
    ),
    ConfigDef(
        "log.cleaner.dedupe.buffer.size",
        "LONG",
        "134217728",
        Int(1 << 20, LONG_MAX),
        "Memory for the cleaner's key map (kbroker keeps 1 key per 128 bytes of it, Kafka 1 per 24).",
        B,
        dynamic=True,
    ),
    ConfigDef(
        "log.cleaner.io.buffer.load.factor",
        "DOUBLE",
        "0.9",
        parse_ratio,
        "Share of the dedupe buffer the key map may fill.",
        B,
    ),
    ConfigDef(
        "log.cleaner.io.max.bytes.per.second",
        "DOUBLE",
        "1.7976931348623157E308",
        parse_positive_double,
        "Cleaner I/O (read plus written) per second.",
        B,
        dynamic=True,
    ),
    ConfigDef(
        "log.cleaner.io.buffer.size",
        "INT",
        "524288",
        Int(0, INT_MAX),
        "Cleaner read and write buffers.",
        B,
        WARNED,
        "kbroker's cleaner reads segments 1 MiB at a time whatever this says",
        dynamic=True,
    ),
    ConfigDef(
        "log.cleaner.threads",
        "INT",
        "1",
        Int(0, INT_MAX),
        "Cleaner threads.",
        B,
        WARNED,
        "kbroker cleans one partition at a time, in one worker process",
        when=lambda value: value != 1,
        dynamic=True,
    ),
    ConfigDef(
        "log.flush.offset.checkpoint.interval.ms",
        "INT",
        "60000",
        Int(0, INT_MAX),
        "How often each partition's recovery point (what is fsynced) is written to recovery-point-offset-checkpoint:"
        " after an unclean stop, segments from there on are checked record by record.",
        B,
    ),
    ConfigDef(
        "log.index.interval.bytes",
        "INT",
        "4096",
        Int(0, INT_MAX),
        "Bytes between offset index entries.",
        B,
        synonym="index.interval.bytes",
        dynamic=True,
    ),
    ConfigDef(
        "log.flush.interval.messages",
        "LONG",
        str(LONG_MAX),
        Int(1, LONG_MAX),
        "Records appended before a partition is fsynced (1: before each acknowledgement).",
        B,
        synonym="flush.messages",
        dynamic=True,
    ),
    ConfigDef(
        "log.flush.interval.ms",
        "LONG",
        str(LONG_MAX),
        Int(0, LONG_MAX),
        "Longest time data stays unflushed.",
        B,
        synonym="flush.ms",
        dynamic=True,
        null_default=True,
    ),
    ConfigDef(
        "log.message.timestamp.type",
        "STRING",
        "CreateTime",
        choice("CreateTime", "LogAppendTime"),
        "Which timestamp records keep.",
        B,
        synonym="message.timestamp.type",
        dynamic=True,
    ),
    ConfigDef(
        "log.message.timestamp.before.max.ms",
        "LONG",
        str(LONG_MAX),
        Int(0, LONG_MAX),
        "How far in the past a batch's timestamp may be.",
        B,
        synonym="message.timestamp.before.max.ms",
        dynamic=True,
    ),
    ConfigDef(
        "log.message.timestamp.after.max.ms",
        "LONG",
        "3600000",
        Int(0, LONG_MAX),
        "How far in the future a batch's timestamp may be.",
        B,
        synonym="message.timestamp.after.max.ms",
        dynamic=True,
    ),
    ConfigDef(
        "log.cleanup.policy",
        "LIST",
        "delete",
        parse_cleanup_policy,
        "Retention policy of topics.",
        B,
        synonym="cleanup.policy",
        dynamic=True,
    ),
    ConfigDef(
        "min.insync.replicas",
        "INT",
        "1",
        Int(1, INT_MAX),
        "In-sync replicas (capped by the replica count) without which acks=all is refused NOT_ENOUGH_REPLICAS.",
        BOTH,
        dynamic=True,
    ),
    ConfigDef(
        "compression.type",
        "STRING",
        "producer",
        choice(*CODECS),
        "Codec of stored batches; producer keeps what the producer sent, another codec is applied on append.",
        BOTH,
        dynamic=True,
    ),
    ConfigDef("socket.request.max.bytes", "INT", "104857600", Int(1, INT_MAX), "Largest request frame accepted.", B),
    ConfigDef(
        "connections.max.idle.ms",
        "LONG",
        "600000",
        Int(-LONG_MAX - 1, LONG_MAX),  # Kafka has no validator: a negative value never closes idle connections
        "Close a connection on which no bytes moved for this long (negative: never).",
        B,
    ),
    ConfigDef(
        "queued.max.request.bytes",
        "LONG",
        "-1",
        Int(-LONG_MAX - 1, LONG_MAX),  # Kafka has no validator; not positive means unbounded
        "Bytes of requests received and not yet answered, over all connections, before reading pauses "
        "(not positive: unbounded; else at least socket.request.max.bytes).",
        B,
    ),
    ConfigDef(
        "quota.window.num", "INT", "11", Int(1, INT_MAX), "Samples of each client-quota rate (kbroker/quotas.py).", B
    ),
    ConfigDef("quota.window.size.seconds", "INT", "1", Int(1, INT_MAX), "Time span of each client-quota sample.", B),
    ConfigDef("offsets.retention.minutes", "INT", "10080", Int(1, INT_MAX), "How long empty groups keep offsets.", B),
    ConfigDef(
        "offsets.topic.num.partitions",
        "INT",
        "50",
        Int(1, 1000),
        "Partitions of __consumer_offsets, set when the broker creates it (on the first FindCoordinator).",
        B,
    ),
    ConfigDef(
        "offsets.topic.segment.bytes",
        "INT",
        "104857600",
        Int(1, INT_MAX),
        "segment.bytes of __consumer_offsets, set when the broker creates it.",
        B,
    ),
    ConfigDef(
        "group.initial.rebalance.delay.ms",
        "INT",
        "3000",
        Int(0, INT_MAX),
        "Wait for more members before the first rebalance of an empty group.",
        B,
    ),
    ConfigDef(
        "offsets.retention.check.interval.ms", "LONG", "600000", Int(1, LONG_MAX), "How often expired offsets go.", B
    ),
    ConfigDef("offset.metadata.max.bytes", "INT", "4096", Int(0, INT_MAX), "Largest metadata string of a commit.", B),
    ConfigDef("group.min.session.timeout.ms", "INT", "6000", Int(0, INT_MAX), "Smallest session timeout allowed.", B),
    ConfigDef("group.max.session.timeout.ms", "INT", "1800000", Int(0, INT_MAX), "Largest session timeout allowed.", B),
    ConfigDef("group.max.size", "INT", str(INT_MAX), Int(1, INT_MAX), "Most members of a classic group (KIP-389).", B),
    ConfigDef(
        "group.consumer.session.timeout.ms",
        "INT",
        "45000",
        Int(1, INT_MAX),
        "Session timeout of consumer-protocol members.",
        B,
    ),
    ConfigDef(
        "group.consumer.min.session.timeout.ms",
        "INT",
        "45000",
        Int(1, INT_MAX),
        "Smallest consumer-protocol session timeout.",
        B,
    ),
    ConfigDef(
        "group.consumer.max.session.timeout.ms",
        "INT",
        "60000",
        Int(1, INT_MAX),
        "Largest consumer-protocol session timeout.",
        B,
    ),
    ConfigDef(
        "group.consumer.heartbeat.interval.ms",
        "INT",
        "5000",
        Int(1, INT_MAX),
        "Heartbeat interval given to consumer-protocol members.",
        B,
    ),
    ConfigDef(
        "group.consumer.min.heartbeat.interval.ms",
        "INT",
        "5000",
        Int(1, INT_MAX),
        "Smallest consumer-protocol heartbeat interval.",
        B,
    ),
    ConfigDef(
        "group.consumer.max.heartbeat.interval.ms",
        "INT",
        "15000",
        Int(1, INT_MAX),
        "Largest consumer-protocol heartbeat interval.",
        B,
    ),
    ConfigDef(
        "group.consumer.max.size",
        "INT",
        str(INT_MAX),
        Int(1, INT_MAX),
        "Most members of a consumer-protocol group.",
        B,
    ),
    ConfigDef(
        "group.consumer.assignors",
        "LIST",
        "uniform,range",
        list_of("uniform", "range", empty=False),
        "Server-side assignors (KIP-848); the first is the default.",
        B,
    ),
    ConfigDef(
        "transactional.id.expiration.ms",
        "INT",
        "604800000",
        Int(1, INT_MAX),
        "Idle transactional ids expire.",
        B,
    ),
    ConfigDef(
        "transaction.max.timeout.ms",
        "INT",
        "900000",
        Int(1, INT_MAX),
        "Largest transaction timeout.",
        B,
    ),
    ConfigDef(
        "transaction.state.log.num.partitions",
        "INT",
        "50",
        Int(1, INT_MAX),
        "Partitions of the transaction state log (__transaction_state), set when the broker creates it.",
        B,
        described=False,
    ),
    ConfigDef(
        "transaction.state.log.segment.bytes",
        "INT",
        "104857600",
        Int(1, INT_MAX),
        "Segment size of the transaction state log (__transaction_state), set when the broker creates it.",
        B,
        described=False,
    ),
    ConfigDef(
        "transaction.state.log.load.buffer.size",
        "INT",
        "5242880",
        Int(1, INT_MAX),
        "Read buffer for loading the transaction state log.",
        B,
        WARNED,
        _LOAD_BUFFER,
        described=False,
    ),
    ConfigDef(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "INT",
        "10000",
        Int(1, INT_MAX),
        "How often timed-out transactions are looked for.",
        B,
        WARNED,
        _TRANSACTION_TIMERS,
        described=False,
    ),
    ConfigDef(
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        "INT",
        "3600000",
        Int(1, INT_MAX),
        "How often expired transactional ids are looked for.",
        B,
        WARNED,
        _TRANSACTION_TIMERS,
        described=False,
    ),
    ConfigDef(
        "advertised.listeners",
        "LIST",
        "",
        parse_string,
        "host:port clients are told to connect to (unset: the listener).",
        B,
        null_default=True,
    ),
    ConfigDef(
        "listeners",
        "LIST",
        "PLAINTEXT://127.0.0.1:9092",
        parse_string,
        "host:port to listen on (PLAINTEXT://host:port also accepted).",
        B,
        dynamic=True,
    ),
    ConfigDef("log.dirs", "LIST", "", parse_string, "The data directory.", B, null_default=True),
    ConfigDef("log.dir", "LIST", "kbroker-data", parse_string, "The data directory (log.dirs wins).", B),
    # --- kbroker's own keys (no Kafka counterpart; not described) ---
    ConfigDef(
        "kbroker.metrics.listen",
        "STRING",
        "",
        parse_metrics_listen,
        "HOST:PORT of the Prometheus metrics endpoint, GET /metrics (unset: none; kbroker serve --metrics-listen).",
        B,
        described=False,
    ),
    ConfigDef(
        "kbroker.request.receive.timeout.ms",
        "LONG",
        "60000",
        Int(-LONG_MAX - 1, LONG_MAX),
        "Close a connection whose request has not arrived whole this long after its first bytes (negative: never); "
        "clients give up on a request after their request.timeout.ms, 30 s by default.",
        B,
        described=False,
    ),
    # --- Kafka broker keys not described by kbroker: the listener keys (read by kbroker/server/listeners.py, which
    # validates them further), then keys with no meaning here, accepted with a warning so a Kafka
    # server.properties works ---
    ConfigDef(
        "broker.id",
        "INT",
        "-1",
        Int(-1, INT_MAX),
        "Kafka's older name of node.id.",
        B,
        WARNED,
        "kbroker's id is node.id",
        described=False,
    ),
    ConfigDef(
        "process.roles",
        "LIST",
        "",
        list_of("broker", "controller"),
        "KRaft roles: broker runs kbroker as a broker under Kafka's KRaft controller quorum; unset, a single node.",
        B,
        WARNED,
        _COMBINED_ROLES,
        when=lambda roles: "controller" in roles.split(","),  # process.roles=controller alone: refused (config.py)
        described=False,
    ),
    ConfigDef(
        "controller.quorum.voters",
        "LIST",
        "",
        list_of(),
        "The KRaft controllers as id@host:port (process.roles=broker).",
        B,
        WARNED,
        _QUORUM_ONLY,
        described=False,
    ),
    ConfigDef(
        "controller.quorum.bootstrap.servers",
        "LIST",
        "",
        list_of(),
        "Addresses of the KRaft controllers as host:port (process.roles=broker).",
        B,
        WARNED,
        _QUORUM_ONLY,
        described=False,
    ),
    ConfigDef(
        "initial.broker.registration.timeout.ms",
        "INT",
        "60000",
        Int(1, INT_MAX),
        "How long a broker under a KRaft controller quorum waits to be registered and unfenced before it stops "
        "(process.roles=broker).",
        B,
        described=False,
    ),
    ConfigDef(
        "broker.heartbeat.interval.ms",
        "INT",
        "2000",
        Int(1, INT_MAX),
        "How often a broker under a KRaft controller quorum heartbeats (process.roles=broker).",
        B,
        described=False,
    ),
    ConfigDef(
        "controller.listener.names",
        "STRING",
        "",
        parse_string,
        "Listener names of the KRaft controller: kbroker does not serve them.",
        B,
        null_default=True,
        described=False,
    ),
    ConfigDef(
        "inter.broker.listener.name",
        "STRING",
        "",
        parse_string,
        "Listener between brokers: the broker's main address.",
        B,
        null_default=True,
        described=False,
    ),
    ConfigDef(
        "listener.security.protocol.map",
        "STRING",
        "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT",
        list_of(),
        "Security protocol of each listener name.",
        B,
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "num.network.threads",
        "INT",
        "3",
        Int(1, INT_MAX),
        "Network threads.",
        B,
        WARNED,
        _NO_POOLS,
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "num.io.threads",
        "INT",
        "8",
        Int(1, INT_MAX),
        "Request handler threads.",
        B,
        WARNED,
        _NO_POOLS,
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "num.recovery.threads.per.data.dir",
        "INT",
        "2",
        Int(1, INT_MAX),
        "Log recovery threads.",
        B,
        WARNED,
        _NO_POOLS,
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "replica.high.watermark.checkpoint.interval.ms",
        "LONG",
        "5000",
        Int(1, LONG_MAX),
        "How often the partitions' high watermarks are written to replication-offset-checkpoint.",
        B,
        described=False,
    ),
    ConfigDef(
        "replica.lag.time.max.ms",
        "LONG",
        "30000",
        Int(1, LONG_MAX),
        "How long a follower may go without catching up to its leader's log end before it leaves the ISR.",
        B,
        described=False,
    ),
    ConfigDef(
        "replica.fetch.wait.max.ms",
        "INT",
        "500",
        Int(0, INT_MAX),
        "How long a follower's fetch may wait at its leader for replica.fetch.min.bytes.",
        B,
        described=False,
    ),
    ConfigDef(
        "replica.fetch.min.bytes",
        "INT",
        "1",
        Int(1, INT_MAX),
        "The bytes a follower's fetch waits for at its leader.",
        B,
        described=False,
    ),
    ConfigDef(
        "replica.fetch.max.bytes",
        "INT",
        "1048576",
        Int(0, INT_MAX),
        "The bytes a follower fetches per partition (at least one batch).",
        B,
        described=False,
    ),
    ConfigDef(
        "replica.fetch.response.max.bytes",
        "INT",
        "10485760",
        Int(0, INT_MAX),
        "The bytes a follower's fetch answer may hold (at least one batch).",
        B,
        described=False,
    ),
    ConfigDef(
        "replica.fetch.backoff.ms",
        "INT",
        "1000",
        Int(0, INT_MAX),
        "How long a follower waits before fetching again a partition whose fetch failed.",
        B,
        described=False,
    ),
    ConfigDef(
        "num.replica.fetchers",
        "INT",
        "1",
        Int(1, INT_MAX),
        "Replica fetcher threads.",
        B,
        WARNED,
        _INTERNAL_REPLICATION,
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "socket.send.buffer.bytes",
        "INT",
        "102400",
        Int(-1, INT_MAX),
        "SO_SNDBUF of sockets.",
        B,
        WARNED,
        "not applied: kbroker leaves socket buffers to the operating system",
        described=False,
    ),
    ConfigDef(
        "socket.receive.buffer.bytes",
        "INT",
        "102400",
        Int(-1, INT_MAX),
        "SO_RCVBUF of sockets.",
        B,
        WARNED,
        "not applied: kbroker leaves socket buffers to the operating system",
        described=False,
    ),
    ConfigDef(
        "offsets.topic.replication.factor",
        "SHORT",
        "3",
        Int(1, SHORT_MAX, short=True),
        "Replicas of __consumer_offsets.",
        B,
        WARNED,
        _INTERNAL_REPLICATION,
        described=False,
    ),
    ConfigDef(
        "transaction.state.log.replication.factor",
        "SHORT",
        "3",
        Int(1, SHORT_MAX, short=True),
        "Replicas of __transaction_state.",
        B,
        WARNED,
        _INTERNAL_REPLICATION,
        described=False,
    ),
    ConfigDef(
        "transaction.state.log.min.isr",
        "INT",
        "2",
        Int(1, INT_MAX),
        "min.insync.replicas of __transaction_state.",
        B,
        WARNED,
        _NO_REPLICATION,
        described=False,
    ),
    ConfigDef(
        "share.coordinator.state.topic.replication.factor",
        "SHORT",
        "3",
        Int(1, SHORT_MAX, short=True),
        "Replicas of __share_group_state.",
        B,
        WARNED,
        _NO_REPLICATION,
        described=False,
    ),
    ConfigDef(
        "share.coordinator.state.topic.min.isr",
        "SHORT",
        "2",
        Int(1, SHORT_MAX, short=True),
        "min.insync.replicas of __share_group_state.",
        B,
        WARNED,
        _NO_REPLICATION,
        described=False,
    ),
    ConfigDef(
        "zookeeper.connect",
        "STRING",
        "",
        parse_string,
        "ZooKeeper (removed in Kafka 4).",
        B,
        WARNED,
        "no meaning for kbroker: there is no ZooKeeper",
        null_default=True,
        described=False,
    ),
    ConfigDef(
        "zookeeper.connection.timeout.ms",
        "INT",
        "",
        Int(0, INT_MAX),
        "ZooKeeper (removed in Kafka 4).",
        B,
        WARNED,
        "no meaning for kbroker: there is no ZooKeeper",
        null_default=True,
        described=False,
    ),
    # --- the log cleaner's topic defaults ---
    ConfigDef(
        "log.cleaner.delete.retention.ms",
        "LONG",
        "86400000",
        Int(0, LONG_MAX),
        "Default of delete.retention.ms.",
        B,
        synonym="delete.retention.ms",
        dynamic=True,
    ),
    ConfigDef(
        "log.cleaner.max.compaction.lag.ms",
        "LONG",
        str(LONG_MAX),
        Int(1, LONG_MAX),
        "Default of max.compaction.lag.ms.",
        B,
        synonym="max.compaction.lag.ms",
        dynamic=True,
    ),
    ConfigDef(
        "log.cleaner.min.compaction.lag.ms",
        "LONG",
        "0",
        Int(0, LONG_MAX),
        "Default of min.compaction.lag.ms.",
        B,
        synonym="min.compaction.lag.ms",
        dynamic=True,
    ),
    ConfigDef(
        "log.cleaner.min.cleanable.ratio",
        "DOUBLE",
        "0.5",
        parse_ratio,
        "Default of min.cleanable.dirty.ratio.",
        B,
        synonym="min.cleanable.dirty.ratio",
        dynamic=True,
    ),
    # --- broker-level synonyms of topic keys kbroker does not apply (not described on the broker) ---
    ConfigDef(
        "log.segment.delete.delay.ms",
        "LONG",
        "60000",
        Int(0, LONG_MAX),
        "Default of file.delete.delay.ms.",
        B,
        WARNED,
        "not applied: a deleted segment's files are removed at once",
        synonym="file.delete.delay.ms",
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "log.local.retention.bytes",
        "LONG",
        "-2",
        Int(-2, LONG_MAX),
        "Default of local.retention.bytes.",
        B,
        WARNED,
        _TIERED,
        synonym="local.retention.bytes",
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "log.local.retention.ms",
        "LONG",
        "-2",
        Int(-2, LONG_MAX),
        "Default of local.retention.ms.",
        B,
        WARNED,
        _TIERED,
        synonym="local.retention.ms",
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "log.remote.copy.lag.bytes",
        "LONG",
        "-1",
        Int(-1, LONG_MAX),
        "Default of remote.copy.lag.bytes.",
        B,
        WARNED,
        _TIERED,
        synonym="remote.copy.lag.bytes",
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "log.remote.copy.lag.ms",
        "LONG",
        "0",
        Int(-1, LONG_MAX),
        "Default of remote.copy.lag.ms.",
        B,
        WARNED,
        _TIERED,
        synonym="remote.copy.lag.ms",
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "log.preallocate",
        "BOOLEAN",
        "false",
        parse_bool,
        "Default of preallocate.",
        B,
        WARNED,
        "not applied: segment files grow as written",
        synonym="preallocate",
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "log.index.size.max.bytes",
        "INT",
        "10485760",
        Int(4, INT_MAX),
        "Default of segment.index.bytes.",
        B,
        WARNED,
        "not applied: kbroker's offset index grows as needed",
        synonym="segment.index.bytes",
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "unclean.leader.election.enable",
        "BOOLEAN",
        "false",
        parse_bool,
        "Elect an out-of-sync replica as leader (single node: no effect).",
        BOTH,
        WARNED,
        _NO_REPLICATION,
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "compression.gzip.level",
        "INT",
        "-1",
        Int(1, 9, -1),
        "gzip level when the broker compresses (compression.type=gzip); -1 is zlib's default, 6.",
        BOTH,
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "compression.lz4.level",
        "INT",
        "9",
        Int(1, 17),
        "lz4 level when the broker compresses (compression.type=lz4): 9 the fast compressor, others LZ4HC.",
        BOTH,
        dynamic=True,
        described=False,
    ),
    ConfigDef(
        "compression.zstd.level",
        "INT",
        "3",
        Int(-131072, 22),
        "zstd level when the broker compresses (compression.type=zstd).",
        BOTH,
        dynamic=True,
        described=False,
    ),
    # --- topic keys (DescribeConfigs on a topic lists every topic and both-level key, in name order) ---
    ConfigDef(
        "cleanup.policy",
        "LIST",
        "delete",
        parse_cleanup_policy,
        "delete (drop old segments), compact (keep the last record per key), or both.",
        T,
        synonym="log.cleanup.policy",
        dynamic=True,
    ),
    ConfigDef(
        "delete.retention.ms",
        "LONG",
        "86400000",
        Int(0, LONG_MAX),
        "How long delete markers stay in a compacted topic.",
        T,
        synonym="log.cleaner.delete.retention.ms",
        dynamic=True,
    ),
    ConfigDef(
        "errors.deadletterqueue.group.enable",
        "BOOLEAN",
        "false",
        parse_bool,
        "Let share groups write undeliverable records to this topic.",
        T,
        WARNED,
        _SHARE_GROUPS,
        when=lambda value: value,
        dynamic=True,
    ),
    ConfigDef(
        "file.delete.delay.ms",
        "LONG",
        "60000",
        Int(0, LONG_MAX),
        "Wait before a deleted segment's files are removed.",
        T,
        WARNED,
        "not applied: a deleted segment's files are removed at once",
        synonym="log.segment.delete.delay.ms",
        dynamic=True,
    ),
    ConfigDef(
        "flush.messages",
        "LONG",
        str(LONG_MAX),
        Int(1, LONG_MAX),
        "Records appended before the partition is fsynced (1: before each acknowledgement).",
        T,
        synonym="log.flush.interval.messages",
        dynamic=True,
    ),
    ConfigDef(
        "flush.ms",
        "LONG",
        str(LONG_MAX),
        Int(0, LONG_MAX),
        "Longest time appended data stays unflushed.",
        T,
        synonym="log.flush.interval.ms",
        dynamic=True,
    ),
    ConfigDef(
        "follower.replication.throttled.replicas",
        "LIST",
        "",
        list_of(),
        "Replicas throttled on followers (no replication in kbroker).",
        T,
        WARNED,
        _NO_REPLICATION,
        dynamic=True,
    ),
    ConfigDef(
        "index.interval.bytes",
        "INT",
        "4096",
        Int(0, INT_MAX),
        "Bytes between offset index entries.",
        T,
        synonym="log.index.interval.bytes",
        dynamic=True,
    ),
    ConfigDef(
        "leader.replication.throttled.replicas",
        "LIST",
        "",
        list_of(),
        "Replicas throttled on the leader (no replication in kbroker).",
        T,
        WARNED,
        _NO_REPLICATION,
        dynamic=True,
    ),
    ConfigDef(
        "local.retention.bytes",
        "LONG",
        "-2",
        Int(-2, LONG_MAX),
        "Local size kept with tiered storage (-2: retention.bytes).",
        T,
        WARNED,
        _TIERED,
        synonym="log.local.retention.bytes",
        dynamic=True,
    ),
    ConfigDef(
        "local.retention.ms",
        "LONG",
        "-2",
        Int(-2, LONG_MAX),
        "Local age kept with tiered storage (-2: retention.ms).",
        T,
        WARNED,
        _TIERED,
        synonym="log.local.retention.ms",
        dynamic=True,
    ),
    ConfigDef(
        "max.compaction.lag.ms",
        "LONG",
        str(LONG_MAX),
        Int(1, LONG_MAX),
        "Longest time a record stays uncompacted.",
        T,
        synonym="log.cleaner.max.compaction.lag.ms",
        dynamic=True,
    ),
    ConfigDef(
        "max.decompressed.message.bytes",
        "INT",
        "2147483639",
        Int(1, INT_MAX),
        "Largest decompressed record accepted.",
        BOTH,
        WARNED,
        _DECOMPRESSED_RECORD,
        when=lambda value: value < 2147483639,
        dynamic=True,
    ),
    ConfigDef(
        "max.message.bytes",
        "INT",
        "1048588",
        Int(0, INT_MAX),
        "Largest record batch accepted.",
        T,
        synonym="message.max.bytes",
        dynamic=True,
    ),
    ConfigDef(
        "message.timestamp.after.max.ms",
        "LONG",
        "3600000",
        Int(0, LONG_MAX),
        "How far in the future a batch's timestamp may be.",
        T,
        synonym="log.message.timestamp.after.max.ms",
        dynamic=True,
    ),
    ConfigDef(
        "message.timestamp.before.max.ms",
        "LONG",
        str(LONG_MAX),
        Int(0, LONG_MAX),
        "How far in the past a batch's timestamp may be.",
        T,
        synonym="log.message.timestamp.before.max.ms",
        dynamic=True,
    ),
    ConfigDef(
        "message.timestamp.type",
        "STRING",
        "CreateTime",
        choice("CreateTime", "LogAppendTime"),
        "CreateTime (the producer's) or LogAppendTime (the broker's).",
        T,
        synonym="log.message.timestamp.type",
        dynamic=True,
    ),
    ConfigDef(
        "min.cleanable.dirty.ratio",
        "DOUBLE",
        "0.5",
        parse_ratio,
        "Share of uncompacted log that triggers compaction.",
        T,
        synonym="log.cleaner.min.cleanable.ratio",
        dynamic=True,
    ),
    ConfigDef(
        "min.compaction.lag.ms",
        "LONG",
        "0",
        Int(0, LONG_MAX),
        "Shortest time a record stays uncompacted.",
        T,
        synonym="log.cleaner.min.compaction.lag.ms",
        dynamic=True,
    ),
    ConfigDef(
        "preallocate",
        "BOOLEAN",
        "false",
        parse_bool,
        "Preallocate segment files.",
        T,
        WARNED,
        "not applied: segment files grow as written",
        synonym="log.preallocate",
        dynamic=True,
    ),
    ConfigDef(
        "remote.copy.lag.bytes",
        "LONG",
        "-1",
        Int(-1, LONG_MAX),
        "Newer local bytes after which a segment may be copied to the remote tier (-1: from local retention).",
        T,
        WARNED,
        _TIERED,
        synonym="log.remote.copy.lag.bytes",
        dynamic=True,
    ),
    ConfigDef(
        "remote.copy.lag.ms",
        "LONG",
        "0",
        Int(-1, LONG_MAX),
        "Age after which a segment may be copied to the remote tier (-1: from local retention).",
        T,
        WARNED,
        _TIERED,
        synonym="log.remote.copy.lag.ms",
        dynamic=True,
    ),
    ConfigDef(
        "remote.log.copy.disable",
        "BOOLEAN",
        "false",
        parse_bool,
        "Stop copying segments to the remote tier.",
        T,
        WARNED,
        _TIERED,
        dynamic=True,
    ),
    ConfigDef(
        "remote.log.delete.on.disable",
        "BOOLEAN",
        "false",
        parse_bool,
        "Delete remote segments when tiered storage is turned off.",
        T,
        WARNED,
        _TIERED,
        dynamic=True,
    ),
    ConfigDef(
        "remote.storage.enable",
        "BOOLEAN",
        "false",
        parse_bool,
        "Tiered storage (not supported by kbroker).",
        T,
        REFUSED,
        "Tiered storage is not supported by kbroker",
        when=lambda value: value,
        dynamic=True,
    ),
    ConfigDef(
        "retention.bytes",
        "LONG",
        "-1",
        Int(-1, LONG_MAX),
        "Partition size above which old segments are deleted (-1: no limit).",
        T,
        synonym="log.retention.bytes",
        dynamic=True,
    ),
    ConfigDef(
        "retention.ms",
        "LONG",
        "604800000",
        Int(-1, LONG_MAX),
        "Age after which segments are deleted (-1: no limit).",
        T,
        synonym="log.retention.ms",
        dynamic=True,
    ),
    ConfigDef(
        "segment.bytes",
        "INT",
        "1073741824",
        Int(14, INT_MAX),
        "Segment size before rolling.",
        T,
        synonym="log.segment.bytes",
        dynamic=True,
    ),
    ConfigDef(
        "segment.index.bytes",
        "INT",
        "10485760",
        Int(4, INT_MAX),
        "Size of a segment's offset index.",
        T,
        WARNED,
        "not applied: kbroker's offset index grows as needed",
        synonym="log.index.size.max.bytes",
        dynamic=True,
    ),
    # log.roll.jitter.ms has no default in Kafka, which therefore lists no synonym.
    ConfigDef(
        "segment.jitter.ms",
        "LONG",
        "0",
        Int(0, LONG_MAX),
        "Random time subtracted from segment.ms.",
        T,
        WARNED,
        "not applied: segments roll at segment.ms exactly",
        dynamic=True,
    ),
    ConfigDef(
        "segment.ms",
        "LONG",
        "604800000",
        Int(1, LONG_MAX),
        "Segment age before rolling.",
        T,
        synonym="log.roll.ms",
        dynamic=True,
    ),
]


# --- security (issue #18): TLS, SASL and the authorizer -------------------------------------------------------
# Kafka's broker-wide values; each can be overridden per listener as listener.name.<listener>.<key>, and the
# SASL ones per listener and mechanism as listener.name.<listener>.<mechanism>.<key> (see LISTENER_SCOPED).

STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
DEFAULT_PRINCIPAL_BUILDER = "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder"
_JAVA_CLASS = "kbroker is not a JVM: it cannot load Java classes; only Kafka's default is accepted"
_BROKER_AS_CLIENT = (
    f"{_SINGLE_NODE}: the broker opens no connections of its own (no inter-broker or controller traffic)"
)
_JAVA_SSL = "a Java (JSSE) setting with no equivalent in Python's ssl module (OpenSSL)"


def parse_authorizer(text: str) -> str:
    name = text.strip()
    if name in ("", STANDARD_AUTHORIZER):
        return name
    if name == "kafka.security.authorizer.AclAuthorizer":
        raise ConfigError(f"{name} is Kafka's ZooKeeper authorizer; set {STANDARD_AUTHORIZER} (KRaft's)")
    raise ConfigError(f"{name!r}: {_JAVA_CLASS} ({STANDARD_AUTHORIZER}), or empty for no authorizer")


def parse_super_users(text: str) -> str:
    """``User:alice;User:bob``: principals separated by semicolons, each ``Type:name``."""
    users = [item.strip() for item in text.split(";") if item.strip()]
    for user in users:
        kind, sep, name = user.partition(":")
        if not sep or not kind or not name:
            raise ConfigError(f"{user!r} is not a principal (expected Type:name, such as User:alice)")
    return ";".join(users)


def java_class(default: str) -> Callable[[str], str]:
    """A Java class name kbroker cannot load: only Kafka's default (or nothing) is accepted."""

    def parse(text: str) -> str:
        name = text.strip()
        if name not in ("", default):
            raise ConfigError(f"{name!r}: {_JAVA_CLASS}" + (f" ({default})" if default else ""))
        return name

    return parse


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")


def _secret(name: str, doc: str) -> ConfigDef:
    return ConfigDef(name, "PASSWORD", "", parse_string, doc, B, null_default=True, described=False)


def _location(name: str, doc: str) -> ConfigDef:
    return ConfigDef(name, "STRING", "", parse_string, doc, B, null_default=True, described=False)


def _warned(name: str, type_name: str, default: str, doc: str, reason: str) -> ConfigDef:
    return ConfigDef(name, type_name, default, parse_string, doc, B, WARNED, reason, described=False)


def _refused_class(name: str, doc: str, default: str = "") -> ConfigDef:
    return ConfigDef(name, "CLASS", default, java_class(default), doc, B, null_default=not default, described=False)


SECURITY_DEFS: list[ConfigDef] = [
    # TLS (kbroker/security/tls.py)
    ConfigDef(
        "ssl.protocol", "STRING", "TLSv1.3", parse_string, "Highest TLS version of the SSL context.", B, described=False
    ),
    ConfigDef(
        "ssl.enabled.protocols", "LIST", "TLSv1.2,TLSv1.3", list_of(), "TLS versions accepted.", B, described=False
    ),
    ConfigDef(
        "ssl.cipher.suites",
        "LIST",
        "",
        list_of(),
        "Cipher suites (IANA names); empty: the defaults.",
        B,
        described=False,
    ),
    ConfigDef(
        "ssl.keystore.type",
        "STRING",
        "JKS",
        parse_string,
        "Key store format: PEM or PKCS12 (JKS cannot be read).",
        B,
        described=False,
    ),
    _location("ssl.keystore.location", "Key store file."),
    _secret("ssl.keystore.password", "Key store password (PKCS12)."),
    _secret("ssl.key.password", "Password of the private key."),
    _secret("ssl.keystore.key", "PEM private key, inline (ssl.keystore.type=PEM)."),
    _secret("ssl.keystore.certificate.chain", "PEM certificate chain, inline (ssl.keystore.type=PEM)."),
    ConfigDef(
        "ssl.truststore.type", "STRING", "JKS", parse_string, "Trust store format: PEM or PKCS12.", B, described=False
    ),
    _location("ssl.truststore.location", "Trust store file (client certificates' CAs)."),
    _secret("ssl.truststore.password", "Trust store password (PKCS12)."),
    _secret("ssl.truststore.certificates", "PEM trusted certificates, inline (ssl.truststore.type=PEM)."),
    ConfigDef(
        "ssl.client.auth",
        "STRING",
        "none",
        choice("required", "requested", "none"),
        "Client certificates: required (mutual TLS), requested, none.",
        B,
        described=False,
    ),
    ConfigDef(
        "ssl.principal.mapping.rules",
        "STRING",
        "DEFAULT",
        parse_string,
        "Rules mapping a client certificate's distinguished name to a principal name.",
        B,
        described=False,
    ),
    _warned(
        "ssl.endpoint.identification.algorithm",
        "STRING",
        "https",
        "Server host name checks of TLS clients.",
        _BROKER_AS_CLIENT,
    ),
    _warned("ssl.keymanager.algorithm", "STRING", "SunX509", "JSSE key manager.", _JAVA_SSL),
    _warned("ssl.trustmanager.algorithm", "STRING", "PKIX", "JSSE trust manager.", _JAVA_SSL),
    _warned("ssl.secure.random.implementation", "STRING", "", "JSSE random source.", _JAVA_SSL),
    _warned("ssl.provider", "STRING", "", "JSSE security provider.", _JAVA_SSL),
    _warned(
        "ssl.allow.dn.changes",
        "BOOLEAN",
        "false",
        "Key store updates changing the DN.",
        "kbroker reads its key store at start-up; it is not reconfigured at run time",
    ),
    _warned(
        "ssl.allow.san.changes",
        "BOOLEAN",
        "false",
        "Key store updates changing SANs.",
        "kbroker reads its key store at start-up; it is not reconfigured at run time",
    ),
    _refused_class("ssl.engine.factory.class", "Custom SSL engine factory."),
    # SASL (kbroker/security/sasl, kbroker/security/authenticator.py)
    ConfigDef(
        "sasl.enabled.mechanisms",
        "LIST",
        "GSSAPI",
        list_of(*SASL_MECHANISMS),
        "SASL mechanisms offered on SASL listeners (GSSAPI, Kafka's default, is refused by a SASL listener).",
        B,
        described=False,
    ),
    ConfigDef(
        "connection.failed.authentication.delay.ms",
        "INT",
        "100",
        Int(0, INT_MAX),
        "Wait before answering a failed authentication and closing the connection.",
        B,
        described=False,
    ),
    ConfigDef(
        "sasl.server.max.receive.size",
        "INT",
        "524288",
        Int(1, INT_MAX),
        "Largest SASL token accepted before authentication completes.",
        B,
        described=False,
    ),
    ConfigDef(
        "connections.max.reauth.ms",
        "LONG",
        "0",
        Int(0, LONG_MAX),
        "Longest SASL session before the client must re-authenticate (0: no limit; KIP-368).",
        B,
        described=False,
    ),
    ConfigDef(
        "sasl.jaas.config",
        "PASSWORD",
        "",
        parse_string,
        "JAAS login configuration.",
        B,
        REFUSED,
        "a broker reads JAAS configs per listener and mechanism: set "
        "listener.name.<listener>.<mechanism>.sasl.jaas.config "
        "(e.g. listener.name.sasl_plaintext.plain.sasl.jaas.config)",
        when=bool,
        null_default=True,
        described=False,
    ),
    _refused_class("sasl.server.callback.handler.class", "Custom SASL server callback handler."),
    _refused_class("sasl.login.class", "Custom SASL login."),
    _refused_class("sasl.login.callback.handler.class", "Custom SASL login callback handler."),
    _warned(
        "sasl.mechanism.inter.broker.protocol", "STRING", "GSSAPI", "SASL mechanism between brokers.", _BROKER_AS_CLIENT
    ),
    _warned("sasl.mechanism.controller.protocol", "STRING", "GSSAPI", "SASL mechanism towards controllers.", _KRAFT),
    _warned(
        "security.inter.broker.protocol", "STRING", "PLAINTEXT", "Security protocol between brokers.", _BROKER_AS_CLIENT
    ),
    _warned(
        "sasl.kerberos.service.name", "STRING", "", "Kerberos service name.", "GSSAPI (Kerberos) is not implemented"
    ),
    _warned(
        "sasl.kerberos.principal.to.local.rules",
        "LIST",
        "DEFAULT",
        "Kerberos principal mapping.",
        "GSSAPI (Kerberos) is not implemented",
    ),
    _refused_class(
        "principal.builder.class",
        "Builds principals from authenticated connections.",
        "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder",
    ),
    # Authorization (kbroker/security/authorizer.py)
    ConfigDef(
        "authorizer.class.name",
        "STRING",
        "",
        parse_authorizer,
        f"The authorizer: empty (none: everything allowed) or {STANDARD_AUTHORIZER}.",
        B,
        described=False,
    ),
    ConfigDef(
        "super.users",
        "STRING",
        "",
        parse_super_users,
        "Principals allowed everything, separated by semicolons (User:admin;User:ops).",
        B,
        null_default=True,
        described=False,
    ),
    ConfigDef(
        "allow.everyone.if.no.acl.found",
        "BOOLEAN",
        "false",
        parse_bool,
        "Allow a request on a resource that has no ACL.",
        B,
        described=False,
    ),
]
CONFIG_DEFS.extend(SECURITY_DEFS)

# Keys a listener overrides as listener.name.<listener>.<key>; the SASL ones also per mechanism as
# listener.name.<listener>.<mechanism>.<key> (Kafka's ListenerName.saslMechanismConfigPrefix).
LISTENER_SCOPED = frozenset(
    {d.name for d in SECURITY_DEFS if d.name.startswith("ssl.")}
    | {
        "sasl.enabled.mechanisms",
        "sasl.server.max.receive.size",
        "connections.max.reauth.ms",
        "principal.builder.class",
    }
)
MECHANISM_SCOPED = frozenset(
    {
        "sasl.jaas.config",
        "sasl.server.callback.handler.class",
        "connections.max.reauth.ms",
        "sasl.login.class",
        "sasl.login.callback.handler.class",
    }
)

REGISTRY: dict[str, ConfigDef] = {d.name: d for d in CONFIG_DEFS}
# Every server.properties key kbroker accepts (or refuses by name), and the ones DescribeConfigs lists.
BROKER_DEFS: dict[str, ConfigDef] = {d.name: d for d in CONFIG_DEFS if d.broker}
DESCRIBED_BROKER_DEFS: dict[str, ConfigDef] = {name: d for name, d in BROKER_DEFS.items() if d.described}
# Topic keys in Kafka's order (by name), as DescribeConfigs lists them.
TOPIC_DEFS: dict[str, ConfigDef] = {d.name: d for d in sorted(CONFIG_DEFS, key=lambda d: d.name) if d.topic}


def problem_with(definition: ConfigDef, value: Any) -> str | None:
    """The reason a parsed value is refused, or None."""
    return definition.reason if definition.status_of(value) is Status.REFUSED else None


def warning_for(definition: ConfigDef, value: Any) -> str | None:
    """The reason a parsed value is accepted but not applied, or None."""
    return definition.reason if definition.status_of(value) is Status.WARNED else None
