from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.exceptions import DecodeError
from protocol.framing import (
    FrameBuffer,
    FrameTooLarge,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.api_versions_response import ApiVersionsResponse
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.metadata_response import MetadataResponse


def test_flexible_request_uses_header_v2_and_keeps_client_id_non_compact() -> None:
    frame = encode_request(MetadataRequest(topics=None), 12, correlation_id=42, client_id="cli")
    # size, api key 3, version 12, correlation id 42, client id as int16 length + bytes, empty tags
    assert frame[4:12] == b"\x00\x03\x00\x0c\x00\x00\x00\x2a"
    assert frame[12:17] == b"\x00\x03cli"
    assert frame[17] == 0
    request = decode_request(frame[4:])
    assert (request.api_key, request.api_version, request.correlation_id) == (3, 12, 42)
    assert request.header.client_id == "cli"
    assert request.body.topics is None


def test_api_versions_response_always_uses_header_v0() -> None:
    body = ApiVersionsResponse(api_keys=[ApiVersionsResponse.ApiVersion(api_key=18, min_version=0, max_version=4)])
    frame = encode_response(body, 18, 3, correlation_id=9)
    # correlation id directly followed by the body's error code: no header tagged-field byte
    assert bytes(frame[4:10]) == b"\x00\x00\x00\x09\x00\x00"
    assert decode_response(frame[4:], 18, 3)[1] == body


def test_flexible_response_header_has_tagged_fields() -> None:
    frame = encode_response(MetadataResponse(), 3, 12, correlation_id=1)
    assert bytes(frame[4:9]) == b"\x00\x00\x00\x01\x00"


def test_unsupported_api_versions_version_still_decodes_header() -> None:
    frame = bytearray(encode_request(ApiVersionsRequest(), 3, correlation_id=5))
    frame[6:8] = (99).to_bytes(2, "big")
    request = decode_request(bytes(frame[4:]))
    assert request.body is None and request.api_version == 99 and request.correlation_id == 5


def test_unknown_api_key_gives_body_none() -> None:
    frame = bytearray(encode_request(MetadataRequest(), 1, correlation_id=5))
    frame[4:6] = (9999).to_bytes(2, "big")
    request = decode_request(bytes(frame[4:]))
    assert request.api is None and request.body is None


def test_truncated_request_is_a_decode_error() -> None:
    frame = encode_request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="t")]), 4, 1)
    for cut in range(4, len(frame) - 1):
        with pytest.raises(DecodeError):
            decode_request(frame[4:cut])


def test_frame_buffer_splits_a_stream() -> None:
    frames = [encode_request(MetadataRequest(), 1, i) for i in range(3)]
    stream = b"".join(frames)
    buffer = FrameBuffer()
    got = []
    for i in range(0, len(stream), 7):
        buffer.feed(stream[i : i + 7])
        while (frame := buffer.next_frame()) is not None:
            got.append(frame)
    assert got == [f[4:] for f in frames]
    assert buffer.pending == 0


def test_frame_buffer_rejects_oversized_and_negative_sizes() -> None:
    for limit, prefix in ((100, b"\x00\x00\x01\x00"), (1 << 20, b"\xff\xff\xff\xff")):
        buffer = FrameBuffer(max_frame_size=limit)
        target = buffer.read_buffer()
        target[:4] = prefix
        buffer.commit(4)
        with pytest.raises(FrameTooLarge):
            buffer.next_frame()
        with pytest.raises(FrameTooLarge):  # feed() takes frames as it goes, so it reports it too
            FrameBuffer(max_frame_size=limit).feed(prefix)


