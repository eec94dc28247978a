"""The same requests to kbroker and to Apache Kafka 4.4 (the ``apache_kafka`` fixture), answers compared.

kbroker runs with the settings the Kafka fixture was given wherever kbroker has them, and node.id 1 like
Kafka's node, so node ids, settings and their sources compare as they are. Only what legitimately differs is
normalised: ports, cluster ids, topic ids, data directories, and Kafka's controller listener. Each
difference that remains is asserted exactly and listed in kbroker/UNSUPPORTED.md with its reason.

Kafka is shared by the session: every test uses topic names of its own.
"""

from __future__ import annotations

import json
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka
from kbroker.config import KEYS as BROKER_KEYS
from kbroker.testing import RunningBroker
from kbroker.topic_config import TOPIC_CONFIG_KEYS
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.framing import encode_request
from protocol.messages import APIS
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.delete_groups_request import DeleteGroupsRequest
from protocol.messages.describe_cluster_request import DescribeClusterRequest
from protocol.messages.describe_configs_request import DescribeConfigsRequest
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.offset_commit_request import OffsetCommitRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch

NO_ID = uuid.UUID(int=0)
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
DYNAMIC_DEFAULT_BROKER_CONFIG = 3

# Every API whose versions differ between Kafka 4.4 and kbroker: name -> (Kafka's range, kbroker's or None).
# A change on either side fails test_api_versions_gaps_are_the_known_ones: update this list and the README's
# table (python tools/api_versions_table.py).
EXPECTED_GAPS: dict[str, tuple[tuple[int, int], tuple[int, int] | None]] = {
    "OffsetCommit": ((2, 10), (2, 9)),
    "OffsetFetch": ((1, 10), (1, 9)),
    "TxnOffsetCommit": ((0, 6), (0, 5)),
    "CreateDelegationToken": ((1, 3), None),
    "RenewDelegationToken": ((1, 2), None),
    "ExpireDelegationToken": ((1, 2), None),
    "DescribeDelegationToken": ((1, 3), None),
    "UnregisterBroker": ((0, 0), None),
    "ShareGroupHeartbeat": ((1, 1), None),
    "ShareGroupDescribe": ((1, 1), None),
    "ShareFetch": ((1, 2), None),
    "ShareAcknowledge": ((1, 2), None),
    "AddRaftVoter": ((0, 1), None),
    "RemoveRaftVoter": ((0, 0), None),
    "InitializeShareGroupState": ((0, 0), None),
    "ReadShareGroupState": ((0, 0), None),
    "WriteShareGroupState": ((0, 1), None),
    "DeleteShareGroupState": ((0, 0), None),
    "ReadShareGroupStateSummary": ((0, 1), None),
    "StreamsGroupHeartbeat": ((0, 1), None),
    "StreamsGroupDescribe": ((0, 1), None),
    "DescribeShareGroupOffsets": ((0, 1), None),
    "AlterShareGroupOffsets": ((0, 0), None),
    "DeleteShareGroupOffsets": ((0, 0), None),
    "StreamsGroupTopologyDescriptionUpdate": ((0, 0), None),
    "UnregisterController": ((0, 0), None),
}


@pytest.fixture(scope="module")
def kbroker(tmp_path_factory: pytest.TempPathFactory, apache_kafka: ApacheKafka) -> Iterator[RunningBroker]:
    """kbroker set up like the Kafka fixture: its settings where kbroker has them, and node.id 1."""
    overrides = {name: value for name, value in apache_kafka.settings.items() if name in BROKER_KEYS}
    with RunningBroker(tmp_path_factory.mktemp("kbroker"), {**overrides, "node.id": "1"}) as running:
        yield running


@pytest.fixture
def ask(kbroker: RunningBroker, apache_kafka: ApacheKafka) -> Callable[[Any, int], tuple[Any, Any]]:
    """``ask(request, version)``: (Kafka's answer, kbroker's answer), each on a new connection."""

    def both(request: Any, version: int) -> tuple[Any, Any]:
        answers = []
        for bootstrap in (apache_kafka.bootstrap, kbroker.bootstrap):
            with WireClient(bootstrap) as client:
                answers.append(client.request(request, version))
        return answers[0], answers[1]

    return both


def plain(value: Any) -> Any:
    """A decoded message as plain data (dicts, lists, values), for comparing and for readable diffs."""
    if isinstance(value, list):
        return [plain(item) for item in value]
    fields = getattr(value, "FIELDS", None)
    if fields is not None:
        return {name: plain(getattr(value, name)) for name in fields}
    return value


def by_partition(answer: Any) -> Any:
    """A ListOffsets answer with each topic's partitions in index order: Kafka's follow a hash map."""
    data = plain(answer)
    for topic in data["topics"]:
        topic["partitions"].sort(key=lambda p: p["partition_index"])
    return data


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create(ask: Callable[[Any, int], tuple[Any, Any]], name: str, partitions: int = 1, **configs: str) -> None:
    topic = CreateTopicsRequest.CreatableTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=1,
        configs=[CreateTopicsRequest.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()],
    )
    for answer in ask(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7):
        assert answer.topics[0].error_code == ErrorCode.NONE, answer.topics[0].error_message
    wait_for_metadata(ask, name)
    # Kafka's metadata names the leader a moment before the leader's log exists (NOT_LEADER_OR_FOLLOWER).
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=p, timestamp=-1) for p in range(partitions)]
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=name, partitions=wanted)]
    )
    deadline = time.monotonic() + 10
    while any(p.error_code for a in ask(request, 11) for t in a.topics for p in t.partitions):
        assert time.monotonic() < deadline, f"{name} not readable on both brokers"
        time.sleep(0.1)


