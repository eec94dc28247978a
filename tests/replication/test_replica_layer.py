"""The replica layer (kbroker/replication) through the Produce, Fetch, ListOffsets and DeleteRecords handlers, on
the in-memory engine: a single node's behaviour (every partition led alone, the high watermark at the log end),
and, by feeding the layer a registration with followers (what the metadata image will do), Kafka's acks
semantics: NOT_ENOUGH_REPLICAS for acks=all below min.insync.replicas, acks=all held until the followers have the
batch (REQUEST_TIMED_OUT at the produce timeout), follower fetches reading to the log end and moving the high
watermark, and a replica that stopped leading refusing clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from kbroker.apis.fetch import handle_fetch
from kbroker.apis.produce import handle_produce
from kbroker.broker import Broker
from kbroker.metadata.image import PartitionRegistration  # the metadata image's registrations feed the layer
from kbroker.replication import Role
from protocol.errors import ErrorCode
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.messages.produce_response import ProduceResponse
from tests.broker.test_handlers_in_memory import batch, context, create, delete_records, list_offset, run, values_of
from tests.replication.conftest import NODE, in_memory_broker

FOLLOWER = 1
LATEST = -1


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with in_memory_broker(tmp_path / "data") as broker:
        yield broker


def produce_request(topic: str, values: list[bytes], acks: int, timeout_ms: int = 5000) -> ProduceRequest:
    data = [ProduceRequest.PartitionProduceData(index=0, records=batch(values))]
    return ProduceRequest(
        acks=acks, timeout_ms=timeout_ms, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=data)]
    )


def produce(broker: Broker, topic: str, values: list[bytes], acks: int) -> tuple[int, int] | None:
    response = run(lambda: handle_produce(context(broker, 0, 9), produce_request(topic, values, acks)))
    if response is None:
        return None
    answer = response.responses[0].partition_responses[0]
    return answer.error_code, answer.base_offset


Read = tuple[int, int, list[tuple[int, bytes | None]]]


def fetch(broker: Broker, topic: str, offset: int, *, replica_id: int = -1, epoch: int = -1) -> Read:
    """(error code, high watermark, [(offset, value)]) of a Fetch v12 from ``replica_id`` (-1: a consumer)."""
    partition = FetchRequest.FetchPartition(
        partition=0, fetch_offset=offset, partition_max_bytes=1 << 20, current_leader_epoch=epoch
    )
    request = FetchRequest(
        replica_id=replica_id,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[partition])],
    )
    answer = run(lambda: handle_fetch(context(broker, 1, 12), request)).responses[0].partitions[0]
    return answer.error_code, answer.high_watermark, values_of(answer.records) if answer.records else []


def with_follower(broker: Broker, topic: str, *, isr: tuple[int, ...], min_insync: int = 1, epoch: int = 1) -> None:
    """Make ``topic``-0 have a follower (broker FOLLOWER), as a metadata image would say."""
    run(lambda: broker.topics.alter_configs(topic, {"min.insync.replicas": str(min_insync)}))
    broker.replicas.apply(topic, 0, PartitionRegistration((NODE, FOLLOWER), isr, NODE, epoch, epoch))


def test_a_single_node_leads_every_partition_and_min_insync_replicas_is_capped_by_the_replicas(broker: Broker) -> None:
    create(broker, "t")
    run(lambda: broker.topics.alter_configs("t", {"min.insync.replicas": "2"}))
    partition = broker.replicas.partition("t", 0)
    assert partition is not None
    state = (partition.role, partition.isr, partition.leader_id, partition.effective_min_isr)
    assert state == (Role.LEADER, (NODE,), NODE, 1)
    # Kafka's effectiveMinIsr: one replica, so acks=all is accepted whatever min.insync.replicas says.
    answers = [produce(broker, "t", [b"a"], acks) for acks in (-1, 1, 0)]
    assert answers == [(ErrorCode.NONE, 0), (ErrorCode.NONE, 1), None]
    assert fetch(broker, "t", 0) == (ErrorCode.NONE, 3, [(0, b"a"), (1, b"a"), (2, b"a")])


def test_acks_all_below_min_insync_replicas_is_refused_and_acks_1_and_0_are_written(broker: Broker) -> None:
    create(broker, "t")
    with_follower(broker, "t", isr=(NODE,), min_insync=2)
    assert produce(broker, "t", [b"refused"], -1) == (ErrorCode.NOT_ENOUGH_REPLICAS, -1)
    assert produce(broker, "t", [b"one"], 1) == (ErrorCode.NONE, 0)
    assert produce(broker, "t", [b"zero"], 0) is None
    assert list_offset(broker, "t", LATEST) == (ErrorCode.NONE, 0, -1)  # under min ISR the HW does not move (KIP-966)
    # The follower reads everything there is, the consumer nothing yet.
    assert fetch(broker, "t", 0, replica_id=FOLLOWER) == (ErrorCode.NONE, 0, [(0, b"one"), (1, b"zero")])
    assert fetch(broker, "t", 0) == (ErrorCode.NONE, 0, [])
    # Back in the ISR with the log end it fetched from: the high watermark moves, consumers read.
    broker.replicas.apply("t", 0, PartitionRegistration((NODE, FOLLOWER), (NODE, FOLLOWER), NODE, 1, 2))
    assert fetch(broker, "t", 2, replica_id=FOLLOWER)[0] == ErrorCode.NONE
    assert fetch(broker, "t", 0) == (ErrorCode.NONE, 2, [(0, b"one"), (1, b"zero")])
    assert produce(broker, "t", [b"all"], 1) == (ErrorCode.NONE, 2)


def test_acks_all_waits_for_the_follower_and_times_out_without_it(broker: Broker) -> None:
    create(broker, "t")
    with_follower(broker, "t", isr=(NODE, FOLLOWER))
    timed_out = run(lambda: handle_produce(context(broker, 0, 9), produce_request("t", [b"a"], -1, timeout_ms=2000)))
    assert timed_out is not None
    answer = timed_out.responses[0].partition_responses[0]
    assert (answer.error_code, answer.base_offset) == (ErrorCode.REQUEST_TIMED_OUT, 0)  # written, not replicated
    assert broker.replicas.partition("t", 0).high_watermark == 0  # type: ignore[union-attr]
    answers: list[ProduceResponse] = []
    waited: list[float] = []

    async def main() -> None:
        async def producer() -> None:
            start = trio.current_time()
            response = await handle_produce(context(broker, 0, 9), produce_request("t", [b"b"], -1, timeout_ms=30_000))
            assert response is not None
            answers.append(response)
            waited.append(trio.current_time() - start)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.sleep(5)
            assert not answers  # held: the follower has neither record
            assert fetch_now(broker, 1) == 0  # it has the first: the high watermark moves to 1, not past "b"
            await trio.sleep(1)
            assert not answers
            assert fetch_now(broker, 2) == 1  # it has both (told the new high watermark at its next fetch)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    answer = answers[0].responses[0].partition_responses[0]
    assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 1)
    assert 6 <= waited[0] < 30  # answered when the follower had the batch, not at the timeout
    assert fetch(broker, "t", 0) == (ErrorCode.NONE, 2, [(0, b"a"), (1, b"b")])


def fetch_now(broker: Broker, offset: int) -> int:
    """The follower's fetch from ``offset``, inside a running trio loop; the high watermark it was told."""
    partition = broker.replicas.partition("t", 0)
    assert partition is not None
    assert partition.fetch_error(FOLLOWER, -1) == ErrorCode.NONE
    told = partition.high_watermark
    partition.record_follower_fetch(FOLLOWER, offset, 0, 0, partition.log.log_end_offset)
    return told


