"""Transactions with real clients against kbroker: Java kafka-clients 3.9 (transaction version 1) and 4.3
(transaction version 2: kbroker's ApiVersions finalizes transaction.version=2, so its EndTxn bumps the epoch),
confluent-kafka, kafka-python 3 and 2 (both have a transactional producer) and aiokafka.

Each client runs in its own process (the compat suite's adapters: compat/clients/, compat/java/CompatDriver.java),
so a producer can be killed like a crashed application. The steps are compat/transactions.py's, which
compat/test_transactions.py also runs against Apache Kafka; here they run on kbroker, with what only kbroker
shows (Admin describeProducers' epochs) and an exactly-once consume-transform-produce loop across kill -9.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from compat.clients import CLIENT_SPECS, ClientSpec, ClientUnavailable
from compat.clients.remote import RemoteClient
from compat.java import CLIENT_SPECS as JAVA_SPECS
from compat.reference import Reference
from compat.test_transactions import ZOMBIE_ERROR
from compat.transactions import FENCED, abandoned_transaction_times_out, commit_abort_commit, zombie_fenced
from kbroker.testing import BrokerProcess, RunningBroker

SPECS = {spec.name: spec for spec in [*CLIENT_SPECS, *JAVA_SPECS] if spec.name != "kcat"}  # kcat has no transactions
Clients = Callable[[], RemoteClient]


@pytest.fixture
def reference(broker: RunningBroker) -> Iterator[Reference]:
    ref = Reference(broker.bootstrap)
    yield ref
    ref.close()


@pytest.fixture(params=sorted(SPECS))
def clients(request: pytest.FixtureRequest, broker: RunningBroker) -> Iterator[Clients]:
    """``clients()``: one more process of the client under test, connected to ``broker``; all ended afterwards."""
    spec: ClientSpec = SPECS[request.param]
    started: list[RemoteClient] = []

    def start() -> RemoteClient:
        try:
            started.append(spec.start(broker.bootstrap))
        except ClientUnavailable as exc:
            pytest.skip(f"client {spec.name} cannot run here: {exc}")
        return started[-1]

    yield start
    for process in started:
        process.close()


def test_commit_abort_commit(clients: Clients, reference: Reference) -> None:
    commit_abort_commit(clients(), reference, "txn", "group", "tid")


def test_zombie_producer_fenced(clients: Clients, reference: Reference, request: pytest.FixtureRequest) -> None:
    name = request.node.callspec.params["clients"]
    assert zombie_fenced(clients(), reference, "zombie", "tid") == ZOMBIE_ERROR.get(name, FENCED)


def test_abandoned_transaction_aborted_after_its_timeout(clients: Clients, reference: Reference) -> None:
    doomed = clients()
    abandoned_transaction_times_out(doomed, clients(), reference, "abandoned", "tid", doomed.crash)


# --- Java Admin ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "epoch", "last_sequence"),
    [
        # Transaction version 1: the producer keeps the epoch InitProducerId gave it, 0, and its sequence runs
        # on across transactions: 25 records, 0-24.
        ("java-3.9", 0, 24),
        # Transaction version 2: every EndTxn bumps the epoch and the markers carry the new one (KIP-890), so
        # after three transactions the partition last saw epoch 3, with no data yet (sequence -1), as Kafka's
        # ProducerStateManager clears a producer's batches when a marker raises its epoch.
        ("java-4.4", 3, -1),
    ],
)
def test_describe_producers_and_list_transactions(
    broker: RunningBroker, reference: Reference, version: str, epoch: int, last_sequence: int
) -> None:
    try:
        java = JAVA_SPECS[[s.name for s in JAVA_SPECS].index(version)].start(broker.bootstrap)
    except ClientUnavailable as exc:
        pytest.skip(f"{version} cannot run here: {exc}")
    try:
        commit_abort_commit(java, reference, "txn", "group", "tid")
        # One producer, and no open transaction.
        [[producer_id, *state]] = java.describe_producers(topic="txn", partition=0)
        assert state == [epoch, last_sequence, -1]
        assert producer_id >= 0

        handle = java.txn_producer_open(transactional_id="open", settings={})
        java.txn_begin(handle=handle)
        assert java.txn_send(handle=handle, topic="txn", records=[{"value": "open", "partition": 0}]) == [[0, 28]]
        producers = java.describe_producers(topic="txn", partition=0)
        assert [p[1:] for p in producers if p[0] != producer_id] == [[0, 0, 28]]  # open since offset 28
        assert java.list_transactions() == [["open", "Ongoing"], ["tid", "CompleteCommit"]]
        java.txn_abort(handle=handle)
        java.producer_close(handle=handle)
    finally:
        java.close()


# --- exactly-once across a crash ----------------------------------------------------------------------------

INPUT_RECORDS = 200
PER_TRANSACTION = 20
# How long one transactional call may take before the application gives the producer up and starts a new
# instance. librdkafka 2.16 can stay stuck in send_offsets_to_transaction after its broker was killed and came
# back on the same port (its connection handle "terminating in state TRY_CONNECT"); a new instance recovers.
CALL_TIMEOUT_S = 10


def within_timeout(call: Callable[..., None], *args: object) -> None:
    """Run a transactional call, giving up after twice CALL_TIMEOUT_S: librdkafka 2.16 does not always honour
    send_offsets_to_transaction's timeout after its broker came back (TimeoutError then, like an application's
    watchdog; the call's thread is left behind)."""
    result: list[BaseException | None] = []

    def run() -> None:
        try:
            call(*args)
            result.append(None)
        except BaseException as exc:  # handed to the caller
            result.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(2 * CALL_TIMEOUT_S)
    if not result:
        raise TimeoutError("a transactional call did not return")
    if result[0] is not None:
        raise result[0]


