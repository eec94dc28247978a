"""``kbroker transactions list|describe|find-hanging|abort`` against ``cluster`` (kbroker, then Apache Kafka 4.3):
a committed transactional id listed and described; an open transaction its coordinator holds is not hanging, and
``abort`` ends it all the same (Admin abortTransaction); the errors a person can make, one line each. A hanging
transaction proper (one no coordinator knows) is made on kbroker alone: tests/transactions/
test_hanging_transactions.py."""

from __future__ import annotations

import time
from typing import Any

from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch
from tests.commands.conftest import Cli, create_topic, unique
from tests.kafka.test_transactions_kafka import init_retrying, settled
from tests.transactions.test_transaction_apis import add_partitions

HOUR_MS = 3_600_000


def commit_one(bootstrap: str, transactional_id: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed")
    producer.commit_transaction(60)


def open_transaction(bootstrap: str, transactional_id: str, topic: str) -> tuple[int, int]:
    """Begin a transaction on partition 0 by hand, its one batch stamped an hour ago; (producer id, epoch)."""
    with WireClient(bootstrap) as client:
        answer = init_retrying(client, transactional_id)
        assert answer.error_code == ErrorCode.NONE
        pid, epoch = answer.producer_id, answer.producer_epoch
        assert settled(lambda: add_partitions(client, transactional_id, pid, epoch, {topic: [0]})) == {
            (topic, 0): ErrorCode.NONE
        }
        batch = build_batch(
            [Record(value=b"open")],
            base_timestamp=int(time.time() * 1000) - HOUR_MS,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=0,
            is_transactional=True,
        )
        data = [ProduceRequest.PartitionProduceData(index=0, records=batch)]
        request = ProduceRequest(
            transactional_id=transactional_id,
            acks=-1,
            timeout_ms=10_000,
            topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=data)],
        )
        # A busy Kafka names the new topic's leader a moment before that broker serves the partition: it answers
        # NOT_LEADER_OR_FOLLOWER, which every client retries; nothing was written, so sequence 0 is sent again.
        deadline = time.monotonic() + 30
        while True:
            produced = client.request(request, 9).responses[0].partition_responses[0]
            if produced.error_code != ErrorCode.NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (produced.error_code, produced.base_offset) == (ErrorCode.NONE, 0)
    return pid, epoch


def stable_offset(bootstrap: str, topic: str) -> int:
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)]
    request = ListOffsetsRequest(
        replica_id=-1, isolation_level=1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=wanted)]
    )
    with WireClient(bootstrap) as client:
        return int(client.request(request, 7).topics[0].partitions[0].offset)


def eventually(check: Any, timeout: float = 30.0) -> Any:
    """``check()`` until it is truthy (Kafka completes a transaction after answering EndTxn)."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "never settled"
        time.sleep(0.2)
    return result


def test_list_and_describe_a_committed_transaction(cli: Cli, cluster: str) -> None:
    topic, transactional_id = create_topic(cluster, "txn-cmd"), unique("txn-cmd-id")
    commit_one(cluster, transactional_id, topic)

    def described() -> dict[str, Any] | None:
        result = cli("transactions", "describe", transactional_id, "--bootstrap", cluster, "-o", "json")
        assert result.exit_code == 0, result.stderr
        document: dict[str, Any] = result.json()
        return document if document["state"] == "CompleteCommit" else None

    document = eventually(described)
    assert {k: v for k, v in document.items() if k not in ("coordinator", "producer_id", "start_time_ms")} == {
        "transactional_id": transactional_id,
        "state": "CompleteCommit",
        "producer_epoch": document["producer_epoch"],  # 4.x clients bump it at each transaction (TV2)
        "timeout_ms": 60_000,
        "partitions": [],
    }
    listed = cli("transactions", "list", "--bootstrap", cluster, "-o", "json")
    assert listed.exit_code == 0, listed.stderr
    mine = [row for row in listed.json() if row["transactional_id"] == transactional_id]
    assert mine == [
        {
            "transactional_id": transactional_id,
            "coordinator": document["coordinator"],
            "producer_id": document["producer_id"],
            "state": "CompleteCommit",
        }
    ]
    only_ongoing = cli("transactions", "list", "--state", "Ongoing", "--bootstrap", cluster, "-o", "json")
    assert [row for row in only_ongoing.json() if row["transactional_id"] == transactional_id] == []


def test_an_open_transaction_its_coordinator_holds_is_not_hanging_and_abort_ends_it(cli: Cli, cluster: str) -> None:
    topic, transactional_id = create_topic(cluster, "txn-open"), unique("txn-open-id")
    pid, epoch = open_transaction(cluster, transactional_id, topic)
    assert stable_offset(cluster, topic) == 0
    found = cli("transactions", "find-hanging", "--topic", topic, "--bootstrap", cluster, "-o", "json")
    assert (found.exit_code, found.json()) == (0, [])  # an hour old, but the coordinator will end it
    aborted = cli(
        "transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", "0",
        "--bootstrap", cluster, "-o", "json",
    )  # fmt: skip
    assert aborted.exit_code == 0, aborted.stderr
    assert aborted.json() == {
        "topic": topic,
        "partition": 0,
        "producer_id": pid,
        "producer_epoch": epoch,
        "coordinator_epoch": 0,
    }
    assert stable_offset(cluster, topic) == 2  # the record, then the abort marker
    again = cli(
        "transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", "0", "--bootstrap", cluster
    )
    assert (again.exit_code, again.stderr) == (
        1,
        f"kbroker transactions: abort: no open transaction starts at offset 0 on {topic}-0\n",
    )


def test_mistakes_are_one_line(cli: Cli, cluster: str) -> None:
    unknown = unique("nobody")
    described = cli("transactions", "describe", unknown, "--bootstrap", cluster)
    assert (described.exit_code, described.stderr) == (
        1,
        f"kbroker transactions: TRANSACTIONAL_ID_NOT_FOUND (105): transactional id {unknown!r} is not known\n",
    )
    unlimited = cli("transactions", "find-hanging", "--bootstrap", cluster)
    assert (unlimited.exit_code, unlimited.stderr) == (
        1,
        "kbroker transactions: find-hanging: limit the search with --broker-id or --topic\n",
    )
    partition_only = cli("transactions", "find-hanging", "--partition", "0", "--broker-id", "1", "--bootstrap", cluster)
    assert partition_only.stderr == "kbroker transactions: find-hanging: --partition needs --topic\n"
    unnamed = cli("transactions", "abort", "--topic", "t", "--partition", "0", "--bootstrap", cluster)
    assert unnamed.exit_code == 1 and unnamed.stderr.startswith("kbroker transactions: abort: name the transaction")
    missing = cli("transactions", "abort", "--topic", unique("missing"), "--partition", "0", "--start-offset", "0",
                  "--bootstrap", cluster)  # fmt: skip
    assert missing.exit_code == 1 and missing.stderr.startswith("kbroker transactions: UNKNOWN_TOPIC_OR_PARTITION (3)")
