"""The `kbroker` command: parses arguments and reports errors; kbroker/app.py runs the broker.

The broker (trio, kbroker.app and what it imports) is imported by ``kbroker serve`` only, with the cyclic garbage
collector paused meanwhile (``import_broker``): the other commands start without it.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kbroker import __version__
from kbroker.config import BrokerConfig, ConfigError, parse_properties

if TYPE_CHECKING:
    import ssl

    from kbroker.app import Settings

log = logging.getLogger("kbroker")


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    value = text.split("://", 1)[-1]  # accept Kafka's PLAINTEXT://host:port form
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def build_parser(client_commands: bool = True) -> argparse.ArgumentParser:
    """The ``kbroker`` command line; without ``client_commands`` only serve, health and certs (``kbroker serve``
    skips building the client commands' parsers, some 20 ms of its start-up)."""
    parser = argparse.ArgumentParser(prog="kbroker", description="A Kafka-compatible broker in Python.")
    parser.add_argument("--version", action="version", version=f"kbroker {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the broker")
    serve.add_argument("--listen", default=None, help="HOST:PORT to listen on (default 127.0.0.1:9092)")
    serve.add_argument("--data-dir", type=Path, default=None, help="log directory (default ./kbroker-data)")
    serve.add_argument("--advertised-listener", default=None, help="HOST:PORT given to clients")
    serve.add_argument("--config", type=Path, default=None, help="a Kafka server.properties file")
    serve.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="set a server.properties key (repeatable)"
    )
    serve.add_argument(
        "--sasl-user",
        action="append",
        default=[],
        metavar="USER:PASSWORD",
        help="require SASL on the listener (PLAIN, SCRAM-SHA-256/512) with this user (repeatable); users an "
        "earlier start named and this one does not are removed",
    )
    serve.add_argument(
        "--tls",
        type=Path,
        default=None,
        metavar="DIR",
        help="serve the listener over TLS with DIR/broker.pem and DIR/ca.pem (as `kbroker certs` writes them)",
    )
    serve.add_argument(
        "--console", default=None, metavar="HOST:PORT", help="serve the web console here (reads this broker)"
    )
    serve.add_argument(
        "--metrics-listen", default=None, metavar="HOST:PORT", help="serve Prometheus metrics at GET /metrics here"
    )
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument(
        "--ready-file", type=Path, default=None, help="once listening, write the advertised HOST:PORT to this file"
    )
    health = sub.add_parser("health", help="check that a broker answers ApiVersions and Metadata (exit 0 if so)")
    health.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of the broker (default %(default)s)")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds for one check (default %(default)s)")
    health.add_argument("--wait", type=float, default=0.0, help="retry for up to this many seconds (default: once)")
    health.add_argument(
        "--command-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="client properties for an SSL listener (security.protocol=SSL, ssl.truststore.location, ...)",
    )
    certs = sub.add_parser("certs", help="write a throwaway CA, broker and client certificates for local TLS (PEM)")
    certs.add_argument("--dir", type=Path, default=Path("kbroker-certs"), help="where to write (default %(default)s)")
    certs.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="broker host name or IP (repeatable; default localhost and 127.0.0.1)",
    )
    certs.add_argument("--client", action="append", default=[], metavar="NAME", help="a client certificate, CN=NAME")
    certs.add_argument("--days", type=int, default=365, help="validity in days (default %(default)s)")
    if client_commands:
        from kbroker.commands import register_all  # client commands: topics, produce, consume, groups, mirror, ...

        register_all(sub)
    return parser


PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def parse_sasl_users(items: list[str]) -> list[tuple[str, str]]:
    users = []
    for item in items:
        user, sep, password = item.partition(":")
        if not sep or not user or not password:
            raise ConfigError(f"--sasl-user expects USER:PASSWORD, got {item!r}")
        # The name becomes a JAAS option name (user_<name>): only JAAS word characters, so that it cannot add users.
        if not all(c.isascii() and (c.isalnum() or c in "._-$") for c in user):
            raise ConfigError(f"--sasl-user {user!r}: a user name here is letters, digits and . _ - $ only")
        users.append((user, password))
    return users


