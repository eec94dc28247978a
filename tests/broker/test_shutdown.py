"""Draining at shutdown: requests already received are answered, idle connections are closed, nothing is cut
half-way (Kafka's controlled shutdown answers in-flight requests before closing its sockets)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.metadata_request import MetadataRequest

TOPIC = "drained"


def _long_poll(topic_id: object) -> FetchRequest:
    partition = FetchRequest.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    return FetchRequest(
        replica_id=-1,
        max_wait_ms=60_000,  # far longer than any shutdown: it is answered because the broker drains
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=TOPIC, topic_id=topic_id, partitions=[partition])],
        forgotten_topics_data=[],
    )


def _read_responses(sock: socket.socket, api_keys: list[tuple[int, int]]) -> list[tuple[int, object]]:
    """Read one response per (api key, version), in order, until the broker closes the connection."""
    frames = FrameBuffer()
    answers = []
    for api_key, version in api_keys:
        while (frame := frames.next_frame()) is None:
            with frames.read_buffer() as target:
                count = sock.recv_into(target)
            if not count:
                return answers
            frames.commit(count)
        answers.append(decode_response(frame, api_key, version))
    return answers


def test_draining_answers_what_was_received_and_closes_idle_connections(broker: RunningBroker) -> None:
    admin = WireClient(broker.bootstrap)
    topic = CreateTopicsRequest.CreatableTopic(name=TOPIC, num_partitions=1, replication_factor=1)
    assert admin.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0
    topic_id = admin.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)]), 12)
    topic_id = topic_id.topics[0].topic_id

    # A long-polling fetch followed, on the same connection, by a pipelined Metadata request.
    pipelined = socket.create_connection(("127.0.0.1", broker.port), timeout=30)
    pipelined.sendall(encode_request(_long_poll(topic_id), 13, 1) + encode_request(MetadataRequest(topics=[]), 12, 2))
    answers: list[tuple[int, object]] = []
    reader = threading.Thread(target=lambda: answers.extend(_read_responses(pipelined, [(1, 13), (3, 12), (3, 12)])))
    reader.start()
    # Both requests reach the broker before it stops (read or still in the socket: either way received).
    idle = WireClient(broker.bootstrap)
    idle.request(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3)

    broker.stop()
    reader.join(30)
    assert not reader.is_alive()
    # Both requests were answered, in order, and then the connection was closed (no third answer).
    assert [correlation for correlation, _ in answers] == [1, 2]
    fetch = answers[0][1]
    assert isinstance(fetch, FetchResponse) and fetch.error_code == ErrorCode.NONE
    assert [(p.partition_index, p.error_code, p.high_watermark) for p in fetch.responses[0].partitions] == [(0, 0, 0)]
    assert answers[1][1].brokers[0].port == broker.port
    # The idle connection was closed by the broker.
    try:
        idle.request(MetadataRequest(topics=[]), 12)
        raise AssertionError("an idle connection stayed open through shutdown")
    except (ConnectionError, OSError):
        pass
    pipelined.close()
    admin.close()


def test_sigterm_right_after_the_ready_file_drains_and_exits_cleanly(tmp_path: Path) -> None:
    """The signal handlers are in place before readiness is announced: SIGTERM at once still drains."""
    for attempt in range(3):
        ready = tmp_path / f"ready-{attempt}"
        command = [sys.executable, "-m", "kbroker", "serve", "--listen", "127.0.0.1:0"]
        command += ["--data-dir", str(tmp_path / f"data-{attempt}"), "--ready-file", str(ready)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
            time.sleep(0.001)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
        assert process.returncode == 0, output.decode()
        assert b"received SIGTERM: shutting down" in output
