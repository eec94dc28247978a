"""The metadata follower's rules, against scripted Fetch answers (no JVM): records reach the image only below the
leader's high watermark and a metadata transaction at a time; the leader an answer names (with its endpoint) is
where the next fetch goes; a diverging epoch drops what waits past the leader's end offset; a divergence below
what was applied, or another cluster's quorum, stops the follower with a line saying so. Committed batches are kept
in the broker's own __cluster_metadata-0, from which a restart rebuilds the image and resumes fetching."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from kbroker.kraft.metadata_follower import MetadataFollower, MetadataFollowerError
from kbroker.kraft.quorum import QuorumView
from kbroker.metadata.controller import MetadataCache
from kbroker.metadata.log import MetadataLog
from kbroker.metadata.snapshots import SnapshotPolicy
from protocol._codec import Message
from protocol.errors import ErrorCode
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.fetch_snapshot_request import FetchSnapshotRequest
from protocol.messages.fetch_snapshot_response import FetchSnapshotResponse
from protocol.metadata_frame import MetadataRecord, build_metadata_batch
from protocol.metadata_records.begin_transaction_record import BeginTransactionRecord
from protocol.metadata_records.end_transaction_record import EndTransactionRecord
from protocol.metadata_records.partition_record import PartitionRecord
from protocol.metadata_records.topic_record import TopicRecord

NODE = 7
VOTER = ("voter.example", 9093)
LEADER = ("leader.example", 9094)


class ScriptedChannel:
    """Answers each Fetch with the next scripted answer and keeps the requests."""

    def __init__(self, answers: list[FetchResponse]) -> None:
        self.answers = answers
        self.requests: list[FetchRequest] = []

    def version_for(self, api_key: int) -> int:
        return 17

    async def request(self, body: Message, version: int | None = None) -> Message:
        assert isinstance(body, FetchRequest)
        self.requests.append(body)
        return self.answers.pop(0)


class ScriptedQuorum(QuorumView):
    def __init__(self, channel: ScriptedChannel) -> None:
        super().__init__([VOTER], client_id="test")
        self.scripted = channel
        self.addresses: list[tuple[str, int]] = []

    def channel(self, address: tuple[str, int], purpose: str) -> Any:
        self.addresses.append(address)
        return self.scripted


def topic_records(name: str, topic_id: uuid.UUID) -> list[MetadataRecord]:
    return [
        MetadataRecord(TopicRecord(name=name, topic_id=topic_id), 0),
        MetadataRecord(PartitionRecord(partition_id=0, topic_id=topic_id, replicas=[NODE], isr=[NODE], leader=NODE), 2),
    ]


def batch(records: Sequence[MetadataRecord], base_offset: int, epoch: int = 1) -> bytes:
    return build_metadata_batch(records, leader_epoch=epoch, timestamp_ms=1, base_offset=base_offset)


def answer(
    records: bytes = b"",
    *,
    high_watermark: int,
    error: int = ErrorCode.NONE,
    leader: tuple[int, int] = (3000, 1),
    endpoint: tuple[str, int] | None = None,
    diverging: tuple[int, int] = (-1, -1),
    top_error: int = ErrorCode.NONE,
) -> FetchResponse:
    partition = FetchResponse.PartitionData(
        partition_index=0,
        error_code=error,
        high_watermark=high_watermark,
        diverging_epoch=FetchResponse.EpochEndOffset(epoch=diverging[0], end_offset=diverging[1]),
        current_leader=FetchResponse.LeaderIdAndEpoch(leader_id=leader[0], leader_epoch=leader[1]),
        snapshot_id=FetchResponse.SnapshotId(end_offset=-1, epoch=-1),
        records=records or None,
    )
    endpoints = (
        [] if endpoint is None else [FetchResponse.NodeEndpoint(node_id=leader[0], host=endpoint[0], port=endpoint[1])]
    )
    return FetchResponse(
        error_code=top_error,
        responses=[FetchResponse.FetchableTopicResponse(topic_id=uuid.UUID(int=1), partitions=[partition])],
        node_endpoints=endpoints,
    )


def follow(
    answers: list[FetchResponse], cache: MetadataCache | None = None, metadata_log: MetadataLog | None = None
) -> tuple[MetadataFollower, ScriptedQuorum, ScriptedChannel, list[bool]]:
    channel = ScriptedChannel(answers)
    quorum = ScriptedQuorum(channel)
    follower = MetadataFollower(
        quorum, cache or MetadataCache(), node_id=NODE, cluster_id="cluster-a", metadata_log=metadata_log
    )
    count = len(answers)

    async def main() -> list[bool]:
        return [await follower.fetch_once() for _ in range(count)]

    return follower, quorum, channel, trio.run(main)


def test_records_are_applied_only_below_the_high_watermark() -> None:
    orders, payments = uuid.uuid4(), uuid.uuid4()
    first = batch(topic_records("orders", orders), 0)
    second = batch(topic_records("payments", payments), 2)
    follower, _, channel, _ = follow([answer(first + second, high_watermark=2), answer(high_watermark=4)])
    # The first answer committed only the first batch: "payments" waited for the second's high watermark.
    assert [r.topics[0].partitions[0].fetch_offset for r in channel.requests] == [0, 4]
    assert [r.topics[0].partitions[0].last_fetched_epoch for r in channel.requests] == [0, 1]
    assert sorted(follower.cache.image.topics.by_name) == ["orders", "payments"]
    assert follower.applied_offset == 3 and follower.caught_up.is_set()
    request = channel.requests[0]
    assert (request.replica_state.replica_id, request.replica_state.replica_epoch) == (NODE, -1)
    assert request.topics[0].topic_id == uuid.UUID(int=1) and request.cluster_id == "cluster-a"


def test_a_metadata_transaction_is_published_whole() -> None:
    orders = uuid.uuid4()
    opened = batch([MetadataRecord(BeginTransactionRecord(name="create"), 0), *topic_records("orders", orders)], 0)
    closed = batch([MetadataRecord(EndTransactionRecord(), 0)], 3)
    cache = MetadataCache()
    published: list[list[str]] = []
    cache.subscribe(lambda image, delta: published.append(sorted(image.topics.by_name)))
    follower, _, channel, _ = follow([answer(opened, high_watermark=3)], cache)
    # The transaction's opening batch (offsets 0-2) is applied, and nothing is published before its end.
    assert follower.applied_offset == 2 and published == []
    assert follower.cache.image.topics.get("orders") is None
    channel.answers.append(answer(closed, high_watermark=4))
    assert trio.run(follower.fetch_once)
    assert published == [["orders"]] and follower.applied_offset == 3


def test_the_leader_an_answer_names_is_where_the_next_fetch_goes() -> None:
    follower, quorum, channel, progressed = follow(
        [
            answer(high_watermark=-1, error=ErrorCode.FENCED_LEADER_EPOCH, leader=(3001, 4), endpoint=LEADER),
            answer(high_watermark=0, leader=(3001, 4)),
        ]
    )
    assert progressed == [True, True]
    assert quorum.addresses == [VOTER, LEADER]
    assert [r.topics[0].partitions[0].current_leader_epoch for r in channel.requests] == [0, 4]
    assert (quorum.leader_id, quorum.leader_epoch) == (3001, 4)


def test_a_diverging_epoch_drops_what_waits_past_the_leaders_end_offset() -> None:
    orders, payments = uuid.uuid4(), uuid.uuid4()
    committed = batch(topic_records("orders", orders), 0, epoch=1)
    unlucky = batch(topic_records("payments", payments), 2, epoch=1)
    follower, _, channel, _ = follow(
        [
            answer(committed + unlucky, high_watermark=2),
            answer(high_watermark=2, leader=(3001, 2), diverging=(1, 2)),
            answer(high_watermark=2, leader=(3001, 2)),
        ]
    )
    assert [r.topics[0].partitions[0].fetch_offset for r in channel.requests] == [0, 4, 2]
    assert channel.requests[2].topics[0].partitions[0].last_fetched_epoch == 1
    assert sorted(follower.cache.image.topics.by_name) == ["orders"]
    assert follower.fetch_offset == 2


def test_a_divergence_below_what_was_applied_stops_the_follower() -> None:
    first = batch(topic_records("orders", uuid.uuid4()), 0)
    with pytest.raises(MetadataFollowerError, match="diverges at offset 1, below the applied offset 1"):
        follow([answer(first, high_watermark=2), answer(high_watermark=2, diverging=(1, 1))])


def test_another_clusters_quorum_stops_the_follower() -> None:
    with pytest.raises(MetadataFollowerError, match="belongs to another cluster than cluster-a"):
        follow([answer(high_watermark=0, top_error=ErrorCode.INCONSISTENT_CLUSTER_ID)])


def test_committed_batches_are_kept_locally_and_a_restart_resumes_after_them(tmp_path: Path) -> None:
    orders, payments = uuid.uuid4(), uuid.uuid4()
    committed = batch(topic_records("orders", orders), 0, epoch=2)
    waiting = batch(topic_records("payments", payments), 2, epoch=2)
    with MetadataLog(tmp_path) as kept:
        follow([answer(committed + waiting, high_watermark=2, leader=(3000, 2))], metadata_log=kept)
        # Only what was committed (and applied) is on disk, at the leader's offsets and epoch.
        assert kept.end_offset == 2
        assert [(b.base_offset, b.leader_epoch) for b in kept.read_batches()] == [(0, 2)]
    with MetadataLog(tmp_path) as reopened:
        cache = MetadataCache()
        channel = ScriptedChannel([answer(waiting, high_watermark=4, leader=(3000, 2))])
        follower = MetadataFollower(
            ScriptedQuorum(channel), cache, node_id=NODE, cluster_id="cluster-a", metadata_log=reopened
        )
        follower.restore()
        assert sorted(cache.image.topics.by_name) == ["orders"]
        assert cache.image.topics.by_name["orders"].topic_id == orders
        assert (follower.fetch_offset, follower.last_fetched_epoch, follower.applied_offset) == (2, 2, 1)
        assert trio.run(follower.fetch_once)
        request = channel.requests[0].topics[0].partitions[0]
        assert (request.fetch_offset, request.last_fetched_epoch) == (2, 2)
        assert sorted(cache.image.topics.by_name) == ["orders", "payments"]
        assert reopened.end_offset == 4


class SnapshotChannel(ScriptedChannel):
    """Answers Fetch with the scripted answers and FetchSnapshot with ``snapshot`` whole."""

    def __init__(self, answers: list[FetchResponse], snapshot: bytes, snapshot_id: tuple[int, int]) -> None:
        super().__init__(answers)
        self.snapshot = snapshot
        self.snapshot_id = snapshot_id

    async def request(self, body: Message, version: int | None = None) -> Message:
        if not isinstance(body, FetchSnapshotRequest):
            return await super().request(body, version)
        end_offset, epoch = self.snapshot_id
        piece = FetchSnapshotResponse.PartitionSnapshot(
            index=0,
            snapshot_id=FetchSnapshotResponse.SnapshotId(end_offset=end_offset, epoch=epoch),
            current_leader=FetchSnapshotResponse.LeaderIdAndEpoch(leader_id=3000, leader_epoch=epoch),
            size=len(self.snapshot),
            position=0,
            unaligned_records=self.snapshot,
        )
        return FetchSnapshotResponse(
            topics=[FetchSnapshotResponse.TopicSnapshot(name="__cluster_metadata", partitions=[piece])]
        )


def test_a_snapshot_from_the_leader_is_kept_and_a_restart_starts_from_it(tmp_path: Path) -> None:
    orders = uuid.uuid4()
    with MetadataLog(tmp_path / "leader") as leader:  # the leader's log and its snapshot at offset 3, epoch 1
        leader.become_leader(1, 3000, [3000])
        leader.append(topic_records("orders", orders))
        snapshot_id = leader.write_snapshot(topic_records("orders", orders), 3, last_contained_timestamp=1)
        snapshot = (leader.directory / snapshot_id.file_name).read_bytes()
    offered = answer(high_watermark=5, leader=(3000, 1))
    offered.responses[0].partitions[0].snapshot_id = FetchResponse.SnapshotId(end_offset=3, epoch=1)
    channel = SnapshotChannel([offered], snapshot, (3, 1))
    with MetadataLog(tmp_path / "broker") as kept:
        cache = MetadataCache()
        follower = MetadataFollower(
            ScriptedQuorum(channel), cache, node_id=NODE, cluster_id="cluster-a", metadata_log=kept
        )
        assert trio.run(follower.fetch_once)
        assert cache.image.topics.by_name["orders"].topic_id == orders
        assert (follower.fetch_offset, follower.last_fetched_epoch, follower.applied_offset) == (3, 1, 2)
        assert (kept.directory / snapshot_id.file_name).read_bytes() == snapshot
    with MetadataLog(tmp_path / "broker") as reopened:  # restarted before any batch followed the snapshot
        cache = MetadataCache()
        follower = MetadataFollower(
            ScriptedQuorum(ScriptedChannel([])), cache, node_id=NODE, cluster_id="cluster-a", metadata_log=reopened
        )
        follower.restore()
        assert cache.image.topics.by_name["orders"].topic_id == orders
        assert (follower.fetch_offset, follower.last_fetched_epoch, follower.applied_offset) == (3, 1, 2)


def test_the_local_log_is_snapshotted_and_trimmed_and_a_restart_replays_the_snapshot(tmp_path: Path) -> None:
    """As Kafka's broker: a snapshot of the image once enough was appended since the last one, the log segments
    and older snapshots it covers deleted beyond metadata.max.retention.bytes, and a restart rebuilt from it."""
    ids = {name: uuid.uuid4() for name in ("orders", "payments", "refunds")}
    answers = [
        answer(batch(topic_records(name, topic_id), 2 * n, epoch=2), high_watermark=2 * n + 2, leader=(3000, 2))
        for n, (name, topic_id) in enumerate(ids.items())
    ]
    every_batch = SnapshotPolicy(max_bytes_between=1, retention_bytes=1)
    with MetadataLog(tmp_path) as kept:
        channel = ScriptedChannel(list(answers))
        follower = MetadataFollower(
            ScriptedQuorum(channel),
            MetadataCache(),
            node_id=NODE,
            cluster_id="cluster-a",
            metadata_log=kept,
            snapshots=every_batch,
        )

        async def fetch_all() -> None:
            for _ in answers:
                assert await follower.fetch_once()

        trio.run(fetch_all)
        # One snapshot left, at the end of what was applied, in the epoch of its last record; the log before it
        # is gone.
        assert [(i.end_offset, i.epoch) for i in kept.snapshot_ids()] == [(6, 2)]
        assert kept.log.log_start_offset == 6
        written = kept.read_snapshot(kept.snapshot_ids()[0])
        assert {r.message.name for r in written.records if isinstance(r.message, TopicRecord)} == set(ids)
    with MetadataLog(tmp_path) as reopened:
        cache = MetadataCache()
        follower = MetadataFollower(
            ScriptedQuorum(ScriptedChannel([])), cache, node_id=NODE, cluster_id="cluster-a", metadata_log=reopened
        )
        follower.restore()
        assert {name: topic.topic_id for name, topic in cache.image.topics.by_name.items()} == ids
        assert (follower.fetch_offset, follower.last_fetched_epoch, follower.applied_offset) == (6, 2, 5)


def test_no_snapshot_is_written_inside_a_metadata_transaction(tmp_path: Path) -> None:
    """A snapshot is of a published image: while a metadata transaction is open, none is due."""
    topic_id = uuid.uuid4()
    begin = MetadataRecord(BeginTransactionRecord(name="t"), 0)
    opened = batch([begin, *topic_records("orders", topic_id)], 0, epoch=1)
    ended = batch([MetadataRecord(EndTransactionRecord(), 0)], 3, epoch=1)
    with MetadataLog(tmp_path) as kept:
        channel = ScriptedChannel([answer(opened, high_watermark=3), answer(ended, high_watermark=4)])
        follower = MetadataFollower(
            ScriptedQuorum(channel),
            MetadataCache(),
            node_id=NODE,
            cluster_id="cluster-a",
            metadata_log=kept,
            snapshots=SnapshotPolicy(max_bytes_between=1),
        )
        assert trio.run(follower.fetch_once)
        assert kept.snapshot_ids() == []
        assert trio.run(follower.fetch_once)
        assert [(i.end_offset, i.epoch) for i in kept.snapshot_ids()] == [(4, 1)]
