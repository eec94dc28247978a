"""The composition root: builds the broker, its background services and the network server, and owns their
lifecycle. ``kbroker serve`` (kbroker/cli.py), RunningBroker (kbroker/testing.py) and the pytest plugin all run a
broker through ``run``.

Start-up: the listeners are bound, the Broker (storage, offsets, group coordinators) is built on the data
directory, then the services are started one by one with ``nursery.start`` in a fixed order (retention, flush,
the coordinators' timers, offset expiry, the log cleaner, then the server accepting connections);
each reports ``started`` once it runs. A background service that fails once started is logged and started again
after a pause (``supervise``): no background failure ends the broker (the services already survive what their
ticks meet; this is the last line). Shutdown is in one place: ``App.drain`` stops accepting, lets every open
connection answer what it already received and close, waits for that up to a deadline, then ``App.stop``
cancels every service at once.

The layers below never import this module or each other upwards: kbroker.broker, kbroker.storage and
kbroker.groups import neither kbroker.server nor kbroker.apis (tests/broker/test_app.py checks it).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

import trio

from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig, ConfigError
from kbroker.metadata.controller import SECURITY_PROTOCOL_IDS, Listener
from kbroker.server.connection import ListenerInfo, ServedListener, serve
from kbroker.server.limits import raise_open_file_limit
from kbroker.server.listener_security import ListenerSecurity, listener_security
from kbroker.server.listeners import ListenerPlan
from kbroker.services import Service, background_services

log = logging.getLogger("kbroker")

DRAIN_SECONDS = 5.0
RESTART_SECONDS = (1.0, 30.0)  # a failed service is started again after 1 s, doubling up to 30 s


class ListenError(Exception):
    """The listener could not be opened; the message names the address and the reason."""


class _SettingsFields(NamedTuple):  # Settings' fields: a NamedTuple is cheaper to create at start-up than a dataclass
    config: BrokerConfig
    data_dir: Path
    listeners: ListenerPlan
    advertised: Endpoint | None = None
    scram_users: tuple[tuple[str, str], ...] = ()  # ``--sasl-user``: made the command line's SCRAM users at start-up
    console: tuple[str, int] | None = None  # ``--console HOST:PORT``: the web console, as one of the services


class Settings(_SettingsFields):
    """What to run: the config, the data directory and the listeners to serve. ``advertised``, if given,
    replaces the main listener's advertised address (``--advertised-listener``).

    A subclass of its fields for the instance dictionary ``security`` is cached in (``_replace`` makes a new
    Settings, with nothing cached)."""

    @cached_property
    def security(self) -> dict[str, ListenerSecurity]:
        """Each listener's TLS context and SASL settings; ConfigError for a mistake (checked before start-up)."""
        served = {spec.name for spec in self.listeners.listeners}
        # A controller listener's settings are this broker's as a client of the controllers (node_security.py).
        controllers = (
            {n.strip().upper() for n in (self.config["controller.listener.names"] or "").split(",")}
            if self.config["process.roles"] == "broker"
            else set()
        )
        for name in sorted(set(self.config.listener_overrides) - served - controllers):
            log.warning("listener.name.%s.* settings name no listener this broker serves: not applied", name.lower())
        return {spec.name: listener_security(spec, self.config) for spec in self.listeners.listeners}


class Server:
    """The network layer as a service: accepts on every listener until draining, serves each connection."""

    def __init__(self, broker: Broker, listeners: list[ServedListener]) -> None:
        self.broker = broker
        self.listeners = listeners
        self.finished = trio.Event()  # set once accepting stopped and every connection ended

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await serve(self.broker, self.listeners)
        finally:
            self.finished.set()


