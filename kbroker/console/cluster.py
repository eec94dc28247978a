"""What the console shows, read from a cluster as a Kafka client (kafka-python's admin client and a consumer).

Every function here is blocking, as kafka-python is: the web layer (kbroker/console/app.py) calls them on a worker
thread, one at a time per client. The results are plain dataclasses the templates render; nothing here knows
about HTTP. Because the console is a client, it shows Apache Kafka (or any Kafka-compatible broker) the same way.
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from kbroker.commands.connection import ClientSettings, CommandError, admin_client, consumer_client

# A page waits at most this long for the cluster (kafka-python's default is 30 s, too long for a person).
REQUEST_TIMEOUT_MS = 10_000
BROWSE_LIMIT = 500  # records on one page of the message browser, at most
BROWSE_SECONDS = 5.0  # how long the browser keeps fetching before it shows what it has


@dataclass
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass
class Overview:
    cluster_id: str | None
    controller_id: int | None
    brokers: list[BrokerInfo]
    topic_count: int
    internal_topic_count: int
    partition_count: int
    total_size: int | None
    kafka_version: str | None  # the Kafka version the broker's ApiVersions look like (kafka-python's guess)
    software: str | None  # the broker's software and version, when the console runs inside it


@dataclass
class PartitionInfo:
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    start_offset: int | None = None
    end_offset: int | None = None
    size: int | None = None
    error: str | None = None

    @property
    def messages(self) -> int | None:
        """About how many records: end − start (compacted topics and transaction markers make it an upper bound)."""
        if self.start_offset is None or self.end_offset is None:
            return None
        return self.end_offset - self.start_offset


@dataclass
class TopicSummary:
    name: str
    internal: bool
    partitions: list[PartitionInfo]

    @property
    def size(self) -> int | None:
        sizes = [p.size for p in self.partitions]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)

    @property
    def messages(self) -> int | None:
        counts = [p.messages for p in self.partitions]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    @property
    def replication_factor(self) -> int:
        return max((len(p.replicas) for p in self.partitions), default=0)


@dataclass
class ConfigEntry:
    name: str
    value: str | None
    source: str
    sensitive: bool
    read_only: bool

    @property
    def is_default(self) -> bool:
        return self.source in ("DEFAULT_CONFIG", "STATIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG")


@dataclass
class TopicDetail:
    summary: TopicSummary
    topic_id: str | None
    configs: list[ConfigEntry]


@dataclass
class GroupSummary:
    group_id: str
    state: str
    group_type: str
    protocol_type: str
    members: int | None = None
    lag: int | None = None


@dataclass
class MemberInfo:
    member_id: str
    client_id: str
    host: str
    group_instance_id: str | None
    assignment: list[str]


@dataclass
class GroupOffset:
    topic: str
    partition: int
    committed: int
    end_offset: int | None
    metadata: str

    @property
    def lag(self) -> int | None:
        if self.end_offset is None or self.committed < 0:
            return None
        return max(self.end_offset - self.committed, 0)


@dataclass
class GroupDetail:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberInfo]
    offsets: list[GroupOffset]

    @property
    def lag(self) -> int | None:
        lags = [o.lag for o in self.offsets if o.lag is not None]
        return sum(lags) if lags else None


@dataclass
class BrowsedRecord:
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]

    @property
    def timestamp_text(self) -> str:
        if self.timestamp < 0:
            return "-"
        moment = datetime.datetime.fromtimestamp(self.timestamp / 1000, tz=datetime.UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class BrowseResult:
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    from_offset: int | None  # where the page starts; None: no record at or after the timestamp
    records: list[BrowsedRecord] = field(default_factory=list)


class Cluster:
    """One admin client (and one browsing consumer) for the console, each used by one caller at a time."""

    def __init__(self, settings: ClientSettings, software: str | None = None) -> None:
        # The console's clients name themselves, unless the command config names them.
        self.settings = ClientSettings(settings.bootstrap, {"client.id": "kbroker-console", **settings.properties})
        self.software = software
        self._admin: Any = None
        self._consumer: Any = None
        self._admin_lock = threading.Lock()
        self._consumer_lock = threading.Lock()

    def _client_kwargs(self) -> dict[str, Any]:
        """A page waits for the cluster at most request.timeout.ms (kafka_kwargs bounds the first connection)."""
        if "request.timeout.ms" in self.settings.properties:
            return {}
        return {"request_timeout_ms": REQUEST_TIMEOUT_MS}

    @property
    def admin(self) -> Any:
        if self._admin is None:  # made on first use: the console starts even while the cluster is down
            self._admin = admin_client(self.settings, **self._client_kwargs())
        return self._admin

    def close(self) -> None:
        for client in (self._admin, self._consumer):
            if client is not None:
                try:
                    client.close()
                except Exception:  # noqa: BLE001 - closing on the way out: nothing left to report to
                    pass
        self._admin = self._consumer = None

    # --- cluster and topics -------------------------------------------------------------------------------------

    def overview(self) -> Overview:
        from kbroker.commands.topics import partition_leaders, partition_sizes

        with self._admin_lock:
            cluster = self.admin.describe_cluster()
            topics = self.admin.describe_topics()
            sizes = partition_sizes(self.admin, partition_leaders(topics))
            version = self.admin._manager.broker_version  # kafka-python's guess from ApiVersions
        brokers = [BrokerInfo(b["broker_id"], b["host"], b["port"], b.get("rack")) for b in cluster["brokers"]]
        controller = cluster.get("controller_id")
        return Overview(
            cluster_id=cluster.get("cluster_id"),
            controller_id=controller if controller is not None and controller >= 0 else None,
            brokers=sorted(brokers, key=lambda b: b.node_id),
            topic_count=sum(1 for t in topics if not t["is_internal"]),
            internal_topic_count=sum(1 for t in topics if t["is_internal"]),
            partition_count=sum(len(t["partitions"]) for t in topics),
            total_size=sum(sizes.values()) if sizes else 0,
            kafka_version=".".join(str(part) for part in version) if version else None,
            software=self.software,
        )

    def topics(self) -> list[TopicSummary]:
        with self._admin_lock:
            described = self.admin.describe_topics()
            summaries = [_summary(t) for t in described if t["error_code"] == 0]
            self._fill_offsets_and_sizes(summaries)
        return sorted(summaries, key=lambda t: (t.internal, t.name))

    def topic(self, name: str) -> TopicDetail:
        from kafka.admin import ConfigResource, ConfigResourceType

        with self._admin_lock:
            described = self.admin.describe_topics([name])
            entry: dict[str, Any] = described[0] if described else {"error_code": 3, "name": name}
            _raise_for_code(entry["error_code"], f"Topic '{name}' is not in the cluster's metadata")
            summary = _summary(entry)
            self._fill_offsets_and_sizes([summary])
            configs = self.admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)], config_filter="ALL")
        entries = [
            ConfigEntry(key, c.get("value"), str(c.get("config_source")), bool(c.get("is_sensitive")), c["read_only"])
            for key, c in sorted(configs.get("topic", {}).get(name, {}).items())
        ]
        return TopicDetail(summary, entry.get("topic_id"), entries)

    def create_topic(self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]) -> None:
        with self._admin_lock:
            self.admin.create_topics(
                {name: {"num_partitions": partitions, "replication_factor": replication_factor, "configs": configs}}
            )

    def delete_topic(self, name: str) -> None:
        with self._admin_lock:
            self.admin.delete_topics([name])

    def _fill_offsets_and_sizes(self, summaries: list[TopicSummary]) -> None:
        from kbroker.commands.topics import log_offsets, partition_sizes

        leaders = {(t.name, p.partition): p.leader for t in summaries for p in t.partitions if p.leader >= 0}
        offsets = log_offsets(self.admin, leaders)
        sizes = partition_sizes(self.admin, leaders)
        for summary in summaries:
            for info in summary.partitions:
                key = (summary.name, info.partition)
                info.start_offset, info.end_offset = offsets.get(key, (None, None))
                info.size = sizes.get(key)

    # --- consumer groups -----------------------------------------------------------------------------------------

    def groups(self) -> list[GroupSummary]:
        with self._admin_lock:
            listed = self.admin.list_groups()
            summaries = [
                GroupSummary(
                    g["group_id"], g.get("group_state") or "", g.get("group_type") or "", g.get("protocol_type") or ""
                )
                for g in listed
            ]
            ids = [g.group_id for g in summaries]
            if ids:
                described = self.admin.describe_groups(ids)
                offsets = self._group_offsets(ids)
                for group in summaries:
                    info = described.get(group.group_id)
                    if info is not None and not info.get("error"):
                        group.members = len(info.get("members") or [])
                    lags = [o.lag for o in offsets.get(group.group_id, []) if o.lag is not None]
                    group.lag = sum(lags) if lags else None
        return sorted(summaries, key=lambda g: g.group_id)

    def group(self, group_id: str) -> GroupDetail:
        with self._admin_lock:
            described = self.admin.describe_groups([group_id])
            info = described.get(group_id) or {}
            error = info.get("error")
            if error:
                raise _group_error(str(error))
            offsets = self._group_offsets([group_id]).get(group_id, [])
        if info.get("group_state") == "Dead" and not offsets:
            from kafka.errors import GroupIdNotFoundError

            raise GroupIdNotFoundError(f"Group '{group_id}' does not exist.")
        members = [
            MemberInfo(
                m.get("member_id") or "",
                m.get("client_id") or "",
                m.get("client_host") or "",
                m.get("group_instance_id"),
                _assignment(m.get("member_assignment")),
            )
            for m in info.get("members") or []
        ]
        return GroupDetail(
            group_id,
            info.get("group_state") or "",
            info.get("protocol_type") or "",
            str(info.get("protocol_data") or ""),
            members,
            offsets,
        )

    def _group_offsets(self, group_ids: list[str]) -> dict[str, list[GroupOffset]]:
        from kafka.admin import OffsetSpec

        committed: dict[str, Any] = {}
        for group_id in group_ids:  # one at a time: brokers before OffsetFetch v8 take one group per request
            committed.update(self.admin.list_group_offsets({group_id: None}))
        partitions = {tp for by_partition in committed.values() for tp in by_partition}
        ends: dict[Any, Any] = {}
        if partitions:
            from kafka.errors import KafkaError

            try:
                ends = self.admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in partitions})
            except KafkaError:  # a committed topic since deleted: show the commits without lag
                ends = {}
        result: dict[str, list[GroupOffset]] = defaultdict(list)
        for group_id, by_partition in committed.items():
            for tp, committed_offset in sorted(by_partition.items()):
                end = ends.get(tp)
                result[group_id].append(
                    GroupOffset(
                        tp.topic,
                        tp.partition,
                        committed_offset.offset,
                        end.offset if end is not None else None,
                        committed_offset.metadata or "",
                    )
                )
        return result

    # --- records -------------------------------------------------------------------------------------------------

    def browse(
        self, topic: str, partition: int, *, offset: int | None, timestamp_ms: int | None, newest: bool, count: int
    ) -> BrowseResult:
        """Up to ``count`` records of one partition from ``offset``, from the first record at or after
        ``timestamp_ms``, or (``newest``) the last ``count`` records."""
        from kafka import TopicPartition
        from kafka.admin import OffsetSpec

        count = max(1, min(count, BROWSE_LIMIT))
        tp = TopicPartition(topic, partition)
        with self._admin_lock:
            described = self.admin.describe_topics([topic])
            entry: dict[str, Any] = described[0] if described else {"error_code": 3, "partitions": []}
            _raise_for_code(entry["error_code"], f"Topic '{topic}' is not in the cluster's metadata")
            if partition not in {p["partition_index"] for p in entry["partitions"]}:
                from kafka.errors import UnknownTopicOrPartitionError

                raise UnknownTopicOrPartitionError(f"Topic '{topic}' has no partition {partition}")
            start = self.admin.list_partition_offsets({tp: OffsetSpec.EARLIEST})[tp].offset
            end = self.admin.list_partition_offsets({tp: OffsetSpec.LATEST})[tp].offset
            if timestamp_ms is not None:
                found = self.admin.list_partition_offsets({tp: timestamp_ms})[tp].offset
                from_offset: int | None = found if found >= 0 else None
            elif newest:
                from_offset = max(start, end - count)
            else:
                from_offset = min(max(offset or 0, start), end)
        result = BrowseResult(topic, partition, start, end, from_offset)
        if from_offset is None or from_offset >= end:
            return result
        with self._consumer_lock:
            result.records = self._fetch(tp, from_offset, end, count)
        return result

    def _fetch(self, tp: Any, from_offset: int, end: int, count: int) -> list[BrowsedRecord]:
        if self._consumer is None:
            self._consumer = consumer_client(
                self.settings,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                **self._client_kwargs(),
            )
        consumer = self._consumer
        consumer.assign([tp])
        consumer.seek(tp, from_offset)
        records: list[BrowsedRecord] = []
        deadline = time.monotonic() + BROWSE_SECONDS
        while len(records) < count and time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=500, max_records=count - len(records))
            for record in batch.get(tp, []):
                records.append(
                    BrowsedRecord(
                        record.partition,
                        record.offset,
                        record.timestamp,
                        record.timestamp_type,
                        record.key,
                        record.value,
                        [(name, value) for name, value in record.headers or []],
                    )
                )
            if consumer.position(tp) >= end:  # read up to the end the page began with
                break
        return records[:count]


def _summary(entry: dict[str, Any]) -> TopicSummary:
    partitions = [
        PartitionInfo(
            p["partition_index"],
            p["leader_id"],
            list(p["replica_nodes"]),
            list(p["isr_nodes"]),
            error=None if p["error_code"] == 0 else _code_name(p["error_code"]),
        )
        for p in entry["partitions"]
    ]
    return TopicSummary(entry["name"], bool(entry["is_internal"]), sorted(partitions, key=lambda p: p.partition))


def _code_name(code: int) -> str:
    import kafka.errors as kafka_errors

    return str(kafka_errors.for_code(code).message)


def _raise_for_code(code: int, message: str) -> None:
    if code:
        import kafka.errors as kafka_errors

        raise kafka_errors.for_code(code)(message)


def _group_error(text: str) -> Exception:
    """The broker's error back from kafka-python's describe_groups text ("[Error 69] GroupIdNotFoundError: ...")."""
    import kafka.errors as kafka_errors

    match = re.match(r"\[Error (\d+)\] \w+:? ?(.*)", text)
    if match is None:
        return CommandError(text)
    return kafka_errors.for_code(int(match.group(1)))(match.group(2) or None)


def _assignment(raw: Any) -> list[str]:
    """The partitions a consumer-protocol member is assigned, as "topic-partition" (kafka-python decodes them)."""
    if not raw or isinstance(raw, str | bytes):
        return []
    assigned = getattr(raw, "assigned_partitions", None) or (
        raw.get("assigned_partitions") if isinstance(raw, dict) else None
    )
    if not assigned:
        return []
    names = []
    for item in assigned:
        topic = item.get("topic") if isinstance(item, dict) else getattr(item, "topic", None)
        partitions = item.get("partitions") if isinstance(item, dict) else getattr(item, "partitions", [])
        names += [f"{topic}-{p}" for p in partitions or []]
    return sorted(names)
