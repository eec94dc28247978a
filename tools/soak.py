"""Reliability soak: kill -9, disk-full and descriptor-exhaustion cycles under load, then count what was
acknowledged and kept, and how often the broker exited on its own.

    python tools/soak.py                          # every kind of cycle (about 7 minutes)
    python tools/soak.py --kills 20 --disk-full 2 # shorter
    python tools/soak.py --cycles disk-full-held,descriptors --disk-full-hold 30   # the new kinds, about a minute
    python tools/soak.py --out soak.json          # also write the figures as JSON

One kbroker process (``python -m kbroker serve``) serves a 3-partition topic while, in this process, an
idempotent confluent-kafka producer (acks=all) writes numbered records and a consumer in a group reads them
and commits its offsets synchronously every 100 records. Then, cycle after cycle:

- kill: after 0.3-1.5 s of load the broker gets SIGKILL and is started again on the same port and data dir;
- disk full: the data directory is a small tmpfs (mounted here, which needs root or an unprivileged user
  namespace; without either the disk-full cycles are skipped and the report says why); a filler file takes
  every free byte for 1-2 s of load (produces fail and are retried by the client, commits fail and are
  retried), then the filler is removed and the broker is restarted (kbroker, as Kafka, keeps a log dir that
  failed offline until a restart), half the time with SIGKILL while the disk is still full;
- disk full, held (``--held-disk-fulls``, ``--disk-full-hold`` seconds, 120 by default): the disk stays full
  while the broker keeps running. Every 0.2 s the broker must still be up; a probe produce must answer an error
  code (KAFKA_STORAGE_ERROR), and a fresh consumer must read every record up to the high watermarks. Then the
  filler is removed and a probe produce says how writes resume: at once, or (the data directory went offline
  after its writes kept failing, as a Kafka log dir does) only after a restart, which the soak then does;
- descriptors (``--descriptor-floods``): the broker is restarted under ``prlimit --nofile=N:N`` (``--nofile``,
  256 by default), and once the load's clients are back it is flooded with N + 50 idle connections for
  ``--flood-hold`` seconds (it must stay up and keep serving the load's connections), then they are closed and a
  new connection must be served again; the broker is then restarted without the limit.

After every restart the group's committed offsets are read back: a commit the broker acknowledged must never
go backwards. At the end the producer is flushed, the broker restarted cleanly and the whole topic read from
the beginning. The report: records acknowledged, lost (acknowledged but absent, or another record at their
offset), duplicated (one record stored twice), unacknowledged but stored (allowed: a record written before
the broker died without answering), commits acknowledged and commits lost, and broker exits (the broker found
not running when the soak had not stopped it: must be 0). It is a tool, not a test: its figures go to the
README's reliability section.
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
import socket
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
PROBE_TOPIC = "soak-probe"  # the held cycles' probe produces: records the verification does not count
PARTITIONS = 3
CYCLE_KINDS = ("kill", "disk-full", "disk-full-held", "descriptors")
GROUP = "soak-group"
COMMIT_EVERY = 100
# The recovery-point checkpoint, a background write, every 5 s rather than Kafka's 60 s: the held cycles then
# see it fail many times (a background failure used to end the broker).
CHECKPOINT_INTERVAL_MS = 5000
TMPFS_MB = 48
QUIET = logging.getLogger("kbroker.soak.clients")  # librdkafka's connection chatter, expected here
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False


@dataclass
class Report:
    kills: int = 0
    disk_full_cycles: int = 0
    disk_full_skipped: str | None = None
    held_disk_full_cycles: int = 0
    disk_full_hold_seconds: float = 0.0
    held_probe_answers: dict[str, int] = field(default_factory=dict)  # probe produce answers while full, by error
    held_reads_complete: int = 0  # fresh reads while full that found every record up to the high watermarks
    held_reads_short: int = 0
    writes_resumed_after_freeing: int = 0  # held cycles whose writes worked again once space was back
    writes_resumed_after_restart: int = 0  # ... or only after a restart (the directory had gone offline)
    descriptor_cycles: int = 0
    descriptor_skipped: str | None = None
    flood_connections: int = 0  # idle connections opened per flood
    acknowledged_during_floods: int = 0  # the load's records acknowledged while the broker had no descriptor left
    served_after_flood: int = 0  # floods after which a new connection was served again
    broker_exits: int = 0
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

    def start(self, nofile: int | None = None) -> None:
        """Start it (under ``prlimit --nofile=N:N`` with ``nofile``) and wait until it answers."""
        from kbroker.health import wait_until_ready

        limit = ["prlimit", f"--nofile={nofile}:{nofile}"] if nofile is not None else []
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *limit,
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
                    "--override",
                    f"log.flush.offset.checkpoint.interval.ms={CHECKPOINT_INTERVAL_MS}",
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until_ready(self.bootstrap, timeout=60)
        except Exception as exc:
            raise SystemExit(f"kbroker did not come back ({exc}); its log: {self.log_path}") from None

    def check_running(self, report: Report) -> bool:
        """Whether it is still running; an exit the soak did not cause is counted (once) and reported."""
        if self.proc is None or self.proc.poll() is None:
            return True
        report.broker_exits += 1
        report.examples.append(f"the broker exited on its own with {self.proc.returncode}; its log: {self.log_path}")
        self.proc = None
        return False

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
    return read_to_ends(bootstrap, "soak-verify", 300)[0]


def read_to_ends(bootstrap: str, group: str, timeout: float) -> tuple[dict[tuple[int, int], str], dict[int, int]]:
    """Every record of the topic up to the high watermarks read first: (records by place, the watermarks)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, "logger": QUIET})
    stored: dict[tuple[int, int], str] = {}
    try:
        ends = {p: reader.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1] for p in range(PARTITIONS)}
        reader.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + timeout
        while len(done) < PARTITIONS and time.monotonic() < deadline:
            for msg in reader.consume(10_000, 1.0):
                if msg.error():
                    continue
                stored[(msg.partition(), msg.offset())] = msg.value().decode()
                if msg.offset() + 1 >= ends[msg.partition()]:
                    done.add(msg.partition())
    finally:
        reader.close()
    return stored, ends


