"""Following ``__cluster_metadata`` as a KRaft observer, as Kafka's broker does (its KafkaRaftClient in the
observer role, feeding the MetadataLoader).

The broker fetches the metadata partition from the quorum's leader with Fetch (topic id 0...01, replica state =
its node id and epoch -1: an observer, never a voter). Each answer carries the leader's high watermark; records
are applied to the metadata image only once below it (committed: a leader change cannot take them back), a
metadata transaction at a time (the image builder holds a transaction's records until its end). A record batch
above the high watermark waits; a diverging epoch in an answer drops what waits beyond the leader's end offset
for that epoch, as Kafka's truncation does. An answer naming a snapshot (the leader no longer has the log from
where the broker is) is loaded with FetchSnapshot into a fresh image.

Each published image goes to the broker's MetadataCache, whose subscribers (topics, replica layer, authorizer)
act on it, exactly as the single node's own controller publishes.

Given the broker's local ``__cluster_metadata-0`` (kbroker/metadata/log.py), each applied batch is appended to
it as the leader wrote it, and a loaded snapshot is kept beside it, as Kafka's broker keeps its copy of the
metadata log: ``restore`` rebuilds the image from it at start-up, and fetching resumes after its end. Only
committed batches are written, so the local copy never needs truncating. As Kafka's broker (its SnapshotGenerator
and the metadata log's retention), the image is snapshotted into it when ``SnapshotPolicy`` says one is due, and
the log segments and older snapshots the newer ones cover are deleted beyond metadata.max.retention.*: a
restart replays the newest snapshot and what follows it, not the cluster's whole history.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import trio

from kbroker.durable.files import write_atomically
from kbroker.kraft import BrokerRoleError
from kbroker.kraft.channel import ChannelError, NodeChannel
from kbroker.kraft.quorum import QuorumView
from kbroker.metadata.controller import MetadataCache
from kbroker.metadata.image import ImageError, MetadataImage, MetadataImageBuilder
from kbroker.metadata.log import MetadataLog, MetadataLogError, Replay, SnapshotId, wall_clock_ms
from kbroker.metadata.snapshots import SnapshotPolicy, write_snapshot
from protocol.errors import ErrorCode
from protocol.exceptions import DecodeError
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.fetch_snapshot_request import FetchSnapshotRequest
from protocol.messages.fetch_snapshot_response import FetchSnapshotResponse
from protocol.metadata_frame import MetadataBatch, decode_metadata_batch, iter_metadata_batches
from protocol.records import iter_batches

log = logging.getLogger("kbroker.kraft")

METADATA_TOPIC = "__cluster_metadata"
METADATA_TOPIC_ID = uuid.UUID(int=1)  # Kafka's Uuid.METADATA_TOPIC_ID
FETCH_API_KEY = 1
MIN_FETCH_VERSION = 13  # topic ids
FETCH_MAX_BYTES = 8 * 1024 * 1024
RETRY_SECONDS = 0.2
_LEADER_CHANGES = {
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
}


class MetadataFollowerError(BrokerRoleError):
    """The quorum's answers cannot be followed (a cluster id mismatch, an unreadable record); names why."""


