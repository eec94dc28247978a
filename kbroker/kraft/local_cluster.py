"""``kbroker cluster``: a local KRaft cluster, Apache Kafka's controller quorum with kbroker brokers under it.

The controllers are Apache Kafka 4.4 in ``process.roles=controller`` mode, run from its Maven jars (fetched with
``mvn`` into the cache tools/maven_artifacts.py fills, ``$KBROKER_MAVEN_CACHE`` or ``~/.cache/kbroker/maven``,
once) on Java 17+; the brokers are ``kbroker serve`` processes with ``process.roles=broker``. Everything lives in
one directory:

    DIR/cluster.json                 the cluster id, each node's id and port (a second run starts the same cluster)
    DIR/controller-<id>/             a controller's server.properties, data (formatted by Kafka's storage tool), log
    DIR/broker-<id>/                 a broker's server.properties, data (formatted as ``kbroker format`` does), log

Each process runs in a session of its own, so a Ctrl-C in the terminal reaches this supervisor only: it stops the
brokers first (SIGTERM: a controlled shutdown, which needs the controllers up) and the controllers after them.
Were the supervisor itself killed, its children get SIGTERM from the kernel (PR_SET_PDEATHSIG) rather than linger.
A child that exits on its own (a ``kill -9`` in a failover test) is reported and the others go on.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kbroker.durable.files import write_atomically

KAFKA_VERSION = "4.4.0"
JAR_SET = f"kafka-{KAFKA_VERSION}"  # the set tools/maven_artifacts.py fetches into the same cache
# The controller's jars: Kafka's server with log4j2 as its logging (tools/maven/kafka-4.4.0.pom.xml's content).
CONTROLLER_POM = f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kbroker.tools</groupId>
  <artifactId>{JAR_SET}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{KAFKA_VERSION}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>2.25.4</version></dependency>
  </dependencies>
</project>
"""
COMPLETE = ".complete"
MINIMUM_JAVA = 17
JAVA_HINT = "apt-get install -y openjdk-17-jre-headless, or https://adoptium.net; or set JAVA_HOME"
CONTROLLER_HEAP = "512m"
FIRST_CONTROLLER_ID = 1000  # brokers are 1..N: the controllers' ids stay clear of them
STATE_FILE = "cluster.json"
WITHIN = 180.0  # seconds a node may take to start (2 busy cores, a cold JVM): a bound against hanging
STOP_WITHIN = 60.0
LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
"""
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
REPLICATION_LISTENER = "REPLICATION"  # the inter-broker listener a test's ClusterNetwork puts a proxy in front of


class ClusterError(Exception):
    """The cluster cannot be started; the message is the one line that says why."""


Progress = Callable[[str], None]


# --- Java and the controller's jars ---------------------------------------------------------------------------


def find_java() -> str:
    """A java of version 17 or newer ($JAVA_HOME's, else the PATH's); ClusterError in one line otherwise."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    if java is None:
        raise ClusterError(f"Kafka's KRaft controller needs Java {MINIMUM_JAVA}+ and there is no java: {JAVA_HINT}")
    try:
        answer = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"cannot run {java} -version ({exc}): {JAVA_HINT}") from None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', answer.stderr + answer.stdout)
    if found is None:
        raise ClusterError(f"cannot tell {java}'s version; Kafka's KRaft controller needs Java {MINIMUM_JAVA}+")
    major = int(found.group(2) or 0) if found.group(1) == "1" else int(found.group(1))  # 1.8 is Java 8
    if major < MINIMUM_JAVA:
        raise ClusterError(f"Kafka's KRaft controller needs Java {MINIMUM_JAVA}+, {java} is Java {major}: {JAVA_HINT}")
    return java


def maven_cache() -> Path:
    return Path(os.environ.get("KBROKER_MAVEN_CACHE") or Path.home() / ".cache" / "kbroker" / "maven")


def controller_classpath(progress: Progress) -> str:
    """Kafka's jars, fetched from Maven Central with mvn the first time (a progress line says so)."""
    target = maven_cache() / JAR_SET
    if not (target / COMPLETE).exists():
        fetch_jars(target, progress)
    return os.pathsep.join(str(path) for path in sorted(target.glob("*.jar")))