def _jaas_quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def security_overrides(args: argparse.Namespace, users: list[tuple[str, str]]) -> list[str]:
    """The server.properties lines ``--sasl-user`` and ``--tls`` stand for: the --listen listener (127.0.0.1:9092
    by default) becomes SASL_PLAINTEXT, SSL or SASL_SSL, with PLAIN's users in its JAAS config (the SCRAM users are
    stored at start-up: kbroker.app.build) and the key and trust stores of ``kbroker certs``."""
    if not users and args.tls is None:
        return []
    if args.config is not None and "listeners" in parse_properties(args.config.read_text(), str(args.config)):
        raise ConfigError(
            "--sasl-user and --tls secure the --listen listener; with 'listeners' in the config, set the security "
            "keys there (README: Security)"
        )
    protocol = ("SASL_SSL" if users else "SSL") if args.tls is not None else "SASL_PLAINTEXT"
    address = (args.listen or "127.0.0.1:9092").split("://", 1)[-1]
    lines = [f"listeners={protocol}://{address}"]
    if users:
        jaas = " ".join(f"user_{user}={_jaas_quoted(password)}" for user, password in users)
        lines += [
            "sasl.enabled.mechanisms=PLAIN," + ",".join(SCRAM_MECHANISMS),
            f"listener.name.{protocol.lower()}.plain.sasl.jaas.config={PLAIN_LOGIN_MODULE} required {jaas};",
        ]
    if args.tls is not None:
        for name in ("broker.pem", "ca.pem"):
            if not (args.tls / name).is_file():
                raise ConfigError(f"--tls {args.tls}: no {name} there (write one with: kbroker certs --dir {args.tls})")
        lines += [
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={args.tls / 'broker.pem'}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={args.tls / 'ca.pem'}",
        ]
    return lines


def resolve_settings(args: argparse.Namespace) -> Settings:
    """Config, data directory, the listeners to serve and the main listener's advertised address if the command
    line gives it. ``--listen`` (with ``--advertised-listener``) is one PLAINTEXT listener in place of the config's
    ``listeners``, secured with ``--sasl-user`` / ``--tls``; otherwise the config's listener keys are parsed
    (kbroker/server/listeners.py)."""
    from kbroker.app import Settings
    from kbroker.broker import Endpoint
    from kbroker.server.listeners import parse_listeners, plaintext_listener

    users = parse_sasl_users(getattr(args, "sasl_user", []))
    secured = security_overrides(args, users) if hasattr(args, "tls") else []
    metrics = [f"kbroker.metrics.listen={args.metrics_listen}"] if getattr(args, "metrics_listen", None) else []
    config = BrokerConfig.load(args.config, [*args.override, *secured, *metrics])
    data_dir = args.data_dir or Path(config["log.dirs"].split(",")[0] or config["log.dir"] or "kbroker-data")
    advertised = None
    if args.advertised_listener:
        advertised = Endpoint(*parse_host_port(args.advertised_listener, "--advertised-listener"))
    if args.listen and not secured:
        host, port = parse_host_port(args.listen.split(",")[0], "--listen")
        advertised_text = config["advertised.listeners"].split(",")[0]
        if advertised is None and advertised_text:
            advertised = Endpoint(*parse_host_port(advertised_text, "--advertised-listener"))
        return Settings(config, data_dir, plaintext_listener(host, port, advertised))
    plan = parse_listeners(
        config["listeners"] or "127.0.0.1:9092", config["advertised.listeners"], config.listener_settings
    )
    return Settings(config, data_dir, plan, advertised, scram_users=tuple(users))


def health_command(args: argparse.Namespace) -> int:
    from kbroker.health import NotReady, check, wait_until_ready

    try:
        context = health_ssl_context(args.command_config)
    except (ConfigError, ValueError) as exc:
        print(f"kbroker health: {exc}", file=sys.stderr)
        return 2
    try:
        if args.wait > 0:
            health = wait_until_ready(args.bootstrap, args.wait, ssl_context=context)
        else:
            health = check(args.bootstrap, args.timeout, context)
    except (NotReady, TimeoutError) as exc:
        print(f"kbroker health: not ready: {exc}", file=sys.stderr)
        return 1
    print(health.summary())
    return 0


def health_ssl_context(command_config: Path | None) -> ssl.SSLContext | None:
    """The TLS context ``kbroker health --command-config`` checks an SSL listener with (None: plaintext)."""
    if command_config is None:
        return None
    from kbroker.commands.connection import CommandError, read_command_config, security_kwargs

    try:
        properties = read_command_config(command_config)
        protocol = properties.get("security.protocol", "PLAINTEXT").upper()
        if protocol.startswith("SASL"):
            raise ValueError(
                f"--command-config: {protocol}: the health check does not log in; check the listener with "
                "kbroker topics list --command-config, or give the broker a PLAINTEXT or SSL listener for checks"
            )
        context: ssl.SSLContext | None = security_kwargs(properties).get("ssl_context")
    except CommandError as exc:
        raise ValueError(str(exc)) from None
    return context


