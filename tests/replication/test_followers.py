"""The replica layer with a follower, on one process: a second broker registered in the image and two-replica
partitions created through the controller (tests/replication/two_brokers.py). Replica fetches read to the log
end and move the high watermark; the ISR shrinks and grows through the controller (PartitionChangeRecords with a
bumped partition epoch) as followers lag and catch up, on an explicit clock; acks=all answers
NOT_ENOUGH_REPLICAS / NOT_ENOUGH_REPLICAS_AFTER_APPEND by the ISR; fetchers whose log diverges are told where
(diverging_epoch); NOT_LEADER_OR_FOLLOWER answers name the current leader (KIP-951); the ReplicaManager gauges
count it all."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import trio
import trio.testing

from kbroker.apis.fetch import handle_fetch
from kbroker.apis.produce import handle_produce
from kbroker.apis.txn_markers import handle_write_txn_markers
from kbroker.broker import Broker
from kbroker.metadata.image import PartitionRegistration
from kbroker.metrics import families
from kbroker.replication import IsrProposal, Partition
from kbroker.storage import LogManager, TopicInfo
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.produce_request import ProduceRequest
from protocol.messages.produce_response import ProduceResponse
from protocol.messages.write_txn_markers_request import WriteTxnMarkersRequest
from protocol.messages.write_txn_markers_response import WriteTxnMarkersResponse
from tests.broker.test_handlers_in_memory import batch, context, values_of
from tests.replication.conftest import NODE, in_memory_broker
from tests.replication.two_brokers import (
    OTHER,
    OTHER_HOST,
    OTHER_PORT,
    change_partition,
    create_replicated,
    register_broker,
    registration,
)

T = 1_800_000_000_000  # the replica layer's clock in these tests (milliseconds)
Result = TypeVar("Result")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with in_memory_broker(tmp_path / "data") as broker:
        yield broker


class Clock:
    """The replica layer's wall clock, moved by hand."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def clock(broker: Broker) -> Clock:
    clock = Clock(T)
    broker.replicas.clock = clock
    return clock


def run(main: Callable[[], Awaitable[Result]]) -> Result:
    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def produce(
    broker: Broker, topic: str, values: list[bytes], acks: int, *, version: int = 9, timeout_ms: int = 5000
) -> ProduceResponse | None:
    data = [ProduceRequest.PartitionProduceData(index=0, records=batch(values))]
    request = ProduceRequest(
        acks=acks, timeout_ms=timeout_ms, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=data)]
    )
    return await handle_produce(context(broker, 0, version), request)


async def produced(broker: Broker, topic: str, values: list[bytes], acks: int = 1) -> tuple[int, int]:
    """(error code, base offset) of a Produce v9."""
    response = await produce(broker, topic, values, acks)
    assert response is not None
    answer = response.responses[0].partition_responses[0]
    return answer.error_code, answer.base_offset


async def fetch(
    broker: Broker,
    topic: str,
    offset: int,
    *,
    replica_id: int = -1,
    broker_epoch: int = -1,
    current_epoch: int = -1,
    last_fetched_epoch: int = -1,
    version: int = 15,
) -> FetchResponse:
    """A Fetch (v13+: by topic id, else by name) of partition 0 from ``offset``, by a consumer or (``replica_id``) a
    follower."""
    topic_id = broker.metadata.image.topics.by_name[topic].topic_id
    partition = FetchRequest.FetchPartition(
        partition=0,
        fetch_offset=offset,
        partition_max_bytes=1 << 20,
        current_leader_epoch=current_epoch,
        last_fetched_epoch=last_fetched_epoch,
    )
    request = FetchRequest(
        replica_id=replica_id,
        replica_state=FetchRequest.ReplicaState(replica_id=replica_id, replica_epoch=broker_epoch),
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[FetchRequest.FetchTopic(topic=topic, topic_id=topic_id, partitions=[partition])],
    )
    return await handle_fetch(context(broker, 1, version), request)


Read = tuple[int, int, list[tuple[int, bytes | None]]]


async def read(broker: Broker, topic: str, offset: int, **options: int) -> Read:
    """(error code, high watermark, [(offset, value)]) of a fetch of partition 0."""
    answer = (await fetch(broker, topic, offset, **options)).responses[0].partitions[0]
    return answer.error_code, answer.high_watermark, values_of(answer.records) if answer.records else []


