"""DescribeClientQuotas (48) and AlterClientQuotas (49): the wire side of kbroker/quotas.py.

The quotas are the metadata image's: describing reads them (through the quota manager, a subscriber of the
image), altering is a controller operation validated as Kafka's ClientQuotaControlManager (kbroker/quotas.py) whose
ClientQuotaRecords are committed before the answer; this module turns requests into those calls and the answers
into responses, in the order Kafka lists them.

Authorization as Kafka's: describing needs DESCRIBE_CONFIGS on the cluster, altering ALTER_CONFIGS (checked by
Kafka's controller, whose message names the request object); else the request fails CLUSTER_AUTHORIZATION_FAILED,
without a message (Kafka 4.3 gives none when describing).
"""

from __future__ import annotations

import trio

from kbroker.apis.context import RequestContext
from kbroker.java_hashing import java_hashmap_order
from kbroker.quotas import (
    IP,
    QuotaFilterError,
    entity_hash,
    entity_parts_in_kafka_order,
    is_ip_literal,
    values_in_kafka_order,
)
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.alter_client_quotas_request import AlterClientQuotasRequest
from protocol.messages.alter_client_quotas_response import AlterClientQuotasResponse
from protocol.messages.describe_client_quotas_request import DescribeClientQuotasRequest
from protocol.messages.describe_client_quotas_response import DescribeClientQuotasResponse

RESOLVE_TIMEOUT_S = 5.0  # a host name given as an IP entity: how long to wait for DNS before calling it invalid


async def handle_describe_client_quotas(
    ctx: RequestContext, request: DescribeClientQuotasRequest
) -> DescribeClientQuotasResponse:
    if not ctx.authorize(AclOperation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)  # Kafka 4.3 gives no message
    components = [(c.entity_type, c.match_type, c.match) for c in request.components]
    try:
        matches = ctx.quotas.describe(components, request.strict)
    except QuotaFilterError as exc:
        return DescribeClientQuotasResponse(error_code=exc.code, error_message=exc.message, entries=None)
    Entry = DescribeClientQuotasResponse.EntryData
    entries = [
        Entry(
            entity=[
                DescribeClientQuotasResponse.EntityData(entity_type=t, entity_name=n)
                for t, n in entity_parts_in_kafka_order(entity)
            ],
            values=[DescribeClientQuotasResponse.ValueData(key=k, value=v) for k, v in values_in_kafka_order(values)],
        )
        for entity, values in matches
    ]
    return DescribeClientQuotasResponse(error_code=ErrorCode.NONE, error_message="", entries=entries)


async def _resolvable_hosts(request: AlterClientQuotasRequest) -> set[str]:
    """The IP entity names that are host names and resolve (Kafka accepts what InetAddress.getByName resolves),
    looked up before the alteration so that DNS never blocks the event loop."""
    hosts = {
        part.entity_name
        for entry in request.entries
        for part in entry.entity
        if part.entity_type == IP and part.entity_name and not is_ip_literal(part.entity_name)
    }
    resolvable = set()
    for host in hosts:
        with trio.move_on_after(RESOLVE_TIMEOUT_S):
            try:
                await trio.socket.getaddrinfo(host, None)
            except OSError:
                continue
            resolvable.add(host)
    return resolvable


async def handle_alter_client_quotas(
    ctx: RequestContext, request: AlterClientQuotasRequest
) -> AlterClientQuotasResponse:
    if not ctx.authorize(AclOperation.ALTER_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    hosts = await _resolvable_hosts(request)
    entries = [
        (
            [(part.entity_type, part.entity_name) for part in entry.entity],
            [(op.key, None if op.remove else op.value) for op in entry.ops],
        )
        for entry in request.entries
    ]
    results = dict(
        await ctx.topics.admin.alter_client_quotas(
            entries, request.validate_only, lambda name: is_ip_literal(name) or name in hosts
        )
    )
    # Kafka answers from a HashMap of entity to result: its bucket order.
    order = java_hashmap_order(list(results), entity_hash)
    return AlterClientQuotasResponse(
        throttle_time_ms=0,
        entries=[
            AlterClientQuotasResponse.EntryData(
                error_code=results[entity].error,
                error_message=results[entity].message,
                entity=[
                    AlterClientQuotasResponse.EntityData(entity_type=t, entity_name=n) for t, n in results[entity].parts
                ],
            )
            for entity in order
        ],
    )
