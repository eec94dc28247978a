"""A mixed cluster: one Apache Kafka broker and two kbroker brokers under one Apache Kafka KRaft controller
(issue #29, "Mixed clusters"). Kafka's broker is the oracle for the inter-broker protocol: a partition led by
Kafka is replicated by kbroker followers, one led by kbroker is replicated by Kafka's follower, and every replica
must hold the same batches byte for byte (both keep Kafka's segment format, and a follower appends the leader's
batches as they are). Then the leader is killed, a replica of the other implementation takes over with every
acknowledged record, and the old leader, restarted, catches up byte for byte.

A second test crosses truncation (KIP-101, KIP-320): a leader takes an acks=1 batch its followers never get and
dies; restarted as a follower of the other implementation, it finds where its log diverges from the new epoch
(diverging_epoch in the Fetch answer) and drops its tail.

Node 1 is Kafka's broker, nodes 2 and 3 are kbroker's. Topics get explicit replica assignments, so the first
replica (the preferred leader) decides which implementation leads, and the next one which takes over.
"""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ElectionType, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from compat.apache_kafka import KafkaUnavailable
from kbroker.groups.offsets import OFFSETS_TOPIC
from kbroker.java_hashing import coordinator_partition
from kbroker.metadata.image import MetadataImage, PartitionRegistration
from kbroker.transactions.state_log import TRANSACTION_TOPIC
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.exceptions import DecodeError
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from protocol.records import iter_batches
from tests.cluster.harness import wait_for
from tests.cluster.kraft_cluster import ControllerView, Implementation, KRaftCluster, QuorumBroker
from tests.cluster.test_kraft_oracle import (
    BOUND,
    BROKER_SETTINGS,
    CONTROLLER_SETTINGS,
    Producing,
    assert_exactly_once_in_order,
    fetch_answer,
    partition_metadata,
    produce_at_leader,
    raw_produce,
    read_all,
    segment_batches,
    wait_registration,
)

KAFKA, KBROKER_1, KBROKER_2 = 1, 2, 3
INTERNAL_PARTITIONS = 10
# Both implementations' internal topics alike, replicated on all three (compat's Kafka settings are one node's).
INTERNAL_TOPICS = {
    "offsets.topic.num.partitions": str(INTERNAL_PARTITIONS),
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.num.partitions": str(INTERNAL_PARTITIONS),
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
}
IMPLEMENTATION_OF: dict[int, Implementation] = {KAFKA: "kafka", KBROKER_1: "kbroker", KBROKER_2: "kbroker"}


class MixedCluster(KRaftCluster):
    """KRaftCluster with brokers of both implementations: node id -> implementation."""

    def __init__(self, root: Path, implementations: dict[int, Implementation]) -> None:
        super().__init__(
            root,
            "kbroker",
            size=len(implementations),
            broker_settings={**BROKER_SETTINGS, **INTERNAL_TOPICS},
            controller_settings=CONTROLLER_SETTINGS,
        )
        self.implementations = dict(implementations)

    def start(self) -> MixedCluster:
        self.proxies.start()
        try:
            self.controller.start()
            self.view = ControllerView(self.controller).start()
            for node_id, implementation in sorted(self.implementations.items()):
                root = self.root / f"broker-{node_id}"
                proxy = self.proxies.add_proxy()
                broker = QuorumBroker(implementation, root, node_id, self.controller, self.broker_settings, proxy)
                self.brokers.append(broker)
            with concurrent.futures.ThreadPoolExecutor(len(self.brokers)) as pool:
                for started in [pool.submit(broker.start) for broker in self.brokers]:
                    started.result()
        except BaseException:
            self.close()
            raise
        return self


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MixedCluster]:
    cluster = MixedCluster(tmp_path_factory.mktemp("mixed"), IMPLEMENTATION_OF)
    try:
        cluster.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def cluster(mixed: MixedCluster) -> MixedCluster:
    mixed.restore()
    return mixed


