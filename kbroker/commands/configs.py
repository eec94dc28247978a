"""``kbroker configs describe|alter``: a topic's or a broker's configs, as kafka-configs.sh shows and changes them.

``describe --topic T`` / ``describe --broker [ID]`` sends DescribeConfigs and lists each config's name, value,
source (DEFAULT_CONFIG, STATIC_BROKER_CONFIG, DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG,
DYNAMIC_DEFAULT_BROKER_CONFIG, ...), and whether it is sensitive (its value is then never sent: null) or read-only.
As kafka-configs.sh, only the configs set on the resource itself (source DYNAMIC_TOPIC_CONFIG for a topic,
DYNAMIC_BROKER_CONFIG for a broker) are listed unless ``--all`` is given. ``--broker`` without an id describes the
controller Metadata names (any broker when there is none).

``alter --topic T|--broker [ID] --set k=v ... --delete k ...`` sends IncrementalAlterConfigs (SET and DELETE
operations) and prints ``Completed updating config for topic T.``; a refused change is one line with the broker's
error code name and message (``INVALID_CONFIG (40): Invalid value ...``).

JSON (``describe --output json``), stable keys::

    {"resource_type": "topic" | "broker", "name": str,
     "configs": [{"name": str, "value": str | null, "source": str, "sensitive": bool, "read_only": bool}, ...]}

``configs`` is sorted by name. ``kbroker topics describe`` uses ``describe_config_entries`` and ``alter_configs``
from here, so both commands show and change configs the same way.
"""

from __future__ import annotations

import argparse
from typing import Any

from kbroker.commands.connection import (
    ClientSettings,
    CommandError,
    add_client_arguments,
    add_output_argument,
    admin_client,
)

CONFIG_COLUMNS = ("name", "value", "source", "sensitive", "read_only")
# DescribeConfigs' resource types (Kafka's ConfigResource.Type) for the resources these commands name.
RESOURCE_TYPES = {"topic": 2, "broker": 4}
# The source of a value set on the resource itself: what kafka-configs.sh lists without --all.
OWN_SOURCE = {"topic": "DYNAMIC_TOPIC_CONFIG", "broker": "DYNAMIC_BROKER_CONFIG"}
SET, DELETE = 0, 1  # IncrementalAlterConfigs' operation codes


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("configs", help="describe or alter a topic's or a broker's configs")
    actions = parser.add_subparsers(dest="action", required=True)

    describe = actions.add_parser("describe", help="list configs with their sources (only the set ones by default)")
    _add_resource_arguments(describe)
    describe.add_argument("--all", action="store_true", help="every config, defaults included")
    add_client_arguments(describe)
    add_output_argument(describe)
    describe.set_defaults(run=describe_command)

    alter = actions.add_parser("alter", help="set or delete configs (IncrementalAlterConfigs)")
    _add_resource_arguments(alter)
    alter.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set a config (repeatable)")
    alter.add_argument(
        "--delete", action="append", default=[], metavar="KEY", help="remove a config, back to its default"
    )
    add_client_arguments(alter)
    alter.set_defaults(run=alter_command)


def _add_resource_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--topic", metavar="TOPIC", help="a topic's configs")
    which.add_argument(
        "--broker", nargs="?", const="", metavar="ID", help="a broker's configs (default: the controller)"
    )


# --- commands ------------------------------------------------------------------------------------------------


def describe_command(args: argparse.Namespace) -> int:
    from kbroker.commands.output import emit

    with admin_client(ClientSettings.from_args(args)) as admin:
        resource_type, name = _resource(admin, args)
        entries = describe_config_entries(admin, resource_type, name)
    if not args.all:
        entries = [entry for entry in entries if entry["source"] == OWN_SOURCE[resource_type]]
    kind = "All" if args.all else "Dynamic"
    document = {"resource_type": resource_type, "name": name, "configs": entries}
    emit(args.output, CONFIG_COLUMNS, entries, title=f"{kind} configs for {resource_type} {name}", document=document)
    return 0


