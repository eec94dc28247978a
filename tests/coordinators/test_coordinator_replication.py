"""Coordinator records are written through the replica layer (kbroker/replication): a commit is answered once the
high watermark passed its batch, as an acks=all produce, and not while a follower in the ISR lags."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
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
