"""The web console: server-rendered pages (Starlette + Jinja2) over a cluster read as a Kafka client.

``kbroker console --bootstrap ... --listen HOST:PORT`` runs it against any Kafka-compatible cluster, and
``kbroker serve --console HOST:PORT`` runs the same code inside the broker (ConsoleService, one of kbroker.app's
services), talking to the broker's own PLAINTEXT listener. Hypercorn's trio worker serves it.

Pages: the cluster overview, topics (list, detail, create, delete with a confirmation), a message browser and
consumer groups with their lag. kafka-python is blocking, so each cluster call runs on a worker thread
(kbroker/console/cluster.py holds the clients). A failure becomes a page with the broker's error code name and
message, never a traceback. Jinja's autoescape is on for every template: record contents are untrusted.
"""

from __future__ import annotations

import datetime
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, quote, urlencode

import jinja2
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from kbroker.commands.connection import ClientSettings, broker_error_line, failure_line, kafka_error_name
from kbroker.config import ConfigError
from kbroker.console import formats
from kbroker.console.cluster import BROWSE_LIMIT, Cluster

if TYPE_CHECKING:
    from kbroker.broker import Broker
    from kbroker.server.listeners import ListenerSpec

log = logging.getLogger("kbroker.console")

HERE = Path(__file__).parent
T = TypeVar("T")
MAX_FORM_BYTES = 1 << 20  # a create-topic form with its configs is far smaller
MAX_INT64 = 2**63 - 1  # offsets and timestamps are int64 on the wire: a larger number cannot be sent

# Kafka error code names a page answers with a 4xx status (the rest: 502, the cluster failed).
NOT_FOUND_ERRORS = frozenset({"UNKNOWN_TOPIC_OR_PARTITION", "UNKNOWN_TOPIC_ID", "GROUP_ID_NOT_FOUND"})
CONFLICT_ERRORS = frozenset({"TOPIC_ALREADY_EXISTS", "NON_EMPTY_GROUP"})
BAD_REQUEST_PREFIXES = ("INVALID_", "POLICY_VIOLATION", "UNSUPPORTED_", "TOPIC_DELETION_DISABLED")


class BadInput(Exception):
    """A form field or query parameter the page cannot use (HTTP 400, this message)."""


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name: record keys, values and names are untrusted
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["bytes"] = human_bytes
    env.filters["urlpart"] = lambda text: quote(str(text), safe="")
    env.filters["number"] = lambda n: "-" if n is None else f"{n:,}"
    env.globals["formats"] = formats.FORMATS
    env.globals["show"] = formats.show
    return env


