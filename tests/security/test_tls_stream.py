"""kbroker's server-side TLS stream (kbroker/server/tls.py) against real TLS clients over a socket pair.

The clients: trio.SSLStream in the same trio run, and Python's blocking ssl socket in a thread. Checked: the
handshake with and without client certificates (a required one missing is a clean BrokenResourceError), exact
bytes both ways for several MB in random pieces, every complete record returned by one receive, max_bytes with
the surplus kept, the peer's close_notify and the peer vanishing mid-record (a clean end), our close_notify,
and a receive cancelled while it waits (the drain path) leaving a stream that still works.
"""

from __future__ import annotations

import random
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from kbroker.security import certs
from kbroker.security.tls import server_context
from kbroker.server.tls import ServerTLSStream

HANG_GUARD = 30  # seconds: a broken stream fails the test instead of hanging it


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> certs.GeneratedCerts:
    return certs.generate(tmp_path_factory.mktemp("certs"), clients=["alice"])


def server_ctx(files: certs.GeneratedCerts, client_auth: str = "none") -> ssl.SSLContext:
    return server_context(
        {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(files.broker),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(files.ca),
            "ssl.client.auth": client_auth,
        }
    )


def client_ctx(files: certs.GeneratedCerts, client: str | None = None, tls12: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(files.ca))
    if client is not None:
        _pem, crt, key = files.clients[client]
        context.load_cert_chain(str(crt), str(key))
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def der_of(path: Path) -> bytes:
    return x509.load_pem_x509_certificates(path.read_bytes())[0].public_bytes(Encoding.DER)


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def random_pieces(data: bytes, seed: int, largest: int) -> list[bytes]:
    chooser, pieces, at = random.Random(seed), [], 0
    while at < len(data):
        size = chooser.randint(1, largest)
        pieces.append(data[at : at + size])
        at += size
    return pieces


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Both ends of a loopback TCP connection (TCP, unlike a unix socket pair, packs small writes together)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _address = listener.accept()
    return server, client


def socket_streams() -> tuple[trio.SocketStream, trio.SocketStream]:
    server, client = tcp_pair()
    return trio.SocketStream(trio.socket.from_stdlib_socket(server)), trio.SocketStream(
        trio.socket.from_stdlib_socket(client)
    )


def run(test: Callable[[], Awaitable[None]]) -> None:
    async def guarded() -> None:
        with trio.fail_after(HANG_GUARD):
            await test()

    trio.run(guarded)


async def receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    received = bytearray()
    while len(received) < size:
        data = await stream.receive_some(65536)
        assert data, f"end of stream after {len(received)} of {size} bytes"
        received += data
    return bytes(received)


async def connected(
    server_context_: ssl.SSLContext, client_context_: ssl.SSLContext, in_memory: bool = False
) -> tuple[ServerTLSStream, trio.SSLStream[trio.abc.Stream]]:
    server_socket: trio.abc.Stream
    client_socket: trio.abc.Stream
    if in_memory:  # what one side sends is in the other's receive buffer at once
        server_socket, client_socket = trio.testing.memory_stream_pair()
    else:
        server_socket, client_socket = socket_streams()
    server = ServerTLSStream(server_socket, server_context_)
    client = trio.SSLStream(client_socket, client_context_, server_hostname="localhost")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.do_handshake)
        nursery.start_soon(client.do_handshake)
    return server, client


# --- handshakes ---------------------------------------------------------------------------------------------


def test_handshake_with_a_client_certificate_gives_it_to_the_server(files: certs.GeneratedCerts) -> None:
    async def test() -> None:
        context = server_ctx(files, "required")
        server, client = await connected(context, client_ctx(files, "alice"))
        assert server.getpeercert(binary_form=True) == der_of(files.clients["alice"][1])
        assert server.version() == "TLSv1.3"
        assert context.options & ssl.OP_NO_RENEGOTIATION  # no read ever waits for a write
        await client.send_all(b"hello")
        assert await server.receive_some() == b"hello"
        await server.send_all(b"world")
        assert await client.receive_some() == b"world"
        await server.aclose()
        await client.aclose()

    run(test)


