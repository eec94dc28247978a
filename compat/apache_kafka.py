"""Apache Kafka itself, as a local JVM process: the reference every kbroker behaviour is compared with.

One KRaft node in combined mode (broker and controller in one process), formatted in a scratch directory
with Kafka's own storage tool and started as ``kafka.Kafka`` on free loopback ports, from the jars of
tools/maven/kafka-4.4.0.pom.xml (fetched from Maven Central once). It is configured the way testcontainers'
Kafka module configures one for tests: internal topics with replication factor 1 and min ISR 1, and, for
tests, no initial rebalance delay. It is ready when it answers ApiVersions and Metadata (kbroker.health),
its log is captured in ``<dir>/kafka.log``, and ``stop()`` sends SIGTERM (a controlled shutdown), then
SIGKILL after a timeout.

    with ApacheKafka(tmp_path, {"num.partitions": "3"}) as kafka:
        client = KafkaProducer(bootstrap_servers=kafka.bootstrap)

    python -m compat.apache_kafka [--dir DIR]     # run one in the foreground until Ctrl-C or SIGTERM

The JVM gets Kafka's own default settings from kafka-server-start.sh (1 GB heap, G1 with 20 ms pauses);
``heap`` changes the heap.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self

from kbroker.health import wait_until_ready

KAFKA_VERSION = "4.4.0"
ARTIFACT_SET = f"kafka-{KAFKA_VERSION}"  # tools/maven/kafka-4.4.0.pom.xml

# kafka-server-start.sh's KAFKA_HEAP_OPTS and kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS.
DEFAULT_HEAP = "1g"
JVM_PERFORMANCE_OPTS = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]

# What testcontainers' Kafka module sets for a single test node, plus fast groups for tests.
TEST_SETTINGS = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
}

LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = INFO
logger.zk.name = org.apache.zookeeper
logger.zk.level = WARN
"""


class KafkaUnavailable(RuntimeError):
    """Apache Kafka cannot run here (no java, its jars could not be fetched); the message says why."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def kafka_classpath() -> str:
    """The broker's jars (fetched from Maven Central if need be); raises KafkaUnavailable."""
    from tools import maven_artifacts  # the repository root is on the path wherever compat/ is

    try:
        return maven_artifacts.classpath(ARTIFACT_SET)
    except maven_artifacts.MavenUnavailable as exc:
        raise KafkaUnavailable(str(exc)) from None


def new_cluster_id() -> str:
    """Kafka's form: a random UUID in URL-safe base64 without padding (22 characters), never starting with "-"
    (Kafka's Uuid.randomUuid draws again there: the storage tool would read such an id as an option)."""
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()).startswith("-"):
        pass
    return cluster_id


def _unblock_signals() -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


