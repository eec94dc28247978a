"""UpdateFeatures (key 57), versions 0-2: finalize feature levels (KIP-584), a controller operation.

The levels are FeatureLevelRecords of the metadata log: the controller checks the updates as Kafka's
FeatureControlManager does (kbroker/metadata/features.py: Kafka's refusals, order and messages) and commits a record
per changed level before the answer, so every later ApiVersions reports it from the image, with the image's offset
as the finalized features epoch (as Kafka). Level 0 removes the feature from the finalized list, as in Kafka.

- v0: each update carries allow_downgrade, which Kafka 4 ignores (it reads only the upgrade type, 1 in v0).
- v1: upgrade_type replaces allow_downgrade; validate_only checks without changing anything.
- v2: no per-feature results on success (v0-1 list each update with NONE and the message "NONE", as Kafka).
The request's timeout_ms is not used: the change is made before the answer, as Kafka 4.3 answers even with 0.
"""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.update_features_request import UpdateFeaturesRequest
from protocol.messages.update_features_response import UpdateFeaturesResponse

__all__ = ["handle_update_features"]


async def handle_update_features(ctx: RequestContext, request: UpdateFeaturesRequest) -> UpdateFeaturesResponse:
    # As Kafka's controller: ALTER on the cluster, else the request fails (its message names the request object).
    if not ctx.authorize(AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    # Like a map: the last update of a feature counts.
    updates = {update.feature: (update.max_version_level, update.upgrade_type) for update in request.feature_updates}
    try:
        await ctx.topics.admin.update_features(updates, validate_only=request.validate_only)
    except KafkaError as exc:
        if exc.code != ErrorCode.INVALID_UPDATE_VERSION:
            raise
        return UpdateFeaturesResponse(throttle_time_ms=0, error_code=exc.code, error_message=exc.message, results=[])
    results = [
        UpdateFeaturesResponse.UpdatableFeatureResult(
            feature=update.feature, error_code=ErrorCode.NONE, error_message=ErrorCode.NONE.name
        )
        for update in request.feature_updates
    ]
    return UpdateFeaturesResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        error_message=None,
        results=results if ctx.api_version < 2 else [],
    )
