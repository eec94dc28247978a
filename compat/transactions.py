"""The transaction scenarios (KIP-98), written once for any client of the compat matrix: compat/test_transactions.py
runs them against kbroker and Apache Kafka, tests/transactions/test_transaction_clients.py against kbroker alone.

A client is anything with the compat operations as keyword calls (a RemoteClient, or an Adapter in-process).
Kafka writes the commit/abort markers after EndTxn has answered (the coordinator's PrepareCommit is what
EndTxn waits for), so what follows a commit is waited for, not expected at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from compat.clients.api import FENCED, ClientError
from compat.helpers import record
from compat.reference import Reference

READ_COMMITTED = {"isolation_level": "read_committed"}
READ_UNCOMMITTED = {"isolation_level": "read_uncommitted"}

# commit 10 records (with the group's offsets), abort 10, commit 5: where each lands on a new partition.
# Each transaction ends with its control batch (one offset): commit at 10, abort at 21, commit at 27.
FIRST, ABORTED, LAST = range(0, 10), range(11, 21), range(22, 27)
MARKERS = {10: "commit", 21: "abort", 27: "commit"}
ABORT_KEY, COMMIT_KEY = "\x00\x00\x00\x00", "\x00\x00\x00\x01"  # a control record's key: version 0, type


def eventually(check: Callable[[], Any], expected: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (value := check()) != expected:
        assert time.monotonic() < deadline, f"still {value!r}, expected {expected!r}"
        time.sleep(0.1)


def values(records: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(r["offset"], r["value"]) for r in records]


def one_transaction(client: Any, handle: int, topic: str, texts: list[str], commit: bool) -> list[list[int]]:
    client.txn_begin(handle=handle)
    placed = client.txn_send(handle=handle, topic=topic, records=[record(None, t, partition=0) for t in texts])
    (client.txn_commit if commit else client.txn_abort)(handle=handle)
    return placed


def commit_abort_commit(client: Any, reference: Reference, topic: str, group: str, transactional_id: str) -> None:
    """Commit 10 records plus the group's offsets, abort 10 (with other offsets), commit 5: read_committed sees
    exactly the 15 committed in order, read_uncommitted all 25, the group's offset only after the commit."""
    reference.create_topic(topic, 1)
    handle = client.txn_producer_open(transactional_id=transactional_id, settings={})
    try:
        client.txn_begin(handle=handle)
        placed = client.txn_send(
            handle=handle, topic=topic, records=[record(f"k{i}", f"first {i}", partition=0) for i in range(10)]
        )
        assert placed == [[0, offset] for offset in FIRST]
        client.txn_send_offsets(handle=handle, group=group, topic=topic, offsets={"0": 7})
        assert reference.committed(group, topic, 1) == {0: None}  # pending until the transaction commits
        client.txn_commit(handle=handle)
        eventually(lambda: reference.committed(group, topic, 1), {0: 7})

        client.txn_begin(handle=handle)
        placed = client.txn_send(
            handle=handle, topic=topic, records=[record(f"k{i}", f"aborted {i}", partition=0) for i in range(10)]
        )
        assert placed == [[0, offset] for offset in ABORTED]
        client.txn_send_offsets(handle=handle, group=group, topic=topic, offsets={"0": 99})
        client.txn_abort(handle=handle)

        placed = one_transaction(client, handle, topic, [f"last {i}" for i in range(5)], commit=True)
        assert placed == [[0, offset] for offset in LAST]
    finally:
        client.producer_close(handle=handle)

    committed = [(o, f"first {i}") for i, o in enumerate(FIRST)] + [(o, f"last {i}") for i, o in enumerate(LAST)]
    aborted = [(o, f"aborted {i}") for i, o in enumerate(ABORTED)]
    # One more than there is to read: the read ends at its timeout with exactly what the partition offers.
    got = client.read(topic=topic, partition=0, offset=0, count=16, settings={**READ_COMMITTED, "timeout_ms": 5000})
    assert values(got) == committed
    got = client.read(topic=topic, partition=0, offset=0, count=26, settings={**READ_UNCOMMITTED, "timeout_ms": 5000})
    assert values(got) == sorted(committed + aborted)
    assert reference.committed(group, topic, 1) == {0: 7}  # the aborted transaction's offsets were dropped

    # On the log: the three control batches, one record each, where the transactions ended.
    controls = {b.header.base_offset: b for b in reference.batches(topic, 0) if b.header.is_control}
    assert sorted(controls) == sorted(MARKERS)
    for offset, batch in controls.items():
        assert batch.header.is_transactional and len(batch.records) == 1
        assert batch.records[0].key == (COMMIT_KEY if MARKERS[offset] == "commit" else ABORT_KEY)


def zombie_fenced(client: Any, reference: Reference, topic: str, transactional_id: str) -> str:
    """A producer whose transaction is open when a new instance with the same transactional id initialises:
    its open transaction is aborted, and its next send or commit fails fenced. Returns the error's name."""
    reference.create_topic(topic, 1)
    zombie = client.txn_producer_open(transactional_id=transactional_id, settings={})
    successor = None
    try:
        client.txn_begin(handle=zombie)
        client.txn_send(handle=zombie, topic=topic, records=[record(None, "zombie 0", partition=0)])
        successor = client.txn_producer_open(transactional_id=transactional_id, settings={})
        error = None
        try:
            client.txn_send(handle=zombie, topic=topic, records=[record(None, "zombie 1", partition=0)])
            client.txn_commit(handle=zombie)
        except ClientError as exc:
            error = exc.error
        assert error is not None, "the fenced producer's commit succeeded"
        one_transaction(client, successor, topic, ["successor"], commit=True)
    finally:
        client.producer_close(handle=zombie)
        if successor is not None:
            client.producer_close(handle=successor)
    got = client.read(topic=topic, partition=0, offset=0, count=2, settings={**READ_COMMITTED, "timeout_ms": 5000})
    assert [r["value"] for r in got] == ["successor"]
    return error


def abandoned_transaction_times_out(
    doomed: Any, client: Any, reference: Reference, topic: str, transactional_id: str, crash: Callable[[], None]
) -> None:
    """A producer process killed with its transaction open (``doomed``, then ``crash()``): the coordinator aborts
    it after transaction.timeout.ms, so read_committed readers get past it to what was committed later."""
    reference.create_topic(topic, 1)
    handle = doomed.txn_producer_open(transactional_id=transactional_id, settings={"transaction_timeout_ms": 2000})
    doomed.txn_begin(handle=handle)
    doomed.txn_send(handle=handle, topic=topic, records=[record(None, f"doomed {i}", partition=0) for i in range(3)])
    crash()
    later = client.txn_producer_open(transactional_id=f"{transactional_id}-later", settings={})
    try:
        one_transaction(client, later, topic, ["later"], commit=True)
    finally:
        client.producer_close(handle=later)
    # The stable offset stays at the open transaction's first record until the coordinator's timer aborts it
    # (Kafka looks for timed-out transactions every 10 s: transaction.abort.timed.out.transaction.cleanup...).
    got = client.read(topic=topic, partition=0, offset=0, count=1, settings={**READ_COMMITTED, "timeout_ms": 40000})
    assert [r["value"] for r in got] == ["later"]
    # Whichever ended first: the abandoned transaction's abort marker and the later one's commit marker.
    controls = [b.records[0].key for b in reference.batches(topic, 0) if b.header.is_control]
    assert sorted(controls) == [ABORT_KEY, COMMIT_KEY], controls


__all__ = ["FENCED", "abandoned_transaction_times_out", "commit_abort_commit", "zombie_fenced"]
