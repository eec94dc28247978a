"""Brokers crashed (kill -9), frozen (SIGSTOP) and cut off (the proxy) while a real client (librdkafka through
confluent-kafka, idempotent, acks=all) produces: every acknowledged record is read back exactly once, in order,
at the offset it was acknowledged with; a client bootstrapped through an isolated broker fails and recovers
after heal, while the other broker is untouched.

The assertions are about safety. Where a test waits, it waits for an outcome within a generous bound; where it
says something did not happen, it cannot have happened by construction (the broker was unreachable)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.fault_proxy import Direction
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.list_offsets_request import ListOffsetsRequest
from tests.cluster.harness import Cluster, ClusterBroker, wait_for

pytestmark = pytest.mark.cluster(size=2)

COUNT = 3000
BOUND = 120.0  # seconds: how long a client may take to get through a fault, on two busy cores
PRODUCER = {
    "enable.idempotence": True,  # implies acks=all, retries and at most 5 requests in flight, in order
    "acks": "all",
    "linger.ms": 5,
    "batch.num.messages": 100,  # many requests, so that a fault lands between and inside them
    "message.timeout.ms": int(BOUND * 1000),
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 500,
}
Record = tuple[int, bytes]  # (offset, value)


class Deliveries:
    """The producer's delivery reports: what was acknowledged, at which offset, and every error."""

    def __init__(self) -> None:
        self.acknowledged: list[Record] = []
        self.errors: list[str] = []

    def __call__(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.acknowledged.append((message.offset(), message.value()))


def producer_for(broker: ClusterBroker, deliveries: Deliveries, **settings: Any) -> Producer:
    return Producer({"bootstrap.servers": broker.bootstrap, **PRODUCER, **settings, "on_delivery": deliveries})


def create_topic(broker: ClusterBroker, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(BOUND)


def produce(producer: Producer, topic: str, values: Iterable[bytes]) -> None:
    for value in values:
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.1)
        producer.poll(0)


def flush(producer: Producer) -> None:
    remaining = producer.flush(BOUND)
    assert remaining == 0, f"{remaining} records not acknowledged within {BOUND:g} s"


def new_reader(broker: ClusterBroker, topic: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"{topic}-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )


def read_until(consumer: Consumer, records: list[Record], end: int, start: int = 0) -> None:
    """Poll the assigned partition into ``records`` until they reach offset ``end`` (exclusive)."""
    deadline = time.monotonic() + BOUND
    while (records[-1][0] + 1 if records else start) < end:
        assert time.monotonic() < deadline, f"read {len(records)} records, not up to offset {end}, in {BOUND:g} s"
        message = consumer.poll(1.0)
        if message is None:
            continue
        error, offset, value = message.error(), message.offset(), message.value()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                continue
            raise KafkaException(error)
        assert offset is not None and value is not None
        records.append((offset, value))


def read_partition(broker: ClusterBroker, topic: str) -> list[Record]:
    """Every record of partition 0 from the log start to the high watermark, through a fresh consumer."""
    consumer = new_reader(broker, topic)
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=BOUND)
        consumer.assign([TopicPartition(topic, 0, low)])
        records: list[Record] = []
        read_until(consumer, records, high, low)
        return records
    finally:
        consumer.close()


def assert_exactly_once_in_order(
    broker: ClusterBroker, topic: str, deliveries: Deliveries, values: list[bytes]
) -> None:
    """Every value acknowledged once, at an offset the log holds it at, in produce order, and nothing else."""
    assert deliveries.errors == []
    log = read_partition(broker, topic)
    assert log == sorted(deliveries.acknowledged)
    assert [value for _, value in log] == values


def wait_for_acknowledgement(producer: Producer, deliveries: Deliveries) -> None:
    def acknowledged() -> bool:
        producer.poll(0.1)
        return bool(deliveries.acknowledged)

    wait_for(acknowledged, "a first acknowledgement", BOUND)


def log_end(broker: ClusterBroker, topic: str) -> int:
    """Partition 0's latest offset, asked of the broker directly (not through its proxy)."""
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)]
    request = ListOffsetsRequest(
        replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=wanted)]
    )
    with WireClient(broker.direct_bootstrap) as client:
        answer = client.request(request, 7).topics[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE
    return int(answer.offset)


def answers(broker: ClusterBroker) -> bool:
    """A fresh client gets metadata through the broker's proxy."""
    metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=BOUND)
    return [b.id for b in metadata.brokers.values()] == [broker.node_id]


