"""Topics as the request handlers see them: look-ups, and the changes that take worker threads or locks.

The log manager (kbroker/storage) owns topic metadata and partition logs; this service adds what needs the
event loop: creating partitions' files in a worker thread, one creation per name at a time (auto-creation
waits for a creation already under way), growing a topic under a lock, and forgetting a deleted topic's
committed offsets. Handlers reach it as ``RequestContext.topics``.
"""

from __future__ import annotations

import logging
import uuid

import trio

from kbroker.config import BrokerConfig
from kbroker.groups.offsets import OFFSETS_TOPIC, OffsetStore
from kbroker.replication import ReplicaManager
from kbroker.storage import LogManager, PartitionLog, TopicInfo
from kbroker.transactions.state_log import TRANSACTION_TOPIC, transaction_topic_configs
from protocol.errors import ErrorCode, KafkaError

log = logging.getLogger("kbroker")


# Kafka's internal topics: Metadata marks them is_internal.
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_TOPIC})


def unknown_topic(name: str) -> KafkaError:
    return KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")


class TopicService:
    def __init__(self, logs: LogManager, offsets: OffsetStore, config: BrokerConfig, replicas: ReplicaManager) -> None:
        self.logs = logs
        self.replicas = replicas
        self.offsets = offsets
        self.config = config
        self._in_creation: dict[str, trio.Event] = {}
        self._partition_changes = trio.Lock()

    # --- look-ups --------------------------------------------------------------------------------------

    def topic(self, name: str) -> TopicInfo | None:
        return self.logs.topic(name)

    def topic_by_id(self, topic_id: uuid.UUID | None) -> TopicInfo | None:
        return self.logs.topic_by_id(topic_id)

    def all(self) -> list[TopicInfo]:
        """Every topic, by name."""
        return self.logs.topics()

    def exists_or_pending(self, name: str) -> bool:
        return self.logs.topic(name) is not None or self.logs.is_pending(name)

    def partition(self, topic: str, partition: int) -> PartitionLog | None:
        """The partition's log (opened on first use); None if there is no such partition.

        Raises KafkaError KAFKA_STORAGE_ERROR if its files cannot be opened.
        """
        replica = self.replicas.partition(topic, partition)  # the log as the replica layer holds it
        return None if replica is None else replica.log

    def effective_configs(self, info: TopicInfo) -> dict[str, str]:
        return self.logs.effective_configs(info)

    # --- changes ---------------------------------------------------------------------------------------

    async def create(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        """Create a topic; its files are made in a worker thread so other clients are not held up.

        Raises KafkaError: TOPIC_ALREADY_EXISTS if the name is taken (or being created), INVALID_TOPIC_EXCEPTION
        if it is not a valid name.
        """
        info = self.logs.plan_topic(name, partitions, configs)
        created = self._in_creation[name] = trio.Event()
        try:
            logs = await trio.to_thread.run_sync(self.logs.build_partitions, info, 0, abandon_on_cancel=False)
        except BaseException:
            self.logs.abandon(info)
            raise
        finally:
            del self._in_creation[name]
            created.set()
        return self.logs.commit_topic(info, logs)

    async def add_partitions(self, name: str, total: int) -> TopicInfo:
        """Grow a topic to ``total`` partitions.

        Raises KafkaError: UNKNOWN_TOPIC_OR_PARTITION for an unknown topic, INVALID_PARTITIONS if not growing.
        """
        async with self._partition_changes:  # two requests growing one topic must not build the same partitions
            info = self.logs.topic(name)
            if info is None:
                raise unknown_topic(name)
            if total <= info.partitions:
                raise KafkaError(ErrorCode.INVALID_PARTITIONS, f"topic {name} already has {info.partitions} partitions")
            logs = await trio.to_thread.run_sync(
                self.logs.build_partitions, info, info.partitions, total, abandon_on_cancel=False
            )
            if self.logs.topic(name) is not info:  # deleted meanwhile
                for plog in logs:
                    plog.delete()
                raise unknown_topic(name)
            return self.logs.commit_partitions(info, logs)

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

    def alter_configs(self, name: str, configs: dict[str, str]) -> TopicInfo:
        """Replace the topic's config overrides; they apply to its open partitions at once."""
        return self.logs.alter_topic_config(name, configs)

    def delete(self, name: str) -> None:
        """Delete the topic, its files and the offsets committed for it."""
        info = self.logs.topic(name)
        if info is not None:
            self.replicas.stop_topic(name, info.partitions)
        self.logs.delete_topic(name)
        self.offsets.delete_topic(name)
