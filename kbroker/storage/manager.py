"""All topics on this broker: their metadata and their partition logs.

Layout of the data directory, as Kafka's: one directory ``<topic>-<partition>`` per partition, holding its
segments and a ``partition.metadata`` naming the topic id (so a directory left behind by an interrupted
delete is never mistaken for a new topic of the same name). Topic metadata (id, partition count, config
overrides) is one JSON file, replaced atomically on every change. A marker written at clean shutdown tells
the next start whether the active segments' tails need checking.

Partition logs are opened on first use, so start-up time does not grow with the number of partitions.

Nothing is deleted on a guess (only a topic deletion removes data). A partition directory that does not belong
to the metadata (another topic id, a topic or partition topics.json does not know) is moved aside as Kafka
moves a stray log: renamed ``<topic>-<partition>.<uuid>-stray``, logged with both paths, never removed by
kbroker. A missing topics.json beside partition directories is rebuilt from their ``partition.metadata``
files (topic config overrides cannot be recovered and are reported); where that is ambiguous (two topic ids
for one name), start-up stops with one line naming the directories. The recovery points of the partitions
(``recovery-point-offset-checkpoint``, Kafka's file) say how much of each log an unclean start must validate.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kbroker.durable.files import (
    LEGACY_VERSION,
    DamagedFileError,
    StorageError,
    fsync_directory,
    read_checked_json,
    write_atomically,
    write_checked_json,
)
from kbroker.storage.checkpoints import RECOVERY_POINT_FILE, read_offset_checkpoint, write_offset_checkpoint
from kbroker.storage.descriptors import DescriptorCache
from kbroker.storage.log import PARTITION_METADATA_FILE, LogConfig, LogDirHealth, PartitionLog, Segment
from protocol.errors import ErrorCode, KafkaError
from protocol.exceptions import DecodeError

log = logging.getLogger("kbroker.storage")

TOPICS_FILE = "topics.json"
TOPICS_KIND = "topics"
TOPICS_FORMAT_VERSION = 2  # 1 was the same document without kind and crc32c
CLEAN_SHUTDOWN_FILE = ".kbroker_cleanshutdown"
DELETED_SUFFIX = "-delete"
STRAY_SUFFIX = "-stray"  # Kafka's suffix for a log that does not belong to the metadata, kept for the operator
_PARTITION_DIRECTORY = re.compile(r"(.+)-(0|[1-9][0-9]{0,9})")
# The metadata log's directory (kbroker/metadata/log.py) is named like a partition's but is not a topic's.
METADATA_LOG_TOPIC = "__cluster_metadata"
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: str | None) -> str | None:
    """Kafka's topic name rules: an error message, or None for a legal name."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return 'Topic name cannot be "." or ".."'
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, topic name: {name}"
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        return (
            f"Topic name {name!r} is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        )
    return None


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)  # overrides set on the topic itself


def _stored_topic_id(directory: Path) -> uuid.UUID | None:
    """The topic id in a partition directory's ``partition.metadata``; None if the file is missing.

    Kafka's layout: ``version: 0`` then ``topic_id: <uuid>``. A file that exists but cannot be read as that is
    damaged (DamagedFileError): the partition is not opened rather than mistaken for a stranger's and discarded.
    """
    path = directory / PARTITION_METADATA_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise DamagedFileError(path, f"cannot be read ({exc})") from None
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())}
    if fields.get("version") != "0":
        raise DamagedFileError(path, f"expected version 0, found {fields.get('version')!r}")
    try:
        return uuid.UUID(fields.get("topic_id", ""))
    except ValueError:
        raise DamagedFileError(path, f"expected a topic id, found {fields.get('topic_id')!r}") from None


def read_topics_file(path: Path) -> tuple[int, list[TopicInfo]]:
    """topics.json: its format version and its topics. DamagedFileError if it cannot be read as that."""
    version, document = read_checked_json(path, TOPICS_KIND, (LEGACY_VERSION, TOPICS_FORMAT_VERSION))
    try:
        topics = [
            TopicInfo(name, uuid.UUID(item["id"]), int(item["partitions"]), dict(item.get("configs", {})))
            for name, item in document.get("topics", {}).items()
        ]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise DamagedFileError(path, f"unexpected content ({type(exc).__name__}: {exc})") from None
    return version, topics


