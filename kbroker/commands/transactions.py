"""``kbroker transactions list|describe|find-hanging|abort``: transactions, as kafka-transactions.sh shows and
ends them (KIP-664).

- ``list [--state S ...] [--producer-id P ...]``: ListTransactions to every broker: each transactional id, the
  broker coordinating it, its producer id and state.
- ``describe TRANSACTIONAL_ID``: DescribeTransactions to its coordinator: state, producer id and epoch, timeout,
  start time of the transaction and the partitions in it.
- ``find-hanging [--broker-id N] [--topic T [--partition P]] [--max-transaction-timeout MINUTES]``: the
  transactions partitions hold open that no coordinator will end, as kafka-transactions.sh finds them:
  DescribeProducers on every partition searched, keeping the open transactions whose producer last wrote more
  than the maximum transaction timeout ago (default 15 minutes, Kafka's ``transaction.max.timeout.ms``); a
  transaction is hanging when no transactional id has its producer id (ListTransactions), or its coordinator
  does not count the partition in the id's transaction (DescribeTransactions). Either ``--broker-id`` (the
  partitions with a replica there) or ``--topic`` limits the search.
- ``abort --topic T --partition P --start-offset O``: Admin abortTransaction (WriteTxnMarkers to the partition's
  leader) for the producer whose open transaction starts at offset O (DescribeProducers); for brokers older than
  3.0, ``--producer-id``, ``--producer-epoch`` and ``--coordinator-epoch`` instead of ``--start-offset``. Needs
  ALTER or CLUSTER_ACTION on the cluster.

JSON (``--output json``), stable keys, rows sorted as the table is:
``list``: ``[{"transactional_id": str, "coordinator": int, "producer_id": int, "state": str}, ...]``;
``describe``: ``{"transactional_id": str, "coordinator": int, "state": str, "producer_id": int,
"producer_epoch": int, "timeout_ms": int, "start_time_ms": int | null, "partitions": ["topic-partition", ...]}``;
``find-hanging``: ``[{"topic": str, "partition": int, "producer_id": int, "producer_epoch": int,
"coordinator_epoch": int, "start_offset": int, "last_timestamp": int, "duration_min": int}, ...]``;
``abort``: ``{"topic": str, "partition": int, "producer_id": int, "producer_epoch": int,
"coordinator_epoch": int}``, the transaction aborted.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kbroker.commands.configs import raise_for_error, send_request
from kbroker.commands.connection import (
    ClientSettings,
    CommandError,
    add_client_arguments,
    add_output_argument,
    admin_client,
)

LIST_COLUMNS = ("transactional_id", "coordinator", "producer_id", "state")
DESCRIBE_COLUMNS = ("field", "value")
HANGING_COLUMNS = (
    "topic",
    "partition",
    "producer_id",
    "producer_epoch",
    "coordinator_epoch",
    "start_offset",
    "last_timestamp",
    "duration_min",
)
ABORT_COLUMNS = ("topic", "partition", "producer_id", "producer_epoch", "coordinator_epoch")
DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN = 15  # Kafka's transaction.max.timeout.ms
MINUTE_MS = 60_000
SEARCH_BATCH = 500  # partitions per DescribeProducers, as kafka-transactions.sh batches them


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("transactions", help="list, describe, find hanging or abort transactions")
    actions = parser.add_subparsers(dest="action", required=True)

    listing = actions.add_parser("list", help="every transactional id the coordinators know")
    listing.add_argument("--state", action="append", default=[], metavar="STATE", help="Ongoing, Empty, ...")
    listing.add_argument("--producer-id", action="append", type=int, default=[], metavar="ID")
    add_client_arguments(listing)
    add_output_argument(listing)
    listing.set_defaults(run=list_command)

    describe = actions.add_parser("describe", help="one transactional id's current transaction")
    describe.add_argument("transactional_id", metavar="TRANSACTIONAL_ID")
    add_client_arguments(describe)
    add_output_argument(describe)
    describe.set_defaults(run=describe_command)

    hanging = actions.add_parser("find-hanging", help="open transactions no coordinator will end (KIP-664)")
    hanging.add_argument("--broker-id", type=int, metavar="N", help="search the partitions with a replica on N")
    hanging.add_argument("--topic", metavar="TOPIC", help="search this topic's partitions")
    hanging.add_argument("--partition", type=int, metavar="P", help="only this partition (with --topic)")
    hanging.add_argument(
        "--max-transaction-timeout",
        type=int,
        default=DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN,
        metavar="MINUTES",
        help=f"only transactions open longer than this (default {DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN})",
    )
    add_client_arguments(hanging)
    add_output_argument(hanging)
    hanging.set_defaults(run=find_hanging_command)

    abort = actions.add_parser("abort", help="abort a hanging transaction (needs ALTER or CLUSTER_ACTION)")
    abort.add_argument("--topic", required=True, metavar="TOPIC")
    abort.add_argument("--partition", type=int, required=True, metavar="P")
    abort.add_argument("--start-offset", type=int, metavar="OFFSET", help="the first offset of the transaction")
    abort.add_argument("--producer-id", type=int, metavar="ID", help="brokers before 3.0: the producer")
    abort.add_argument("--producer-epoch", type=int, metavar="EPOCH", help="brokers before 3.0: its epoch")
    abort.add_argument("--coordinator-epoch", type=int, metavar="EPOCH", help="brokers before 3.0")
    add_client_arguments(abort)
    add_output_argument(abort)
    abort.set_defaults(run=abort_command)


# --- list and describe ------------------------------------------------------------------------------------------


def list_command(args: argparse.Namespace) -> int:
    from kbroker.commands.output import emit

    with admin_client(ClientSettings.from_args(args)) as admin:
        by_broker = admin.list_transactions(
            producer_id_filters=args.producer_id or None, state_filters=args.state or None
        )
    rows = [
        {
            "transactional_id": t.transactional_id,
            "coordinator": broker,
            "producer_id": t.producer_id,
            "state": str(t.state.value),
        }
        for broker, listings in by_broker.items()
        for t in listings
    ]
    emit(args.output, LIST_COLUMNS, sorted(rows, key=lambda row: row["transactional_id"]))
    return 0


def _describe(admin: Any, transactional_ids: list[str]) -> dict[str, tuple[int, Any] | None]:
    """transactional id -> (its coordinator, its DescribeTransactions entry), None for TRANSACTIONAL_ID_NOT_FOUND;
    any other error raised."""
    from kafka.protocol.admin import DescribeTransactionsRequest
    from kafka.protocol.metadata.find_coordinator import CoordinatorType

    from protocol.errors import ErrorCode

    coordinators = admin._manager.run(admin._find_coordinator_ids, transactional_ids, CoordinatorType.TRANSACTION)
    found: dict[str, tuple[int, Any] | None] = {}
    for transactional_id in transactional_ids:
        node_id = coordinators[transactional_id]
        answer = send_request(admin, DescribeTransactionsRequest(transactional_ids=[transactional_id]), node_id)
        for state in answer.transaction_states:
            if state.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND:
                found[state.transactional_id] = None
                continue
            raise_for_error(state.error_code, None, f"transactional id {state.transactional_id!r}")
            found[state.transactional_id] = node_id, state
    return found


def describe_command(args: argparse.Namespace) -> int:
    from kbroker.commands.output import emit

    with admin_client(ClientSettings.from_args(args)) as admin:
        described = _describe(admin, [args.transactional_id]).get(args.transactional_id)
    if described is None:
        raise CommandError(f"TRANSACTIONAL_ID_NOT_FOUND (105): transactional id {args.transactional_id!r} is not known")
    coordinator, state = described
    document = {
        "transactional_id": args.transactional_id,
        "coordinator": coordinator,
        "state": state.transaction_state,
        "producer_id": state.producer_id,
        "producer_epoch": state.producer_epoch,
        "timeout_ms": state.transaction_timeout_ms,
        "start_time_ms": state.transaction_start_time_ms if state.transaction_start_time_ms >= 0 else None,
        "partitions": sorted(f"{t.topic}-{p}" for t in state.topics for p in t.partitions),
    }
    rows = [{"field": key, "value": value} for key, value in document.items()]
    emit(args.output, DESCRIBE_COLUMNS, rows, document=document)
    return 0


# --- find-hanging -----------------------------------------------------------------------------------------------


def _partitions_to_search(admin: Any, args: argparse.Namespace) -> list[tuple[str, int]]:
    if args.partition is not None:
        return [(args.topic, args.partition)]
    topics = admin.describe_topics([args.topic] if args.topic is not None else None)
    partitions = []
    for topic in topics:
        raise_for_error(topic["error_code"], None, f"topic {topic['name']!r}")
        for partition in topic["partitions"]:
            if args.broker_id is None or args.broker_id in partition["replica_nodes"]:
                partitions.append((topic["name"], partition["partition_index"]))
    return sorted(partitions)


def _open_transactions(admin: Any, partitions: list[tuple[str, int]], broker_id: int | None) -> list[dict[str, Any]]:
    """Every open transaction of the partitions (DescribeProducers), as find-hanging's rows without the duration."""
    from kafka import TopicPartition

    found = []
    for start in range(0, len(partitions), SEARCH_BATCH):
        batch = [TopicPartition(topic, index) for topic, index in partitions[start : start + SEARCH_BATCH]]
        producers = admin.describe_producers(batch, broker_id=broker_id)
        for partition, state in producers.items():
            for producer in state.active_producers:
                if producer.current_transaction_start_offset < 0:
                    continue
                found.append(
                    {
                        "topic": partition.topic,
                        "partition": partition.partition,
                        "producer_id": producer.producer_id,
                        "producer_epoch": producer.producer_epoch,
                        "coordinator_epoch": producer.coordinator_epoch,
                        "start_offset": producer.current_transaction_start_offset,
                        "last_timestamp": producer.last_timestamp,
                    }
                )
    return found