def alter_command(args: argparse.Namespace) -> int:
    changes = parse_assignments(args.set, "--set")
    deletions = list(args.delete)
    if not changes and not deletions:
        raise CommandError("alter: nothing to change (give --set KEY=VALUE or --delete KEY)")
    both = sorted(set(changes) & set(deletions))
    if both:
        raise CommandError(f"alter: {', '.join(both)} is both set and deleted")
    with admin_client(ClientSettings.from_args(args)) as admin:
        resource_type, name = _resource(admin, args)
        alter_configs(admin, resource_type, name, changes, deletions)
    print(f"Completed updating config for {resource_type} {name}.")
    return 0


def _resource(admin: Any, args: argparse.Namespace) -> tuple[str, str]:
    """(``topic``, name) or (``broker``, id): ``--broker`` alone means the controller (any broker if none)."""
    if args.topic is not None:
        return "topic", args.topic
    cluster = admin.describe_cluster()
    brokers = sorted(broker["broker_id"] for broker in cluster["brokers"])
    if args.broker:
        if not args.broker.isdigit() or int(args.broker) not in brokers:
            known = ", ".join(str(broker) for broker in brokers)
            raise CommandError(f"--broker {args.broker}: no such broker in the cluster (its brokers: {known})")
        return "broker", str(int(args.broker))
    controller = cluster.get("controller_id", -1)
    if controller is None or controller < 0:
        if not brokers:
            raise CommandError("the cluster's metadata names no broker")
        controller = brokers[0]
    return "broker", str(controller)


# --- shared with ``kbroker topics`` ---------------------------------------------------------------------------


def parse_assignments(items: list[str], option: str) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a malformed item is refused in one line."""
    assignments: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"{option} {item!r}: expected KEY=VALUE")
        assignments[key.strip()] = value
    return assignments


def send_request(admin: Any, request: Any, node_id: int | None = None) -> Any:
    """One request through the admin client's connections, to ``node_id`` (any broker if None): the raw response,
    for the APIs whose per-resource errors kafka-python's helpers drop or flatten."""
    return admin._manager.run(admin._manager.send, request, node_id)


def raise_for_error(error_code: int, message: str | None, subject: str) -> None:
    """A kafka-python error for a non-zero code, with the broker's message (or one naming ``subject``)."""
    if error_code == 0:
        return
    import kafka.errors as kafka_errors

    error = kafka_errors.for_code(error_code)
    if error_code == kafka_errors.UnknownTopicOrPartitionError.errno:
        raise error(f"{subject} does not exist")  # brokers' messages here rarely name it
    raise error(message or f"{subject}: {error.description}")


def describe_config_entries(admin: Any, resource_type: str, name: str) -> list[dict[str, Any]]:
    """Every config of the resource as rows with ``CONFIG_COLUMNS``, sorted by name."""
    from kafka.admin import ConfigSourceType
    from kafka.protocol.admin import DescribeConfigsRequest

    request = DescribeConfigsRequest(resources=[(RESOURCE_TYPES[resource_type], name, None)], include_synonyms=False)
    node = int(name) if resource_type == "broker" else None  # a broker's configs come from that broker
    response = send_request(admin, request, node)
    entries: list[dict[str, Any]] = []
    for result in response.results:
        raise_for_error(result.error_code, result.error_message, f"{resource_type} {name!r}")
        for config in result.configs:
            try:
                source = ConfigSourceType(config.config_source).name
            except ValueError:
                source = f"UNKNOWN({config.config_source})"
            entries.append(
                {
                    "name": config.name,
                    "value": config.value,
                    "source": source,
                    "sensitive": bool(config.is_sensitive),
                    "read_only": bool(config.read_only),
                }
            )
    return sorted(entries, key=lambda entry: entry["name"])


def alter_configs(admin: Any, resource_type: str, name: str, changes: dict[str, str], deletions: list[str]) -> None:
    """IncrementalAlterConfigs: SET each of ``changes``, DELETE each of ``deletions``; a refusal raises."""
    from kafka.protocol.admin import IncrementalAlterConfigsRequest

    operations: list[tuple[str, int, str | None]] = [(key, SET, value) for key, value in changes.items()]
    operations += [(key, DELETE, None) for key in deletions]
    request = IncrementalAlterConfigsRequest(
        resources=[(RESOURCE_TYPES[resource_type], name, operations)], validate_only=False
    )
    node = int(name) if resource_type == "broker" else None
    response = send_request(admin, request, node)
    for result in response.responses:
        raise_for_error(result.error_code, result.error_message, f"{resource_type} {name!r}")
