"""ApiVersions (key 18): what this broker handles, straight from the handler table, and its features (KIP-584).

The only feature named is transaction.version (KIP-890), supported 0-2 and finalized at 2 as in a Kafka 4.3
cluster: Java 4.x clients then use transaction version 2 (EndTxn v5 with the epoch bumped by the coordinator,
partitions added by Produce v12+ and TxnOffsetCommit v5); clients that do not look at features (Java 3.9,
librdkafka, kafka-python) keep using version 1, which the coordinator serves too. The finalized levels are the
metadata image's (FeatureLevelRecords; UpdateFeatures changes them, kbroker/apis/features.py) and the finalized
features epoch is the image's offset in the metadata log, as Kafka's; a client sees a change on its next
connection, as with Kafka. metadata.version is in the image but not named here, nor are the other features Kafka
lists (group.version, ...) (UNSUPPORTED.md).

From v5 (KIP-1242) a client may name the cluster and node it means to reach, both or neither (one alone is an
invalid request); as Kafka 4.4 checks it, a cluster that is not this one, or this cluster with another node id, is
answered REBOOTSTRAP_REQUIRED (the client then bootstraps again) with no API list.

Under a KRaft quorum the APIs a broker forwards to the controller are advertised, as Kafka's broker advertises them,
in the versions both the broker and the active controller serve (kbroker/apis/__init__.py ``advertised_under``).
"""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from kbroker.metadata.features import SUPPORTED_LEVELS
from protocol.errors import ErrorCode
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.api_versions_response import ApiVersionsResponse

# Kafka's regular expression for client software names and versions (KIP-511).
_SOFTWARE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")

SUPPORTED_FEATURES = [
    ApiVersionsResponse.SupportedFeatureKey(name=name, min_version=low, max_version=high)
    for name, (low, high) in SUPPORTED_LEVELS.items()
]


def _valid_software_field(value: str) -> bool:
    return bool(value) and value[0].isalnum() and value[-1].isalnum() and set(value) <= _SOFTWARE_CHARS


async def handle_api_versions(ctx: RequestContext, request: ApiVersionsRequest) -> ApiVersionsResponse:
    from kbroker.apis import advertised_under, advertised_versions  # the table imports this module

    version = ctx.api_version
    names_target = version >= 5 and request.cluster_id is not None
    if (version >= 5 and names_target != (request.node_id != -1)) or (
        version >= 3
        and not (
            _valid_software_field(request.client_software_name)
            and _valid_software_field(request.client_software_version)
        )
    ):
        return ApiVersionsResponse(error_code=ErrorCode.INVALID_REQUEST)
    if names_target and (request.cluster_id != ctx.cluster.cluster_id or request.node_id != ctx.cluster.node_id):
        return ApiVersionsResponse(error_code=ErrorCode.REBOOTSTRAP_REQUIRED)
    image = ctx.topics.image
    controller = ctx.topics.controller.controller_api_versions()
    return ApiVersionsResponse(
        error_code=ErrorCode.NONE,
        api_keys=advertised_versions() if controller is None else advertised_under(controller),
        throttle_time_ms=0,
        # As Kafka (KAFKA-17011): v3 leaves out supported features whose range starts at 0, which older clients
        # could not parse.
        supported_features=SUPPORTED_FEATURES if version >= 4 else [],
        # As Kafka's broker: the offset of the image it answers from (clients take finalized features only with
        # an epoch above -1).
        finalized_features_epoch=image.provenance.offset,
        # As Kafka 4: the finalized range of each feature is its one level.
        finalized_features=[
            ApiVersionsResponse.FinalizedFeatureKey(name=name, min_version_level=level, max_version_level=level)
            for name, level in image.features.items()
            if name in SUPPORTED_LEVELS
        ],
    )
