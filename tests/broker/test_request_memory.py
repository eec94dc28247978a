"""queued.max.request.bytes (kbroker/server/memory.py): one pool bounds the bytes of requests received and not yet
answered over every connection. A connection counts the bytes it receives, not the sizes their prefixes
announce, and stops reading while the pool is full unless its unfinished request is the oldest; what it counted
comes back once the request is answered, or when the connection ends (closed by the client, or dropped for
idleness halfway through a request)."""

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

from kbroker.config import BrokerConfig, ConfigError
from kbroker.server.connection import Connection
from kbroker.server.memory import RequestMemory
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch

# --- the pool -----------------------------------------------------------------------------------------------


def test_a_full_pool_lets_only_the_oldest_unfinished_request_read_on() -> None:
    async def main() -> None:
        pool = RequestMemory(100)
        oldest, younger, idle = object(), object(), object()
        pool.receiving(oldest)
        pool.receiving(younger)
        assert pool.take(60) + pool.take(50) == 110  # over: bytes are counted as they come, not refused
        assert (pool.may_read(oldest), pool.may_read(younger), pool.may_read(idle)) == (True, False, False)
        resumed: list[str] = []

        async def wait(name: str, connection: object) -> None:
            await pool.room_for(connection)
            resumed.append(name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, "younger", younger)
            nursery.start_soon(wait, "idle", idle)
            await trio.testing.wait_all_tasks_blocked()
            assert (resumed, pool.waits) == ([], 2)
            pool.received(oldest)  # whole: the younger request is the oldest now
            await trio.testing.wait_all_tasks_blocked()
            assert resumed == ["younger"]
            pool.release(60)  # answered: room again for anyone
            await trio.testing.wait_all_tasks_blocked()
            assert (resumed, pool.used) == (["younger", "idle"], 50)
        assert RequestMemory.from_setting(-1).bounded is False
        assert RequestMemory.from_setting(0).bounded is False
        unbounded = RequestMemory(None)
        assert (unbounded.take(10**9), unbounded.may_read(idle), unbounded.used) == (0, True, 0)

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


def test_a_full_pool_stops_reading_until_the_oldest_request_is_answered(broker_factory: Any) -> None:
    running: RunningBroker = broker_factory(LIMITS)
    _create_topic(running, "big")
    first, second, third = (_produce_frame("big", n, 160_000) for n in (1, 2, 3))
    with _connect(running) as a, _connect(running) as b, _connect(running) as c:
        a.sendall(first[:150_000])
        # Counted: what arrived, and the part of its frame buffer allocated for what has not (held all the same).
        _until(lambda: _pool(running).used >= 150_000, "the first request's bytes counted")
        b.sendall(second[:150_000])
        _until(lambda: _pool(running).used >= 300_000, "the second request's bytes counted: the pool is full")
        # A third request does not begin to be read while the pool is full: its connection stops reading.
        sender = threading.Thread(target=c.sendall, args=(third,))
        sender.start()
        _until(lambda: _pool(running).waits >= 1, "the third request waits for memory")
        assert _pool(running).used == 2 * len(first)  # both frame buffers have grown to their requests' size
        a.sendall(first[150_000:])  # the oldest request may always read on: it completes and is answered
        assert _produced_offset(a, 1) == 0
        b.sendall(second[150_000:])  # then there is room for both others, in whichever order they complete
        sender.join(30)
        assert {_produced_offset(b, 2), _produced_offset(c, 3)} == {1, 2}
        pool = _pool(running)
        _until(lambda: pool.used == 0, "all memory released")


def test_a_request_that_stops_midway_holds_only_what_it_sent(broker_factory: Any) -> None:
    running: RunningBroker = broker_factory({**LIMITS, "connections.max.idle.ms": "500"})
    _create_topic(running, "gone")
    first, second, third = (_produce_frame("gone", n, 160_000) for n in (1, 2, 3))
    closed = _connect(running)
    closed.sendall(first[:1000])
    pool = _pool(running)
    # What arrived and the frame buffer's first block (64 KiB), not the 160 kB announced.
    _until(lambda: 1000 <= pool.used < 70_000, "what arrived is counted")
    closed.close()  # the client goes away halfway: its bytes are given back
    assert running.broker is not None
    broker = running.broker
    _until(lambda: pool.used == 0 and not broker.open_connections, "memory released on close")
    with _connect(running) as stalled, _connect(running) as other:
        stalled.sendall(second[:1000])  # and stops sending: dropped after connections.max.idle.ms
        _until(lambda: 1000 <= pool.used < 70_000, "the stalled request's bytes counted")
        other.sendall(third)  # served at once: a stalled announcement does not hold the pool
        assert _produced_offset(other, 3) == 0
        assert pool.waits == 0
        assert stalled.recv(1) == b""
    _until(lambda: pool.used == 0, "all memory released")


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
