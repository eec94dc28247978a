"""``kbroker groups list|describe|delete|reset-offsets``: consumer groups, as kafka-consumer-groups.sh shows them.

- ``list``: every group with its type (classic or consumer, KIP-848), state and protocol type (ListGroups v5
  where the broker has it).
- ``describe GROUP...``: per partition the committed offset, log end offset, lag and owning member (the default
  view, kafka-consumer-groups.sh --describe); ``--members`` lists the members and their assignments, ``--state``
  the coordinator, assignor and state. KIP-848 groups are described with ConsumerGroupDescribe (sent through
  kafka-python's connection with kbroker's own protocol codecs, since kafka-python has no such message), and a
  group that is not one (GROUP_ID_NOT_FOUND) with DescribeGroups, as Kafka's admin client falls back.
- ``delete GROUP...``: DeleteGroups; a group with members answers NON_EMPTY_GROUP.
- ``reset-offsets``: plans new committed offsets (to earliest, latest, an offset, a date-time, or shifted) and,
  with ``--execute``, commits them; a dry run by default, and refused while the group has active members.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kbroker.commands.connection import (
    ClientSettings,
    CommandError,
    add_client_arguments,
    add_output_argument,
    admin_client,
)
from kbroker.commands.output import Row, emit

CONSUMER_GROUP_DESCRIBE_KEY = 69
GROUP_ID_NOT_FOUND = 69
# Kafka's reset-offsets works only on a group nobody consumes in (ConsumerGroupCommand.resetOffsets).
INACTIVE_STATES = ("Empty", "Dead")
DESCRIBE_RETRY_SECONDS = 10.0

OFFSET_COLUMNS = (
    "group",
    "topic",
    "partition",
    "current_offset",
    "log_end_offset",
    "lag",
    "consumer_id",
    "host",
    "client_id",
)
MEMBER_COLUMNS = ("group", "consumer_id", "instance_id", "host", "client_id", "partitions", "assignment")
STATE_COLUMNS = ("group", "type", "coordinator", "assignor", "state", "members")
RESET_COLUMNS = ("group", "topic", "partition", "current_offset", "new_offset")


def register(subparsers: argparse._SubParsersAction) -> None:
    groups = subparsers.add_parser(
        "groups",
        help="list, describe, delete consumer groups and reset their offsets",
        description="Consumer groups, as kafka-consumer-groups.sh shows them.",
    )
    actions = groups.add_subparsers(dest="action", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="every group with its type, state and protocol")
    _common(listing)
    listing.set_defaults(run=list_command)

    describe = actions.add_parser("describe", help="members, committed offsets, log end offsets and lag of groups")
    describe.add_argument("groups", nargs="+", metavar="GROUP")
    view = describe.add_mutually_exclusive_group()
    view.add_argument(
        "--offsets", action="store_const", dest="view", const="offsets", help="per partition (the default)"
    )
    view.add_argument("--members", action="store_const", dest="view", const="members", help="per member")
    view.add_argument("--state", action="store_const", dest="view", const="state", help="coordinator and state")
    _common(describe)
    describe.set_defaults(run=describe_command, view="offsets")

    delete = actions.add_parser("delete", help="delete groups that have no members (and their offsets)")
    delete.add_argument("groups", nargs="+", metavar="GROUP")
    _common(delete)
    delete.set_defaults(run=delete_command)

    reset = actions.add_parser(
        "reset-offsets",
        help="plan (and with --execute commit) new offsets for an inactive group",
        description="Prints the plan; --execute commits it. The group must have no active members.",
    )
    reset.add_argument("--group", required=True, help="the group whose committed offsets to reset")
    scope = reset.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--topic",
        action="append",
        dest="topics",
        metavar="TOPIC[:P,P]",
        help="a topic, or some of its partitions (repeatable)",
    )
    scope.add_argument("--all-topics", action="store_true", help="every partition the group has an offset for")
    strategy = reset.add_mutually_exclusive_group(required=True)
    strategy.add_argument("--to-earliest", action="store_true", help="the log start offset")
    strategy.add_argument("--to-latest", action="store_true", help="the log end offset")
    strategy.add_argument("--to-offset", type=int, metavar="N", help="offset N (kept within the log)")
    strategy.add_argument(
        "--to-datetime", metavar="ISO8601", help="the first offset at or after a time, e.g. 2024-01-31T12:00:00.000"
    )
    strategy.add_argument(
        "--shift-by", type=int, metavar="N", help="the committed offset plus N (negative: back; kept within the log)"
    )
    strategy.add_argument("--to-current", action="store_true", help="the committed offset (latest if none)")
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    mode.add_argument("--dry-run", action="store_true", help="only print the plan (the default)")
    _common(reset)
    reset.set_defaults(run=reset_offsets_command)


def _common(parser: argparse.ArgumentParser) -> None:
    add_client_arguments(parser)
    add_output_argument(parser)


# --- what a group is ----------------------------------------------------------------------------------------------


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    host: str
    assignment: list[tuple[str, int]] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "instance_id": self.instance_id,
            "client_id": self.client_id,
            "host": self.host,
            "assignment": [{"topic": topic, "partition": partition} for topic, partition in self.assignment],
        }


@dataclass
class GroupDescription:
    group: str
    type: str  # "classic" or "consumer" (KIP-848)
    state: str
    protocol_type: str
    assignor: str
    coordinator: int
    members: list[Member]


def describe_groups(admin: Any, group_ids: list[str]) -> dict[str, GroupDescription | None]:
    """Each group's description; None for a group that does not exist. A coordinator still loading (or not yet
    there, as on a new cluster) is asked again for a while, as Kafka's admin client retries."""
    import kafka.errors as kafka_errors

    deadline = time.monotonic() + DESCRIBE_RETRY_SECONDS
    while True:
        try:
            return admin._manager.run(_describe_groups, admin, list(group_ids))
        except kafka_errors.KafkaError as exc:
            if not getattr(exc, "retriable", False) or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


