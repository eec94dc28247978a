"""The bound on request memory across every connection: ``queued.max.request.bytes``.

Kafka gives its socket server one memory pool of ``queued.max.request.bytes`` (unbounded when not positive):
a request's buffer is allocated from it once the size prefix is read, and a connection whose next request
does not fit stops being read (Kafka mutes the channel) until memory is released, which happens once the
request has been handled.

kbroker counts what is actually buffered instead of what size prefixes announce: reserving a frame's
announced size lets four bytes claiming 100 MB hold 100 MB of the pool, so a handful of connections that
send a size prefix and nothing more would stop every other client until they are dropped. ``RequestMemory``:

* A connection counts the bytes it receives as they arrive (``take``) and gives them back once the request
  they belong to has been answered, or when the connection ends (``release``).
* While the pool holds ``capacity`` bytes or more, connections stop reading (TCP flow control holds their
  clients back), all but one: the connection whose unfinished request began first reads on, so that
  requests keep completing and memory keeps coming back, whatever state the others are in. The pool can so
  be overdrawn by at most one request (Kafka's pool is not strict either: it grants any request while some
  memory is free) and by what each connection received in its last read.

A connection tells the pool when a request of its begins to arrive (``receiving``) and when it is whole
(``received``); the order of those beginnings decides who reads on.
"""

from __future__ import annotations

import struct

import trio

SIZE_PREFIX = struct.calcsize(">i")


class RequestMemory:
    """A pool of ``capacity`` bytes shared by every connection's requests; ``None`` means unbounded."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.used = 0  # bytes received and not yet given back (may exceed capacity: see above)
        self.waits = 0  # times a connection had to stop reading for memory (for tests and diagnostics)
        self._receiving: dict[object, None] = {}  # connections with a request partly here, oldest first
        self._changed: trio.Event | None = None  # set when memory comes back or the oldest request is whole

    @classmethod
    def from_setting(cls, queued_max_request_bytes: int) -> RequestMemory:
        """Kafka's rule: a bound only when the setting is positive."""
        return cls(queued_max_request_bytes if queued_max_request_bytes > 0 else None)

    @property
    def bounded(self) -> bool:
        return self.capacity is not None

    def take(self, size: int) -> int:
        """Count ``size`` bytes just received; returns what was counted (nothing when unbounded)."""
        if self.capacity is None:
            return 0
        self.used += size
        return size

    def release(self, size: int) -> None:
        if size:
            self.used -= size
            self._wake()

    def receiving(self, connection: object) -> None:
        """``connection`` has part of a request: it joins the order in which unfinished requests began."""
        self._receiving.setdefault(connection)

    def received(self, connection: object) -> None:
        """``connection``'s request is whole (or the connection ended): the next oldest may read on."""
        if self._receiving:
            oldest = next(iter(self._receiving))
            if self._receiving.pop(connection, False) is None and oldest is connection:
                self._wake()

    def may_read(self, connection: object) -> bool:
        if self.capacity is None or self.used < self.capacity:
            return True
        return bool(self._receiving) and next(iter(self._receiving)) is connection

    async def room_for(self, connection: object) -> None:
        """Wait until ``connection`` may read: the pool has room, or its unfinished request is the oldest."""
        if self.may_read(connection):
            return
        self.waits += 1
        while not self.may_read(connection):
            if self._changed is None:
                self._changed = trio.Event()
            await self._changed.wait()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
