"""The transaction APIs over the wire (WireClient against a running broker): FindCoordinator for a transactional
id, InitProducerId with one, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn (v3 and the TV2 v5), TxnOffsetCommit, and
ApiVersions' transaction.version feature; the error codes for fenced epochs, the wrong state, an unknown
transactional id and an invalid timeout, per version where Kafka maps PRODUCER_FENCED for older clients."""

from __future__ import annotations

import time
from typing import Any

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.add_offsets_to_txn_request import AddOffsetsToTxnRequest
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.end_txn_request import EndTxnRequest
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.messages.list_offsets_request import ListOffsetsRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.messages.txn_offset_commit_request import TxnOffsetCommitRequest
from protocol.records import Record, build_batch

TOPIC = "txn-topic"


def create(client: WireClient) -> None:
    topic = CreateTopicsRequest.CreatableTopic(name=TOPIC, num_partitions=2, replication_factor=1)
    assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0


def init(client: WireClient, tid: str, timeout: int = 60_000, version: int = 4, pid: int = -1, epoch: int = -1) -> Any:
    request = InitProducerIdRequest(
        transactional_id=tid, transaction_timeout_ms=timeout, producer_id=pid, producer_epoch=epoch
    )
    return client.request(request, version)


def add_partitions(
    client: WireClient, tid: str, pid: int, epoch: int, partitions: dict[str, list[int]], version: int = 3
) -> dict[tuple[str, int], int]:
    request = AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=tid,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[
            AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=p) for t, p in partitions.items()
        ],
    )
    answer = client.request(request, version)
    return {
        (t.name, p.partition_index): p.partition_error_code
        for t in answer.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


def end(client: WireClient, tid: str, pid: int, epoch: int, commit: bool, version: int = 3) -> Any:
    request = EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch, committed=commit)
    return client.request(request, version)


def log_end(client: WireClient, partition: int) -> int:
    wanted = [ListOffsetsRequest.ListOffsetsPartition(partition_index=partition, timestamp=-1)]
    request = ListOffsetsRequest(
        replica_id=-1, topics=[ListOffsetsRequest.ListOffsetsTopic(name=TOPIC, partitions=wanted)]
    )
    offset: int = client.request(request, 7).topics[0].partitions[0].offset
    return offset


def committed(client: WireClient, group: str, topic: str = TOPIC) -> int:
    request = OffsetFetchRequest(
        group_id=group, topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])]
    )
    offset: int = client.request(request, 5).topics[0].partitions[0].committed_offset
    return offset


def txn_offset_commit(
    client: WireClient,
    tid: str,
    pid: int,
    epoch: int,
    group: str,
    offset: int,
    version: int = 3,
    topic: str = TOPIC,
    generation: int = -1,
    member: str = "",
) -> int:
    partition = TxnOffsetCommitRequest.TxnOffsetCommitRequestPartition(
        partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""
    )
    request = TxnOffsetCommitRequest(
        transactional_id=tid,
        group_id=group,
        producer_id=pid,
        producer_epoch=epoch,
        generation_id_or_member_epoch=generation,
        member_id=member,
        topics=[TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=topic, partitions=[partition])],
    )
    code: int = client.request(request, version).topics[0].partitions[0].error_code
    return code


