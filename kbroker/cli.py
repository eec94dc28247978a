"""The `kbroker` command."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

import trio

from kbroker import __version__
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig, ConfigError
from kbroker.server.listeners import ListenerPlan, parse_listeners, plaintext_listener
from kbroker.storage.files import StorageError

log = logging.getLogger("kbroker")


class ListenError(Exception):
    """The listener could not be opened; the message names the address and the reason."""


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    value = text.split("://", 1)[-1]  # accept Kafka's PLAINTEXT://host:port form
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def build_parser() -> argparse.ArgumentParser:
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
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument(
        "--ready-file", type=Path, default=None, help="once listening, write the advertised HOST:PORT to this file"
    )
    health = sub.add_parser("health", help="check that a broker answers ApiVersions and Metadata (exit 0 if so)")
    health.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of the broker (default %(default)s)")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds for one check (default %(default)s)")
    health.add_argument("--wait", type=float, default=0.0, help="retry for up to this many seconds (default: once)")
    return parser


def resolve_settings(args: argparse.Namespace) -> tuple[BrokerConfig, Path, ListenerPlan, Endpoint | None]:
    """Config, data directory, the listeners to serve and the main listener's advertised address if the command
    line gives it. ``--listen`` (with ``--advertised-listener``) is one PLAINTEXT listener in place of the config's
    ``listeners``; otherwise the config's listener keys are parsed (kbroker/server/listeners.py)."""
    config = BrokerConfig.load(args.config, args.override)
    data_dir = args.data_dir or Path(config["log.dirs"].split(",")[0] or config["log.dir"] or "kbroker-data")
    advertised = None
    if args.advertised_listener:
        advertised = Endpoint(*parse_host_port(args.advertised_listener, "--advertised-listener"))
    if args.listen:
        host, port = parse_host_port(args.listen.split(",")[0], "--listen")
        advertised_text = config["advertised.listeners"].split(",")[0]
        if advertised is None and advertised_text:
            advertised = Endpoint(*parse_host_port(advertised_text, "--advertised-listener"))
        return config, data_dir, plaintext_listener(host, port, advertised), None
    plan = parse_listeners(
        config["listeners"] or "127.0.0.1:9092", config["advertised.listeners"], config.listener_settings
    )
    return config, data_dir, plan, advertised


