"""Java's Admin client (kafka-clients 4.3) creating, describing and deleting SCRAM users on kbroker
(tests/broker/java/ScramAdmin.java): the client computes the salted password itself, so a user it creates must
then log in. Every outcome, refusals included, is the one Apache Kafka 4.3 gave the same program with the same
names (run by hand: the program describes right after it alters, which Kafka's metadata image may not yet show)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from kbroker.security.sasl import SaslSettings, create_server
from kbroker.security.sasl.scram import SCRAM_SHA_256, SCRAM_SHA_512
from kbroker.testing import RunningBroker
from tests.security.test_sasl_scram import Client

PROGRAM = Path(__file__).parents[1] / "broker" / "java" / "ScramAdmin.java"


def test_java_admin_client_manages_scram_users(
    broker_factory: Callable[..., RunningBroker], java_program: Callable[..., list[str]]
) -> None:
    node = broker_factory({})
    run = "java"  # fixed names: which refusal all() reports first follows the order of the answer's users
    command = java_program(PROGRAM, "4.4.0")
    done = subprocess.run([*command, node.bootstrap, run], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    alice, bob = f"alice-{run}", f"bob-{run}"
    assert seen == {
        "create": f"{{{alice}=DuplicateResourceException, {bob}=ok}}",
        "create_all": "DuplicateResourceException",
        "create_one_each": f"{{{alice}=ok, {bob}=ok}}",
        "create_one_each_all": "ok",
        "create_more": f"{{{alice}=ok}}",
        "create_more_all": "ok",
        "refused": f"{{few-{run}=UnacceptableCredentialException, many-{run}=UnacceptableCredentialException, "
        f"nobody-{run}=ResourceNotFoundException}}",
        "refused_all": "UnacceptableCredentialException",
        "all_has_alice": "true",
        "all_has_bob": "true",
        "alice": "SCRAM_SHA_256:4096,SCRAM_SHA_512:8192",
        "bob": "SCRAM_SHA_512:16384",
        "describe_nobody": "ResourceNotFoundException",
        "describe_alice": "SCRAM_SHA_256:4096,SCRAM_SHA_512:8192",
        "delete": f"{{{alice}=ok, {bob}=ok}}",
        "delete_all": "ok",
        "alice_after": "SCRAM_SHA_256:4096",
        "bob_after": "ResourceNotFoundException",
        "users_after": "1",
    }
    # The credential the Java client made from alice's password logs in with it (SCRAM-SHA-512 was deleted, so
    # SHA-256 it is; and bob's SHA-512 one is gone).
    assert node.broker is not None
    store = node.broker.scram_credentials
    server = create_server("SCRAM-SHA-256", SaslSettings(plain_users={}, scram_credentials=store))
    client = Client(SCRAM_SHA_256, alice, "alice-secret")
    final, signature = client.final(server.evaluate_response(client.first()))
    assert server.evaluate_response(final) == signature
    assert store.lookup(bob, SCRAM_SHA_512.name) is None
