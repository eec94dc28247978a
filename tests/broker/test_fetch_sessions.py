"""Fetch sessions (KIP-227) on the wire: full requests open them, incremental ones carry only what changed."""

from __future__ import annotations

import random
import uuid

import pytest

from kbroker.fetch_sessions import CachedPartition, FetchSessionCache, next_epoch
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch

TOPIC = "sessions"


def _setup(client: WireClient, partitions: int = 3) -> uuid.UUID:
    topic = CreateTopicsRequest.CreatableTopic(name=TOPIC, num_partitions=partitions, replication_factor=1)
    created = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7)
    assert created.topics[0].error_code == ErrorCode.NONE
    metadata = client.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC)]), 12)
    return metadata.topics[0].topic_id


def _produce(client: WireClient, partition: int, values: list[bytes]) -> int:
    batch = build_batch([Record(offset_delta=i, value=v) for i, v in enumerate(values)], base_timestamp=0)
    data = ProduceRequest.PartitionProduceData(index=partition, records=batch)
    request = ProduceRequest(
        acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=TOPIC, partition_data=[data])]
    )
    answer = client.request(request, 9).responses[0].partition_responses[0]
    assert answer.error_code == ErrorCode.NONE
    return answer.base_offset


def _fetch(
    client: WireClient,
    version: int,
    session_id: int,
    epoch: int,
    positions: dict[int, int],
    topic_id: uuid.UUID,
    forget: list[int] | None = None,
    last_fetched_epoch: int = -1,
) -> FetchResponse:
    partitions = [
        FetchRequest.FetchPartition(
            partition=p, fetch_offset=offset, partition_max_bytes=1 << 20, last_fetched_epoch=last_fetched_epoch
        )
        for p, offset in positions.items()
    ]
    topics = [FetchRequest.FetchTopic(topic=TOPIC, topic_id=topic_id, partitions=partitions)] if partitions else []
    forgotten = [FetchRequest.ForgottenTopic(topic=TOPIC, topic_id=topic_id, partitions=forget)] if forget else []
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=10 << 20,
        isolation_level=0,
        session_id=session_id,
        session_epoch=epoch,
        topics=topics,
        forgotten_topics_data=forgotten,
    )
    return client.request(request, version)


def _answered(response: FetchResponse) -> dict[int, tuple[int, int]]:
    """partition -> (high watermark, bytes of records) for every partition in the response."""
    return {
        p.partition_index: (p.high_watermark, len(p.records or b""))
        for topic in response.responses
        for p in topic.partitions
    }


@pytest.mark.parametrize("version", [11, 12, 13, 17])
def test_a_session_answers_only_partitions_with_news(broker: RunningBroker, version: int) -> None:
    with WireClient(broker.bootstrap) as client:
        topic_id = _setup(client)
        _produce(client, 0, [b"a", b"b"])
        full = _fetch(client, version, 0, 0, {0: 0, 1: 0, 2: 0}, topic_id)
        assert full.error_code == ErrorCode.NONE and full.session_id != 0
        answered = _answered(full)
        assert set(answered) == {0, 1, 2} and answered[0][0] == 2 and answered[0][1] > 0
        session = full.session_id

        # Nothing changed and nothing moved: an empty incremental answer.
        quiet = _fetch(client, version, session, 1, {0: 2}, topic_id)
        assert (quiet.error_code, quiet.session_id, _answered(quiet)) == (ErrorCode.NONE, session, {})

        # New data on partition 2 only: only partition 2 comes back, from the cached position 0.
        _produce(client, 2, [b"x"])
        news = _fetch(client, version, session, 2, {}, topic_id)
        assert set(_answered(news)) == {2} and _answered(news)[2][0] == 1 and _answered(news)[2][1] > 0

        # The same request again (the client did not move partition 2): the same data, as Kafka does.
        again = _fetch(client, version, session, 3, {}, topic_id)
        assert set(_answered(again)) == {2}

        # Moving partition 2 past its data: nothing new to say.
        moved = _fetch(client, version, session, 4, {2: 1}, topic_id)
        assert _answered(moved) == {}

        # Forgotten partitions leave the session: new data there is not reported.
        _produce(client, 1, [b"y"])
        forgot = _fetch(client, version, session, 5, {}, topic_id, forget=[1])
        assert _answered(forgot) == {}
        _produce(client, 0, [b"z"])
        assert set(_answered(_fetch(client, version, session, 6, {}, topic_id))) == {0}


