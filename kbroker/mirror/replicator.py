"""``kbroker mirror``'s engine: copy topics from a source cluster to a target cluster, as MirrorMaker 2 does.

One loop, on kafka-python clients: poll the source → produce to the target (same partition number, key, value,
headers and timestamp) → wait for the target's acknowledgement (acks=all) → record offset syncs → commit the
progress. Nothing is committed before the target has the records, so a crash at any point loses nothing:

- at-least-once (default): progress is the consumer group ``kbroker-mirror-<source>-<target>`` in the SOURCE,
  committed after the flush; a restart resumes there and may copy the records of the last batch again.
- ``--exactly-once`` (KIP-656): a transactional producer in the target; the records, their offset syncs and the
  progress (``send_offsets_to_transaction`` into the same group id in the TARGET, keyed by the target topic and
  holding SOURCE offsets, since brokers refuse offsets for topics they lack) commit together, and the start
  position is read from that group. A restart's ``init_transactions`` aborts what a killed mirror left open.

Alongside: missing target topics are created with the source's partition count and non-default topic configs
(less those MM2 never copies); new source topics matching ``--topics`` are picked up at each metadata refresh;
consumer groups matching ``--groups`` get their committed offsets translated and committed in the target when the
group has no active member there (checkpoints.py); lag is logged on stderr periodically and on exit.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from kbroker.commands.connection import ClientSettings, CommandError, admin_client
from kbroker.mirror.checkpoints import Checkpoint, OffsetSync, OffsetSyncStore, runs
from kbroker.mirror.policy import ReplicationPolicy, checkpoints_topic, mirror_group, offset_syncs_topic

# Topic configs MirrorMaker 2 never copies (DefaultConfigPropertyFilter's config.properties.exclude default).
EXCLUDED_TOPIC_CONFIGS = re.compile(
    r"follower\.replication\.throttled\.replicas|leader\.replication\.throttled\.replicas"
    r"|message\.timestamp\.difference\.max\.ms|message\.timestamp\.type|unclean\.leader\.election\.enable"
    r"|min\.insync\.replicas"
)
RETRY_SECONDS = 30.0  # how long a retriable error (a coordinator still loading) is retried before it is reported
MAX_RECORD_BYTES = 64 * 1024 * 1024  # the target topic's own max.message.bytes is the real limit
REPORTED_PARTITIONS = 20  # in one lag line; the rest are summed


@dataclass
class MirrorOptions:
    source: ClientSettings
    target: ClientSettings
    policy: ReplicationPolicy
    groups: re.Pattern[str] | None = None
    once: bool = False
    exactly_once: bool = False
    refresh_interval: float = 30.0  # seconds between looks for new source topics
    report_interval: float = 10.0  # seconds between lag lines
    checkpoint_interval: float = 10.0  # seconds between group offset translations
    poll_records: int = 2000


@dataclass
class PartitionProgress:
    position: int  # the next source offset not yet in the target (committed progress)
    once_end: int | None = None  # with --once: the source end offset when the partition was assigned


@dataclass
class Mirror:
    options: MirrorOptions
    log: Callable[[str], None] = field(default=lambda line: print(f"kbroker mirror: {line}", file=sys.stderr))

    def __post_init__(self) -> None:
        self.stopping = threading.Event()
        self.policy = self.options.policy
        self.group = mirror_group(self.policy.source_alias, self.policy.target_alias)
        self.syncs_topic = offset_syncs_topic(self.policy.source_alias)
        self.checkpoints_topic = checkpoints_topic(self.policy.source_alias)
        self.store = OffsetSyncStore()
        self.progress: dict[Any, PartitionProgress] = {}  # TopicPartition -> progress
        self.copied = 0
        self.last_checkpoints: dict[bytes, Checkpoint] = {}
        self.source_admin: Any = None
        self.target_admin: Any = None
        self.consumer: Any = None
        self.producer: Any = None

    # --- life cycle --------------------------------------------------------------------------------------------

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> int:
        with _stop_on_signals(self.stop):
            try:
                self._open()
                self._loop()
                self._report()
            finally:
                self._close()
        return 0

    def _open(self) -> None:
        from kafka import KafkaConsumer, KafkaProducer

        source, target = self.options.source, self.options.target
        self.source_admin = admin_client(source)
        self.target_admin = admin_client(target)
        self._create_internal_topics()
        self._load_offset_syncs()
        producer_settings: dict[str, Any] = {
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": 5,
            "max_request_size": MAX_RECORD_BYTES,
        }
        if self.options.exactly_once:
            producer_settings["transactional_id"] = self.group
        nullable = _nullable_bytes_serializer()
        self.producer = KafkaProducer(
            **target.kafka_kwargs(f"{self.group}-producer"),
            **producer_settings,
            key_serializer=nullable,
            value_serializer=nullable,
        )
        if self.options.exactly_once:
            self.producer.init_transactions()
        self.consumer = KafkaConsumer(
            **source.kafka_kwargs(f"{self.group}-consumer"),
            group_id=None if self.options.exactly_once else self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",  # aborted source records must not become committed target ones
            max_poll_records=self.options.poll_records,
        )

    def _close(self) -> None:
        for client in (self.consumer, self.producer, self.source_admin, self.target_admin):
            if client is None:
                continue
            try:
                if client is self.consumer:
                    client.close(autocommit=False)
                else:
                    client.close()
            except Exception:  # closing after a failure: the failure is what the user needs to see
                pass

    def _loop(self) -> None:
        next_refresh = next_report = next_checkpoint = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            if now >= next_refresh:
                self._refresh_topics()
                next_refresh = now + self.options.refresh_interval
            self._copy_batch()
            now = time.monotonic()
            if self.options.groups is not None and now >= next_checkpoint:
                self._checkpoint()
                next_checkpoint = now + self.options.checkpoint_interval
            if self.options.once and self._caught_up():
                if self.options.groups is not None:
                    self._checkpoint()
                return
            if now >= next_report:
                self._report()
                next_report = now + self.options.report_interval
        # stopping: the last batch was committed by _copy_batch; the final lag line follows in run()

    # --- topics ------------------------------------------------------------------------------------------------

    def _create_internal_topics(self) -> None:
        existing = set(self.target_admin.list_topics())
        wanted = {
            self.syncs_topic: {"cleanup.policy": "delete"},
            self.checkpoints_topic: {"cleanup.policy": "compact"},
        }
        self._create_topics({name: (1, configs) for name, configs in wanted.items() if name not in existing})

    def _create_topics(self, topics: dict[str, tuple[int, dict[str, str]]]) -> None:
        from kafka.admin import NewTopic
        from kafka.errors import TopicAlreadyExistsError

        for name, (partitions, configs) in topics.items():
            try:
                self.target_admin.create_topics([NewTopic(name, partitions, -1, topic_configs=configs)])
            except TopicAlreadyExistsError:  # made meanwhile (another mirror): fine
                pass
            self.log(f"created topic {name} in the target ({_partitions_text(partitions)}{_configs_text(configs)})")

    def _refresh_topics(self) -> None:
        """Find source topics to mirror, make their target topics, assign any new partitions."""
        from kafka import TopicPartition

        source_topics = {
            topic["name"]: len(topic["partitions"])
            for topic in self.source_admin.describe_topics()
            if not topic.get("is_internal") and self.policy.should_mirror(topic["name"])
        }
        target_partitions = {
            topic["name"]: len(topic["partitions"])
            for topic in self.target_admin.describe_topics()
            if topic["partitions"]
        }
        for source_topic, partitions in sorted(source_topics.items()):
            target_topic = self.policy.target_topic(source_topic)
            have = target_partitions.get(target_topic, 0)
            if have == 0:
                self._create_topics({target_topic: (partitions, self._copied_configs(source_topic))})
            elif have < partitions:
                from kafka.admin import NewPartitions

                self.target_admin.create_partitions({target_topic: NewPartitions(partitions)})
                self.log(f"grew {target_topic} in the target to {_partitions_text(partitions)}")
        new_partitions = [
            TopicPartition(topic, partition)
            for topic, count in sorted(source_topics.items())
            for partition in range(count)
            if TopicPartition(topic, partition) not in self.progress
        ]
        if not new_partitions:
            return
        self.consumer.assign(list(self.progress) + new_partitions)
        starts = self._start_positions(new_partitions)
        once_ends = self.consumer.end_offsets(new_partitions) if self.options.once else {}
        for tp in new_partitions:
            if starts.get(tp) is not None:
                self.consumer.seek(tp, starts[tp])
            self.progress[tp] = PartitionProgress(self.consumer.position(tp), once_ends.get(tp))
        topics = sorted({tp.topic for tp in new_partitions})
        self.log(f"mirroring {', '.join(topics)} ({_partitions_text(len(new_partitions))})")

    def _copied_configs(self, source_topic: str) -> dict[str, str]:
        """The source topic's configs set on the topic itself (not defaults), less those MM2 never copies."""
        from kafka.admin import ConfigResource, ConfigResourceType

        described = self.source_admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, source_topic)])
        entries = described.get("topic", {}).get(source_topic, {})
        return {
            name: entry["value"]
            for name, entry in sorted(entries.items())
            if entry.get("config_source") == "DYNAMIC_TOPIC_CONFIG"
            and entry.get("value") is not None
            and not EXCLUDED_TOPIC_CONFIGS.fullmatch(name)
        }

    def _start_positions(self, partitions: list[Any]) -> dict[Any, int | None]:
        """With --exactly-once, where the progress group in the target says to start (None: the beginning);
        at-least-once, the consumer finds its committed offsets in the source itself."""
        if not self.options.exactly_once:
            return {}
        from kafka import TopicPartition

        committed = _retrying(self.target_admin.list_group_offsets, {self.group: None}).get(self.group, {})
        starts: dict[Any, int | None] = {}
        for tp in partitions:
            stored = committed.get(TopicPartition(self.policy.target_topic(tp.topic), tp.partition))
            starts[tp] = stored.offset if stored is not None and stored.offset >= 0 else None
        return starts

    # --- copying -----------------------------------------------------------------------------------------------

    def _copy_batch(self) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        batch = self.consumer.poll(timeout_ms=200, max_records=self.options.poll_records)
        positions = {tp: self.consumer.position(tp) for tp in self.progress}
        advanced = {tp: offset for tp, offset in positions.items() if offset != self.progress[tp].position}
        if not batch and not advanced:
            return
        transactional = self.options.exactly_once
        if transactional:
            self.producer.begin_transaction()
        _refuse_null_header_values(batch)  # before anything of the batch is sent
        for tp in batch:
            self._await_target_partition(self.policy.target_topic(tp.topic), tp.partition)
        sent: list[tuple[Any, int, Any]] = []  # (source partition, source offset, future)
        for tp, records in batch.items():
            target_topic = self.policy.target_topic(tp.topic)
            for record in records:
                future = self.producer.send(
                    target_topic,
                    key=NULL if record.key is None else record.key,
                    value=NULL if record.value is None else record.value,
                    headers=list(record.headers) or None,
                    partition=record.partition,
                    timestamp_ms=record.timestamp if record.timestamp is not None and record.timestamp >= 0 else None,
                )
                sent.append((tp, record.offset, future))
        self.producer.flush()
        pairs: dict[Any, list[tuple[int, int]]] = {}
        for tp, source_offset, future in sent:
            pairs.setdefault(tp, []).append((source_offset, future.get().offset))  # raises if the target refused
        syncs = [sync for tp, tp_pairs in pairs.items() for sync in runs(tp.topic, tp.partition, tp_pairs)]
        sync_futures = [self.producer.send(self.syncs_topic, key=s.key(), value=s.value(), partition=0) for s in syncs]
        offsets = {tp: OffsetAndMetadata(offset, "", -1) for tp, offset in advanced.items()}
        if transactional:
            # keyed by the target topic: brokers refuse offsets for topics they do not have
            target_offsets = {
                TopicPartition(self.policy.target_topic(tp.topic), tp.partition): offset
                for tp, offset in offsets.items()
            }
            self.producer.send_offsets_to_transaction(target_offsets, self.group)
            self.producer.commit_transaction()
        else:
            self.producer.flush()
            for future in sync_futures:
                future.get()
            self.consumer.commit(offsets)
        for sync in syncs:
            self.store.add(sync)
        for tp, offset in advanced.items():
            self.progress[tp].position = offset
        self.copied += len(sent)

    def _await_target_partition(self, topic: str, partition: int) -> None:
        """Wait until the producer knows the target partition: a topic grown while mirrored (here, in
        _refresh_topics) is not in its cached metadata, and kafka-python's send() raises ValueError for a partition
        it does not know. Still missing after RETRY_SECONDS: one line (the target topic has fewer partitions)."""
        deadline = time.monotonic() + RETRY_SECONDS
        while partition not in (self.producer.partitions_for(topic) or ()):
            if time.monotonic() > deadline:
                raise CommandError(f"the target topic {topic} has no partition {partition} to copy the source's into")
            # kafka-python has no public call that refreshes a producer's metadata
            self.producer._metadata.request_update()
            self.producer._sender.wakeup()
            time.sleep(0.1)

    def _caught_up(self) -> bool:
        return all(p.once_end is None or p.position >= p.once_end for p in self.progress.values())

    # --- offset syncs and checkpoints --------------------------------------------------------------------------

    def _load_offset_syncs(self) -> None:
        """Read the syncs earlier runs recorded, so groups committed before this start can be translated."""
        from kafka import KafkaConsumer, TopicPartition

        partition = TopicPartition(self.syncs_topic, 0)
        reader = KafkaConsumer(
            **self.options.target.kafka_kwargs(f"{self.group}-syncs"),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        try:
            reader.assign([partition])
            reader.seek_to_beginning(partition)
            end = reader.end_offsets([partition])[partition]
            while reader.position(partition) < end:
                for records in reader.poll(timeout_ms=500).values():
                    for record in records:
                        if record.key is not None and record.value is not None:
                            self.store.add(OffsetSync.decode(record.key, record.value))
        finally:
            reader.close(autocommit=False)

    def _checkpoint(self) -> None:
        """Translate group offsets; a group that cannot be (not authorized, ...) is logged, the copy goes on."""
        from kafka.errors import KafkaError

        from kbroker.commands.connection import failure_line

        try:
            self._sync_group_offsets()
        except KafkaError as exc:
            self.log(f"group offsets not translated this round: {failure_line(exc)}")

    def _sync_group_offsets(self) -> None:
        """Translate the committed offsets of the source groups matching --groups into the target: checkpoint
        records always, the group's own offsets when it has no active member in the target (MM2's rule) and only
        forward (a group already further along in the target keeps its place)."""
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        assert self.options.groups is not None
        groups = sorted(
            group["group_id"]
            for group in _retrying(self.source_admin.list_groups)
            if self.options.groups.fullmatch(group["group_id"]) and group["group_id"] != self.group
        )
        checkpoints: list[Checkpoint] = []
        for group in groups:
            committed = _retrying(self.source_admin.list_group_offsets, {group: None}).get(group, {})
            translated: dict[Any, OffsetAndMetadata] = {}
            for tp, offset in sorted(committed.items()):
                if tp not in self.progress or offset.offset < 0:
                    continue
                downstream = self.store.translate(tp.topic, tp.partition, offset.offset)
                if downstream is None:
                    continue
                target_topic = self.policy.target_topic(tp.topic)
                checkpoints.append(
                    Checkpoint(group, target_topic, tp.partition, offset.offset, downstream, offset.metadata or "")
                )
                translated[TopicPartition(target_topic, tp.partition)] = OffsetAndMetadata(
                    downstream, offset.metadata or "", -1
                )
            if translated and self._inactive_in_target(group):
                current = _retrying(self.target_admin.list_group_offsets, {group: None}).get(group, {})
                forward = {
                    tp: offset
                    for tp, offset in translated.items()
                    if tp not in current or current[tp].offset < offset.offset
                }
                if forward:
                    results = _retrying(self.target_admin.alter_group_offsets, group, forward)
                    refused = sorted(f"{tp.topic}-{tp.partition}" for tp, error in results.items() if error.errno)
                    if refused:  # a member joined meanwhile: the next round tries again
                        self.log(f"group {group}: the target refused offsets for {', '.join(refused)}")
        # a checkpoint is written when it changes (the topic is compacted on this key, as MM2's)
        changed = [c for c in checkpoints if self.last_checkpoints.get(c.key()) != c]
        if changed:
            self._write_checkpoints(changed)
            self.last_checkpoints.update((c.key(), c) for c in changed)

    def _inactive_in_target(self, group: str) -> bool:
        description = _retrying(self.target_admin.describe_groups, [group]).get(group, {})
        return description.get("group_state") in (None, "", "Empty", "Dead") and not description.get("members")

    def _write_checkpoints(self, checkpoints: list[Checkpoint]) -> None:
        if self.options.exactly_once:
            self.producer.begin_transaction()
        for checkpoint in checkpoints:
            self.producer.send(self.checkpoints_topic, key=checkpoint.key(), value=checkpoint.value(), partition=0)
        if self.options.exactly_once:
            self.producer.commit_transaction()
        else:
            self.producer.flush()

    # --- lag -----------------------------------------------------------------------------------------------------

    def _report(self) -> None:
        """One line: records copied, total lag and the lag of each partition (source end offset minus mirrored)."""
        if self.consumer is None or not self.progress:
            self.log(f"{self.copied} records copied; no topics matched yet")
            return
        ends = self.consumer.end_offsets(list(self.progress))
        lags = sorted(
            ((tp.topic, tp.partition, max(0, ends.get(tp, 0) - p.position)) for tp, p in self.progress.items()),
        )
        total = sum(lag for *_, lag in lags)
        shown = " ".join(f"{topic}-{partition}={lag}" for topic, partition, lag in lags[:REPORTED_PARTITIONS])
        rest = f" (+{_partitions_text(len(lags) - REPORTED_PARTITIONS)})" if len(lags) > REPORTED_PARTITIONS else ""
        self.log(f"{self.copied} records copied; lag {total}: {shown}{rest}")


NULL = object()  # a null key or value, as handed to the producer (see _nullable_bytes_serializer)


def _nullable_bytes_serializer() -> Any:
    """The producer's key and value serializer: ``NULL`` becomes a null key or value. kafka-python's send() refuses
    a record whose key and value are both None, which Kafka allows (a tombstone without a key, a record that only
    has headers); its record format carries them, and its check runs before the serializers."""
    from kafka.serializer import Serializer

    class NullableBytes(Serializer):
        def serialize(self, topic: str, headers: Any, data: Any) -> Any:
            return None if data is NULL else data

    return NullableBytes()


def _refuse_null_header_values(batch: dict[Any, list[Any]]) -> None:
    """kafka-python's producer cannot write a header whose value is null (Kafka can): stop with one line rather
    than copy the record altered; nothing of the batch is sent or committed, so no record is lost."""
    for tp, records in batch.items():
        for record in records:
            for name, value in record.headers:
                if value is None:
                    raise CommandError(
                        f"cannot copy {tp.topic}-{tp.partition} offset {record.offset}: its header {name!r} has a "
                        "null value, which kbroker mirror's producer (kafka-python) cannot write"
                    )


def _retrying(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, again while it fails with a retriable error (a group coordinator still loading, a leader
    moving), for up to RETRY_SECONDS; then the error is reported."""
    from kafka.errors import KafkaError

    deadline = time.monotonic() + RETRY_SECONDS
    while True:
        try:
            return call(*args)
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _partitions_text(count: int) -> str:
    return f"{count} partition{'' if count == 1 else 's'}"


def _configs_text(configs: dict[str, str]) -> str:
    return "".join(f", {name}={value}" for name, value in configs.items())


@contextmanager
def _stop_on_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C and SIGTERM finish the batch in hand (flush, commit) and stop; a second one stops at once (a flush
    waiting on a target that went away), without committing the batch in hand, so nothing is lost: a restart copies
    it again. Off the main thread, nothing to do."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signalled: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if signalled:
            raise KeyboardInterrupt
        signalled.append(signum)
        stop()

    previous = {number: signal.signal(number, handler) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def check_pattern(option: str, text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise CommandError(f"{option} {text!r} is not a regular expression: {exc}") from None
