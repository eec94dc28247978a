"""The fault proxy (tests/cluster/fault_proxy.py) between a client socket and a plain TCP server, both held by
the test: bytes pass exactly and in order, held bytes wait in the proxy and come out in order on release, a
drop resets connections and refuses new ones until healed, and closing the host leaves nothing behind.

Nothing here waits for time to pass: where a test says bytes have not arrived, the proxy has first been seen
holding them (its queue counts them), so they cannot have."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from kbroker.fault_proxy import Direction, FaultProxy, ProxiedConnection, ProxyHost
from tests.cluster.harness import wait_for

TIMEOUT = 30.0  # a bound on every blocking socket call, never a pace


@pytest.fixture
def host() -> Iterator[ProxyHost]:
    with ProxyHost() as started:
        yield started


@pytest.fixture
def server() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        listening.settimeout(TIMEOUT)
        yield listening


@pytest.fixture
def proxy(host: ProxyHost, server: socket.socket) -> FaultProxy:
    return host.add_proxy(server.getsockname()[:2])


def connect(proxy: FaultProxy) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=TIMEOUT)


def accept(server: socket.socket) -> socket.socket:
    accepted, _ = server.accept()
    accepted.settimeout(TIMEOUT)
    return accepted


def read_exactly(sock: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise AssertionError(f"end of stream after {len(data)} of {count} bytes")
        data += chunk
    return bytes(data)


def assert_nothing_to_read(sock: socket.socket) -> None:
    sock.setblocking(False)
    try:
        with pytest.raises(BlockingIOError):
            sock.recv(1)
    finally:
        sock.settimeout(TIMEOUT)


def assert_reset(sock: socket.socket) -> None:
    """The connection was reset (RST), not closed: a read fails with ECONNRESET."""
    with pytest.raises(ConnectionResetError):
        while sock.recv(65536):  # bytes the peer had already forwarded may come first
            pass


def assert_refused(proxy: FaultProxy) -> None:
    """A new connection is reset: the kernel completes the handshake, the proxy accepts and resets it, which
    the client sees at connect() or at its first read, whichever the RST reaches first."""
    with pytest.raises(ConnectionResetError):
        with connect(proxy) as client:
            client.recv(1)


def only_connection(proxy: FaultProxy) -> ProxiedConnection:
    wait_for(lambda: len(proxy.connections()) == 1, "the proxy has one connection")
    (connection,) = proxy.connections()
    return connection


def test_bytes_pass_exactly_both_ways_and_a_close_is_forwarded(proxy: FaultProxy, server: socket.socket) -> None:
    to_server, to_client = os.urandom(3 << 20), os.urandom(2 << 20)  # beyond socket buffers and one read
    with connect(proxy) as client, accept(server) as upstream:
        # Each side sends from a thread while the test reads the other side: neither send waits on a reader.
        senders = [
            threading.Thread(target=client.sendall, args=(to_server,)),
            threading.Thread(target=upstream.sendall, args=(to_client,)),
        ]
        for sender in senders:
            sender.start()
        received_upstream = read_exactly(upstream, len(to_server))
        received_client = read_exactly(client, len(to_client))
        for sender in senders:
            sender.join(TIMEOUT)
        assert received_upstream == to_server
        assert received_client == to_client
        client.shutdown(socket.SHUT_WR)
        assert upstream.recv(1) == b""  # the client's FIN, after every byte
        upstream.sendall(b"after the client's half-close")
        assert read_exactly(client, 29) == b"after the client's half-close"
        upstream.close()
        assert client.recv(1) == b""
    wait_for(lambda: proxy.connections() == [], "the proxy forgets the closed connection")


def test_hold_queues_in_order_and_release_forwards(proxy: FaultProxy, server: socket.socket) -> None:
    with connect(proxy) as client, accept(server) as upstream:
        client.sendall(b"before")
        assert read_exactly(upstream, 6) == b"before"
        connection = only_connection(proxy)
        proxy.hold()
        client.sendall(b"one,")
        client.sendall(b"two,three")
        upstream.sendall(b"reply")
        wait_for(lambda: connection.queued(Direction.TO_BROKER) == 13, "13 bytes held toward the server")
        wait_for(lambda: connection.queued(Direction.FROM_BROKER) == 5, "5 bytes held toward the client")
        assert_nothing_to_read(upstream)
        assert_nothing_to_read(client)

        # A connection made while held is accepted but not taken to the server until release.
        with connect(proxy) as late_client:
            late_client.sendall(b"late")
            wait_for(lambda: proxy.accepted_count() == 2, "the proxy accepted the second connection")
            late = proxy.connections()[1]
            assert not late.connected_to_broker
            server.setblocking(False)
            with pytest.raises(BlockingIOError):
                server.accept()
            server.settimeout(TIMEOUT)

            proxy.release()
            assert read_exactly(upstream, 13) == b"one,two,three"
            assert read_exactly(client, 5) == b"reply"
            with accept(server) as late_upstream:
                assert read_exactly(late_upstream, 4) == b"late"
        assert connection.forwarded(Direction.TO_BROKER) == 6 + 13
        client.sendall(b"flowing")
        assert read_exactly(upstream, 7) == b"flowing"


def test_hold_of_one_direction_lets_the_other_flow(proxy: FaultProxy, server: socket.socket) -> None:
    with connect(proxy) as client, accept(server) as upstream:
        connection = only_connection(proxy)
        connection.hold(Direction.FROM_BROKER)
        upstream.sendall(b"held")
        client.sendall(b"passes")
        assert read_exactly(upstream, 6) == b"passes"
        wait_for(lambda: connection.queued(Direction.FROM_BROKER) == 4, "4 bytes held toward the client")
        assert_nothing_to_read(client)
        upstream.close()  # the server's FIN waits behind the held bytes
        connection.release(Direction.FROM_BROKER)
        assert read_exactly(client, 4) == b"held"
        assert client.recv(1) == b""


def test_a_reset_is_held_behind_the_held_bytes(proxy: FaultProxy, server: socket.socket) -> None:
    with connect(proxy) as client, accept(server) as upstream:
        connection = only_connection(proxy)
        proxy.hold(Direction.FROM_BROKER)
        upstream.sendall(b"last words")
        wait_for(lambda: connection.queued(Direction.FROM_BROKER) == 10, "10 bytes held toward the client")
        upstream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        upstream.close()  # RST
        assert_nothing_to_read(client)
        proxy.release(Direction.FROM_BROKER)
        assert read_exactly(client, 10) == b"last words"
        assert_reset(client)


def test_drop_resets_connections_and_refuses_new_ones_until_healed(proxy: FaultProxy, server: socket.socket) -> None:
    with connect(proxy) as client, accept(server) as upstream:
        client.sendall(b"ping")
        assert read_exactly(upstream, 4) == b"ping"
        proxy.drop()
        assert_reset(client)
        assert_reset(upstream)
    for _ in range(3):
        assert_refused(proxy)
    wait_for(lambda: proxy.accepted_count() == 4, "the proxy accepted (and reset) three more connections")
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # none of them reached the server
        server.accept()
    server.settimeout(TIMEOUT)

    proxy.heal()
    with connect(proxy) as client, accept(server) as upstream:
        client.sendall(b"healed")
        assert read_exactly(upstream, 6) == b"healed"


def test_dropping_one_connection_leaves_the_others(proxy: FaultProxy, server: socket.socket) -> None:
    with connect(proxy) as first, accept(server) as first_upstream:
        with connect(proxy) as second, accept(server) as second_upstream:
            wait_for(lambda: len(proxy.connections()) == 2, "two connections")
            proxy.connections()[0].drop()
            assert_reset(first)
            assert_reset(first_upstream)
            second.sendall(b"still here")
            assert read_exactly(second_upstream, 10) == b"still here"


CHILD_CLIENT = """
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30) as sock:
    sock.sendall(b"from the child")
    sock.shutdown(socket.SHUT_WR)
    print(sock.recv(100).decode())
