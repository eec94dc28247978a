"""The broker's metrics: counters the request path updates, and what a scrape reads from the broker's state.

The request path only adds integers (and one float for the latency sum) to plain Python objects:
``BrokerMetrics.observe_request`` once per request (kbroker/server/connection.py), ``topic(name)`` counters per
topic and partition produced to or fetched from (kbroker/apis/produce.py, fetch.py). Nothing here does I/O or
imports prometheus_client; everything else (sizes, offsets, connections, group lag) is read from the broker
when a scrape asks (``families``). kbroker/server/metrics_http.py serves the result in Prometheus text format
on ``kbroker serve --metrics-listen HOST:PORT`` (server.properties: ``kbroker.metrics.listen``).

Names follow Kafka's JMX metrics as the Prometheus JMX exporter renders them (``kafka.server:type=
BrokerTopicMetrics,name=BytesInPerSec,topic=t`` becomes ``kafka_server_brokertopicmetrics_bytesin_total
{topic="t"}``): Kafka's meters are counters here (a rate is PromQL's ``rate()``). Consumer lag, which Kafka's
broker does not export, uses the names of the widely used kafka_exporter so its dashboards work unchanged.

=====================================================================  =========  ===============================
Metric                                                                 Type       Labels
=====================================================================  =========  ===============================
kafka_server_brokertopicmetrics_bytesin_total                          counter    topic (none: all topics)
kafka_server_brokertopicmetrics_bytesout_total                         counter    topic (none: all topics)
kafka_server_brokertopicmetrics_messagesin_total                       counter    topic (none: all topics)
kafka_network_requestmetrics_requests_total                            counter    request, version
kafka_network_requestmetrics_totaltimems                               histogram  request (buckets in ms)
kafka_server_socketservermetrics_connection_count                      gauge      listener
kafka_log_log_size                                                     gauge      topic, partition
kafka_log_log_logstartoffset                                           gauge      topic, partition
kafka_log_log_logendoffset                                             gauge      topic, partition
kafka_log_log_highwatermark                                            gauge      topic, partition
kafka_log_log_numlogsegments                                           gauge      topic, partition
kafka_server_replicamanager_partitioncount                             gauge
kafka_server_replicamanager_leadercount                                gauge
kafka_server_replicamanager_offlinereplicacount                        gauge
kafka_server_replicamanager_underreplicatedpartitions                  gauge
kafka_server_replicamanager_underminisrpartitioncount                  gauge
kafka_server_replicamanager_atminisrpartitioncount                     gauge
kafka_server_replicamanager_isrshrinks_total                           counter
kafka_server_replicamanager_isrexpands_total                           counter
kafka_server_replicamanager_failedisrupdates_total                     counter
kafka_cluster_partition_underreplicated                                gauge      topic, partition
kafka_cluster_partition_underminisr                                    gauge      topic, partition
kafka_cluster_partition_atminisr                                       gauge      topic, partition
kafka_cluster_partition_insyncreplicascount                            gauge      topic, partition
kafka_cluster_partition_replicascount                                  gauge      topic, partition
kafka_server_fetcherlagmetrics_consumerlag                             gauge      clientid, topic, partition
kafka_consumergroup_current_offset                                     gauge      consumergroup, topic, partition
kafka_consumergroup_lag                                                gauge      consumergroup, topic, partition
process_* (CPU seconds, resident memory, open descriptors, start time)  various    (prometheus_client's)
=====================================================================  =========  ===============================

What each counts, as Kafka counts it:

* bytesin / messagesin: the record batches of a Produce that were appended (their size as received, their
  record count), counted once appended; refused batches count nothing, and a producer's retry that the
  idempotence check answers from the first append counts again (Kafka's ReplicaManager marks both for every
  append that did not fail). bytesout: the record bytes of each
  Fetch answer as sent, per partition (errors and empty partitions add 0). The series without a topic label
  is the sum over every topic, deleted ones included (it never goes down); a deleted topic's own series
  disappear with it, as Kafka removes its topic metrics.
* requests_total: every request answered (or, for acks=0 produce, handled), by API name as Kafka writes it
  (``Produce``, ``Fetch``, ``Metadata``...) and version. totaltimems: from the request read whole to its
  answer written to the socket (Kafka's TotalTimeMs less the queue time kbroker does not have), in
  milliseconds: buckets ``REQUEST_TIME_BUCKETS_MS``, ``_sum`` in ms, ``_count`` the requests.
* connection_count: open Kafka client connections per listener (every served listener, 0 included).
* Log gauges: per partition, the bytes of its segments, its first offset, the offset after its last record,
  its high watermark (what consumers may read; kbroker's addition, Kafka has no JMX gauge for it) and its
  number of segments.
* replicamanager: partitions hosted, partitions it leads, those whose files could not be opened (offline), and
  the partitions it leads with fewer in-sync replicas than replicas (under-replicated), than the effective
  min.insync.replicas (under min ISR), or exactly that many (at min ISR), as Kafka's ReplicaManager counts them:
  the effective min.insync.replicas is capped by the replica count, so a single node's partitions are all at
  min ISR and none under it.
* Partition gauges (Kafka's kafka.cluster:type=Partition), per partition this broker leads (0 on a follower, as
  Kafka's): under-replicated, under min ISR and at min ISR as 0 or 1, and its in-sync and assigned replica counts.
* fetcherlagmetrics_consumerlag (Kafka's ReplicaLag, FetcherLagMetrics ConsumerLag): per partition this broker
  follows and has fetched, its leader's high watermark less this replica's log end after that fetch; clientid
  names the fetcher as Kafka's (``ReplicaFetcherThread-0-<leader id>``).
* consumergroup: per group and partition with a committed offset, that offset and the lag: high watermark
  less committed offset (never below 0), computed at scrape time from the group coordinator's offsets.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from protocol.errors import KafkaError
from protocol.messages import APIS

if TYPE_CHECKING:
    from kbroker.broker import Broker

# Upper bounds of the request latency histogram's buckets, in milliseconds (then +Inf).
REQUEST_TIME_BUCKETS_MS = (0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
_BUCKET_BOUNDS_S = tuple(bound / 1000 for bound in REQUEST_TIME_BUCKETS_MS)


class TopicCounters:
    """One topic's counters, updated in place by the produce and fetch handlers."""

    __slots__ = ("bytes_in", "bytes_out", "messages_in")

    def __init__(self) -> None:
        self.bytes_in = 0
        self.bytes_out = 0
        self.messages_in = 0


