"""Requests a broker under Kafka's KRaft quorum forwards to the active controller, as Kafka's broker does.

Kafka 4.4's KafkaApis hands CreateTopics, DeleteTopics, CreatePartitions, CreateAcls, DeleteAcls, ElectLeaders,
AlterPartitionReassignments, ListPartitionReassignments, AlterClientQuotas, AlterUserScramCredentials,
UpdateFeatures and DescribeQuorum to its ForwardingManager whole: the broker neither checks nor authorizes them,
the controller does, as the client's principal (the Envelope carries it). ``forwarded_in_a_cluster`` wraps such a
handler so that it does the same when the broker's controller forwards requests (kbroker/kraft/forwarding.py) and
answers locally otherwise (a single node is its own controller). AlterConfigs and IncrementalAlterConfigs are
answered in part here first, as Kafka's broker does, and the rest forwarded re-encoded (kbroker/apis/configs.py).
"""

from __future__ import annotations

from typing import Any

from kbroker.apis.context import CloseConnection, RequestContext
from protocol.framing import encode_request

READS = frozenset({46, 55})  # ListPartitionReassignments, DescribeQuorum: nothing to wait for in the image


async def forward_to_controller(
    ctx: RequestContext, body: Any, *, as_received: bool = False, api_version: int | None = None
) -> Any:
    """The controller's answer to ``body`` sent with the client's header: the request's bytes as the client sent
    them if ``as_received``, else ``body`` encoded (Kafka's serializeWithHeader, for what is left of a request
    answered in part, or at ``api_version`` for another API: the CreateTopics a Metadata request auto-creates a
    topic with)."""
    from kbroker.kraft.forwarding import ControllerVersionMismatch

    version = ctx.api_version if api_version is None else api_version
    frame: bytes | bytearray
    if as_received and ctx.request_frame is not None:
        frame = ctx.request_frame
    else:
        frame = encode_request(body, version, ctx.correlation_id, ctx.client_id)[4:]
    try:
        return await ctx.topics.controller.forward(
            frame,
            api_key=body.API_KEY,
            api_version=version,
            principal=ctx.principal,
            client_host=ctx.client_address,
            changes=body.API_KEY not in READS and not getattr(body, "validate_only", False),
        )
    except ControllerVersionMismatch as exc:
        raise CloseConnection(f"{exc} (it may have changed since the client asked ApiVersions)") from None


def forwarded_in_a_cluster(local: Any) -> Any:
    """``local`` for a broker that is its own controller; the controller's answer for one under a KRaft quorum."""

    async def handle(ctx: RequestContext, request: Any) -> Any:
        if ctx.topics.controller.forwards_requests:
            return await forward_to_controller(ctx, request, as_received=True)
        return await local(ctx, request)

    handle.__name__ = handle.__qualname__ = getattr(local, "__name__", "handle")
    handle.__doc__ = local.__doc__
    return handle
