"""ACLs through Java's Admin client 4.3 (tests/broker/java/AclAdmin.java) on a kbroker with Kafka's
StandardAuthorizer and the client (User:ANONYMOUS) as super user: create, describe (everything and a MATCH
filter), a refused cluster name with Kafka's exception and message, delete, describe again."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kbroker.testing import RunningBroker

SETTINGS = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
    "node.id": "1",
}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[RunningBroker]:
    with RunningBroker(tmp_path, SETTINGS) as running:
        yield running


def test_java_admin_client_manages_acls(node: RunningBroker, java_program: Callable[..., list[str]]) -> None:
    command = java_program(Path(__file__).parent / "java" / "AclAdmin.java", "4.4.0")
    done = subprocess.run([*command, node.bootstrap], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    read = "TOPIC:LITERAL:orders:User:alice:*:READ:ALLOW"
    prefixed = "TOPIC:PREFIXED:ord:User:bob:10.0.0.1:WRITE:DENY"
    group = "GROUP:LITERAL:g:User:*:*:ALL:ALLOW"
    assert seen == {
        "create": "ok",
        "create_bad_cluster": (
            "InvalidRequestException: The only valid name for the CLUSTER resource is kafka-cluster"
        ),
        "describe_all": f"[{group}, {read}, {prefixed}]",
        "describe_match": f"[{read}, {prefixed}]",
        "deleted": f"[{read}, {prefixed}]",
        "describe_after": f"[{group}]",
    }
