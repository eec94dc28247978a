"""A 3-broker kbroker cluster under Apache Kafka's KRaft controller, compared step by step with a 3-broker Apache
Kafka cluster under the same controller settings (tests/cluster/kraft_cluster.py): each test runs on both
implementations with the same steps and the same assertions (error codes, leaders, leader epochs, ISR, offsets,
records).

Topics have replication factor 3 and min.insync.replicas=2. The controller's view (leaders, epochs, ISR) is read
from its own metadata log, as an observer; what a broker answers is read on the wire (WireClient), and what a
broker holds from its segment files (the same layout in both). Where a test waits, it waits for an outcome within
a generous bound (two busy cores); the assertions are about safety and exact answers, never timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from compat.apache_kafka import KafkaUnavailable
from kbroker.metadata.image import MetadataImage, PartitionRegistration
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.exceptions import DecodeError
from protocol.messages.describe_cluster_request import DescribeClusterRequest
from protocol.messages.describe_topic_partitions_request import DescribeTopicPartitionsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.offset_for_leader_epoch_request import OffsetForLeaderEpochRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch, decode_records, iter_batches
from tests.cluster.harness import wait_for
from tests.cluster.kraft_cluster import IMPLEMENTATIONS, KRaftCluster, QuorumBroker

BOUND = 120.0  # seconds: how long an outcome may take on two busy cores (a bound, never a measure)
BROKER_SETTINGS = {
    "replica.lag.time.max.ms": "4000",
    "broker.heartbeat.interval.ms": "500",
}
CONTROLLER_SETTINGS = {"broker.session.timeout.ms": "6000"}
PRODUCE_VERSION = 11  # by topic name; answers NOT_LEADER_OR_FOLLOWER with the leader (KIP-951, v10+)
FETCH_VERSION = 12
METADATA_VERSION = 12
PRODUCER = {
    "enable.idempotence": True,  # acks=all, retries, at most 5 requests in flight, in order
    "acks": "all",
    "linger.ms": 2,
    "message.timeout.ms": int(BOUND * 1000),
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 500,
    "topic.metadata.refresh.interval.ms": 1000,
}
Acked = tuple[int, bytes]  # (offset, value)
IN_FLIGHT = 500  # records the producer may have unacknowledged


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def quorum(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KRaftCluster]:
    """One cluster per implementation; pytest runs every test of one before it starts the other."""
    implementation = request.param
    cluster = KRaftCluster(
        tmp_path_factory.mktemp(f"kraft-{implementation}"),
        implementation,
        size=3,
        broker_settings=BROKER_SETTINGS,
        controller_settings=CONTROLLER_SETTINGS,
    )
    try:
        cluster.start()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def cluster(quorum: KRaftCluster) -> KRaftCluster:
    """The module's cluster with every broker running, reachable and unfenced (whatever the last test did)."""
    quorum.restore()
    return quorum


# --- helpers -----------------------------------------------------------------------------------------------


def registration(image: MetadataImage, topic: str) -> PartitionRegistration | None:
    topic_image = image.topics.by_name.get(topic)
    return None if topic_image is None else topic_image.partitions.get(0)


def wait_registration(
    cluster: KRaftCluster, topic: str, condition: Callable[[PartitionRegistration], bool], what: str
) -> PartitionRegistration:
    def holds(image: MetadataImage) -> bool:
        current = registration(image, topic)
        return current is not None and condition(current)

    found = registration(cluster.observe().wait(holds, f"{topic}-0: {what}", BOUND), topic)
    assert found is not None
    return found