def human_bytes(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover - the loop returns


class Console:
    """The pages over one Cluster."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.env = environment()

    # --- plumbing ------------------------------------------------------------------------------------------------

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("nav", "")
        html = self.env.get_template(template).render(
            request=request, bootstrap=self.cluster.settings.bootstrap, **context
        )
        return HTMLResponse(html, status_code=status)

    def error_page(self, request: Request, status: int, title: str, message: str) -> HTMLResponse:
        return self.page(request, "error.html", status, title=title, message=message, http_status=status)

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking cluster call on a worker thread (the Cluster lets one call use a client at a time)."""
        return await trio.to_thread.run_sync(partial(function, *args, **kwargs))

    def failure(self, request: Request, exc: Exception) -> HTMLResponse:
        """The page for a failed cluster call: the broker's error code name and message, with a fitting status."""
        status, title, message = describe_failure(exc)
        if status >= 500:
            log.warning("console: %s %s: %s", request.method, request.url.path, message)
        return self.error_page(request, status, title, message)

    def routes(self) -> list[Route | Mount]:
        def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
            async def endpoint(request: Request) -> Response:
                if request.method == "POST" and not same_origin(request):
                    return self.error_page(request, 403, "Forbidden", "a form from another site cannot change topics")
                try:
                    return await handler(request)
                except BadInput as exc:
                    return self.error_page(request, 400, "Bad request", str(exc))
                except Exception as exc:  # a cluster failure, shown with its error code name
                    return self.failure(request, exc)

            return endpoint

        return [
            Route("/", guarded(self.overview_page), name="overview"),
            Route("/topics", guarded(self.topics_page), name="topics"),
            Route("/create-topic", guarded(self.create_topic_page), methods=["GET", "POST"], name="create_topic"),
            Route("/topics/{name}", guarded(self.topic_page), name="topic"),
            Route("/topics/{name}/messages", guarded(self.messages_page), name="messages"),
            Route("/topics/{name}/delete", guarded(self.delete_topic_page), methods=["GET", "POST"], name="delete"),
            Route("/groups", guarded(self.groups_page), name="groups"),
            Route("/groups/{group_id:path}", guarded(self.group_page), name="group"),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]

    # --- pages ---------------------------------------------------------------------------------------------------

    async def overview_page(self, request: Request) -> Response:
        overview = await self.call(self.cluster.overview)
        return self.page(request, "overview.html", overview=overview, nav="overview")

    async def topics_page(self, request: Request) -> Response:
        topics = await self.call(self.cluster.topics)
        return self.page(request, "topics.html", topics=topics, nav="topics")

    async def topic_page(self, request: Request) -> Response:
        detail = await self.call(self.cluster.topic, request.path_params["name"])
        return self.page(request, "topic.html", topic=detail, nav="topics")

    async def messages_page(self, request: Request) -> Response:
        name = request.path_params["name"]
        query = request.query_params
        fmt = query.get("format", "text")
        if fmt not in formats.FORMATS:
            raise BadInput(f"format must be one of {', '.join(formats.FORMATS)}, got {fmt!r}")
        mode = query.get("mode", "offset")
        if mode not in ("offset", "timestamp", "newest"):
            raise BadInput(f"mode must be offset, timestamp or newest, got {mode!r}")
        partition = whole_number(query.get("partition", "0"), "partition")
        count = whole_number(query.get("count", "20"), "count", low=1, high=BROWSE_LIMIT)
        offset = whole_number(query["offset"], "offset", high=MAX_INT64) if query.get("offset") else None
        timestamp_text = query.get("timestamp", "").strip()
        timestamp_ms = parse_timestamp(timestamp_text) if mode == "timestamp" else None
        if mode == "timestamp" and timestamp_ms is None:
            raise BadInput("timestamp: give a date and time (UTC), e.g. 2024-05-01T12:00:00, or milliseconds")
        described = await self.call(self.cluster.topic, name)
        browsed = await self.call(
            self.cluster.browse,
            name,
            partition,
            offset=offset if mode == "offset" else None,
            timestamp_ms=timestamp_ms,
            newest=mode == "newest",
            count=count,
        )
        form = {
            "partition": partition,
            "mode": mode,
            "offset": "" if offset is None else offset,
            "timestamp": timestamp_text,
            "count": count,
            "format": fmt,
        }
        next_link = None
        if browsed.records and browsed.records[-1].offset + 1 < browsed.end_offset:
            next_query = {**form, "mode": "offset", "offset": browsed.records[-1].offset + 1, "timestamp": ""}
            next_link = f"/topics/{quote(name, safe='')}/messages?{urlencode(next_query)}"
        return self.page(
            request,
            "messages.html",
            topic=described.summary,
            browsed=browsed,
            form=form,
            fmt=fmt,
            next_link=next_link,
            nav="topics",
        )

    async def create_topic_page(self, request: Request) -> Response:
        if request.method == "GET":
            return self.page(request, "create_topic.html", form={}, error=None, nav="create")
        data = await form_fields(request)
        form = {key: data.get(key, "") for key in ("name", "partitions", "replication_factor", "configs")}
        try:
            name = form["name"].strip()
            if not name:
                raise BadInput("name: a topic needs a name")
            partitions = whole_number(form["partitions"] or "-1", "partitions", low=-1)
            replication = whole_number(form["replication_factor"] or "-1", "replication factor", low=-1)
            configs = parse_configs(form["configs"])
            await self.call(self.cluster.create_topic, name, partitions, replication, configs)
        except BadInput as exc:
            return self.page(request, "create_topic.html", 400, form=form, error=str(exc), nav="create")
        except Exception as exc:
            status, title, message = describe_failure(exc)
            return self.page(request, "create_topic.html", status, form=form, error=message, nav="create")
        return RedirectResponse(f"/topics/{quote(name, safe='')}", status_code=303)

    async def delete_topic_page(self, request: Request) -> Response:
        name = request.path_params["name"]
        if request.method == "GET":
            detail = await self.call(self.cluster.topic, name)  # 404 for a topic that is not there
            return self.page(request, "delete_topic.html", topic=detail.summary, error=None, nav="topics")
        data = await form_fields(request)
        if data.get("confirm", "") != name:
            detail = await self.call(self.cluster.topic, name)
            message = "type the topic's name to confirm: nothing was deleted"
            return self.page(request, "delete_topic.html", 400, topic=detail.summary, error=message, nav="topics")
        await self.call(self.cluster.delete_topic, name)
        return RedirectResponse(f"/topics?{urlencode({'deleted': name})}", status_code=303)

    async def groups_page(self, request: Request) -> Response:
        groups = await self.call(self.cluster.groups)
        return self.page(request, "groups.html", groups=groups, nav="groups")

    async def group_page(self, request: Request) -> Response:
        group = await self.call(self.cluster.group, request.path_params["group_id"])
        return self.page(request, "group.html", group=group, nav="groups")


def describe_failure(exc: BaseException) -> tuple[int, str, str]:
    """(HTTP status, title, one line) for a failed cluster call: the Kafka error code name leads the line."""
    import kafka.errors as kafka_errors

    if isinstance(exc, kafka_errors.BrokerResponseError):
        name = kafka_error_name(exc.errno, str(exc.message))
        status = 502
        if name in NOT_FOUND_ERRORS:
            status = 404
        elif name in CONFLICT_ERRORS:
            status = 409
        elif name.endswith("_AUTHORIZATION_FAILED"):
            status = 403
        elif name.startswith(BAD_REQUEST_PREFIXES):
            status = 400
        return status, name, broker_error_line(exc)
    other = failure_line(exc) if isinstance(exc, Exception) else None
    if other is not None:  # no broker reachable, a timeout, a bad command config
        return 503, "The cluster did not answer", other
    log.exception("console: unexpected failure", exc_info=exc)
    return 500, "Internal error", f"{type(exc).__name__} (details in the console's log)"


def same_origin(request: Request) -> bool:
    """A form POST from this console's own pages (a browser sends Origin; a page elsewhere cannot forge it)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True  # not from a browser form, or a browser that sends none: nothing cross-site to stop
    return origin == f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"


async def form_fields(request: Request) -> dict[str, str]:
    """A posted form's fields (application/x-www-form-urlencoded, as the console's forms send), first value each."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise BadInput(f"the form is larger than {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise BadInput("the form is not UTF-8") from None
    return {key: values[0] for key, values in fields.items()}


def whole_number(text: str, what: str, low: int = 0, high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise BadInput(f"{what} must be a whole number, got {text!r}") from None
    if value < low or (high is not None and value > high):
        bounds = f"{low}..{high}" if high is not None else f"{low} or more"
        raise BadInput(f"{what} must be {bounds}, got {value}")
    return value


def parse_timestamp(text: str) -> int | None:
    """Milliseconds since the epoch from digits, or from an ISO 8601 date and time (UTC unless it says)."""
    if not text:
        return None
    if text.isdigit():
        value = int(text)
        return value if value <= MAX_INT64 else None  # ListOffsets carries an int64: more cannot be sent
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def parse_configs(text: str) -> dict[str, str]:
    """KEY=VALUE lines (blank lines and # comments skipped), as topic configs for CreateTopics."""
    configs: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"configs line {number}: expected KEY=VALUE, got {line!r}")
        configs[key.strip()] = value.strip()
    return configs


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")


def allowed_hosts(bound_host: str) -> list[str]:
    """The Host headers the console answers: on a loopback address only loopback names, so that a web page whose
    name is rebound to 127.0.0.1 (DNS rebinding) cannot drive it from the user's browser; on a given address that
    address too; on every interface (0.0.0.0, ::) any name, since the console cannot know which the users type."""
    if bound_host in ("0.0.0.0", "::", ""):
        return ["*"]
    hosts = list(LOOPBACK_HOSTS)
    if bound_host not in hosts:
        hosts.append(f"[{bound_host}]" if ":" in bound_host else bound_host)
    return hosts


def create_app(cluster: Cluster, hosts: Sequence[str] = ("*",)) -> Starlette:
    """The console's ASGI app over ``cluster``, answering requests for ``hosts`` (allowed_hosts) only; unknown pages
    and methods get the plain error page."""
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    console = Console(cluster)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "Error")
        return console.error_page(request, exc.status_code, title, f"{request.method} {request.url.path}")

    async def internal_error(request: Request, exc: Exception) -> Response:
        try:
            return console.failure(request, exc)
        except Exception:  # the error page itself failed: plain text, never a traceback
            log.exception("console: the error page failed")
            return PlainTextResponse("500 Internal error (details in the console's log)", status_code=500)

    app = Starlette(
        routes=console.routes(),
        exception_handlers={HTTPException: http_error, 500: internal_error},
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts))],
    )
    app.state.console = console
    return app


