"""ListTransactions (key 66) v0-2 and DescribeTransactions (key 65) v0: the transaction coordinator's state, as
Admin ``listTransactions`` / ``describeTransactions`` and ``kafka-transactions.sh list|describe`` show it.

- ListTransactions: every transactional id the coordinator knows but those being removed (Dead), filtered by
  state names (Kafka's: Empty, Ongoing, PrepareCommit, ...; a name Kafka does not know is echoed back in
  unknown_state_filters), by producer ids, from v1 by how long the transaction has been running
  (duration_filter ms; -1 for none), and from v2 by a regular expression on the transactional id
  (KIP-1152; Python's ``re`` where Kafka uses Java's, the common syntax agrees).
- DescribeTransactions: per transactional id its state, timeout, start time, producer id and epoch, and the
  partitions of the ongoing transaction by topic; TRANSACTIONAL_ID_NOT_FOUND for an id the coordinator does
  not know.

Authorization as Kafka's: only transactional ids the principal may DESCRIBE are listed; a described one it may not
is TRANSACTIONAL_ID_AUTHORIZATION_FAILED; a described transaction shows only the topics the principal may DESCRIBE.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

from kbroker.apis.context import RequestContext
from kbroker.groups.offsets import OFFSETS_TOPIC
from kbroker.java_hashing import coordinator_partition
from kbroker.security.acls import AclOperation, ResourceType
from kbroker.transactions.coordinator import TransactionMetadata, TxnState
from protocol.errors import ErrorCode
from protocol.messages.describe_transactions_request import DescribeTransactionsRequest
from protocol.messages.describe_transactions_response import DescribeTransactionsResponse
from protocol.messages.list_transactions_request import ListTransactionsRequest
from protocol.messages.list_transactions_response import ListTransactionsResponse

STATE_NAMES = {state.value: state for state in TxnState}
NO_DURATION_FILTER = -1


async def handle_list_transactions(ctx: RequestContext, request: ListTransactionsRequest) -> ListTransactionsResponse:
    wanted_states = {STATE_NAMES[name] for name in request.state_filters if name in STATE_NAMES}
    unknown_states = [name for name in request.state_filters if name not in STATE_NAMES]
    producer_ids = set(request.producer_id_filters)
    duration_ms = request.duration_filter if ctx.api_version >= 1 else NO_DURATION_FILTER
    pattern = None
    if ctx.api_version >= 2 and request.transactional_id_pattern:
        try:
            pattern = re.compile(request.transactional_id_pattern)
        except re.error:
            return ListTransactionsResponse(
                throttle_time_ms=0, error_code=ErrorCode.INVALID_REGULAR_EXPRESSION, transaction_states=[]
            )
    now_ms = int(time.time() * 1000)

    def included(metadata: TransactionMetadata) -> bool:
        if metadata.state is TxnState.DEAD:  # being expired and removed
            return False
        if producer_ids and metadata.producer_id not in producer_ids:
            return False
        if request.state_filters and metadata.state not in wanted_states:
            return False
        if duration_ms >= 0 and now_ms - metadata.start_ms <= duration_ms:
            return False
        if pattern is not None and pattern.fullmatch(metadata.transactional_id) is None:
            return False
        return ctx.authorize(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, metadata.transactional_id)

    states = [
        ListTransactionsResponse.TransactionState(
            transactional_id=metadata.transactional_id,
            producer_id=metadata.producer_id,
            transaction_state=metadata.state.value,
        )
        for metadata in list(ctx.transactions.transactions.values())
        if included(metadata)
    ]
    return ListTransactionsResponse(
        throttle_time_ms=0, error_code=ErrorCode.NONE, unknown_state_filters=unknown_states, transaction_states=states
    )


async def handle_describe_transactions(
    ctx: RequestContext, request: DescribeTransactionsRequest
) -> DescribeTransactionsResponse:
    answers = []
    for transactional_id in request.transactional_ids:
        if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            answers.append(
                DescribeTransactionsResponse.TransactionState(  # the other fields as Kafka leaves them
                    error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                    transactional_id=transactional_id,
                    topics=[],
                )
            )
            continue
        metadata = ctx.transactions.get(transactional_id)
        if metadata is None or metadata.state is TxnState.DEAD:
            answers.append(
                DescribeTransactionsResponse.TransactionState(  # the other fields as Kafka leaves them: zero
                    error_code=ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                    transactional_id=transactional_id,
                    transaction_state="",
                    transaction_timeout_ms=0,
                    transaction_start_time_ms=0,
                    producer_id=0,
                    producer_epoch=0,
                    topics=[],
                )
            )
            continue
        by_topic: defaultdict[str, list[int]] = defaultdict(list)
        # Kafka adds the group's __consumer_offsets partition to the transaction (AddOffsetsToTxn); kbroker keeps
        # the groups apart, so they are named as the partition Kafka would have added.
        offsets_partitions = ctx.config["offsets.topic.num.partitions"]
        for topic, partition in sorted(
            {
                *metadata.partitions,
                *((OFFSETS_TOPIC, coordinator_partition(g, offsets_partitions)) for g in metadata.groups),
            }
        ):
            by_topic[topic].append(partition)
        answers.append(
            DescribeTransactionsResponse.TransactionState(
                error_code=ErrorCode.NONE,
                transactional_id=transactional_id,
                transaction_state=metadata.state.value,
                transaction_timeout_ms=metadata.timeout_ms,
                transaction_start_time_ms=metadata.start_ms,
                producer_id=metadata.producer_id,
                producer_epoch=metadata.producer_epoch,
                topics=[
                    DescribeTransactionsResponse.TopicData(topic=topic, partitions=partitions)
                    for topic, partitions in by_topic.items()
                    if ctx.authorize(AclOperation.DESCRIBE, ResourceType.TOPIC, topic)
                ],
            )
        )
    return DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=answers)
