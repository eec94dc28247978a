"""Transactions through a transaction coordinator's failover in a kbroker cluster (``kbroker_cluster``: Apache
Kafka's KRaft controller and three kbroker brokers; the internal topics and the data topics with 3 replicas and
min.insync.replicas=2).

The coordinator of a transactional id is the leader of its ``__transaction_state`` partition. Killing it with
SIGKILL while a transaction is open moves that leadership to another in-sync replica, whose coordinator loads the
partition and takes the transaction over (Ongoing, with the partitions it has); killing it right after EndTxn
answered leaves the transaction in PrepareCommit, and the next coordinator writes the markers it owes to every
partition, wherever they are led. What is asserted is safety, never timing: the output read with read_committed
holds each input record exactly once, no aborted record is visible, the group's committed offset never goes back,
and no partition is left with an open transaction.

Every client family that does transactions runs the same consume-transform-produce loop in its own process
(compat/clients, compat/java/CompatDriver.java): Java kafka-clients 3.9 (transaction version 1) and 4.4 (version 2),
confluent-kafka and aiokafka (kafka-python: see FAMILIES).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition

from compat.clients import CLIENT_SPECS, ClientSpec, ClientUnavailable
from compat.clients.api import ClientError
from compat.clients.remote import RemoteClient
from compat.helpers import record
from compat.java import CLIENT_SPECS as JAVA_SPECS
from kbroker.java_hashing import coordinator_partition
from kbroker.pytest_plugin import KbrokerCluster
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.end_txn_request import EndTxnRequest
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch
from tests.kraft.conftest import WITHIN, wait_for

TRANSACTION_STATE = "__transaction_state"
OUTPUT_PARTITIONS = 3
# Families with a transactional producer (kcat has none). Left out: kafka-python (2 and 3 share one adapter). After
# its transaction coordinator is killed, kafka-python 3.0.12's send_offsets_to_transaction never returns: its debug
# log shows AddOffsetsToTxn failing to connect, FindCoordinator answered the new coordinator at once, and then
# nothing sent for 90 s (the request it re-queued is not sent again), whatever the broker.
LEFT_OUT = ("kcat", "kafka-python-2", "kafka-python-3")
FAMILIES = {spec.name: spec for spec in [*CLIENT_SPECS, *JAVA_SPECS] if spec.name not in LEFT_OUT}


def leader(admin: AdminClient, topic: str, partition: int) -> int | None:
    """The partition's leader as Metadata names it (None while it has none)."""
    described = admin.list_topics(topic, timeout=10).topics.get(topic)
    if described is None or described.error is not None or partition not in described.partitions:
        return None
    found = described.partitions[partition].leader
    return found if found >= 0 else None


def internal_leader(admin: AdminClient, topic: str, key: str) -> int:
    """The leader of the internal topic's partition for ``key`` (a transactional id or a group)."""
    described = wait_for(
        f"{topic}'s partitions",
        lambda: (lambda t: t if t is not None and t.error is None and t.partitions else None)(
            admin.list_topics(topic, timeout=10).topics.get(topic)
        ),
    )
    index = coordinator_partition(key, len(described.partitions))
    found: int = wait_for(f"{topic}-{index}'s leader", lambda: leader(admin, topic, index))
    return found


def coordinator_of(admin: AdminClient, transactional_id: str) -> int:
    """The id's transaction coordinator: the leader of its __transaction_state partition."""
    return internal_leader(admin, TRANSACTION_STATE, transactional_id)


def group_led_apart(bootstrap: str, admin: AdminClient, prefix: str, broker: int) -> str:
    """A group name whose coordinator (its __consumer_offsets partition's leader) is not ``broker``. librdkafka
    2.16's send_offsets_to_transaction can hang for good when the group coordinator's broker leaves the metadata
    (confluentinc/librdkafka#5511), so the broker killed here coordinates the transactions, not the group."""
    committed_offset(bootstrap, f"{prefix}-probe", "probe")  # FindCoordinator creates __consumer_offsets
    return next(
        f"{prefix}-{n}" for n in range(1000) if internal_leader(admin, "__consumer_offsets", f"{prefix}-{n}") != broker
    )


def kill_coordinator(cluster: KbrokerCluster, admin: AdminClient, transactional_id: str) -> int:
    """SIGKILL the id's coordinator; returns its node id once another broker leads the id's partition."""
    killed = coordinator_of(admin, transactional_id)
    cluster.broker(killed).kill()
    wait_for("a new coordinator", lambda: coordinator_of(admin, transactional_id) != killed)
    return killed