def probe_produce(bootstrap: str) -> str:
    """One record to the probe topic over the wire (acks=all), on a new connection: the answer's error name (NONE:
    written), or why there was none. 8 KB, so that it never fits in what is left of a page already written."""
    from kbroker.wire_client import WireClient
    from protocol.errors import ErrorCode
    from protocol.messages.produce_request import ProduceRequest
    from protocol.records import Record, build_batch

    batch = build_batch([Record(offset_delta=0, value=b"p" * 8192)])
    data = [ProduceRequest.PartitionProduceData(index=0, records=batch)]
    request = ProduceRequest(
        acks=-1, timeout_ms=10_000, topic_data=[ProduceRequest.TopicProduceData(name=PROBE_TOPIC, partition_data=data)]
    )
    try:
        with WireClient(bootstrap, timeout=10) as client:
            answer = client.request(request, 9).responses[0].partition_responses[0]
    except (OSError, ConnectionError) as exc:
        return f"no answer ({type(exc).__name__})"
    return ErrorCode(answer.error_code).name


def held_disk_full(broker: BrokerProcess, data: DataDir, report: Report, hold: float) -> None:
    """Fill the disk and keep it full for ``hold`` seconds with the broker running, then free it (see the module
    docstring); restarts the broker only if writes do not resume once space is back."""
    data.fill()
    began = time.monotonic()
    probes = [2.0, max(2.0, hold - 2.0)]  # soon after the fill, and near the end
    read_at: float | None = hold / 2
    while (elapsed := time.monotonic() - began) < hold:
        if not broker.check_running(report):  # counted; it cannot start again on the full disk
            data.free()
            report.held_disk_full_cycles += 1
            broker.start()
            return
        if probes and elapsed >= probes[0]:
            probes.pop(0)
            answer = probe_produce(broker.bootstrap)
            report.held_probe_answers[answer] = report.held_probe_answers.get(answer, 0) + 1
        if read_at is not None and elapsed >= read_at:
            read_at = None
            stored, ends = read_to_ends(broker.bootstrap, f"soak-held-reader-{report.held_disk_full_cycles}", 60)
            if len(stored) >= sum(ends.values()):
                report.held_reads_complete += 1
            else:
                report.held_reads_short += 1
                report.examples.append(f"while the disk was full a reader got {len(stored)} of {sum(ends.values())}")
        time.sleep(0.2)
    data.free()
    report.disk_full_hold_seconds = hold
    report.held_disk_full_cycles += 1
    if probe_produce(broker.bootstrap) == "NONE":
        report.writes_resumed_after_freeing += 1
        return
    broker.check_running(report)
    broker.stop()
    broker.start()
    answer = probe_produce(broker.bootstrap)
    if answer == "NONE":
        report.writes_resumed_after_restart += 1
    else:
        report.examples.append(f"after the disk was freed and the broker restarted, a produce answered {answer}")


