"""DescribeClientQuotas and AlterClientQuotas sent to kbroker and to Apache Kafka 4.4 (the ``apache_kafka`` fixture):
the same sequence of alterations (valid, refused, validate-only, removals, defaults, IP entities) and then the same
filters, every answer compared: error codes, messages, the entities echoed and the values described.

Kafka applies an alteration in its controller and its broker describes from a metadata image that follows a moment
later, so after the alterations the scenario waits until the last one is visible before describing. Entries of a
DescribeClientQuotas answer are compared as a sorted list (Kafka lists them in the order of a hash map whose size
depends on its history); within each entry the order of entity parts and values is compared as given.
controller_mutation_rate is left out: kbroker refuses it (UNSUPPORTED.md, tests/broker/test_client_quotas.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka
from kbroker.config import KEYS as BROKER_KEYS
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.messages.alter_client_quotas_request import AlterClientQuotasRequest as Alter
from protocol.messages.describe_client_quotas_request import DescribeClientQuotasRequest as Describe

EXACT, DEFAULT, ANY = 0, 1, 2
Parts = list[tuple[str, str | None]]
Ops = list[tuple[str, float | None]]


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory, apache_kafka: ApacheKafka) -> Iterator[dict[str, str]]:
    """{"kafka": bootstrap, "kbroker": bootstrap}, kbroker set up like the Kafka fixture."""
    overrides = {name: value for name, value in apache_kafka.settings.items() if name in BROKER_KEYS}
    with RunningBroker(tmp_path_factory.mktemp("kbroker"), {**overrides, "node.id": "1"}) as running:
        yield {"kafka": apache_kafka.bootstrap, "kbroker": running.bootstrap}


def alter(client: WireClient, entries: list[tuple[Parts, Ops]], validate_only: bool = False, version: int = 1) -> Any:
    request = Alter(
        entries=[
            Alter.EntryData(
                entity=[Alter.EntityData(entity_type=t, entity_name=n) for t, n in parts],
                ops=[Alter.OpData(key=k, value=v or 0.0, remove=v is None) for k, v in ops],
            )
            for parts, ops in entries
        ],
        validate_only=validate_only,
    )
    answer = client.request(request, version)
    return answer.throttle_time_ms, [
        (e.error_code, e.error_message, [(p.entity_type, p.entity_name) for p in e.entity]) for e in answer.entries
    ]


def describe(
    client: WireClient, components: list[tuple[str, int, str | None]], strict: bool = False, version: int = 1
) -> Any:
    request = Describe(
        components=[Describe.ComponentData(entity_type=t, match_type=m, match=n) for t, m, n in components],
        strict=strict,
    )
    answer = client.request(request, version)
    entries = None
    if answer.entries is not None:
        entries = sorted(
            (
                ([(p.entity_type, p.entity_name) for p in entry.entity], [(v.key, v.value) for v in entry.values])
                for entry in answer.entries
            ),
            key=repr,
        )
    return answer.error_code, answer.error_message, entries


def scenario(bootstrap: str, run: str) -> dict[str, Any]:
    alice, bob, app = f"alice-{run}", f"bob-{run}", f"app-{run}"
    seen: dict[str, Any] = {}
    with WireClient(bootstrap, timeout=30) as client:
        seen["set"] = alter(
            client,
            [
                ([("user", alice)], [("producer_byte_rate", 1024.0), ("consumer_byte_rate", 2048.0)]),
                ([("user", alice), ("client-id", app)], [("request_percentage", 50.0)]),
                ([("client-id", app)], [("consumer_byte_rate", 4096.0)]),
                ([("user", bob), ("client-id", None)], [("producer_byte_rate", 10.0)]),
                ([("ip", "10.1.2.3")], [("connection_creation_rate", 20.0)]),
            ],
        )
        seen["refused"] = [
            alter(client, [([("user", alice)], [("bogus", 1.0)])]),
            alter(client, [([("user", alice)], [("producer_byte_rate", 1.5)])]),
            alter(client, [([("user", alice)], [("producer_byte_rate", -1.0)])]),
            alter(client, [([("user", alice)], [("request_percentage", 0.0)])]),
            alter(client, [([("user", alice)], [("producer_byte_rate", 1.0), ("producer_byte_rate", 2.0)])]),
            alter(client, [([("user", alice)], [("bogus", 1.0), ("worse", 1.0), ("consumer_byte_rate", 1.0)])]),
            alter(client, [([], [("consumer_byte_rate", 1.0)])]),
            alter(client, [([("group", "g")], [("consumer_byte_rate", 1.0)])]),
            alter(client, [([("user", "")], [("consumer_byte_rate", 1.0)])]),
            alter(client, [([("ip", "10.1.2.3")], [("consumer_byte_rate", 1.0)])]),
            alter(client, [([("ip", "no.such.host.invalid")], [("connection_creation_rate", 1.0)])]),
            alter(client, [([("user", alice), ("ip", "10.1.2.3")], [("connection_creation_rate", 1.0)])]),
            alter(client, [([("client-id", app)], [("connection_creation_rate", 1.0)])]),
            alter(client, [([("client-id", app)], [("producer_byte_rate", 1e30)])]),
            alter(client, [([("ip", "10.1.2.3")], [("connection_creation_rate", 3e9)])]),
        ]
        seen["mixed"] = alter(
            client,
            [
                ([("user", bob)], [("bogus", 1.0)]),
                ([("client-id", f"c-{run}"), ("user", bob)], [("producer_byte_rate", 5.0)]),
                ([("user", f"v-{run}")], [("producer_byte_rate", 1.0)]),
                ([("user", f"v-{run}")], [("consumer_byte_rate", 1.0)]),
            ],
        )
        seen["validate_only"] = alter(client, [([("user", f"w-{run}")], [("producer_byte_rate", 7.0)])], True)
        seen["v0"] = alter(client, [([("client-id", f"old-{run}")], [("consumer_byte_rate", 8.0)])], version=0)
        seen["remove"] = alter(
            client, [([("user", alice)], [("consumer_byte_rate", None), ("request_percentage", None)])]
        )
        seen["remove_last"] = alter(client, [([("client-id", f"old-{run}")], [("consumer_byte_rate", None)])])
        seen["sentinel"] = alter(client, [([("client-id", f"sentinel-{run}")], [("producer_byte_rate", 1.0)])])
        deadline = time.monotonic() + 30
        while describe(client, [("client-id", EXACT, f"sentinel-{run}")])[2] == []:  # Kafka's image catching up
            assert time.monotonic() < deadline, "the quotas set never became visible"
            time.sleep(0.1)
        seen["describe"] = {
            "user_exact": describe(client, [("user", EXACT, alice)]),
            "user_exact_strict": describe(client, [("user", EXACT, alice)], strict=True),
            "user_and_client": describe(client, [("user", EXACT, alice), ("client-id", EXACT, app)]),
            "client_exact_v0": describe(client, [("client-id", EXACT, app)], version=0),
            "bob_any_client": describe(client, [("user", EXACT, bob), ("client-id", ANY, None)]),
            "bob_default_client": describe(client, [("user", EXACT, bob), ("client-id", DEFAULT, None)], strict=True),
            "ip": describe(client, [("ip", EXACT, "10.1.2.3")]),
            "removed": describe(client, [("client-id", EXACT, f"old-{run}")]),
            "not_validated": describe(client, [("user", EXACT, f"w-{run}")]),
            "duplicate_applied": describe(client, [("user", EXACT, f"v-{run}")]),
            "strict_nothing": describe(client, [], strict=True),
            "unknown_type": describe(client, [("bogus", ANY, None)]),
            "empty_type": describe(client, [("", ANY, None)]),
            "bad_match_type": describe(client, [("user", 7, None)]),
            "exact_null": describe(client, [("user", EXACT, None)]),
            "default_named": describe(client, [("user", DEFAULT, "x")]),
            "any_named": describe(client, [("user", ANY, "x")]),
            "twice": describe(client, [("user", ANY, None), ("user", ANY, None)]),
            "ip_and_user": describe(client, [("user", ANY, None), ("ip", ANY, None)]),
        }
    return seen


def test_client_quota_answers_match_kafka(brokers: dict[str, str]) -> None:
    run = uuid.uuid4().hex[:8]  # the same names on both brokers, new ones each run
    kafka, ours = scenario(brokers["kafka"], run), scenario(brokers["kbroker"], run)
    for key in kafka:
        assert ours[key] == kafka[key], key
    assert [entry[:2] for entry in kafka["set"][1]] == [(0, None)] * 5  # the scenario's premise: all were set
    assert len(kafka["describe"]["user_exact"][2]) == 2 and kafka["describe"]["unknown_type"][0] == 35
