"""``kbroker acls list|create|delete``: against a kbroker with Kafka's StandardAuthorizer (the client is the super
user User:ANONYMOUS), and against ``cluster`` (kbroker and Apache Kafka 4.3, neither with an authorizer), where
both answer SECURITY_DISABLED with the same message."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kbroker.testing import RunningBroker
from tests.commands.conftest import Cli

AUTHORIZED = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
}
HEADER = [
    " PRINCIPAL  ┃ HOST ┃ OPERATION ┃ PERMISSION ┃ RESOURCE TYPE ┃ RESOURCE NAME ┃ PATTERN TYPE",
    "━━━━━━━━━━━━╇━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━",
]


@pytest.fixture
def secured(broker_factory: Callable[..., RunningBroker]) -> str:
    return broker_factory(AUTHORIZED).bootstrap


def lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def binding(principal: str, operation: str, permission: str, name: str, *, host: str = "*",
            resource_type: str = "TOPIC", pattern_type: str = "LITERAL") -> dict[str, str]:  # fmt: skip
    return {
        "principal": principal,
        "host": host,
        "operation": operation,
        "permission": permission,
        "resource_type": resource_type,
        "resource_name": name,
        "pattern_type": pattern_type,
    }


def test_create_list_delete(cli: Cli, secured: str) -> None:
    created = cli("acls", "create", "--allow-principal", "User:alice", "--operation", "Read", "--operation",
                  "describe", "--topic", "orders", "--bootstrap", secured)  # fmt: skip
    assert (created.exit_code, created.stderr) == (0, "")
    assert lines(created.stdout) == [
        "Created ACLs",
        *HEADER,
        " User:alice │ *    │ DESCRIBE  │ ALLOW      │ TOPIC         │ orders        │ LITERAL",
        " User:alice │ *    │ READ      │ ALLOW      │ TOPIC         │ orders        │ LITERAL",
    ]
    prefixed = cli("acls", "create", "--deny-principal", "User:bob", "--operation", "WRITE", "--topic", "ord",
                   "--resource-pattern-type", "prefixed", "--host", "10.0.0.1", "--bootstrap", secured)  # fmt: skip
    assert prefixed.exit_code == 0
    group = cli("acls", "create", "--allow-principal", "User:alice", "--operation", "read", "--group", "billing",
                "--bootstrap", secured, "-o", "json")  # fmt: skip
    assert group.json() == [binding("User:alice", "READ", "ALLOW", "billing", resource_type="GROUP")]
    cluster_acl = cli("acls", "create", "--allow-principal", "User:ops", "--operation", "describe-configs",
                      "--cluster", "--bootstrap", secured, "-o", "json")  # fmt: skip
    assert cluster_acl.json() == [
        binding("User:ops", "DESCRIBE_CONFIGS", "ALLOW", "kafka-cluster", resource_type="CLUSTER")
    ]

    every = [  # by resource type, resource name, pattern type, then principal, permission, operation
        binding("User:ops", "DESCRIBE_CONFIGS", "ALLOW", "kafka-cluster", resource_type="CLUSTER"),
        binding("User:alice", "READ", "ALLOW", "billing", resource_type="GROUP"),
        binding("User:bob", "WRITE", "DENY", "ord", host="10.0.0.1", pattern_type="PREFIXED"),
        binding("User:alice", "DESCRIBE", "ALLOW", "orders"),
        binding("User:alice", "READ", "ALLOW", "orders"),
    ]
    listed = cli("acls", "list", "--bootstrap", secured, "-o", "json")
    assert (listed.exit_code, listed.json()) == (0, every)
    # match: every binding that applies to topic 'orders' (its literal ones and the prefixed 'ord').
    matching = cli("acls", "list", "--topic", "orders", "--resource-pattern-type", "match", "--bootstrap", secured,
                   "-o", "json")  # fmt: skip
    assert matching.json() == every[2:]
    literal = cli("acls", "list", "--topic", "orders", "--resource-pattern-type", "literal", "--bootstrap", secured)
    assert lines(literal.stdout) == [
        *HEADER,
        " User:alice │ *    │ DESCRIBE  │ ALLOW      │ TOPIC         │ orders        │ LITERAL",
        " User:alice │ *    │ READ      │ ALLOW      │ TOPIC         │ orders        │ LITERAL",
    ]
    by_principal = cli("acls", "list", "--principal", "User:alice", "--operation", "READ", "--bootstrap", secured,
                       "-o", "json")  # fmt: skip
    assert by_principal.json() == [every[1], every[4]]
    assert cli("acls", "list", "--permission", "deny", "--bootstrap", secured, "-o", "json").json() == [every[2]]

    deleted = cli("acls", "delete", "--topic", "orders", "--operation", "read", "--bootstrap", secured)
    assert (deleted.exit_code, deleted.stderr) == (0, "")
    assert lines(deleted.stdout) == [
        "Deleted ACLs",
        *HEADER,
        " User:alice │ *    │ READ      │ ALLOW      │ TOPIC         │ orders        │ LITERAL",
    ]
    by_user = cli("acls", "delete", "--principal", "User:alice", "--bootstrap", secured, "-o", "json")
    assert by_user.json() == [every[1], every[3]]
    assert cli("acls", "list", "--bootstrap", secured, "-o", "json").json() == [every[0], every[2]]


def test_mistakes_are_one_line(cli: Cli, secured: str) -> None:
    def failure(*argv: str) -> str:
        result = cli("acls", *argv, "--bootstrap", secured)
        assert (result.exit_code, result.stdout) == (1, "")
        return result.stderr

    assert failure("create", "--allow-principal", "alice", "--operation", "read", "--topic", "t") == (
        "kbroker acls: principal 'alice': expected TYPE:NAME, such as User:alice\n"
    )
    assert failure("create", "--allow-principal", "User:a", "--operation", "fly", "--topic", "t") == (
        "kbroker acls: --operation fly: not one of Kafka's operations (ALL, READ, WRITE, CREATE, DELETE, ALTER, "
        "DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, CREATE_TOKENS, "
        "DESCRIBE_TOKENS)\n"
    )
    assert failure("create", "--allow-principal", "User:a", "--operation", "read") == (
        "kbroker acls: create: name a resource (--topic, --group, --transactional-id or --cluster)\n"
    )
    assert failure("create", "--operation", "read", "--topic", "t") == (
        "kbroker acls: create: give --allow-principal or --deny-principal\n"
    )
    assert failure("delete", "--operation", "read") == (
        "kbroker acls: delete: name a resource (--topic, --group, --transactional-id, --cluster) or a --principal\n"
    )
    # The broker's own validation (Kafka's AclApis messages): an empty resource name.
    assert failure("create", "--allow-principal", "User:a", "--operation", "read", "--topic", "") == (
        "kbroker acls: INVALID_REQUEST (42): Invalid empty resource name\n"
    )
    assert cli("acls", "list", "--bootstrap", secured, "-o", "json").json() == []


def test_without_an_authorizer(cli: Cli, cluster: str) -> None:
    expected = {
        ("list",): "kbroker acls: SECURITY_DISABLED (54): No Authorizer is configured on the broker\n",
        ("create", "--allow-principal", "User:a", "--operation", "read", "--topic", "cli-acls"): (
            "kbroker acls: SECURITY_DISABLED (54): No Authorizer is configured.\n"
        ),
        ("delete", "--topic", "cli-acls"): "kbroker acls: SECURITY_DISABLED (54): No Authorizer is configured.\n",
    }
    for argv, line in expected.items():
        result = cli("acls", *argv, "--bootstrap", cluster)
        assert (result.exit_code, result.stdout, result.stderr) == (1, "", line)
