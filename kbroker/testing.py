"""Run a broker inside the current process, on its own thread: for tests and the pytest plugin.

with RunningBroker(tmp_path) as broker:
    client = KafkaProducer(bootstrap_servers=broker.bootstrap)
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

import trio

from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig


class RunningBroker:
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
        self._cancel: trio.CancelScope | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

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
            raise RuntimeError("broker failed to start") from self._error
        if self.broker is None:
            raise RuntimeError("broker did not start within 30 s")
        return self

    def _run(self) -> None:
        from kbroker.cli import run_broker

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with trio.CancelScope() as scope:
                self._cancel = scope
                async with trio.open_nursery() as nursery:
                    advertised = Endpoint(self.host, self.port) if self.port else None
                    self.broker = await nursery.start(
                        run_broker, self.config, self.data_dir, (self.host, self.port), advertised
                    )
                    if self.port == 0:
                        self.port = self.broker.advertised.port
                    self._ready.set()

        try:
            trio.run(main)
        except BaseException as exc:  # reported to the thread that called start()
            self._error = exc
        finally:
            self._ready.set()

    def stop(self) -> None:
        """Drain and stop: in-flight requests answered, files flushed and closed."""
        if self._thread is None or self._token is None:
            return

        async def shutdown() -> None:
            assert self.broker is not None and self._cancel is not None
            self.broker.begin_drain()
            with trio.move_on_after(5):
                while self.broker.open_connections:
                    await trio.sleep(0.01)
            self._cancel.cancel()

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

    def __enter__(self) -> RunningBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
