"""Responses with record data left in segment files: sent with sendfile, byte for byte what encoding gives."""

from __future__ import annotations

import os
from pathlib import Path

import trio
import trio.testing

from kbroker.server.sending import send_spliced
from kbroker.storage.segment import FileRegion
from protocol.framing import encode_response
from protocol.messages.fetch_response import FetchResponse


def _response(records: list[object]) -> FetchResponse:
    partitions = [
        FetchResponse.PartitionData(partition_index=i, records=r)  # type: ignore[arg-type]
        for i, r in enumerate(records)
    ]
    return FetchResponse(responses=[FetchResponse.FetchableTopicResponse(topic="t", partitions=partitions)])


def test_regions_are_sent_in_place_and_closed(tmp_path: Path) -> None:
    # Large enough that sendfile meets a full socket buffer and has to wait for the reader.
    content = os.urandom(3 << 20)
    path = tmp_path / "segment.log"
    path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY)
    spans = [(100, 2 << 20), (0, 0), ((2 << 20) + 500, 700_000)]
    regions = [FileRegion(fd, start, length) if length else b"" for start, length in spans]
    os.close(fd)  # the regions hold descriptors of their own
    out = encode_response(_response(regions), 1, 12, 5)
    expected = bytes(encode_response(_response([content[s : s + n] for s, n in spans]), 1, 12, 5))
    received = bytearray()

    async def main() -> None:
        left, right = trio.socket.socketpair()
        with left, right:

            async def reader() -> None:
                while len(received) < len(expected):
                    data = await right.recv(1 << 16)
                    assert data
                    received.extend(data)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader)
                await send_spliced(left, out)

    trio.run(main)
    assert bytes(received) == expected
    assert all(region.fd == -1 for region in regions if isinstance(region, FileRegion))
