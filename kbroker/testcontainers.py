"""kbroker in Docker for tests, started the way testcontainers starts Kafka (``pip install 'kbroker[docker]'``).

    from kbroker.testcontainers import KBrokerContainer

    with KBrokerContainer("kbroker:latest").with_config("num.partitions", 3) as kafka:
        producer = KafkaProducer(bootstrap_servers=kafka.get_bootstrap_server())

The image is the one docker/Dockerfile builds (``docker build -f docker/Dockerfile -t kbroker .``, or
``KBrokerContainer.build_image(repository_root)``). As with testcontainers' KafkaContainer, the container's
address on the host is known only once Docker has mapped the port, so the container waits for it: its
entrypoint waits for KBROKER_ADVERTISED_LISTENER_FILE, which ``start()`` writes, and ``start()`` returns
once the broker answers ApiVersions and Metadata on that address (kbroker.health), not on a log line.

``KBrokerCluster`` is a cluster in Docker: Apache Kafka's KRaft controller (the ``apache/kafka`` image) and N
kbroker brokers on a network of their own, each broker's client port published on the host, with helpers to
kill, stop, pause, restart and isolate one broker.

For tests without Docker, the pytest plugin's ``kafka_broker`` fixture starts kbroker in-process (and
``kbroker_cluster`` a cluster of local processes).
"""

from __future__ import annotations

import io
import secrets
import shlex
import socket
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from kbroker.health import NotReady, check, wait_until_ready
from kbroker.kraft.local_cluster import FIRST_CONTROLLER_ID, KAFKA_VERSION, controller_features

try:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.docker_client import DockerClient
    from testcontainers.core.network import Network
except ImportError as exc:  # the optional dependency
    raise ImportError("kbroker.testcontainers needs testcontainers: pip install 'kbroker[docker]'") from exc

DEFAULT_IMAGE = "kbroker:latest"
ADVERTISED_LISTENER_FILE = "/tmp/kbroker-advertised-listener"


def config_env(key: str, value: object) -> tuple[str, str]:
    """The KBROKER_CONFIG_<KEY> variable docker/entrypoint.sh turns into the server.properties ``key``."""
    if not key or "_" in key or not all(part.isalnum() for part in key.split(".")):
        raise ValueError(
            f"config key {key!r}: the image takes settings as KBROKER_CONFIG_<KEY> variables, dots as underscores, "
            "so a key must be letters, digits and dots"
        )
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return "KBROKER_CONFIG_" + key.replace(".", "_").upper(), text


def docker_engine_problem(timeout: float = 3.0) -> str | None:
    """Why no Docker engine can be used from here (None when one answers a ping)."""
    try:
        import docker
    except ImportError:
        return "the docker package is not installed (pip install 'kbroker[docker]')"
    try:
        client = docker.from_env(timeout=timeout)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # docker-py raises DockerException, requests' and urllib3's errors alike
        return f"no Docker engine: {type(exc).__name__}: {exc}"
    return None


class KBrokerContainer(DockerContainer):
    """A kbroker container; ``get_bootstrap_server()`` is its ``host:port`` on the Docker host."""

    def __init__(self, image: str = DEFAULT_IMAGE, port: int = 9092, **kwargs: Any) -> None:
        super().__init__(image, **kwargs)
        self.port = port
        self.startup_timeout = 60.0
        self.with_exposed_ports(port)
        self.with_env("KBROKER_LISTENER", f"0.0.0.0:{port}")
        self.with_env("KBROKER_ADVERTISED_LISTENER_FILE", ADVERTISED_LISTENER_FILE)
        # As testcontainers' KafkaContainer: a group forms at its first join, not 3 s later (with_config wins).
        self.with_config("group.initial.rebalance.delay.ms", 0)

    def with_config(self, key: str, value: object) -> Self:
        """A server.properties setting, e.g. ``with_config("log.retention.ms", 3600000)``."""
        self.with_env(*config_env(key, value))
        return self

    def with_startup_timeout(self, seconds: float) -> Self:
        self.startup_timeout = seconds
        return self

    def get_bootstrap_server(self) -> str:
        return f"{self.get_container_host_ip()}:{self.get_exposed_port(self.port)}"

    def start(self) -> Self:
        super().start()
        self._put_file(ADVERTISED_LISTENER_FILE, self.get_bootstrap_server() + "\n")
        try:
            wait_until_ready(self.get_bootstrap_server(), timeout=self.startup_timeout)
        except TimeoutError as exc:
            logs = b"".join(self.get_logs()).decode(errors="replace")[-4000:]
            raise TimeoutError(f"{exc}\ncontainer log:\n{logs}") from None
        return self

    def _put_file(self, path: str, text: str) -> None:
        data = text.encode()
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        if not self.get_wrapped_container().put_archive("/", archive.getvalue()):
            raise OSError(f"could not write {path} into the container")

    @staticmethod
    def build_image(source: Path | str, tag: str = DEFAULT_IMAGE) -> str:
        """Build docker/Dockerfile of a kbroker source tree as ``tag`` (what ``docker build`` would); returns it.

        Only the files the image needs are sent to the engine, whatever else the tree holds.
        """
        import docker

        root = Path(source)
        wanted = ["pyproject.toml", "README.md", "kbroker", "protocol", "docker/Dockerfile", "docker/entrypoint.sh"]
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            for name in wanted:
                tar.add(root / name, arcname=name, filter=_without_caches)
        context.seek(0)
        client = docker.from_env()
        try:
            client.images.build(fileobj=context, custom_context=True, dockerfile="docker/Dockerfile", tag=tag, rm=True)
        finally:
            client.close()
        return tag