def replicated_topic(admin: AdminClient, name: str, partitions: int) -> None:
    created = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=3, config={"min.insync.replicas": "2"})]
    )
    created[name].result(WITHIN)
    for index in range(partitions):
        wait_for(f"{name}-{index}'s leader", lambda i=index: leader(admin, name, i))


def seed(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, value=f"record {i}".encode(), partition=0)
    assert producer.flush(WITHIN) == 0


def committed_offset(bootstrap: str, group: str, topic: str) -> int:
    # read_committed: OffsetFetch asks for stable offsets (KIP-447), so a commit whose marker is not yet written
    # is waited for rather than read as the offset before it.
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        [position] = consumer.committed([TopicPartition(topic, 0)], WITHIN)
    finally:
        consumer.close()
    return max(position.offset, 0)  # no commit yet: from the start


def read_committed(bootstrap: str, topic: str, partitions: int) -> dict[int, list[str]]:
    """Every record a read_committed consumer reads of each partition up to its last stable offset."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "failover-check",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), WITHIN)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen: dict[int, list[str]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + WITHIN
        while True:
            positions = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())}
            if all(positions[p] >= end for p, end in ends.items()):
                return seen
            assert time.monotonic() < deadline, f"positions {positions} did not reach {ends}"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen[message.partition()].append(message.value().decode())
    finally:
        consumer.close()


def open_transactions(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, int]]:
    """(partition, producer id, first offset) of every transaction the partitions hold open (DescribeProducers)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_producers([KafkaTopicPartition(topic, p) for p in range(partitions)])
    finally:
        admin.close()
    return sorted(
        (tp.partition, producer.producer_id, producer.current_transaction_start_offset)
        for tp, state in described.items()
        for producer in state.active_producers
        if producer.current_transaction_start_offset >= 0
    )


def assert_exactly_once(bootstrap: str, source: str, sink: str, group: str, count: int) -> None:
    """Each input record once in the output (read_committed, in input order per partition), the group's offset
    at the end of the input, and no transaction left open."""
    output = wait_for(
        "the committed output",
        lambda: (lambda seen: seen if sum(map(len, seen.values())) >= count else None)(
            read_committed(bootstrap, sink, OUTPUT_PARTITIONS)
        ),
    )
    expected = {p: [f"OUT record {i}" for i in range(count) if i % OUTPUT_PARTITIONS == p] for p in output}
    assert output == expected
    assert committed_offset(bootstrap, group, source) == count
    assert wait_for("no open transaction", lambda: open_transactions(bootstrap, sink, OUTPUT_PARTITIONS) == []) is True


# --- every client family: consume-transform-produce across a coordinator killed mid-transaction ---------------

INPUT_RECORDS = 60
PER_TRANSACTION = 10


@pytest.fixture(params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, kbroker_cluster: KbrokerCluster) -> Iterator[RemoteClient]:
    spec: ClientSpec = FAMILIES[request.param]
    try:
        client = spec.start(kbroker_cluster.bootstrap)
    except ClientUnavailable as exc:
        pytest.skip(f"client {spec.name} cannot run here: {exc}")
    yield client
    client.close()


def test_consume_transform_produce_across_coordinator_kill(
    kbroker_cluster: KbrokerCluster, family: RemoteClient
) -> None:
    """The loop reads the input from the group's committed offset (read_committed), writes its transformation to
    three partitions and commits the input offsets in the same transaction. In its third transaction, with the
    output written and the offsets not yet sent, the coordinator is killed (SIGKILL): the application goes on with
    the new coordinator, or, if the client gives the transaction up, aborts (or starts a new producer instance)
    and reads again from the committed offset, as an exactly-once application does."""
    cluster = kbroker_cluster
    bootstrap = cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = family.name.replace(".", "")
    source, sink, transactional_id = f"in-{name}", f"out-{name}", f"eos-app-{name}"
    replicated_topic(admin, source, 1)
    replicated_topic(admin, sink, OUTPUT_PARTITIONS)
    seed(bootstrap, source, INPUT_RECORDS)

    handle = family.txn_producer_open(transactional_id=transactional_id, settings={})
    group = group_led_apart(bootstrap, admin, f"eos-{name}", coordinator_of(admin, transactional_id))
    killed: int | None = None
    transactions = failures = 0
    position = committed_offset(bootstrap, group, source)
    offsets_seen = [position]
    deadline = time.monotonic() + 4 * WITHIN
    while position < INPUT_RECORDS:
        assert time.monotonic() < deadline, f"{position} of {INPUT_RECORDS} processed ({failures} failed)"
        batch = family.read(
            topic=source,
            partition=0,
            offset=position,
            count=PER_TRANSACTION,
            settings={"isolation_level": "read_committed", "timeout_ms": 10000},
        )
        assert [r["offset"] for r in batch] == list(range(position, position + len(batch))), batch
        if not batch:
            continue
        try:
            family.txn_begin(handle=handle)
            family.txn_send(
                handle=handle,
                topic=sink,
                records=[record(None, "OUT " + r["value"], partition=r["offset"] % OUTPUT_PARTITIONS) for r in batch],
            )
            transactions += 1
            if transactions == 3:  # the output written, its offsets not: the coordinator dies
                killed = kill_coordinator(cluster, admin, transactional_id)
            family.txn_send_offsets(handle=handle, group=group, topic=source, offsets={"0": position + len(batch)})
            family.txn_commit(handle=handle)
            position += len(batch)
        except ClientError as error:
            failures += 1
            assert failures <= 3, f"{family.name}: {error}"
            try:
                family.txn_abort(handle=handle)
            except ClientError:  # fenced or fatal: a new instance takes over (fencing this one)
                handle = family.txn_producer_open(transactional_id=transactional_id, settings={})
            position = committed_offset(bootstrap, group, source)  # the failed transaction's input, again
        # The group's offset (read as stable: pending transactional offsets wait for their marker) is the loop's.
        assert committed_offset(bootstrap, group, source) == position
        offsets_seen.append(position)
    assert killed is not None
    family.producer_close(handle=handle)
    assert offsets_seen == sorted(offsets_seen)
    assert_exactly_once(bootstrap, source, sink, group, INPUT_RECORDS)