def wait_for_metadata(ask: Callable[[Any, int], tuple[Any, Any]], name: str) -> None:
    """Kafka answers CreateTopics before its metadata cache (and log) have the topic: wait until both do."""
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=name)], allow_auto_topic_creation=False)
    deadline = time.monotonic() + 10
    while True:
        answers = ask(request, 12)
        if all(a.topics[0].error_code == 0 and all(p.leader_id >= 0 for p in a.topics[0].partitions) for a in answers):
            return
        assert time.monotonic() < deadline, [plain(a.topics) for a in answers]
        time.sleep(0.1)


def produce_request(name: str, batches: dict[int, bytes]) -> ProduceRequest:
    data = [ProduceRequest.PartitionProduceData(index=p, records=batch) for p, batch in batches.items()]
    return ProduceRequest(
        acks=-1, timeout_ms=10_000, topic_data=[ProduceRequest.TopicProduceData(name=name, partition_data=data)]
    )


def produce_errors(ask: Callable[[Any, int], tuple[Any, Any]], name: str, batches: dict[int, bytes]) -> list[Any]:
    """Each broker's {partition: error code} for one Produce v9."""
    return [
        {p.index: p.error_code for t in answer.responses for p in t.partition_responses}
        for answer in ask(produce_request(name, batches), 9)
    ]


# --- ApiVersions ------------------------------------------------------------------------------------------


def advertised(bootstrap: str) -> dict[int, tuple[int, int]]:
    with WireClient(bootstrap) as client:
        answer = client.request(ApiVersionsRequest(client_software_name="kbroker", client_software_version="1"), 3)
    assert answer.error_code == ErrorCode.NONE
    return {api.api_key: (api.min_version, api.max_version) for api in answer.api_keys}


def test_kbroker_never_advertises_a_version_kafka_does_not(kbroker: RunningBroker, apache_kafka: ApacheKafka) -> None:
    kafka, ours = advertised(apache_kafka.bootstrap), advertised(kbroker.bootstrap)
    beyond = {
        APIS[key].name: (versions, kafka.get(key))
        for key, versions in ours.items()
        if key not in kafka or not kafka[key][0] <= versions[0] <= versions[1] <= kafka[key][1]
    }
    assert beyond == {}


def test_api_versions_gaps_are_the_known_ones(kbroker: RunningBroker, apache_kafka: ApacheKafka) -> None:
    kafka, ours = advertised(apache_kafka.bootstrap), advertised(kbroker.bootstrap)
    gaps = {APIS[key].name: (versions, ours.get(key)) for key, versions in kafka.items() if ours.get(key) != versions}
    assert gaps == EXPECTED_GAPS


