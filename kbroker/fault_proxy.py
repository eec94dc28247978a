"""A TCP proxy that can break the network to one node: put in front of a listener and advertised in its place,
every connection to that listener goes through it. The ``kbroker_cluster`` fixture's ``network_faults`` puts one
in front of each broker's inter-broker listener and each controller (``ClusterBroker.isolate``), and the cluster
harness of the suite one in front of every broker (tests/cluster/harness.py).

Each proxied connection carries two directions (Direction.TO_BROKER, Direction.FROM_BROKER). Per connection or
for the whole proxy (existing and new connections alike):

- ``hold(direction)``: stop forwarding; what arrives is queued (up to QUEUE_LIMIT bytes per direction, then TCP
  flow control holds the rest in the kernel) and so is a close or reset from that side. A new connection is
  accepted but not connected to the broker while TO_BROKER is held. ``release(direction)`` forwards the queue
  in order and carries on.
- ``drop()``: reset every connection (RST on both sides) and reset each new one as soon as it is accepted, until
  ``heal()`` (which also releases every hold). Per connection, ``drop()`` resets that one.
- ``block(source)``: the same, only for connections from one named local process (``ProxyHost.name_source``),
  until ``unblock(source)``: a broker's own connections to its peers are cut while others' pass. The connecting
  process is found as Linux shows it: the client socket's inode in /proc/net/tcp, among /proc/PID/fd.

All proxies of a test share one trio event loop on one thread (ProxyHost); the methods here are called from the
test's thread and run on that loop, so the state they change is only ever touched there. ``ProxyHost.close()``
resets what is still open, closes the listeners and joins the thread; an error inside the loop is raised there.
"""

from __future__ import annotations

import enum
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import trio

QUEUE_LIMIT = 4 << 20  # bytes one held direction reads ahead; beyond it the sender is held by TCP flow control
CHUNK = 64 << 10
TABLE_READS = 3
RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
CLOSE_GRACEFULLY = struct.pack("ii", 0, 0)
T = TypeVar("T")


class Direction(enum.Flag):
    NONE = 0
    TO_BROKER = enum.auto()
    FROM_BROKER = enum.auto()
    BOTH = TO_BROKER | FROM_BROKER


class _ForwardedReset(Exception):
    """The other side reset (or failed) its connection: forwarded as a reset once the queue ahead of it is out."""


def _hex_address(address: tuple[str, int]) -> str:
    """An IPv4 address as /proc/net/tcp writes it: the address as a little-endian hex word, then the port."""
    return f"{int.from_bytes(socket.inet_aton(address[0]), 'little'):08X}:{address[1]:04X}"


def connecting_process(client: tuple[str, int], server: tuple[str, int], candidates: list[int]) -> int | None:
    """Which of the ``candidates`` (pids) holds the client end of the local TCP connection client -> server."""
    local, remote = _hex_address(client), _hex_address(server)
    inode = None
    # The kernel writes the table a page per read and can skip a socket if the table changes between two: a
    # socket not found is looked for again before it counts as gone.
    for _ in range(TABLE_READS):
        with open("/proc/net/tcp") as table:
            inode = next((fields[9] for fields in map(str.split, table) if fields[1:3] == [local, remote]), None)
        if inode is not None:
            break
    else:
        return None  # closed already
    target = f"socket:[{inode}]"
    for pid in candidates:
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # exited
            continue
        for descriptor in descriptors:
            try:
                if os.readlink(f"/proc/{pid}/fd/{descriptor}") == target:
                    return pid
            except OSError:  # closed meanwhile
                continue
    return None


