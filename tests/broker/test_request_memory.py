"""queued.max.request.bytes (kbroker/server/memory.py): one pool bounds the bytes of requests received and not yet
answered over every connection. A connection reserves a request's size before reading its body and stops
reading while the pool is full; what it reserved comes back once the request is answered, or when the
connection ends (closed by the client, or dropped for idleness halfway through a request)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from kbroker.config import BrokerConfig, ConfigError
from kbroker.server.connection import Connection
from kbroker.server.memory import FrameSizes, RequestMemory
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch

# --- the frame follower -------------------------------------------------------------------------------------


@given(
    sizes=st.lists(st.integers(0, 300), max_size=8),
    cuts=st.lists(st.integers(0, 3000), max_size=12),
)
def test_frame_sizes_are_found_wherever_the_stream_is_cut(sizes: list[int], cuts: list[int]) -> None:
    stream = b"".join(struct.pack(">i", size) + bytes([7]) * size for size in sizes)
    points = sorted({min(cut, len(stream)) for cut in cuts} | {0, len(stream)})
    follower = FrameSizes()
    seen: list[int] = []
    for start, end in zip(points, points[1:], strict=False):
        seen += follower.observe(stream[start:end])
    assert seen == sizes
    assert not follower.inside_frame


def test_a_frame_still_arriving_is_reported_until_its_last_byte() -> None:
    follower = FrameSizes()
    assert follower.observe(struct.pack(">i", 5) + b"abc") == [5]
    assert follower.inside_frame
    assert follower.observe(b"de" + struct.pack(">i", 2)[:3]) == []  # the rest, then most of a prefix
    assert not follower.inside_frame
    assert follower.observe(struct.pack(">i", 2)[3:] + b"x") == [2]
    assert follower.inside_frame


# --- the pool -----------------------------------------------------------------------------------------------


def test_the_pool_serves_waiters_in_order_and_a_cancelled_wait_reserves_nothing() -> None:
    async def main() -> None:
        pool = RequestMemory(100)
        granted: list[str] = []

        async def reserve(name: str, size: int) -> None:
            await pool.reserve(size)
            granted.append(name)

        assert await pool.reserve(60) == 60
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reserve, "fifty", 50)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(reserve, "ten", 10)  # would fit, but waits its turn behind fifty
            await trio.testing.wait_all_tasks_blocked()
            with trio.CancelScope() as cancelled:
                cancelled.cancel()
                await pool.reserve(30)  # cancelled in the queue: never reserved
            assert (granted, pool.used, pool.waits) == ([], 60, 3)
            pool.release(60)
            await trio.testing.wait_all_tasks_blocked()
            assert (sorted(granted), pool.used) == (["fifty", "ten"], 60)  # both granted, then run in any order
        assert pool.take(70) == 70  # bytes already received are counted even beyond the bound
        assert pool.used == 130
        assert RequestMemory.from_setting(-1).bounded is False
        assert RequestMemory.from_setting(0).bounded is False
        assert await RequestMemory(None).reserve(10**9) == 0

    trio.run(main)


def test_the_bound_must_hold_one_largest_request_as_in_kafka() -> None:
    with pytest.raises(ConfigError, match="^queued.max.request.bytes must be larger or equal to socket.request.max"):
        BrokerConfig({"queued.max.request.bytes": "1000", "socket.request.max.bytes": "1001"})
    assert BrokerConfig({})["queued.max.request.bytes"] == -1  # Kafka's default: unbounded
    for value in ("0", "-1", "1001"):
        BrokerConfig({"queued.max.request.bytes": value, "socket.request.max.bytes": "1001"})


# --- on real sockets ----------------------------------------------------------------------------------------

LIMITS = {"socket.request.max.bytes": "200000", "queued.max.request.bytes": "300000"}


def _produce_frame(topic: str, correlation_id: int, value_size: int) -> bytes:
    batch = build_batch([Record(offset_delta=0, key=None, value=bytes([correlation_id]) * value_size)])
    data = [ProduceRequest.PartitionProduceData(index=0, records=batch)]
    request = ProduceRequest(
        acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=data)]
    )
    return encode_request(request, 9, correlation_id)


def _create_topic(running: RunningBroker, name: str) -> None:
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=1, replication_factor=1)
    with WireClient(running.bootstrap) as client:
        created = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7)
    assert created.topics[0].error_code == 0


def _produced_offset(sock: socket.socket, correlation_id: int) -> int:
    frames = FrameBuffer()
    while (frame := frames.next_frame()) is None:
        data = sock.recv(65536)
        assert data, "the broker closed the connection"
        frames.feed(data)
    answered_id, answer = decode_response(frame, 0, 9)
    partition = answer.responses[0].partition_responses[0]
    assert (answered_id, partition.error_code) == (correlation_id, 0)
    return int(partition.base_offset)


def _pool(running: RunningBroker) -> RequestMemory:
    """The server's pool, as every connection holds it (waits for the first connection to be registered)."""
    broker = running.broker
    assert broker is not None
    _until(lambda: bool(broker.open_connections), "a connection is open")
    connection = next(iter(broker.open_connections.values()))
    assert isinstance(connection, Connection)
    return connection.memory


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _connect(running: RunningBroker) -> socket.socket:
    host, port = running.bootstrap.split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def test_a_request_that_does_not_fit_waits_until_memory_is_released(broker_factory: Any) -> None:
    running: RunningBroker = broker_factory(LIMITS)
    _create_topic(running, "big")
    first, second = _produce_frame("big", 1, 160_000), _produce_frame("big", 2, 160_000)
    with _connect(running) as a, _connect(running) as b:
        a.sendall(first[:1000])
        _until(lambda: _pool(running).used == len(first), "the first request reserved")
        # The second does not fit beside the first (2 x 160 kB > 300 kB): its connection stops reading.
        sender = threading.Thread(target=b.sendall, args=(second,))
        sender.start()
        _until(lambda: _pool(running).waits == 1, "the second request waits for memory")
        assert _pool(running).used == len(first)
        a.sendall(first[1000:])  # the first completes, is answered, and its memory goes back
        assert _produced_offset(a, 1) == 0
        sender.join(30)
        assert _produced_offset(b, 2) == 1
        pool = _pool(running)
        _until(lambda: pool.used == 0, "all memory released")
        assert pool.waits == 1


