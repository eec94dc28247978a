"""A transaction coordinator's traffic with other brokers (kbroker/transactions/remote.py), against a real kbroker
as the other broker.

Verification (Kafka's AddPartitionsToTxnManager): the verifications waiting for one coordinator go in one
AddPartitionsToTxn request, each transactional id answered with its own producer's state, and a transactional id
queued twice keeps only its newest request. Markers (Kafka's TransactionMarkerRequestCompletionHandler): a marker
answered TRANSACTION_COORDINATOR_FENCED, or one whose transaction this broker no longer coordinates, is
cancelled, neither retried for ever nor counted as written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from kbroker.kraft.channel import NodeChannel
from kbroker.replication.fetcher import Address
from kbroker.testing import RunningBroker
from kbroker.transactions.remote import RemoteMarker, RemoteTransactions
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.write_txn_markers_request import WriteTxnMarkersRequest
from tests.transactions.test_transaction_apis import TOPIC, add_partitions, create, init
from tests.transactions.test_write_txn_markers import offsets, produce_transactional, write_markers

COORDINATOR = 0


def remote_for(
    broker: RunningBroker,
    written: Callable[[RemoteMarker], None] = lambda marker: None,
    owed: Callable[[RemoteMarker], bool] = lambda marker: True,
) -> RemoteTransactions:
    host, port = broker.bootstrap.rsplit(":", 1)
    return RemoteTransactions(
        1,
        leader_of=lambda topic, index: COORDINATOR,
        address_of=lambda node: Address(host, int(port)) if node == COORDINATOR else None,
        written=written,
        owed=owed,
    )


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[str, int, int, bool]]]:
    """Each AddPartitionsToTxn sent: (transactional id, producer id, epoch, verify only) per transaction."""
    requests: list[list[tuple[str, int, int, bool]]] = []
    original = NodeChannel.request

    async def counting(self: NodeChannel, body: Any, version: int | None = None) -> Any:
        if isinstance(body, AddPartitionsToTxnRequest):
            requests.append(
                [(t.transactional_id, t.producer_id, t.producer_epoch, t.verify_only) for t in body.transactions]
            )
        return await original(self, body, version)

    monkeypatch.setattr(NodeChannel, "request", counting)
    return requests


def test_verifications_for_one_coordinator_go_in_one_request(
    broker: RunningBroker, sent: list[list[tuple[str, int, int, bool]]]
) -> None:
    with WireClient(broker.bootstrap) as client:
        create(client)
        producers = {tid: init(client, tid) for tid in ("v-a", "v-b", "v-c")}
        for tid in ("v-a", "v-b"):  # v-c has no transaction on partition 0
            p = producers[tid]
            assert add_partitions(client, tid, p.producer_id, p.producer_epoch, {TOPIC: [0]}) == {(TOPIC, 0): 0}
    remote = remote_for(broker)
    answers: dict[str, dict[tuple[str, int], ErrorCode]] = {}

    async def verify(tid: str, epoch_ahead: int = 0) -> None:
        p = producers[tid]
        answers[tid] = await remote.verify(
            COORDINATOR, tid, p.producer_id, p.producer_epoch + epoch_ahead, [(TOPIC, 0), (TOPIC, 0)]
        )

    async def main() -> None:
        async with trio.open_nursery() as service:
            await service.start(remote.run)
            async with trio.open_nursery() as requests:
                requests.start_soon(verify, "v-a")
                requests.start_soon(verify, "v-b")
                requests.start_soon(verify, "v-c")
            service.cancel_scope.cancel()

    trio.run(main)
    # One request for the three, each transaction with its own producer id and epoch.
    assert [sorted(r) for r in sent] == [
        sorted((tid, p.producer_id, p.producer_epoch, True) for tid, p in producers.items())
    ]
    assert answers["v-a"] == answers["v-b"] == {(TOPIC, 0): ErrorCode.NONE}
    assert answers["v-c"] == {(TOPIC, 0): ErrorCode.TRANSACTION_ABORTABLE}


def test_a_transactional_id_queued_twice_keeps_its_newest_request(
    broker: RunningBroker, sent: list[list[tuple[str, int, int, bool]]]
) -> None:
    """As Kafka's AddPartitionsToTxnManager: the same epoch queued again answers the earlier one
    NETWORK_EXCEPTION (the producer retries it); a newer epoch answers it INVALID_PRODUCER_EPOCH; an older epoch
    than the one queued is answered INVALID_PRODUCER_EPOCH at once, never sent."""
    with WireClient(broker.bootstrap) as client:
        create(client)
        first = init(client, "twice")
        bumped = init(client, "twice")  # epoch + 1: the current one
        assert bumped.producer_epoch == first.producer_epoch + 1
        assert add_partitions(client, "twice", bumped.producer_id, bumped.producer_epoch, {TOPIC: [0]}) == {
            (TOPIC, 0): 0
        }
    remote = remote_for(broker)
    answers: list[tuple[str, dict[tuple[str, int], ErrorCode]]] = []

    async def verify(label: str, epoch: int) -> None:
        answers.append((label, await remote.verify(COORDINATOR, "twice", bumped.producer_id, epoch, [(TOPIC, 0)])))

    async def main() -> None:
        async with trio.open_nursery() as service:
            await service.start(remote.run)
            for labels in (("old", "new"), ("retry-1", "retry-2")):
                async with trio.open_nursery() as requests:
                    # Started together, both are queued before the sender runs (in either order).
                    for label in labels:
                        epoch = first.producer_epoch if label == "old" else bumped.producer_epoch
                        requests.start_soon(verify, label, epoch)
            service.cancel_scope.cancel()

    trio.run(main)
    found = dict(answers)
    assert found["old"] == {(TOPIC, 0): ErrorCode.INVALID_PRODUCER_EPOCH}
    assert found["new"] == {(TOPIC, 0): ErrorCode.NONE}
    assert sorted([found["retry-1"][(TOPIC, 0)], found["retry-2"][(TOPIC, 0)]]) == sorted(
        [ErrorCode.NONE, ErrorCode.NETWORK_EXCEPTION]
    )
    # Only the newest of each pair went to the coordinator.
    assert sent == [[("twice", bumped.producer_id, bumped.producer_epoch, True)]] * 2


def test_a_marker_fenced_or_no_longer_owed_is_cancelled(broker: RunningBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer coordinator (epoch 5) ended a transaction on the partition, and the producer opened another: a
    marker from the older coordinator (epoch 3) is answered TRANSACTION_COORDINATOR_FENCED and cancelled, the open
    transaction left as it is; a marker of a transaction this broker no longer coordinates is not even sent."""
    with WireClient(broker.bootstrap) as client:
        create(client)
        p = init(client, "fenced-marker")
        assert add_partitions(client, "fenced-marker", p.producer_id, p.producer_epoch, {TOPIC: [0]}) == {(TOPIC, 0): 0}
        produce_transactional(client, "fenced-marker", TOPIC, p.producer_id, p.producer_epoch)
        newer = WriteTxnMarkersRequest.WritableTxnMarker(
            producer_id=p.producer_id,
            producer_epoch=p.producer_epoch,
            transaction_result=True,
            topics=[WriteTxnMarkersRequest.WritableTxnMarkerTopic(name=TOPIC, partition_indexes=[0])],
            coordinator_epoch=5,
        )
        assert write_markers(client, newer) == [(p.producer_id, TOPIC, 0, ErrorCode.NONE)]
        produce_transactional(client, "fenced-marker", TOPIC, p.producer_id, p.producer_epoch, sequence=1)
        open_end = offsets(client, TOPIC, 1)  # the last stable offset: the second transaction is open
    marker = RemoteMarker("fenced-marker", p.producer_id, p.producer_epoch, True, 3, 1, TOPIC, 0)
    written: list[RemoteMarker] = []
    requests: list[Any] = []
    original = NodeChannel.request

    async def counting(self: NodeChannel, body: Any, version: int | None = None) -> Any:
        requests.append(body)
        return await original(self, body, version)

    monkeypatch.setattr(NodeChannel, "request", counting)

    async def settle(remote: RemoteTransactions) -> None:
        async with trio.open_nursery() as service:
            await service.start(remote.run)
            remote.send(marker)
            with trio.fail_after(20):  # retried for ever before: a bound against hanging, not a measure
                while remote.pending():
                    await trio.sleep(0.05)
            service.cancel_scope.cancel()

    trio.run(settle, remote_for(broker, written.append))
    assert written == [] and len(requests) == 1
    trio.run(settle, remote_for(broker, written.append, owed=lambda m: False))
    assert written == [] and len(requests) == 1  # not sent
    with WireClient(broker.bootstrap) as client:
        assert offsets(client, TOPIC, 1) == open_end < offsets(client, TOPIC, 0)
