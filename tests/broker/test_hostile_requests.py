"""Every API the broker handles, fed well-formed requests full of random values: it must always answer.

Values come from the same schema-driven hypothesis strategies as tests/test_differential.py, so requests
name unknown topics, groups and producers, carry garbage record bytes, negative sizes and odd strings. A
handled version must never close the connection or raise inside a handler: the answer is a Kafka error code.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from test_differential import build_protocol, compared_pairs, message, struct_strategy

from kbroker.apis import HANDLERS
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.describe_groups_request import DescribeGroupsRequest
from protocol.messages.metadata_request import MetadataRequest

# Fields that make the broker wait: kept short so that a legitimate long poll does not look like a hang.
WAIT_FIELDS = {"max_wait_ms", "timeout_ms", "rebalance_timeout_ms", "session_timeout_ms"}
EXAMPLES = 6


def _cases() -> list[Any]:
    handled = [
        (key, version)
        for key, version in compared_pairs()
        if key in HANDLERS and HANDLERS[key].min_version <= version <= HANDLERS[key].max_version
    ]
    return [pytest.param(key, version, id=f"{HANDLERS[key].name}-v{version}") for key, version in handled]


class _Failures(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def hostile_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningBroker, _Failures]]:
    failures = _Failures()
    server_log = logging.getLogger("kbroker.server")
    server_log.addHandler(failures)
    overrides = {"group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "1"}
    data_dir: Path = tmp_path_factory.mktemp("hostile")
    with RunningBroker(data_dir, overrides) as broker:
        yield broker, failures
    server_log.removeHandler(failures)


KNOWN_TOPIC = "known"
KNOWN_GROUP = "known-group"
NAME_FIELDS = {"name": KNOWN_TOPIC, "topic": KNOWN_TOPIC, "topic_name": KNOWN_TOPIC, "group_id": KNOWN_GROUP}


def _aim(value: Any) -> Any:
    """Point about half of the names at a topic and a group that exist, so requests reach real state."""
    if isinstance(value, list):
        return [_aim(item) for item in value]
    if isinstance(value, dict):
        for key, item in value.items():
            if key in NAME_FIELDS and isinstance(item, str) and len(item) % 2 == 0:
                value[key] = NAME_FIELDS[key]
            else:
                value[key] = _aim(item)
    return value


def _tame(values: dict[str, Any]) -> dict[str, Any]:
    values = _aim(values)
    for name in WAIT_FIELDS & values.keys():
        if isinstance(values[name], int):
            values[name] = min(max(values[name], 0), 50)
    if isinstance(values.get("acks"), int) and values["acks"] == 0:
        values["acks"] = 1  # acks=0 is answered with silence, which this test would take for a hang
    return values


@pytest.mark.parametrize("api_key,version", _cases())
def test_random_requests_get_answers_not_closed_connections(
    hostile_broker: tuple[RunningBroker, _Failures], api_key: int, version: int
) -> None:
    broker, failures = hostile_broker
    msg = message(api_key, "request")
    with WireClient(broker.bootstrap) as client:  # again for each API: DeleteTopics may have removed it
        topic = CreateTopicsRequest.CreatableTopic(name=KNOWN_TOPIC, num_partitions=3, replication_factor=1)
        client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7)
    before = len(failures.records)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(struct_strategy(msg.fields, version, msg.proto_cls).map(_tame))
    def check(values: dict[str, Any]) -> None:
        request = build_protocol(msg.fields, values, msg.proto_cls)
        with WireClient(broker.bootstrap, timeout=20) as client:
            response = client.request(request, version)  # a closed connection or a timeout raises here
        assert response is not None
        problems = [r.getMessage() for r in failures.records[before:]]
        assert not problems, problems

    check()


def test_topic_ids_in_metadata_before_v12_are_an_invalid_request(hostile_broker: tuple[RunningBroker, Any]) -> None:
    # The v10-11 schema has nullable names and topic ids, but Kafka only lets v12+ use them. Encoding the
    # answer for such a request once took the whole broker down.
    broker, _ = hostile_broker
    by_id = MetadataRequest.MetadataRequestTopic(name=None, topic_id=uuid.uuid4())
    with WireClient(broker.bootstrap) as client:
        for version in (10, 11):
            answer = client.request(MetadataRequest(topics=[by_id], allow_auto_topic_creation=True), version)
            assert [(t.error_code, t.name) for t in answer.topics] == [(ErrorCode.INVALID_REQUEST, "")]
        answer = client.request(MetadataRequest(topics=[by_id]), 12)
        assert [t.error_code for t in answer.topics] == [ErrorCode.UNKNOWN_TOPIC_ID]


def test_a_response_larger_than_a_mebibyte_reaches_the_wire_client(hostile_broker: tuple[RunningBroker, Any]) -> None:
    # 3,000 groups of 400-character ids: a DescribeGroups answer of about 1.2 MB, read in growing pieces.
    broker, _ = hostile_broker
    ids = [f"{i:04d}" + "g" * 396 for i in range(3000)]
    with WireClient(broker.bootstrap) as client:
        answer = client.request(DescribeGroupsRequest(groups=ids, include_authorized_operations=False), 5)
    assert [g.group_id for g in answer.groups] == ids