def replica(broker: Broker, topic: str) -> Partition:
    partition = broker.replicas.partition(topic, 0)
    assert partition is not None
    return partition


def gauges(broker: Broker) -> dict[str, float]:
    """The ReplicaManager gauges and partition t-0's gauges, by name."""
    values = {}
    t0 = {"topic": "t", "partition": "0"}
    for family in families(broker):
        for sample in family.samples:
            if family.name.startswith("kafka_server_replicamanager_"):
                values[family.name.removeprefix("kafka_server_replicamanager_")] = sample.value
            elif family.name.startswith("kafka_cluster_partition_") and sample.labels == t0:
                values[family.name.removeprefix("kafka_cluster_")] = sample.value
    return values


# --- replica fetches -------------------------------------------------------------------------------------


def test_a_follower_reads_to_the_log_end_and_its_position_moves_the_high_watermark(broker: Broker) -> None:
    async def main() -> None:
        epoch = register_broker(broker)
        await create_replicated(broker, "t", [[NODE, OTHER]])
        assert registration(broker, "t") == PartitionRegistration((NODE, OTHER), (NODE, OTHER), NODE, 0, 0)
        assert await produced(broker, "t", [b"a", b"b"]) == (ErrorCode.NONE, 0)
        assert await produced(broker, "t", [b"c"]) == (ErrorCode.NONE, 2)
        # The follower in the ISR has not fetched: consumers see nothing yet.
        assert await read(broker, "t", 0) == (ErrorCode.NONE, 0, [])
        everything = [(0, b"a"), (1, b"b"), (2, b"c")]
        assert await read(broker, "t", 0, replica_id=OTHER, broker_epoch=epoch) == (ErrorCode.NONE, 0, everything)
        follower = replica(broker, "t").remote[OTHER]
        assert (follower.log_end_offset, follower.broker_epoch) == (0, epoch)
        # Its next fetch says it has everything: the answer carries the high watermark read before that.
        assert await read(broker, "t", 3, replica_id=OTHER, broker_epoch=epoch) == (ErrorCode.NONE, 0, [])
        assert replica(broker, "t").high_watermark == 3
        assert await read(broker, "t", 0) == (ErrorCode.NONE, 3, everything)
        assert await read(broker, "t", 3, replica_id=OTHER, broker_epoch=epoch) == (ErrorCode.NONE, 3, [])
        # A broker that is not a replica of the partition is refused as Kafka refuses it.
        assert (await read(broker, "t", 0, replica_id=7))[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert (await read(broker, "t", 0, replica_id=7, current_epoch=0))[0] == ErrorCode.UNKNOWN_LEADER_EPOCH

    run(main)


def test_acks_all_waits_for_the_follower_and_is_answered_when_its_fetch_covers_the_batch(broker: Broker) -> None:
    answers: list[tuple[int, int]] = []

    async def main() -> None:
        epoch = register_broker(broker)
        await create_replicated(broker, "t", [[NODE, OTHER]], {"min.insync.replicas": "2"})

        async def producer() -> None:
            answers.append(await produced(broker, "t", [b"a"], acks=-1))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.testing.wait_all_tasks_blocked()
            assert not answers
            await read(broker, "t", 0, replica_id=OTHER, broker_epoch=epoch)  # it has nothing yet
            await trio.testing.wait_all_tasks_blocked()
            assert not answers
            await read(broker, "t", 1, replica_id=OTHER, broker_epoch=epoch)  # it has the batch

    run(main)
    assert answers == [(ErrorCode.NONE, 0)]


def test_a_waiting_consumer_fetch_is_answered_when_a_follower_fetch_moves_the_high_watermark(broker: Broker) -> None:
    answers: list[Read] = []

    async def main() -> None:
        epoch = register_broker(broker)
        await create_replicated(broker, "t", [[NODE, OTHER]])
        assert await produced(broker, "t", [b"a"]) == (ErrorCode.NONE, 0)
        topic_id = broker.metadata.image.topics.by_name["t"].topic_id
        partition = FetchRequest.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
        request = FetchRequest(
            max_wait_ms=60_000,
            min_bytes=1,
            max_bytes=1 << 20,
            topics=[FetchRequest.FetchTopic(topic_id=topic_id, partitions=[partition])],
        )

        async def consumer() -> None:
            start = trio.current_time()
            data = (await handle_fetch(context(broker, 1, 15), request)).responses[0].partitions[0]
            answers.append((data.error_code, data.high_watermark, values_of(data.records)))
            assert trio.current_time() - start < 60  # answered by the follower's fetch, not at max_wait_ms

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer)
            await trio.testing.wait_all_tasks_blocked()
            assert not answers
            await read(broker, "t", 1, replica_id=OTHER, broker_epoch=epoch)

    run(main)
    assert answers == [(ErrorCode.NONE, 1, [(0, b"a")])]


