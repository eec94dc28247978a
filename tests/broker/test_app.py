"""The composition root (kbroker/app.py): every service starts and reports it, cancelling the app stops them
all with no task left behind, draining answers connections within its deadline, and the core layers never
import the network or handler layers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from kbroker import app
from kbroker.config import BrokerConfig
from kbroker.server.listeners import plaintext_listener

SERVICES = [
    "retention",
    "flush",
    "high-watermark-checkpoint",
    "coordinator-timers",
    "offset-expiry",
    "log-cleaner",
    "server",
]


class TaskCounter(trio.abc.Instrument):
    """Counts the tasks spawned and exited while installed."""

    def __init__(self) -> None:
        self.alive: set[trio.lowlevel.Task] = set()
        self.spawned = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.alive.add(task)
        self.spawned += 1

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.alive.discard(task)


def _settings(tmp_path: Path) -> app.Settings:
    return app.Settings(BrokerConfig({}), tmp_path / "data", plaintext_listener("127.0.0.1", 0))


def test_the_app_starts_every_service_in_order_and_cancelling_it_leaves_no_task(tmp_path: Path) -> None:
    counter = TaskCounter()
    seen: dict[str, object] = {}

    async def main() -> None:
        trio.lowlevel.add_instrument(counter)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                running = await nursery.start(app.run, _settings(tmp_path))
                seen["started"] = list(running.started)
                seen["tasks while running"] = len(counter.alive)
                scope.cancel()
        seen["nursery exited"] = True
        trio.lowlevel.remove_instrument(counter)

    trio.run(main)
    assert seen["started"] == SERVICES
    assert isinstance(seen["tasks while running"], int) and seen["tasks while running"] >= len(SERVICES)
    assert seen["nursery exited"] is True
    assert counter.spawned >= len(SERVICES)
    assert counter.alive == set(), f"tasks left running: {[task.name for task in counter.alive]}"
    # The data directory was released: a second broker starts on it.
    trio.run(_start_and_stop, tmp_path)


async def _start_and_stop(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        running = await nursery.start(app.run, _settings(tmp_path))
        running.stop()


def test_drain_closes_idle_connections_and_stops_the_app_within_its_deadline(tmp_path: Path) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(app.run, _settings(tmp_path))
            stream = await trio.open_tcp_stream("127.0.0.1", running.broker.listen.port)
            with trio.fail_after(5):
                while not running.broker.open_connections:
                    await trio.sleep(0.01)
                await running.drain(grace_seconds=3)
                assert await stream.receive_some(10) == b""  # the idle connection was closed by the broker
            assert running.server.finished.is_set()
            await stream.aclose()

    trio.run(main)


def test_drain_stops_the_app_at_its_deadline_when_a_connection_does_not_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(app.run, _settings(tmp_path))
            # Connections are not told to stop reading: the idle one stays open past the deadline.
            monkeypatch.setattr(running.broker, "begin_drain", lambda: None)
            stream = await trio.open_tcp_stream("127.0.0.1", running.broker.listen.port)
            with trio.fail_after(5):
                while not running.broker.open_connections:
                    await trio.sleep(0.01)
                started = trio.current_time()
                await running.drain(grace_seconds=0.3)
            assert trio.current_time() - started >= 0.3
            assert not running.server.finished.is_set()
        await stream.aclose()

    trio.run(main)


LAYERING_CHECK = """
import json, sys
import kbroker.broker, kbroker.storage, kbroker.groups, kbroker.services
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("kbroker.server", "kbroker.apis")))))
"""


def test_the_core_never_imports_the_network_or_handler_layers() -> None:
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", LAYERING_CHECK], capture_output=True, text=True, cwd=root, check=True
    )
    assert json.loads(result.stdout) == []
