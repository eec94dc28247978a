"""No background task failure ends the broker (issue #26, item 1): each service of kbroker/services.py meets a
full disk, a process out of descriptors and a bug in its ticks, logs each kind of failure once (not once per
tick), goes on ticking, and says when the work succeeds again. The recovery-point checkpoint feeds the data
directory's health policy as a failed append does. kbroker/app.py starts a background service that fails
anyway again after a pause; the coordinators' timers (kbroker/groups/timers.py) are covered by
tests/groups/test_coordinator_timers.py."""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from kbroker import app
from kbroker.config import BrokerConfig
from kbroker.durable import fs
from kbroker.durable.fs import FaultyFileSystem
from kbroker.server.listeners import plaintext_listener
from kbroker.services import FlushService, LogCleanerService, OffsetExpiryService, RetentionService
from kbroker.storage import LogManager
from kbroker.storage.checkpoints import RECOVERY_POINT_FILE, read_offset_checkpoint
from kbroker.storage.log import LogDirHealth

ENOSPC = OSError(errno.ENOSPC, "No space left on device")
EMFILE = OSError(errno.EMFILE, "Too many open files", "/data/recovery-point-offset-checkpoint.tmp")


class Bug(Exception):
    """What a programming error in a tick raises."""


class Script:
    """A stand-in for the work a tick does: raises the scripted outcomes in turn (None: succeeds), then succeeds."""

    def __init__(self, *outcomes: Exception | None) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    def __call__(self, *args: Any) -> list[Any]:
        self.calls += 1
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome
        return []


# Three full-disk failures, three of a bug, a success, two full-disk failures again, then successes.
OUTCOMES = (ENOSPC, ENOSPC, ENOSPC, Bug("boom"), Bug("boom"), Bug("boom"), None, ENOSPC, ENOSPC)


def _config(**overrides: str) -> BrokerConfig:
    return BrokerConfig(
        {
            "log.retention.check.interval.ms": "1000",
            "log.flush.interval.ms": "1000",
            "log.flush.offset.checkpoint.interval.ms": "1000",
            "offsets.retention.check.interval.ms": "1000",
            "log.cleaner.backoff.ms": "1000",
            **overrides,
        }
    )


def _fake_logs(**work: Callable[..., Any]) -> SimpleNamespace:
    logs = SimpleNamespace(
        apply_retention=lambda now: [],
        due_for_flush=lambda now: [],
        checkpoint_recovery_points=lambda: None,
        dir_health=LogDirHealth(Path("data")),  # never written: the failures here stay below its limit
    )
    for name, function in work.items():
        setattr(logs, name, function)
    return logs


def _service(kind: str, script: Script, tmp_path: Path) -> Any:
    """The service ``kind`` on a broker whose work for that service is ``script``."""
    if kind == "retention":
        return RetentionService(SimpleNamespace(config=_config(), logs=_fake_logs(apply_retention=script)))  # type: ignore[arg-type]
    if kind == "flush":
        return FlushService(SimpleNamespace(config=_config(), logs=_fake_logs(due_for_flush=script)))  # type: ignore[arg-type]
    if kind == "checkpoint":  # due at every tick: the interval is measured on the wall clock, not the mock one
        logs = _fake_logs(checkpoint_recovery_points=script)
        config = _config(**{"log.flush.offset.checkpoint.interval.ms": "1"})
        return FlushService(SimpleNamespace(config=config, logs=logs))  # type: ignore[arg-type]
    if kind == "offset-expiry":
        return OffsetExpiryService(SimpleNamespace(config=_config(), logs=_fake_logs(), expire_offsets=script))  # type: ignore[arg-type]
    assert kind == "log-cleaner"
    manager = LogManager(tmp_path / "data", {})
    service = LogCleanerService(SimpleNamespace(config=_config(), logs=manager))  # type: ignore[arg-type]

    async def clean_dirtiest(logs: LogManager) -> bool:
        script()
        return False

    service.clean_dirtiest = clean_dirtiest  # type: ignore[method-assign]
    return service


async def _inline(sync_fn: Callable[..., Any], *args: Any, **_: Any) -> Any:
    await trio.lowlevel.checkpoint()
    return sync_fn(*args)


