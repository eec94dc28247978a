"""A broker restarted under a KRaft quorum replays an image from its own __cluster_metadata-0 that may be stale: it
may still lead partitions the quorum moved while it was down. As Kafka's broker (which installs its metadata
publishers only after its initial catch-up), its replica layer acts on nothing before the metadata follower has
caught up: no replica becomes leader, no follower fetches from the leader the stale image names, no coordinator
shard is loaded; then the current image is applied once, as one delta. No JVM: the quorum's answers are scripted
(tests/kraft/test_metadata_follower.py), and the broker is the real one on a data directory."""

from __future__ import annotations

import base64
import socket
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kbroker.apis.produce import handle_produce
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
from kbroker.groups.offsets import OFFSETS_TOPIC
from kbroker.metadata.image import LocalChanges, PartitionRegistration
from kbroker.metadata.log import MetadataLog
from kbroker.replication import Partition, ReplicaManager
from kbroker.replication.partition import Role
from kbroker.storage import LogManager
from protocol._codec import Message
from protocol.errors import ErrorCode
from protocol.messages.produce_request import ProduceRequest
from protocol.metadata_frame import MetadataRecord
from protocol.metadata_records.partition_change_record import PartitionChangeRecord
from protocol.metadata_records.partition_record import PartitionRecord
from protocol.metadata_records.register_broker_record import BrokerEndpoint, RegisterBrokerRecord
from protocol.metadata_records.topic_record import TopicRecord
from tests.broker.test_handlers_in_memory import batch as records_batch
from tests.broker.test_handlers_in_memory import context
from tests.kraft.test_metadata_follower import ScriptedChannel, answer
from tests.kraft.test_metadata_follower import batch as metadata_batch

NODE, SECOND, THIRD = 1, 2, 3
CLUSTER_ID = "cluster-a"
ORDERS, PAYMENTS = uuid.uuid4(), uuid.uuid4()
OFFSETS_ID = uuid.uuid4()
QUORUM_EPOCH = 4  # the quorum leader's epoch on every metadata batch


def closed_port() -> int:
    """A local port nothing listens on: the other brokers' registered endpoint (their fetchers retry quietly)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def format_data_dir(data_dir: Path) -> None:
    data_dir.mkdir(parents=True)
    directory_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    (data_dir / "meta.properties").write_text(
        f"node.id={NODE}\ndirectory.id={directory_id}\nversion=1\ncluster.id={CLUSTER_ID}\n"
    )


def records(*messages: tuple[Message, int]) -> list[MetadataRecord]:
    return [MetadataRecord(message, version) for message, version in messages]


def initial_metadata(port: int) -> list[MetadataRecord]:
    """Three brokers; orders-0 and __consumer_offsets-0 led by this broker in leader epoch 3 (ISR: it and 2),
    payments-0 led by broker 2 in leader epoch 5."""
    brokers = [
        (
            RegisterBrokerRecord(
                broker_id=node,
                incarnation_id=uuid.UUID(int=node),
                broker_epoch=10 + node,
                end_points=[BrokerEndpoint(name="PLAINTEXT", host="127.0.0.1", port=port, security_protocol=0)],
                fenced=False,
            ),
            3,
        )
        for node in (NODE, SECOND, THIRD)
    ]

    def led_here(topic_id: uuid.UUID) -> PartitionRecord:
        return PartitionRecord(
            partition_id=0,
            topic_id=topic_id,
            replicas=[NODE, SECOND],
            isr=[NODE, SECOND],
            leader=NODE,
            leader_epoch=3,
            partition_epoch=3,
        )

    return records(
        *brokers,
        (TopicRecord(name="orders", topic_id=ORDERS), 0),
        (led_here(ORDERS), 2),
        (TopicRecord(name=OFFSETS_TOPIC, topic_id=OFFSETS_ID), 0),
        (led_here(OFFSETS_ID), 2),
        (TopicRecord(name="payments", topic_id=PAYMENTS), 0),
        (
            PartitionRecord(
                partition_id=0,
                topic_id=PAYMENTS,
                replicas=[SECOND, NODE, THIRD],
                isr=[SECOND, NODE, THIRD],
                leader=SECOND,
                leader_epoch=5,
                partition_epoch=5,
            ),
            2,
        ),
    )


def moved_while_down() -> list[list[MetadataRecord]]:
    """What the quorum committed while this broker was down, batch by batch: payments-0 came to this broker (leader
    epoch 6), then went to broker 3 (7); orders-0 and __consumer_offsets-0 went to broker 2 (4), this broker out of
    their ISR."""

    def change(topic_id: uuid.UUID, leader: int, isr: Sequence[int]) -> tuple[Message, int]:
        return PartitionChangeRecord(partition_id=0, topic_id=topic_id, leader=leader, isr=list(isr)), 0

    return [
        records(change(PAYMENTS, NODE, [NODE, THIRD])),
        records(
            change(PAYMENTS, THIRD, [THIRD]),
            change(ORDERS, SECOND, [SECOND]),
            change(OFFSETS_ID, SECOND, [SECOND]),
        ),
    ]


def open_broker(data_dir: Path) -> Broker:
    config = BrokerConfig(
        {
            "process.roles": "broker",
            "node.id": str(NODE),
            "controller.quorum.bootstrap.servers": "127.0.0.1:9",
            "controller.listener.names": "CONTROLLER",
            "offsets.topic.num.partitions": "1",
        }
    )
    return Broker(config, data_dir, Endpoint("127.0.0.1", 9092))


def script_quorum(broker: Broker, monkeypatch: pytest.MonkeyPatch, channel: ScriptedChannel) -> None:
    assert broker.kraft is not None
    monkeypatch.setattr(broker.kraft.quorum, "channel", lambda address, purpose: channel)


async def fetch_metadata(broker: Broker) -> None:
    assert broker.kraft is not None
    assert await broker.kraft.follower.fetch_once()


def role_of(partition: Partition | None) -> tuple[Role, int, int] | None:
    return None if partition is None else (partition.role, partition.leader_id, partition.leader_epoch)


def logs_state(broker: Broker) -> dict[str, tuple[int, int, list[tuple[int, int]]]]:
    """Each partition log's end offset, high watermark and leader epochs."""
    state = {}
    for topic in ("orders", "payments"):
        plog = broker.logs.get_partition(topic, 0)
        assert plog is not None
        entries = [(entry.epoch, entry.start_offset) for entry in plog.leader_epochs.entries]
        state[topic] = (plog.log_end_offset, plog.high_watermark, entries)
    return state