class RequestCounters:
    """One API's requests: a count per version, and the latency histogram's bucket counts and sum."""

    __slots__ = ("by_version", "buckets", "seconds")

    def __init__(self) -> None:
        self.by_version: dict[int, int] = {}
        self.buckets = [0] * (len(_BUCKET_BOUNDS_S) + 1)  # the last one is +Inf
        self.seconds = 0.0


class BrokerMetrics:
    """Every counter the request path updates; one per broker (``Broker.metrics``)."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicCounters] = {}
        self.requests: dict[int, RequestCounters] = {}
        # What deleted topics had counted: kept so that the all-topics totals never go down.
        self.retired = TopicCounters()

    def topic(self, name: str) -> TopicCounters:
        """The counters of topic ``name`` (made on first use)."""
        counters = self.topics.get(name)
        if counters is None:
            counters = self.topics[name] = TopicCounters()
        return counters

    def observe_request(self, api_key: int, version: int, seconds: float) -> None:
        """Count one request of ``api_key`` v``version`` that took ``seconds`` from read to answered."""
        counters = self.requests.get(api_key)
        if counters is None:
            counters = self.requests[api_key] = RequestCounters()
        by_version = counters.by_version
        by_version[version] = by_version.get(version, 0) + 1
        counters.buckets[bisect_left(_BUCKET_BOUNDS_S, seconds)] += 1  # le: a bound is in its bucket
        counters.seconds += seconds

    def forget_topics_except(self, existing: set[str]) -> None:
        """Drop the counters of topics that no longer exist, adding them to the all-topics remainder."""
        for name in [name for name in self.topics if name not in existing]:
            gone = self.topics.pop(name)
            self.retired.bytes_in += gone.bytes_in
            self.retired.bytes_out += gone.bytes_out
            self.retired.messages_in += gone.messages_in


# --- what a scrape reads -----------------------------------------------------------------------------------


class Sample(NamedTuple):
    suffix: str  # added to the family's name: "" for a gauge, "_total" for a counter, "_bucket"... for a histogram
    labels: dict[str, str]
    value: float


@dataclass(slots=True)
class Family:
    """One metric in Prometheus' terms: a name, its type and help, and its samples."""

    name: str
    kind: str  # "counter", "gauge" or "histogram"
    help: str
    samples: list[Sample] = field(default_factory=list)

    def add(self, value: float, suffix: str = "", **labels: str) -> None:
        self.samples.append(Sample(suffix, labels, value))


