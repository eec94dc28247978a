"""The replica fetcher (kbroker/replication/fetcher.py) between two or three kbroker brokers in one process, over
TCP.

Each broker is its own controller here, so the tests keep their images in step as a KRaft quorum would: each
registers the others (RegisterBrokerRecord), broker 0 creates the topics, and every partition change is published
to all. Followers fetch from their leader's registered endpoint through their ReplicaManager's fetchers, as in a
cluster. The tests wait for outcomes (offsets, bytes, ISR) with generous bounds, never for a time.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from kbroker.apis.list_offsets import handle_list_offsets
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
from kbroker.fetch_sessions import FetchSession
from kbroker.metadata.controller import record
from kbroker.metadata.image import ConfigResourceType
from kbroker.metrics import families
from kbroker.replication.fetch_session import FollowerSession, Forgotten, PartitionFetch, SessionRequest
from kbroker.replication.fetcher import ReplicaFetcherManager
from kbroker.server.connection import serve
from kbroker.storage import PartitionLog
from protocol._codec import Message
from protocol.errors import ErrorCode
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.metadata_records.config_record import ConfigRecord
from protocol.metadata_records.partition_record import PartitionRecord
from protocol.metadata_records.topic_record import TopicRecord
from tests.broker.test_handlers_in_memory import context, values_of
from tests.replication.test_followers import produce, produced
from tests.replication.two_brokers import change_partition, register_broker, registration

A, B, C = 0, 1, 2
TOPIC = ConfigResourceType.TOPIC
PATIENCE = 60  # seconds: a bound for outcomes, generous for two busy cores
FAST = {"replica.fetch.wait.max.ms": "50", "replica.fetch.backoff.ms": "50"}


class Cluster:
    """Brokers 0, 1 (and 2), serving on local ports, each knowing the others; broker 0 creates the topics."""

    def __init__(self, tmp_path: Path, ports: dict[int, int], max_fetch_version: int | None) -> None:
        self.tmp_path = tmp_path
        self.ports = ports
        self.max_fetch_version = max_fetch_version
        self.brokers: dict[int, Broker] = {}
        self._running: dict[int, trio.CancelScope] = {}
        self._stopped: dict[int, trio.Event] = {}

    def make(self, node: int) -> Broker:
        """Broker ``node`` (its data kept across restarts) knowing the others; its fetches carry the broker epoch
        broker 0's image gave it (as one controller would have given one)."""
        config = BrokerConfig({"node.id": str(node), "num.partitions": "1", **FAST})
        broker = self.brokers[node] = Broker(
            config, self.tmp_path / f"broker-{node}", Endpoint("127.0.0.1", self.ports[node])
        )
        for other in self.ports:
            if other != node:
                register_broker(broker, other, "127.0.0.1", self.ports[other])
        fetchers = broker.replicas.fetchers
        assert fetchers is not None
        fetchers.max_fetch_version = self.max_fetch_version
        if node != A and A in self.brokers:
            epoch = self.brokers[A].metadata.image.brokers[node].epoch
            fetchers.broker_epoch = lambda: epoch
        return broker

    async def start(self, node: int, nursery: trio.Nursery) -> None:
        """Serve broker ``node`` on its port, its replica layer (fetchers included) running."""
        listeners = await trio.open_tcp_listeners(self.ports[node], host="127.0.0.1")
        await nursery.start(self._run, node, listeners)

    async def _run(
        self, node: int, listeners: list[trio.SocketListener], *, task_status: trio.TaskStatus[None]
    ) -> None:
        broker = self.brokers[node]
        stopped = self._stopped[node] = trio.Event()
        try:
            with trio.CancelScope() as self._running[node]:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(serve, broker, listeners)
                    await nursery.start(broker.replicas.run)
                    task_status.started()
        finally:
            broker.close()
            stopped.set()

    def started(self, node: int) -> bool:
        return node in self._stopped

    async def stop(self, node: int) -> None:
        """Stop broker ``node`` as a shutdown does (its high watermarks checkpointed, its logs closed)."""
        self._running[node].cancel()
        await self._stopped[node].wait()

    def __getitem__(self, node: int) -> Broker:
        return self.brokers[node]

    def fetchers(self, node: int) -> ReplicaFetcherManager:
        fetchers = self.brokers[node].replicas.fetchers
        assert fetchers is not None
        return fetchers

    async def create(self, topic: str, replicas: Sequence[int], isr: Sequence[int], **configs: str) -> None:
        """Partition 0 of ``topic`` on ``replicas`` (the first leads) with ``isr``, in every image."""
        await create(self[A], topic, replicas, configs)
        if tuple(isr) != tuple(replicas):
            change_partition(self[A], topic, 0, isr=isr)
        self.mirror_topic(topic, configs)

    def mirror_topic(self, topic: str, configs: dict[str, str] | None = None, source: int = A) -> None:
        """Publish broker ``source``'s registration of ``topic`` to the others (the same topic id, epochs, ISR)."""
        image = self[source].metadata.image.topics.by_name[topic]
        records: list[Message] = [TopicRecord(name=topic, topic_id=image.topic_id)]
        for name, value in (configs or {}).items():
            records.append(ConfigRecord(resource_type=TOPIC, resource_name=topic, name=name, value=value))
        for index, partition in image.partitions.items():
            records.append(
                PartitionRecord(
                    partition_id=index,
                    topic_id=image.topic_id,
                    replicas=list(partition.replicas),
                    isr=list(partition.isr),
                    leader=partition.leader,
                    leader_epoch=partition.leader_epoch,
                    partition_epoch=partition.partition_epoch,
                )
            )
        for node, broker in self.brokers.items():
            if node != source:  # committed to its metadata log: a restart keeps it
                broker.controller.commit_now([record(message) for message in records], transaction="mirror")

    def change(self, topic: str, *, leader: int | None = None, isr: Sequence[int] | None = None) -> None:
        """A partition change, as the controller quorum would publish it to every broker."""
        changed = {change_partition(b, topic, 0, leader=leader, isr=isr) for b in self.brokers.values()}
        assert len({(r.leader, r.leader_epoch) for r in changed}) == 1

    def log(self, node: int, topic: str) -> PartitionLog:
        partition = self.brokers[node].replicas.held(topic, 0)
        assert partition is not None
        return partition.log

    def log_end(self, node: int, topic: str) -> int:
        """The replica's log end offset (-1 before its log is open)."""
        partition = self.brokers[node].replicas.held(topic, 0)
        return -1 if partition is None else partition.log.log_end_offset


