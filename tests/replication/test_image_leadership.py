"""The replica layer and the coordinators take leadership from the metadata image: each delta's local changes
make this broker's replicas leader, follower or stopped (Kafka's ReplicaManager.applyDelta), a leader's log
starts the image's leader epoch, the coordinator shards of internal partitions are loaded and unloaded with
their leadership, and FindCoordinator names the image's leader. Deltas are fed as the controller publishes them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kbroker.apis.groups import handle_find_coordinator
from kbroker.apis.leader_epochs import handle_offset_for_leader_epoch
from kbroker.apis.list_offsets import handle_list_offsets
from kbroker.apis.metadata import handle_metadata
from kbroker.broker import Broker
from kbroker.coordinators.runtime import CoordinatorRuntime
from kbroker.groups.offsets import OFFSETS_TOPIC, CommittedOffset
from kbroker.storage import PartitionLog
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.offset_for_leader_epoch_request import OffsetForLeaderEpochRequest
from protocol.metadata_records.partition_change_record import PartitionChangeRecord
from tests.broker.test_handlers_in_memory import context, create, run
from tests.replication.conftest import NODE, in_memory_broker
from tests.replication.test_replica_layer import produce
from tests.replication.two_brokers import OTHER, OTHER_PORT, move_leader, publish, register_other


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    with in_memory_broker(tmp_path / "data", {"offsets.topic.num.partitions": "3"}) as broker:
        yield broker


def log_of(broker: Broker, topic: str) -> PartitionLog:
    log = broker.topics.partition(topic, 0)
    assert log is not None
    return log


def metadata_leader(broker: Broker, topic: str) -> tuple[int, int]:
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)])
    [answer] = run(lambda: handle_metadata(context(broker, 3, 12), request)).topics
    return answer.partitions[0].leader_id, answer.partitions[0].leader_epoch


def find_coordinator(broker: Broker, group: str) -> tuple[int, int, str, int]:
    request = FindCoordinatorRequest(key_type=0, coordinator_keys=[group])
    [answer] = run(lambda: handle_find_coordinator(context(broker, 10, 4), request)).coordinators
    return answer.error_code, answer.node_id, answer.host, answer.port


def epoch_end(broker: Broker, topic: str, current_epoch: int, epoch: int) -> tuple[int, int, int]:
    """(error code, epoch, end offset) of OffsetForLeaderEpoch v4 for partition 0."""
    partition = OffsetForLeaderEpochRequest.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=current_epoch, leader_epoch=epoch
    )
    request = OffsetForLeaderEpochRequest(
        replica_id=-1, topics=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=topic, partitions=[partition])]
    )
    [answer] = run(lambda: handle_offset_for_leader_epoch(context(broker, 23, 4), request)).topics[0].partitions
    return answer.error_code, answer.leader_epoch, answer.end_offset


def latest_epoch(broker: Broker, topic: str) -> tuple[int, int]:
    """(error code, leader epoch) of ListOffsets v7 for the latest offset of partition 0."""
    partition = ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[partition])]
    )
    answer = run(lambda: handle_list_offsets(context(broker, 2, 7), request)).topics[0].partitions[0]
    return answer.error_code, answer.leader_epoch


def test_a_follower_registration_refuses_produce_and_leading_again_starts_the_images_epoch(broker: Broker) -> None:
    assert create(broker, "orders").topics[0].error_code == ErrorCode.NONE
    assert produce(broker, "orders", [b"a"], 1) == (ErrorCode.NONE, 0)
    log = broker.topics.partition("orders", 0)
    assert log is not None and log.leader_epoch == 0

    follower_epoch = move_leader(broker, "orders", 0, OTHER)
    replica = broker.replicas.partition("orders", 0)
    assert replica is not None and not replica.is_leader and replica.leader_epoch == follower_epoch
    assert produce(broker, "orders", [b"b"], 1) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)
    # As Kafka's metadata cache: a leader the image has no broker registration of is not named.
    assert metadata_leader(broker, "orders") == (-1, follower_epoch)
    register_other(broker)
    assert metadata_leader(broker, "orders") == (OTHER, follower_epoch)
    assert epoch_end(broker, "orders", -1, 0)[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert latest_epoch(broker, "orders")[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER

    leader_epoch = move_leader(broker, "orders", 0, NODE)
    assert leader_epoch > follower_epoch > 0
    assert replica.is_leader and log.leader_epoch == leader_epoch == replica.leader_epoch
    assert metadata_leader(broker, "orders") == (NODE, leader_epoch)
    assert latest_epoch(broker, "orders") == (ErrorCode.NONE, leader_epoch)
    assert epoch_end(broker, "orders", follower_epoch, 0)[0] == ErrorCode.FENCED_LEADER_EPOCH
    # A follower in the ISR that has not fetched holds the high watermark: acks=1 is answered at once.
    assert produce(broker, "orders", [b"c"], 1) == (ErrorCode.NONE, 1)
    assert log.end_offset_for_epoch(follower_epoch) == (0, 1)  # epoch 0 ended where the new leader began
    assert log.end_offset_for_epoch(leader_epoch) == (leader_epoch, 2)
    assert epoch_end(broker, "orders", leader_epoch, 0) == (ErrorCode.NONE, 0, 1)


def test_the_offsets_shard_unloads_with_leadership_and_reloads_from_the_log_in_the_new_epoch(broker: Broker) -> None:
    offsets = broker.offsets
    offsets.ensure_topic()  # every partition placed on this broker, the only one registered
    register_other(broker)
    group = "payments"
    partition = offsets.partition_for(group)
    committed = CommittedOffset(offset=42, leader_epoch=0, metadata="m", commit_timestamp=1)
    offsets.commit(group, {("orders", 0): committed})
    assert find_coordinator(broker, group) == (ErrorCode.NONE, NODE, "localhost", 9092)

    move_leader(broker, OFFSETS_TOPIC, partition, OTHER)
    assert partition not in offsets.runtime.shards
    assert offsets.get(group) == {}
    # The coordinator is the image's leader, named by its registered endpoint.
    assert find_coordinator(broker, group) == (ErrorCode.NONE, OTHER, "other.example", OTHER_PORT)
    untouched = next(p for p in range(3) if p != partition)
    assert untouched in offsets.runtime.shards

    epoch = move_leader(broker, OFFSETS_TOPIC, partition, NODE)
    assert offsets.runtime.shard_epochs[partition] == epoch
    assert offsets.get(group) == {("orders", 0): committed}  # replayed from the partition
    assert find_coordinator(broker, group) == (ErrorCode.NONE, NODE, "localhost", 9092)
    replica = broker.replicas.partition(OFFSETS_TOPIC, partition)
    assert replica is not None and replica.log.leader_epoch == epoch


def fail_loads(
    monkeypatch: pytest.MonkeyPatch, runtime: CoordinatorRuntime[Any], partition: int, failures: int
) -> list[int]:
    """Make ``runtime``'s next ``failures`` loads of ``partition`` fail as a log that cannot be read does; the
    attempts are recorded."""
    load = runtime.load
    attempts: list[int] = []

    def failing(index: int) -> Any:
        if index == partition:
            attempts.append(index)
            if len(attempts) <= failures:
                raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"partition {index} cannot be read")
        return load(index)

    monkeypatch.setattr(runtime, "load", failing)
    return attempts


def test_an_offsets_shard_whose_reload_failed_is_loaded_by_the_next_find_coordinator(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leading a partition again, in a new epoch, reloads its shard; if that reload fails, the next use of the
    partition loads it (the FindCoordinator of one of its groups), as for a partition whose files were not made
    yet: its groups are not left answering COORDINATOR_NOT_AVAILABLE until a restart."""
    offsets = broker.offsets
    offsets.ensure_topic()
    register_other(broker)
    group = "payments"
    partition = offsets.partition_for(group)
    committed = CommittedOffset(offset=42, leader_epoch=0, metadata="m", commit_timestamp=1)
    offsets.commit(group, {("orders", 0): committed})

    move_leader(broker, OFFSETS_TOPIC, partition, OTHER)
    attempts = fail_loads(monkeypatch, offsets.runtime, partition, failures=1)
    epoch = move_leader(broker, OFFSETS_TOPIC, partition, NODE)
    assert attempts == [partition] and partition not in offsets.runtime.shards
    assert find_coordinator(broker, group) == (ErrorCode.NONE, NODE, "localhost", 9092)
    assert attempts == [partition, partition] and offsets.runtime.shard_epochs[partition] == epoch
    assert offsets.get(group) == {("orders", 0): committed}


