"""The confluent-kafka compat adapter (compat/clients/confluent.py) reports SASL_AUTHENTICATION_FAILED only for an
authentication the broker refused.

librdkafka also hands error_cb an _AUTHENTICATION error when it drops one of its own connections while that
connection's SaslHandshake is unanswered: it forgets a group coordinator it was connecting to (the consumer
closes, or a FindCoordinator answers COORDINATOR_NOT_AVAILABLE), and the handshake request fails locally ("SASL
PLAIN mechanism handshake failed: Local: Broker transport failure"). The adapter keeps error_cb's errors for the
life of its process, so such an error, left by the consumer that read a round trip back, made a later refused
produce report SASL_AUTHENTICATION_FAILED instead of TOPIC_AUTHORIZATION_FAILED
(compat/test_security.py::test_deny_overrides_allow, once under load). Here the interleaving is forced: the broker
holds the SaslHandshake answer of every connection opened after it named a coordinator, then answers the
consumer's next coordinator query COORDINATOR_NOT_AVAILABLE, so librdkafka drops the coordinator connection
mid-handshake while the adapter reads.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import KafkaError, Producer

from compat.clients.api import SECURITY_ENV, ClientError
from compat.clients.confluent import ConfluentAdapter
from compat.security import STANDARD_AUTHORIZER, Acl, create_acls, jaas_plain
from kbroker.apis import groups as group_apis
from kbroker.security.acls import AclOperation, AclPermissionType, PatternType, ResourceType
from kbroker.server.connection import Connection
from kbroker.testing import RunningBroker
from protocol.errors import ErrorCode

BOB = ("bob", "bob-secret")
SASL_HANDSHAKE = 17
HELD = "HELD"  # the listener the consumer is sent to for its group coordinator


class CoordinatorHandshakeHold:
    """FindCoordinator names broker 1 on the HELD listener, where every SaslHandshake waits (until released); once
    one waits there, FindCoordinator answers COORDINATOR_NOT_AVAILABLE. The consumer's other connections (the
    bootstrap broker, broker 0: metadata and fetches) are on the SASL_PLAINTEXT listener and go through."""

    def __init__(self, broker: RunningBroker) -> None:
        host, _, port = broker.bootstrap_for(HELD).rpartition(":")
        self.coordinator = (ErrorCode.NONE, 1, host, int(port))
        self.held: list[int] = []  # connections whose SaslHandshake waits
        self.refused_lookups = 0
        self._released: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        answer = Connection._authentication_answer

        async def held_answer(connection: Connection, request: Any, body: Any, step: Any) -> Any:
            if request.api_key == SASL_HANDSHAKE and connection.listener.name == HELD:
                if self._released is None:
                    self._released, self._token = trio.Event(), trio.lowlevel.current_trio_token()
                self.held.append(connection.id)
                await self._released.wait()
            return await answer(connection, request, body, step)

        def lookup(*args: Any) -> tuple[ErrorCode, int, str, int]:
            if self.held:
                self.refused_lookups += 1
                return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "", -1
            return self.coordinator

        monkeypatch.setattr(Connection, "_authentication_answer", held_answer)
        monkeypatch.setattr(group_apis, "_coordinator_of", lookup)

    def release(self) -> None:
        if self._released is not None and self._token is not None:
            trio.from_thread.run_sync(self._released.set, trio_token=self._token)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[RunningBroker]:
    jaas = jaas_plain((BOB,))
    settings = {
        "listeners": f"PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,{HELD}://127.0.0.1:0",
        "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,{HELD}:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        f"listener.name.{HELD.lower()}.plain.sasl.jaas.config": jaas,
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": "User:ANONYMOUS",  # the PLAINTEXT listener sets things up
        "allow.everyone.if.no.acl.found": "false",
    }
    with RunningBroker(tmp_path / "data", settings) as broker:
        yield broker


def produce_plaintext(broker: RunningBroker, topic: str, value: str) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap_for("PLAINTEXT")})
    producer.produce(topic, value.encode(), partition=0)
    assert producer.flush(20) == 0


def test_a_handshake_librdkafka_drops_itself_is_not_a_refused_authentication(
    secured: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed, denied = "family-open", "family-shut"
    produce_plaintext(secured, allowed, "first")  # auto-created, as the denied one below
    produce_plaintext(secured, denied, "from the super user")
    create_acls(
        secured.bootstrap_for("PLAINTEXT"),
        [
            Acl(f"User:{BOB[0]}", ResourceType.TOPIC, "family-", AclOperation.ALL, pattern=PatternType.PREFIXED),
            Acl(f"User:{BOB[0]}", ResourceType.TOPIC, denied, AclOperation.WRITE, AclPermissionType.DENY),
            Acl(f"User:{BOB[0]}", ResourceType.GROUP, "compat-", AclOperation.ALL, pattern=PatternType.PREFIXED),
        ],
    )
    security = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}
    security.update(sasl_username=BOB[0], sasl_password=BOB[1])
    monkeypatch.setenv(SECURITY_ENV, json.dumps(security))
    adapter = ConfluentAdapter(secured.bootstrap_for("SASL_PLAINTEXT"))

    hold = CoordinatorHandshakeHold(secured)
    hold.install(monkeypatch)

    def second_record_once_dropped() -> None:
        """The record the read waits for, sent once librdkafka reported the handshake it dropped."""
        deadline = time.monotonic() + 30
        while not any(e.code() == KafkaError._AUTHENTICATION for e in adapter.errors):
            if time.monotonic() > deadline:
                return  # the read then times out with one record, and the assertions below say why
            time.sleep(0.05)
        produce_plaintext(secured, allowed, "second")

    sender = threading.Thread(target=second_record_once_dropped)
    sender.start()
    try:
        back = adapter.read(allowed, 0, 0, 2, {"timeout_ms": 30000})
    finally:
        sender.join()
        hold.release()
    # The interleaving happened: a coordinator connection waited in its handshake, the broker then refused to
    # name a coordinator, and librdkafka dropped the waiting connection, reporting _AUTHENTICATION for it.
    assert hold.held and hold.refused_lookups >= 1
    dropped = [e.str() for e in adapter.errors if e.code() == KafkaError._AUTHENTICATION]
    assert dropped and all("mechanism handshake failed: Local: " in message for message in dropped), dropped
    # Nothing was refused: the read completes, and a produce the ACLs deny is refused for that reason.
    assert [r["value"] for r in back] == ["first", "second"]
    producer = adapter.producer_open({})
    try:
        with pytest.raises(ClientError) as refused:
            adapter.producer_send(producer, denied, [{"key": "k", "value": "no", "partition": 0}])
    finally:
        adapter.shutdown()
    assert refused.value.error == "TOPIC_AUTHORIZATION_FAILED"


def test_a_wrong_password_is_still_a_refused_authentication(
    secured: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    security = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}
    security.update(sasl_username=BOB[0], sasl_password="not-" + BOB[1])
    monkeypatch.setenv(SECURITY_ENV, json.dumps(security))
    adapter = ConfluentAdapter(secured.bootstrap_for("SASL_PLAINTEXT"))
    producer = adapter.producer_open({})
    try:
        with pytest.raises(ClientError) as refused:
            adapter.producer_send(producer, "family-open", [{"key": "k", "value": "no", "partition": 0}])
    finally:
        adapter.shutdown()
    assert refused.value.error == "SASL_AUTHENTICATION_FAILED"
    assert "Invalid username or password" in refused.value.message
