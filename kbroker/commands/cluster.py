"""``kbroker cluster``: a local KRaft cluster, Apache Kafka's controller quorum and N kbroker brokers under it
(kbroker/kraft/local_cluster.py does the work)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cluster",
        help="run a local cluster: Apache Kafka's KRaft controllers (Java 17+) and N kbroker brokers",
        description="Format (the first time) and start a KRaft controller quorum of Apache Kafka and N kbroker "
        "brokers on local ports; Ctrl-C or SIGTERM stops the brokers, then the controllers. A second run on the "
        "same --dir starts the same cluster again, with its data.",
    )
    parser.add_argument("--brokers", type=int, default=None, help="kbroker brokers (default 3; then as before)")
    parser.add_argument(
        "--controllers", type=int, default=None, choices=[1, 3], help="Kafka controllers (default 1; then as before)"
    )
    parser.add_argument(
        "--dir", type=Path, default=Path("kbroker-cluster"), help="the cluster's directory (default %(default)s)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        metavar="BASE",
        help="brokers listen on BASE, BASE+1, ..., the controllers on the ports after them (default 9092; 0: any "
        "free ports, kept for the next run)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from kbroker.kraft import local_cluster

    return local_cluster.run(args.dir, args.brokers, args.controllers, args.port, lambda line: print(line, flush=True))
