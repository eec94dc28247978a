"""InitProducerId (22): producer ids for idempotent producers.

An idempotent producer (no transactional id) always gets a fresh producer id with epoch 0, as in Kafka;
the per-partition sequence checks live with the log (kbroker/storage) because they must be atomic with
the append. Transactional ids need the transaction coordinator, listed in kbroker/UNSUPPORTED.md.
"""

from __future__ import annotations

import logging

from kbroker.apis.context import RequestContext
from protocol.errors import ErrorCode
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.messages.init_producer_id_response import InitProducerIdResponse

log = logging.getLogger("kbroker.producers")


async def handle_init_producer_id(ctx: RequestContext, request: InitProducerIdRequest) -> InitProducerIdResponse:
    if request.transactional_id is not None:
        return InitProducerIdResponse(
            throttle_time_ms=0, error_code=ErrorCode.NOT_COORDINATOR, producer_id=-1, producer_epoch=-1
        )
    producer_id = ctx.producer_ids.allocate_producer_id()
    log.debug("producer id %d for client %s", producer_id, ctx.client_id)
    return InitProducerIdResponse(
        throttle_time_ms=0, error_code=ErrorCode.NONE, producer_id=producer_id, producer_epoch=0
    )