# --- the ISR ------------------------------------------------------------------------------------------------


def test_a_lagging_follower_leaves_the_isr_and_rejoins_once_caught_up(broker: Broker, clock: Clock) -> None:
    async def main() -> None:
        epoch = register_broker(broker)
        await create_replicated(broker, "t", [[NODE, OTHER]], {"min.insync.replicas": "2"})
        partition = replica(broker, "t")
        assert await produced(broker, "t", [b"a"]) == (ErrorCode.NONE, 0)
        clock.now_ms = T + 1000
        await read(broker, "t", 1, replica_id=OTHER, broker_epoch=epoch)  # caught up at T + 1000
        assert partition.high_watermark == 1
        clock.now_ms = T + 2000
        assert await produced(broker, "t", [b"b"]) == (ErrorCode.NONE, 1)
        assert gauges(broker)["partition_underreplicated"] == 0

        # replica.lag.time.max.ms (30 s) after it was last caught up it is still in sync; a millisecond later not.
        assert broker.replicas.maybe_shrink_isrs(T + 1000 + 30_000) == 0
        assert broker.replicas.maybe_shrink_isrs(T + 1000 + 30_001) == 1
        assert partition.pending_isr == IsrProposal(0, 0, ((NODE, -1),))
        assert partition.maximal_isr == (NODE, OTHER)  # until the controller decides
        assert broker.replicas.maybe_shrink_isrs(T + 1000 + 30_002) == 0  # one change in flight at a time
        await broker.replicas.send_isr_changes()
        assert registration(broker, "t") == PartitionRegistration((NODE, OTHER), (NODE,), NODE, 0, 1)
        assert (partition.isr, partition.partition_epoch, partition.pending_isr) == ((NODE,), 1, None)

        # Below min.insync.replicas: acks=all is refused before anything is written, acks=1 is written.
        assert await produced(broker, "t", [b"refused"], acks=-1) == (ErrorCode.NOT_ENOUGH_REPLICAS, -1)
        assert await produced(broker, "t", [b"c"], acks=1) == (ErrorCode.NONE, 2)
        assert partition.high_watermark == 1  # under min ISR the high watermark stays
        assert gauges(broker) == {
            "partitioncount": 1,
            "leadercount": 1,
            "offlinereplicacount": 0,
            "underreplicatedpartitions": 1,
            "underminisrpartitioncount": 1,
            "atminisrpartitioncount": 0,
            "partition_underreplicated": 1,
            "partition_underminisr": 1,
            "partition_atminisr": 0,
            "partition_insyncreplicascount": 1,
            "partition_replicascount": 2,
            "isrshrinks": 1,
            "isrexpands": 0,
            "failedisrupdates": 0,
        }

        # Back at the high watermark in this leader epoch: proposed for the ISR, with the broker epoch it fetched in.
        clock.now_ms = T + 40_000
        await read(broker, "t", 1, replica_id=OTHER, broker_epoch=epoch)
        assert partition.pending_isr == IsrProposal(0, 1, ((NODE, -1), (OTHER, epoch)))
        await broker.replicas.send_isr_changes()
        assert registration(broker, "t") == PartitionRegistration((NODE, OTHER), (NODE, OTHER), NODE, 0, 2)
        assert partition.high_watermark == 1
        await read(broker, "t", 3, replica_id=OTHER, broker_epoch=epoch)
        assert partition.high_watermark == 3
        values = gauges(broker)
        assert (values["underreplicatedpartitions"], values["underminisrpartitioncount"]) == (0, 0)
        assert (values["atminisrpartitioncount"], values["partition_insyncreplicascount"]) == (1, 2)
        assert (values["isrshrinks"], values["isrexpands"], values["failedisrupdates"]) == (1, 1, 0)

    run(main)


