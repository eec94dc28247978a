"""One client connection: frames in, responses out, strictly in request order.

Like Kafka, a connection's requests are handled one at a time (Kafka mutes a channel until its response
is sent), while a reader task keeps pulling frames off the socket so the next request is ready. Both
tasks live in the connection's nursery: when the client goes away or the broker shuts down, everything
the connection started is cancelled with it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from kbroker.apis import HANDLERS, unsupported_version_response
from kbroker.apis.context import RequestContext
from kbroker.server.sending import send_spliced
from protocol.exceptions import DecodeError
from protocol.framing import FrameBuffer, FrameTooLarge, SplicedOutput, decode_request, encode_response
from protocol.messages import APIS

if TYPE_CHECKING:
    from kbroker.broker import Broker

log = logging.getLogger("kbroker.server")

PRODUCE = 0
API_VERSIONS = 18
_PIPELINE_DEPTH = 32  # decoded requests waiting per connection; more and the reader stops reading


class ConnectionClosed(Exception):
    pass


async def serve_connection(broker: Broker, stream: trio.SocketStream, connection_id: int) -> None:
    try:
        peer = stream.socket.getpeername()
        host = f"{peer[0]}:{peer[1]}"
    except OSError:
        host = "?"
    send, receive = trio.open_memory_channel[bytearray](_PIPELINE_DEPTH)
    try:
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(_read_frames, broker, stream, send, host)
            try:
                await _process(broker, stream, receive, host, connection_id)
            except ConnectionClosed:
                pass
            nursery.cancel_scope.cancel()
    except Exception as exc:  # exception groups from the nursery included
        if not _is_disconnect(exc):
            # Whatever went wrong ends this connection only; the broker and other clients carry on.
            log.error("connection from %s failed", host, exc_info=exc)
    finally:
        broker.connection_closed(connection_id)


_DISCONNECTS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ConnectionClosed)


def _is_disconnect(exc: BaseException) -> bool:
    """A peer that went away (closing a socket it already dropped, say): nothing worth logging."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_disconnect(inner) for inner in exc.exceptions)
    return isinstance(exc, _DISCONNECTS)


async def _read_frames(
    broker: Broker, stream: trio.SocketStream, send: trio.MemorySendChannel[bytearray], host: str
) -> None:
    buffer = FrameBuffer(broker.config["socket.request.max.bytes"])
    sock = stream.socket
    async with send:
        while True:
            try:
                # Straight into the frame buffer: a large request is never copied in user space.
                with buffer.read_buffer() as target:  # released before the buffer may grow again
                    count = await sock.recv_into(target)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return
            if not count:
                return
            buffer.commit(count)
            try:
                while (frame := buffer.next_frame()) is not None:
                    await send.send(frame)
            except FrameTooLarge as exc:
                log.warning("closing connection from %s: %s", host, exc)
                return


async def _process(
    broker: Broker,
    stream: trio.SocketStream,
    receive: trio.MemoryReceiveChannel[bytearray],
    host: str,
    connection_id: int,
) -> None:
    async with receive:
        while True:
            # Waiting for the next request is the one place a draining broker may stop a connection.
            with trio.CancelScope() as idle:
                broker.idle_scopes.add(idle)
                if broker.draining:
                    idle.cancel()
                try:
                    frame = await receive.receive()
                except trio.EndOfChannel:
                    return
                finally:
                    broker.idle_scopes.discard(idle)
            if idle.cancelled_caught:
                return
            try:
                request = decode_request(frame)
            except DecodeError as exc:
                log.warning("closing connection from %s: unparseable request: %s", host, exc)
                return
            key, version = request.api_key, request.api_version
            if request.trailing_bytes:
                log.debug("ignoring %d trailing bytes after api key %d v%d", request.trailing_bytes, key, version)
            handler = HANDLERS.get(key)
            if request.body is None or handler is None or not handler.supports(version):
                if key == API_VERSIONS:
                    # KIP-511: answer in v0 format with the full list so the client can pick a version.
                    response = unsupported_version_response()
                    await _send(stream, encode_response(response, key, 0, request.correlation_id))
                    continue
                name = APIS[key].name if key in APIS else f"api key {key}"
                log.warning("closing connection from %s: unsupported %s version %d", host, name, version)
                return
            context = RequestContext(
                broker=broker,
                api_key=key,
                api_version=version,
                correlation_id=request.correlation_id,
                client_id=request.header.client_id,
                client_host=host,
                connection_id=connection_id,
            )
            try:
                response = await handler.handle(context, request.body)
                if response is None:  # acks=0 produce: Kafka sends nothing back
                    continue
                encoded = encode_response(response, key, version, request.correlation_id)
            except Exception:
                # A bug in one handler costs this connection, never the broker.
                log.exception("handler for %s v%d failed (client %s)", handler.name, version, host)
                return
            await _send(stream, encoded)


async def _send(stream: trio.SocketStream, data: bytes | bytearray) -> None:
    try:
        if isinstance(data, SplicedOutput) and data.splices:
            await send_spliced(stream.socket, data)  # record data straight from the segment files
        else:
            await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        raise ConnectionClosed from exc


async def serve(broker: Broker, listeners: list[trio.SocketListener]) -> None:
    """Accept connections until draining starts, then wait for the open ones to finish."""
    counter = 0

    async def accept_loop(listener: trio.SocketListener, connections: trio.Nursery) -> None:
        nonlocal counter
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:  # e.g. EMFILE: back off instead of spinning
                    log.error("accept failed: %s", exc)
                    await trio.sleep(0.1)
                    continue
                counter += 1
                broker.open_connections.add(counter)
                connections.start_soon(serve_connection, broker, stream, counter)

    async with trio.open_nursery() as connections:
        with broker.accepting:
            async with trio.open_nursery() as acceptors:
                for listener in listeners:
                    acceptors.start_soon(accept_loop, listener, connections)
