from __future__ import annotations

import functools
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from compat.apache_kafka import ApacheKafka, KafkaUnavailable
from kbroker.pytest_plugin import KafkaBrokerFactory
from kbroker.testing import RunningBroker

# The brokers come from the package's pytest plugin (kbroker/pytest_plugin.py), always in-process here:
# tests reach into the running broker (``broker.broker``).


@pytest.fixture
def broker(kafka_broker_factory: KafkaBrokerFactory) -> RunningBroker:
    """A fresh broker on an ephemeral port with its own data directory."""
    return kafka_broker_factory(mode="thread")


@pytest.fixture
def broker_factory(kafka_broker_factory: KafkaBrokerFactory) -> Callable[..., RunningBroker]:
    """``broker_factory(overrides)``: start brokers with custom settings; all are stopped at the end of the test."""
    return functools.partial(kafka_broker_factory, mode="thread")


# --- Java kafka-clients programs --------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def _java_clients() -> ModuleType:
    spec = importlib.util.spec_from_file_location("java_clients", REPO / "tools" / "java_clients.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["java_clients"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


JavaProgram = Callable[..., list[str]]  # java_program(source, version, *shared)


@pytest.fixture(scope="session")
def java_program(tmp_path_factory: pytest.TempPathFactory) -> JavaProgram:
    """``java_program(source, version, *shared)``: the command that runs ``source``'s class on kafka-clients
    ``version``; ``shared`` are the source files of other classes it uses.

    The jars come from Maven Central (tools/java_clients.py, which CI runs first; fetched here if need be);
    each source is compiled with javac once per session per version. KBROKER_JAVA_LOG=DEBUG (or INFO, ...)
    puts log4j on the classpath and the client's log on stderr.
    """
    java_clients = _java_clients()
    compiled: dict[tuple[Path, str], list[str]] = {}
    unavailable: dict[str, str] = {}  # tried once per session, not once per test

    def command(source: Path, version: str, *shared: Path) -> list[str]:
        if version in unavailable:
            pytest.skip(unavailable[version])
        key = (source, version)
        if key not in compiled:
            classes = tmp_path_factory.mktemp(f"{source.stem}-{version}")
            logging = bool(os.environ.get("KBROKER_JAVA_LOG"))
            try:
                compiled[key] = java_clients.compile_program(source, version, classes, logging, shared)
            except java_clients.JavaClientsUnavailable as exc:
                unavailable[version] = f"kafka-clients {version} unavailable (python tools/java_clients.py): {exc}"
                pytest.skip(unavailable[version])
        return compiled[key]

    return command


# --- Apache Kafka, the reference ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafka]:
    """Apache Kafka 4.3 as a local JVM process (compat/apache_kafka.py), one per session: the oracle that
    differential tests send the same requests to. Its jars come from Maven Central (.ci/run fetches them);
    where they cannot be had, or there is no java, the tests that need it skip saying so."""
    try:
        kafka = ApacheKafka(tmp_path_factory.mktemp("apache-kafka"), {"group.min.session.timeout.ms": "1000"})
        kafka.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    yield kafka
    kafka.stop()
