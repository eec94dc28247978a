"""The single-node admin APIs sent to kbroker and to Apache Kafka 4.4 (one KRaft node, id 1 on both), answers
compared: DescribeLogDirs (sizes of the same produced batches), AlterReplicaLogDirs, ElectLeaders,
AlterPartitionReassignments, ListPartitionReassignments, DescribeQuorum, UpdateFeatures (with what ApiVersions
then reports) and ListConfigResources.

Where the brokers differ by design the comparison leaves it out and says why: each names its own data directory;
Kafka's metadata log has its own offsets and its voter a controller listener (kbroker/UNSUPPORTED.md); Kafka
has internal topics (__consumer_offsets) that kbroker keeps elsewhere, so lists of every topic are cut to the
test's own; DescribeLogDirs partitions and AlterReplicaLogDirs results come in Kafka's hash-map order, compared
sorted. Kafka's brokers learn a feature change from its controller a moment after UpdateFeatures answers, so
ApiVersions is asked until it shows the change (kbroker shows it at once).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.alter_partition_reassignments_request import AlterPartitionReassignmentsRequest
from protocol.messages.alter_replica_log_dirs_request import AlterReplicaLogDirsRequest
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.describe_log_dirs_request import DescribeLogDirsRequest
from protocol.messages.describe_quorum_request import DescribeQuorumRequest
from protocol.messages.elect_leaders_request import ElectLeadersRequest
from protocol.messages.list_config_resources_request import ListConfigResourcesRequest
from protocol.messages.list_partition_reassignments_request import ListPartitionReassignmentsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.messages.update_features_request import UpdateFeaturesRequest
from protocol.records import Record, build_batch
from tests.broker.test_single_node_admin import quorum_rows
from tests.kafka.test_transactions_kafka import brokers, create_topic  # noqa: F401 (brokers is a fixture)

NODE = 1  # both brokers' node.id
TV = "transaction.version"
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3
RETRIABLE_PRODUCE = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}


def _produce(client: WireClient, topic: str, partition: int, batch: bytes) -> None:
    data = ProduceRequest.PartitionProduceData(index=partition, records=batch)
    request = ProduceRequest(
        acks=-1, timeout_ms=10_000, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[data])]
    )
    deadline = time.monotonic() + 30
    while (code := client.request(request, 9).responses[0].partition_responses[0].error_code) in RETRIABLE_PRODUCE:
        assert time.monotonic() < deadline, code  # Kafka's replica becomes leader a moment after Metadata says so
        time.sleep(0.1)
    assert code == ErrorCode.NONE


def _log_dir_topics(answer: Any, names: set[str]) -> list[Any]:
    (result,) = answer.results
    return sorted(
        (t.name, sorted((p.partition_index, p.partition_size, p.offset_lag, p.is_future_key) for p in t.partitions))
        for t in result.topics
        if t.name in names
    )


def _log_dirs_scenario(client: WireClient, run: str) -> dict[str, Any]:
    topic, missing = f"dirs-{run}", f"missing-{run}"
    create_topic(client, topic)
    batch = build_batch([Record(offset_delta=i, key=b"k%d" % i, value=b"v" * 50) for i in range(5)])
    _produce(client, topic, 0, batch)
    _produce(client, topic, 0, batch)
    _produce(client, topic, 1, batch)
    Wanted = DescribeLogDirsRequest.DescribableLogDirTopic
    some = [Wanted(topic=topic, partitions=[1, 7, 0, 1]), Wanted(topic=missing, partitions=[0])]
    seen: dict[str, Any] = {}
    for version in (1, 2, 3, 4, 5):
        answer = client.request(DescribeLogDirsRequest(topics=some), version)
        (result,) = answer.results
        seen[f"describe v{version}"] = (
            answer.error_code,
            result.error_code,
            result.log_dir.startswith("/"),
            _log_dir_topics(answer, {topic, missing}),
            (result.total_bytes > 0, result.usable_bytes > 0)
            if version >= 4
            else (result.total_bytes, result.usable_bytes),
            result.is_cordoned,
        )
    every = client.request(DescribeLogDirsRequest(topics=None), 4)
    seen["describe all"] = _log_dir_topics(every, {topic, missing})
    seen["describe none"] = _log_dir_topics(client.request(DescribeLogDirsRequest(topics=[]), 4), {topic})
    ours = every.results[0].log_dir

    def alter(moves: list[tuple[str, str, list[int]]]) -> list[Any]:
        Dir, Topic = AlterReplicaLogDirsRequest.AlterReplicaLogDir, AlterReplicaLogDirsRequest.AlterReplicaLogDirTopic
        request = AlterReplicaLogDirsRequest(
            dirs=[Dir(path=path, topics=[Topic(name=name, partitions=parts)]) for path, name, parts in moves]
        )
        answer = client.request(request, 2)
        return sorted(
            (t.topic_name == topic, sorted((p.partition_index, p.error_code) for p in t.partitions))
            for t in answer.results
        )

    seen["alter same dir"] = alter([(ours, topic, [0, 1, 7, 0]), (ours, missing, [0])])
    seen["alter other dir"] = alter([(f"/nowhere-{run}", topic, [0]), (f"/nowhere-{run}", missing, [0])])
    seen["alter trailing slash"] = alter([(ours + "/", topic, [0])])
    seen["alter split"] = alter([(ours, topic, [0]), ("relative", topic, [1])])
    return seen


def test_log_dirs(brokers: dict[str, str]) -> None:  # noqa: F811
    run = uuid.uuid4().hex[:8]
    seen = {}
    for name, bootstrap in brokers.items():
        with WireClient(bootstrap) as client:
            seen[name] = _log_dirs_scenario(client, run)
    assert seen["kbroker"] == seen["kafka"]
    assert seen["kafka"]["alter other dir"] == [
        (False, [(0, ErrorCode.LOG_DIR_NOT_FOUND)]),
        (True, [(0, ErrorCode.LOG_DIR_NOT_FOUND)]),
    ]


def _replicas_scenario(client: WireClient, run: str) -> dict[str, Any]:
    topic, missing = f"replicas-{run}", f"missing-{run}"
    create_topic(client, topic)
    seen: dict[str, Any] = {}

    def elect(
        election_type: int, topics: dict[str, list[int]] | None, version: int = 2, timeout_ms: int = 30_000
    ) -> Any:
        wanted = (
            None
            if topics is None
            else [ElectLeadersRequest.TopicPartitions(topic=t, partitions=p) for t, p in topics.items()]
        )
        request = ElectLeadersRequest(election_type=election_type, topic_partitions=wanted, timeout_ms=timeout_ms)
        answer = client.request(request, version)
        results = [
            (r.topic, [(p.partition_id, p.error_code, p.error_message) for p in r.partition_result])
            for r in answer.replica_election_results
            if topics is not None or r.topic == topic
        ]
        everything_empty = all(not r.partition_result for r in answer.replica_election_results)
        return answer.error_code, results, everything_empty

    asked = {topic: [0, 1, 7], missing: [0]}
    for election_type, version in ((0, 0), (0, 1), (1, 1), (0, 2), (1, 2), (2, 2)):
        seen[f"elect type {election_type} v{version}"] = elect(election_type, asked, version)
    seen["elect all"] = elect(0, None)
    seen["elect all unclean"] = elect(1, None)
    seen["elect all unknown type"] = elect(2, None)
    seen["elect empty"] = elect(2, {}, timeout_ms=0)
    seen["elect timed out"] = elect(0, {topic: [0]}, timeout_ms=0)
    seen["elect timed out all"] = elect(0, None, timeout_ms=0)

    def reassign(parts: dict[str, list[tuple[int, list[int] | None]]], version: int = 1, **kwargs: Any) -> Any:
        Topic = AlterPartitionReassignmentsRequest.ReassignableTopic
        Partition = AlterPartitionReassignmentsRequest.ReassignablePartition
        request = AlterPartitionReassignmentsRequest(
            timeout_ms=kwargs.get("timeout_ms", 30_000),
            allow_replication_factor_change=kwargs.get("allow", True),
            topics=[
                Topic(name=name, partitions=[Partition(partition_index=i, replicas=r) for i, r in ps])
                for name, ps in parts.items()
            ],
        )
        answer = client.request(request, version)
        return (
            answer.error_code,
            answer.error_message,
            answer.allow_replication_factor_change,
            [
                (t.name, [(p.partition_index, p.error_code, p.error_message) for p in t.partitions])
                for t in answer.responses
            ],
        )

    for replicas in ([NODE], None, [], [99], [NODE, 99], [NODE, NODE], [99, NODE, NODE], [99, 99], [-5]):
        for version in (0, 1):
            seen[f"reassign {replicas} v{version}"] = reassign({topic: [(0, replicas)]}, version)
    seen["reassign unknown"] = reassign({topic: [(7, [NODE]), (-1, None)], missing: [(0, [NODE])]})
    seen["reassign repeated"] = reassign({topic: [(0, None), (0, [NODE]), (1, [NODE])]})
    seen["reassign no rf change"] = reassign({topic: [(0, [NODE, 99])]}, allow=False)
    seen["reassign timed out"] = reassign({topic: [(0, [NODE])]}, timeout_ms=0)
    seen["reassign nothing"] = reassign({}, timeout_ms=0)
    Listed = ListPartitionReassignmentsRequest.ListPartitionReassignmentsTopics
    for label, topics in (
        ("all", None),
        ("some", [Listed(name=topic, partition_indexes=[0, 7]), Listed(name=missing, partition_indexes=[0])]),
    ):
        listed = client.request(ListPartitionReassignmentsRequest(timeout_ms=30_000, topics=topics), 0)
        seen[f"list {label}"] = (listed.error_code, listed.error_message, listed.topics)
    return seen


def test_elections_and_reassignments(brokers: dict[str, str]) -> None:  # noqa: F811
    run = uuid.uuid4().hex[:8]
    seen = {}
    for name, bootstrap in brokers.items():
        with WireClient(bootstrap) as client:
            seen[name] = _replicas_scenario(client, run)
    assert seen["kbroker"] == seen["kafka"]
    not_needed = (ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.")
    assert seen["kafka"]["elect type 1 v2"][1][0] == (
        f"replicas-{run}",
        [
            (0, *not_needed),
            (1, *not_needed),
            (7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"No such partition as replicas-{run}-7"),
        ],
    )
    assert seen["kafka"]["elect all"] == (ErrorCode.NONE, [(f"replicas-{run}", [])], True)
    assert seen["kafka"]["reassign [1] v1"] == (
        ErrorCode.NONE,
        None,
        True,
        [(f"replicas-{run}", [(0, ErrorCode.NONE, None)])],
    )


def _quorum(topics: list[tuple[str, list[int]]]) -> DescribeQuorumRequest:
    Topic, Partition = DescribeQuorumRequest.TopicData, DescribeQuorumRequest.PartitionData
    return DescribeQuorumRequest(
        topics=[Topic(topic_name=t, partitions=[Partition(partition_index=p) for p in ps]) for t, ps in topics]
    )


def _quorum_scenario(client: WireClient) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for version in (0, 1, 2):
        answer = client.request(_quorum([("__cluster_metadata", [0])]), version)
        ((topic, (partition,)),) = [(t.topic_name, t.partitions) for t in answer.topics]
        (voter,) = partition.current_voters
        seen[f"metadata v{version}"] = (
            answer.error_code,
            answer.error_message,
            topic,
            (partition.partition_index, partition.error_code, partition.error_message, partition.leader_id),
            partition.leader_epoch >= 1,
            # Offsets of the metadata log differ (UNSUPPORTED.md): its end is the high watermark on one voter.
            (voter.replica_id, voter.replica_directory_id, voter.log_end_offset == partition.high_watermark > 0),
            (voter.last_fetch_timestamp > 0, voter.last_fetch_timestamp == voter.last_caught_up_timestamp)
            if version >= 1
            else (voter.last_fetch_timestamp, voter.last_caught_up_timestamp),
            partition.observers,
            # Kafka names its controller listener, kbroker its broker listener (UNSUPPORTED.md).
            [(n.node_id, len(n.listeners)) for n in answer.nodes],
        )
    for label, asked in (
        ("other topic", [("some-topic", [0])]),
        ("other partition", [("__cluster_metadata", [1])]),
        ("two partitions", [("__cluster_metadata", [0, 1])]),
        ("two topics", [("__cluster_metadata", [0]), ("x", [])]),
        ("nothing", []),
    ):
        answer = client.request(_quorum(asked), 2)
        seen[label] = (
            answer.error_code,
            answer.error_message,
            quorum_rows(answer),
            answer.nodes,
        )
    return seen


def test_describe_quorum(brokers: dict[str, str]) -> None:  # noqa: F811
    seen = {}
    for name, bootstrap in brokers.items():
        with WireClient(bootstrap) as client:
            seen[name] = _quorum_scenario(client)
    assert seen["kbroker"] == seen["kafka"]
    assert seen["kafka"]["metadata v2"][3] == (0, ErrorCode.NONE, "", NODE)
    assert seen["kafka"]["metadata v2"][-1] == [(NODE, 1)]


def _finalized(client: WireClient) -> tuple[list[tuple[str, int, int]], int]:
    answer = client.request(ApiVersionsRequest(client_software_name="test", client_software_version="1"), 4)
    features = [(f.name, f.min_version_level, f.max_version_level) for f in answer.finalized_features if f.name == TV]
    return features, answer.finalized_features_epoch


def _finalized_at(client: WireClient, level: int) -> tuple[list[tuple[str, int, int]], int]:
    """ApiVersions' finalized transaction.version once it is ``level`` (Kafka's broker catches up with its
    controller after UpdateFeatures answers), or what it still is after 30 s."""
    deadline = time.monotonic() + 30
    while (finalized := _finalized(client))[0] != [(TV, level, level)] and time.monotonic() < deadline:
        time.sleep(0.1)
    return finalized


def _update(
    client: WireClient, updates: list[tuple[str, int, int]], version: int = 1, validate_only: bool = False
) -> Any:
    Update = UpdateFeaturesRequest.FeatureUpdateKey
    request = UpdateFeaturesRequest(
        timeout_ms=30_000,
        feature_updates=[Update(feature=f, max_version_level=level, upgrade_type=kind) for f, level, kind in updates],
        validate_only=validate_only,
    )
    answer = client.request(request, version)
    return answer.error_code, answer.error_message, [(r.feature, r.error_code, r.error_message) for r in answer.results]


def _features_scenario(client: WireClient) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    cases = {
        "same level": [(TV, 2, UPGRADE)],
        "too high": [(TV, 3, UPGRADE)],
        "downgrade as upgrade": [(TV, 1, UPGRADE)],
        "safe downgrade": [(TV, 1, SAFE_DOWNGRADE)],
        "unsafe downgrade to 0": [(TV, 0, UNSAFE_DOWNGRADE)],
        "below 0": [(TV, -1, SAFE_DOWNGRADE)],
        "upgrade type 0": [(TV, 2, 0)],
        "upgrade type 4": [(TV, 2, 4)],
        "unknown feature": [("nope.version", 1, UPGRADE)],
        "unknown feature at 0": [("nope.version", 0, SAFE_DOWNGRADE)],
        "two failing": [("nope.version", 1, UPGRADE), (TV, 5, UPGRADE)],
        "two unknown": [("a.version", 1, UPGRADE), ("b.version", 1, UPGRADE)],
        "repeated": [(TV, 2, UPGRADE), (TV, 1, SAFE_DOWNGRADE)],
        "nothing": [],
    }
    for label, updates in cases.items():
        for version in (0, 1, 2):
            seen[f"{label} v{version}"] = _update(client, updates, version, validate_only=True)
    before, epoch = _finalized(client)
    seen["before"] = before
    try:
        seen["downgrade"] = _update(client, [(TV, 1, SAFE_DOWNGRADE)])
        after, new_epoch = _finalized_at(client, 1)
        seen["after downgrade"] = (after, new_epoch > epoch)
        seen["upgrade with a downgrade type"] = _update(client, [(TV, 2, SAFE_DOWNGRADE)], validate_only=True)
    finally:
        seen["restore"] = _update(client, [(TV, 2, UPGRADE)], version=2)
    seen["restored"] = _finalized_at(client, 2)[0]
    return seen


def test_update_features(brokers: dict[str, str]) -> None:  # noqa: F811
    seen = {}
    for name, bootstrap in brokers.items():
        with WireClient(bootstrap) as client:
            seen[name] = _features_scenario(client)
    assert seen["kbroker"] == seen["kafka"]
    assert seen["kafka"]["after downgrade"] == ([(TV, 1, 1)], True)
    assert seen["kafka"]["restored"] == [(TV, 2, 2)]
    assert seen["kafka"]["two failing v1"] == (
        ErrorCode.INVALID_UPDATE_VERSION,
        "The update failed for all features since the following feature had an error: Invalid update version 5 for "
        f"feature {TV}. Local controller {NODE} only supports versions 0-2",
        [],
    )


def test_list_config_resources(brokers: dict[str, str]) -> None:  # noqa: F811
    run = uuid.uuid4().hex[:8]
    seen: dict[str, Any] = {}
    for name, bootstrap in brokers.items():
        with WireClient(bootstrap) as client:
            topics = {f"configs-{run}", f"configs-b-{run}"}
            for topic in topics:
                create_topic(client, topic)
            answers = {}
            for label, types, version in (
                ("v0", [], 0),
                ("every type", [], 1),
                ("topics", [2, 2], 1),
                ("broker", [4], 1),
                ("broker logger", [8], 1),
                ("client metrics and groups", [16, 32], 1),
                ("unknown type", [0], 1),
                ("any type", [1], 1),
                ("acl-only type", [3], 1),
                ("no such type", [2, 99], 1),
            ):
                answer = client.request(ListConfigResourcesRequest(resource_types=types), version)
                answers[label] = (
                    answer.error_code,
                    sorted(
                        (r.resource_name, r.resource_type)
                        for r in answer.config_resources
                        if r.resource_type != 2 or r.resource_name in topics
                    ),
                )
            seen[name] = answers
    assert seen["kbroker"] == seen["kafka"]
    assert seen["kafka"]["every type"] == (
        ErrorCode.NONE,
        sorted([("1", 4), ("1", 8), (f"configs-{run}", 2), (f"configs-b-{run}", 2)]),
    )
    assert seen["kafka"]["no such type"] == (ErrorCode.UNSUPPORTED_VERSION, [])
