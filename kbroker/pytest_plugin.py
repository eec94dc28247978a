"""pytest plugin: a real Kafka broker (kbroker) for tests, without Docker. Installed with the package and
loaded through the ``pytest11`` entry point ``kbroker`` (disable with ``-p no:kbroker``).

Fixtures
    kafka_broker          a started broker on 127.0.0.1 and an ephemeral port, with its own temp data
                          directory; ``kafka_broker.bootstrap`` is the address for ``bootstrap.servers``.
                          It also has ``restart()`` (same port, same data) and ``stop()``.
    kafka_bootstrap       the same broker's bootstrap address as a string.
    kafka_broker_factory  ``kafka_broker_factory({"num.partitions": "3"}, mode="subprocess")`` starts one more
                          broker with these server.properties overrides; all are stopped after the test.

Every broker the plugin starts has ``group.initial.rebalance.delay.ms=0`` (as testcontainers' KafkaContainer),
so a consumer group forms at its first join instead of 3 s later; any setting below can change that.

Settings (pytest.ini / pyproject ``[tool.pytest.ini_options]``, or ``-o name=value``)
    kafka_broker_scope    ``function`` (default: a fresh broker per test) or ``session`` (one for the run).
    kafka_broker_mode     ``thread`` (default: a trio broker on a thread of the test process, about 5 ms to
                          start) or ``subprocess`` (a ``kbroker serve`` child, about 0.5 s; isolated from the
                          test process, and ``kill()`` crashes it). Measured by tools/bench_fixture_startup.py.
    kafka_broker_config   ``key=value`` lines: server.properties overrides for every broker the plugin starts.

Marker
    ``@pytest.mark.kafka_broker_config({"auto.create.topics.enable": "false"})`` (or keyword arguments)
    sets overrides for that test's ``kafka_broker``; it needs function scope (use the factory otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

if TYPE_CHECKING:  # the broker is imported when a test first asks for one, not in every pytest run
    from kbroker.testing import BrokerProcess, RunningBroker

    KafkaBroker = RunningBroker | BrokerProcess
else:
    KafkaBroker = Any
KafkaBrokerFactory = Callable[..., KafkaBroker]

SCOPES = ("function", "session")
# What every broker the plugin starts gets unless the ini, a marker or the factory says otherwise. As in
# testcontainers' KafkaContainer: no initial rebalance delay, so a test's group forms at its first join.
DEFAULT_OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}
MODES = ("thread", "subprocess")
MARKER = "kafka_broker_config"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("kafka_broker_scope", "kbroker plugin: function or session", default="function")
    parser.addini("kafka_broker_mode", "kbroker plugin: thread or subprocess", default="thread")
    parser.addini("kafka_broker_config", "kbroker plugin: key=value broker config lines", type="linelist", default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(overrides=None, **keys): server.properties overrides for this test's kafka_broker"
    )
    for name, allowed in (("kafka_broker_scope", SCOPES), ("kafka_broker_mode", MODES)):
        value = config.getini(name)
        if value not in allowed:
            raise pytest.UsageError(f"{name} = {value!r}: expected one of {', '.join(allowed)}")
    ini_overrides(config)  # a bad line stops the run at once, not in every test


def ini_overrides(config: pytest.Config) -> dict[str, str]:
    overrides = {}
    for line in config.getini("kafka_broker_config"):
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise pytest.UsageError(f"kafka_broker_config: expected key=value, got {line!r}")
        overrides[name.strip()] = value.strip()
    return overrides


def as_config_value(value: Any) -> str:
    """Python values as server.properties text: True -> "true", 3 -> "3"."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def marker_overrides(node: pytest.Item) -> dict[str, str]:
    """Overrides from every kafka_broker_config marker on the test (closest last, so it wins)."""
    overrides: dict[str, str] = {}
    for mark in reversed(list(node.iter_markers(MARKER))):
        for arg in mark.args:
            if not isinstance(arg, Mapping):
                raise pytest.UsageError(f"@pytest.mark.{MARKER} takes a dict of config keys, got {arg!r}")
            overrides.update({str(k): as_config_value(v) for k, v in arg.items()})
        overrides.update({k: as_config_value(v) for k, v in mark.kwargs.items()})
    return overrides


def start_broker(
    config: pytest.Config, data_dir: Path, overrides: Mapping[str, str] | None = None, mode: str | None = None
) -> KafkaBroker:
    from kbroker.testing import BrokerProcess, RunningBroker

    mode = mode or config.getini("kafka_broker_mode")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    kind = RunningBroker if mode == "thread" else BrokerProcess
    # A bad key or value raises kbroker.config.ConfigError naming it, before anything starts.
    return kind(data_dir, {**DEFAULT_OVERRIDES, **ini_overrides(config), **(overrides or {})}).start()


def _broker_scope(fixture_name: str, config: pytest.Config) -> Literal["function", "session"]:
    # pytest_configure has already rejected any other value.
    return "session" if config.getini("kafka_broker_scope") == "session" else "function"


@pytest.fixture(scope=_broker_scope)
def kafka_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A started broker; ``.bootstrap`` is its address. Scope and mode come from the ini settings."""
    overrides: dict[str, str] = {}
    if request.scope == "function":
        overrides = marker_overrides(request.node)
    elif any(
        item.get_closest_marker(MARKER) and "kafka_broker" in getattr(item, "fixturenames", ())
        for item in request.session.items
    ):
        raise pytest.UsageError(
            f"@pytest.mark.{MARKER} needs kafka_broker_scope = function; with a session broker, "
            "start a configured one with kafka_broker_factory"
        )
    broker = start_broker(request.config, tmp_path_factory.mktemp("kafka-broker") / "data", overrides)
    yield broker
    broker.stop()


@pytest.fixture
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """The bootstrap address ("127.0.0.1:PORT") of ``kafka_broker``."""
    return kafka_broker.bootstrap


@pytest.fixture
def kafka_broker_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaBrokerFactory]:
    """``kafka_broker_factory(overrides=None, mode=None)``: start another broker; stopped after the test."""
    started: list[KafkaBroker] = []

    def start(overrides: Mapping[str, Any] | None = None, mode: str | None = None) -> KafkaBroker:
        text = {str(k): as_config_value(v) for k, v in (overrides or {}).items()}
        broker = start_broker(request.config, tmp_path_factory.mktemp("kafka-broker") / "data", text, mode)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()
