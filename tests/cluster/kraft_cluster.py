"""N brokers under one Apache Kafka KRaft controller, for tests: kbroker's (``kbroker serve`` with
process.roles=broker) or Apache Kafka's own (compat.apache_kafka.ApacheKafkaBroker), run the same way, so that a
test can take the same steps on both and compare what they answer.

As in tests/cluster/harness.py, every broker sits behind a FaultProxy and advertises it: clients and the other
brokers (replica fetchers) reach it through the proxy, while the controller is reached directly. Each broker
can be killed (SIGKILL), stopped (SIGTERM: a controlled shutdown) and started again on the same port and data;
its proxy can hold, drop or block (one broker's connections) what goes to and from it.

``ControllerView`` follows the controller's metadata log as an observer (as kbroker's broker role does) on a
thread of its own, so a test reads the quorum's committed image (leaders, epochs, ISR, fenced brokers) at any
time.

    with KRaftCluster(tmp_path, "kafka", size=3) as cluster:
        cluster.observe().wait(lambda image: ..., "what is waited for")
"""

from __future__ import annotations

import base64
import concurrent.futures
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import trio

from compat.apache_kafka import ApacheKafkaBroker, KafkaController
from kbroker.fault_proxy import FaultProxy, ProxyHost
from kbroker.kraft.metadata_follower import MetadataFollower
from kbroker.kraft.quorum import QuorumView, parse_voters
from kbroker.metadata.controller import MetadataCache
from kbroker.metadata.image import MetadataImage
from kbroker.pytest_plugin import DEFAULT_OVERRIDES
from kbroker.testing import BrokerProcess
from tests.cluster.harness import HOST, free_port, wait_for

Implementation = Literal["kbroker", "kafka"]
IMPLEMENTATIONS: tuple[Implementation, ...] = ("kbroker", "kafka")
START_SECONDS = 180.0  # a bound for one broker's start on two busy cores, never a measure
# The levels kbroker's broker role supports; Kafka's brokers run under the same controller settings.
CONTROLLER_FEATURES = {"share.version": 0, "streams.version": 0}
OBSERVER_ID = 9999


def format_data_dir(data_dir: Path, cluster_id: str, node_id: int) -> None:
    """What ``kafka-storage format -t CLUSTER_ID -c broker.properties`` writes in a broker's log directory."""
    data_dir.mkdir(parents=True)
    directory_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    (data_dir / "meta.properties").write_text(
        f"#\n#Written by kafka-storage format\nnode.id={node_id}\ndirectory.id={directory_id}\nversion=1\n"
        f"cluster.id={cluster_id}\n"
    )


class ControllerView:
    """The controller quorum's committed metadata, followed by an observer on a thread of its own."""

    def __init__(self, controller: KafkaController) -> None:
        self.controller = controller
        self.cache = MetadataCache()
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="controller-view", daemon=True)

    def start(self) -> ControllerView:
        self._thread.start()
        self._started.wait(60)
        return self

    def _run(self) -> None:
        quorum = QuorumView(list(parse_voters(self.controller.voters).values()), client_id="kbroker-test-observer")
        follower = MetadataFollower(
            quorum, self.cache, node_id=OBSERVER_ID, cluster_id=self.controller.cluster_id, max_wait_ms=100
        )

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            try:
                with trio.CancelScope() as self._cancel:
                    async with trio.open_nursery() as nursery:
                        await nursery.start(follower.run)
                        self._started.set()
            finally:
                with trio.CancelScope(shield=True):
                    await quorum.aclose()

        try:
            trio.run(main)
        except BaseException as exc:  # reported by wait()
            self._error = exc
        finally:
            self._started.set()

    @property
    def image(self) -> MetadataImage:
        return self.cache.image

    def wait(self, condition: Callable[[MetadataImage], bool], what: str, timeout: float = 120.0) -> MetadataImage:
        """The image once ``condition`` holds for it (AssertionError naming ``what`` after ``timeout``)."""

        def holds() -> bool:
            if self._error is not None:
                raise AssertionError(f"the controller observer failed: {self._error!r}")
            return condition(self.cache.image)

        wait_for(holds, what, timeout)
        return self.cache.image

    def close(self) -> None:
        token, cancel = self._token, self._cancel
        if token is not None and cancel is not None:
            try:
                trio.from_thread.run_sync(cancel.cancel, trio_token=token)
            except trio.RunFinishedError:
                pass
        self._thread.join(30)