def fetch_jars(target: Path, progress: Progress) -> None:
    import fcntl

    mvn = shutil.which("mvn")
    if mvn is None:
        raise ClusterError(
            f"Apache Kafka {KAFKA_VERSION}'s jars are not in {target} and fetching them needs Maven: "
            "apt-get install -y maven (then run this again)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:  # the lock tools/maven_artifacts.py takes
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / COMPLETE).exists():
            return
        progress(f"fetching Apache Kafka {KAFKA_VERSION} (its KRaft controller) from Maven Central into {target} ...")
        staging = Path(tempfile.mkdtemp(prefix=f".{JAR_SET}-", dir=target.parent))
        try:
            (staging / "pom.xml").write_text(CONTROLLER_POM)
            command = [
                mvn, "-B", "-q", "-f", str(staging / "pom.xml"), "dependency:copy-dependencies",
                f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
            ]  # fmt: skip
            try:
                run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ClusterError(f"cannot fetch Apache Kafka {KAFKA_VERSION} from Maven Central: {exc}") from None
            (staging / "pom.xml").unlink()
            jars = sorted(path.name for path in staging.glob("*.jar"))
            if run.returncode != 0 or not jars:
                errors = [line for line in (run.stdout + run.stderr).splitlines() if "[ERROR]" in line]
                detail = (errors or ["mvn failed"])[0].replace("[ERROR]", "").strip()[:300]
                raise ClusterError(f"cannot fetch Apache Kafka {KAFKA_VERSION} from Maven Central: {detail}")
            (staging / COMPLETE).write_text("\n".join(jars) + "\n")
            if target.exists():  # an earlier, interrupted fetch
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        progress(f"fetched {len(jars)} jars")


# --- the cluster's layout --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    role: str  # "controller" or "broker"
    node_id: int
    port: int
    directory: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def properties_path(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.role}.log"


@dataclass
class Layout:
    directory: Path
    cluster_id: str
    controllers: list[Node]
    brokers: list[Node]
    created: bool = False  # made by this run (else read from an earlier run's cluster.json)

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.address for broker in self.brokers)

    @property
    def voters(self) -> str:
        return ",".join(f"{node.node_id}@{node.address}" for node in self.controllers)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def load_layout(directory: Path, brokers: int | None, controllers: int | None, base_port: int | None) -> Layout:
    """The cluster ``directory`` holds (its cluster.json), or a new one: brokers 1..N on ports BASE.., the
    controllers after them (ids from 1000); ``--port 0``: any free ports, kept for the next run."""
    from kbroker.commands.format import random_uuid

    state = directory / STATE_FILE
    if state.exists():
        try:
            saved = json.loads(state.read_text())
            cluster_id = str(saved["cluster_id"])
            nodes = {
                role: [
                    Node(role, int(n["node_id"]), int(n["port"]), directory / f"{role}-{n['node_id']}")
                    for n in saved[f"{role}s"]
                ]
                for role in ("controller", "broker")
            }
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ClusterError(
                f"{state} is damaged ({exc}); restore it, or start a new cluster in another --dir"
            ) from None
        if not nodes["controller"] or not nodes["broker"]:
            raise ClusterError(
                f"{state} is damaged (no brokers or no controllers); start a new cluster in another --dir"
            )
        layout = Layout(directory, cluster_id, nodes["controller"], nodes["broker"])
        asked = {"--brokers": (brokers, len(layout.brokers)), "--controllers": (controllers, len(layout.controllers))}
        if base_port not in (None, 0, layout.brokers[0].port):
            asked["--port"] = (base_port, layout.brokers[0].port)
        differing = [f"{flag} {have}" for flag, (want, have) in asked.items() if want is not None and want != have]
        if differing:
            raise ClusterError(
                f"{directory} holds a cluster of {len(layout.brokers)} brokers and {len(layout.controllers)} "
                f"controller(s) (cluster id {cluster_id}); run it with {', '.join(differing)}, or start a new "
                "cluster in another --dir"
            )
        return layout
    brokers = 3 if brokers is None else brokers
    controllers = 1 if controllers is None else controllers
    if brokers < 1:
        raise ClusterError(f"--brokers {brokers}: a cluster needs at least one broker")
    if controllers not in (1, 3):
        raise ClusterError(f"--controllers {controllers}: 1 (for development) or 3 (fault tolerant)")
    base = 9092 if base_port is None else base_port
    if not 0 <= base <= 65535 - (brokers + controllers - 1):
        raise ClusterError(f"--port {base}: the cluster's ports would not all be in 1..65535")
    ports: list[int] = []
    while len(ports) < brokers + controllers:
        port = free_port() if base == 0 else base + len(ports)
        if port not in ports:  # two probes may be given one free port
            ports.append(port)
    layout = Layout(
        directory,
        random_uuid(),
        [
            Node(
                "controller",
                FIRST_CONTROLLER_ID + i,
                ports[brokers + i],
                directory / f"controller-{FIRST_CONTROLLER_ID + i}",
            )
            for i in range(controllers)
        ],
        [Node("broker", i + 1, ports[i], directory / f"broker-{i + 1}") for i in range(brokers)],
        created=True,
    )
    directory.mkdir(parents=True, exist_ok=True)
    saved = {
        "cluster_id": layout.cluster_id,
        "kafka_version": KAFKA_VERSION,
        **{
            f"{role}s": [{"node_id": n.node_id, "port": n.port} for n in nodes]
            for role, nodes in (("controller", layout.controllers), ("broker", layout.brokers))
        },
    }
    write_atomically(state, json.dumps(saved, indent=2) + "\n", sync_directory=True)
    return layout


