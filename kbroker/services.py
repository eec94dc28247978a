"""The broker's background services: each is an object with ``async def run(*, task_status)`` that reports
``started`` once running and runs until cancelled. kbroker/app.py builds them and starts them in one place.

The group coordinators' timers are one service of the same shape: the CoordinatorTimers
(kbroker.groups.timers) the coordinators register with, which ticks each at its next deadline.

Nothing a tick meets ends a service, let alone the broker: a full disk, a process out of descriptors or a bug
fails that tick, which TickFailures logs once per kind of failure, and the next tick tries again. What a failed
write means for the data directory (offline for writes after repeated failures) is decided by its health policy
(LogDirHealth in kbroker/storage/log.py), which a failed checkpoint feeds as a failed append does.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import trio

from kbroker.broker import Broker
from kbroker.durable.files import DamagedFileError, StorageError
from kbroker.storage import PartitionLog
from kbroker.storage.manager import LogManager
from kbroker.storage.swap import SegmentSwapInterrupted
from protocol.errors import KafkaError

if TYPE_CHECKING:
    from kbroker.config import BrokerConfig
    from kbroker.storage.cleaner import CleanableSection, CleanerCheckpoints, CleanerSettings, CleanJob, JobResult

log = logging.getLogger("kbroker")


class Service(Protocol):
    """A background service: ``run`` reports started, then runs until cancelled."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


class TickFailures:
    """The failures of one service's ticks, logged once per kind (what failed, the exception's type and errno):
    a condition that lasts (a full disk) is one line, not one per tick. A tick of the same work that succeeds
    again is logged too, and a later failure of that kind is then logged again."""

    def __init__(self, service: str) -> None:
        self.service = service
        self._failing: dict[str, tuple[type[BaseException], int | None]] = {}  # what -> kind of its failure

    def failed(self, what: str, exc: Exception) -> None:
        kind = (type(exc), exc.errno if isinstance(exc, OSError) else None)
        if self._failing.get(what) == kind:
            log.debug("%s: %s failed again: %s", self.service, what, _describe(exc))
            return
        self._failing[what] = kind
        if isinstance(exc, OSError | StorageError):
            log.error("%s: %s failed, tried again later: %s", self.service, what, _describe(exc))
        else:  # a bug: its traceback, once
            log.exception("%s: %s failed unexpectedly, tried again later", self.service, what)

    def succeeded(self, what: str) -> None:
        if self._failing.pop(what, None) is not None:
            log.warning("%s: %s works again", self.service, what)

    @property
    def failing(self) -> list[str]:
        """What is failing now, for tests and status."""
        return sorted(self._failing)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror if exc.filename is None else f"{exc.strerror}: {exc.filename}"
    return str(exc) or type(exc).__name__


def _flush_all(logs: list[PartitionLog]) -> list[tuple[PartitionLog, Exception]]:
    """fsync each log; one that fails does not keep the others from being flushed. Returns the failures."""
    failed: list[tuple[PartitionLog, Exception]] = []
    for plog in logs:
        try:
            plog.flush()
        except Exception as exc:  # noqa: BLE001 - reported by the service, once per kind
            failed.append((plog, exc))
    return failed


