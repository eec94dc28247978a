"""One client connection: frames in, responses out, strictly in request order.

Like Kafka, a connection's requests are handled one at a time (Kafka mutes a channel until its response
is sent): one task reads a request, answers it, and reads the next. Pipelined requests wait in the
stream's buffer, or already split into frames in the FrameBuffer, so the only back-pressure is TCP's.

A ``Connection`` owns its trio stream and what the broker knows about the client: the listener it came in
on and that listener's security (its TLS context and SASL settings), its principal (``User:ANONYMOUS``, the
client certificate's on SSL listeners, the SASL user on SASL ones), its SASL authenticator, and the client id
and software it names. Every request passes one pipeline:

    version check -> authentication gate -> handler -> error mapping

A version the broker does not handle closes the connection (ApiVersions excepted, KIP-511), as a frame that
cannot be parsed does. On a SASL listener the authentication gate hands requests to the connection's
authenticator (kbroker/security/authenticator.py) until authentication completes, and again for a
re-authentication; a session past its lifetime ends at its next request. Authorization is each handler's. A handler
that raises ``KafkaError`` gets that API's error answer with the error's code; any other exception is logged
once with its traceback and answered with UNKNOWN_SERVER_ERROR, and the connection carries on. Only an API
version whose answer has no error field at all leaves nothing to say, and then the connection is closed.

On a plain socket, requests are read straight into the frame buffer (``recv_into``) and record data goes
from segment files to the socket with ``sendfile``; any other stream (TLS: kbroker/server/tls.py, a test's
wrapper) reads with ``receive_some`` and sends file regions read into memory.

At shutdown the broker tells every connection to stop reading: a connection finishes the request in hand,
answers what was already received, then sees end of stream and closes. The task runs in the broker's
connection nursery, so it is cancelled with it.

Idle and stalled connections (``connections.max.idle.ms``, negative: never): as in Kafka's Selector, a
connection on which no bytes moved for that long is closed, whether it sent nothing or stopped halfway
through a request (Kafka has no separate read timeout; its idle timer is that timeout), and so is one whose
client stopped reading a response. A request being handled is never cut off. A connection only notes the
time of its last activity; one task for the whole server closes the idle ones (kbroker/server/idle.py).

Request memory (``queued.max.request.bytes``): every connection counts the bytes it receives in one pool
and gives a request's bytes back once it is answered; while the pool is full the connection reads nothing
more, unless its unfinished request is the oldest (kbroker/server/memory.py).

Client quotas (kbroker/quotas.py, kbroker/server/throttling.py): while any is set, each request is measured
against its client's quotas; a client over one gets throttle_time_ms in its answer and the connection reads
nothing from it for that long (muted, as Kafka mutes the channel). An IP over its connection_creation_rate has
its new connection held for the throttle time, then closed unserved.
"""

from __future__ import annotations

import errno
import logging
import socket
from time import perf_counter
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from kbroker.apis import HANDLERS, ApiHandler, unsupported_version_response
from kbroker.apis.context import CloseConnection, HandlerServices, RequestContext
from kbroker.server import offload
from kbroker.server.idle import IDLE_SETTING, RECEIVE_SETTING, IdleReaper
from kbroker.server.limits import accept_failure_message
from kbroker.server.listener_security import PLAINTEXT_SECURITY, ListenerSecurity, new_authenticator
from kbroker.server.memory import SIZE_PREFIX, RequestMemory
from kbroker.server.sending import send_bytes, send_spliced, send_spliced_to_stream
from kbroker.server.throttling import answer_under_quotas, client_throttles
from kbroker.server.tls import ServerTLSStream
from protocol.errors import ErrorCode, KafkaError
from protocol.exceptions import DecodeError
from protocol.framing import FrameBuffer, FrameTooLarge, Request, SplicedOutput, encode_response
from protocol.messages import APIS

if TYPE_CHECKING:
    from kbroker.broker import Broker
    from kbroker.security.authenticator import SaslAuthenticator, Step

log = logging.getLogger("kbroker.server")

PRODUCE = 0
SASL_HANDSHAKE = 17
API_VERSIONS = 18
ANONYMOUS = "User:ANONYMOUS"
DEFAULT_LISTENER = "PLAINTEXT"
RECEIVE_SIZE = 64 * 1024  # bytes asked of a stream that is not a plain socket per read