def partition_directories(data_dir: Path) -> list[tuple[str, int, Path]]:
    """(topic, partition, path) of every directory named like a partition directory (not the metadata log's)."""
    found = []
    for entry in os.scandir(data_dir):
        match = _PARTITION_DIRECTORY.fullmatch(entry.name)
        if match and match[1] != METADATA_LOG_TOPIC and entry.is_dir() and validate_topic_name(match[1]) is None:
            found.append((match[1], int(match[2]), Path(entry.path)))
    return sorted(found)


def topics_from_directories(data_dir: Path) -> list[TopicInfo]:
    """The topics the partition directories show, when nothing else records them (config overrides are lost).

    A topic's id is the one its ``partition.metadata`` files name (a new one if none does), its partition count
    one more than its highest partition directory. Two ids for one name is ambiguous: StorageError.
    """
    by_name: dict[str, list[tuple[int, Path]]] = {}
    for name, index, directory in partition_directories(data_dir):
        by_name.setdefault(name, []).append((index, directory))
    topics = []
    for name, directories in by_name.items():
        ids: dict[uuid.UUID, list[Path]] = {}
        for _, directory in directories:
            try:
                stored = _stored_topic_id(directory)
            except DamagedFileError as exc:
                log.warning("rebuilding the topic list: %s (the partition keeps its data and reports it)", exc)
                continue
            if stored is not None:
                ids.setdefault(stored, []).append(directory)
        if len(ids) > 1:
            listing = "; ".join(f"{topic_id}: {', '.join(map(str, paths))}" for topic_id, paths in ids.items())
            raise StorageError(
                f"{data_dir / TOPICS_FILE} is missing and cannot be rebuilt: the directories of topic "
                f"{name!r} name different topic ids ({listing}); move the directories of the wrong topic out "
                "of the data directory, or restore topics.json from a backup"
            )
        topic_id = next(iter(ids)) if ids else uuid.uuid4()
        topics.append(TopicInfo(name, topic_id, max(index for index, _ in directories) + 1))
    return topics


