"""Descriptor exhaustion on the server side (issue #15, item 6): accept() failing with EMFILE is retried with a
growing pause and logged once, with the limits in force and the fix, while the connections already open keep
being served; when descriptors come back the broker accepts again. At start-up the soft open-file limit is
raised to the hard one, as the JVM does (kbroker/server/limits.py)."""

from __future__ import annotations

import errno
import logging
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from kbroker.server import connection as connection_module
from kbroker.server.connection import HANDLER_LOAD_DELAY_S, ListenerInfo, accept_loop
from kbroker.server.limits import accept_failure_message, open_file_limit
from kbroker.wire_client import WireClient
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch
from tests.broker.limited_broker import start, stop

ACCEPT_FAILED = "listener PLAINTEXT cannot accept connections: Too many open files"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))


@pytest.fixture
def server_log() -> Iterator[_Records]:
    records = _Records()
    logger = logging.getLogger("kbroker.server")
    logger.addHandler(records)
    yield records
    logger.removeHandler(records)


class _FailingListener(trio.abc.Listener[Any]):
    """Fails with EMFILE ``failures`` times, then hands out one stream, then waits forever."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.attempts: list[float] = []

    async def accept(self) -> Any:
        self.attempts.append(trio.current_time())
        if len(self.attempts) <= self.failures:
            raise OSError(errno.EMFILE, "Too many open files")
        if len(self.attempts) == self.failures + 1:
            return "a stream"
        await trio.sleep_forever()

    async def aclose(self) -> None:
        pass


def test_emfile_is_logged_once_with_the_fix_and_retried_with_a_growing_pause(
    monkeypatch: pytest.MonkeyPatch, server_log: _Records
) -> None:
    served: list[tuple[Any, int]] = []

    async def serve_connection(broker: Any, stream: Any, connection_id: int, *rest: Any) -> None:
        served.append((stream, connection_id))

    monkeypatch.setattr(connection_module, "serve_connection", serve_connection)
    listener = _FailingListener(failures=6)

    async def main() -> None:
        async with trio.open_nursery() as connections:
            # Only the accept loop's connection-rate check reaches the broker (no ip quotas set): the connection
            # itself is served by the replaced serve_connection.
            broker: Any = SimpleNamespace(quotas=SimpleNamespace(limits_connections=False))
            connections.start_soon(accept_loop, broker, listener, ListenerInfo(), connections, lambda: 7)
            await trio.testing.wait_all_tasks_blocked()
            while len(listener.attempts) < 8:
                await trio.sleep(0.01)
            connections.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    # Pauses of 0.05 s doubling up to 1 s between the attempts, then accepting goes on at once.
    pauses = [round(b - a, 3) for a, b in zip(listener.attempts, listener.attempts[1:], strict=False)]
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 0.0]
    assert served == [("a stream", 7)]
    limit = open_file_limit()
    assert server_log.records == [
        (
            logging.ERROR,
            f"{ACCEPT_FAILED} (open-file limit: {limit}). Raise it before starting kbroker (ulimit -n 65536, or "
            "LimitNOFILE=65536 in a systemd unit); connections already open are still served and accepting is "
            "retried with backoff",
        ),
        (logging.WARNING, "listener PLAINTEXT accepts connections again (after 6 failed attempts)"),
    ]


def test_the_other_resource_errors_name_what_ran_out() -> None:
    assert accept_failure_message("EXTERNAL", OSError(errno.ENFILE, "Too many open files in system")) == (
        "listener EXTERNAL cannot accept connections: Too many open files in system (the system-wide limit, "
        "fs.file-max). Raise it (sysctl fs.file-max) or close other programs' files; connections already open "
        "are still served and accepting is retried with backoff"
    )
    assert accept_failure_message("EXTERNAL", OSError(errno.ENOBUFS, "No buffer space available")) == (
        "listener EXTERNAL cannot accept connections: No buffer space available (out of memory for sockets); "
        "connections already open are still served and accepting is retried with backoff"
    )


# --- a real broker under a low descriptor limit -------------------------------------------------------------


def _produce(client: WireClient, value: bytes) -> tuple[int, int]:
    batch = build_batch([Record(offset_delta=0, key=None, value=value)])
    data = [ProduceRequest.PartitionProduceData(index=0, records=batch)]
    topic = ProduceRequest.TopicProduceData(name="kept", partition_data=data)
    answer = client.request(ProduceRequest(acks=-1, timeout_ms=5000, topic_data=[topic]), 9)
    partition = answer.responses[0].partition_responses[0]
    return partition.error_code, partition.base_offset


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts descriptors in /proc (Linux only)")
def test_out_of_descriptors_existing_connections_keep_working_and_accepting_resumes(tmp_path: Path) -> None:
    process, address, stderr = start(tmp_path, soft=48, hard=48)
    host, port = address.split(":")
    extra: list[socket.socket] = []
    # The broker loads every handler a moment after start-up (kbroker.server.connection.load_handlers): one that
    # runs out of descriptors later in its life has them all. Exhaust them only after that.
    time.sleep(HANDLER_LOAD_DELAY_S + 0.5)
    try:
        with WireClient(address) as client:
            topic = CreateTopicsRequest.CreatableTopic(name="kept", num_partitions=1, replication_factor=1)
            created = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7)
            assert created.topics[0].error_code == 0
            assert _produce(client, b"before") == (0, 0)
            # Connect until the broker has no descriptor left to accept with (the rest wait in the backlog).
            while ACCEPT_FAILED not in stderr.read_text():
                assert len(extra) < 200, "the broker never ran out of descriptors"
                extra.append(socket.create_connection((host, int(port)), timeout=30))
                time.sleep(0.01)
            # The open connection is served as before while accept keeps failing.
            for n in range(20):
                assert _produce(client, b"during %d" % n) == (0, 1 + n)
            answer = client.request(MetadataRequest(topics=None, allow_auto_topic_creation=False), 12)
            assert [t.name for t in answer.topics] == ["kept"]
            time.sleep(1.0)  # several more failed attempts (the pause grows to 1 s): still one line
            for sock in extra:
                sock.close()
            extra.clear()
            with WireClient(address) as fresh:  # descriptors are free again: a new connection is served
                assert _produce(fresh, b"after") == (0, 21)
    finally:
        for sock in extra:
            sock.close()
        log = stop(process, stderr)
    assert process.returncode == 0, log
    assert log.count(ACCEPT_FAILED) == 1, log
    attempts = re.search(r"listener PLAINTEXT accepts connections again \(after (\d+) failed attempts\)", log)
    assert attempts is not None and int(attempts.group(1)) > 1, log
    assert "Traceback" not in log


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/limits (Linux only)")
def test_kbroker_serve_runs_with_the_hard_open_file_limit(tmp_path: Path) -> None:
    _, hard_now = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard = 4096 if hard_now == resource.RLIM_INFINITY else min(hard_now, 4096)
    process, _, stderr = start(tmp_path, soft=256, hard=hard)
    try:
        limits = Path(f"/proc/{process.pid}/limits").read_text()
        assert re.search(rf"^Max open files\s+{hard}\s+{hard}\s+files", limits, re.MULTILINE), limits
    finally:
        log = stop(process, stderr)
    assert process.returncode == 0, log


_RAISE_CHECK = """
import logging, resource, sys
from pathlib import Path
from kbroker.testing import RunningBroker

records = []


class Collect(logging.Handler):
    def emit(self, record):
        records.append((record.levelno, record.getMessage()))


logger = logging.getLogger("kbroker")
logger.addHandler(Collect())
logger.setLevel(logging.INFO)
with RunningBroker(Path(sys.argv[1])):
    raised = resource.getrlimit(resource.RLIMIT_NOFILE)
print(repr((raised, records)))
"""


def test_starting_a_broker_raises_the_soft_limit_to_the_hard_one_and_says_so(tmp_path: Path) -> None:
    import ast

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"the hard open-file limit here ({hard}) leaves nothing to raise")

    def low_soft_limit() -> None:  # in the child only: this process keeps its own limit and descriptors
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    result = subprocess.run(
        [sys.executable, "-c", _RAISE_CHECK, str(tmp_path / "data")],
        preexec_fn=low_soft_limit,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    raised, records = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    expected_soft = hard if hard != resource.RLIM_INFINITY else 1 << 20
    assert tuple(raised) == (expected_soft, hard)
    assert (
        logging.INFO,
        f"raised the open-file limit from soft 256, hard {_text(hard)} to soft {expected_soft}, hard {_text(hard)} "
        "(as the JVM does for Kafka)",
    ) in records


def _text(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)
