"""Transactions (KIP-98) through each client's transactional producer: commit, abort, the group's offsets sent to
the transaction, read_committed against read_uncommitted, fencing of a zombie instance, and the timeout of a
transaction whose producer died. The steps are compat/transactions.py's; everything asserted is Kafka's
documented behaviour, so it holds against Apache Kafka (the same error name from each client on both)."""

from __future__ import annotations

from collections.abc import Callable

from compat.clients import ClientSpec
from compat.clients.api import FENCED
from compat.clients.remote import RemoteClient
from compat.reference import Reference
from compat.transactions import abandoned_transaction_times_out, commit_abort_commit, zombie_fenced


def test_commit_abort_commit(client: RemoteClient, reference: Reference, names) -> None:
    commit_abort_commit(client, reference, names("txn"), names("group"), names("tid"))


# What each client reports when the fenced zombie sends again. The broker answers its Produce with the old epoch
# INVALID_PRODUCER_EPOCH: Java (an abortable InvalidProducerEpochException) and kafka-python raise that name;
# librdkafka and aiokafka turn it into their fatal "fenced" error. Apache Kafka and kbroker give the same.
ZOMBIE_ERROR = {
    "kafka-python-3": "INVALID_PRODUCER_EPOCH",
    "kafka-python-2": "INVALID_PRODUCER_EPOCH",
    "java-3.9": "INVALID_PRODUCER_EPOCH",
    "java-4.4": "INVALID_PRODUCER_EPOCH",
}


def test_zombie_producer_fenced(client: RemoteClient, client_spec: ClientSpec, reference: Reference, names) -> None:
    error = zombie_fenced(client, reference, names("zombie"), names("tid"))
    assert error == ZOMBIE_ERROR.get(client_spec.name, FENCED)


def test_abandoned_transaction_aborted_after_its_timeout(
    client: RemoteClient, new_member: Callable[[], RemoteClient], reference: Reference, names
) -> None:
    doomed = new_member()
    abandoned_transaction_times_out(doomed, client, reference, names("abandoned"), names("tid"), doomed.crash)


def test_describe_producers_after_transactions(client: RemoteClient, reference: Reference, names) -> None:
    """Admin describeProducers after commit, abort, commit: Java 3.9 (transaction version 1) keeps epoch 0 and
    its sequence runs on (24); 4.3 (version 2) has its epoch bumped by each EndTxn and no batch at epoch 3."""
    topic = names("txn")
    commit_abort_commit(client, reference, topic, names("group"), names("tid"))
    [[producer_id, *state]] = client.describe_producers(topic=topic, partition=0)
    assert producer_id >= 0
    assert state == ([0, 24, -1] if client.version.startswith("3.") else [3, -1, -1])
