"""Sending a response whose record data stays in segment files: bytes from memory, regions with sendfile.

A fetch response is mostly record batches already on disk. Instead of reading them into memory and
copying them into the encoded response, the encoder leaves gaps (protocol._codec.SplicedOutput) and this
module sends the encoded bytes around them and each file region with os.sendfile, so the data goes from
the page cache to the socket without passing through Python.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import trio

from protocol.framing import SplicedOutput

Progress = Callable[[], None]  # called whenever some bytes were sent (the connection's idle clock)


def _no_progress() -> None:
    pass


async def send_spliced(sock: trio.socket.SocketType, out: SplicedOutput, progress: Progress = _no_progress) -> None:
    """Send ``out`` with its regions in place; the regions are closed whether or not it succeeds."""
    try:
        view = memoryview(out)
        sent_up_to = 0
        for position, region in out.splices:
            # No MSG_MORE here: when a region ends the response there is nothing left to send to uncork it.
            await send_bytes(sock, view[sent_up_to:position], progress)
            await _send_region(sock, region, progress)
            sent_up_to = position
        await send_bytes(sock, view[sent_up_to:], progress)
    finally:
        release(out)


async def send_spliced_to_stream(stream: trio.abc.SendStream, out: SplicedOutput) -> None:
    """``send_spliced`` for a stream that is not a plain socket (TLS, a test's wrapper): each region is read
    into memory and sent between the bytes around it. The regions are closed whether or not it succeeds."""
    try:
        view = memoryview(out)
        sent_up_to = 0
        for position, region in out.splices:
            if position > sent_up_to:
                await stream.send_all(view[sent_up_to:position])
            await stream.send_all(bytes(region))  # type: ignore[call-overload]
            sent_up_to = position
        if sent_up_to < len(view):
            await stream.send_all(view[sent_up_to:])
    finally:
        release(out)


def release(out: SplicedOutput) -> None:
    for _, region in out.splices:
        close = getattr(region, "close", None)
        if close is not None:
            close()


async def send_bytes(sock: trio.socket.SocketType, data: memoryview, progress: Progress = _no_progress) -> None:
    """All of ``data``, reporting each partial send to ``progress``."""
    while data:
        sent = await sock.send(data)
        data = data[sent:]
        progress()


async def _send_region(sock: trio.socket.SocketType, region: Any, progress: Progress) -> None:
    fd = getattr(region, "fd", None)
    if fd is None:  # not a file region: whatever bytes it stands for
        await send_bytes(sock, memoryview(bytes(region)), progress)
        return
    offset, remaining = region.position, region.length
    while remaining:
        try:
            sent = os.sendfile(sock.fileno(), fd, offset, remaining)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(sock)
            continue
        if sent == 0:
            # The file is shorter than the region: the size prefix is already out, so the stream is lost.
            raise OSError(f"segment region ended {remaining} bytes early")
        offset += sent
        remaining -= sent
        progress()
        await trio.lowlevel.checkpoint()