def test_api_versions_answers_and_features(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    for version in range(6):
        kafka, ours = ask(ApiVersionsRequest(client_software_name="x", client_software_version="1"), version)
        assert (kafka.error_code, ours.error_code) == (0, 0)
        assert (kafka.throttle_time_ms, ours.throttle_time_ms) == (0, 0)
    # KIP-584 features: Kafka names its finalized feature levels; kbroker names only transaction.version, the
    # same as Kafka's, so Java 4.x clients use transaction version 2 with both (UNSUPPORTED.md).
    assert {f.name for f in kafka.finalized_features} >= {"metadata.version", "group.version", "transaction.version"}
    assert [plain(f) for f in ours.supported_features] == [
        plain(f) for f in kafka.supported_features if f.name == "transaction.version"
    ]
    assert [plain(f) for f in ours.finalized_features] == [
        plain(f) for f in kafka.finalized_features if f.name == "transaction.version"
    ]
    assert ours.finalized_features_epoch > 0 and kafka.finalized_features_epoch > 0  # the image offsets differ
    # KIP-511: a client software name that is not Kafka's pattern is an invalid request, from v3.
    kafka, ours = ask(ApiVersionsRequest(client_software_name="-bad name", client_software_version="1"), 3)
    assert kafka.error_code == ours.error_code == ErrorCode.INVALID_REQUEST


def cluster_id(bootstrap: str) -> str:
    with WireClient(bootstrap) as client:
        answer: str = client.request(DescribeClusterRequest(), 0).cluster_id
    return answer


def test_api_versions_v5_checks_the_cluster_and_node_named(kbroker: RunningBroker, apache_kafka: ApacheKafka) -> None:
    # KIP-1242: each broker is named its own cluster id or another, with node id 1 (both brokers' id) or another;
    # naming only one of them is an invalid request.
    answers: dict[str, list[Any]] = {}
    for name, bootstrap in (("kafka", apache_kafka.bootstrap), ("kbroker", kbroker.bootstrap)):
        own = cluster_id(bootstrap)
        other = "AAAAAAAAAAAAAAAAAAAAAA"
        assert own != other
        cases = [(own, 1), (own, 2), (other, 1), (other, -1), (None, 7), (None, -1), ("", 1), (own, -1)]
        with WireClient(bootstrap) as client:
            answers[name] = [
                client.request(
                    ApiVersionsRequest(
                        client_software_name="x", client_software_version="1", cluster_id=cluster, node_id=node
                    ),
                    5,
                )
                for cluster, node in cases
            ]
    kafka, ours = answers["kafka"], answers["kbroker"]
    assert [a.error_code for a in ours] == [a.error_code for a in kafka]
    rebootstrap = ErrorCode.REBOOTSTRAP_REQUIRED
    invalid = ErrorCode.INVALID_REQUEST
    assert [a.error_code for a in ours] == [0, rebootstrap, rebootstrap, invalid, invalid, 0, rebootstrap, invalid]
    for kafka_answer, our_answer in zip(kafka, ours, strict=True):
        if kafka_answer.error_code:  # the error answer lists nothing, as Kafka's
            assert plain(our_answer) == plain(kafka_answer)
        else:
            assert {api.api_key for api in our_answer.api_keys} <= {api.api_key for api in kafka_answer.api_keys}


def raw_exchange(bootstrap: str, frame: bytes) -> bytes | None:
    """Send one frame; the answer's bytes after the size and correlation id, or None if the broker closed."""
    host, _, port = bootstrap.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            data += chunk
    return data[8:]


def with_version(frame: bytes, version: int) -> bytes:
    return frame[:6] + struct.pack(">h", version) + frame[8:]


def test_unsupported_versions(kbroker: RunningBroker, apache_kafka: ApacheKafka) -> None:
    # ApiVersions newer than the broker knows: UNSUPPORTED_VERSION in a v0 answer that lists only ApiVersions'
    # own versions (KIP-511), so the client retries with one of them.
    request = ApiVersionsRequest(client_software_name="x", client_software_version="1")
    frame = with_version(encode_request(request, 3, 7), 99)
    answers = [raw_exchange(bootstrap, frame) for bootstrap in (apache_kafka.bootstrap, kbroker.bootstrap)]
    assert answers[0] == answers[1] == struct.pack(">hihhh", ErrorCode.UNSUPPORTED_VERSION, 1, 18, 0, 5)
    # Any other API at a version the broker does not have, or does not have at all: the connection is closed.
    metadata = with_version(encode_request(MetadataRequest(topics=[]), 13, 7), 14)
    too_old = with_version(encode_request(ListOffsetsRequest(topics=[]), 1, 7), 0)
    for frame in (metadata, too_old):
        assert raw_exchange(apache_kafka.bootstrap, frame) is None
        assert raw_exchange(kbroker.bootstrap, frame) is None


# --- Metadata ---------------------------------------------------------------------------------------------


def normal_metadata(answer: Any, port: int) -> Any:
    data = plain(answer)
    for broker in data["brokers"]:
        assert broker["port"] == port
        broker["port"] = "port"
    if data["cluster_id"] is not None:
        assert len(data["cluster_id"]) == 22
        data["cluster_id"] = "cluster"
    for topic in data["topics"]:
        topic["topic_id"] = "id" if topic["topic_id"] not in (None, NO_ID) else topic["topic_id"]
    return data


def test_metadata_of_a_topic_and_of_unknown_ones(
    ask: Callable[[Any, int], tuple[Any, Any]], kbroker: RunningBroker, apache_kafka: ApacheKafka
) -> None:
    name, missing = unique("metadata"), unique("missing")
    create(ask, name, partitions=3)
    for version in range(14):
        request = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in (name, missing)],
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=True,
            include_topic_authorized_operations=True,
        )
        if version < 4:  # auto-creation cannot be refused before v4
            request.topics = request.topics[:1]
        kafka, ours = ask(request, version)
        assert normal_metadata(ours, kbroker.broker.advertised.port) == normal_metadata(kafka, apache_kafka.port), (
            version
        )
    topic = kafka.topics[0]
    assert [(p.partition_index, p.leader_id, p.replica_nodes, p.isr_nodes) for p in topic.partitions] == [
        (i, 1, [1], [1]) for i in range(3)
    ]
    assert (kafka.topics[1].error_code, kafka.topics[1].partitions) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])
    # By topic id (v12+): an unknown id is UNKNOWN_TOPIC_ID.
    by_id = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=None, topic_id=uuid.uuid4())])
    kafka, ours = ask(by_id, 12)
    assert normal_metadata(ours, kbroker.broker.advertised.port) == normal_metadata(kafka, apache_kafka.port)
    assert kafka.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_ID


def test_metadata_refuses_invalid_topic_names(
    ask: Callable[[Any, int], tuple[Any, Any]], kbroker: RunningBroker, apache_kafka: ApacheKafka
) -> None:
    names = ["bad name!", "x" * 250, "..", unique("ok.with_dots-and-dashes")]
    request = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in names[:3]], allow_auto_topic_creation=True
    )
    kafka, ours = ask(request, 12)
    assert [t.error_code for t in kafka.topics] == [ErrorCode.INVALID_TOPIC_EXCEPTION] * 3
    # kbroker answers in the request's order; Kafka 4.4 in the order of a hash set of the names (UNSUPPORTED.md).
    assert [t.name for t in ours.topics] == names[:3]
    kafka_data, our_data = (
        normal_metadata(kafka, apache_kafka.port),
        normal_metadata(ours, kbroker.broker.advertised.port),
    )
    for data in (kafka_data, our_data):
        data["topics"].sort(key=lambda topic: topic["name"])
    assert our_data == kafka_data


