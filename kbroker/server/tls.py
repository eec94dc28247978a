"""The server side of a TLS connection: kbroker's own stream over ``ssl.SSLObject`` and two memory BIOs.

Why not ``trio.SSLStream``: it hands back one TLS record per ``receive_some``, and clients send small records
(librdkafka ~3.6 KB), so a 1 MB produce took ~250 reads, each a pass through trio's scheduler plus SSLStream's
bookkeeping: most of the broker's time on a TLS produce, while decryption itself was ~5%. This stream reads a
large chunk off the socket and returns every complete record in it at once.

It is made for a Connection's strict one-request-at-a-time use: one task reads, then writes, never both at once
(a second concurrent call raises ``trio.BusyResourceError``). Renegotiation is refused
(``ssl.OP_NO_RENEGOTIATION``), so no read ever waits for a write: the few bytes OpenSSL produces while reading
(an answer to a TLS 1.3 KeyUpdate, a no_renegotiation alert) stay in the outgoing BIO and go out first thing in
the next ``receive_some`` or ``send_all``, where a cancellation loses no data already decrypted.

Cancellation: a cancelled ``receive_some`` leaves what arrived in the incoming BIO for the next call. A send
cancelled once ciphertext is partly on the wire (``send_all``, or the flush before a read) leaves the TLS stream
unusable, as trio's streams do: the stream is then broken and every later call raises
``trio.BrokenResourceError``.

End of stream: ``receive_some`` returns ``b""`` after the client's close_notify, and also when the transport
ends without one, even mid-record (clients often just close; a request's frame is length-prefixed, so a
truncated one is simply never complete). Failures raise ``trio.BrokenResourceError`` with the ssl error as
``__cause__``.
"""

from __future__ import annotations

import ssl
from typing import Any, Literal, overload

import trio

RECEIVE_CHUNK = 256 * 1024  # bytes asked of the transport per read: many records at once
SEND_CHUNK = 256 * 1024  # plaintext encrypted per write, so the ciphertext waiting in memory stays bounded
DEFAULT_MAX_BYTES = 256 * 1024  # receive_some() without max_bytes
CLOSE_NOTIFY_SECONDS = 1.0  # aclose() waits no longer than this for a peer that reads nothing


