"""SaslHandshake (17) v0-1 and SaslAuthenticate (36) v0-2 outside an authentication.

While a SASL listener's connection authenticates (or re-authenticates), the connection hands these two to its
authenticator (kbroker/security/authenticator.py), which answers them; they never get here. What gets here is
either sent on a listener without SASL, or after authentication completed (a SaslHandshake of a re-authentication
that is not allowed yet, KIP-368). Kafka's KafkaApis answers both ILLEGAL_SASL_STATE, and so does kbroker.

Versions: SaslHandshake v1 means SaslAuthenticate requests follow (v0: raw tokens); SaslAuthenticate v1 adds
session_lifetime_ms, v2 is the flexible encoding.
"""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from protocol.errors import ErrorCode
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_authenticate_response import SaslAuthenticateResponse
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest
from protocol.messages.sasl_handshake_response import SaslHandshakeResponse


async def handle_sasl_handshake(ctx: RequestContext, request: SaslHandshakeRequest) -> SaslHandshakeResponse:
    return SaslHandshakeResponse(error_code=ErrorCode.ILLEGAL_SASL_STATE, mechanisms=[])


async def handle_sasl_authenticate(ctx: RequestContext, request: SaslAuthenticateRequest) -> SaslAuthenticateResponse:
    return SaslAuthenticateResponse(
        error_code=ErrorCode.ILLEGAL_SASL_STATE,
        error_message="SaslAuthenticate request received after successful authentication",
    )