def create_assigned_topic(cluster: KRaftCluster, topic: str, replicas: list[int]) -> PartitionRegistration:
    """One partition on ``replicas`` (the first the preferred leader), min.insync.replicas=2; its registration
    once all three are in the ISR and every broker knows the leader."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = NewTopic(topic, num_partitions=1, replica_assignment=[replicas], config={"min.insync.replicas": "2"})
    admin.create_topics([new])[topic].result(BOUND)
    created = wait_registration(cluster, topic, lambda r: len(r.isr) == 3 and r.leader >= 0, "3 in-sync replicas")
    for broker in cluster.brokers:
        wait_for(lambda b=broker: partition_metadata(b, topic)[0] == created.leader, f"{broker} knows", BOUND)
    return created


def segment_bytes(broker: QuorumBroker, topic: str, end: int) -> list[bytes]:
    """Each batch below offset ``end`` in the broker's segment files of partition 0, as the bytes stored."""
    batches: list[bytes] = []
    for segment in sorted(broker.partition_dir(topic, 0).glob("*.log")):
        try:
            for header, batch in iter_batches(segment.read_bytes()):
                if header.base_offset < end:
                    batches.append(bytes(batch))
        except DecodeError:  # a batch being written as the file is read
            pass
    return batches


def high_watermark(leader: QuorumBroker, topic: str, epoch: int) -> int:
    error_code, watermark, _ = fetch_answer(leader, topic, 0, epoch)
    assert error_code == ErrorCode.NONE, f"fetch from {leader}: {ErrorCode(error_code).name}"
    return watermark


def assert_replicas_hold_the_same_bytes(cluster: KRaftCluster, topic: str, leader: QuorumBroker, epoch: int) -> int:
    """Every replica holds the leader's batches up to its high watermark, byte for byte; the watermark."""
    watermark = high_watermark(leader, topic, epoch)
    expected = segment_bytes(leader, topic, watermark)
    assert expected, f"{leader} holds no batch of {topic}"
    held: dict[str, list[bytes]] = {}

    def same() -> bool:
        for broker in cluster.brokers:
            held[broker.name] = segment_bytes(broker, topic, watermark)
        return all(batches == expected for batches in held.values())

    try:
        wait_for(same, f"every replica of {topic}-0 holding the leader's bytes", BOUND)
    except AssertionError:
        for name, batches in held.items():
            assert len(batches) == len(expected), f"{name}: {len(batches)} batches, the leader {len(expected)}"
            for index, (got, want) in enumerate(zip(batches, expected, strict=True)):
                assert got == want, f"{name}: batch {index} differs from the leader's"
        raise
    return watermark


def fetch_sessions(follower: QuorumBroker, leader: QuorumBroker) -> tuple[int, list[str]]:
    """In a kbroker follower's log: how many KIP-227 fetch sessions the leader opened with it, and the leader's
    refusals of its incremental fetches (kbroker/replication/fetcher.py logs both)."""
    text = follower.log_path.read_text(errors="replace")
    opened = re.findall(rf"fetch session [1-9][0-9]* opened with broker {leader.node_id} ", text)
    refused = re.findall(rf"broker {leader.node_id}(?:'s answer to| answered) fetch session [^\n]*", text)
    return len(opened), refused


@pytest.mark.parametrize(
    "replicas",
    [[KAFKA, KBROKER_1, KBROKER_2], [KBROKER_1, KAFKA, KBROKER_2]],
    ids=["kafka-leads", "kbroker-leads"],
)
def test_a_partition_replicates_byte_for_byte_and_fails_over_to_the_other_implementation(
    cluster: MixedCluster, replicas: list[int]
) -> None:
    topic = f"mixed-{IMPLEMENTATION_OF[replicas[0]]}-leads"
    created = create_assigned_topic(cluster, topic, replicas)
    assert (created.leader, created.replicas, sorted(created.isr)) == (replicas[0], tuple(replicas), [1, 2, 3])
    old = cluster.broker(created.leader)

    with Producing(cluster, topic) as producing:
        producing.wait_acknowledged(300)
    assert producing.errors == []
    assert_exactly_once_in_order(read_all(old, topic), producing.acknowledged)
    in_sync = wait_registration(cluster, topic, lambda r: len(r.isr) == 3, "all three in sync")
    assert (in_sync.leader, in_sync.leader_epoch) == (created.leader, created.leader_epoch)
    watermark = assert_replicas_hold_the_same_bytes(cluster, topic, old, created.leader_epoch)
    assert watermark == len(producing.acknowledged)
    if old.implementation == "kafka":  # its kbroker followers fetched in sessions Kafka kept up, never refused
        for follower in (cluster.broker(KBROKER_1), cluster.broker(KBROKER_2)):
            opened, refused = fetch_sessions(follower, old)
            assert opened >= 1 and refused == [], (follower, opened, refused)

    # The leader dies: the controller elects the next replica in the ISR, of the other implementation, at the
    # next epoch, and it serves every acknowledged record and takes more.
    old.kill()
    elected = wait_registration(cluster, topic, lambda r: r.leader not in (old.node_id, -1), "a new leader")
    assert (elected.leader, elected.leader_epoch) == (replicas[1], created.leader_epoch + 1)
    assert IMPLEMENTATION_OF[elected.leader] != IMPLEMENTATION_OF[old.node_id]
    new = cluster.broker(elected.leader)
    assert produce_at_leader(new, topic, [b"after-0", b"after-1"], acks=-1) == (ErrorCode.NONE, watermark)
    acknowledged = [*producing.acknowledged, (watermark, b"after-0"), (watermark + 1, b"after-1")]
    assert_exactly_once_in_order(read_all(new, topic), acknowledged)

    # The old leader comes back as a follower of the other implementation and catches up byte for byte.
    old.start()
    back = wait_registration(cluster, topic, lambda r: len(r.isr) == 3, "the former leader back in the ISR")
    assert (back.leader, back.leader_epoch) == (new.node_id, elected.leader_epoch)
    assert assert_replicas_hold_the_same_bytes(cluster, topic, new, elected.leader_epoch) == watermark + 2


