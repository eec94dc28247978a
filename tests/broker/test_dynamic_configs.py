"""Dynamic broker configs and group configs (kbroker/dynamic_config.py) over the wire: Kafka 4.4's errors and
messages (each checked against a Kafka 4.4 broker sent the same request), the config sources and synonyms
DescribeConfigs reports, a dynamic default changing what produce accepts without a restart and still doing so
after one (it is a ConfigRecord in the metadata log), and a group config reaching the KIP-848 coordinator."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.alter_configs_request import AlterConfigsRequest as Alter
from protocol.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.describe_configs_request import DescribeConfigsRequest as Describe
from protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest as Incremental
from protocol.messages.list_config_resources_request import ListConfigResourcesRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch
from tools import maven_artifacts

TOPIC, BROKER, GROUP = 2, 4, 32
SET, DELETE, APPEND = 0, 1, 2
DYNAMIC_TOPIC, DYNAMIC_BROKER, DYNAMIC_DEFAULT, STATIC, DEFAULT, GROUP_CONFIG = 1, 2, 3, 4, 5, 8
NODE = "1"
Ops = list[tuple[str, int, str | None]]


@pytest.fixture
def running(tmp_path: Path) -> Any:
    with RunningBroker(tmp_path / "data", {"node.id": NODE, "log.retention.hours": "100"}) as broker:
        yield broker


def incremental(client: WireClient, resource_type: int, name: str, ops: Ops, validate_only: bool = False) -> Any:
    resource = Incremental.AlterConfigsResource(
        resource_type=resource_type,
        resource_name=name,
        configs=[Incremental.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops],
    )
    (answer,) = client.request(Incremental(resources=[resource], validate_only=validate_only), 1).responses
    return answer.error_code, answer.error_message


def alter(client: WireClient, resource_type: int, name: str, configs: dict[str, str | None]) -> Any:
    resource = Alter.AlterConfigsResource(
        resource_type=resource_type,
        resource_name=name,
        configs=[Alter.AlterableConfig(name=k, value=v) for k, v in configs.items()],
    )
    (answer,) = client.request(Alter(resources=[resource]), 2).responses
    return answer.error_code, answer.error_message


def describe(client: WireClient, resource_type: int, name: str, keys: list[str] | None) -> dict[str, Any]:
    resource = Describe.DescribeConfigsResource(
        resource_type=resource_type, resource_name=name, configuration_keys=keys
    )
    (result,) = client.request(Describe(resources=[resource], include_synonyms=True), 4).results
    assert result.error_code == ErrorCode.NONE, result.error_message
    return {
        e.name: (e.value, e.config_source, e.read_only, [(s.name, s.value, s.source) for s in e.synonyms])
        for e in result.configs
    }


def create_topic(client: WireClient, name: str, configs: dict[str, str] | None = None) -> None:
    topic = CreateTopicsRequest.CreatableTopic(
        name=name,
        num_partitions=1,
        replication_factor=1,
        configs=[CreateTopicsRequest.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()],
    )
    assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7).topics[0].error_code == 0


def produce(client: WireClient, topic: str, value_size: int) -> int:
    batch = build_batch([Record(value=b"v" * value_size)])
    data = ProduceRequest.PartitionProduceData(index=0, records=batch)
    request = ProduceRequest(
        acks=-1, timeout_ms=10_000, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[data])]
    )
    return int(client.request(request, 9).responses[0].partition_responses[0].error_code)


def test_broker_config_changes_are_validated_as_kafka_validates_them(running: RunningBroker) -> None:
    with WireClient(running.bootstrap) as client:
        refusals = {
            "read-only": incremental(client, BROKER, NODE, [("log.dirs", SET, "/tmp/x")]),
            "read-only at default": incremental(client, BROKER, "", [("log.dirs", SET, "/x"), ("broker.id", SET, "3")]),
            "read-only, legacy": alter(client, BROKER, "", {"log.dirs": "/tmp/x"}),
            "not a number": incremental(client, BROKER, "", [("message.max.bytes", SET, "abc")]),
            "other broker": incremental(client, BROKER, "7", [("message.max.bytes", SET, "1000")]),
            "not an id": incremental(client, BROKER, "x", [("message.max.bytes", SET, "1000")]),
            "null": incremental(client, BROKER, "", [("message.max.bytes", SET, None)]),
            "null, legacy": alter(client, BROKER, "", {"message.max.bytes": None}),
            "append to a number": incremental(client, BROKER, "", [("message.max.bytes", APPEND, "1")]),
            "thread pool": incremental(client, BROKER, NODE, [("num.io.threads", SET, "16")]),
            "listeners": incremental(client, BROKER, NODE, [("listeners", SET, "PLAINTEXT://:1")]),
        }
        assert refusals == {
            "read-only": (ErrorCode.INVALID_REQUEST, "Cannot update these configs dynamically: [log.dirs]"),
            "read-only at default": (
                ErrorCode.INVALID_REQUEST,
                "Cannot update these configs dynamically: [broker.id, log.dirs]",
            ),
            "read-only, legacy": (ErrorCode.INVALID_REQUEST, "Cannot update these configs dynamically: [log.dirs]"),
            "not a number": (
                ErrorCode.INVALID_REQUEST,
                "Invalid value abc for configuration message.max.bytes: Not a number of type INT",
            ),
            "other broker": (ErrorCode.INVALID_REQUEST, "Unexpected broker id, expected 1, but received 7"),
            "not an id": (ErrorCode.INVALID_REQUEST, "Node id must be an integer, but it is: x"),
            "null": (ErrorCode.INVALID_REQUEST, "Null value not supported for : message.max.bytes"),
            "null, legacy": (ErrorCode.INVALID_REQUEST, "Null value not supported for : message.max.bytes"),
            "append to a number": (
                ErrorCode.INVALID_CONFIG,
                "Config value append is not allowed for config key: message.max.bytes",
            ),
            # Dynamic in Kafka, but nothing in kbroker to change at run time (UNSUPPORTED.md).
            "thread pool": (
                ErrorCode.INVALID_REQUEST,
                "kbroker cannot update these configs dynamically: [num.io.threads] (kbroker applies only the topic "
                "defaults and log.cleaner.* at run time; set others in the config file)",
            ),
            "listeners": (
                ErrorCode.INVALID_REQUEST,
                "kbroker cannot update these configs dynamically: [listeners] (kbroker applies only the topic "
                "defaults and log.cleaner.* at run time; set others in the config file)",
            ),
        }
        # A validate-only change is checked and not made; nothing refused above was stored either.
        assert incremental(client, BROKER, "", [("message.max.bytes", SET, "5000")], validate_only=True) == (0, None)
        assert describe(client, BROKER, "", None) == {}
        assert describe(client, BROKER, NODE, ["message.max.bytes"])["message.max.bytes"][1] == DEFAULT


def test_sources_and_synonyms_follow_kafkas_precedence(running: RunningBroker) -> None:
    assert running.broker is not None
    with WireClient(running.bootstrap) as client:
        create_topic(client, "layers")
        set_default = [("message.max.bytes", SET, "5000"), ("log.retention.ms", SET, "7200000")]
        assert incremental(client, BROKER, "", set_default) == (0, None)
        set_mine = [("log.retention.ms", SET, "3600000"), ("log.cleaner.backoff.ms", SET, "20000")]
        assert incremental(client, BROKER, NODE, set_mine) == (0, None)
        keys = ["message.max.bytes", "log.retention.ms", "log.cleaner.backoff.ms", "log.segment.bytes"]
        # As Kafka 4.4 answers the same sequence (a static log.retention.hours shows as its synonym here).
        assert describe(client, BROKER, NODE, keys) == {
            "message.max.bytes": (
                "5000",
                DYNAMIC_DEFAULT,
                False,
                [("message.max.bytes", "5000", DYNAMIC_DEFAULT), ("message.max.bytes", "1048588", DEFAULT)],
            ),
            "log.retention.ms": (
                "3600000",
                DYNAMIC_BROKER,
                False,
                [
                    ("log.retention.ms", "3600000", DYNAMIC_BROKER),
                    ("log.retention.ms", "7200000", DYNAMIC_DEFAULT),
                    ("log.retention.hours", "100", STATIC),
                    ("log.retention.hours", "168", DEFAULT),
                ],
            ),
            "log.cleaner.backoff.ms": (
                "20000",
                DYNAMIC_BROKER,
                False,
                [("log.cleaner.backoff.ms", "20000", DYNAMIC_BROKER), ("log.cleaner.backoff.ms", "15000", DEFAULT)],
            ),
            "log.segment.bytes": ("1073741824", DEFAULT, False, [("log.segment.bytes", "1073741824", DEFAULT)]),
        }
        # The default resource lists only what is set there.
        assert describe(client, BROKER, "", None) == {
            "message.max.bytes": ("5000", DYNAMIC_DEFAULT, False, [("message.max.bytes", "5000", DYNAMIC_DEFAULT)]),
            "log.retention.ms": ("7200000", DYNAMIC_DEFAULT, False, [("log.retention.ms", "7200000", DYNAMIC_DEFAULT)]),
        }
        topic = describe(client, TOPIC, "layers", ["retention.ms", "max.message.bytes"])
        assert topic["retention.ms"][:2] == ("3600000", DYNAMIC_BROKER)
        assert topic["max.message.bytes"][:2] == ("5000", DYNAMIC_DEFAULT)
        # What the broker runs with: its logs' defaults and its cleaner's back-off.
        assert running.broker.logs.topic_defaults["retention.ms"] == "3600000"
        assert running.broker.dynamic_config.current["log.cleaner.backoff.ms"] == 20000
        # Removing this broker's value uncovers the default's; removing that, the static setting's.
        assert incremental(client, BROKER, NODE, [("log.retention.ms", DELETE, None)]) == (0, None)
        assert describe(client, TOPIC, "layers", ["retention.ms"])["retention.ms"][:2] == ("7200000", DYNAMIC_DEFAULT)
        # Legacy AlterConfigs replaces the whole set: message.max.bytes and log.retention.ms go.
        assert alter(client, BROKER, "", {"log.segment.bytes": "20000000"}) == (0, None)
        assert set(describe(client, BROKER, "", None)) == {"log.segment.bytes"}
        assert describe(client, TOPIC, "layers", ["retention.ms"])["retention.ms"][:2] == ("360000000", DEFAULT)
        assert running.broker.logs.topic_defaults["segment.bytes"] == "20000000"


def test_a_dynamic_default_applies_at_once_and_survives_a_restart(tmp_path: Path) -> None:
    broker = RunningBroker(tmp_path / "data", {"node.id": NODE})
    with broker:
        with WireClient(broker.bootstrap) as client:
            create_topic(client, "limited")
            create_topic(client, "overridden", {"max.message.bytes": "100000"})
            assert produce(client, "limited", 2000) == ErrorCode.NONE
            assert incremental(client, BROKER, "", [("message.max.bytes", SET, "1000")]) == (0, None)
            # Without a restart: the topic without an override takes the new default, the other keeps its own.
            assert produce(client, "limited", 2000) == ErrorCode.MESSAGE_TOO_LARGE
            assert produce(client, "overridden", 2000) == ErrorCode.NONE
            assert produce(client, "limited", 100) == ErrorCode.NONE
        broker.restart()
        with WireClient(broker.bootstrap) as client:
            assert produce(client, "limited", 2000) == ErrorCode.MESSAGE_TOO_LARGE
            described = describe(client, BROKER, NODE, ["message.max.bytes"])["message.max.bytes"]
            assert described[:2] == ("1000", DYNAMIC_DEFAULT)
            assert incremental(client, BROKER, "", [("message.max.bytes", DELETE, None)]) == (0, None)
            assert produce(client, "limited", 2000) == ErrorCode.NONE


def heartbeat(client: WireClient, group: str, topic: str) -> Any:
    request = ConsumerGroupHeartbeatRequest(
        group_id=group,
        member_id=uuid.uuid4().hex,
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=[topic],
        topic_partitions=[],
    )
    return client.request(request, 1)


def test_group_configs(running: RunningBroker) -> None:
    with WireClient(running.bootstrap) as client:
        create_topic(client, "grouped")
        group = "configured-group"
        # Kafka 4.4's answers, with the broker's default bounds (session 45000..60000, heartbeat 5000..15000).
        assert {
            "too long": incremental(client, GROUP, group, [("consumer.session.timeout.ms", SET, "70000")]),
            "too short": incremental(client, GROUP, group, [("consumer.heartbeat.interval.ms", SET, "10")]),
            "unknown": incremental(client, GROUP, group, [("foo", SET, "1")]),
            "not a number": incremental(client, GROUP, group, [("consumer.session.timeout.ms", SET, "x")]),
            "default group": incremental(client, GROUP, "", [("consumer.session.timeout.ms", SET, "50000")]),
        } == {
            "too long": (
                ErrorCode.INVALID_CONFIG,
                "consumer.session.timeout.ms must be in the range 45000 to 60000 inclusive.",
            ),
            "too short": (
                ErrorCode.INVALID_CONFIG,
                "consumer.heartbeat.interval.ms must be in the range 5000 to 15000 inclusive.",
            ),
            "unknown": (ErrorCode.INVALID_CONFIG, "Unknown group config name: foo"),
            "not a number": (
                ErrorCode.INVALID_CONFIG,
                "Invalid value x for configuration consumer.session.timeout.ms: Not a number of type INT",
            ),
            "default group": (ErrorCode.INVALID_REQUEST, "Default group resources are not allowed."),
        }
        ops: Ops = [("consumer.session.timeout.ms", SET, "50000"), ("consumer.heartbeat.interval.ms", SET, "6000")]
        assert incremental(client, GROUP, group, ops) == (0, None)
        assert describe(client, GROUP, group, None) == {
            "consumer.session.timeout.ms": (
                "50000",
                GROUP_CONFIG,
                False,
                [
                    ("consumer.session.timeout.ms", "50000", GROUP_CONFIG),
                    ("group.consumer.session.timeout.ms", "45000", DEFAULT),
                ],
            ),
            "consumer.heartbeat.interval.ms": (
                "6000",
                GROUP_CONFIG,
                False,
                [
                    ("consumer.heartbeat.interval.ms", "6000", GROUP_CONFIG),
                    ("group.consumer.heartbeat.interval.ms", "5000", DEFAULT),
                ],
            ),
        }
        # The KIP-848 coordinator tells members the group's heartbeat interval; another group gets the broker's.
        configured, other = heartbeat(client, group, "grouped"), heartbeat(client, "plain-group", "grouped")
        assert (configured.error_code, configured.heartbeat_interval_ms) == (0, 6000)
        assert (other.error_code, other.heartbeat_interval_ms) == (0, 5000)
        listed = client.request(ListConfigResourcesRequest(resource_types=[GROUP]), 1).config_resources
        assert [(r.resource_name, r.resource_type) for r in listed] == [(group, GROUP)]
        assert alter(client, GROUP, group, {"consumer.heartbeat.interval.ms": "7000"}) == (0, None)
        assert heartbeat(client, group, "grouped").heartbeat_interval_ms == 7000
        assert describe(client, GROUP, group, ["consumer.session.timeout.ms"])["consumer.session.timeout.ms"][:2] == (
            "45000",
            DEFAULT,
        )


# --- Kafka's kafka-configs tool and librdkafka's admin client --------------------------------------------------

KAFKA_TOOLS = "kafka-tools-4.4.0"  # tools/maven/kafka-tools-4.4.0.pom.xml


@pytest.fixture(scope="module")
def kafka_configs() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``kafka_configs(bootstrap, *arguments)``: Kafka 4.4's ConfigCommand (kafka-configs.sh), run to its end."""
    try:
        jars = maven_artifacts.prepare(KAFKA_TOOLS)
    except maven_artifacts.MavenUnavailable as exc:
        pytest.skip(f"{KAFKA_TOOLS} unavailable (python tools/maven_artifacts.py {KAFKA_TOOLS}): {exc}")
    classpath = ":".join(str(jar) for jar in sorted(jars.glob("*.jar")))
    java = ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m", "-cp", classpath]

    def run(bootstrap: str, *arguments: str) -> subprocess.CompletedProcess[str]:
        command = [*java, "org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", bootstrap, *arguments]
        return subprocess.run(command, capture_output=True, encoding="utf-8", timeout=180)

    return run


