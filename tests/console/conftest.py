"""Fixtures for the web console's tests: the console served on a free port of this process (its own trio thread,
hypercorn as in ``kbroker console``) over a cluster, and a tiny HTTP client (the standard library's)."""

from __future__ import annotations

import http.client
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html import unescape
from html.parser import HTMLParser
from urllib.parse import urlencode

import pytest
import trio

from kbroker.commands.connection import ClientSettings
from kbroker.console.app import serve
from kbroker.console.cluster import Cluster


@dataclass
class Page:
    status: int
    headers: dict[str, str]
    text: str


class ConsoleServer:
    """The console over ``bootstrap`` on 127.0.0.1 and a free port, until ``stop``."""

    def __init__(self, bootstrap: str, properties: dict[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.properties = properties or {}
        self.port = 0
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel: trio.CancelScope | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kbroker-console", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            with trio.CancelScope() as scope:
                self._cancel = scope
                self._token = trio.lowlevel.current_trio_token()
                async with trio.open_nursery() as nursery:
                    cluster = Cluster(ClientSettings(self.bootstrap, self.properties))
                    _, self.port = await nursery.start(serve, cluster, "127.0.0.1", 0)
                    self._ready.set()

        try:
            trio.run(main)
        except BaseException as exc:  # shown by start(), which waits for readiness
            self._error = exc
            self._ready.set()

    def start(self) -> ConsoleServer:
        self._thread.start()
        assert self._ready.wait(30), "the console did not start"
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._token is not None and self._cancel is not None:
            cancel = self._cancel
            try:
                trio.from_thread.run_sync(cancel.cancel, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        self._thread.join(30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(
        self, method: str, path: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> Page:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            body = urlencode(form) if form is not None else None
            sent = dict(headers or {})
            if body is not None:
                sent["Content-Type"] = "application/x-www-form-urlencoded"
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            return Page(response.status, dict(response.getheaders()), response.read().decode())
        finally:
            connection.close()

    def get(self, path: str) -> Page:
        return self.request("GET", path)

    def post(self, path: str, form: dict[str, str], headers: dict[str, str] | None = None) -> Page:
        return self.request("POST", path, form, headers)


ConsoleFactory = Callable[..., ConsoleServer]


@pytest.fixture
def console_factory() -> Iterator[ConsoleFactory]:
    """``console_factory(bootstrap, properties=None)``: a started console over that cluster (client properties as
    in a --command-config file), stopped after the test."""
    started: list[ConsoleServer] = []

    def start(bootstrap: str, properties: dict[str, str] | None = None) -> ConsoleServer:
        server = ConsoleServer(bootstrap, properties).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


class _Tables(HTMLParser):
    """Collects each table's body rows (cell texts, whitespace kept) by the table's id; the record browser's notes
    ("not JSON") are left out of the cell text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._in_body = False
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._in_note = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "span" and dict(attrs).get("class") == "note":
            self._in_note = True
        elif tag == "table":
            self._table = dict(attrs).get("id") or ""
            self.tables[self._table] = []
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "span":
            self._in_note = False
        elif tag == "td" and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "tbody":
            self._in_body = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None and not self._in_note:
            self._cell.append(data)


def table_rows(html: str, table_id: str) -> list[list[str]]:
    """The body rows of the table with this id, each a list of its cells' text (entities decoded)."""
    parser = _Tables()
    parser.feed(html)
    return parser.tables[table_id]


def element_text(html: str, element_id: str) -> str:
    """The text of the element with this id (its first text run), entities decoded."""
    match = re.search(rf'id="{re.escape(element_id)}"[^>]*>([^<]*)<', html)
    assert match is not None, f"no element with id {element_id!r}"
    return unescape(match.group(1))