def find_hanging(admin: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """KIP-664's search: the open transactions older than the maximum timeout that no coordinator holds."""
    now_ms = int(time.time() * 1000)
    timeout_ms = args.max_transaction_timeout * MINUTE_MS
    candidates = [
        row
        for row in _open_transactions(admin, _partitions_to_search(admin, args), args.broker_id)
        if now_ms - row["last_timestamp"] > timeout_ms
    ]
    if not candidates:
        return []
    producer_ids = sorted({row["producer_id"] for row in candidates})
    listed = admin.list_transactions(producer_id_filters=producer_ids)
    transactional_ids = {t.producer_id: t.transactional_id for listings in listed.values() for t in listings}
    described = _describe(admin, sorted(set(transactional_ids.values())))
    hanging = []
    for row in candidates:
        entry = described.get(transactional_ids.get(row["producer_id"], ""))
        in_transaction = entry is not None and any(
            t.topic == row["topic"] and row["partition"] in t.partitions for t in entry[1].topics
        )
        if not in_transaction:  # no id has the producer, or its coordinator will not write this marker
            hanging.append({**row, "duration_min": (now_ms - row["last_timestamp"]) // MINUTE_MS})
    return sorted(hanging, key=lambda row: (row["topic"], row["partition"], row["start_offset"]))


def find_hanging_command(args: argparse.Namespace) -> int:
    from kbroker.commands.output import emit

    if args.topic is None and args.broker_id is None:
        raise CommandError("find-hanging: limit the search with --broker-id or --topic")
    if args.partition is not None and args.topic is None:
        raise CommandError("find-hanging: --partition needs --topic")
    if args.max_transaction_timeout < 0:
        raise CommandError("find-hanging: --max-transaction-timeout must not be negative")
    with admin_client(ClientSettings.from_args(args)) as admin:
        rows = find_hanging(admin, args)
    emit(args.output, HANGING_COLUMNS, rows, title="Hanging transactions")
    return 0


# --- abort ------------------------------------------------------------------------------------------------------


def _abort_spec(admin: Any, args: argparse.Namespace) -> dict[str, Any]:
    from kafka import TopicPartition

    where = f"{args.topic}-{args.partition}"
    if args.start_offset is None:
        if args.producer_id is None:
            raise CommandError(
                "abort: name the transaction with --start-offset (brokers 3.0 and later) or with --producer-id, "
                "--producer-epoch and --coordinator-epoch (older brokers)"
            )
        if args.producer_epoch is None or args.coordinator_epoch is None:
            raise CommandError("abort: --producer-id needs --producer-epoch and --coordinator-epoch")
        producer_id, producer_epoch, coordinator_epoch = args.producer_id, args.producer_epoch, args.coordinator_epoch
    else:
        state = admin.describe_producers([TopicPartition(args.topic, args.partition)])
        producers = next(iter(state.values())).active_producers if state else []
        match = [p for p in producers if p.current_transaction_start_offset == args.start_offset]
        if not match:
            raise CommandError(f"abort: no open transaction starts at offset {args.start_offset} on {where}")
        producer_id, producer_epoch = match[0].producer_id, match[0].producer_epoch
        coordinator_epoch = match[0].coordinator_epoch
    # A transaction never ended by a coordinator reports coordinator epoch -1: 0 is at most any real one (as Kafka).
    return {
        "topic": args.topic,
        "partition": args.partition,
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
        "coordinator_epoch": max(coordinator_epoch, 0),
    }


def abort_command(args: argparse.Namespace) -> int:
    from kafka import TopicPartition
    from kafka.admin import AbortTransactionSpec

    from kbroker.commands.output import emit

    with admin_client(ClientSettings.from_args(args)) as admin:
        spec = _abort_spec(admin, args)
        admin.abort_transaction(
            AbortTransactionSpec(
                TopicPartition(args.topic, args.partition),
                spec["producer_id"],
                spec["producer_epoch"],
                spec["coordinator_epoch"],
            )
        )
    emit(args.output, ABORT_COLUMNS, [spec], title="Aborted transaction", document=spec)
    return 0