@pytest.mark.parametrize(
    "replicas",
    [[KAFKA, KBROKER_1, KBROKER_2], [KBROKER_1, KAFKA, KBROKER_2]],
    ids=["kafka-leads", "kbroker-leads"],
)
def test_a_former_leader_truncates_its_unreplicated_tail_following_the_other_implementation(
    cluster: MixedCluster, replicas: list[int]
) -> None:
    topic = f"tail-{IMPLEMENTATION_OF[replicas[0]]}-leads"
    created = create_assigned_topic(cluster, topic, replicas)
    old = cluster.broker(created.leader)
    assert produce_at_leader(old, topic, [b"a0", b"a1", b"a2"], acks=-1) == (ErrorCode.NONE, 0)

    # The followers stop hearing from the leader (its proxy holds their fetches); the leader takes an acks=1
    # batch they never get and dies.
    old.proxy.hold()
    assert raw_produce(old.direct_bootstrap, topic, [b"t0", b"t1"], acks=1) == (ErrorCode.NONE, 3)
    old.kill()
    old.proxy.drop()
    elected = wait_registration(cluster, topic, lambda r: r.leader not in (old.node_id, -1), "a new leader")
    assert (elected.leader, elected.leader_epoch) == (replicas[1], created.leader_epoch + 1)
    new = cluster.broker(elected.leader)
    assert produce_at_leader(new, topic, [b"b0", b"b1", b"b2"], acks=-1) == (ErrorCode.NONE, 3)

    # Back as a follower of the other implementation: its tail goes, the new epoch's batch comes, byte for byte.
    old.proxy.heal()
    old.start()
    back = wait_registration(cluster, topic, lambda r: len(r.isr) == 3, "the former leader back in the ISR")
    assert (back.leader, back.leader_epoch) == (new.node_id, elected.leader_epoch)
    assert assert_replicas_hold_the_same_bytes(cluster, topic, new, elected.leader_epoch) == 6
    expected = [(0, created.leader_epoch, [b"a0", b"a1", b"a2"]), (3, elected.leader_epoch, [b"b0", b"b1", b"b2"])]
    for broker in cluster.brokers:
        assert segment_batches(broker, topic) == expected, broker
    assert read_all(new, topic) == [(0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"b0"), (4, b"b1"), (5, b"b2")]


# --- coordinators on either implementation -----------------------------------------------------------------------


def find_coordinator(broker: QuorumBroker, key: str, key_type: int) -> tuple[int, int]:
    """(error code, node id) FindCoordinator v4 answers at ``broker`` for a group (0) or transactional id (1)."""
    request = FindCoordinatorRequest(key_type=key_type, coordinator_keys=[key])
    with WireClient(broker.bootstrap) as client:
        [coordinator] = client.request(request, 4).coordinators
    return coordinator.error_code, coordinator.node_id