def test_handshake_without_client_authentication_has_no_peer_certificate(files: certs.GeneratedCerts) -> None:
    async def test() -> None:
        server, client = await connected(server_ctx(files), client_ctx(files))
        assert server.getpeercert(binary_form=True) is None
        await server.aclose()
        await client.aclose()

    run(test)


def test_requested_client_authentication_takes_a_certificate_or_none(files: certs.GeneratedCerts) -> None:
    async def test() -> None:
        context = server_ctx(files, "requested")
        server, client = await connected(context, client_ctx(files, "alice"))
        assert server.getpeercert(binary_form=True) == der_of(files.clients["alice"][1])
        await server.aclose()
        await client.aclose()
        server, client = await connected(context, client_ctx(files))
        assert server.getpeercert(binary_form=True) is None
        await server.aclose()
        await client.aclose()

    run(test)


@pytest.mark.parametrize("tls12", [False, True], ids=["TLSv1.3", "TLSv1.2"])
def test_a_required_client_certificate_missing_fails_the_handshake_cleanly(
    files: certs.GeneratedCerts, tls12: bool
) -> None:
    async def test() -> None:
        server_socket, client_socket = socket_streams()
        server = ServerTLSStream(server_socket, server_ctx(files, "required"))
        client = trio.SSLStream(client_socket, client_ctx(files, tls12=tls12), server_hostname="localhost")
        failure: list[BaseException] = []

        async def serve() -> None:
            try:
                await server.do_handshake()
            except trio.BrokenResourceError as exc:
                failure.append(exc)
            with pytest.raises(trio.BrokenResourceError):  # no half state: the stream refuses further use
                await server.receive_some()
            await server.aclose()

        async def connect() -> None:
            try:  # TLS 1.3: the client's handshake ends before the server judges it; the alert comes next
                await client.do_handshake()
                await client.receive_some()
            except trio.BrokenResourceError:
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            nursery.start_soon(connect)
        [error] = failure
        assert isinstance(error.__cause__, ssl.SSLError)
        assert error.__cause__.reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE"

    run(test)