"""


def test_blocking_a_source_resets_its_connections_only(
    host: ProxyHost, proxy: FaultProxy, server: socket.socket
) -> None:
    host.name_source(os.getpid(), "this test")
    with connect(proxy) as mine, accept(server) as upstream:
        connection = only_connection(proxy)
        assert connection.source == "this test"
        proxy.block("this test")
        assert_reset(mine)
        assert_reset(upstream)
    assert_refused(proxy)

    # Another process's connections pass meanwhile.
    child = subprocess.Popen([sys.executable, "-c", CHILD_CLIENT, str(proxy.address[1])], stdout=subprocess.PIPE)
    with accept(server) as from_child:
        assert read_exactly(from_child, 14) == b"from the child"
        from_child.sendall(b"answered")
    output, _ = child.communicate(timeout=TIMEOUT)
    assert child.returncode == 0 and output == b"answered\n"

    proxy.unblock("this test")
    with connect(proxy) as mine, accept(server) as upstream:
        mine.sendall(b"unblocked")
        assert read_exactly(upstream, 9) == b"unblocked"


def test_clients_that_reset_at_once_leave_the_proxy_working(proxy: FaultProxy, server: socket.socket) -> None:
    for _ in range(50):  # some are reset before the proxy accepts them, some after
        client = connect(proxy)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        client.close()
    wait_for(lambda: proxy.accepted_count() == 50, "the proxy accepted all 50")
    wait_for(lambda: proxy.connections() == [], "and let them all go")
    for _ in range(50):  # those that reached the server before their reset
        server.setblocking(False)
        try:
            server.accept()[0].close()
        except BlockingIOError:
            break
    server.settimeout(TIMEOUT)
    with connect(proxy) as client:
        client.sendall(b"still serving")
        with accept(server) as upstream:
            assert read_exactly(upstream, 13) == b"still serving"


def test_a_connection_to_a_dead_upstream_is_reset(host: ProxyHost) -> None:
    assert_refused(host.add_proxy(("127.0.0.1", 1)))  # nothing listens on port 1
    assert_refused(host.add_proxy(None))


def test_closing_the_host_resets_connections_and_leaves_no_thread(server: socket.socket) -> None:
    threads_before = set(threading.enumerate())
    host = ProxyHost().start()
    proxy = host.add_proxy(server.getsockname()[:2])
    with connect(proxy) as client, accept(server) as upstream:
        client.sendall(b"x")
        assert read_exactly(upstream, 1) == b"x"
        host.close()
        assert set(threading.enumerate()) == threads_before
        assert_reset(client)
        assert_reset(upstream)
    with pytest.raises(ConnectionRefusedError):  # the listener is closed
        socket.create_connection(proxy.address, timeout=TIMEOUT)
