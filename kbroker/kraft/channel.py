"""A request channel to one node of the controller quorum: Kafka's NodeToControllerChannelManager in miniature.

One request at a time (a broker's control-plane traffic is a heartbeat every couple of seconds and a metadata
fetch in flight, each on its own channel), over a trio stream opened on first use and again after a failure. On
connecting, ApiVersions tells which versions the node serves, and each request goes at the newest version both
sides know. A failure of the connection closes it and raises ``ChannelError``: the caller decides whether and
where to try again (another voter, after a back-off).

Every connection this broker opens to another node (controllers and brokers alike) is one of these, secured as
its ``NodeSecurity`` says (kbroker/kraft/node_security.py): TLS first, then ApiVersions, then SASL (SaslHandshake
and SaslAuthenticate, as Kafka's clients order them), the mechanisms' client side being kafka-python's. A SASL
session with a lifetime (the server's connections.max.reauth.ms, KIP-368) is not re-authenticated in place: the
connection is opened afresh before its lifetime runs out, as the server would close it after.
"""

from __future__ import annotations

import ssl
from typing import Any

import trio

from kbroker import __version__
from kbroker.kraft.node_security import PLAINTEXT_NODE, NodeSecurity
from protocol._codec import Message
from protocol.exceptions import DecodeError
from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages import APIS
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.api_versions_response import ApiVersionsResponse
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_authenticate_response import SaslAuthenticateResponse
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest
from protocol.messages.sasl_handshake_response import SaslHandshakeResponse

API_VERSIONS_VERSION = 3  # the first flexible one; every KRaft-era node serves it
MAX_RESPONSE_BYTES = 100 * 1024 * 1024
REAUTHENTICATE_FRACTION = 0.85  # of a SASL session's lifetime: reconnect after this much of it (Kafka's clients
# re-authenticate between 85% and 95%)


class ChannelError(Exception):
    """The node could not be reached, closed the connection, or answered something unreadable."""


class ChannelAuthenticationError(ChannelError):
    """TLS or SASL with the node failed: its certificate, the trust store or the credentials need fixing."""


class _Refused(ConnectionError):
    """The TLS handshake or the SASL login failed (raised as ChannelAuthenticationError)."""