def test_metadata_auto_creates_topics(
    ask: Callable[[Any, int], tuple[Any, Any]], kbroker: RunningBroker, apache_kafka: ApacheKafka
) -> None:
    name = unique("auto")
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=name)], allow_auto_topic_creation=True)
    kafka, ours = ask(request, 12)
    # Kafka creates the topic in the background and first answers UNKNOWN_TOPIC_OR_PARTITION; kbroker creates it
    # before answering (UNSUPPORTED.md). Both end with the topic, num.partitions partitions, led by node 1.
    assert (kafka.topics[0].error_code, kafka.topics[0].partitions) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [])
    assert ours.topics[0].error_code == ErrorCode.NONE
    wait_for_metadata(ask, name)
    kafka, ours = ask(request, 12)
    assert normal_metadata(ours, kbroker.broker.advertised.port) == normal_metadata(kafka, apache_kafka.port)
    assert [(p.partition_index, p.leader_id) for p in kafka.topics[0].partitions] == [(0, 1)]


# --- ListOffsets ------------------------------------------------------------------------------------------


def test_list_offsets_on_the_same_records(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    name = unique("offsets")
    create(ask, name, partitions=2)
    base = int(time.time() * 1000) - 600_000
    # Three batches on partition 0 with timestamps out of order inside the second; partition 1 stays empty.
    batches = [
        build_batch(
            [Record(offset_delta=i, timestamp_delta=i * 1000, value=b"a") for i in range(3)], base_timestamp=base
        ),
        build_batch(
            [Record(offset_delta=0, timestamp_delta=9000, value=b"b"), Record(offset_delta=1, timestamp_delta=5000)],
            base_timestamp=base,
        ),
        build_batch([Record(offset_delta=0, timestamp_delta=7000, value=b"c")], base_timestamp=base),
    ]
    for batch in batches:
        assert produce_errors(ask, name, {0: batch}) == [{0: 0}, {0: 0}]
    specs = [-2, -1, -3, -4, base - 1, base, base + 1500, base + 5000, base + 8000, base + 9000, base + 9001]
    by_spec = {}
    for version in range(1, 12):
        for spec in specs:
            if (spec == -3 and version < 7) or (spec == -4 and version < 8):
                continue
            partitions = [ListOffsetsRequest.ListOffsetsPartition(partition_index=p, timestamp=spec) for p in (0, 1, 9)]
            request = ListOffsetsRequest(
                replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=name, partitions=partitions)]
            )
            kafka, ours = ask(request, version)
            assert by_partition(ours) == by_partition(kafka), (version, spec)
            first, empty, unknown = sorted(kafka.topics[0].partitions, key=lambda p: p.partition_index)
            assert (empty.offset, empty.error_code, unknown.error_code) == (0 if spec in (-1, -2, -4) else -1, 0, 3)
            by_spec[spec] = (first.offset, first.timestamp)
    assert by_spec == {
        -2: (0, -1),
        -1: (6, -1),
        -3: (3, base + 9000),
        -4: (0, -1),
        base - 1: (0, base),
        base: (0, base),
        base + 1500: (2, base + 2000),
        base + 5000: (3, base + 9000),
        base + 8000: (3, base + 9000),
        base + 9000: (3, base + 9000),
        base + 9001: (-1, -1),
    }


def test_list_offsets_refuses_a_partition_asked_twice(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    name = unique("twice")
    create(ask, name, partitions=3)
    part = ListOffsetsRequest.ListOffsetsPartition
    topics = [
        ListOffsetsRequest.ListOffsetsTopic(name=name, partitions=[part(partition_index=0, timestamp=-1)]),
        ListOffsetsRequest.ListOffsetsTopic(
            name=name, partitions=[part(partition_index=1, timestamp=-1), part(partition_index=0, timestamp=-2)]
        ),
        ListOffsetsRequest.ListOffsetsTopic(name=name, partitions=[part(partition_index=2, timestamp=-2)]),
    ]
    for version in (1, 11):
        answers = ask(ListOffsetsRequest(replica_id=-1, topics=topics), version)
        # Kafka's order of the answers follows a hash map: compared as sets.
        kafka, ours = (
            {(t.name, p.partition_index, p.error_code, p.offset) for t in a.topics for p in t.partitions}
            for a in answers
        )
        assert (
            ours
            == kafka
            == {
                (name, 0, ErrorCode.INVALID_REQUEST, -1),
                (name, 1, ErrorCode.NONE, 0),
                (name, 2, ErrorCode.NONE, 0),
            }
        )


def test_list_offsets_on_an_unknown_topic(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    partitions = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)]
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=unique("nowhere"), partitions=partitions)]
    )
    for version in (1, 5, 11):
        kafka, ours = ask(request, version)
        assert by_partition(ours) == by_partition(kafka)
        assert kafka.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# --- DescribeConfigs --------------------------------------------------------------------------------------


