"""The Java clients of the compat matrix: compat/java/CompatDriver.java on kafka-clients 3.9.0 and 4.4.0.

The jars come from Maven Central (tools/java_clients.py); the driver is compiled once per version per machine
into the cache directory, keyed by its source's hash.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

from compat.clients import CACHE, ClientSpec, ClientUnavailable

SOURCE = Path(__file__).with_name("CompatDriver.java")
JSON_SOURCE = Path(__file__).with_name("Json.java")  # shared with tests/clients/java/KafkaClientScenario.java
VERSIONS = ["3.9.0", "4.4.0"]


@cache
def driver_command(version: str) -> list[str]:
    from tools import java_clients

    digest = hashlib.sha256(SOURCE.read_bytes() + JSON_SOURCE.read_bytes()).hexdigest()[:16]
    classes = CACHE / "compat-java" / f"{version}-{digest}"
    try:
        return java_clients.compile_program(SOURCE, version, classes, shared=(JSON_SOURCE,))
    except java_clients.JavaClientsUnavailable as exc:
        raise ClientUnavailable(f"kafka-clients {version}: {exc}") from None


def java_client(version: str) -> ClientSpec:
    def launch(bootstrap: str) -> tuple[list[str], dict[str, str]]:
        return [*driver_command(version), bootstrap], dict(os.environ)

    return ClientSpec(f"java-{version.rsplit('.', 1)[0]}", launch, "murmur2")


CLIENT_SPECS = [java_client(version) for version in VERSIONS]
