"""The transaction APIs sent to kbroker and to Apache Kafka 4.4 (the ``apache_kafka`` fixture), error codes and
epochs compared: InitProducerId (bump, invalid timeout, KIP-360 fencing), AddPartitionsToTxn (unknown id, another
producer id, unknown partitions, a fenced epoch at v1 and v2), EndTxn (wrong state, fenced, retry, v5's epoch
bump), AddOffsetsToTxn, TxnOffsetCommit (not added, fenced) and the transaction.version feature. Producer ids
differ between the brokers, so each scenario reports epochs and codes, never the ids themselves."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from compat.apache_kafka import ApacheKafka
from kbroker.config import KEYS as BROKER_KEYS
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.add_offsets_to_txn_request import AddOffsetsToTxnRequest
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.metadata_request import MetadataRequest
from tests.transactions.test_transaction_apis import add_partitions, committed, end, init, txn_offset_commit

# What a client retries while Kafka's coordinator loads __transaction_state or a transaction completes.
GROUP_KEY, TRANSACTION_KEY = 0, 1
RETRIABLE = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.CONCURRENT_TRANSACTIONS,
}


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory, apache_kafka: ApacheKafka) -> Iterator[dict[str, str]]:
    """{"kafka": bootstrap, "kbroker": bootstrap}, kbroker set up like the Kafka fixture."""
    overrides = {name: value for name, value in apache_kafka.settings.items() if name in BROKER_KEYS}
    with RunningBroker(tmp_path_factory.mktemp("kbroker"), {**overrides, "node.id": "1"}) as running:
        yield {"kafka": apache_kafka.bootstrap, "kbroker": running.bootstrap}


def create_topic(client: WireClient, name: str) -> None:
    topic = CreateTopicsRequest.CreatableTopic(name=name, num_partitions=2, replication_factor=1)
    assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7).topics[0].error_code == 0
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=name)], allow_auto_topic_creation=False)
    deadline = time.monotonic() + 10
    while True:  # Kafka answers CreateTopics before its metadata names the leaders
        answer = client.request(request, 12).topics[0]
        if answer.error_code == 0 and len(answer.partitions) == 2 and all(p.leader_id >= 0 for p in answer.partitions):
            return
        assert time.monotonic() < deadline, f"{name} has no leaders"
        time.sleep(0.1)


def find_coordinator(client: WireClient, key: str, key_type: int) -> None:
    """Until the coordinator is there: Kafka creates __transaction_state / __consumer_offsets on first use."""
    deadline = time.monotonic() + 60
    while client.request(FindCoordinatorRequest(key=key, key_type=key_type), 3).error_code != ErrorCode.NONE:
        assert time.monotonic() < deadline, f"no coordinator for {key}"
        time.sleep(0.2)


def init_retrying(client: WireClient, tid: str, **kwargs: Any) -> Any:
    """FindCoordinator (Kafka creates __transaction_state on the first one), then InitProducerId until it is not a
    retriable error."""
    find_coordinator(client, tid, TRANSACTION_KEY)
    deadline = time.monotonic() + 30
    while True:
        answer = init(client, tid, **kwargs)
        if answer.error_code not in RETRIABLE or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def settled(call: Callable[[], Any]) -> Any:
    """``call()`` again while it answers CONCURRENT_TRANSACTIONS: Kafka writes the markers of the transaction
    just ended after answering EndTxn, kbroker before (UNSUPPORTED.md)."""
    deadline = time.monotonic() + 30
    while True:
        answer = call()
        code = answer.error_code if hasattr(answer, "error_code") else next(iter(answer.values()))
        if code != ErrorCode.CONCURRENT_TRANSACTIONS or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


def scenario(bootstrap: str, run: str) -> dict[str, Any]:
    """The same requests to one broker; what each answered (epochs and codes only)."""
    topic, tid = f"txn-{run}", f"tid-{run}"
    seen: dict[str, Any] = {}
    with WireClient(bootstrap, timeout=30) as client:
        create_topic(client, topic)
        first = init_retrying(client, tid)
        pid = first.producer_id
        seen["init"] = (first.error_code, first.producer_epoch)
        seen["init_bad_timeout"] = init(client, tid, timeout=900_001).error_code
        seen["init_zero_timeout"] = init(client, tid, timeout=0).error_code
        seen["end_nothing_begun"] = end(client, tid, pid, 0, True).error_code
        seen["end_fenced_v3"] = end(client, tid, pid, 7, True).error_code
        seen["end_fenced_v1"] = end(client, tid, pid, 7, True, version=1).error_code
        seen["end_unknown_id"] = end(client, f"nobody-{run}", pid, 0, True).error_code
        seen["add_unknown_id"] = add_partitions(client, f"nobody-{run}", pid, 0, {topic: [0]})
        seen["add_other_pid"] = add_partitions(client, tid, pid + 1000, 0, {topic: [0]})
        seen["add_unknown_partition"] = add_partitions(client, tid, pid, 0, {topic: [0, 9]})
        find_coordinator(client, f"g-{run}", GROUP_KEY)
        seen["txn_offset_commit_not_added"] = txn_offset_commit(client, tid, pid, 0, f"g-{run}", 5, topic=topic)
        seen["add"] = add_partitions(client, tid, pid, 0, {topic: [0, 1]})
        add_offsets = AddOffsetsToTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=0, group_id=f"g-{run}"
        )
        seen["add_offsets"] = client.request(add_offsets, 3).error_code
        seen["txn_offset_commit_fenced"] = txn_offset_commit(client, tid, pid, 3, f"g-{run}", 5, topic=topic)
        seen["txn_offset_commit_fenced_v1"] = txn_offset_commit(client, tid, pid, 3, f"g-{run}", 5, 1, topic)
        seen["txn_offset_commit_other_pid"] = txn_offset_commit(client, tid, pid + 1000, 0, f"g-{run}", 5, topic=topic)
        seen["txn_offset_commit_unknown_id"] = txn_offset_commit(
            client, f"nobody-{run}", pid, 0, f"g-{run}", 5, topic=topic
        )
        # KIP-447: a generation for a group that has none.
        seen["txn_offset_commit_generation"] = txn_offset_commit(
            client, tid, pid, 0, f"g-{run}", 5, topic=topic, generation=3, member="m"
        )
        seen["txn_offset_commit_unknown_topic"] = txn_offset_commit(client, tid, pid, 0, f"g-{run}", 5, topic="nope")
        seen["txn_offset_commit"] = txn_offset_commit(client, tid, pid, 0, f"g-{run}", 5, topic=topic)
        commit_answer = end(client, tid, pid, 0, True)
        seen["commit"] = commit_answer.error_code
        retry_deadline = time.monotonic() + 30
        while True:  # Kafka completes the markers after answering: a retry says CONCURRENT_TRANSACTIONS meanwhile
            retried = end(client, tid, pid, 0, True).error_code
            if retried != ErrorCode.CONCURRENT_TRANSACTIONS or time.monotonic() > retry_deadline:
                break
            time.sleep(0.1)
        seen["commit_retry"] = retried
        seen["abort_after_commit"] = end(client, tid, pid, 0, False).error_code
        # A new instance while a transaction is open: the old one is aborted and fenced.
        add_partitions(client, tid, pid, 0, {topic: [0]})
        second = init(client, tid)
        seen["init_over_open_txn"] = second.error_code
        third = init_retrying(client, tid)
        seen["init_after_abort"] = (third.error_code, third.producer_epoch)
        seen["add_fenced_v2"] = add_partitions(client, tid, pid, 0, {topic: [0]}, version=2)
        seen["add_fenced_v1"] = add_partitions(client, tid, pid, 0, {topic: [0]}, version=1)
        seen["kip360_old_epoch_v4"] = init(client, tid, pid=pid, epoch=0, version=4).error_code
        seen["kip360_old_epoch_v3"] = init(client, tid, pid=pid, epoch=0, version=3).error_code
        # Transaction version 2: EndTxn v5 answers the bumped epoch.
        tv2 = f"{tid}-tv2"
        tv2_pid = init_retrying(client, tv2, version=5).producer_id
        add_partitions(client, tv2, tv2_pid, 0, {topic: [1]})
        bumped = end(client, tv2, tv2_pid, 0, True, version=5)
        seen["end_v5"] = (bumped.error_code, bumped.producer_id == tv2_pid, bumped.producer_epoch)
        retried_v5 = settled(lambda: end(client, tv2, tv2_pid, 0, True, version=5))
        seen["end_v5_retry"] = (retried_v5.error_code, retried_v5.producer_id == tv2_pid, retried_v5.producer_epoch)
        wrong = settled(lambda: end(client, tv2, tv2_pid, 1, True, version=5))
        seen["end_v5_commit_nothing"] = (wrong.error_code, wrong.producer_id, wrong.producer_epoch)
        empty_abort = settled(lambda: end(client, tv2, tv2_pid, 1, False, version=5))
        seen["end_v5_abort_nothing"] = (empty_abort.error_code, empty_abort.producer_epoch)
        # TxnOffsetCommit v5 adds the group to the transaction itself; the offset shows once committed.
        group = f"g5-{run}"
        find_coordinator(client, group, GROUP_KEY)
        settled(lambda: add_partitions(client, tv2, tv2_pid, 2, {topic: [0]}))
        seen["txn_offset_commit_v5"] = txn_offset_commit(client, tv2, tv2_pid, 2, group, 9, version=5, topic=topic)
        seen["committed_before"] = committed(client, group, topic)
        seen["end_v5_commit_offsets"] = end(client, tv2, tv2_pid, 2, True, version=5).error_code
        deadline = time.monotonic() + 30
        while committed(client, group, topic) != 9 and time.monotonic() < deadline:
            time.sleep(0.1)  # Kafka applies the offsets when its marker reaches __consumer_offsets
        seen["committed_after"] = committed(client, group, topic)
        # AddPartitionsToTxn v4 verify_only, as Kafka 4 brokers ask their coordinator.
        verify = AddPartitionsToTxnRequest(
            transactions=[
                AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction(
                    transactional_id=tv2,
                    producer_id=tv2_pid,
                    producer_epoch=3,
                    verify_only=True,
                    topics=[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=topic, partitions=[0])],
                )
            ]
        )
        settled(lambda: add_partitions(client, tv2, tv2_pid, 3, {topic: [1]}))
        verified = client.request(verify, 4)
        seen["verify_only"] = (
            verified.error_code,
            [
                (p.partition_index, p.partition_error_code)
                for r in verified.results_by_transaction
                for t in r.topic_results
                for p in t.results_by_partition
            ],
        )
        features = client.request(ApiVersionsRequest(client_software_name="x", client_software_version="1"), 4)
        seen["transaction.version"] = (
            [(f.min_version, f.max_version) for f in features.supported_features if f.name == "transaction.version"],
            [
                (f.min_version_level, f.max_version_level)
                for f in features.finalized_features
                if f.name == "transaction.version"
            ],
        )
    return seen


def test_transaction_error_codes_match_kafka(brokers: dict[str, str]) -> None:
    run = uuid.uuid4().hex[:8]
    kafka = scenario(brokers["kafka"], f"k{run}")
    ours = scenario(brokers["kbroker"], f"k{run}")
    differing = {key: (kafka[key], ours[key]) for key in kafka if kafka[key] != ours[key]}
    assert differing == {}