async def _connect(address: tuple[str, int]) -> trio.SocketStream:
    """A connection to ``address`` whose connect, if a drop cancels it, ends in a reset like the rest of a drop
    (trio closes a socket whose connect was cancelled; SO_LINGER 0 makes that close a RST)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        await sock.connect(address)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, CLOSE_GRACEFULLY)
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def _close(stream: trio.SocketStream | None, reset: bool) -> None:
    """Close now; with ``reset``, SO_LINGER 0 makes the close send RST instead of FIN."""
    if stream is None or stream.socket.fileno() == -1:
        return
    if reset:
        try:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        except OSError:  # already reset by the peer
            pass
    stream.socket.close()


class _Pipe:
    """One direction of a connection: ``read`` queues what ``source`` sends, ``write`` forwards the queue to
    ``sink`` unless held. The end of the source (FIN, or a reset as _ForwardedReset) is forwarded after the queue."""

    def __init__(
        self,
        source: trio.SocketStream,
        sink: trio.SocketStream,
        held: bool,
        totals: dict[Direction, int],
        direction: Direction,
    ) -> None:
        self.source = source
        self.sink = sink
        self.held = held
        self.pending = bytearray()
        self.forwarded = 0
        self._totals = totals  # the proxy's count over all its connections
        self._direction = direction
        self._ended = False
        self._failure: BaseException | None = None
        self._changed = trio.lowlevel.ParkingLot()

    def set_held(self, held: bool) -> None:
        self.held = held
        self._changed.unpark_all()

    async def read(self) -> None:
        try:
            while True:
                while len(self.pending) >= QUEUE_LIMIT:
                    await self._changed.park()
                data = await self.source.receive_some(CHUNK)
                if not data:
                    break
                self.pending += data
                self._changed.unpark_all()
        except (OSError, trio.BrokenResourceError) as exc:
            self._failure = exc
        self._ended = True
        self._changed.unpark_all()

    async def write(self) -> None:
        while True:
            while self.held or not (self.pending or self._ended):
                await self._changed.park()
            if self.pending:
                chunk = bytes(self.pending)
                self.pending.clear()
                self._changed.unpark_all()
                await self.sink.send_all(chunk)
                self.forwarded += len(chunk)
                self._totals[self._direction] += len(chunk)
            elif self._failure is not None:
                raise _ForwardedReset(str(self._failure))
            else:
                await self.sink.send_eof()
                return


class ProxiedConnection:
    """One client connection through a FaultProxy. Its methods are called from the test's thread."""

    def __init__(self, proxy: FaultProxy, downstream: trio.SocketStream) -> None:
        self.proxy = proxy
        self.number = proxy.accepted  # the how-manieth connection the proxy accepted, from 1
        self.client_address: tuple[str, int] = downstream.socket.getpeername()[:2]
        self.source = proxy.host._source_of(self.client_address, proxy.address)  # a named process, or None
        self._downstream = downstream
        self._upstream: trio.SocketStream | None = None
        self._held = Direction.NONE  # this connection's own holds; the proxy's are added
        self._pipes: dict[Direction, _Pipe] = {}
        self._scope = trio.CancelScope()
        self._dropped = False
        self._changed = trio.lowlevel.ParkingLot()
        self._closed = False

    # --- from the test's thread ---------------------------------------------------------------------------

    def hold(self, direction: Direction = Direction.BOTH) -> None:
        self.proxy.host.call(self._set_held, self._held | direction)

    def release(self, direction: Direction = Direction.BOTH) -> None:
        self.proxy.host.call(self._set_held, self._held & ~direction)

    def drop(self) -> None:
        self.proxy.host.call(self._drop)

    def queued(self, direction: Direction) -> int:
        """Bytes read from one side and not yet forwarded to the other."""
        return self.proxy.host.call(lambda: len(pipe.pending) if (pipe := self._pipes.get(direction)) else 0)

    def forwarded(self, direction: Direction) -> int:
        return self.proxy.host.call(lambda: pipe.forwarded if (pipe := self._pipes.get(direction)) else 0)

    @property
    def connected_to_broker(self) -> bool:
        return self.proxy.host.call(lambda: self._upstream is not None)

    @property
    def closed(self) -> bool:
        return self.proxy.host.call(lambda: self._closed)

    # --- on the loop ------------------------------------------------------------------------------------------

    def _effective_hold(self) -> Direction:
        return self._held | self.proxy._held

    def _set_held(self, held: Direction) -> None:
        self._held = held
        self._apply()

    def _apply(self) -> None:
        held = self._effective_hold()
        for direction, pipe in self._pipes.items():
            pipe.set_held(direction in held)
        self._changed.unpark_all()

    def _drop(self) -> None:
        self._dropped = True
        self._scope.cancel()

    async def serve(self) -> None:
        reset = True
        try:
            with self._scope:
                while Direction.TO_BROKER in self._effective_hold():  # the broker sees no connection yet
                    await self._changed.park()
                if self.proxy._dropped or self.proxy.upstream is None:
                    return
                try:
                    self._upstream = await _connect(self.proxy.upstream)
                except OSError:  # the broker is down: the client sees a reset, as from a dead host's proxy
                    return
                held = self._effective_hold()
                totals = self.proxy._forwarded
                self._pipes = {
                    Direction.TO_BROKER: _Pipe(
                        self._downstream, self._upstream, Direction.TO_BROKER in held, totals, Direction.TO_BROKER
                    ),
                    Direction.FROM_BROKER: _Pipe(
                        self._upstream, self._downstream, Direction.FROM_BROKER in held, totals, Direction.FROM_BROKER
                    ),
                }
                try:
                    async with trio.open_nursery() as nursery:
                        for pipe in self._pipes.values():
                            nursery.start_soon(pipe.read)
                            nursery.start_soon(pipe.write)
                    reset = False  # both sides closed cleanly, every byte forwarded
                except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError, _ForwardedReset):
                    pass  # one side failed: reset both
        finally:
            _close(self._downstream, reset or self._dropped)
            _close(self._upstream, reset or self._dropped)
            self._closed = True
            self.proxy._connections.discard(self)


