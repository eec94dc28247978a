"""The broker's background services: each is an object with ``async def run(*, task_status)`` that reports
``started`` once running and runs until cancelled. kbroker/app.py builds them and starts them in one place.

The group coordinators' timers are one service of the same shape: the CoordinatorRuntime
(kbroker.groups.runtime) the coordinators register with, which ticks each at its next deadline.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import trio

from kbroker.broker import Broker
from kbroker.storage import PartitionLog

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


def background_services(broker: Broker) -> list[tuple[str, Service]]:
    """The broker's background services by name, in the order they are started."""
    return [
        ("retention", RetentionService(broker)),
        ("flush", FlushService(broker)),
        ("coordinator-runtime", broker.coordinator_runtime),
        ("offset-expiry", OffsetExpiryService(broker)),
    ]
