"""Coordinator records are written through the replica layer (kbroker/replication): a commit is answered once the
high watermark passed its batch, as an acks=all produce, and not while a follower in the ISR lags."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import trio
import trio.testing

from kbroker.apis.group_offsets import handle_offset_commit, handle_offset_delete
from kbroker.apis.groups import handle_delete_groups, handle_leave_group
from kbroker.apis.producer_ids import handle_init_producer_id
from kbroker.apis.transactions import handle_txn_offset_commit
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
from kbroker.groups.coordinator import GroupState, SyncResult
from kbroker.groups.offsets import OFFSETS_TOPIC, CommittedOffset
from kbroker.metadata.image import PartitionRegistration
from kbroker.storage import LogManager
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.delete_groups_request import DeleteGroupsRequest
from protocol.messages.delete_groups_response import DeleteGroupsResponse
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.messages.leave_group_request import LeaveGroupRequest
from protocol.messages.leave_group_response import LeaveGroupResponse
from protocol.messages.offset_commit_request import OffsetCommitRequest
from protocol.messages.offset_delete_request import OffsetDeleteRequest
from protocol.messages.txn_offset_commit_request import TxnOffsetCommitRequest
from tests.broker.test_handlers_in_memory import context, create, run

NODE, FOLLOWER = 0, 1
R = TypeVar("R")


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
    answers, state = sync_as_only_member(broker, lead_with_follower_in_isr(broker))
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
    lead_with_follower_in_isr(broker)

    answers, state = sync_as_only_member(broker, lambda: None)
    assert [(a.error_code, a.assignment) for a in answers] == [(ErrorCode.COORDINATOR_NOT_AVAILABLE, b"")]
    assert state == GroupState.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in broker.groups.groups["g"].members.values())


def lead_with_follower_in_isr(broker: Broker) -> Callable[[], None]:
    """This broker leads the group's __consumer_offsets partition with FOLLOWER in its ISR; what makes FOLLOWER
    fetch everything written so far (the high watermark then passes it)."""
    broker.replicas.apply(OFFSETS_TOPIC, 0, PartitionRegistration((NODE, FOLLOWER), (NODE, FOLLOWER), NODE, 1, 1))
    partition = broker.replicas.partition(OFFSETS_TOPIC, 0)
    assert partition is not None

    def follower_fetches() -> None:
        end = partition.log.log_end_offset
        partition.record_follower_fetch(FOLLOWER, end, 0, 0, end)

    return follower_fetches


def answer_once_committed(
    broker: Broker, request: Callable[[], Awaitable[R]], follower_fetches: Callable[[], None] | None
) -> tuple[list[R], list[R]]:
    """Send ``request``; a virtual second later FOLLOWER fetches (``follower_fetches``; None: never). What was
    answered before that fetch, and in the end."""
    answers: list[R] = []
    before_fetch: list[R] = []

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:

            async def send() -> None:
                answers.append(await request())

            nursery.start_soon(send)
            await trio.sleep(1)
            before_fetch.extend(answers)
            if follower_fetches is not None:
                follower_fetches()

    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))
    return before_fetch, answers


def stable_member(broker: Broker, follower_fetches: Callable[[], None]) -> str:
    """A stable classic group "g" of one member, its generation committed; the member's id."""
    answers, state = sync_as_only_member(broker, follower_fetches)
    assert [a.error_code for a in answers] == [ErrorCode.NONE] and state == GroupState.STABLE
    return next(iter(broker.groups.groups["g"].members))


def leave(broker: Broker, member_id: str) -> Callable[[], Awaitable[LeaveGroupResponse]]:
    request = LeaveGroupRequest(group_id="g", members=[LeaveGroupRequest.MemberIdentity(member_id=member_id)])
    return lambda: handle_leave_group(context(broker, 13, 5), request)


def test_a_leave_group_that_empties_the_group_is_answered_once_its_generation_is_committed(broker: Broker) -> None:
    """As Kafka's LeaveGroup, a coordinator write: the last member leaving writes the group's Empty generation,
    and the answer waits until the ISR has it (a failover cannot bring the member back)."""
    follower_fetches = lead_with_follower_in_isr(broker)
    member_id = stable_member(broker, follower_fetches)

    before_fetch, answers = answer_once_committed(broker, leave(broker, member_id), follower_fetches)
    assert before_fetch == []
    assert [(a.error_code, [(m.member_id, m.error_code) for m in a.members]) for a in answers] == [
        (ErrorCode.NONE, [(member_id, ErrorCode.NONE)])
    ]
    assert [(g.generation_id, g.members) for g in broker.offsets.stored_groups()] == [(2, {})]
    assert broker.groups.groups["g"].state == GroupState.EMPTY


def test_a_leave_group_whose_empty_generation_is_not_committed_in_time_is_answered_coordinator_not_available(
    broker: Broker,
) -> None:
    """The write times out (REQUEST_TIMED_OUT): the request is answered COORDINATOR_NOT_AVAILABLE, as Kafka maps it,
    without per-member answers."""
    follower_fetches = lead_with_follower_in_isr(broker)
    member_id = stable_member(broker, follower_fetches)

    _, answers = answer_once_committed(broker, leave(broker, member_id), None)
    assert [(a.error_code, a.members) for a in answers] == [(ErrorCode.COORDINATOR_NOT_AVAILABLE, [])]


