"""A minimal blocking Kafka client speaking protocol/ messages: for tests, tools and health checks.

It sends one request at a time and returns the decoded response body; it does none of a real client's
work (metadata, retries, batching). Tests use it to put exact requests on the wire and check exact answers.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

from protocol.framing import FrameBuffer, decode_response, encode_request


class WireClient:
    def __init__(
        self,
        bootstrap: str,
        timeout: float = 10.0,
        client_id: str = "kbroker-wire-client",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        host, _, port = bootstrap.rpartition(":")
        self._sock = socket.create_connection((host, int(port)), timeout=timeout)
        if ssl_context is not None:  # an SSL or SASL_SSL listener
            self._sock = ssl_context.wrap_socket(self._sock, server_hostname=host)
        self._frames = FrameBuffer()
        self._client_id = client_id
        self._correlation_id = 0

    def request(self, body: Any, version: int) -> Any:
        """Send ``body`` (a protocol.messages request) as ``version`` and return the response body."""
        self._correlation_id += 1
        api_key = body.API_KEY
        self._sock.sendall(encode_request(body, version, self._correlation_id, client_id=self._client_id))
        correlation_id, response = decode_response(self._next_frame(), api_key, version)
        if correlation_id != self._correlation_id:
            raise ConnectionError(f"correlation id {correlation_id}, expected {self._correlation_id}")
        return response

    def exchange_token(self, token: bytes) -> bytes:
        """A bare size-prefixed SASL token out and one back: the exchange after SaslHandshake v0."""
        self._sock.sendall(len(token).to_bytes(4, "big") + token)
        return bytes(self._next_frame())

    def _next_frame(self) -> bytearray:
        while (frame := self._frames.next_frame()) is None:
            with self._frames.read_buffer() as target:  # released before the buffer may grow again
                count = self._sock.recv_into(target)
            if not count:
                raise ConnectionError("the broker closed the connection")
            self._frames.commit(count)
        return frame

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