# accept() failures that say "out of resources right now": wait and try again (as trio.serve_listeners does).
ACCEPT_RETRY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY_SECONDS = 0.05  # the first wait; it doubles while accept keeps failing
ACCEPT_RETRY_MAX_SECONDS = 1.0


class ConnectionClosed(Exception):
    pass


class ListenerInfo(NamedTuple):
    """What a connection knows of the listener that accepted it."""

    name: str = DEFAULT_LISTENER
    security_protocol: str = "PLAINTEXT"
    security: ListenerSecurity = PLAINTEXT_SECURITY  # its TLS context and SASL settings


class _Close(Exception):
    """The pipeline's verdict that this connection ends here (the reason is already logged)."""


class Connection:
    """One client's stream and per-connection state, and the loop that serves its requests."""

    def __init__(
        self,
        broker: Broker,
        stream: trio.abc.Stream,
        connection_id: int,
        listener: ListenerInfo | None = None,
        memory: RequestMemory | None = None,
        reaper: IdleReaper | None = None,
    ) -> None:
        self.broker = broker
        self.services = HandlerServices.of(broker)  # what handlers get: typed services, not the broker
        self.stream = stream
        self.id = connection_id
        self.listener = listener if listener is not None else ListenerInfo()
        self.principal = ANONYMOUS
        # SASL listeners: the authentication every request waits for (kbroker/security/authenticator.py).
        self.sasl: SaslAuthenticator | None = None
        if self.listener.security.sasl is not None:
            self.sasl = new_authenticator(self.listener.security.sasl, broker)
        self._close_after_answer = False  # a failed authentication: answered, then the connection ends
        self.client_id: str | None = None
        self.client_software_name: str | None = None
        self.client_software_version: str | None = None
        # The zero-copy paths need the socket itself; any other stream goes through its own methods (TLS too).
        raw_socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._socket: trio.socket.SocketType | None = raw_socket if self.listener.security.ssl_context is None else None
        self.peer = _peer_name(raw_socket)
        self._stopping = False
        self._read_scope: trio.CancelScope | None = None
        # The server's reaper closes idle connections; a connection run on its own brings its own.
        self._reaper = reaper
        self.idle_since: float | None = None  # last bytes in or out; None while a request is handled
        self.receiving_since: float | None = None  # when the request still arriving began (or reading resumed)
        self._idle_scope = trio.CancelScope()  # cancelled by the reaper: idle for connections.max.idle.ms
        self._expired_by = IDLE_SETTING  # or RECEIVE_SETTING: the request took too long to arrive
        self._sending = False
        self._buffer: FrameBuffer | None = None
        # The pool is the server's, shared by every connection; without one, this connection has no bound.
        self.memory = memory if memory is not None else RequestMemory(None)
        self._bounded = self.memory.bounded
        self._held = 0  # bytes received and counted in the pool, given back as their requests are answered
        self._unfilled = 0  # of it, allocated for a large frame and not received yet
        self._request_size = 0  # the frame being handled, size prefix included (the produce byte quota's measure)
        self._throttle_ms = 0  # what the request just handled earned its client under its quotas
        self._mute_scope: trio.CancelScope | None = None

    @property
    def listener_name(self) -> str:
        return self.listener.name

    @property
    def security_protocol(self) -> str:
        return self.listener.security_protocol

    # --- life cycle ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve requests until the client goes, a frame is malformed or the broker drains; never raises."""
        broker = self.broker
        accepted = self.stream
        try:
            async with accepted:
                broker.open_connections[self.id] = self
                if broker.draining:  # accepted just as draining began: nothing more will be read
                    self.stop_reading()
                if self._reaper is not None:
                    await self._serve_watched(self._reaper)
                else:
                    async with trio.open_nursery() as nursery:  # run on its own: a reaper for this one only
                        reaper = IdleReaper(broker.config[IDLE_SETTING], broker.config[RECEIVE_SETTING])
                        nursery.start_soon(reaper.run)
                        await self._serve_watched(reaper)
                        nursery.cancel_scope.cancel()
                if self.stream is not accepted:  # TLS: close_notify before the socket closes, as Kafka sends it
                    await self.stream.aclose()
        except Exception as exc:  # noqa: BLE001 - one connection's failure is logged, never the broker's
            if not _is_disconnect(exc):
                # Whatever went wrong ends this connection only; the broker and other clients carry on.
                log.error("connection from %s failed", self.peer, exc_info=exc)
        finally:
            self.memory.received(self)  # an unfinished request no longer holds the others back
            self.memory.release(self._held)  # what it received and never answered goes back to the pool
            self._held = 0
            broker.connection_closed(self.id)

    def stop_reading(self) -> None:
        """Read nothing more: what was received is still answered, then the connection ends (draining)."""
        self._stopping = True
        if self._socket is not None:
            try:
                self._socket.shutdown(socket.SHUT_RD)  # recv sees end of stream once the buffer is read
            except OSError:  # already gone
                pass
        elif self._read_scope is not None:
            self._read_scope.cancel()  # only ever around a read, never around a handler
        if self._mute_scope is not None:
            self._mute_scope.cancel()  # draining: no point holding a throttled client any longer

    def expire(self, setting: str) -> None:
        """The reaper's verdict: no bytes moved for connections.max.idle.ms, or a request took longer than
        kbroker.request.receive.timeout.ms to arrive (never called while handling)."""
        self._expired_by = setting
        self._idle_scope.cancel()

    async def _serve_watched(self, reaper: IdleReaper) -> None:
        self.idle_since = trio.current_time()
        reaper.watch(self)
        try:
            with self._idle_scope:
                await self._serve()
        finally:
            reaper.forget(self)
        if self._idle_scope.cancelled_caught:
            self._log_expired(reaper)

    def _log_expired(self, reaper: IdleReaper) -> None:
        pending = self._buffer.pending if self._buffer is not None else 0
        idle_ms = round(reaper.idle_seconds * 1000)
        if self._expired_by == RECEIVE_SETTING:
            log.info(
                "closing connection from %s: a request was still arriving after %s=%d (%d bytes received)",
                self.peer,
                RECEIVE_SETTING,
                round(reaper.receive_seconds * 1000),
                pending,
            )
        elif self._sending:
            log.info(
                "closing connection from %s: it read none of its response for connections.max.idle.ms=%d",
                self.peer,
                idle_ms,
            )
        elif pending:
            log.info(
                "closing connection from %s: a request stopped arriving midway (%d bytes received, then "
                "nothing for connections.max.idle.ms=%d)",
                self.peer,
                pending,
                idle_ms,
            )
        else:
            log.debug("closing connection from %s: idle for connections.max.idle.ms=%d", self.peer, idle_ms)

    async def _serve(self) -> None:
        if self.listener.security.ssl_context is not None and not await self._tls_handshake():
            return
        limit = self.broker.config["socket.request.max.bytes"]
        if self.sasl is not None:  # until authenticated, frames are held to sasl.server.max.receive.size
            limit = self.sasl.listener.max_receive_size
        buffer = self._buffer = FrameBuffer(limit)
        while await self._serve_one(buffer):
            # The request and its frame are gone with _serve_one's frame: their memory goes back to the pool.
            answered = min(self._request_size, self._held)
            self._held -= answered
            self.memory.release(answered)

    async def _serve_one(self, buffer: FrameBuffer) -> bool:
        """Read, handle and answer one request; False once the connection is to end."""
        try:
            frame = await self._next_frame(buffer)
        except FrameTooLarge as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            return False
        if frame is None:
            return False
        self._request_size = SIZE_PREFIX + len(frame)
        if self.sasl is not None and self.sasl.raw_tokens:  # after SaslHandshake v0: a bare SASL token
            return await self._raw_sasl_token(bytes(frame))
        # A huge request's objects are freed when _answer returns, before the collector runs again.
        huge = offload.is_huge(frame)  # counting a large Produce's partitions once, for both
        with offload.collector_paused(frame, huge):
            return await self._answer(frame, huge)

    async def _answer(self, frame: bytearray, huge: bool) -> bool:
        """Decode, handle and answer one request frame; False once the connection is to end."""
        self.idle_since = None  # decoding and handling: never idle, however long it takes
        try:
            request = await offload.decode(frame, huge)
        except DecodeError as exc:
            log.warning("closing connection from %s: unparseable request: %s", self.peer, exc)
            return False
        except OSError as exc:
            # The request's codec is imported on first use: out of descriptors (EMFILE) it cannot be, and the
            # request cannot be read to answer it. Like an unreadable request it ends this connection only; the
            # client retries and the import is tried again then.
            log.warning("closing connection from %s: cannot load the request's codec: %s", self.peer, exc)
            return False
        started = perf_counter()  # kafka_network_requestmetrics_totaltimems: from here to the answer written
        try:
            response = await self.handle(request, frame)
        except _Close:
            return False
        self.idle_since = trio.current_time()
        throttle_ms, self._throttle_ms = self._throttle_ms, 0
        if throttle_ms and not client_throttles(request.api_key, request.api_version):
            await self._mute(throttle_ms)  # a client from before KIP-219: the broker holds the answer instead
            throttle_ms = 0
        if response is not None:
            await self._send(response)
        self.services.metrics.observe_request(request.api_key, request.api_version, perf_counter() - started)
        if self._close_after_answer:
            return False
        if throttle_ms:
            await self._mute(throttle_ms)
        return True

    async def _mute(self, throttle_ms: int) -> None:
        """Read nothing from this client for ``throttle_ms`` (it is over a quota); not idle meanwhile."""
        self.idle_since = None
        with trio.move_on_after(throttle_ms / 1000) as self._mute_scope:
            await trio.sleep_forever()
        self._mute_scope = None
        self.idle_since = trio.current_time()

    # --- the request pipeline -----------------------------------------------------------------------------

    async def handle(self, request: Request, frame: bytearray | None = None) -> bytes | bytearray | None:
        """The encoded answer to ``request`` (``frame``: its bytes as received), None when none is due (acks=0);
        raises _Close to end here."""
        key, version = request.api_key, request.api_version
        if request.trailing_bytes:
            log.debug("ignoring %d trailing bytes after api key %d v%d", request.trailing_bytes, key, version)
        # 1. version check
        handler = HANDLERS.get(key)
        body = request.body
        if body is None or handler is None or not handler.supports(version):
            if key == API_VERSIONS:
                # KIP-511: answer in v0 format with the full list so the client can pick a version.
                return encode_response(unsupported_version_response(), key, 0, request.correlation_id)
            name = APIS[key].name if key in APIS else f"api key {key}"
            log.warning("closing connection from %s: unsupported %s version %d", self.peer, name, version)
            raise _Close
        self.client_id = request.header.client_id
        if key == API_VERSIONS and version >= 3:
            self.client_software_name = body.client_software_name
            self.client_software_version = body.client_software_version
        # 2. authentication gate
        sasl = self.sasl
        if sasl is not None:
            if not sasl.complete or (key == SASL_HANDSHAKE and self._begin_reauthentication(sasl)):
                step = sasl.on_request(key, version, body)
                if not step.pass_through:
                    return await self._authentication_answer(request, body, step)
            elif sasl.session_expired():
                # Kafka's check: a session past its lifetime that did not re-authenticate ends here.
                log.info("closing connection from %s (%s): its SASL session expired", self.peer, self.principal)
                raise _Close
        context = RequestContext(
            services=self.services,
            api_key=key,
            api_version=version,
            correlation_id=request.correlation_id,
            client_id=self.client_id,
            client_host=self.peer,
            connection_id=self.id,
            listener=self.listener.name,
            principal=self.principal,
            request_frame=frame,
        )
        try:
            # 3. handler
            if self.services.quotas.enforcing:  # the only cost of quotas while none is set
                encoded, self._throttle_ms = await answer_under_quotas(
                    handler,
                    context,
                    body,
                    self._request_size,
                    lambda answer: offload.encode(answer, key, version, request.correlation_id),
                )
                return encoded
            response = await handler.handle(context, body)
            if response is None:  # acks=0 produce: Kafka sends nothing back
                return None
            return await offload.encode(response, key, version, request.correlation_id)
        # 4. error mapping
        except CloseConnection as exc:
            log.info("closing connection from %s: %s", self.peer, exc)
            raise _Close from None
        except KafkaError as exc:
            log.debug("%s v%d from %s failed: %r", handler.name, version, self.peer, exc)
            return await self._error_answer(request, body, exc.code, exc.message)
        except Exception:
            log.exception("handler for %s v%d failed (client %s)", handler.name, version, self.peer)
            return await self._error_answer(request, body, ErrorCode.UNKNOWN_SERVER_ERROR, None)

    async def _authentication_answer(self, request: Request, body: Any, step: Step) -> SplicedOutput | None:
        """The answer to a request of the SASL exchange (handshake or token), and what follows it."""
        if step.failed:
            await self._failed_authentication_delay()
        if step.close:
            self._close_after_answer = True
        self._authentication_done()
        if step.response is None:
            raise _Close
        if isinstance(step.response, tuple):  # a request out of turn: its own API's error answer
            code, message = step.response
            return await self._error_answer(request, body, code, message)
        return encode_response(step.response, request.api_key, request.api_version, request.correlation_id)

    async def _raw_sasl_token(self, token: bytes) -> bool:
        """One token of a SaslHandshake v0 exchange: answered with a bare size-prefixed token; False: close."""
        assert self.sasl is not None
        step = self.sasl.on_raw_token(token)
        if step.failed:
            await self._failed_authentication_delay()
        if step.close:
            return False
        self._authentication_done()
        challenge = step.response or b""
        await self._send(len(challenge).to_bytes(4, "big") + challenge)
        return True

    async def _failed_authentication_delay(self) -> None:
        """connection.failed.authentication.delay.ms before a failed authentication is answered or closed."""
        assert self.sasl is not None
        await trio.sleep(self.sasl.listener.failed_delay_ms / 1000)

    def _begin_reauthentication(self, sasl: SaslAuthenticator) -> bool:
        """KIP-368: a SaslHandshake on an authenticated connection; tokens are held to the SASL size limit again."""
        if not sasl.begin_reauthentication():
            return False
        if self._buffer is not None:
            self._buffer.max_frame_size = sasl.listener.max_receive_size
        return True

    def _authentication_done(self) -> None:
        """Once SASL completes: the principal is known and frames may be as large as any request."""
        if self.sasl is not None and self.sasl.complete:
            assert self.sasl.principal is not None
            self.principal = self.sasl.principal
            if self._buffer is not None:
                self._buffer.max_frame_size = self.broker.config["socket.request.max.bytes"]

    async def _tls_handshake(self) -> bool:
        """Wrap the stream in TLS and shake hands; on SSL listeners the principal is the client certificate's."""
        security = self.listener.security
        assert security.ssl_context is not None
        # kbroker's own TLS stream: each read returns every record received, not one (kbroker/server/tls.py).
        tls = ServerTLSStream(self.stream, security.ssl_context)
        try:
            await tls.do_handshake()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            log.info("closing connection from %s: TLS handshake failed: %s", self.peer, cause)
            return False
        self.stream = tls
        if self.listener.security_protocol == "SSL":
            from kbroker.security.principal import PrincipalMappingError, principal_of_certificate

            try:
                self.principal = principal_of_certificate(tls.getpeercert(binary_form=True), security.principal_rules)
            except PrincipalMappingError as exc:  # Kafka fails the client's authentication
                log.info("closing connection from %s: %s", self.peer, exc)
                return False
        self.idle_since = trio.current_time()
        return True

    async def _error_answer(self, request: Request, body: Any, code: ErrorCode, message: str | None) -> SplicedOutput:
        key, version = request.api_key, request.api_version
        if key == PRODUCE and getattr(body, "acks", None) == 0:
            # As Kafka: an acks=0 producer reads no answer, so the only way to tell it is to close.
            log.warning("closing connection from %s: acks=0 produce failed with %s", self.peer, code.name)
            raise _Close
        # Imported by the first failed request: a broker whose requests all succeed never loads it.
        from kbroker.apis.error_responses import error_response

        try:
            response = error_response(key, version, body, code, message)
            if response is not None:
                return await offload.encode(response, key, version, request.correlation_id)
        except Exception:
            log.exception("error answer for %s v%d failed (client %s)", APIS[key].name, version, self.peer)
            raise _Close from None
        log.warning(
            "closing connection from %s: %s v%d has no error field for %s",
            self.peer,
            APIS[key].name,
            version,
            code.name,
        )
        raise _Close

    # --- the stream ---------------------------------------------------------------------------------------

    async def _next_frame(self, buffer: FrameBuffer) -> bytearray | None:
        """The next request frame, reading only when none is buffered; None at end of stream."""
        if self._socket is not None:
            return await self._read_frame(buffer)
        # One cancel scope for every read of a frame, which stop_reading() cancels: a large request over TLS
        # takes hundreds of reads (a TLS record each), and a scope per read cost a fifth of the broker's time.
        frame = None
        with trio.CancelScope() as self._read_scope:
            frame = await self._read_frame(buffer)
        self._read_scope = None
        return frame

    async def _read_frame(self, buffer: FrameBuffer) -> bytearray | None:
        while (frame := buffer.next_frame()) is None:
            if self.receiving_since is None and buffer.midframe:
                # A request has begun (or reading resumes after handling, a memory wait or a mute): from now
                # on it has kbroker.request.receive.timeout.ms to arrive whole (kbroker/server/idle.py).
                self.receiving_since = trio.current_time()
            if self._bounded:
                await self._wait_for_memory(buffer.midframe)
            try:
                if self._socket is not None:
                    # Straight into the frame buffer: a large request is never copied in user space.
                    with buffer.read_buffer() as target:  # released before the buffer may grow again
                        count = await self._socket.recv_into(target)
                    if not count:
                        return None
                    buffer.commit(count)
                else:
                    if self._stopping:
                        return None
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                    if not data:  # end of stream (stop_reading() cancels the read: _next_frame returns None)
                        return None
                    count = len(data)
                    buffer.feed(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return None
            if self._bounded:
                # What arrived, and what the frame buffer set aside for the rest of a large frame: memory held.
                unfilled = buffer.unfilled
                self._held += self.memory.take(count + unfilled - self._unfilled)
                self._unfilled = unfilled
            self.idle_since = trio.current_time()  # bytes arrived: not idle
        self.receiving_since = None  # the frame is whole; what follows it starts the clock at the next read
        if self._bounded:
            self.memory.received(self)
        return frame

    async def _wait_for_memory(self, midframe: bool) -> None:
        """Before reading on: wait while the request pool is full (kbroker/server/memory.py). Reading stops, so
        TCP holds the client back; it is not idle while the broker keeps it waiting, and the clocks restart."""
        if midframe:
            self.memory.receiving(self)
        if not self.memory.may_read(self):
            self.idle_since = None
            await self.memory.room_for(self)
            self.idle_since = trio.current_time()
            if self.receiving_since is not None:
                self.receiving_since = self.idle_since

    async def _send(self, data: bytes | bytearray) -> None:
        self._sending = True
        try:
            if isinstance(data, SplicedOutput) and data.splices:
                # Record data straight from the segment files where the stream is a socket.
                if self._socket is not None:
                    await send_spliced(self._socket, data, self._sent_some)
                else:
                    await send_spliced_to_stream(self.stream, data)
            elif self._socket is not None:
                await send_bytes(self._socket, memoryview(data), self._sent_some)
            else:
                await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise ConnectionClosed from exc
        self._sending = False
        self.idle_since = trio.current_time()

    def _sent_some(self) -> None:
        self.idle_since = trio.current_time()  # the client is reading: not idle


def _peer_name(sock: trio.socket.SocketType | None) -> str:
    if sock is None:
        return "?"
    try:
        peer = sock.getpeername()
        return f"{peer[0]}:{peer[1]}"
    except (OSError, IndexError, TypeError):
        return "?"


def _peer_ip(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, IndexError, TypeError):
        return "?"


async def _close_after(stream: trio.SocketStream, hold_ms: int) -> None:
    with trio.move_on_after(hold_ms / 1000):
        await trio.sleep_forever()
    await stream.aclose()


_DISCONNECTS = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionClosed)
# OSErrors that mean the peer or its socket is gone; any other (EMFILE from a lazy import, say) is logged.
_DISCONNECT_ERRNOS = frozenset(
    {errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN, errno.ECONNABORTED, errno.ESHUTDOWN, errno.ETIMEDOUT, errno.EBADF}
)