def create_topic(cluster: KRaftCluster, topic: str) -> PartitionRegistration:
    """One partition, 3 replicas, min.insync.replicas=2; its registration once every replica is in the ISR and
    every broker knows its leader."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = NewTopic(topic, num_partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    admin.create_topics([new])[topic].result(BOUND)
    created = wait_registration(cluster, topic, lambda r: len(r.isr) == 3 and r.leader >= 0, "3 in-sync replicas")
    for broker in cluster.brokers:
        wait_for(lambda b=broker: partition_metadata(b, topic)[0] == created.leader, f"{broker} knows", BOUND)
    return created


def partition_metadata(broker: QuorumBroker, topic: str) -> tuple[int, int, list[int]]:
    """(leader, leader epoch, ISR) of partition 0 as ``broker`` answers Metadata."""
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)])
    with WireClient(broker.bootstrap, timeout=BOUND) as client:
        answer = client.request(request, METADATA_VERSION)
    [described] = answer.topics
    if described.error_code != ErrorCode.NONE or not described.partitions:
        return -1, -1, []
    [partition] = described.partitions
    return partition.leader_id, partition.leader_epoch, sorted(partition.isr_nodes)


def raw_produce(bootstrap: str, topic: str, values: list[bytes], acks: int, timeout_ms: int = 30000) -> tuple[int, int]:
    """One batch of ``values`` to partition 0 as one ProduceRequest: (error code, base offset) as answered."""
    batch = build_batch([Record(offset_delta=i, value=value) for i, value in enumerate(values)])
    partition = ProduceRequest.PartitionProduceData(index=0, records=batch)
    request = ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[partition])],
    )
    with WireClient(bootstrap, timeout=BOUND) as client:
        answer = client.request(request, PRODUCE_VERSION)
    [topic_answer] = answer.responses
    [partition_answer] = topic_answer.partition_responses
    return partition_answer.error_code, partition_answer.base_offset


def produce_at_leader(broker: QuorumBroker, topic: str, values: list[bytes], acks: int) -> tuple[int, int]:
    """raw_produce to a broker the controller made leader: sent again while it answers NOT_LEADER_OR_FOLLOWER
    (nothing written), as a client would, since a broker may answer Metadata from the new image a moment before
    its replica layer has applied it (Kafka's does)."""
    answers: list[tuple[int, int]] = []

    def answered() -> bool:
        answers.append(raw_produce(broker.bootstrap, topic, values, acks))
        return answers[-1][0] != ErrorCode.NOT_LEADER_OR_FOLLOWER

    wait_for(answered, f"{broker} taking produce requests for {topic}", BOUND)
    return answers[-1]


def read_all(broker: QuorumBroker, topic: str) -> list[Acked]:
    """Every record of partition 0 up to the high watermark, fetched from ``broker`` (its leader) as a consumer."""
    records: list[Acked] = []
    offset = 0
    with WireClient(broker.bootstrap, timeout=BOUND) as client:
        while True:
            fetched = FetchRequest.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)
            request = FetchRequest(
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=1 << 20,
                topics=[FetchRequest.FetchTopic(topic=topic, partitions=[fetched])],
            )
            [topic_answer] = client.request(request, FETCH_VERSION).responses
            [answer] = topic_answer.partitions
            assert answer.error_code == ErrorCode.NONE, f"fetch from {broker}: {ErrorCode(answer.error_code).name}"
            before = len(records)
            for header, batch in iter_batches(answer.records or b""):
                for record in decode_records(batch):
                    at = header.base_offset + record.offset_delta
                    if at >= offset:
                        records.append((at, record.value or b""))
            if records:
                offset = records[-1][0] + 1
            if offset >= answer.high_watermark or len(records) == before:
                return records


def segment_batches(broker: QuorumBroker, topic: str) -> list[tuple[int, int, list[bytes]]]:
    """(base offset, partition leader epoch, values) of each batch in the broker's segment files of partition 0."""
    batches = []
    for segment in sorted(broker.partition_dir(topic, 0).glob("*.log")):
        try:
            for header, batch in iter_batches(segment.read_bytes()):
                values = [record.value or b"" for record in decode_records(batch)]
                batches.append((header.base_offset, header.partition_leader_epoch, values))
        except DecodeError:  # a batch being written as the file is read
            pass
    return batches


