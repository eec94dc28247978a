"""__consumer_offsets as Apache Kafka 4.3.1 shows it: created by the first FindCoordinator for a group, internal in
Metadata, listed by DescribeLogDirs and ListConfigResources, with Kafka's topic configs. Both brokers run with the
Kafka fixture's offsets.topic.num.partitions=1."""

from __future__ import annotations

import uuid
from typing import Any

from kbroker.wire_client import WireClient
from protocol.messages.describe_configs_request import DescribeConfigsRequest
from protocol.messages.describe_log_dirs_request import DescribeLogDirsRequest
from protocol.messages.list_config_resources_request import ListConfigResourcesRequest
from protocol.messages.metadata_request import MetadataRequest
from tests.kafka.test_transactions_kafka import GROUP_KEY, brokers, find_coordinator  # noqa: F401 (a fixture)

OFFSETS_TOPIC = "__consumer_offsets"
CONFIGS = ["cleanup.policy", "compression.type", "segment.bytes"]
TOPIC_RESOURCE = 2


def _scenario(client: WireClient) -> dict[str, Any]:
    find_coordinator(client, f"group-{uuid.uuid4().hex[:8]}", GROUP_KEY)
    wanted = [MetadataRequest.MetadataRequestTopic(name=OFFSETS_TOPIC)]
    [topic] = client.request(MetadataRequest(topics=wanted, allow_auto_topic_creation=False), 12).topics
    listed = {t.name: t.is_internal for t in client.request(MetadataRequest(topics=None), 12).topics}
    dirs = client.request(
        DescribeLogDirsRequest(
            topics=[DescribeLogDirsRequest.DescribableLogDirTopic(topic=OFFSETS_TOPIC, partitions=[0])]
        ),
        4,
    ).results
    resources = client.request(ListConfigResourcesRequest(resource_types=[TOPIC_RESOURCE]), 1).config_resources
    resource = DescribeConfigsRequest.DescribeConfigsResource(
        resource_type=TOPIC_RESOURCE, resource_name=OFFSETS_TOPIC, configuration_keys=CONFIGS
    )
    [described] = client.request(DescribeConfigsRequest(resources=[resource]), 4).results
    return {
        "metadata": (topic.error_code, topic.is_internal, [p.partition_index for p in topic.partitions]),
        "in the listing": listed.get(OFFSETS_TOPIC),
        "log dirs": sorted((t.name, [p.partition_index for p in t.partitions]) for d in dirs for t in d.topics),
        "config resources": [r.resource_name for r in resources if r.resource_name == OFFSETS_TOPIC],
        "configs": sorted((c.name, c.value) for c in described.configs),
    }


def test_consumer_offsets_is_shown_as_kafka_shows_it(brokers: dict[str, str]) -> None:  # noqa: F811
    seen = {}
    for name, bootstrap in brokers.items():
        with WireClient(bootstrap) as client:
            seen[name] = _scenario(client)
    assert seen["kbroker"] == seen["kafka"]
    assert seen["kafka"]["metadata"] == (0, True, [0])
    assert seen["kafka"]["config resources"] == [OFFSETS_TOPIC]
    assert seen["kafka"]["log dirs"] == [(OFFSETS_TOPIC, [0])]
    assert seen["kafka"]["configs"] == [
        ("cleanup.policy", "compact"),
        ("compression.type", "producer"),
        ("segment.bytes", "104857600"),
    ]
