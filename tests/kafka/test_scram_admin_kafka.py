"""AlterUserScramCredentials and DescribeUserScramCredentials sent to kbroker and to Apache Kafka 4.4 (the
``apache_kafka`` fixture, which takes them on its PLAINTEXT listener without an authorizer): the same sequence of
upsertions, refusals (empty user, unknown mechanism, too few and too many iterations, a user twice, a deletion of
what does not exist, an empty salted password) and deletions, then the same descriptions, every answer compared
in order: users, error codes and messages.

Kafka applies an alteration in its controller and its broker describes from a metadata image that follows a moment
later, so after each change the scenario upserts a sentinel user and waits until the broker describes it. Within a
user, the credentials are compared sorted (Kafka lists the mechanisms in the order of a map keyed by an enum's
identity hash); a description of every user is compared as the sorted set of this run's users (the session's Kafka
may hold others).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka
from kbroker.config import KEYS as BROKER_KEYS
from kbroker.security.sasl.scram import SCRAM_SHA_256, SCRAM_SHA_512, salted_password
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.messages.alter_user_scram_credentials_request import AlterUserScramCredentialsRequest as Alter
from protocol.messages.describe_user_scram_credentials_request import DescribeUserScramCredentialsRequest as Describe

SHA256, SHA512 = 1, 2


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory, apache_kafka: ApacheKafka) -> Iterator[dict[str, str]]:
    """{"kafka": bootstrap, "kbroker": bootstrap}, kbroker set up like the Kafka fixture."""
    overrides = {name: value for name, value in apache_kafka.settings.items() if name in BROKER_KEYS}
    with RunningBroker(tmp_path_factory.mktemp("kbroker"), {**overrides, "node.id": "1"}) as running:
        yield {"kafka": apache_kafka.bootstrap, "kbroker": running.bootstrap}


def upsert(name: str, mechanism: int = SHA256, iterations: int = 4096, salted: bytes | None = None) -> Any:
    scram = SCRAM_SHA_512 if mechanism == SHA512 else SCRAM_SHA_256
    salt = b"salt-of-" + name.encode()
    if salted is None:
        salted = salted_password(scram, "secret", salt, 4096)
    return Alter.ScramCredentialUpsertion(
        name=name, mechanism=mechanism, iterations=iterations, salt=salt, salted_password=salted
    )


def delete(name: str, mechanism: int = SHA256) -> Any:
    return Alter.ScramCredentialDeletion(name=name, mechanism=mechanism)


def alter(client: WireClient, deletions: list[Any], upsertions: list[Any]) -> list[tuple[str, int, str | None]]:
    answer = client.request(Alter(deletions=deletions, upsertions=upsertions), 0)
    return [(r.user, r.error_code, r.error_message) for r in answer.results]


def describe(client: WireClient, users: list[str] | None) -> Any:
    request = Describe(users=None if users is None else [Describe.UserName(name=user) for user in users])
    answer = client.request(request, 0)
    results = [
        (r.user, r.error_code, r.error_message, sorted((c.mechanism, c.iterations) for c in r.credential_infos))
        for r in answer.results
    ]
    return answer.error_code, answer.error_message, results


def settle(client: WireClient, sentinel: str) -> None:
    """Upsert ``sentinel`` and wait until it is described: every earlier change is then visible too."""
    assert alter(client, [], [upsert(sentinel)]) == [(sentinel, 0, None)]
    deadline = time.monotonic() + 30
    while describe(client, [sentinel])[2][0][1] != 0:
        assert time.monotonic() < deadline, "the SCRAM change never became visible"
        time.sleep(0.1)


def scenario(bootstrap: str, run: str) -> dict[str, Any]:
    alice, bob, carol, dave = (f"{name}-{run}" for name in ("alice", "bob", "carol", "dave"))
    seen: dict[str, Any] = {}
    with WireClient(bootstrap, timeout=30) as client:
        seen["create"] = alter(
            client, [], [upsert(alice), upsert(bob, SHA512, 8192), upsert(carol, SHA256, 16384), upsert(dave)]
        )
        seen["second_mechanism"] = alter(client, [], [upsert(alice, SHA512, 4096)])
        settle(client, f"sentinel1-{run}")
        seen["describe_some"] = describe(client, [alice, bob, f"nobody-{run}", carol, carol])
        seen["refusals"] = alter(
            client,
            [
                delete(f"nobody-{run}"),
                delete(alice, SHA256),
                delete("", SHA256),
                delete(bob, 0),
                delete(dave, SHA256),
                delete(dave, SHA512),
            ],
            [
                upsert(alice),
                upsert(f"few-{run}", SHA256, 4095),
                upsert(f"many-{run}", SHA512, 16385),
                upsert(f"mech-{run}", 3),
                upsert(""),
                upsert(f"twice-{run}"),
                upsert(f"twice-{run}", SHA512),
                upsert(f"empty-{run}", salted=b""),
                upsert(f"short-{run}", salted=b"k"),
                upsert(carol, SHA256, 4096),
            ],
        )
        seen["delete"] = alter(client, [delete(bob, SHA512), delete(alice, SHA512)], [])
        seen["delete_again"] = alter(client, [delete(bob, SHA512)], [])
        seen["wrong_mechanism"] = alter(client, [delete(carol, SHA512)], [])
        settle(client, f"sentinel2-{run}")
        seen["describe_after"] = describe(client, [alice, bob, carol, dave, f"short-{run}", f"empty-{run}"])
        everyone = [f"{name}-{run}" for name in ("alice", "bob", "carol", "dave", "short", "sentinel1", "sentinel2")]
        for users in (None, []):
            code, message, results = describe(client, users)
            seen[f"describe_all_{users}"] = code, message, sorted(r for r in results if r[0] in everyone)
        seen["describe_empty_name"] = describe(client, [""])
    return seen


def test_scram_admin_answers_match_kafka(brokers: dict[str, str]) -> None:
    run = uuid.uuid4().hex[:8]  # the same names on both brokers, new ones each run
    kafka, ours = scenario(brokers["kafka"], run), scenario(brokers["kbroker"], run)
    for key in kafka:
        assert ours[key] == kafka[key], key
    assert [code for _, code, _ in kafka["create"]] == [0, 0, 0, 0]  # the scenario's premise: all were created