class ApacheKafka:
    """One Apache Kafka node (broker + controller) in ``directory``; ``start()``, ``stop()``, ``restart()``."""

    def __init__(
        self,
        directory: Path,
        overrides: dict[str, str] | None = None,
        *,
        host: str = "127.0.0.1",
        heap: str = DEFAULT_HEAP,
        test_settings: bool = True,
        extra_listeners: dict[str, str] | None = None,
    ) -> None:
        self.directory = Path(directory)
        # Listeners besides PLAINTEXT (name -> security protocol; a PLAINTEXT entry is the main one), each on
        # a free port chosen at the first start (extra_ports), advertised as it listens.
        self.extra_listeners = {n: p for n, p in (extra_listeners or {}).items() if n != "PLAINTEXT"}
        self.extra_ports: dict[str, int] = {}
        self.host = host
        self.heap = heap
        self.settings = {**(TEST_SETTINGS if test_settings else {}), **(overrides or {})}
        self.port = 0
        self.controller_port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None  # spawn to the first answered Metadata of the last start
        self._formatted = False
        self.cluster_id = ""  # chosen at the first start (the storage tool formats the data directory with it)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "kafka.log"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    def _properties(self) -> str:
        extra = "".join(f",{name}://{self.host}:{port}" for name, port in self.extra_ports.items())
        protocols = "".join(f",{name}:{protocol}" for name, protocol in self.extra_listeners.items())
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self.host}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port}{extra},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}{extra}",
            "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT{protocols}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            **self.settings,
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise KafkaUnavailable("java is not installed (apt-get install -y default-jdk-headless)")
        return java

    def _run_tool(self, classpath: str, *arguments: str) -> None:
        command = [self._java(), "-Xmx256m", "-cp", classpath, *self._log_options(), *arguments]
        run = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            raise RuntimeError(f"Kafka's {arguments[0]} failed (exit {run.returncode}): {run.stdout}{run.stderr}")

    def _jvm_options(self) -> list[str]:
        """JVM options of the node's process beyond Kafka's own (none here)."""
        return []

    def _log_options(self) -> list[str]:
        return [f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}"]

    def start(self, timeout: float = 120.0) -> Self:
        """Format (the first time), start, and wait until it answers ApiVersions and Metadata."""
        classpath = kafka_classpath()
        java = self._java()
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self._formatted:  # the ports stay the same across restarts: the log and clients know them
            self.port, self.controller_port = free_port(self.host), free_port(self.host)
            self.extra_ports = {name: free_port(self.host) for name in self.extra_listeners}
        properties = self.directory / "server.properties"
        properties.write_text(self._properties())
        (self.directory / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        if not self._formatted:
            self.cluster_id = self.cluster_id or new_cluster_id()
            format_command = ["kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(properties)]
            self._run_tool(classpath, *format_command, *self._format_options())
            self._formatted = True
        command = [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", *JVM_PERFORMANCE_OPTS, *self._jvm_options()]
        command += self._log_options()
        command += ["-cp", classpath, "kafka.Kafka", str(properties)]
        began = time.monotonic()
        # A child inherits the signals its parent blocks (main() blocks SIGINT and SIGTERM): Kafka gets none blocked.
        inherited = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_unblock_signals if inherited else None,  # only where main() blocked some: no threads
            )
        deadline = began + timeout
        while True:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise RuntimeError(f"Apache Kafka exited with {code} while starting:\n{self.log_tail()}")
            try:
                self._wait_until_ready(min(2.0, max(0.1, deadline - time.monotonic())))
                break
            except TimeoutError:
                if time.monotonic() >= deadline:
                    self.stop()
                    raise RuntimeError(f"Apache Kafka did not start within {timeout:g} s:\n{self.log_tail()}") from None
        self.startup_seconds = time.monotonic() - began
        return self

    def _format_options(self) -> list[str]:
        return []

    def _wait_until_ready(self, timeout: float) -> None:
        wait_until_ready(self.bootstrap, timeout=timeout)

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (Kafka shuts down in order), SIGKILL if it is still running after ``timeout`` seconds."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash: no controlled shutdown, nothing flushed beyond what the JVM wrote."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def restart(self, timeout: float = 120.0) -> Self:
        """The same node again: same ports, same data."""
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


class KafkaController(ApacheKafka):
    """One Apache Kafka node in ``process.roles=controller`` mode: a KRaft quorum of one voter, which brokers
    (Kafka's or kbroker's) register with and follow. It answers only on its controller listener: ``bootstrap`` is
    that address (controller.quorum.bootstrap.servers for a broker)."""

    def __init__(
        self,
        directory: Path,
        overrides: dict[str, str] | None = None,
        *,
        node_id: int = 3000,
        features: dict[str, int] | None = None,
    ) -> None:
        """``features``: levels the storage tool formats the quorum with (``--feature NAME=LEVEL``), instead of
        the release's defaults."""
        super().__init__(directory, overrides, heap="384m", test_settings=False)
        self.node_id = node_id
        self.features = dict(features or {})

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.controller_port}"

    @property
    def voters(self) -> str:
        """controller.quorum.voters as a broker of this quorum sets it."""
        return f"{self.node_id}@{self.host}:{self.controller_port}"

    def _properties(self) -> str:
        settings = {
            "process.roles": "controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "listeners": f"CONTROLLER://{self.host}:{self.controller_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self.data_dir),
            **self.settings,
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _format_options(self) -> list[str]:
        return [option for name, level in self.features.items() for option in ("--feature", f"{name}={level}")]

    def _wait_until_ready(self, timeout: float) -> None:
        """A controller answers ApiVersions on its listener once its quorum has a leader."""
        from kbroker.wire_client import WireClient
        from protocol.messages.api_versions_request import ApiVersionsRequest

        deadline = time.monotonic() + timeout
        while True:
            try:
                with WireClient(self.bootstrap, timeout=1.0) as client:
                    if client.request(ApiVersionsRequest(), 0).error_code == 0:
                        return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no Kafka controller answering at {self.bootstrap}")
            time.sleep(0.1)


class ApacheKafkaBroker(ApacheKafka):
    """One Apache Kafka node in ``process.roles=broker`` mode, a broker of a KafkaController's quorum (started
    first: its cluster id formats this broker's log directory). ``stop()`` (SIGTERM) is a controlled shutdown,
    ``kill()`` a crash; ``start()`` again comes back on the same port with the same data. ``advertised``
    (HOST:PORT) is what it registers for clients and the other brokers in place of where it listens (a proxy).
    """

    def __init__(
        self,
        directory: Path,
        controller: KafkaController,
        node_id: int,
        overrides: dict[str, str] | None = None,
        *,
        heap: str = "320m",
        advertised: str | None = None,
    ) -> None:
        super().__init__(directory, overrides, heap=heap)
        self.controller = controller
        self.node_id = node_id
        self.advertised = advertised

    def _properties(self) -> str:
        advertised = self.advertised or f"{self.host}:{self.port}"
        settings = {
            "process.roles": "broker",
            "node.id": str(self.node_id),
            # The voters, not controller.quorum.bootstrap.servers: a Kafka broker finds the active controller of a
            # static quorum (kraft.version 0, as KafkaController formats it) only from them.
            "controller.quorum.voters": self.controller.voters,
            "listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "advertised.listeners": f"PLAINTEXT://{advertised}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            **self.settings,
        }
        return "".join(f"{key}={value}\n" for key, value in settings.items())

    def _jvm_options(self) -> list[str]:
        # IPv4 sockets: tests/cluster's FaultProxy tells which process a connection comes from by /proc/net/tcp,
        # where the JVM's default dual-stack (IPv6) sockets do not appear.
        return ["-Djava.net.preferIPv4Stack=true"]

    def start(self, timeout: float = 120.0) -> Self:
        """Format (the first time, with the controller's cluster id), start, and wait until the controller has
        unfenced it (a Kafka broker answers requests only then)."""
        self.cluster_id = self.controller.cluster_id
        return super().start(timeout)


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="its directory (default: a new temporary one)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="a broker setting")
    args = parser.parse_args(argv)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="apache-kafka-"))
    overrides = dict(item.split("=", 1) for item in args.override)
    # Blocked from the start, so that neither signal ends this process (Kafka runs in a session of its own and
    # would be left running): sigwait takes it, then Kafka is stopped. One sent while Kafka starts waits for that.
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    kafka = ApacheKafka(directory, overrides)
    try:
        kafka.start()
    except (KafkaUnavailable, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        pid = kafka.process.pid if kafka.process is not None else None
        print(
            f"Apache Kafka {KAFKA_VERSION} ready at {kafka.bootstrap} in {kafka.startup_seconds:.2f} s "
            f"({directory}, pid {pid})",
            flush=True,
        )
        signal.sigwait(stop_signals)
    finally:
        kafka.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
