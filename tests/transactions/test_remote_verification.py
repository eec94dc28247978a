"""The verification a broker asks of a transaction coordinator on another broker (kbroker/transactions/remote.py,
Kafka's AddPartitionsToTxnManager), against a real kbroker as that coordinator: the verifications waiting for one
coordinator go in one AddPartitionsToTxn request, each transactional id answered with its own producer's state,
and a transactional id queued twice keeps only its newest request."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from kbroker.kraft.channel import NodeChannel
from kbroker.replication.fetcher import Address
from kbroker.testing import RunningBroker
from kbroker.transactions.remote import RemoteTransactions
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from tests.transactions.test_transaction_apis import TOPIC, add_partitions, create, init

COORDINATOR = 0


def remote_for(broker: RunningBroker) -> RemoteTransactions:
    host, port = broker.bootstrap.rsplit(":", 1)
    return RemoteTransactions(
        1,
        leader_of=lambda topic, index: COORDINATOR,
        address_of=lambda node: Address(host, int(port)) if node == COORDINATOR else None,
        written=lambda marker: None,
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
