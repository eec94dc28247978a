"""Classic group membership in __consumer_offsets: each generation is a GroupMetadata record, so a group
survives a broker restart as in Kafka (its members carry on by heartbeating), and DeleteGroups writes its
tombstone."""

from __future__ import annotations

import struct
from pathlib import Path

from kbroker.groups.offsets import OFFSETS_TOPIC
from kbroker.java_hashing import coordinator_partition
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.coordinator_frame import decode_coordinator_record
from protocol.coordinator_records.group_metadata_value import GroupMetadataValue
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.delete_groups_request import DeleteGroupsRequest
from protocol.messages.describe_groups_request import DescribeGroupsRequest
from protocol.messages.heartbeat_request import HeartbeatRequest
from protocol.messages.join_group_request import JoinGroupRequest
from protocol.messages.leave_group_request import LeaveGroupRequest
from protocol.messages.sync_group_request import SyncGroupRequest
from protocol.records import decode_records, iter_batches

SUBSCRIPTION = struct.pack(">hih", 0, 1, 6) + b"orders" + struct.pack(">i", -1)
ASSIGNMENT = struct.pack(">hih", 0, 1, 6) + b"orders" + struct.pack(">iiii", 2, 0, 1, -1)
SETTINGS = {"group.initial.rebalance.delay.ms": "0", "offsets.topic.num.partitions": "4"}


def join(client: WireClient, member_id: str = "") -> tuple[int, str, int]:
    request = JoinGroupRequest(
        group_id="kept",
        session_timeout_ms=30_000,
        rebalance_timeout_ms=20_000,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=SUBSCRIPTION)],
    )
    answer = client.request(request, 9)
    return answer.error_code, answer.member_id, answer.generation_id


def group_records(data_dir: Path) -> list[GroupMetadataValue | None]:
    segment = data_dir / f"{OFFSETS_TOPIC}-{coordinator_partition('kept', 4)}" / "00000000000000000000.log"
    values = []
    for _, batch in iter_batches(segment.read_bytes()):
        for record in decode_records(batch):
            decoded = decode_coordinator_record("group", record.key, record.value)
            if decoded.record_type == 2:
                assert decoded.value is None or isinstance(decoded.value, GroupMetadataValue)
                values.append(decoded.value)
    return values


def test_a_stable_classic_group_survives_a_restart_and_its_member_carries_on(tmp_path: Path) -> None:
    broker = RunningBroker(tmp_path / "data", SETTINGS).start()
    try:
        with WireClient(broker.bootstrap) as client:
            topic = CreateTopicsRequest.CreatableTopic(name="orders", num_partitions=2, replication_factor=1)
            client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 5)
            _, member_id, _ = join(client)  # MEMBER_ID_REQUIRED, then the join with the id
            assert join(client, member_id) == (ErrorCode.NONE, member_id, 1)
            sync = SyncGroupRequest(
                group_id="kept",
                generation_id=1,
                member_id=member_id,
                protocol_type="consumer",
                protocol_name="range",
                assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=member_id, assignment=ASSIGNMENT)],
            )
            assert client.request(sync, 5).error_code == ErrorCode.NONE
        broker.stop()
        [stored] = group_records(tmp_path / "data")
        assert stored is not None
        assert (stored.protocol_type, stored.generation, stored.protocol, stored.leader) == (
            "consumer",
            1,
            "range",
            member_id,
        )
        [member] = stored.members
        assert (member.member_id, member.session_timeout, member.rebalance_timeout) == (member_id, 30_000, 20_000)
        assert (member.subscription, member.assignment) == (SUBSCRIPTION, ASSIGNMENT)
        broker.start()
        with WireClient(broker.bootstrap) as client:
            [described] = client.request(DescribeGroupsRequest(groups=["kept"]), 5).groups
            assert (described.group_state, described.protocol_data, len(described.members)) == ("Stable", "range", 1)
            assert (described.members[0].member_id, described.members[0].member_assignment) == (member_id, ASSIGNMENT)
            beat = HeartbeatRequest(group_id="kept", generation_id=1, member_id=member_id)
            assert client.request(beat, 4).error_code == ErrorCode.NONE  # the same generation, no rebalance
            leave = LeaveGroupRequest(group_id="kept", members=[LeaveGroupRequest.MemberIdentity(member_id=member_id)])
            assert client.request(leave, 3).error_code == ErrorCode.NONE
            [left] = client.request(DescribeGroupsRequest(groups=["kept"]), 5).groups
            assert left.group_state == "Empty"
            [deleted] = client.request(DeleteGroupsRequest(groups_names=["kept"]), 2).results
            assert deleted.error_code == ErrorCode.NONE
        broker.stop()
        *_, empty, tombstone = group_records(tmp_path / "data")
        assert empty is not None and (empty.generation, empty.members) == (2, [])  # emptied by the leave
        assert tombstone is None
        broker.start()
        with WireClient(broker.bootstrap) as client:
            [gone] = client.request(DescribeGroupsRequest(groups=["kept"]), 5).groups
            assert gone.group_state == "Dead"
    finally:
        broker.stop()