def api_name(api_key: int) -> str:
    """The API's name as Kafka's request metrics write it (``Produce``, ``Fetch``, ``Metadata``)."""
    api = APIS.get(api_key)
    return api.name if api is not None else str(api_key)


def families(broker: Broker) -> Iterator[Family]:
    """Every metric of ``broker`` at this moment (see the module docstring for each)."""
    metrics = broker.metrics
    topics = broker.logs.topics()
    metrics.forget_topics_except({info.name for info in topics})
    yield from _topic_families(metrics)
    yield from _request_families(metrics)
    yield _connection_family(broker)
    yield from _log_families(broker, sum(info.partitions for info in topics))
    yield _fetcher_lag_family(broker)
    yield from _group_families(broker)


def _fetcher_lag_family(broker: Broker) -> Family:
    family = Family(
        "kafka_server_fetcherlagmetrics_consumerlag",
        "gauge",
        "Per partition followed here: the leader's high watermark less this replica's log end, as last fetched.",
    )
    fetchers = broker.replicas.fetchers
    for client_id, topic, partition, lag in sorted(fetchers.lags() if fetchers is not None else []):
        family.add(lag, clientid=client_id, topic=topic, partition=str(partition))
    return family


def _topic_families(metrics: BrokerMetrics) -> Iterator[Family]:
    prefix = "kafka_server_brokertopicmetrics_"
    for attribute, name, help_text in (
        ("bytes_in", "bytesin", "Bytes of record batches appended by Produce requests."),
        ("bytes_out", "bytesout", "Bytes of records sent in Fetch answers."),
        ("messages_in", "messagesin", "Records appended by Produce requests."),
    ):
        family = Family(prefix + name, "counter", help_text)
        total = getattr(metrics.retired, attribute)
        for topic, counters in sorted(metrics.topics.items()):
            value = getattr(counters, attribute)
            total += value
            family.add(value, "_total", topic=topic)
        family.add(total, "_total")
        yield family


def _request_families(metrics: BrokerMetrics) -> Iterator[Family]:
    requests = Family("kafka_network_requestmetrics_requests", "counter", "Requests handled, by API and version.")
    latency = Family(
        "kafka_network_requestmetrics_totaltimems",
        "histogram",
        "Milliseconds from a request read whole to its answer written, by API.",
    )
    for api_key, counters in sorted(metrics.requests.items()):
        request = api_name(api_key)
        for version, count in sorted(counters.by_version.items()):
            requests.add(count, "_total", request=request, version=str(version))
        cumulative = 0
        for bound, count in zip((*REQUEST_TIME_BUCKETS_MS, float("inf")), counters.buckets, strict=True):
            cumulative += count
            latency.add(cumulative, "_bucket", request=request, le=_bound_text(bound))
        latency.add(cumulative, "_count", request=request)
        latency.add(counters.seconds * 1000, "_sum", request=request)
    yield requests
    yield latency