def internal_topic(cluster: MixedCluster, topic: str, key_type: int) -> dict[int, PartitionRegistration]:
    """The internal topic's partitions once it exists with every partition's three replicas in sync (the first
    FindCoordinator, here at Kafka's broker, has it created)."""
    wait_for(lambda: find_coordinator(cluster.broker(KAFKA), "any", key_type)[0] == ErrorCode.NONE, topic, BOUND)

    def complete(image: MetadataImage) -> bool:
        found = image.topics.get(topic)
        partitions = {} if found is None else found.partitions
        return len(partitions) == INTERNAL_PARTITIONS and all(len(p.isr) == 3 for p in partitions.values())

    found = cluster.observe().wait(complete, f"{topic} with every replica in sync").topics.get(topic)
    assert found is not None
    # An earlier test's kill moved leaders off their preferred replicas: give them back (ElectLeaders, forwarded to
    # the controller), so each broker leads partitions again.
    if any(p.leader != p.replicas[0] for p in found.partitions.values()):
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        wanted = [TopicPartition(topic, index) for index in found.partitions]
        admin.elect_leaders(ElectionType.PREFERRED, wanted).result(BOUND)

        def preferred(image: MetadataImage) -> bool:
            return complete(image) and all(
                p.leader == p.replicas[0] for p in image.topics.by_name[topic].partitions.values()
            )

        found = cluster.observe().wait(preferred, f"{topic} led by its preferred replicas").topics.get(topic)
        assert found is not None
    return dict(found.partitions)


def key_placed(
    partitions: dict[int, PartitionRegistration], prefix: str, leader: int, successor: int
) -> tuple[str, int]:
    """A key (``prefix``-N) whose partition (Kafka's hash) ``leader`` leads with ``successor`` the replica the
    controller elects when the leader dies: the first other in-sync replica in replica order. (An earlier test's
    kill may have moved leaders off their preferred replica, so the leader need not be the first.)"""
    for n in range(10_000):
        key = f"{prefix}-{n}"
        partition = coordinator_partition(key, INTERNAL_PARTITIONS)
        registration = partitions[partition]
        others = [replica for replica in registration.replicas if replica != leader and replica in registration.isr]
        if registration.leader == leader and others[:1] == [successor]:
            return key, partition
    raise AssertionError(f"no {prefix} key led by {leader} with {successor} next")


def test_every_broker_names_the_coordinator_kafkas_hash_gives(cluster: MixedCluster) -> None:
    """Both implementations map a group or transactional id to the same partition (Kafka's Utils.abs of Java's
    hash, negative hashes included) and so name the same coordinator: its partition's leader."""
    for topic, key_type in ((OFFSETS_TOPIC, 0), (TRANSACTION_TOPIC, 1)):
        partitions = internal_topic(cluster, topic, key_type)
        for key in [f"key-{n}" for n in range(20)] + ["group-100", "my-group", "polygenelubricants"]:
            expected = partitions[coordinator_partition(key, INTERNAL_PARTITIONS)].leader
            everywhere = {node: (ErrorCode.NONE, expected) for node in IMPLEMENTATION_OF}

            def named(key: str = key, key_type: int = key_type) -> dict[int, tuple[int, int]]:
                return {broker.node_id: find_coordinator(broker, key, key_type) for broker in cluster.brokers}

            # A broker whose own image does not have the topic yet answers COORDINATOR_NOT_AVAILABLE meanwhile.
            wait_for(lambda: all(code == ErrorCode.NONE for code, _ in named().values()), f"{key} answered", BOUND)
            assert named() == everywhere, (topic, key)


@pytest.mark.parametrize("coordinator", [KAFKA, KBROKER_1], ids=["kafka-coordinates", "kbroker-coordinates"])
def test_committed_offsets_fail_over_to_the_other_implementation(cluster: MixedCluster, coordinator: int) -> None:
    """A group's offsets committed at one implementation's coordinator are served by the other's once it leads
    the group's partition: it loaded them from its replica of the records the first wrote."""
    successor = KBROKER_1 if coordinator == KAFKA else KAFKA
    partitions = internal_topic(cluster, OFFSETS_TOPIC, 0)
    group, partition = key_placed(partitions, f"offsets-{coordinator}", coordinator, successor)
    topic = f"offsets-of-{IMPLEMENTATION_OF[coordinator]}"
    create_assigned_topic(cluster, topic, [successor, coordinator, KBROKER_2])
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 42)], asynchronous=False)
    consumer.close()

    cluster.broker(coordinator).kill()
    moved = cluster.observe().wait(
        lambda i: i.topics.by_name[OFFSETS_TOPIC].partitions[partition].leader == successor, "the successor leading"
    )
    assert moved.topics.by_name[OFFSETS_TOPIC].partitions[partition].leader == successor

    def committed() -> int:
        """The group's offset as the new coordinator answers OffsetFetch (-1 while it cannot yet). Not
        confluent-kafka's list_consumer_group_offsets: librdkafka crashes on the NOT_COORDINATOR a moving
        coordinator answers (confluentinc/librdkafka#5040)."""
        wanted = OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])
        with WireClient(cluster.broker(successor).bootstrap, timeout=BOUND) as client:
            answer = client.request(OffsetFetchRequest(group_id=group, topics=[wanted]), 7)
        if answer.error_code or not answer.topics:  # NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS meanwhile
            return -1
        [fetched] = answer.topics[0].partitions
        return -1 if fetched.error_code else int(fetched.committed_offset)

    wait_for(lambda: committed() == 42, "the offset at the new coordinator", BOUND)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, 43)], asynchronous=False)
    consumer.close()
    assert committed() == 43