def test_find_coordinator_for_a_transactional_id(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        answer = client.request(FindCoordinatorRequest(key="t", key_type=1), 3)
        assert (answer.error_code, answer.node_id) == (ErrorCode.NONE, 0)
        batched = client.request(FindCoordinatorRequest(key_type=1, coordinator_keys=["t", "u"]), 4)
        assert [(c.key, c.error_code, c.node_id) for c in batched.coordinators] == [("t", 0, 0), ("u", 0, 0)]


def test_init_producer_id_bumps_fences_and_checks_the_timeout(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        first = init(client, "tid-init")
        assert first.error_code == ErrorCode.NONE and first.producer_epoch == 0
        pid = first.producer_id
        assert (init(client, "tid-init").producer_id, init(client, "tid-init").producer_epoch) == (pid, 2)
        assert init(client, "tid-init", timeout=900_001).error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
        assert init(client, "tid-init", timeout=0).error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
        assert init(client, "", timeout=1000).error_code == ErrorCode.INVALID_REQUEST
        # KIP-360: an old epoch is fenced (INVALID_PRODUCER_EPOCH before v4); a half-given id/epoch is invalid.
        assert init(client, "tid-init", pid=pid, epoch=0, version=4).error_code == ErrorCode.PRODUCER_FENCED
        assert init(client, "tid-init", pid=pid, epoch=0, version=3).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
        assert init(client, "tid-init", pid=pid, epoch=-1, version=4).error_code == ErrorCode.INVALID_REQUEST
        recovered = init(client, "tid-init", pid=pid, epoch=2, version=4)
        assert (recovered.error_code, recovered.producer_id, recovered.producer_epoch) == (0, pid, 3)
        # An idempotent producer still gets a fresh id at epoch 0.
        plain = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1), 4)
        assert plain.error_code == ErrorCode.NONE and plain.producer_epoch == 0 and plain.producer_id != pid


