"""The client commands of ``kbroker``: tools that speak Kafka's protocol as a client, so they work against any
Kafka-compatible broker (kbroker, Apache Kafka, Tansu), as Kafka's kafka-topics.sh, kafka-console-producer.sh and
friends do.

One module per family, each with ``register(subparsers)`` that adds its subcommands and sets ``run`` (a function
of the parsed arguments returning the exit code) on each:

- ``topics``: kbroker topics list|describe|create|delete|alter
- ``records``: kbroker produce / kbroker consume
- ``groups``: kbroker groups list|describe|delete|reset-offsets
- ``configs``: kbroker configs describe|alter
- ``acls``: kbroker acls list|create|delete
- ``transactions``: kbroker transactions list|describe|find-hanging|abort
- ``mirror``: kbroker mirror (kbroker/mirror/ does the work)
- ``console``: kbroker console (kbroker/console/ does the work)
- ``format``: kbroker format (a broker's log directories for a KRaft cluster, as kafka-storage format)
- ``cluster``: kbroker cluster (kbroker/kraft/local_cluster.py does the work)

Module-level imports here stay light (argparse and the standard library): ``kbroker serve`` parses the same
command line and its start-up time counts. kafka-python, rich and the web stack are imported when a command runs.
``connection`` turns ``--bootstrap``/``--command-config`` into client settings, ``output`` prints tables or JSON,
and ``run`` (below) reports every failure as one line with the broker's error code name.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

COMMAND_MODULES = (
    "topics",
    "records",
    "groups",
    "configs",
    "acls",
    "transactions",
    "mirror",
    "console",
    "format",
    "cluster",
)

Runner = Callable[[argparse.Namespace], int]


def register_all(subparsers: argparse._SubParsersAction) -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"kbroker.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"kbroker.commands.{name}":
                raise
            continue  # a family not written yet
        module.register(subparsers)


def run(args: argparse.Namespace) -> int:
    """Run the command ``args.run`` names; any failure becomes one line on stderr (exit 1), Ctrl-C exit 130."""
    from kbroker.commands.connection import ClientLog, failure_line

    runner: Runner = args.run
    client_log = ClientLog()
    client_log.install()
    try:
        return runner(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kbroker consume ... | head`: the reader left, which is not an error
        sys.stderr.close()
        return 0
    except Exception as exc:
        line = failure_line(exc, client_log)
        if line is None:
            raise
        print(f"kbroker {args.command}: {line}", file=sys.stderr)
        return 1
    finally:
        client_log.uninstall()
