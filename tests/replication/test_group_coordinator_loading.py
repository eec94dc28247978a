"""Every group API while this broker leads a group's __consumer_offsets partition but has not loaded its shard
(Kafka's coordinator context in its LOADING state): answered COORDINATOR_LOAD_IN_PROGRESS, as Kafka's
CoordinatorRuntime answers (GroupCoordinatorService: a classic Heartbeat succeeds blindly instead), never as if the
group did not exist; NOT_COORDINATOR while another broker leads it. Once the shard loads, the group is back as its
records left it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kbroker.apis.consumer_groups import handle_consumer_group_describe, handle_consumer_group_heartbeat
from kbroker.apis.group_offsets import handle_offset_commit, handle_offset_delete, handle_offset_fetch
from kbroker.apis.groups import (
    handle_delete_groups,
    handle_describe_groups,
    handle_heartbeat,
    handle_join_group,
    handle_leave_group,
    handle_list_groups,
    handle_sync_group,
)
from kbroker.apis.transactions import handle_txn_offset_commit
from kbroker.broker import Broker
from kbroker.groups.coordinator import Group, GroupState, Member
from kbroker.groups.offsets import OFFSETS_TOPIC, CommittedOffset, OffsetStore
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest
from protocol.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest
from protocol.messages.delete_groups_request import DeleteGroupsRequest
from protocol.messages.describe_groups_request import DescribeGroupsRequest
from protocol.messages.heartbeat_request import HeartbeatRequest
from protocol.messages.join_group_request import JoinGroupRequest
from protocol.messages.leave_group_request import LeaveGroupRequest
from protocol.messages.list_groups_request import ListGroupsRequest
from protocol.messages.offset_commit_request import OffsetCommitRequest
from protocol.messages.offset_delete_request import OffsetDeleteRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from protocol.messages.sync_group_request import SyncGroupRequest
from protocol.messages.txn_offset_commit_request import TxnOffsetCommitRequest
from tests.broker.test_handlers_in_memory import context, run
from tests.replication.conftest import NODE, in_memory_broker
from tests.replication.two_brokers import OTHER, move_leader, register_other

GROUP = "billing"
COMMITTED = CommittedOffset(offset=42, leader_epoch=0, metadata="m", commit_timestamp=1)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with in_memory_broker(tmp_path / "data", {"offsets.topic.num.partitions": "3"}) as broker:
        yield broker


def code_of(handler: Callable[[], Awaitable[Any]], answer: Callable[[Any], int]) -> int:
    """The request's error code: from its response, or the KafkaError the pipeline's boundary answers with."""
    try:
        return answer(run(handler))
    except KafkaError as exc:
        return exc.code


def the_code(response: Any) -> int:
    return int(response.error_code)


def group_codes(broker: Broker) -> dict[str, int]:
    """The group's error code in each group API (Heartbeat and SyncGroup as its stored member)."""
    commit_topic = OffsetCommitRequest.OffsetCommitRequestTopic(
        name="orders", partitions=[OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0)]
    )
    txn_topic = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(
        name="orders", partitions=[TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition(partition_index=0)]
    )
    delete_topic = OffsetDeleteRequest.OffsetDeleteRequestTopic(
        name="orders", partitions=[OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=0)]
    )
    requests: dict[str, tuple[int, int, Callable[..., Awaitable[Any]], Any, Callable[[Any], int]]] = {
        "JoinGroup": (11, 9, handle_join_group, JoinGroupRequest(
            group_id=GROUP, session_timeout_ms=10000, rebalance_timeout_ms=30000, member_id="m-1",
            protocol_type="consumer", protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")],
        ), the_code),
        "SyncGroup": (14, 5, handle_sync_group, SyncGroupRequest(
            group_id=GROUP, generation_id=3, member_id="m-1", protocol_type="consumer", protocol_name="range"
        ), the_code),
        "Heartbeat": (12, 4, handle_heartbeat, HeartbeatRequest(group_id=GROUP, generation_id=3, member_id="m-1"),
                      the_code),
        "LeaveGroup": (13, 5, handle_leave_group, LeaveGroupRequest(
            group_id=GROUP, members=[LeaveGroupRequest.MemberIdentity(member_id="m-2")]
        ), the_code),
        "OffsetCommit": (8, 8, handle_offset_commit, OffsetCommitRequest(
            group_id=GROUP, generation_id_or_member_epoch=3, member_id="m-1", topics=[commit_topic]
        ), lambda r: r.topics[0].partitions[0].error_code),
        "OffsetFetch v7": (9, 7, handle_offset_fetch, OffsetFetchRequest(group_id=GROUP, topics=None), the_code),
        "OffsetFetch v9": (9, 9, handle_offset_fetch, OffsetFetchRequest(
            groups=[OffsetFetchRequest.OffsetFetchRequestGroup(group_id=GROUP, topics=None)]
        ), lambda r: r.groups[0].error_code),
        "TxnOffsetCommit": (28, 3, handle_txn_offset_commit, TxnOffsetCommitRequest(
            transactional_id="tx", group_id=GROUP, producer_id=7, producer_epoch=0, topics=[txn_topic]
        ), lambda r: r.topics[0].partitions[0].error_code),
        "ConsumerGroupHeartbeat": (68, 1, handle_consumer_group_heartbeat, ConsumerGroupHeartbeatRequest(
            group_id=GROUP, member_id="c-1", member_epoch=0, rebalance_timeout_ms=30000,
            subscribed_topic_names=["orders"], topic_partitions=[],
        ), the_code),
        "DescribeGroups": (15, 5, handle_describe_groups, DescribeGroupsRequest(groups=[GROUP]),
                           lambda r: r.groups[0].error_code),
        "ConsumerGroupDescribe": (69, 1, handle_consumer_group_describe, ConsumerGroupDescribeRequest(
            group_ids=[GROUP]
        ), lambda r: r.groups[0].error_code),
        "OffsetDelete": (47, 0, handle_offset_delete, OffsetDeleteRequest(group_id=GROUP, topics=[delete_topic]),
                         the_code),
        "DeleteGroups": (42, 2, handle_delete_groups, DeleteGroupsRequest(groups_names=[GROUP]),
                         lambda r: r.results[0].error_code),
    }  # fmt: skip

    def answer_of(api_key: int, version: int, handler: Callable[..., Awaitable[Any]], request: Any) -> Any:
        return run(lambda: handler(context(broker, api_key, version), request))

    codes = {}
    for name, (api_key, version, handler, request, answer) in requests.items():
        try:
            codes[name] = answer(answer_of(api_key, version, handler, request))
        except KafkaError as exc:  # the answer the pipeline's boundary gives
            codes[name] = exc.code
    return codes