async def _describe_groups(admin: Any, group_ids: list[str]) -> dict[str, GroupDescription | None]:
    coordinators: dict[str, int] = await admin._find_coordinator_ids(group_ids)
    by_coordinator: dict[int, list[str]] = {}
    for group_id in group_ids:
        by_coordinator.setdefault(coordinators[group_id], []).append(group_id)
    api_versions = admin._manager.broker_version_data.api_versions or {}
    results: dict[str, GroupDescription | None] = {}
    for coordinator, ids in by_coordinator.items():
        classic = ids
        if CONSUMER_GROUP_DESCRIBE_KEY in api_versions:
            consumer_groups, classic = await _consumer_group_describe(admin, coordinator, ids)
            results.update(consumer_groups)
        if classic:
            results.update(await _classic_describe(admin, coordinator, classic))
    return {group_id: results.get(group_id) for group_id in group_ids}


async def _consumer_group_describe(
    admin: Any, coordinator: int, group_ids: list[str]
) -> tuple[dict[str, GroupDescription], list[str]]:
    """KIP-848 groups among ``group_ids``, and the ids that are not one (to be asked with DescribeGroups)."""
    from protocol.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest

    request = KbrokerRequest(ConsumerGroupDescribeRequest(group_ids=group_ids))
    response = await admin._manager.send(request, node_id=coordinator)
    described: dict[str, GroupDescription] = {}
    not_consumer_groups: list[str] = []
    for group in response.groups:
        if group.error_code == GROUP_ID_NOT_FOUND:
            not_consumer_groups.append(group.group_id)
            continue
        _raise_for(group.error_code, group.error_message)
        members = [
            Member(
                member.member_id,
                member.instance_id,
                member.client_id,
                member.client_host,
                sorted(
                    (topic.topic_name, partition)
                    for topic in member.assignment.topic_partitions
                    for partition in topic.partitions
                ),
            )
            for member in group.members
        ]
        described[group.group_id] = GroupDescription(
            group.group_id, "consumer", group.group_state, "consumer", group.assignor_name, coordinator, members
        )
    return described, not_consumer_groups