def test_memory_of_a_connection_that_goes_away_midway_is_released(broker_factory: Any) -> None:
    running: RunningBroker = broker_factory({**LIMITS, "connections.max.idle.ms": "500"})
    _create_topic(running, "gone")
    first, second, third = (_produce_frame("gone", n, 160_000) for n in (1, 2, 3))
    closed = _connect(running)
    closed.sendall(first[:1000])
    pool = _pool(running)
    _until(lambda: pool.used == len(first), "the first request reserved")
    closed.close()  # the client goes away halfway: its reservation is returned
    assert running.broker is not None
    broker = running.broker
    _until(lambda: pool.used == 0 and not broker.open_connections, "memory released on close")
    with _connect(running) as stalled, _connect(running) as waiting:
        stalled.sendall(second[:1000])  # and stops sending: dropped after connections.max.idle.ms
        _until(lambda: pool.used == len(second), "the stalled request reserved")
        waiting.sendall(third)  # waits for memory, then is served once the stalled connection is dropped
        assert _produced_offset(waiting, 3) == 0
        assert stalled.recv(1) == b""
    _until(lambda: pool.used == 0, "all memory released")
    assert pool.waits == 1  # the third request did wait for the stalled one


def test_without_a_bound_nothing_is_counted(tmp_path: Any) -> None:
    async def main() -> None:
        from kbroker.broker import Broker, Endpoint

        broker = Broker(BrokerConfig({}), tmp_path / "data", Endpoint("localhost", 9092))
        try:
            client_stream, server_stream = trio.testing.memory_stream_pair()
            connection = Connection(broker, server_stream, 1)
            assert not connection.memory.bounded
            async with trio.open_nursery() as nursery:
                nursery.start_soon(connection.run)
                await client_stream.send_all(struct.pack(">i", 50) + bytes(10))
                await trio.testing.wait_all_tasks_blocked()
                assert connection.memory.used == 0
                nursery.cancel_scope.cancel()
        finally:
            broker.close()

    trio.run(main)
