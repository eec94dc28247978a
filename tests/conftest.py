from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.testing import RunningBroker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    """A fresh broker on an ephemeral port with its own data directory."""
    with RunningBroker(tmp_path / "data") as running:
        yield running


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator:
    """Start brokers with custom settings; all are stopped at the end of the test."""
    started: list[RunningBroker] = []

    def start(overrides: dict[str, str] | None = None, name: str = "data") -> RunningBroker:
        running = RunningBroker(tmp_path / name, overrides).start()
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()
