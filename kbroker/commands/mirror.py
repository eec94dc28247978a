"""``kbroker mirror``: copy topics from one cluster to another, continuously, as MirrorMaker 2 does.

    kbroker mirror --source A:9092 --target B:9092 --topics 'orders.*' [--groups '.*'] [--rename prefix|identity]
                   [--source-alias NAME] [--target-alias NAME] [--source-config F] [--target-config F]
                   [--once] [--exactly-once]

kbroker/mirror/ does the work (replicator.py: the copy loop; policy.py: topic names; checkpoints.py: offset
translation). Either side can be any Kafka-compatible cluster; ``--source-config``/``--target-config`` are client
properties files as ``--command-config`` (security.protocol, sasl.*, ssl.*).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kbroker.commands.connection import BOOTSTRAP_ENVIRONMENT, DEFAULT_BOOTSTRAP


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mirror",
        help="copy topics (and consumer group offsets) from one cluster to another, as MirrorMaker 2",
        description=(
            "Copy the topics matching --topics from the source cluster to the target: keys, values, headers, "
            "timestamps and partitions; missing target topics are made with the same partition count and "
            "configs. Progress is committed only after the target acknowledged, so a restart resumes without "
            "loss (at-least-once; --exactly-once uses a transactional producer in the target). Consumer groups "
            "matching --groups get their offsets translated to the target (MM2 checkpoints). Lag is logged on "
            "stderr; Ctrl-C or SIGTERM stops cleanly."
        ),
    )
    parser.add_argument(
        "--source",
        default=os.environ.get(BOOTSTRAP_ENVIRONMENT),
        metavar="HOST:PORT[,HOST:PORT]",
        help=f"the source cluster's brokers (default ${BOOTSTRAP_ENVIRONMENT} or {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument("--target", required=True, metavar="HOST:PORT[,HOST:PORT]", help="the target's brokers")
    parser.add_argument(
        "--topics", required=True, metavar="REGEX", help="source topics to copy (the regex matches the whole name)"
    )
    parser.add_argument(
        "--groups",
        metavar="REGEX",
        default=None,
        help="source consumer groups whose offsets are translated to the target (default: none)",
    )
    parser.add_argument("--source-config", type=Path, metavar="FILE", help="client properties for the source")
    parser.add_argument("--target-config", type=Path, metavar="FILE", help="client properties for the target")
    parser.add_argument(
        "--rename",
        choices=("prefix", "identity"),
        default="prefix",
        help="target topic names: prefix gives <source-alias>.<topic> (MM2's default), identity keeps the name",
    )
    parser.add_argument("--source-alias", default="source", metavar="NAME", help="the source cluster's name")
    parser.add_argument(
        "--target-alias",
        default="target",
        metavar="NAME",
        help="the target cluster's name (the mirror's group is kbroker-mirror-<source-alias>-<target-alias>)",
    )
    parser.add_argument("--once", action="store_true", help="copy up to the source's current end, then exit")
    parser.add_argument(
        "--exactly-once",
        action="store_true",
        help="transactional copy: records and progress commit together in the target (no duplicates)",
    )
    parser.add_argument(
        "--refresh-interval", type=float, default=30.0, metavar="SECONDS", help="how often to look for new topics"
    )
    parser.add_argument(
        "--report-interval", type=float, default=10.0, metavar="SECONDS", help="how often to log the lag"
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how often to translate group offsets",
    )
    parser.set_defaults(run=run_mirror)


def run_mirror(args: argparse.Namespace) -> int:
    from kbroker.commands.connection import ClientSettings, CommandError, read_command_config
    from kbroker.mirror.policy import ReplicationPolicy
    from kbroker.mirror.replicator import Mirror, MirrorOptions, check_pattern

    for name in ("source_alias", "target_alias"):
        alias = getattr(args, name)
        if not alias or "." in alias:
            raise CommandError(f"--{name.replace('_', '-')} {alias!r}: a cluster alias is a non-empty name without '.'")
    if args.source_alias == args.target_alias:
        raise CommandError(
            f"--source-alias and --target-alias are both {args.source_alias!r}: give them different names"
        )
    for option in ("refresh_interval", "report_interval", "checkpoint_interval"):
        if getattr(args, option) <= 0:
            raise CommandError(f"--{option.replace('_', '-')} must be a positive number of seconds")

    def settings(bootstrap: str | None, config: Path | None) -> ClientSettings:
        properties = read_command_config(config) if config else {}
        return ClientSettings(bootstrap or properties.get("bootstrap.servers") or DEFAULT_BOOTSTRAP, properties)

    policy = ReplicationPolicy(
        args.rename, args.source_alias, args.target_alias, check_pattern("--topics", args.topics)
    )
    options = MirrorOptions(
        source=settings(args.source, args.source_config),
        target=settings(args.target, args.target_config),
        policy=policy,
        groups=check_pattern("--groups", args.groups) if args.groups is not None else None,
        once=args.once,
        exactly_once=args.exactly_once,
        refresh_interval=args.refresh_interval,
        report_interval=args.report_interval,
        checkpoint_interval=args.checkpoint_interval,
    )
    return Mirror(options).run()
