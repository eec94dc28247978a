"""Topics as the request handlers see them: look-ups, and changes made through the controller.

Topics live in the metadata image (kbroker/metadata): creating, growing, deleting a topic and changing its
configs are controller operations, and this service, subscribed to the broker's MetadataCache, keeps the log
manager (kbroker/storage) in step with each new image: partitions this broker holds a replica of are known to
it (their files made on first use), those it no longer holds are deleted with their committed offsets. One
creation per name is under way at a time (auto-creation waits for a creation already under way). Handlers
reach it as ``RequestContext.topics``; leader, epochs, replicas and ISR are read from ``image``.
"""

from __future__ import annotations

import logging
import uuid

import trio

from kbroker.config import BrokerConfig
from kbroker.durable.files import StorageError
from kbroker.groups.offsets import OFFSETS_TOPIC, OffsetStore
from kbroker.metadata.controller import AdminController, Controller, MetadataCache
from kbroker.metadata.image import ConfigResourceType, MetadataDelta, MetadataImage, PartitionRegistration
from kbroker.replication import ReplicaManager
from kbroker.storage import LogManager, PartitionLog, TopicInfo
from kbroker.transactions.state_log import TRANSACTION_TOPIC, transaction_topic_configs
from protocol.errors import ErrorCode, KafkaError

log = logging.getLogger("kbroker")


# Kafka's internal topics: Metadata marks them is_internal.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_TOPIC})


def unknown_topic(name: str) -> KafkaError:
    return KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")


class InternalTopicCreation:
    """Under a KRaft controller quorum, the internal topics FindCoordinator needs are created in the background, as
    Kafka's AutoTopicCreationManager creates them: the request that finds one missing asks for it and answers
    COORDINATOR_NOT_AVAILABLE at once (the client retries), rather than wait for the controller and for the files
    of every partition. One creation at a time; a name asked for again while pending is asked once."""

    def __init__(self, topics: TopicService) -> None:
        self._topics = topics
        self._wanted: dict[str, tuple[int, dict[str, str]]] = {}
        self._asked = trio.Event()

    def request(self, name: str, partitions: int, configs: dict[str, str]) -> None:
        if name not in self._wanted:
            self._wanted[name] = (partitions, dict(configs))
            self._asked.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._asked.wait()
            self._asked = trio.Event()
            while self._wanted:
                name, (partitions, configs) = next(iter(self._wanted.items()))
                try:
                    if self._topics.image.topics.get(name) is None:
                        await self._topics.create(name, partitions, configs)
                        log.info("created %s with %d partitions", name, partitions)
                except KafkaError as exc:  # created meanwhile elsewhere, or refused: the next request asks again
                    log.info("%s was not created here: %s %s", name, exc.code.name, exc.message)
                except (OSError, StorageError) as exc:
                    log.error("cannot make the files of %s: %s", name, exc)
                finally:
                    self._wanted.pop(name, None)


