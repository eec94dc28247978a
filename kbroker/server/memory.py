"""The bound on request memory across every connection: ``queued.max.request.bytes``.

Kafka gives its socket server one memory pool of ``queued.max.request.bytes`` (unbounded when not positive):
a request's buffer is allocated from it once the size prefix is read, and a connection whose next request
does not fit stops being read (Kafka mutes the channel) until memory is released, which happens once the
request has been handled. kbroker does the same with ``RequestMemory``:

* A connection follows the frame boundaries of what it receives (``FrameSizes``, which reads only the 4-byte
  size prefixes). Before it reads on into a frame it reserves the frame's whole size, waiting while the pool
  is exhausted; waiting stops reading the socket, so TCP flow control holds the client back.
* What is reserved is given back when the request has been answered (or the connection ends).

Two differences from Kafka, both in favour of the bound: Kafka's pool is not strict (any request is granted
while some memory is free, so the pool can be overdrawn by one whole request), kbroker's waits until the
request fits, first come first served, so a large request is never starved by small ones. And what a
connection already holds when it learns a frame's size (at most one receive buffer: the small frames in it
are counted at once, never waited for, and the frame buffer's first block for a large one) is not reserved
ahead; that is a few kilobytes to a megabyte per connection, never a whole request.

Reservations are bookkeeping only: the frame buffer still grows as bytes arrive (protocol/framing.py), so a
size prefix alone costs no memory, only room in the pool until the connection is closed or goes idle.
"""

from __future__ import annotations

import struct
from collections import deque

import trio

_SIZE = struct.Struct(">i")
SIZE_PREFIX = _SIZE.size


class RequestMemory:
    """A pool of ``capacity`` bytes shared by every connection's requests; ``None`` means unbounded."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.used = 0  # bytes reserved now (may exceed capacity by what connections held before asking)
        self.waits = 0  # times a connection had to stop reading for memory (for tests and diagnostics)
        self._waiters: deque[tuple[int, trio.Event]] = deque()

    @classmethod
    def from_setting(cls, queued_max_request_bytes: int) -> RequestMemory:
        """Kafka's rule: a bound only when the setting is positive."""
        return cls(queued_max_request_bytes if queued_max_request_bytes > 0 else None)

    @property
    def bounded(self) -> bool:
        return self.capacity is not None

    async def reserve(self, size: int) -> int:
        """Wait until ``size`` bytes fit (in arrival order) and reserve them; returns what was reserved.

        Cancellation-safe: a cancelled wait reserves nothing and lets the next waiter go.
        """
        if self.capacity is None:
            return 0
        size = min(size, self.capacity)  # never wait for what can never fit (the config checks prevent it)
        if not self._waiters and self.used + size <= self.capacity:
            self.used += size
            return size
        self.waits += 1
        entry = (size, trio.Event())
        self._waiters.append(entry)
        try:
            await entry[1].wait()
        except BaseException:
            if entry[1].is_set():  # granted just as we were cancelled: give it back
                self.release(size)
            else:
                self._waiters.remove(entry)
                self._grant()  # the head of the queue may have been holding others back
            raise
        return size

    def take(self, size: int) -> int:
        """Count ``size`` bytes that are already in memory (no waiting: they were received before their size
        was known); returns what was counted."""
        if self.capacity is None:
            return 0
        self.used += size
        return size

    def release(self, size: int) -> None:
        if size:
            self.used -= size
            self._grant()

    def _grant(self) -> None:
        assert self.capacity is not None
        while self._waiters and self.used + self._waiters[0][0] <= self.capacity:
            size, granted = self._waiters.popleft()
            self.used += size
            granted.set()


class FrameSizes:
    """Follows the frames of a byte stream by their 4-byte size prefixes, skipping their bodies uncopied."""

    def __init__(self) -> None:
        self._prefix = bytearray()  # the part of a size prefix received so far
        self._body_left = 0  # bytes of the current frame's body still to come

    @property
    def inside_frame(self) -> bool:
        """The last frame whose size was seen has not arrived whole yet."""
        return self._body_left > 0

    def observe(self, data: bytes | bytearray | memoryview) -> list[int]:
        """The sizes of the frames whose size prefix is completed by ``data``, in order."""
        sizes: list[int] = []
        # Views are released on return: the caller's buffer may be resized afterwards.
        with memoryview(data) as whole, whole.cast("B") as view:
            position, end = 0, len(view)
            while position < end:
                if self._body_left:
                    skipped = min(self._body_left, end - position)
                    self._body_left -= skipped
                    position += skipped
                    continue
                wanted = SIZE_PREFIX - len(self._prefix)
                self._prefix += view[position : position + wanted]
                position += min(wanted, end - position)
                if len(self._prefix) == SIZE_PREFIX:
                    (size,) = _SIZE.unpack(self._prefix)
                    self._prefix.clear()
                    sizes.append(size)
                    self._body_left = max(size, 0)  # a negative size ends the stream (FrameBuffer refuses it)
        return sizes
