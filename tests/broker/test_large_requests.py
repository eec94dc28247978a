"""Huge and half-sent requests against a broker process (issue #26, items 5 and 6).

One huge request must not stall every other client: its frame is decoded and its answer encoded in a worker
thread (kbroker/server/offload.py) and its handler takes turns with the other connections
(kbroker/apis/turns.py). A request's memory follows the bytes received, not the size its prefix announces
(protocol/framing.py), and a request that trickles in is dropped after kbroker.request.receive.timeout.ms
(kbroker/server/idle.py).
"""

from __future__ import annotations

import gc
import socket
import statistics
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.testing import BrokerProcess
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.metadata_request import MetadataRequest

TOPIC = "t"
PARTITIONS = 4
HUNDRED_MB = 100 * 1024 * 1024


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def process_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "data", {"kbroker.request.receive.timeout.ms": "1500"}, log_level="INFO").start()
    try:
        with WireClient(broker.bootstrap) as client:
            created = client.request(
                CreateTopicsRequest(
                    topics=[
                        CreateTopicsRequest.CreatableTopic(name=TOPIC, num_partitions=PARTITIONS, replication_factor=1)
                    ],
                    timeout_ms=10000,
                ),
                5,
            )
            assert created.topics[0].error_code == ErrorCode.NONE
        yield broker
    finally:
        broker.stop()


def _exchange(sock: socket.socket, frame: bytes) -> bytearray:
    sock.sendall(frame)
    frames = FrameBuffer(1 << 30)
    while (answer := frames.next_frame()) is None:
        with frames.read_buffer() as target:
            count = sock.recv_into(target)
        assert count, "the broker closed the connection"
        frames.commit(count)
    return answer


def _latencies_during(broker: BrokerProcess, work: threading.Thread) -> list[float]:
    """Metadata round trips of another client, back to back, for as long as ``work`` runs (it only sends and
    receives bytes: decoding a huge answer here would stall this process, not the broker)."""
    latencies: list[float] = []
    with WireClient(broker.bootstrap, timeout=30) as other:
        request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)])
        other.request(request, 12)
        work.start()
        while work.is_alive():
            started = time.perf_counter()
            answer = other.request(request, 12)
            latencies.append(time.perf_counter() - started)
            assert [len(t.partitions) for t in answer.topics] == [PARTITIONS]
            time.sleep(0.002)
    work.join()
    return latencies