def _framed(sizes: list[int]) -> tuple[bytes, list[bytes]]:
    bodies = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    return b"".join(len(b).to_bytes(4, "big") + b for b in bodies), bodies


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 3, 100, 4000, 5000, 9000, 70000]), max_size=12),
    reads=st.lists(st.integers(1, 20000), min_size=1, max_size=50),
)
def test_frame_buffer_recv_into_path_returns_every_frame_intact(sizes: list[int], reads: list[int]) -> None:
    # A small chunk so that frames straddle it, fill it, and outgrow it (their own buffer).
    stream, bodies = _framed(sizes)
    buffer = FrameBuffer(chunk_size=8192)
    got: list[bytearray] = []
    position = 0
    step = 0
    while position < len(stream):
        with buffer.read_buffer() as target:
            assert len(target) > 0
            count = min(len(target), reads[step % len(reads)], len(stream) - position)
            target[:count] = stream[position : position + count]
        buffer.commit(count)
        position += count
        step += 1
        while (frame := buffer.next_frame()) is not None:
            got.append(frame)
    assert got == bodies
    assert all(type(frame) is bytearray for frame in got)
    assert buffer.pending == 0


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 20000), max_size=8), piece=st.integers(1, 30000))
def test_frame_buffer_feed_path_matches(sizes: list[int], piece: int) -> None:
    stream, bodies = _framed(sizes)
    buffer = FrameBuffer(chunk_size=4096)
    got = []
    for i in range(0, len(stream), piece):
        buffer.feed(stream[i : i + piece])
        while (frame := buffer.next_frame()) is not None:
            got.append(frame)
    assert got == bodies and buffer.pending == 0


def test_trailing_bytes_after_a_request_body_are_ignored_as_kafka_does() -> None:
    # librdkafka 2.x sends Metadata v13 with three bytes after the body; Kafka ignores them.
    frame = bytes.fromhex("0003000d00000003000772646b61666b610000000000010000")
    request = decode_request(frame)
    assert (request.api_key, request.api_version, request.correlation_id) == (3, 13, 3)
    assert request.header.client_id == "rdkafka"
    assert request.body.topics is None and request.body.allow_auto_topic_creation is False
    assert request.trailing_bytes == 3


class _Region:
    """Stands for bytes the transport sends itself (the broker's file regions)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __bytes__(self) -> bytes:
        return self.data


def _fetch_response(records: list[object]) -> FetchResponse:
    partitions = [
        FetchResponse.PartitionData(partition_index=i, high_watermark=10 + i, records=r)  # type: ignore[arg-type]
        for i, r in enumerate(records)
    ]
    return FetchResponse(responses=[FetchResponse.FetchableTopicResponse(topic="t", partitions=partitions)])


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_records_given_as_regions_are_left_as_gaps_that_splice_back_to_the_plain_encoding(version: int) -> None:
    payloads = [b"first batch bytes", b"", b"third" * 50]
    plain = encode_response(_fetch_response(payloads), 1, version, 77)
    assert not plain.splices
    spliced = encode_response(_fetch_response([_Region(p) if p else p for p in payloads]), 1, version, 77)
    assert [len(region) for _, region in spliced.splices] == [len(payloads[0]), len(payloads[2])]
    assert spliced.spliced_length == len(payloads[0]) + len(payloads[2])
    assert len(spliced) + spliced.spliced_length == len(plain)
    # Reassembled in place, it is byte for byte the ordinary encoding, size prefix included.
    pieces, previous = [], 0
    for position, region in spliced.splices:
        pieces += [bytes(spliced[previous:position]), bytes(region)]
        previous = position
    pieces.append(bytes(spliced[previous:]))
    assert b"".join(pieces) == bytes(plain)
    # Encoding into a plain buffer (no transport to splice) copies the region's bytes in.
    body = bytearray()
    _fetch_response([_Region(p) for p in payloads]).encode_into(body, version)
    assert bytes(body) == bytes(plain[len(plain) - len(body) :])


def test_a_large_frame_buffer_grows_with_the_bytes_that_arrive() -> None:
    body = bytes(range(256)) * (3 * 4096 + 7)  # just over 3 MiB
    stream = len(body).to_bytes(4, "big") + body
    buffer = FrameBuffer(max_frame_size=100 << 20)
    position = 0
    reserved = []
    while position < len(stream):
        target = buffer.read_buffer()
        reserved.append(len(target))
        count = min(len(target), 65536, len(stream) - position)
        target[:count] = stream[position : position + count]
        target.release()
        buffer.commit(count)
        position += count
    assert max(reserved) <= 2 << 20  # never the whole 3 MiB up front
    assert buffer.next_frame() == body and buffer.pending == 0


def test_a_size_prefix_alone_does_not_reserve_its_size() -> None:
    buffer = FrameBuffer(max_frame_size=100 << 20)
    buffer.feed((100 << 20).to_bytes(4, "big") + b"x" * 20_000)  # claims 100 MiB, sends 20 kB
    assert buffer.next_frame() is None
    assert len(buffer.read_buffer()) <= 1 << 20
