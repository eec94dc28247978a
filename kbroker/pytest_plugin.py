"""pytest plugin: a real Kafka broker (kbroker) for tests, without Docker. Installed with the package and
loaded through the ``pytest11`` entry point ``kbroker`` (disable with ``-p no:kbroker``).

Fixtures
    kafka_broker          a started broker on 127.0.0.1 and an ephemeral port, with its own temp data
                          directory; ``kafka_broker.bootstrap`` is the address for ``bootstrap.servers``.
                          It also has ``restart()`` (same port, same data) and ``stop()``.
    kafka_bootstrap       the same broker's bootstrap address as a string.
    kafka_broker_factory  ``kafka_broker_factory({"num.partitions": "3"}, mode="subprocess")`` starts one more
                          broker with these server.properties overrides; all are stopped after the test.
    kbroker_cluster       a cluster: Apache Kafka's KRaft controller (one voter, a JVM) and 3 kbroker brokers
                          under it (``process.roles=broker``), each in a process of its own with its own port
                          and data. ``.bootstrap`` lists every broker, ``.controller_bootstrap`` and
                          ``.controller_pid`` are the controller's, ``.directory`` holds every node's files;
                          ``.brokers`` (or ``.broker(node_id)``, ids from 1) each have ``node_id``,
                          ``bootstrap``, ``pid``, ``log_path`` and ``kill()`` (SIGKILL), ``stop()`` (SIGTERM:
                          a controlled shutdown), ``start()`` / ``restart()`` (same port, same data; return once
                          the broker is serving), ``pause()`` / ``resume()`` (SIGSTOP / SIGCONT), and in a
                          cluster made with ``network_faults=True`` ``isolate()``: a network partition around
                          it (its connections to the controller and the other brokers reset until the
                          cluster's ``heal()``; clients still reach it). One cluster serves the tests of a
                          module (see kbroker_cluster_scope); after each test the brokers it took down are
                          started again, the paused ones resumed and the isolated ones connected. At the end
                          the brokers stop first (a controlled shutdown), then the controller.
                          It needs Java 17+ and Apache Kafka's jars (fetched into the Maven cache with ``mvn``
                          on first use); where they cannot be had, the tests that ask for it skip saying why.
    kbroker_cluster_factory  ``kbroker_cluster_factory(brokers=5, config={"num.partitions": 6},
                          network_faults=False)`` starts another cluster of that size with these broker
                          settings; stopped after the test.

Every broker the plugin starts has ``group.initial.rebalance.delay.ms=0`` (as testcontainers' KafkaContainer),
so a consumer group forms at its first join instead of 3 s later; any setting below can change that.

Settings (pytest.ini / pyproject ``[tool.pytest.ini_options]``, or ``-o name=value``)
    kafka_broker_scope    ``function`` (default: a fresh broker per test) or ``session`` (one for the run).
    kafka_broker_mode     ``thread`` (default: a trio broker on a thread of the test process, about 5 ms to
                          start) or ``subprocess`` (a ``kbroker serve`` child, about 0.5 s; isolated from the
                          test process, and ``kill()`` crashes it). Measured by tools/bench_fixture_startup.py.
    kafka_broker_config   ``key=value`` lines: server.properties overrides for every broker the plugin starts
                          (the cluster's brokers too).
    kbroker_cluster_scope ``module`` (default: one cluster per test module), ``session`` (one for the run) or
                          ``function`` (a fresh cluster per test, about 5 s each).

Marker
    ``@pytest.mark.kafka_broker_config({"auto.create.topics.enable": "false"})`` (or keyword arguments)
    sets overrides for that test's ``kafka_broker``; it needs function scope (use the factory otherwise).
    ``@pytest.mark.kbroker_cluster(brokers=5, config={...}, network_faults=True)`` gives that test a cluster of
    its own, so made (``network_faults``: the nodes reach one another through proxies, so ``isolate()`` works).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

if TYPE_CHECKING:  # the broker is imported when a test first asks for one, not in every pytest run
    from kbroker.kraft.local_cluster import StartedCluster
    from kbroker.testing import BrokerProcess, RunningBroker

    KafkaBroker = RunningBroker | BrokerProcess
    KbrokerCluster = StartedCluster
else:
    KafkaBroker = Any
    KbrokerCluster = Any
KafkaBrokerFactory = Callable[..., KafkaBroker]
KbrokerClusterFactory = Callable[..., KbrokerCluster]

SCOPES = ("function", "session")
# What every broker the plugin starts gets unless the ini, a marker or the factory says otherwise. As in
# testcontainers' KafkaContainer: no initial rebalance delay, so a test's group forms at its first join.
DEFAULT_OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}
MODES = ("thread", "subprocess")
MARKER = "kafka_broker_config"
CLUSTER_MARKER = "kbroker_cluster"
CLUSTER_SCOPES = ("module", "session", "function")
DEFAULT_CLUSTER_BROKERS = 3


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("kafka_broker_scope", "kbroker plugin: function or session", default="function")
    parser.addini("kafka_broker_mode", "kbroker plugin: thread or subprocess", default="thread")
    parser.addini("kafka_broker_config", "kbroker plugin: key=value broker config lines", type="linelist", default=[])
    parser.addini("kbroker_cluster_scope", "kbroker plugin: module, session or function", default="module")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(overrides=None, **keys): server.properties overrides for this test's kafka_broker"
    )
    config.addinivalue_line(
        "markers",
        f"{CLUSTER_MARKER}(brokers=3, config=None, network_faults=False): this test's kbroker_cluster, a cluster "
        "of its own",
    )
    for name, allowed in (
        ("kafka_broker_scope", SCOPES),
        ("kafka_broker_mode", MODES),
        ("kbroker_cluster_scope", CLUSTER_SCOPES),
    ):
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


# --- kbroker_cluster: Apache Kafka's KRaft controller and kbroker brokers (kbroker/kraft/local_cluster.py) -------


def start_cluster(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    brokers: int = DEFAULT_CLUSTER_BROKERS,
    config: Mapping[str, Any] | None = None,
    network_faults: bool = False,
) -> KbrokerCluster:
    """A started cluster; the test skips (one line saying why) where Java 17+ or Kafka's jars cannot be had."""
    import sys

    from kbroker.kraft.local_cluster import ClusterError, check_can_run, start_cluster

    def progress(line: str) -> None:  # the jars' first fetch takes a while: say so
        print(f"kbroker_cluster: {line}", file=sys.stderr, flush=True)

    try:
        java_and_classpath = check_can_run(progress)
    except ClusterError as exc:
        pytest.skip(f"kbroker_cluster cannot run here: {exc}")
    overrides = {**DEFAULT_OVERRIDES, **ini_overrides(request.config)}
    overrides.update({str(k): as_config_value(v) for k, v in (config or {}).items()})
    directory = tmp_path_factory.mktemp("kbroker-cluster")
    return start_cluster(directory, brokers, overrides, progress, java_and_classpath, network_faults)


