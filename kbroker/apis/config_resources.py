"""ListConfigResources (key 74), versions 0-1: the resources DescribeConfigs can be asked about (KIP-1142).

Version 0 was ListClientMetricsResources (KIP-714) and lists only client metrics subscriptions: kbroker has
none, so its answer is empty. Version 1 lists the resources of the types asked for (none: every type), as Kafka
4.3 does: the broker's logger and the broker itself (named by node id), then every topic. Client metrics
subscriptions are a valid type with nothing to list (kbroker has none); groups are listed when they have config
overrides, as Kafka lists them. A type that is not a config
resource type (UNKNOWN, ANY, the ACL-only types, ...) fails the request with UNSUPPORTED_VERSION, Kafka's answer.
As Kafka 4.3, every version needs DESCRIBE_CONFIGS on the cluster first (else CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from kbroker.apis.configs import BROKER, BROKER_LOGGER, TOPIC
from kbroker.apis.context import RequestContext
from kbroker.metadata.image import ConfigResourceType
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.list_config_resources_request import ListConfigResourcesRequest
from protocol.messages.list_config_resources_response import ListConfigResourcesResponse

CLIENT_METRICS = 16
GROUP = 32
CONFIG_RESOURCE_TYPES = frozenset({TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP})

Resource = ListConfigResourcesResponse.ConfigResource


async def handle_list_config_resources(
    ctx: RequestContext, request: ListConfigResourcesRequest
) -> ListConfigResourcesResponse:
    if not ctx.authorize(AclOperation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed.")
    if ctx.api_version == 0:  # client metrics subscriptions only
        return ListConfigResourcesResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, config_resources=[])
    wanted = set(request.resource_types) or CONFIG_RESOURCE_TYPES
    if not wanted <= CONFIG_RESOURCE_TYPES:
        return ListConfigResourcesResponse(
            throttle_time_ms=0, error_code=ErrorCode.UNSUPPORTED_VERSION, config_resources=[]
        )
    node = str(ctx.cluster.node_id)
    resources = []
    if BROKER_LOGGER in wanted:
        resources.append(Resource(resource_name=node, resource_type=BROKER_LOGGER))
    if BROKER in wanted:
        resources.append(Resource(resource_name=node, resource_type=BROKER))
    if TOPIC in wanted:
        resources += [Resource(resource_name=info.name, resource_type=TOPIC) for info in ctx.topics.all()]
    if GROUP in wanted:  # the groups with config overrides (ConfigRecords on GROUP resources), as Kafka
        resources += [
            Resource(resource_name=name, resource_type=GROUP)
            for kind, name in ctx.topics.image.configs
            if kind == ConfigResourceType.GROUP
        ]
    return ListConfigResourcesResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, config_resources=resources)