class RetentionService:
    """Deletes segments past retention.ms / retention.bytes every log.retention.check.interval.ms."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.failures = TickFailures("retention")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        interval = self.broker.config["log.retention.check.interval.ms"] / 1000
        task_status.started()
        while True:
            await trio.sleep(interval)
            self.tick()

    def tick(self) -> None:
        try:
            deleted = self.broker.logs.apply_retention(_now_ms())
        except Exception as exc:  # noqa: BLE001 - logged once per kind; the next check tries again
            self.failures.failed("retention check", exc)
            return
        self.failures.succeeded("retention check")
        if deleted:
            log.info("retention deleted %d segment(s)", len(deleted))


class FlushService:
    """Honours flush.ms for partitions that have unflushed data (fsync runs off the event loop), and writes the
    recovery-point checkpoint every log.flush.offset.checkpoint.interval.ms.

    A checkpoint that cannot be written leaves the previous one in place (an unclean start then validates more of
    each log, losing nothing) and is tried again at the next interval. It counts as a failed write of the data
    directory, as a failed append does; one written counts as a write that succeeded. While the directory is
    offline no checkpoint is written, as Kafka checkpoints only its online log directories.
    """

    CHECKPOINT = "recovery-point checkpoint"

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.failures = TickFailures("flush")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A topic may set flush.ms below the broker's setting, so look at least once a second.
        interval_ms = min(self.broker.config["log.flush.interval.ms"], 1000)
        checkpoint_interval = self.broker.config["log.flush.offset.checkpoint.interval.ms"] / 1000
        # Scheduled on trio's monotonic clock: a wall clock set back must not hold checkpoints off.
        next_checkpoint = trio.current_time() + checkpoint_interval
        task_status.started()
        while True:
            await trio.sleep(max(interval_ms, 10) / 1000)
            await self.flush_due(_now_ms())
            now = trio.current_time()
            if checkpoint_interval > 0 and now >= next_checkpoint:
                # What is fsynced need not be checked again after a crash (Kafka's recovery-point checkpoint).
                next_checkpoint = now + checkpoint_interval
                await self.checkpoint()

    async def flush_due(self, now: int) -> None:
        try:
            due = self.broker.logs.due_for_flush(now)
            failed = await trio.to_thread.run_sync(_flush_all, due) if due else []
        except Exception as exc:  # noqa: BLE001 - logged once per kind; the next tick tries again
            self.failures.failed("flush", exc)
            return
        self.failures.succeeded("flush")
        failing = set()
        for plog, error in failed:
            failing.add(plog)
            self.failures.failed(f"flush of {plog.topic}-{plog.partition}", error)
        for plog in due:
            if plog not in failing:
                self.failures.succeeded(f"flush of {plog.topic}-{plog.partition}")

    async def checkpoint(self) -> None:
        logs = self.broker.logs
        health = logs.dir_health
        if health.offline:
            return
        try:
            await trio.to_thread.run_sync(logs.checkpoint_recovery_points)
        except Exception as exc:  # noqa: BLE001 - logged once per kind; the next interval tries again
            self.failures.failed(self.CHECKPOINT, exc)
            if isinstance(exc, OSError | StorageError):
                health.write_failed(f"writing the {self.CHECKPOINT}", exc, logged=True)
            return
        self.failures.succeeded(self.CHECKPOINT)
        health.write_succeeded()


class OffsetExpiryService:
    """Offsets of groups without members expire after offsets.retention.minutes (KIP-211)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.failures = TickFailures("offset-expiry")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        interval = self.broker.config["offsets.retention.check.interval.ms"] / 1000
        task_status.started()
        while True:
            await trio.sleep(interval)
            self.tick()

    def tick(self) -> None:
        retention_ms = self.broker.config["offsets.retention.minutes"] * 60_000
        try:
            self.broker.expire_offsets(_now_ms(), retention_ms)
        except Exception as exc:  # noqa: BLE001 - logged once per kind; the next check tries again
            self.failures.failed("offset expiry", exc)
            return
        self.failures.succeeded("offset expiry")