class App:
    """A built broker and its services; ``run`` starts them all, ``drain`` and ``stop`` end them."""

    def __init__(self, broker: Broker, listeners: list[ServedListener]) -> None:
        self.broker = broker
        self.server = Server(broker, listeners)
        self.services: list[tuple[str, Service]] = [*background_services(broker), ("server", self.server)]
        self.started: list[str] = []  # names of the services running, in the order they started
        self._scope = trio.CancelScope()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every service in order, report started, and run until stopped. A service failing at start-up
        stops the start; a background one failing later is started again (the server is not: its listeners
        close with it, and a failure there ends the broker)."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                for name, service in self.services:
                    if name == "server":
                        await nursery.start(service.run)
                    else:
                        await nursery.start(supervise, name, service)
                    self.started.append(name)
                task_status.started()

    def stop(self) -> None:
        """Cancel every service: the one place they are stopped."""
        self._scope.cancel()

    async def drain(self, grace_seconds: float = DRAIN_SECONDS) -> None:
        """Stop accepting, let in-flight requests be answered and connections close, then stop everything.
        A broker under a KRaft quorum first shuts down under control: leadership moves away while it still serves."""
        if self.broker.kraft is not None:
            await self.broker.kraft.controlled_shutdown()
        self.broker.begin_drain()
        with trio.move_on_after(grace_seconds):
            await self.server.finished.wait()
        self.stop()


class _ReportOnce:
    """Passes a service's first ``started`` on to whoever started it; a restarted service reports to nobody."""

    def __init__(self, task_status: trio.TaskStatus[None]) -> None:
        self.task_status: trio.TaskStatus[None] | None = task_status

    @property
    def reported(self) -> bool:
        return self.task_status is None

    def started(self, value: None = None) -> None:
        task_status = self.task_status
        if task_status is not None:
            self.task_status = None
            task_status.started(value)