def _run_until(service: Any, done: Callable[[], bool]) -> None:
    """Run the service (on a mock clock) until ``done``; an exception escaping it fails the test.

    Work a service sends to a thread runs inline: while a thread runs, every task is blocked and an autojumping
    mock clock would race to the next deadline, on a loaded machine as far as the test's own."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            with trio.fail_after(3600):
                while not done():
                    await trio.sleep(0.5)
            nursery.cancel_scope.cancel()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trio.to_thread, "run_sync", _inline)
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@pytest.fixture
def kbroker_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG, logger="kbroker")
    yield caplog


def _lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[tuple[str, str, bool]]:
    """(level name, message, whether a traceback is attached) of the kbroker log lines at ``level`` or above."""
    return [
        (r.levelname, r.getMessage(), r.exc_info is not None)
        for r in caplog.records
        if r.name.startswith("kbroker") and r.levelno >= level
    ]


WHAT = {
    "retention": ("retention", "retention check"),
    "flush": ("flush", "flush"),
    "checkpoint": ("flush", "recovery-point checkpoint"),
    "offset-expiry": ("offset-expiry", "offset expiry"),
    "log-cleaner": ("log-cleaner", "cleaning"),
}


@pytest.mark.parametrize("kind", list(WHAT))
def test_each_kind_of_failure_is_logged_once_and_the_service_keeps_ticking(
    kind: str, tmp_path: Path, kbroker_log: pytest.LogCaptureFixture
) -> None:
    script = Script(*OUTCOMES)
    _run_until(_service(kind, script, tmp_path), lambda: script.calls >= len(OUTCOMES) + 3)
    service, what = WHAT[kind]
    assert _lines(kbroker_log) == [
        ("ERROR", f"{service}: {what} failed, tried again later: No space left on device", False),
        ("ERROR", f"{service}: {what} failed unexpectedly, tried again later", True),
        ("WARNING", f"{service}: {what} works again", False),
        ("ERROR", f"{service}: {what} failed, tried again later: No space left on device", False),
        ("WARNING", f"{service}: {what} works again", False),
    ]


def test_a_partition_whose_flush_fails_does_not_keep_the_others_from_being_flushed(
    kbroker_log: pytest.LogCaptureFixture,
) -> None:
    flushed: list[str] = []

    class Log:
        def __init__(self, topic: str, fails: bool) -> None:
            self.topic, self.partition, self.fails = topic, 0, fails

        def flush(self) -> None:
            if self.fails:
                raise ENOSPC
            flushed.append(self.topic)

    logs = [Log("a", False), Log("b", True), Log("c", False)]
    service = FlushService(SimpleNamespace(config=_config(), logs=_fake_logs(due_for_flush=lambda now: logs)))  # type: ignore[arg-type]
    _run_until(service, lambda: len(flushed) >= 10)
    assert flushed[:4] == ["a", "c", "a", "c"]
    failed = "flush: flush of b-0 failed, tried again later: No space left on device"
    assert _lines(kbroker_log) == [("ERROR", failed, False)]


# --- the checkpoint and the data directory's health ------------------------------------------------------------


@pytest.fixture
def faulty() -> Iterator[FaultyFileSystem]:
    with fs.installed(FaultyFileSystem()) as double:
        yield double


def _checkpoint(service: FlushService) -> None:
    trio.run(service.checkpoint)


def test_a_failed_checkpoint_counts_as_a_failed_write_of_the_directory_and_one_written_resets_the_count(
    tmp_path: Path, faulty: FaultyFileSystem, kbroker_log: pytest.LogCaptureFixture
) -> None:
    logs = LogManager(tmp_path / "data", {})
    logs.create_topic("t", 1, {})
    checkpoint_file = tmp_path / "data" / RECOVERY_POINT_FILE
    service = FlushService(SimpleNamespace(config=_config(), logs=logs))  # type: ignore[arg-type]
    health = logs.dir_health
    faulty.disk_full = True
    for _ in range(LogDirHealth.FAILURE_LIMIT - 1):
        _checkpoint(service)
    assert (health.failures_in_a_row, health.offline) == (LogDirHealth.FAILURE_LIMIT - 1, False)
    assert not checkpoint_file.exists() and not list((tmp_path / "data").glob("*.tmp"))
    faulty.disk_full = False
    _checkpoint(service)  # written: the disk works, the count starts again
    assert health.failures_in_a_row == 0
    assert read_offset_checkpoint(checkpoint_file) == {("t", 0): 0}
    tmp = tmp_path / "data" / f"{RECOVERY_POINT_FILE}.tmp"
    assert _lines(kbroker_log) == [
        ("ERROR", f"flush: recovery-point checkpoint failed, tried again later: No space left on device: {tmp}", False),
        ("WARNING", "flush: recovery-point checkpoint works again", False),
    ]

    faulty.disk_full = True
    for _ in range(LogDirHealth.FAILURE_LIMIT):
        _checkpoint(service)
    assert health.offline
    assert health.offline_reason == (
        f"{LogDirHealth.FAILURE_LIMIT} writes in a row failed, the last: writing the recovery-point checkpoint: "
        f"No space left on device: {tmp}"
    )
    faulty.disk_full = False
    writes = faulty.counts.get("write", 0)
    _checkpoint(service)  # offline: no checkpoint is written any more (Kafka checkpoints only online log dirs)
    assert faulty.counts.get("write", 0) == writes
    assert read_offset_checkpoint(checkpoint_file) == {("t", 0): 0}


def test_a_checkpoint_failing_for_want_of_descriptors_is_logged_once_and_does_not_count_against_the_directory(
    tmp_path: Path, kbroker_log: pytest.LogCaptureFixture
) -> None:
    logs = LogManager(tmp_path / "data", {})
    script = Script(*[EMFILE] * 30)
    logs.checkpoint_recovery_points = script  # type: ignore[method-assign,assignment]
    config = _config(**{"log.flush.offset.checkpoint.interval.ms": "1"})
    service = FlushService(SimpleNamespace(config=config, logs=logs))  # type: ignore[arg-type]
    _run_until(service, lambda: script.calls >= 30)
    assert (logs.dir_health.failures_in_a_row, logs.dir_health.offline) == (0, False)
    assert _lines(kbroker_log) == [
        (
            "ERROR",
            "flush: recovery-point checkpoint failed, tried again later: Too many open files: "
            "/data/recovery-point-offset-checkpoint.tmp",
            False,
        )
    ]


# --- the last line: a service that fails anyway is started again -------------------------------------------------


class _FailingService:
    """Reports started, ticks ``before_failing`` times, then raises; each start is counted."""

    def __init__(self, before_failing: int, error: Exception) -> None:
        self.before_failing = before_failing
        self.error = error
        self.starts = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.starts += 1
        task_status.started()
        for _ in range(self.before_failing):
            await trio.sleep(1)
        raise self.error


def test_a_background_service_that_fails_after_starting_is_started_again_with_a_growing_pause(
    kbroker_log: pytest.LogCaptureFixture,
) -> None:
    service = _FailingService(0, Bug("lost its state"))
    starts: list[float] = []
    original = service.run

    async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        starts.append(trio.current_time())
        await original(task_status=task_status)

    service.run = run  # type: ignore[method-assign]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(app.supervise, "example", service)
            while service.starts < 8:
                await trio.sleep(1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    pauses = [round(b - a, 3) for a, b in zip(starts, starts[1:], strict=False)]
    assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    lines = _lines(kbroker_log)
    assert lines[0] == ("ERROR", "service example failed; restarting it in 1 s", True)  # the traceback, once
    assert lines[1:] == [
        ("ERROR", f"service example failed again: lost its state; restarting it in {pause:g} s", False)
        for pause in (2, 4, 8, 16, 30, 30, 30)
    ]


def test_a_service_failing_before_it_started_fails_the_start() -> None:
    class Unstartable:
        async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            raise OSError(errno.EADDRINUSE, "Address already in use")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(app.supervise, "metrics", Unstartable())

    with pytest.raises(BaseExceptionGroup) as raised:
        trio.run(main)
    assert [str(e) for e in raised.value.exceptions] == ["[Errno 98] Address already in use"]


def test_the_app_keeps_serving_when_a_background_service_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the exception ended App.run's nursery, and with it the broker."""
    failing = _FailingService(2, ENOSPC)
    real = app.background_services
    monkeypatch.setattr(app, "background_services", lambda broker: [*real(broker), ("failing", failing)])
    settings = app.Settings(BrokerConfig({}), tmp_path / "data", plaintext_listener("127.0.0.1", 0))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(app.run, settings)
            with trio.fail_after(30):
                while failing.starts < 2:
                    await trio.sleep(0.05)
                # The server still answers: a connection is accepted and served.
                stream = await trio.open_tcp_stream("127.0.0.1", running.broker.listen.port)
                await stream.aclose()
            running.stop()

    trio.run(main)
    assert failing.starts >= 2


def test_writes_failing_for_want_of_descriptors_never_take_the_directory_offline(tmp_path: Path) -> None:
    """Out of descriptors is the process's limit (idle connections), gone when they close: the directory must not
    stay offline until a restart for it. A full disk still takes it offline after FAILURE_LIMIT failures."""
    health = LogDirHealth(tmp_path)
    for _ in range(3 * LogDirHealth.FAILURE_LIMIT):
        health.write_failed("append to t-0", OSError(errno.EMFILE, "Too many open files"))
        health.write_failed("append to t-0", OSError(errno.ENFILE, "Too many open files in system"))
    assert (health.failures_in_a_row, health.offline) == (0, False)
    for _ in range(LogDirHealth.FAILURE_LIMIT):
        health.write_failed("append to t-0", ENOSPC)
    assert health.offline
