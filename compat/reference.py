"""The suite's own view of a target, independent of every client under test: Kafka requests put on the wire
with protocol/ (kbroker.wire_client), the same against kbroker and Apache Kafka.

Scenarios use it to set up (create topics and wait until every partition has a leader, write records with
known timestamps) and to check what is really stored (the record batches on the log, committed offsets),
so a client is judged by what the broker holds, not only by what the client reports.

Request versions are ones Kafka 4.x still accepts (it dropped the oldest ones) and kbroker answers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.find_coordinator_request import FindCoordinatorRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.offset_fetch_request import OffsetFetchRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import BatchHeader, Record, build_batch, decode_records, iter_batches

VERSIONS = {  # api key -> the version this module speaks
    ProduceRequest.API_KEY: 9,
    FetchRequest.API_KEY: 12,
    MetadataRequest.API_KEY: 12,
    FindCoordinatorRequest.API_KEY: 3,
    OffsetFetchRequest.API_KEY: 7,
    CreateTopicsRequest.API_KEY: 7,
}


class ReferenceError(AssertionError):
    """The target answered a set-up or check request with an error."""


# Errors a client retries: Apache Kafka lists a new topic's leader in Metadata a moment before that leader
# takes produce requests, and its group coordinator loads its partition for a moment after a restart.
RETRIABLE = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
}


@dataclass(frozen=True)
class StoredRecord:
    offset: int
    timestamp: int
    key: str | None
    value: str | None
    headers: list[list[str | None]]


@dataclass(frozen=True)
class StoredBatch:
    header: BatchHeader
    records: list[StoredRecord]


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="surrogateescape")


class Reference:
    def __init__(self, bootstrap: str, timeout: float = 30.0) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self._connections: dict[str, WireClient] = {}

    # --- connections ---------------------------------------------------------------------------------------

    def _connection(self, address: str) -> WireClient:
        if address not in self._connections:
            client = WireClient(address, timeout=self.timeout, client_id="compat-reference")
            request = ApiVersionsRequest(client_software_name="kbroker-compat", client_software_version="1")
            offered = {a.api_key: a for a in client.request(request, 3).api_keys}
            for api_key, version in VERSIONS.items():
                have = offered.get(api_key)
                if have is None or not have.min_version <= version <= have.max_version:
                    client.close()
                    raise ReferenceError(f"{address} does not accept API {api_key} v{version}")
            self._connections[address] = client
        return self._connections[address]

    def _request(self, body, address: str | None = None):
        address = address or self.bootstrap
        try:
            return self._connection(address).request(body, VERSIONS[body.API_KEY])
        except (OSError, ConnectionError):  # the broker restarted since: connect again, once
            self._connections.pop(address).close()
            return self._connection(address).request(body, VERSIONS[body.API_KEY])

    def close(self) -> None:
        for client in self._connections.values():
            client.close()
        self._connections.clear()

    # --- metadata and topics -------------------------------------------------------------------------------

    def metadata(self, topics: list[str] | None):
        wanted = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
        return self._request(MetadataRequest(topics=wanted, allow_auto_topic_creation=False))

    def leaders(self, topic: str) -> dict[int, str]:
        """partition -> address of its leader; waits until every partition has one."""
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self.metadata([topic])
            brokers = {b.node_id: f"{b.host}:{b.port}" for b in answer.brokers}
            found = answer.topics[0]
            if found.error_code == ErrorCode.NONE and found.partitions:
                leaders = {p.partition_index: brokers.get(p.leader_id) for p in found.partitions}
                if all(leaders.values()):
                    return leaders  # type: ignore[return-value]
            if time.monotonic() > deadline:
                raise ReferenceError(f"topic {topic} has no leader for every partition: {found}")
            time.sleep(0.05)

    def create_topic(self, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
        topic = CreateTopicsRequest.CreatableTopic(
            name=name,
            num_partitions=partitions,
            replication_factor=-1,  # the broker's default.replication.factor (1 on a one-broker target)
            configs=[CreateTopicsRequest.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()],
        )
        answer = self._request(CreateTopicsRequest(topics=[topic], timeout_ms=int(self.timeout * 1000)))
        error = answer.topics[0].error_code
        if error != ErrorCode.NONE:
            raise ReferenceError(f"CreateTopics {name}: {ErrorCode(error).name} {answer.topics[0].error_message}")
        self.leaders(name)

    def partition_count(self, topic: str) -> int:
        return len(self.leaders(topic))

    # --- records -------------------------------------------------------------------------------------------

    def produce(
        self, topic: str, partition: int, records: list[tuple[str | None, str | None, int]], compression: int = 0
    ) -> int:
        """Append (key, value, timestamp) records as one batch (a None value: a tombstone); returns the base
        offset."""
        base = min(ts for _, _, ts in records)
        batch = build_batch(
            [
                Record(
                    offset_delta=i,
                    timestamp_delta=ts - base,
                    key=None if key is None else key.encode(),
                    value=None if value is None else value.encode(),
                )
                for i, (key, value, ts) in enumerate(records)
            ],
            base_timestamp=base,
            compression_type=compression,
        )
        data = ProduceRequest.PartitionProduceData(index=partition, records=batch)
        request = ProduceRequest(
            acks=-1,
            timeout_ms=int(self.timeout * 1000),
            topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[data])],
        )
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._request(request, self.leaders(topic)[partition]).responses[0].partition_responses[0]
            if answer.error_code not in RETRIABLE or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if answer.error_code != ErrorCode.NONE:
            raise ReferenceError(f"Produce {topic}-{partition}: {ErrorCode(answer.error_code).name}")
        return answer.base_offset

    def batches(self, topic: str, partition: int) -> list[StoredBatch]:
        """Every record batch of the partition from offset 0 up to its high watermark, decoded."""
        leader = self.leaders(topic)[partition]
        out: list[StoredBatch] = []
        position = 0
        while True:
            part = FetchRequest.FetchPartition(partition=partition, fetch_offset=position, partition_max_bytes=4 << 20)
            request = FetchRequest(
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=16 << 20,
                isolation_level=0,
                session_id=0,
                session_epoch=-1,
                topics=[FetchRequest.FetchTopic(topic=topic, partitions=[part])],
                forgotten_topics_data=[],
            )
            answer = self._request(request, leader).responses[0].partitions[0]
            if answer.error_code != ErrorCode.NONE:
                raise ReferenceError(f"Fetch {topic}-{partition}@{position}: {ErrorCode(answer.error_code).name}")
            for header, data in iter_batches(answer.records or b""):
                if header.next_offset <= position:
                    continue  # a batch the fetch started inside of, already taken
                records = [
                    StoredRecord(
                        offset=header.base_offset + r.offset_delta,
                        timestamp=header.base_timestamp + r.timestamp_delta,
                        key=_text(r.key),
                        value=_text(r.value),
                        headers=[[k, _text(v)] for k, v in r.headers],
                    )
                    for r in decode_records(data)
                ]
                out.append(StoredBatch(header, records))
                position = header.next_offset
            if position >= answer.high_watermark:
                return out

    def records(self, topic: str, partition: int) -> list[StoredRecord]:
        return [r for batch in self.batches(topic, partition) if not batch.header.is_control for r in batch.records]

    # --- groups --------------------------------------------------------------------------------------------

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int | None]:
        """The group's committed offset per partition (None where it has none)."""
        request = OffsetFetchRequest(
            group_id=group,
            topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=list(range(partitions)))],
        )
        deadline = time.monotonic() + self.timeout
        while True:
            found = self._request(FindCoordinatorRequest(key=group, key_type=0))
            error = found.error_code
            if error == ErrorCode.NONE:
                answer = self._request(request, f"{found.host}:{found.port}")
                error = answer.error_code
            if error not in RETRIABLE or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if found.error_code != ErrorCode.NONE:
            raise ReferenceError(f"FindCoordinator {group}: {ErrorCode(found.error_code).name}")
        if answer.error_code != ErrorCode.NONE:
            raise ReferenceError(f"OffsetFetch {group}: {ErrorCode(answer.error_code).name}")
        return {
            p.partition_index: (p.committed_offset if p.committed_offset >= 0 else None)
            for t in answer.topics
            for p in t.partitions
        }
