"""The config registry (kbroker/config_registry.py): every key complete, synonyms consistent, nothing accepted
and silently ignored; Kafka's stock server.properties starts kbroker with warnings only for the keys that have
no meaning on one node; a refused key is refused with its reason by CreateTopics and by the command line."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbroker import config_registry as registry
from kbroker.config import KEYS, BrokerConfig, ConfigError
from kbroker.config_registry import REGISTRY, Scope, Status
from kbroker.testing import RunningBroker
from kbroker.topic_config import TOPIC_CONFIG_KEYS, validate_topic_configs, warn_unapplied
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.describe_configs_request import DescribeConfigsRequest
from protocol.messages.metadata_request import MetadataRequest

STOCK = Path(__file__).resolve().parents[1] / "fixtures" / "kafka-4.3-server.properties"
TYPES = {"BOOLEAN", "STRING", "INT", "SHORT", "LONG", "DOUBLE", "LIST", "CLASS", "PASSWORD"}
# The keys of Kafka's stock server.properties with no meaning on a single node: the only ones warned about.
STOCK_WARNED = {
    "process.roles",
    "controller.quorum.bootstrap.servers",
    "num.network.threads",
    "num.io.threads",
    "socket.send.buffer.bytes",
    "socket.receive.buffer.bytes",
    "num.recovery.threads.per.data.dir",
    "offsets.topic.replication.factor",
    "share.coordinator.state.topic.replication.factor",
    "share.coordinator.state.topic.min.isr",
    "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr",
}


def test_every_key_has_a_type_a_valid_default_a_validator_and_a_status() -> None:
    for name, key in REGISTRY.items():
        assert key.type_name in TYPES, name
        assert callable(key.parse), name
        assert isinstance(key.scope, Scope) and isinstance(key.status, Status), name
        assert key.doc, name
        if key.default or not key.null_default:
            key.parse(key.default)  # the default passes the validator
        if key.when is not None and key.default:  # a status for some values only: never for the default
            assert key.status_of(key.parse(key.default)) is Status.IMPLEMENTED, name
        if key.status is not Status.IMPLEMENTED:
            assert key.reason, f"{name} is {key.status.value} without a reason"
    # Numbers' types agree with their validators' ranges.
    for name, key in REGISTRY.items():
        if isinstance(key.parse, registry.Int):
            assert key.type_name == key.parse.type_name, name


def test_every_broker_synonym_of_a_topic_key_exists_and_points_back() -> None:
    for name, key in TOPIC_CONFIG_KEYS.items():
        synonym = key.broker_synonym
        if synonym is None:
            continue
        broker_key = REGISTRY.get(synonym)
        assert broker_key is not None and broker_key.broker, f"{name}: broker synonym {synonym} is not a broker key"
        assert broker_key.topic_config == name, f"{synonym} does not name {name} back"
        assert broker_key.type_name == key.type_name, name
    for key in registry.BROKER_DEFS.values():
        if key.topic_config is not None:
            assert TOPIC_CONFIG_KEYS[key.topic_config].broker_synonym == key.name


def test_what_is_not_applied_is_warned_or_refused_with_the_issue_that_owns_it() -> None:
    for policy in ("compact", "delete", "compact,delete"):  # the log cleaner compacts
        assert REGISTRY["cleanup.policy"].status_of(policy) is Status.IMPLEMENTED
    assert REGISTRY["log.cleaner.threads"].status_of(1) is Status.IMPLEMENTED
    assert REGISTRY["log.cleaner.threads"].status_of(4) is Status.WARNED
    assert REGISTRY["min.insync.replicas"].status_of(2) is Status.IMPLEMENTED  # the replica layer applies it
    assert REGISTRY["remote.storage.enable"].status_of(True) is Status.REFUSED
    assert REGISTRY["remote.storage.enable"].status_of(False) is Status.IMPLEMENTED
    assert "Tiered storage" in REGISTRY["remote.storage.enable"].reason
    applied = (
        "transactional.id.expiration.ms",  # the transaction coordinator's
        "transaction.max.timeout.ms",
        "transaction.state.log.num.partitions",  # __transaction_state's, at its creation
        "transaction.state.log.segment.bytes",
        "offsets.topic.num.partitions",  # __consumer_offsets'
        "offsets.topic.segment.bytes",
    )
    for name in applied:
        assert REGISTRY[name].status is Status.IMPLEMENTED
    assert REGISTRY["transaction.state.log.load.buffer.size"].status is Status.WARNED
    assert set(KEYS) == {name for name, key in registry.BROKER_DEFS.items() if key.described}
    messages = warn_unapplied("t", {"cleanup.policy": "compact", "retention.ms": "1000", "preallocate": "true"})
    assert [m.split(":")[0] for m in messages] == ["topic t"] and "preallocate" in messages[0]


def test_refused_values_name_their_reason() -> None:
    problem = validate_topic_configs({"remote.storage.enable": "true"})
    assert problem is not None and problem.startswith("Invalid value true for configuration remote.storage.enable: ")
    assert "Tiered storage" in problem
    assert validate_topic_configs({"min.insync.replicas": "2", "cleanup.policy": "compact"}) is None
    assert BrokerConfig({"transaction.max.timeout.ms": "1000"})["transaction.max.timeout.ms"] == 1000
    with pytest.raises(ConfigError, match="num.io.threads: expected an integer"):
        BrokerConfig({"num.io.threads": "many"})  # a warned key is still validated


def test_create_topics_refuses_a_refused_value_with_its_reason(broker: RunningBroker) -> None:
    config = CreateTopicsRequest.CreatableTopicConfig(name="remote.storage.enable", value="true")
    topic = CreateTopicsRequest.CreatableTopic(name="tiered", num_partitions=1, replication_factor=1, configs=[config])
    with WireClient(broker.bootstrap) as client:
        answer = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0]
    assert answer.error_code == ErrorCode.INVALID_CONFIG
    reason = REGISTRY["remote.storage.enable"].reason
    assert answer.error_message == f"Invalid value true for configuration remote.storage.enable: {reason}"
    assert broker.broker is not None and broker.broker.topic("tiered") is None


def test_the_command_line_refuses_a_refused_key_in_one_line(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(tmp_path)]
    result = subprocess.run(
        [*command, "--override", "sasl.jaas.config=x required;"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    reason = REGISTRY["sasl.jaas.config"].reason
    assert (
        result.stderr.strip()
        == f"kbroker: configuration error: sasl.jaas.config=x required; is not supported: {reason}"
    )


def test_kafkas_stock_server_properties_starts_with_warnings_only_for_single_node_keys(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    command = [sys.executable, "-m", "kbroker", "serve", "--config", str(STOCK), "--ready-file", str(ready)]
    # The stock file's ports and /tmp directory are replaced by free ones; every other key is as shipped.
    command += ["--data-dir", str(tmp_path / "data"), "--override", "listeners=PLAINTEXT://127.0.0.1:0,CONTROLLER://:0"]
    command += ["--override", "advertised.listeners=PLAINTEXT://127.0.0.1:0"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text().strip():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "broker did not become ready"
            time.sleep(0.05)
        with WireClient(ready.read_text().strip()) as client:
            answer = client.request(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12)
        assert [broker.node_id for broker in answer.brokers] == [1]
        # A key from the config file is STATIC_BROKER_CONFIG (4), with Kafka's default as a DEFAULT_CONFIG synonym.
        names = ["num.partitions", "log.segment.bytes", "log.retention.hours", "socket.request.max.bytes"]
        resource = DescribeConfigsRequest.DescribeConfigsResource(
            resource_type=4, resource_name="1", configuration_keys=names
        )
        with WireClient(ready.read_text().strip()) as client:
            described = client.request(DescribeConfigsRequest(resources=[resource], include_synonyms=True), 4)
        entries = {e.name: e for e in described.results[0].configs}
        assert {name: entries[name].config_source for name in names} == dict.fromkeys(names, 4)
        assert [(s.name, s.value, s.source) for s in entries["log.retention.hours"].synonyms] == [
            ("log.retention.hours", "168", 4),
            ("log.retention.hours", "168", 5),
        ]
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    warned = {m.group(1) for m in re.finditer(r" WARNING kbroker\.config: ([a-z.]+)=", stderr)}
    assert warned == STOCK_WARNED
    assert not re.search(r" (ERROR|CRITICAL) | WARNING (?!kbroker\.config: )", stderr), stderr
    assert "Traceback" not in stderr


def test_default_replication_factor_is_applied_by_a_broker_of_a_quorum_and_warned_on_a_single_node(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Kafka's broker server.properties often carries default.replication.factor=3: a single node starts with it
    (one replica to give, warned), and a broker under Kafka's controllers applies it, unwarned."""
    with caplog.at_level("WARNING", logger="kbroker"):
        single = BrokerConfig({"default.replication.factor": "3"})
    assert single["default.replication.factor"] == 3
    assert [r.getMessage() for r in caplog.records] == [
        "default.replication.factor=3 is accepted but not applied: no meaning on a single node: every partition has "
        "one replica (applied with process.roles=broker, under Kafka's controllers)"
    ]
    caplog.clear()
    quorum = {"process.roles": "broker", "node.id": "1", "controller.listener.names": "CONTROLLER"}
    quorum["controller.quorum.voters"] = "1@localhost:9093"
    with caplog.at_level("WARNING", logger="kbroker"):
        broker = BrokerConfig({**quorum, "default.replication.factor": "3"})
    assert broker["default.replication.factor"] == 3
    assert caplog.records == []
    with pytest.raises(ConfigError, match="default.replication.factor"):
        BrokerConfig({"default.replication.factor": "0"})
    # What the controllers decide is warned as theirs, not as a single node's.
    with caplog.at_level("WARNING", logger="kbroker"):
        BrokerConfig({**quorum, "unclean.leader.election.enable": "false"})
    assert [r.getMessage() for r in caplog.records] == [
        "unclean.leader.election.enable=false is accepted but not applied: the KRaft controller quorum elects "
        "leaders: set it on the controllers, or as a topic config"
    ]


def test_a_single_node_auto_creates_one_replica_whatever_default_replication_factor_says(tmp_path: Path) -> None:
    settings = {"node.id": "4", "default.replication.factor": "3"}
    with RunningBroker(tmp_path, settings) as broker, WireClient(broker.bootstrap) as client:
        wanted = [MetadataRequest.MetadataRequestTopic(name="auto-made")]
        [topic] = client.request(MetadataRequest(topics=wanted, allow_auto_topic_creation=True), 12).topics
        assert topic.error_code == ErrorCode.NONE
        assert [list(p.replica_nodes) for p in topic.partitions] == [[4]]