def produce_answer(broker: QuorumBroker, topic: str) -> tuple[int, int, tuple[int, int], list[tuple[int, str]]]:
    """An acks=1 Produce v11 sent to ``broker``: (error code, base offset, (current leader id, epoch), the
    endpoints named (node id, host:port))."""
    batch = build_batch([Record(value=b"misdirected")])
    partition = ProduceRequest.PartitionProduceData(index=0, records=batch)
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[partition])
    with WireClient(broker.bootstrap, timeout=BOUND) as client:
        answer = client.request(ProduceRequest(acks=1, timeout_ms=30000, topic_data=[data]), PRODUCE_VERSION)
    [[part]] = [topic_answer.partition_responses for topic_answer in answer.responses]
    hint = (part.current_leader.leader_id, part.current_leader.leader_epoch)
    named = sorted((node.node_id, f"{node.host}:{node.port}") for node in answer.node_endpoints)
    return part.error_code, part.base_offset, hint, named


def fetch_answer(broker: QuorumBroker, topic: str, offset: int, epoch: int) -> tuple[int, int, list[int]]:
    """A consumer's Fetch v12 of partition 0 at ``broker`` naming leader ``epoch``: (error code, high watermark,
    the offsets of the records returned)."""
    fetched = FetchRequest.FetchPartition(
        partition=0, current_leader_epoch=epoch, fetch_offset=offset, partition_max_bytes=1 << 20
    )
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[fetched])],
    )
    with WireClient(broker.bootstrap, timeout=BOUND) as client:
        [topic_answer] = client.request(request, FETCH_VERSION).responses
    [answer] = topic_answer.partitions
    offsets = [
        header.base_offset + record.offset_delta
        for header, batch in iter_batches(answer.records or b"")
        for record in decode_records(batch)
    ]
    return answer.error_code, answer.high_watermark, offsets


def epoch_end_answer(broker: QuorumBroker, topic: str, current: int, asked: int) -> tuple[int, int, int]:
    """OffsetForLeaderEpoch v4 as a consumer asks it: (error code, epoch, end offset)."""
    partition = OffsetForLeaderEpochRequest.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=current, leader_epoch=asked
    )
    request = OffsetForLeaderEpochRequest(
        replica_id=-1, topics=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=topic, partitions=[partition])]
    )
    with WireClient(broker.bootstrap, timeout=BOUND) as client:
        [topic_answer] = client.request(request, 4).topics
    [answer] = topic_answer.partitions
    return answer.error_code, answer.leader_epoch, answer.end_offset


PartitionView = tuple[int, int, int, list[int], list[int], list[int], list[int], list[int]]


def described_partition(broker: QuorumBroker, topic: str) -> PartitionView:
    """Partition 0 as ``broker`` describes it (DescribeTopicPartitions v0): error code, leader, leader epoch,
    replicas, ISR, eligible leader replicas, last known ELR, offline replicas."""
    request = DescribeTopicPartitionsRequest(topics=[DescribeTopicPartitionsRequest.TopicRequest(name=topic)])
    with WireClient(broker.bootstrap, timeout=BOUND) as client:
        [described] = client.request(request, 0).topics
    [p] = described.partitions
    elr, last_known = p.eligible_leader_replicas or [], p.last_known_elr or []
    return p.error_code, p.leader_id, p.leader_epoch, p.replica_nodes, p.isr_nodes, elr, last_known, p.offline_replicas


def controller_decided(image: MetadataImage, topic: str) -> PartitionView:
    """The same from the controller's registration: offline replicas are those on fenced brokers, as Kafka's
    KRaftMetadataCache answers them."""
    r = registration(image, topic)
    assert r is not None
    offline = [b for b in r.replicas if b not in image.brokers or image.brokers[b].fenced]
    elr, last_known = list(r.eligible_leader_replicas), list(r.last_known_elr)
    return ErrorCode.NONE, r.leader, r.leader_epoch, list(r.replicas), list(r.isr), elr, last_known, offline