def test_add_partitions_error_codes(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        create(client)
        pid = init(client, "tid-add").producer_id
        assert add_partitions(client, "nobody", pid, 0, {TOPIC: [0]}) == {
            (TOPIC, 0): ErrorCode.INVALID_PRODUCER_ID_MAPPING
        }
        assert add_partitions(client, "tid-add", pid + 1000, 0, {TOPIC: [0]}) == {
            (TOPIC, 0): ErrorCode.INVALID_PRODUCER_ID_MAPPING
        }
        # One unknown partition fails the request; the others are not attempted.
        assert add_partitions(client, "tid-add", pid, 0, {TOPIC: [0, 7], "missing": [0]}) == {
            (TOPIC, 0): ErrorCode.OPERATION_NOT_ATTEMPTED,
            (TOPIC, 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ("missing", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        }
        assert add_partitions(client, "tid-add", pid, 0, {TOPIC: [0, 1]}) == {(TOPIC, 0): 0, (TOPIC, 1): 0}
        init(client, "tid-add")  # a new instance: aborts the open transaction, CONCURRENT_TRANSACTIONS
        assert add_partitions(client, "tid-add", pid, 0, {TOPIC: [0]}, version=2) == {
            (TOPIC, 0): ErrorCode.PRODUCER_FENCED
        }
        assert add_partitions(client, "tid-add", pid, 0, {TOPIC: [0]}, version=1) == {
            (TOPIC, 0): ErrorCode.INVALID_PRODUCER_EPOCH
        }


def test_end_txn_error_codes_and_markers(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        create(client)
        pid = init(client, "tid-end").producer_id
        assert end(client, "nobody", pid, 0, True).error_code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        assert end(client, "tid-end", pid, 0, True).error_code == ErrorCode.INVALID_TXN_STATE  # nothing begun
        assert end(client, "tid-end", pid, 5, True).error_code == ErrorCode.PRODUCER_FENCED
        assert end(client, "tid-end", pid, 5, True, version=1).error_code == ErrorCode.INVALID_PRODUCER_EPOCH
        add_partitions(client, "tid-end", pid, 0, {TOPIC: [1]})
        before = log_end(client, 1)
        answer = end(client, "tid-end", pid, 0, True)
        assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (0, -1, -1)
        assert log_end(client, 1) == before + 1  # the commit marker, written before the answer
        assert end(client, "tid-end", pid, 0, True).error_code == ErrorCode.NONE  # a retry
        assert end(client, "tid-end", pid, 0, False).error_code == ErrorCode.INVALID_TXN_STATE


def test_end_txn_v5_bumps_the_epoch(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        create(client)
        pid = init(client, "tid-tv2", version=5).producer_id
        add_partitions(client, "tid-tv2", pid, 0, {TOPIC: [0]})
        answer = end(client, "tid-tv2", pid, 0, True, version=5)
        assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (0, pid, 1)
        retried = end(client, "tid-tv2", pid, 0, True, version=5)
        assert (retried.error_code, retried.producer_id, retried.producer_epoch) == (0, pid, 1)
        assert add_partitions(client, "tid-tv2", pid, 0, {TOPIC: [0]}) == {(TOPIC, 0): ErrorCode.PRODUCER_FENCED}


def test_txn_offset_commit_is_visible_only_after_the_commit(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        create(client)
        pid = init(client, "tid-offsets").producer_id
        assert txn_offset_commit(client, "tid-offsets", pid, 0, "g1", 10) == ErrorCode.INVALID_TXN_STATE  # not added
        add = AddOffsetsToTxnRequest(transactional_id="tid-offsets", producer_id=pid, producer_epoch=0, group_id="g1")
        assert client.request(add, 3).error_code == ErrorCode.NONE
        # A fenced epoch, as Kafka's verification answers the group coordinator.
        assert txn_offset_commit(client, "tid-offsets", pid, 1, "g1", 10) == ErrorCode.INVALID_PRODUCER_EPOCH
        assert txn_offset_commit(client, "tid-offsets", pid, 1, "g1", 10, version=1) == ErrorCode.INVALID_PRODUCER_EPOCH
        assert txn_offset_commit(client, "tid-offsets", pid, 0, "g1", 10) == ErrorCode.NONE
        assert committed(client, "g1") == -1
        assert end(client, "tid-offsets", pid, 0, True).error_code == ErrorCode.NONE
        assert committed(client, "g1") == 10
        # Aborted: the offset stays as it was.
        client.request(
            AddOffsetsToTxnRequest(transactional_id="tid-offsets", producer_id=pid, producer_epoch=0, group_id="g1"), 3
        )
        assert txn_offset_commit(client, "tid-offsets", pid, 0, "g1", 20) == ErrorCode.NONE
        assert end(client, "tid-offsets", pid, 0, False).error_code == ErrorCode.NONE
        assert committed(client, "g1") == 10
        # v5 (TV2) adds the group itself.
        assert txn_offset_commit(client, "tid-offsets", pid, 0, "g2", 30, version=5) == ErrorCode.NONE
        assert end(client, "tid-offsets", pid, 0, True).error_code == ErrorCode.NONE
        assert committed(client, "g2") == 30


def test_api_versions_finalizes_transaction_version_2(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        answer = client.request(ApiVersionsRequest(client_software_name="x", client_software_version="1"), 4)
        v3 = client.request(ApiVersionsRequest(client_software_name="x", client_software_version="1"), 3)
    assert [(f.name, f.min_version, f.max_version) for f in answer.supported_features] == [
        ("transaction.version", 0, 2)
    ]
    # v3 leaves out a supported range starting at 0, as Kafka does (KAFKA-17011); the finalized level stays.
    assert v3.supported_features == [] and v3.finalized_features == answer.finalized_features
    assert [(f.name, f.min_version_level, f.max_version_level) for f in answer.finalized_features] == [
        ("transaction.version", 2, 2)
    ]
    # As Kafka's: the offset of the metadata image, which holds at least the bootstrap and this broker's registration.
    assert answer.finalized_features_epoch >= 1
    versions = {a.api_key: (a.min_version, a.max_version) for a in answer.api_keys}
    assert [versions[key] for key in (22, 24, 25, 26, 28)] == [(0, 5), (0, 5), (0, 4), (0, 5), (0, 5)]


def test_a_timed_out_transaction_is_aborted_by_the_coordinator_timer(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        create(client)
        pid = init(client, "tid-timeout", timeout=200).producer_id
        before = log_end(client, 0)
        assert add_partitions(client, "tid-timeout", pid, 0, {TOPIC: [0]}) == {(TOPIC, 0): ErrorCode.NONE}
        deadline = time.monotonic() + 30
        # Nobody ends it: the coordinator's timer aborts it with the epoch bumped, fencing the producer.
        while (codes := add_partitions(client, "tid-timeout", pid, 0, {TOPIC: [0]})) == {(TOPIC, 0): ErrorCode.NONE}:
            assert time.monotonic() < deadline, "the transaction was not aborted after its timeout"
            time.sleep(0.05)
        assert codes == {(TOPIC, 0): ErrorCode.PRODUCER_FENCED}
        assert end(client, "tid-timeout", pid, 0, True).error_code == ErrorCode.PRODUCER_FENCED
        assert log_end(client, 0) == before + 1  # the abort marker
        assert init(client, "tid-timeout").producer_epoch == 2  # the fence took epoch 1


def test_transactions_survive_a_restart(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        create(client)
        pid = init(client, "tid-restart").producer_id
        add_partitions(client, "tid-restart", pid, 0, {TOPIC: [1]})
        client.request(
            AddOffsetsToTxnRequest(transactional_id="tid-restart", producer_id=pid, producer_epoch=0, group_id="gr"), 3
        )
        assert txn_offset_commit(client, "tid-restart", pid, 0, "gr", 11) == ErrorCode.NONE
        before = log_end(client, 1)
    broker.restart()
    with WireClient(broker.bootstrap) as client:
        # The transaction is still open with its partition and group: the same producer commits it.
        assert committed(client, "gr") == -1
        assert add_partitions(client, "tid-restart", pid, 0, {TOPIC: [1]}) == {(TOPIC, 1): ErrorCode.NONE}
        assert end(client, "tid-restart", pid, 0, True).error_code == ErrorCode.NONE
        assert committed(client, "gr") == 11
        assert log_end(client, 1) == before + 1
    broker.restart()
    with WireClient(broker.bootstrap) as client:
        assert committed(client, "gr") == 11
        assert init(client, "tid-restart").producer_epoch == 1  # the id and its epoch were kept


def test_a_produce_with_two_transactional_producers_is_refused_whole(broker: RunningBroker) -> None:
    """As Kafka's ReplicaManager: the transactional batches of one Produce name one producer (id and epoch); one
    naming two answers INVALID_PRODUCER_ID_MAPPING on every partition and appends nothing (verifying it with one
    of them would let the other's batch in unverified)."""
    with WireClient(broker.bootstrap) as client:
        create(client)
        first, second = init(client, "two-a"), init(client, "two-b")
        assert add_partitions(client, "two-a", first.producer_id, first.producer_epoch, {TOPIC: [0, 1]}) == {
            (TOPIC, 0): 0,
            (TOPIC, 1): 0,
        }

        def batch(producer: Any, epoch_ahead: int = 0) -> bytes:
            return build_batch(
                [Record(value=b"v")],
                producer_id=producer.producer_id,
                producer_epoch=producer.producer_epoch + epoch_ahead,
                base_sequence=0,
                is_transactional=True,
            )

        def produce(batches: list[bytes]) -> list[tuple[int, int]]:
            request = ProduceRequest(
                transactional_id="two-a",
                acks=-1,
                timeout_ms=10_000,
                topic_data=[
                    ProduceRequest.TopicProduceData(
                        name=TOPIC,
                        partition_data=[
                            ProduceRequest.PartitionProduceData(index=i, records=b) for i, b in enumerate(batches)
                        ],
                    )
                ],
            )
            answer = client.request(request, 9).responses[0].partition_responses
            return [(p.index, p.error_code) for p in answer]

        refused = ErrorCode.INVALID_PRODUCER_ID_MAPPING
        assert produce([batch(first), batch(second)]) == [(0, refused), (1, refused)]
        assert [log_end(client, p) for p in (0, 1)] == [0, 0]
        # The same id at another epoch counts as another producer too (Kafka keys them by id and epoch).
        assert produce([batch(first), batch(first, epoch_ahead=1)]) == [(0, refused), (1, refused)]
        assert [log_end(client, p) for p in (0, 1)] == [0, 0]
        assert produce([batch(first), batch(first)]) == [(0, ErrorCode.NONE), (1, ErrorCode.NONE)]
        assert [log_end(client, p) for p in (0, 1)] == [1, 1]
