"""CreateAcls, DescribeAcls and DeleteAcls sent to kbroker and to Apache Kafka 4.4, both with Kafka's
StandardAuthorizer and ``super.users=User:ANONYMOUS`` (the test client, on the PLAINTEXT listener; Kafka's
controller listener is PLAINTEXT too, so its principal is the same super user), every answer compared.

Kafka's DescribeAcls lists resources and ACLs in the order of Java hash maps keyed by enum-hashed values, which
changes from one JVM to the next, so describe answers are compared sorted; CreateAcls and DeleteAcls answers are
compared as given (per creation and per filter), the ACLs each DeleteAcls filter matched sorted. Kafka applies ACL
changes through its controller and then its broker's metadata image, so after each change the scenario waits
until Kafka describes the same ACLs before going on. A raw UNKNOWN (0) code is left out: Kafka closes the
connection, kbroker answers INVALID_REQUEST (UNSUPPORTED.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka, KafkaUnavailable
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_acls_request import CreateAclsRequest as Create
from protocol.messages.delete_acls_request import DeleteAclsRequest as Delete
from protocol.messages.describe_acls_request import DescribeAclsRequest as Describe

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SETTINGS = {"authorizer.class.name": STANDARD, "super.users": "User:ANONYMOUS"}

# Codes: resource types ANY 1 TOPIC 2 GROUP 3 CLUSTER 4 TRANSACTIONAL_ID 5; pattern types ANY 1 MATCH 2
# LITERAL 3 PREFIXED 4; operations ANY 1 ALL 2 READ 3 WRITE 4 DESCRIBE 8; permissions ANY 1 DENY 2 ALLOW 3.
Binding = tuple[int, str, int, str, str, int, int]  # resource type, name, pattern type, principal, host, op, perm


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    try:
        kafka = ApacheKafka(tmp_path_factory.mktemp("kafka-acls"), SETTINGS, heap="512m").start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        with RunningBroker(tmp_path_factory.mktemp("kbroker-acls"), {**SETTINGS, "node.id": "1"}) as running:
            yield {"kafka": kafka.bootstrap, "kbroker": running.bootstrap}
    finally:
        kafka.stop()


def create(client: WireClient, bindings: list[Binding], version: int = 3) -> list[tuple[int, str | None]]:
    creations = [
        Create.AclCreation(
            resource_type=rt,
            resource_name=name,
            resource_pattern_type=pt,
            principal=principal,
            host=host,
            operation=op,
            permission_type=perm,
        )
        for rt, name, pt, principal, host, op, perm in bindings
    ]
    answer = client.request(Create(creations=creations), version)
    return [(r.error_code, r.error_message) for r in answer.results]


FilterFields = tuple[int, str | None, int, str | None, str | None, int, int]
EVERYTHING: FilterFields = (1, None, 1, None, None, 1, 1)


def describe(client: WireClient, fields: FilterFields, version: int = 3) -> Any:
    rt, name, pt, principal, host, op, perm = fields
    answer = client.request(
        Describe(
            resource_type_filter=rt,
            resource_name_filter=name,
            pattern_type_filter=pt,
            principal_filter=principal,
            host_filter=host,
            operation=op,
            permission_type=perm,
        ),
        version,
    )
    resources = sorted(
        (
            r.resource_type,
            r.resource_name,
            r.pattern_type,
            sorted((a.principal, a.host, a.operation, a.permission_type) for a in r.acls),
        )
        for r in answer.resources
    )
    return answer.error_code, answer.error_message, resources


def delete(client: WireClient, filters: list[FilterFields], version: int = 3) -> Any:
    answer = client.request(
        Delete(
            filters=[
                Delete.DeleteAclsFilter(
                    resource_type_filter=rt,
                    resource_name_filter=name,
                    pattern_type_filter=pt,
                    principal_filter=principal,
                    host_filter=host,
                    operation=op,
                    permission_type=perm,
                )
                for rt, name, pt, principal, host, op, perm in filters
            ]
        ),
        version,
    )
    return [
        (
            f.error_code,
            f.error_message,
            sorted(
                (
                    m.error_code,
                    m.error_message,
                    m.resource_type,
                    m.resource_name,
                    m.pattern_type,
                    m.principal,
                    m.host,
                    m.operation,
                    m.permission_type,
                )
                for m in f.matching_acls
            ),
        )
        for f in answer.filter_results
    ]


def settle(clients: dict[str, WireClient]) -> None:
    """Wait until Kafka's broker describes what kbroker does (Kafka applies ACLs a moment after answering)."""
    expected = describe(clients["kbroker"], EVERYTHING)
    deadline = time.monotonic() + 15
    while describe(clients["kafka"], EVERYTHING) != expected and time.monotonic() < deadline:
        time.sleep(0.1)


VALID: list[Binding] = [
    (2, "orders", 3, "User:alice", "*", 3, 3),
    (2, "orders", 3, "User:alice", "10.0.0.1", 4, 2),
    (2, "pay", 4, "User:*", "*", 2, 3),
    (2, "*", 3, "User:bob", "*", 8, 3),
    (2, "*", 4, "User:bob", "*", 3, 3),  # a PREFIXED "*" is accepted (a prefix, not the wildcard)
    (3, "group-1", 3, "User:alice", "*", 3, 3),
    (4, "kafka-cluster", 3, "User:alice", "*", 7, 3),
    (5, "tx", 4, "User:alice", "*", 4, 2),
    (2, "odd", 3, "User:", "not-an-ip", 3, 3),  # Kafka checks only that the principal has a colon, and that
    (2, "odd", 3, ":x", "not-an-ip", 3, 3),  # the host is not empty (4.4): a host that is no address is kept
    (2, "odd", 3, "Group:ops", "*", 3, 3),
]