def write_properties(path: Path, settings: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))


def controller_settings(layout: Layout, node: Node) -> dict[str, str]:
    return {
        "process.roles": "controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": layout.voters,
        "listeners": f"CONTROLLER://{node.address}",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(node.data_dir),
    }


def broker_settings(layout: Layout, node: Node, overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Kafka's broker settings for this broker; the internal topics replicated as widely as the cluster allows
    (Kafka's defaults, 3 replicas and min ISR 2, need 3 brokers); ``overrides`` (the pytest fixture's) last."""
    replicas = min(3, len(layout.brokers))
    return {
        "process.roles": "broker",
        "node.id": str(node.node_id),
        "controller.quorum.bootstrap.servers": ",".join(c.address for c in layout.controllers),
        "controller.listener.names": "CONTROLLER",
        "listeners": f"PLAINTEXT://{node.address}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(node.data_dir),
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min(2, replicas)),
        **(overrides or {}),
    }


def controller_features() -> list[str]:
    """``--feature`` options for the storage tool: each feature finalized at the highest level kbroker's brokers
    serve (Kafka 4.4 would finalize share.version and streams.version, which they do not, and refuse them)."""
    from kbroker.metadata.features import KRAFT_BROKER_FEATURES

    return [
        option
        for name, (_, highest) in KRAFT_BROKER_FEATURES.items()
        if name not in ("metadata.version", "kraft.version")  # the release's; kraft.version 0 with static voters
        for option in ("--feature", f"{name}={highest}")
    ]


def format_nodes(
    layout: Layout,
    java: str,
    classpath: str,
    broker_overrides: Mapping[str, str] | None = None,
    network: ClusterNetwork | None = None,
) -> None:
    """Format every node not formatted yet: controllers with Kafka's storage tool, brokers as kbroker format.
    ``network``: the nodes reach one another through its proxies."""
    from kbroker.commands.format import FormatError, format_directories

    for node in layout.controllers:
        settings = controller_settings(layout, node)
        if network is not None:
            settings |= network.controller_settings(node)
        write_properties(node.properties_path, settings)
        (node.directory / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        if (node.data_dir / "meta.properties").exists():
            continue
        command = [java, "-Xmx256m", *log4j_options(node), "-cp", classpath, "kafka.tools.StorageTool", "format"]
        command += ["-t", layout.cluster_id, "-c", str(node.properties_path), *controller_features()]
        try:
            run = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(f"Kafka's storage tool failed for controller {node.node_id}: {exc}") from None
        if run.returncode != 0:
            lines = [line for line in (run.stderr + run.stdout).splitlines() if "Exception" in line or "rror" in line]
            detail = (lines or [f"exit {run.returncode}"])[0][:300]
            raise ClusterError(f"Kafka's storage tool could not format controller {node.node_id}: {detail}")
    for node in layout.brokers:
        settings = broker_settings(layout, node, broker_overrides)
        if network is not None:
            settings |= network.broker_settings(node)
        write_properties(node.properties_path, settings)
        try:
            format_directories([node.data_dir], layout.cluster_id, node.node_id, ignore_formatted=True)
        except FormatError as exc:
            raise ClusterError(f"broker {node.node_id}: {exc}") from None


def log4j_options(node: Node) -> list[str]:
    return [f"-Dlog4j2.configurationFile={node.directory / 'log4j2.properties'}"]


# --- the processes ---------------------------------------------------------------------------------------------


def _parent_death_signal() -> Callable[[], None]:
    """What a child runs before exec: no signal blocked (the supervisor blocks its stop signals), and on Linux
    SIGTERM should the supervisor die (PR_SET_PDEATHSIG), so that no node outlives it unseen. prctl is looked up
    here, before any fork: the child only calls it."""
    prctl = None
    if sys.platform.startswith("linux"):
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if prctl is not None:
            prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG

    return setup


@dataclass
class Running:
    node: Node
    process: subprocess.Popen[bytes]
    reported: bool = False  # its unexpected exit was reported

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class LocalCluster:
    layout: Layout
    java: str
    classpath: str
    progress: Progress
    running: list[Running] = field(default_factory=list)
    child_setup: Callable[[], None] = field(default_factory=_parent_death_signal)
    on_spawn: Callable[[Running], None] | None = None  # told of each process started (a test's network faults)

    def _spawn(self, node: Node, command: list[str]) -> Running:
        with open(node.log_path, "ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the supervisor only: it stops the nodes in order
                preexec_fn=self.child_setup,
            )
        running = Running(node, process)
        self.running.append(running)
        if self.on_spawn is not None:
            self.on_spawn(running)
        return running

    def start(self, should_stop: Callable[[], bool]) -> None:
        for node in self.layout.controllers + self.layout.brokers:
            check_port_free(node)
        controllers = [self._spawn(node, self._controller_command(node)) for node in self.layout.controllers]
        for running in controllers:
            self._wait(running, functools.partial(controller_answers, running.node), should_stop)
        brokers = [self.spawn_broker(node) for node in self.layout.brokers]  # all at once: they start in parallel
        for running in brokers:
            self.wait_broker(running, should_stop)

    def spawn_broker(self, node: Node) -> Running:
        ready = node.directory / "ready"
        ready.unlink(missing_ok=True)
        # A broker started again replaces its ended process: stop() signals the running ones only.
        self.running = [r for r in self.running if r.node != node]
        return self._spawn(node, self._broker_command(node, ready))

    def wait_broker(self, running: Running, should_stop: Callable[[], bool]) -> None:
        # The ready file is written once the broker is unfenced by the controllers: registered, caught up, serving.
        self._wait(running, (running.node.directory / "ready").exists, should_stop)

    def process_of(self, node: Node) -> Running | None:
        """The node's latest process, if it is still running (perhaps paused)."""
        found = [r for r in self.running if r.node == node and r.process.poll() is None]
        return found[-1] if found else None

    def _controller_command(self, node: Node) -> list[str]:
        # kafka-server-start.sh's JVM settings (G1, 20 ms pauses), a smaller heap: a controller holds metadata only.
        return [
            self.java, f"-Xmx{CONTROLLER_HEAP}", f"-Xms{CONTROLLER_HEAP}", "-server", "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
            "-Djava.awt.headless=true", *log4j_options(node), "-cp", self.classpath, "kafka.Kafka",
            str(node.properties_path),
        ]  # fmt: skip

    def _broker_command(self, node: Node, ready: Path) -> list[str]:
        command = [sys.executable, "-m", "kbroker", "serve", "--config", str(node.properties_path)]
        return command + ["--ready-file", str(ready), "--log-level", "INFO"]

    def _wait(self, running: Running, ready: Callable[[], bool], should_stop: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WITHIN
        while not ready():
            node = running.node
            if running.process.poll() is not None:
                raise ClusterError(
                    f"{node.role} {node.node_id} {ended(running.process.returncode)} while starting: "
                    f"{last_line(node.log_path)} (log: {node.log_path})"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{node.role} {node.node_id} did not start within {WITHIN:g} s (log: {node.log_path})"
                )
            if should_stop():
                raise KeyboardInterrupt
            time.sleep(0.1)

    def report_exits(self) -> None:
        for running in self.running:
            code = running.process.poll()
            if code is not None and not running.reported:
                running.reported = True
                node = running.node
                self.progress(f"{node.role} {node.node_id} (pid {running.pid}) {ended(code)} (log: {node.log_path})")

    def stop(self) -> None:
        """Brokers first, together (each a controlled shutdown the controllers answer), then the controllers."""
        for role in ("broker", "controller"):
            group = [r for r in self.running if r.node.role == role]
            for running in group:
                if running.process.poll() is None:
                    running.process.send_signal(signal.SIGCONT)  # a paused node (a test's pause()) must see it
                    running.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_WITHIN
            for running in group:
                try:
                    running.process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.progress(f"{role} {running.node.node_id} (pid {running.pid}) did not stop; killing it")
                    running.process.kill()
                    running.process.wait()
        self.running.clear()


# --- for tests: a started cluster and its brokers (the pytest plugin's kbroker_cluster) --------------------------


class ClusterBroker:
    """One broker of a :class:`StartedCluster`, to take down and bring back in a test. Each call returns once
    it is done: stopped processes have exited, started ones are unfenced (registered with the controller)."""

    def __init__(self, cluster: LocalCluster, node: Node, network: ClusterNetwork | None = None) -> None:
        self._cluster = cluster
        self.node = node
        self._network = network

    def __repr__(self) -> str:
        return f"<broker {self.node_id} at {self.bootstrap} pid {self.pid}>"

    @property
    def node_id(self) -> int:
        return self.node.node_id

    @property
    def bootstrap(self) -> str:
        return self.node.address

    @property
    def log_path(self) -> Path:
        return self.node.log_path

    @property
    def pid(self) -> int | None:
        """The process id while it runs (paused included), else None."""
        running = self._cluster.process_of(self.node)
        return None if running is None else running.pid

    @property
    def is_running(self) -> bool:
        return self._cluster.process_of(self.node) is not None

    def kill(self) -> None:
        """SIGKILL, as a crash: no controlled shutdown, whatever is not yet on disk is lost."""
        running = self._cluster.process_of(self.node)
        if running is not None:
            running.process.kill()
            running.process.wait()

    def stop(self) -> None:
        """SIGTERM: a controlled shutdown (the controller moves its leaderships away first)."""
        running = self._cluster.process_of(self.node)
        if running is None:
            return
        running.process.send_signal(signal.SIGCONT)  # a paused broker could not act on the SIGTERM
        running.process.send_signal(signal.SIGTERM)
        try:
            running.process.wait(STOP_WITHIN)
        except subprocess.TimeoutExpired:
            running.process.kill()
            running.process.wait()
            raise ClusterError(
                f"broker {self.node_id} did not stop within {STOP_WITHIN:g} s of SIGTERM; killed it "
                f"(log: {self.log_path})"
            ) from None

    def start(self) -> None:
        """Start it again on its port and data directory; returns once it is serving."""
        if self.is_running:
            raise ClusterError(f"broker {self.node_id} is running (pid {self.pid}): stop() or kill() it first")
        self._cluster.wait_broker(self._cluster.spawn_broker(self.node), lambda: False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the process stays, answers nothing, misses its heartbeats (the controller fences it)."""
        running = self._cluster.process_of(self.node)
        if running is None:
            raise ClusterError(f"broker {self.node_id} is not running")
        running.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after pause()."""
        running = self._cluster.process_of(self.node)
        if running is None:
            raise ClusterError(f"broker {self.node_id} is not running")
        running.process.send_signal(signal.SIGCONT)

    def isolate(self) -> None:
        """Cut it off from the controllers and the other brokers, as a network partition would: its connections
        to them and theirs to it are reset, and new ones too, until the cluster's ``heal()``. Clients still reach
        it (a leader on the wrong side of a partition keeps answering them). Needs ``network_faults``."""
        if self._network is None:
            raise ClusterError("isolate() needs a cluster started with network_faults=True")
        self._network.isolate(self.node_id)


class StartedCluster:
    """A running cluster for tests: ``bootstrap`` (every broker), ``brokers`` (by node id, from 1),
    ``controller_bootstrap``; ``stop()`` ends the brokers (controlled shutdown), then the controller."""

    def __init__(self, cluster: LocalCluster, network: ClusterNetwork | None = None) -> None:
        self._cluster = cluster
        self.network = network
        self.brokers = [ClusterBroker(cluster, node, network) for node in cluster.layout.brokers]

    def __repr__(self) -> str:
        return f"<kbroker cluster {self.cluster_id}: brokers {self.bootstrap}, controller {self.controller_bootstrap}>"

    @property
    def cluster_id(self) -> str:
        return self._cluster.layout.cluster_id

    @property
    def directory(self) -> Path:
        return self._cluster.layout.directory

    @property
    def bootstrap(self) -> str:
        return self._cluster.layout.bootstrap

    @property
    def controller_bootstrap(self) -> str:
        return ",".join(node.address for node in self._cluster.layout.controllers)

    @property
    def controller_pid(self) -> int | None:
        """The controller's process id while it runs."""
        running = self._cluster.process_of(self._cluster.layout.controllers[0])
        return None if running is None else running.pid

    def broker(self, node_id: int) -> ClusterBroker:
        for broker in self.brokers:
            if broker.node_id == node_id:
                return broker
        raise KeyError(f"no broker {node_id} in this cluster (brokers {[b.node_id for b in self.brokers]})")

    def heal(self) -> None:
        """Every broker running, resumed and connected again, as it was started (between the tests that share
        it)."""
        if self.network is not None:
            self.network.heal()
        for broker in self.brokers:
            if broker.is_running:
                broker.resume()
            else:
                broker.start()

    def stop(self) -> None:
        try:
            self._cluster.stop()
        finally:
            if self.network is not None:
                self.network.close()


class ClusterNetwork:
    """Network faults for tests: a FaultProxy (kbroker/fault_proxy.py) in front of each controller and of each
    broker's inter-broker listener, advertised in their place, so that the nodes reach one another only through
    them; clients reach the brokers' client listener directly. Each node's process is named to the proxies as it
    starts, so that ``isolate`` can cut one node's connections (a partition around it) and leave the rest."""

    def __init__(self, layout: Layout) -> None:
        from kbroker.fault_proxy import ProxyHost

        self.host = ProxyHost().start()
        # Each broker's own inter-broker listener (a port of its own: clients keep the cluster's ports).
        self.replication_ports = {node.node_id: free_port() for node in layout.brokers}
        try:
            self.proxies = {
                node.node_id: self.host.add_proxy(("127.0.0.1", self.replication_ports[node.node_id]))
                for node in layout.brokers
            }
            self.proxies |= {node.node_id: self.host.add_proxy(("127.0.0.1", node.port)) for node in layout.controllers}
        except BaseException:
            self.host.close()
            raise
        self.voters = ",".join(f"{node.node_id}@{self.proxies[node.node_id].bootstrap}" for node in layout.controllers)
        self._isolated: set[int] = set()

    def controller_settings(self, node: Node) -> dict[str, str]:
        return {
            "controller.quorum.voters": self.voters,
            "advertised.listeners": f"CONTROLLER://{self.proxies[node.node_id].bootstrap}",
        }

    def broker_settings(self, node: Node) -> dict[str, str]:
        proxy = self.proxies[node.node_id]
        return {
            "controller.quorum.bootstrap.servers": ",".join(
                address.split("@", 1)[1] for address in self.voters.split(",")
            ),
            "listeners": f"PLAINTEXT://{node.address},{REPLICATION_LISTENER}://127.0.0.1:"
            f"{self.replication_ports[node.node_id]}",
            "advertised.listeners": f"PLAINTEXT://{node.address},{REPLICATION_LISTENER}://{proxy.bootstrap}",
            "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,{REPLICATION_LISTENER}:PLAINTEXT,"
            "CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": REPLICATION_LISTENER,
        }

    def spawned(self, running: Running) -> None:
        """A node's new process: its connections are the node's from now on."""
        self.host.name_source(running.pid, _source_name(running.node.node_id))

    def isolate(self, node_id: int) -> None:
        self._isolated.add(node_id)
        for other, proxy in self.proxies.items():
            if other == node_id:
                proxy.drop()  # connections to it
            else:
                proxy.block(_source_name(node_id))  # its connections to the others

    def heal(self) -> None:
        for proxy in self.proxies.values():
            proxy.heal()
            for node_id in self._isolated:
                proxy.unblock(_source_name(node_id))
        self._isolated.clear()

    def close(self) -> None:
        self.host.close()


def _source_name(node_id: int) -> str:
    return f"node-{node_id}"


def check_can_run(progress: Progress) -> tuple[str, str]:
    """Java 17+ and the controller's classpath (the jars fetched on first use), or ClusterError saying why not."""
    return find_java(), controller_classpath(progress)


def start_cluster(
    directory: Path,
    brokers: int,
    broker_overrides: Mapping[str, str] | None = None,
    progress: Progress = lambda line: None,
    java_and_classpath: tuple[str, str] | None = None,
    network_faults: bool = False,
) -> StartedCluster:
    """A new cluster in ``directory`` (one controller, ``brokers`` brokers, free ports), started and serving;
    ``network_faults``: the nodes connected through proxies (``ClusterNetwork``), so that a broker can be isolated.
    ClusterError in one line if it cannot be run or started; nothing is left running then."""
    java, classpath = java_and_classpath or check_can_run(progress)
    layout = load_layout(directory.resolve(), brokers, 1, 0)
    network = ClusterNetwork(layout) if network_faults else None
    try:
        format_nodes(layout, java, classpath, broker_overrides, network)
        cluster = LocalCluster(layout, java, classpath, progress, on_spawn=None if network is None else network.spawned)
        try:
            cluster.start(lambda: False)
        except BaseException:
            cluster.stop()
            raise
    except BaseException:
        if network is not None:
            network.close()
        raise
    return StartedCluster(cluster, network)


def controller_answers(node: Node) -> bool:
    """A Kafka controller answers ApiVersions on its listener once it runs."""
    from kbroker.wire_client import WireClient
    from protocol.messages.api_versions_request import ApiVersionsRequest

    try:
        with WireClient(node.address, timeout=2.0) as client:
            return bool(client.request(ApiVersionsRequest(), 0).error_code == 0)
    except OSError:
        return False


def check_port_free(node: Node) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", node.port))
        except OSError:
            raise ClusterError(
                f"port {node.port} ({node.role} {node.node_id}) is in use: is this cluster already running, or "
                "another broker? (a new cluster: --port BASE)"
            ) from None


def ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was ended by {signal.Signals(-returncode).name}"
        except ValueError:
            pass
    return f"exited with {returncode}"


def last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "no output"


def run(
    directory: Path,
    brokers: int | None,
    controllers: int | None,
    base_port: int | None,
    out: Callable[[str], None],
) -> int:
    """Start the cluster, print where it is, run until SIGINT or SIGTERM, stop it in order. Exit code."""

    try:
        # Before any signal is blocked: a Ctrl-C while the jars are fetched ends the command at once.
        java = find_java()
        classpath = controller_classpath(out)
    except ClusterError as exc:
        out_error(f"kbroker cluster: {exc}")
        return 1
    # Blocked from here on: a stop signal is taken by sigtimedwait, never by a handler that could leave nodes half
    # started; the children unblock them (_parent_death_signal).
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def stop_asked() -> bool:
        return signal.sigtimedwait(STOP_SIGNALS, 0) is not None

    cluster: LocalCluster | None = None
    try:
        layout = load_layout(directory.resolve(), brokers, controllers, base_port)
        format_nodes(layout, java, classpath)
        cluster = LocalCluster(layout, java, classpath, out)
        what = "formatted" if layout.created else "restarting"
        out(
            f"cluster {layout.cluster_id} ({what}) in {layout.directory}: Apache Kafka {KAFKA_VERSION} "
            "controllers, kbroker brokers"
        )
        cluster.start(stop_asked)
        for running in cluster.running:
            node = running.node
            out(f"{node.role} {node.node_id} at {node.address} pid {running.pid} (log: {node.log_path})")
        out(f"bootstrap: {layout.bootstrap}")
        out("Ctrl-C stops the brokers, then the controllers")
        while signal.sigtimedwait(STOP_SIGNALS, 1.0) is None:
            cluster.report_exits()
        return 0
    except (ClusterError, OSError) as exc:
        out_error(f"kbroker cluster: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if cluster is not None and cluster.running:
            out("stopping: the brokers (controlled shutdown), then the controllers")
            cluster.stop()
            out("stopped")
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def out_error(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