def descriptor_flood(broker: BrokerProcess, load: Load, report: Report, nofile: int, hold: float) -> None:
    """Restart the broker under ``nofile`` descriptors, flood it with idle connections for ``hold`` seconds, close
    them, check that a new connection is served, and restart it without the limit."""
    broker.check_running(report)
    broker.stop()
    broker.start(nofile=nofile)
    # The load's clients reconnect first: theirs are the open connections that must keep being served.
    acknowledged_before = len(load.acked)
    deadline = time.monotonic() + 30
    while len(load.acked) == acknowledged_before and time.monotonic() < deadline:
        time.sleep(0.1)
    flood: list[socket.socket] = []
    acknowledged_before = len(load.acked)
    try:
        for _ in range(nofile + 50):
            try:
                flood.append(socket.create_connection(("127.0.0.1", broker.port), timeout=5))
            except OSError:
                break
        report.flood_connections = max(report.flood_connections, len(flood))
        deadline = time.monotonic() + hold
        while time.monotonic() < deadline:
            if not broker.check_running(report):
                break
            time.sleep(0.2)
        report.acknowledged_during_floods += len(load.acked) - acknowledged_before
    finally:
        for sock in flood:
            sock.close()
    report.descriptor_cycles += 1
    deadline = time.monotonic() + 30
    answer = "not asked"
    while broker.check_running(report) and time.monotonic() < deadline:
        answer = probe_produce(broker.bootstrap)
        if answer == "NONE":
            report.served_after_flood += 1
            break
        time.sleep(0.5)
    else:
        report.examples.append(f"after a descriptor flood a new connection got: {answer}")
    broker.stop()
    broker.start()


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


@dataclass(frozen=True)
class Plan:
    kills: int = 0
    disk_full: int = 0
    held_disk_fulls: int = 0
    descriptor_floods: int = 0
    disk_full_hold: float = 120.0
    flood_hold: float = 15.0
    nofile: int = 256