class QuorumBroker:
    """One broker of either implementation behind its proxy."""

    def __init__(
        self,
        implementation: Implementation,
        root: Path,
        node_id: int,
        controller: KafkaController,
        settings: Mapping[str, str],
        proxy: FaultProxy,
    ) -> None:
        self.implementation = implementation
        self.node_id = node_id
        self.name = f"broker-{node_id}"
        self.proxy = proxy
        self.running = False
        self.kbroker: BrokerProcess | None = None
        self.kafka: ApacheKafkaBroker | None = None
        if implementation == "kbroker":
            data_dir = root / "data"
            format_data_dir(data_dir, controller.cluster_id, node_id)
            overrides = {
                **DEFAULT_OVERRIDES,
                "process.roles": "broker",
                "node.id": str(node_id),
                "controller.quorum.bootstrap.servers": controller.bootstrap,
                "controller.listener.names": "CONTROLLER",
                **settings,
            }
            self.kbroker = BrokerProcess(
                data_dir, overrides, host=HOST, port=free_port(), log_level="INFO", advertised=proxy.bootstrap
            )
        else:
            self.kafka = ApacheKafkaBroker(root, controller, node_id, dict(settings), advertised=proxy.bootstrap)

    def __repr__(self) -> str:
        return f"<{self.implementation} broker {self.node_id} {'running' if self.running else 'stopped'}>"

    @property
    def bootstrap(self) -> str:
        """The proxy: what the broker advertises, for clients."""
        return self.proxy.bootstrap

    @property
    def direct_bootstrap(self) -> str:
        """Where the process listens, bypassing the proxy (its metadata still names the proxy)."""
        port = self.kbroker.port if self.kbroker is not None else self.kafka.port if self.kafka is not None else 0
        return f"{HOST}:{port}"

    @property
    def data_dir(self) -> Path:
        if self.kbroker is not None:
            return self.kbroker.data_dir
        assert self.kafka is not None
        return self.kafka.data_dir

    @property
    def log_path(self) -> Path:
        if self.kbroker is not None:
            return self.kbroker.log_path
        assert self.kafka is not None
        return self.kafka.log_path

    @property
    def pid(self) -> int:
        process = self.kbroker.process if self.kbroker is not None else self.kafka.process if self.kafka else None
        assert process is not None, f"{self} is not running"
        return process.pid

    def partition_dir(self, topic: str, index: int) -> Path:
        """Where this broker keeps the partition's segments (the same layout in both implementations)."""
        return self.data_dir / f"{topic}-{index}"

    def start(self) -> QuorumBroker:
        assert not self.running, f"{self} is running"
        if self.kbroker is not None:
            self.kbroker.start(timeout=START_SECONDS)
        elif self.kafka is not None:
            self.kafka.start(timeout=START_SECONDS)
        host, _, port = self.direct_bootstrap.rpartition(":")
        self.proxy.set_upstream((host, int(port)))
        self.proxy.host.name_source(self.pid, self.name)
        self.running = True
        return self

    def stop(self) -> None:
        """SIGTERM: a controlled shutdown (leadership moves away first), then a clean stop."""
        if self.running:
            self.proxy.host.forget_source(self.pid)
        if self.kbroker is not None:
            self.kbroker.stop(timeout=START_SECONDS)
        elif self.kafka is not None:
            self.kafka.stop(timeout=START_SECONDS)
        self.running = False

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.running:
            self.proxy.host.forget_source(self.pid)
        if self.kbroker is not None:
            self.kbroker.kill()
        elif self.kafka is not None:
            self.kafka.kill()
        self.running = False

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-size:]
        except OSError:
            return ""


class KRaftCluster:
    """A KafkaController and ``size`` brokers (node ids 1..size) of one implementation under ``root``.

    ``broker_settings`` go to every broker and ``controller_settings`` to the controller, the same for both
    implementations.
    """

    def __init__(
        self,
        root: Path,
        implementation: Implementation,
        size: int = 3,
        broker_settings: Mapping[str, str] | None = None,
        controller_settings: Mapping[str, str] | None = None,
    ) -> None:
        self.root = Path(root)
        self.implementation = implementation
        self.size = size
        self.broker_settings = dict(broker_settings or {})
        self.controller = KafkaController(
            self.root / "controller", dict(controller_settings or {}), features=CONTROLLER_FEATURES
        )
        self.proxies = ProxyHost()
        self.brokers: list[QuorumBroker] = []
        self.view: ControllerView | None = None

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.bootstrap for broker in self.brokers)

    def broker(self, node_id: int) -> QuorumBroker:
        return next(broker for broker in self.brokers if broker.node_id == node_id)

    def observe(self) -> ControllerView:
        assert self.view is not None, "the cluster is not started"
        return self.view

    def start(self) -> KRaftCluster:
        self.proxies.start()
        try:
            self.controller.start()
            self.view = ControllerView(self.controller).start()
            for node_id in range(1, self.size + 1):
                root = self.root / f"broker-{node_id}"
                settings = self.broker_settings
                proxy = self.proxies.add_proxy()
                self.brokers.append(QuorumBroker(self.implementation, root, node_id, self.controller, settings, proxy))
            with concurrent.futures.ThreadPoolExecutor(self.size) as pool:
                for started in [pool.submit(broker.start) for broker in self.brokers]:
                    started.result()
        except BaseException:
            self.close()
            raise
        return self

    def cut(self, source: QuorumBroker, target: QuorumBroker) -> None:
        """Cut ``source``'s connections to ``target`` (its replica fetches) until ``target.proxy.heal()`` or
        ``unblock``. A connection is told apart by its process when accepted: one a broker made before its start
        named it (a fetcher connecting at once) is no one's, so those are reset too, and come back named."""
        target.proxy.block(source.name)
        for connection in target.proxy.connections():
            if connection.source is None:
                connection.drop()

    def restore(self) -> None:
        """Every broker running, reachable and unfenced: what a test leaves behind for the next one."""
        for broker in self.brokers:
            broker.proxy.heal()
        stopped = [broker for broker in self.brokers if not broker.running]
        with concurrent.futures.ThreadPoolExecutor(max(1, len(stopped))) as pool:
            for started in [pool.submit(broker.start) for broker in stopped]:
                started.result()
        ids = {broker.node_id for broker in self.brokers}
        self.observe().wait(
            lambda image: all(i in image.brokers and not image.brokers[i].fenced for i in ids),
            "every broker registered and unfenced",
        )

    def close(self) -> None:
        try:
            for broker in self.brokers:
                broker.stop()
            if self.view is not None:
                self.view.close()
            self.controller.stop()
        finally:
            self.proxies.close()

    def __enter__(self) -> KRaftCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
