"""``kbroker serve`` with ``process.roles=broker``: the broker role under Kafka's KRaft controller quorum.

One service ties the parts together as Kafka's BrokerServer starts them: the metadata follower feeds the broker's
MetadataCache, the lifecycle manager registers the broker's listeners and features and heartbeats with the applied
offset, and the forwarding controller (kbroker/kraft/forwarding.py) keeps a producer id block ahead. As Kafka's
broker, it enables request processing only once the controller has unfenced it: the service reports started
(and the server after it starts accepting) then. A clean stop is a controlled shutdown first, so the controller
moves leadership away before the listeners close.

The metadata the broker applied is kept in its own ``__cluster_metadata-0`` (as Kafka's broker keeps it): a
restart publishes that image at once and fetches on from there; its replica layer acts on leadership only once
the follower has caught up with the quorum (kbroker/replication/manager.py ``start_acting``), as Kafka's broker.
A broker no controller registers and unfences within ``initial.broker.registration.timeout.ms`` stops with one
line, as Kafka's does.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from pathlib import Path

import trio

from kbroker.config import BrokerConfig
from kbroker.durable.files import write_atomically
from kbroker.kraft import BrokerRoleError
from kbroker.kraft.forwarding import QuorumController
from kbroker.kraft.lifecycle import BrokerLifecycleManager, BrokerListener
from kbroker.kraft.metadata_follower import MetadataFollower
from kbroker.kraft.node_security import PLAINTEXT_NODE, NodeSecurity
from kbroker.kraft.quorum import QuorumView, parse_bootstrap, parse_voters
from kbroker.metadata.controller import Listener, MetadataCache
from kbroker.metadata.features import KRAFT_BROKER_FEATURES
from kbroker.metadata.log import MetadataLog
from kbroker.metadata.snapshots import SnapshotPolicy

log = logging.getLogger("kbroker.kraft")

CONTROLLED_SHUTDOWN_SECONDS = 30.0  # as long as Kafka's broker waits for it before stopping anyway
FETCH_WAIT_MS = 500  # Kafka's replica.fetch.wait.max.ms default: how long a metadata fetch waits for records
REQUEST_TIMEOUT_MS = 30000  # Kafka's request.timeout.ms default: how long a forwarded request may take
# The broker epoch of the last clean stop, as Kafka keeps it in its clean-shutdown file: written once the logs are
# closed cleanly after a controlled shutdown, read (and removed) at the next start.
CLEAN_EPOCH_FILE = ".kbroker_broker_epoch"


def quorum_addresses(config: BrokerConfig) -> list[tuple[str, int]]:
    """Where the controllers are: controller.quorum.bootstrap.servers, else controller.quorum.voters."""
    bootstrap = config["controller.quorum.bootstrap.servers"]
    if bootstrap:
        return parse_bootstrap(bootstrap)
    return list(parse_voters(config["controller.quorum.voters"]).values())


class BrokerRole:
    """The broker's KRaft parts and the service that runs them (``run``) and stops them under control."""

    def __init__(
        self,
        config: BrokerConfig,
        cache: MetadataCache,
        *,
        node_id: int,
        cluster_id: str,
        directory_id: uuid.UUID,
        metadata_log: MetadataLog | None = None,
        data_dir: Path | None = None,
        security: NodeSecurity = PLAINTEXT_NODE,
    ) -> None:
        """``metadata_log``: the broker's local copy of the quorum's log, read back here (None: memory only);
        ``data_dir``: where the epoch of a clean stop is kept (None: nowhere); ``security``: how the controllers
        are reached (their listener's TLS and SASL)."""
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.directory_id = directory_id
        self.heartbeat_interval_ms = config["broker.heartbeat.interval.ms"]
        self.registration_timeout = config["initial.broker.registration.timeout.ms"] / 1000
        self.data_dir = data_dir
        self.previous_broker_epoch = self._take_clean_epoch()
        self.quorum = QuorumView(quorum_addresses(config), client_id=f"kbroker-broker-{node_id}", security=security)
        self.follower = MetadataFollower(
            self.quorum,
            cache,
            node_id=node_id,
            cluster_id=cluster_id,
            max_wait_ms=FETCH_WAIT_MS,
            metadata_log=metadata_log,
            snapshots=SnapshotPolicy.from_config(config),
        )
        self.follower.restore()
        self.lifecycle: BrokerLifecycleManager | None = None
        self.controller = QuorumController(
            self.quorum,
            cache,
            sync=self.follower.sync,
            node_id=node_id,
            broker_epoch=lambda: self.lifecycle.broker_epoch if self.lifecycle is not None else -1,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )

    def register(self, listeners: Sequence[Listener]) -> None:
        """The listeners the broker registers with (its advertised addresses, known once they are bound)."""
        self.lifecycle = BrokerLifecycleManager(
            self.quorum,
            node_id=self.node_id,
            cluster_id=self.cluster_id,
            listeners=[BrokerListener(*listener) for listener in listeners],
            features=KRAFT_BROKER_FEATURES,
            log_dirs=[self.directory_id],
            applied_offset=lambda: self.follower.applied_offset,
            caught_up=self.follower.caught_up.is_set,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            previous_broker_epoch=self.previous_broker_epoch,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the metadata log, register and heartbeat; report started once the controller unfenced the
        broker. Runs until cancelled (after a controlled shutdown it only waits to be)."""
        lifecycle = self.lifecycle
        assert lifecycle is not None, "register() names the listeners first"
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.follower.run)
                await nursery.start(lifecycle.run)
                log.info("waiting for the controller quorum to unfence broker %d", self.node_id)
                with trio.move_on_after(self.registration_timeout):
                    await lifecycle.unfenced.wait()
                if not lifecycle.unfenced.is_set():
                    where = ", ".join(f"{host}:{port}" for host, port in self.quorum.bootstrap)
                    what = "unfenced" if lifecycle.registered.is_set() else "registered"
                    failure = "" if lifecycle.last_failure is None else f"; last failure: {lifecycle.last_failure}"
                    raise BrokerRoleError(
                        f"no KRaft controller at {where} {what} broker {self.node_id} within "
                        f"{self.registration_timeout:g} s (initial.broker.registration.timeout.ms; is the controller "
                        f"quorum running, and are these its controller listeners?){failure}"
                    )
                await nursery.start(self.controller.run)
                log.info("broker %d unfenced (broker epoch %d)", self.node_id, lifecycle.broker_epoch)
                task_status.started()
                await trio.sleep_forever()  # the lifecycle manager returns after a controlled shutdown
        finally:
            with trio.CancelScope(shield=True):
                await self.quorum.aclose()

    def keep_clean_epoch(self) -> None:
        """After a controlled shutdown whose logs closed cleanly: keep the broker epoch for the next registration."""
        lifecycle = self.lifecycle
        if self.data_dir is not None and lifecycle is not None and lifecycle.shutdown_allowed.is_set():
            write_atomically(self.data_dir / CLEAN_EPOCH_FILE, f"{lifecycle.broker_epoch}\n", sync_directory=True)

    def _take_clean_epoch(self) -> int:
        """The epoch a clean stop kept, removed so that a crash after this start cannot claim it (-1: none)."""
        if self.data_dir is None:
            return -1
        path = self.data_dir / CLEAN_EPOCH_FILE
        try:
            text = path.read_text().strip()
        except (OSError, UnicodeDecodeError):
            return -1
        path.unlink(missing_ok=True)
        return int(text) if text.isdigit() else -1

    async def controlled_shutdown(self, timeout: float = CONTROLLED_SHUTDOWN_SECONDS) -> None:
        """Ask the controller to move leadership away and wait until it allows the shutdown (or ``timeout``)."""
        lifecycle = self.lifecycle
        if lifecycle is None or not lifecycle.registered.is_set():
            return
        log.info("controlled shutdown: asking the controller quorum to move leadership off broker %d", self.node_id)
        lifecycle.begin_controlled_shutdown()
        with trio.move_on_after(timeout):
            await lifecycle.shutdown_allowed.wait()
            log.info("controlled shutdown allowed by the controller quorum")
            return
        log.warning("the controller quorum did not allow a controlled shutdown within %g s: stopping anyway", timeout)