@asynccontextmanager
async def cluster_of(
    tmp_path: Path, nodes: Sequence[int] = (A, B), max_fetch_version: int | None = None
) -> AsyncIterator[Cluster]:
    ports = {}
    for node in nodes:  # a free port each, opened again by each start
        with trio.socket.socket() as probe:
            await probe.bind(("127.0.0.1", 0))
            ports[node] = probe.getsockname()[1]
    cluster = Cluster(tmp_path, ports, max_fetch_version)
    try:
        async with trio.open_nursery() as nursery:
            for node in nodes:
                cluster.make(node)
            for node in nodes:
                await cluster.start(node, nursery)
            yield cluster
            nursery.cancel_scope.cancel()
    finally:
        for node, broker in cluster.brokers.items():
            if not cluster.started(node):  # made but never started: nothing else closes it
                broker.close()


async def create(broker: Broker, topic: str, replicas: Sequence[int], configs: dict[str, str] | None = None) -> None:
    """Partition 0 of ``topic`` on ``replicas`` (the first leads), created on ``broker`` (its files made)."""
    await broker.topics.create(topic, 1, configs or {}, assignments=[list(replicas)])


async def eventually(what: str, check: Callable[[], bool]) -> None:
    with trio.move_on_after(PATIENCE):
        while not check():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"not reached within {PATIENCE} s: {what}")