# --- a stable offset read right after the commit ------------------------------------------------------------


def test_a_stable_offset_fetch_after_commit_sees_the_committed_offset(kbroker_cluster: KbrokerCluster) -> None:
    """With the group coordinator on another broker than the transaction coordinator, the commit marker reaches
    the group's __consumer_offsets partition after EndTxn answered, and is applied there before the ISR has it.
    A read_committed consumer's OffsetFetch (require_stable, KIP-447) meanwhile answers UNSTABLE_OFFSET_COMMIT,
    which the client retries, never the offset before the commit: an application restarting from it would
    process the committed input again."""
    bootstrap = kbroker_cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    replicated_topic(admin, "stable-in", 1)
    transactional_id = "stable-app"
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(WITHIN)
    group = group_led_apart(bootstrap, admin, "stable", coordinator_of(admin, transactional_id))
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        for n in range(1, 11):
            producer.begin_transaction()
            offsets = [TopicPartition("stable-in", 0, 10 * n)]
            producer.send_offsets_to_transaction(offsets, member.consumer_group_metadata(), WITHIN)
            producer.commit_transaction(WITHIN)
            assert committed_offset(bootstrap, group, "stable-in") == 10 * n
    finally:
        member.close()


# --- markers owed while the coordinator or a partition's leader dies ------------------------------------------