def test_a_transaction_state_shard_whose_reload_failed_is_loaded_by_the_next_find_coordinator(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    transactions = broker.transactions
    transactions.ensure_topic()
    register_other(broker)
    partition = transactions.partition_for("tx")
    assert transactions.init_producer_id("tx", 60000).error == ErrorCode.NONE

    move_leader(broker, "__transaction_state", partition, OTHER)
    attempts = fail_loads(monkeypatch, transactions.state_log, partition, failures=1)
    move_leader(broker, "__transaction_state", partition, NODE)
    assert attempts == [partition] and "tx" not in transactions.transactions
    request = FindCoordinatorRequest(key_type=1, coordinator_keys=["tx"])
    [answer] = run(lambda: handle_find_coordinator(context(broker, 10, 4), request)).coordinators
    assert (answer.error_code, answer.node_id) == (ErrorCode.NONE, NODE)
    assert attempts == [partition, partition] and "tx" in transactions.transactions


def test_a_transaction_state_shard_and_its_ids_go_when_this_broker_stops_leading_it(broker: Broker) -> None:
    transactions = broker.transactions
    transactions.ensure_topic()
    partition = transactions.partition_for("tx")
    assert transactions.init_producer_id("tx", 60000).error == ErrorCode.NONE
    assert "tx" in transactions.transactions

    move_leader(broker, "__transaction_state", partition, OTHER)
    assert partition not in transactions.state_log.shards and "tx" not in transactions.transactions

    move_leader(broker, "__transaction_state", partition, NODE)
    assert partition in transactions.state_log.shards and "tx" in transactions.transactions


def test_a_reloaded_transaction_state_shard_times_out_its_ids_and_marks_in_the_new_coordinator_epoch(
    broker: Broker,
) -> None:
    """As Kafka's coordinator after loading a partition: the Ongoing transactions it holds get their timeouts
    again, and the abort a timeout writes carries the partition's leader epoch as its coordinator epoch (a marker
    of a zombie coordinator, in an older epoch, is then refused by the partition)."""
    transactions = broker.transactions
    transactions.ensure_topic()
    register_other(broker)
    assert create(broker, "orders").topics[0].error_code == ErrorCode.NONE
    state_partition = transactions.partition_for("tx")
    started = transactions.init_producer_id("tx", 1000)
    assert started.error == ErrorCode.NONE
    pid, epoch = started.producer_id, started.producer_epoch
    assert transactions.add_partitions("tx", pid, epoch, [("orders", 0)]) == ErrorCode.NONE

    move_leader(broker, "__transaction_state", state_partition, OTHER)
    coordinator_epoch = move_leader(broker, "__transaction_state", state_partition, NODE)
    assert coordinator_epoch > 0
    assert transactions.state_log.coordinator_epoch(state_partition) == coordinator_epoch
    assert transactions.transactions["tx"].state.value == "Ongoing"

    deadline = transactions.next_deadline_ms()
    assert deadline is not None  # the reloaded id's timeout is armed
    later = deadline + 1
    transactions._now_ms = lambda: later  # the coordinator's wall clock, past the timeout
    transactions.tick()
    # The abort's markers wait until the ISR has PrepareAbort: the other replica never fetches here, so it is
    # dropped from the ISR; the next retry writes them.
    assert transactions.transactions["tx"].state.value == "PrepareAbort"
    topic_id = broker.metadata.image.topics.by_name["__transaction_state"].topic_id
    publish(broker, PartitionChangeRecord(partition_id=state_partition, topic_id=topic_id, isr=[NODE]))
    retry = later + 1001
    transactions._now_ms = lambda: retry
    transactions.tick()
    metadata = transactions.transactions["tx"]
    assert metadata.state.value == "CompleteAbort" and metadata.producer_epoch == epoch + 1

    log = log_of(broker, "orders")
    entry = log.producers.producers[pid]
    assert entry.coordinator_epoch == coordinator_epoch
    # A marker from the coordinator's earlier epoch is a zombie's.
    zombie = log.append_marker(pid, epoch + 1, False, coordinator_epoch - 1, later)
    assert zombie.error_code == ErrorCode.TRANSACTION_COORDINATOR_FENCED


def test_an_unloaded_transaction_state_shard_leaves_no_timer_behind(broker: Broker) -> None:
    transactions = broker.transactions
    transactions.ensure_topic()
    register_other(broker)
    assert create(broker, "orders").topics[0].error_code == ErrorCode.NONE
    started = transactions.init_producer_id("tx", 1000)
    assert transactions.add_partitions("tx", started.producer_id, started.producer_epoch, [("orders", 0)]) == 0
    assert transactions.next_deadline_ms() is not None

    move_leader(broker, "__transaction_state", transactions.partition_for("tx"), OTHER)
    # The timeout of a transaction this broker no longer coordinates is gone with it.
    assert transactions.next_deadline_ms() is None


def consumer_heartbeat(broker: Broker, group: str, member_id: str, epoch: int) -> tuple[int, str, int]:
    """(error code, member id, member epoch) of a KIP-848 heartbeat subscribing to "orders"."""
    from kbroker.apis.consumer_groups import handle_consumer_group_heartbeat
    from protocol.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest

    request = ConsumerGroupHeartbeatRequest(
        group_id=group,
        member_id=member_id,
        member_epoch=epoch,
        rebalance_timeout_ms=30000,
        subscribed_topic_names=["orders"] if epoch == 0 else None,
        topic_partitions=[] if epoch == 0 else None,
    )
    answer = run(lambda: handle_consumer_group_heartbeat(context(broker, 68, 1), request))
    return answer.error_code, answer.member_id or "", answer.member_epoch


def offset_fetch_code(broker: Broker, group: str) -> int:
    """The group's error code in an OffsetFetch v9 of every partition it committed."""
    from kbroker.apis.group_offsets import handle_offset_fetch
    from protocol.messages.offset_fetch_request import OffsetFetchRequest

    request = OffsetFetchRequest(groups=[OffsetFetchRequest.OffsetFetchRequestGroup(group_id=group, topics=None)])
    [answer] = run(lambda: handle_offset_fetch(context(broker, 9, 9), request)).groups
    return answer.error_code


def test_groups_unload_with_their_partition_and_come_back_from_its_log(broker: Broker) -> None:
    """As Kafka's coordinator: the groups of a __consumer_offsets partition go from memory when this broker stops
    leading it (a heartbeat then answers NOT_COORDINATOR), and come back from its records when it leads again,
    members, epochs and assignments as they were."""
    offsets = broker.offsets
    offsets.ensure_topic()
    register_other(broker)
    assert create(broker, "orders").topics[0].error_code == ErrorCode.NONE
    group = "payments"
    code, member, epoch = consumer_heartbeat(broker, group, str(uuid.uuid4()), 0)
    assert code == ErrorCode.NONE and epoch >= 1
    before = broker.consumer_groups.groups[group]
    assigned = dict(before.members[member].assigned)
    assert assigned  # the only member owns the topic's partition
    classic = broker.groups
    partition = offsets.partition_for(group)

    move_leader(broker, OFFSETS_TOPIC, partition, OTHER)
    assert group not in broker.consumer_groups.groups
    assert consumer_heartbeat(broker, group, member, epoch)[0] == ErrorCode.NOT_COORDINATOR
    assert offset_fetch_code(broker, group) == ErrorCode.NOT_COORDINATOR

    async def lead_again() -> int:  # on the event loop, as the broker applies an image: sessions restart then
        return move_leader(broker, OFFSETS_TOPIC, partition, NODE)

    run(lead_again)
    restored = broker.consumer_groups.groups[group]
    assert (restored.group_epoch, restored.assignment_epoch) == (before.group_epoch, before.assignment_epoch)
    assert restored.members[member].member_epoch == epoch and dict(restored.members[member].assigned) == assigned
    assert consumer_heartbeat(broker, group, member, epoch) == (ErrorCode.NONE, member, epoch)
    assert offset_fetch_code(broker, group) == ErrorCode.NONE
    assert classic.groups == {}  # no classic group was made or restored along the way


def test_a_classic_group_unloads_with_its_partition_and_comes_back_from_its_log(broker: Broker) -> None:
    from kbroker.apis.groups import handle_heartbeat
    from kbroker.groups.coordinator import Group, GroupState, Member
    from protocol.messages.heartbeat_request import HeartbeatRequest

    offsets = broker.offsets
    offsets.ensure_topic()
    register_other(broker)
    classic = broker.groups
    member = Member("m-1", None, "client", "/10.0.0.1", 10000, 30000, "consumer", [("range", b"sub")], assignment=b"a")
    group = Group(
        "billing",
        state=GroupState.STABLE,
        generation_id=3,
        protocol_type="consumer",
        protocol_name="range",
        leader_id="m-1",
        members={"m-1": member},
    )
    offsets.store_group(group)  # its generation, as the coordinator writes it

    async def restore() -> None:
        classic.restore([group])

    run(restore)
    partition = offsets.partition_for("billing")

    def heartbeat() -> int:
        request = HeartbeatRequest(group_id="billing", generation_id=3, member_id="m-1")
        try:
            return run(lambda: handle_heartbeat(context(broker, 12, 4), request)).error_code
        except KafkaError as exc:  # the answer the pipeline's boundary gives
            return exc.code

    assert heartbeat() == ErrorCode.NONE
    move_leader(broker, OFFSETS_TOPIC, partition, OTHER)
    assert "billing" not in classic.groups
    assert heartbeat() == ErrorCode.NOT_COORDINATOR

    async def lead_again() -> int:
        return move_leader(broker, OFFSETS_TOPIC, partition, NODE)

    run(lead_again)
    restored = classic.groups["billing"]
    assert (restored.generation_id, restored.leader_id, list(restored.members)) == (3, "m-1", ["m-1"])
    assert restored.members["m-1"].assignment == b"a"
    assert heartbeat() == ErrorCode.NONE


def test_a_join_parked_when_its_partition_is_unloaded_and_loaded_again_is_answered_not_coordinator(
    broker: Broker,
) -> None:
    """A JoinGroup parked in a new group's rebalance is answered NOT_COORDINATOR when the group's partition is
    unloaded, even if this broker leads it again at once (a new leader epoch): its client looks up the coordinator
    and joins again instead of waiting out its request timeout."""
    from kbroker.groups.coordinator import GroupState

    offsets = broker.offsets
    offsets.ensure_topic()
    register_other(broker)
    classic = broker.groups
    partition = offsets.partition_for("billing")

    async def scenario() -> tuple[bool, list[int]]:
        answers: list[int] = []

        async def join() -> None:
            result = await classic.join(
                "billing", "", None, "client", "/10.0.0.1", 10000, 30000, "consumer", [("range", b"sub")], False
            )
            answers.append(result.error_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(join)
            await trio.testing.wait_all_tasks_blocked()
            parked = classic.groups["billing"].state == GroupState.PREPARING_REBALANCE and not answers
            move_leader(broker, OFFSETS_TOPIC, partition, OTHER)
            move_leader(broker, OFFSETS_TOPIC, partition, NODE)
        return parked, answers

    parked, answers = run(scenario)
    assert parked and answers == [ErrorCode.NOT_COORDINATOR]
    assert partition in offsets.runtime.shards and "billing" not in classic.groups  # it was never written
