"""kbroker serve --metrics-listen: GET /metrics in Prometheus text format, with exact values after known traffic.

Requests go through kbroker's WireClient (exact batches, exact request versions, one known connection) or
kafka-python (group offsets); the endpoint is scraped with urllib and parsed with prometheus_client's parser.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
from prometheus_client.parser import text_string_to_metric_families

from kbroker.metrics import REQUEST_TIME_BUCKETS_MS, BrokerMetrics
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.delete_topics_request import DeleteTopicsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch

METRICS = {"kbroker.metrics.listen": "127.0.0.1:0"}
Labels = tuple[tuple[str, str], ...]


def scrape(url: str) -> dict[str, dict[Labels, float]]:
    """Every sample of the endpoint: sample name -> {sorted labels: value}."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def one(samples: dict[str, dict[Labels, float]], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def create_topic(client: WireClient, name: str, partitions: int) -> None:
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1)
    answer = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7)
    assert answer.topics[0].error_code == ErrorCode.NONE


def produce(client: WireClient, topic: str, partition: int, records: bytes) -> int:
    data = [ProduceRequest.PartitionProduceData(index=partition, records=records)]
    request = ProduceRequest(
        acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=data)]
    )
    code: int = client.request(request, 9).responses[0].partition_responses[0].error_code
    return code


def fetch(client: WireClient, topic: str, partition: int, offset: int) -> bytes:
    wanted = FetchRequest.FetchPartition(partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20)
    request = FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[FetchRequest.FetchTopic(topic=topic, partitions=[wanted])],
    )
    answer = client.request(request, 4).responses[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE
    return bytes(answer.records)


def batch(*values: bytes) -> bytes:
    return bytes(build_batch([Record(offset_delta=i, value=value) for i, value in enumerate(values)]))


def test_produce_fetch_requests_connections_and_logs_are_counted_exactly(
    broker_factory: Callable[..., RunningBroker],
) -> None:
    broker = broker_factory(METRICS)
    first, second = batch(b"a", b"bb", b"ccc"), batch(b"dddd", b"eeeee")
    with WireClient(broker.bootstrap) as client:
        create_topic(client, "metered", 2)
        assert produce(client, "metered", 0, first) == ErrorCode.NONE
        assert produce(client, "metered", 1, second) == ErrorCode.NONE
        assert produce(client, "metered", 1, b"\x00" * 70) != ErrorCode.NONE  # refused: counts no bytes
        assert len(fetch(client, "metered", 0, 0)) == len(first)  # the batch as stored (its leader epoch set)
        # Answered after the requests above were counted: each is counted before the next is read.
        client.request(ApiVersionsRequest(), 0)
        samples = scrape(broker.metrics_url)

    bytes_in = "kafka_server_brokertopicmetrics_bytesin_total"
    assert samples[bytes_in] == {(("topic", "metered"),): len(first) + len(second), (): len(first) + len(second)}
    assert samples["kafka_server_brokertopicmetrics_messagesin_total"] == {(("topic", "metered"),): 5, (): 5}
    assert samples["kafka_server_brokertopicmetrics_bytesout_total"] == {
        (("topic", "metered"),): len(first),
        (): len(first),
    }

    requests = samples["kafka_network_requestmetrics_requests_total"]
    assert requests[(("request", "CreateTopics"), ("version", "7"))] == 1
    assert requests[(("request", "Produce"), ("version", "9"))] == 3
    assert requests[(("request", "Fetch"), ("version", "4"))] == 1
    assert requests[(("request", "ApiVersions"), ("version", "0"))] >= 1
    assert one(samples, "kafka_network_requestmetrics_totaltimems_count", request="Produce") == 3
    produce_buckets = {
        labels: value
        for labels, value in samples["kafka_network_requestmetrics_totaltimems_bucket"].items()
        if ("request", "Produce") in labels
    }
    assert len(produce_buckets) == len(REQUEST_TIME_BUCKETS_MS) + 1
    assert produce_buckets[(("le", "+Inf"), ("request", "Produce"))] == 3
    assert one(samples, "kafka_network_requestmetrics_totaltimems_sum", request="Produce") > 0

    assert samples["kafka_server_socketservermetrics_connection_count"] == {(("listener", "PLAINTEXT"),): 1}
    partition = {"0": (3, len(first)), "1": (2, len(second))}
    for index, (end, size) in partition.items():
        labels = {"topic": "metered", "partition": index}
        assert one(samples, "kafka_log_log_logendoffset", **labels) == end
        assert one(samples, "kafka_log_log_highwatermark", **labels) == end
        assert one(samples, "kafka_log_log_logstartoffset", **labels) == 0
        assert one(samples, "kafka_log_log_size", **labels) == size
        assert one(samples, "kafka_log_log_numlogsegments", **labels) == 1
    for name, value in (
        ("partitioncount", 2),
        ("leadercount", 2),
        ("offlinereplicacount", 0),
        ("underreplicatedpartitions", 0),
        ("underminisrpartitioncount", 0),
    ):
        assert samples[f"kafka_server_replicamanager_{name}"] == {(): value}
    assert samples["process_open_fds"][()] > 0  # prometheus_client's process metrics come along


def test_a_deleted_topics_series_go_and_the_all_topics_totals_stay(
    broker_factory: Callable[..., RunningBroker],
) -> None:
    broker = broker_factory(METRICS)
    records = batch(b"gone")
    with WireClient(broker.bootstrap) as client:
        create_topic(client, "doomed", 1)
        assert produce(client, "doomed", 0, records) == ErrorCode.NONE
        assert scrape(broker.metrics_url)["kafka_server_brokertopicmetrics_messagesin_total"] == {
            (("topic", "doomed"),): 1,
            (): 1,
        }
        answer = client.request(DeleteTopicsRequest(topic_names=["doomed"], timeout_ms=5000), 4)
        assert answer.responses[0].error_code == ErrorCode.NONE
        samples = scrape(broker.metrics_url)
    assert samples["kafka_server_brokertopicmetrics_messagesin_total"] == {(): 1}
    assert samples["kafka_server_brokertopicmetrics_bytesin_total"] == {(): len(records)}
    assert "kafka_log_log_size" not in samples  # no partition left
    assert samples["kafka_server_replicamanager_partitioncount"] == {(): 0}


def test_consumer_group_lag_is_the_high_watermark_less_the_committed_offset(
    broker_factory: Callable[..., RunningBroker],
) -> None:
    broker = broker_factory(METRICS)
    with WireClient(broker.bootstrap) as client:
        create_topic(client, "lagging", 1)
        assert produce(client, "lagging", 0, batch(b"1", b"2", b"3", b"4", b"5")) == ErrorCode.NONE
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="lag-group", enable_auto_commit=False)
    try:
        partition = TopicPartition("lagging", 0)
        consumer.commit({partition: OffsetAndMetadata(2, "", -1)})
        labels = {"consumergroup": "lag-group", "topic": "lagging", "partition": "0"}
        samples = scrape(broker.metrics_url)
        assert one(samples, "kafka_consumergroup_current_offset", **labels) == 2
        assert one(samples, "kafka_consumergroup_lag", **labels) == 3
        with WireClient(broker.bootstrap) as client:
            assert produce(client, "lagging", 0, batch(b"6")) == ErrorCode.NONE
        assert one(scrape(broker.metrics_url), "kafka_consumergroup_lag", **labels) == 4
        consumer.commit({partition: OffsetAndMetadata(6, "", -1)})
        assert one(scrape(broker.metrics_url), "kafka_consumergroup_lag", **labels) == 0
    finally:
        consumer.close()


