"""``kbroker topics list|describe|create|delete|alter``: kafka-topics.sh's work, as a Kafka client.

- ``list [REGEX]``: each topic's name, partition count and replication factor (Metadata), sorted by name; internal
  topics (``__consumer_offsets``, ``__transaction_state``) only with ``--internal``; REGEX must match the whole
  name, as kafka-topics.sh's ``--topic`` does with ``--list``.
- ``describe [TOPIC...]`` (every non-internal topic without names): per partition the leader, replicas, ISR, log
  start and end offsets (ListOffsets earliest/latest) and the leader's size on disk (DescribeLogDirs); then the
  topic's configs with their sources (DescribeConfigs): only those not at their default (source other than
  DEFAULT_CONFIG, as kafka-topics.sh shows) unless ``--all-configs``.
- ``create TOPIC [--partitions N] [--replication-factor R] [--config k=v ...] [--if-not-exists]``: CreateTopics
  (the broker's defaults when N or R is not given); returns once the topic has leaders.
- ``delete TOPIC... [--if-exists]``: DeleteTopics.
- ``alter TOPIC [--partitions N] [--config k=v ...] [--delete-config k ...]``: CreatePartitions and
  IncrementalAlterConfigs.

A failure is one line with the broker's error code name: ``UNKNOWN_TOPIC_OR_PARTITION (3): topic 'x' does not
exist``, ``TOPIC_ALREADY_EXISTS (36): Topic 'x' already exists.``, ``INVALID_CONFIG (40): <broker's message>``
(exit 1).

JSON (``--output json``), stable keys:

``list``: ``[{"name": str, "partitions": int, "replication_factor": int, "internal": bool}, ...]``

``describe``::

    [{"name": str, "topic_id": str, "internal": bool, "partition_count": int, "replication_factor": int,
      "partitions": [{"partition": int, "leader": int | null, "replicas": [int], "isr": [int],
                      "log_start_offset": int | null, "log_end_offset": int | null, "size_bytes": int | null}],
      "configs": [{"name": str, "value": str | null, "source": str, "sensitive": bool, "read_only": bool}]}, ...]

null where the cluster did not say (a partition without a leader, a broker refusing DescribeLogDirs).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kbroker.commands.configs import (
    CONFIG_COLUMNS,
    alter_configs,
    describe_config_entries,
    parse_assignments,
    raise_for_error,
    send_request,
)
from kbroker.commands.connection import (
    ClientSettings,
    CommandError,
    add_client_arguments,
    add_output_argument,
    admin_client,
)

LIST_COLUMNS = ("name", "partitions", "replication_factor")
PARTITION_COLUMNS = ("partition", "leader", "replicas", "isr", "log_start_offset", "log_end_offset", "size_bytes")
UNKNOWN_TOPIC = 3


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("topics", help="list, describe, create, delete or alter topics")
    actions = parser.add_subparsers(dest="action", required=True)

    listing = actions.add_parser("list", help="topics with their partition counts and replication factors")
    listing.add_argument("pattern", nargs="?", metavar="REGEX", help="only topics whose whole name matches")
    listing.add_argument("--internal", action="store_true", help="include internal topics (__consumer_offsets, ...)")
    add_client_arguments(listing)
    add_output_argument(listing)
    listing.set_defaults(run=list_command)

    describe = actions.add_parser("describe", help="partitions (leaders, offsets, sizes) and configs")
    describe.add_argument("topics", nargs="*", metavar="TOPIC", help="default: every non-internal topic")
    describe.add_argument("--all-configs", action="store_true", help="list default configs too")
    add_client_arguments(describe)
    add_output_argument(describe)
    describe.set_defaults(run=describe_command)

    create = actions.add_parser("create", help="create a topic")
    create.add_argument("topic", metavar="TOPIC")
    create.add_argument("--partitions", type=int, default=None, metavar="N", help="default: the broker's")
    create.add_argument("--replication-factor", type=int, default=None, metavar="R", help="default: the broker's")
    create.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="a topic config")
    create.add_argument("--if-not-exists", action="store_true", help="succeed quietly if the topic exists")
    add_client_arguments(create)
    create.set_defaults(run=create_command)

    delete = actions.add_parser("delete", help="delete topics")
    delete.add_argument("topics", nargs="+", metavar="TOPIC")
    delete.add_argument("--if-exists", action="store_true", help="skip topics that do not exist")
    add_client_arguments(delete)
    delete.set_defaults(run=delete_command)

    alter = actions.add_parser("alter", help="add partitions or change configs")
    alter.add_argument("topic", metavar="TOPIC")
    alter.add_argument("--partitions", type=int, default=None, metavar="N", help="the new (larger) partition count")
    alter.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="set a topic config")
    alter.add_argument("--delete-config", action="append", default=[], metavar="KEY", help="back to the default")
    add_client_arguments(alter)
    alter.set_defaults(run=alter_command)


# --- list ------------------------------------------------------------------------------------------------------


def list_command(args: argparse.Namespace) -> int:
    from kbroker.commands.output import emit

    pattern = _compile(args.pattern)
    with admin_client(ClientSettings.from_args(args)) as admin:
        topics = admin.describe_topics()
    rows = [
        {
            "name": topic["name"],
            "partitions": len(topic["partitions"]),
            "replication_factor": _replication_factor(topic),
            "internal": bool(topic["is_internal"]),
        }
        for topic in topics
        if (args.internal or not topic["is_internal"]) and (pattern is None or pattern.fullmatch(topic["name"]))
    ]
    rows.sort(key=lambda row: row["name"])
    emit(args.output, LIST_COLUMNS, rows)
    return 0


def _compile(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise CommandError(f"list: {pattern!r} is not a regular expression: {exc}") from None


def _replication_factor(topic: dict[str, Any]) -> int:
    partitions = topic["partitions"]
    return len(partitions[0]["replica_nodes"]) if partitions else 0


# --- describe --------------------------------------------------------------------------------------------------


def describe_command(args: argparse.Namespace) -> int:
    with admin_client(ClientSettings.from_args(args)) as admin:
        if args.topics:
            metadata = admin.describe_topics(list(dict.fromkeys(args.topics)))
            for topic in metadata:
                raise_for_error(topic["error_code"], None, f"topic {topic['name']!r}")
        else:
            metadata = [topic for topic in admin.describe_topics() if not topic["is_internal"]]
        metadata.sort(key=lambda topic: topic["name"])
        leaders = partition_leaders(metadata)
        offsets = log_offsets(admin, leaders)
        sizes = partition_sizes(admin, leaders)
        documents = []
        for topic in metadata:
            configs = describe_config_entries(admin, "topic", topic["name"])
            if not args.all_configs:
                configs = [entry for entry in configs if entry["source"] != "DEFAULT_CONFIG"]
            documents.append(_topic_document(topic, offsets, sizes, configs))
    if args.output == "json":
        from kbroker.commands.output import print_json

        print_json(documents)
    else:
        _print_topics(documents, args.all_configs)
    return 0


def _topic_document(
    topic: dict[str, Any],
    offsets: dict[tuple[str, int], tuple[int | None, int | None]],
    sizes: dict[tuple[str, int], int],
    configs: list[dict[str, Any]],
) -> dict[str, Any]:
    name = topic["name"]
    partitions = []
    for partition in sorted(topic["partitions"], key=lambda p: p["partition_index"]):
        index = partition["partition_index"]
        start, end = offsets.get((name, index), (None, None))
        partitions.append(
            {
                "partition": index,
                "leader": partition["leader_id"] if partition["leader_id"] >= 0 else None,
                "replicas": list(partition["replica_nodes"]),
                "isr": list(partition["isr_nodes"]),
                "log_start_offset": start,
                "log_end_offset": end,
                "size_bytes": sizes.get((name, index)),
            }
        )
    return {
        "name": name,
        "topic_id": str(topic["topic_id"]) if topic.get("topic_id") is not None else None,
        "internal": bool(topic["is_internal"]),
        "partition_count": len(partitions),
        "replication_factor": _replication_factor(topic),
        "partitions": partitions,
        "configs": configs,
    }


PartitionKey = tuple[str, int]  # (topic, partition)


def partition_leaders(metadata: list[dict[str, Any]]) -> dict[PartitionKey, int]:
    """The leader of every partition that has one, from kafka-python's describe_topics()."""
    return {
        (topic["name"], partition["partition_index"]): partition["leader_id"]
        for topic in metadata
        for partition in topic["partitions"]
        if partition["leader_id"] >= 0
    }


