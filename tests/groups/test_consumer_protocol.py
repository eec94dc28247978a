"""The KIP-848 consumer group protocol against a live broker: Java kafka-clients 4.4.0 and confluent-kafka
(librdkafka) with ``group.protocol=consumer``, and exact wire-level requests for the group APIs around it.

Members run in their own processes (tests/groups/java/ConsumerGroupMember.java and
consumer_protocol_member.py) so one can be killed with SIGKILL, leaving the group without a word.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from member_processes import MemberProcess, create_topic, disjoint_and_complete, produce, run_program, wait_for

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest
from protocol.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest
from protocol.messages.delete_groups_request import DeleteGroupsRequest
from protocol.messages.describe_groups_request import DescribeGroupsRequest
from protocol.messages.join_group_request import JoinGroupRequest
from protocol.messages.leave_group_request import LeaveGroupRequest
from protocol.messages.list_groups_request import ListGroupsRequest
from protocol.messages.offset_commit_request import OffsetCommitRequest
from protocol.messages.offset_delete_request import OffsetDeleteRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
JAVA_SOURCE = HERE / "java" / "ConsumerGroupMember.java"
JAVA_SHARED = HERE / "java" / "GroupMembers.java"
JAVA_VERSION = "4.4.0"  # the consumer protocol is GA from kafka-clients 4.0
# Kafka's minimums are 45 s session / 5 s heartbeat; lowered (with the minimums) so failover is quick.
FAST_GROUPS = {
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.heartbeat.interval.ms": "500",
    "group.consumer.min.heartbeat.interval.ms": "100",
}
WAIT_SECONDS = 90  # a generous bound for anything to happen, never a speed check


@pytest.fixture(scope="module")
def java_member(java_program: Callable[..., list[str]]) -> list[str]:
    """The command that runs tests/groups/java/ConsumerGroupMember.java on kafka-clients 4.3."""
    return java_program(JAVA_SOURCE, JAVA_VERSION, JAVA_SHARED)


def _create_and_fill(broker: RunningBroker, topic: str, partitions: int, per_partition: int) -> None:
    create_topic(broker.bootstrap, topic, partitions)
    produce(broker.bootstrap, topic, partitions, per_partition)


def _failover_scenario(
    broker: RunningBroker, members: list[MemberProcess], spawn: Callable[[str], MemberProcess], group: str
) -> None:
    """Three members share six partitions; one closes, one is killed; the survivor ends up with everything,
    and nothing that was committed is read twice."""
    _create_and_fill(broker, "events", 6, 10)
    members.extend(spawn(f"member-{i}") for i in range(3))
    # Members join one at a time and partitions move incrementally (revoked, then assigned), so a 3/2/1 split is
    # disjoint and complete on the way to the uniform assignor's 2/2/2: wait for the balance itself.
    wait_for(
        lambda: (
            disjoint_and_complete(members, 6)
            and sorted(len(m.assigned or []) for m in members) == [2, 2, 2]
            and sum(len(m.records) for m in members) == 60
        ),
        members,
        "3-way split",
        timeout=WAIT_SECONDS,
    )
    state = broker.broker.consumer_groups.groups[group]
    assert sorted(len(m.assigned or []) for m in members) == [2, 2, 2]
    assert state.state.value == "Stable" and len(state.members) == 3

    leaving, killed, survivor = members
    leaving.close()
    killed.kill()
    produce(broker.bootstrap, "events", 6, 10, start=60)
    wait_for(lambda: leaving.closed, members, "the closing member to leave", timeout=WAIT_SECONDS)
    wait_for(
        lambda: survivor.assigned == list(range(6)) and sum(len(m.records) for m in members) >= 120,
        members,
        "the survivor to own every partition and read every record",
        timeout=WAIT_SECONDS,
    )
    consumed = [record for m in members for record in m.records]
    assert len(consumed) == len(set(consumed)), "a committed record was consumed twice"
    assert sorted(consumed) == [(p, o) for p in range(6) for o in range(20)]
    committed = broker.broker.offsets.get(group)
    assert {p: committed[("events", p)].offset for p in range(6)} == dict.fromkeys(range(6), 20)
    assert list(state.members) == [next(iter(state.members))] and len(state.members) == 1


def test_java_members_split_fail_over_and_admin_describes_them(
    broker_factory, members: list[MemberProcess], java_member: list[str]
) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)

    def spawn(name: str) -> MemberProcess:
        return MemberProcess([*java_member, broker.bootstrap, "member", "jg", "events", name], name)

    _create_and_fill(broker, "events", 6, 10)
    members.extend(spawn(f"member-{i}") for i in range(3))
    wait_for(lambda: disjoint_and_complete(members, 6), members, "3-way split", timeout=WAIT_SECONDS)
    events = {e["event"]: e for e in run_program([*java_member, broker.bootstrap, "admin", "jg"])}
    described = events["described"]
    group = broker.broker.consumer_groups.groups["jg"]
    assert (described["type"], described["assignor"]) == ("Consumer", "uniform")
    assert (described["groupEpoch"], described["targetAssignmentEpoch"]) == (group.group_epoch, group.assignment_epoch)
    by_client = {m["clientId"]: m for m in described["members"]}
    assert sorted(by_client) == ["member-0", "member-1", "member-2"]
    for member in members:
        member.drain()
    for member in members:
        view = by_client[member.name]
        # Every member reported its share, so the group is reconciled: the broker's view is the member's own.
        assert view["partitions"] == member.assigned == view["target"]
    assert described["state"] == "Stable"
    assert sorted(sum((m["target"] for m in described["members"]), [])) == list(range(6))
    assert {"groupId": "jg", "type": "Consumer", "protocol": "consumer", "state": described["state"]} in events[
        "listed"
    ]["groups"]


def test_java_members_fail_over_without_reading_committed_records_twice(
    broker_factory, members: list[MemberProcess], java_member: list[str]
) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)

    def spawn(name: str) -> MemberProcess:
        return MemberProcess([*java_member, broker.bootstrap, "member", "jg", "events", name], name)

    _failover_scenario(broker, members, spawn, "jg")


def test_librdkafka_members_fail_over_without_reading_committed_records_twice(
    broker_factory, members: list[MemberProcess]
) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    script = str(HERE / "consumer_protocol_member.py")

    def spawn(name: str) -> MemberProcess:
        return MemberProcess([sys.executable, script, broker.bootstrap, "rg", "events", name], name)

    _failover_scenario(broker, members, spawn, "rg")


def test_librdkafka_resumes_after_the_last_commit_across_a_broker_restart(broker_factory) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    _create_and_fill(broker, "orders", 2, 20)
    config = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": "resume",
        "group.protocol": "consumer",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    first = Consumer(config)
    first.subscribe(["orders"])
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + WAIT_SECONDS
    while len(seen) < 40 and time.monotonic() < deadline:
        message = first.poll(0.2)
        if message is not None and message.error() is None:
            seen.append((message.partition(), message.offset()))
    assert sorted(seen) == [(p, o) for p in range(2) for o in range(20)]
    # Commit only up to offset 12 on each partition: a restart must resume exactly there.
    first.commit(offsets=[TopicPartition("orders", p, 12) for p in range(2)], asynchronous=False)
    first.close()
    broker.restart()
    second = Consumer({**config, "bootstrap.servers": broker.bootstrap})
    second.subscribe(["orders"])
    resumed: list[tuple[int, int]] = []
    deadline = time.monotonic() + WAIT_SECONDS
    while len(resumed) < 16 and time.monotonic() < deadline:
        message = second.poll(0.2)
        if message is not None and message.error() is None:
            resumed.append((message.partition(), message.offset()))
    second.close()
    assert sorted(resumed) == [(p, o) for p in range(2) for o in range(12, 20)]


def test_librdkafka_regex_subscription_gets_topics_created_later(broker_factory) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    _create_and_fill(broker, "logs-a", 2, 1)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "rx", "group.protocol": "consumer"})
    consumer.subscribe(["^logs-.*"])  # librdkafka sends it as SubscribedTopicRegex (v1), "(^logs-.*)"
    try:

        def assignment() -> list[tuple[str, int]]:
            consumer.poll(0.1)
            return sorted((tp.topic, tp.partition) for tp in consumer.assignment())

        deadline = time.monotonic() + WAIT_SECONDS
        while assignment() != [("logs-a", 0), ("logs-a", 1)] and time.monotonic() < deadline:
            pass
        assert assignment() == [("logs-a", 0), ("logs-a", 1)]
        member = next(iter(broker.broker.consumer_groups.groups["rx"].members.values()))
        assert (member.subscribed_topic_names, member.subscribed_topic_regex) == ([], "(^logs-.*)")
        _create_and_fill(broker, "logs-b", 1, 1)
        _create_and_fill(broker, "other", 1, 1)
        while len(assignment()) < 3 and time.monotonic() < deadline:
            pass
        assert assignment() == [("logs-a", 0), ("logs-a", 1), ("logs-b", 0)]
    finally:
        consumer.close()


def test_librdkafka_admin_describes_and_lists_a_consumer_group(broker_factory) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory(FAST_GROUPS)
    _create_and_fill(broker, "t", 2, 1)
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "ag", "group.protocol": "consumer", "client.id": "cid"}
    )
    consumer.subscribe(["t"])
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while len(consumer.assignment()) < 2 and time.monotonic() < deadline:
            consumer.poll(0.1)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        described = admin.describe_consumer_groups(["ag"])["ag"].result(10)  # ConsumerGroupDescribe
        assert (str(described.state), str(described.type), described.partition_assignor) == (
            "ConsumerGroupState.STABLE",
            "ConsumerGroupType.CONSUMER",
            "uniform",
        )
        (member,) = described.members
        assert member.client_id == "cid" and member.member_id == consumer.memberid()
        assert sorted((tp.topic, tp.partition) for tp in member.assignment.topic_partitions) == [("t", 0), ("t", 1)]
        listed = admin.list_consumer_groups().result(10).valid
        assert [(g.group_id, str(g.type)) for g in listed] == [("ag", "ConsumerGroupType.CONSUMER")]
    finally:
        consumer.close()


# --- wire level ----------------------------------------------------------------------------------------


def _join(client: WireClient, group: str, member_id: str, version: int = 1, **fields: Any) -> Any:
    request = ConsumerGroupHeartbeatRequest(
        group_id=group,
        member_id=member_id,
        member_epoch=0,
        rebalance_timeout_ms=30000,
        subscribed_topic_names=["orders"],
        topic_partitions=[],
        **fields,
    )
    return client.request(request, version)


def test_heartbeat_describe_list_and_offsets_on_the_wire(broker: RunningBroker) -> None:
    _create_and_fill(broker, "orders", 4, 1)
    topic_id = broker.broker.topic("orders").topic_id
    with WireClient(broker.bootstrap) as client:
        joined = _join(client, "wire", "member-a")
        assert (joined.error_code, joined.member_id, joined.member_epoch) == (ErrorCode.NONE, "member-a", 1)
        assert joined.heartbeat_interval_ms == 5000  # group.consumer.heartbeat.interval.ms default
        assert [(tp.topic_id, tp.partitions) for tp in joined.assignment.topic_partitions] == [(topic_id, [0, 1, 2, 3])]
        v0 = _join(client, "wire", "", version=0)  # v0: the coordinator names the member
        assert v0.error_code == ErrorCode.NONE and len(v0.member_id) == 22 and v0.assignment.topic_partitions == []
        bad = _join(client, "wire", "member-c", server_assignor="sticky")
        assert (bad.error_code, bad.error_message) == (
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            "ServerAssignor sticky is not supported. Supported assignors: uniform, range.",
        )

        described = client.request(ConsumerGroupDescribeRequest(group_ids=["wire", "nothing"]), 0).groups
        assert (described[0].error_code, described[0].group_state, described[0].group_epoch) == (0, "Reconciling", 2)
        assert described[0].assignor_name == "uniform" and described[0].assignment_epoch == 2
        by_id = {m.member_id: m for m in described[0].members}
        assert [tp.partitions for tp in by_id["member-a"].assignment.topic_partitions] == [[0, 1, 2, 3]]
        assert [(tp.topic_name, tp.partitions) for tp in by_id["member-a"].target_assignment.topic_partitions] == [
            ("orders", [0, 1])  # sticky: it keeps the first half of what it had
        ]
        assert by_id["member-a"].subscribed_topic_names == ["orders"] and by_id["member-a"].member_epoch == 1
        assert by_id["member-a"].member_type == -1  # v0 has no member type: the decoder's default
        # v1 (KIP-1099) says what kind of member each is: every member of a consumer group here is one.
        described_v1 = client.request(ConsumerGroupDescribeRequest(group_ids=["wire"]), 1).groups[0]
        assert sorted((m.member_id, m.member_type) for m in described_v1.members) == [
            (member_id, 1) for member_id in sorted(by_id)
        ]
        assert (described[1].error_code, described[1].error_message) == (
            ErrorCode.GROUP_ID_NOT_FOUND,
            "Group nothing not found.",
        )

        listed = client.request(ListGroupsRequest(states_filter=[], types_filter=["consumer"]), 5).groups
        assert [(g.group_id, g.group_type, g.protocol_type, g.group_state) for g in listed] == [
            ("wire", "consumer", "consumer", "Reconciling")
        ]
        assert client.request(ListGroupsRequest(states_filter=[], types_filter=["classic"]), 5).groups == []
        classic_view = client.request(DescribeGroupsRequest(groups=["wire"]), 6).groups[0]
        assert (classic_view.error_code, classic_view.group_state, classic_view.error_message) == (
            ErrorCode.GROUP_ID_NOT_FOUND,
            "Dead",
            "Group wire is not a classic group.",
        )

        def commit(epoch: int, member: str = "member-a", version: int = 9) -> int:
            request = OffsetCommitRequest(
                group_id="wire",
                generation_id_or_member_epoch=epoch,
                member_id=member,
                topics=[
                    OffsetCommitRequest.OffsetCommitRequestTopic(
                        name="orders",
                        partitions=[
                            OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=1)
                        ],
                    )
                ],
            )
            return client.request(request, version).topics[0].partitions[0].error_code

        assert commit(0) == ErrorCode.STALE_MEMBER_EPOCH
        assert commit(1, member="ghost") == ErrorCode.UNKNOWN_MEMBER_ID
        assert commit(1, version=8) == ErrorCode.UNSUPPORTED_VERSION
        assert commit(1) == ErrorCode.NONE

        def fetch(member: str | None, epoch: int) -> Any:
            group = OffsetFetchRequest.OffsetFetchRequestGroup(
                group_id="wire", member_id=member, member_epoch=epoch, topics=None
            )
            return client.request(OffsetFetchRequest(groups=[group]), 9).groups[0]

        assert fetch("member-a", 1).topics[0].partitions[0].committed_offset == 1
        assert fetch(None, -1).topics[0].partitions[0].committed_offset == 1
        assert fetch("member-a", 5).error_code == ErrorCode.STALE_MEMBER_EPOCH

        offset_delete = OffsetDeleteRequest(
            group_id="wire",
            topics=[
                OffsetDeleteRequest.OffsetDeleteRequestTopic(
                    name="orders", partitions=[OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=0)]
                )
            ],
        )
        subscribed = client.request(offset_delete, 0)
        assert subscribed.topics[0].partitions[0].error_code == ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC

        # Classic JoinGroup cannot take the id while the consumer group has members; deleting it cannot either.
        join = JoinGroupRequest(
            group_id="wire",
            session_timeout_ms=10000,
            rebalance_timeout_ms=10000,
            member_id="",
            protocol_type="consumer",
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")],
        )
        assert client.request(join, 9).error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        deleted = client.request(DeleteGroupsRequest(groups_names=["wire"]), 2).results[0]
        assert deleted.error_code == ErrorCode.NON_EMPTY_GROUP

        for member_id in ("member-a", v0.member_id):
            left = client.request(
                ConsumerGroupHeartbeatRequest(group_id="wire", member_id=member_id, member_epoch=-1), 1
            )
            assert (left.error_code, left.member_epoch) == (ErrorCode.NONE, -1)
        listed = client.request(ListGroupsRequest(states_filter=["empty"], types_filter=[]), 5).groups
        assert [(g.group_id, g.group_type, g.group_state) for g in listed] == [("wire", "consumer", "Empty")]
        deleted = client.request(DeleteGroupsRequest(groups_names=["wire"]), 2).results[0]
        assert deleted.error_code == ErrorCode.NONE
        assert "wire" not in broker.broker.consumer_groups.groups and not broker.broker.offsets.has_group("wire")


def test_consumer_protocol_cannot_take_a_classic_group_with_members(broker_factory) -> None:  # noqa: ANN001
    broker: RunningBroker = broker_factory({"group.initial.rebalance.delay.ms": "0"})
    _create_and_fill(broker, "orders", 1, 1)
    with WireClient(broker.bootstrap) as client:
        join = JoinGroupRequest(
            group_id="shared",
            session_timeout_ms=10000,
            rebalance_timeout_ms=10000,
            member_id="",
            protocol_type="consumer",
            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")],
        )
        member_id = client.request(join, 9).member_id  # MEMBER_ID_REQUIRED hands out the id (KIP-394)
        join.member_id = member_id
        assert client.request(join, 9).error_code == ErrorCode.NONE
        refused = _join(client, "shared", str(uuid.uuid4()))
        assert (refused.error_code, refused.error_message) == (
            ErrorCode.GROUP_ID_NOT_FOUND,
            "Group shared is not a consumer group",
        )
        leave = LeaveGroupRequest(
            group_id="shared", members=[LeaveGroupRequest.MemberIdentity(member_id=member_id, group_instance_id=None)]
        )
        assert client.request(leave, 5).error_code == ErrorCode.NONE
        # Empty now: the id passes to the consumer protocol (committed offsets, if any, stay).
        assert _join(client, "shared", "m").error_code == ErrorCode.NONE
        assert "shared" not in broker.broker.groups.groups