class LogManager:
    def __init__(
        self,
        data_dir: Path,
        topic_defaults: dict[str, str],
        *,
        open_segment_files: int | None = None,
        in_memory: bool = False,
        high_watermarks: Mapping[tuple[str, int], int] | None = None,
        catalog: list[TopicInfo] | None = None,
    ) -> None:
        """``open_segment_files``: how many segment files may be open at once (default: half the soft
        open-file limit, see kbroker/storage/descriptors.py). ``in_memory``: every log over the memory backend
        (kbroker/storage/memory.py) and nothing written to ``data_dir``, which then only names the logs.
        ``high_watermarks``: the replica layer's checkpoint (kbroker/replication), where a reopened log's high
        watermark starts (at its log start if it has no entry, as Kafka's); None: at its log end.
        ``catalog``: the topics as the metadata image has them; the image is then the only record of topics
        (its publisher keeps this manager in step) and no topics.json is read or written."""
        self.data_dir = Path(data_dir)
        self.durable = not in_memory
        self._catalog_file = catalog is None  # topics.json is this manager's own record of topics
        self.topic_defaults = dict(topic_defaults)
        self.clean_start = True
        if self.durable:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            marker = self.data_dir / CLEAN_SHUTDOWN_FILE
            self.clean_start = marker.exists()
            marker.unlink(missing_ok=True)
        self._topics: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        self._partitions: dict[tuple[str, int], PartitionLog] = {}
        self._pending: set[str] = set()  # topics being created
        # Partitions the image gave this broker whose files a worker thread is making (see ``register_topic``).
        self._building: set[tuple[str, int]] = set()
        # Offline (refusing writes until a restart) once writes keep failing or an fsync fails: see log.py.
        self.dir_health = LogDirHealth(self.data_dir)
        # Every partition's segments share one bounded set of open files (made here, on the event loop).
        self.descriptors = DescriptorCache(open_segment_files)
        self._opened_this_run: set[tuple[str, int]] = set()  # recovered, if the start was unclean
        self._recovery_points: dict[tuple[str, int], int] = {}
        self._high_watermarks = high_watermarks
        # Told of each log opened after start-up, before anyone else sees it (the replica layer takes it).
        self.opened: Callable[[PartitionLog], object] | None = None
        for info in catalog or ():
            self._topics[info.name] = info
            self._by_id[info.topic_id] = info
        if not self.durable:
            for info in catalog or ():
                self.commit_partitions(info, self.build_partitions(info, 0))
            return
        if not self._catalog_file:
            pass
        elif (self.data_dir / TOPICS_FILE).exists():
            self._load_topics()
        else:
            self._rebuild_topics_from_disk()
        self._remove_deleted_directories()
        self._quarantine_unknown_directories()
        self._recovery_points = self._load_recovery_points()

    @classmethod
    def in_memory_store(cls, topic_defaults: dict[str, str]) -> LogManager:
        """Topics and logs kept in memory only (fast handler tests): the same engine, nothing durable."""
        return cls(Path("memory"), topic_defaults, in_memory=True)

    # --- metadata ------------------------------------------------------------------------------------

    def _load_topics(self) -> None:
        path = self.data_dir / TOPICS_FILE
        if not path.exists():
            return
        version, topics = read_topics_file(path)
        for info in topics:
            self._topics[info.name] = info
            self._by_id[info.topic_id] = info
        if version == LEGACY_VERSION:  # {"version": 1, "topics": ...} without a checksum, from older kbrokers
            self._save_topics()

    def _save_topics(self) -> None:
        if not self.durable or not self._catalog_file:
            return
        topics = {
            info.name: {"id": str(info.topic_id), "partitions": info.partitions, "configs": info.configs}
            for info in self._topics.values()
        }
        write_checked_json(self.data_dir / TOPICS_FILE, TOPICS_KIND, TOPICS_FORMAT_VERSION, {"topics": topics})

    def _partition_directories(self) -> list[tuple[str, int, Path]]:
        return partition_directories(self.data_dir)

    def _rebuild_topics_from_disk(self) -> None:
        """No topics.json: rebuild it from the partition directories, so their data is not taken for strays."""
        for info in topics_from_directories(self.data_dir):
            self._topics[info.name] = info
            self._by_id[info.topic_id] = info
        if not self._topics:
            return
        self._save_topics()
        log.warning(
            "%s was missing: rebuilt it from the partition directories (%s); topic config overrides could not be "
            "recovered, set them again if there were any",
            self.data_dir / TOPICS_FILE,
            ", ".join(f"{info.name}: {info.partitions} partition(s)" for info in self.topics()),
        )

    # --- kept in step with the metadata image (``catalog``) -----------------------------------------

    def register_topic(self, info: TopicInfo) -> range:
        """A topic the image has, new or changed (more partitions, other configs): open partitions take the
        new configs at once. Returns the partitions new to this manager: a log in memory has them now; on disk
        their files are for ``build_partitions`` to make in a worker thread and ``finish_building`` to commit
        (until then they are not served, as Kafka serves no replica it has not created yet)."""
        known = self._topics.get(info.name)
        if known is not None and known.topic_id != info.topic_id:
            self.delete_topic(info.name)  # replaced by a topic of the same name (deleted and created again)
            known = None
        if known is None:
            self._topics[info.name] = info
            self._by_id[info.topic_id] = info
            known, first = info, 0
        else:
            first = known.partitions
            known.partitions = max(known.partitions, info.partitions)
            if known.configs != info.configs:
                self.alter_topic_config(info.name, info.configs)
        new = range(first, known.partitions)
        if not self.durable:
            self.commit_partitions(known, self.build_partitions(known, first))
        else:
            self._building.update((info.name, index) for index in new)
        return new

    def is_building(self, topic: str, partition: int) -> bool:
        """Whether the partition's files are being made (``get_partition`` answers None until they are)."""
        return (topic, partition) in self._building

    def finish_building(self, info: TopicInfo, new: range, logs: list[PartitionLog]) -> None:
        """Serve the partitions built for ``register_topic``; built for a topic deleted meanwhile, they go."""
        for index in new:
            self._building.discard((info.name, index))
        if self._topics.get(info.name) is not info:
            for plog in logs:
                plog.delete()
            return
        for plog in logs:
            self._partitions[(info.name, plog.partition)] = plog
            self._opened_this_run.add((info.name, plog.partition))

    def _quarantine_unknown_directories(self) -> None:
        """Move aside partition directories of topics (or partitions) the metadata does not know."""
        for name, index, directory in self._partition_directories():
            info = self._topics.get(name)
            if info is not None and index < info.partitions:
                continue  # a known partition: its topic id is checked when it is opened
            if info is None:
                self._quarantine(directory, f"topic {name!r} is not in {TOPICS_FILE}")
            else:
                self._quarantine(directory, f"topic {name!r} has {info.partitions} partition(s) in {TOPICS_FILE}")

    def _quarantine(self, directory: Path, reason: str) -> None:
        """Rename a partition directory aside, as Kafka's stray logs: kept for the operator, never deleted."""
        stray = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}{STRAY_SUFFIX}")
        os.rename(directory, stray)
        fsync_directory(self.data_dir)
        log.warning("moved %s aside to %s: %s; kbroker does not delete it", directory, stray, reason)

    def _load_recovery_points(self) -> dict[tuple[str, int], int]:
        try:
            return read_offset_checkpoint(self.data_dir / RECOVERY_POINT_FILE)
        except DamagedFileError as exc:
            log.warning("%s; logs opened after an unclean stop are validated whole", exc)
            return {}

    def checkpoint_recovery_points(self) -> None:
        """Write recovery-point-offset-checkpoint: each open partition's recovery point (what is fsynced), and
        for the others the point read at start-up. May run in a worker thread, e.g. after a flush."""
        if not self.durable:
            return
        points = {key: offset for key, offset in dict(self._recovery_points).items() if key[0] in self._topics}
        for key, plog in list(self._partitions.items()):
            points[key] = plog.recovery_point
        write_offset_checkpoint(self.data_dir / RECOVERY_POINT_FILE, points)

    def _remove_deleted_directories(self) -> None:
        for path in self.data_dir.glob(f"*{DELETED_SUFFIX}"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)

    def topic(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID | None) -> TopicInfo | None:
        return self._by_id.get(topic_id) if topic_id is not None else None

    def topics(self) -> list[TopicInfo]:
        return sorted(self._topics.values(), key=lambda info: info.name)

    def effective_configs(self, info: TopicInfo) -> dict[str, str]:
        return {**self.topic_defaults, **info.configs}

    def log_config(self, info: TopicInfo) -> LogConfig:
        return LogConfig.from_topic_configs(self.effective_configs(info))

    # --- topic changes -------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        """Create a topic in one go (see ``plan_topic`` for the three steps an event loop uses)."""
        info = self.plan_topic(name, partitions, configs)
        try:
            logs = self.build_partitions(info, 0)
        except BaseException:
            self.abandon(info)
            raise
        return self.commit_topic(info, logs)

    # Creating a partition costs a few file-system calls that can take milliseconds each, so a thousand of
    # them must not stall the event loop: ``plan_topic`` reserves the name, ``build_partitions`` (safe in a
    # worker thread: it touches only the new directories) creates the files, and ``commit_topic`` makes the
    # topic visible.

    def plan_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        if name in self._topics or name in self._pending:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        problem = validate_topic_name(name)
        if problem is not None:
            raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        self._pending.add(name)
        return TopicInfo(name, uuid.uuid4(), partitions, dict(configs))

    def build_partitions(
        self, info: TopicInfo, first: int, total: int | None = None, *, only: Container[int] | None = None
    ) -> list[PartitionLog]:
        """Directories and first segments of partitions ``first`` up to ``total`` (default: all of the topic),
        those in ``only`` if given (the replicas this broker holds). Safe in a worker thread: it touches only the
        new directories."""
        config = self.log_config(info)
        logs = []
        for index in range(first, info.partitions if total is None else total):
            if only is not None and index not in only:
                continue
            if self.durable:
                directory, backend = self._prepare_directory(info, index), None
            else:
                from kbroker.storage.memory import MemoryBackend  # only for logs kept in memory

                directory = self._directory(info.name, index)
                backend = MemoryBackend(directory)
            logs.append(
                PartitionLog(
                    info.name,
                    index,
                    directory,
                    config,
                    clean=True,
                    health=self.dir_health,
                    descriptors=self.descriptors,
                    backend=backend,
                )
            )
        return logs

    def commit_topic(self, info: TopicInfo, logs: list[PartitionLog]) -> TopicInfo:
        self._pending.discard(info.name)
        self._topics[info.name] = info
        self._by_id[info.topic_id] = info
        for plog in logs:
            self._partitions[(info.name, plog.partition)] = plog
            self._opened_this_run.add((info.name, plog.partition))
        self._save_topics()
        return info

    def abandon(self, info: TopicInfo) -> None:
        """Forget a planned topic whose partitions could not be built."""
        self._pending.discard(info.name)

    def is_pending(self, name: str) -> bool:
        return name in self._pending

    def _prepare_directory(self, info: TopicInfo, index: int) -> Path:
        directory = self._directory(info.name, index)
        if directory.exists():
            # Left behind by an older topic of this name (a delete that did not finish): kept, aside.
            self._quarantine(directory, f"it is not partition {index} of topic id {info.topic_id}")
            self._recovery_points.pop((info.name, index), None)
        directory.mkdir(parents=True)
        self._write_partition_metadata(info, directory)
        return directory

    @staticmethod
    def _write_partition_metadata(info: TopicInfo, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(
            directory / PARTITION_METADATA_FILE, f"version: 0\ntopic_id: {info.topic_id}\n", sync_directory=True
        )

    def _directory(self, name: str, index: int) -> Path:
        return self.data_dir / f"{name}-{index}"

    def _discard_directory(self, directory: Path) -> None:
        doomed = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}{DELETED_SUFFIX}")
        os.rename(directory, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def delete_topic(self, name: str) -> None:
        info = self._topics.pop(name)
        self._by_id.pop(info.topic_id, None)
        for index in range(info.partitions):
            self._recovery_points.pop((name, index), None)
        self._save_topics()  # the topic is gone once this is written; removing files can lag behind
        for index in range(info.partitions):
            plog = self._partitions.pop((name, index), None)
            if plog is not None:
                plog.delete()
            directory = self._directory(name, index)
            # (a partition still being built is deleted by ``finish_building``)
            if self.durable and (name, index) not in self._building and directory.exists():
                self._discard_directory(directory)

    def add_partitions(self, name: str, total: int) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
        if total <= info.partitions:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, f"topic {name} already has {info.partitions} partitions")
        return self.commit_partitions(info, self.build_partitions(info, info.partitions, total))

    def commit_partitions(self, info: TopicInfo, logs: list[PartitionLog]) -> TopicInfo:
        for plog in logs:
            self._partitions[(info.name, plog.partition)] = plog
            self._opened_this_run.add((info.name, plog.partition))
        if logs:
            info.partitions = max(info.partitions, logs[-1].partition + 1)
        self._save_topics()
        return info

    def set_topic_defaults(self, topic_defaults: dict[str, str]) -> None:
        """New broker-level defaults (dynamic broker configs): every open partition without an override of a
        changed key takes the new value at once."""
        if topic_defaults == self.topic_defaults:
            return
        self.topic_defaults = dict(topic_defaults)
        configs: dict[str, LogConfig] = {}
        for (name, _), plog in self._partitions.items():
            info = self._topics.get(name)
            if info is None:
                continue
            if name not in configs:
                configs[name] = self.log_config(info)
            plog.update_config(configs[name])

    def alter_topic_config(self, name: str, configs: dict[str, str]) -> TopicInfo:
        """Replace the topic's config overrides; takes effect on its open partitions at once."""
        info = self._topics[name]
        info.configs = dict(configs)
        self._save_topics()
        config = self.log_config(info)
        for index in range(info.partitions):
            plog = self._partitions.get((name, index))
            if plog is not None:
                plog.update_config(config)
        return info

    # --- partitions ----------------------------------------------------------------------------------

    def get_partition(self, topic: str, partition: int) -> PartitionLog | None:
        plog = self._partitions.get((topic, partition))
        if plog is not None:
            return plog
        if (topic, partition) in self._building:
            return None
        info = self._topics.get(topic)
        if info is None or not 0 <= partition < info.partitions or not self.durable:
            return None  # (a log in memory exists from its creation)
        directory = self._directory(topic, partition)
        try:
            stored_id = _stored_topic_id(directory) if directory.exists() else None
            if stored_id is None:
                # A new partition, or one whose metadata file was lost: keep any data and (re)write the file.
                self._write_partition_metadata(info, directory)
            elif stored_id != info.topic_id:
                # Left behind by an older topic of the same name (a delete that did not finish): kept, aside.
                reason = f"its {PARTITION_METADATA_FILE} names topic id {stored_id}, {topic} is {info.topic_id}"
                self._quarantine(directory, reason)
                self._recovery_points.pop((topic, partition), None)
                self._write_partition_metadata(info, directory)
            checkpointed = self._high_watermarks
            plog = PartitionLog(
                topic,
                partition,
                directory,
                self.log_config(info),
                clean=self.clean_start,
                health=self.dir_health,
                recovery_point=self._recovery_points.get((topic, partition), 0),
                descriptors=self.descriptors,
                high_watermark=None if checkpointed is None else checkpointed.get((topic, partition), 0),
            )
        except (StorageError, OSError, DecodeError) as exc:
            # Kafka takes such a log offline; here the partition answers KAFKA_STORAGE_ERROR until repaired.
            log.error("%s-%d cannot be opened: %s", topic, partition, exc)
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"{topic}-{partition} cannot be opened: {exc}") from None
        self._partitions[(topic, partition)] = plog
        self._opened_this_run.add((topic, partition))
        if self.opened is not None:
            self.opened(plog)
        return plog

    def open_partitions(self) -> list[PartitionLog]:
        return list(self._partitions.values())

    def all_partitions(self) -> list[PartitionLog]:
        """Every partition of every topic, opening those not yet open."""
        return self._partitions_of(list(self._topics.values()))

    def compacted_partitions(self) -> list[PartitionLog]:
        """Every partition of the topics whose cleanup.policy includes compact (opened if need be)."""
        return self._partitions_of([info for info in self._topics.values() if self.log_config(info).compacted])

    def _partitions_of(self, topics: list[TopicInfo]) -> list[PartitionLog]:
        result = []
        for info in topics:
            for index in range(info.partitions):
                try:
                    plog = self.get_partition(info.name, index)
                except KafkaError:  # damaged: logged by get_partition, left alone by maintenance
                    continue
                if plog is not None:
                    result.append(plog)
        return result

    def apply_retention(self, now_ms: int) -> list[Segment]:
        deleted: list[Segment] = []
        for plog in self.all_partitions():
            deleted.extend(plog.apply_retention(now_ms))
        return deleted

    def due_for_flush(self, now_ms: int) -> list[PartitionLog]:
        return [plog for plog in self._partitions.values() if plog.flush_due(now_ms)]

    def close(self) -> None:
        for plog in self._partitions.values():
            plog.close()
        if not self.durable:
            self._partitions.clear()
            return
        try:
            self.checkpoint_recovery_points()
        except OSError as exc:  # the previous checkpoint stays: the next unclean start validates more
            log.error("cannot write %s: %s", self.data_dir / RECOVERY_POINT_FILE, exc)
        self._partitions.clear()
        if self.dir_health.offline:
            return  # no clean-shutdown marker: the next start recovers every log from its batches
        every_partition = {(info.name, index) for info in self._topics.values() for index in range(info.partitions)}
        if not self.clean_start and not every_partition <= self._opened_this_run:
            # After an unclean start, partitions never opened were never recovered: the next start must still
            # recover them (from their recovery points, so those that were opened cost little).
            log.info("partitions not opened since an unclean start are recovered at the next start")
            return
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        marker.write_text("")
        fsync_directory(self.data_dir)
