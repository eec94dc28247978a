"""Reliability soak: kill -9 and disk-full cycles under load, then count what was acknowledged and kept.

    python tools/soak.py                          # 100 kill -9 cycles and 10 disk-full cycles (about 6 minutes)
    python tools/soak.py --kills 20 --disk-full 2 # shorter
    python tools/soak.py --out soak.json          # also write the figures as JSON

One kbroker process (``python -m kbroker serve``) serves a 3-partition topic while, in this process, an
idempotent confluent-kafka producer (acks=all) writes numbered records and a consumer in a group reads them
and commits its offsets synchronously every 100 records. Then, cycle after cycle:

- kill: after 0.3-1.5 s of load the broker gets SIGKILL and is started again on the same port and data dir;
- disk full: the data directory is a small tmpfs (mounted here, which needs root or an unprivileged user
  namespace; without either the disk-full cycles are skipped and the report says why); a filler file takes
  every free byte for 1-2 s of load (produces fail and are retried by the client, commits fail and are
  retried), then the filler is removed and the broker is restarted (kbroker, as Kafka, keeps a log dir that
  failed offline until a restart), half the time with SIGKILL while the disk is still full.

After every restart the group's committed offsets are read back: a commit the broker acknowledged must never
go backwards. At the end the producer is flushed, the broker restarted cleanly and the whole topic read from
the beginning. The report: records acknowledged, lost (acknowledged but absent, or another record at their
offset), duplicated (one record stored twice), unacknowledged but stored (allowed: a record written before
the broker died without answering), commits acknowledged and commits lost. It is a tool, not a test: its
figures go to the README's reliability section.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compat.apache_kafka import free_port  # noqa: E402

TOPIC = "soak"
PARTITIONS = 3
GROUP = "soak-group"
COMMIT_EVERY = 100
TMPFS_MB = 48
QUIET = logging.getLogger("kbroker.soak.clients")  # librdkafka's connection chatter, expected here
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


@dataclass
class Report:
    kills: int = 0
    disk_full_cycles: int = 0
    disk_full_skipped: str | None = None
    seconds: float = 0.0
    acknowledged: int = 0
    produce_errors: int = 0
    lost: int = 0
    offsets_reused: int = 0
    duplicated: int = 0
    stored_unacknowledged: int = 0
    commits_acknowledged: int = 0
    commit_errors: int = 0
    commits_lost: int = 0
    consumed: int = 0
    examples: list[str] = field(default_factory=list)


# --- the data directory ---------------------------------------------------------------------------------------


class DataDir:
    """A temporary directory, on a small tmpfs when one can be mounted (for the disk-full cycles)."""

    def __init__(self, size_mb: int) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="kbroker-soak-"))
        self.path = self.base / "data"
        self.mounted = False
        self.why_not: str | None = None
        if os.geteuid() != 0:
            self.why_not = "mounting a tmpfs needs root; disk-full cycles need a small file system"
        else:
            result = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(self.base)],
                capture_output=True,
                text=True,
            )
            if result.returncode == 0:
                self.mounted = True
            else:
                self.why_not = f"mount -t tmpfs failed: {result.stderr.strip() or result.returncode}"
        self.path.mkdir()
        self.filler = self.base / "filler"

    def free_bytes(self) -> int:
        stats = os.statvfs(self.base)
        return stats.f_bavail * stats.f_frsize

    def fill(self) -> int:
        """Take every free byte; returns how many were taken."""
        taken = 0
        chunk = b"\0" * (1 << 20)
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9):  # smaller and smaller until not a byte is left
                while True:
                    try:
                        taken += os.write(fd, chunk[:size])
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return taken

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def remove(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.base)], check=False)
        shutil.rmtree(self.base, ignore_errors=True)


# --- the broker -------------------------------------------------------------------------------------------------


class BrokerProcess:
    def __init__(self, data_dir: Path, port: int, log_path: Path) -> None:
        self.data_dir = data_dir
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        from kbroker.health import wait_until_ready

        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "kbroker",
                    "serve",
                    "--listen",
                    self.bootstrap,
                    "--data-dir",
                    str(self.data_dir),
                    "--log-level",
                    "WARNING",
                    "--override",
                    "group.initial.rebalance.delay.ms=0",
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until_ready(self.bootstrap, timeout=60)
        except Exception as exc:
            raise SystemExit(f"kbroker did not come back ({exc}); its log: {self.log_path}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


# --- the load ---------------------------------------------------------------------------------------------------


class Load:
    """An idempotent producer and a committing group consumer, each on its own thread."""

    def __init__(self, bootstrap: str, report: Report) -> None:
        from confluent_kafka import Consumer, Producer

        self.report = report
        self.acked: dict[str, tuple[int, int]] = {}  # value -> (partition, offset) the broker acknowledged
        self.committed: dict[int, int] = {}  # partition -> the highest commit the broker acknowledged
        self.fatal: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 600_000,
                "reconnect.backoff.max.ms": 200,
                "logger": QUIET,
            }
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": GROUP,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 45_000,
                "reconnect.backoff.max.ms": 200,
                "logger": QUIET,
            }
        )
        self.threads = [
            threading.Thread(target=self._produce, name="soak-producer", daemon=True),
            threading.Thread(target=self._consume, name="soak-consumer", daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            with self._lock:
                self.report.produce_errors += 1
                if err.fatal():
                    self.fatal = f"producer: {err}"
            return
        with self._lock:
            self.acked[msg.value().decode()] = (msg.partition(), msg.offset())

    def _produce(self) -> None:
        number = 0
        while not self._stop.is_set() and self.fatal is None:
            try:
                self.producer.produce(
                    TOPIC, value=str(number).encode(), key=str(number % 97).encode(), on_delivery=self._delivered
                )
                number += 1
            except BufferError:
                self.producer.poll(0.05)
                continue
            if number % 100 == 0:
                self.producer.poll(0)
                time.sleep(0.002)  # a steady stream rather than a flood: about 30k records/s at most

    def _consume(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        self.consumer.subscribe([TOPIC])
        since_commit = 0
        while not self._stop.is_set():
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            self.report.consumed += 1
            since_commit += 1
            if since_commit < COMMIT_EVERY:
                continue
            since_commit = 0
            try:
                results = self.consumer.commit(asynchronous=False)
            except KafkaException:
                self.report.commit_errors += 1
                continue
            for tp in results or []:
                if isinstance(tp, TopicPartition) and tp.error is None and tp.offset >= 0:
                    with self._lock:
                        self.report.commits_acknowledged += 1
                        self.committed[tp.partition] = max(self.committed.get(tp.partition, -1), tp.offset)

    def stop(self) -> None:
        self._stop.set()
        for thread in self.threads:
            thread.join(30)
        remaining = self.producer.flush(120)
        if remaining:
            self.report.examples.append(f"{remaining} records still unanswered at the end")
        self.consumer.close()


def check_commits(bootstrap: str, load: Load, report: Report) -> None:
    """No commit the broker acknowledged may go backwards after a restart."""
    from confluent_kafka import Consumer, TopicPartition

    with load._lock:
        expected = dict(load.committed)
    if not expected:
        return
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False, "logger": QUIET})
    try:
        for _ in range(20):
            try:
                found = reader.committed([TopicPartition(TOPIC, p) for p in expected], timeout=10)
                break
            except Exception:  # the coordinator may still be loading: ask again
                time.sleep(0.5)
        else:
            report.examples.append("committed offsets could not be read back")
            return
        for tp in found:
            if tp.offset < expected[tp.partition]:
                report.commits_lost += 1
                report.examples.append(
                    f"commit of partition {tp.partition} went back: {expected[tp.partition]} -> {tp.offset}"
                )
    finally:
        reader.close()


def read_everything(bootstrap: str) -> dict[tuple[int, int], str]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    reader = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "soak-verify", "enable.auto.commit": False, "logger": QUIET}
    )
    stored: dict[tuple[int, int], str] = {}
    try:
        ends = {p: reader.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in range(PARTITIONS)}
        reader.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 300
        while len(done) < PARTITIONS and time.monotonic() < deadline:
            for msg in reader.consume(10_000, 1.0):
                if msg.error():
                    continue
                stored[(msg.partition(), msg.offset())] = msg.value().decode()
                if msg.offset() + 1 >= ends[msg.partition()]:
                    done.add(msg.partition())
    finally:
        reader.close()
    return stored


def verify(acked: dict[str, tuple[int, int]], stored: dict[tuple[int, int], str], report: Report) -> None:
    report.acknowledged = len(acked)
    for value, where in acked.items():
        found = stored.get(where)
        if found is None:
            report.lost += 1
            if len(report.examples) < 10:
                report.examples.append(f"record {value} acknowledged at {where} is gone")
        elif found != value:
            report.offsets_reused += 1
            if len(report.examples) < 10:
                report.examples.append(f"record {value} acknowledged at {where}, which now holds {found}")
    counts = Counter(stored.values())
    report.duplicated = sum(n - 1 for n in counts.values() if n > 1)
    report.stored_unacknowledged = sum(1 for value in counts if value not in acked)


# ---------------------------------------------------------------------------------------------------------------


def run(kills: int, disk_full: int) -> Report:
    from confluent_kafka.admin import AdminClient, NewTopic

    report = Report()
    data = DataDir(TMPFS_MB)
    if disk_full and not data.mounted:
        report.disk_full_skipped = data.why_not
        print(f"disk-full cycles skipped: {data.why_not}", file=sys.stderr)
        disk_full = 0
    broker = BrokerProcess(data.path, free_port(), data.base.parent / f"{data.base.name}.log")
    began = time.monotonic()
    load: Load | None = None
    try:
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "logger": QUIET})
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)
        load = Load(broker.bootstrap, report)
        load.start()
        # The cycles, kills and disk-fulls interleaved at random.
        cycles = ["kill"] * kills + ["disk-full"] * disk_full
        random.shuffle(cycles)
        for number, cycle in enumerate(cycles, 1):
            time.sleep(random.uniform(0.3, 1.5))
            if cycle == "kill":
                broker.kill()
                report.kills += 1
            else:
                data.fill()
                time.sleep(random.uniform(1.0, 2.0))
                if random.random() < 0.5:
                    broker.kill()
                    report.kills += 1
                else:
                    broker.stop()
                data.free()
                report.disk_full_cycles += 1
            broker.start()
            check_commits(broker.bootstrap, load, report)
            if load.fatal is not None:
                report.examples.append(load.fatal)
                break
            print(f"cycle {number}/{len(cycles)} ({cycle}): {len(load.acked)} acknowledged", file=sys.stderr)
        time.sleep(1.0)
        load.stop()
        broker.stop()
        broker.start()
        check_commits(broker.bootstrap, load, report)
        verify(load.acked, read_everything(broker.bootstrap), report)
    finally:
        broker.stop()
        data.remove()
    report.seconds = round(time.monotonic() - began, 1)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=100, help="kill -9 cycles (default 100)")
    parser.add_argument("--disk-full", type=int, default=10, help="disk-full cycles (default 10)")
    parser.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)
    print(f"seed {seed}", file=sys.stderr)
    report = run(args.kills, args.disk_full)
    figures = {"seed": seed, **asdict(report)}
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    bad = report.lost or report.offsets_reused or report.duplicated or report.commits_lost
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