def test_the_replica_manager_checks_for_lagging_followers_and_sends_isr_changes_on_its_own(
    broker: Broker, clock: Clock
) -> None:
    async def main() -> None:
        epoch = register_broker(broker)
        await create_replicated(broker, "t", [[NODE, OTHER]])
        replica(broker, "t")  # its log opened (as a produce or fetch opens it): led from T
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.replicas.run)
            clock.now_ms = T + 30_001  # in the ISR since T, and it has never fetched
            await trio.sleep(14.9)  # the check runs every half replica.lag.time.max.ms
            assert registration(broker, "t").isr == (NODE, OTHER)
            await trio.sleep(0.2)
            assert registration(broker, "t") == PartitionRegistration((NODE, OTHER), (NODE,), NODE, 0, 1)
            await read(broker, "t", 0, replica_id=OTHER, broker_epoch=epoch)  # it has all there is
            await trio.testing.wait_all_tasks_blocked()
            assert registration(broker, "t") == PartitionRegistration((NODE, OTHER), (NODE, OTHER), NODE, 0, 2)
            nursery.cancel_scope.cancel()

    run(main)


def test_a_follower_fetching_with_another_broker_epoch_is_not_proposed_for_the_isr(broker: Broker) -> None:
    async def main() -> None:
        epoch = register_broker(broker)
        await create_replicated(broker, "t", [[NODE, OTHER]])
        change_partition(broker, "t", 0, isr=[NODE])
        partition = replica(broker, "t")
        await read(broker, "t", 0, replica_id=OTHER, broker_epoch=epoch + 1)  # a previous incarnation's fetch
        assert partition.pending_isr is None
        await read(broker, "t", 0, replica_id=OTHER, broker_epoch=epoch)
        assert partition.pending_isr == IsrProposal(0, 1, ((NODE, -1), (OTHER, epoch)))

    run(main)


def test_acks_all_whose_batch_is_replicated_as_the_isr_shrinks_answers_not_enough_replicas_after_append(
    broker: Broker,
) -> None:
    answers: list[tuple[int, int]] = []

    async def main() -> None:
        epoch = register_broker(broker)
        await create_replicated(broker, "t", [[NODE, OTHER]], {"min.insync.replicas": "2"})
        partition = replica(broker, "t")

        async def producer() -> None:
            answers.append(await produced(broker, "t", [b"a"], acks=-1))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.testing.wait_all_tasks_blocked()
            # In one step: the follower's fetch covers the batch, then the image removes it from the ISR.
            partition.record_follower_fetch(OTHER, 1, 0, T, partition.log.log_end_offset, epoch)
            assert partition.high_watermark == 1
            change_partition(broker, "t", 0, isr=[NODE])

    run(main)
    assert answers == [(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, 0)]


