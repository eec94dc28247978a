"""``connections.max.idle.ms``: one task closes every connection on which no bytes moved for that long.

Kafka's Selector keeps its connections in order of last activity and, on each poll, closes the oldest once it
has been idle for ``connections.max.idle.ms`` (a negative value disables this). Activity is any bytes read
or written, so this is also Kafka's only read timeout: a request that stops arriving halfway is dropped
when the connection has been silent that long, and so is a client that stops reading its response.

``IdleReaper`` does the same for kbroker with one task for the whole server, not a timer per connection:
a connection records the time of its last activity (a float store per read or send, nothing more), and
the reaper sleeps until the earliest moment some connection could have been idle long enough, then closes
those that were. A connection whose request is being handled is not watched (``idle_since`` is None): a
handler is never cut off, whatever it waits for.

A byte every few minutes keeps a connection from ever being idle, and a request that trickles in that way holds
its connection for as long as its client likes. ``kbroker.request.receive.timeout.ms`` (negative: never) bounds
that: once the first bytes of a request have arrived, the rest must follow within that time or the connection
is closed. Kafka has no such setting; its clients give up on a request they have not had an answer to within
their ``request.timeout.ms`` (30 s by default), so a request still arriving after 60 s is one no client waits
for. The same task watches both clocks: a connection notes when its unfinished request began
(``receiving_since``), and the time spent handling a request, waiting for request memory or muted for a quota
is not counted (the clock restarts when reading resumes).
"""

from __future__ import annotations

import math
from typing import Protocol

import trio


class Watched(Protocol):
    """What the reaper needs of a connection."""

    @property
    def idle_since(self) -> float | None:
        """trio time of the last bytes read or sent; None while a request is being handled."""
        ...

    @property
    def receiving_since(self) -> float | None:
        """trio time the request still arriving began (or reading resumed); None when none is partly here."""
        ...

    def expire(self, setting: str) -> None:
        """Close: over ``setting`` (connections.max.idle.ms or kbroker.request.receive.timeout.ms)."""
        ...


IDLE_SETTING = "connections.max.idle.ms"
RECEIVE_SETTING = "kbroker.request.receive.timeout.ms"


class IdleReaper:
    """Closes the connections idle for ``idle_ms``, or receiving one request for ``receive_ms`` (negative: never)."""

    def __init__(self, idle_ms: int, receive_ms: int = -1) -> None:
        self.idle_seconds = idle_ms / 1000 if idle_ms >= 0 else math.inf
        self.receive_seconds = receive_ms / 1000 if receive_ms >= 0 else math.inf
        self._watched: set[Watched] = set()
        self.sweeps = 0  # times the reaper woke (for tests and diagnostics)

    @property
    def enabled(self) -> bool:
        return self.idle_seconds != math.inf or self.receive_seconds != math.inf

    def watch(self, connection: Watched) -> None:
        # A new connection expires no earlier than any wake-up already planned: nothing to reschedule.
        self._watched.add(connection)

    def forget(self, connection: Watched) -> None:
        self._watched.discard(connection)

    async def run(self) -> None:
        """Close idle connections until cancelled."""
        if not self.enabled:
            return
        while True:
            now = trio.current_time()
            # A clock started after this sweep runs out no earlier than this: no wake-up to bring forward.
            next_check = now + min(self.idle_seconds, self.receive_seconds)
            for connection in list(self._watched):
                since = connection.idle_since
                if since is None:  # handling a request; idle from when it is answered, at the earliest now
                    continue
                expires, setting = since + self.idle_seconds, IDLE_SETTING
                receiving = connection.receiving_since
                if receiving is not None and receiving + self.receive_seconds < expires:
                    expires, setting = receiving + self.receive_seconds, RECEIVE_SETTING
                if expires <= now:
                    self._watched.discard(connection)
                    connection.expire(setting)
                else:
                    next_check = min(next_check, expires)
            self.sweeps += 1
            await trio.sleep_until(next_check)