class UnreadableShard:
    """One ``__consumer_offsets`` partition whose shard the coordinator runtime cannot load (the replica layer's
    load fails) until ``readable`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, offsets: OffsetStore, partition: int) -> None:
        self.readable = False
        load = offsets.runtime.load

        def load_when_readable(index: int) -> Any:
            if index == partition and not self.readable:
                raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"partition {index} cannot be read yet")
            return load(index)

        monkeypatch.setattr(offsets.runtime, "load", load_when_readable)


def stored_group(broker: Broker) -> None:
    """A stable classic group of one member, and an offset it committed, as the coordinator writes them."""
    member = Member("m-1", None, "client", "/10.0.0.1", 10000, 30000, "consumer", [("range", b"sub")], assignment=b"a")
    group = Group(
        GROUP,
        state=GroupState.STABLE,
        generation_id=3,
        protocol_type="consumer",
        protocol_name="range",
        leader_id="m-1",
        members={"m-1": member},
    )
    broker.offsets.store_group(group)
    broker.offsets.commit(GROUP, {("orders", 0): COMMITTED})


def test_every_group_api_answers_load_in_progress_until_the_groups_shard_is_loaded(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    offsets = broker.offsets
    offsets.ensure_topic()
    register_other(broker)
    stored_group(broker)
    partition = offsets.partition_for(GROUP)
    move_leader(broker, OFFSETS_TOPIC, partition, OTHER)
    assert set(group_codes(broker).values()) == {ErrorCode.NOT_COORDINATOR}

    # This broker leads the partition again, but its shard cannot be read yet (the replica layer's load failed).
    shard = UnreadableShard(monkeypatch, offsets, partition)
    move_leader(broker, OFFSETS_TOPIC, partition, NODE)
    assert partition not in offsets.runtime.shards
    loading = group_codes(broker)
    expected = dict.fromkeys(loading, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    expected["Heartbeat"] = ErrorCode.NONE  # as Kafka: answered blindly while the group loads
    assert loading == expected
    # Nothing was written or made meanwhile: no group started over, no offset deleted.
    assert partition not in offsets.runtime.shards and GROUP not in broker.groups.groups

    shard.readable = True  # the next request loads the shard: the group and its offsets are back as they were
    fetched = run(
        lambda: handle_offset_fetch(
            context(broker, 9, 9),
            OffsetFetchRequest(groups=[OffsetFetchRequest.OffsetFetchRequestGroup(group_id=GROUP, topics=None)]),
        )
    ).groups[0]
    assert fetched.error_code == ErrorCode.NONE
    assert [(t.name, p.partition_index, p.committed_offset) for t in fetched.topics for p in t.partitions] == [
        ("orders", 0, 42)
    ]
    restored = broker.groups.groups[GROUP]
    assert (restored.generation_id, list(restored.members)) == (3, ["m-1"])
    heartbeat = HeartbeatRequest(group_id=GROUP, generation_id=3, member_id="m-1")
    assert code_of(lambda: handle_heartbeat(context(broker, 12, 4), heartbeat), the_code) == ErrorCode.NONE


def listed(broker: Broker) -> tuple[int, list[tuple[str, str]]]:
    """ListGroups v4's error code and its (group id, state) rows."""
    response = run(lambda: handle_list_groups(context(broker, 16, 4), ListGroupsRequest()))
    return response.error_code, [(g.group_id, g.group_state) for g in response.groups]


def test_list_groups_answers_load_in_progress_while_a_partition_led_here_is_loading(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Kafka's ListGroups, which reads every shard of the coordinator runtime: the whole request fails with
    COORDINATOR_LOAD_IN_PROGRESS (no groups at all) while one partition this broker leads is not loaded, rather
    than a list its groups are missing from; a partition another broker leads is left to that broker."""
    offsets = broker.offsets
    offsets.ensure_topic()
    register_other(broker)
    stored_group(broker)
    partition = offsets.partition_for(GROUP)
    elsewhere = next(g for g in (f"other-{i}" for i in range(100)) if offsets.partition_for(g) != partition)
    offsets.commit(elsewhere, {("orders", 0): COMMITTED})
    assert listed(broker) == (ErrorCode.NONE, [(GROUP, "Stable"), (elsewhere, "Empty")])

    move_leader(broker, OFFSETS_TOPIC, partition, OTHER)
    assert listed(broker) == (ErrorCode.NONE, [(elsewhere, "Empty")])  # the other broker lists GROUP

    shard = UnreadableShard(monkeypatch, offsets, partition)
    move_leader(broker, OFFSETS_TOPIC, partition, NODE)
    assert listed(broker) == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, [])

    shard.readable = True  # the next ListGroups loads the shard and lists both groups again
    assert listed(broker) == (ErrorCode.NONE, [(GROUP, "Stable"), (elsewhere, "Empty")])