def describe(
    ask: Callable[[Any, int], tuple[Any, Any]], resource_type: int, names: tuple[str, str], documentation: bool = False
) -> tuple[Any, Any]:
    """Each broker's result for its own resource name (the broker resource is named by node id or empty)."""
    answers = []
    for index, name in enumerate(names):
        resource = DescribeConfigsRequest.DescribeConfigsResource(
            resource_type=resource_type, resource_name=name, configuration_keys=None
        )
        request = DescribeConfigsRequest(
            resources=[resource], include_synonyms=True, include_documentation=documentation
        )
        answers.append(ask(request, 4)[index].results[0])
    return answers[0], answers[1]


def config_map(result: Any, documentation: bool = False) -> dict[str, Any]:
    entries = {}
    for entry in result.configs:
        data = plain(entry)
        data["documentation"] = bool(data["documentation"]) if documentation else data["documentation"]
        entries[entry.name] = data
    return entries


def normal_broker_config(entry: dict[str, Any]) -> dict[str, Any]:
    """What legitimately differs in a broker config: addresses, directories, Kafka's controller listener, and
    min.insync.replicas set as a cluster default by Kafka's storage tool."""

    def value(name: str, text: str | None) -> str | None:
        if text is None:
            return None
        if name in ("listeners", "advertised.listeners"):
            kept = [item for item in text.split(",") if not item.startswith("CONTROLLER://")]
            return ",".join(item.split("://")[0] + "://<address>" for item in kept)
        if name in ("log.dirs", "log.dir"):
            return "<directory>"
        return text

    entry = dict(entry, value=value(entry["name"], entry["value"]))
    entry["synonyms"] = [
        dict(s, value=value(s["name"], s["value"]))
        for s in entry["synonyms"]
        if s["source"] != DYNAMIC_DEFAULT_BROKER_CONFIG
    ]
    if entry["config_source"] == DYNAMIC_DEFAULT_BROKER_CONFIG:
        entry["config_source"] = entry["synonyms"][0]["source"]
    return entry