# --- serving -----------------------------------------------------------------------------------------------------


def bind(host: str, port: int) -> socket.socket:
    """The console's listening socket; OSError naming the address if it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"web console: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


async def serve(
    cluster: Cluster,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the console on host:port until cancelled; reports the bound (host, port)."""
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    sock = bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn takes the descriptor over
    config.accesslog = None
    http_log = logging.getLogger("kbroker.console.http")
    if http_log.level == logging.NOTSET:  # hypercorn's "Running on" repeats the line below: its warnings only
        http_log.setLevel(logging.WARNING)
    config.errorlog = http_log
    config.graceful_timeout = 1.0
    try:
        async with trio.open_nursery() as nursery:
            # Starlette is an ASGI app; hypercorn's type names the protocol only.
            asgi_app: Any = create_app(cluster, allowed_hosts(bound_host))
            await nursery.start(partial(hypercorn_serve, asgi_app, config, mode="asgi"))
            shown_host = "127.0.0.1" if bound_host in ("0.0.0.0", "::") else bound_host
            log.info("web console on http://%s:%d (cluster %s)", shown_host, bound_port, cluster.settings.bootstrap)
            task_status.started((bound_host, bound_port))
    finally:
        cluster.close()


class ConsoleService:
    """``kbroker serve --console HOST:PORT``: the console as one of the broker's services, reading the broker
    through its own PLAINTEXT listener (the same code as ``kbroker console``)."""

    def __init__(self, bootstrap: str | None, host: str, port: int) -> None:
        self.bootstrap = bootstrap
        self.host = host
        self.port = port
        self.address: tuple[str, int] | None = None  # bound, once running

    @classmethod
    def for_broker(cls, broker: Broker, listeners: Sequence[ListenerSpec], address: tuple[str, int]) -> ConsoleService:
        plaintext = [spec for spec in listeners if spec.security_protocol == "PLAINTEXT"]
        bootstrap = None
        if plaintext:
            advertised = broker.advertised_by_listener.get(plaintext[0].name, broker.advertised)
            bootstrap = f"{advertised.host}:{advertised.port}"
        return cls(bootstrap, *address)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from kbroker import __version__

        if self.bootstrap is None:
            raise ConfigError(
                "--console reads the broker through a PLAINTEXT listener and this broker has none; "
                "run `kbroker console --bootstrap HOST:PORT --command-config FILE` with the client settings instead"
            )
        # The console's own clients inside the broker: their failures show on its pages, so kafka-python's log
        # lines (a connection closed as the broker drains) would only add noise to the broker's log.
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
        cluster = Cluster(ClientSettings(self.bootstrap), software=f"kbroker {__version__}")
        async with trio.open_nursery() as nursery:
            self.address = await nursery.start(partial(serve, cluster, self.host, self.port))
            task_status.started()
