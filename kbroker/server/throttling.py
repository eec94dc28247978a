"""Client quotas on the request path: measure a request against the quotas that apply to its client, and say for
how long the connection is to be muted (Kafka's quota managers; the quotas and rates are in kbroker/quotas.py).

The connection calls ``answer_under_quotas`` instead of the handler only while some user or client-id quota is
set (``ClientQuotas.enforcing``), so a broker without quotas pays one attribute look-up per request.

What is measured, as Kafka does:

- producer_byte_rate: the Produce request's size (its whole frame), acks=0 included.
- consumer_byte_rate: the Fetch response's size (its whole frame). Kafka answers a fetch over the quota with an
  empty response and keeps the data for later; kbroker sends the data it read with the throttle time, and the
  mute that follows holds the average at the quota all the same (UNSUPPORTED.md).
- request_percentage: the time the handler ran on the event loop, its waits (a long-polling fetch, a rebalance,
  an fsync in a worker thread) left out, as a percentage of one thread: Kafka measures its request handler
  threads' time the same way. The handler's coroutine is stepped through ``timed`` only for clients under such
  a quota. Produce with acks=0 is not measured (Kafka: no response to carry the throttle).

The throttle time goes into the response's throttle_time_ms (the response is encoded a second time for that,
which only happens to a client over its quota). KIP-219: for the versions whose clients back off by themselves,
the response is sent at once and reading from the connection stops for the throttle time afterwards; for older
versions the broker holds the response for the throttle time before sending it.
"""

from __future__ import annotations

import time
import types
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

from kbroker.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE
from protocol.framing import SplicedOutput

if TYPE_CHECKING:
    from kbroker.apis import ApiHandler
    from kbroker.apis.context import RequestContext

PRODUCE, FETCH = 0, 1
# KIP-219 (Kafka 2.0): from which version a client throttles itself on throttle_time_ms, per API key (Kafka's
# AbstractResponse.shouldClientThrottle). APIs added later throttle themselves in every version.
CLIENT_THROTTLES_FROM = {
    0: 6,  # Produce
    1: 8,  # Fetch
    2: 3,  # ListOffsets
    3: 6,  # Metadata
    8: 4,  # OffsetCommit
    9: 4,  # OffsetFetch
    10: 2,  # FindCoordinator
    11: 3,  # JoinGroup
    12: 2,  # Heartbeat
    13: 2,  # LeaveGroup
    14: 2,  # SyncGroup
    15: 2,  # DescribeGroups
    16: 2,  # ListGroups
    18: 2,  # ApiVersions
    19: 3,  # CreateTopics
    20: 2,  # DeleteTopics
    21: 1,  # DeleteRecords
    22: 1,  # InitProducerId
    23: 2,  # OffsetForLeaderEpoch
    24: 1,  # AddPartitionsToTxn
    25: 1,  # AddOffsetsToTxn
    26: 1,  # EndTxn
    28: 1,  # TxnOffsetCommit
    32: 2,  # DescribeConfigs
    33: 1,  # AlterConfigs
    34: 1,  # AlterReplicaLogDirs
    35: 1,  # DescribeLogDirs
    37: 1,  # CreatePartitions
    42: 1,  # DeleteGroups
}

T = TypeVar("T")


def client_throttles(api_key: int, version: int) -> bool:
    """Whether the client backs off on its own for this response (KIP-219), so the broker can answer at once."""
    return version >= CLIENT_THROTTLES_FROM.get(api_key, 0)


def user_of(principal: str) -> str:
    """The quota user of a principal: its name ("User:ANONYMOUS" is the user ANONYMOUS)."""
    return principal.partition(":")[2] or principal


@types.coroutine
def timed(awaitable: Awaitable[T]) -> Generator[Any, Any, tuple[T, float]]:
    """Run ``awaitable`` to its end and return its result with the seconds it ran: the sum of its steps between
    suspensions, so time spent waiting (sleeping, in a worker thread, for other tasks) is not counted."""
    steps = awaitable.__await__()
    spent = 0.0
    to_send: Any = None
    to_throw: BaseException | None = None
    while True:
        started = time.perf_counter()
        try:
            yielded = steps.send(to_send) if to_throw is None else steps.throw(to_throw)
        except StopIteration as done:
            return done.value, spent + time.perf_counter() - started
        spent += time.perf_counter() - started
        to_throw = None
        try:
            to_send = yield yielded
        except BaseException as exc:  # noqa: BLE001 - passed on to the coroutine, which decides
            to_throw, to_send = exc, None


async def answer_under_quotas(
    handler: ApiHandler,
    context: RequestContext,
    body: Any,
    request_size: int,
    encode: Callable[[Any], Awaitable[SplicedOutput]],
) -> tuple[SplicedOutput | None, int]:
    """The encoded answer (None for acks=0) and the throttle time in ms this request earned its client."""
    quotas = context.quotas
    user, client_id = user_of(context.principal), context.client_id or ""
    key = context.api_key
    unanswered = key == PRODUCE and getattr(body, "acks", None) == 0
    request_throttle = 0
    response: Any
    if not unanswered and quotas.applies(REQUEST_PERCENTAGE, user, client_id):
        response, seconds = await timed(handler.handle(context, body))
        request_throttle = quotas.record(REQUEST_PERCENTAGE, user, client_id, seconds * 100)
    else:
        response = await handler.handle(context, body)
    byte_throttle = 0
    if key == PRODUCE:
        byte_throttle = quotas.record(PRODUCER_BYTE_RATE, user, client_id, request_size)
    if response is None:
        return None, byte_throttle
    encoded = await encode(response)
    if key == FETCH:
        byte_throttle = quotas.record(CONSUMER_BYTE_RATE, user, client_id, len(encoded) + encoded.spliced_length)
    throttle = max(request_throttle, byte_throttle)
    if throttle > 0 and hasattr(response, "throttle_time_ms"):
        response.throttle_time_ms = max(response.throttle_time_ms, throttle)
        encoded = await encode(response)
    return encoded, throttle