def _without_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name or info.name.endswith(".pyc") else info


# --- a cluster: Apache Kafka's KRaft controller and kbroker brokers, each in a container ----------------------

CONTROLLER_IMAGE = f"apache/kafka:{KAFKA_VERSION}"  # the controller kbroker's brokers are tested under
CONTROLLER_PORT = 9093
CONTROLLER_PROPERTIES = "/tmp/kbroker-controller.properties"
CONTROLLER_DATA_DIR = "/var/lib/kafka/data"  # the apache/kafka image's volume, writable by its user
CONTROLLER_HEAP = "-Xmx512m -Xms512m"  # KAFKA_HEAP_OPTS: a controller holds metadata only
CLIENT_LISTENER, CLIENT_PORT = "EXTERNAL", 9092  # published on the host: what clients are given
BROKER_LISTENER, BROKER_PORT = "INTERNAL", 9093  # on the cluster's network: replication between brokers
STARTUP_TIMEOUT = 180.0  # seconds: a cold JVM and N brokers registering on a busy machine
STOP_TIMEOUT = 60  # seconds docker stop waits for a controlled shutdown before it kills


@dataclass(frozen=True)
class ClusterPlan:
    """What each container of a :class:`KBrokerCluster` is given, worked out before any is started (and without
    Docker): the controller's server.properties and command, each broker's environment. Brokers are 1..N; broker
    N's client port is ``host_ports[N - 1]`` on ``host``."""

    cluster_id: str
    name_prefix: str  # container names, also their host names on the cluster's network
    host: str  # where the Docker engine publishes ports, as clients on this machine reach it
    host_ports: tuple[int, ...]
    broker_config: tuple[tuple[str, str], ...] = ()  # with_config's settings, for every broker

    @property
    def broker_ids(self) -> range:
        return range(1, len(self.host_ports) + 1)

    @property
    def controller_name(self) -> str:
        return f"{self.name_prefix}-controller"

    def broker_name(self, node_id: int) -> str:
        return f"{self.name_prefix}-broker-{node_id}"

    def broker_address(self, node_id: int) -> str:
        """Broker ``node_id``'s client address on the host."""
        return f"{self.host}:{self.host_ports[node_id - 1]}"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(self.broker_address(node_id) for node_id in self.broker_ids)

    def controller_properties(self) -> dict[str, str]:
        return {
            "process.roles": "controller",
            "node.id": str(FIRST_CONTROLLER_ID),
            "controller.quorum.voters": f"{FIRST_CONTROLLER_ID}@{self.controller_name}:{CONTROLLER_PORT}",
            "listeners": f"CONTROLLER://:{CONTROLLER_PORT}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": CONTROLLER_DATA_DIR,
        }

    def controller_command(self) -> list[str]:
        """The controller's command: its properties written, its storage formatted, Kafka started. Not the
        image's own set-up from KAFKA_* variables: that formats without ``--feature``, and Kafka 4.4 would then
        finalize features (share.version, streams.version) kbroker's brokers do not support, and be refused by
        them; here each is finalized at the highest level they serve, as ``kbroker cluster`` formats it."""
        lines = [f"{key}={value}" for key, value in self.controller_properties().items()]
        format_command = ["/opt/kafka/bin/kafka-storage.sh", "format", "--ignore-formatted"]
        format_command += ["-t", self.cluster_id, "-c", CONTROLLER_PROPERTIES, *controller_features()]
        script = "\n".join(
            [
                "set -e",
                f"printf '%s\\n' {shlex.join(lines)} > {CONTROLLER_PROPERTIES}",
                shlex.join(format_command),
                f"exec /opt/kafka/bin/kafka-server-start.sh {CONTROLLER_PROPERTIES}",
            ]
        )
        return ["sh", "-c", script]

    def broker_settings(self, node_id: int) -> dict[str, str]:
        """Broker ``node_id``'s server.properties: two listeners, the inter-broker one on the cluster's network
        under its container name, the client one advertised at its published port on the host."""
        if node_id not in self.broker_ids:
            raise KeyError(f"no broker {node_id} in this cluster (brokers 1..{len(self.host_ports)})")
        replicas = min(3, len(self.host_ports))  # Kafka's internal-topic defaults, as far as the brokers allow
        return {
            "process.roles": "broker",
            "node.id": str(node_id),
            "controller.quorum.bootstrap.servers": f"{self.controller_name}:{CONTROLLER_PORT}",
            "controller.listener.names": "CONTROLLER",
            "listeners": f"{BROKER_LISTENER}://0.0.0.0:{BROKER_PORT},{CLIENT_LISTENER}://0.0.0.0:{CLIENT_PORT}",
            "advertised.listeners": f"{BROKER_LISTENER}://{self.broker_name(node_id)}:{BROKER_PORT},"
            f"{CLIENT_LISTENER}://{self.broker_address(node_id)}",
            "listener.security.protocol.map": f"{BROKER_LISTENER}:PLAINTEXT,{CLIENT_LISTENER}:PLAINTEXT,"
            "CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": BROKER_LISTENER,
            "offsets.topic.replication.factor": str(replicas),
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(min(2, replicas)),
            "group.initial.rebalance.delay.ms": "0",  # as KBrokerContainer (and testcontainers' KafkaContainer)
            **dict(self.broker_config),
        }

    def broker_env(self, node_id: int) -> dict[str, str]:
        """The environment docker/entrypoint.sh turns into broker ``node_id``'s ``kbroker format`` and ``serve``."""
        env = dict(config_env(key, value) for key, value in self.broker_settings(node_id).items())
        env["KBROKER_CLUSTER_ID"] = self.cluster_id
        env["KBROKER_LISTENER"] = f"0.0.0.0:{CLIENT_PORT}"  # the listener the image's health check asks
        return env


