"""Listeners as Kafka configures them: ``listeners``, ``listener.security.protocol.map``, ``advertised.listeners``,
``inter.broker.listener.name`` (and ``controller.listener.names``), parsed in one place.

``listeners=PLAINTEXT://127.0.0.1:9092,INTERNAL://0.0.0.0:9093`` names each listener; its security protocol
comes from the map (by default each protocol's own name maps to itself, as in Kafka); ``advertised.listeners``
gives the address clients of a listener are told (by default the listener's own, ``localhost`` for a wildcard
host); the inter-broker listener is the broker's main address (the ready line, the test fixtures' bootstrap).
Listeners named in ``controller.listener.names`` belong to a KRaft controller, which kbroker does not run:
they are not served. Each listener's TLS and SASL settings are read by kbroker/server/listener_security.py. As
before, ``host:port`` without a name is a PLAINTEXT listener.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NamedTuple

from kbroker.broker import Endpoint
from kbroker.config import LISTENER_KEYS, ConfigError

log = logging.getLogger("kbroker.server")

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_LISTENER_NAME = "PLAINTEXT"
WILDCARD_HOSTS = ("0.0.0.0", "::", "")

__all__ = ["LISTENER_KEYS", "ListenerPlan", "ListenerSpec", "parse_listeners", "plaintext_listener"]


class ListenerSpec(NamedTuple):
    """One listener to serve: its name, security protocol, where it listens and what it advertises (None:
    its own address once bound; a port of 0 likewise becomes the bound port)."""

    name: str
    security_protocol: str
    host: str
    port: int
    advertised: Endpoint | None = None

    def advertised_address(self, bound_port: int) -> Endpoint:
        if self.advertised is None:
            host = "localhost" if self.host in WILDCARD_HOSTS else self.host
            return Endpoint(host, bound_port)
        return Endpoint(self.advertised.host, self.advertised.port or bound_port)


def split_host_port(text: str, what: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too); an empty host means every interface."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _entries(text: str, what: str, default_name: str | None) -> list[tuple[str, str, int]]:
    """(NAME, host, port) of each ``NAME://host:port`` (or bare ``host:port``) item of a comma-separated list."""
    result = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, address = item.partition("://")
        if not sep:
            if default_name is None:
                raise ConfigError(f"{what}: expected NAME://HOST:PORT, got {item!r}")
            name, address = default_name, item
        name = name.strip().upper()  # Kafka normalises listener names to upper case
        if not name or not all(c.isalnum() or c == "_" for c in name):
            raise ConfigError(f"{what}: {name!r} is not a listener name")
        host, port = split_host_port(address, f"{what} {name}")
        result.append((name, host, port))
    return result


def parse_protocol_map(text: str) -> dict[str, str]:
    if not text.strip():
        return {protocol: protocol for protocol in SECURITY_PROTOCOLS}
    mapping: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name:
            raise ConfigError(f"listener.security.protocol.map: expected NAME:PROTOCOL, got {item!r}")
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(
                f"listener.security.protocol.map: {protocol!r} for {name} is not one of {', '.join(SECURITY_PROTOCOLS)}"
            )
        mapping[name] = protocol
    return mapping


class ListenerPlan(NamedTuple):
    """The listeners to serve, in the order configured, and which one is the broker's main address."""

    listeners: tuple[ListenerSpec, ...]
    primary: str

    @property
    def primary_listener(self) -> ListenerSpec:
        return next(spec for spec in self.listeners if spec.name == self.primary)

    def with_advertised(self, name: str, advertised: Endpoint) -> ListenerPlan:
        """This plan with ``name`` advertising ``advertised`` (a port of 0: the bound port)."""
        return ListenerPlan(
            tuple(
                ListenerSpec(s.name, s.security_protocol, s.host, s.port, advertised) if s.name == name else s
                for s in self.listeners
            ),
            self.primary,
        )


def parse_listeners(
    listeners: str,
    advertised: str = "",
    settings: Mapping[str, str] | None = None,
) -> ListenerPlan:
    """The listener plan of ``listeners`` and ``advertised.listeners`` with the other keys in ``settings``.

    Raises ConfigError, in one line naming the listener, for anything Kafka would refuse.
    """
    settings = settings or {}
    entries = _entries(listeners, "listeners", DEFAULT_LISTENER_NAME)
    if not entries:
        raise ConfigError("listeners: no listener given")
    names = [name for name, _, _ in entries]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"listeners: {', '.join(duplicates)} named more than once")
    ports = [port for _, _, port in entries if port]
    if len(ports) != len(set(ports)):
        raise ConfigError("listeners: each listener needs a port of its own")
    protocols = parse_protocol_map(settings.get("listener.security.protocol.map", ""))
    controllers = {
        name.strip().upper() for name in settings.get("controller.listener.names", "").split(",") if name.strip()
    }
    served = []
    for name, host, port in entries:
        if name in controllers:
            log.info("listener %s is a KRaft controller listener, which kbroker does not run: not served", name)
            continue
        protocol = protocols.get(name)
        if protocol is None:
            raise ConfigError(f"listener {name}: listener.security.protocol.map gives it no security protocol")
        served.append(ListenerSpec(name, protocol, host, port))
    if not served:
        raise ConfigError("listeners: every listener is a controller listener; none left to serve clients")
    advertised_by_name: dict[str, Endpoint] = {}
    for name, host, port in _entries(advertised, "advertised.listeners", served[0].name):
        if name not in names:
            raise ConfigError(f"advertised.listeners: listener {name} is not in listeners")
        advertised_by_name[name] = Endpoint("localhost" if host in WILDCARD_HOSTS else host, port)
    served = [ListenerSpec(s.name, s.security_protocol, s.host, s.port, advertised_by_name.get(s.name)) for s in served]
    primary = settings.get("inter.broker.listener.name", "").strip().upper()
    if primary:
        if primary not in {s.name for s in served}:
            raise ConfigError(f"inter.broker.listener.name: {primary} is not a listener this broker serves")
    else:
        primary = DEFAULT_LISTENER_NAME if any(s.name == DEFAULT_LISTENER_NAME for s in served) else served[0].name
    return ListenerPlan(tuple(served), primary)


def plaintext_listener(host: str, port: int, advertised: Endpoint | None = None) -> ListenerPlan:
    """The one PLAINTEXT listener of ``--listen`` and ``--advertised-listener``."""
    return ListenerPlan(
        (ListenerSpec(DEFAULT_LISTENER_NAME, "PLAINTEXT", host, port, advertised),), DEFAULT_LISTENER_NAME
    )
