"""Transactions: AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26) and TxnOffsetCommit (28).

The state machine lives in kbroker/transactions/coordinator.py (``ctx.transactions``); these handlers do what
Kafka's KafkaApis does around it: the request-level checks (unknown partitions fail the whole AddPartitionsToTxn,
the others answering OPERATION_NOT_ATTEMPTED), and the error codes older versions understand (PRODUCER_FENCED is
INVALID_PRODUCER_EPOCH before AddPartitionsToTxn, AddOffsetsToTxn, EndTxn and TxnOffsetCommit v2).

AddPartitionsToTxn v4-5 are the batched form Kafka 4 brokers send each other (KIP-890): each transaction is added,
or with ``verify_only`` checked, partition by partition. TxnOffsetCommit keeps the offsets pending in the offset
store until the transaction ends (kbroker/groups/offsets.py); who may commit is checked as OffsetCommit checks it
(member id and generation of KIP-447), with the differences Kafka makes for transactional commits.

Authorization as Kafka's: every one of them needs WRITE on the transactional id (else
TRANSACTIONAL_ID_AUTHORIZATION_FAILED); AddPartitionsToTxn v0-3 also WRITE on each topic (a refused topic fails
the transaction as an unknown one does: TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED), while
v4-5 come from brokers and need CLUSTER_ACTION on the cluster; AddOffsetsToTxn and TxnOffsetCommit need READ on
the group (else GROUP_AUTHORIZATION_FAILED) and TxnOffsetCommit READ on each topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import time

from kbroker.apis.context import RequestContext
from kbroker.coordinators.runtime import write_error_answer
from kbroker.groups.offsets import OFFSETS_TOPIC, CommittedOffset, OffsetStoreError
from kbroker.groups.router import GroupKind
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.add_offsets_to_txn_request import AddOffsetsToTxnRequest
from protocol.messages.add_offsets_to_txn_response import AddOffsetsToTxnResponse
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.add_partitions_to_txn_response import AddPartitionsToTxnResponse
from protocol.messages.end_txn_request import EndTxnRequest
from protocol.messages.end_txn_response import EndTxnResponse
from protocol.messages.txn_offset_commit_request import TxnOffsetCommitRequest
from protocol.messages.txn_offset_commit_response import TxnOffsetCommitResponse

Partitions = list[tuple[str, int]]


def _may_write_transaction(ctx: RequestContext, transactional_id: str) -> bool:
    return ctx.authorize(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)


def fenced_for_version(code: ErrorCode, version: int, first_version_knowing_fenced: int = 2) -> ErrorCode:
    """PRODUCER_FENCED (KIP-588) as a client of this version understands it."""
    if code == ErrorCode.PRODUCER_FENCED and version < first_version_knowing_fenced:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code


# --- AddPartitionsToTxn -------------------------------------------------------------------------------------


def _partition_results(
    topics: list[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic], codes: dict[tuple[str, int], ErrorCode]
) -> list[AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult]:
    by_topic: dict[str, dict[int, None]] = {}  # each partition once, in the order of the request
    for topic in topics:
        by_topic.setdefault(topic.name, {}).update(dict.fromkeys(topic.partitions))
    return [
        AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult(
            name=name,
            results_by_partition=[
                AddPartitionsToTxnResponse.AddPartitionsToTxnPartitionResult(
                    partition_index=p, partition_error_code=codes[(name, p)]
                )
                for p in partitions
            ],
        )
        for name, partitions in by_topic.items()
    ]


def _add_transaction(
    ctx: RequestContext,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    topics: list[AddPartitionsToTxnRequest.AddPartitionsToTxnTopic],
    verify_only: bool,
    from_client: bool = False,
) -> dict[tuple[str, int], ErrorCode]:
    """Each partition's answer, as Kafka's KafkaApis and TransactionCoordinator give it; a client's request (v0-3)
    is authorized here, a broker's (v4-5) was as a whole."""
    partitions = list(dict.fromkeys((t.name, p) for t in topics for p in t.partitions))
    if from_client:
        if not _may_write_transaction(ctx, transactional_id):
            return dict.fromkeys(partitions, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        refused = {t.name for t in topics if not ctx.authorize(AclOperation.WRITE, ResourceType.TOPIC, t.name)}
        if refused:
            # A refused topic fails the transaction as an unknown one does; refusal is told before absence.
            return {
                (topic, index): ErrorCode.TOPIC_AUTHORIZATION_FAILED
                if topic in refused
                else ErrorCode.OPERATION_NOT_ATTEMPTED
                if _exists(ctx, topic, index)
                else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                for topic, index in partitions
            }
    if verify_only:
        return {
            (topic, index): _verify(ctx, transactional_id, producer_id, producer_epoch, topic, index)
            for topic, index in partitions
        }
    unknown = {(t, p) for t, p in partitions if not _exists(ctx, t, p)}
    if unknown:
        # One unknown partition fails the request; the others were not attempted.
        return {
            key: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if key in unknown else ErrorCode.OPERATION_NOT_ATTEMPTED
            for key in partitions
        }
    code = ctx.transactions.add_partitions(transactional_id, producer_id, producer_epoch, partitions)
    return dict.fromkeys(partitions, code)


async def _replicated(
    ctx: RequestContext, transactional_id: str, codes: dict[tuple[str, int], ErrorCode]
) -> dict[tuple[str, int], ErrorCode]:
    """The partitions answered NONE are answered once the transaction's state is on the ISR (or with the error
    its replication failed with)."""
    if ErrorCode.NONE not in codes.values():
        return codes
    failed = await ctx.transactions.replicated(transactional_id)
    if failed == ErrorCode.NONE:
        return codes
    return {key: failed if code == ErrorCode.NONE else code for key, code in codes.items()}


def _verify(
    ctx: RequestContext, transactional_id: str, producer_id: int, producer_epoch: int, topic: str, index: int
) -> ErrorCode:
    """AddPartitionsToTxn verify_only (Kafka's handleVerifyPartitionsInTransaction): the coordinator's own answer."""
    transactions = ctx.transactions
    if not transactional_id:
        return ErrorCode.INVALID_REQUEST
    if transactions.coordinated_elsewhere(transactional_id):
        return ErrorCode.NOT_COORDINATOR  # the asking broker looks the coordinator up again
    metadata = transactions.get(transactional_id)
    if metadata is None or metadata.producer_id != producer_id:
        return ErrorCode.INVALID_PRODUCER_ID_MAPPING
    if metadata.producer_epoch != producer_epoch:
        return ErrorCode.PRODUCER_FENCED
    if metadata.state.is_prepare:
        return ErrorCode.CONCURRENT_TRANSACTIONS
    if topic == OFFSETS_TOPIC:
        # A group coordinator verifying a TxnOffsetCommit names the group's partition: in the transaction if a group
        # added with AddOffsetsToTxn lives there (Kafka adds that partition itself).
        in_transaction = (topic, index) in metadata.partitions or any(
            transactions.offsets_partition_of(g) == index for g in metadata.groups
        )
        return ErrorCode.NONE if in_transaction else ErrorCode.TRANSACTION_ABORTABLE
    return ErrorCode.NONE if (topic, index) in metadata.partitions else ErrorCode.TRANSACTION_ABORTABLE


def _exists(ctx: RequestContext, topic: str, index: int) -> bool:
    info = ctx.topics.topic(topic)
    return info is not None and 0 <= index < info.partitions


async def handle_add_partitions_to_txn(
    ctx: RequestContext, request: AddPartitionsToTxnRequest
) -> AddPartitionsToTxnResponse:
    version = ctx.api_version
    if version <= 3:
        codes = _add_transaction(
            ctx,
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            request.v3_and_below_topics,
            verify_only=False,
            from_client=True,
        )
        codes = await _replicated(ctx, request.v3_and_below_transactional_id, codes)
        codes = {key: fenced_for_version(code, version) for key, code in codes.items()}
        return AddPartitionsToTxnResponse(
            throttle_time_ms=0, results_by_topic_v3_and_below=_partition_results(request.v3_and_below_topics, codes)
        )
    if not ctx.authorize(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
    results = []
    for transaction in request.transactions:
        codes = _add_transaction(
            ctx,
            transaction.transactional_id,
            transaction.producer_id,
            transaction.producer_epoch,
            transaction.topics,
            verify_only=transaction.verify_only,
        )
        codes = await _replicated(ctx, transaction.transactional_id, codes)
        results.append(
            AddPartitionsToTxnResponse.AddPartitionsToTxnResult(
                transactional_id=transaction.transactional_id,
                topic_results=_partition_results(transaction.topics, codes),
            )
        )
    return AddPartitionsToTxnResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, results_by_transaction=results)


# --- AddOffsetsToTxn and EndTxn -------------------------------------------------------------------------------


async def handle_add_offsets_to_txn(ctx: RequestContext, request: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse:
    if not _may_write_transaction(ctx, request.transactional_id):
        return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, request.group_id):
        return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    code = ctx.transactions.add_offsets(
        request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
    )
    if code == ErrorCode.NONE:
        code = await ctx.transactions.replicated(request.transactional_id)
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=fenced_for_version(code, ctx.api_version))


