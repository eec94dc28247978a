"""``kbroker console``: the web console (kbroker/console/) against any Kafka-compatible cluster.

``kbroker console --bootstrap HOST:PORT --listen 127.0.0.1:8080 [--command-config FILE]`` serves the pages until
Ctrl-C; ``kbroker serve --console HOST:PORT`` runs the same console inside the broker.
"""

from __future__ import annotations

import argparse

from kbroker.commands.connection import ClientSettings, CommandError, add_client_arguments

DEFAULT_LISTEN = "127.0.0.1:8080"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "console",
        help="a web console for a cluster: topics, messages, consumer groups",
        description="Serve the web console for the cluster at --bootstrap (kbroker, Apache Kafka or any "
        "Kafka-compatible broker): overview, topics, a message browser, consumer groups with lag, creating and "
        "deleting topics.",
    )
    add_client_arguments(parser)
    parser.add_argument(
        "--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help="where to serve the pages (default %(default)s)"
    )
    parser.set_defaults(run=run_console)


def listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise CommandError(f"--listen must be HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def run_console(args: argparse.Namespace) -> int:
    import logging

    import trio

    from kbroker.console.app import serve
    from kbroker.console.cluster import Cluster

    host, port = listen_address(args.listen)
    settings = ClientSettings.from_args(args)
    settings.kafka_kwargs()  # a bad --command-config fails here, in one line, before anything listens
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("kafka").setLevel(logging.WARNING)  # the client's connection chatter; pages show failures
    trio.run(serve, Cluster(settings), host, port)
    return 0