def records_of(plog: PartitionLog, start: int = 0) -> bytes:
    return plog.read(start, 1 << 30, max_offset=plog.log_end_offset).read_bytes()


def checkpoint_of(plog: PartitionLog) -> bytes:
    path = plog.leader_epochs.path
    assert path is not None
    return path.read_bytes()


def run(main: Callable[[], Awaitable[None]]) -> None:
    trio.run(main)


# --- catching up ------------------------------------------------------------------------------------------


def test_a_follower_copies_the_leaders_log_exactly_and_joins_the_isr(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster_of(tmp_path) as cluster:
            leader = cluster[A]
            # Broker 0 writes in epoch 0, then (broker 1 not knowing the topic yet) in epoch 2.
            await create(leader, "t", [A, B], {"min.insync.replicas": "2"})
            change_partition(leader, "t", 0, isr=[A])
            assert await produced(leader, "t", [b"a", b"b"]) == (ErrorCode.NONE, 0)
            assert await produced(leader, "t", [b"c"]) == (ErrorCode.NONE, 2)
            change_partition(leader, "t", 0, leader=B)
            change_partition(leader, "t", 0, leader=A)
            assert registration(leader, "t").leader_epoch == 2
            assert await produced(leader, "t", [b"d", b"e"]) == (ErrorCode.NONE, 3)
            leader_log = cluster.log(A, "t")
            assert leader_log.leader_epochs.entries == ((0, 0), (2, 3))

            cluster.mirror_topic("t", {"min.insync.replicas": "2"})  # broker 1 learns it follows broker 0
            await eventually("the follower has the log end", lambda: cluster.log_end(B, "t") == 5)
            follower_log = cluster.log(B, "t")
            assert records_of(follower_log) == records_of(leader_log)
            assert [offset for offset, _ in values_of(records_of(follower_log))] == [0, 1, 2, 3, 4]
            assert follower_log.leader_epochs.entries == leader_log.leader_epochs.entries
            assert checkpoint_of(follower_log) == checkpoint_of(leader_log)
            state = cluster.fetchers(B).state_of("t", 0)
            assert state is not None and state.leader_epoch == 2

            # Caught up: the leader proposes it for the ISR, its high watermark moves, and the follower's follows.
            await eventually("the follower is in the ISR", lambda: registration(leader, "t").isr == (A, B))
            await eventually("the leader's high watermark", lambda: leader_log.high_watermark == 5)
            await eventually("the follower's high watermark", lambda: follower_log.high_watermark == 5)
            lag = [s for f in families(cluster[B]) if f.name.endswith("consumerlag") for s in f.samples]
            assert [(s.labels["clientid"], s.labels["topic"], s.value) for s in lag] == [
                ("ReplicaFetcherThread-0-0", "t", 0)
            ]

            # acks=all is answered once the follower has the batch (its fetch past it moved the high watermark).
            answer = await produce(leader, "t", [b"f"], -1, timeout_ms=PATIENCE * 1000)
            assert answer is not None
            assert answer.responses[0].partition_responses[0].error_code == ErrorCode.NONE
            assert follower_log.log_end_offset == 6
            await eventually("the follower's high watermark", lambda: follower_log.high_watermark == 6)
            assert records_of(follower_log) == records_of(leader_log)

    run(main)


def test_a_follower_of_a_topic_created_through_it_fetches_once_its_files_are_made(tmp_path: Path) -> None:
    # The create on broker 1 makes the partition's files in a worker thread while the replica layer learns it
    # follows broker 0: its log opens (and its fetching starts) once they are made, not at a later registration.
    # Broker 0 learns of the topic only after broker 1's first fetch was refused: the answers after the back-off
    # are taken.
    async def main() -> None:
        async with cluster_of(tmp_path) as cluster:
            await create(cluster[B], "t", [A, B])

            def refused_once() -> bool:
                state = cluster.fetchers(B).state_of("t", 0)
                return state is not None and state.delayed_until > -math.inf

            await eventually("the follower's first fetch is refused", refused_once)
            cluster.mirror_topic("t", source=B)
            await eventually("the leader's files are made", lambda: cluster[A].replicas.partition("t", 0) is not None)
            assert await produced(cluster[A], "t", [b"a", b"b"]) == (ErrorCode.NONE, 0)
            await eventually("the follower has the log end", lambda: cluster.log_end(B, "t") == 2)
            assert records_of(cluster.log(B, "t")) == records_of(cluster.log(A, "t"))
            assert registration(cluster[B], "t").partition_epoch == 0  # no ISR change was needed

    run(main)


# --- truncation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_fetch_version", [None, 11], ids=["diverging-epoch", "offset-for-leader-epoch"])
def test_a_former_leader_truncates_its_unreplicated_tail_and_then_matches_the_new_leader(
    tmp_path: Path, max_fetch_version: int | None
) -> None:
    async def main() -> None:
        async with cluster_of(tmp_path, max_fetch_version=max_fetch_version) as cluster:
            await cluster.create("t", [A, B], [A, B])
            assert await produced(cluster[A], "t", [b"a", b"b"]) == (ErrorCode.NONE, 0)
            await eventually("the follower has both", lambda: cluster.log_end(B, "t") == 2)
            # Broker 1 stops fetching; broker 0 takes acks=1 writes it never gets.
            cluster.fetchers(B).unfollow("t", 0)
            assert await produced(cluster[A], "t", [b"lost-1", b"lost-2"]) == (ErrorCode.NONE, 2)
            assert await produced(cluster[A], "t", [b"lost-3"]) == (ErrorCode.NONE, 4)
            # Broker 1 is elected (epoch 1) and writes; broker 0 follows it.
            cluster.change("t", leader=B)
            assert await produced(cluster[B], "t", [b"x"]) == (ErrorCode.NONE, 2)
            old_leader, new_leader = cluster.log(A, "t"), cluster.log(B, "t")
            await eventually(
                "the former leader matches the new one",
                lambda: old_leader.log_end_offset == 3 and records_of(old_leader) == records_of(new_leader),
            )
            assert values_of(records_of(old_leader)) == [(0, b"a"), (1, b"b"), (2, b"x")]
            assert old_leader.leader_epochs.entries == new_leader.leader_epochs.entries == ((0, 0), (1, 2))
            assert checkpoint_of(old_leader) == checkpoint_of(new_leader)
            await eventually("the high watermark", lambda: old_leader.high_watermark == 3)

    run(main)


@pytest.mark.parametrize(
    ("batches", "log_start", "fetched"),
    [
        ([[b"a"], [b"b"], [b"c"], [b"d"]], 3, [(3, b"d")]),
        # The leader's log starts inside a batch (DeleteRecords): the follower takes that batch whole.
        ([[b"a"], [b"b"], [b"c", b"d", b"e"], [b"f"]], 3, [(2, b"c"), (3, b"d"), (4, b"e"), (5, b"f")]),
    ],
    ids=["at-a-batch", "inside-a-batch"],
)
def test_a_follower_behind_the_leaders_log_start_starts_over_there(
    tmp_path: Path, batches: list[list[bytes]], log_start: int, fetched: list[tuple[int, bytes]]
) -> None:
    async def main() -> None:
        async with cluster_of(tmp_path) as cluster:
            leader = cluster[A]
            await create(leader, "t", [A, B])
            change_partition(leader, "t", 0, isr=[A])
            for values in batches:
                await produced(leader, "t", values)
            leader_log = cluster.log(A, "t")
            leader_log.roll()
            leader_log.delete_records(log_start)  # the new follower's log ends at 0, before the leader's start
            cluster.mirror_topic("t")
            end = leader_log.log_end_offset
            await eventually("the follower has the log end", lambda: cluster.log_end(B, "t") == end)
            follower_log = cluster.log(B, "t")
            await eventually("the leader's log start", lambda: follower_log.log_start_offset == log_start)
            assert values_of(records_of(follower_log, log_start)) == fetched
            assert records_of(follower_log, log_start) == records_of(leader_log, log_start)

    run(main)


# --- fetchers follow registrations ---------------------------------------------------------------------------


def test_a_leader_change_moves_the_partition_between_fetchers_and_a_stopped_one_ends_its_fetcher(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with cluster_of(tmp_path) as cluster:
            await cluster.create("t", [A, B], [A, B])
            await eventually("broker 1 fetches from broker 0", lambda: cluster.fetchers(B).state_of("t", 0) is not None)
            first = cluster.fetchers(B).fetchers[A]
            assert cluster.fetchers(A).fetchers == {}

            cluster.change("t", leader=B)  # broker 1 leads in epoch 1: its fetcher ends, broker 0 fetches from it
            with trio.fail_after(PATIENCE):
                await first.ended.wait()
            assert cluster.fetchers(B).fetchers == {}
            assert list(cluster.fetchers(A).fetchers) == [B]
            state = cluster.fetchers(A).state_of("t", 0)
            assert state is not None and state.leader_epoch == 1
            assert await produced(cluster[B], "t", [b"y"]) == (ErrorCode.NONE, 0)
            await eventually("broker 0 replicates from broker 1", lambda: cluster.log_end(A, "t") == 1)
            assert records_of(cluster.log(A, "t")) == records_of(cluster.log(B, "t"))

            second = cluster.fetchers(A).fetchers[B]
            cluster[A].replicas.stop("t", 0)  # no longer a replica here: its fetcher has nothing left and ends
            with trio.fail_after(PATIENCE):
                await second.ended.wait()
            assert cluster.fetchers(A).fetchers == {}

    run(main)


def test_a_follower_fenced_by_an_older_epoch_waits_for_its_next_registration(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster_of(tmp_path) as cluster:
            await cluster.create("t", [A, B], [A, B])
            # Broker 0 moves to epoch 2 (leading again) while broker 1 still has epoch 0: FENCED_LEADER_EPOCH.
            change_partition(cluster[A], "t", 0, leader=B)
            change_partition(cluster[A], "t", 0, leader=A)
            assert await produced(cluster[A], "t", [b"a"]) == (ErrorCode.NONE, 0)
            await eventually("fenced", lambda: (s := cluster.fetchers(B).state_of("t", 0)) is not None and s.parked)
            assert cluster.log_end(B, "t") == 0
            # The registration in epoch 2 arrives: it fetches again, in that epoch.
            change_partition(cluster[B], "t", 0, leader=B)
            change_partition(cluster[B], "t", 0, leader=A)
            await eventually("it caught up", lambda: cluster.log_end(B, "t") == 1)
            assert records_of(cluster.log(B, "t")) == records_of(cluster.log(A, "t"))

    run(main)


@pytest.mark.parametrize("max_fetch_version", [None, 11], ids=["diverging-epoch", "offset-out-of-range"])
def test_a_follower_ahead_of_a_leader_that_lost_its_tail_truncates_to_the_leaders_end(
    tmp_path: Path, max_fetch_version: int | None
) -> None:
    async def main() -> None:
        async with cluster_of(tmp_path, max_fetch_version=max_fetch_version) as cluster:
            await cluster.create("t", [A, B], [A, B])
            for value in (b"a", b"b", b"c"):
                await produced(cluster[A], "t", [value])
            await eventually("the follower has all three", lambda: cluster.log_end(B, "t") == 3)
            cluster.log(A, "t").truncate_to(1)  # the leader lost offsets 1 and 2 (an unclean election's outcome)
            await eventually("the follower is cut to the leader's end", lambda: cluster.log_end(B, "t") == 1)
            assert await produced(cluster[A], "t", [b"z"]) == (ErrorCode.NONE, 1)
            await eventually("the follower has the new record", lambda: cluster.log_end(B, "t") == 2)
            assert values_of(records_of(cluster.log(B, "t"))) == [(0, b"a"), (1, b"z")]
            assert records_of(cluster.log(B, "t")) == records_of(cluster.log(A, "t"))

    run(main)


def test_with_three_brokers_a_new_leader_takes_its_followers_from_the_old_leaders_fetcher(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster_of(tmp_path, (A, B, C)) as cluster:
            await cluster.create("t", [A, B, C], [A, B, C])
            assert await produced(cluster[A], "t", [b"a"]) == (ErrorCode.NONE, 0)
            await eventually("both follow", lambda: cluster.log_end(B, "t") == cluster.log_end(C, "t") == 1)
            from_a = cluster.fetchers(B).fetchers[A]
            assert list(cluster.fetchers(C).fetchers) == [A]

            cluster.change("t", leader=C)  # epoch 1: broker 1 moves to broker 2's fetcher, broker 0 follows too
            with trio.fail_after(PATIENCE):
                await from_a.ended.wait()
            assert list(cluster.fetchers(B).fetchers) == [C]
            assert list(cluster.fetchers(A).fetchers) == [C]
            assert cluster.fetchers(C).fetchers == {}
            assert await produced(cluster[C], "t", [b"b"]) == (ErrorCode.NONE, 1)
            await eventually("all have it", lambda: cluster.log_end(A, "t") == cluster.log_end(B, "t") == 2)
            expected = records_of(cluster.log(C, "t"))
            assert records_of(cluster.log(A, "t")) == records_of(cluster.log(B, "t")) == expected
            assert cluster.log(B, "t").leader_epochs.entries == cluster.log(C, "t").leader_epochs.entries
            assert values_of(expected) == [(0, b"a"), (1, b"b")]

    run(main)


def test_list_offsets_latest_is_the_log_end_for_a_replica_and_the_high_watermark_for_a_consumer(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with cluster_of(tmp_path) as cluster:
            await cluster.create("t", [A, B], [A, B])
            await eventually("broker 1 fetches", lambda: cluster.fetchers(B).state_of("t", 0) is not None)
            cluster.fetchers(B).unfollow("t", 0)  # the follower stops: the leader's high watermark stays
            assert await produced(cluster[A], "t", [b"a", b"b"]) == (ErrorCode.NONE, 0)

            async def latest(replica_id: int) -> tuple[int, int]:
                partition = ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)
                topic = ListOffsetsRequest.ListOffsetsTopic(name="t", partitions=[partition])
                request = ListOffsetsRequest(replica_id=replica_id, topics=[topic])
                answer = (await handle_list_offsets(context(cluster[A], 2, 7), request)).topics[0].partitions[0]
                return answer.error_code, answer.offset

            assert cluster.log(A, "t").high_watermark == 0
            assert await latest(-1) == (ErrorCode.NONE, 0)
            assert await latest(B) == (ErrorCode.NONE, 2)

    run(main)


def test_a_restarted_follower_opens_its_log_and_fetches_on_from_its_end(tmp_path: Path) -> None:
    async def main() -> None:
        async with cluster_of(tmp_path) as cluster, trio.open_nursery() as nursery:
            await cluster.create("t", [A, B], [A, B])
            assert await produced(cluster[A], "t", [b"a", b"b"]) == (ErrorCode.NONE, 0)
            await eventually("the follower has both", lambda: cluster.log_end(B, "t") == 2)
            await cluster.stop(B)
            assert await produced(cluster[A], "t", [b"c"]) == (ErrorCode.NONE, 2)
            cluster.make(B)  # its image (from its metadata log) says it follows broker 0: no new registration
            await cluster.start(B, nursery)
            await eventually("the restarted follower caught up", lambda: cluster.log_end(B, "t") == 3)
            assert records_of(cluster.log(B, "t")) == records_of(cluster.log(A, "t"))
            assert values_of(records_of(cluster.log(B, "t"))) == [(0, b"a"), (1, b"b"), (2, b"c")]
            nursery.cancel_scope.cancel()

    run(main)


# --- fetch sessions (KIP-227) --------------------------------------------------------------------------------


def record_requests(monkeypatch: pytest.MonkeyPatch) -> list[SessionRequest]:
    """Every request the followers' fetch sessions build, in order."""
    built: list[SessionRequest] = []
    build = FollowerSession.build

    def recording(
        self: FollowerSession, wanted: dict[tuple[str, int], PartitionFetch], **options: bool
    ) -> SessionRequest:
        request = build(self, wanted, **options)
        built.append(request)
        return request

    monkeypatch.setattr(FollowerSession, "build", recording)
    return built


def leader_session(cluster: Cluster, follower: int = B, leader: int = A) -> FetchSession | None:
    """The session of ``follower``'s fetcher in ``leader``'s cache."""
    fetcher = cluster.fetchers(follower).fetchers.get(leader)
    session_id = 0 if fetcher is None else fetcher.session.session_id
    return cluster[leader].fetch_sessions.get(session_id) if session_id else None


def session_key(cluster: Cluster, topic: str, max_fetch_version: int | None) -> tuple[object, int]:
    """How the leader's session knows partition 0 of ``topic``: by topic id from Fetch v13, by name before."""
    if max_fetch_version is not None and max_fetch_version < 13:
        return (topic, 0)
    return (cluster[A].metadata.image.topics.by_name[topic].topic_id, 0)


@pytest.mark.parametrize("max_fetch_version", [None, 12], ids=["topic-ids", "topic-names"])
def test_a_follower_fetches_in_a_session_naming_only_the_partitions_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_fetch_version: int | None
) -> None:
    built = record_requests(monkeypatch)

    async def main() -> None:
        async with cluster_of(tmp_path, max_fetch_version=max_fetch_version) as cluster:
            await cluster.create("t", [A, B], [A, B])
            await cluster.create("u", [A, B], [A, B])
            assert await produced(cluster[A], "u", [b"u0", b"u1"]) == (ErrorCode.NONE, 0)
            await eventually("u replicated", lambda: cluster.log_end(B, "u") == 2)
            await eventually(
                "the leader holds both", lambda: (s := leader_session(cluster)) is not None and len(s.partitions) == 2
            )
            quiet = len(built)
            for n in range(5):
                assert await produced(cluster[A], "t", [b"t%d" % n] * (n + 1)) == (ErrorCode.NONE, n * (n + 1) // 2)
            await eventually("t replicated", lambda: cluster.log_end(B, "t") == 15)
            await eventually("the high watermark told", lambda: cluster.log(B, "t").high_watermark == 15)
            for topic in ("t", "u"):
                assert records_of(cluster.log(B, topic)) == records_of(cluster.log(A, topic))

            # One full request opened the session; every later one was incremental, naming only what changed.
            assert built[0].full and built[0].session_id == 0
            assert not any(request.full for request in built[1:])
            session = cluster.fetchers(B).fetchers[A].session
            assert session.session_id != 0 and set(session.partitions) == {("t", 0), ("u", 0)}
            after = built[quiet:]
            assert all(set(r.to_send) <= {("t", 0)} and r.to_forget == [] for r in after)
            offsets = [r.to_send[("t", 0)].fetch_offset for r in after if r.to_send]
            assert offsets == sorted(set(offsets)) and offsets[-1] == 15  # sent when its position moved, only then
            assert any(not r.to_send for r in after)  # polls naming nothing: the leader fetched from its cache

            # The leader's cache has the follower's session, as the follower last named each partition.
            held = leader_session(cluster)
            assert held is not None
            assert held.epoch >= len(built) - 1  # each incremental request served moved it on
            cached = held.partitions[session_key(cluster, "t", max_fetch_version)]
            assert (cached.fetch_offset, cached.current_leader_epoch, cached.fetcher_log_start_offset) == (15, 0, 0)
            assert cached.last_fetched_epoch == 0 and cached.high_watermark == 15
            assert held.partitions[session_key(cluster, "u", max_fetch_version)].fetch_offset == 2

    run(main)


def test_a_fenced_partition_leaves_the_session_and_is_sent_again_with_its_next_registration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = record_requests(monkeypatch)

    async def main() -> None:
        async with cluster_of(tmp_path) as cluster:
            await cluster.create("t", [A, B], [A, B])
            await cluster.create("u", [A, B], [A, B])
            t_id = cluster[A].metadata.image.topics.by_name["t"].topic_id
            await eventually(
                "the leader holds both", lambda: (s := leader_session(cluster)) is not None and len(s.partitions) == 2
            )
            # Broker 0 moves t to epoch 2 while broker 1 still has epoch 0: the leader checks the epoch it cached.
            change_partition(cluster[A], "t", 0, leader=B)
            change_partition(cluster[A], "t", 0, leader=A)
            assert await produced(cluster[A], "t", [b"a"]) == (ErrorCode.NONE, 0)
            await eventually("fenced", lambda: (s := cluster.fetchers(B).state_of("t", 0)) is not None and s.parked)
            await eventually("t forgotten", lambda: any(Forgotten("t", t_id, 0) in r.to_forget for r in built))
            held = leader_session(cluster)
            assert held is not None and list(held.partitions) == [session_key(cluster, "u", None)]
            assert await produced(cluster[A], "u", [b"u"]) == (ErrorCode.NONE, 0)  # u goes on meanwhile
            await eventually("u replicated", lambda: cluster.log_end(B, "u") == 1)
            assert cluster.log_end(B, "t") == 0

            # The registration in epoch 2 arrives: t is sent again in full, in that epoch, and catches up.
            resumed = len(built)
            change_partition(cluster[B], "t", 0, leader=B)
            change_partition(cluster[B], "t", 0, leader=A)
            await eventually("t caught up", lambda: cluster.log_end(B, "t") == 1)
            sent_again = [r.to_send[("t", 0)] for r in built[resumed:] if ("t", 0) in r.to_send]
            assert sent_again[0][:5] == (t_id, 0, 0, 1_048_576, 2)  # its topic, offset, log start, size, epoch
            assert not any(r.full for r in built[resumed:])
            for topic in ("t", "u"):
                assert records_of(cluster.log(B, topic)) == records_of(cluster.log(A, topic))

    run(main)


def test_a_session_the_leader_lost_or_fell_out_of_step_with_is_opened_again_by_a_full_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = record_requests(monkeypatch)

    async def main() -> None:
        async with cluster_of(tmp_path) as cluster:
            await cluster.create("t", [A, B], [A, B])
            await eventually("a session", lambda: leader_session(cluster) is not None)
            fetcher = cluster.fetchers(B).fetchers[A]
            cache = cluster[A].fetch_sessions

            # As a restarted leader: the session is gone (FETCH_SESSION_ID_NOT_FOUND), a new one is opened.
            first = fetcher.session.session_id
            cache.remove(first)
            lost = len(built)
            assert await produced(cluster[A], "t", [b"a"]) == (ErrorCode.NONE, 0)
            await eventually("a new session", lambda: fetcher.session.session_id not in (0, first))
            assert [(r.session_id, r.epoch) for r in built[lost:] if r.full][0] == (0, 0)
            await eventually("replicated", lambda: cluster.log_end(B, "t") == 1)

            # Out of step (INVALID_FETCH_SESSION_EPOCH): a full fetch closes the session and opens another.
            second = fetcher.session.session_id
            held = cache.get(second)
            assert held is not None
            held.epoch += 5
            stepped = len(built)
            assert await produced(cluster[A], "t", [b"b", b"c"]) == (ErrorCode.NONE, 1)
            await eventually("another session", lambda: fetcher.session.session_id not in (0, second))
            assert [(r.session_id, r.epoch) for r in built[stepped:] if r.full][0] == (second, 0)
            assert cache.get(second) is None and leader_session(cluster) is not None
            await eventually("replicated", lambda: cluster.log_end(B, "t") == 3)
            assert records_of(cluster.log(B, "t")) == records_of(cluster.log(A, "t"))

    run(main)
