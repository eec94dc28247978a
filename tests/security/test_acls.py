"""ACL bindings and filters (kbroker/security/acls.py): operation implication, entry matching, filter matching
(ANY and MATCH pattern types, null fields) and the validation of new bindings with Kafka 4.3's messages."""

from __future__ import annotations

import pytest

from kbroker.security.acls import (
    IMPLIES_DESCRIBE,
    IMPLIES_DESCRIBE_CONFIGS,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    entry_applies,
    operation_of,
    resource_type_of,
    validate_new_binding,
)

OPS = [op for op in AclOperation if op not in (AclOperation.UNKNOWN, AclOperation.ANY)]
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
TOPIC, LITERAL, PREFIXED = ResourceType.TOPIC, PatternType.LITERAL, PatternType.PREFIXED


def acl(
    operation: AclOperation,
    permission: AclPermissionType = ALLOW,
    principal: str = "User:alice",
    host: str = "*",
    name: str = "t",
    pattern: PatternType = LITERAL,
    resource_type: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def expected_allow_applies(acl_op: AclOperation, asked: AclOperation) -> bool:
    """Kafka's table: the same operation, ALL, or an operation implying DESCRIBE / DESCRIBE_CONFIGS."""
    if acl_op in (asked, AclOperation.ALL):
        return True
    if asked == AclOperation.DESCRIBE:
        return acl_op in (AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER)
    if asked == AclOperation.DESCRIBE_CONFIGS:
        return acl_op == AclOperation.ALTER_CONFIGS
    return False


def test_implication_sets_are_kafkas() -> None:
    assert IMPLIES_DESCRIBE == {
        AclOperation.DESCRIBE,
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.DELETE,
        AclOperation.ALTER,
    }
    assert IMPLIES_DESCRIBE_CONFIGS == {AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}


@pytest.mark.parametrize("acl_op", OPS, ids=lambda op: op.name)
@pytest.mark.parametrize("asked", OPS[1:], ids=lambda op: op.name)  # ALL is never asked about
def test_allow_operation_table(acl_op: AclOperation, asked: AclOperation) -> None:
    assert entry_applies(acl(acl_op, ALLOW), "User:alice", "1.2.3.4", asked) == expected_allow_applies(acl_op, asked)


@pytest.mark.parametrize("acl_op", OPS, ids=lambda op: op.name)
@pytest.mark.parametrize("asked", OPS[1:], ids=lambda op: op.name)
def test_deny_operation_table_implies_nothing(acl_op: AclOperation, asked: AclOperation) -> None:
    # A DENY for READ does not deny DESCRIBE; a DENY for ALL denies everything.
    expected = acl_op in (asked, AclOperation.ALL)
    assert entry_applies(acl(acl_op, DENY), "User:alice", "1.2.3.4", asked) == expected


@pytest.mark.parametrize(
    ("acl_principal", "acl_host", "principal", "host", "expected"),
    [
        ("User:alice", "*", "User:alice", "10.0.0.1", True),
        ("User:alice", "*", "User:bob", "10.0.0.1", False),
        ("User:*", "*", "User:bob", "10.0.0.1", True),
        ("User:*", "*", "Group:x", "10.0.0.1", True),  # the principal set is {the principal, User:*}
        ("Group:*", "*", "Group:x", "10.0.0.1", False),  # only User:* is a wildcard
        ("User:alice", "10.0.0.1", "User:alice", "10.0.0.1", True),
        ("User:alice", "10.0.0.1", "User:alice", "10.0.0.2", False),
        ("User:alice", "10.0.0.*", "User:alice", "10.0.0.2", False),  # hosts are equal or *, no patterns
        ("user:alice", "*", "User:alice", "10.0.0.1", False),  # case matters
    ],
)
def test_principal_and_host(acl_principal: str, acl_host: str, principal: str, host: str, expected: bool) -> None:
    binding = acl(AclOperation.READ, principal=acl_principal, host=acl_host)
    assert entry_applies(binding, principal, host, AclOperation.READ) is expected


def test_codes_unknown_to_kafka_are_unknown() -> None:
    assert resource_type_of(99) == ResourceType.UNKNOWN
    assert operation_of(-3) == AclOperation.UNKNOWN
    assert resource_type_of(2) == ResourceType.TOPIC


STORED = [
    acl(AclOperation.READ, name="t"),
    acl(AclOperation.READ, name="*"),
    acl(AclOperation.READ, name="t", pattern=PREFIXED),
    acl(AclOperation.READ, name="to", pattern=PREFIXED),
    acl(AclOperation.READ, name="topic", pattern=PREFIXED),
    acl(AclOperation.READ, name="*", pattern=PREFIXED),
    acl(AclOperation.WRITE, DENY, principal="User:bob", host="10.0.0.1", name="topic"),
    acl(AclOperation.DESCRIBE, name="g", resource_type=ResourceType.GROUP),
]


def selected(binding_filter: AclBindingFilter) -> list[int]:
    return [index for index, binding in enumerate(STORED) if binding_filter.matches(binding)]


@pytest.mark.parametrize(
    ("binding_filter", "expected"),
    [
        (AclBindingFilter(), [0, 1, 2, 3, 4, 5, 6, 7]),
        (AclBindingFilter(TOPIC), [0, 1, 2, 3, 4, 5, 6]),
        (AclBindingFilter(ResourceType.GROUP, "g", LITERAL), [7]),
        (AclBindingFilter(TOPIC, "t", PatternType.ANY), [0, 2]),  # ANY: this exact name, any pattern type
        (AclBindingFilter(TOPIC, "*", PatternType.ANY), [1, 5]),
        (AclBindingFilter(TOPIC, "t", LITERAL), [0]),
        (AclBindingFilter(TOPIC, "t", PREFIXED), [2]),
        # MATCH: everything that applies to a topic of that name: itself, the wildcard, its prefixes.
        (AclBindingFilter(TOPIC, "topic", PatternType.MATCH), [1, 2, 3, 4, 6]),
        (AclBindingFilter(TOPIC, "tx", PatternType.MATCH), [1, 2]),
        (AclBindingFilter(TOPIC, "*", PatternType.MATCH), [1, 5]),  # a PREFIXED "*" only prefixes "*..."
        (AclBindingFilter(TOPIC, None, PatternType.MATCH), [0, 1, 2, 3, 4, 5, 6]),
        (AclBindingFilter(TOPIC, None, PREFIXED), [2, 3, 4, 5]),
        (AclBindingFilter(principal="User:bob"), [6]),
        (AclBindingFilter(host="10.0.0.1"), [6]),
        (AclBindingFilter(host="*"), [0, 1, 2, 3, 4, 5, 7]),  # hosts are compared as strings, * is not special
        (AclBindingFilter(operation=AclOperation.WRITE), [6]),
        (AclBindingFilter(operation=AclOperation.ALL), []),  # ALL in a filter is the operation ALL, not any
        (AclBindingFilter(permission=DENY), [6]),
        (AclBindingFilter(ResourceType.UNKNOWN), []),
    ],
)
def test_filters(binding_filter: AclBindingFilter, expected: list[int]) -> None:
    assert selected(binding_filter) == expected


def test_unknown_filters_are_refused_with_kafkas_messages() -> None:
    assert AclBindingFilter().unknown_problem() is None
    assert AclBindingFilter(ResourceType.UNKNOWN).unknown_problem() == "Unknown patternFilter."
    assert AclBindingFilter(pattern_type=PatternType.UNKNOWN).unknown_problem() == "Unknown patternFilter."
    assert AclBindingFilter(operation=AclOperation.UNKNOWN).unknown_problem() == "Unknown entryFilter."
    assert AclBindingFilter(permission=AclPermissionType.UNKNOWN).unknown_problem() == "Unknown entryFilter."


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        (acl(AclOperation.READ), None),
        (acl(AclOperation.READ, name="*", pattern=PREFIXED), None),  # Kafka 4.3 accepts a prefixed "*"
        (acl(AclOperation.ALL, resource_type=ResourceType.CLUSTER, name="kafka-cluster"), None),
        (
            acl(AclOperation.ALTER, resource_type=ResourceType.CLUSTER, name="other"),
            "The only valid name for the CLUSTER resource is kafka-cluster",
        ),
        (acl(AclOperation.READ, name=""), "Invalid empty resource name"),
        (acl(AclOperation.READ, resource_type=ResourceType.UNKNOWN), "Invalid resourceType UNKNOWN"),
        (acl(AclOperation.READ, pattern=PatternType.UNKNOWN), "Invalid patternType UNKNOWN"),
        (acl(AclOperation.UNKNOWN), "Invalid operation UNKNOWN"),
        (acl(AclOperation.READ, AclPermissionType.UNKNOWN), "Invalid permissionType UNKNOWN"),
        # Kafka checks the cluster's name before everything else.
        (
            acl(AclOperation.UNKNOWN, resource_type=ResourceType.CLUSTER, name=""),
            "The only valid name for the CLUSTER resource is kafka-cluster",
        ),
        (acl(AclOperation.UNKNOWN, AclPermissionType.UNKNOWN), "Invalid operation UNKNOWN"),
    ],
)
def test_validate_new_binding(binding: AclBinding, message: str | None) -> None:
    assert validate_new_binding(binding) == message