def free_host_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return int(probe.getsockname()[1])


class DockerClusterBroker:
    """One broker container of a :class:`KBrokerCluster`. Each call returns once done: a stopped or killed
    container has exited, a started one answers Metadata as an unfenced broker."""

    def __init__(self, cluster: KBrokerCluster, node_id: int, container: DockerContainer) -> None:
        self._cluster = cluster
        self.node_id = node_id
        self.container = container
        self.bootstrap = cluster.plan.broker_address(node_id)
        self.isolated = False

    def __repr__(self) -> str:
        return f"<broker {self.node_id} at {self.bootstrap}: {self.status}>"

    @property
    def status(self) -> str:
        """Docker's state of the container: running, paused, exited..."""
        wrapped = self.container.get_wrapped_container()
        wrapped.reload()
        return str(wrapped.status)

    @property
    def is_running(self) -> bool:
        return self.status in ("running", "paused")

    def kill(self) -> None:
        """SIGKILL (docker kill), as a crash: no controlled shutdown."""
        if self._unpaused_if_running():
            wrapped = self.container.get_wrapped_container()
            wrapped.kill()
            wrapped.wait()

    def stop(self) -> None:
        """SIGTERM (docker stop): a controlled shutdown; Docker kills it after STOP_TIMEOUT seconds."""
        if self._unpaused_if_running():
            self.container.get_wrapped_container().stop(timeout=STOP_TIMEOUT)

    def start(self) -> None:
        """Start the stopped container again, on its data and its host port; returns once it serves."""
        if self.is_running:
            raise RuntimeError(f"broker {self.node_id} is running: stop() or kill() it first")
        self.container.get_wrapped_container().start()
        self._cluster.wait_until_serving([self], {self.bootstrap})

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """docker pause (the cgroup freezer): the process stays, answers nothing, misses its heartbeats."""
        if self.status != "running":
            raise RuntimeError(f"broker {self.node_id} is not running ({self.status})")
        self.container.get_wrapped_container().pause()

    def resume(self) -> None:
        """docker unpause after pause()."""
        if self.status != "paused":
            raise RuntimeError(f"broker {self.node_id} is not paused ({self.status})")
        self.container.get_wrapped_container().unpause()

    def isolate(self) -> None:
        """docker network disconnect: cut off from the controller and the other brokers. Its published port goes
        with its only network, so clients lose it too (unlike the local cluster's isolate()); ``reconnect()``
        or the cluster's ``heal()`` brings it back on the same port."""
        if not self.isolated:
            self._cluster.docker_api().disconnect_container_from_network(
                self.container.get_container_id(), self._cluster.network_name
            )
            self.isolated = True

    def reconnect(self) -> None:
        """docker network connect after isolate(): its name resolves on the network again."""
        if self.isolated:
            self._cluster.docker_api().connect_container_to_network(
                self.container.get_container_id(), self._cluster.network_name
            )
            self.isolated = False

    def logs(self) -> str:
        return b"".join(self.container.get_logs()).decode(errors="replace")

    def _unpaused_if_running(self) -> bool:
        """True if the container runs; a paused one is unpaused first (Docker cannot stop or kill it paused)."""
        status = self.status
        if status == "paused":
            self.container.get_wrapped_container().unpause()
        return status in ("running", "paused")