def test_the_controller_checks_isr_changes_as_kafkas_does(broker: Broker) -> None:
    async def main() -> None:
        epoch = register_broker(broker)
        topic = await create_replicated(broker, "t", [[NODE, OTHER]])
        own_epoch = broker.metadata.image.brokers[NODE].epoch

        async def alter(
            broker_id: int = NODE,
            broker_epoch: int = own_epoch,
            topic_id: uuid.UUID = topic.topic_id,
            leader_epoch: int = 0,
            partition_epoch: int = 0,
            isr: tuple[tuple[int, int], ...] = ((NODE, -1),),
        ) -> ErrorCode:
            try:
                await broker.controller.alter_partition(
                    broker_id,
                    broker_epoch,
                    topic_id,
                    0,
                    leader_epoch=leader_epoch,
                    partition_epoch=partition_epoch,
                    isr=isr,
                )
            except KafkaError as exc:
                return exc.code
            return ErrorCode.NONE

        assert await alter(broker_epoch=own_epoch + 100) == ErrorCode.STALE_BROKER_EPOCH
        assert await alter(topic_id=uuid.uuid4()) == ErrorCode.UNKNOWN_TOPIC_ID
        assert await alter(leader_epoch=1) == ErrorCode.NOT_CONTROLLER
        assert await alter(broker_id=OTHER, broker_epoch=epoch) == ErrorCode.INVALID_REQUEST  # not the leader
        assert await alter(isr=((NODE, -1), (7, -1))) == ErrorCode.INVALID_REQUEST  # 7 is no replica
        assert await alter(isr=((OTHER, -1),)) == ErrorCode.INVALID_REQUEST  # without its leader
        assert await alter(isr=((NODE, -1), (OTHER, epoch + 1))) == ErrorCode.INELIGIBLE_REPLICA
        assert await alter() == ErrorCode.NONE
        assert registration(broker, "t") == PartitionRegistration((NODE, OTHER), (NODE,), NODE, 0, 1)
        assert await alter() == ErrorCode.INVALID_UPDATE_VERSION  # partition epoch 0 is gone
        assert await alter(partition_epoch=1) == ErrorCode.NONE  # the ISR it has already: no record
        assert registration(broker, "t").partition_epoch == 1
        change_partition(broker, "t", 0, leader=OTHER)
        change_partition(broker, "t", 0, leader=NODE)
        assert await alter(partition_epoch=3, leader_epoch=1) == ErrorCode.FENCED_LEADER_EPOCH

    run(main)


# --- diverging epochs ----------------------------------------------------------------------------------------


def test_a_fetcher_whose_log_diverges_is_told_the_epoch_and_offset_to_truncate_to(broker: Broker) -> None:
    async def main() -> None:
        epoch = register_broker(broker)
        await create_replicated(broker, "t", [[NODE, OTHER]])
        change_partition(broker, "t", 0, isr=[NODE])
        assert await produced(broker, "t", [b"a", b"b"]) == (ErrorCode.NONE, 0)  # epoch 0: offsets 0 and 1
        change_partition(broker, "t", 0, leader=OTHER)  # epoch 1 led elsewhere
        change_partition(broker, "t", 0, leader=NODE)  # epoch 2 starts here at offset 2
        assert await produced(broker, "t", [b"c"]) == (ErrorCode.NONE, 2)

        async def answer(offset: int, last_epoch: int, replica_id: int = OTHER) -> tuple[int, int, int, int]:
            response = await fetch(
                broker, "t", offset, replica_id=replica_id, broker_epoch=epoch, last_fetched_epoch=last_epoch
            )
            data = response.responses[0].partitions[0]
            return data.error_code, data.diverging_epoch.epoch, data.diverging_epoch.end_offset, len(data.records)

        # A follower with epoch-1 records (never written here) truncates to where epoch 0 ended.
        assert await answer(3, 1) == (ErrorCode.NONE, 0, 2, 0)
        assert replica(broker, "t").remote[OTHER].log_end_offset == -1  # its position is not recorded
        assert await answer(3, 0) == (ErrorCode.NONE, 0, 2, 0)  # epoch 0 ended before its fetch offset
        assert (await answer(2, 0))[:3] == (ErrorCode.NONE, -1, -1)  # in step: it reads
        assert (await answer(0, 2))[:3] == (ErrorCode.NONE, -1, -1)
        assert await answer(4, 2) == (ErrorCode.NONE, 2, 3, 0)  # past the log end in the current epoch
        assert (await answer(0, 5))[0] == ErrorCode.OFFSET_OUT_OF_RANGE  # an epoch this log has not seen
        assert await answer(3, 1, replica_id=-1) == (ErrorCode.NONE, 0, 2, 0)  # consumers too (v12+)

    run(main)