def log_offsets(admin: Any, partitions: Iterable[PartitionKey]) -> dict[PartitionKey, tuple[int | None, int | None]]:
    """(log start offset, log end offset) of each partition: ListOffsets earliest and latest (None where the
    cluster did not say). kbroker topics describe and the web console show these."""
    from kafka import TopicPartition
    from kafka.protocol.consumer.offsets import OffsetSpec

    wanted = [TopicPartition(topic, partition) for topic, partition in partitions]
    if not wanted:
        return {}
    earliest = admin.list_partition_offsets(dict.fromkeys(wanted, OffsetSpec.EARLIEST))
    latest = admin.list_partition_offsets(dict.fromkeys(wanted, OffsetSpec.LATEST))
    return {
        (tp.topic, tp.partition): (
            earliest[tp].offset if tp in earliest else None,
            latest[tp].offset if tp in latest else None,
        )
        for tp in wanted
    }


def partition_sizes(admin: Any, leaders: Mapping[PartitionKey, int]) -> dict[PartitionKey, int]:
    """The size on disk of each partition's leader replica (DescribeLogDirs to each leader; the sum over its log
    directories). A broker refusing the request (no DESCRIBE on the cluster) leaves its partitions out."""
    import kafka.errors as kafka_errors
    from kafka.protocol.admin import DescribeLogDirsRequest

    by_leader: dict[int, dict[str, list[int]]] = {}
    for (topic, partition), leader in leaders.items():
        by_leader.setdefault(leader, {}).setdefault(topic, []).append(partition)
    sizes: dict[PartitionKey, int] = {}
    for leader, wanted in by_leader.items():
        request = DescribeLogDirsRequest(topics=[(name, indexes) for name, indexes in wanted.items()])
        try:
            response = send_request(admin, request, leader)
        except kafka_errors.BrokerResponseError:
            continue
        if getattr(response, "error_code", 0):  # v3+: a top-level error such as CLUSTER_AUTHORIZATION_FAILED
            continue
        for log_dir in response.results:
            if log_dir.error_code:
                continue
            for topic in log_dir.topics:
                for partition in topic.partitions:
                    if partition.partition_index in wanted.get(topic.name, ()) and not partition.is_future_key:
                        key = (topic.name, partition.partition_index)
                        sizes[key] = sizes.get(key, 0) + partition.partition_size
    return sizes