def unfinished_transactions(bootstrap: str) -> list[tuple[str, str]]:
    """(transactional id, state) of every transaction the coordinators hold not complete (ListTransactions)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        listed = admin.list_transactions(state_filters=["Ongoing", "PrepareCommit", "PrepareAbort"])
    finally:
        admin.close()
    return sorted((t.transactional_id, str(t.state.value)) for listings in listed.values() for t in listings)


def test_markers_owed_when_the_coordinator_or_a_leader_is_killed(kbroker_cluster: KbrokerCluster) -> None:
    """Each transaction writes to three partitions (led by the three brokers) and commits or aborts; right after
    EndTxn answered (PrepareX on the ISR, the markers being written) a broker is killed: first a partition's
    leader that is not the coordinator (its marker goes to whichever replica leads it next), then the coordinator
    (the next one loads the transaction in PrepareX and writes the markers to every partition, wherever led). The
    committed records are read exactly once, the aborted ones never, and nothing is left open."""
    cluster = kbroker_cluster
    bootstrap = cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic, transactional_id = "owed", "owed-app"
    replicated_topic(admin, topic, OUTPUT_PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 0})
    producer.init_transactions(WITHIN)
    written: dict[int, list[str]] = {p: [] for p in range(OUTPUT_PARTITIONS)}

    def transaction(number: int, commit: bool) -> None:
        producer.begin_transaction()
        for p in range(OUTPUT_PARTITIONS):
            producer.produce(topic, value=f"t{number} p{p}".encode(), partition=p)
        assert producer.flush(WITHIN) == 0
        (producer.commit_transaction if commit else producer.abort_transaction)(WITHIN)
        if commit:
            for p in range(OUTPUT_PARTITIONS):
                written[p].append(f"t{number} p{p}")

    # A leader of a partition of the transaction, not its coordinator, killed just after EndTxn (first: the
    # topic's leaders are still spread over the three brokers).
    transaction(1, commit=True)
    coordinator = coordinator_of(admin, transactional_id)
    victim = next(
        found
        for p in range(OUTPUT_PARTITIONS)
        if (found := wait_for("a leader", lambda p=p: leader(admin, topic, p))) != coordinator
    )
    cluster.broker(victim).kill()
    wait_for(
        "the victim's partitions led elsewhere",
        lambda: all(leader(admin, topic, p) not in (None, victim) for p in range(OUTPUT_PARTITIONS)),
    )
    cluster.broker(victim).start()

    # The coordinator killed just after EndTxn of a commit, then of an abort.
    for number, commit in ((2, True), (3, False)):
        transaction(number, commit)
        coordinator = kill_coordinator(cluster, admin, transactional_id)
        cluster.broker(coordinator).start()

    transaction(4, commit=True)  # the transactional id goes on after all of it
    producer.flush(WITHIN)
    assert wait_for("every transaction complete", lambda: unfinished_transactions(bootstrap) == []) is True
    assert wait_for("no open transaction", lambda: open_transactions(bootstrap, topic, OUTPUT_PARTITIONS) == [])
    assert read_committed(bootstrap, topic, OUTPUT_PARTITIONS) == written


# --- what a client is told is on the ISR first ------------------------------------------------------------------


def test_an_acknowledged_commit_survives_the_coordinator_failing_over(kbroker_cluster: KbrokerCluster) -> None:
    """The transaction coordinator answers EndTxn only once its PrepareCommit is on the ISR of its
    __transaction_state partition, and writes no marker before (Kafka appends with acks=-1 and sends the markers
    from the append's completion). Here the coordinator also leads the transaction's partition, and both its
    followers are paused (SIGSTOP) when EndTxn comes: no answer comes (kbroker answered NONE at once, and wrote
    the commit marker on its own partition, so a successor that never saw the decision aborted a transaction
    its client was told was committed). Then the coordinator is killed: the transaction ends one way, whole."""
    cluster = kbroker_cluster
    bootstrap = cluster.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    probe = Producer({"bootstrap.servers": bootstrap, "transactional.id": "unreplicated-probe"})
    probe.init_transactions(WITHIN)  # __transaction_state exists
    transactional_id = "unreplicated"
    coordinator = coordinator_of(admin, transactional_id)
    others = [b for b in cluster.brokers if b.node_id != coordinator]
    topic = "unreplicated"
    admin.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=1,
                replica_assignment=[[coordinator, *(b.node_id for b in others)]],
                config={"min.insync.replicas": "2"},
            )
        ]
    )[topic].result(WITHIN)
    assert wait_for(f"{topic}'s leader", lambda: leader(admin, topic, 0)) == coordinator

    node = cluster.broker(coordinator)
    with WireClient(node.bootstrap) as client:
        started = client.request(
            InitProducerIdRequest(transactional_id=transactional_id, transaction_timeout_ms=5000), 4
        )
        assert started.error_code == ErrorCode.NONE
        producer_id, epoch = started.producer_id, started.producer_epoch
        added = client.request(
            AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=transactional_id,
                v3_and_below_producer_id=producer_id,
                v3_and_below_producer_epoch=epoch,
                v3_and_below_topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=[0])],
            ),
            3,
        )
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
        batch = build_batch(
            [Record(value=b"acknowledged?")],
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=0,
            is_transactional=True,
        )
        produce = ProduceRequest(
            transactional_id=transactional_id,
            acks=-1,
            timeout_ms=30_000,
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name=topic, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
                )
            ],
        )
        assert client.request(produce, 9).responses[0].partition_responses[0].error_code == ErrorCode.NONE

    for follower in others:
        follower.pause()
    answered: int | None = None
    try:
        with WireClient(node.bootstrap, timeout=3.0) as client:
            ending = EndTxnRequest(
                transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch, committed=True
            )
            answered = client.request(ending, 3).error_code
    except OSError:  # no answer while the followers are paused: the ISR does not have PrepareCommit
        pass
    finally:
        node.kill()
        for follower in others:
            follower.resume()
    wait_for("a new coordinator", lambda: coordinator_of(admin, transactional_id) != coordinator)

    assert wait_for("the transaction ended", lambda: open_transactions(bootstrap, topic, 1) == []) is True
    assert wait_for("every transaction complete", lambda: unfinished_transactions(bootstrap) == []) is True
    # Not answered while no follower could have PrepareCommit: answered at once (and its markers written) before.
    assert answered is None, answered
    # Unanswered, the commit may still hold (a follower can take PrepareCommit from a fetch answer already on its
    # way, and lead next) or end aborted on its timeout: one or the other, whole, and nothing left open.
    assert read_committed(bootstrap, topic, 1)[0] in ([], ["acknowledged?"])