async def _classic_describe(admin: Any, coordinator: int, group_ids: list[str]) -> dict[str, GroupDescription | None]:
    from kafka.protocol.admin import DescribeGroupsRequest

    response = await admin._manager.send(DescribeGroupsRequest(groups=group_ids), node_id=coordinator)
    described: dict[str, GroupDescription | None] = {}
    for group in response.groups:
        # A group nobody knows is Dead without an error (DescribeGroups before v6, and Kafka's coordinator), or
        # GROUP_ID_NOT_FOUND (v6+ for an id that is no classic group).
        if group.error_code == GROUP_ID_NOT_FOUND or (group.error_code == 0 and group.group_state == "Dead"):
            described[group.group_id] = None
            continue
        _raise_for(group.error_code, getattr(group, "error_message", None))
        members = [
            Member(
                member.member_id,
                member.group_instance_id,
                member.client_id,
                member.client_host,
                _classic_assignment(member.member_assignment) if group.protocol_type == "consumer" else [],
            )
            for member in group.members
        ]
        described[group.group_id] = GroupDescription(
            group.group_id,
            "classic",
            group.group_state,
            group.protocol_type,
            group.protocol_data,
            coordinator,
            members,
        )
    return described


def _classic_assignment(data: bytes | None) -> list[tuple[str, int]]:
    """The partitions in a classic consumer's assignment (ConsumerProtocolAssignment); none if unreadable."""
    if not data:
        return []
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment

    try:
        assignment = ConsumerProtocolAssignment.decode(data)
    except Exception:  # an assignor's own format: the assignment is not shown, the group still is
        return []
    pairs = assignment.assigned_partitions
    return sorted((topic, partition) for topic, partitions in pairs for partition in partitions)


def _raise_for(error_code: int, message: str | None) -> None:
    if error_code:
        import kafka.errors as kafka_errors

        raise kafka_errors.for_code(error_code)(message or "")


class KbrokerRequest:
    """A request made with kbroker's protocol/ codecs, sendable through kafka-python's connections (which need
    only what is below), for APIs kafka-python has no message for (ConsumerGroupDescribe). The connection picks
    the version both sides know, frames it and hands the response frame back to ``response_type``."""

    def __init__(self, body: Any) -> None:
        from protocol.messages import APIS

        self.body = body
        self.API_KEY: int = body.API_KEY
        self.name: str = APIS[body.API_KEY].name
        self.min_version, self.max_version = body.VALID_VERSIONS
        self._min_version: int | None = None
        self._max_version: int | None = None
        self.API_VERSION: int | None = None
        self.header: _KbrokerRequestHeader | None = None

    def with_header(self, correlation_id: int = 0, client_id: str = "kbroker-cli") -> None:
        assert self.API_VERSION is not None
        self.header = _KbrokerRequestHeader(self.API_KEY, self.API_VERSION, correlation_id, client_id)

    def encode(self, framed: bool = True, header: bool = True) -> bytes:
        from protocol.framing import encode_request

        assert framed and header and self.header is not None and self.API_VERSION is not None
        return encode_request(self.body, self.API_VERSION, self.header.correlation_id, self.header.client_id)

    def expect_response(self) -> bool:
        return True

    def __str__(self) -> str:
        return f"{self.name}Request_v{self.API_VERSION}({self.body!r})"


@dataclass
class _KbrokerRequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str

    def get_response_class(self) -> _KbrokerResponseType:
        return _KbrokerResponseType(self.api_key, self.api_version)


@dataclass
class _ResponseHeader:
    correlation_id: int


class _KbrokerResponseType:
    """What kafka-python's parser asks of a response class: the header, then the body, of one frame."""

    def __init__(self, api_key: int, api_version: int) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self._body: Any = None

    def parse_header(self, frame: Any) -> _ResponseHeader:
        from protocol.exceptions import DecodeError
        from protocol.framing import decode_response

        try:
            correlation_id, self._body = decode_response(frame.read(), self.api_key, self.api_version)
        except DecodeError as exc:
            raise ValueError(str(exc)) from None  # kafka-python reports a ValueError as KafkaProtocolError
        return _ResponseHeader(correlation_id)

    def decode(self, frame: Any) -> Any:
        return self._body


# --- list ---------------------------------------------------------------------------------------------------------


def list_command(args: argparse.Namespace) -> int:
    admin = admin_client(ClientSettings.from_args(args))
    try:
        listed = admin.list_groups()
    finally:
        admin.close()
    rows = sorted(
        (
            {
                "group": group["group_id"],
                "type": group.get("group_type") or "classic",
                "state": group.get("group_state") or None,
                "protocol": group.get("protocol_type"),
            }
            for group in listed
        ),
        key=lambda row: row["group"],
    )
    emit(args.output, ("group", "type", "state", "protocol"), rows)
    return 0


