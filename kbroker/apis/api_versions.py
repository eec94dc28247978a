"""ApiVersions (key 18): what this broker handles, straight from the handler table."""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from protocol.errors import ErrorCode
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.api_versions_response import ApiVersionsResponse

# Kafka's regular expression for client software names and versions (KIP-511).
_SOFTWARE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")


def _valid_software_field(value: str) -> bool:
    return bool(value) and value[0].isalnum() and value[-1].isalnum() and set(value) <= _SOFTWARE_CHARS


async def handle_api_versions(ctx: RequestContext, request: ApiVersionsRequest) -> ApiVersionsResponse:
    from kbroker.apis import advertised_versions  # the table imports this module

    if ctx.api_version >= 3 and not (
        _valid_software_field(request.client_software_name) and _valid_software_field(request.client_software_version)
    ):
        return ApiVersionsResponse(error_code=ErrorCode.INVALID_REQUEST)
    return ApiVersionsResponse(
        error_code=ErrorCode.NONE,
        api_keys=advertised_versions(),
        throttle_time_ms=0,
    )