def offsets_only_group(broker: Broker, follower_fetches: Callable[[], None]) -> None:
    """Topic "orders" and group "g" known by a committed offset of it only."""
    assert create(broker, "orders").topics[0].error_code == ErrorCode.NONE
    commit(broker, 5)
    follower_fetches()


def delete_groups(broker: Broker, *group_ids: str) -> Callable[[], Awaitable[DeleteGroupsResponse]]:
    request = DeleteGroupsRequest(groups_names=list(group_ids))
    return lambda: handle_delete_groups(context(broker, 42, 2), request)


@pytest.mark.parametrize("in_time", [True, False])
def test_delete_groups_is_answered_once_the_tombstones_are_committed(broker: Broker, in_time: bool) -> None:
    """As Kafka's DeleteGroups, one coordinator write per __consumer_offsets partition: answered once its
    tombstones are committed; if they are not in time, every group of that partition in the request is answered
    COORDINATOR_NOT_AVAILABLE (Kafka's mapping of the timeout), the missing one too."""
    follower_fetches = lead_with_follower_in_isr(broker)
    offsets_only_group(broker, follower_fetches)

    before_fetch, answers = answer_once_committed(
        broker, delete_groups(broker, "g", "missing"), follower_fetches if in_time else None
    )
    assert before_fetch == []
    results = [(r.group_id, r.error_code) for a in answers for r in a.results]
    if in_time:
        assert sorted(results) == [("g", ErrorCode.NONE), ("missing", ErrorCode.GROUP_ID_NOT_FOUND)]
    else:
        assert sorted(results) == [
            ("g", ErrorCode.COORDINATOR_NOT_AVAILABLE),
            ("missing", ErrorCode.COORDINATOR_NOT_AVAILABLE),
        ]
    assert not broker.offsets.has_group("g")  # deleted all the same: Kafka does not undo the write


@pytest.mark.parametrize("in_time", [True, False])
def test_offset_delete_is_answered_once_the_tombstones_are_committed(broker: Broker, in_time: bool) -> None:
    follower_fetches = lead_with_follower_in_isr(broker)
    offsets_only_group(broker, follower_fetches)
    topic = OffsetDeleteRequest.OffsetDeleteRequestTopic(
        name="orders", partitions=[OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=0)]
    )
    request = OffsetDeleteRequest(group_id="g", topics=[topic])

    before_fetch, answers = answer_once_committed(
        broker,
        lambda: handle_offset_delete(context(broker, 47, 0), request),
        follower_fetches if in_time else None,
    )
    assert before_fetch == []
    summary = [
        (a.error_code, [(p.partition_index, p.error_code) for t in a.topics for p in t.partitions]) for a in answers
    ]
    if in_time:
        assert summary == [(ErrorCode.NONE, [(0, ErrorCode.NONE)])]
    else:
        assert summary == [(ErrorCode.COORDINATOR_NOT_AVAILABLE, [])]
    assert not broker.offsets.has_group("g")


def test_an_offset_commit_not_committed_in_time_is_answered_coordinator_not_available(broker: Broker) -> None:
    """Kafka maps the commit's timeout (REQUEST_TIMED_OUT) to COORDINATOR_NOT_AVAILABLE for every partition."""
    lead_with_follower_in_isr(broker)
    assert create(broker, "orders").topics[0].error_code == ErrorCode.NONE
    topic = OffsetCommitRequest.OffsetCommitRequestTopic(
        name="orders",
        partitions=[OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=3)],
    )
    request = OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1, member_id="", topics=[topic])

    _, answers = answer_once_committed(broker, lambda: handle_offset_commit(context(broker, 8, 8), request), None)
    assert [[(p.partition_index, p.error_code) for t in a.topics for p in t.partitions] for a in answers] == [
        [(0, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
    ]


def test_a_txn_offset_commit_not_committed_in_time_is_answered_coordinator_not_available(broker: Broker) -> None:
    """As OffsetCommit: the commit's timeout is answered COORDINATOR_NOT_AVAILABLE, as Kafka maps it."""
    assert create(broker, "orders").topics[0].error_code == ErrorCode.NONE
    init = InitProducerIdRequest(transactional_id="t", transaction_timeout_ms=60000)
    started = run(lambda: handle_init_producer_id(context(broker, 22, 5), init))
    assert started.error_code == ErrorCode.NONE
    lead_with_follower_in_isr(broker)  # the group's partition only: the transaction's state is not held back
    topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(
        name="orders",
        partitions=[TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=3)],
    )
    request = TxnOffsetCommitRequest(
        transactional_id="t",
        group_id="g",
        producer_id=started.producer_id,
        producer_epoch=started.producer_epoch,
        topics=[topic],
    )
    before, answers = answer_once_committed(
        broker, lambda: handle_txn_offset_commit(context(broker, 28, 5), request), None
    )
    assert before == []
    assert [[(p.partition_index, p.error_code) for t in a.topics for p in t.partitions] for a in answers] == [
        [(0, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
    ]
