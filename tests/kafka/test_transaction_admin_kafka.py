"""ListTransactions, DescribeTransactions and OffsetFetch's require_stable sent to kbroker and to Apache Kafka 4.4
after the same transactions: transactional ids left Empty, Ongoing (with partitions and pending offsets) and
CompleteCommit on both. Producer ids and times differ between the brokers, so they are checked apart."""

from __future__ import annotations

import time
import uuid
from typing import Any

from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.add_offsets_to_txn_request import AddOffsetsToTxnRequest
from protocol.messages.describe_transactions_request import DescribeTransactionsRequest
from protocol.messages.list_transactions_request import ListTransactionsRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from tests.kafka.test_transactions_kafka import (  # noqa: F401 (brokers is a fixture)
    GROUP_KEY,
    RETRIABLE,
    brokers,
    create_topic,
    find_coordinator,
    init_retrying,
    settled,
)
from tests.transactions.test_transaction_apis import add_partitions, end, txn_offset_commit


def _states(answer: Any, ids: set[str]) -> dict[str, str]:
    return {s.transactional_id: s.transaction_state for s in answer.transaction_states if s.transactional_id in ids}


def test_list_and_describe_transactions_and_require_stable(brokers: dict[str, str]) -> None:  # noqa: F811
    run = uuid.uuid4().hex[:8]
    topic, group = f"admin-{run}", f"g-{run}"
    empty, ongoing, done = f"empty-{run}", f"ongoing-{run}", f"done-{run}"
    ids = {empty, ongoing, done}
    seen: dict[str, dict[str, Any]] = {}
    for name, bootstrap in brokers.items():
        with WireClient(bootstrap) as client:
            create_topic(client, topic)
            answers = {tid: init_retrying(client, tid) for tid in ids}
            assert {tid: a.error_code for tid, a in answers.items()} == dict.fromkeys(ids, ErrorCode.NONE)
            pid = {tid: a.producer_id for tid, a in answers.items()}
            for tid in (ongoing, done):
                added = settled(lambda tid=tid, pid=pid: add_partitions(client, tid, pid[tid], 0, {topic: [0, 1]}))
                assert set(added.values()) == {ErrorCode.NONE}
            add = AddOffsetsToTxnRequest(
                transactional_id=ongoing, producer_id=pid[ongoing], producer_epoch=0, group_id=group
            )
            assert settled(lambda add=add: client.request(add, 3)).error_code == ErrorCode.NONE
            find_coordinator(client, group, GROUP_KEY)  # Kafka creates __consumer_offsets on first use
            deadline = time.monotonic() + 30
            while (code := txn_offset_commit(client, ongoing, pid[ongoing], 0, group, 7, topic=topic)) in RETRIABLE:
                assert time.monotonic() < deadline, code
                time.sleep(0.2)
            assert code == ErrorCode.NONE
            assert settled(lambda pid=pid: end(client, done, pid[done], 0, True)).error_code == ErrorCode.NONE
            # Kafka writes the markers after answering EndTxn: wait until the transaction is complete.
            deadline = time.monotonic() + 30
            while _states(client.request(DescribeTransactionsRequest(transactional_ids=[done]), 0), {done}) != {
                done: "CompleteCommit"
            }:
                assert time.monotonic() < deadline, "the committed transaction never completed"
                time.sleep(0.1)
            listed = client.request(ListTransactionsRequest(state_filters=[], producer_id_filters=[]), 1)
            only_ongoing = client.request(
                ListTransactionsRequest(state_filters=["Ongoing", "Nonsense"], producer_id_filters=[]), 1
            )
            by_producer = client.request(ListTransactionsRequest(state_filters=[], producer_id_filters=[pid[done]]), 1)
            long_running = client.request(
                ListTransactionsRequest(state_filters=[], producer_id_filters=[], duration_filter=3_600_000), 1
            )
            described = client.request(
                DescribeTransactionsRequest(transactional_ids=[empty, ongoing, done, f"unknown-{run}"]), 0
            )
            stable = OffsetFetchRequest(
                group_id=group,
                topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0, 1])],
                require_stable=True,
            )
            unstable = client.request(stable, 7).topics[0].partitions
            time.sleep(0.1)
            seen[name] = {
                "listed": (listed.error_code, _states(listed, ids), list(listed.unknown_state_filters)),
                "only ongoing": (_states(only_ongoing, ids), list(only_ongoing.unknown_state_filters)),
                "by producer": _states(by_producer, ids),
                "long running": _states(long_running, ids),
                "described": [
                    (
                        d.error_code,
                        d.transactional_id,
                        d.transaction_state,
                        d.transaction_timeout_ms,
                        d.producer_epoch,
                        sorted((t.topic, sorted(t.partitions)) for t in d.topics),
                        d.producer_id == pid.get(d.transactional_id, 0),
                        d.transaction_start_time_ms > 0,
                    )
                    for d in described.transaction_states
                ],
                "require stable": [(p.partition_index, p.error_code, p.committed_offset) for p in unstable],
            }
            end(client, ongoing, pid[ongoing], 0, False)  # leave nothing open on the shared Kafka
    assert seen["kbroker"] == seen["kafka"]
    assert seen["kafka"]["listed"] == (
        ErrorCode.NONE,
        {empty: "Empty", ongoing: "Ongoing", done: "CompleteCommit"},
        [],
    )
    assert seen["kafka"]["only ongoing"] == ({ongoing: "Ongoing"}, ["Nonsense"])
    assert seen["kafka"]["require stable"] == [(0, ErrorCode.UNSTABLE_OFFSET_COMMIT, -1), (1, ErrorCode.NONE, -1)]