def raw_http(address: tuple[str, int], request: bytes) -> bytes:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_bad_requests_are_answered_and_the_endpoint_carries_on(broker_factory: Callable[..., RunningBroker]) -> None:
    broker = broker_factory(METRICS)
    url = broker.metrics_url
    with pytest.raises(urllib.error.HTTPError) as not_found:
        urllib.request.urlopen(url.replace("/metrics", "/nope"), timeout=10)
    assert not_found.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as not_allowed:
        urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=10)
    assert not_allowed.value.code == 405
    assert not_allowed.value.headers["Allow"] == "GET, HEAD"
    host, port = url.split("/")[2].split(":")
    assert raw_http((host, int(port)), b"NOT HTTP AT ALL\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw_http((host, int(port)), b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 5000).startswith(
        b"HTTP/1.1 431 "
    )
    head = raw_http((host, int(port)), b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")  # headers only
    # Two scrapes on one kept-alive connection, then the client closes.
    keep_alive = raw_http(
        (host, int(port)),
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics?x=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert keep_alive.count(b"HTTP/1.1 200 ") == 2
    assert "kafka_server_replicamanager_partitioncount" in scrape(url)


def test_metrics_counters_place_latencies_in_their_buckets() -> None:
    metrics = BrokerMetrics()
    metrics.observe_request(0, 9, 0.0003)  # 0.3 ms: the 0.5 ms bucket
    metrics.observe_request(0, 9, 0.001)  # exactly 1 ms: the 1 ms bucket (le is inclusive)
    metrics.observe_request(0, 8, 45.0)  # beyond the last bound: +Inf only
    counters = metrics.requests[0]
    assert counters.by_version == {9: 2, 8: 1}
    bounds = [*REQUEST_TIME_BUCKETS_MS, float("inf")]
    assert {bounds[i]: n for i, n in enumerate(counters.buckets) if n} == {0.5: 1, 1: 1, float("inf"): 1}
    assert counters.seconds == pytest.approx(45.0013)


def test_a_metrics_port_in_use_stops_start_up_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "kbroker", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d")]
            + ["--metrics-listen", f"127.0.0.1:{port}", "--log-level", "ERROR"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"kbroker: --metrics-listen: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


def test_a_malformed_metrics_address_is_a_configuration_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(tmp_path / "d"), "--metrics-listen", "9404"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "kbroker: configuration error: kbroker.metrics.listen: expected HOST:PORT, got '9404'"
    ]


def test_serve_without_metrics_imports_neither_prometheus_client_nor_an_http_stack(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    command = [sys.executable, "-X", "importtime", "-m", "kbroker", "serve", "--listen", "127.0.0.1:0"]
    command += ["--data-dir", str(tmp_path / "d"), "--ready-file", str(ready), "--log-level", "ERROR"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, "kbroker serve exited"
            assert time.monotonic() < deadline, "kbroker serve did not start"
            time.sleep(0.01)
        # A client request too: the request path's modules are loaded.
        with WireClient(ready.read_text().strip()) as client:
            client.request(ApiVersionsRequest(), 0)
    finally:
        os.kill(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    imported = {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}
    assert "kbroker.server.connection" in imported and "kbroker.metrics" in imported
    assert not {name for name in imported if name.split(".")[0] in ("prometheus_client", "h11", "hypercorn")}
