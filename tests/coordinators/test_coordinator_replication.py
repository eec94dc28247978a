"""Coordinator records are written through the replica layer (kbroker/replication): a commit is answered once the
high watermark passed its batch, as an acks=all produce, and not while a follower in the ISR lags."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
from kbroker.groups.coordinator import GroupState, SyncResult
from kbroker.groups.offsets import OFFSETS_TOPIC, CommittedOffset
from kbroker.metadata.image import PartitionRegistration
from kbroker.storage import LogManager
from protocol.errors import ErrorCode, KafkaError

NODE, FOLLOWER = 0, 1


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    config = BrokerConfig({"node.id": str(NODE), "offsets.topic.num.partitions": "1"})
    logs = LogManager.in_memory_store(config.topic_defaults())
    broker = Broker(config, tmp_path / "data", Endpoint("localhost", 9092), logs=logs)
    broker.offsets.ensure_topic()
    try:
        yield broker
    finally:
        broker.close()


def commit(broker: Broker, offset: int) -> int:
    return broker.offsets.commit("g", {("orders", 0): CommittedOffset(offset, -1, None, 0)})


def test_a_commit_waits_for_the_follower_in_the_isr(broker: Broker) -> None:
    broker.replicas.apply(OFFSETS_TOPIC, 0, PartitionRegistration((NODE, FOLLOWER), (NODE, FOLLOWER), NODE, 1, 1))
    partition = broker.replicas.partition(OFFSETS_TOPIC, 0)
    assert partition is not None
    answered: list[float] = []

    async def scenario() -> None:
        end = commit(broker, 5)
        async with trio.open_nursery() as nursery:

            async def wait() -> None:
                await broker.offsets.committed("g", end)
                answered.append(trio.current_time())

            nursery.start_soon(wait)
            await trio.sleep(1)
            assert answered == [] and partition.log.high_watermark < end  # the follower has not fetched it
            partition.record_follower_fetch(FOLLOWER, end, 0, 0, partition.log.log_end_offset)
        assert answered and partition.log.high_watermark == end

    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_commit_not_committed_in_time_times_out_and_one_to_a_follower_is_not_coordinator(broker: Broker) -> None:
    broker.replicas.apply(OFFSETS_TOPIC, 0, PartitionRegistration((NODE, FOLLOWER), (NODE, FOLLOWER), NODE, 1, 1))

    async def lagging() -> None:
        end = commit(broker, 5)
        with pytest.raises(KafkaError) as raised:
            await broker.offsets.committed("g", end)
        assert raised.value.code == ErrorCode.REQUEST_TIMED_OUT

    trio.run(lagging, clock=trio.testing.MockClock(autojump_threshold=0))
    assert broker.offsets.get("g")[("orders", 0)].offset == 5
    replica = broker.replicas.partition(OFFSETS_TOPIC, 0)
    assert replica is not None
    end = replica.log.log_end_offset
    # A follower: the shard is unloaded with the leadership, and a commit is refused without being written.
    broker.replicas.apply(OFFSETS_TOPIC, 0, PartitionRegistration((NODE, FOLLOWER), (FOLLOWER,), FOLLOWER, 2, 2))
    assert 0 not in broker.offsets.runtime.shards
    with pytest.raises(Exception, match="not loaded on this broker"):
        commit(broker, 6)
    assert replica.log.log_end_offset == end


def sync_as_only_member(broker: Broker, while_waiting: Callable[[], None]) -> tuple[list[SyncResult], GroupState]:
    """A new classic group of one member: its JoinGroup, then its SyncGroup as leader; ``while_waiting`` runs a
    virtual second after the SyncGroup was sent. What the SyncGroup answered, and the group's state then."""
    classic = broker.groups
    answers: list[SyncResult] = []
    seen_while_waiting: list[tuple[int, GroupState]] = []

    async def scenario() -> None:
        async with trio.open_nursery() as timers:
            await timers.start(broker.coordinator_timers.run)  # the initial rebalance delay, the sync deadline
            await run_group()
            timers.cancel_scope.cancel()

    async def run_group() -> None:
        joined = await classic.join(
            "g", "", None, "client", "/10.0.0.1", 10000, 30000, "consumer", [("range", b"sub")], False
        )
        assert joined.error_code == ErrorCode.NONE and joined.leader == joined.member_id
        assignment = {joined.member_id: b"orders-0"}
        async with trio.open_nursery() as nursery:

            async def sync() -> None:
                answers.append(
                    await classic.sync("g", joined.generation_id, joined.member_id, None, None, None, assignment)
                )

            nursery.start_soon(sync)
            await trio.sleep(1)
            seen_while_waiting.append((len(answers), classic.groups["g"].state))
            while_waiting()

    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))
    # Not answered while its assignment was not committed: the group was still completing its rebalance.
    assert seen_while_waiting == [(0, GroupState.COMPLETING_REBALANCE)]
    return answers, classic.groups["g"].state


def test_a_leaders_sync_group_is_answered_once_the_assignment_is_committed(broker: Broker) -> None:
    """As Kafka's coordinator: the SyncGroup that completes a rebalance is answered once the group's GroupMetadata
    record is replicated to the ISR (the high watermark passed it), so no member works on an assignment a
    failover could take back."""
    broker.replicas.apply(OFFSETS_TOPIC, 0, PartitionRegistration((NODE, FOLLOWER), (NODE, FOLLOWER), NODE, 1, 1))
    partition = broker.replicas.partition(OFFSETS_TOPIC, 0)
    assert partition is not None

    def follower_fetches() -> None:
        end = partition.log.log_end_offset
        partition.record_follower_fetch(FOLLOWER, end, 0, 0, end)

    answers, state = sync_as_only_member(broker, follower_fetches)
    assert [(a.error_code, a.assignment) for a in answers] == [(ErrorCode.NONE, b"orders-0")]
    assert state == GroupState.STABLE
    assert [(g.generation_id, g.leader_id) for g in broker.offsets.stored_groups()] == [
        (1, broker.groups.groups["g"].leader_id)
    ]


def test_a_leaders_sync_group_whose_assignment_is_not_committed_in_time_is_answered_coordinator_not_available(
    broker: Broker,
) -> None:
    """The follower in the ISR never fetches: the write times out (REQUEST_TIMED_OUT), answered as Kafka maps it
    (COORDINATOR_NOT_AVAILABLE: the member finds the coordinator and rejoins), and the group rebalances again
    instead of becoming Stable on an uncommitted assignment."""
    broker.replicas.apply(OFFSETS_TOPIC, 0, PartitionRegistration((NODE, FOLLOWER), (NODE, FOLLOWER), NODE, 1, 1))

    answers, state = sync_as_only_member(broker, lambda: None)
    assert [(a.error_code, a.assignment) for a in answers] == [(ErrorCode.COORDINATOR_NOT_AVAILABLE, b"")]
    assert state == GroupState.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in broker.groups.groups["g"].members.values())
