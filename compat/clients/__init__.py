"""The clients of the compat matrix, and how to add one.

A client is a ``ClientSpec``: a name (the matrix column), how to start its process for a bootstrap address,
and the partitioner its documentation gives for keyed records. The process speaks the JSON lines of
compat/clients/runner.py and offers the operations of compat/clients/api.py, raising Unsupported for what the
client cannot do (the matrix shows "n/a" there). So adding a client is one adapter:

- a Python library: a subclass of ``compat.clients.api.Adapter`` in a module, and
  ``python_client("name", "package.module:AdapterClass")``;
- anything else: a program that reads the requests on stdin and answers on stdout (compat/java/CompatDriver.java).

Specs come from ``CLIENT_SPECS`` lists: the ones below, and those of any ``compat/<folder>/compat_client.py``
(a plug-in: e.g. compat/spark/compat_client.py for a Spark client), found at collection time.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from compat.clients.api import SECURITY_ENV
from compat.clients.remote import RemoteClient

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("KBROKER_CACHE", Path.home() / ".cache" / "kbroker"))
KAFKA_PYTHON_2 = "2.3.3"


class ClientUnavailable(Exception):
    """The client cannot run on this machine (not installed, no package index, no JDK); the message says why."""


Launcher = Callable[[str], tuple[list[str], dict[str, str]]]  # bootstrap -> (command, environment)


@dataclass(frozen=True)
class ClientSpec:
    name: str
    launch: Launcher
    partitioner: str | None = None  # a key of kbroker.partitioners.DEFAULT_PARTITIONERS
    notes: list[str] = field(default_factory=list)

    def start(self, bootstrap: str, security: dict[str, str] | None = None) -> RemoteClient:
        """The client's process; ``security`` (compat/clients/api.py) goes to it in KBROKER_COMPAT_SECURITY."""
        command, env = self.launch(bootstrap)
        if security:
            env = {**env, SECURITY_ENV: json.dumps(security)}
        return RemoteClient(self.name, command, env)


def python_env(*first_on_path: Path) -> dict[str, str]:
    paths = [*map(str, first_on_path), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def python_client(
    name: str,
    adapter: str,
    partitioner: str | None,
    needs: str,
    extra_path: Callable[[], Path] | None = None,
) -> ClientSpec:
    """A Python adapter (``module:Class``) served by compat/clients/runner.py; ``needs`` is the module it imports."""

    def launch(bootstrap: str) -> tuple[list[str], dict[str, str]]:
        first = [extra_path()] if extra_path else []
        if not first and importlib.util.find_spec(needs) is None:
            raise ClientUnavailable(f"{needs} is not installed")
        return [sys.executable, "-m", "compat.clients.runner", adapter, bootstrap], python_env(*first)

    return ClientSpec(name, launch, partitioner)


@cache
def kafka_python2_path() -> Path:
    """kafka-python 2.x installed into a cache directory (``pip install --target``), to go first on PYTHONPATH."""
    target = CACHE / f"kafka-python-{KAFKA_PYTHON_2}"
    if not (target / "kafka" / "__init__.py").exists():
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
        install = subprocess.run([*command, f"kafka-python=={KAFKA_PYTHON_2}"], capture_output=True, text=True)
        if install.returncode != 0:
            raise ClientUnavailable(f"cannot install kafka-python {KAFKA_PYTHON_2}: {install.stderr[-300:]}")
    return target


def _kcat_launch(bootstrap: str) -> tuple[list[str], dict[str, str]]:
    from compat.clients.kcat import KCAT

    if KCAT is None:
        raise ClientUnavailable("kcat is not installed (apt-get install -y kcat; .ci/run does)")
    return [sys.executable, "-m", "compat.clients.runner", "compat.clients.kcat:KcatAdapter", bootstrap], python_env()


CLIENT_SPECS = [
    python_client("kafka-python-3", "compat.clients.kafka_python:KafkaPythonAdapter", "murmur2", "kafka"),
    python_client(
        "kafka-python-2",
        "compat.clients.kafka_python:KafkaPythonAdapter",
        "murmur2",
        "kafka",
        extra_path=kafka_python2_path,
    ),
    python_client(
        "confluent-kafka", "compat.clients.confluent:ConfluentAdapter", "consistent_random", "confluent_kafka"
    ),
    python_client("aiokafka", "compat.clients.aiokafka_client:AiokafkaAdapter", "murmur2", "aiokafka"),
    ClientSpec("kcat", _kcat_launch, "consistent_random"),
]


def all_client_specs() -> list[ClientSpec]:
    """The built-in clients, the Java ones, then every plug-in's (compat/<folder>/compat_client.py)."""
    from compat.java import CLIENT_SPECS as JAVA_SPECS

    specs = [*CLIENT_SPECS, *JAVA_SPECS]
    for plugin in sorted(REPO.glob("compat/*/compat_client.py")):
        module = importlib.import_module(f"compat.{plugin.parent.name}.compat_client")
        specs.extend(module.CLIENT_SPECS)
    names = [s.name for s in specs]
    duplicated = {n for n in names if names.count(n) > 1}
    if duplicated:
        raise ValueError(f"two compat clients share a name: {sorted(duplicated)}")
    return specs