def test_a_follower_truncates_to_where_the_leaders_log_diverges(broker: Broker) -> None:
    async def main() -> None:
        register_broker(broker)
        await create_replicated(broker, "t", [[OTHER, NODE]])  # this broker follows
        partition = replica(broker, "t")
        assert not partition.is_leader
        # Batches from the leader's log: epoch 0 at offsets 0-1, epoch 3 at offset 2 (made by a leader's log).
        leader = LogManager.in_memory_store(broker.config.topic_defaults())
        leader.register_topic(TopicInfo("l", uuid.uuid4(), 1, {}))
        leader_log = leader.get_partition("l", 0)
        assert leader_log is not None
        leader_log.append(bytearray(batch([b"a", b"b"])))
        leader_log.assign_leader_epoch(3)
        leader_log.append(bytearray(batch([b"c"])))
        fetched = leader_log.read(0, 1 << 20).read_bytes()
        result = partition.append_as_follower(fetched)
        assert (result.error_code, result.base_offset, partition.log.log_end_offset) == (ErrorCode.NONE, 0, 3)
        assert partition.log.end_offset_for_epoch(0) == (0, 2)
        assert partition.log.end_offset_for_epoch(3) == (3, 3)
        partition.update_follower_high_watermark(10)
        assert partition.high_watermark == 3  # the leader's, bounded by this log
        # A new leader answered epoch 2 ends at offset 2: this log knows no epoch 2, so it goes back to epoch 0's end.
        assert partition.truncation_offset(2, 2) == 2
        assert partition.truncation_offset(3, 5) == 3
        assert partition.truncation_offset(0, 1) == 1
        partition.truncate_to(partition.truncation_offset(0, 1))
        assert (partition.log.log_end_offset, partition.high_watermark) == (0, 0)  # the batch holding 1 went whole
        assert partition.append_as_follower(fetched).error_code == ErrorCode.NONE
        assert partition.log.log_end_offset == 3
        # As leader it refuses to append as a follower.
        change_partition(broker, "t", 0, leader=NODE)
        assert partition.append_as_follower(fetched).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER

    run(main)