@pytest.mark.parametrize(
    ("coordinator", "data_leader"),
    [(KAFKA, KBROKER_1), (KBROKER_1, KAFKA)],
    ids=["kafka-coordinates-kbroker-leads", "kbroker-coordinates-kafka-leads"],
)
def test_transactions_cross_implementations_and_survive_their_coordinators_death(
    cluster: MixedCluster, coordinator: int, data_leader: int
) -> None:
    """One implementation's transaction coordinator writes its markers to the other's partition leader (and is
    verified by it); a transaction left open when the coordinator dies is committed through the other
    implementation's coordinator, which loaded it from its replica of __transaction_state. Every replica of the
    data partition ends with the same bytes, markers included."""
    successor = KBROKER_1 if coordinator == KAFKA else KAFKA
    partitions = internal_topic(cluster, TRANSACTION_TOPIC, 1)
    transactional_id, partition = key_placed(partitions, f"txn-{coordinator}", coordinator, successor)
    topic = f"txn-{IMPLEMENTATION_OF[coordinator]}-coordinates"
    third = next(node for node in IMPLEMENTATION_OF if node not in (coordinator, data_leader))
    created = create_assigned_topic(cluster, topic, [data_leader, third, coordinator])
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": transactional_id, "message.timeout.ms": 60000}
    )
    producer.init_transactions(BOUND)

    def transaction(values: list[bytes], commit: bool) -> None:
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value=value, partition=0)
        if commit:
            producer.commit_transaction(BOUND)
        else:
            producer.abort_transaction(BOUND)

    transaction([b"c0", b"c1", b"c2"], commit=True)
    transaction([b"a0", b"a1"], commit=False)
    assert read_committed(cluster, topic, 3) == [b"c0", b"c1", b"c2"]

    producer.begin_transaction()
    producer.produce(topic, value=b"d0", partition=0)
    producer.produce(topic, value=b"d1", partition=0)
    assert producer.flush(BOUND) == 0
    cluster.broker(coordinator).kill()
    cluster.observe().wait(
        lambda i: i.topics.by_name[TRANSACTION_TOPIC].partitions[partition].leader == successor, "a new coordinator"
    )
    for _ in range(60):  # the producer finds the new coordinator; retriable errors meanwhile
        try:
            producer.commit_transaction(BOUND)
            break
        except KafkaException as exc:
            if not exc.args[0].retriable():
                raise
    else:
        raise AssertionError("the commit never completed")
    assert read_committed(cluster, topic, 5) == [b"c0", b"c1", b"c2", b"d0", b"d1"]

    cluster.broker(coordinator).start()
    leader = cluster.broker(data_leader)
    back = wait_registration(cluster, topic, lambda r: len(r.isr) == 3, "every replica back in sync")
    assert back.leader == data_leader and back.leader_epoch == created.leader_epoch
    assert_replicas_hold_the_same_bytes(cluster, topic, leader, back.leader_epoch)


def read_committed(cluster: MixedCluster, topic: str, count: int) -> list[bytes]:
    """The values of partition 0 a read_committed consumer sees (``count`` of them, then nothing more)."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"reader-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    try:
        wait_for(lambda: _poll_into(consumer, values) >= count, f"{count} committed records of {topic}", BOUND)
        assert consumer.poll(2.0) is None
    finally:
        consumer.close()
    return values


def _poll_into(consumer: Consumer, values: list[bytes]) -> int:
    message = consumer.poll(0.5)
    if message is not None and message.error() is None:
        values.append(message.value())
    return len(values)