class _OneAtATime:
    """Raises BusyResourceError when a second task enters while one is inside (two reads, or two writes)."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._held = False

    def __enter__(self) -> None:
        if self._held:
            raise trio.BusyResourceError(f"another task is already {self._what} this TLS stream")
        self._held = True

    def __exit__(self, *_: object) -> None:
        self._held = False


class ServerTLSStream(trio.abc.Stream):
    """TLS on the server side of ``transport``; ``do_handshake()`` first, then receive_some/send_all."""

    def __init__(self, transport: trio.abc.Stream, context: ssl.SSLContext) -> None:
        # The contexts are per listener and shared by its connections: setting the option again is harmless.
        if not context.options & ssl.OP_NO_RENEGOTIATION:
            context.options |= ssl.OP_NO_RENEGOTIATION
        self.transport_stream = transport
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._handshake_done = False
        self._end_of_stream = False  # close_notify or the transport's end seen: every receive is b""
        self._transport_ended = False
        self._broken: BaseException | None = None  # why the stream can no longer be used
        self._closed = False
        self._receiving = _OneAtATime("receiving on")
        self._sending = _OneAtATime("sending on")

    # --- what a connection asks of it ------------------------------------------------------------------------

    async def do_handshake(self) -> None:
        """Shake hands as the server; the session tickets of TLS 1.3 are sent before this returns."""
        with self._receiving, self._sending:
            self._check_usable()
            if self._handshake_done:
                await trio.lowlevel.checkpoint()
                return
            while True:
                try:
                    self._ssl.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    if self._transport_ended:  # OpenSSL normally says so itself (SSLEOFError)
                        self._broken = trio.BrokenResourceError("the client closed during the TLS handshake")
                        raise self._broken from None
                    await self._flush()
                    await self._receive_into_bio()
                except ssl.SSLError as exc:
                    await self._fail(exc)
            self._handshake_done = True
            await self._flush()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Every complete record's data already received, up to ``max_bytes``; ``b""`` at end of stream."""
        if max_bytes is None:
            max_bytes = DEFAULT_MAX_BYTES
        elif max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        with self._receiving:
            self._check_usable()
            if not self._handshake_done:
                raise trio.BrokenResourceError("receive_some before the TLS handshake")
            # Data already decrypted-ready returns without a pass through the scheduler (the point of this
            # stream), but never to a cancelled caller.
            await trio.lowlevel.checkpoint_if_cancelled()
            while True:
                await self._flush()  # bytes the last read made OpenSSL write (see the module docstring)
                data = self._decrypt(max_bytes)
                if data is not None:
                    if not data:
                        await trio.lowlevel.checkpoint()
                    return data
                if self._transport_ended:  # OpenSSL normally says so itself (SSLEOFError)
                    self._end_of_stream = True
                    continue
                await self._receive_into_bio()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Encrypt ``data`` in large writes and send it; when this returns it is all with the transport."""
        with self._sending:
            self._check_usable()
            if not self._handshake_done:
                raise trio.BrokenResourceError("send_all before the TLS handshake")
            with memoryview(data) as view, view.cast("B") as plain:
                if not plain:
                    await self._flush()
                    await trio.lowlevel.checkpoint()
                    return
                for start in range(0, len(plain), SEND_CHUNK):
                    try:
                        self._ssl.write(plain[start : start + SEND_CHUNK])
                    except ssl.SSLError as exc:
                        await self._fail(exc)
                    await self._flush()

    async def wait_send_all_might_not_block(self) -> None:
        with self._sending:
            self._check_usable()
            await self._flush()
            await self.transport_stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Send close_notify (best effort: a peer gone or not reading is not waited for), then close."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            if self._handshake_done and self._broken is None:
                try:
                    self._ssl.unwrap()  # writes close_notify, then wants the peer's: not waited for
                except (ssl.SSLWantReadError, ssl.SSLError):
                    pass
                with trio.move_on_after(CLOSE_NOTIFY_SECONDS):
                    try:
                        await self._flush()
                    except trio.BrokenResourceError:
                        pass  # the peer already went: nothing to tell it
        finally:
            await self.transport_stream.aclose()

    @overload
    def getpeercert(self, binary_form: Literal[True]) -> bytes | None: ...

    @overload
    def getpeercert(self, binary_form: Literal[False] = False) -> dict[str, Any] | None: ...

    def getpeercert(self, binary_form: bool = False) -> bytes | dict[str, Any] | None:
        """The client's certificate after the handshake (None if it sent none), as ``ssl.SSLObject`` gives it."""
        return self._ssl.getpeercert(binary_form)

    def version(self) -> str | None:
        return self._ssl.version()

    def cipher(self) -> tuple[str, str, int] | None:
        return self._ssl.cipher()

    # --- inside -------------------------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("this TLS stream is closed")
        if self._broken is not None:
            raise trio.BrokenResourceError("this TLS stream is broken") from self._broken

    def _decrypt(self, max_bytes: int) -> bytes | None:
        """The data of every complete record in the incoming BIO, up to ``max_bytes`` (the rest stays there);
        ``b""`` at end of stream; None if no record is complete yet."""
        if self._end_of_stream:
            return b""
        pieces: list[bytes] = []
        remaining = max_bytes
        try:
            while remaining:
                piece = self._ssl.read(remaining)  # at most one record's data
                if not piece:  # close_notify
                    self._end_of_stream = True
                    break
                pieces.append(piece)
                remaining -= len(piece)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLEOFError:  # the transport ended without close_notify, maybe mid-record: a clean end
            self._end_of_stream = True
        except ssl.SSLError as exc:
            # A corrupt or forged record: what came before it is good, the stream is not.
            self._broken = exc
            if not pieces:
                raise trio.BrokenResourceError(f"TLS failed: {exc}") from exc
        if pieces:
            return pieces[0] if len(pieces) == 1 else b"".join(pieces)
        return b"" if self._end_of_stream else None

    async def _receive_into_bio(self) -> None:
        """One read of the transport into the incoming BIO (its end marked there, for OpenSSL to judge)."""
        try:
            data = await self.transport_stream.receive_some(RECEIVE_CHUNK)
        except (trio.BrokenResourceError, OSError) as exc:
            self._broken = exc
            raise trio.BrokenResourceError(f"the connection failed: {exc}") from exc
        if data:
            self._incoming.write(data)
        else:
            self._transport_ended = True
            self._incoming.write_eof()

    async def _flush(self) -> None:
        """Send what OpenSSL wrote; a send cut short (cancelled or failed) breaks the stream for good."""
        if not self._outgoing.pending:
            return
        ciphertext = self._outgoing.read()
        completed = False
        try:
            await self.transport_stream.send_all(ciphertext)
            completed = True
        except (trio.BrokenResourceError, OSError) as exc:
            raise trio.BrokenResourceError(f"the connection failed: {exc}") from exc
        finally:
            if not completed and self._broken is None:
                self._broken = trio.BrokenResourceError("a send was cut short: the TLS stream is out of step")

    async def _fail(self, exc: ssl.SSLError) -> None:
        """A TLS failure: tell the peer if OpenSSL wrote an alert (best effort), then raise it."""
        self._broken = exc
        try:
            await self._flush()
        except trio.BrokenResourceError:
            pass
        raise trio.BrokenResourceError(f"TLS failed: {exc}") from exc
