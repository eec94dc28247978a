"""The cyclic garbage collector is paused while a huge request is in hand (kbroker.server.offload): a full
collection of its millions of objects stopped the event loop for a third of a second (issue #26, item 5); the
live latency bound is in tests/broker/test_large_requests.py."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kbroker.server import offload
from protocol.framing import encode_request
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.metadata_request import MetadataRequest


def frame_of(request: object, api_version: int) -> bytearray:
    return bytearray(encode_request(request, api_version, 7)[4:])  # without the size prefix


HUGE = frame_of(
    FetchRequest(
        max_wait_ms=0,
        min_bytes=0,
        topics=[
            FetchRequest.FetchTopic(
                topic="t",
                partitions=[FetchRequest.FetchPartition(partition=i, fetch_offset=0) for i in range(5000)],
            )
        ],
    ),
    12,
)
SMALL = frame_of(MetadataRequest(topics=None), 12)


@pytest.fixture
def collector() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.enable()
    yield
    assert offload._COLLECTOR_PAUSE.holders == 0
    if not was_enabled:
        gc.disable()


def test_a_huge_request_pauses_the_collector_until_the_last_one_is_answered(collector: None) -> None:
    assert offload.is_huge(HUGE) and not offload.is_huge(SMALL)
    with offload.collector_paused(SMALL):
        assert gc.isenabled()
    with offload.collector_paused(HUGE):
        assert not gc.isenabled()
        with offload.collector_paused(HUGE):
            assert not gc.isenabled()
        assert not gc.isenabled()  # the first is still in hand
    assert gc.isenabled()


def test_the_collector_resumes_when_a_huge_request_fails(collector: None) -> None:
    with pytest.raises(RuntimeError), offload.collector_paused(HUGE):
        raise RuntimeError("handler failed")
    assert gc.isenabled()


def test_a_collector_someone_else_disabled_stays_disabled(collector: None) -> None:
    gc.disable()
    with offload.collector_paused(HUGE):
        assert not gc.isenabled()
    assert not gc.isenabled()
    gc.enable()


def test_overlapping_huge_requests_cannot_keep_the_collector_off_for_good(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    collections = []
    monkeypatch.setattr(offload.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(offload.gc, "collect", lambda: collections.append(clock[0]) or 0)
    with offload.collector_paused(HUGE):
        for _ in range(25):  # a new huge request every second while another is still in hand
            clock[0] += 1.0
            with offload.collector_paused(HUGE):
                assert not gc.isenabled()
    assert collections == [1011.0, 1022.0]  # once the pause had lasted longer than LONGEST_S (10 s)
    assert gc.isenabled()
