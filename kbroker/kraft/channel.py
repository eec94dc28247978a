"""A request channel to one node of the controller quorum: Kafka's NodeToControllerChannelManager in miniature.

One request at a time (a broker's control-plane traffic is a heartbeat every couple of seconds and a metadata
fetch in flight, each on its own channel), over a trio stream opened on first use and again after a failure. On
connecting, ApiVersions tells which versions the node serves, and each request goes at the newest version both
sides know. A failure of the connection closes it and raises ``ChannelError``: the caller decides whether and
where to try again (another voter, after a back-off).
"""

from __future__ import annotations

import trio

from kbroker import __version__
from protocol._codec import Message
from protocol.exceptions import DecodeError
from protocol.framing import FrameBuffer, decode_response, encode_request
from protocol.messages import APIS
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.api_versions_response import ApiVersionsResponse

API_VERSIONS_VERSION = 3  # the first flexible one; every KRaft-era node serves it
MAX_RESPONSE_BYTES = 100 * 1024 * 1024


class ChannelError(Exception):
    """The node could not be reached, closed the connection, or answered something unreadable."""


class NodeChannel:
    """Requests to one ``host:port``, answered in order."""

    def __init__(self, host: str, port: int, *, client_id: str, connect_timeout: float = 5.0) -> None:
        self.host = host
        self.port = port
        self._client_id = client_id
        self._connect_timeout = connect_timeout
        self._stream: trio.SocketStream | None = None
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
                if self._stream is None:
                    await self._connect()
                chosen = self.version_for(body.API_KEY) if version is None else version
                return await self._exchange(body, chosen)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, DecodeError, ConnectionError) as exc:
                await self._close()
                raise ChannelError(f"{self.host}:{self.port}: {exc or type(exc).__name__}") from exc

    async def _connect(self) -> None:
        with trio.fail_after(self._connect_timeout):
            self._stream = await trio.open_tcp_stream(self.host, self.port)
        self._frames = FrameBuffer(MAX_RESPONSE_BYTES)
        # v3+ must name the client software (Kafka answers INVALID_REQUEST to an empty name).
        hello = ApiVersionsRequest(client_software_name="kbroker", client_software_version=__version__)
        answer = await self._exchange(hello, API_VERSIONS_VERSION)
        assert isinstance(answer, ApiVersionsResponse)
        if answer.error_code != 0:
            raise ConnectionError(f"ApiVersions answered error {answer.error_code}")
        self.versions = {key.api_key: (key.min_version, key.max_version) for key in answer.api_keys}
        self.finalized_features = {f.name: f.max_version_level for f in answer.finalized_features}

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