class NodeChannel:
    """Requests to one ``host:port``, answered in order."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str,
        connect_timeout: float = 5.0,
        security: NodeSecurity = PLAINTEXT_NODE,
    ) -> None:
        self.host = host
        self.port = port
        self.security = security
        self._client_id = client_id
        self._connect_timeout = connect_timeout
        self._stream: trio.abc.Stream | None = None
        self._session_ends = float("inf")  # trio time to reconnect at: before a SASL session's lifetime ends
        self._frames = FrameBuffer(MAX_RESPONSE_BYTES)
        self._correlation_id = 0
        self._lock = trio.Lock()
        self.versions: dict[int, tuple[int, int]] = {}  # api key -> (min, max) the node serves
        self.finalized_features: dict[str, int] = {}  # feature -> level, as the node's ApiVersions answered

    def __repr__(self) -> str:
        return f"NodeChannel({self.host}:{self.port})"

    def version_for(self, api_key: int) -> int:
        """The newest version of ``api_key`` that this code and the node both know; ChannelError if none."""
        ours = APIS[api_key].valid_versions
        theirs = self.versions.get(api_key)
        if theirs is None or theirs[1] < ours[0] or ours[1] < theirs[0]:
            raise ChannelError(f"{self.host}:{self.port} does not serve {APIS[api_key].name} in versions {ours}")
        return min(ours[1], theirs[1])

    async def request(self, body: Message, version: int | None = None) -> Message:
        """Send ``body`` (at ``version``, or the newest both sides know) and return the decoded answer."""
        async with self._lock:
            try:
                if self._stream is not None and trio.current_time() >= self._session_ends:
                    await self._close()
                if self._stream is None:
                    try:
                        await self._connect()
                    except BaseException:  # failed or cancelled half-way: never left half-connected (unauthenticated)
                        await self._close()
                        raise
                chosen = self.version_for(body.API_KEY) if version is None else version
                return await self._exchange(body, chosen)
            except (
                OSError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                trio.TooSlowError,
                DecodeError,
                ConnectionError,
            ) as exc:
                await self._close()
                error = ChannelAuthenticationError if isinstance(exc, _Refused) else ChannelError
                raise error(f"{self.host}:{self.port}: {_reason(exc)}") from exc

    async def _connect(self) -> None:
        self._session_ends = float("inf")
        with trio.fail_after(self._connect_timeout):
            stream: trio.abc.Stream = await trio.open_tcp_stream(self.host, self.port)
            self._stream = stream
            if self.security.ssl_context is not None:
                self._stream = tls = trio.SSLStream(stream, self.security.ssl_context, server_hostname=self.host)
                try:
                    await tls.do_handshake()
                except trio.BrokenResourceError as exc:
                    if isinstance(exc.__cause__, ssl.SSLError):
                        raise _Refused(_reason(exc)) from exc
                    raise
        self._frames = FrameBuffer(MAX_RESPONSE_BYTES)
        # v3+ must name the client software (Kafka answers INVALID_REQUEST to an empty name).
        hello = ApiVersionsRequest(client_software_name="kbroker", client_software_version=__version__)
        answer = await self._exchange(hello, API_VERSIONS_VERSION)
        assert isinstance(answer, ApiVersionsResponse)
        if answer.error_code != 0:
            raise ConnectionError(f"ApiVersions answered error {answer.error_code}")
        self.versions = {key.api_key: (key.min_version, key.max_version) for key in answer.api_keys}
        self.finalized_features = {f.name: f.max_version_level for f in answer.finalized_features}
        if self.security.sasl_mechanism is not None:
            with trio.fail_after(self._connect_timeout):
                await self._authenticate(self.security)

    async def _authenticate(self, security: NodeSecurity) -> None:
        """SASL as Kafka's clients do it: SaslHandshake names the mechanism, then its tokens go in SaslAuthenticate
        until it is done; a refusal raises ConnectionError with the server's reason."""
        from kafka.net.sasl import get_sasl_mechanism

        mechanism = security.sasl_mechanism
        assert mechanism is not None
        handshake = await self._exchange(
            SaslHandshakeRequest(mechanism=mechanism), self.version_for(SaslHandshakeRequest.API_KEY)
        )
        assert isinstance(handshake, SaslHandshakeResponse)
        if handshake.error_code != 0:
            raise _Refused(
                f"SASL {mechanism} is not enabled on the {security.listener} listener there "
                f"(it enables {', '.join(handshake.mechanisms) or 'none'})"
            )
        client: Any = get_sasl_mechanism(mechanism)(
            sasl_mechanism=mechanism, sasl_plain_username=security.username, sasl_plain_password=security.password
        )
        version = self.version_for(SaslAuthenticateRequest.API_KEY)
        lifetime_ms = 0
        while not client.is_done():
            answer = await self._exchange(SaslAuthenticateRequest(auth_bytes=client.auth_bytes()), version)
            assert isinstance(answer, SaslAuthenticateResponse)
            if answer.error_code != 0:
                raise _Refused(
                    f"SASL {mechanism} authentication as {security.username!r} failed: "
                    f"{answer.error_message or f'error {answer.error_code}'}"
                )
            lifetime_ms = answer.session_lifetime_ms
            try:
                client.receive(answer.auth_bytes)
            except (ValueError, KeyError, UnicodeDecodeError) as exc:  # e.g. a SCRAM server signature that is wrong
                raise _Refused(f"SASL {mechanism}: the server's answer is not valid: {exc}") from None
        if not client.is_authenticated():
            raise _Refused(f"SASL {mechanism} authentication as {security.username!r} failed")
        if lifetime_ms > 0:
            self._session_ends = trio.current_time() + lifetime_ms / 1000 * REAUTHENTICATE_FRACTION

    async def _exchange(self, body: Message, version: int) -> Message:
        assert self._stream is not None
        self._correlation_id += 1
        await self._stream.send_all(encode_request(body, version, self._correlation_id, client_id=self._client_id))
        while (frame := self._frames.next_frame()) is None:
            with self._frames.read_buffer() as target:
                data = await self._stream.receive_some(len(target))
                target[: len(data)] = data
            if not data:
                raise ConnectionError("the node closed the connection")
            self._frames.commit(len(data))
        correlation_id, answer = decode_response(frame, body.API_KEY, version)
        if correlation_id != self._correlation_id:
            raise ConnectionError(f"correlation id {correlation_id}, expected {self._correlation_id}")
        return answer

    async def _close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()

    async def aclose(self) -> None:
        async with self._lock:
            await self._close()


def _reason(exc: BaseException) -> str:
    """A failure in words: a TLS error is what OpenSSL said (trio wraps it in BrokenResourceError)."""
    cause = exc.__cause__
    if isinstance(exc, trio.BrokenResourceError) and isinstance(cause, ssl.SSLError):
        return f"TLS: {getattr(cause, 'verify_message', None) or cause.reason or cause}"
    if isinstance(exc, trio.TooSlowError):
        return "timed out connecting"
    return str(exc) or type(exc).__name__