def run(plan: Plan) -> Report:
    from confluent_kafka.admin import AdminClient, NewTopic

    report = Report()
    data = DataDir(TMPFS_MB)
    disk_full, held = plan.disk_full, plan.held_disk_fulls
    if (disk_full or held) and not data.mounted:
        report.disk_full_skipped = data.why_not
        print(f"disk-full cycles skipped: {data.why_not}", file=sys.stderr)
        disk_full = held = 0
    floods = plan.descriptor_floods
    if floods and shutil.which("prlimit") is None:
        report.descriptor_skipped = "no prlimit command"
        print("descriptor cycles skipped: no prlimit command", file=sys.stderr)
        floods = 0
    broker = BrokerProcess(data.path, free_port(), data.base.parent / f"{data.base.name}.log")
    began = time.monotonic()
    load: Load | None = None
    try:
        broker.start()
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "logger": QUIET})
        for created in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1), NewTopic(PROBE_TOPIC, 1, 1)]).values():
            created.result(30)
        load = Load(broker.bootstrap, report)
        load.start()
        # The cycles, of every kind asked for, interleaved at random.
        cycles = ["kill"] * plan.kills + ["disk-full"] * disk_full
        cycles += ["disk-full-held"] * held + ["descriptors"] * floods
        random.shuffle(cycles)
        for number, cycle in enumerate(cycles, 1):
            time.sleep(random.uniform(0.3, 1.5))
            broker.check_running(report)
            if cycle == "kill":
                broker.kill()
                report.kills += 1
                broker.start()
            elif cycle == "disk-full":
                data.fill()
                time.sleep(random.uniform(1.0, 2.0))
                broker.check_running(report)
                if random.random() < 0.5:
                    broker.kill()
                    report.kills += 1
                else:
                    broker.stop()
                data.free()
                report.disk_full_cycles += 1
                broker.start()
            elif cycle == "disk-full-held":
                held_disk_full(broker, data, report, plan.disk_full_hold)
            else:
                descriptor_flood(broker, load, report, plan.nofile, plan.flood_hold)
            check_commits(broker.bootstrap, load, report)
            if load.fatal is not None:
                report.examples.append(load.fatal)
                break
            print(f"cycle {number}/{len(cycles)} ({cycle}): {len(load.acked)} acknowledged", file=sys.stderr)
        time.sleep(1.0)
        load.stop()
        broker.check_running(report)
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
    parser.add_argument(
        "--cycles",
        default=",".join(CYCLE_KINDS),
        help=f"the kinds of cycle to run, comma-separated (default: all of {', '.join(CYCLE_KINDS)})",
    )
    parser.add_argument("--kills", type=int, default=100, help="kill -9 cycles (default 100)")
    parser.add_argument("--disk-full", type=int, default=10, help="disk-full cycles (default 10)")
    parser.add_argument("--held-disk-fulls", type=int, default=1, help="held disk-full cycles (default 1)")
    parser.add_argument(
        "--disk-full-hold", type=float, default=120.0, help="seconds a held disk-full cycle keeps the disk full (120)"
    )
    parser.add_argument("--descriptor-floods", type=int, default=2, help="descriptor-exhaustion cycles (default 2)")
    parser.add_argument("--flood-hold", type=float, default=15.0, help="seconds a flood is held (default 15)")
    parser.add_argument("--nofile", type=int, default=256, help="the broker's open-file limit in a flood (256)")
    parser.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    parser.add_argument("--out", type=Path, help="write the report as JSON here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)
    print(f"seed {seed}", file=sys.stderr)
    kinds = {kind.strip() for kind in args.cycles.split(",") if kind.strip()}
    if unknown := kinds - set(CYCLE_KINDS):
        parser.error(f"--cycles: unknown kind(s) {', '.join(sorted(unknown))} (known: {', '.join(CYCLE_KINDS)})")
    plan = Plan(
        kills=args.kills if "kill" in kinds else 0,
        disk_full=args.disk_full if "disk-full" in kinds else 0,
        held_disk_fulls=args.held_disk_fulls if "disk-full-held" in kinds else 0,
        descriptor_floods=args.descriptor_floods if "descriptors" in kinds else 0,
        disk_full_hold=args.disk_full_hold,
        flood_hold=args.flood_hold,
        nofile=args.nofile,
    )
    report = run(plan)
    figures = {"seed": seed, **asdict(report)}
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    bad = report.lost or report.offsets_reused or report.duplicated or report.commits_lost or report.broker_exits
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