def certs_command(args: argparse.Namespace) -> int:
    """``kbroker certs``: write the certificates, print server.properties lines and client settings."""
    from kbroker.security import certs

    try:
        written = certs.generate(args.dir, args.host or None, args.client, args.days)
    except certs.CertsError as exc:
        print(f"kbroker: {exc}", file=sys.stderr)
        return 1
    host = (args.host or certs.DEFAULT_HOSTS)[0]
    print(f"# Certificates in {written.directory.resolve()} (a throwaway CA: for development only)")
    print("# server.properties (kbroker serve --config server.properties, or Apache Kafka)")
    print(certs.server_properties(written, host))
    print(certs.client_settings(written))
    return 0


def seconds_since_process_start() -> float | None:
    """How long ago this process started (Linux: /proc/self/stat against the boot clock); None if unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Field 22, starttime in clock ticks after boot; the name in field 2 may hold spaces, so count from ")".
        start_ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def process_started_at() -> float:
    """When this process started, on the time.perf_counter() clock (else when the kbroker package loaded)."""
    age = seconds_since_process_start()
    if age is None or age < 0:
        from kbroker import IMPORTED_AT

        return IMPORTED_AT
    return time.perf_counter() - age


# What to do about a damaged file that stops start-up, by file name (the others: DAMAGED_FILE_FIX).
DAMAGED_FILE_FIXES = {
    "topics.json": (
        "restore it from a backup, or move it out of the data directory and kbroker rebuilds it from the "
        "partition directories (topic config overrides are not recovered)"
    ),
    "meta.properties": (
        "restore it from a backup, or write its lines again: version=1, cluster.id=<this cluster's id>, "
        "node.id=<this broker's node.id> (moved aside instead, the broker starts as a new cluster)"
    ),
    "replication-offset-checkpoint": (
        "move it out of the data directory: each partition's high watermark then starts from its log start offset, "
        "and its leader moves it to its log end"
    ),
    "producer-id-block": (
        "restore it from a backup, or write in its place a decimal number above every producer id this broker "
        "handed out (moved aside instead, producer ids are handed out again from 0)"
    ),
    "finalized-features.json": (
        "restore it from a backup, or move it out of the data directory (transaction.version is then finalized at "
        "2, the default)"
    ),
}
DAMAGED_FILE_FIX = "restore it from a backup, or move it out of the data directory"


def error_line(exc: BaseException, data_dir: Path | None = None) -> str | None:
    """The one line a start-up failure is reported with (None: not one of those, let it propagate). An OSError
    that names no file (a failed write says only "No space left on device") names ``data_dir``."""
    from kbroker.app import ListenError
    from kbroker.durable.files import DamagedFileError, StorageError

    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:  # trio's nurseries wrap errors
        exc = exc.exceptions[0]
    if isinstance(exc, DamagedFileError):
        return f"kbroker: {exc}; to fix: {DAMAGED_FILE_FIXES.get(exc.path.name, DAMAGED_FILE_FIX)}"
    if isinstance(exc, ListenError | StorageError):
        return f"kbroker: {exc}"
    if isinstance(exc, ConfigError):
        return f"kbroker: configuration error: {exc}"
    if "kbroker.kraft" in sys.modules:  # a broker under a KRaft quorum (process.roles=broker)
        from kbroker.kraft import BrokerRoleError

        if isinstance(exc, BrokerRoleError):
            return f"kbroker: {exc}"
    if isinstance(exc, OSError):
        if exc.filename is not None:
            where = f": {exc.filename}"
        else:
            where = f" (data directory {data_dir})" if data_dir is not None else ""
        return f"kbroker: {exc.strerror or exc}{where}"
    return None


def import_broker() -> None:
    """Import the broker's modules (some 300 with trio's: most of ``kbroker serve``'s start-up) with the cyclic
    garbage collector paused, then move what they made to the permanent generation.

    Importing makes long-lived objects (modules, classes, functions) and next to no garbage, yet every few hundred
    allocations a collection walks them, more of them each time. Frozen, the full collections of the running broker
    do not walk them either."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        import trio  # noqa: F401

        from kbroker import app  # noqa: F401
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def main(argv: list[str] | None = None) -> int:
    started_at = process_started_at()
    arguments = sys.argv[1:] if argv is None else argv
    args = build_parser(client_commands=arguments[:1] != ["serve"]).parse_args(arguments)
    if getattr(args, "run", None) is not None:
        from kbroker.commands import run

        return run(args)
    if args.command == "health":
        return health_command(args)
    if args.command == "certs":
        return certs_command(args)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    import_broker()
    import trio

    from kbroker import app

    try:
        settings = resolve_settings(args)
        if args.console:
            settings = settings._replace(console=parse_host_port(args.console, "--console"))
        settings.security  # noqa: B018 - TLS and SASL settings are checked before anything is opened
    except ConfigError as exc:
        print(f"kbroker: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(
            lambda: app.run(
                settings,
                install_signal_handlers=True,
                started_at=started_at,
                ready_file=args.ready_file,
            )
        )
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        line = error_line(exc, settings.data_dir)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
