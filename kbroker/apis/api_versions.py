"""ApiVersions (key 18): what this broker handles, straight from the handler table, and its features (KIP-584).

The only feature named is transaction.version (KIP-890), supported 0-2 and finalized at 2 as in a Kafka 4.3
cluster: Java 4.x clients then use transaction version 2 (EndTxn v5 with the epoch bumped by the coordinator,
partitions added by Produce v12+ and TxnOffsetCommit v5); clients that do not look at features (Java 3.9,
librdkafka, kafka-python) keep using version 1, which the coordinator serves too. kbroker has no KRaft metadata
log, so the other features Kafka lists (metadata.version, group.version, ...) are not named (UNSUPPORTED.md).
"""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from protocol.errors import ErrorCode
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.api_versions_response import ApiVersionsResponse

# Kafka's regular expression for client software names and versions (KIP-511).
_SOFTWARE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")

TRANSACTION_VERSION = "transaction.version"
SUPPORTED_FEATURES = [ApiVersionsResponse.SupportedFeatureKey(name=TRANSACTION_VERSION, min_version=0, max_version=2)]
FINALIZED_FEATURES = [
    ApiVersionsResponse.FinalizedFeatureKey(name=TRANSACTION_VERSION, min_version_level=2, max_version_level=2)
]
# Kafka's epoch is the offset of the last feature change in its metadata log; the features here never change.
# Clients take finalized features only with an epoch above -1 (what they start from).
FINALIZED_FEATURES_EPOCH = 0


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
        # As Kafka (KAFKA-17011): v3 leaves out supported features whose range starts at 0, which older clients
        # could not parse.
        supported_features=SUPPORTED_FEATURES if ctx.api_version >= 4 else [],
        finalized_features_epoch=FINALIZED_FEATURES_EPOCH,
        finalized_features=FINALIZED_FEATURES,
    )