# --- describe -----------------------------------------------------------------------------------------------------


def describe_command(args: argparse.Namespace) -> int:
    group_ids = list(dict.fromkeys(args.groups))
    admin = admin_client(ClientSettings.from_args(args))
    try:
        descriptions = describe_groups(admin, group_ids)
        found = [description for description in descriptions.values() if description is not None]
        committed = admin.list_group_offsets([d.group for d in found]) if found else {}
        partitions = {tp for offsets in committed.values() for tp in offsets}
        for member in (member for description in found for member in description.members):
            partitions.update(_topic_partition(topic, partition) for topic, partition in member.assignment)
        log_end = _log_end_offsets(admin, partitions)
    finally:
        admin.close()

    documents: list[dict[str, Any]] = []
    for description in found:
        documents.append(
            {
                "group": description.group,
                "type": description.type,
                "state": description.state,
                "protocol_type": description.protocol_type,
                "assignor": description.assignor,
                "coordinator": description.coordinator,
                "members": [member.document() for member in description.members],
                "offsets": _offset_rows(description, committed.get(description.group, {}), log_end),
            }
        )
    if args.output == "json":
        emit("json", (), [], document=documents)
    elif found:  # no table at all when every group named is unknown (only the error lines, as Kafka's tool)
        for description in found:
            if description.state == "Empty":
                print(f"Consumer group '{description.group}' has no active members.", file=sys.stderr)
            elif description.state not in ("Stable", "Dead"):
                print(f"Warning: Consumer group '{description.group}' is rebalancing.", file=sys.stderr)
        if args.view == "members":
            emit("table", MEMBER_COLUMNS, [row for d in found for row in _member_rows(d)])
        elif args.view == "state":
            emit("table", STATE_COLUMNS, [_state_row(d) for d in found])
        else:
            rows = [dict(row, group=document["group"]) for document in documents for row in document["offsets"]]
            emit("table", OFFSET_COLUMNS, rows)
    missing = [group_id for group_id, description in descriptions.items() if description is None]
    for group_id in missing:
        print(f"kbroker groups: GROUP_ID_NOT_FOUND (69): Consumer group '{group_id}' does not exist.", file=sys.stderr)
    return 1 if missing else 0


def _topic_partition(topic: str, partition: int) -> Any:
    from kafka.structs import TopicPartition

    return TopicPartition(topic, partition)


def _log_end_offsets(admin: Any, partitions: set[Any]) -> dict[Any, int]:
    """Each partition's log end offset; a partition that no longer exists is left out (shown as "-")."""
    if not partitions:
        return {}
    import kafka.errors as kafka_errors
    from kafka.admin import OffsetSpec

    existing = _existing_partitions(admin, {tp.topic for tp in partitions})
    present = [tp for tp in partitions if tp.partition in existing.get(tp.topic, ())]
    if not present:
        return {}
    try:
        offsets = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in present})
    except kafka_errors.UnknownTopicOrPartitionError:
        return {}
    return {tp: result.offset for tp, result in offsets.items()}


def _existing_partitions(admin: Any, topics: set[str]) -> dict[str, set[int]]:
    described = admin.describe_topics(sorted(topics))
    return {
        topic["name"]: {partition["partition_index"] for partition in topic["partitions"]}
        for topic in described
        if not topic["error_code"]
    }


def _offset_rows(description: GroupDescription, committed: dict[Any, Any], log_end: dict[Any, int]) -> list[Row]:
    """kafka-consumer-groups.sh --describe's rows: each assigned partition with its member, then each partition
    with a committed offset that no member owns."""
    owners: dict[tuple[str, int], Member] = {}
    for member in description.members:
        for topic_partition in member.assignment:
            owners[topic_partition] = member
    keys = set(owners) | {(tp.topic, tp.partition) for tp in committed}
    rows: list[Row] = []
    for topic, partition in sorted(keys):
        tp = _topic_partition(topic, partition)
        current = committed[tp].offset if tp in committed and committed[tp].offset >= 0 else None
        end = log_end.get(tp)
        owner = owners.get((topic, partition))
        rows.append(
            {
                "topic": topic,
                "partition": partition,
                "current_offset": current,
                "log_end_offset": end,
                "lag": end - current if current is not None and end is not None else None,
                "consumer_id": owner.member_id if owner else None,
                "host": owner.host if owner else None,
                "client_id": owner.client_id if owner else None,
            }
        )
    return rows