def first_run(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """The broker's first run: caught up at once, it leads orders-0 in epoch 3 and takes three records there; the
    end offset of its local metadata log."""
    format_data_dir(data_dir)
    with MetadataLog(data_dir) as kept:
        kept.append_committed(metadata_batch(initial_metadata(closed_port()), 0, epoch=QUORUM_EPOCH))
        end = kept.end_offset
    broker = open_broker(data_dir)
    try:
        script_quorum(broker, monkeypatch, ScriptedChannel([answer(high_watermark=end, leader=(3000, QUORUM_EPOCH))]))

        async def serve() -> None:
            await fetch_metadata(broker)
            data = [ProduceRequest.PartitionProduceData(index=0, records=records_batch([b"a", b"b", b"c"]))]
            request = ProduceRequest(
                acks=1,
                timeout_ms=5000,
                topic_data=[ProduceRequest.TopicProduceData(name="orders", partition_data=data)],
            )
            response = await handle_produce(context(broker, 0, 9), request)
            assert response is not None
            answered = response.responses[0].partition_responses[0]
            assert (answered.error_code, answered.base_offset) == (ErrorCode.NONE, 0)

        trio.run(serve)
        assert role_of(broker.replicas.held("orders", 0)) == (Role.LEADER, NODE, 3)
        assert broker.offsets.runtime.shard_epochs == {0: 3}  # its coordinator shard, loaded as leader
    finally:
        broker.close()
    return end


def test_a_restarted_broker_acts_only_on_the_current_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = tmp_path / "data"
    end = first_run(data_dir, monkeypatch)

    # The restart: its image says it leads orders-0 and __consumer_offsets-0 in epoch 3 and follows broker 2 for
    # payments-0; the quorum has moved all three.
    broker = open_broker(data_dir)
    try:
        changes: list[tuple[str, Role, int, int]] = []
        broker.replicas.on_role_change(lambda p: changes.append((p.topic, p.role, p.leader_id, p.leader_epoch)))
        moved = moved_while_down()
        committed = metadata_batch(moved[0], end, epoch=QUORUM_EPOCH)
        committed += metadata_batch(moved[1], end + len(moved[0]), epoch=QUORUM_EPOCH)
        high_watermark = end + len(moved[0]) + len(moved[1])
        script_quorum(broker, monkeypatch, ScriptedChannel([answer(committed, high_watermark=high_watermark)]))
        assert broker.offsets.runtime.shards == {}

        async def restart() -> dict[str, Any]:
            seen: dict[str, Any] = {}
            async with trio.open_nursery() as nursery:
                await nursery.start(broker.replicas.run)  # the replica layer running (its fetchers too) all along
                await trio.testing.wait_all_tasks_blocked()
                orders = broker.replicas.partition("orders", 0)  # a use of the log before the image is current
                seen["orders before"] = role_of(orders)
                seen["payments fetcher before"] = broker.replicas.fetchers and broker.replicas.fetchers.fetcher_of(
                    "payments", 0
                )
                seen["shards before"] = dict(broker.offsets.runtime.shards)
                seen["logs before"] = logs_state(broker)
                await fetch_metadata(broker)  # caught up: the image is current
                await trio.testing.wait_all_tasks_blocked()
                fetchers = broker.replicas.fetchers
                assert fetchers is not None
                for topic in ("orders", "payments"):
                    fetcher = fetchers.fetcher_of(topic, 0)
                    seen[f"{topic} source"] = None if fetcher is None else fetcher.source_id
                nursery.cancel_scope.cancel()
            return seen

        seen = trio.run(restart)
        assert seen["orders before"] == (Role.FOLLOWER, -1, -1)  # held without a role, not its stale leader
        assert seen["payments fetcher before"] is None  # no fetching from the stale leader (broker 2)
        assert seen["shards before"] == {}
        # Once caught up: the current registrations, each applied once, never leading.
        assert role_of(broker.replicas.held("orders", 0)) == (Role.FOLLOWER, SECOND, 4)
        assert role_of(broker.replicas.held("payments", 0)) == (Role.FOLLOWER, THIRD, 7)
        assert (seen["orders source"], seen["payments source"]) == (SECOND, THIRD)
        assert [change for change in changes if change[1] is Role.LEADER] == []
        assert ("orders", Role.FOLLOWER, SECOND, 4) in changes
        assert broker.offsets.runtime.shards == {}  # broker 2 coordinates it now
        # The logs as they were: nothing truncated, no leader epoch started (payments-0 never led in epoch 6).
        assert logs_state(broker) == seen["logs before"]
        assert seen["logs before"]["orders"] == (3, 0, [(3, 0)])  # its records, none replicated yet
    finally:
        broker.close()


def test_a_coordinator_shard_is_loaded_in_the_epoch_the_current_image_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """__consumer_offsets-0 went to broker 2 (epoch 4) and back to this broker (5) while it was down: its shard is
    loaded once, in epoch 5, after the catch-up, and not from the replayed image's epoch 3."""
    data_dir = tmp_path / "data"
    end = first_run(data_dir, monkeypatch)
    broker = open_broker(data_dir)
    try:
        away = [
            MetadataRecord(PartitionChangeRecord(partition_id=0, topic_id=OFFSETS_ID, leader=SECOND, isr=[SECOND]), 0)
        ]
        back = [MetadataRecord(PartitionChangeRecord(partition_id=0, topic_id=OFFSETS_ID, leader=NODE, isr=[NODE]), 0)]
        committed = metadata_batch(away, end, epoch=QUORUM_EPOCH) + metadata_batch(back, end + 1, epoch=QUORUM_EPOCH)
        script_quorum(broker, monkeypatch, ScriptedChannel([answer(committed, high_watermark=end + 2)]))
        loads: list[int] = []
        broker.offsets.shard_listeners.append((loads.append, lambda partition: None))
        assert broker.offsets.runtime.shard_epochs == {}
        trio.run(fetch_metadata, broker)
        assert broker.offsets.runtime.shard_epochs == {0: 5}
        assert role_of(broker.replicas.held(OFFSETS_TOPIC, 0)) == (Role.LEADER, NODE, 5)
        assert loads == [0]
    finally:
        broker.close()


class Registrations:
    """A leadership source answering what the test sets."""

    def __init__(self, registrations: dict[tuple[str, int], PartitionRegistration]) -> None:
        self.registrations = registrations

    def partition(self, topic: str, index: int, /) -> PartitionRegistration | None:
        return self.registrations.get((topic, index))


def test_replicas_held_before_acting_take_only_stops_then_the_current_registrations(tmp_path: Path) -> None:
    """The ReplicaManager alone: before ``start_acting`` a replica opened has no role and deltas change none (a
    stop still stops); ``start_acting`` applies the current registrations once and stops the held replicas they do
    not place here."""
    logs = LogManager.in_memory_store({})
    for name in ("kept", "moved", "deleted"):
        logs.create_topic(name, 1, {})
    stale = PartitionRegistration((NODE, SECOND), (NODE, SECOND), NODE, 3, 3)
    source = Registrations({(name, 0): stale for name in ("kept", "moved", "deleted")})
    replicas = ReplicaManager(logs, NODE, source, tmp_path, acting=False)
    changes: list[tuple[str, Role, int, int]] = []
    replicas.on_role_change(lambda p: changes.append((p.topic, p.role, p.leader_id, p.leader_epoch)))
    held = {name: replicas.partition(name, 0) for name in ("kept", "moved", "deleted")}
    assert {name: role_of(partition) for name, partition in held.items()} == {
        name: (Role.FOLLOWER, -1, -1) for name in held
    }

    replayed = LocalChanges()
    replayed.leaders[("kept", 0)] = stale._replace(leader_epoch=4)
    replayed.deletes.add(("deleted", 0))
    replicas.apply_delta(replayed)
    assert role_of(replicas.held("kept", 0)) == (Role.FOLLOWER, -1, -1)
    assert replicas.held("deleted", 0) is None
    assert changes == [("deleted", Role.FOLLOWER, -1, -1)]

    current = LocalChanges()
    current.leaders[("kept", 0)] = stale._replace(leader_epoch=5, partition_epoch=5)
    replicas.start_acting(current)  # "moved" is no longer placed here (reassigned away while this broker was down)
    assert role_of(replicas.held("kept", 0)) == (Role.LEADER, NODE, 5)
    assert replicas.held("moved", 0) is None
    assert changes[1:] == [("moved", Role.FOLLOWER, -1, -1), ("kept", Role.LEADER, NODE, 5)]
