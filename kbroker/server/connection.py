"""One client connection: frames in, responses out, strictly in request order.

Like Kafka, a connection's requests are handled one at a time (Kafka mutes a channel until its response
is sent): one task reads a request, answers it, and reads the next. Pipelined requests wait in the
socket's buffer, or already split into frames in the FrameBuffer, so the only back-pressure is TCP's.
At shutdown the broker shuts every connection's socket for reading: a connection finishes the request in
hand, answers what was already received, then sees end of stream and closes. The task runs in the
broker's connection nursery, so it is cancelled with it.
"""

from __future__ import annotations

import logging
import socket
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

API_VERSIONS = 18


class ConnectionClosed(Exception):
    pass


async def serve_connection(broker: Broker, stream: trio.SocketStream, connection_id: int) -> None:
    try:
        peer = stream.socket.getpeername()
        host = f"{peer[0]}:{peer[1]}"
    except OSError:
        host = "?"
    try:
        async with stream:
            broker.open_connections[connection_id] = stream.socket
            if broker.draining:  # accepted just as draining began: nothing more will be read
                stop_reading(stream.socket)
            await _serve(broker, stream, host, connection_id)
    except Exception as exc:  # noqa: BLE001 - one connection's failure is logged, never the broker's
        if not _is_disconnect(exc):
            # Whatever went wrong ends this connection only; the broker and other clients carry on.
            log.error("connection from %s failed", host, exc_info=exc)
    finally:
        broker.connection_closed(connection_id)


def stop_reading(sock: trio.socket.SocketType) -> None:
    """Shut the socket for reading: what was received is still read, then end of stream (draining)."""
    try:
        sock.shutdown(socket.SHUT_RD)
    except OSError:  # already gone
        pass


_DISCONNECTS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ConnectionClosed)


def _is_disconnect(exc: BaseException) -> bool:
    """A peer that went away (closing a socket it already dropped, say): nothing worth logging."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_disconnect(inner) for inner in exc.exceptions)
    return isinstance(exc, _DISCONNECTS)


async def _next_frame(sock: trio.socket.SocketType, buffer: FrameBuffer) -> bytearray | None:
    """The next request frame, reading from the socket only when none is buffered; None at end of stream."""
    while (frame := buffer.next_frame()) is None:
        try:
            # Straight into the frame buffer: a large request is never copied in user space.
            with buffer.read_buffer() as target:  # released before the buffer may grow again
                count = await sock.recv_into(target)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return None
        if not count:
            return None
        buffer.commit(count)
    return frame


async def _serve(broker: Broker, stream: trio.SocketStream, host: str, connection_id: int) -> None:
    buffer = FrameBuffer(broker.config["socket.request.max.bytes"])
    sock = stream.socket
    while True:
        try:
            frame = await _next_frame(sock, buffer)
        except FrameTooLarge as exc:
            log.warning("closing connection from %s: %s", host, exc)
            return
        if frame is None:
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
                connections.start_soon(serve_connection, broker, stream, counter)

    async with trio.open_nursery() as connections:
        with broker.accepting:
            async with trio.open_nursery() as acceptors:
                for listener in listeners:
                    acceptors.start_soon(accept_loop, listener, connections)