def _member_rows(description: GroupDescription) -> list[Row]:
    rows: list[Row] = []
    for member in description.members:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in member.assignment:
            by_topic.setdefault(topic, []).append(partition)
        rows.append(
            {
                "group": description.group,
                "consumer_id": member.member_id,
                "instance_id": member.instance_id,
                "host": member.host,
                "client_id": member.client_id,
                "partitions": len(member.assignment),
                "assignment": " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in sorted(by_topic.items())) or None,
            }
        )
    return rows


def _state_row(description: GroupDescription) -> Row:
    return {
        "group": description.group,
        "type": description.type,
        "coordinator": description.coordinator,
        "assignor": description.assignor or None,
        "state": description.state,
        "members": len(description.members),
    }


# --- delete -------------------------------------------------------------------------------------------------------


def delete_command(args: argparse.Namespace) -> int:
    import kafka.errors as kafka_errors

    group_ids = list(dict.fromkeys(args.groups))
    admin = admin_client(ClientSettings.from_args(args))
    try:
        results = admin.delete_groups(group_ids)
    finally:
        admin.close()
    rows: list[Row] = []
    failures: list[str] = []
    for group_id in group_ids:
        outcome = results.get(group_id, "OK")
        if outcome == "OK":
            rows.append({"group": group_id, "error": None})
            continue
        error = getattr(kafka_errors, outcome, kafka_errors.UnknownError)
        rows.append({"group": group_id, "error": error.message})
        failures.append(
            f"group '{group_id}' could not be deleted: {error.message} ({error.errno}): {error.description}"
        )
    deleted = [row["group"] for row in rows if row["error"] is None]
    if args.output == "json":
        emit("json", (), rows)
    elif deleted:
        names = ", ".join(f"'{group_id}'" for group_id in deleted)
        print(f"Deletion of requested consumer groups ({names}) was successful.")
    for failure in failures:
        print(f"kbroker groups: {failure}", file=sys.stderr)
    return 1 if failures else 0


# --- reset-offsets ------------------------------------------------------------------------------------------------


def reset_offsets_command(args: argparse.Namespace) -> int:
    timestamp = parse_datetime(args.to_datetime) if args.to_datetime is not None else None
    requested = [parse_topic_argument(argument) for argument in args.topics or ()]
    admin = admin_client(ClientSettings.from_args(args))
    try:
        description = describe_groups(admin, [args.group])[args.group]
        state = description.state if description is not None else "Dead"
        if state not in INACTIVE_STATES:
            raise CommandError(
                f"Assignments can only be reset if the group '{args.group}' is inactive, "
                f"but the current state is {state}."
            )
        committed = admin.list_group_offsets([args.group]).get(args.group, {})
        current = {(tp.topic, tp.partition): om.offset for tp, om in committed.items() if om.offset >= 0}
        if args.all_topics:
            partitions = sorted(current)
        else:
            partitions = _partitions_to_reset(admin, requested)
        plan = _plan(admin, args, partitions, current, timestamp)
        if args.execute and plan:
            _commit(admin, args.group, plan)
    finally:
        admin.close()
    rows = [
        {
            "group": args.group,
            "topic": topic,
            "partition": partition,
            "current_offset": current.get((topic, partition)),
            "new_offset": new_offset,
        }
        for (topic, partition), new_offset in sorted(plan.items())
    ]
    emit(args.output, RESET_COLUMNS, rows)
    if not args.execute and args.output == "table":
        print("Dry run: nothing was committed; add --execute to commit these offsets.", file=sys.stderr)
    return 0