def test_a_diverging_epoch_is_answered_though_nothing_else_changed(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        topic_id = _setup(client, partitions=1)
        _produce(client, 0, [b"a", b"b", b"c"])
        full = _fetch(client, 13, 0, 0, {0: 3}, topic_id, last_fetched_epoch=0)
        assert full.session_id != 0 and _answered(full) == {0: (3, 0)}
        session = full.session_id

        # The fetcher's log goes on past this one's in the same epoch (an unclean election cut this log): the high
        # watermark is the same, yet the answer must say where to truncate, as Kafka's.
        diverged = _fetch(client, 13, session, 1, {0: 5}, topic_id, last_fetched_epoch=0)
        # Not named again, the position and epoch cached still diverge: said again.
        again = _fetch(client, 13, session, 2, {}, topic_id)
        for response in (diverged, again):
            assert _answered(response) == {0: (3, 0)}
            divergence = response.responses[0].partitions[0].diverging_epoch
            assert (divergence.epoch, divergence.end_offset) == (0, 3)


def test_session_errors_are_kafkas(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        topic_id = _setup(client)
        session = _fetch(client, 12, 0, 0, {0: 0}, topic_id).session_id
        assert session != 0
        wrong_epoch = _fetch(client, 12, session, 5, {}, topic_id)
        assert (wrong_epoch.error_code, wrong_epoch.session_id) == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0)
        unknown = _fetch(client, 12, session + 1, 1, {}, topic_id)
        assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        # A session opened by name cannot go on by topic id.
        switched = _fetch(client, 13, session, 1, {}, topic_id)
        assert switched.error_code == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
        # The epoch is not used up by a failed request: epoch 1 still works.
        assert _fetch(client, 12, session, 1, {}, topic_id).error_code == ErrorCode.NONE
        # A full request with epoch -1 closes the session and opens none.
        closing = _fetch(client, 12, session, -1, {0: 0}, topic_id)
        assert closing.session_id == 0 and set(_answered(closing)) == {0}
        assert _fetch(client, 12, session, 2, {}, topic_id).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_forgetting_every_partition_ends_the_session(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        topic_id = _setup(client, partitions=1)
        session = _fetch(client, 12, 0, 0, {0: 0}, topic_id).session_id
        ended = _fetch(client, 12, session, 1, {}, topic_id, forget=[0])
        assert (ended.error_code, _answered(ended)) == (ErrorCode.NONE, {})
        assert _fetch(client, 12, session, 2, {}, topic_id).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_an_errored_partition_is_repeated_until_the_error_clears() -> None:
    cached = CachedPartition(fetch_offset=0, max_bytes=100)
    cached.remember(high_watermark=5, log_start_offset=0, error=0)
    assert not cached.must_respond(False, 5, 0, 0)
    assert cached.must_respond(False, 5, 0, ErrorCode.OFFSET_OUT_OF_RANGE)
    cached.remember(5, 0, ErrorCode.OFFSET_OUT_OF_RANGE)
    assert cached.must_respond(False, 5, 0, 0)  # the high watermark was forgotten with the error
    assert cached.must_respond(False, 5, 3, 0) and cached.must_respond(True, 5, 0, 0)


def test_epochs_wrap_past_int32_to_one() -> None:
    assert next_epoch(1) == 2 and next_epoch(2**31 - 1) == 1


def test_a_full_cache_evicts_stale_then_smaller_settled_sessions_only() -> None:
    cache = FetchSessionCache(max_sessions=2, eviction_ms=1000, rng=random.Random(7))

    def parts(n: int) -> dict[tuple[object, int], CachedPartition]:
        return {("t", i): CachedPartition(0, 1) for i in range(n)}

    first = cache.create(0, False, parts(5))
    second = cache.create(0, False, parts(2))
    assert first is not None and second is not None and first.id != second.id
    assert cache.create(500, False, parts(10)) is None  # nobody is stale or settled yet
    cache.touch(first, 1500)
    third = cache.create(1600, False, parts(3))  # second was last used at 0: stale, evicted
    assert third is not None and cache.get(second.id) is None and len(cache) == 2
    cache.touch(third, 2500)
    cache.touch(first, 2500)
    assert cache.create(2600, False, parts(1)) is None  # no stale one; settled ones are bigger
    fourth = cache.create(2700, False, parts(4))  # first (5) is bigger, third (3) settled and smaller
    assert fourth is not None and cache.get(third.id) is None and cache.get(first.id) is first