def _bound_text(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def _connection_family(broker: Broker) -> Family:
    family = Family(
        "kafka_server_socketservermetrics_connection_count", "gauge", "Open client connections, by listener."
    )
    counts = dict.fromkeys((name for name, _ in broker.listeners), 0)
    for connection in list(broker.open_connections.values()):
        listener = getattr(connection, "listener_name", "PLAINTEXT")
        counts[listener] = counts.get(listener, 0) + 1
    for listener, count in sorted(counts.items()):
        family.add(count, listener=listener)
    return family


def _log_families(broker: Broker, hosted: int) -> Iterator[Family]:
    gauges = [
        Family("kafka_log_log_size", "gauge", "Bytes of the partition's log segments."),
        Family("kafka_log_log_logstartoffset", "gauge", "The partition's first offset."),
        Family("kafka_log_log_logendoffset", "gauge", "The offset after the partition's last record."),
        Family("kafka_log_log_highwatermark", "gauge", "The partition's high watermark (what consumers may read)."),
        Family("kafka_log_log_numlogsegments", "gauge", "The partition's log segments."),
    ]
    size, start, end, high_watermark, segments = gauges
    partitions = sorted(broker.logs.all_partitions(), key=lambda plog: (plog.topic, plog.partition))
    for plog in partitions:
        labels = {"topic": plog.topic, "partition": str(plog.partition)}
        size.add(plog.size_bytes, **labels)
        start.add(plog.log_start_offset, **labels)
        end.add(plog.log_end_offset, **labels)
        high_watermark.add(plog.high_watermark, **labels)
        segments.add(len(plog.segments), **labels)
    yield from gauges
    per_partition = [
        Family("kafka_cluster_partition_underreplicated", "gauge", "1 if it has fewer in-sync replicas than replicas."),
        Family("kafka_cluster_partition_underminisr", "gauge", "1 if it has fewer in-sync replicas than its minimum."),
        Family("kafka_cluster_partition_atminisr", "gauge", "1 if it has exactly its minimum of in-sync replicas."),
        Family("kafka_cluster_partition_insyncreplicascount", "gauge", "Its in-sync replicas (0 unless led here)."),
        Family("kafka_cluster_partition_replicascount", "gauge", "Its replicas (0 unless led here)."),
    ]
    under_replicated, under_min_isr, at_min_isr, in_sync, assigned = per_partition
    leaders = under_replicated_count = under_min_isr_count = at_min_isr_count = 0
    for plog in partitions:
        labels = {"topic": plog.topic, "partition": str(plog.partition)}
        replica = broker.replicas.held(plog.topic, plog.partition)
        leading = replica is not None and replica.is_leader
        flags, in_sync_count, replica_count = (False, False, False), 0, 0
        if replica is not None and leading:
            flags = (replica.under_replicated, replica.under_min_isr, replica.at_min_isr)
            in_sync_count, replica_count = len(replica.isr), len(replica.replicas)
        under_replicated.add(int(flags[0]), **labels)
        under_min_isr.add(int(flags[1]), **labels)
        at_min_isr.add(int(flags[2]), **labels)
        in_sync.add(in_sync_count, **labels)
        assigned.add(replica_count, **labels)
        leaders += leading
        under_replicated_count += flags[0]
        under_min_isr_count += flags[1]
        at_min_isr_count += flags[2]
    yield from per_partition
    prefix = "kafka_server_replicamanager_"
    for name, value, help_text in (
        ("partitioncount", hosted, "Partitions on this broker."),
        ("leadercount", leaders, "Partitions this broker leads."),
        ("offlinereplicacount", hosted - len(partitions), "Partitions whose files could not be opened."),
        (
            "underreplicatedpartitions",
            under_replicated_count,
            "Partitions led here with fewer in-sync replicas than replicas.",
        ),
        ("underminisrpartitioncount", under_min_isr_count, "Partitions led here under their min.insync.replicas."),
        ("atminisrpartitioncount", at_min_isr_count, "Partitions led here at exactly their min.insync.replicas."),
    ):
        family = Family(prefix + name, "gauge", help_text)
        family.add(value)
        yield family
    replicas = broker.replicas
    for name, count, help_text in (
        ("isrshrinks", replicas.isr_shrinks, "ISR shrinks of partitions led here, as the controller accepted them."),
        ("isrexpands", replicas.isr_expands, "ISR expansions of partitions led here, as the controller accepted them."),
        ("failedisrupdates", replicas.failed_isr_updates, "ISR changes the controller refused."),
    ):
        family = Family(prefix + name, "counter", help_text)
        family.add(count)
        yield family


def _group_families(broker: Broker) -> Iterator[Family]:
    current = Family("kafka_consumergroup_current_offset", "gauge", "The group's committed offset, by partition.")
    lag = Family("kafka_consumergroup_lag", "gauge", "High watermark less the group's committed offset.")
    for group, committed in sorted(broker.offsets.offsets.items()):
        for (topic, partition), offset in sorted(committed.items()):
            try:
                plog = broker.logs.get_partition(topic, partition)
            except KafkaError:  # a partition whose files cannot be opened has no lag to tell
                plog = None
            if plog is None:  # offsets of a topic or partition that no longer exists
                continue
            labels = {"consumergroup": group, "topic": topic, "partition": str(partition)}
            current.add(offset.offset, **labels)
            lag.add(max(plog.high_watermark - offset.offset, 0), **labels)
    yield current
    yield lag