def _print_topics(documents: list[dict[str, Any]], all_configs: bool) -> None:
    from kbroker.commands.output import print_table

    for number, document in enumerate(documents):
        if number:
            print()
        print(
            f"Topic: {document['name']}  TopicId: {document['topic_id']}  "
            f"PartitionCount: {document['partition_count']}  ReplicationFactor: {document['replication_factor']}"
        )
        print_table(PARTITION_COLUMNS, document["partitions"])
        if document["configs"]:
            print_table(
                CONFIG_COLUMNS, document["configs"], title="Configs" if all_configs else "Configs (non-default)"
            )
        else:
            print("Configs: all at their defaults")


# --- create, delete, alter -------------------------------------------------------------------------------------


def create_command(args: argparse.Namespace) -> int:
    configs = parse_assignments(args.config, "--config")
    spec = {
        args.topic: {
            "num_partitions": -1 if args.partitions is None else args.partitions,
            "replication_factor": -1 if args.replication_factor is None else args.replication_factor,
            "configs": configs,
        }
    }
    with admin_client(ClientSettings.from_args(args)) as admin:
        result = admin.create_topics(spec, raise_errors=False)
        for topic in result["topics"]:
            if topic["error_code"] == 36 and args.if_not_exists:  # TOPIC_ALREADY_EXISTS
                return 0
            raise_for_error(topic["error_code"], topic["error_message"], f"topic {topic['name']!r}")
        admin.wait_for_topics([args.topic])
    print(f"Created topic {args.topic}.")
    return 0


def delete_command(args: argparse.Namespace) -> int:
    names = list(dict.fromkeys(args.topics))
    with admin_client(ClientSettings.from_args(args)) as admin:
        result = admin.delete_topics(names, raise_errors=False)
    failures = []
    for topic in result["topics"]:
        if topic["error_code"] == 0:
            print(f"Deleted topic {topic['name']}.")
        elif not (topic["error_code"] == UNKNOWN_TOPIC and args.if_exists):
            failures.append(topic)
    for topic in failures:  # the first one is raised (one line); several are rare and each is named
        raise_for_error(topic["error_code"], topic["error_message"], f"topic {topic['name']!r}")
    return 0


def alter_command(args: argparse.Namespace) -> int:
    changes = parse_assignments(args.config, "--config")
    if args.partitions is None and not changes and not args.delete_config:
        raise CommandError("alter: nothing to change (give --partitions N, --config KEY=VALUE or --delete-config KEY)")
    with admin_client(ClientSettings.from_args(args)) as admin:
        if args.partitions is not None:
            response = admin.create_partitions({args.topic: args.partitions}, raise_errors=False)
            for result in response.results:
                raise_for_error(result.error_code, result.error_message, f"topic {result.name!r}")
            print(f"Topic {args.topic} now has {args.partitions} partitions.")
        if changes or args.delete_config:
            alter_configs(admin, "topic", args.topic, changes, list(args.delete_config))
            print(f"Completed updating config for topic {args.topic}.")
    return 0