def test_a_client_gone_during_the_handshake_is_a_broken_resource(files: certs.GeneratedCerts) -> None:
    async def test() -> None:
        server_socket, client_socket = socket_streams()
        server = ServerTLSStream(server_socket, server_ctx(files))
        await client_socket.send_all(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, then nothing
        await client_socket.aclose()
        with pytest.raises(trio.BrokenResourceError) as caught:
            await server.do_handshake()
        assert isinstance(caught.value.__cause__, ssl.SSLEOFError)
        await server.aclose()

    run(test)


def test_a_client_speaking_plaintext_is_a_broken_resource_with_the_ssl_error(files: certs.GeneratedCerts) -> None:
    async def test() -> None:
        server_socket, client_socket = socket_streams()
        server = ServerTLSStream(server_socket, server_ctx(files))
        await client_socket.send_all(b"\x00\x00\x00\x10" + bytes(16))  # a Kafka frame, not a ClientHello
        with pytest.raises(trio.BrokenResourceError) as caught:
            await server.do_handshake()
        assert isinstance(caught.value.__cause__, ssl.SSLError)
        assert caught.value.__cause__.reason == "WRONG_VERSION_NUMBER"
        await server.aclose()
        await client_socket.aclose()

    run(test)


# --- data ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tls12", [False, True], ids=["TLSv1.3", "TLSv1.2"])
def test_several_megabytes_both_ways_against_trio_ssl_stream(files: certs.GeneratedCerts, tls12: bool) -> None:
    upload, download = payload(1, 5_000_017), payload(2, 3_000_011)

    async def test() -> None:
        server, client = await connected(server_ctx(files, "required"), client_ctx(files, "alice", tls12=tls12))
        received: list[bytes] = []

        async def client_sends() -> None:
            for piece in random_pieces(upload, seed=3, largest=300_000):
                await client.send_all(piece)

        async def server_receives() -> None:
            received.append(await receive_exactly(server, len(upload)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client_sends)
            nursery.start_soon(server_receives)
        assert received == [upload]

        async with trio.open_nursery() as nursery:

            async def server_sends() -> None:
                for piece in random_pieces(download, seed=4, largest=700_000):
                    await server.send_all(piece)

            nursery.start_soon(server_sends)
            assert await receive_exactly(client, len(download)) == download
        await server.aclose()
        await client.aclose()

    run(test)


def test_several_megabytes_both_ways_against_python_ssl_socket(files: certs.GeneratedCerts) -> None:
    upload, download = payload(5, 4_000_037), payload(6, 6_000_001)
    client_failures: list[BaseException] = []
    client_received = bytearray()

    def client(sock: socket.socket) -> None:
        try:
            with client_ctx(files, "alice").wrap_socket(sock, server_hostname="localhost") as tls:
                for piece in random_pieces(upload, seed=7, largest=200_000):
                    tls.sendall(piece)
                while len(client_received) < len(download):
                    data = tls.recv(1 << 20)
                    if not data:
                        break
                    client_received.extend(data)
        except BaseException as exc:  # reported by the test, not lost in the thread
            client_failures.append(exc)

    async def test() -> None:
        server_end, client_end = tcp_pair()
        thread = threading.Thread(target=client, args=(client_end,))
        thread.start()
        try:
            server = ServerTLSStream(
                trio.SocketStream(trio.socket.from_stdlib_socket(server_end)), server_ctx(files, "required")
            )
            await server.do_handshake()
            assert await receive_exactly(server, len(upload)) == upload
            for piece in random_pieces(download, seed=8, largest=1_000_000):
                await server.send_all(piece)
            await server.aclose()
        finally:
            await trio.to_thread.run_sync(thread.join)

    run(test)
    assert client_failures == []
    assert bytes(client_received) == download


def test_one_receive_returns_every_complete_record_and_keeps_the_surplus(files: certs.GeneratedCerts) -> None:
    messages = [payload(seed, 100) for seed in range(300)]  # one TLS record each
    everything = b"".join(messages)

    async def test() -> None:
        server, client = await connected(server_ctx(files), client_ctx(files), in_memory=True)
        for message in messages:
            await client.send_all(message)
        # Every record is in the server's transport by now: the first read takes them all.
        assert await server.receive_some() == everything
        for message in messages:
            await client.send_all(message)
        parts = [await server.receive_some(1000)]
        assert parts[0] == everything[:1000]  # max_bytes holds, across record boundaries
        while sum(map(len, parts)) < len(everything):
            parts.append(await server.receive_some(7777))
        assert b"".join(parts) == everything
        await server.aclose()
        await client.aclose()

    run(test)


# --- endings ------------------------------------------------------------------------------------------------


class CuttingStream(trio.abc.Stream):
    """A transport for the client that, once armed, sends half of the next write and then ends its side (FIN: a
    close with unread bytes, such as TLS 1.3 session tickets, would be a reset instead)."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self.inner = inner
        self.cut_next_send = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.cut_next_send:
            await self.inner.send_all(bytes(data)[: len(data) // 2])
            await self.inner.send_eof()
            return
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_client_gone_mid_record_is_a_clean_end(files: certs.GeneratedCerts) -> None:
    async def test() -> None:
        server_socket, client_socket = socket_streams()
        server = ServerTLSStream(server_socket, server_ctx(files))
        cutting = CuttingStream(client_socket)
        client = trio.SSLStream(cutting, client_ctx(files), server_hostname="localhost")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.do_handshake)
            nursery.start_soon(client.do_handshake)
        await client.send_all(b"whole")
        cutting.cut_next_send = True
        await client.send_all(b"x" * 5000)  # half of this record reaches the server, then the socket closes
        assert await server.receive_some() == b"whole"
        assert await server.receive_some() == b""
        assert await server.receive_some() == b""  # and it stays ended
        await server.aclose()

    run(test)


def test_close_notify_both_ways(files: certs.GeneratedCerts) -> None:
    async def test() -> None:
        server, client = await connected(server_ctx(files), client_ctx(files))
        await client.send_all(b"last words")
        await client.aclose()  # trio.SSLStream sends close_notify
        assert await server.receive_some() == b"last words"
        assert await server.receive_some() == b""

        server, client = await connected(server_ctx(files), client_ctx(files))
        await server.send_all(b"bye")
        await server.aclose()
        assert await client.receive_some() == b"bye"
        # trio.SSLStream (https_compatible=False) says b"" only after a close_notify, else BrokenResourceError.
        assert await client.receive_some() == b""
        with pytest.raises(trio.ClosedResourceError):
            await server.send_all(b"after close")
        await client.aclose()

    run(test)


def test_a_peer_gone_without_close_notify_is_an_end_and_send_fails_cleanly(files: certs.GeneratedCerts) -> None:
    async def test() -> None:
        server, client = await connected(server_ctx(files), client_ctx(files))
        await client.send_all(b"data")
        await client.transport_stream.send_eof()  # the socket only: no close_notify
        assert await server.receive_some() == b"data"
        assert await server.receive_some() == b""
        with pytest.raises(trio.BrokenResourceError):
            await server.send_all(b"x" * 1_000_000)
        await server.aclose()

    run(test)


# --- cancellation -------------------------------------------------------------------------------------------


class SplittingStream(trio.abc.Stream):
    """A transport for the client that sends its next write in two halves, the second when released."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self.inner = inner
        self.split_next_send = False
        self.first_half_sent = trio.Event()
        self.release = trio.Event()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.split_next_send:
            self.split_next_send = False
            data = bytes(data)
            await self.inner.send_all(data[: len(data) // 2])
            self.first_half_sent.set()
            await self.release.wait()
            await self.inner.send_all(data[len(data) // 2 :])
            return
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_cancelled_receive_leaves_a_working_stream(files: certs.GeneratedCerts) -> None:
    async def test() -> None:
        server_socket, client_socket = socket_streams()
        server = ServerTLSStream(server_socket, server_ctx(files))
        splitting = SplittingStream(client_socket)
        client = trio.SSLStream(splitting, client_ctx(files), server_hostname="localhost")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.do_handshake)
            nursery.start_soon(client.do_handshake)

        # Cancelled while nothing has arrived (Connection.stop_reading cancels the read scope).
        with trio.CancelScope() as scope:
            scope.cancel()
            await server.receive_some()
        assert scope.cancelled_caught

        # Cancelled while half a record has arrived: the half stays for the next receive.
        message = payload(9, 10_000)
        async with trio.open_nursery() as nursery:
            splitting.split_next_send = True
            nursery.start_soon(client.send_all, message)
            await splitting.first_half_sent.wait()
            with trio.CancelScope() as scope:
                nursery.start_soon(cancel_when_blocked, scope)
                await server.receive_some()
            assert scope.cancelled_caught
            splitting.release.set()
        assert await receive_exactly(server, len(message)) == message
        await server.send_all(b"still fine")
        assert await client.receive_some() == b"still fine"
        await server.aclose()
        await client.aclose()

    run(test)


async def cancel_when_blocked(scope: trio.CancelScope) -> None:
    await trio.testing.wait_all_tasks_blocked()
    scope.cancel()


def test_two_tasks_receiving_at_once_is_refused(files: certs.GeneratedCerts) -> None:
    async def test() -> None:
        server, client = await connected(server_ctx(files), client_ctx(files))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.receive_some)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await server.receive_some()
            nursery.cancel_scope.cancel()
        await client.send_all(b"ok")
        assert await server.receive_some() == b"ok"
        await server.aclose()
        await client.aclose()

    run(test)