def eos_consumer(bootstrap: str) -> Consumer:
    """The application's input: read_committed, at the group's committed offset (or the start)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "eos",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition("in", 0)])
    return consumer


def eos_producer(bootstrap: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": "eos-app", "transaction.timeout.ms": 10000}
    )
    producer.init_transactions(60)  # fences the previous instance and aborts what it left open
    return producer


def test_consume_transform_produce_across_kill_9(kafka_broker_factory: Callable[..., BrokerProcess]) -> None:
    """A consume-transform-produce loop (read_committed input; output and input offsets in one transaction)
    whose broker is killed with SIGKILL while a transaction is open, then started again: the application goes
    back to the group's committed offset, as an exactly-once application does after a failed transaction, and
    the output holds each input record's transformation exactly once, in order."""
    broker = kafka_broker_factory(mode="subprocess")
    seed = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(INPUT_RECORDS):
        seed.produce("in", value=f"record {i}".encode(), partition=0)
    assert seed.flush(30) == 0

    consumer, producer = eos_consumer(broker.bootstrap), eos_producer(broker.bootstrap)
    abandoned: list[Producer] = []
    transactions = failed = crashes = 0
    done = 0
    deadline = time.monotonic() + 120
    while done < INPUT_RECORDS:
        assert time.monotonic() < deadline, f"{done} of {INPUT_RECORDS} processed in 120 s ({failed} failed)"
        messages = [m for m in consumer.consume(PER_TRANSACTION, 1.0) if m.error() is None]
        if not messages:
            continue
        try:
            producer.begin_transaction()
            for message in messages:
                producer.produce("out", value=message.value().upper(), partition=0)
            producer.flush(CALL_TIMEOUT_S)
            transactions += 1
            if transactions == 4:  # output written, offsets not yet: the broker dies mid-transaction
                broker.kill()
                broker.start()
                crashes += 1
            positions = consumer.position(consumer.assignment())
            metadata = consumer.consumer_group_metadata()
            within_timeout(producer.send_offsets_to_transaction, positions, metadata, CALL_TIMEOUT_S)
            within_timeout(producer.commit_transaction, CALL_TIMEOUT_S)
            done = messages[-1].offset() + 1
        except (KafkaException, TimeoutError) as exc:
            failed += 1
            if isinstance(exc, KafkaException) and exc.args[0].txn_requires_abort():
                producer.abort_transaction(60)
            else:  # fatal, or stuck: a new instance, which fences this one
                abandoned.append(producer)  # never destroyed here: its destructor would wait for the stuck call
                producer = eos_producer(broker.bootstrap)
            consumer.close()  # back to the committed offset: the failed transaction's input is read again
            consumer = eos_consumer(broker.bootstrap)
    consumer.close()
    # The open transaction either survived the crash (the coordinator's state and the written output are on
    # disk) and committed, or failed and was started over: the output is the same either way.
    assert crashes == 1 and failed <= 3
    abandoned.clear()

    check = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check", "isolation.level": "read_committed"})
    check.assign([TopicPartition("out", 0, 0)])
    out: list[bytes] = []
    for _ in range(100):
        out += [m.value() for m in check.consume(100, 0.2) if m.error() is None]
        if len(out) >= INPUT_RECORDS:
            break
    out += [m.value() for m in check.consume(100, 1.0) if m.error() is None]  # nothing more may follow
    check.close()
    assert out == [f"RECORD {i}".encode() for i in range(INPUT_RECORDS)]
    group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "eos"})
    assert [tp.offset for tp in group.committed([TopicPartition("in", 0)], 30)] == [INPUT_RECORDS]
    group.close()
