"""Over the wire, with the file system failing under a running broker (kbroker/durable/fs.py's test double):
a produce that cannot be written answers KAFKA_STORAGE_ERROR, an OffsetCommit that cannot be journalled answers
NOT_COORDINATOR (Kafka's coordinator maps a failed append to __consumer_offsets so), the connection stays open,
nothing changes, and once space returns both resume where they were, across a restart too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.durable import fs
from kbroker.durable.fs import FaultyFileSystem
from kbroker.storage import LogManager
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.offset_commit_request import OffsetCommitRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch, decode_records, iter_batches

TOPIC = "durable"


@pytest.fixture
def faulty() -> Iterator[FaultyFileSystem]:
    with fs.installed(FaultyFileSystem()) as double:
        yield double


def create(client: WireClient, configs: dict[str, str] | None = None) -> None:
    topic = CreateTopicsRequest.CreatableTopic(
        name=TOPIC,
        num_partitions=1,
        replication_factor=1,
        configs=[CreateTopicsRequest.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()],
    )
    assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0


def produce(client: WireClient, value: bytes) -> tuple[int, int]:
    batch = build_batch([Record(offset_delta=0, value=value)], base_timestamp=0)
    request = ProduceRequest(
        acks=-1,
        timeout_ms=5000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=TOPIC, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
            )
        ],
    )
    answer = client.request(request, 9).responses[0].partition_responses[0]
    return answer.error_code, answer.base_offset


def fetch_values(client: WireClient) -> list[tuple[int, bytes | None]]:
    partition = FetchRequest.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    request = FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        topics=[FetchRequest.FetchTopic(topic=TOPIC, partitions=[partition])],
    )
    answer = client.request(request, 11).responses[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE
    return [
        (header.base_offset + record.offset_delta, record.value)
        for header, view in iter_batches(bytes(answer.records or b""))
        for record in decode_records(view)
    ]


def commit(client: WireClient, offset: int) -> int:
    request = OffsetCommitRequest(
        group_id="g",
        generation_id_or_member_epoch=-1,
        member_id="",
        topics=[
            OffsetCommitRequest.OffsetCommitRequestTopic(
                name=TOPIC,
                partitions=[
                    OffsetCommitRequest.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset)
                ],
            )
        ],
    )
    return int(client.request(request, 8).topics[0].partitions[0].error_code)


def committed(client: WireClient) -> int:
    request = OffsetFetchRequest(
        group_id="g", topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[0])]
    )
    return int(client.request(request, 7).topics[0].partitions[0].committed_offset)


def test_a_full_disk_is_answered_with_error_codes_and_nothing_changes_until_space_returns(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        create(client)
        assert produce(client, b"a") == (ErrorCode.NONE, 0)
        assert commit(client, 1) == ErrorCode.NONE
        faulty.disk_full = True
        assert produce(client, b"lost") == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
        assert commit(client, 7) == ErrorCode.NOT_COORDINATOR
        # The same connection is still served, reads included, and nothing moved.
        assert fetch_values(client) == [(0, b"a")]
        assert committed(client) == 1
        faulty.disk_full = False
        assert produce(client, b"b") == (ErrorCode.NONE, 1)  # the offset the failed produce did not take
        assert commit(client, 2) == ErrorCode.NONE
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        assert fetch_values(client) == [(0, b"a"), (1, b"b")]
        assert committed(client) == 2
        assert produce(client, b"c") == (ErrorCode.NONE, 2)


def test_a_produce_whose_flush_fails_is_not_acknowledged_and_the_directory_stays_offline_until_a_restart(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        create(client, {"flush.messages": "1"})
        assert produce(client, b"a") == (ErrorCode.NONE, 0)
        faulty.nth[("fsync", faulty.counts.get("fsync", 0) + 1)] = "fsync"  # the next fsync: the produce's
        assert produce(client, b"unsynced") == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
        assert produce(client, b"refused") == (ErrorCode.KAFKA_STORAGE_ERROR, -1)  # offline, though fsync works
        assert fetch_values(client)[0] == (0, b"a")  # reads go on
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        values = fetch_values(client)
        assert values[0] == (0, b"a") and len(values) <= 2  # the unacknowledged record may or may not be there
        assert produce(client, b"b") == (ErrorCode.NONE, len(values))  # writable again after the restart


def test_deletions_that_cannot_be_written_answer_errors_and_delete_nothing(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    from protocol.messages.delete_groups_request import DeleteGroupsRequest
    from protocol.messages.delete_records_request import DeleteRecordsRequest
    from protocol.messages.offset_delete_request import OffsetDeleteRequest

    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        create(client)
        assert produce(client, b"a") == (ErrorCode.NONE, 0)
        assert produce(client, b"b") == (ErrorCode.NONE, 1)
        assert commit(client, 1) == ErrorCode.NONE
        faulty.disk_full = True
        offset_delete = OffsetDeleteRequest(
            group_id="g",
            topics=[
                OffsetDeleteRequest.OffsetDeleteRequestTopic(
                    name=TOPIC, partitions=[OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=0)]
                )
            ],
        )
        assert client.request(offset_delete, 0).error_code == ErrorCode.NOT_COORDINATOR
        assert client.request(DeleteGroupsRequest(groups_names=["g"]), 2).results[0].error_code == (
            ErrorCode.NOT_COORDINATOR
        )
        delete_records = DeleteRecordsRequest(
            topics=[
                DeleteRecordsRequest.DeleteRecordsTopic(
                    name=TOPIC, partitions=[DeleteRecordsRequest.DeleteRecordsPartition(partition_index=0, offset=1)]
                )
            ],
            timeout_ms=5000,
        )
        answer = client.request(delete_records, 2).topics[0].partitions[0]
        assert (answer.error_code, answer.low_watermark) == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
        # Nothing was deleted: the commit and both records are still there.
        assert committed(client) == 1
        assert fetch_values(client) == [(0, b"a"), (1, b"b")]


# --- the offsets journal shares the data directory's health (issue #26, item 7) --------------------------------


def test_while_the_data_directory_is_offline_offset_commits_answer_not_coordinator_and_change_nothing(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    """Before: a commit made while the directory was offline (space back, an fsync had failed) answered NONE.
    Kafka 4.3's coordinators map the KAFKA_STORAGE_ERROR of an append to an offline log dir to NOT_COORDINATOR
    (CoordinatorOperationExceptionHelper), as for a full disk."""
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        create(client, {"flush.messages": "1"})
        assert produce(client, b"a") == (ErrorCode.NONE, 0)
        assert commit(client, 1) == ErrorCode.NONE
        faulty.nth[("fsync", faulty.counts.get("fsync", 0) + 1)] = "fsync"  # the next produce's fsync
        assert produce(client, b"unsynced") == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
        assert broker.broker is not None and isinstance(broker.broker.logs, LogManager)
        assert broker.broker.logs.dir_health.offline
        writes = faulty.counts.get("write", 0)
        assert commit(client, 5) == ErrorCode.NOT_COORDINATOR
        assert faulty.counts.get("write", 0) == writes  # not even tried: the directory is offline
        assert committed(client) == 1  # reads go on
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        assert committed(client) == 1
        assert commit(client, 6) == ErrorCode.NONE  # writable again after the restart
        assert committed(client) == 6


def test_a_failed_fsync_of_consumer_offsets_takes_the_data_directory_offline(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    """__consumer_offsets is in the data directory, as in a Kafka log dir: an fsync failing there is fatal for
    the directory, produces included."""
    with (
        RunningBroker(tmp_path, {"log.flush.interval.messages": "1"}) as broker,
        WireClient(broker.bootstrap) as client,
    ):
        create(client)
        assert produce(client, b"a") == (ErrorCode.NONE, 0)
        assert commit(client, 0) == ErrorCode.NONE  # __consumer_offsets is created
        faulty.nth[("fsync", faulty.counts.get("fsync", 0) + 1)] = "fsync"  # the next commit's fsync
        assert commit(client, 1) == ErrorCode.NOT_COORDINATOR
        assert produce(client, b"b") == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
        assert fetch_values(client) == [(0, b"a")]


def test_failed_offsets_writes_count_towards_taking_the_directory_offline(
    tmp_path: Path, faulty: FaultyFileSystem
) -> None:
    from kbroker.groups.offsets import CommittedOffset, OffsetStore, OffsetStoreError
    from kbroker.storage.log import LogDirHealth

    store = OffsetStore.in_data_dir(tmp_path, partitions=1)
    health = store.logs.dir_health
    commit_one = {(TOPIC, 0): CommittedOffset(1, -1, None, 0)}
    store.commit("g", commit_one)  # creates __consumer_offsets
    faulty.disk_full = True
    for _ in range(LogDirHealth.FAILURE_LIMIT - 1):
        with pytest.raises(OffsetStoreError):
            store.commit("g", commit_one)
    assert (health.failures_in_a_row, health.offline) == (LogDirHealth.FAILURE_LIMIT - 1, False)
    faulty.disk_full = False
    store.commit("g", commit_one)  # a write that succeeds resets the count
    assert health.failures_in_a_row == 0
    faulty.disk_full = True
    for _ in range(LogDirHealth.FAILURE_LIMIT):
        with pytest.raises(OffsetStoreError):
            store.commit("g", {(TOPIC, 0): CommittedOffset(2, -1, None, 0)})
    assert health.offline
    faulty.disk_full = False
    with pytest.raises(OffsetStoreError, match=f"data directory {tmp_path} is offline"):
        store.commit("g", {(TOPIC, 0): CommittedOffset(3, -1, None, 0)})
    assert store.get("g")[(TOPIC, 0)].offset == 1
    store.close()
