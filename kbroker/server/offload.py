"""Decoding and encoding large messages in a worker thread, so that one huge request does not stall every client.

The codecs are pure Python: a 10 MB Fetch naming 300,000 partitions takes about 0.3 s to decode and its
answer more than a second to encode, and on the event loop that is time in which no other connection is
served. A request frame of ``LARGE_FRAME_BYTES`` or more is decoded in a worker thread, and so is any answer
with ``MANY_ITEMS`` or more array elements (counted two levels deep, stopping as soon as there are
enough) encoded in one. The worker still holds the GIL while it works, but Python hands the GIL over every
``sys.getswitchinterval()`` (5 ms), so the event loop keeps serving the other connections meanwhile. Smaller
messages stay on the loop: a thread hand-off costs about 100 us, more than their whole decode. So does a large
Produce naming fewer than ``MANY_ITEMS`` partitions: its record sets are bytes, decoded in microseconds, and
counting its partitions (protocol.framing.produce_partitions skips the record sets) takes a few microseconds.

One worker at a time (a capacity limiter per trio run): several huge requests wait for each other, not the
loop for all of them. The handler between decode and encode runs on the loop, in turns (kbroker/apis/turns.py).

Only data the request owns goes to the worker: the frame it was read into, and the answer its handler built
for it (handlers build their answers afresh; none shares a response object with another task).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from protocol._codec import Struct
from protocol.framing import PRODUCE_KEY, Request, SplicedOutput, decode_request, encode_response, produce_partitions

LARGE_FRAME_BYTES = 64 * 1024  # a Fetch of about 2,000 partitions, decoded in about 2 ms
MANY_ITEMS = 2000  # array elements of an answer, or partitions of a Produce: milliseconds of work

_WORKER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("kbroker_codec_worker")


def _worker() -> trio.CapacityLimiter:
    try:
        return _WORKER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(1)
        _WORKER.set(limiter)
        return limiter


def is_huge(frame: bytearray) -> bool:
    """A frame whose decode is worth a worker: a large one, but a Produce only if it names many partitions."""
    return len(frame) >= LARGE_FRAME_BYTES and not (
        frame[1] == PRODUCE_KEY and frame[0] == 0 and produce_partitions(frame, MANY_ITEMS) < MANY_ITEMS
    )


async def decode(frame: bytearray, huge: bool | None = None) -> Request:
    """``decode_request``, in the worker for a huge frame (``huge``: is_huge(frame), if the caller has it)."""
    if not (is_huge(frame) if huge is None else huge):
        return decode_request(frame)
    return await trio.to_thread.run_sync(decode_request, frame, limiter=_worker())


class _CollectorPause:
    """Python's cyclic garbage collector, paused while huge requests are in hand.

    Decoding a 300,000-partition Fetch makes millions of objects, and every time the objects made since the last
    full collection reach a quarter of all objects, CPython 3.11 walks every object in one go, holding the GIL
    (about 0.3 s here, in whichever thread allocates): the event loop stops that long, a worker thread or not.
    The request's objects hold no reference cycles and are freed by reference counting when it is answered, so
    the collector has nothing to find in them: it is paused from the decode to the answer and resumed when the
    last huge request in hand is done. So that a stream of overlapping huge requests cannot keep it off for good,
    a pause longer than ``LONGEST_S`` collects once before it goes on.
    """

    LONGEST_S = 10.0

    def __init__(self) -> None:
        self.holders = 0
        self.since = 0.0
        self.was_enabled = True

    @contextmanager
    def held(self) -> Iterator[None]:
        now = time.monotonic()
        if self.holders == 0:
            self.was_enabled = gc.isenabled()
            self.since = now
            gc.disable()
        elif now - self.since > self.LONGEST_S and self.was_enabled:
            gc.collect()
            self.since = now
        self.holders += 1
        try:
            yield
        finally:
            self.holders -= 1
            if self.holders == 0 and self.was_enabled:
                gc.enable()


_COLLECTOR_PAUSE = _CollectorPause()


@contextmanager
def collector_paused(frame: bytearray, huge: bool | None = None) -> Iterator[None]:
    """Around decoding, handling and answering ``frame``: the collector paused if it is huge (see _CollectorPause;
    ``huge``: is_huge(frame), if the caller has it)."""
    if not (is_huge(frame) if huge is None else huge):
        yield
        return
    with _COLLECTOR_PAUSE.held():
        yield


async def encode(body: Any, api_key: int, api_version: int, correlation_id: int) -> SplicedOutput:
    """``encode_response``, in the worker for a large answer."""
    if array_items(body, MANY_ITEMS) < MANY_ITEMS:
        return encode_response(body, api_key, api_version, correlation_id)
    return await trio.to_thread.run_sync(encode_response, body, api_key, api_version, correlation_id, limiter=_worker())


def array_items(message: Any, enough: int) -> int:
    """The elements of ``message``'s arrays and of its elements' arrays, counted until there are ``enough``."""
    count = 0
    for name in message.FIELDS:
        value = getattr(message, name)
        if type(value) is not list:
            continue
        count += len(value)
        if count >= enough:
            return count
        for item in value:
            if isinstance(item, Struct):
                for inner in item.FIELDS:
                    nested = getattr(item, inner)
                    if type(nested) is list:
                        count += len(nested)
                if count >= enough:
                    return count
    return count
