"""The handler table: every entry resolves to a handler, and ApiVersions advertises exactly the table."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from kbroker.apis import ADVERTISED_MIN_VERSION, HANDLERS, advertised_versions
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages import APIS
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.describe_cluster_request import DescribeClusterRequest


@pytest.mark.parametrize("api_key", sorted(HANDLERS))
def test_every_entry_resolves_to_a_coroutine_handler(api_key: int) -> None:
    handler = HANDLERS[api_key]
    assert inspect.iscoroutinefunction(handler.handle), handler.target
    low, high = APIS[api_key].valid_versions
    assert low <= handler.min_version <= handler.max_version <= high


def test_api_versions_is_derived_from_the_table() -> None:
    advertised = {(v.api_key, v.min_version, v.max_version) for v in advertised_versions()}
    expected = {(k, ADVERTISED_MIN_VERSION.get(k, h.min_version), h.max_version) for k, h in HANDLERS.items()}
    assert advertised == expected


def test_api_versions_v5_checks_the_cluster_and_node_a_client_names(broker: RunningBroker) -> None:
    """KIP-1242 as Kafka 4.4 answers it (compared with Kafka in tests/kafka/test_differential_kafka.py)."""
    with WireClient(broker.bootstrap) as client:
        cluster_id = client.request(DescribeClusterRequest(), 0).cluster_id
        node_id = client.request(DescribeClusterRequest(), 0).controller_id

        def ask(cluster: str | None, node: int) -> Any:
            request = ApiVersionsRequest(
                client_software_name="x", client_software_version="1", cluster_id=cluster, node_id=node
            )
            return client.request(request, 5)

        served = ask(cluster_id, node_id)
        assert served.error_code == ErrorCode.NONE
        assert [(v.api_key, v.min_version, v.max_version) for v in served.api_keys if v.api_key == 18] == [(18, 0, 5)]
        assert ask(None, -1).error_code == ErrorCode.NONE  # naming neither is not checked
        for cluster, node in ((cluster_id, node_id + 1), ("AAAAAAAAAAAAAAAAAAAAAA", node_id)):
            refused = ask(cluster, node)
            assert (refused.error_code, refused.api_keys) == (ErrorCode.REBOOTSTRAP_REQUIRED, [])
        for cluster, node in ((cluster_id, -1), (None, node_id)):  # one without the other
            assert ask(cluster, node).error_code == ErrorCode.INVALID_REQUEST
