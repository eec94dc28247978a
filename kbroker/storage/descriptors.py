"""Open segment files as a bounded resource: one LRU of ``.log`` descriptors shared by a broker's segments.

Kafka keeps every segment file open and relies on a high ``ulimit -n`` (its lazy index opening is the nearest
thing to a bound); with a thousand partitions and the common 1,024 limit that leaves nothing for connections.
Here a segment holds its descriptor only while it is among the ``capacity`` most recently used: asking for it
(``Segment._descriptor``) moves the segment to the recent end, and opening one more closes the least recently
used that nobody is using. Capacity, unless given: half the process's soft RLIMIT_NOFILE (the other half is for
sockets, index and metadata files, sendfile regions and the offsets journal), read when the cache is made,
which is after kbroker raised the soft limit to the hard one (kbroker/server/limits.py).

Threads. The cache belongs to the thread that made it (the event loop): only that thread opens descriptors to
keep and evicts. Other threads never take one from it:
- fsync (a flush in a worker thread) uses the segment's descriptor if it has one, and a running fsync pins it
  (eviction skips a segment whose ``_fsyncs_running`` is not zero, checked under the segment's ``_fd_lock``);
  a segment evicted before its fsync ran gets a descriptor of its own for that fsync, opened and closed there;
- a segment made in a worker thread (topic creation builds partitions in one) creates its file and keeps no
  descriptor; the reads such a thread does (loading a partition directory) each open and close their own.
So a descriptor is never closed under a thread that uses it, nor reused for another file while it does.

Sendfile regions (segment.FileRegion) dup a descriptor each, alive until their response is sent; at most
``region_budget`` (a quarter of the capacity) at once, after which a read returns the bytes instead.

Eviction and durability: closing a descriptor loses nothing written through it (the bytes are in the page
cache, the file's, not the descriptor's), but a dirty segment still owes an fsync: its write generations are
left as they were, so ``dirty`` stays true and the next flush opens the file to sync it (fsync syncs the file,
whichever descriptor names it). Dirty segments are not pinned: with the default flush policy (never, leaving
it to the OS) every active segment stays dirty, and pinning them would bound nothing.

A closed segment (deleted, replaced by a swap, or its log closed) refuses to reopen: ``ClosedSegmentError``.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

try:
    import resource
except ImportError:  # not on this platform (Windows): no limit to read
    resource = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from kbroker.storage.segment import Segment

MIN_CAPACITY = 8  # below this a partition's reads and its appends would evict each other on every request
UNLIMITED_CAPACITY = 1 << 16  # with no soft limit at all: plenty, and still a bound
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class ClosedSegmentError(OSError):
    """The segment was closed (deleted, replaced or shut down): its file is not reopened."""

    def __init__(self, path: os.PathLike[str] | str) -> None:
        super().__init__(errno.EBADF, "segment file was closed (deleted or replaced) and is not reopened", str(path))


def default_capacity() -> int:
    """Half the process's soft open-file limit (at least MIN_CAPACITY)."""
    if resource is None:
        return UNLIMITED_CAPACITY
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return UNLIMITED_CAPACITY
    return max(MIN_CAPACITY, soft // 2)


class DescriptorCache:
    """The open segment descriptors of one broker, least recently used first."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = default_capacity() if capacity is None else capacity
        if self.capacity < 1:
            raise ValueError(f"descriptor cache capacity must be at least 1, got {self.capacity}")
        self._owner = threading.get_ident()
        self._lru: OrderedDict[Segment, None] = OrderedDict()  # segments holding a descriptor, oldest first
        self._lock = threading.Lock()  # structural changes (a close may come from another thread)
        self.opens = 0  # descriptors opened to keep (creation or reopening), for tests and measurements
        self.evictions = 0
        # Descriptors lent to FileRegions (dup()s of segment descriptors, alive until a response is sent). A set:
        # add and discard are single calls, safe from any thread (a region may be closed by garbage collection).
        self._lent: set[int] = set()
        self.region_budget = max(1, self.capacity // 4)
        # ``touch(segment)``: it was just used (most recent now); KeyError if it is not in the cache. The hot
        # path of every append and read, so the OrderedDict's own method, without a Python frame around it.
        self.touch = self._lru.move_to_end

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def on_owner_thread(self) -> bool:
        return threading.get_ident() == self._owner

    def holds(self, segment: Segment) -> bool:
        return segment in self._lru

    def order(self) -> list[Segment]:
        """The segments holding a descriptor, least recently used first."""
        with self._lock:
            return list(self._lru)

    def create(self, segment: Segment) -> tuple[int, int]:
        """Create (or open) the segment's file: (descriptor kept, or -1 off the owner thread; the file's size)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        if not self.on_owner_thread:
            fd = os.open(segment.log_path, flags, 0o644)
            try:
                return -1, os.fstat(fd).st_size
            finally:
                os.close(fd)
        fd = self._open_kept(segment, flags)
        return fd, os.fstat(fd).st_size

    def reopen(self, segment: Segment) -> int:
        """A descriptor for ``segment``, which has none: opened and kept (evicting another if full).

        Off the owner thread (which should not need one: see the module docstring) it is kept without
        evicting, and the owner brings the cache back to capacity at its next open.
        """
        return self._open_kept(segment, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)  # never O_CREAT: no resurrection

    def pread(self, segment: Segment, size: int, position: int) -> bytes:
        """Read from a segment that holds no descriptor: reopened on the owner thread, a descriptor of the
        reading thread's own (opened, read, closed) elsewhere."""
        if self.on_owner_thread:
            return os.pread(self.reopen(segment), size, position)
        fd = segment._open_transient()
        try:
            return os.pread(fd, size, position)
        finally:
            os.close(fd)

    def _open_kept(self, segment: Segment, flags: int) -> int:
        if segment.closed:  # refused before anything is evicted for it (Segment checks again, under its lock)
            raise ClosedSegmentError(segment.log_path)
        with self._lock:
            evict = self.on_owner_thread
            if evict:
                self._make_room(segment, len(self._lru) + 1 - self.capacity)
            while True:
                try:
                    fd = segment._open_descriptor(flags)
                    break
                except OSError as exc:
                    # Sockets or other files took the rest: give one of ours back and try again.
                    if exc.errno not in _OUT_OF_DESCRIPTORS or not evict or not self._make_room(segment, 1):
                        raise
            self._lru[segment] = None
            self.opens += 1
            return fd

    def _make_room(self, keep: Segment, count: int) -> bool:
        """Close up to ``count`` least recently used descriptors not in use (never ``keep``'s); whether any was."""
        victims: list[Segment] = []
        for victim in self._lru:  # releasing does not change the LRU, so iterating it is safe
            if len(victims) >= count:
                break
            if victim is not keep and victim._release_descriptor():
                victims.append(victim)
        for victim in victims:
            del self._lru[victim]
        self.evictions += len(victims)
        return bool(victims)

    @property
    def regions_exhausted(self) -> bool:
        """Whether FileRegions hold their budget of descriptors (reads then return the bytes instead)."""
        return len(self._lent) >= self.region_budget

    def lend(self, fd: int) -> None:
        self._lent.add(fd)

    def returned(self, fd: int) -> None:
        self._lent.discard(fd)

    def forget(self, segment: Segment) -> None:
        """``segment`` is closing: it leaves the cache (its descriptor is closed by Segment.close)."""
        with self._lock:
            self._lru.pop(segment, None)
