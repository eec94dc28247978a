"""The admin APIs a single node answers truthfully, kbroker alone: DescribeLogDirs and AlterReplicaLogDirs
(kbroker/apis/log_dirs.py), ElectLeaders and the partition reassignment APIs (kbroker/apis/replicas.py),
DescribeQuorum (kbroker/apis/quorum.py), UpdateFeatures with what ApiVersions then reports
(kbroker/apis/features.py) and ListConfigResources (kbroker/apis/config_resources.py).

The codes and messages are the ones Apache Kafka 4.3 gives for the same requests;
tests/kafka/test_single_node_admin_kafka.py sends them to both and compares.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kbroker.apis import log_dirs
from kbroker.java_hashing import java_hashmap_order, java_string_hash
from kbroker.metadata.migration import FEATURES_FILE
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.alter_partition_reassignments_request import AlterPartitionReassignmentsRequest
from protocol.messages.alter_replica_log_dirs_request import AlterReplicaLogDirsRequest
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.describe_log_dirs_request import DescribeLogDirsRequest
from protocol.messages.describe_quorum_request import DescribeQuorumRequest
from protocol.messages.elect_leaders_request import ElectLeadersRequest
from protocol.messages.list_config_resources_request import ListConfigResourcesRequest
from protocol.messages.list_partition_reassignments_request import ListPartitionReassignmentsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.messages.update_features_request import UpdateFeaturesRequest
from protocol.records import Record, build_batch

NODE = 3  # not the default node id, so an answer naming the node is seen to name this one
TOPIC_TYPE, BROKER_TYPE, BROKER_LOGGER_TYPE, CLIENT_METRICS_TYPE, GROUP_TYPE = 2, 4, 8, 16, 32
NOT_NEEDED = "Leader election not needed for topic partition."
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3
FAILED = "The update failed for all features since the following feature had an error: "


@pytest.fixture
def node(broker_factory: Callable[..., RunningBroker]) -> RunningBroker:
    return broker_factory({"node.id": str(NODE)})


def create_topic(client: WireClient, name: str, partitions: int = 2) -> None:
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1)
    assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7).topics[0].error_code == 0


def produce(client: WireClient, topic: str, partition: int, batch: bytes) -> None:
    data = ProduceRequest.PartitionProduceData(index=partition, records=batch)
    request = ProduceRequest(
        acks=-1, timeout_ms=10_000, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[data])]
    )
    assert client.request(request, 9).responses[0].partition_responses[0].error_code == ErrorCode.NONE


# --- DescribeLogDirs ---------------------------------------------------------------------------------------


def _partitions(answer: Any) -> list[tuple[str, list[tuple[int, int, int, bool]]]]:
    (result,) = answer.results
    return [
        (t.name, [(p.partition_index, p.partition_size, p.offset_lag, p.is_future_key) for p in t.partitions])
        for t in result.topics
    ]


def test_describe_log_dirs_lists_the_data_directory_with_the_segment_bytes_of_each_partition(
    node: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = build_batch([Record(offset_delta=i, value=b"v" * 100) for i in range(3)])
    monkeypatch.setattr(log_dirs, "volume_bytes", lambda path: (1_000_000, 250_000))
    with WireClient(node.bootstrap) as client:
        create_topic(client, "sized")
        create_topic(client, "other", partitions=1)
        produce(client, "sized", 0, batch)
        produce(client, "sized", 0, batch)
        answers = {version: client.request(DescribeLogDirsRequest(topics=None), version) for version in (1, 4, 5)}
    on_disk = sum(f.stat().st_size for f in (node.data_dir / "sized-0").glob("*.log"))
    assert on_disk == 2 * len(batch)
    expected = [("other", [(0, 0, 0, False)]), ("sized", [(0, 2 * len(batch), 0, False), (1, 0, 0, False)])]
    for version, answer in answers.items():
        assert answer.error_code == ErrorCode.NONE
        assert _partitions(answer) == expected, version
        (result,) = answer.results
        assert (result.error_code, result.log_dir) == (ErrorCode.NONE, os.path.abspath(node.data_dir))
        assert (result.total_bytes, result.usable_bytes) == ((-1, -1) if version < 4 else (1_000_000, 250_000))
        assert result.is_cordoned is False


def test_describe_log_dirs_leaves_out_unknown_topics_and_partitions_and_names_each_partition_once(
    node: RunningBroker,
) -> None:
    Wanted = DescribeLogDirsRequest.DescribableLogDirTopic
    with WireClient(node.bootstrap) as client:
        create_topic(client, "known")
        asked = [
            Wanted(topic="known", partitions=[1, 7, 1, -1]),
            Wanted(topic="missing", partitions=[0]),
            Wanted(topic="known", partitions=[1, 0]),
        ]
        some = client.request(DescribeLogDirsRequest(topics=asked), 4)
        none_existing = client.request(DescribeLogDirsRequest(topics=[Wanted(topic="known", partitions=[9])]), 4)
        nothing = client.request(DescribeLogDirsRequest(topics=[]), 4)
    assert _partitions(some) == [("known", [(0, 0, 0, False), (1, 0, 0, False)])]
    assert _partitions(none_existing) == []
    assert _partitions(nothing) == []


def test_the_volume_size_is_the_one_statvfs_gives() -> None:
    volume = os.statvfs("/")
    total, usable = log_dirs.volume_bytes("/")
    assert total == volume.f_blocks * volume.f_frsize
    assert 0 <= usable <= total


# --- AlterReplicaLogDirs -----------------------------------------------------------------------------------


def _alter_log_dirs(client: WireClient, moves: list[tuple[str, str, list[int]]], version: int = 2) -> Any:
    Dir, Topic = AlterReplicaLogDirsRequest.AlterReplicaLogDir, AlterReplicaLogDirsRequest.AlterReplicaLogDirTopic
    request = AlterReplicaLogDirsRequest(
        dirs=[Dir(path=path, topics=[Topic(name=topic, partitions=partitions)]) for path, topic, partitions in moves]
    )
    answer = client.request(request, version)
    return sorted(
        (t.topic_name, sorted((p.partition_index, p.error_code) for p in t.partitions)) for t in answer.results
    )


def test_alter_replica_log_dirs_has_nothing_to_move_into_the_one_directory(node: RunningBroker) -> None:
    ours = os.path.abspath(node.data_dir)
    with WireClient(node.bootstrap) as client:
        create_topic(client, "placed")
        for version in (1, 2):
            same = _alter_log_dirs(client, [(ours, "placed", [0, 1, 7, 0]), (ours, "missing", [0])], version)
            assert same == [
                ("missing", [(0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]),
                ("placed", [(0, ErrorCode.NONE), (1, ErrorCode.NONE), (7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)]),
            ]
        elsewhere = _alter_log_dirs(client, [("/elsewhere", "placed", [0]), ("/elsewhere", "missing", [0])])
        assert elsewhere == [
            ("missing", [(0, ErrorCode.LOG_DIR_NOT_FOUND)]),
            ("placed", [(0, ErrorCode.LOG_DIR_NOT_FOUND)]),
        ]
        # The path must be the one DescribeLogDirs names, exactly, as in Kafka.
        assert _alter_log_dirs(client, [(ours + "/", "placed", [0])]) == [
            ("placed", [(0, ErrorCode.LOG_DIR_NOT_FOUND)])
        ]
        split = _alter_log_dirs(client, [(ours, "placed", [0]), ("relative", "placed", [1])])
        assert split == [("placed", [(0, ErrorCode.NONE), (1, ErrorCode.LOG_DIR_NOT_FOUND)])]
        assert client.request(AlterReplicaLogDirsRequest(dirs=[]), 2).results == []


# --- ElectLeaders ------------------------------------------------------------------------------------------


def _elect(client: WireClient, election_type: int, topics: dict[str, list[int]] | None, **kwargs: Any) -> Any:
    wanted = (
        None
        if topics is None
        else [ElectLeadersRequest.TopicPartitions(topic=t, partitions=p) for t, p in topics.items()]
    )
    request = ElectLeadersRequest(
        election_type=election_type, topic_partitions=wanted, timeout_ms=kwargs.get("timeout_ms", 60_000)
    )
    answer = client.request(request, kwargs.get("version", 2))
    results = [
        (r.topic, [(p.partition_id, p.error_code, p.error_message) for p in r.partition_result])
        for r in answer.replica_election_results
    ]
    return answer.error_code, results


def test_elect_leaders_finds_no_election_needed_for_the_one_replica(node: RunningBroker) -> None:
    with WireClient(node.bootstrap) as client:
        create_topic(client, "elected")
        for election_type, version in ((0, 0), (0, 1), (1, 1), (0, 2), (1, 2)):
            answer = _elect(client, election_type, {"elected": [0, 1, 7], "missing": [0]}, version=version)
            assert answer == (
                ErrorCode.NONE,
                [
                    (
                        "elected",
                        [
                            (0, ErrorCode.ELECTION_NOT_NEEDED, NOT_NEEDED),
                            (1, ErrorCode.ELECTION_NOT_NEEDED, NOT_NEEDED),
                            (7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such partition as elected-7"),
                        ],
                    ),
                    ("missing", [(0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such topic as missing")]),
                ],
            ), (election_type, version)
        # Every partition: none needed an election, so each topic comes back with none listed.
        create_topic(client, "also-elected")
        assert _elect(client, 1, None) == (ErrorCode.NONE, [("also-elected", []), ("elected", [])])


def test_elect_leaders_refuses_an_unknown_type_and_a_passed_deadline_as_kafka_does(node: RunningBroker) -> None:
    with WireClient(node.bootstrap) as client:
        create_topic(client, "elected")
        unknown_type = (ErrorCode.INVALID_REQUEST, "Unknown election type 2")
        assert _elect(client, 2, {"elected": [0], "missing": [0]}) == (
            ErrorCode.INVALID_REQUEST,
            [("elected", [(0, *unknown_type)]), ("missing", [(0, *unknown_type)])],
        )
        assert _elect(client, 2, None) == (ErrorCode.INVALID_REQUEST, [])
        timed_out = (ErrorCode.REQUEST_TIMED_OUT, [("elected", [(0, ErrorCode.REQUEST_TIMED_OUT, None)])])
        assert _elect(client, 2, {"elected": [0]}, timeout_ms=0) == timed_out
        assert _elect(client, 0, {"elected": [0]}, timeout_ms=-1) == timed_out
        assert _elect(client, 0, None, timeout_ms=0) == (ErrorCode.REQUEST_TIMED_OUT, [])
        # An empty list is answered at once, whatever the type and timeout.
        assert _elect(client, 2, {}, timeout_ms=0) == (ErrorCode.NONE, [])


# --- AlterPartitionReassignments and ListPartitionReassignments --------------------------------------------


def _reassign(client: WireClient, topics: dict[str, list[tuple[int, list[int] | None]]], **kwargs: Any) -> Any:
    Topic, Partition = (
        AlterPartitionReassignmentsRequest.ReassignableTopic,
        AlterPartitionReassignmentsRequest.ReassignablePartition,
    )
    request = AlterPartitionReassignmentsRequest(
        timeout_ms=kwargs.get("timeout_ms", 60_000),
        allow_replication_factor_change=kwargs.get("allow", True),
        topics=[
            Topic(name=name, partitions=[Partition(partition_index=i, replicas=r) for i, r in parts])
            for name, parts in topics.items()
        ],
    )
    answer = client.request(request, kwargs.get("version", 1))
    results = [
        (t.name, [(p.partition_index, p.error_code, p.error_message) for p in t.partitions]) for t in answer.responses
    ]
    return answer.error_code, answer.error_message, answer.allow_replication_factor_change, results


def _invalid(message: str) -> tuple[int, str]:
    return ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"The manual partition assignment includes {message}"


def test_a_reassignment_to_the_one_replica_completes_and_any_other_is_refused_with_kafkas_reason(
    node: RunningBroker,
) -> None:
    cases: list[tuple[list[int] | None, tuple[int, str | None]]] = [
        ([NODE], (ErrorCode.NONE, None)),
        (None, (ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None)),
        ([], _invalid("an empty replica list.")),
        ([99], _invalid("broker 99, but no such broker is registered.")),
        ([NODE, 99], _invalid("broker 99, but no such broker is registered.")),
        ([NODE, NODE], _invalid(f"the broker {NODE} more than once.")),
        ([99, NODE, NODE], _invalid(f"the broker {NODE} more than once.")),  # replicas are checked in order
        ([-5, -5], _invalid("broker -5, but no such broker is registered.")),
    ]
    with WireClient(node.bootstrap) as client:
        create_topic(client, "moved")
        for replicas, expected in cases:
            for version in (0, 1):
                answer = _reassign(client, {"moved": [(0, replicas)]}, version=version)
                assert answer == (ErrorCode.NONE, None, True, [("moved", [(0, *expected)])]), (replicas, version)
        unknown = _reassign(client, {"moved": [(7, [NODE]), (-1, None)], "missing": [(0, [NODE])]})
        assert unknown[3] == [
            (
                "moved",
                [
                    (7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find partition moved:7."),
                    (-1, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find partition moved:-1."),
                ],
            ),
            ("missing", [(0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find a topic named missing.")]),
        ]
        assert _reassign(client, {"moved": [(0, [NODE])]}, allow=False)[2] is False  # echoed from v1
        assert _reassign(client, {"moved": [(0, [NODE])]}, timeout_ms=0) == (
            ErrorCode.REQUEST_TIMED_OUT,
            None,
            True,
            [("moved", [(0, ErrorCode.REQUEST_TIMED_OUT, None)])],
        )
        # No topics: answered at once, with an empty (not null) message, as Kafka does.
        assert _reassign(client, {}, timeout_ms=0) == (ErrorCode.NONE, "", True, [])
        Listed = ListPartitionReassignmentsRequest.ListPartitionReassignmentsTopics
        for topics in (
            None,
            [Listed(name="moved", partition_indexes=[0, 7]), Listed(name="missing", partition_indexes=[0])],
        ):
            listed = client.request(ListPartitionReassignmentsRequest(timeout_ms=60_000, topics=topics), 0)
            assert (listed.error_code, listed.error_message, listed.topics) == (ErrorCode.NONE, None, [])


# --- DescribeQuorum ----------------------------------------------------------------------------------------


def _quorum(topics: list[tuple[str, list[int]]]) -> DescribeQuorumRequest:
    Topic, Partition = DescribeQuorumRequest.TopicData, DescribeQuorumRequest.PartitionData
    return DescribeQuorumRequest(
        topics=[
            Topic(topic_name=name, partitions=[Partition(partition_index=p) for p in parts]) for name, parts in topics
        ]
    )


def test_describe_quorum_names_this_node_the_single_voter_and_leader(node: RunningBroker) -> None:
    metadata = _quorum([("__cluster_metadata", [0])])
    with WireClient(node.bootstrap) as client:
        before_ms = int(time.time() * 1000)
        answers = {version: client.request(metadata, version) for version in (0, 1, 2)}
        after_ms = int(time.time() * 1000)
        end = _finalized(client)[1] + 1  # one past the metadata image's offset
    host, port = node.bootstrap.rsplit(":", 1)
    for version, answer in answers.items():
        assert (answer.error_code, answer.error_message) == (ErrorCode.NONE, "")
        ((name, (partition,)),) = [(t.topic_name, t.partitions) for t in answer.topics]
        assert name == "__cluster_metadata"
        assert (partition.partition_index, partition.error_code, partition.error_message) == (0, ErrorCode.NONE, "")
        assert (partition.leader_id, partition.leader_epoch, partition.high_watermark, partition.observers) == (
            NODE,
            1,
            end,
            [],
        )
        (voter,) = partition.current_voters
        assert (voter.replica_id, voter.replica_directory_id, voter.log_end_offset) == (NODE, uuid.UUID(int=0), end)
        if version == 0:
            assert (voter.last_fetch_timestamp, voter.last_caught_up_timestamp) == (-1, -1)
        else:  # the leader reports the time of the answer for both, as Kafka's does
            assert before_ms <= voter.last_fetch_timestamp == voter.last_caught_up_timestamp <= after_ms
        nodes = [(n.node_id, [(li.name, li.host, li.port) for li in n.listeners]) for n in answer.nodes]
        assert nodes == ([(NODE, [("PLAINTEXT", host, int(port))])] if version == 2 else [])


def test_describe_quorum_leader_epoch_is_the_metadata_logs_one_more_at_each_start(tmp_path: Path) -> None:
    """Each start opens a new epoch of __cluster_metadata-0, as each restart of a Kafka node elects it again."""
    request = _quorum([("__cluster_metadata", [0])])
    epochs = []
    for _ in range(2):
        with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
            epochs.append(client.request(request, 2).topics[0].partitions[0].leader_epoch)
    assert epochs[1] == epochs[0] + 1 >= 2


def quorum_rows(answer: Any) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """A DescribeQuorum answer's partitions: (topic, [(partition, error, message, leader, leader epoch, high
    watermark, voters, observers)])."""
    return [
        (
            t.topic_name,
            [
                (
                    p.partition_index,
                    p.error_code,
                    p.error_message,
                    p.leader_id,
                    p.leader_epoch,
                    p.high_watermark,
                    p.current_voters,
                    p.observers,
                )
                for p in t.partitions
            ],
        )
        for t in answer.topics
    ]


def test_describe_quorum_answers_any_other_partition_as_not_hosted(node: RunningBroker) -> None:
    not_hosted = (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        "This server does not host this topic-partition.",
        0,
        0,
        0,
        [],
        [],
    )
    with WireClient(node.bootstrap) as client:
        for asked in (
            [("topic", [0])],
            [("__cluster_metadata", [1])],
            [("__cluster_metadata", [0, 1])],  # the metadata partition too, when asked with another
            [("__cluster_metadata", [0]), ("other", [])],
        ):
            answer = client.request(_quorum(asked), 2)
            assert answer.error_code == ErrorCode.NONE
            assert quorum_rows(answer) == [(name, [(p, *not_hosted) for p in parts]) for name, parts in asked]
            assert answer.nodes == []
        assert client.request(_quorum([]), 2).topics == []


# --- UpdateFeatures and ApiVersions ------------------------------------------------------------------------


def _finalized(client: WireClient) -> tuple[list[tuple[str, int, int]], int]:
    answer = client.request(ApiVersionsRequest(client_software_name="test", client_software_version="1"), 4)
    features = [(f.name, f.min_version_level, f.max_version_level) for f in answer.finalized_features]
    return features, answer.finalized_features_epoch


def _update(
    client: WireClient, updates: list[tuple[str, int, int]], version: int = 1, validate_only: bool = False
) -> Any:
    Update = UpdateFeaturesRequest.FeatureUpdateKey
    request = UpdateFeaturesRequest(
        timeout_ms=60_000,
        feature_updates=[Update(feature=f, max_version_level=level, upgrade_type=kind) for f, level, kind in updates],
        validate_only=validate_only,
    )
    answer = client.request(request, version)
    return answer.error_code, answer.error_message, [(r.feature, r.error_code, r.error_message) for r in answer.results]


def test_update_features_refuses_what_kafka_refuses_with_its_message(node: RunningBroker) -> None:
    tv = "transaction.version"
    refused = {
        (
            tv,
            3,
            UPGRADE,
        ): f"Invalid update version 3 for feature {tv}. Local controller {NODE} only supports versions 0-2",
        (tv, 1, UPGRADE): (
            f"Invalid update version 1 for feature {tv}. Can't downgrade the version of this feature without setting "
            "the upgrade type to either safe or unsafe downgrade."
        ),
        (
            tv,
            -1,
            SAFE_DOWNGRADE,
        ): f"Invalid update version -1 for feature {tv}. A feature version cannot be less than 0.",
        (
            tv,
            2,
            0,
        ): f"Invalid update version 2 for feature {tv}. The controller does not support the given upgrade type.",
        (
            tv,
            2,
            4,
        ): f"Invalid update version 2 for feature {tv}. The controller does not support the given upgrade type.",
        ("group.version", 1, UPGRADE): (
            f"Invalid update version 1 for feature group.version. Local controller {NODE} does not support this "
            "feature."
        ),
        (
            "nope.version",
            0,
            SAFE_DOWNGRADE,
        ): "Invalid update version 0 for feature nope.version. Feature nope.version not found.",
    }
    with WireClient(node.bootstrap) as client:
        for update, reason in refused.items():
            for version in (1, 2):
                assert _update(client, [update], version) == (ErrorCode.INVALID_UPDATE_VERSION, FAILED + reason, [])
        # Several failures: the first in the order a java.util.HashMap of the names iterates is named.
        both = [("nope.version", 1, UPGRADE), (tv, 5, UPGRADE)]
        assert _update(client, both)[1] == FAILED + refused[(tv, 3, UPGRADE)].replace("version 3", "version 5")
        features, epoch = _finalized(client)
        assert features == [(tv, 2, 2)]
        assert client.request(_quorum([("__cluster_metadata", [0])]), 2).topics[0].partitions[0].high_watermark == (
            epoch + 1
        )  # nothing refused was written


def test_an_update_of_transaction_version_shows_in_api_versions_and_survives_a_restart(node: RunningBroker) -> None:
    tv = "transaction.version"
    done = (ErrorCode.NONE, None, [(tv, ErrorCode.NONE, "NONE")])
    metadata = _quorum([("__cluster_metadata", [0])])
    with WireClient(node.bootstrap) as client:
        # The finalized features epoch is the offset of the metadata image, as Kafka's: the high watermark of
        # __cluster_metadata-0 is one past it, and each change written moves it on by its one record.
        features, start = _finalized(client)
        assert features == [(tv, 2, 2)]
        assert client.request(metadata, 2).topics[0].partitions[0].high_watermark == start + 1
        assert _update(client, [(tv, 2, UPGRADE)]) == done  # the level it has: nothing changes
        assert _update(client, [(tv, 0, UNSAFE_DOWNGRADE)], validate_only=True) == done
        assert _finalized(client) == ([(tv, 2, 2)], start)
        assert _update(client, [(tv, 1, SAFE_DOWNGRADE)], version=0) == (
            ErrorCode.INVALID_UPDATE_VERSION,
            FAILED + f"Invalid update version 1 for feature {tv}. Can't downgrade the version of this feature without "
            "setting the upgrade type to either safe or unsafe downgrade.",
            [],
        )  # v0 has no upgrade type: Kafka 4 takes it as an upgrade whatever allow_downgrade says
        assert _update(client, [(tv, 1, SAFE_DOWNGRADE)], version=2) == (ErrorCode.NONE, None, [])
        assert _finalized(client) == ([(tv, 1, 1)], start + 1)
        assert _update(client, [(tv, 2, SAFE_DOWNGRADE)]) == (
            ErrorCode.INVALID_UPDATE_VERSION,
            FAILED + f"Invalid update version 2 for feature {tv}. Can't downgrade to a newer version.",
            [],
        )
        assert _update(client, [(tv, 2, UPGRADE), (tv, 0, SAFE_DOWNGRADE)]) == (  # the last update of a feature counts
            ErrorCode.NONE,
            None,
            [(tv, ErrorCode.NONE, "NONE")] * 2,
        )
        assert _finalized(client) == ([], start + 2)  # level 0: no longer finalized
        assert client.request(metadata, 2).topics[0].partitions[0].high_watermark == start + 3
    node.restart()
    assert not (node.data_dir / FEATURES_FILE).exists()  # the levels are the metadata log's only
    with WireClient(node.bootstrap) as client:
        features, restarted = _finalized(client)
        assert features == [] and restarted > start + 2  # the restart registered the broker again
        assert _update(client, [(tv, 2, UPGRADE)]) == done
        assert _finalized(client) == ([(tv, 2, 2)], restarted + 1)


def test_java_hash_map_order_is_the_order_kafka_checked_feature_updates_in() -> None:
    def order(names: list[str]) -> list[str]:
        return java_hashmap_order(names, java_string_hash)

    # Pairs of unknown features sent to Kafka 4.3: the one its error message named comes first.
    assert order(["a.version", "b.version"])[0] == "b.version"
    assert order(["x", "a.version"])[0] == "a.version"
    assert order(["y", "x"])[0] == "x"
    assert order(["nope.version", "transaction.version"])[0] == "transaction.version"
    many = [f"feature-{i}" for i in range(40)]  # past the first resize: still each name once
    assert sorted(order(many)) == sorted(many)


# --- ListConfigResources -----------------------------------------------------------------------------------


def test_list_config_resources_names_the_broker_its_logger_and_every_topic(node: RunningBroker) -> None:
    def listed(types: list[int] | None, version: int = 1) -> tuple[int, list[tuple[str, int]]]:
        request = ListConfigResourcesRequest(resource_types=types or [])
        answer = client.request(request, version)
        return answer.error_code, sorted((r.resource_name, r.resource_type) for r in answer.config_resources)

    with WireClient(node.bootstrap) as client:
        create_topic(client, "configured")
        create_topic(client, "also-configured")
        topics = [("also-configured", TOPIC_TYPE), ("configured", TOPIC_TYPE)]
        broker = [(str(NODE), BROKER_TYPE), (str(NODE), BROKER_LOGGER_TYPE)]
        assert listed(None, version=0) == (ErrorCode.NONE, [])  # ListClientMetricsResources: none here
        assert listed(None) == (ErrorCode.NONE, sorted(broker + topics))
        assert listed([TOPIC_TYPE, TOPIC_TYPE]) == (ErrorCode.NONE, topics)
        assert listed([BROKER_TYPE]) == (ErrorCode.NONE, [(str(NODE), BROKER_TYPE)])
        assert listed([CLIENT_METRICS_TYPE, GROUP_TYPE]) == (ErrorCode.NONE, [])
        for not_a_config_type in (0, 1, 3, 99):
            assert listed([TOPIC_TYPE, not_a_config_type]) == (ErrorCode.UNSUPPORTED_VERSION, [])


# --- through Java's Admin client ---------------------------------------------------------------------------


def test_java_admin_client_uses_them(node: RunningBroker, java_program: Callable[..., list[str]]) -> None:
    command = java_program(Path(__file__).parent / "java" / "SingleNodeAdmin.java", "4.4.0")
    done = subprocess.run([*command, node.bootstrap, "java-admin"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    # The finalized features epoch is the metadata image's offset, one below the metadata log's high watermark;
    # each feature change written moves it on by its one record.
    start = int(seen.get("features_before", "0 epoch -2").split()[-1])
    assert seen == {
        "log_dirs": "1",
        "log_dir": os.path.abspath(node.data_dir),
        "log_dir_error": "null",
        "replica": "0 lag 0 future false",
        "volume": "true",
        "move_same_dir": "ok",
        "move_elsewhere": "LogDirNotFoundException",
        "elect_PREFERRED": "ElectionNotNeededException",
        "elect_UNCLEAN": "ElectionNotNeededException",
        "elect_all": "0",
        "reassign_same": "ok",
        "reassign_other": "InvalidReplicaAssignmentException",
        "reassign_cancel": "NoReassignmentInProgressException",
        "reassignments": "0",
        "quorum": f"leader {NODE} epoch 1 hw {start + 1} voters [{NODE}@{start + 1}] observers 0 nodes [{NODE}]",
        "features_before": f"2 epoch {start}",
        "update_unknown": "InvalidUpdateVersionException",
        "update_validate": "ok",
        "features_validated": f"2 epoch {start}",
        "downgrade": "ok",
        "features_downgraded": f"1 epoch {start + 1}",
        "upgrade": "ok",
        "features_upgraded": f"2 epoch {start + 2}",
        "config_resources": f"[BROKER:{NODE}, TOPIC:java-admin]",
    }
