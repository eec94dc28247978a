"""Broker configuration: Kafka's server.properties keys, typed, defaulted and validated at start-up.

The keys, their types, defaults, validators and what kbroker does with each are in kbroker/config_registry.py.
A key kbroker applies is accepted; a Kafka key with no meaning for a single-process broker (thread pools,
KRaft quorum, replication factors, ...) or not applied yet is accepted with a warning naming the reason, so an
existing server.properties can be reused; a key refused by the registry, or unknown, is an error naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kbroker import config_registry as registry

log = logging.getLogger("kbroker.config")

ConfigError = registry.ConfigError
LONG_MAX, INT_MAX = registry.LONG_MAX, registry.INT_MAX
Key = registry.ConfigDef  # one entry of the registry (kbroker/config_registry.py)


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


# The broker settings DescribeConfigs lists; every other accepted key is in registry.BROKER_DEFS.
KEYS: dict[str, Key] = registry.DESCRIBED_BROKER_DEFS
# Kafka keys with no meaning here: accepted (with a warning) so a Kafka server.properties still works.
IGNORED_KAFKA_KEYS = frozenset(
    name for name, d in registry.BROKER_DEFS.items() if not d.described and d.status is registry.Status.WARNED
)

# Kafka's listener keys besides listeners and advertised.listeners: accepted, kept as given and read by the
# listener parser (kbroker/server/listeners.py); not (yet) in KEYS, so DescribeConfigs does not list them.
LISTENER_KEYS = ("listener.security.protocol.map", "inter.broker.listener.name", "controller.listener.names")
LISTENER_PREFIX = "listener.name."  # per-listener overrides of security keys (Kafka's ListenerName.configPrefix)


def _broker_role_problems(values: Mapping[str, Any], given: Mapping[str, str]) -> list[str]:
    """process.roles=broker needs what Kafka's broker needs: its node.id, where the KRaft controllers are and the
    name of their listener. kbroker is never a controller of Kafka's quorum (process.roles=broker,controller is a
    single node, its own controller, with a warning)."""
    if values["process.roles"] == "controller":
        return [registry.CONTROLLER_ROLE_REFUSED]
    if values["process.roles"] != "broker":
        return []
    if not values["controller.quorum.bootstrap.servers"] and not values["controller.quorum.voters"]:
        return [
            "process.roles=broker needs controller.quorum.bootstrap.servers (host:port,...) or "
            "controller.quorum.voters (id@host:port,...) naming the KRaft controllers"
        ]
    missing = [key for key in ("node.id", "controller.listener.names") if not given.get(key)]
    if missing:
        return [f"process.roles=broker needs {' and '.join(missing)} (as Kafka's broker does)"]
    from kbroker.kraft.quorum import QuorumConfigError, parse_bootstrap, parse_voters

    try:
        parse_bootstrap(values["controller.quorum.bootstrap.servers"])
        parse_voters(values["controller.quorum.voters"])
    except QuorumConfigError as exc:
        return [str(exc)]
    # How the controllers and the other brokers are reached (TLS, SASL) is checked as the broker starts, where its
    # key and trust stores are read (kbroker/kraft/node_security.py).
    return []


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

    def __init__(self, values: Mapping[str, str] | None = None, *, warn: bool = True) -> None:
        """``warn``: log each accepted-but-not-applied setting (off when the dynamic layers rebuild the view)."""
        self._warn = warn
        self._raw: dict[str, str] = {}
        self._values: dict[str, Any] = {}
        self.listener_settings: dict[str, str] = {}  # LISTENER_KEYS as given
        # listener.name.<LISTENER>.[<mechanism>.]<key> overrides: {LISTENER: {"[mechanism.]key": typed value}}
        self.listener_overrides: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        for name, text in (values or {}).items():
            if name.startswith(LISTENER_PREFIX):
                problem = self._add_listener_override(name, text)
                if problem is not None:
                    errors.append(problem)
                continue
            key = registry.BROKER_DEFS.get(name)
            if key is None:
                errors.append(f"unknown configuration key {name!r}")
                continue
            try:
                value = key.parse(text)
            except ConfigError as exc:
                errors.append(f"{name}: {exc}")
                continue
            refused = registry.problem_with(key, value)
            if refused is not None:
                errors.append(f"{name}={text.strip()} is not supported: {refused}")
                continue
            warning = registry.warning_for(key, value)
            if (values or {}).get("process.roles", "").strip() == "broker":
                if name in registry.QUORUM_KEYS:
                    warning = None  # where the controllers are: applied by the broker role
                elif warning is not None:
                    warning = registry.BROKER_ROLE_WARNINGS.get(name, warning)
            if warning is not None and warn:
                log.warning("%s=%s is accepted but not applied: %s", name, text.strip(), warning)
            self._values[name] = value
            self._raw[name] = text.strip()
            if name in LISTENER_KEYS:
                self.listener_settings[name] = text.strip()
        if errors:
            raise ConfigError("; ".join(errors))
        for key in registry.BROKER_DEFS.values():
            if key.name not in self._values:
                self._values[key.name] = (
                    None if key.default == "" and isinstance(key.parse, registry.Int) else key.parse(key.default)
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
        problems = _consumer_group_problems(self._values) + _broker_role_problems(self._values, self._raw)
        queued = self._values["queued.max.request.bytes"]
        if 0 < queued < self._values["socket.request.max.bytes"]:  # Kafka's check: one request must always fit
            problems.append("queued.max.request.bytes must be larger or equal to socket.request.max.bytes")
        if problems:
            raise ConfigError("; ".join(problems))

    def _add_listener_override(self, name: str, text: str) -> str | None:
        """Record one ``listener.name.<listener>.[<mechanism>.]<key>`` setting; the problem with it, if any."""
        listener, _, rest = name[len(LISTENER_PREFIX) :].partition(".")
        mechanism, key = "", rest
        if rest not in registry.LISTENER_SCOPED:
            mechanism, _, key = rest.partition(".")
            if mechanism.upper() not in registry.SASL_MECHANISMS or key not in registry.MECHANISM_SCOPED:
                return (
                    f"unknown configuration key {name!r} (per listener: listener.name.<listener>.<key> with an ssl.* "
                    "or SASL key, or listener.name.<listener>.<mechanism>.sasl.jaas.config)"
                )
        if not listener:
            return f"{name}: no listener name"
        if listener != listener.lower() or mechanism != mechanism.lower():
            # Kafka reads these prefixes in lower case only: the same file would silently not apply there.
            log.warning("%s: Apache Kafka reads listener.name.<listener>.<mechanism>. in lower case only", name)
        definition = registry.BROKER_DEFS[key]
        try:
            # A JAAS config is kept as text here and parsed with its listener (kbroker/server/security.py).
            value = text.strip() if key == "sasl.jaas.config" else definition.parse(text)
        except ConfigError as exc:
            return f"{name}: {exc}"
        if key != "sasl.jaas.config":
            refused = registry.problem_with(definition, value)
            if refused is not None:
                return f"{name}={text.strip()} is not supported: {refused}"
            warning = registry.warning_for(definition, value)
            if warning is not None and self._warn:
                log.warning("%s=%s is accepted but not applied: %s", name, text.strip(), warning)
        scoped = f"{mechanism.upper()}.{key}" if mechanism else key
        self.listener_overrides.setdefault(listener.upper(), {})[scoped] = value
        self._raw[name] = text.strip()
        return None

    def for_listener(self, listener: str, key: str, mechanism: str | None = None) -> Any:
        """The value of ``key`` on ``listener`` (and ``mechanism``): the most specific override, else the broker's.

        ``sasl.jaas.config`` has no broker-wide value: None unless set for the listener and mechanism.
        """
        overrides = self.listener_overrides.get(listener.upper(), {})
        if mechanism is not None and f"{mechanism.upper()}.{key}" in overrides:
            return overrides[f"{mechanism.upper()}.{key}"]
        if key in overrides:
            return overrides[key]
        return None if key == "sasl.jaas.config" else self._values[key]

    def ssl_settings(self, listener: str) -> dict[str, str]:
        """The listener's effective ssl.* settings as text (unset ones left out), for kbroker.security.tls."""
        result = {}
        for key in sorted(registry.LISTENER_SCOPED):
            if key.startswith("ssl.") and registry.BROKER_DEFS[key].status is registry.Status.IMPLEMENTED:
                value = self.for_listener(listener, key)
                if value is not None and value != "":
                    result[key] = value if isinstance(value, str) else str(value)
        return result

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

    def with_dynamic(self, dynamic: Mapping[str, str]) -> BrokerConfig:
        """These settings with ``dynamic`` (already validated) set over them: the broker's effective config once
        dynamic broker configs apply, derived settings (log.retention.ms from .hours, ...) worked out again."""
        if not dynamic:
            return self
        return BrokerConfig({**self._raw, **dynamic}, warn=False)

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
        return {
            key.topic_config: self.describe_value(key.name)
            for key in registry.BROKER_DEFS.values()
            if key.topic_config is not None
        }
