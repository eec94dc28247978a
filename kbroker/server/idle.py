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

    def expire(self) -> None:
        """Close: idle for connections.max.idle.ms."""
        ...


class IdleReaper:
    """Closes the connections that have been idle for ``idle_ms`` (negative: never)."""

    def __init__(self, idle_ms: int) -> None:
        self.idle_seconds = idle_ms / 1000 if idle_ms >= 0 else math.inf
        self._watched: set[Watched] = set()
        self.sweeps = 0  # times the reaper woke (for tests and diagnostics)

    @property
    def enabled(self) -> bool:
        return self.idle_seconds != math.inf

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
            next_check = now + self.idle_seconds
            for connection in list(self._watched):
                since = connection.idle_since
                if since is None:  # handling a request; idle from when it is answered, at the earliest now
                    continue
                expires = since + self.idle_seconds
                if expires <= now:
                    self._watched.discard(connection)
                    connection.expire()
                else:
                    next_check = min(next_check, expires)
            self.sweeps += 1
            await trio.sleep_until(next_check)