def test_kafkas_config_tool_sets_broker_and_group_configs(
    running: RunningBroker, kafka_configs: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    def ok(*arguments: str) -> str:
        done = kafka_configs(running.bootstrap, *arguments)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    default = ["--entity-type", "brokers", "--entity-default"]
    mine = ["--entity-type", "brokers", "--entity-name", NODE]
    group = ["--entity-type", "groups", "--entity-name", "tool-group"]
    assert ok("--alter", *default, "--add-config", "message.max.bytes=5000,log.retention.ms=7200000") == (
        "Completed updating default config for brokers in the cluster.\n"
    )
    assert ok("--alter", *mine, "--add-config", "log.cleaner.backoff.ms=20000") == (
        f"Completed updating config for broker {NODE}.\n"
    )
    assert ok("--describe", *default).splitlines() == [
        "Default configs for brokers in the cluster are:",
        "  log.retention.ms=7200000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=7200000}",
        "  message.max.bytes=5000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:message.max.bytes=5000}",
    ]
    assert ok("--describe", *mine).splitlines() == [
        f"Dynamic configs for broker {NODE} are:",
        "  log.cleaner.backoff.ms=20000 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:log.cleaner.backoff.ms=20000, "
        "DEFAULT_CONFIG:log.cleaner.backoff.ms=15000}",
    ]
    refused = kafka_configs(running.bootstrap, "--alter", *mine, "--add-config", "log.dirs=/x")
    assert refused.returncode == 1
    assert (
        "Caused by: org.apache.kafka.common.errors.InvalidRequestException: "
        "Cannot update these configs dynamically: [log.dirs]"
    ) in refused.stderr
    assert ok("--alter", *group, "--add-config", "consumer.session.timeout.ms=50000") == (
        "Completed updating config for group tool-group.\n"
    )
    out_of_range = kafka_configs(running.bootstrap, "--alter", *group, "--add-config", "consumer.session.timeout.ms=1")
    assert out_of_range.returncode == 1
    assert (
        "Caused by: org.apache.kafka.common.errors.InvalidConfigurationException: "
        "consumer.session.timeout.ms must be in the range 45000 to 60000 inclusive."
    ) in out_of_range.stderr
    assert ok("--describe", *group).splitlines() == [
        "Dynamic configs for group tool-group are:",
        "  consumer.session.timeout.ms=50000 sensitive=false synonyms={DYNAMIC_GROUP_CONFIG:"
        "consumer.session.timeout.ms=50000, DEFAULT_CONFIG:group.consumer.session.timeout.ms=45000}",
    ]
    ok("--alter", *default, "--delete-config", "message.max.bytes,log.retention.ms")
    ok("--alter", *mine, "--delete-config", "log.cleaner.backoff.ms")
    ok("--alter", *group, "--delete-config", "consumer.session.timeout.ms")
    assert ok("--describe", *default) == "Default configs for brokers in the cluster are:\n"
    assert ok("--describe", *group) == "The group 'tool-group' doesn't exist and doesn't have dynamic config.\n"
    assert running.broker is not None and running.broker.dynamic_config.current["message.max.bytes"] == 1048588


def test_librdkafka_admin_alters_a_broker_resource(running: RunningBroker) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource

    admin = AdminClient({"bootstrap.servers": running.bootstrap})

    def change(name: str, key: str, value: str) -> None:
        entry = ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
        resource = ConfigResource(ConfigResource.Type.BROKER, name, incremental_configs=[entry])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=30)

    change(NODE, "log.retention.bytes", "1000000")
    with WireClient(running.bootstrap) as client:  # librdkafka refuses a resource with an empty name
        assert incremental(client, BROKER, "", [("log.segment.bytes", SET, "2000000")]) == (0, None)
    (described,) = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, NODE)]).values()
    configs = described.result(timeout=30)
    retention, segment = configs["log.retention.bytes"], configs["log.segment.bytes"]
    assert (retention.value, retention.source, retention.is_read_only) == (
        "1000000",
        ConfigSource.DYNAMIC_BROKER_CONFIG.value,
        False,
    )
    assert (segment.value, segment.source) == ("2000000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    with pytest.raises(KafkaException) as refused:
        change(NODE, "num.partitions", "3")
    error = refused.value.args[0]
    assert (error.code(), error.str()) == (
        ErrorCode.INVALID_REQUEST,
        "Cannot update these configs dynamically: [num.partitions]",
    )


def test_a_resource_named_twice_in_one_alteration_is_refused_and_nothing_changes(running: RunningBroker) -> None:
    # As Kafka's ConfigAdminManager.preprocess: every entry of a repeated resource is INVALID_REQUEST, before its
    # keys are checked, and the others are applied. (Kafka 4.4 answers this for IncrementalAlterConfigs,
    # compared in tests/kafka/test_dynamic_configs_kafka.py; its legacy AlterConfigs never answers such a request.)
    with WireClient(running.bootstrap) as client:
        create_topic(client, "twice")
        twice = "Each resource must appear at most once."
        resources = [
            Incremental.AlterConfigsResource(
                resource_type=TOPIC,
                resource_name="twice",
                configs=[Incremental.AlterableConfig(name="retention.ms", config_operation=0, value=value)],
            )
            for value in ("1000", "2000")
        ] + [
            Incremental.AlterConfigsResource(
                resource_type=BROKER,
                resource_name="",
                configs=[Incremental.AlterableConfig(name="log.retention.ms", config_operation=0, value="7200000")],
            )
        ]
        answer = client.request(Incremental(resources=resources), 1)
        assert [(r.error_code, r.error_message, r.resource_type, r.resource_name) for r in answer.responses] == [
            (ErrorCode.INVALID_REQUEST, twice, TOPIC, "twice"),
            (ErrorCode.INVALID_REQUEST, twice, TOPIC, "twice"),
            (ErrorCode.NONE, None, BROKER, ""),
        ]
        legacy = Alter.AlterConfigsResource(
            resource_type=TOPIC, resource_name="twice", configs=[Alter.AlterableConfig(name="retention.ms", value="5")]
        )
        answer = client.request(Alter(resources=[legacy, legacy]), 2)
        assert [(r.error_code, r.error_message) for r in answer.responses] == [(ErrorCode.INVALID_REQUEST, twice)] * 2
        # The topic kept no override; the broker default named once was applied (and the topic inherits it).
        value, source, _, _ = describe(client, TOPIC, "twice", ["retention.ms"])["retention.ms"]
        assert (value, source) == ("7200000", DYNAMIC_DEFAULT)