async def supervise(
    name: str, service: Service, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run ``service``. What it raises before it reports started is raised (start-up fails); once started, an
    exception ending it is logged (with its traceback the first time) and it is started again after a pause that
    grows while it keeps failing."""
    status = _ReportOnce(task_status)
    logged: set[tuple[type[BaseException], str]] = set()
    first_pause, max_pause = RESTART_SECONDS
    pause = first_pause
    while True:
        began = trio.current_time()
        try:
            await service.run(task_status=status)
        except Exception as exc:
            if not status.reported:
                raise
            kind = (type(exc), str(exc))
            if kind in logged:
                log.error("service %s failed again: %s; restarting it in %g s", name, exc, pause)
            else:
                logged.add(kind)
                log.exception("service %s failed; restarting it in %g s", name, pause)
        else:
            if not status.reported:
                return  # it never started: nursery.start reports that
            log.error("service %s stopped on its own; restarting it in %g s", name, pause)
        await trio.sleep(pause)
        # A service that ran a good while before failing starts again soon; one failing at once waits longer.
        pause = first_pause if trio.current_time() - began > max_pause + pause else min(pause * 2, max_pause)


async def open_listeners(settings: Settings) -> list[ServedListener]:
    """Bind every listener (one accept socket set each); ListenError names the one that failed."""
    served: list[ServedListener] = []
    security = settings.security
    try:
        for spec in settings.listeners.listeners:
            try:
                sockets = await trio.open_tcp_listeners(spec.port, host=spec.host)
            except OSError as exc:
                raise ListenError(f"cannot listen on {spec.host}:{spec.port}: {exc.strerror or exc}") from exc
            info = ListenerInfo(spec.name, spec.security_protocol, security[spec.name])
            served.append(ServedListener(info, sockets))
    except BaseException:
        close_listeners(served)
        raise
    return served


def close_listeners(served: list[ServedListener]) -> None:
    for item in served:
        for listener in item.sockets:
            listener.socket.close()


def build(settings: Settings, served: list[ServedListener]) -> App:
    """The broker on the data directory, told the addresses its listeners are bound to, and its services."""
    plan = settings.listeners
    if settings.advertised is not None:
        plan = plan.with_advertised(plan.primary, settings.advertised)
    bound = {item.info.name: item.sockets[0].socket.getsockname()[1] for item in served}
    main = plan.primary_listener
    registration = [
        Listener(spec.name, address.host, address.port, SECURITY_PROTOCOL_IDS.get(spec.security_protocol, 0))
        for spec in plan.listeners
        for address in (spec.advertised_address(bound[spec.name]),)
    ]
    if os.environ.get("KBROKER_TEST_MUTATIONS"):  # the fault suite's broken brokers (kbroker/replication/mutations.py)
        from kbroker.replication.mutations import install_from_environment

        install_from_environment()
    broker = Broker(
        settings.config, settings.data_dir, main.advertised_address(bound[main.name]), listeners=registration
    )
    try:
        scram_users = broker.configure_sasl_users(settings.scram_users)
    except ValueError as exc:
        broker.close()
        raise ConfigError(f"--sasl-user {exc}") from None
    log_scram_users(*scram_users)
    broker.listen = Endpoint(main.host, bound[main.name])
    broker.listeners = [(spec.name, Endpoint(spec.host, bound[spec.name])) for spec in plan.listeners]
    broker.advertised_by_listener = {spec.name: spec.advertised_address(bound[spec.name]) for spec in plan.listeners}
    for spec in plan.listeners:
        if len(plan.listeners) > 1:
            ad = broker.advertised_by_listener[spec.name]
            log.info("listener %s on %s:%d, advertised %s:%d", spec.name, spec.host, bound[spec.name], ad.host, ad.port)
    app = App(broker, served)
    if broker.kraft is not None:  # first: the server accepts clients only once the controller unfenced the broker
        app.services.insert(0, ("kraft", broker.kraft))
    if settings.config["kbroker.metrics.listen"]:  # --metrics-listen; prometheus_client is imported only then
        from kbroker.server.metrics_http import MetricsEndpoint

        # Before the server: a metrics port in use stops start-up before any client is accepted.
        app.services.insert(-1, ("metrics", MetricsEndpoint(broker, settings.config["kbroker.metrics.listen"])))
    if settings.console is not None:
        from kbroker.console.app import ConsoleService  # the web stack is imported only when a console is asked for

        app.services.append(("console", ConsoleService.for_broker(broker, plan.listeners, settings.console)))
    return app


def log_scram_users(removed: list[str], from_command_line: list[str], from_api: list[str]) -> None:
    """Which SCRAM users exist, by who created them (names only, never a password)."""
    if removed:
        log.warning("SCRAM users deleted, no longer named by --sasl-user: %s", ", ".join(removed))
    if from_command_line or from_api:
        log.info(
            "SCRAM users: from --sasl-user: %s; from AlterUserScramCredentials: %s",
            ", ".join(from_command_line) or "none",
            ", ".join(from_api) or "none",
        )


def write_ready_file(path: Path, address: Endpoint) -> None:
    """Written whole, then renamed: a reader never sees half an address."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(f"{address.host}:{address.port}\n")
    partial.replace(path)


async def run(
    settings: Settings,
    *,
    task_status: trio.TaskStatus[App] = trio.TASK_STATUS_IGNORED,
    install_signal_handlers: bool = False,
    started_at: float | None = None,
    ready_file: Path | None = None,
) -> None:
    """Run a broker until cancelled, stopped or signalled; reports the running App through ``task_status``.

    With ``install_signal_handlers``, SIGINT or SIGTERM drains and returns.
    """
    # Every connection and open segment is a descriptor: use all the process may have, as the JVM does.
    raised = raise_open_file_limit()
    if raised is not None:
        log.info("raised the open-file limit from %s to %s (as the JVM does for Kafka)", *raised)
    served = await open_listeners(settings)
    try:
        app = build(settings, served)
    except BaseException:
        close_listeners(served)
        raise
    broker = app.broker
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(app.run)
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
                    broker.listen.host,
                    broker.listen.port,
                    broker.advertised.host,
                    broker.advertised.port,
                    settings.data_dir,
                    broker.cluster_id,
                )
                if ready_file is not None:
                    write_ready_file(ready_file, broker.advertised)
                task_status.started(app)
                if signals is not None:
                    async for signum in signals:
                        log.info("received %s: shutting down", signal.Signals(signum).name)
                        break
                    await app.drain()
    finally:
        close_listeners(served)  # those the server never took over (it closes its own)
        broker.close()
