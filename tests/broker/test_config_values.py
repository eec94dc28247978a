"""Topic configs through CreateTopics and AlterConfigs: a null value is refused and nothing is applied, given
values are kept; a topic with flush.messages=1 is flushed before its produce is acknowledged."""

from __future__ import annotations

from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.alter_configs_request import AlterConfigsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch

TOPIC_RESOURCE = 2


def _create(client: WireClient, name: str, configs: list[tuple[str, str | None]]) -> CreateTopicsRequest:
    topic = CreateTopicsRequest.CreatableTopic(
        name=name,
        num_partitions=1,
        replication_factor=1,
        configs=[CreateTopicsRequest.CreatableTopicConfig(name=k, value=v) for k, v in configs],
    )
    return client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7).topics[0]


def _alter(client: WireClient, name: str, configs: list[tuple[str, str | None]]) -> tuple[int, str | None]:
    resource = AlterConfigsRequest.AlterConfigsResource(
        resource_type=TOPIC_RESOURCE,
        resource_name=name,
        configs=[AlterConfigsRequest.AlterableConfig(name=k, value=v) for k, v in configs],
    )
    answer = client.request(AlterConfigsRequest(resources=[resource]), 2).responses[0]
    return answer.error_code, answer.error_message


def test_create_topics_refuses_a_null_config_value_and_keeps_given_ones(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        refused = _create(client, "with-null", [("retention.ms", None)])
        assert refused.error_code == ErrorCode.INVALID_CONFIG
        assert refused.error_message == "Null value not supported for topic config retention.ms"
        assert broker.broker.topic("with-null") is None
        # A null is refused even when a later entry gives the same name a value.
        refused = _create(client, "null-then-value", [("retention.ms", None), ("retention.ms", "1000")])
        assert refused.error_code == ErrorCode.INVALID_CONFIG
        assert broker.broker.topic("null-then-value") is None

        created = _create(client, "with-values", [("retention.ms", "1000"), ("cleanup.policy", "delete")])
    assert created.error_code == ErrorCode.NONE
    info = broker.broker.topic("with-values")
    assert info is not None and info.configs == {"retention.ms": "1000", "cleanup.policy": "delete"}


def test_alter_configs_refuses_a_null_value_and_replaces_the_overrides_otherwise(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        assert _create(client, "altered", [("retention.ms", "1000")]).error_code == ErrorCode.NONE
        code, message = _alter(client, "altered", [("segment.ms", "60000"), ("retention.ms", None)])
        assert (code, message) == (ErrorCode.INVALID_REQUEST, "Null value not supported")
        code, message = _alter(client, "altered", [("segment.ms", None), ("segment.ms", "60000")])
        assert (code, message) == (ErrorCode.INVALID_REQUEST, "Null value not supported")
        info = broker.broker.topic("altered")
        assert info is not None and info.configs == {"retention.ms": "1000"}

        assert _alter(client, "altered", [("segment.ms", "60000")]) == (ErrorCode.NONE, None)
    info = broker.broker.topic("altered")
    assert info is not None and info.configs == {"segment.ms": "60000"}  # AlterConfigs replaces the whole set


def test_produce_to_a_flush_messages_topic_is_flushed_before_the_answer(broker: RunningBroker) -> None:
    with WireClient(broker.bootstrap) as client:
        assert _create(client, "durable", [("flush.messages", "1")]).error_code == ErrorCode.NONE
        batch = build_batch([Record(value=b"one"), Record(offset_delta=1, value=b"two")], base_timestamp=1)
        request = ProduceRequest(
            acks=-1,
            timeout_ms=10_000,
            topic_data=[
                ProduceRequest.TopicProduceData(
                    name="durable", partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
                )
            ],
        )
        answer = client.request(request, 9).responses[0].partition_responses[0]
    assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 0)
    plog = broker.broker.partition("durable", 0)
    assert plog is not None and plog.high_watermark == 2
    assert not plog.needs_flush  # the two messages were fsynced before the acknowledgement
    assert not any(segment.dirty for segment in plog.segments)