async def handle_end_txn(ctx: RequestContext, request: EndTxnRequest) -> EndTxnResponse:
    if not _may_write_transaction(ctx, request.transactional_id):
        return EndTxnResponse(throttle_time_ms=0, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    # EndTxn v5 is transaction version 2 (KIP-890): the coordinator bumps the epoch and answers it.
    transactions = ctx.transactions
    result = transactions.end_transaction(
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        request.committed,
        transaction_version=2 if ctx.api_version >= 5 else 1,
    )
    error = result.error
    if error == ErrorCode.NONE:
        # Answered once PrepareX is on the ISR; only then are its markers written (in a cluster).
        error = await transactions.replicated(request.transactional_id)
        if error == ErrorCode.NONE:
            transactions.write_prepared_markers(request.transactional_id)
    return EndTxnResponse(
        throttle_time_ms=0,
        error_code=fenced_for_version(error, ctx.api_version),
        producer_id=result.producer_id,
        producer_epoch=result.producer_epoch,
    )


# --- TxnOffsetCommit ------------------------------------------------------------------------------------------


def _member_check(ctx: RequestContext, request: TxnOffsetCommitRequest) -> ErrorCode:
    """Who may commit for the group (KIP-447 from v3), as Kafka checks a transactional offset commit."""
    group_id = request.group_id
    if not group_id:
        return ErrorCode.INVALID_GROUP_ID
    if ctx.api_version >= 3:
        member_id, instance_id = request.member_id, request.group_instance_id
        generation = request.generation_id_or_member_epoch  # renamed by the 4.4 schema (KIP-1319)
    else:
        member_id, generation, instance_id = "", -1, None
    groups = ctx.groups
    if groups.kind(group_id) is GroupKind.CONSUMER:
        code = groups.consumer.validate_offset_commit(group_id, member_id, generation, 9)
        # A transactional commit with a stale member epoch is ILLEGAL_GENERATION, which every client knows.
        return ErrorCode.ILLEGAL_GENERATION if code == ErrorCode.STALE_MEMBER_EPOCH else code or ErrorCode.NONE
    code = groups.classic.validate_offset_commit(
        group_id, member_id, instance_id, generation, 8, group_has_offsets=groups.offsets.has_group(group_id)
    )
    if code == ErrorCode.UNKNOWN_MEMBER_ID and not member_id and generation < 0 and instance_id is None:
        return ErrorCode.NONE  # older transactional commits name no member: accepted while the group has members
    if code == ErrorCode.REBALANCE_IN_PROGRESS:
        return ErrorCode.NONE  # only plain commits wait for the assignment
    return code


async def _verify_offsets_remotely(ctx: RequestContext, request: TxnOffsetCommitRequest, version: int) -> ErrorCode:
    """The transaction coordinator is another broker: ask it whether the group's __consumer_offsets partition is in
    the producer's transaction (AddPartitionsToTxn; v5, transaction version 2, adds it), and answer as Kafka's group
    coordinator does."""
    transactions = ctx.transactions
    assert transactions.remote is not None
    key = (OFFSETS_TOPIC, ctx.groups.offsets.partition_for(request.group_id))
    codes = await transactions.remote.verify(
        transactions.coordinator_node(request.transactional_id),
        request.transactional_id,
        request.producer_id,
        request.producer_epoch,
        [key],
        add=version >= 5,  # transaction version 2: the partition joins the transaction, as Kafka 4.4 does
    )
    code = codes[key]
    if code == ErrorCode.PRODUCER_FENCED:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if code == ErrorCode.TRANSACTION_ABORTABLE and version < 4:
        return ErrorCode.INVALID_TXN_STATE
    if code == ErrorCode.NETWORK_EXCEPTION:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE  # retried by the client
    return code


async def handle_txn_offset_commit(ctx: RequestContext, request: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse:
    version = ctx.api_version
    if not _may_write_transaction(ctx, request.transactional_id):
        raise KafkaError(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "Transactional Id authorization failed.")
    if not ctx.authorize(AclOperation.READ, ResourceType.GROUP, request.group_id):
        raise KafkaError(ErrorCode.GROUP_AUTHORIZATION_FAILED, "Group authorization failed.")
    ctx.groups.require_coordinator(request.group_id)
    transactions = ctx.transactions
    if transactions.remote is not None and transactions.coordinated_elsewhere(request.transactional_id):
        check = await _verify_offsets_remotely(ctx, request, version)
    else:
        check = transactions.verify_offset_commit(
            request.transactional_id, request.producer_id, request.producer_epoch, request.group_id, add=version >= 5
        )
        if check == ErrorCode.NONE:
            check = await transactions.replicated(request.transactional_id)
    if check == ErrorCode.NONE:
        check = _member_check(ctx, request)
    check = fenced_for_version(check, version)
    now = int(time.time() * 1000)
    max_metadata = ctx.config["offset.metadata.max.bytes"]
    commits: dict[tuple[str, int], CommittedOffset] = {}
    topics = []
    for topic in request.topics:
        info = ctx.topics.topic(topic.name)
        readable = ctx.authorize(AclOperation.READ, ResourceType.TOPIC, topic.name)
        partitions = []
        for part in topic.partitions:
            if not readable:
                code = ErrorCode.TOPIC_AUTHORIZATION_FAILED  # before its existence, which is not told
            elif info is None or not 0 <= part.partition_index < info.partitions:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # Kafka checks this before the coordinator
            elif check != ErrorCode.NONE:
                code = check
            elif part.committed_metadata is not None and len(part.committed_metadata.encode()) > max_metadata:
                code = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                code = ErrorCode.NONE
                epoch = part.committed_leader_epoch if version >= 2 else -1
                commits[(topic.name, part.partition_index)] = CommittedOffset(
                    part.committed_offset, epoch, part.committed_metadata, now
                )
            partitions.append(
                TxnOffsetCommitResponse.TxnOffsetCommitResponsePartition(
                    partition_index=part.partition_index, error_code=code
                )
            )
        topics.append(TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic(name=topic.name, partitions=partitions))
    if commits:
        try:
            end_offset = ctx.groups.offsets.commit_pending(
                request.group_id, request.producer_id, commits, request.producer_epoch
            )
            await ctx.groups.offsets.committed(request.group_id, end_offset)
            failure = ErrorCode.NONE
        except OffsetStoreError:  # logged; nothing recorded (as OffsetCommit answers a failed write)
            failure = ErrorCode.NOT_COORDINATOR
        except KafkaError as exc:  # written but not committed: the error as Kafka maps it (a timeout too)
            failure = write_error_answer(exc.code)
        if failure != ErrorCode.NONE:
            for topic_response in topics:
                for partition in topic_response.partitions:
                    if partition.error_code == ErrorCode.NONE:
                        partition.error_code = failure
    return TxnOffsetCommitResponse(throttle_time_ms=0, topics=topics)
