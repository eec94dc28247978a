"""Dynamic broker configs and group configs: Kafka's ConfigRecords on BROKER and GROUP resources.

A broker's effective settings are layered as Kafka's DynamicBrokerConfig layers them: the dynamic config of this
broker (ConfigRecord on BROKER "<node id>") over the cluster-wide dynamic default (BROKER "") over the static
config file over the defaults. A topic's config is its own override over those. Only keys Kafka 4.4 updates at run
time are accepted, and of those only the ones kbroker applies without a restart: the topic defaults (log.*,
message.max.bytes, compression.*, min.insync.replicas, ...) and the log cleaner's settings. Others are refused
with a message saying so.

Group configs (KIP-848, Kafka's GroupConfig) are ConfigRecords on GROUP "<group id>": the consumer group
coordinator reads a group's session timeout and heartbeat interval from the image, over the broker's
group.consumer.* defaults, and they are validated against the broker's group.consumer.min/max.* bounds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import NamedTuple

from kbroker import config_registry as registry
from kbroker.config import BrokerConfig
from kbroker.config_registry import ConfigError
from kbroker.metadata.image import ConfigResourceType, MetadataDelta, MetadataImage
from protocol.errors import ErrorCode

log = logging.getLogger("kbroker.config")

# Kafka 4.4's dynamically updatable broker configs: those its DescribeConfigs marks read_only=false.
KAFKA_DYNAMIC_BROKER_KEYS = frozenset(
    """
    background.threads compression.gzip.level compression.lz4.level compression.type compression.zstd.level
    config.providers cordoned.log.dirs errors.deadletterqueue.auto.create.topics.enable
    errors.deadletterqueue.topic.name.prefix follower.fetch.last.tiered.offset.enable
    group.consumer.assignment.interval.ms group.coordinator.cached.buffer.max.bytes
    group.share.assignment.interval.ms group.streams.assignment.interval.ms listener.security.protocol.map
    listeners log.cleaner.backoff.ms log.cleaner.dedupe.buffer.size log.cleaner.delete.retention.ms
    log.cleaner.io.buffer.load.factor log.cleaner.io.buffer.size log.cleaner.io.max.bytes.per.second
    log.cleaner.max.compaction.lag.ms log.cleaner.min.cleanable.ratio log.cleaner.min.compaction.lag.ms
    log.cleaner.threads log.cleanup.policy log.flush.interval.messages log.flush.interval.ms
    log.index.interval.bytes log.index.size.max.bytes log.local.retention.bytes log.local.retention.ms
    log.message.timestamp.after.max.ms log.message.timestamp.before.max.ms log.message.timestamp.type
    log.preallocate log.remote.copy.lag.bytes log.remote.copy.lag.ms log.retention.bytes log.retention.ms
    log.roll.jitter.ms log.roll.ms log.segment.bytes log.segment.delete.delay.ms max.connection.creation.rate
    max.connections max.connections.per.ip max.connections.per.ip.overrides max.decompressed.message.bytes
    message.max.bytes metric.reporters min.insync.replicas num.io.threads num.network.threads
    num.recovery.threads.per.data.dir num.replica.fetchers principal.builder.class producer.id.expiration.ms
    remote.fetch.max.wait.ms remote.list.offsets.request.timeout.ms remote.log.index.file.cache.total.size.bytes
    remote.log.manager.copier.thread.pool.size remote.log.manager.copy.max.bytes.per.second
    remote.log.manager.expiration.thread.pool.size remote.log.manager.fetch.max.bytes.per.second
    remote.log.manager.follower.thread.pool.size remote.log.reader.threads sasl.enabled.mechanisms
    sasl.jaas.config sasl.kerberos.kinit.cmd sasl.kerberos.min.time.before.relogin
    sasl.kerberos.principal.to.local.rules sasl.kerberos.service.name sasl.kerberos.ticket.renew.jitter
    sasl.kerberos.ticket.renew.window.factor sasl.login.refresh.buffer.seconds
    sasl.login.refresh.min.period.seconds sasl.login.refresh.window.factor sasl.login.refresh.window.jitter
    sasl.mechanism.inter.broker.protocol share.coordinator.cached.buffer.max.bytes ssl.cipher.suites
    ssl.client.auth ssl.enabled.protocols ssl.endpoint.identification.algorithm ssl.engine.factory.class
    ssl.key.password ssl.keymanager.algorithm ssl.keystore.certificate.chain ssl.keystore.key
    ssl.keystore.location ssl.keystore.password ssl.keystore.type ssl.protocol ssl.provider
    ssl.secure.random.implementation ssl.trustmanager.algorithm ssl.truststore.certificates
    ssl.truststore.location ssl.truststore.password ssl.truststore.type transaction.partition.verification.enable
    unclean.leader.election.enable
    """.split()
)

# The log cleaner's settings its service reads before each pass (kbroker/services.py LogCleanerService).
CLEANER_KEYS = frozenset(
    {
        "log.cleaner.backoff.ms",
        "log.cleaner.dedupe.buffer.size",
        "log.cleaner.io.buffer.load.factor",
        "log.cleaner.io.max.bytes.per.second",
        "log.cleaner.threads",  # accepted with a warning, as in server.properties
        "log.cleaner.io.buffer.size",  # accepted with a warning, as in server.properties
    }
)

# What kbroker changes at run time: Kafka's dynamic keys that are topic defaults, and the cleaner's.
APPLIED_DYNAMIC_KEYS = frozenset(
    name
    for name in KAFKA_DYNAMIC_BROKER_KEYS
    if name in registry.BROKER_DEFS and (registry.BROKER_DEFS[name].topic_config is not None or name in CLEANER_KEYS)
)

# ConfigSource values (DescribeConfigs v1+) of the dynamic layers.
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
GROUP_CONFIG = 8


def kafka_value_problem(definition: registry.ConfigDef, value: str) -> str | None:
    """Why ``value`` is not valid for ``definition``, in Kafka's words where Kafka's validator has them."""
    parse = definition.parse
    invalid = f"Invalid value {value} for configuration {definition.name}"
    if isinstance(parse, registry.Int):
        try:
            number = int(value.strip())
        except ValueError:
            return f"{invalid}: Not a number of type {parse.type_name}"
        if number not in parse.extra:
            if number < parse.low:
                return f"{invalid}: Value must be at least {parse.low}"
            if number > parse.high:
                return f"{invalid}: Value must be no more than {parse.high}"
    try:
        parsed = parse(value)
    except ConfigError as exc:
        return f"{invalid}: {exc}"
    refused = registry.problem_with(definition, parsed)
    return None if refused is None else f"{invalid}: {refused}"


def broker_configs_problem(configs: Mapping[str, str | None]) -> tuple[ErrorCode, str] | None:
    """Kafka's DynamicBrokerConfig.validateConfigs over a resource's configs as they would be after the change
    (Kafka's order: read-only keys first, then values), with kbroker's refusal of the keys it cannot apply live."""
    static = sorted(name for name in configs if name in registry.BROKER_DEFS and name not in KAFKA_DYNAMIC_BROKER_KEYS)
    if static:
        return ErrorCode.INVALID_REQUEST, f"Cannot update these configs dynamically: [{', '.join(static)}]"
    unapplied = sorted(name for name in configs if name not in APPLIED_DYNAMIC_KEYS)
    if unapplied:
        return ErrorCode.INVALID_REQUEST, (
            f"kbroker cannot update these configs dynamically: [{', '.join(unapplied)}] (kbroker applies only "
            "the topic defaults and log.cleaner.* at run time; set others in the config file)"
        )
    for name, value in configs.items():
        if value is None:
            return ErrorCode.INVALID_REQUEST, f"Null value not supported for : {name}"
        problem = kafka_value_problem(registry.BROKER_DEFS[name], value)
        if problem is not None:
            return ErrorCode.INVALID_REQUEST, problem
    return None


def warn_unapplied_broker(resource: str, configs: Mapping[str, str]) -> None:
    """Log the dynamic settings kbroker accepts but does not act on (as for server.properties)."""
    for name, value in configs.items():
        definition = registry.BROKER_DEFS.get(name)
        if definition is None:
            continue
        try:
            reason = registry.warning_for(definition, definition.parse(value))
        except ConfigError:
            continue
        if reason is not None:
            log.warning("%s: %s=%s is accepted but not applied: %s", resource, name, value, reason)


# Kafka's DynamicBrokerConfig.brokerConfigSynonyms: the keys a derived setting is worked out from, in order.
_SYNONYM_CHAINS = (
    ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    ("log.roll.ms", "log.roll.hours"),
    ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
)
BROKER_SYNONYMS = {name: chain for chain in _SYNONYM_CHAINS for name in chain}
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
# Settings Kafka requires, so it lists no default synonym for them; kbroker has defaults of its own.
REQUIRED_IN_KAFKA = frozenset({"node.id"})


class BrokerConfigLayers(NamedTuple):
    """A broker's settings by source: the static config, the cluster-wide dynamic default, this broker's dynamic
    configs, and the effective settings they make (Kafka's precedence: per broker > default > static)."""

    static: BrokerConfig
    default: Mapping[str, str]
    per_broker: Mapping[str, str]
    effective: BrokerConfig

    @classmethod
    def of(cls, static: BrokerConfig, image: MetadataImage, node_id: int) -> BrokerConfigLayers:
        default = dict(image.config(ConfigResourceType.BROKER, ""))
        per_broker = dict(image.config(ConfigResourceType.BROKER, str(node_id)))
        # A stored key kbroker would refuse now (a data directory from another broker) is skipped, not fatal.
        layered = {
            name: value
            for name, value in {**default, **per_broker}.items()
            if broker_configs_problem({name: value}) is None
        }
        return cls(static, default, per_broker, static.with_dynamic(layered))

    def synonyms(self, name: str, *, per_broker: bool = True) -> list[tuple[str, str | None, int]]:
        """Kafka's ConfigHelper.configSynonyms: each synonym of ``name`` where a source sets it, by source (this
        broker's dynamic, the dynamic default, static, default), from the first entry for ``name`` itself on.
        ``per_broker`` False (the default resource): only the dynamic default's."""
        chain = BROKER_SYNONYMS.get(name, (name,))
        found: list[tuple[str, str | None, int]] = []
        if per_broker:
            found += [(n, self.per_broker[n], DYNAMIC_BROKER_CONFIG) for n in chain if n in self.per_broker]
        found += [(n, self.default[n], DYNAMIC_DEFAULT_BROKER_CONFIG) for n in chain if n in self.default]
        if per_broker:
            for n in chain:
                if n in registry.BROKER_DEFS and not self.static.is_default(n):
                    found.append((n, self.static.describe_value(n), STATIC_BROKER_CONFIG))
            for n in chain:
                definition = registry.BROKER_DEFS.get(n)
                if definition is not None and not definition.null_default and n not in REQUIRED_IN_KAFKA:
                    found.append((n, definition.default, DEFAULT_CONFIG))
        while found and found[0][0] != name:
            found.pop(0)
        return found


class DynamicBrokerConfig:
    """The broker's effective settings: its static config with the image's dynamic BROKER configs over it.

    Subscribed to the broker's MetadataCache; each image that changes this broker's or the default's configs
    rebuilds ``current`` and tells the listeners (the log manager's topic defaults, ...)."""

    def __init__(self, static: BrokerConfig, node_id: int, image: MetadataImage) -> None:
        self.static = static
        self.node_id = node_id
        self.listeners: list[Callable[[BrokerConfig], None]] = []
        self.layers = BrokerConfigLayers(static, {}, {}, static)
        self.current = static
        self._rebuild(image)

    def _rebuild(self, image: MetadataImage) -> None:
        self.layers = BrokerConfigLayers.of(self.static, image, self.node_id)
        self.current = self.layers.effective

    def publish(self, image: MetadataImage, delta: MetadataDelta) -> None:
        mine = {(ConfigResourceType.BROKER, ""), (ConfigResourceType.BROKER, str(self.node_id))}
        if not mine.intersection(delta.changed_configs()):
            return
        self._rebuild(image)
        for listener in self.listeners:
            listener(self.current)


# --- group configs ------------------------------------------------------------------------------------------


class GroupKey(NamedTuple):
    """One of Kafka's GroupConfig keys that kbroker's consumer group coordinator honours."""

    name: str
    broker_default: str  # the broker setting that is its default (its synonym)
    minimum: str  # the broker settings bounding it
    maximum: str


GROUP_KEYS = {
    key.name: key
    for key in (
        GroupKey(
            "consumer.session.timeout.ms",
            "group.consumer.session.timeout.ms",
            "group.consumer.min.session.timeout.ms",
            "group.consumer.max.session.timeout.ms",
        ),
        GroupKey(
            "consumer.heartbeat.interval.ms",
            "group.consumer.heartbeat.interval.ms",
            "group.consumer.min.heartbeat.interval.ms",
            "group.consumer.max.heartbeat.interval.ms",
        ),
    )
}


def group_configs_problem(config: BrokerConfig, configs: Mapping[str, str | None]) -> tuple[ErrorCode, str] | None:
    """Kafka's GroupConfig.validate over a group's configs as they would be after the change."""
    values: dict[str, int] = {}
    for name, value in configs.items():
        key = GROUP_KEYS.get(name)
        if key is None:
            return ErrorCode.INVALID_CONFIG, f"Unknown group config name: {name}"
        if value is None:
            return ErrorCode.INVALID_CONFIG, f"Null value not supported for group configs: {name}"
        try:
            values[name] = int(value.strip())
        except ValueError:
            return ErrorCode.INVALID_CONFIG, f"Invalid value {value} for configuration {name}: Not a number of type INT"
        if values[name] < 1:
            return ErrorCode.INVALID_CONFIG, f"Invalid value {value} for configuration {name}: Value must be at least 1"
    for name, number in values.items():
        key = GROUP_KEYS[name]
        low, high = config[key.minimum], config[key.maximum]
        if not low <= number <= high:
            return ErrorCode.INVALID_CONFIG, f"{name} must be in the range {low} to {high} inclusive."
    session = values.get("consumer.session.timeout.ms", config["group.consumer.session.timeout.ms"])
    heartbeat = values.get("consumer.heartbeat.interval.ms", config["group.consumer.heartbeat.interval.ms"])
    if session <= heartbeat:
        return (
            ErrorCode.INVALID_CONFIG,
            "consumer.session.timeout.ms must be greater than consumer.heartbeat.interval.ms",
        )
    return None
