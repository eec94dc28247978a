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


async def forward_to_controller(ctx: RequestContext, body: Any = None, *, api_version: int | None = None) -> Any:
    """The controller's answer to this request as the client sent it, or, given ``body``, to ``body`` sent with the
    client's header (Kafka's serializeWithHeader, for what is left of a request answered in part; ``api_version``
    for a request of another API, as the CreateTopics a Metadata request auto-creates a topic with)."""
    from kbroker.kraft.forwarding import ControllerVersionMismatch

    api_key = ctx.api_key if body is None else body.API_KEY
    version = ctx.api_version if api_version is None else api_version
    frame: bytes | bytearray
    if body is not None:
        frame = encode_request(body, version, ctx.correlation_id, ctx.client_id)[4:]
    elif ctx.request_frame is not None:
        frame = ctx.request_frame
    else:
        raise ValueError("a request without its frame needs its body to be forwarded")
    try:
        return await ctx.topics.controller.forward(
            frame,
            api_key=api_key,
            api_version=version,
            principal=ctx.principal,
            client_host=ctx.client_address,
        )
    except ControllerVersionMismatch as exc:
        raise CloseConnection(f"{exc} (it may have changed since the client asked ApiVersions)") from None


def forwarded_in_a_cluster(local: Any) -> Any:
    """``local`` for a broker that is its own controller; the controller's answer for one under a KRaft quorum."""

    async def handle(ctx: RequestContext, request: Any) -> Any:
        if ctx.topics.controller.forwards_requests:
            return await forward_to_controller(ctx, None if ctx.request_frame is not None else request)
        return await local(ctx, request)

    handle.__name__ = handle.__qualname__ = getattr(local, "__name__", "handle")
    handle.__doc__ = local.__doc__
    return handle
