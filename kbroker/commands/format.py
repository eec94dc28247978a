"""``kbroker format``: what Kafka's ``kafka-storage format -t CLUSTER_ID -c broker.properties`` does for a broker's
log directories, without a JVM: each gets a meta.properties (version=1, cluster.id, node.id and a directory.id of
its own), which ``kbroker serve`` with ``process.roles=broker`` needs before it joins the cluster's controllers.

As Kafka's storage tool: nothing is written unless every directory can be; a directory formatted for another
cluster or node is refused, one formatted for this one is refused too unless ``--ignore-formatted`` (then it is left
as it is and the others are formatted). ``--random-uuid`` prints a new cluster id, as ``kafka-storage random-uuid``.
Unlike Kafka 4.4's tool, which takes any string, a cluster id must be a Kafka Uuid (22 characters of URL-safe
base64): the controllers' ids are, and a broker with another id is refused at registration.
"""

from __future__ import annotations

import argparse
import base64
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from kbroker.config import ConfigError, parse_properties

META_PROPERTIES = "meta.properties"
_UUID_TEXT = re.compile(r"[A-Za-z0-9_-]{22}(==)?")
# Kafka's reserved Uuids (Uuid.RESERVED, DirectoryId's reserved ids): never a cluster or directory id.
_RESERVED = {uuid.UUID(int=value) for value in range(100)}


class FormatError(Exception):
    """The directories cannot be formatted; the message is the one line that says why."""


def random_uuid() -> str:
    """A new id as Kafka's Uuid.randomUuid makes it: a random (v4) UUID in URL-safe base64 without padding, never
    a reserved one, never starting with "-" (a command line would read it as an option)."""
    while True:
        value = uuid.uuid4()
        text = base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")
        if value not in _RESERVED and not text.startswith("-"):
            return text


def check_cluster_id(text: str) -> str:
    if _UUID_TEXT.fullmatch(text) is None:
        raise FormatError(
            f"cluster id {text!r} is not a Kafka cluster id (22 characters of URL-safe base64 such as "
            "`kbroker format --random-uuid` or `kafka-storage random-uuid` prints)"
        )
    if uuid.UUID(bytes=base64.urlsafe_b64decode(text[:22] + "==")) in _RESERVED:
        raise FormatError(f"cluster id {text!r} is one of Kafka's reserved ids; make one with --random-uuid")
    return text[:22]


def read_meta_properties(path: Path) -> dict[str, str]:
    try:
        return parse_properties(path.read_text(), str(path))
    except UnicodeDecodeError:
        raise FormatError(f"{path} is not a text file") from None
    except (OSError, ConfigError) as exc:
        raise FormatError(f"cannot read {path}: {exc}") from None


@dataclass(frozen=True)
class Formatted:
    written: list[Path]  # directories formatted now
    kept: list[Path]  # already formatted for this cluster and node (--ignore-formatted)


def format_directories(
    directories: list[Path], cluster_id: str, node_id: int, *, ignore_formatted: bool = False
) -> Formatted:
    """Write meta.properties into each of ``directories`` (created if need be); checked first, all of them."""
    cluster_id = check_cluster_id(cluster_id)
    if node_id < 0:
        raise FormatError(f"node id {node_id} is negative: a broker's node.id is 0 or more")
    if not directories:
        raise FormatError("no directory to format: give --dir DIR, or log.dirs in --config")
    unique = list(dict.fromkeys(Path(directory) for directory in directories))
    empty: list[Path] = []
    kept: list[Path] = []
    for directory in unique:
        path = directory / META_PROPERTIES
        if not path.exists():
            if directory.exists() and not directory.is_dir():
                raise FormatError(f"{directory} is not a directory")
            empty.append(directory)
            continue
        stored = read_meta_properties(path)
        if stored.get("cluster.id") != cluster_id:
            raise FormatError(
                f"{directory} is already formatted for cluster {stored.get('cluster.id')!r}, not {cluster_id!r} "
                "(a directory of another cluster: give its id, or format an empty directory)"
            )
        if stored.get("node.id") != str(node_id):
            raise FormatError(
                f"{directory} is already formatted as node.id {stored.get('node.id')}, not {node_id} (a directory "
                "of another node: give its node id, or format an empty directory)"
            )
        if not ignore_formatted:
            raise FormatError(
                f"log directory {directory} is already formatted; use --ignore-formatted to leave it as it is "
                "and format the others"
            )
        kept.append(directory)
    from kbroker.durable.files import write_atomically

    used = set()
    for directory in empty:
        while (directory_id := random_uuid()) in used:
            pass
        used.add(directory_id)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            write_atomically(
                directory / META_PROPERTIES,
                "#\n#Written by kbroker format\n"
                f"version=1\ncluster.id={cluster_id}\nnode.id={node_id}\ndirectory.id={directory_id}\n",
                sync_directory=True,
            )
        except OSError as exc:
            raise FormatError(f"cannot write {directory / META_PROPERTIES}: {exc.strerror or exc}") from None
    return Formatted(empty, kept)


def directories_of(properties: dict[str, str]) -> list[Path]:
    """The directories Kafka's storage tool formats for a server.properties: log.dirs (else log.dir), and
    metadata.log.dir if it is set."""
    names = (properties.get("log.dirs") or properties.get("log.dir") or "").split(",")
    names.append(properties.get("metadata.log.dir", ""))
    return [Path(name.strip()) for name in names if name.strip()]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "format",
        help="format a broker's log directories for a KRaft cluster (as kafka-storage format), without a JVM",
        description="Write meta.properties (cluster id, node id, a directory id) into each log directory of a "
        "broker, as `kafka-storage format -t CLUSTER_ID -c broker.properties` does.",
    )
    parser.add_argument("--config", "-c", type=Path, default=None, help="the broker's server.properties")
    parser.add_argument("--cluster-id", "-t", default=None, help="the cluster's id (its controllers' id)")
    parser.add_argument("--node-id", type=int, default=None, help="this broker's node.id (default: the config's)")
    parser.add_argument(
        "--dir",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="a log directory (repeatable; default: the config's log.dirs)",
    )
    parser.add_argument(
        "--ignore-formatted",
        "-g",
        action="store_true",
        help="leave directories already formatted for this cluster and node as they are",
    )
    parser.add_argument("--random-uuid", action="store_true", help="print a new cluster id and exit")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.random_uuid:
        print(random_uuid())
        return 0
    try:
        properties: dict[str, str] = {}
        if args.config is not None:
            try:
                properties = parse_properties(args.config.read_text(), str(args.config))
            except OSError as exc:
                raise FormatError(f"cannot read {args.config}: {exc.strerror}") from None
            except ConfigError as exc:
                raise FormatError(str(exc)) from None
        if args.cluster_id is None:
            raise FormatError("--cluster-id is needed (the controllers' cluster id; a new one: --random-uuid)")
        node_text = str(args.node_id) if args.node_id is not None else properties.get("node.id", "").strip()
        if not node_text:
            raise FormatError("--node-id is needed (or node.id in --config)")
        if not node_text.lstrip("-").isdigit():
            raise FormatError(f"node.id {node_text!r} is not an integer")
        directories = args.dir or directories_of(properties)
        formatted = format_directories(
            directories, args.cluster_id, int(node_text), ignore_formatted=args.ignore_formatted
        )
    except FormatError as exc:
        print(f"kbroker format: {exc}", file=sys.stderr)
        return 1
    for directory in formatted.written:
        print(f"Formatting {directory} for cluster {args.cluster_id[:22]} as node {node_text}.")
    if not formatted.written:
        print("All of the log directories are already formatted.")
    return 0