def cluster_marker_arguments(*args: Any, **kwargs: Any) -> tuple[int, Mapping[str, Any] | None, bool]:
    def arguments(
        brokers: int = DEFAULT_CLUSTER_BROKERS, config: Mapping[str, Any] | None = None, network_faults: bool = False
    ) -> Any:
        return brokers, config, network_faults

    try:
        brokers, config, network_faults = arguments(*args, **kwargs)
    except TypeError as exc:
        raise pytest.UsageError(
            f"@pytest.mark.{CLUSTER_MARKER}(brokers=3, config=None, network_faults=False): {exc}"
        ) from None
    if not isinstance(brokers, int) or not isinstance(config, Mapping | None) or not isinstance(network_faults, bool):
        raise pytest.UsageError(
            f"@pytest.mark.{CLUSTER_MARKER}: brokers is a number, config a dict of settings, network_faults a bool"
        )
    return brokers, config, network_faults


def _cluster_scope(fixture_name: str, config: pytest.Config) -> Literal["module", "session", "function"]:
    scope = config.getini("kbroker_cluster_scope")  # pytest_configure has already rejected any other value
    return "session" if scope == "session" else "function" if scope == "function" else "module"


@pytest.fixture(scope=_cluster_scope)
def _kbroker_shared_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KbrokerCluster]:
    """The cluster the tests of a module (or the session) share; tests ask for ``kbroker_cluster``."""
    cluster = start_cluster(request, tmp_path_factory)
    yield cluster
    cluster.stop()


@pytest.fixture
def kbroker_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KbrokerCluster]:
    """Kafka's KRaft controller and kbroker brokers; ``.bootstrap``, ``.brokers``, ``.controller_bootstrap``."""
    mark = request.node.get_closest_marker(CLUSTER_MARKER)
    if mark is not None:  # a cluster of its own, as the marker asks
        own = start_cluster(request, tmp_path_factory, *cluster_marker_arguments(*mark.args, **mark.kwargs))
        yield own
        own.stop()
        return
    shared: KbrokerCluster = request.getfixturevalue("_kbroker_shared_cluster")
    yield shared
    if request.config.getini("kbroker_cluster_scope") != "function":
        shared.heal()  # what this test killed, stopped or paused is back for the next test


@pytest.fixture
def kbroker_cluster_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KbrokerClusterFactory]:
    """``kbroker_cluster_factory(brokers=3, config=None)``: start another cluster; stopped after the test."""
    started: list[KbrokerCluster] = []

    def start(
        brokers: int = DEFAULT_CLUSTER_BROKERS, config: Mapping[str, Any] | None = None, network_faults: bool = False
    ) -> KbrokerCluster:
        cluster = start_cluster(request, tmp_path_factory, brokers, config, network_faults)
        started.append(cluster)
        return cluster

    yield start
    for cluster in reversed(started):
        cluster.stop()