def parse_topic_argument(argument: str) -> tuple[str, list[int] | None]:
    """``topic`` or ``topic:0,1``, as kafka-consumer-groups.sh --topic takes them."""
    topic, separator, partitions = argument.partition(":")
    if not topic:
        raise CommandError(f"--topic {argument!r}: a topic name is needed")
    if not separator:
        return topic, None
    try:
        numbers = [int(partition) for partition in partitions.split(",")]
    except ValueError:
        raise CommandError(f"--topic {argument!r}: partitions are numbers separated by commas, as t:0,1") from None
    if any(number < 0 for number in numbers):
        raise CommandError(f"--topic {argument!r}: partitions are not negative")
    return topic, numbers


def parse_datetime(text: str) -> int:
    """Milliseconds since the epoch of an ISO 8601 date-time; UTC when it names no zone (as Kafka's
    Utils.getDateTime)."""
    if "T" not in text:
        raise CommandError(
            f"--to-datetime {text!r}: Error parsing timestamp. It does not contain a 'T' according to ISO8601 format"
        )
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"--to-datetime {text!r}: not an ISO 8601 date-time such as 2024-01-31T12:00:00.000 or "
            "2024-01-31T12:00:00+02:00"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _partitions_to_reset(admin: Any, requested: list[tuple[str, list[int] | None]]) -> list[tuple[str, int]]:
    existing = _existing_partitions(admin, {topic for topic, _ in requested})
    chosen: set[tuple[str, int]] = set()
    for topic, partitions in requested:
        if topic not in existing:
            raise CommandError(f"UNKNOWN_TOPIC_OR_PARTITION (3): Topic '{topic}' does not exist.")
        for partition in sorted(existing[topic]) if partitions is None else partitions:
            if partition not in existing[topic]:
                raise CommandError(
                    f"UNKNOWN_TOPIC_OR_PARTITION (3): Topic '{topic}' has no partition {partition} "
                    f"(it has {len(existing[topic])})."
                )
            chosen.add((topic, partition))
    return sorted(chosen)


def _plan(
    admin: Any,
    args: argparse.Namespace,
    partitions: list[tuple[str, int]],
    current: dict[tuple[str, int], int],
    timestamp: int | None,
) -> dict[tuple[str, int], int]:
    """The new offset of each partition, by the strategy the arguments name."""
    if not partitions:
        return {}
    from kafka.admin import OffsetSpec
    from kafka.protocol.consumer import OffsetTimestamp

    def list_offsets(spec: Any) -> dict[tuple[str, int], int]:
        answer = admin.list_partition_offsets({_topic_partition(t, p): spec for t, p in partitions})
        return {(tp.topic, tp.partition): result.offset for tp, result in answer.items()}

    earliest = list_offsets(OffsetSpec.EARLIEST)
    latest = list_offsets(OffsetSpec.LATEST)

    def clamp(key: tuple[str, int], offset: int) -> int:
        # Kafka's checkOffsetsRange: past the end is the end, before the start is the start.
        return max(earliest[key], min(offset, latest[key]))

    if args.to_earliest:
        return {key: earliest[key] for key in partitions}
    if args.to_latest:
        return {key: latest[key] for key in partitions}
    if args.to_offset is not None:
        return {key: clamp(key, args.to_offset) for key in partitions}
    if args.shift_by is not None:
        for topic, partition in partitions:
            if (topic, partition) not in current:
                raise CommandError(
                    f"Cannot shift offset for partition {topic}-{partition} since there is no current committed offset"
                )
        return {key: clamp(key, current[key] + args.shift_by) for key in partitions}
    if timestamp is not None:
        by_time = list_offsets(OffsetTimestamp(timestamp))
        # No record at or after the time: the log end offset, as Kafka falls back to the latest offset.
        return {key: by_time[key] if by_time.get(key, -1) >= 0 else latest[key] for key in partitions}
    return {key: current.get(key, latest[key]) for key in partitions}  # --to-current


def _commit(admin: Any, group_id: str, plan: dict[tuple[str, int], int]) -> None:
    import kafka.errors as kafka_errors
    from kafka.structs import OffsetAndMetadata

    offsets = {_topic_partition(t, p): OffsetAndMetadata(offset, "", -1) for (t, p), offset in plan.items()}
    results = admin.alter_group_offsets(group_id, offsets)
    for tp, error in sorted(results.items()):
        if error is not kafka_errors.NoError:
            raise error(f"committing offset {plan[(tp.topic, tp.partition)]} for {tp.topic}-{tp.partition}")
