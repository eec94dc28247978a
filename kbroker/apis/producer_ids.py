"""InitProducerId (22): producer ids for idempotent and transactional producers.

An idempotent producer (no transactional id) always gets a fresh producer id with epoch 0, as in Kafka; the
per-partition sequence checks live with the log (kbroker/storage) because they must be atomic with the append.
A transactional id goes to the transaction coordinator (kbroker/transactions), which bumps its epoch, fences the
previous instance and aborts its open transaction; ``producer_id`` and ``producer_epoch`` (v3+) are KIP-360's
recovery of a producer that had an abortable error.

Authorization as Kafka's: a transactional id needs WRITE on it (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED); an
idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic (else
CLUSTER_AUTHORIZATION_FAILED), both before anything else is looked at.
"""

from __future__ import annotations

import logging

from kbroker.apis.context import RequestContext
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.messages.init_producer_id_response import InitProducerIdResponse

log = logging.getLogger("kbroker.producers")

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


def _answer(
    code: ErrorCode, producer_id: int = NO_PRODUCER_ID, epoch: int = NO_PRODUCER_EPOCH
) -> InitProducerIdResponse:
    return InitProducerIdResponse(throttle_time_ms=0, error_code=code, producer_id=producer_id, producer_epoch=epoch)


async def handle_init_producer_id(ctx: RequestContext, request: InitProducerIdRequest) -> InitProducerIdResponse:
    if request.transactional_id is not None:
        if not ctx.authorize(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
            return _answer(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    elif not ctx.authorize(AclOperation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME) and not (
        ctx.authorize_any(AclOperation.WRITE, ResourceType.TOPIC)
    ):
        return _answer(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    expected: tuple[int, int] | None = None
    if ctx.api_version >= 3:
        producer_id, epoch = request.producer_id, request.producer_epoch
        if (producer_id == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH):
            return _answer(ErrorCode.INVALID_REQUEST)  # both or neither, as Kafka checks
        if producer_id != NO_PRODUCER_ID:
            expected = (producer_id, epoch)
    if request.transactional_id is None:
        producer_id = ctx.producer_ids.allocate_producer_id()
        log.debug("producer id %d for client %s", producer_id, ctx.client_id)
        return _answer(ErrorCode.NONE, producer_id, 0)
    result = ctx.transactions.init_producer_id(request.transactional_id, request.transaction_timeout_ms, expected)
    code = result.error
    if code == ErrorCode.NONE:  # the new epoch fences the previous instance only once the ISR has it
        code = await ctx.transactions.replicated(request.transactional_id)
        if code != ErrorCode.NONE:
            return _answer(code)
    if code == ErrorCode.PRODUCER_FENCED and ctx.api_version < 4:
        code = ErrorCode.INVALID_PRODUCER_EPOCH  # PRODUCER_FENCED is new in v4 (KIP-588)
    return _answer(code, result.producer_id, result.producer_epoch)
