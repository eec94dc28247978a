"""Dynamic broker configs and group configs sent to kbroker and to Apache Kafka 4.4 (the ``apache_kafka``
fixture): the same alterations, valid and refused, on this broker, the cluster-wide default and a group, and
then the same descriptions, every answer compared (error codes, messages, values, sources, synonyms).

What differs on purpose (kbroker/UNSUPPORTED.md) is left out of the comparison: the min.insync.replicas=1
cluster default Kafka's storage tool writes (so a legacy AlterConfigs of the default resource is not sent, Kafka
refuses it for removing that key), the keys Kafka accepts that kbroker refuses (thread pools, unknown names),
and the group keys Kafka lists that kbroker's coordinator has no use for (share, streams, dead letter queue).
Kafka applies a change in its controller and describes it from a metadata image that follows a moment later, so
the descriptions wait until both answer alike (bounded), then compare. The Kafka broker is shared by the session:
everything set is removed at the end."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka
from kbroker.config import KEYS as BROKER_KEYS
from kbroker.dynamic_config import GROUP_KEYS
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.messages.alter_configs_request import AlterConfigsRequest as Alter
from protocol.messages.describe_configs_request import DescribeConfigsRequest as Describe
from protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest as Incremental

BROKER, GROUP = 4, 32
SET, DELETE, APPEND = 0, 1, 2
NODE = "1"
GROUP_ID = "dynamic-configs-differential"
KEYS = ["message.max.bytes", "log.retention.ms", "log.retention.bytes", "log.cleaner.backoff.ms", "log.segment.bytes"]


@pytest.fixture(scope="module")
def bootstraps(tmp_path_factory: pytest.TempPathFactory, apache_kafka: ApacheKafka) -> Iterator[dict[str, str]]:
    overrides = {name: value for name, value in apache_kafka.settings.items() if name in BROKER_KEYS}
    with RunningBroker(tmp_path_factory.mktemp("kbroker"), {**overrides, "node.id": NODE}) as running:
        yield {"kafka": apache_kafka.bootstrap, "kbroker": running.bootstrap}


def incremental(client: WireClient, resource_type: int, name: str, ops: list[tuple[str, int, str | None]]) -> Any:
    resource = Incremental.AlterConfigsResource(
        resource_type=resource_type,
        resource_name=name,
        configs=[Incremental.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops],
    )
    return [(r.error_code, r.error_message) for r in client.request(Incremental(resources=[resource]), 1).responses]


def incremental_twice(client: WireClient, resource_type: int, name: str, key: str, values: tuple[str, str]) -> Any:
    """One IncrementalAlterConfigs naming the same resource twice (Kafka refuses both, whatever else holds)."""
    resources = [
        Incremental.AlterConfigsResource(
            resource_type=resource_type,
            resource_name=name,
            configs=[Incremental.AlterableConfig(name=key, config_operation=SET, value=value)],
        )
        for value in values
    ]
    answer = client.request(Incremental(resources=resources), 1)
    return [(r.error_code, r.error_message, r.resource_type, r.resource_name) for r in answer.responses]


def alter(client: WireClient, resource_type: int, name: str, configs: dict[str, str | None]) -> Any:
    resource = Alter.AlterConfigsResource(
        resource_type=resource_type,
        resource_name=name,
        configs=[Alter.AlterableConfig(name=k, value=v) for k, v in configs.items()],
    )
    return [(r.error_code, r.error_message) for r in client.request(Alter(resources=[resource]), 2).responses]


def describe(client: WireClient, resource_type: int, name: str, keys: list[str] | None) -> Any:
    resource = Describe.DescribeConfigsResource(
        resource_type=resource_type, resource_name=name, configuration_keys=keys
    )
    (result,) = client.request(Describe(resources=[resource], include_synonyms=True), 4).results
    entries = {
        e.name: (
            e.value,
            e.config_source,
            e.read_only,
            e.config_type,
            [(s.name, s.value, s.source) for s in e.synonyms],
        )
        for e in result.configs
        if e.name != "min.insync.replicas" and (resource_type != GROUP or e.name in GROUP_KEYS)
    }
    return result.error_code, entries


def alterations(client: WireClient) -> dict[str, Any]:
    return {
        "a resource twice": incremental_twice(client, BROKER, "", "message.max.bytes", ("5000", "6000")),
        "a group twice": incremental_twice(client, GROUP, GROUP_ID, "consumer.session.timeout.ms", ("50000", "x")),
        "read-only": incremental(client, BROKER, NODE, [("log.dirs", SET, "/tmp/x")]),
        "read-only at the default": incremental(client, BROKER, "", [("log.dirs", SET, "/x"), ("broker.id", SET, "3")]),
        "read-only, legacy": alter(client, BROKER, NODE, {"log.dirs": "/tmp/x"}),
        "not a number": incremental(client, BROKER, "", [("message.max.bytes", SET, "abc")]),
        "another broker": incremental(client, BROKER, "7", [("message.max.bytes", SET, "1000")]),
        "not a broker id": incremental(client, BROKER, "x", [("message.max.bytes", SET, "1000")]),
        "null": incremental(client, BROKER, "", [("message.max.bytes", SET, None)]),
        "append to a number": incremental(client, BROKER, "", [("message.max.bytes", APPEND, "1")]),
        "default": incremental(
            client, BROKER, "", [("message.max.bytes", SET, "5000"), ("log.retention.ms", SET, "7200000")]
        ),
        "this broker": incremental(
            client, BROKER, NODE, [("log.retention.ms", SET, "3600000"), ("log.cleaner.backoff.ms", SET, "20000")]
        ),
        "this broker, legacy": alter(
            client, BROKER, NODE, {"log.retention.ms": "3600000", "log.retention.bytes": "100000000"}
        ),
        "group": incremental(
            client,
            GROUP,
            GROUP_ID,
            [("consumer.session.timeout.ms", SET, "50000"), ("consumer.heartbeat.interval.ms", SET, "6000")],
        ),
        "group, too long": incremental(client, GROUP, GROUP_ID, [("consumer.session.timeout.ms", SET, "70000")]),
        "group, too short": incremental(client, GROUP, GROUP_ID, [("consumer.heartbeat.interval.ms", SET, "10")]),
        "group, unknown": incremental(client, GROUP, GROUP_ID, [("foo", SET, "1")]),
        "group, not a number": incremental(client, GROUP, GROUP_ID, [("consumer.session.timeout.ms", SET, "x")]),
        "default group": incremental(client, GROUP, "", [("consumer.session.timeout.ms", SET, "50000")]),
    }


def descriptions(client: WireClient) -> dict[str, Any]:
    return {
        "this broker": describe(client, BROKER, NODE, KEYS),
        "default": describe(client, BROKER, "", None),
        "group": describe(client, GROUP, GROUP_ID, None),
        "unconfigured group": describe(client, GROUP, "no-such-group", None),
    }


def cleanup(client: WireClient) -> None:
    incremental(client, BROKER, "", [("message.max.bytes", DELETE, None), ("log.retention.ms", DELETE, None)])
    keys = ("log.retention.ms", "log.retention.bytes", "log.cleaner.backoff.ms")
    incremental(client, BROKER, NODE, [(key, DELETE, None) for key in keys])
    incremental(client, GROUP, GROUP_ID, [(key, DELETE, None) for key in GROUP_KEYS])


def test_dynamic_configs_answer_as_kafka(bootstraps: dict[str, str]) -> None:
    clients = {kind: WireClient(bootstrap, timeout=30) for kind, bootstrap in bootstraps.items()}
    try:
        altered = {kind: alterations(client) for kind, client in clients.items()}
        assert altered["kbroker"] == altered["kafka"]
        deadline = time.monotonic() + 20
        described = {kind: descriptions(client) for kind, client in clients.items()}
        while described["kbroker"] != described["kafka"] and time.monotonic() < deadline:
            time.sleep(0.3)
            described["kafka"] = descriptions(clients["kafka"])
        assert described["kbroker"] == described["kafka"]
        # What the comparison stands on: the layers as set, in both.
        assert described["kbroker"]["this broker"][1]["log.retention.ms"][:2] == ("3600000", 2)
        assert described["kbroker"]["default"][1]["message.max.bytes"][:2] == ("5000", 3)
        assert described["kbroker"]["group"][1]["consumer.session.timeout.ms"][:2] == ("50000", 8)
    finally:
        for client in clients.values():
            cleanup(client)
            client.close()
