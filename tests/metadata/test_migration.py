"""A data directory an older kbroker wrote (topics in topics.json; tests/fixtures/topics-json-datadir, written by
tools/capture_topics_json_datadir.py running that kbroker) is moved onto the metadata log once, at the first
start: every topic keeps its id, partitions, configs and records; a topics.json that disagrees with the metadata
log stops start-up with one line and changes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from kbroker.durable.files import read_checked_json, write_checked_json
from kbroker.metadata.image import ConfigResourceType
from kbroker.metadata.log import MetadataLog
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.describe_configs_request import DescribeConfigsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.metadata_records.config_record import ConfigRecord
from protocol.metadata_records.topic_record import TopicRecord
from protocol.records import decode_records, iter_batches

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "topics-json-datadir"
EXPECTED: dict[str, Any] = json.loads((FIXTURE / "expected.json").read_text())
DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs config_source of a topic's own override


def older_data_dir(tmp_path: Path) -> Path:
    data_dir = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data_dir)
    return data_dir


def topics_seen(client: WireClient) -> dict[str, tuple[uuid.UUID, int, list[int]]]:
    """name -> (topic id, partition count, the leader epochs)."""
    answer = client.request(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12)
    return {
        t.name: (t.topic_id, len(t.partitions), sorted({p.leader_epoch for p in t.partitions})) for t in answer.topics
    }


def overrides(client: WireClient, name: str) -> dict[str, str | None]:
    resource = DescribeConfigsRequest.DescribeConfigsResource(
        resource_type=2, resource_name=name, configuration_keys=None
    )
    [result] = client.request(DescribeConfigsRequest(resources=[resource]), 4).results
    assert result.error_code == ErrorCode.NONE
    return {c.name: c.value for c in result.configs if c.config_source == DYNAMIC_TOPIC_CONFIG}


def records(client: WireClient, name: str, partitions: int) -> dict[str, list[list[str]]]:
    fetched = [
        FetchRequest.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20) for p in range(partitions)
    ]
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 22,
        topics=[FetchRequest.FetchTopic(topic=name, partitions=fetched)],
    )
    found: dict[str, list[list[str]]] = {}
    for part in client.request(request, 11).responses[0].partitions:
        assert part.error_code == ErrorCode.NONE
        values = [
            [bytes(r.key or b"").decode(), bytes(r.value or b"").decode()]
            for _, view in iter_batches(bytes(part.records or b""))
            for r in decode_records(view)
        ]
        if values:
            found[str(part.partition_index)] = values
    return found


def assert_everything_kept(client: WireClient) -> None:
    seen = topics_seen(client)
    assert {name: (uuid.UUID(t["id"]), t["partitions"], [0]) for name, t in EXPECTED.items()} == seen
    for name, topic in EXPECTED.items():
        assert overrides(client, name) == topic["configs"]
        assert records(client, name, topic["partitions"]) == topic["records"]


def test_topics_ids_configs_and_records_survive_the_move_to_the_metadata_log(tmp_path: Path) -> None:
    data_dir = older_data_dir(tmp_path)
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        assert_everything_kept(client)
    assert not (data_dir / "topics.json").exists()
    assert (data_dir / "topics.json.migrated").read_bytes() == (FIXTURE / "data" / "topics.json").read_bytes()
    # The topics are records of the metadata log now, with their ids and configs.
    with MetadataLog(data_dir) as metadata_log:
        written = [record.message for record in metadata_log.replay().records()]
    assert {(r.name, str(r.topic_id)) for r in written if isinstance(r, TopicRecord)} == {
        (name, topic["id"]) for name, topic in EXPECTED.items()
    }
    assert {
        (r.resource_name, r.name, r.value)
        for r in written
        if isinstance(r, ConfigRecord) and r.resource_type == ConfigResourceType.TOPIC
    } == {(name, key, value) for name, topic in EXPECTED.items() for key, value in topic["configs"].items()}
    # Started again, nothing is migrated twice and nothing is lost.
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        assert_everything_kept(client)
    with MetadataLog(data_dir) as metadata_log:
        again = [
            record.message for record in metadata_log.replay().records() if isinstance(record.message, TopicRecord)
        ]
    assert len(again) == len(EXPECTED)


def test_a_topics_json_left_beside_the_metadata_log_with_the_same_topics_is_only_set_aside(tmp_path: Path) -> None:
    """A stop between the migration's commit and the rename of topics.json: the next start only renames it."""
    data_dir = older_data_dir(tmp_path)
    with RunningBroker(data_dir):
        pass
    (data_dir / "topics.json.migrated").rename(data_dir / "topics.json")
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        assert_everything_kept(client)
    assert not (data_dir / "topics.json").exists()


def test_a_topics_json_naming_another_topic_id_stops_start_up_with_one_line(tmp_path: Path) -> None:
    data_dir = older_data_dir(tmp_path)
    with RunningBroker(data_dir):
        pass
    topics = data_dir / "topics.json"
    original = EXPECTED["orders"]["id"]
    other = "00000000-0000-0000-0000-000000000009"
    # The file's checksum covers its topics: written as the older kbroker would have.
    _, document = read_checked_json(data_dir / "topics.json.migrated", "topics", (2,))
    document["topics"]["orders"]["id"] = other
    write_checked_json(topics, "topics", 2, document)
    before = {p.relative_to(data_dir): p.read_bytes() for p in data_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    command = [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in result.stderr and result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line == (
        f"kbroker: {topics}: topic 'orders' is {other} there but {original} in the metadata log; move {topics} out "
        "of the data directory if the metadata log is right"
    )
    partitions_after = {
        p.relative_to(data_dir): p.read_bytes()
        for p in data_dir.rglob("*")
        if p.is_file() and p.name != ".lock" and "__cluster_metadata" not in str(p)
    }
    assert partitions_after == {k: v for k, v in before.items() if "__cluster_metadata" not in str(k)}
