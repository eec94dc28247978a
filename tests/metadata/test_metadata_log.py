"""kbroker/metadata/log.py: the local ``__cluster_metadata-0`` log, its snapshots and quorum-state, written,
reopened and replayed. That Kafka's own dump tool reads what it writes is tests/kafka/test_dump_log_kafka.py."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from kbroker.metadata.log import (
    MetadataLog,
    MetadataLogError,
    QuorumState,
    SnapshotId,
    read_snapshot_file,
)
from protocol.messages.k_raft_version_record import KRaftVersionRecord
from protocol.messages.leader_change_message import LeaderChangeMessage
from protocol.messages.voters_record import VotersRecord
from protocol.metadata_frame import MetadataRecord
from protocol.metadata_records.config_record import ConfigRecord
from protocol.metadata_records.topic_record import TopicRecord
from protocol.records import iter_batches
from tests.metadata.sample_records import sample_records


def config(i: int) -> MetadataRecord:
    return MetadataRecord(ConfigRecord(resource_type=2, resource_name="orders", name="retention.ms", value=str(i)), 0)


def opened(tmp_path: Path, **options: int) -> MetadataLog:
    log = MetadataLog(tmp_path, **options)
    if log.leader_epoch == 0:
        log.become_leader(1, node_id=1, voters=[1])
    return log


def test_records_are_appended_in_kafkas_layout_and_replayed_after_a_reopen(tmp_path: Path) -> None:
    records = sample_records()
    with opened(tmp_path) as log:
        assert log.append(records[:5], timestamp_ms=1_000) == 1  # after the LeaderChangeMessage at 0
        assert log.append(records[5:], timestamp_ms=2_000) == 6
        assert log.end_offset == 1 + len(records)
    directory = tmp_path / "__cluster_metadata-0"
    assert (directory / "00000000000000000000.log").exists()
    assert (directory / "leader-epoch-checkpoint").read_text() == "0\n1\n1 0\n"
    assert (directory / "partition.metadata").read_text() == "version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAQ\n"
    with MetadataLog(tmp_path) as log:
        assert log.leader_epoch == 1
        replay = log.replay()
    assert replay.snapshot is None and replay.end_offset == 1 + len(records)
    assert list(replay.records()) == records
    leader_change, first, second = replay.batches
    assert leader_change.is_control and (leader_change.base_offset, leader_change.leader_epoch) == (0, 1)
    assert leader_change.controls == (
        LeaderChangeMessage(
            leader_id=1,
            voters=[LeaderChangeMessage.Voter(voter_id=1)],
            granting_voters=[LeaderChangeMessage.Voter(voter_id=1)],
        ),
    )
    assert (first.base_offset, first.last_offset, first.leader_epoch, first.append_timestamp) == (1, 5, 1, 1_000)
    assert (second.base_offset, second.last_offset, second.append_timestamp) == (6, 1 + len(records) - 1, 2_000)


def test_a_new_epoch_is_written_to_quorum_state_and_opened_by_a_leader_change(tmp_path: Path) -> None:
    with opened(tmp_path) as log:
        log.append([config(0)])
        assert log.become_leader(2, node_id=1, voters=[1]) == 2
        log.append([config(1)])
        with pytest.raises(MetadataLogError, match="epoch 2 is not newer than 2"):
            log.become_leader(2, node_id=1, voters=[1])
    state = json.loads((tmp_path / "__cluster_metadata-0" / "quorum-state").read_text())
    assert state == {
        "clusterId": "",
        "leaderId": 1,
        "leaderEpoch": 2,
        "votedId": -1,
        "appliedOffset": 0,
        "currentVoters": [{"voterId": 1}],
        "data_version": 0,
    }
    with MetadataLog(tmp_path) as log:
        assert log.quorum_state() == QuorumState(1, 2, -1, 0, (1,))
        assert [(b.base_offset, b.leader_epoch, b.is_control) for b in log.replay().batches] == [
            (0, 1, True),
            (1, 1, False),
            (2, 2, True),
            (3, 2, False),
        ]
        assert (log.epoch_at(2), log.epoch_at(3), log.epoch_at(4)) == (1, 2, 2)


def test_a_snapshot_holds_the_image_and_replay_goes_on_from_it(tmp_path: Path) -> None:
    records = sample_records()
    with opened(tmp_path) as log:
        log.append(records)
        end = log.end_offset
        snapshot_id = log.write_snapshot(records, end, last_contained_timestamp=1234, timestamp_ms=5)
        assert snapshot_id == SnapshotId(end, 1)
        log.append([config(7)])
    path = tmp_path / "__cluster_metadata-0" / f"{end:020d}-0000000001.checkpoint"
    assert path.exists()
    # Kafka's layout: a header control batch, data batches with offsets from the header's, a footer batch.
    batches = [header for header, _ in iter_batches(path.read_bytes(), strict=True)]
    assert batches[0].is_control and batches[-1].is_control
    assert [b.base_offset for b in batches] == [0, 1, 1 + len(records)]
    assert {b.partition_leader_epoch for b in batches} == {1}
    with MetadataLog(tmp_path) as log:
        assert log.snapshot_ids() == [snapshot_id]
        replay = log.replay()
    assert replay.snapshot is not None
    assert replay.snapshot.header.last_contained_log_timestamp == 1234
    assert replay.snapshot.records == tuple(records)
    assert [b.base_offset for b in replay.batches] == [end]
    assert list(replay.records()) == [*records, config(7)]


def test_a_snapshot_may_carry_kraft_version_and_voters_after_its_header(tmp_path: Path) -> None:
    controls = [
        KRaftVersionRecord(k_raft_version=1),
        VotersRecord(voters=[VotersRecord.Voter(voter_id=1, voter_directory_id=uuid.UUID(int=5))]),
    ]
    with opened(tmp_path) as log:
        log.append([config(0)])
        snapshot_id = log.write_snapshot([config(0)], log.end_offset, last_contained_timestamp=0, controls=controls)
        snapshot = log.read_snapshot(snapshot_id)
    assert snapshot.controls == tuple(controls) and snapshot.records == (config(0),)


def test_a_big_image_is_cut_into_batches(tmp_path: Path) -> None:
    image = [config(i) for i in range(300)]
    with opened(tmp_path) as log:
        log.append(image)
        snapshot_id = log.write_snapshot(image, log.end_offset, last_contained_timestamp=0, max_batch_bytes=2048)
    path = tmp_path / "__cluster_metadata-0" / snapshot_id.file_name
    headers = [header for header, _ in iter_batches(path.read_bytes(), strict=True)]
    data = headers[1:-1]
    assert len(data) == 8 and all(h.size <= 2048 for h in data)  # about 38 records of about 50 bytes in each
    assert data[0].base_offset == 1 and headers[-1].base_offset == 301
    assert all(a.next_offset == b.base_offset for a, b in zip(headers, headers[1:], strict=False))
    assert read_snapshot_file(path).records == tuple(image)


def test_the_bootstrap_snapshot_before_any_record_is_0_0(tmp_path: Path) -> None:
    with MetadataLog(tmp_path) as log:
        snapshot_id = log.write_snapshot([config(0)], 0, last_contained_timestamp=0)
        assert snapshot_id.file_name == "00000000000000000000-0000000000.checkpoint"
        assert list(log.replay().records()) == [config(0)]


def test_a_snapshot_past_the_log_end_is_refused(tmp_path: Path) -> None:
    with opened(tmp_path) as log:
        with pytest.raises(MetadataLogError, match="no snapshot at 5, the log ends at 1"):
            log.write_snapshot([], 5, last_contained_timestamp=0)


def test_a_snapshot_cut_short_is_refused_with_one_line(tmp_path: Path) -> None:
    with opened(tmp_path) as log:
        log.append([config(0), config(1)])
        snapshot_id = log.write_snapshot([config(0), config(1)], log.end_offset, last_contained_timestamp=0)
    path = tmp_path / "__cluster_metadata-0" / snapshot_id.file_name
    data = path.read_bytes()
    footer = list(iter_batches(data))[-1][1]
    path.write_bytes(data[: len(data) - len(footer)])  # every batch whole, the footer missing
    with (
        MetadataLog(tmp_path) as log,
        pytest.raises(MetadataLogError, match="does not end with a SnapshotFooterRecord"),
    ):
        log.read_snapshot(snapshot_id)
    path.write_bytes(data[:-10])  # a batch cut in the middle
    with MetadataLog(tmp_path) as log:
        with pytest.raises(MetadataLogError, match=f"snapshot {path}: .*runs past the end"):
            log.read_snapshot(snapshot_id)
        # Replayed, the log still holds what it covered: it is set aside and the log replayed from its start.
        replay = log.replay()
    assert replay.snapshot is None and list(replay.records()) == [config(0), config(1)]
    assert not path.exists() and path.with_name(path.name + ".damaged").read_bytes() == data[:-10]


def test_leftovers_of_a_snapshot_being_written_are_removed_at_open(tmp_path: Path) -> None:
    directory = tmp_path / "__cluster_metadata-0"
    directory.mkdir()
    for name in (
        "00000000000000000005-0000000001.checkpoint.part",
        "00000000000000000003-0000000001.checkpoint.deleted",
    ):
        (directory / name).write_bytes(b"half")
    with MetadataLog(tmp_path) as log:
        assert log.snapshot_ids() == []
    assert sorted(p.name for p in directory.iterdir() if "checkpoint" in p.name) == []


def test_a_torn_end_of_the_log_is_cut_and_the_rest_replays(tmp_path: Path) -> None:
    with opened(tmp_path) as log:
        log.append([config(0)])
        log.append([config(1)])
    segment = tmp_path / "__cluster_metadata-0" / "00000000000000000000.log"
    whole = segment.read_bytes()
    segment.write_bytes(whole[:-7])  # the last batch torn by a crash
    with MetadataLog(tmp_path) as log:
        assert log.end_offset == 2
        assert list(log.replay().records()) == [config(0)]
        assert log.append([config(2)]) == 2
        assert list(log.replay().records()) == [config(0), config(2)]


def test_segments_roll_and_replay_reads_across_them(tmp_path: Path) -> None:
    with opened(tmp_path, segment_bytes=400) as log:
        for i in range(12):
            log.append([config(i), MetadataRecord(TopicRecord(name=f"t{i}", topic_id=uuid.UUID(int=i + 1)), 0)])
    segments = sorted((tmp_path / "__cluster_metadata-0").glob("*.log"))
    assert len(segments) > 3
    with MetadataLog(tmp_path, segment_bytes=400) as log:
        records = list(log.replay().records())
    assert len(records) == 24 and records[-1].message == TopicRecord(name="t11", topic_id=uuid.UUID(int=12))


def test_a_record_the_log_cannot_write_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with opened(tmp_path) as log:
        with pytest.raises(MetadataLogError, match="PartitionRecord cannot be written at version 7"):
            log.append([config(0), MetadataRecord(sample_records()[3].message, 7)])
        assert log.end_offset == 1
        with pytest.raises(ValueError, match="at least one record"):
            log.append([])


def test_a_damaged_quorum_state_is_one_line(tmp_path: Path) -> None:
    with opened(tmp_path) as log:
        (log.directory / "quorum-state").write_text('{"leaderId": 1}')
        with pytest.raises(MetadataLogError, match="is not a quorum-state file: data_version None is not 0"):
            log.quorum_state()


KAFKA_WRITTEN = Path(__file__).resolve().parent.parent / "fixtures" / "kraft-4.3.1" / "cluster_metadata"


def test_quorum_state_is_written_as_kafka_writes_it_for_a_single_voter(tmp_path: Path) -> None:
    with MetadataLog(tmp_path) as log:
        log.become_leader(1, node_id=1, voters=[1])
    written = (tmp_path / "__cluster_metadata-0" / "quorum-state").read_bytes()
    assert written == (KAFKA_WRITTEN / "quorum-state").read_bytes()  # Kafka 4.3.1's, node 1 leader of epoch 1


def test_kafkas_own_metadata_log_is_replayed_from_its_snapshot(tmp_path: Path) -> None:
    directory = tmp_path / "__cluster_metadata-0"
    directory.mkdir()
    (snapshot_path,) = KAFKA_WRITTEN.glob("*.checkpoint")
    for source in (KAFKA_WRITTEN / "00000000000000000000.log", snapshot_path):
        (directory / source.name).write_bytes(source.read_bytes())  # without Kafka's leader-epoch-checkpoint
    with MetadataLog(tmp_path) as log:
        assert log.leader_epoch == 1  # from the batches' epochs
        assert (directory / "leader-epoch-checkpoint").read_text() == "0\n1\n1 0\n"
        replay = log.replay()
        end = log.end_offset
        assert replay.snapshot is not None and replay.snapshot.id == SnapshotId(47, 1)
        assert replay.snapshot.records == read_snapshot_file(snapshot_path).records
        assert replay.batches[0].base_offset == 47 and replay.batches[-1].last_offset == end - 1
        names = {record.message.NAME for record in replay.snapshot.records}
        assert {"TopicRecord", "PartitionRecord", "ConfigRecord", "UserScramCredentialRecord"} <= names
        assert log.append([config(1)]) == end  # kbroker goes on where Kafka stopped, in Kafka's epoch
        log.become_leader(2, node_id=1, voters=[1])
    with MetadataLog(tmp_path) as log:
        assert [b.leader_epoch for b in log.replay().batches][-2:] == [1, 2]


def test_a_lost_leader_epoch_checkpoint_is_rebuilt_from_the_batches(tmp_path: Path) -> None:
    with opened(tmp_path) as log:
        log.append([config(0)])
        log.become_leader(4, node_id=1, voters=[1])
        log.append([config(1)])
    (tmp_path / "__cluster_metadata-0" / "leader-epoch-checkpoint").unlink()
    with MetadataLog(tmp_path) as log:
        assert log.leader_epoch == 4 and log.epoch_at(2) == 1 and log.epoch_at(3) == 4
