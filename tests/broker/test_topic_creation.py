"""Creating topics and partitions does its file work off the event loop, and concurrent changes stay consistent."""

from __future__ import annotations

import threading
import time

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_partitions_request import CreatePartitionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.metadata_request import MetadataRequest


def _create(bootstrap: str, name: str, partitions: int) -> int:
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1)
    with WireClient(bootstrap, timeout=120) as client:
        return client.request(CreateTopicsRequest(topics=[topic], timeout_ms=60_000), 7).topics[0].error_code


def _partitions(bootstrap: str, name: str) -> int:
    with WireClient(bootstrap) as client:
        metadata = client.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=name)]), 12)
    assert metadata.topics[0].error_code == ErrorCode.NONE
    return len(metadata.topics[0].partitions)


def test_other_clients_are_answered_while_a_large_topic_is_created(broker: RunningBroker) -> None:
    result: list[int] = []
    creating = threading.Thread(target=lambda: result.append(_create(broker.bootstrap, "wide", 800)))
    with WireClient(broker.bootstrap) as other:
        other.request(ApiVersionsRequest(), 3)  # connected and warmed up before the creation starts
        creating.start()
        answered_during_creation = 0
        while creating.is_alive():
            other.request(ApiVersionsRequest(), 3)
            answered_during_creation += int(creating.is_alive())
            time.sleep(0.005)
    creating.join()
    assert result == [ErrorCode.NONE]
    assert answered_during_creation > 0  # with the file work on the event loop this stays 0
    assert _partitions(broker.bootstrap, "wide") == 800
    # Every partition has its first segment already, and they all survive a restart.
    data_dir = broker.data_dir
    assert all((data_dir / f"wide-{i}" / "00000000000000000000.log").exists() for i in range(800))
    broker.restart()
    assert _partitions(broker.bootstrap, "wide") == 800


def test_concurrent_creates_of_one_name_make_one_topic(broker: RunningBroker) -> None:
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(_create(broker.bootstrap, "race", 200))) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS, ErrorCode.TOPIC_ALREADY_EXISTS]
    assert _partitions(broker.bootstrap, "race") == 200


def test_concurrent_partition_increases_apply_once(broker: RunningBroker) -> None:
    assert _create(broker.bootstrap, "grow", 1) == ErrorCode.NONE
    results: list[int] = []

    def grow() -> None:
        request = CreatePartitionsRequest(
            topics=[CreatePartitionsRequest.CreatePartitionsTopic(name="grow", count=300, assignments=None)],
            timeout_ms=60_000,
            validate_only=False,
        )
        with WireClient(broker.bootstrap, timeout=120) as client:
            results.append(client.request(request, 3).results[0].error_code)

    threads = [threading.Thread(target=grow) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [ErrorCode.NONE, ErrorCode.INVALID_PARTITIONS]
    assert _partitions(broker.bootstrap, "grow") == 300


def test_a_request_for_more_than_ten_thousand_partitions_is_a_policy_violation(broker: RunningBroker) -> None:
    # Kafka's controller refuses to add over 10,000 partitions in one request (KAFKA-17870, KAFKA-19673).
    topics = [
        CreateTopicsRequest.CreatableTopic(name="a", num_partitions=6000, replication_factor=1),
        CreateTopicsRequest.CreatableTopic(name="b", num_partitions=4001, replication_factor=1),
    ]
    with WireClient(broker.bootstrap) as client:
        for validate_only in (True, False):
            answer = client.request(CreateTopicsRequest(topics=topics, timeout_ms=5000, validate_only=validate_only), 7)
            assert [(t.name, t.error_code) for t in answer.topics] == [
                ("a", ErrorCode.POLICY_VIOLATION),
                ("b", ErrorCode.POLICY_VIOLATION),
            ]
        assert _create(broker.bootstrap, "small", 2) == ErrorCode.NONE
        grow = CreatePartitionsRequest.CreatePartitionsTopic(name="small", count=2**31 - 1, assignments=None)
        answer = client.request(CreatePartitionsRequest(topics=[grow], timeout_ms=5000, validate_only=False), 3)
        assert answer.results[0].error_code == ErrorCode.POLICY_VIOLATION
    assert _partitions(broker.bootstrap, "small") == 2