def test_a_consumer_reads_a_follower_up_to_its_high_watermark_from_fetch_v11(broker: Broker) -> None:
    """As Kafka's fetchOnlyLeader (KIP-392): a consumer's Fetch v11+ carries client metadata and may read a
    follower; before v11 it reads the leader only. The leader epoch it names is checked against the follower's."""

    async def main() -> None:
        register_broker(broker)
        await create_replicated(broker, "t", [[OTHER, NODE]])  # this broker follows
        epoch = registration(broker, "t").leader_epoch
        partition = replica(broker, "t")
        leader = LogManager.in_memory_store(broker.config.topic_defaults())
        leader.register_topic(TopicInfo("l", uuid.uuid4(), 1, {}))
        leader_log = leader.get_partition("l", 0)
        assert leader_log is not None
        leader_log.append(bytearray(batch([b"a", b"b"])))
        leader_log.append(bytearray(batch([b"c"])))
        assert partition.append_as_follower(leader_log.read(0, 1 << 20).read_bytes()).error_code == ErrorCode.NONE
        partition.update_follower_high_watermark(2)  # the leader's high watermark: c is not committed yet

        assert await read(broker, "t", 0, version=11) == (ErrorCode.NONE, 2, [(0, b"a"), (1, b"b")])
        assert await read(broker, "t", 0, current_epoch=epoch, version=13) == (
            ErrorCode.NONE,
            2,
            [(0, b"a"), (1, b"b")],
        )
        assert await read(broker, "t", 2, version=13) == (ErrorCode.NONE, 2, [])
        assert (await read(broker, "t", 0, version=10))[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert (await read(broker, "t", 0, current_epoch=epoch + 1, version=13))[0] == ErrorCode.UNKNOWN_LEADER_EPOCH

    run(main)


# --- KIP-951: where the leader is -----------------------------------------------------------------------------


def test_not_leader_answers_name_the_current_leader_and_its_endpoint(broker: Broker) -> None:
    async def main() -> None:
        register_broker(broker)
        await create_replicated(broker, "t", [[OTHER, NODE]])
        leader_epoch = registration(broker, "t").leader_epoch

        response = await produce(broker, "t", [b"a"], 1, version=10)
        assert response is not None
        answer = response.responses[0].partition_responses[0]
        assert answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert (answer.current_leader.leader_id, answer.current_leader.leader_epoch) == (OTHER, leader_epoch)
        assert [(n.node_id, n.host, n.port, n.rack) for n in response.node_endpoints] == [
            (OTHER, OTHER_HOST, OTHER_PORT, None)
        ]
        older = await produce(broker, "t", [b"a"], 1, version=9)  # before v10 there is no such field to fill
        assert older is not None
        assert older.responses[0].partition_responses[0].current_leader.leader_id == -1 and not older.node_endpoints

        # A replica's fetch reads the leader only (a consumer's may read this follower, see below).
        fetched = await fetch(broker, "t", 0, replica_id=OTHER, version=16)
        data = fetched.responses[0].partitions[0]
        assert data.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert (data.current_leader.leader_id, data.current_leader.leader_epoch) == (OTHER, leader_epoch)
        assert [(n.node_id, n.host, n.port) for n in fetched.node_endpoints] == [(OTHER, OTHER_HOST, OTHER_PORT)]
        older_fetch = await fetch(broker, "t", 0, replica_id=OTHER, version=15)
        assert older_fetch.responses[0].partitions[0].current_leader.leader_id == -1
        assert not older_fetch.node_endpoints

        # A fenced epoch at this broker, now the leader: it names itself, by its registered endpoint.
        new_epoch = change_partition(broker, "t", 0, leader=NODE).leader_epoch
        fenced = await fetch(broker, "t", 0, current_epoch=new_epoch - 1, version=16)
        data = fenced.responses[0].partitions[0]
        assert data.error_code == ErrorCode.FENCED_LEADER_EPOCH
        assert (data.current_leader.leader_id, data.current_leader.leader_epoch) == (NODE, new_epoch)
        assert [(n.node_id, n.host, n.port) for n in fenced.node_endpoints] == [(NODE, "localhost", 9092)]

    run(main)


def test_a_transaction_marker_sent_to_a_follower_is_refused_and_nothing_is_written(broker: Broker) -> None:
    # Markers are appended by leaders only: a coordinator that sends one to a follower (a stale leader) is told
    # NOT_LEADER_OR_FOLLOWER and looks for the leader; the follower's log stays as its leader made it.
    async def main() -> None:
        register_broker(broker)
        await create_replicated(broker, "t", [[OTHER, NODE]])
        follower_log = replica(broker, "t").log
        end = follower_log.log_end_offset
        marker = WriteTxnMarkersRequest.WritableTxnMarker(
            producer_id=1000,
            producer_epoch=0,
            transaction_result=True,
            topics=[WriteTxnMarkersRequest.WritableTxnMarkerTopic(name="t", partition_indexes=[0])],
            coordinator_epoch=0,
        )
        answer = await handle_write_txn_markers(context(broker, 27, 1), WriteTxnMarkersRequest(markers=[marker]))
        assert [(p.partition_index, p.error_code) for p in answer.markers[0].topics[0].partitions] == [
            (0, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        ]
        assert follower_log.log_end_offset == end

        # The leader now: the marker is written (a control batch for a producer with nothing open) and answered
        # once the follower in the ISR has it, as Kafka appends markers with acks=-1.
        change_partition(broker, "t", 0, leader=NODE)
        answers: list[WriteTxnMarkersResponse] = []

        async def send() -> None:
            request = WriteTxnMarkersRequest(markers=[marker])
            answers.append(await handle_write_txn_markers(context(broker, 27, 1), request))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            await trio.sleep(5)
            assert not answers and follower_log.log_end_offset == end + 1  # written, waiting for the follower
            await read(broker, "t", end + 1, replica_id=OTHER)  # its fetch past the marker
        [answer] = answers
        assert [(p.partition_index, p.error_code) for p in answer.markers[0].topics[0].partitions] == [
            (0, ErrorCode.NONE)
        ]

    run(main)


# --- one node ----------------------------------------------------------------------------------------------------


def test_on_one_node_every_partition_is_at_min_isr_and_none_under_it(broker: Broker) -> None:
    async def main() -> None:
        await create_replicated(broker, "t", [[NODE]], {"min.insync.replicas": "2"})
        assert await produced(broker, "t", [b"a"], acks=-1) == (ErrorCode.NONE, 0)

    run(main)
    values = gauges(broker)
    assert values["atminisrpartitioncount"] == 1 and values["partition_atminisr"] == 1
    assert (values["underreplicatedpartitions"], values["underminisrpartitioncount"]) == (0, 0)
    assert (values["partition_insyncreplicascount"], values["partition_replicascount"]) == (1, 1)
    assert broker.replicas.maybe_shrink_isrs(T + 10**9) == 0
