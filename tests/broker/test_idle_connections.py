"""connections.max.idle.ms (kbroker/server/connection.py): as Kafka's Selector, a connection on which no bytes
moved for that long is closed: one that sent nothing, one that stopped halfway through a request (Kafka's only
read timeout), one whose client reads none of its response. A request being handled is never cut off, bytes
arriving keep a connection open, and a negative value disables the timer.

Most tests run a Connection on an in-memory stream under trio's virtual clock, so the times are exact; one runs
the broker on real sockets (the recv_into path)."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from kbroker.apis import HANDLERS
from kbroker.apis.context import RequestContext
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig, ConfigError
from kbroker.server.connection import Connection
from kbroker.testing import RunningBroker
from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.heartbeat_request import HeartbeatRequest
from protocol.messages.heartbeat_response import HeartbeatResponse

API_VERSIONS_REQUEST = encode_request(ApiVersionsRequest(), 0, 1)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def server_log() -> Iterator[_Records]:
    records = _Records()
    logger = logging.getLogger("kbroker.server")
    level = logger.level
    logger.addHandler(records)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(records)
    logger.setLevel(level)


async def _answer(stream: trio.abc.Stream, frames: FrameBuffer) -> bytearray:
    while (frame := frames.next_frame()) is None:
        data = await stream.receive_some(65536)
        assert data, "the broker closed the stream"
        frames.feed(data)
    return frame


def _run_connection(
    tmp_path: Path, settings: dict[str, str], client: Any, *, lockstep: bool = False
) -> tuple[float | None, bool]:
    """Serve one in-memory connection under a virtual clock while ``client(stream)`` runs; returns when (in
    virtual seconds) the connection ended, or None if it was still open when the client finished, and
    whether the client saw the stream end."""
    ended: list[float] = []
    saw_end: list[bool] = []

    async def main() -> None:
        broker = Broker(BrokerConfig(settings), tmp_path / "data", Endpoint("localhost", 9092))
        try:
            pair = trio.testing.lockstep_stream_pair() if lockstep else trio.testing.memory_stream_pair()
            client_stream, server_stream = pair
            connection = Connection(broker, server_stream, 1)

            async def serve() -> None:
                await connection.run()
                ended.append(trio.current_time())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve)
                saw_end.append(await client(client_stream))
                await trio.testing.wait_all_tasks_blocked()  # the connection's task finishes, if it is ending
                nursery.cancel_scope.cancel()
        finally:
            broker.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return (ended[0] if ended else None), saw_end[0]


async def _ends(stream: trio.abc.Stream) -> bool:
    """Wait (virtual time) for the broker to close the stream; True when it did within 10**7 seconds."""
    with trio.move_on_after(10**7):
        while await stream.receive_some(65536):
            pass
        return True
    return False


def test_an_idle_connection_is_closed_after_kafkas_default_ten_minutes(tmp_path: Path) -> None:
    async def client(stream: trio.abc.Stream) -> bool:
        await trio.sleep(100)
        await stream.send_all(API_VERSIONS_REQUEST)
        decode_response(await _answer(stream, FrameBuffer()), 18, 0)  # answered at t=100
        return await _ends(stream)

    ended, saw_end = _run_connection(tmp_path, {}, client)
    assert saw_end
    assert ended == pytest.approx(100 + 600)  # ten minutes after the last bytes moved


def test_each_request_restarts_the_idle_clock(tmp_path: Path) -> None:
    async def client(stream: trio.abc.Stream) -> bool:
        frames = FrameBuffer()
        for _ in range(5):  # 5 requests 0.9 s apart: never idle for 1 s
            await trio.sleep(0.9)
            await stream.send_all(API_VERSIONS_REQUEST)
            await _answer(stream, frames)
        return await _ends(stream)

    ended, saw_end = _run_connection(tmp_path, {"connections.max.idle.ms": "1000"}, client)
    assert saw_end
    assert ended == pytest.approx(5 * 0.9 + 1.0)


def test_a_negative_value_never_closes_an_idle_connection(tmp_path: Path) -> None:
    async def client(stream: trio.abc.Stream) -> bool:
        return await _ends(stream)

    ended, saw_end = _run_connection(tmp_path, {"connections.max.idle.ms": "-1"}, client)
    assert (ended, saw_end) == (None, False)


def test_a_request_that_stops_arriving_midway_is_dropped(tmp_path: Path, server_log: _Records) -> None:
    async def client(stream: trio.abc.Stream) -> bool:
        # A size prefix announcing 1000 bytes, then 10 of them, then 0.5 s later 10 more, then nothing.
        await stream.send_all(struct.pack(">i", 1000) + bytes(10))
        await trio.sleep(0.5)
        await stream.send_all(bytes(10))
        return await _ends(stream)

    ended, saw_end = _run_connection(tmp_path, {"connections.max.idle.ms": "2000"}, client)
    assert saw_end
    assert ended == pytest.approx(0.5 + 2.0)  # trickling bytes count as activity, as in Kafka
    assert (
        "closing connection from ?: a request stopped arriving midway (24 bytes received, then nothing for "
        "connections.max.idle.ms=2000)"
    ) in server_log.messages


def test_a_request_being_handled_is_not_cut_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handler = HANDLERS[12]

    async def slow_heartbeat(context: RequestContext, request: Any) -> Any:
        await trio.sleep(30)  # thirty times connections.max.idle.ms
        return HeartbeatResponse(error_code=0)

    monkeypatch.setattr(handler, "_handle", slow_heartbeat)

    async def client(stream: trio.abc.Stream) -> bool:
        await stream.send_all(encode_request(HeartbeatRequest(group_id="g", generation_id=1, member_id="m"), 0, 7))
        correlation_id, answer = decode_response(await _answer(stream, FrameBuffer()), 12, 0)
        assert (correlation_id, answer.error_code, trio.current_time()) == (7, 0, pytest.approx(30))
        return await _ends(stream)

    ended, saw_end = _run_connection(tmp_path, {"connections.max.idle.ms": "1000"}, client)
    assert saw_end
    assert ended == pytest.approx(31)


def test_a_client_that_reads_no_response_is_disconnected(tmp_path: Path, server_log: _Records) -> None:
    async def client(stream: trio.abc.Stream) -> bool:
        await stream.send_all(API_VERSIONS_REQUEST)  # then never reads: the lockstep stream blocks the send
        await trio.sleep(10)
        with pytest.raises(trio.BrokenResourceError):
            await stream.send_all(API_VERSIONS_REQUEST)
        return True

    ended, _ = _run_connection(tmp_path, {"connections.max.idle.ms": "3000"}, client, lockstep=True)
    assert ended == pytest.approx(3.0)
    assert (
        "closing connection from ?: it read none of its response for connections.max.idle.ms=3000"
        in server_log.messages
    )


def test_the_setting_is_a_long_without_bounds_as_in_kafka() -> None:
    assert BrokerConfig({})["connections.max.idle.ms"] == 600000
    assert BrokerConfig({"connections.max.idle.ms": "-5"})["connections.max.idle.ms"] == -5
    with pytest.raises(ConfigError, match="connections.max.idle.ms: expected an integer, got 'soon'"):
        BrokerConfig({"connections.max.idle.ms": "soon"})


def test_idle_and_half_sent_sockets_are_closed_and_others_kept(broker_factory: Any, server_log: _Records) -> None:
    running: RunningBroker = broker_factory({"connections.max.idle.ms": "300"})
    host, port = running.bootstrap.split(":")
    idle = socket.create_connection((host, int(port)), timeout=30)
    stalled = socket.create_connection((host, int(port)), timeout=30)
    with idle, stalled:
        idle.sendall(API_VERSIONS_REQUEST)
        assert len(idle.recv(65536)) > 4  # answered
        stalled.sendall(struct.pack(">i", 5000) + bytes(100))  # a request that stops arriving
        assert idle.recv(1) == b""  # closed by the broker for idleness
        assert stalled.recv(1) == b""
    assert any("a request stopped arriving midway (104 bytes received" in m for m in server_log.messages)
    with socket.create_connection((host, int(port)), timeout=30) as fresh:  # the broker still serves
        fresh.sendall(API_VERSIONS_REQUEST)
        assert len(fresh.recv(65536)) > 4


def test_a_request_trickling_in_is_dropped_after_the_receive_timeout(tmp_path: Path, server_log: _Records) -> None:
    async def client(stream: trio.abc.Stream) -> bool:
        await stream.send_all(API_VERSIONS_REQUEST)  # answered: the clock runs only while a request arrives
        await _answer(stream, FrameBuffer())
        await trio.sleep(5)
        # Then a size prefix announcing 1000 bytes and one byte a second: never idle for connections.max.idle.ms.
        await stream.send_all(struct.pack(">i", 1000))
        for _ in range(20):
            await trio.sleep(1)
            try:
                await stream.send_all(b"x")
            except trio.BrokenResourceError:
                return True
        return await _ends(stream)

    settings = {"connections.max.idle.ms": "6000", "kbroker.request.receive.timeout.ms": "3500"}
    ended, saw_end = _run_connection(tmp_path, settings, client)
    assert saw_end
    assert ended == pytest.approx(5 + 3.5)  # 3.5 s after the first bytes of the trickling request
    assert (
        "closing connection from ?: a request was still arriving after kbroker.request.receive.timeout.ms=3500 "
        "(7 bytes received)"
    ) in server_log.messages


def test_a_request_handled_for_long_does_not_count_against_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    handler = HANDLERS[12]

    async def slow_heartbeat(context: RequestContext, request: Any) -> Any:
        await trio.sleep(30)  # ten times kbroker.request.receive.timeout.ms
        return HeartbeatResponse(error_code=0)

    monkeypatch.setattr(handler, "_handle", slow_heartbeat)
    heartbeat = encode_request(HeartbeatRequest(group_id="g", generation_id=1, member_id="m"), 0, 7)

    async def client(stream: trio.abc.Stream) -> bool:
        # The heartbeat, then half of the next request at once: it waits behind the heartbeat being handled.
        await stream.send_all(heartbeat + API_VERSIONS_REQUEST[:5])
        frames = FrameBuffer()
        await _answer(stream, frames)
        assert trio.current_time() == pytest.approx(30)
        await trio.sleep(2)  # within the 3 s allowed from when reading resumed
        await stream.send_all(API_VERSIONS_REQUEST[5:])
        correlation_id, _ = decode_response(await _answer(stream, frames), 18, 0)
        assert correlation_id == 1
        return await _ends(stream)

    settings = {"connections.max.idle.ms": "10000", "kbroker.request.receive.timeout.ms": "3000"}
    ended, saw_end = _run_connection(tmp_path, settings, client)
    assert saw_end
    assert ended == pytest.approx(32 + 10)  # then idle, as before


def test_the_receive_timeout_is_a_kbroker_setting_with_a_minute_by_default() -> None:
    assert BrokerConfig({})["kbroker.request.receive.timeout.ms"] == 60000
    assert BrokerConfig({"kbroker.request.receive.timeout.ms": "-1"})["kbroker.request.receive.timeout.ms"] == -1