class TopicService:
    def __init__(
        self,
        logs: LogManager,
        offsets: OffsetStore,
        config: BrokerConfig,
        controller: Controller,
        metadata: MetadataCache,
        node_id: int,
        replicas: ReplicaManager,
    ) -> None:
        self.logs = logs
        self.replicas = replicas
        self.offsets = offsets
        self.config = config
        self.controller = controller
        self.metadata = metadata
        self.node_id = node_id
        self._in_creation: dict[str, trio.Event] = {}
        # New partitions whose files are still to make, by topic name: made by the request that added them, or by
        # build_published for those an image gave this broker without one (created through another broker).
        self._to_build: dict[str, list[tuple[TopicInfo, range]]] = {}
        self._adding: dict[str, int] = {}  # topics whose new partitions an AddPartitions in progress builds itself
        # Under a KRaft quorum (a service the broker runs): internal topics created without the request waiting.
        self.internal_creation: InternalTopicCreation | None = None
        metadata.subscribe(self._publish)

    @property
    def image(self) -> MetadataImage:
        return self.metadata.image

    @property
    def admin(self) -> AdminController:
        """The controller's admin operations, a single node's own. Under Kafka's KRaft quorum the requests that
        use them are forwarded whole before reaching a handler; one that still arrives here is answered as
        Kafka's broker answers a controller-only request: NOT_CONTROLLER."""
        if not isinstance(self.controller, AdminController):
            raise KafkaError(ErrorCode.NOT_CONTROLLER, "This broker is not the controller.")
        return self.controller

    def registration(self, topic: str, partition: int) -> PartitionRegistration | None:
        """The partition as the controller registered it: replicas, leader, leader epoch, ISR."""
        return self.metadata.image.topics.partition(topic, partition)

    # --- kept in step with the image ---------------------------------------------------------------------

    def _publish(self, image: MetadataImage, delta: MetadataDelta) -> None:
        changes = delta.local_changes(self.node_id)
        removed = {topic.name for topic in delta.removed_topics()}
        for name in sorted(removed):
            gone = self.logs.topic(name)
            if gone is not None and image.topics.get(name) is None:
                self.replicas.stop_topic(name, gone.partitions)
                self.logs.delete_topic(name)
                self.offsets.delete_topic(name)
        touched = {name for name, _ in (*changes.leaders, *changes.followers)}
        touched.update(name for kind, name in delta.changed_configs() if kind == ConfigResourceType.TOPIC)
        for name in sorted(touched):
            topic = image.topics.get(name)
            if topic is not None:
                configs = dict(image.config(ConfigResourceType.TOPIC, name))
                new = self.logs.register_topic(TopicInfo(name, topic.topic_id, len(topic.partitions), configs))
                info = self.logs.topic(name)
                if new and info is not None and self.logs.durable:
                    self._to_build.setdefault(name, []).append((info, new))

    async def _build_new_partitions(self, name: str) -> None:
        """Make the files of the partitions new images gave this broker in topic ``name``, in a worker thread so
        other clients are not held up by thousands of them."""
        pending = self._to_build.pop(name, [])
        try:
            while pending:
                info, new = pending[0]
                logs: list[PartitionLog] = []
                try:
                    logs = await trio.to_thread.run_sync(self._make_files, info, new, abandon_on_cancel=False)
                finally:
                    pending.pop(0)
                    self.logs.finish_building(info, new, logs)
        finally:
            for info, new in pending:  # not built (cancelled): made when first used
                self.logs.finish_building(info, new, [])
            self.replicas.open_followers(())  # followers the replica layer found still being built start fetching

    async def build_published(self) -> None:
        """Make the files of the partitions images gave this broker that no create here is making: those of topics
        created through another broker or a controller elsewhere (the replica layer calls it as registrations
        arrive, so their leaders serve and their followers fetch)."""
        for name in list(self._to_build):
            if name not in self._in_creation and name not in self._adding:
                await self._build_new_partitions(name)

    def _make_files(self, info: TopicInfo, new: range) -> list[PartitionLog]:
        """The logs of partitions ``new`` of ``info``, their files made. The topic is committed: as on Kafka, a log
        that cannot be made shows when it is used (its files are made then, or it answers KAFKA_STORAGE_ERROR)."""
        here = [index for index in new if self._replica_here(info.name, index)]
        try:
            return self.logs.build_partitions(info, new.start, new.stop, only=here)
        except (OSError, StorageError) as exc:
            log.error("cannot make the files of %s partitions %s: %s", info.name, list(new), exc)
            return []

    def _replica_here(self, topic: str, index: int) -> bool:
        """Whether the image places a replica of the partition on this broker (one it does not know: kept)."""
        registration = self.image.topics.partition(topic, index)
        return registration is None or self.node_id in registration.replicas

    # --- look-ups --------------------------------------------------------------------------------------

    def topic(self, name: str) -> TopicInfo | None:
        """The topic, as the log manager knows it or, holding no replica of it here, as the image has it."""
        info = self.logs.topic(name)
        return info if info is not None else self.in_image(name)

    def topic_by_id(self, topic_id: uuid.UUID | None) -> TopicInfo | None:
        info = self.logs.topic_by_id(topic_id)
        if info is None and topic_id is not None:
            topic = self.image.topics.by_id.get(topic_id)
            return self.in_image(topic.name) if topic is not None else None
        return info

    def all(self) -> list[TopicInfo]:
        """Every topic, by name."""
        return self.logs.topics()

    def exists_or_pending(self, name: str) -> bool:
        return self.logs.topic(name) is not None or name in self._in_creation

    def partition(self, topic: str, partition: int) -> PartitionLog | None:
        """The partition's log (opened on first use); None if there is no such partition.

        Raises KafkaError KAFKA_STORAGE_ERROR if its files cannot be opened.
        """
        replica = self.replicas.partition(topic, partition)  # the log as the replica layer holds it
        return None if replica is None else replica.log

    def effective_configs(self, info: TopicInfo) -> dict[str, str]:
        return self.logs.effective_configs(info)

    # --- changes ---------------------------------------------------------------------------------------

    async def create(
        self,
        name: str,
        partitions: int,
        configs: dict[str, str],
        *,
        replication_factor: int = -1,
        assignments: list[list[int]] | None = None,
    ) -> TopicInfo:
        """Create a topic through the controller (``replication_factor`` -1: default.replication.factor).

        Raises KafkaError as the controller refuses it: TOPIC_ALREADY_EXISTS, INVALID_TOPIC_EXCEPTION, ...
        """
        if name in self._in_creation:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        if not assignments and replication_factor == -1:
            replication_factor, configs = self._replication_of(name, configs)
        created = self._in_creation[name] = trio.Event()
        try:
            try:
                await self.controller.create_topic(
                    name,
                    partitions=-1 if assignments else partitions,
                    replication_factor=-1 if assignments else replication_factor,
                    configs=configs,
                    assignments=assignments,
                )
            except KafkaError:
                # Refused, perhaps as created meanwhile through another broker: the partitions its image gave this
                # broker while this create was under way were left to it (build_published skips them).
                await self._build_new_partitions(name)
                raise
            await self._build_new_partitions(name)
        finally:
            del self._in_creation[name]
            created.set()
        return self._published(name)

    @property
    def default_replication_factor(self) -> int:
        """default.replication.factor under a KRaft quorum; a single node has one replica to give whatever it says
        (a larger value is accepted there with a warning, as Kafka's broker server.properties carry it)."""
        return self.config["default.replication.factor"] if self.controller.forwards_requests else 1

    def _replication_of(self, name: str, configs: dict[str, str]) -> tuple[int, dict[str, str]]:
        """A new topic's replication factor (and configs): default.replication.factor, or under a KRaft quorum
        for an internal topic its own settings, as Kafka's AutoTopicCreationManager creates them
        (offsets.topic.replication.factor; transaction.state.log.replication.factor with
        transaction.state.log.min.isr as its min.insync.replicas). A single node has one replica to give."""
        if name not in INTERNAL_TOPICS or not self.controller.forwards_requests:
            return self.default_replication_factor, configs
        if name == OFFSETS_TOPIC:
            return self.config["offsets.topic.replication.factor"], configs
        min_isr = str(self.config["transaction.state.log.min.isr"])
        return self.config["transaction.state.log.replication.factor"], {"min.insync.replicas": min_isr, **configs}

    def create_now(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        """Create an internal topic a coordinator needs at once, committed and its files made before this returns
        (Controller.create_topic_now: start-up migration, a commit before any FindCoordinator).

        Raises KafkaError as the controller refuses it (or cannot commit here and now)."""
        if name in self._in_creation:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        self.controller.create_topic_now(
            name, partitions=partitions, replication_factor=self.default_replication_factor, configs=configs
        )
        for info, new in self._to_build.pop(name, []):
            self.logs.finish_building(info, new, self._make_files(info, new))
        return self._published(name)

    async def check_create(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        assignments: list[list[int]] | None,
        configs: dict[str, str] | None = None,
    ) -> None:
        """What ``create`` would refuse about the partitions and replicas (and ``configs``, if given), without
        creating anything."""
        if not assignments and replication_factor == -1:
            replication_factor = self.default_replication_factor
        await self.controller.create_topic(
            name,
            partitions=-1 if assignments else partitions,
            replication_factor=-1 if assignments else replication_factor,
            configs=configs or {},
            assignments=assignments,
            validate_only=True,
        )

    def _published(self, name: str) -> TopicInfo:
        info = self.logs.topic(name) or self.in_image(name)  # the image's: a topic with no replica here
        if info is None:  # deleted again before the caller ran
            raise unknown_topic(name)
        return info

    def in_image(self, name: str) -> TopicInfo | None:
        """A topic of the cluster as the image has it, replicas on this broker or not (in a cluster, the log
        manager knows only the topics this broker holds a replica of)."""
        topic = self.image.topics.get(name)
        if topic is None:
            return None
        configs = dict(self.image.config(ConfigResourceType.TOPIC, name))
        return TopicInfo(name, topic.topic_id, len(topic.partitions), configs)

    async def add_partitions(
        self, name: str, total: int, assignments: list[list[int]] | None = None, *, validate_only: bool = False
    ) -> TopicInfo:
        """Grow a topic to ``total`` partitions (``validate_only``: only check that it could be).

        Raises KafkaError: UNKNOWN_TOPIC_OR_PARTITION for an unknown topic, INVALID_PARTITIONS if not growing.
        """
        self._adding[name] = self._adding.get(name, 0) + 1  # its new partitions are built here, not in build_published
        try:
            await self.admin.create_partitions(name, total, assignments=assignments, validate_only=validate_only)
            await self._build_new_partitions(name)
        finally:
            self._adding[name] -= 1
            if not self._adding[name]:
                del self._adding[name]
        return self._published(name)

    async def auto_create(self, name: str) -> TopicInfo | None:
        """Create ``name`` with the broker defaults if auto-creation is on; None otherwise."""
        if not self.config["auto.create.topics.enable"]:
            return None
        pending = self._in_creation.get(name)
        if pending is not None:  # someone else is creating it: use theirs
            await pending.wait()
        info = self.logs.topic(name)
        if info is None:
            partitions, configs = self._auto_created_shape(name)
            try:
                info = await self.create(name, partitions, configs)
            except KafkaError:  # created meanwhile (or not a valid name)
                return self.logs.topic(name)
            log.info("auto-created topic %s with %d partitions", name, info.partitions)
        return info

    def _auto_created_shape(self, name: str) -> tuple[int, dict[str, str]]:
        """Partitions and configs of an auto-created topic: the broker defaults, or an internal topic's own (as
        Kafka's auto-creation makes the internal topics as their coordinators would)."""
        if name == OFFSETS_TOPIC:
            return self.offsets.configured_partitions, self.offsets.topic_configs()
        if name == TRANSACTION_TOPIC:
            segment_bytes = self.config["transaction.state.log.segment.bytes"]
            return self.config["transaction.state.log.num.partitions"], transaction_topic_configs(segment_bytes)
        return self.config["num.partitions"], {}

    async def alter_configs(self, name: str, configs: dict[str, str]) -> TopicInfo:
        """Replace the topic's config overrides; they apply to its open partitions at once."""
        current = self.image.config(ConfigResourceType.TOPIC, name)
        changes: dict[str, str | None] = {key: None for key in current if key not in configs}
        changes.update(configs)
        await self.admin.alter_configs(ConfigResourceType.TOPIC, name, changes)
        return self._published(name)

    async def delete(self, name: str) -> None:
        """Delete the topic; its files and the offsets committed for it go as the image drops it."""
        info = self.logs.topic(name) or self.in_image(name)
        if info is None:
            raise unknown_topic(name)
        await self.admin.delete_topic(info.topic_id)
