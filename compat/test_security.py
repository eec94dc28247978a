"""Security: TLS, mutual TLS, SASL (PLAIN, SCRAM-SHA-256/512) and ACLs, with every client, on kbroker and on
Apache Kafka configured the same way (compat/security.py: one secured broker per target, a listener per setup).

SCRAM users are created through the admin API (AlterUserScramCredentials) and ACLs with CreateAcls, over the
broker's PLAINTEXT listener, where ANONYMOUS is a super user; the clients under test connect to the secured
listeners only. A refused authentication is SASL_AUTHENTICATION_FAILED for every client and produces nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compat.apache_kafka import KafkaUnavailable
from compat.clients import ClientSpec, ClientUnavailable
from compat.clients.api import AUTHENTICATION_FAILED, ClientError
from compat.clients.remote import RemoteClient
from compat.conftest import SELECTED
from compat.helpers import produce, read, record
from compat.reference import Reference
from compat.security import (
    ADMIN,
    ALICE,
    BOB,
    REAUTH_MS,
    USERS,
    Acl,
    Certificates,
    SecuredBroker,
    client_security,
    create_acls,
    create_scram_users,
    start_secured,
)
from compat.targets import TEST_SETTINGS
from kbroker.security.acls import AclOperation, AclPermissionType, PatternType, ResourceType

Op = AclOperation


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "client_spec" in metafunc.fixturenames and "client" not in metafunc.fixturenames:
        metafunc.parametrize("client_spec", SELECTED["clients"], indirect=True)


class Secured:
    """A secured broker, its certificates, and client processes kept per (client, identity) for the module."""

    def __init__(self, broker: SecuredBroker, certs: Certificates) -> None:
        self.broker = broker
        self.certs = certs
        self.reference = Reference(broker.bootstrap)
        self.processes: dict[tuple[str, str], RemoteClient] = {}
        self.unavailable: dict[str, str] = {}

    def client(self, spec: ClientSpec, listener: str, **identity: Any) -> RemoteClient:
        """A process of ``spec`` connecting to ``listener`` as ``identity`` (client_security's arguments)."""
        key = (spec.name, f"{listener} {sorted(identity.items())}")
        running = self.processes.get(key)
        if running is not None and running.process.poll() is None:
            return running
        if spec.name in self.unavailable:
            pytest.skip(self.unavailable[spec.name])
        protocol = {"MTLS": "SSL", "REAUTH": "SASL_PLAINTEXT"}.get(listener, listener)
        try:
            started = spec.start(self.broker.address(listener), client_security(self.certs, protocol, **identity))
        except ClientUnavailable as exc:
            self.unavailable[spec.name] = f"client {spec.name}: {exc}"
            pytest.skip(self.unavailable[spec.name])
        self.processes[key] = started
        return started

    def topic(self, name: str, partitions: int = 1) -> str:
        self.reference.create_topic(name, partitions)
        return name

    def acls(self, *acls: Acl) -> None:
        create_acls(self.broker.bootstrap, list(acls))

    def stored_values(self, topic: str) -> list[str | None]:
        return [r.value.decode() if r.value is not None else None for r in self.reference.records(topic, 0)]

    def close(self) -> None:
        for process in self.processes.values():
            process.close()
        self.reference.close()
        self.broker.stop()


@pytest.fixture(scope="session")
def secured(secured_target: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    directory: Path = tmp_path_factory.mktemp(f"secured-{secured_target}")
    certs = Certificates.create(directory / "certs")
    try:
        broker = start_secured(secured_target, directory, certs, TEST_SETTINGS)
    except KafkaUnavailable as exc:
        pytest.skip(f"target {secured_target}: {exc}")
    create_scram_users(broker.bootstrap, USERS)
    # alice may use every topic and group; bob only what a scenario grants him; admin is a super user.
    create_acls(
        broker.bootstrap,
        [
            Acl(f"User:{ALICE[0]}", ResourceType.TOPIC, "*", Op.ALL),
            Acl(f"User:{ALICE[0]}", ResourceType.GROUP, "*", Op.ALL),
            Acl(certs.client_principal, ResourceType.GROUP, "*", Op.READ),
            # confluent-kafka reads by position through a consumer that must name a group ("compat-<uuid>") and
            # looks up its coordinator, which Kafka refuses without DESCRIBE on the group; it joins none.
            Acl(f"User:{BOB[0]}", ResourceType.GROUP, "compat-", Op.DESCRIBE, pattern=PatternType.PREFIXED),
        ],
    )
    running = Secured(broker, certs)
    yield running
    running.close()


@pytest.fixture
def unique() -> Callable[[str], str]:
    run = uuid.uuid4().hex[:8]
    return lambda what: f"sec-{what}-{run}"


def user(principal: tuple[str, str]) -> str:
    return f"User:{principal[0]}"


def round_trip(client: RemoteClient, topic: str, values: list[str]) -> None:
    """Produce ``values`` to partition 0 and read them back through the same client."""
    sent = produce(client, topic, [record(f"k{i}", v, partition=0) for i, v in enumerate(values)])
    assert sent == [[0, i] for i in range(len(values))]
    back = read(client, topic, 0, 0, len(values), timeout_ms=15000)
    assert [r["value"] for r in back] == values


# --- TLS -------------------------------------------------------------------------------------------------------


def test_tls_server_authentication(secured: Secured, client_spec: ClientSpec, unique) -> None:
    client = secured.client(client_spec, "SSL")
    topic = secured.topic(unique("tls"))
    round_trip(client, topic, ["over", "tls"])


def test_mutual_tls_principal_is_the_certificate_dn(secured: Secured, client_spec: ClientSpec, unique) -> None:
    client = secured.client(client_spec, "MTLS", client_certificate=True)
    topic = secured.topic(unique("mtls"))
    with pytest.raises(ClientError) as refused:  # the DN has no ACL on this topic yet
        produce(client, topic, [record("k", "no", partition=0)])
    assert refused.value.error == "TOPIC_AUTHORIZATION_FAILED"
    principal = secured.certs.client_principal
    secured.acls(
        Acl(principal, ResourceType.TOPIC, topic, Op.WRITE), Acl(principal, ResourceType.TOPIC, topic, Op.READ)
    )
    round_trip(client, topic, ["mutual", "tls"])


# --- SASL ------------------------------------------------------------------------------------------------------

SASL_SETUPS = [
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
    ("SASL_SSL", "SCRAM-SHA-256"),
    ("SASL_SSL", "SCRAM-SHA-512"),
]


def scram_login_refused(client_spec: ClientSpec) -> str | None:
    """Why this client's SCRAM login is refused by both brokers although its password is right, else None."""
    if client_spec.name != "kcat":
        return None
    from compat.clients.kcat import scram_nonce_bug

    return scram_nonce_bug()


def login_mechanism(client_spec: ClientSpec, wanted: str) -> str:
    """``wanted``, or PLAIN for a client whose SCRAM cannot log in (where the principal, not the mechanism, counts)."""
    return "PLAIN" if wanted.startswith("SCRAM-") and scram_login_refused(client_spec) else wanted


@pytest.mark.parametrize(("listener", "mechanism"), SASL_SETUPS, ids=[f"{lst}-{m}" for lst, m in SASL_SETUPS])
def test_sasl(secured: Secured, client_spec: ClientSpec, listener: str, mechanism: str, unique) -> None:
    client = secured.client(client_spec, listener, mechanism=mechanism, user=ALICE)
    topic = secured.topic(unique("sasl"))
    if mechanism.startswith("SCRAM-") and scram_login_refused(client_spec):
        # Kafka 4.3 and kbroker both check the final nonce exactly (CVE-2024-56128): the right password is refused.
        with pytest.raises(ClientError) as refused:
            produce(client, topic, [record("k", "must not land", partition=0)])
        assert refused.value.error == AUTHENTICATION_FAILED
        assert secured.stored_values(topic) == []
        return
    round_trip(client, topic, [mechanism, listener])


BAD_CREDENTIALS = {
    "wrong-password": ("SCRAM-SHA-256", (ALICE[0], "not-" + ALICE[1])),
    "unknown-user": ("PLAIN", ("mallory", "whatever")),
    "wrong-password-plain": ("PLAIN", (BOB[0], "not-" + BOB[1])),
    "unknown-user-scram": ("SCRAM-SHA-512", ("mallory", "whatever")),
}


@pytest.mark.parametrize("case", list(BAD_CREDENTIALS))
def test_refused_credentials(secured: Secured, client_spec: ClientSpec, case: str, unique) -> None:
    mechanism, credentials = BAD_CREDENTIALS[case]
    client = secured.client(client_spec, "SASL_PLAINTEXT", mechanism=mechanism, user=credentials)
    topic = secured.topic(unique("refused"))
    with pytest.raises(ClientError) as refused:
        produce(client, topic, [record("k", "must not land", partition=0)])
    assert refused.value.error == AUTHENTICATION_FAILED
    assert secured.stored_values(topic) == []


# --- ACLs (StandardAuthorizer) ---------------------------------------------------------------------------------


def test_producer_without_write(secured: Secured, client_spec: ClientSpec, unique) -> None:
    client = secured.client(client_spec, "SASL_PLAINTEXT", mechanism="PLAIN", user=BOB)
    topic = secured.topic(unique("nowrite"))
    secured.acls(Acl(user(BOB), ResourceType.TOPIC, topic, Op.READ))  # READ (so DESCRIBE), not WRITE
    # Not idempotent: an idempotent producer without WRITE anywhere is refused earlier, at InitProducerId
    # (CLUSTER_AUTHORIZATION_FAILED: no IDEMPOTENT_WRITE, which WRITE on any topic would imply).
    with pytest.raises(ClientError) as refused:
        produce(client, topic, [record("k", "no", partition=0)], idempotent=False)
    assert refused.value.error == "TOPIC_AUTHORIZATION_FAILED"
    assert secured.stored_values(topic) == []


def test_consumer_without_group_read(secured: Secured, client_spec: ClientSpec, unique) -> None:
    client = secured.client(client_spec, "SASL_PLAINTEXT", mechanism="PLAIN", user=BOB)
    topic = secured.topic(unique("nogroup"))
    secured.acls(Acl(user(BOB), ResourceType.TOPIC, topic, Op.READ))
    handle: int | None = None
    try:
        # Where the refusal surfaces is the client's choice: aiokafka's open waits for an assignment and raises
        # it there, the others raise it from a poll (FindCoordinator is refused before any JoinGroup).
        with pytest.raises(ClientError) as refused:
            handle = client.consumer_open(
                group=unique("group"),
                topics=[topic],
                settings={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                client.consumer_poll(handle=handle, timeout_ms=500)
        assert refused.value.error == "GROUP_AUTHORIZATION_FAILED"
    finally:
        if handle is not None:
            try:
                client.consumer_close(handle=handle)
            except ClientError:
                pass


def test_prefixed_acl_grants_a_family(secured: Secured, client_spec: ClientSpec, unique) -> None:
    client = secured.client(
        client_spec, "SASL_PLAINTEXT", mechanism=login_mechanism(client_spec, "SCRAM-SHA-256"), user=BOB
    )
    family = unique("family")
    first, second = secured.topic(f"{family}-orders"), secured.topic(f"{family}-payments")
    outsider = secured.topic(unique("outsider"))
    for operation in (Op.WRITE, Op.READ):
        secured.acls(Acl(user(BOB), ResourceType.TOPIC, f"{family}-", operation, pattern=PatternType.PREFIXED))
    round_trip(client, first, ["first"])
    round_trip(client, second, ["second"])
    with pytest.raises(ClientError) as refused:
        produce(client, outsider, [record("k", "no", partition=0)])
    assert refused.value.error == "TOPIC_AUTHORIZATION_FAILED"


def test_deny_overrides_allow(secured: Secured, client_spec: ClientSpec, unique) -> None:
    client = secured.client(client_spec, "SASL_PLAINTEXT", mechanism="PLAIN", user=BOB)
    family = unique("denied")
    allowed, denied = secured.topic(f"{family}-open"), secured.topic(f"{family}-shut")
    secured.acls(
        Acl(user(BOB), ResourceType.TOPIC, f"{family}-", Op.ALL, pattern=PatternType.PREFIXED),
        Acl(user(BOB), ResourceType.TOPIC, denied, Op.WRITE, AclPermissionType.DENY),
    )
    round_trip(client, allowed, ["allowed"])
    with pytest.raises(ClientError) as refused:
        produce(client, denied, [record("k", "no", partition=0)])
    assert refused.value.error == "TOPIC_AUTHORIZATION_FAILED"
    assert secured.stored_values(denied) == []


def test_super_user_bypasses_acls(secured: Secured, client_spec: ClientSpec, unique) -> None:
    # PLAIN: the principal, not the mechanism, is what matters here.
    client = secured.client(client_spec, "SASL_PLAINTEXT", mechanism="PLAIN", user=ADMIN)
    topic = secured.topic(unique("super"))
    secured.acls(Acl(f"User:{ADMIN[0]}", ResourceType.TOPIC, topic, Op.ALL, AclPermissionType.DENY))
    round_trip(client, topic, ["super", "user"])


# --- re-authentication (KIP-368) -------------------------------------------------------------------------------


def test_sessions_outlive_reauthentication(secured: Secured, client_spec: ClientSpec, unique) -> None:
    """The REAUTH listener's sessions last REAUTH_MS: one producer keeps sending across two of them (the
    broker's log tells whether a client re-authenticated or had its expired session closed and reconnected)."""
    client = secured.client(client_spec, "REAUTH", mechanism=login_mechanism(client_spec, "SCRAM-SHA-256"), user=ALICE)
    topic = secured.topic(unique("reauth"))
    handle = client.producer_open(settings={})
    try:
        for index in range(3):
            if index:
                time.sleep(REAUTH_MS / 1000 * 1.25)  # the session the last send used has expired
            sent = client.producer_send(handle=handle, topic=topic, records=[record("k", f"v{index}", partition=0)])
            assert sent == [[0, index]]
    finally:
        client.producer_close(handle=handle)
    back = read(client, topic, 0, 0, 3, timeout_ms=15000)
    assert [r["value"] for r in back] == ["v0", "v1", "v2"]