class FaultProxy:
    """Listens on 127.0.0.1 at a port kept for its life and forwards each connection to ``upstream`` (settable:
    a restarted broker may listen elsewhere). Made by ProxyHost.add_proxy; methods are called from the test."""

    def __init__(self, host: ProxyHost, listener: trio.SocketListener, upstream: tuple[str, int] | None) -> None:
        self.host = host
        self._listener = listener
        self.address: tuple[str, int] = listener.socket.getsockname()[:2]
        self.upstream = upstream
        self._held = Direction.NONE
        self._dropped = False
        self._blocked: set[str] = set()
        self._connections: set[ProxiedConnection] = set()
        self._forwarded = {Direction.TO_BROKER: 0, Direction.FROM_BROKER: 0}
        self.accepted = 0  # connections accepted so far

    @property
    def bootstrap(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    # --- from the test's thread ---------------------------------------------------------------------------

    def set_upstream(self, address: tuple[str, int] | None) -> None:
        self.host.call(setattr, self, "upstream", address)

    def hold(self, direction: Direction = Direction.BOTH) -> None:
        self.host.call(self._set_held, self._held | direction)

    def release(self, direction: Direction = Direction.BOTH) -> None:
        self.host.call(self._set_held, self._held & ~direction)

    def drop(self) -> None:
        """Reset every connection, and each new one as it is accepted, until heal()."""
        self.host.call(self._drop)

    def heal(self) -> None:
        """Forward again: no drop, no hold (the proxy's and every connection's). Blocked sources stay blocked."""
        self.host.call(self._heal)

    def block(self, source: str) -> None:
        """Reset the connections from the process named ``source``, and each new one, until unblock(source)."""
        self.host.call(self._block, source)

    def unblock(self, source: str) -> None:
        self.host.call(self._blocked.discard, source)

    def blocked(self) -> set[str]:
        return self.host.call(lambda: set(self._blocked))

    def connections(self) -> list[ProxiedConnection]:
        """The open connections, oldest first."""
        return self.host.call(lambda: sorted(self._connections, key=lambda c: c.number))

    def accepted_count(self) -> int:
        return self.host.call(lambda: self.accepted)

    def forwarded(self, direction: Direction) -> int:
        """Bytes forwarded in ``direction`` over all connections so far."""
        return self.host.call(lambda: self._forwarded[direction])

    def queued(self, direction: Direction) -> int:
        """Bytes waiting (held) in ``direction`` over the open connections."""
        return self.host.call(lambda: sum(len(c._pipes[direction].pending) for c in self._connections if c._pipes))

    # --- on the loop ------------------------------------------------------------------------------------------

    def _set_held(self, held: Direction) -> None:
        self._held = held
        for connection in self._connections:
            connection._apply()

    def _drop(self) -> None:
        self._dropped = True
        for connection in self._connections:
            connection._drop()

    def _block(self, source: str) -> None:
        self._blocked.add(source)
        for connection in self._connections:
            if connection.source == source:
                connection._drop()

    def _heal(self) -> None:
        self._dropped = False
        self._held = Direction.NONE
        for connection in self._connections:
            connection._set_held(Direction.NONE)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            try:
                while True:
                    stream = await self._listener.accept()
                    self.accepted += 1
                    if self._dropped:
                        _close(stream, reset=True)
                        continue
                    try:
                        connection = ProxiedConnection(self, stream)
                    except OSError:  # the client is gone already (reset before it was accepted)
                        _close(stream, reset=True)
                        continue
                    if connection.source is not None and connection.source in self._blocked:
                        _close(stream, reset=True)
                        continue
                    self._connections.add(connection)
                    nursery.start_soon(connection.serve)
            finally:
                self._listener.socket.close()


class ProxyHost:
    """The thread and trio loop that run a test's proxies. ``with ProxyHost() as host: proxy = host.add_proxy(...)``."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.proxies: list[FaultProxy] = []
        self._sources: dict[int, str] = {}  # pid -> name, for FaultProxy.block

    def name_source(self, pid: int, name: str) -> None:
        """Connections from process ``pid`` come from ``name`` (a broker's process, after each start)."""
        self.call(self._sources.__setitem__, pid, name)

    def forget_source(self, pid: int) -> None:
        self.call(self._sources.pop, pid, None)

    def _source_of(self, client: tuple[str, int], server: tuple[str, int]) -> str | None:
        if not self._sources:  # nothing named: no need to look
            return None
        pid = connecting_process(client, server, list(self._sources))
        return None if pid is None else self._sources[pid]

    def start(self) -> ProxyHost:
        self._thread = threading.Thread(target=self._run, name="fault-proxies", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise RuntimeError("the proxy loop failed to start") from self._error
        return self

    def _run(self) -> None:
        async def main() -> None:
            async with trio.open_nursery() as nursery:
                self._token = trio.lowlevel.current_trio_token()
                self._nursery = nursery
                self._started.set()
                await trio.sleep_forever()

        try:
            trio.run(main)
        except BaseException as exc:  # raised again by close(), in the test's thread
            self._error = exc
        finally:
            self._started.set()

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """Run ``function(*args)`` on the loop and return its result (so loop state is only touched there)."""
        assert self._token is not None, "ProxyHost not started"
        return trio.from_thread.run_sync(function, *args, trio_token=self._token)

    def add_proxy(self, upstream: tuple[str, int] | None = None) -> FaultProxy:
        """A new proxy on 127.0.0.1 and a free port, forwarding to ``upstream`` (None: reset every connection)."""

        async def start() -> FaultProxy:
            assert self._nursery is not None
            (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
            proxy = FaultProxy(self, listener, upstream)
            self._nursery.start_soon(proxy.run)
            return proxy

        assert self._token is not None, "ProxyHost not started"
        proxy = trio.from_thread.run(start, trio_token=self._token)
        self.proxies.append(proxy)
        return proxy

    def close(self) -> None:
        """Reset every connection, close every listener, end the loop and join its thread."""
        if self._thread is None:
            return
        if self._nursery is not None and self._token is not None:
            try:
                self.call(self._nursery.cancel_scope.cancel)
            except trio.RunFinishedError:
                pass
        self._thread.join(30)
        if self._thread.is_alive():
            raise RuntimeError("the proxy loop did not stop within 30 s")
        self._thread = None
        if self._error is not None:
            raise RuntimeError("the proxy loop failed") from self._error

    def __enter__(self) -> ProxyHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