class MetadataFollower:
    """Fetches the metadata log from the quorum's leader and publishes each committed change to ``cache``."""

    def __init__(
        self,
        quorum: QuorumView,
        cache: MetadataCache,
        *,
        node_id: int,
        cluster_id: str,
        max_wait_ms: int = 500,
        on_applied: Callable[[int], None] | None = None,
        metadata_log: MetadataLog | None = None,
        snapshots: SnapshotPolicy | None = None,
    ) -> None:
        """``metadata_log``: the local copy of the quorum's log, written as batches are applied (None: kept in
        memory only); ``snapshots``: when it gets a snapshot of the image and how much of it is kept."""
        self.quorum = quorum
        self.cache = cache
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.max_wait_ms = max_wait_ms
        self._on_applied = on_applied
        self.metadata_log = metadata_log
        self.snapshots = snapshots if snapshots is not None else SnapshotPolicy()
        self._last_snapshot_ms = wall_clock_ms()  # as Kafka's generator: the time bound counts from start-up
        self._builder = MetadataImageBuilder(cache.image)
        self.fetch_offset = 0  # the next offset to fetch
        self.last_fetched_epoch = 0
        self.high_watermark = -1
        self.applied_offset = -1  # the offset of the last record applied to a published image
        # Fetched, not yet below the high watermark: each batch decoded and as the leader wrote it.
        self._waiting: list[tuple[MetadataBatch, bytes]] = []
        self.caught_up = trio.Event()  # applied everything below the high watermark of an answer, once
        self._caught_up_listeners: list[Callable[[], None]] = []
        # Fetches are numbered as they are sent; ``_synced_fetch`` is the newest one after whose answer everything
        # below its high watermark was applied (``sync`` waits for one sent after it was called).
        self._fetches_sent = 0
        self._synced_fetch = -1
        self._synced = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            try:
                progressed = await self.fetch_once()
            except ChannelError as exc:
                log.info("metadata fetch from the controller quorum failed (retrying): %s", exc)
                self.quorum.forget_leader()
                progressed = False
            if not progressed:
                await trio.sleep(RETRY_SECONDS)

    # --- one round trip ---------------------------------------------------------------------------------

    async def fetch_once(self) -> bool:
        """One Fetch to the leader (or a configured voter); False if the caller should back off first."""
        address = self.quorum.address()
        channel = self.quorum.channel(address, "metadata")
        current_epoch = max(self.quorum.leader_epoch, self.last_fetched_epoch, 0)
        partition = FetchRequest.FetchPartition(
            partition=0,
            current_leader_epoch=current_epoch,
            fetch_offset=self.fetch_offset,
            last_fetched_epoch=self.last_fetched_epoch,
            partition_max_bytes=FETCH_MAX_BYTES,
        )
        request = FetchRequest(
            cluster_id=self.cluster_id,
            replica_state=FetchRequest.ReplicaState(replica_id=self.node_id, replica_epoch=-1),
            max_wait_ms=self.max_wait_ms,
            min_bytes=1,
            max_bytes=FETCH_MAX_BYTES,
            topics=[FetchRequest.FetchTopic(topic=METADATA_TOPIC, topic_id=METADATA_TOPIC_ID, partitions=[partition])],
        )
        fetch_number = self._fetches_sent
        self._fetches_sent += 1
        answer = await channel.request(request)
        if channel.version_for(FETCH_API_KEY) < MIN_FETCH_VERSION:
            raise MetadataFollowerError(f"{address[0]}:{address[1]} serves Fetch below v{MIN_FETCH_VERSION}")
        assert isinstance(answer, FetchResponse)
        if answer.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID:
            raise MetadataFollowerError(
                f"the controller quorum at {address[0]}:{address[1]} belongs to another cluster than {self.cluster_id}"
            )
        if answer.error_code != ErrorCode.NONE:
            log.info("metadata fetch answered %s", ErrorCode(answer.error_code).name)
            return False
        [topic] = answer.responses
        [data] = topic.partitions
        self._learn_leader(answer, data)
        if data.error_code in _LEADER_CHANGES:
            return data.current_leader.leader_epoch > current_epoch  # at once if the answer taught a newer epoch
        if data.error_code != ErrorCode.NONE:
            log.info("metadata fetch answered %s for %s-0", ErrorCode(data.error_code).name, METADATA_TOPIC)
            return False
        if data.snapshot_id.end_offset >= 0:
            await self._load_snapshot(channel, data.snapshot_id.end_offset, data.snapshot_id.epoch)
            return True
        if data.diverging_epoch.epoch >= 0:
            self._truncate(data.diverging_epoch.epoch, data.diverging_epoch.end_offset)
            return True
        if isinstance(data.records, (bytes, bytearray, memoryview)) and data.records:  # decoded: never a file Region
            # A fetch may end inside a batch (max bytes): the whole ones are kept, the rest is fetched again.
            for header, raw in iter_batches(data.records):
                if header.last_offset < self.fetch_offset:
                    continue
                try:
                    batch = decode_metadata_batch(raw, header)
                except DecodeError as exc:
                    raise MetadataFollowerError(f"unreadable {METADATA_TOPIC} batch: {exc}") from None
                self._waiting.append((batch, bytes(raw)))
                self.fetch_offset = batch.last_offset + 1
                self.last_fetched_epoch = batch.leader_epoch
        self.high_watermark = data.high_watermark
        self._apply_committed()
        if self._snapshot_due():
            await trio.to_thread.run_sync(self.write_snapshot, abandon_on_cancel=False)
        if self.applied_offset + 1 >= self.high_watermark:
            self._synced_fetch = fetch_number
            self._synced.set()
            self._synced = trio.Event()
        return True

    def on_caught_up(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` once, as ``caught_up`` is set (at once if it is): right after the image that caught up
        is published, before any later record is applied."""
        if self.caught_up.is_set():
            listener()
        else:
            self._caught_up_listeners.append(listener)

    async def sync(self) -> None:
        """Wait until what the quorum had committed when this was called is applied and published: a change the
        active controller has answered is then in the broker's image (a fetch sent after the answer is answered
        with a high watermark past its records)."""
        wanted = self._fetches_sent
        while self._synced_fetch < wanted:
            await self._synced.wait()

    def _learn_leader(self, answer: FetchResponse, data: FetchResponse.PartitionData) -> None:
        leader = data.current_leader
        if leader.leader_id < 0:
            return
        address = next(((e.host, e.port) for e in answer.node_endpoints if e.node_id == leader.leader_id), None)
        self.quorum.learn_leader(leader.leader_id, leader.leader_epoch, address)

    def _truncate(self, epoch: int, end_offset: int) -> None:
        """The leader's log diverges from what was fetched: drop what waits at or past ``end_offset``."""
        if end_offset <= self.applied_offset:
            raise MetadataFollowerError(
                f"the quorum's leader diverges at offset {end_offset}, below the applied offset {self.applied_offset}"
            )
        self._waiting = [(batch, raw) for batch, raw in self._waiting if batch.last_offset < end_offset]
        self.fetch_offset = end_offset
        self.last_fetched_epoch = epoch

    def _apply_committed(self) -> None:
        """Apply the waiting batches below the high watermark and publish what they complete."""
        applied = 0
        while self._waiting and self._waiting[0][0].last_offset < self.high_watermark:
            batch, raw = self._waiting.pop(0)
            self._keep(raw)
            for index, record in enumerate(batch.records):
                self._builder.replay(record.message, batch.base_offset + index, batch.leader_epoch)
            self.applied_offset = batch.last_offset
            published = self._builder.publish()
            if published is not None:
                self.cache.publish(*published)
            applied += 1
        if applied and self.metadata_log is not None and not self.metadata_log.log.sync():
            raise MetadataFollowerError(f"{self.metadata_log.directory}: fsync failed, the data directory is offline")
        if applied and self._on_applied is not None:
            self._on_applied(self.applied_offset)
        if self.applied_offset + 1 >= self.high_watermark > 0 and not self.caught_up.is_set():
            self.caught_up.set()
            listeners, self._caught_up_listeners = self._caught_up_listeners, []
            for listener in listeners:
                listener()

    # --- the local copy ---------------------------------------------------------------------------------

    def _keep(self, raw: bytes) -> None:
        """Append one committed batch to the local metadata log, with the leader's offsets and epoch."""
        if self.metadata_log is None:
            return
        try:
            self.metadata_log.append_committed(raw)
        except MetadataLogError as exc:
            raise MetadataFollowerError(str(exc)) from None

    def _snapshot_due(self) -> bool:
        if self.metadata_log is None or self._builder.in_transaction:
            return False
        return self.snapshots.due(self.metadata_log.bytes_since_snapshot, wall_clock_ms() - self._last_snapshot_ms)

    def write_snapshot(self) -> None:
        """Snapshot the published image into the local log, then delete what older snapshots alone covered beyond
        the retention bounds. Runs while nothing is appended (the fetch loop waits for it; the image is
        immutable). A failure is logged: the image stands, and the next applied batch asks again."""
        if self.metadata_log is None:
            return
        self._last_snapshot_ms = wall_clock_ms()
        write_snapshot(self.metadata_log, self.cache.image, self.snapshots)

    def restore(self) -> None:
        """Rebuild the image from the local metadata log (its newest snapshot and the batches after it), publish
        it, and fetch on from its end: a restarted broker serves what it had applied and resumes there."""
        if self.metadata_log is None:
            return
        try:
            latest = self.metadata_log.latest_snapshot_id()
            if latest is not None and latest.end_offset > self.metadata_log.end_offset:
                # A snapshot fetched from the leader, no batch after it yet: the local log has nothing to add.
                replay = Replay(self.metadata_log.read_snapshot(latest), (), latest.end_offset)
            else:
                replay = self.metadata_log.replay()
            if replay.snapshot is not None:
                end, epoch = replay.snapshot.id.end_offset, replay.snapshot.id.epoch
                for index, item in enumerate(replay.snapshot.records):
                    self._builder.replay(item.message, end - len(replay.snapshot.records) + index, -1)
                self.fetch_offset, self.last_fetched_epoch = end, epoch
            for batch in replay.batches:
                for index, record in enumerate(batch.records):
                    self._builder.replay(record.message, batch.base_offset + index, batch.leader_epoch)
                self.fetch_offset, self.last_fetched_epoch = batch.last_offset + 1, batch.leader_epoch
        except (ImageError, MetadataLogError) as exc:
            raise MetadataFollowerError(f"{self.metadata_log.directory}: {exc}") from None
        published = self._builder.publish()
        if published is not None:
            self.cache.publish(*published)
        self.applied_offset = self.fetch_offset - 1
        if self.fetch_offset:
            log.info("resuming %s-0 at offset %d, epoch %d", METADATA_TOPIC, self.fetch_offset, self.last_fetched_epoch)

    def _keep_snapshot(self, data: bytes, end_offset: int, epoch: int) -> None:
        """Keep a snapshot fetched from the leader beside the local log, whose next batch then follows it."""
        if self.metadata_log is None:
            return
        directory = self.metadata_log.directory
        write_atomically(directory / SnapshotId(end_offset, epoch).file_name, data, sync_directory=True, private=True)
        self.metadata_log.log.truncate_to(self.metadata_log.log.log_start_offset)

    # --- snapshots --------------------------------------------------------------------------------------

    async def _load_snapshot(self, channel: NodeChannel, end_offset: int, epoch: int) -> None:
        """The leader answers with a snapshot: fetch it whole and make it the image."""
        if self.applied_offset >= 0:
            # Kept from before a restart, but the leader no longer has the log from there (it went while this broker
            # was away): its snapshot replaces the image, as on a fresh start.
            log.warning(
                "the quorum's leader no longer has %s-0 from offset %d: loading its snapshot at %d",
                METADATA_TOPIC,
                self.fetch_offset,
                end_offset,
            )
        data = bytearray()
        size = -1
        while size < 0 or len(data) < size:
            partition = FetchSnapshotRequest.PartitionSnapshot(
                partition=0,
                current_leader_epoch=max(self.quorum.leader_epoch, 0),
                snapshot_id=FetchSnapshotRequest.SnapshotId(end_offset=end_offset, epoch=epoch),
                position=len(data),
            )
            request = FetchSnapshotRequest(
                cluster_id=self.cluster_id,
                replica_id=self.node_id,
                max_bytes=FETCH_MAX_BYTES,
                topics=[FetchSnapshotRequest.TopicSnapshot(name=METADATA_TOPIC, partitions=[partition])],
            )
            answer = await channel.request(request)
            assert isinstance(answer, FetchSnapshotResponse)
            [piece] = answer.topics[0].partitions
            if answer.error_code != ErrorCode.NONE or piece.error_code != ErrorCode.NONE:
                code = answer.error_code or piece.error_code
                raise ChannelError(f"FetchSnapshot {end_offset}-{epoch} answered {ErrorCode(code).name}")
            size = piece.size
            data += bytes(piece.unaligned_records or b"")
        self._keep_snapshot(bytes(data), end_offset, epoch)
        builder = MetadataImageBuilder(MetadataImage())
        for batch in iter_metadata_batches(data):
            for index, record in enumerate(batch.records):
                builder.replay(record.message, batch.base_offset + index, batch.leader_epoch)
        published = builder.publish()
        if published is not None:
            self.cache.publish(*published)
        self._builder = MetadataImageBuilder(self.cache.image)
        self._waiting = []
        self.fetch_offset = end_offset
        self.last_fetched_epoch = epoch
        self.applied_offset = end_offset - 1
        if self._on_applied is not None:
            self._on_applied(self.applied_offset)