class LogCleanerService:
    """Compacts the partitions of compacted topics (kbroker/storage/cleaner.py), the dirtiest first, one at a
    time: the pass runs in a worker process (kbroker/storage/cleaner_worker.py), the swap on the event loop.
    With nothing to clean it sleeps log.cleaner.backoff.ms. A partition whose pass fails on bad data is left
    alone until a restart, as Kafka marks such a partition uncleanable.

    The cleaner's code (kbroker/storage/cleaner.py) and its checkpoint file are loaded by the first pass that has
    a compacted partition to look at, not at start-up."""

    def __init__(self, broker: Broker, settings_source: Callable[[], BrokerConfig] | None = None) -> None:
        """``settings_source``: the broker's settings as they are now (default: its static config)."""
        self.broker = broker
        self.settings_source = settings_source if settings_source is not None else lambda: broker.config
        self.enabled: bool = broker.config["log.cleaner.enable"]
        self.checkpoints: CleanerCheckpoints | None = None  # read at the first pass with a compacted partition
        self.uncleanable: dict[tuple[str, int], str] = {}
        self.passes = 0  # completed passes, for tests and status
        self.worker: trio.Process | None = None  # the cleaner's worker process, from the first pass on
        self.failures = TickFailures("log-cleaner")

    @property
    def backoff_seconds(self) -> float:
        return float(self.settings_source()["log.cleaner.backoff.ms"]) / 1000

    @property
    def settings(self) -> CleanerSettings:
        """The log.cleaner.* settings as they are now (dynamic broker configs change them between passes)."""
        from kbroker.storage.cleaner import CleanerSettings

        config = self.settings_source()
        return CleanerSettings(
            enabled=self.enabled,
            dedupe_buffer_bytes=config["log.cleaner.dedupe.buffer.size"],
            load_factor=config["log.cleaner.io.buffer.load.factor"],
            io_max_bytes_per_second=config["log.cleaner.io.max.bytes.per.second"],
            backoff_ms=config["log.cleaner.backoff.ms"],
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        logs = self.broker.logs
        if not self.enabled or not logs.durable:
            # The cleaner's worker reads and writes segment files: logs kept in memory keep every record.
            task_status.started()
            await trio.sleep_forever()
        task_status.started()
        try:
            while True:
                try:
                    cleaned = await self.clean_dirtiest(logs)
                except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen error: logged once per kind
                    self.failures.failed("cleaning", exc)
                    cleaned = False
                else:
                    self.failures.succeeded("cleaning")
                if not cleaned:
                    await trio.sleep(self.backoff_seconds)
        finally:
            await self.stop_worker()

    def _dirtiest(self, logs: LogManager) -> tuple[PartitionLog, CleanableSection] | None:
        compacted = list(logs.compacted_partitions())
        if not compacted:
            return None
        from kbroker.storage.cleaner import CleanerCheckpoints, cleanable_section, wants_cleaning

        if self.checkpoints is None:
            self.checkpoints = CleanerCheckpoints(logs.data_dir)
        now = _now_ms()
        best: tuple[PartitionLog, CleanableSection] | None = None
        for plog in compacted:
            if plog.health.offline or (plog.topic, plog.partition) in self.uncleanable:
                continue
            section = cleanable_section(plog, self.checkpoints.get(plog.topic, plog.partition), now)
            if not wants_cleaning(plog, section):
                continue
            if best is None or (section.overdue, section.dirty_ratio) > (best[1].overdue, best[1].dirty_ratio):
                best = plog, section
        return best

    async def clean_dirtiest(self, logs: LogManager) -> bool:
        """One pass over the dirtiest partition; whether there was one to clean. Nothing a pass meets ends the
        service: a failure is logged, and a partition whose data the pass cannot clean is left alone."""
        chosen = self._dirtiest(logs)
        if chosen is None:
            return False
        plog, section = chosen
        from kbroker.storage.cleaner import (
            CleanerAborted,
            CleanJob,
            CleanResult,
            describe,
            materialize,
            remove_cleaned_files,
        )

        job = CleanJob.for_log(plog, section, self.settings, _now_ms())
        result: CleanResult | None = None
        keep_files = False  # the pass's files are the log's (swapped in), or a restart's to recover
        try:
            try:
                result = await trio.to_thread.run_sync(materialize, plog, await self._run_worker(job))
            except CleanerAborted as exc:
                log.info("cleaning %s stopped: %s", job.name, exc)
                return True
            except (CleanerFailed, DamagedFileError, StorageError, OSError) as exc:
                if _still_open(logs, plog) and not isinstance(exc, WorkerLost):
                    self.uncleanable[(plog.topic, plog.partition)] = str(exc)
                    log.error("%s cannot be cleaned (left alone until a restart): %s", job.name, exc)
                else:  # the topic went away during the pass, or the worker did: not the partition's fault
                    log.warning("cleaning %s stopped: %s", job.name, exc)
                return True
            if not _still_open(logs, plog):
                return True  # the topic was deleted (or re-created) during the pass
            try:
                if result.replacements:
                    plog.swap_segments(result.replaced, result.replacements, prepared=True, aborted=result.aborted)
                keep_files = True
            except ValueError as exc:  # the log changed meanwhile (retention, DeleteRecords): the next pass redoes it
                log.info("cleaning %s given up: %s", job.name, exc)
                return True
            except SegmentSwapInterrupted as exc:  # the directory is offline now; a restart finishes the swap
                keep_files = True
                log.error("%s", exc)
                return True
            except (OSError, StorageError) as exc:  # before the swap began: nothing changed
                plog.health.write_failed(f"segment swap of {job.name}", exc)
                return True
        finally:
            if not keep_files:
                for segment in result.replacements if result is not None else []:
                    segment.close()
                remove_cleaned_files(plog.directory)
        self.passes += 1
        log.info("%s", describe(plog, section, result))
        live = {(p.topic, p.partition) for p in logs.open_partitions()}
        checkpoints = self.checkpoints
        assert checkpoints is not None
        try:
            await trio.to_thread.run_sync(
                lambda: checkpoints.update(plog.topic, plog.partition, result.end_offset, live=live)
            )
        except OSError as exc:  # the next pass starts from the previous checkpoint: more work, no harm
            log.warning("cannot write %s: %s", checkpoints.path, exc)
        return True

    async def _run_worker(self, job: CleanJob) -> JobResult:
        """``run_job`` in the worker process (kbroker/storage/cleaner_worker.py): its own interpreter and core.
        Started at the first pass and kept; cancelled (shutdown) or failing, it is killed and the caller removes
        what it wrote."""
        try:  # imported at the first pass, not at start-up; out of descriptors, the next pass tries again
            import pickle

            from kbroker.storage.cleaner import CleanerAborted, JobResult
            from kbroker.storage.cleaner_worker import FRAME_LENGTH, frame
        except (OSError, ImportError) as exc:
            raise WorkerLost(f"cannot load the cleaner worker's modules: {exc}") from None
        if self.worker is None:
            try:
                self.worker = await trio.lowlevel.open_process(
                    [sys.executable, "-m", "kbroker.storage.cleaner_worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
            except OSError as exc:  # no process to spare (EMFILE, EAGAIN): tried again at the next pass
                raise WorkerLost(f"cannot start the cleaner worker: {exc}") from None
        worker = self.worker
        assert worker.stdin is not None and worker.stdout is not None
        try:
            await worker.stdin.send_all(frame(pickle.dumps(job)))
            head = await _receive_exactly(worker.stdout, FRAME_LENGTH.size)
            (length,) = FRAME_LENGTH.unpack(head)
            kind, value = pickle.loads(await _receive_exactly(worker.stdout, length))
        except BaseException as exc:
            await self.stop_worker()
            if isinstance(exc, (OSError, EOFError, trio.BrokenResourceError)):
                raise WorkerLost(f"the cleaner worker stopped: {exc}") from None  # a new one at the next pass
            raise
        if kind == "done":
            assert isinstance(value, JobResult)
            return value
        if kind == "aborted":
            raise CleanerAborted(str(value))
        raise CleanerFailed(str(value))

    async def stop_worker(self) -> None:
        """Kill the worker process (mid-pass its state is unknown) and reap it, even while being cancelled."""
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.kill()
            with trio.CancelScope(shield=True):
                await worker.wait()


def _still_open(logs: LogManager, plog: PartitionLog) -> bool:
    """Whether ``plog`` is still the log of its partition (not deleted, re-created or damaged meanwhile)."""
    try:
        return logs.get_partition(plog.topic, plog.partition) is plog
    except KafkaError:
        return False


async def _receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            raise EOFError(f"the stream ended after {len(data)} of {size} bytes")
        data += chunk
    return bytes(data)


class CleanerFailed(Exception):
    """A pass that cannot succeed until something changes (damaged data, an unexpected error)."""


class WorkerLost(CleanerFailed):
    """The worker process could not be started or died: the partition is not to blame."""


def background_services(broker: Broker) -> list[tuple[str, Service]]:
    """The broker's background services by name, in the order they are started."""
    services: list[tuple[str, Service]] = [
        ("retention", RetentionService(broker)),
        ("flush", FlushService(broker)),
        ("high-watermark-checkpoint", broker.replicas),  # replication-offset-checkpoint (kbroker/replication)
        ("coordinator-timers", broker.coordinator_timers),
        ("offset-expiry", OffsetExpiryService(broker)),
        ("log-cleaner", LogCleanerService(broker, lambda: broker.dynamic_config.current)),
    ]
    if broker.transactions.remote is not None:  # in a cluster: markers for partitions other brokers lead
        services.append(("transaction-markers", broker.transactions.remote))
    if broker.topics.internal_creation is not None:  # under a KRaft quorum (kbroker/topics.py)
        services.append(("internal-topic-creation", broker.topics.internal_creation))
    return services