def _is_disconnect(exc: BaseException) -> bool:
    """A peer that went away (closing a socket it already dropped, say): nothing worth logging."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_disconnect(inner) for inner in exc.exceptions)
    if isinstance(exc, OSError) and exc.errno in _DISCONNECT_ERRNOS:
        return True
    return isinstance(exc, _DISCONNECTS)


HANDLER_LOAD_DELAY_S = 1.0
HANDLER_LOAD_RETRY_S = 5.0  # a handler that could not be loaded (out of descriptors) is tried again this often


async def load_handlers() -> None:
    """Import every handler and its message classes soon after start-up, one API at a time between requests.

    They are imported on first use so that the broker is ready sooner (kbroker/apis/__init__.py), but a
    broker that has run out of descriptors could not open their source files: the first Metadata request
    after the limit was reached would fail, and a request whose codec is not loaded could not be decoded.
    It waits a moment first, so that the clients' first requests (which load their own handlers) are not
    kept waiting behind it: the broker answers its first Metadata as soon as before. One that cannot be loaded
    yet (out of descriptors already) is tried again later; meanwhile a request needing it is answered with an error.
    """
    await trio.sleep(HANDLER_LOAD_DELAY_S)
    pending = list(HANDLERS.values())
    reported = False
    while True:
        failed: list[tuple[ApiHandler, str]] = []
        for handler in pending:
            reason = handler.load(quiet=True)
            if reason is not None:
                failed.append((handler, reason))
            await trio.lowlevel.checkpoint()
        if not failed:
            if reported:
                log.warning("every handler is loaded now")
            return
        if not reported:  # one line for them all, not one per handler or per attempt
            reported = True
            log.error(
                "%d of %d handlers could not be loaded yet (the first: %s); tried again every %g s",
                len(failed),
                len(HANDLERS),
                failed[0][1],
                HANDLER_LOAD_RETRY_S,
            )
        pending = [handler for handler, _ in failed]
        await trio.sleep(HANDLER_LOAD_RETRY_S)


async def serve_connection(
    broker: Broker,
    stream: trio.abc.Stream,
    connection_id: int,
    listener: ListenerInfo | None = None,
    memory: RequestMemory | None = None,
    reaper: IdleReaper | None = None,
) -> None:
    await Connection(broker, stream, connection_id, listener, memory, reaper).run()


class ServedListener(NamedTuple):
    """Sockets to accept on, and the listener their connections belong to."""

    info: ListenerInfo
    sockets: list[trio.SocketListener]


async def accept_loop(
    broker: Broker,
    listener: trio.abc.Listener[trio.SocketStream],
    info: ListenerInfo,
    connections: trio.Nursery,
    next_id: Any,
    memory: RequestMemory | None = None,
    reaper: IdleReaper | None = None,
) -> None:
    """Accept until cancelled; out of descriptors or memory, it waits and retries with a growing pause.

    The failure is logged once, with its fix, when it starts, and once more when accepting works again:
    not once per attempt. Connections already open are served meanwhile: they are other tasks.
    """
    failures = 0
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_RETRY_ERRNOS:
                    raise
                if not failures:
                    log.error("%s", accept_failure_message(info.name, exc))
                failures += 1
                await trio.sleep(min(ACCEPT_RETRY_SECONDS * 2 ** min(failures - 1, 16), ACCEPT_RETRY_MAX_SECONDS))
                continue
            if failures:
                log.warning("listener %s accepts connections again (after %d failed attempts)", info.name, failures)
                failures = 0
            if broker.quotas.limits_connections:
                hold_ms = broker.quotas.record_connection(_peer_ip(stream))
                if hold_ms:  # over the IP's connection_creation_rate: held, then closed unserved (as Kafka)
                    connections.start_soon(_close_after, stream, hold_ms)
                    continue
            connections.start_soon(serve_connection, broker, stream, next_id(), info, memory, reaper)


async def serve(broker: Broker, listeners: list[trio.SocketListener] | list[ServedListener]) -> None:
    """Accept connections on every listener until draining starts, then wait for the open ones to finish."""
    served = [
        item if isinstance(item, ServedListener) else ServedListener(ListenerInfo(), [item]) for item in listeners
    ]
    counter = 0
    memory = RequestMemory.from_setting(broker.config["queued.max.request.bytes"])
    reaper = IdleReaper(broker.config[IDLE_SETTING], broker.config[RECEIVE_SETTING])

    def next_id() -> int:
        nonlocal counter
        counter += 1
        return counter

    async with trio.open_nursery() as reaping:
        reaping.start_soon(reaper.run)
        async with trio.open_nursery() as connections:
            with broker.accepting:
                async with trio.open_nursery() as acceptors:
                    acceptors.start_soon(load_handlers)
                    for item in served:
                        for sock in item.sockets:
                            acceptors.start_soon(
                                accept_loop, broker, sock, item.info, connections, next_id, memory, reaper
                            )
        reaping.cancel_scope.cancel()  # every connection has ended