CREATIONS: list[list[Binding]] = [
    VALID,
    VALID[:2],  # already there: success, nothing added
    [(2, "t", 3, "alice", "*", 3, 3)],
    [(2, "t", 3, "User:a", "", 3, 3)],  # Kafka 4.4: "Host pattern cannot be null or empty"
    [(2, "t", 3, "alice", "", 3, 3)],  # the principal is checked first
    [(2, "t", 3, "", "*", 3, 3)],
    [(4, "other", 3, "User:a", "*", 3, 3), (2, "", 3, "User:a", "*", 3, 3)],
    [(4, "other", 3, "alice", "*", 99, 3)],  # the cluster's name is checked first
    [(2, "t", 3, "alice", "*", 99, 3)],  # then the codes, before the principal
    [(99, "t", 3, "User:a", "*", 3, 3)],
    [(2, "t", 99, "User:a", "*", 3, 3)],
    [(2, "t", 3, "User:a", "*", 99, 3)],
    [(2, "t", 3, "User:a", "*", 3, 99)],
    [(2, "fine", 3, "User:a", "*", 3, 3), (1, "t", 3, "User:a", "*", 3, 3)],  # ANY: the whole request fails
    [(2, "fine", 3, "User:a", "*", 3, 3), (2, "t", 1, "User:a", "*", 3, 3)],
    [(2, "t", 2, "User:a", "*", 3, 3)],
    [(2, "t", 3, "User:a", "*", 1, 3)],
    [(2, "t", 3, "User:a", "*", 3, 1)],
    [],
]

DESCRIBE_FILTERS: list[FilterFields] = [
    EVERYTHING,
    (2, None, 1, None, None, 1, 1),
    (2, "orders", 2, None, None, 1, 1),  # MATCH: literal, wildcard and prefixes that apply
    (2, "payments", 2, None, None, 1, 1),
    (2, "*", 2, None, None, 1, 1),
    (2, "*", 1, None, None, 1, 1),
    (2, "orders", 3, None, None, 1, 1),
    (2, None, 4, None, None, 1, 1),
    (1, None, 1, "User:alice", None, 1, 1),
    (1, None, 1, None, "10.0.0.1", 1, 1),
    (1, None, 1, None, None, 2, 1),  # ALL means the operation ALL here
    (1, None, 1, None, None, 1, 2),
    (99, None, 1, None, None, 1, 1),
    (1, None, 99, None, None, 1, 1),
    (1, None, 1, None, None, 99, 1),
    (3, "nope", 3, None, None, 1, 1),
]

DELETIONS: list[list[FilterFields]] = [
    [(2, "orders", 3, None, "10.0.0.1", 1, 1), (2, "orders", 2, None, None, 4, 2)],  # both report the same ACL
    [(99, None, 1, None, None, 1, 1), (1, None, 1, None, None, 99, 1), (3, None, 1, None, None, 1, 1)],
    [(2, "nothing", 3, None, None, 1, 1)],
    [(2, "payments", 2, "User:bob", None, 1, 1)],
    [],
    [EVERYTHING],
]


def test_the_three_apis_answer_as_kafka(brokers: dict[str, str]) -> None:
    clients = {name: WireClient(bootstrap) for name, bootstrap in brokers.items()}
    try:
        assert describe(clients["kbroker"], EVERYTHING) == (ErrorCode.NONE, "", [])
        for bindings in CREATIONS:
            for version in (1, 3):
                answers = {name: create(client, bindings, version) for name, client in clients.items()}
                assert answers["kbroker"] == answers["kafka"], bindings
        settle(clients)
        for fields in DESCRIBE_FILTERS:
            for version in (1, 3):
                answers = {name: describe(client, fields, version) for name, client in clients.items()}
                assert answers["kbroker"] == answers["kafka"], fields
        for filters in DELETIONS:
            answers = {name: delete(client, filters) for name, client in clients.items()}
            assert answers["kbroker"] == answers["kafka"], filters
            settle(clients)
            assert describe(clients["kbroker"], EVERYTHING) == describe(clients["kafka"], EVERYTHING)
        assert describe(clients["kbroker"], EVERYTHING) == (ErrorCode.NONE, "", [])
    finally:
        for client in clients.values():
            client.close()


def test_without_an_authorizer_both_answer_security_disabled(
    tmp_path_factory: pytest.TempPathFactory, apache_kafka: ApacheKafka
) -> None:
    with RunningBroker(tmp_path_factory.mktemp("kbroker-no-authorizer"), {"node.id": "1"}) as running:
        bootstraps = {"kafka": apache_kafka.bootstrap, "kbroker": running.bootstrap}
        answers = {}
        for name, bootstrap in bootstraps.items():
            with WireClient(bootstrap) as client:
                answers[name] = (
                    create(client, VALID[:2]),
                    describe(client, EVERYTHING),
                    delete(client, [EVERYTHING, (2, "x", 3, None, None, 1, 1)]),
                )
    assert answers["kbroker"] == answers["kafka"]
    assert answers["kbroker"][0] == [(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured.")] * 2
    assert answers["kbroker"][1] == (ErrorCode.SECURITY_DISABLED, "No Authorizer is configured on the broker", [])