async def run_broker(
    config: BrokerConfig,
    data_dir: Path,
    listen: tuple[str, int] | ListenerPlan,
    advertised: Endpoint | None,
    *,
    task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED,
    install_signal_handlers: bool = False,
    started_at: float | None = None,
    ready_file: Path | None = None,
) -> None:
    """Run until cancelled or signalled; reports the ready broker through ``task_status``.

    ``listen`` is one PLAINTEXT listener's address (``advertised`` its advertised one) or a plan of several
    listeners (``advertised``, if given, then replaces the main listener's advertised address).
    """
    from kbroker.server.connection import ListenerInfo, ServedListener, serve

    if isinstance(listen, ListenerPlan):
        plan = listen if advertised is None else listen.with_advertised(listen.primary, advertised)
    else:
        plan = plaintext_listener(listen[0], listen[1], advertised)
    served: list[ServedListener] = []
    try:
        for spec in plan.listeners:  # one accept loop per socket, each connection knowing its listener
            try:
                sockets = await trio.open_tcp_listeners(spec.port, host=spec.host)
            except OSError as exc:
                raise ListenError(f"cannot listen on {spec.host}:{spec.port}: {exc.strerror or exc}") from exc
            served.append(ServedListener(ListenerInfo(spec.name, spec.security_protocol), sockets))
        bound = {item.info.name: item.sockets[0].socket.getsockname()[1] for item in served}
        main = plan.primary_listener
        bound_port = bound[main.name]
        advertised = main.advertised_address(bound_port)
        broker = Broker(config, data_dir, advertised)
    except BaseException:
        for item in served:
            for listener in item.sockets:
                listener.socket.close()
        raise
    listen = (main.host, bound_port)
    broker.listen = Endpoint(main.host, bound_port)
    broker.listeners = [(spec.name, Endpoint(spec.host, bound[spec.name])) for spec in plan.listeners]
    broker.advertised_by_listener = {spec.name: spec.advertised_address(bound[spec.name]) for spec in plan.listeners}
    for spec in plan.listeners:
        if len(plan.listeners) > 1:
            ad = broker.advertised_by_listener[spec.name]
            log.info("listener %s on %s:%d, advertised %s:%d", spec.name, spec.host, bound[spec.name], ad.host, ad.port)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, broker, served)
            nursery.start_soon(broker.retention_loop)
            nursery.start_soon(broker.flush_loop)
            nursery.start_soon(broker.groups.run)
            nursery.start_soon(broker.consumer_groups.run)
            nursery.start_soon(broker.offset_expiry_loop)
            with contextlib.ExitStack() as stack:
                # Signals are caught before readiness is announced: a SIGTERM right after the ready line drains.
                signals = (
                    stack.enter_context(trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM))
                    if install_signal_handlers
                    else None
                )
                elapsed = f" in {time.perf_counter() - started_at:.2f}s" if started_at is not None else ""
                log.info(
                    "kbroker ready%s: listening on %s:%d (advertised %s:%d), data dir %s, cluster id %s",
                    elapsed,
                    listen[0],
                    bound_port,
                    advertised.host,
                    advertised.port,
                    data_dir,
                    broker.cluster_id,
                )
                if ready_file is not None:  # written whole, then renamed: a reader never sees half an address
                    partial = ready_file.with_name(ready_file.name + ".partial")
                    partial.write_text(f"{advertised.host}:{advertised.port}\n")
                    partial.replace(ready_file)
                task_status.started(broker)
                if signals is not None:
                    async for signum in signals:
                        log.info("received %s: shutting down", signal.Signals(signum).name)
                        break
                    await drain(broker, nursery)
    finally:
        broker.close()


async def drain(broker: Broker, nursery: trio.Nursery, grace_seconds: float = 5.0) -> None:
    """Stop accepting, let in-flight requests be answered, then cancel what is left."""
    broker.begin_drain()
    with trio.move_on_after(grace_seconds):
        while broker.open_connections:
            await trio.sleep(0.01)
    nursery.cancel_scope.cancel()


def raise_open_file_limit() -> None:
    """Every partition holds open segment files and every client a socket: lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
    except (ImportError, ValueError, OSError) as exc:  # not POSIX, or not allowed: run with what there is
        log.debug("open file limit unchanged: %s", exc)


def health_command(args: argparse.Namespace) -> int:
    from kbroker.health import NotReady, check, wait_until_ready

    try:
        health = wait_until_ready(args.bootstrap, args.wait) if args.wait > 0 else check(args.bootstrap, args.timeout)
    except (NotReady, TimeoutError) as exc:
        print(f"kbroker health: not ready: {exc}", file=sys.stderr)
        return 1
    print(health.summary())
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


def error_line(exc: BaseException) -> str | None:
    """The one line a start-up failure is reported with (None: not one of those, let it propagate)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:  # trio's nurseries wrap errors
        exc = exc.exceptions[0]
    if isinstance(exc, ListenError | StorageError):
        return f"kbroker: {exc}"
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename is not None else ""
        return f"kbroker: {exc.strerror or exc}{where}"
    return None


def main(argv: list[str] | None = None) -> int:
    started_at = process_started_at()
    args = build_parser().parse_args(argv)
    if args.command == "health":
        return health_command(args)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    raise_open_file_limit()
    try:
        config, data_dir, listen, advertised = resolve_settings(args)
    except ConfigError as exc:
        print(f"kbroker: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(
            lambda: run_broker(
                config,
                data_dir,
                listen,
                advertised,
                install_signal_handlers=True,
                started_at=started_at,
                ready_file=args.ready_file,
            )
        )
    except KeyboardInterrupt:
        pass
    except Exception as exc:
        line = error_line(exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
