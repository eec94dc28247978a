"""kbroker's broker role under Apache Kafka's own KRaft controller (a controller-only Kafka 4.4 node from the
Maven jars): it registers, follows ``__cluster_metadata`` as an observer into a MetadataCache, heartbeats until
the controller unfences it, sees the topics the controller places on it as leader, and shuts down under control.
A controller that finalized feature levels kbroker does not support refuses it, and the line says which."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from compat.apache_kafka import KafkaController, KafkaUnavailable
from kbroker.kraft.lifecycle import BrokerLifecycleManager, BrokerListener, RegistrationRefused
from kbroker.kraft.metadata_follower import MetadataFollower
from kbroker.kraft.quorum import QuorumView, parse_voters
from kbroker.metadata.controller import MetadataCache
from kbroker.metadata.features import KRAFT_BROKER_FEATURES
from kbroker.metadata.image import MetadataDelta, MetadataImage
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from tests.kraft.conftest import KBROKER_LEVELS

NODE = 1
BROKER_PORT = 29092  # advertised only: nothing connects to it here
WITHIN = 90  # seconds: a bound against hanging, never a measure (2 busy cores)


def start_controller(directory: Path, features: dict[str, int]) -> KafkaController:
    controller = KafkaController(directory, features=features)
    try:
        controller.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    return controller


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaController]:
    """A one-voter quorum formatted with the feature levels kbroker supports."""
    running = start_controller(tmp_path_factory.mktemp("kafka-controller"), KBROKER_LEVELS)
    try:
        yield running
    finally:
        running.stop()


class Broker:
    """The broker role's parts wired as the broker wires them: quorum view, metadata follower into a cache,
    lifecycle manager fed with the applied offset."""

    def __init__(self, controller: KafkaController, node_id: int = NODE) -> None:
        self.cache = MetadataCache()
        self.deltas: list[MetadataDelta] = []
        self.cache.subscribe(lambda image, delta: self.deltas.append(delta))
        self.quorum = QuorumView(list(parse_voters(controller.voters).values()), client_id=f"kbroker-{node_id}")
        self.follower = MetadataFollower(self.quorum, self.cache, node_id=node_id, cluster_id=controller.cluster_id)
        self.lifecycle = BrokerLifecycleManager(
            self.quorum,
            node_id=node_id,
            cluster_id=controller.cluster_id,
            listeners=[BrokerListener("PLAINTEXT", "127.0.0.1", BROKER_PORT, 0)],
            features=KRAFT_BROKER_FEATURES,
            log_dirs=[uuid.uuid4()],
            applied_offset=lambda: self.follower.applied_offset,
            caught_up=self.follower.caught_up.is_set,
            heartbeat_interval_ms=200,
        )

    @property
    def image(self) -> MetadataImage:
        return self.cache.image

    async def until(self, predicate: Callable[[], bool]) -> None:
        with trio.fail_after(WITHIN):
            while not predicate():
                await trio.sleep(0.05)


def create_topic(controller: KafkaController, name: str, partitions: int) -> int:
    """CreateTopics sent to the controller itself, as a broker forwards it; the topic's error code."""
    topic = CreateTopicsRequest.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=1, assignments=[], configs=[]
    )
    with WireClient(controller.bootstrap) as client:
        answer = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=30000), 7)
    [result] = answer.topics
    return result.error_code


def test_a_kbroker_broker_registers_follows_the_metadata_log_and_leads_what_the_controller_places_on_it(
    controller: KafkaController,
) -> None:
    broker = Broker(controller)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.follower.run)
            await nursery.start(broker.lifecycle.run)
            with trio.fail_after(WITHIN):
                await broker.lifecycle.unfenced.wait()
            registered = broker.image.brokers[NODE]
            assert registered.incarnation_id == broker.lifecycle.incarnation_id
            assert registered.epoch == broker.lifecycle.broker_epoch
            endpoint = registered.endpoints["PLAINTEXT"]
            assert (endpoint.host, endpoint.port) == ("127.0.0.1", BROKER_PORT)
            await broker.until(lambda: not broker.image.brokers[NODE].fenced)
            assert broker.image.metadata_version == controller_metadata_version(controller)

            assert await trio.to_thread.run_sync(create_topic, controller, "orders", 3) == ErrorCode.NONE
            await broker.until(lambda: broker.image.topics.get("orders") is not None)
            topic = broker.image.topics.get("orders")
            assert topic is not None and sorted(topic.partitions) == [0, 1, 2]
            for registration in topic.partitions.values():
                assert (registration.leader, list(registration.replicas), list(registration.isr)) == (
                    NODE,
                    [NODE],
                    [NODE],
                )
                assert registration.leader_epoch == 0
            led = {key for delta in broker.deltas for key in delta.local_changes(NODE).leaders}
            assert {("orders", 0), ("orders", 1), ("orders", 2)} <= led
            assert broker.follower.applied_offset < broker.follower.high_watermark  # only committed records

            broker.lifecycle.begin_controlled_shutdown()
            with trio.fail_after(WITHIN):
                await broker.lifecycle.shutdown_allowed.wait()
            # The controller moved leadership away before allowing it: with no other replica (and ELR on, as 4.4
            # formats it), each partition is left leaderless with this broker as its eligible leader replica.
            await broker.until(lambda: broker.image.brokers[NODE].in_controlled_shutdown)
            await broker.until(
                lambda: all(p.leader == -1 for p in broker.image.topics.by_name["orders"].partitions.values())
            )
            for registration in broker.image.topics.by_name["orders"].partitions.values():
                assert (registration.isr, registration.eligible_leader_replicas) == ((), (NODE,))
                assert registration.leader_epoch == 1
            nursery.cancel_scope.cancel()
        await broker.quorum.aclose()

    trio.run(main)


def controller_metadata_version(controller: KafkaController) -> int:
    from protocol.messages.api_versions_request import ApiVersionsRequest

    with WireClient(controller.bootstrap) as client:
        answer = client.request(ApiVersionsRequest(client_software_name="kbroker-test", client_software_version="1"), 3)
    return next(f.max_version_level for f in answer.finalized_features if f.name == "metadata.version")


def test_a_controller_that_finalized_share_groups_refuses_kbroker_and_the_line_names_the_feature(
    tmp_path: Path,
) -> None:
    defaults = start_controller(tmp_path / "defaults", {})
    try:
        broker = Broker(defaults, node_id=2)

        async def main() -> None:
            with trio.fail_after(WITHIN):
                await broker.lifecycle.run()

        with pytest.raises(RegistrationRefused) as refused:
            trio.run(main)
        assert "share.version=2 (kbroker supports 0-0)" in str(refused.value)
        assert "kafka-storage format --feature" in str(refused.value)
    finally:
        defaults.stop()