def values_for(topic: str, count: int = COUNT) -> list[bytes]:
    return [f"{topic}-{index:05d}".encode() for index in range(count)]


def test_each_broker_advertises_its_proxy(cluster: Cluster) -> None:
    for broker in cluster.brokers:
        # Asked directly, bypassing the proxy, the broker still sends clients to the proxy.
        metadata = AdminClient({"bootstrap.servers": broker.direct_bootstrap}).list_topics(timeout=BOUND)
        assert [(b.id, f"{b.host}:{b.port}") for b in metadata.brokers.values()] == [(broker.node_id, broker.bootstrap)]
        assert broker.bootstrap != broker.direct_bootstrap


def test_kill_9_mid_stream_then_restart_keeps_every_acknowledged_record_once(cluster: Cluster) -> None:
    broker = cluster.brokers[0]
    topic = "killed-mid-stream"
    create_topic(broker, topic)
    values = values_for(topic)
    deliveries = Deliveries()
    producer = producer_for(broker, deliveries)
    produce(producer, topic, values[: COUNT // 3])
    wait_for_acknowledgement(producer, deliveries)
    # The crash comes when the log holds records whose acknowledgements the client has not had: the proxy
    # holds the broker's answers, and they are lost with the connections. The producer then sends those
    # records again to the restarted broker, which must know them (idempotence) rather than append them twice.
    broker.hold(Direction.FROM_BROKER)
    produce(producer, topic, values[COUNT // 3 : 2 * COUNT // 3])

    def answers_held_for_appended_records() -> bool:
        producer.poll(0)  # every acknowledgement that got through is counted
        held = broker.proxy.queued(Direction.FROM_BROKER)
        return held > 0 and log_end(broker, topic) > len(deliveries.acknowledged)

    wait_for(answers_held_for_appended_records, "records appended, their acknowledgements held", BOUND)
    broker.kill()
    broker.isolate()  # the held answers go with the connections
    broker.heal()
    produce(producer, topic, values[2 * COUNT // 3 :])  # queued while the broker is down
    broker.start()
    flush(producer)
    assert_exactly_once_in_order(broker, topic, deliveries, values)


def test_a_consumer_reading_across_a_kill_9_and_restart_reads_every_record_once(cluster: Cluster) -> None:
    broker = cluster.brokers[1]
    topic = "read-across-a-crash"
    create_topic(broker, topic)
    values = values_for(topic, 2000)
    deliveries = Deliveries()
    producer = producer_for(broker, deliveries)
    produce(producer, topic, values[:1000])
    flush(producer)
    consumer = new_reader(broker, topic)
    received: list[Record] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        read_until(consumer, received, 500)
        broker.kill()
        broker.start()
        produce(producer, topic, values[1000:])
        flush(producer)
        read_until(consumer, received, 2000)
    finally:
        consumer.close()
    assert deliveries.errors == []
    assert received == sorted(deliveries.acknowledged)
    assert [value for _, value in received] == values


def test_sigstop_while_producing_then_sigcont_loses_and_duplicates_nothing(cluster: Cluster) -> None:
    broker = cluster.brokers[0]
    topic = "paused-mid-stream"
    create_topic(broker, topic)
    values = values_for(topic)
    deliveries = Deliveries()
    # A short request timeout: while the broker is frozen, requests time out and are sent again, and the frozen
    # broker still has the first copies in its socket buffers when it wakes up.
    producer = producer_for(broker, deliveries, **{"socket.timeout.ms": 1000})
    produce(producer, topic, values[: COUNT // 2])
    wait_for_acknowledgement(producer, deliveries)
    broker.pause()
    sent_before = broker.proxy.forwarded(Direction.TO_BROKER)
    produce(producer, topic, values[COUNT // 2 :])

    def requests_reached_the_frozen_broker() -> bool:
        producer.poll(0)
        return broker.proxy.forwarded(Direction.TO_BROKER) > sent_before

    wait_for(requests_reached_the_frozen_broker, "requests sent to the frozen broker", BOUND)
    frozen_until = time.monotonic() + 3.0  # past the request timeout (any length is safe: not an assertion)
    while time.monotonic() < frozen_until:
        producer.poll(0.1)
    broker.resume()
    flush(producer)
    assert_exactly_once_in_order(broker, topic, deliveries, values)


def test_graceful_restart_mid_stream_keeps_every_acknowledged_record_once(cluster: Cluster) -> None:
    broker = cluster.brokers[0]
    topic = "restarted-mid-stream"
    create_topic(broker, topic)
    values = values_for(topic)
    deliveries = Deliveries()
    producer = producer_for(broker, deliveries)
    produce(producer, topic, values[: COUNT // 2])
    broker.restart()
    produce(producer, topic, values[COUNT // 2 :])
    flush(producer)
    assert_exactly_once_in_order(broker, topic, deliveries, values)


def test_isolated_broker_fails_its_clients_and_they_recover_after_heal(cluster: Cluster) -> None:
    other, isolated = cluster.brokers
    topic = "isolated"
    create_topic(isolated, topic)
    create_topic(other, topic)
    deliveries = Deliveries()
    producer = producer_for(isolated, deliveries)
    produce(producer, topic, [b"before"])
    flush(producer)

    isolated.isolate()
    assert other.proxy.blocked() == {isolated.name}  # what the isolated broker itself connects to is cut too
    fresh = AdminClient({"bootstrap.servers": isolated.bootstrap})
    with pytest.raises(KafkaException):  # no metadata through a proxy that resets every connection
        fresh.list_topics(timeout=1)
    produce(producer, topic, [b"during"])
    assert producer.flush(1) == 1  # the connected producer's record cannot get through either

    # The other broker is not affected.
    other_deliveries = Deliveries()
    other_producer = producer_for(other, other_deliveries)
    produce(other_producer, topic, [b"elsewhere"])
    flush(other_producer)
    assert other_deliveries.acknowledged == [(0, b"elsewhere")]

    isolated.heal()
    assert other.proxy.blocked() == set()
    flush(producer)
    assert topic in fresh.list_topics(timeout=BOUND).topics
    assert_exactly_once_in_order(isolated, topic, deliveries, [b"before", b"during"])
    assert deliveries.acknowledged == [(0, b"before"), (1, b"during")]


def test_a_partition_blocks_each_side_on_the_other_sides_proxies_until_healed(cluster: Cluster) -> None:
    first, second = cluster.brokers
    cluster.partition([first.node_id], [second.node_id])
    assert (first.proxy.blocked(), second.proxy.blocked()) == ({second.name}, {first.name})
    assert answers(first) and answers(second)  # clients are on neither side
    cluster.heal()
    assert (first.proxy.blocked(), second.proxy.blocked()) == (set(), set())


def test_held_broker_answers_nothing_until_released_then_exactly_once(cluster: Cluster) -> None:
    broker = cluster.brokers[1]
    topic = "held"
    create_topic(broker, topic)
    deliveries = Deliveries()
    producer = producer_for(broker, deliveries)
    produce(producer, topic, [b"first"])
    flush(producer)

    broker.hold()
    produce(producer, topic, [b"second"])
    wait_for(
        lambda: any(connection.queued(Direction.TO_BROKER) for connection in broker.proxy.connections()),
        "the produce request waits in the proxy",
    )
    assert producer.flush(1) == 1  # held: the request has not reached the broker
    broker.release()
    flush(producer)
    assert_exactly_once_in_order(broker, topic, deliveries, [b"first", b"second"])
