"""Produce (key 0): validate record batches without decoding their records, then append them as leader.

Appends go through the replica layer (kbroker/replication, ``ctx.replicas``), which applies Kafka's acks:
acks=all is refused NOT_ENOUGH_REPLICAS while the ISR is smaller than the effective min.insync.replicas, and its
answer waits until the high watermark passes the batch (at once on a single node), REQUEST_TIMED_OUT after the
request's timeout. From v10 a NOT_LEADER_OR_FOLLOWER answer names the current leader and its endpoint (KIP-951,
kbroker/apis/leader_hints.py).

Batches stay opaque bytes: the header and CRC are checked (kbroker/storage/validation.py), offsets are
assigned in place by the log, and the bytes go to disk as received. Records are only decoded where a feature needs them.

Transactional batches (KIP-890 verification): before anything else, the transaction coordinator is asked
whether the partition is part of the producer's ongoing transaction; if not, the partition is answered with
the coordinator's error (INVALID_TXN_STATE, INVALID_PRODUCER_EPOCH, ...) and nothing is written.

Kafka's internal topics (``__consumer_offsets``, ``__transaction_state``) are written only by their coordinators:
a client's batch for one of their partitions is answered INVALID_TOPIC_EXCEPTION without a message, as Kafka's
ReplicaManager answers it (after the topic, partition and transaction checks, before the batch is validated).
``__cluster_metadata`` is no topic to clients (UNKNOWN_TOPIC_OR_PARTITION, as Kafka).

Authorization as Kafka's: transactional records need WRITE on the request's transactional id (else the
whole request fails TRANSACTIONAL_ID_AUTHORIZATION_FAILED), each topic WRITE (else its partitions are
TOPIC_AUTHORIZATION_FAILED, whether the topic exists or not). Without an authorizer the only cost is one
``is None`` test per request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import trio

from kbroker.apis.context import RequestContext
from kbroker.apis.leader_hints import current_leader, no_replica_error
from kbroker.apis.turns import Turns
from kbroker.replication.manager import PendingAck
from kbroker.security.acls import AclOperation, ResourceType
from kbroker.storage.validation import RecordValidationError, validate_batch
from kbroker.topics import INTERNAL_TOPICS
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.produce_request import ProduceRequest
from protocol.messages.produce_response import ProduceResponse
from protocol.records import HEADER_SIZE, TRANSACTIONAL_BIT, BatchHeader

log = logging.getLogger("kbroker.produce")

PARTITIONS_PER_TURN = 200  # validating and appending a batch takes tens of microseconds
LEADER_HINTS_VERSION = 10  # KIP-951: NOT_LEADER_OR_FOLLOWER names the current leader

PartitionResponse = ProduceResponse.PartitionProduceResponse
_ATTRIBUTES_LOW = 22  # the low byte of a batch's int16 attributes, where the transactional bit is
# Kafka's messages for the verification errors it words itself (ReplicaManager); the others carry none.
_VERIFICATION_MESSAGES = {
    ErrorCode.INVALID_TXN_STATE: "Partition was not added to the transaction",
    ErrorCode.NOT_ENOUGH_REPLICAS: "Unable to verify the partition has been added to the transaction.",
}


def _error(
    index: int, code: ErrorCode, message: str | None = None, record_errors: Sequence[tuple[int, str]] = ()
) -> PartitionResponse:
    return PartitionResponse(
        index=index,
        error_code=code,
        base_offset=-1,
        error_message=message,
        record_errors=[
            ProduceResponse.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=text)
            for i, text in record_errors
        ],
    )


async def _transactional_producers(request: ProduceRequest, turns: Turns) -> set[tuple[int, int]]:
    """The (producer id, epoch) of each transactional batch of the request: one walk of its partitions answers
    both whether it carries transactional records and whether they name one producer."""
    producers: set[tuple[int, int]] = set()
    for topic_data in request.topic_data:
        for part in topic_data.partition_data:
            await turns.step()
            records = part.records
            if records is not None and len(records) >= HEADER_SIZE and records[_ATTRIBUTES_LOW] & TRANSACTIONAL_BIT:
                header = BatchHeader.parse(records)
                producers.add((header.producer_id, header.producer_epoch))
    return producers


def _check_one_producer(producers: set[tuple[int, int]]) -> None:
    """A transactional produce carries the batches of one producer (id and epoch): as Kafka's ReplicaManager, a
    request whose transactional batches name several is refused whole with INVALID_PRODUCER_ID_MAPPING (it would
    otherwise be verified with one of them, and its other batches appended unverified). A negative producer id is
    no producer: validation refuses its batch."""
    if sum(1 for producer_id, _ in producers if producer_id >= 0) > 1:
        raise KafkaError(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING, "Transactional records contained more than one producer ID"
        )


# What a transaction coordinator on another broker answers that the producer should retry: Kafka's ReplicaManager
# turns them into NOT_ENOUGH_REPLICAS, which every client retries without a metadata refresh.
_RETRY_VERIFICATION = frozenset(
    {
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
    }
)


def _verification_error(code: ErrorCode, produce_version: int) -> ErrorCode:
    """A remote coordinator's verification answer as the producer gets it (Kafka's AddPartitionsToTxnManager and
    ReplicaManager)."""
    if code == ErrorCode.PRODUCER_FENCED:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if code == ErrorCode.TRANSACTION_ABORTABLE and produce_version <= 10:
        return ErrorCode.INVALID_TXN_STATE  # what older clients understand
    if code in _RETRY_VERIFICATION:
        return ErrorCode.NOT_ENOUGH_REPLICAS
    return code


async def _verify_remotely(ctx: RequestContext, request: ProduceRequest) -> dict[tuple[str, int], ErrorCode] | None:
    """In a cluster, a transactional produce whose transaction coordinator is another broker: that coordinator's
    answer for each transactional partition, asked in one AddPartitionsToTxn as Kafka 4.4's broker does (Produce
    v12+, transaction version 2, adds the partitions; older versions only verify them); None when the coordinator
    is this broker (or there is none to ask)."""
    transactions = ctx.transactions
    transactional_id = request.transactional_id
    if transactional_id is None or transactions.remote is None:
        return None
    if not transactions.coordinated_elsewhere(transactional_id):
        return None
    by_id = ctx.api_version >= 13
    producer: tuple[int, int] | None = None
    partitions: list[tuple[str, int]] = []
    for topic_data in request.topic_data:
        info = ctx.topics.topic_by_id(topic_data.topic_id) if by_id else ctx.topics.topic(topic_data.name)
        if info is None:
            continue
        for part in topic_data.partition_data:
            records = part.records
            if records is None or len(records) < HEADER_SIZE or not records[_ATTRIBUTES_LOW] & TRANSACTIONAL_BIT:
                continue
            header = BatchHeader.parse(records)
            if header.producer_id < 0:
                continue
            producer = producer or (header.producer_id, header.producer_epoch)
            try:
                plog = ctx.topics.partition(info.name, part.index)
            except KafkaError:
                plog = None  # the append answers the storage error
            if plog is not None and plog.has_ongoing_transaction(header.producer_id, header.producer_epoch):
                continue  # as Kafka: the transaction is open here already, verified by its first batch
            partitions.append((info.name, part.index))
    if producer is None or not partitions:
        return {}  # nothing to ask: every transactional batch continues a transaction open here
    coordinator = transactions.coordinator_node(transactional_id)
    codes = await transactions.remote.verify(
        coordinator, transactional_id, producer[0], producer[1], partitions, add=ctx.api_version >= 12
    )
    return {key: _verification_error(code, ctx.api_version) for key, code in codes.items()}


def _transaction_error(
    ctx: RequestContext,
    transactional_id: str | None,
    topic: str,
    partition: int,
    records: bytearray | memoryview,
    remote: dict[tuple[str, int], ErrorCode] | None = None,
) -> ErrorCode:
    """The coordinator's answer for a transactional batch (NONE for any other batch, left to validation);
    ``remote``: the answers of a coordinator on another broker."""
    if transactional_id is None or len(records) < HEADER_SIZE or not records[_ATTRIBUTES_LOW] & TRANSACTIONAL_BIT:
        return ErrorCode.NONE
    header = BatchHeader.parse(records)
    if header.producer_id < 0:
        return ErrorCode.NONE  # validation refuses it
    if remote is not None:
        return remote.get((topic, partition), ErrorCode.NONE)
    return ctx.transactions.verify_partition(
        transactional_id,
        header.producer_id,
        header.producer_epoch,
        topic,
        partition,
        produce_version=ctx.api_version,
    )


async def handle_produce(ctx: RequestContext, request: ProduceRequest) -> ProduceResponse | None:
    authorizing = ctx.services.authorizer is not None  # the hot path's one check when nobody configured ACLs
    turns = Turns(PARTITIONS_PER_TURN)  # many partitions: other connections run as it goes (kbroker/apis/turns.py)
    producers = await _transactional_producers(request, turns)
    if producers and (request.transactional_id is None or authorizing):
        # As Kafka: transactional records need a transactional id the client may WRITE (the whole request).
        if request.transactional_id is None or not ctx.authorize(
            AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id
        ):
            raise KafkaError(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "Transactional Id authorization failed.")
    remote = None
    if request.transactional_id is not None:
        _check_one_producer(producers)
        # Verified by a coordinator on another broker before anything is appended.
        remote = await _verify_remotely(ctx, request)
    acks = request.acks
    now_ms = int(time.time() * 1000)
    by_id = ctx.api_version >= 13
    topics: list[ProduceResponse.TopicProduceResponse] = []
    to_flush = []
    awaiting: list[PendingAck] = []  # acks=all answers held until the high watermark passes their batch
    not_leader = False  # a partition answered NOT_LEADER_OR_FOLLOWER (named with its leader from v10)
    replicas = ctx.replicas
    metrics = ctx.services.metrics
    for topic_data in request.topic_data:
        info = ctx.topics.topic_by_id(topic_data.topic_id) if by_id else ctx.topics.topic(topic_data.name)
        results: list[PartitionResponse] = []
        if authorizing and (by_id and info is not None or not by_id):
            name = info.name if info is not None else topic_data.name
            if not ctx.authorize(AclOperation.WRITE, ResourceType.TOPIC, name):
                for part in topic_data.partition_data:
                    results.append(_error(part.index, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                    await turns.step()
                topics.append(
                    ProduceResponse.TopicProduceResponse(
                        name=topic_data.name, topic_id=topic_data.topic_id, partition_responses=results
                    )
                )
                continue
        internal = info is not None and info.name in INTERNAL_TOPICS
        for part in topic_data.partition_data:
            await turns.step()
            if acks not in (-1, 0, 1):
                results.append(_error(part.index, ErrorCode.INVALID_REQUIRED_ACKS))
                continue
            if info is None:
                code = ErrorCode.UNKNOWN_TOPIC_ID if by_id else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                results.append(_error(part.index, code))
                continue
            try:
                partition = replicas.partition(info.name, part.index)
            except KafkaError as exc:  # a partition whose files cannot be opened (KAFKA_STORAGE_ERROR)
                results.append(_error(part.index, exc.code, exc.message))
                continue
            if partition is None:  # no replica here: another broker's partition, or none at all
                code = no_replica_error(ctx, info.name, part.index)
                results.append(_error(part.index, code))
                not_leader = not_leader or code == ErrorCode.NOT_LEADER_OR_FOLLOWER
                continue
            plog = partition.log
            records = part.records
            if not isinstance(records, bytearray) and (not isinstance(records, memoryview) or records.readonly):
                records = bytearray(records or b"")  # offsets are assigned in place
            txn_error = _transaction_error(ctx, request.transactional_id, info.name, part.index, records, remote)
            if (
                txn_error == ErrorCode.NONE
                and remote is None
                and request.transactional_id is not None
                and len(records) >= HEADER_SIZE
                and records[_ATTRIBUTES_LOW] & TRANSACTIONAL_BIT
            ):
                # This broker coordinates it: the transaction's state (the partition just added, for v12+) must be
                # on the ISR before the records are appended, as Kafka's verification waits for it.
                txn_error = _verification_error(
                    await ctx.transactions.replicated(request.transactional_id), ctx.api_version
                )
            if txn_error != ErrorCode.NONE:
                results.append(_error(part.index, txn_error, _VERIFICATION_MESSAGES.get(txn_error)))
                continue
            if internal:  # only the coordinators append to their topics (Kafka's internalTopicsAllowed)
                results.append(_error(part.index, ErrorCode.INVALID_TOPIC_EXCEPTION))
                continue
            try:
                header = validate_batch(
                    records,
                    plog.config.max_message_bytes,
                    timestamps=plog.config.timestamp_window(now_ms),
                    target_codec=plog.config.compression.codec,
                )
            except RecordValidationError as exc:
                results.append(_error(part.index, exc.code, exc.message, exc.record_errors))
                continue
            except KafkaError as exc:
                log.debug("rejecting produce to %s-%d: %s", info.name, part.index, exc.message)
                results.append(_error(part.index, exc.code, exc.message))
                continue
            result = partition.append_as_leader(
                records,
                header,
                acks,
                now_ms=now_ms,
                timestamp_type_log_append=plog.config.message_timestamp_type == "LogAppendTime",
            )
            if result.error_code != ErrorCode.NONE:
                results.append(
                    _error(part.index, ErrorCode(result.error_code), result.error_message, result.record_errors)
                )
                not_leader = not_leader or result.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
                continue
            counters = metrics.topic(info.name)  # kafka_server_brokertopicmetrics_*: counted once appended
            counters.bytes_in += len(records)
            counters.messages_in += header.records_count
            if plog.needs_flush:
                to_flush.append((plog, results, len(results)))
            answer = PartitionResponse(
                index=part.index,
                error_code=ErrorCode.NONE,
                base_offset=result.base_offset,
                log_append_time_ms=result.log_append_time_ms,
                log_start_offset=result.log_start_offset,
            )
            results.append(answer)
            if acks == -1:
                required_offset = result.base_offset + header.last_offset_delta + 1
                if plog.high_watermark < required_offset:  # followers must have it first (never on one node)
                    awaiting.append((partition, required_offset, answer))
        topics.append(
            ProduceResponse.TopicProduceResponse(
                name=topic_data.name, topic_id=topic_data.topic_id, partition_responses=results
            )
        )
    if to_flush:
        # flush.messages reached: fsync before acknowledging, off the event loop. A failed fsync takes the
        # data directory offline; the records it should have made durable are not acknowledged.
        def flush_all() -> list[bool]:
            return [plog.sync() for plog, _, _ in to_flush]

        for (plog, answers, index), synced in zip(to_flush, await trio.to_thread.run_sync(flush_all), strict=True):
            if not synced:
                message = f"{plog.topic}-{plog.partition}: the fsync that flush.messages asks for failed"
                answers[index] = _error(answers[index].index, ErrorCode.KAFKA_STORAGE_ERROR, message)
    if awaiting:
        await replicas.await_acks(awaiting, request.timeout_ms)  # REQUEST_TIMED_OUT for those still waiting then
    if acks == 0:
        return None
    node_endpoints: list[ProduceResponse.NodeEndpoint] = []
    if (not_leader or awaiting) and ctx.api_version >= LEADER_HINTS_VERSION:
        node_endpoints = _name_leaders(ctx, topics)
    return ProduceResponse(responses=topics, throttle_time_ms=0, node_endpoints=node_endpoints)


def _name_leaders(
    ctx: RequestContext, topics: list[ProduceResponse.TopicProduceResponse]
) -> list[ProduceResponse.NodeEndpoint]:
    """KIP-951: each NOT_LEADER_OR_FOLLOWER partition gets its current leader, and the response their endpoints."""
    endpoints: dict[int, ProduceResponse.NodeEndpoint] = {}
    by_id = ctx.api_version >= 13
    for topic in topics:
        info = ctx.topics.topic_by_id(topic.topic_id) if by_id else ctx.topics.topic(topic.name)
        if info is None:
            continue
        for answer in topic.partition_responses:
            if answer.error_code != ErrorCode.NOT_LEADER_OR_FOLLOWER:
                continue
            hint = current_leader(ctx, info.name, answer.index)
            answer.current_leader = ProduceResponse.LeaderIdAndEpoch(
                leader_id=hint.leader_id, leader_epoch=hint.leader_epoch
            )
            if hint.endpoint is not None:
                endpoints[hint.leader_id] = ProduceResponse.NodeEndpoint(
                    node_id=hint.leader_id, host=hint.endpoint.host, port=hint.endpoint.port, rack=hint.rack
                )
    return list(endpoints.values())
