"""The broker's background services: each is an object with ``async def run(*, task_status)`` that reports
``started`` once running and runs until cancelled. kbroker/app.py builds them and starts them in one place.

The group coordinators' timers are one service of the same shape: the CoordinatorRuntime
(kbroker.groups.runtime) the coordinators register with, which ticks each at its next deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

import trio

from kbroker.broker import Broker
from kbroker.storage import PartitionLog
from kbroker.storage.cleaner import (
    CleanableSection,
    CleanerAborted,
    CleanerCheckpoints,
    CleanerSettings,
    PartitionCleaner,
    cleanable_section,
    describe,
    wants_cleaning,
)
from kbroker.storage.files import StorageError
from kbroker.storage.manager import LogManager

T = TypeVar("T")

log = logging.getLogger("kbroker")


class Service(Protocol):
    """A background service: ``run`` reports started, then runs until cancelled."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


def _flush_all(logs: list[PartitionLog]) -> None:
    for plog in logs:
        plog.flush()


class RetentionService:
    """Deletes segments past retention.ms / retention.bytes every log.retention.check.interval.ms."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        interval = self.broker.config["log.retention.check.interval.ms"] / 1000
        task_status.started()
        while True:
            await trio.sleep(interval)
            deleted = self.broker.logs.apply_retention(_now_ms())
            if deleted:
                log.info("retention deleted %d segment(s)", len(deleted))


class FlushService:
    """Honours flush.ms for partitions that have unflushed data; fsync runs off the event loop."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A topic may set flush.ms below the broker's setting, so look at least once a second.
        interval_ms = min(self.broker.config["log.flush.interval.ms"], 1000)
        checkpoint_interval_ms = self.broker.config["log.flush.offset.checkpoint.interval.ms"]
        next_checkpoint = _now_ms() + checkpoint_interval_ms
        task_status.started()
        while True:
            await trio.sleep(max(interval_ms, 10) / 1000)
            now = _now_ms()
            due = self.broker.logs.due_for_flush(now)
            if due:
                await trio.to_thread.run_sync(_flush_all, due)
            if checkpoint_interval_ms > 0 and now >= next_checkpoint:
                # What is fsynced need not be checked again after a crash (Kafka's recovery-point checkpoint).
                next_checkpoint = now + checkpoint_interval_ms
                await trio.to_thread.run_sync(self.broker.logs.checkpoint_recovery_points)


class OffsetExpiryService:
    """Offsets of groups without members expire after offsets.retention.minutes (KIP-211)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        interval = self.broker.config["offsets.retention.check.interval.ms"] / 1000
        retention_ms = self.broker.config["offsets.retention.minutes"] * 60_000
        task_status.started()
        while True:
            await trio.sleep(interval)
            self.broker.expire_offsets(_now_ms(), retention_ms)


async def run_stoppable(work: Callable[[threading.Event], T]) -> T:
    """``work(stop)`` in a worker thread; if the caller is cancelled, ``stop`` is set and the thread waited for."""
    stop = threading.Event()

    async def stop_when_cancelled() -> None:
        try:
            await trio.sleep_forever()
        finally:
            stop.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_when_cancelled)
        try:
            return await trio.to_thread.run_sync(work, stop)
        finally:
            nursery.cancel_scope.cancel()


class LogCleanerService:
    """Compacts the partitions of compacted topics (kbroker/storage/cleaner.py), the dirtiest first, one at a
    time: the pass runs in a worker thread, the swap on the event loop. With nothing to clean it sleeps
    log.cleaner.backoff.ms. A partition whose pass fails on bad data is left alone until a restart, as Kafka
    marks such a partition uncleanable."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        config = broker.config
        self.settings = CleanerSettings(
            enabled=config["log.cleaner.enable"],
            dedupe_buffer_bytes=config["log.cleaner.dedupe.buffer.size"],
            load_factor=config["log.cleaner.io.buffer.load.factor"],
            io_max_bytes_per_second=config["log.cleaner.io.max.bytes.per.second"],
            backoff_ms=config["log.cleaner.backoff.ms"],
        )
        self.checkpoints: CleanerCheckpoints | None = None
        self.uncleanable: dict[tuple[str, int], str] = {}
        self.passes = 0  # completed passes, for tests and status

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        logs = self.broker.logs
        if not self.settings.enabled or not isinstance(logs, LogManager):
            # The in-memory engine keeps every record: compaction rewrites segment files.
            task_status.started()
            await trio.sleep_forever()
        self.checkpoints = CleanerCheckpoints(logs.data_dir)
        task_status.started()
        while True:
            if not await self.clean_dirtiest(logs):
                await trio.sleep(self.settings.backoff_ms / 1000)

    def _dirtiest(self, logs: LogManager) -> tuple[PartitionLog, CleanableSection] | None:
        assert self.checkpoints is not None
        now = _now_ms()
        best: tuple[PartitionLog, CleanableSection] | None = None
        for plog in logs.compacted_partitions():
            if plog.health.offline or (plog.topic, plog.partition) in self.uncleanable:
                continue
            section = cleanable_section(plog, self.checkpoints.get(plog.topic, plog.partition), now)
            if not wants_cleaning(plog, section):
                continue
            if best is None or (section.overdue, section.dirty_ratio) > (best[1].overdue, best[1].dirty_ratio):
                best = plog, section
        return best

    async def clean_dirtiest(self, logs: LogManager) -> bool:
        """One pass over the dirtiest partition; whether there was one to clean."""
        chosen = self._dirtiest(logs)
        if chosen is None:
            return False
        plog, section = chosen
        key = (plog.topic, plog.partition)
        cleaner = PartitionCleaner(plog, section, self.settings, _now_ms())
        try:
            result = await run_stoppable(cleaner.run)
        except CleanerAborted as exc:
            log.info("cleaning %s-%d stopped: %s", plog.topic, plog.partition, exc)
            return True
        except (OSError, StorageError, ValueError) as exc:  # DecodeError is a ValueError: damaged data
            self.uncleanable[key] = str(exc)
            log.error("%s-%d cannot be cleaned (left alone until a restart): %s", plog.topic, plog.partition, exc)
            return True
        if logs.get_partition(plog.topic, plog.partition) is not plog:
            cleaner.discard()  # the topic was deleted (or re-created) during the pass
            return True
        try:
            if result.replacements:
                plog.swap_segments(result.replaced, result.replacements, prepared=True, aborted=result.aborted)
                cleaner.written.clear()  # part of the log now: not the pass's to discard
        except ValueError as exc:  # the log changed meanwhile (retention, DeleteRecords): the next pass redoes it
            log.info("cleaning %s-%d given up: %s", plog.topic, plog.partition, exc)
            cleaner.discard()
            return True
        except (OSError, StorageError) as exc:
            plog.health.write_failed(f"segment swap of {plog.topic}-{plog.partition}", exc)
            cleaner.discard()
            return True
        live = {(p.topic, p.partition) for p in logs.open_partitions()}
        assert self.checkpoints is not None
        await trio.to_thread.run_sync(
            lambda: self.checkpoints.update(plog.topic, plog.partition, result.end_offset, live=live)  # type: ignore[union-attr]
        )
        self.passes += 1
        log.info("%s", describe(plog, section, result))
        return True


def background_services(broker: Broker) -> list[tuple[str, Service]]:
    """The broker's background services by name, in the order they are started."""
    return [
        ("retention", RetentionService(broker)),
        ("flush", FlushService(broker)),
        ("coordinator-runtime", broker.coordinator_runtime),
        ("offset-expiry", OffsetExpiryService(broker)),
        ("log-cleaner", LogCleanerService(broker)),
    ]