def test_describe_broker_configs(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    for documentation in (False, True):
        kafka_result, our_result = describe(ask, BROKER_RESOURCE, ("1", "1"), documentation)
        assert (kafka_result.error_code, our_result.error_code) == (0, 0)
        kafka, ours = config_map(kafka_result, documentation), config_map(our_result, documentation)
        assert set(ours) == set(BROKER_KEYS) and set(ours) < set(kafka)  # Kafka has ~340 (UNSUPPORTED.md)
        # Kafka can change these at run time; kbroker all but listeners (a restart: UNSUPPORTED.md).
        dynamic_in_kafka = {name for name in ours if not kafka[name]["read_only"]}
        assert dynamic_in_kafka == {
            "message.max.bytes",
            "log.segment.bytes",
            "log.roll.ms",
            "log.retention.ms",
            "log.retention.bytes",
            "log.index.interval.bytes",
            "log.flush.interval.messages",
            "log.flush.interval.ms",
            "log.message.timestamp.type",
            "log.message.timestamp.before.max.ms",
            "log.message.timestamp.after.max.ms",
            "log.cleanup.policy",
            "min.insync.replicas",
            "compression.type",
            "max.decompressed.message.bytes",
            "listeners",
            # The log cleaner's (Kafka reconfigures its cleaner threads at run time).
            "log.cleaner.backoff.ms",
            "log.cleaner.dedupe.buffer.size",
            "log.cleaner.delete.retention.ms",
            "log.cleaner.io.buffer.load.factor",
            "log.cleaner.io.buffer.size",
            "log.cleaner.io.max.bytes.per.second",
            "log.cleaner.max.compaction.lag.ms",
            "log.cleaner.min.cleanable.ratio",
            "log.cleaner.min.compaction.lag.ms",
            "log.cleaner.threads",
        }
        assert {name for name, entry in ours.items() if not entry["read_only"]} == dynamic_in_kafka - {"listeners"}
        differences = {
            name: (normal_broker_config(kafka[name]), normal_broker_config(ours[name]))
            for name in ours
            if normal_broker_config(dict(kafka[name], read_only=kafka[name]["read_only"] or name == "listeners"))
            != normal_broker_config(ours[name])
        }
        assert differences == {}
        # Kafka's default listener is every interface, kbroker's the loopback one (UNSUPPORTED.md).
        assert (kafka["listeners"]["synonyms"][1]["value"], ours["listeners"]["synonyms"][1]["value"]) == (
            "PLAINTEXT://:9092",
            "PLAINTEXT://127.0.0.1:9092",
        )


def test_describe_topic_configs(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    name = unique("configs")
    create(ask, name, **{"retention.ms": "3600000", "cleanup.policy": "compact,delete", "max.message.bytes": "2000"})
    for documentation in (False, True):
        kafka_result, our_result = describe(ask, TOPIC_RESOURCE, (name, name), documentation)
        kafka, ours = config_map(kafka_result, documentation), config_map(our_result, documentation)
        assert set(ours) == set(kafka) == set(TOPIC_CONFIG_KEYS)
        normal = {key: normal_broker_config(entry) for key, entry in kafka.items()}
        assert ours == normal
    assert (ours["retention.ms"]["value"], ours["retention.ms"]["config_source"]) == ("3600000", 1)
    assert ours["max.message.bytes"]["synonyms"] == [
        {"name": "max.message.bytes", "value": "2000", "source": 1},
        {"name": "message.max.bytes", "value": "1048588", "source": 5},
    ]


def test_describe_configs_of_what_is_not_there(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    resources = [
        DescribeConfigsRequest.DescribeConfigsResource(resource_type=TOPIC_RESOURCE, resource_name=unique("none")),
        DescribeConfigsRequest.DescribeConfigsResource(resource_type=BROKER_RESOURCE, resource_name="7"),
        DescribeConfigsRequest.DescribeConfigsResource(resource_type=TOPIC_RESOURCE, resource_name="bad name!"),
    ]
    for version in (1, 4):
        kafka, ours = ask(DescribeConfigsRequest(resources=resources, include_synonyms=False), version)
        codes = [(r.error_code, r.resource_type, r.resource_name, r.configs) for r in kafka.results]
        assert [(r.error_code, r.resource_type, r.resource_name, r.configs) for r in ours.results] == codes
        assert [code for code, *_ in codes] == [
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.INVALID_REQUEST,
            ErrorCode.INVALID_TOPIC_EXCEPTION,
        ]


# --- DescribeCluster --------------------------------------------------------------------------------------


def test_describe_cluster(
    ask: Callable[[Any, int], tuple[Any, Any]], kbroker: RunningBroker, apache_kafka: ApacheKafka
) -> None:
    for version in range(3):
        for operations in (False, True):
            request = DescribeClusterRequest(include_cluster_authorized_operations=operations)
            kafka, ours = ask(request, version)
            answers = []
            for answer, port in ((kafka, apache_kafka.port), (ours, kbroker.broker.advertised.port)):
                data = plain(answer)
                assert len(data["cluster_id"]) == 22 and [b["port"] for b in data["brokers"]] == [port]
                data["cluster_id"] = "cluster"
                data["brokers"][0]["port"] = "port"
                answers.append(data)
            assert answers[1] == answers[0], (version, operations)
    assert [b.broker_id for b in kafka.brokers] == [kafka.controller_id] == [1]
    # Controller endpoints (endpoint_type 2) are asked of controllers only; other types do not exist.
    for endpoint_type, code in ((2, ErrorCode.MISMATCHED_ENDPOINT_TYPE), (0, ErrorCode.UNSUPPORTED_ENDPOINT_TYPE)):
        kafka, ours = ask(DescribeClusterRequest(endpoint_type=endpoint_type), 1)
        assert plain(ours) == plain(kafka)
        assert kafka.error_code == code


# --- bad input: the same error codes ----------------------------------------------------------------------


def test_create_topics_refusals(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    existing = unique("exists")
    create(ask, existing)
    config = CreateTopicsRequest.CreatableTopicConfig
    cases = {
        unique("factor"): dict(replication_factor=3),
        unique("zero"): dict(num_partitions=0),
        unique("negative-factor"): dict(replication_factor=-2),
        unique("unknown-config"): dict(configs=[config(name="no.such.config", value="1")]),
        unique("bad-number"): dict(configs=[config(name="retention.ms", value="soon")]),
        unique("bad-choice"): dict(configs=[config(name="cleanup.policy", value="shred")]),
        unique("null-value"): dict(configs=[config(name="retention.ms", value=None)]),
        unique("too-small"): dict(configs=[config(name="segment.bytes", value="10")]),
        unique("bad-level"): dict(configs=[config(name="compression.gzip.level", value="12")]),
        "bad name!": {},
        "x" * 250: {},
        existing: {},
    }
    topics = [
        CreateTopicsRequest.CreatableTopic(
            name=name,
            num_partitions=case.get("num_partitions", 1),
            replication_factor=case.get("replication_factor", 1),
            configs=case.get("configs", []),
        )
        for name, case in cases.items()
    ]
    for validate_only in (True, False):
        kafka, ours = ask(CreateTopicsRequest(topics=topics, timeout_ms=10_000, validate_only=validate_only), 7)
        kafka_codes = {t.name: t.error_code for t in kafka.topics}
        assert {t.name: t.error_code for t in ours.topics} == kafka_codes
        assert sorted(set(kafka_codes.values())) == [
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            ErrorCode.TOPIC_ALREADY_EXISTS,
            ErrorCode.INVALID_PARTITIONS,
            ErrorCode.INVALID_REPLICATION_FACTOR,
            ErrorCode.INVALID_CONFIG,
        ]


def test_produce_refusals(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    name = unique("refusals")
    create(ask, name, partitions=1, **{"max.message.bytes": "2000"})
    now = int(time.time() * 1000)
    good = build_batch([Record(value=b"ok")], base_timestamp=now)
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF  # a record byte: the CRC no longer matches
    cases = {
        "bad CRC": (name, 0, bytes(corrupt)),
        "too large": (name, 0, build_batch([Record(value=b"x" * 5000)], base_timestamp=now)),
        "unknown partition": (name, 5, good),
        "unknown topic": (unique("unknown"), 0, good),
        "two hours ahead": (name, 0, build_batch([Record(value=b"late")], base_timestamp=now + 7_200_000)),
        "garbage": (name, 0, b"\x00" * 70),
    }
    outcome = {}
    for label, (topic, partition, batch) in cases.items():
        kafka, ours = produce_errors(ask, topic, {partition: batch})
        assert ours == kafka, label
        outcome[label] = kafka[partition]
    assert outcome == {
        "bad CRC": ErrorCode.CORRUPT_MESSAGE,
        "too large": ErrorCode.MESSAGE_TOO_LARGE,
        "unknown partition": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        "unknown topic": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        "two hours ahead": ErrorCode.INVALID_TIMESTAMP,
        "garbage": ErrorCode.CORRUPT_MESSAGE,
    }


# --- OffsetForLeaderEpoch ---------------------------------------------------------------------------------


def test_offset_for_leader_epoch(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    from protocol.messages.offset_for_leader_epoch_request import OffsetForLeaderEpochRequest

    name = unique("epochs")
    create(ask, name, partitions=2)
    batch = build_batch([Record(offset_delta=i, value=b"e") for i in range(4)], base_timestamp=int(time.time() * 1000))
    assert produce_errors(ask, name, {0: batch}) == [{0: 0}, {0: 0}]
    # (current_leader_epoch, leader_epoch) on the written partition 0, the empty partition 1 and an unknown one.
    cases = [(-1, 0), (0, 0), (-1, 1), (-1, -1), (1, 0), (0, 7)]
    for version in (2, 3, 4):
        for current, wanted in cases:
            part = OffsetForLeaderEpochRequest.OffsetForLeaderPartition
            partitions = [part(partition=p, current_leader_epoch=current, leader_epoch=wanted) for p in (0, 1, 5)]
            request = OffsetForLeaderEpochRequest(
                replica_id=-1,
                topics=[
                    OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=name, partitions=partitions),
                    OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
                        topic=unique("nowhere"), partitions=partitions[:1]
                    ),
                ],
            )
            kafka, ours = ask(request, version)
            for answer in (kafka, ours):  # Kafka's topics and partitions follow hash maps
                answer.topics.sort(key=lambda t: t.topic)
                for topic in answer.topics:
                    topic.partitions.sort(key=lambda p: p.partition)
            assert plain(ours) == plain(kafka), (version, current, wanted)
    # What Kafka answered, spelled out: epoch 0 ends at the log end of each partition.
    request = OffsetForLeaderEpochRequest(
        replica_id=-1,
        topics=[
            OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
                topic=name,
                partitions=[
                    OffsetForLeaderEpochRequest.OffsetForLeaderPartition(partition=p, current_leader_epoch=-1)
                    for p in (0, 1)
                ],
            )
        ],
    )
    for answer in ask(request, 4):
        rows = sorted((p.partition, p.error_code, p.leader_epoch, p.end_offset) for p in answer.topics[0].partitions)
        assert rows == [(0, 0, 0, 4), (1, 0, 0, 0)]


# --- Produce: record timestamps -------------------------------------------------------------------------


def test_record_timestamps_out_of_the_window(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    import re

    name = unique("timestamps")
    create(ask, name, **{"message.timestamp.before.max.ms": "3600000", "message.timestamp.after.max.ms": "3600000"})
    now = int(time.time() * 1000)
    hour = 3_600_000
    shapes = {
        "second record too old": ([0, -2 * hour, 0], now),
        "third record too new": ([0, 0, 2 * hour], now),
        "all too old": ([0, 0], now - 2 * hour),
        "in the window": ([0, 1], now),
    }
    for label, (deltas, base) in shapes.items():
        records = [Record(offset_delta=i, timestamp_delta=d, value=b"t") for i, d in enumerate(deltas)]
        request = produce_request(name, {0: build_batch(records, base_timestamp=base)})
        answers = []
        for answer in ask(request, 11):
            part = answer.responses[0].partition_responses[0]
            # Each broker's window is around its own clock: compare the rest of the text.
            errors = [
                (e.batch_index, re.sub(r"\[\d+, \d+\]", "[...]", e.batch_index_error_message or ""))
                for e in part.record_errors
            ]
            answers.append((part.error_code, part.error_message, errors))
        kafka, ours = answers
        assert ours == kafka, label
    kafka_code, _, kafka_errors = kafka
    assert (kafka_code, kafka_errors) == (0, [])


# --- DescribeProducers ------------------------------------------------------------------------------------


def test_describe_producers(
    ask: Callable[[Any, int], tuple[Any, Any]], kbroker: RunningBroker, apache_kafka: ApacheKafka
) -> None:
    from protocol.messages.describe_producers_request import DescribeProducersRequest
    from protocol.messages.init_producer_id_request import InitProducerIdRequest

    name = unique("producers")
    create(ask, name, partitions=2)
    now = int(time.time() * 1000)
    producer_ids = []
    for bootstrap in (apache_kafka.bootstrap, kbroker.bootstrap):  # each broker's own idempotent producer
        with WireClient(bootstrap) as client:
            init = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000)
            deadline = time.monotonic() + 15
            while (answer := client.request(init, 4)).error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                assert time.monotonic() < deadline, "Kafka's producer ids never became available"
                time.sleep(0.2)  # Kafka hands out producer ids a moment after it starts
            producer_id = answer.producer_id
            assert (answer.error_code, producer_id >= 0) == (ErrorCode.NONE, True)
            producer_ids.append(producer_id)
            for sequence in (0, 3):  # two batches of three records
                records = [Record(offset_delta=i, value=b"p") for i in range(3)]
                batch = build_batch(
                    records, base_timestamp=now, producer_id=producer_id, producer_epoch=0, base_sequence=sequence
                )
                answer = client.request(produce_request(name, {0: batch}), 9)
                assert answer.responses[0].partition_responses[0].error_code == ErrorCode.NONE
    request = DescribeProducersRequest(
        topics=[
            DescribeProducersRequest.TopicRequest(name=name, partition_indexes=[0, 1, 7]),
            DescribeProducersRequest.TopicRequest(name=unique("nowhere"), partition_indexes=[0]),
        ]
    )
    normalised = []
    for answer, producer_id in zip(ask(request, 0), producer_ids, strict=True):
        data = plain(answer)
        data["topics"].sort(key=lambda t: t["name"] != name)
        for topic in data["topics"]:
            topic["partitions"].sort(key=lambda p: p["partition_index"])
            for partition in topic["partitions"]:
                for state in partition["active_producers"]:
                    assert state["producer_id"] == producer_id
                    assert now <= state["last_timestamp"] <= now + 60_000
                    state["producer_id"] = state["last_timestamp"] = "normalised"
        normalised.append(data)
    kafka, ours = normalised
    assert json.dumps(ours, indent=1) == json.dumps(kafka, indent=1)
    first = kafka["topics"][0]["partitions"]
    assert [(p["partition_index"], p["error_code"], len(p["active_producers"])) for p in first] == [
        (0, 0, 1),
        (1, 0, 0),
        (7, 3, 0),
    ]
    assert first[0]["active_producers"][0] == {
        "producer_id": "normalised",
        "producer_epoch": 0,
        "last_sequence": 5,
        "last_timestamp": "normalised",
        "coordinator_epoch": -1,
        "current_txn_start_offset": -1,
    }


def test_fetch_checks_the_current_leader_epoch(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    from protocol.messages.fetch_request import FetchRequest

    name = unique("fetch-epoch")
    create(ask, name, partitions=1)
    batch = build_batch([Record(offset_delta=i, value=b"f") for i in range(3)], base_timestamp=int(time.time() * 1000))
    assert produce_errors(ask, name, {0: batch}) == [{0: 0}, {0: 0}]
    outcome = {}
    for current in (-1, 0, 1, 9):
        part = FetchRequest.FetchPartition(
            partition=0, current_leader_epoch=current, fetch_offset=0, partition_max_bytes=1 << 20
        )
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=[FetchRequest.FetchTopic(topic=name, partitions=[part])],
            forgotten_topics_data=[],
        )
        for version in (9, 12):
            kafka, ours = ask(request, version)
            answers = [a.responses[0].partitions[0] for a in (kafka, ours)]
            seen = [(a.error_code, a.high_watermark, len(a.records or b"") > 0) for a in answers]
            assert seen[0] == seen[1], (current, version)
            outcome[current] = seen[0]
    # A fetcher that knows a newer epoch than the broker's is told UNKNOWN_LEADER_EPOCH, without offsets.
    assert outcome == {
        -1: (ErrorCode.NONE, 3, True),
        0: (ErrorCode.NONE, 3, True),
        1: (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, False),
        9: (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, False),
    }


# --- DeleteGroups -----------------------------------------------------------------------------------------


def test_delete_groups_v3_answers_as_kafka(ask: Callable[[Any, int], tuple[Any, Any]]) -> None:
    name, group, missing = unique("deleted"), unique("offsets-only"), unique("missing")
    create(ask, name)
    partition = OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=0)
    commit = OffsetCommitRequest(
        group_id=group, topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name=name, partitions=[partition])]
    )
    deadline = time.monotonic() + 30
    while True:  # Kafka creates __consumer_offsets on the first FindCoordinator, then loads it
        ask(FindCoordinatorRequest(key_type=0, coordinator_keys=[group]), 4)
        codes = [answer.topics[0].partitions[0].error_code for answer in ask(commit, 9)]
        if codes[0] not in (
            ErrorCode.NOT_COORDINATOR,
            ErrorCode.COORDINATOR_NOT_AVAILABLE,
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ):
            break
        assert time.monotonic() < deadline, codes
        time.sleep(0.2)
    assert codes == [ErrorCode.NONE, ErrorCode.NONE]
    for version in (2, 3):
        # The first pass deletes the group of committed offsets; the second finds neither group.
        kafka, ours = ask(DeleteGroupsRequest(groups_names=[group, missing]), version)
        assert plain(ours) == plain(kafka)
    # Kafka 4.4 answers groups that do not exist in the order of a HashMap of their ids (the names are random).
    assert sorted((r.group_id, r.error_code, r.error_message) for r in ours.results) == sorted(
        [(group, ErrorCode.GROUP_ID_NOT_FOUND, None), (missing, ErrorCode.GROUP_ID_NOT_FOUND, None)]
    )
