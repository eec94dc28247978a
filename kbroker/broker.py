"""The broker: configuration, storage and coordination state shared by every connection.

Networking (kbroker/server), storage (kbroker/storage) and group coordination (kbroker/groups) are
separate layers; this object is what ties them together for the request handlers in kbroker/apis. It imports
neither the network layer nor the handlers: kbroker/app.py composes them (tests/broker/test_app.py checks it).
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

import trio

from kbroker.config import BrokerConfig
from kbroker.coordinators.migration import migrate_offsets_journal, migrate_transactions_journal
from kbroker.durable.files import DamagedFileError, lock_data_dir, write_atomically
from kbroker.dynamic_config import DynamicBrokerConfig
from kbroker.fetch_sessions import FetchSessionCache
from kbroker.groups.offsets import OffsetStore
from kbroker.groups.timers import CoordinatorTimers
from kbroker.metadata.controller import METADATA_VERSION_LEVEL, Listener, LocalController, MetadataCache
from kbroker.metadata.features import SUPPORTED_LEVELS
from kbroker.metadata.image import ConfigResourceType, LocalChanges, MetadataDelta, MetadataImage
from kbroker.metadata.log import MetadataLog
from kbroker.metadata.migration import (
    SASL_USERS_FILE,
    migrate_acl_file,
    migrate_features,
    migrate_older_files,
    migrate_producer_id_block,
    migrate_topic_catalog,
    written_before_features,
)
from kbroker.metadata.snapshots import SnapshotPolicy
from kbroker.metrics import BrokerMetrics
from kbroker.quotas import ClientQuotas
from kbroker.replication import IsrProposal, Partition, ReplicaManager, read_high_watermarks
from kbroker.replication.fetcher import Address, FetcherSettings, ReplicaFetcherManager
from kbroker.security.acls import Authorizer
from kbroker.storage import LogManager, PartitionLog, TopicInfo
from kbroker.storage.manager import CLEAN_SHUTDOWN_FILE
from kbroker.topics import InternalTopicCreation, TopicService
from kbroker.transactions.coordinator import TransactionCoordinator
from kbroker.transactions.remote import RemoteTransactions
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from kbroker.groups.consumer_group import ConsumerGroupCoordinator
    from kbroker.groups.coordinator import GroupCoordinator
    from kbroker.groups.router import GroupRouter
    from kbroker.kraft.forwarding import QuorumController
    from kbroker.kraft.role import BrokerRole
    from kbroker.security.scram_credentials import ScramCredentials

log = logging.getLogger("kbroker")


class Endpoint(NamedTuple):
    host: str
    port: int


class OpenConnection(Protocol):
    """What the broker needs of a client connection (kbroker.server.connection.Connection) to drain it."""

    def stop_reading(self) -> None: ...


def new_cluster_id() -> str:
    # Kafka's cluster ids are a random UUID in URL-safe base64 without padding (22 characters).
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class Broker:
    def __init__(
        self,
        config: BrokerConfig,
        data_dir: Path,
        advertised: Endpoint,
        *,
        logs: LogManager | None = None,
        listeners: list[Listener] | None = None,
    ) -> None:
        """``listeners``: the endpoints this broker registers with (default: ``advertised`` as PLAINTEXT)."""
        self.config = config
        self.data_dir = data_dir
        self.advertised = advertised
        self.listen = advertised  # where it listens: set by whoever opened the listener (kbroker.app)
        # Each listener's advertised address by listener name; ``advertised`` serves a name not in it.
        self.advertised_by_listener: dict[str, Endpoint] = {}
        self.listeners: list[tuple[str, Endpoint]] = []  # (name, bound address) of each listener served
        self.node_id: int = config["node.id"]
        self.started_ms = int(time.time() * 1000)  # the group coordinator, made later, ages offsets from here
        self._data_dir_lock = lock_data_dir(data_dir)  # created if missing; held until close()
        # process.roles=broker: a broker under Kafka's KRaft controller quorum (kbroker/kraft), not its own controller.
        self.kraft: BrokerRole | None = None
        self.controller: LocalController | QuorumController
        try:
            self.metadata = MetadataCache()
            if config["process.roles"] == "broker":
                self.cluster_id, directory_id = self._load_formatted_meta()
                self.controller = self._join_quorum(directory_id, durable=logs is None)
            else:
                self.cluster_id = self._load_meta()
                # The cluster's metadata: the image, and this node as its own controller. With logs kept in memory
                # (unit tests) the metadata is too; otherwise it is the metadata log __cluster_metadata-0.
                self.controller = self._open_controller(durable=logs is None)
            self.register(listeners or [Listener("PLAINTEXT", advertised.host, advertised.port, 0)])
            # The effective settings: the static config with the image's dynamic broker configs over it.
            self.dynamic_config = DynamicBrokerConfig(config, self.node_id, self.metadata.image)
            # An older kbroker's producer id block, once (it names this registration).
            if logs is None and isinstance(self.controller, LocalController):
                migrate_producer_id_block(self.controller, data_dir, self.node_id)
            # InitProducerId hands out ids from blocks the controller allocates (ProducerIdsRecords): a block is
            # committed before any id in it is used, so a restart never hands an id out twice.
            self._producer_ids = range(0)
            self._next_producer_id = 0
            # Where reopened logs' high watermarks start (a damaged file stops start-up, see kbroker/replication).
            high_watermarks = read_high_watermarks(data_dir)
            # ``logs``: a store given by the caller (one kept in memory, in unit tests); files in data_dir by default.
            if logs is None:
                catalog = [
                    TopicInfo(topic.name, topic.topic_id, len(topic.partitions), dict(self._topic_configs(topic.name)))
                    for topic in self.metadata.image.topics.by_id.values()
                ]
                logs = LogManager(
                    data_dir,
                    self.dynamic_config.current.topic_defaults(),
                    catalog=catalog,
                    high_watermarks=high_watermarks,
                )
            else:
                logs.set_topic_defaults(self.dynamic_config.current.topic_defaults())
            self.logs = logs
            self.metadata.subscribe(self.dynamic_config.publish)
            self.dynamic_config.listeners.append(lambda current: self.logs.set_topic_defaults(current.topic_defaults()))
            # The replica layer between handlers and logs: each replica's role and leader epoch are the image's,
            # read as its log opens and changed by each delta (the first subscriber: roles change before the
            # topic service deletes a removed topic's logs).
            self.replicas = ReplicaManager(
                self.logs,
                self.node_id,
                self.metadata,
                data_dir,
                checkpointed=high_watermarks,
                checkpoint_interval_ms=config["replica.high.watermark.checkpoint.interval.ms"],
                lag_time_max_ms=config["replica.lag.time.max.ms"],
                alter_partition=self._alter_partition,
                eligible=self._isr_eligible,
                fetchers=ReplicaFetcherManager(
                    self.node_id,
                    address_of=self._inter_broker_address,
                    broker_epoch=self._broker_epoch,
                    topic_id_of=self._topic_id,
                    clock=lambda: int(time.time() * 1000),
                    settings=FetcherSettings(
                        wait_max_ms=config["replica.fetch.wait.max.ms"],
                        min_bytes=config["replica.fetch.min.bytes"],
                        max_bytes=config["replica.fetch.max.bytes"],
                        response_max_bytes=config["replica.fetch.response.max.bytes"],
                        backoff_ms=config["replica.fetch.backoff.ms"],
                    ),
                    security=None if self.kraft is None else self.cluster_security.inter_broker,
                ),
                # Under a KRaft quorum the image replayed from the local metadata log may be stale: the replicas
                # act once the follower has caught up with the quorum (``_act_on_current_image``).
                acting=self.kraft is None,
            )
            if self.kraft is None:
                self.replicas.open_followers(self._followed_partitions())
            else:
                self.kraft.follower.on_caught_up(self._act_on_current_image)
            self.metadata.subscribe(self._apply_to_replicas)
            self.logs.opened = self.replicas.adopt  # a log opened by anyone is a replica at once
            # Committed offsets: the shards of __consumer_offsets (kbroker/groups/offsets.py), loaded here.
            self.offsets = OffsetStore(
                self.logs,
                partitions=config["offsets.topic.num.partitions"],
                segment_bytes=config["offsets.topic.segment.bytes"],
                replicas=self.replicas,
            )
            self.topics = TopicService(
                self.logs, self.offsets, config, self.controller, self.metadata, self.node_id, self.replicas
            )
            if self.logs.durable:  # partitions an image gives this broker get their files as it arrives
                self.replicas.build_logs = self.topics.build_published
            if self.kraft is not None:  # FindCoordinator asks for internal topics without waiting, as Kafka's broker
                self.topics.internal_creation = InternalTopicCreation(self.topics)
            # An internal topic a coordinator needs at once is created through the controller, as any other.
            self.offsets.create_topic = self.topics.create_now
            if self.logs.durable:  # the offsets journal of an older kbroker, once
                migrate_offsets_journal(data_dir, self.offsets)
            # Client quotas: the image's, enforced from each image that changes them.
            self.quotas = ClientQuotas(
                window_samples=config["quota.window.num"], window_seconds=config["quota.window.size.seconds"]
            )
            self.quotas.publish(self.metadata.image, MetadataDelta(self.metadata.image))
            self.metadata.subscribe(self.quotas.publish)
        except BaseException:
            self._close_metadata_log()
            self._data_dir_lock.release()
            raise
        # The ACL authorizer when authorizer.class.name names one (kbroker/security/authorizer.py); None: allow
        # all. It decides over the ACLs of the metadata image, told of each new one.
        self.authorizer: Authorizer | None = None
        if str(config["authorizer.class.name"]).strip():
            from kbroker.security.authorizer import StandardAuthorizer

            standard = StandardAuthorizer.from_config(config)
            if standard is not None:
                standard.publish(self.metadata.image, MetadataDelta(self.metadata.image))
                self.metadata.subscribe(standard.publish)
            self.authorizer = standard
        self.fetch_sessions = FetchSessionCache(config["max.incremental.fetch.session.cache.slots"])
        self.metrics = BrokerMetrics()  # counters the request path updates (kbroker/metrics.py)
        # One timer service for every coordinator (kbroker.groups.timers); each registers with it.
        self.coordinator_timers = CoordinatorTimers()
        try:
            self.transactions = TransactionCoordinator(
                data_dir,
                allocate_producer_id=self.allocate_producer_id,
                partition=self.topics.partition,
                offsets=self.offsets,
                max_timeout_ms=config["transaction.max.timeout.ms"],
                id_expiration_ms=config["transactional.id.expiration.ms"],
                runtime=self.coordinator_timers,
                logs=self.logs,
                state_partitions=config["transaction.state.log.num.partitions"],
                segment_bytes=config["transaction.state.log.segment.bytes"],
                offsets_partitions=config["offsets.topic.num.partitions"],
                replicas=self.replicas,
            )
            self.transactions.create_topic = self.topics.create_now
            if self.kraft is not None:  # markers and verification with the other brokers of the cluster
                self.transactions.remote = RemoteTransactions(
                    self.node_id,
                    leader_of=self._partition_leader,
                    address_of=self._inter_broker_address,
                    written=self.transactions.remote_marker_written,
                    owed=self.transactions.owes_marker,
                    security=self.cluster_security.inter_broker,
                )
                self.transactions.acting = self.kraft.follower.caught_up.is_set
            if self.logs.durable:  # the transactions journal of an older kbroker, once
                migrate_transactions_journal(data_dir, self.transactions)
            # Transactions a crash left half-ended get their markers; after an unclean stop, lost ones too. Not under
            # a KRaft quorum: there a PrepareX is completed when its partition is loaded as leader (wherever its
            # partitions are led), and markers are on the ISR before they count as written, so none is lost with
            # one broker's torn tail; reconciling from this broker's own replicas, before the image is current,
            # would read follower logs that lag their leaders and end transactions that are not over.
            if self.kraft is None:
                self.transactions.recover(reconcile_markers=not self.logs.clean_start)
        except BaseException:  # a damaged transactions journal: start-up stops, the data dir is left unlocked
            self.logs.close()
            self.offsets.close()
            self._close_metadata_log()
            self._data_dir_lock.release()
            raise
        self.draining = False
        self.accepting = trio.CancelScope()  # cancelled to stop accepting new connections
        self.open_connections: dict[int, OpenConnection] = {}  # connection id -> its connection
        self._drain_listeners: set[Callable[[], None]] = set()

    def _apply_to_replicas(self, image: MetadataImage, delta: MetadataDelta) -> None:
        self.replicas.apply_delta(delta.local_changes(self.node_id))

    def _act_on_current_image(self) -> None:
        """The metadata follower caught up with the quorum: as Kafka's broker, once its initial catch-up is done,
        publishes its first image to the replica manager and coordinators, the replica layer now acts on the current
        image, given as one delta (each partition whose leader or epoch changed while this broker was down is handled
        once, with its current registration), and the coordinators load the shards this broker leads."""
        changes = LocalChanges()
        node = self.node_id
        for topic in self.metadata.image.topics.by_id.values():
            for index, registration in topic.partitions.items():
                if node in registration.replicas:
                    placed = changes.leaders if registration.leader == node else changes.followers
                    placed[(topic.name, index)] = registration
        self.replicas.start_acting(changes)
        self.offsets.load_led_shards()
        self.transactions.load_led_shards()

    async def _alter_partition(self, partition: Partition, proposal: IsrProposal) -> None:
        """Send a leader's ISR change to the controller, as Kafka's AlterPartitionManager does."""
        topic = self.metadata.image.topics.get(partition.topic)
        broker = self.metadata.image.brokers.get(self.node_id)
        if topic is None or broker is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{partition.topic} is not in the metadata image")
        await self.controller.alter_partition(
            self.node_id,
            broker.epoch,
            topic.topic_id,
            partition.index,
            leader_epoch=proposal.leader_epoch,
            partition_epoch=proposal.partition_epoch,
            isr=proposal.isr,
        )

    def _inter_broker_address(self, broker_id: int) -> Address | None:
        """A broker's endpoint on the inter-broker listener, as the image registered it (Kafka's
        inter.broker.listener.name, else the listener named after security.inter.broker.protocol)."""
        broker = self.metadata.image.brokers.get(broker_id)
        if broker is None:
            return None
        name = self.config["inter.broker.listener.name"] or self.config["security.inter.broker.protocol"]
        endpoint = broker.endpoints.get(name.strip().upper())
        return None if endpoint is None else Address(endpoint.host, endpoint.port, endpoint.security_protocol)

    def _partition_leader(self, topic: str, index: int) -> int | None:
        """A partition's leader in the image (-1: none now); None if the image has no such partition."""
        registration = self.replicas.leadership.partition(topic, index)
        return None if registration is None else registration.leader

    def _broker_epoch(self) -> int:
        broker = self.metadata.image.brokers.get(self.node_id)
        return -1 if broker is None else broker.epoch

    def _topic_id(self, name: str) -> uuid.UUID | None:
        topic = self.metadata.image.topics.get(name)
        return None if topic is None else topic.topic_id

    def _followed_partitions(self) -> list[tuple[str, int]]:
        """The partitions the image makes this broker follow (their logs open at start-up, to fetch into)."""
        node = self.node_id
        return [
            (topic.name, index)
            for topic in self.metadata.image.topics.by_id.values()
            for index, registration in topic.partitions.items()
            if node in registration.replicas and registration.leader != node
        ]

    def _isr_eligible(self, broker_id: int, broker_epoch: int) -> bool:
        """Kafka's isReplicaIsrEligible: registered, unfenced, not shutting down, fetching in its current epoch."""
        broker = self.metadata.image.brokers.get(broker_id)
        return (
            broker is not None
            and not broker.fenced
            and not broker.in_controlled_shutdown
            and broker_epoch in (-1, broker.epoch)
        )

    # --- group coordinators: made by the first request (or check) that needs one --------------------------
    # What they keep is in ``offsets`` (committed offsets, classic groups' GroupMetadata and consumer groups'
    # ConsumerGroup* records, restored when each coordinator is made), so nothing is lost by making them late, and
    # ``kbroker serve`` answers its first requests without importing them (about 10 ms). The group handlers import
    # their modules (kbroker.server.connection.load_handlers does so soon after start-up).

    @cached_property
    def groups(self) -> GroupCoordinator:
        """The classic group coordinator (JoinGroup, SyncGroup, Heartbeat...)."""
        from kbroker.groups.coordinator import GroupCoordinator

        coordinator = GroupCoordinator(
            min_session_timeout_ms=self.config["group.min.session.timeout.ms"],
            max_session_timeout_ms=self.config["group.max.session.timeout.ms"],
            initial_rebalance_delay_ms=self.config["group.initial.rebalance.delay.ms"],
            max_size=self.config["group.max.size"],
            runtime=self.coordinator_timers,
            started_ms=self.started_ms,
            store=self.offsets,  # each generation is written to __consumer_offsets, as Kafka's GroupMetadata
        )
        offsets = self.offsets  # the groups as a restart finds them, then as shards load and unload
        offsets.serve_groups(lambda p: coordinator.restore(offsets.stored_groups(p)), coordinator.unload)
        return coordinator

    @cached_property
    def consumer_groups(self) -> ConsumerGroupCoordinator:
        """The KIP-848 consumer group coordinator (ConsumerGroupHeartbeat)."""
        from kbroker.groups.assignors import TopicMetadata
        from kbroker.groups.consumer_group import ConsumerGroupCoordinator

        coordinator = ConsumerGroupCoordinator(
            topics=lambda: (TopicMetadata(t.topic_id, t.name, t.partitions) for t in self.logs.topics()),
            session_timeout_ms=self.config["group.consumer.session.timeout.ms"],
            heartbeat_interval_ms=self.config["group.consumer.heartbeat.interval.ms"],
            max_size=self.config["group.consumer.max.size"],
            assignors=self.config["group.consumer.assignors"].split(","),
            classic=self.groups,
            runtime=self.coordinator_timers,
            group_configs=lambda group_id: self.metadata.image.config(ConfigResourceType.GROUP, group_id),
            store=self.offsets,  # each change is written to __consumer_offsets, as Kafka's ConsumerGroup* records
            authorizing=lambda: self.authorizer is not None,
        )
        offsets = self.offsets  # the groups as a restart finds them, then as shards load and unload
        offsets.serve_groups(lambda p: coordinator.restore(offsets.stored_consumer_groups(p)), coordinator.unload)
        return coordinator

    @cached_property
    def group_router(self) -> GroupRouter:
        """Which coordinator a group id belongs to."""
        from kbroker.groups.router import GroupRouter

        return GroupRouter(self.groups, self.consumer_groups, self.offsets)

    @cached_property
    def scram_credentials(self) -> ScramCredentials:
        """The SCRAM credentials of the metadata image, for logins and DescribeUserScramCredentials (their module
        is imported by the first use: a broker without SCRAM users starts without it)."""
        from kbroker.security.scram_credentials import ScramCredentials

        return ScramCredentials(self.metadata, self.data_dir if self.controller.metadata_log is not None else None)

    def configure_sasl_users(self, users: Sequence[tuple[str, str]]) -> tuple[list[str], list[str], list[str]]:
        """``--sasl-user``'s users made the command line's SCRAM users, at start-up (kbroker/security/
        scram_credentials.py, imported only when there are some, now or from an earlier start): the users removed,
        then every user, from the command line and from the API (names only)."""
        if users and self.kraft is not None:
            raise ValueError(
                "is for a single node: under a KRaft controller quorum create SCRAM users with kafka-configs"
            )
        if isinstance(self.controller, LocalController) and (users or (self.data_dir / SASL_USERS_FILE).exists()):
            done = self.scram_credentials.configure_users(self.controller, users)
            return done.removed, done.from_command_line, done.from_api
        return [], [], sorted({user for user, _ in self.metadata.image.scram_credentials})

    def advertised_for(self, listener: str) -> Endpoint:
        """The address clients of ``listener`` are given (Kafka answers with the listener a request came in on)."""
        return self.advertised_by_listener.get(listener, self.advertised)

    # --- metadata ----------------------------------------------------------------------------------------

    def _open_controller(self, *, durable: bool) -> LocalController:
        metadata_log = MetadataLog(self.data_dir) if durable else None
        try:
            controller = LocalController(
                self.node_id, self.metadata, metadata_log, SnapshotPolicy.from_config(self.config)
            )
            # No start has got as far as registering: the data directory may be an older kbroker's.
            fresh = not controller.image.brokers
            older_log = written_before_features(controller)
            controller.bootstrap()
            if durable:
                migrate_topic_catalog(controller, self.data_dir, fresh=fresh)
                migrate_acl_file(controller, self.data_dir)
                migrate_older_files(controller, self.data_dir)
                migrate_features(controller, self.data_dir, older_log=older_log)
        except BaseException:
            if metadata_log is not None:
                metadata_log.close()
            raise
        return controller

    def _join_quorum(self, directory_id: uuid.UUID, *, durable: bool) -> QuorumController:
        """The broker role's parts (kbroker/kraft): the metadata follows the quorum's log (its local copy read back
        first), admin goes to its active controller."""
        from kbroker.kraft.node_security import cluster_security
        from kbroker.kraft.role import BrokerRole

        # TLS and SASL towards the controllers and the other brokers: a mistake stops the start in one line.
        self.cluster_security = cluster_security(self.config)
        metadata_log = MetadataLog(self.data_dir) if durable else None
        try:
            self.kraft = BrokerRole(
                self.config,
                self.metadata,
                node_id=self.node_id,
                cluster_id=self.cluster_id,
                directory_id=directory_id,
                metadata_log=metadata_log,
                data_dir=self.data_dir if durable else None,
                security=self.cluster_security.controller,
            )
        except BaseException:
            if metadata_log is not None:
                metadata_log.close()
            raise
        return self.kraft.controller

    def _topic_configs(self, name: str) -> dict[str, str]:
        return dict(self.metadata.image.config(ConfigResourceType.TOPIC, name))

    def _close_metadata_log(self) -> None:
        kraft = self.__dict__.get("kraft")
        if kraft is not None and kraft.follower.metadata_log is not None:
            kraft.follower.metadata_log.close()
        controller = self.__dict__.get("controller")
        if controller is not None and controller.metadata_log is not None:
            controller.metadata_log.close()

    def register(self, listeners: list[Listener]) -> None:
        """Register this broker with the controller: its listeners as clients reach them, its features."""
        if self.kraft is not None:  # the lifecycle manager registers with the quorum once the broker runs
            self.kraft.register(listeners)
            return
        # As Kafka's brokers: every feature it supports, so the controller refuses a level it could not serve.
        features = {"metadata.version": (7, METADATA_VERSION_LEVEL), **SUPPORTED_LEVELS}
        self.controller.register_broker(self.node_id, listeners, features)

    # --- persisted identity ----------------------------------------------------------------------------

    def _load_meta(self) -> str:
        path = self.data_dir / "meta.properties"
        if path.exists():
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                raise DamagedFileError(path, "not a text file") from None
            values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and line[0] != "#")
            node_text = values.get("node.id", str(self.node_id))
            if not node_text.strip().lstrip("-").isdigit():
                raise DamagedFileError(path, f"node.id {node_text!r} is not an integer")
            stored_node = int(node_text)
            if stored_node != self.node_id:
                raise SystemExit(
                    f"{path} belongs to node.id {stored_node}, but this broker is configured as {self.node_id}"
                )
            if not values.get("cluster.id"):
                raise DamagedFileError(path, "no cluster.id")
            return values["cluster.id"]
        cluster_id = new_cluster_id()
        write_atomically(path, f"version=1\ncluster.id={cluster_id}\nnode.id={self.node_id}\n")
        return cluster_id

    def _load_formatted_meta(self) -> tuple[str, uuid.UUID]:
        """A broker-role data directory's cluster id and directory id, from the meta.properties Kafka's storage
        tool writes (``kafka-storage format -t CLUSTER_ID -c broker.properties``); a directory id is added if the
        file has none. Nothing is invented: the cluster id is the controllers'."""
        path = self.data_dir / "meta.properties"
        if not path.exists():
            raise SystemExit(
                f"{path} is missing: a broker under a KRaft controller quorum needs its data directory formatted "
                "with the cluster's id (kbroker format -t CLUSTER_ID -c broker.properties, "
                "or Kafka's kafka-storage format)"
            )
        cluster_id = self._load_meta()
        values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and line[0] != "#")
        try:
            return cluster_id, uuid.UUID(bytes=base64.urlsafe_b64decode(values["directory.id"] + "=="))
        except (KeyError, ValueError):
            directory_id = uuid.uuid4()
            text = base64.urlsafe_b64encode(directory_id.bytes).decode().rstrip("=")
            write_atomically(path, f"version=1\ncluster.id={cluster_id}\nnode.id={self.node_id}\ndirectory.id={text}\n")
            return cluster_id, directory_id

    def allocate_producer_id(self) -> int:
        """The next producer id of this broker's block; a new block from the controller when it is used up
        (KafkaError COORDINATOR_LOAD_IN_PROGRESS while the controller cannot commit one at once, as Kafka's broker
        answers while its next block is on its way)."""
        if self._next_producer_id >= self._producer_ids.stop:
            broker = self.metadata.image.brokers[self.node_id]
            self._producer_ids = self.controller.allocate_producer_ids_now(self.node_id, broker.epoch)
            self._next_producer_id = self._producer_ids.start
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        return producer_id

    # --- topics ----------------------------------------------------------------------------------------

    def topic(self, name: str) -> TopicInfo | None:
        return self.topics.topic(name)

    def partition(self, topic: str, partition: int) -> PartitionLog | None:
        return self.topics.partition(topic, partition)

    # --- shutdown wake-ups ------------------------------------------------------------------------------

    def on_drain(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` when draining starts (a long-polling fetch answers at once); returns the unsubscribe."""
        self._drain_listeners.add(listener)
        return lambda: self._drain_listeners.discard(listener)

    def connection_closed(self, connection_id: int) -> None:
        """Forget per-connection state."""
        self.open_connections.pop(connection_id, None)

    # --- offsets expiry (run by kbroker.services.OffsetExpiryService) ---------------------------------

    def expire_offsets(self, now_ms: int, retention_ms: int) -> int:
        expired = 0
        for group_id in self.offsets.groups():
            if self.group_router.has_members(group_id):
                continue
            base_ms = self.groups.offset_expiry_base_ms(group_id)
            expired += self.offsets.expire(group_id, now_ms - retention_ms, now_ms, base_ms)
        # Kafka's clean-up: an Empty classic group with no offsets left is gone (Dead).
        self.groups.forget_empty_groups(keep=self.offsets.has_group)
        if expired:
            log.info("expired %d committed offset(s)", expired)
        return expired

    def begin_drain(self) -> None:
        self.draining = True
        if "groups" in self.__dict__:  # made by a group request: its waiting joins answer now
            self.groups.wake_all()
        self.accepting.cancel()
        for connection in list(self.open_connections.values()):
            connection.stop_reading()  # each answers what it already received, then closes
        for listener in list(self._drain_listeners):
            listener()

    def close(self) -> None:
        try:
            self.replicas.close()  # the high watermarks' last checkpoint
            self.logs.close()
            self.offsets.close()
            self.transactions.close()
            if self.kraft is not None and (self.data_dir / CLEAN_SHUTDOWN_FILE).exists():
                self.kraft.keep_clean_epoch()  # only once the logs are known clean: the controller trusts them
            self._close_metadata_log()
        finally:
            self._data_dir_lock.release()
