"""Classic group APIs on the wire, with exact requests and answers: JoinGroup/SyncGroup versions,
LeaveGroup batches, ListGroups filters (v4 states, v5 types), DescribeGroups fields (v3+ authorized
operations, v6 per-group errors), OffsetCommit/OffsetFetch checks (v9 GROUP_ID_NOT_FOUND, require_stable)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.describe_groups_request import DescribeGroupsRequest
from protocol.messages.heartbeat_request import HeartbeatRequest
from protocol.messages.join_group_request import JoinGroupRequest
from protocol.messages.leave_group_request import LeaveGroupRequest
from protocol.messages.list_groups_request import ListGroupsRequest
from protocol.messages.offset_commit_request import OffsetCommitRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from protocol.messages.sync_group_request import SyncGroupRequest

AUTHORIZED_OPERATIONS_NOT_REQUESTED = -(2**31)
# READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS: all a group supports, what Kafka 4.3 reports without
# an authorizer (3400; tests/kafka/test_authorization_kafka.py checks it against Kafka)
GROUP_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)
SUBSCRIPTION = struct.pack(">hih", 0, 1, 6) + b"orders" + struct.pack(">i", -1)
ASSIGNMENT = struct.pack(">hih", 0, 1, 6) + b"orders" + struct.pack(">iiii", 2, 0, 1, -1)


@pytest.fixture
def fast_broker(broker_factory) -> Iterator[RunningBroker]:  # noqa: ANN001
    running = broker_factory({"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1000"})
    admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
    admin.create_topics([NewTopic("orders", 2, 1)])
    admin.close()
    yield running


def join(client: WireClient, group: str, member_id: str = "", version: int = 9, **extra: object):  # noqa: ANN201
    request = JoinGroupRequest(
        group_id=group,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id=member_id,
        protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=SUBSCRIPTION)],
        **extra,
    )
    return client.request(request, version)


def stable_member(client: WireClient, group: str) -> tuple[str, int]:
    """One member joined (KIP-394 two-step) and synced; its id and generation."""
    member_id = join(client, group).member_id
    joined = join(client, group, member_id)
    assert (joined.error_code, joined.leader, joined.generation_id) == (ErrorCode.NONE, member_id, 1)
    synced = client.request(
        SyncGroupRequest(
            group_id=group,
            generation_id=1,
            member_id=member_id,
            protocol_type="consumer",
            protocol_name="range",
            assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=member_id, assignment=ASSIGNMENT)],
        ),
        5,
    )
    assert (synced.error_code, synced.assignment) == (ErrorCode.NONE, ASSIGNMENT)
    return member_id, 1


def commit(client: WireClient, group: str, generation: int, member_id: str, version: int, offset: int = 5):  # noqa: ANN201
    return client.request(
        OffsetCommitRequest(
            group_id=group,
            generation_id_or_member_epoch=generation,
            member_id=member_id,
            topics=[
                OffsetCommitRequest.OffsetCommitRequestTopic(
                    name="orders",
                    partitions=[
                        OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset)
                    ],
                )
            ],
        ),
        version,
    )


def commit_code(response) -> int:  # noqa: ANN001
    return response.topics[0].partitions[0].error_code


def test_join_group_versions_and_sync_group_v5_checks(fast_broker: RunningBroker) -> None:
    with WireClient(fast_broker.bootstrap) as client:
        required = join(client, "wire", version=4)
        assert required.error_code == ErrorCode.MEMBER_ID_REQUIRED and required.member_id.startswith("kbroker-wire")
        old_client = join(client, "wire-v3", version=3)  # before KIP-394: in at once
        assert (old_client.error_code, old_client.generation_id) == (ErrorCode.NONE, 1)
        joined = join(client, "wire", required.member_id, version=7)
        assert (joined.error_code, joined.protocol_type, joined.protocol_name) == (ErrorCode.NONE, "consumer", "range")
        assert [(m.member_id, m.metadata) for m in joined.members] == [(required.member_id, SUBSCRIPTION)]

        def sync(protocol_type: str | None, protocol_name: str | None):  # noqa: ANN202
            return client.request(
                SyncGroupRequest(
                    group_id="wire",
                    generation_id=1,
                    member_id=required.member_id,
                    protocol_type=protocol_type,
                    protocol_name=protocol_name,
                    assignments=[],
                ),
                5,
            )

        assert sync("connect", "range").error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert sync("consumer", "roundrobin").error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        done = sync("consumer", "range")
        assert (done.error_code, done.protocol_type, done.protocol_name) == (ErrorCode.NONE, "consumer", "range")
        beat = HeartbeatRequest(group_id="wire", generation_id=1, member_id=required.member_id)
        assert client.request(beat, 4).error_code == ErrorCode.NONE
        stale = HeartbeatRequest(group_id="wire", generation_id=0, member_id=required.member_id)
        assert client.request(stale, 4).error_code == ErrorCode.ILLEGAL_GENERATION
        wrong = HeartbeatRequest(group_id="wire", generation_id=1, member_id=required.member_id, group_instance_id="x")
        assert client.request(wrong, 3).error_code == ErrorCode.UNKNOWN_MEMBER_ID
        session = join(client, "wire-bad", version=9, group_instance_id="s").error_code
        assert session == ErrorCode.NONE  # static members are never asked for a member id first
        too_short = JoinGroupRequest(group_id="x", session_timeout_ms=10, member_id="", protocol_type="consumer")
        too_short.protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")]
        assert client.request(too_short, 5).error_code == ErrorCode.INVALID_SESSION_TIMEOUT


def test_leave_group_single_and_batched(fast_broker: RunningBroker) -> None:
    with WireClient(fast_broker.bootstrap) as client:
        member_id, _ = stable_member(client, "leavers")
        unknown_v0 = client.request(LeaveGroupRequest(group_id="leavers", member_id="ghost"), 0)
        assert unknown_v0.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        identity = LeaveGroupRequest.MemberIdentity
        batch = client.request(
            LeaveGroupRequest(
                group_id="leavers",
                members=[
                    identity(member_id=member_id),
                    identity(member_id="", group_instance_id="nobody"),
                    identity(member_id="ghost"),
                ],
            ),
            5,
        )
        assert batch.error_code == ErrorCode.NONE
        assert [(m.member_id, m.group_instance_id, m.error_code) for m in batch.members] == [
            (member_id, None, ErrorCode.NONE),
            ("", "nobody", ErrorCode.UNKNOWN_MEMBER_ID),
            ("ghost", None, ErrorCode.UNKNOWN_MEMBER_ID),
        ]
        no_group = client.request(LeaveGroupRequest(group_id="no-such", members=[identity(member_id="m")]), 3)
        assert no_group.error_code == ErrorCode.NONE  # Kafka: the member is unknown, not the request
        assert [m.error_code for m in no_group.members] == [ErrorCode.UNKNOWN_MEMBER_ID]
        described = client.request(DescribeGroupsRequest(groups=["leavers"]), 5).groups[0]
        assert (described.group_state, described.protocol_type, described.members) == ("Empty", "consumer", [])


def test_list_groups_filters_by_state_and_type(fast_broker: RunningBroker) -> None:
    with WireClient(fast_broker.bootstrap) as client:
        stable_member(client, "busy")
        assert commit_code(commit(client, "idle", -1, "", 8)) == ErrorCode.NONE  # a group with offsets only

        def listed(version: int, states: list[str] | None = None, types: list[str] | None = None) -> list[tuple]:
            request = ListGroupsRequest(states_filter=states or [], types_filter=types or [])
            response = client.request(request, version)
            assert response.error_code == ErrorCode.NONE
            return sorted((g.group_id, g.protocol_type, g.group_state, g.group_type) for g in response.groups)

        everything = [("busy", "consumer", "Stable", "classic"), ("idle", "", "Empty", "classic")]
        assert listed(5) == everything
        assert listed(4, ["Stable"]) == [("busy", "consumer", "Stable", "")]  # v4 has no group type
        assert listed(4, ["empty", "DEAD"]) == [("idle", "", "Empty", "")]  # states compare case-insensitively
        assert listed(5, types=["Classic"]) == everything
        assert listed(5, types=["consumer"]) == []
        assert listed(5, ["stable"], ["classic", "consumer"]) == everything[:1]
        # v3 has neither filter nor state: every group.
        v3 = client.request(ListGroupsRequest(), 3)
        assert sorted(g.group_id for g in v3.groups) == ["busy", "idle"]


def test_describe_groups_fields_and_errors(fast_broker: RunningBroker) -> None:
    with WireClient(fast_broker.bootstrap, client_id="describer") as client:
        member_id, _ = stable_member(client, "shown")
        with_ops = client.request(
            DescribeGroupsRequest(groups=["shown", "absent"], include_authorized_operations=True), 5
        )
        shown, absent = with_ops.groups
        assert (shown.error_code, shown.group_state, shown.protocol_type, shown.protocol_data) == (
            ErrorCode.NONE,
            "Stable",
            "consumer",
            "range",
        )
        assert shown.authorized_operations == GROUP_OPERATIONS
        (member,) = shown.members
        assert (member.member_id, member.group_instance_id, member.client_id, member.client_host) == (
            member_id,
            None,
            "describer",
            "/127.0.0.1",
        )
        assert (member.member_metadata, member.member_assignment) == (SUBSCRIPTION, ASSIGNMENT)
        # Before v6 an unknown group is described as Dead without an error.
        assert (absent.error_code, absent.group_state, absent.members) == (ErrorCode.NONE, "Dead", [])
        assert absent.authorized_operations == GROUP_OPERATIONS

        v6 = client.request(DescribeGroupsRequest(groups=["absent", "shown"]), 6)
        missing, found = v6.groups
        assert (missing.error_code, missing.error_message, missing.group_state) == (
            ErrorCode.GROUP_ID_NOT_FOUND,
            "Group absent not found.",
            "Dead",
        )
        assert missing.authorized_operations == AUTHORIZED_OPERATIONS_NOT_REQUESTED
        assert (found.error_code, found.error_message) == (ErrorCode.NONE, None)
        assert found.authorized_operations == AUTHORIZED_OPERATIONS_NOT_REQUESTED  # not asked for

        # While rebalancing, members are listed without metadata or assignment, and no protocol.
        rejoin = join(client, "shown", member_id)  # the leader rejoining of a one-member group: at once
        assert rejoin.generation_id == 2
        completing = client.request(DescribeGroupsRequest(groups=["shown"]), 4).groups[0]
        assert (completing.group_state, completing.protocol_data) == ("CompletingRebalance", "")
        assert [(m.member_id, m.member_metadata, m.member_assignment) for m in completing.members] == [
            (member_id, b"", b"")
        ]


def test_offset_commit_and_fetch_checks(fast_broker: RunningBroker) -> None:
    with WireClient(fast_broker.bootstrap) as client:
        assert commit_code(commit(client, "nobody", 3, "m", 9)) == ErrorCode.GROUP_ID_NOT_FOUND
        assert commit_code(commit(client, "nobody", 3, "m", 8)) == ErrorCode.ILLEGAL_GENERATION
        member_id, generation = stable_member(client, "committer")
        assert commit_code(commit(client, "committer", generation, member_id, 9, offset=11)) == ErrorCode.NONE
        assert commit_code(commit(client, "committer", generation + 1, member_id, 9)) == ErrorCode.ILLEGAL_GENERATION
        assert commit_code(commit(client, "committer", generation, "other", 9)) == ErrorCode.UNKNOWN_MEMBER_ID
        assert commit_code(commit(client, "committer", -1, "", 9)) == ErrorCode.UNKNOWN_MEMBER_ID

        # require_stable (v7+): UNSTABLE_OFFSET_COMMIT is only for partitions with pending transactional
        # offsets; kbroker has no transactions, so committed offsets are always stable.
        topic = OffsetFetchRequest.OffsetFetchRequestTopic(name="orders", partition_indexes=[0, 1])
        v7 = client.request(OffsetFetchRequest(group_id="committer", topics=[topic], require_stable=True), 7)
        assert v7.error_code == ErrorCode.NONE
        assert [(p.partition_index, p.committed_offset, p.error_code) for p in v7.topics[0].partitions] == [
            (0, 11, ErrorCode.NONE),
            (1, -1, ErrorCode.NONE),
        ]
        group = OffsetFetchRequest.OffsetFetchRequestGroup
        v8 = client.request(
            OffsetFetchRequest(
                groups=[group(group_id="committer", topics=None), group(group_id="empty")], require_stable=True
            ),
            8,
        )
        committed, empty = v8.groups
        assert [
            (t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in committed.topics
        ] == [("orders", [(0, 11)])]
        assert (empty.error_code, empty.topics) == (ErrorCode.NONE, [])