class KBrokerCluster:
    """A KRaft cluster in Docker: one Apache Kafka controller and ``brokers`` kbroker brokers on a network of their
    own; ``get_bootstrap_servers()`` is every broker's client address on the host, ``broker(node_id)`` one broker.

        with KBrokerCluster("kbroker:latest", brokers=3).with_config("min.insync.replicas", 2) as cluster:
            producer = KafkaProducer(bootstrap_servers=cluster.get_bootstrap_servers(), acks="all")
            cluster.broker(1).kill()

    Each broker's client port is published on a host port picked free on this machine, fixed for the life of its
    container, so that a broker stopped and started (or isolated and reconnected) is at the same address; so the
    Docker engine must be this machine's (a local socket, Docker Desktop). ``start()`` returns once every broker
    answers Metadata listing all of them."""

    def __init__(
        self,
        image: str = DEFAULT_IMAGE,
        brokers: int = 3,
        controller_image: str = CONTROLLER_IMAGE,
        docker_client_kw: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(brokers, bool) or not isinstance(brokers, int) or brokers < 1:
            raise ValueError(f"brokers={brokers!r}: a cluster needs a whole number of brokers, at least 1")
        if not image or not controller_image:
            raise ValueError("image and controller_image name Docker images (kbroker's, and apache/kafka's)")
        self.image = image
        self.broker_count = brokers
        self.controller_image = controller_image
        self.docker_client_kw = docker_client_kw
        self.startup_timeout = STARTUP_TIMEOUT
        self._config: dict[str, str] = {}
        self._plan: ClusterPlan | None = None
        self._network: Network | None = None
        self.controller: DockerContainer | None = None
        self.brokers: list[DockerClusterBroker] = []

    def __repr__(self) -> str:
        where = "not started" if self._plan is None else f"brokers {self._plan.bootstrap_servers}"
        return f"<KBrokerCluster of {self.broker_count} brokers: {where}>"

    def with_config(self, key: str, value: object) -> Self:
        """A server.properties setting for every broker, e.g. ``with_config("min.insync.replicas", 2)``."""
        config_env(key, value)  # a key the image cannot take is refused now, not at start
        self._config[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return self

    def with_startup_timeout(self, seconds: float) -> Self:
        self.startup_timeout = seconds
        return self

    @property
    def plan(self) -> ClusterPlan:
        if self._plan is None:
            raise RuntimeError("the cluster is not started: start() it (or use it as a context manager)")
        return self._plan

    @property
    def cluster_id(self) -> str:
        return self.plan.cluster_id

    @property
    def network_name(self) -> str:
        if self._network is None:
            raise RuntimeError("the cluster is not started: start() it (or use it as a context manager)")
        return self._network.name

    def get_bootstrap_servers(self) -> str:
        return self.plan.bootstrap_servers

    def broker(self, node_id: int) -> DockerClusterBroker:
        for broker in self.brokers:
            if broker.node_id == node_id:
                return broker
        raise KeyError(f"no broker {node_id} in this cluster (brokers {[b.node_id for b in self.brokers]})")

    def make_plan(self, host: str) -> ClusterPlan:
        """A new cluster's plan: a fresh cluster id and container names, free host ports."""
        from kbroker.commands.format import random_uuid

        ports: list[int] = []
        while len(ports) < self.broker_count:
            port = free_host_port()
            if port not in ports:  # two probes may be given one port
                ports.append(port)
        return ClusterPlan(
            cluster_id=random_uuid(),
            name_prefix=f"kbroker-{secrets.token_hex(4)}",
            host=host,
            host_ports=tuple(ports),
            broker_config=tuple(self._config.items()),
        )

    def containers(self, plan: ClusterPlan, network: Network) -> tuple[DockerContainer, dict[int, DockerContainer]]:
        """The controller's container and each broker's, by node id, as ``plan`` makes them (none started)."""
        controller = (
            DockerContainer(self.controller_image, docker_client_kw=self.docker_client_kw)
            .with_name(plan.controller_name)
            .with_network(network)
            .with_env("KAFKA_HEAP_OPTS", CONTROLLER_HEAP)
            .with_command(plan.controller_command())
        )
        brokers = {}
        for node_id in plan.broker_ids:
            broker = (
                DockerContainer(self.image, docker_client_kw=self.docker_client_kw)
                .with_name(plan.broker_name(node_id))
                .with_network(network)
                .with_bind_ports(CLIENT_PORT, plan.host_ports[node_id - 1])
            )
            for name, value in plan.broker_env(node_id).items():
                broker.with_env(name, value)
            brokers[node_id] = broker
        return controller, brokers

    def start(self) -> Self:
        if self._plan is not None:
            raise RuntimeError("the cluster is started already")
        try:
            self._plan = plan = self.make_plan(DockerClient(**(self.docker_client_kw or {})).host())
            self._network = Network(docker_client_kw=self.docker_client_kw).create()
            self.controller, brokers = self.containers(plan, self._network)
            self.brokers = [DockerClusterBroker(self, node_id, container) for node_id, container in brokers.items()]
            self.controller.start()
            for broker in self.brokers:
                broker.container.start()
            self.wait_until_serving(self.brokers, {plan.broker_address(node_id) for node_id in plan.broker_ids})
        except BaseException:
            self.stop()
            raise
        return self

    def wait_until_serving(self, brokers: list[DockerClusterBroker], expected: set[str]) -> None:
        """Until each of ``brokers`` answers Metadata listing (at least) the addresses ``expected``."""
        deadline = time.monotonic() + self.startup_timeout
        waiting = list(brokers)
        problem = ""
        while waiting:
            broker = waiting[0]
            try:
                listed = set(check(broker.bootstrap, timeout=5.0).brokers)
                if expected <= listed:
                    waiting.pop(0)
                    continue
                problem = f"its Metadata lists {sorted(listed)}, not yet {sorted(expected - listed)}"
            except NotReady as exc:
                problem = str(exc)
            if not broker.is_running:
                raise RuntimeError(f"broker {broker.node_id} exited while starting; its log:\n{broker.logs()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"broker {broker.node_id} ({broker.bootstrap}) not serving within {self.startup_timeout:g} s: "
                    f"{problem}\nits log:\n{broker.logs()[-4000:]}"
                )
            time.sleep(0.5)

    def heal(self) -> None:
        """Every broker connected, running and serving again, as started."""
        for broker in self.brokers:
            if broker.status == "paused":
                broker.resume()
            broker.reconnect()
        stopped = [broker for broker in self.brokers if not broker.is_running]
        for broker in stopped:
            broker.container.get_wrapped_container().start()
        self.wait_until_serving(self.brokers, {self.plan.broker_address(node_id) for node_id in self.plan.broker_ids})

    def stop(self) -> None:
        """Remove the brokers, the controller and the network (what was created of them)."""
        for container in [broker.container for broker in self.brokers] + [self.controller]:
            if container is not None:
                container.stop()  # removes the container if one was created (its volume too), else nothing
        self.brokers.clear()
        self.controller = None
        if self._network is not None:  # set once created
            self._network.remove()
        self._network = None
        self._plan = None

    def docker_api(self) -> Any:
        """docker-py's low-level client (network connect and disconnect)."""
        if self.controller is None:
            raise RuntimeError("the cluster is not started: start() it (or use it as a context manager)")
        return self.controller.get_docker_client().client.api

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