def test_a_waiting_acks_all_is_answered_not_leader_when_the_replica_becomes_a_follower(broker: Broker) -> None:
    create(broker, "t")
    with_follower(broker, "t", isr=(NODE, FOLLOWER))
    answers: list[ProduceResponse] = []

    async def main() -> None:
        async def producer() -> None:
            response = await handle_produce(context(broker, 0, 9), produce_request("t", [b"a"], -1, timeout_ms=30_000))
            assert response is not None
            answers.append(response)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.sleep(1)
            broker.replicas.apply("t", 0, PartitionRegistration((NODE, FOLLOWER), (FOLLOWER,), FOLLOWER, 2, 2))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert answers[0].responses[0].partition_responses[0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    # A follower serves neither producers nor other followers; a consumer's Fetch v11+ reads it up to its high
    # watermark (KIP-392, as Kafka's): "a" was never committed.
    assert produce(broker, "t", [b"b"], 1) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)
    assert fetch(broker, "t", 0, replica_id=FOLLOWER)[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert fetch(broker, "t", 0) == (ErrorCode.NONE, 0, [])
    assert list_offset(broker, "t", LATEST)[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert delete_records(broker, "t", 0)[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_a_fetch_from_a_replica_the_partition_does_not_have_is_refused_as_kafka_refuses_it(broker: Broker) -> None:
    create(broker, "t")
    produce(broker, "t", [b"a"], 1)
    # Alone (a single node): no other replica may fetch; one that names the epoch is told to retry with it.
    assert fetch(broker, "t", 0, replica_id=FOLLOWER) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, [])
    assert fetch(broker, "t", 0, replica_id=FOLLOWER, epoch=0) == (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, [])
    assert fetch(broker, "t", 0, replica_id=FOLLOWER, epoch=1) == (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, [])
    with_follower(broker, "t", isr=(NODE, FOLLOWER), epoch=3)  # a newer epoch starts at the log end
    assert fetch(broker, "t", 0, replica_id=FOLLOWER, epoch=2) == (ErrorCode.FENCED_LEADER_EPOCH, -1, [])
    assert fetch(broker, "t", 0, replica_id=FOLLOWER, epoch=3) == (ErrorCode.NONE, 1, [(0, b"a")])
    follower = broker.replicas.partition("t", 0).remote[FOLLOWER]  # type: ignore[union-attr]
    assert (follower.log_end_offset, follower.last_fetch_leader_log_end_offset) == (0, 1)


def test_a_waiting_acks_all_is_answered_not_leader_when_its_topic_is_deleted(broker: Broker) -> None:
    create(broker, "t")
    with_follower(broker, "t", isr=(NODE, FOLLOWER))
    answers: list[ProduceResponse] = []

    async def main() -> None:
        async def producer() -> None:
            response = await handle_produce(context(broker, 0, 9), produce_request("t", [b"a"], -1, timeout_ms=30_000))
            assert response is not None
            answers.append(response)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.testing.wait_all_tasks_blocked()  # the produce waits for its follower
            # On the real clock: the deletion commits to the metadata log in a worker thread, and a mock clock
            # would jump to the produce's timeout meanwhile.
            await broker.topics.delete("t")

    trio.run(main)
    assert answers[0].responses[0].partition_responses[0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert broker.replicas.partition("t", 0) is None