def test_a_fetch_of_300000_partitions_does_not_stall_other_clients(process_broker: BrokerProcess) -> None:
    partitions = 300_000
    fetch = FetchRequest(
        max_wait_ms=0,
        topics=[
            FetchRequest.FetchTopic(
                topic=TOPIC,
                partitions=[
                    FetchRequest.FetchPartition(partition=i, fetch_offset=0, partition_max_bytes=1024)
                    for i in range(partitions)
                ],
            )
        ],
    )
    frame = encode_request(fetch, 12, 99)
    del fetch
    gc.collect()  # the client's own garbage collections must not count: its heap is small again
    assert len(frame) > 9_000_000
    answers: list[bytearray] = []

    def big_fetch() -> None:
        with socket.create_connection(("127.0.0.1", process_broker.port), timeout=60) as sock:
            answers.append(_exchange(sock, frame))

    latencies = _latencies_during(process_broker, threading.Thread(target=big_fetch))
    correlation_id, answer = decode_response(answers[0], 1, 12)
    codes = [p.error_code for t in answer.responses for p in t.partitions]
    assert correlation_id == 99 and len(codes) == partitions
    assert codes[:PARTITIONS] == [ErrorCode.NONE] * PARTITIONS  # the partitions that exist, then the others
    assert set(codes[PARTITIONS:]) == {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    # Before: a round trip waited for the whole fetch, about 4 s here; now the worst is a garbage collection.
    assert max(latencies) < 1.0, (max(latencies), statistics.median(latencies))
    assert len(latencies) > 20, latencies


def test_a_metadata_request_for_200000_topics_does_not_stall_other_clients(process_broker: BrokerProcess) -> None:
    topics = 200_000
    metadata = MetadataRequest(
        topics=[MetadataRequest.MetadataRequestTopic(name=f"unknown-{i}") for i in range(topics)],
        allow_auto_topic_creation=False,
    )
    frame = encode_request(metadata, 12, 98)
    del metadata
    gc.collect()  # the client's own garbage collections must not count: its heap is small again
    answers: list[bytearray] = []

    def big_metadata() -> None:
        with socket.create_connection(("127.0.0.1", process_broker.port), timeout=60) as sock:
            answers.append(_exchange(sock, frame))

    latencies = _latencies_during(process_broker, threading.Thread(target=big_metadata))
    for frame_answer in answers:
        _, answer = decode_response(frame_answer, 3, 12)
        assert [t.name for t in answer.topics] == [f"unknown-{i}" for i in range(topics)]
        assert {t.error_code for t in answer.topics} == {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    assert max(latencies) < 1.0, (max(latencies), statistics.median(latencies))
    assert len(latencies) > 10, latencies


def test_a_size_prefix_alone_costs_no_more_than_a_small_block() -> None:
    frames = FrameBuffer(HUNDRED_MB)
    tracemalloc.start()
    try:
        frames.feed(struct.pack(">i", HUNDRED_MB) + b"x")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert frames.next_frame() is None and frames.midframe
    assert peak < 128 * 1024  # it was a whole mebibyte


def test_a_large_frame_grows_with_what_arrives_and_comes_out_whole() -> None:
    payload = bytes(range(256)) * (5 * 4096 + 7)  # about 5 MiB
    frames = FrameBuffer(HUNDRED_MB)
    stream = struct.pack(">i", len(payload)) + payload + struct.pack(">i", 3) + b"abc"
    for start in range(0, len(stream), 100_003):
        frames.feed(stream[start : start + 100_003])
    assert frames.next_frame() == payload
    assert frames.next_frame() == b"abc"
    assert frames.next_frame() is None and not frames.midframe


def test_announced_but_unsent_requests_cost_memory_by_what_arrived(process_broker: BrokerProcess) -> None:
    pid = process_broker.process.pid  # type: ignore[union-attr]
    before = _rss_bytes(pid)
    connections = [socket.create_connection(("127.0.0.1", process_broker.port)) for _ in range(500)]
    try:
        for sock in connections:
            sock.sendall(struct.pack(">i", HUNDRED_MB) + b"x")
        with WireClient(process_broker.bootstrap) as client:  # every one of them has been read by now
            client.request(MetadataRequest(topics=[]), 12)
        time.sleep(0.3)
        grown = _rss_bytes(pid) - before
        # Before: 1 MiB each, about 525 MB; now the 64 KiB first block and the connection itself.
        assert grown < 120 * 1024 * 1024, f"RSS grew by {grown / 2**20:.0f} MiB"
    finally:
        for sock in connections:
            sock.close()


def test_a_trickling_request_is_dropped_while_others_are_served(process_broker: BrokerProcess) -> None:
    frame = encode_request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)]), 12, 5)
    with (
        socket.create_connection(("127.0.0.1", process_broker.port), timeout=10) as trickling,
        WireClient(process_broker.bootstrap) as other,
    ):
        started = time.monotonic()
        closed_after = None
        for byte in frame:  # one byte every 0.1 s: never idle, never whole within the 1.5 s allowed
            try:
                trickling.sendall(bytes([byte]))
            except OSError:
                closed_after = time.monotonic() - started
                break
            assert [t.error_code for t in other.request(MetadataRequest(topics=[]), 12).topics] == []
            time.sleep(0.1)
            trickling.setblocking(False)
            try:
                if trickling.recv(1) == b"":
                    closed_after = time.monotonic() - started
                    break
            except BlockingIOError:  # still open
                pass
            except OSError:  # reset
                closed_after = time.monotonic() - started
                break
            finally:
                trickling.setblocking(True)
        assert closed_after is not None, "the trickling request was never dropped"
        assert 1.4 < closed_after < 5.0
        answer = other.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)]), 12)
        assert [(t.name, len(t.partitions)) for t in answer.topics] == [(TOPIC, PARTITIONS)]
    log = process_broker.log_path.read_text()
    assert "a request was still arriving after kbroker.request.receive.timeout.ms=1500" in log
