"""The Prometheus endpoint: ``GET /metrics`` over HTTP/1.1 on ``kbroker.metrics.listen`` (``--metrics-listen``).

A broker service (kbroker/services.py's shape: ``run(task_status)``), started by kbroker/app.py only when the
key is set, so a broker without it never imports prometheus_client or h11. Each scrape reads the broker's
counters and state on the event loop (kbroker/metrics.py: what every metric means) and renders them with
prometheus_client's text exposition, with prometheus_client's process metrics (CPU, memory, descriptors).

HTTP is parsed by h11 (hypercorn's parser): a malformed request is answered 400, a path other than
``/metrics`` 404, a method other than GET or HEAD 405, and the connection closes; keep-alive is served for
scrapers that reuse their connection, which is closed after ``IDLE_SECONDS`` without a request. A failure in
one connection is logged and ends that connection only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import h11
import trio
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector

from kbroker.metrics import families

if TYPE_CHECKING:
    from kbroker.broker import Broker

log = logging.getLogger("kbroker.metrics")

PATH = "/metrics"
IDLE_SECONDS = 60.0  # a kept-alive connection with no request for this long is closed
MAX_REQUEST_HEAD = 16 * 1024  # bytes of request line and headers: more is a bad request
READ_SIZE = 16 * 1024


class BrokerCollector:
    """prometheus_client's view of a broker: its metrics (kbroker/metrics.py) and the process's."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.process = ProcessCollector(registry=None)

    def collect(self) -> Iterable[Metric]:
        for family in families(self.broker):
            metric = Metric(family.name, family.help, family.kind)
            for sample in family.samples:
                metric.add_sample(family.name + sample.suffix, sample.labels, sample.value)
            yield metric
        yield from self.process.collect()

    def render(self) -> bytes:
        return generate_latest(self)


def split_host_port(address: str) -> tuple[str | None, int]:
    """``HOST:PORT`` as kbroker.metrics.listen holds it (already checked); no host: every interface (None)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or None, int(port)


class MetricsEndpoint:
    """Serves ``GET /metrics`` for one broker; ``address`` is where it listens once started."""

    def __init__(self, broker: Broker, address: str) -> None:
        self.broker = broker
        self.host, self.port = split_host_port(address)
        self.collector = BrokerCollector(broker)
        self.address: tuple[str, int] | None = None  # (host, port) bound, once running
        self.scrapes = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        except OSError as exc:
            from kbroker.app import ListenError  # the composition root's one-line start-up error

            where = f"{self.host or '0.0.0.0'}:{self.port}"
            raise ListenError(f"--metrics-listen: cannot listen on {where}: {exc.strerror or exc}") from exc
        bound = listeners[0].socket.getsockname()
        self.address = (bound[0], bound[1])
        log.info("metrics at http://%s:%d%s", bound[0], bound[1], PATH)
        async with trio.open_nursery() as connections:
            task_status.started()
            await trio.serve_listeners(self._serve_connection, listeners, handler_nursery=connections)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        try:
            async with stream:
                await self._serve_requests(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError):
            pass  # the scraper went away
        except Exception:  # noqa: BLE001 - one connection's failure never stops the endpoint or the broker
            log.exception("metrics connection failed")

    async def _serve_requests(self, stream: trio.SocketStream) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD)
        while True:
            try:
                request = await self._next_request(stream, connection)
            except h11.RemoteProtocolError as exc:
                if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await self._respond(stream, connection, exc.error_status_hint, f"bad request: {exc}\n")
                return
            if request is None:
                return
            await self._answer(stream, connection, request)
            if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                return  # not kept alive (Connection: close, HTTP/1.0, or a body we did not read)
            connection.start_next_cycle()

    async def _next_request(self, stream: trio.SocketStream, connection: h11.Connection) -> h11.Request | None:
        """The next request with its (ignored) body read; None at end of stream or after IDLE_SECONDS."""
        request: h11.Request | None = None
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = b""
                with trio.move_on_after(IDLE_SECONDS):
                    data = await stream.receive_some(READ_SIZE)
                if not data and request is None:
                    return None
                connection.receive_data(data)  # b"": end of stream; h11 raises if a request was cut short
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed):
                return None
            # h11.Data (a body sent with GET): read and ignored

    async def _answer(self, stream: trio.SocketStream, connection: h11.Connection, request: h11.Request) -> None:
        method = request.method.decode("ascii", "replace")
        path = request.target.decode("ascii", "replace").partition("?")[0]
        if path != PATH:
            await self._respond(stream, connection, 404, f"not found: {path} (metrics are at {PATH})\n")
        elif method not in ("GET", "HEAD"):
            await self._respond(stream, connection, 405, f"{method} is not allowed: GET {PATH}\n", allow=True)
        else:
            self.scrapes += 1
            body = self.collector.render()
            await self._respond(
                stream, connection, 200, body, content_type=CONTENT_TYPE_LATEST, head_only=method == "HEAD"
            )

    async def _respond(
        self,
        stream: trio.SocketStream,
        connection: h11.Connection,
        status: int,
        body: bytes | str,
        *,
        content_type: str = "text/plain; charset=utf-8",
        head_only: bool = False,
        allow: bool = False,
    ) -> None:
        payload = body.encode() if isinstance(body, str) else body
        headers = [("Content-Type", content_type), ("Content-Length", str(len(payload)))]
        if allow:
            headers.append(("Allow", "GET, HEAD"))
        if status >= 400:
            headers.append(("Connection", "close"))
        chunks = [connection.send(h11.Response(status_code=status, headers=headers))]
        if not head_only:
            chunks.append(connection.send(h11.Data(data=payload)))
        chunks.append(connection.send(h11.EndOfMessage()))
        await stream.send_all(b"".join(chunk for chunk in chunks if chunk))
