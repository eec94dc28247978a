"""Run a broker for tests: inside the current process on its own thread (RunningBroker), or as a child
``kbroker serve`` process (BrokerProcess). Both have the same surface: ``bootstrap``, ``data_dir``, ``start``,
``stop``, ``restart`` and use as a context manager. The pytest plugin (kbroker.pytest_plugin) builds on them.

with RunningBroker(tmp_path) as broker:
    client = KafkaProducer(bootstrap_servers=broker.bootstrap)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import trio

from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig

T = TypeVar("T")

if TYPE_CHECKING:  # kbroker.app (and the network layer) is imported when a broker is first started
    from kbroker.app import App
    from kbroker.server.listeners import ListenerPlan


class _StartedBroker:
    """What both kinds share: ``with`` starts and stops; ``restart`` stops and starts on the same data and port."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> Self:
        self.stop()
        return self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class RunningBroker(_StartedBroker):
    def __init__(
        self,
        data_dir: Path,
        overrides: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.config = BrokerConfig(overrides or {})
        self.host = host
        self.port = port
        self.broker: Broker | None = None
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._app: App | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._bound_ports: dict[str, int] = {}  # each listener's port once bound (restarts keep them)

    @property
    def bootstrap(self) -> str:
        assert self.broker is not None, "broker not started"
        return f"{self.broker.advertised.host}:{self.broker.advertised.port}"

    def start(self) -> RunningBroker:
        self._ready.clear()
        self._thread = threading.Thread(target=self._run, name="kbroker", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            error = self._error
            while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:  # trio's nursery wraps it
                error = error.exceptions[0]
            raise RuntimeError(f"broker failed to start: {error}") from self._error
        if self.broker is None:
            raise RuntimeError("broker did not start within 30 s")
        return self

    @property
    def metrics_url(self) -> str:
        """``http://HOST:PORT/metrics`` once started with ``kbroker.metrics.listen`` in the overrides (port 0: any)."""
        from kbroker.server.metrics_http import PATH, MetricsEndpoint

        assert self._app is not None, "broker not started"
        endpoint = dict(self._app.services).get("metrics")
        assert isinstance(endpoint, MetricsEndpoint) and endpoint.address is not None, "no kbroker.metrics.listen"
        return f"http://{endpoint.address[0]}:{endpoint.address[1]}{PATH}"

    def bootstrap_for(self, listener: str) -> str:
        """The advertised address of one listener (``listeners`` given in the overrides)."""
        assert self.broker is not None, "broker not started"
        address = self.broker.advertised_by_listener[listener.upper()]
        return f"{address.host}:{address.port}"

    def _listener_plan(self) -> ListenerPlan:
        """``listeners`` from the overrides (ports once bound are kept for restarts), else one PLAINTEXT listener."""
        from kbroker.server.listeners import ListenerSpec, parse_listeners, plaintext_listener

        if self.config.is_default("listeners"):
            advertised = Endpoint(self.host, self.port) if self.port else None
            return plaintext_listener(self.host, self.port, advertised)
        plan = parse_listeners(
            self.config["listeners"], self.config["advertised.listeners"], self.config.listener_settings
        )
        if self._bound_ports:
            specs = tuple(
                ListenerSpec(s.name, s.security_protocol, s.host, self._bound_ports.get(s.name, s.port), s.advertised)
                for s in plan.listeners
            )
            plan = type(plan)(specs, plan.primary)
        return plan

    def _run(self) -> None:
        from kbroker import app

        settings = app.Settings(self.config, self.data_dir, self._listener_plan())

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self._app = await nursery.start(app.run, settings)
                self.broker = self._app.broker
                if self.port == 0:
                    self.port = self.broker.advertised.port
                self._bound_ports = {name: address.port for name, address in self.broker.listeners}
                self._ready.set()

        try:
            trio.run(main)
        except BaseException as exc:  # reported to the thread that called start()
            self._error = exc
        finally:
            self._app = None
            self._ready.set()

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function(*args)`` on the broker's event loop and return what it returns: what a test does to the
        running broker's objects directly (they are the event loop's, and may wake its tasks)."""
        if self._token is None:
            raise RuntimeError("the broker is not running")
        return trio.from_thread.run_sync(function, *args, trio_token=self._token)

    def stop(self) -> None:
        """Drain and stop: in-flight requests answered, files flushed and closed."""
        if self._thread is None or self._token is None:
            return

        async def shutdown() -> None:
            if self._app is not None:
                await self._app.drain()

        try:
            trio.from_thread.run(shutdown, trio_token=self._token)
        except trio.RunFinishedError:
            pass
        self._thread.join(30)
        self._thread = None
        self._token = None

    def restart(self) -> RunningBroker:
        """Stop and start again on the same data directory and port."""
        self.stop()
        self.broker = None
        return self.start()


class BrokerProcess(_StartedBroker):
    """``kbroker serve`` as a child process on an ephemeral port (then the same port across restarts).

    Its log goes to ``<data_dir>.log`` beside the data directory. ``kill()`` ends it with SIGKILL, as a crash
    would: no drain, no final flush. ``advertised`` (HOST:PORT) is given to clients in place of the listening
    address, e.g. a proxy in front of the broker (tests/cluster); the broker then listens on the fixed ``port``.
    """

    def __init__(
        self,
        data_dir: Path,
        overrides: dict[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "WARNING",
        advertised: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.overrides = dict(overrides or {})
        BrokerConfig(self.overrides)  # a bad key fails here, with Kafka's key name, not in the child
        if advertised is not None and (port == 0 or "listeners" in self.overrides):
            # The ready file names the advertised address, so where the broker listens must be known beforehand.
            raise ValueError("an advertised address needs a fixed port and no listeners override")
        self.host = host
        self.port = port
        self.advertised = advertised
        self.log_level = log_level
        self.log_path = self.data_dir.with_name(self.data_dir.name + ".log")
        self._ready_file = self.data_dir.with_name(self.data_dir.name + ".ready")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        assert self.process is not None, "broker not started"
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        self._ready_file.unlink(missing_ok=True)
        command = [sys.executable, "-m", "kbroker", "serve"]
        if "listeners" not in self.overrides:  # else the configured listeners, the main one in the ready file
            command += ["--listen", f"{self.host}:{self.port}"]
        if self.advertised is not None:
            command += ["--advertised-listener", self.advertised]
        command += ["--data-dir", str(self.data_dir), "--ready-file", str(self._ready_file)]
        command += ["--log-level", self.log_level]
        for name, value in self.overrides.items():
            command += ["--override", f"{name}={value}"]
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while not self._ready_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"kbroker serve exited with {self.process.returncode}:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"kbroker serve did not start within {timeout:g} s:\n{self._log_tail()}")
            time.sleep(0.005)
        if self.advertised is None:  # else the ready file names the advertised address, not the listening one
            host, _, port = self._ready_file.read_text().strip().rpartition(":")
            self.port = int(port)
            if "listeners" in self.overrides:
                self.host = host
        return self

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: the broker drains (in-flight requests answered), flushes and exits."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing drained, nothing flushed beyond what was already written."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.process = None
