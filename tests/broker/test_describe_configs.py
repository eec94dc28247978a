"""DescribeConfigs for the broker and topics, kbroker alone: types, listeners, synonyms, derived settings.

tests/kafka/test_differential_kafka.py sends the same requests to Apache Kafka and compares the answers.
"""

from __future__ import annotations

from collections.abc import Callable

from kbroker.config import KEYS, BrokerConfig
from kbroker.dynamic_config import APPLIED_DYNAMIC_KEYS
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.describe_configs_request import DescribeConfigsRequest
from protocol.messages.describe_configs_response import DescribeConfigsResponse

BROKER, TOPIC = 4, 2
BOOLEAN, STRING, INT, LONG, LIST = 1, 2, 3, 5, 7
STATIC, DEFAULT = 4, 5


def _describe(
    bootstrap: str, resource_type: int, name: str, *, documentation: bool = False
) -> dict[str, DescribeConfigsResponse.DescribeConfigsResourceResult]:
    resource = DescribeConfigsRequest.DescribeConfigsResource(
        resource_type=resource_type, resource_name=name, configuration_keys=None
    )
    request = DescribeConfigsRequest(resources=[resource], include_synonyms=True, include_documentation=documentation)
    with WireClient(bootstrap) as client:
        result = client.request(request, 4).results[0]
    assert result.error_code == 0, result.error_message
    return {entry.name: entry for entry in result.configs}


def _synonyms(entry: DescribeConfigsResponse.DescribeConfigsResourceResult) -> list[tuple[str, str | None, int]]:
    return [(s.name, s.value, s.source) for s in entry.synonyms]


def test_every_broker_config_has_kafkas_type(broker: RunningBroker) -> None:
    configs = _describe(broker.bootstrap, BROKER, "0")
    assert set(configs) == set(KEYS)
    assert all(entry.config_type != 0 for entry in configs.values())  # never UNKNOWN
    types = {name: configs[name].config_type for name in ("node.id", "auto.create.topics.enable", "log.retention.ms")}
    assert types == {"node.id": INT, "auto.create.topics.enable": BOOLEAN, "log.retention.ms": LONG}
    assert configs["log.message.timestamp.type"].config_type == STRING
    assert configs["group.consumer.assignors"].config_type == LIST
    assert configs["listeners"].config_type == LIST


def test_listeners_and_data_directory_are_reported_as_they_are(broker: RunningBroker) -> None:
    configs = _describe(broker.bootstrap, BROKER, "0")
    address = f"PLAINTEXT://{broker.bootstrap}"
    assert (configs["listeners"].value, configs["listeners"].config_source) == (address, STATIC)
    assert _synonyms(configs["listeners"]) == [
        ("listeners", address, STATIC),
        ("listeners", "PLAINTEXT://127.0.0.1:9092", DEFAULT),
    ]
    assert _synonyms(configs["advertised.listeners"]) == [("advertised.listeners", address, STATIC)]
    assert configs["log.dirs"].value == str(broker.broker.data_dir)
    # What kbroker changes at run time (dynamic broker configs) is writable; listeners need a restart.
    writable = {name for name, entry in configs.items() if not entry.read_only}
    assert writable == APPLIED_DYNAMIC_KEYS & set(KEYS)
    assert "message.max.bytes" in writable and "listeners" not in writable


def test_static_settings_list_their_default_as_a_synonym(broker_factory: Callable[..., RunningBroker]) -> None:
    broker = broker_factory({"num.partitions": "3", "log.retention.hours": "2", "auto.create.topics.enable": "False"})
    configs = _describe(broker.bootstrap, BROKER, "0")
    assert _synonyms(configs["num.partitions"]) == [("num.partitions", "3", STATIC), ("num.partitions", "1", DEFAULT)]
    assert _synonyms(configs["auto.create.topics.enable"]) == [
        ("auto.create.topics.enable", "false", STATIC),
        ("auto.create.topics.enable", "true", DEFAULT),
    ]
    # log.retention.ms is unset, so null as Kafka describes it; retention comes from log.retention.hours.
    assert (configs["log.retention.ms"].value, _synonyms(configs["log.retention.ms"])) == (None, [])
    with WireClient(broker.bootstrap) as client:
        topic = CreateTopicsRequest.CreatableTopic(name="hours", num_partitions=1, replication_factor=1)
        assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0
    retention = _describe(broker.bootstrap, TOPIC, "hours")["retention.ms"]
    assert (retention.value, retention.config_source, _synonyms(retention)) == ("7200000", DEFAULT, [])


def test_documentation_only_when_asked(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        topic = CreateTopicsRequest.CreatableTopic(name="documented", num_partitions=1, replication_factor=1)
        assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0
    for resource_type, name in ((BROKER, "0"), (TOPIC, "documented")):
        assert all(e.documentation is None for e in _describe(broker.bootstrap, resource_type, name).values())
        documented = _describe(broker.bootstrap, resource_type, name, documentation=True).values()
        assert all(e.documentation for e in documented)


def test_retention_and_roll_are_derived_from_hours_and_minutes_as_in_kafka() -> None:
    assert BrokerConfig({})["log.retention.ms"] == 7 * 24 * 3_600_000
    assert BrokerConfig({"log.retention.hours": "1"})["log.retention.ms"] == 3_600_000
    assert BrokerConfig({"log.retention.hours": "1", "log.retention.minutes": "2"})["log.retention.ms"] == 120_000
    assert BrokerConfig({"log.retention.minutes": "2", "log.retention.ms": "5"})["log.retention.ms"] == 5
    assert BrokerConfig({"log.retention.hours": "-1"})["log.retention.ms"] == -1
    assert BrokerConfig({"log.roll.hours": "3"})["log.roll.ms"] == 3 * 3_600_000
    assert BrokerConfig({"log.roll.hours": "3"}).topic_defaults()["segment.ms"] == str(3 * 3_600_000)