def assert_described_as_decided(broker: QuorumBroker, cluster: KRaftCluster, topic: str) -> None:
    """``broker`` comes to describe the partition as the controller decided it (its image may lag a moment)."""
    answers: list[tuple[PartitionView, PartitionView]] = []

    def agree() -> bool:
        answers.append((described_partition(broker, topic), controller_decided(cluster.observe().image, topic)))
        return answers[-1][0] == answers[-1][1]

    try:
        wait_for(agree, f"{broker} describing {topic}-0 as the controller decided", BOUND / 2)
    except AssertionError:
        described, decided = answers[-1]
        assert described == decided, broker


class Producing:
    """An idempotent acks=all producer (confluent-kafka) sending values 000000, 000001, ... to partition 0 on a
    thread until stopped, with every acknowledgement and error as its delivery reports give them."""

    def __init__(self, cluster: KRaftCluster, topic: str) -> None:
        self.topic = topic
        self.acknowledged: list[Acked] = []
        self.errors: list[str] = []
        self.producer = Producer({"bootstrap.servers": cluster.bootstrap, **PRODUCER, "on_delivery": self._delivered})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"producing-{topic}", daemon=True)
        self.sent = 0

    def _delivered(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.acknowledged.append((message.offset(), message.value()))

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.sent - len(self.acknowledged) - len(self.errors) >= IN_FLIGHT:
                self.producer.poll(0.05)
                continue
            try:
                self.producer.produce(self.topic, value=f"{self.sent:06d}".encode(), partition=0)
                self.sent += 1
            except BufferError:
                pass
            self.producer.poll(0.002)

    def __enter__(self) -> Producing:
        self._thread.start()
        return self

    def wait_acknowledged(self, count: int) -> None:
        wait_for(lambda: len(self.acknowledged) >= count or bool(self.errors), f"{count} acknowledged", BOUND)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(BOUND)
        self.producer.flush(BOUND)


def assert_exactly_once_in_order(read: list[Acked], acknowledged: list[Acked]) -> None:
    """Nothing acknowledged lost (each at the offset it was acknowledged with), nothing twice, in the order sent."""
    values = [value for _, value in read]
    assert len(set(values)) == len(values), "a record was written twice"
    assert values == sorted(values), "records out of the order they were sent"
    assert [offset for offset, _ in read] == list(range(len(read))), "offsets with gaps"
    at = dict(read)
    lost = [(offset, value) for offset, value in acknowledged if at.get(offset) != value]
    assert not lost, f"acknowledged records missing: {lost[:5]}"
    assert [offset for offset, _ in acknowledged] == sorted(offset for offset, _ in acknowledged)


# --- the steps ---------------------------------------------------------------------------------------------


def test_every_broker_lists_the_three_brokers(cluster: KRaftCluster) -> None:
    expected = sorted((b.node_id, *b.bootstrap.split(":")) for b in cluster.brokers)
    for broker in cluster.brokers:
        with WireClient(broker.bootstrap, timeout=BOUND) as client:
            metadata = client.request(MetadataRequest(topics=None), METADATA_VERSION)
            described = client.request(DescribeClusterRequest(), 0)
        assert sorted((b.node_id, b.host, str(b.port)) for b in metadata.brokers) == expected
        assert metadata.cluster_id == cluster.controller.cluster_id
        assert metadata.controller_id in {b.node_id for b in cluster.brokers}
        assert described.error_code == ErrorCode.NONE
        assert sorted((b.broker_id, b.host, str(b.port)) for b in described.brokers) == expected
        assert described.cluster_id == cluster.controller.cluster_id


def test_losing_followers_shrinks_the_isr_then_acks_all_is_refused(cluster: KRaftCluster) -> None:
    topic = "shrinking"
    created = create_topic(cluster, topic)
    leader = cluster.broker(created.leader)
    first, second = (cluster.broker(r) for r in created.replicas if r != created.leader)
    assert (created.leader_epoch, sorted(created.isr)) == (0, [1, 2, 3])

    assert produce_at_leader(leader, topic, [b"a0", b"a1"], acks=-1) == (ErrorCode.NONE, 0)

    # One follower gone: the ISR shrinks to the leader and the other follower, and acks=all goes on.
    first.kill()
    shrunk = wait_registration(cluster, topic, lambda r: first.node_id not in r.isr, "the killed follower out")
    assert (shrunk.leader, shrunk.leader_epoch, sorted(shrunk.isr)) == (
        leader.node_id,
        created.leader_epoch,
        sorted([leader.node_id, second.node_id]),
    )
    assert produce_at_leader(leader, topic, [b"b0", b"b1"], acks=-1) == (ErrorCode.NONE, 2)

    # Both followers gone: the ISR is the leader alone, below min.insync.replicas; acks=all is refused before
    # anything is written, acks=1 is still taken.
    second.kill()
    alone = wait_registration(cluster, topic, lambda r: second.node_id not in r.isr, "both followers out")
    assert (alone.leader, alone.leader_epoch, alone.isr) == (leader.node_id, created.leader_epoch, (leader.node_id,))
    wait_for(lambda: partition_metadata(leader, topic)[2] == [leader.node_id], "the leader's own ISR", BOUND)
    fenced = cluster.observe().wait(
        lambda i: i.brokers[first.node_id].fenced and i.brokers[second.node_id].fenced, "both followers fenced", BOUND
    )
    assert controller_decided(fenced, topic)[1:5] == (
        leader.node_id,
        created.leader_epoch,
        list(created.replicas),
        [leader.node_id],
    )
    assert_described_as_decided(leader, cluster, topic)
    assert produce_at_leader(leader, topic, [b"refused"], acks=-1) == (ErrorCode.NOT_ENOUGH_REPLICAS, -1)
    assert produce_at_leader(leader, topic, [b"c0"], acks=1) == (ErrorCode.NONE, 4)

    # Back: both catch up and rejoin the ISR under the same leader and epoch; acks=all is taken again.
    first.start()
    second.start()
    back = wait_registration(cluster, topic, lambda r: len(r.isr) == 3, "both followers back in the ISR")
    assert (back.leader, back.leader_epoch) == (leader.node_id, created.leader_epoch)
    for broker in cluster.brokers:
        assert_described_as_decided(broker, cluster, topic)
    assert produce_at_leader(leader, topic, [b"d0"], acks=-1) == (ErrorCode.NONE, 5)
    expected = [(0, b"a0"), (1, b"a1"), (2, b"b0"), (3, b"b1"), (4, b"c0"), (5, b"d0")]
    assert read_all(leader, topic) == expected
    for broker in cluster.brokers:  # every replica holds the same batches, in the same epoch
        assert segment_batches(broker, topic) == [
            (0, 0, [b"a0", b"a1"]),
            (2, 0, [b"b0", b"b1"]),
            (4, 0, [b"c0"]),
            (5, 0, [b"d0"]),
        ], broker


def test_killing_the_leader_elects_an_isr_member_at_the_next_epoch(cluster: KRaftCluster) -> None:
    topic = "failover"
    created = create_topic(cluster, topic)
    old = cluster.broker(created.leader)
    with Producing(cluster, topic) as producing:
        producing.wait_acknowledged(200)
        old.kill()
        elected = wait_registration(cluster, topic, lambda r: r.leader not in (old.node_id, -1), "a new leader")
        assert elected.leader in created.isr
        assert elected.leader_epoch == created.leader_epoch + 1
        assert sorted(elected.isr) == sorted(r for r in created.replicas if r != old.node_id)
        # The producer moves to the new leader: more records are acknowledged after the election.
        producing.wait_acknowledged(len(producing.acknowledged) + 200)
    assert producing.errors == []
    new = cluster.broker(elected.leader)
    assert partition_metadata(new, topic)[:2] == (elected.leader, elected.leader_epoch)
    assert_exactly_once_in_order(read_all(new, topic), producing.acknowledged)


def test_a_restarted_former_leader_truncates_its_unreplicated_tail(cluster: KRaftCluster) -> None:
    topic = "tail"
    created = create_topic(cluster, topic)
    old = cluster.broker(created.leader)
    assert produce_at_leader(old, topic, [b"a0", b"a1", b"a2"], acks=-1) == (ErrorCode.NONE, 0)

    # The followers stop hearing from the leader (its proxy holds their fetches), the leader takes an acks=1
    # batch they never get, and dies; what the proxy held for them is dropped.
    old.proxy.hold()
    assert raw_produce(old.direct_bootstrap, topic, [b"t0", b"t1"], acks=1) == (ErrorCode.NONE, 3)
    old.kill()
    old.proxy.drop()
    elected = wait_registration(cluster, topic, lambda r: r.leader not in (old.node_id, -1), "a new leader")
    assert elected.leader_epoch == created.leader_epoch + 1
    new = cluster.broker(elected.leader)
    wait_for(lambda: partition_metadata(new, topic)[:2] == (new.node_id, elected.leader_epoch), "new leads", BOUND)
    assert produce_at_leader(new, topic, [b"b0", b"b1", b"b2"], acks=-1) == (ErrorCode.NONE, 3)

    # The former leader comes back as a follower: its tail diverges from the new epoch and goes.
    old.proxy.heal()
    old.start()
    back = wait_registration(cluster, topic, lambda r: len(r.isr) == 3, "the former leader back in the ISR")
    assert (back.leader, back.leader_epoch) == (new.node_id, elected.leader_epoch)
    expected = [(0, created.leader_epoch, [b"a0", b"a1", b"a2"]), (3, elected.leader_epoch, [b"b0", b"b1", b"b2"])]
    for broker in cluster.brokers:
        assert segment_batches(broker, topic) == expected, broker
    assert read_all(new, topic) == [(0, b"a0"), (1, b"a1"), (2, b"a2"), (3, b"b0"), (4, b"b1"), (5, b"b2")]

    # What the leader and the former leader answer clients about the two epochs. A consumer's Fetch v12 may read
    # a follower (KIP-392), up to the high watermark the follower has heard of: waited for first.
    old_epoch, new_epoch = created.leader_epoch, elected.leader_epoch

    def follower_told_the_high_watermark() -> bool:
        error_code, high_watermark, _ = fetch_answer(old, topic, 4, new_epoch)
        return error_code != ErrorCode.NONE or high_watermark == 6

    wait_for(follower_told_the_high_watermark, "the follower's high watermark at the leader's", BOUND)
    assert {
        "produce to the former leader": produce_answer(old, topic),
        "fetch at the leader, old epoch": fetch_answer(new, topic, 0, old_epoch),
        "fetch at the leader, next epoch": fetch_answer(new, topic, 0, new_epoch + 1),
        "fetch at the leader": fetch_answer(new, topic, 4, new_epoch),
        "fetch at a follower": fetch_answer(old, topic, 4, new_epoch),
        "fetch at a follower, old epoch": fetch_answer(old, topic, 4, old_epoch),
        "end of the old epoch": epoch_end_answer(new, topic, new_epoch, old_epoch),
        "end of the new epoch": epoch_end_answer(new, topic, new_epoch, new_epoch),
        "end of the old epoch at a follower": epoch_end_answer(old, topic, new_epoch, old_epoch),
    } == {
        "produce to the former leader": (
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            -1,
            (new.node_id, new_epoch),
            [(new.node_id, new.bootstrap)],
        ),
        "fetch at the leader, old epoch": (ErrorCode.FENCED_LEADER_EPOCH, -1, []),
        "fetch at the leader, next epoch": (ErrorCode.UNKNOWN_LEADER_EPOCH, -1, []),
        "fetch at the leader": (ErrorCode.NONE, 6, [3, 4, 5]),  # the whole batch holding offset 4
        "fetch at a follower": (ErrorCode.NONE, 6, [3, 4, 5]),
        "fetch at a follower, old epoch": (ErrorCode.FENCED_LEADER_EPOCH, -1, []),
        "end of the old epoch": (ErrorCode.NONE, old_epoch, 3),
        "end of the new epoch": (ErrorCode.NONE, new_epoch, 6),
        "end of the old epoch at a follower": (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1),
    }


def test_a_controlled_shutdown_of_the_leader_moves_leadership_without_client_errors(cluster: KRaftCluster) -> None:
    topic = "handover"
    created = create_topic(cluster, topic)
    old = cluster.broker(created.leader)
    with Producing(cluster, topic) as producing:
        producing.wait_acknowledged(200)
        old.stop()  # SIGTERM: the controller moves leadership before the broker stops
        moved = wait_registration(cluster, topic, lambda r: r.leader != old.node_id, "leadership moved")
        assert moved.leader in created.isr
        assert moved.leader_epoch == created.leader_epoch + 1
        assert sorted(moved.isr) == sorted(r for r in created.replicas if r != old.node_id)
        producing.wait_acknowledged(len(producing.acknowledged) + 200)
    assert producing.errors == []
    assert_exactly_once_in_order(read_all(cluster.broker(moved.leader), topic), producing.acknowledged)


def test_a_follower_cut_off_from_the_leader_holds_acks_all_until_the_leader_drops_it(cluster: KRaftCluster) -> None:
    """The leader's own ISR change (AlterPartition), not the controller's fencing: the follower still heartbeats."""
    topic = "stalled"
    created = create_topic(cluster, topic)
    leader = cluster.broker(created.leader)
    cut, other = (cluster.broker(r) for r in created.replicas if r != created.leader)
    assert produce_at_leader(leader, topic, [b"a0"], acks=-1) == (ErrorCode.NONE, 0)

    # Its fetches cannot reach the leader: an acks=all batch is written but not acknowledged within its timeout
    # (a fraction of replica.lag.time.max.ms, which the follower is still within).
    cluster.cut(cut, leader)
    timed_out = raw_produce(leader.bootstrap, topic, [b"late"], acks=-1, timeout_ms=500)
    assert timed_out == (ErrorCode.REQUEST_TIMED_OUT, 1)
    dropped = wait_registration(cluster, topic, lambda r: cut.node_id not in r.isr, "the cut-off follower out")
    assert (dropped.leader, dropped.leader_epoch, dropped.partition_epoch, sorted(dropped.isr)) == (
        leader.node_id,
        created.leader_epoch,
        created.partition_epoch + 1,
        sorted([leader.node_id, other.node_id]),
    )
    assert not cluster.observe().image.brokers[cut.node_id].fenced
    assert produce_at_leader(leader, topic, [b"b0"], acks=-1) == (ErrorCode.NONE, 2)

    # Reconnected, it catches up and the leader adds it back.
    leader.proxy.unblock(cut.name)
    back = wait_registration(cluster, topic, lambda r: len(r.isr) == 3, "the follower back in the ISR")
    assert (back.leader, back.leader_epoch, back.partition_epoch) == (
        leader.node_id,
        created.leader_epoch,
        created.partition_epoch + 2,
    )
    assert read_all(leader, topic) == [(0, b"a0"), (1, b"late"), (2, b"b0")]
    for broker in cluster.brokers:
        assert segment_batches(broker, topic) == [(0, 0, [b"a0"]), (1, 0, [b"late"]), (2, 0, [b"b0"])], broker
