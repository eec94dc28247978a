"""The request pipeline of a connection (kbroker/server/connection.py): a handler's KafkaError becomes that
API's error answer, a crash in a handler is answered with UNKNOWN_SERVER_ERROR and logged once, and the
connection serves the next request; a stream that is not a plain socket is served byte for byte."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_differential import build_protocol, compared_pairs, message, struct_strategy

from kbroker.apis import HANDLERS
from kbroker.apis.context import RequestContext
from kbroker.apis.error_responses import error_response
from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig
from kbroker.server import connection as connection_module
from kbroker.server.connection import Connection, ListenerInfo
from kbroker.server.sending import send_spliced_to_stream
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode, KafkaError
from protocol.framing import FrameBuffer, SplicedOutput, decode_response, encode_request
from protocol.messages import APIS
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.describe_groups_request import DescribeGroupsRequest
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.heartbeat_request import HeartbeatRequest
from protocol.messages.metadata_request import MetadataRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.records import Record, build_batch, decode_records, iter_batches

HEARTBEAT, CREATE_TOPICS, DESCRIBE_GROUPS = 12, 19, 15


def _replace_handler(
    monkeypatch: pytest.MonkeyPatch, api_key: int, handle: Callable[[RequestContext, Any], Awaitable[Any]]
) -> None:
    handler = HANDLERS[api_key]
    monkeypatch.setattr(handler, "_handle", handle)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server_log() -> Any:
    records = _Records()
    logger = logging.getLogger("kbroker.server")
    logger.addHandler(records)
    yield records
    logger.removeHandler(records)


def test_a_kafka_error_from_a_handler_is_that_apis_error_answer(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def rebalancing(ctx: RequestContext, request: Any) -> Any:
        raise KafkaError(ErrorCode.REBALANCE_IN_PROGRESS, "try again")

    async def invalid(ctx: RequestContext, request: Any) -> Any:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "no such thing")

    _replace_handler(monkeypatch, HEARTBEAT, rebalancing)
    _replace_handler(monkeypatch, CREATE_TOPICS, invalid)
    heartbeat = HeartbeatRequest(group_id="g", generation_id=1, member_id="m")
    topics = [CreateTopicsRequest.CreatableTopic(name=n, num_partitions=1, replication_factor=1) for n in "ab"]
    with WireClient(broker.bootstrap) as client:
        for version in (0, 4):  # without and with throttle time / flexible encoding
            assert client.request(heartbeat, version).error_code == ErrorCode.REBALANCE_IN_PROGRESS
        answer = client.request(CreateTopicsRequest(topics=topics, timeout_ms=1000), 7)
        assert [(t.name, t.error_code, t.error_message) for t in answer.topics] == [
            ("a", ErrorCode.INVALID_REQUEST, "no such thing"),
            ("b", ErrorCode.INVALID_REQUEST, "no such thing"),
        ]
        assert broker.broker is not None and broker.broker.topic("a") is None


def test_a_crash_in_a_handler_is_answered_and_the_connection_kept(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch, server_log: _Records
) -> None:
    async def crashing(ctx: RequestContext, request: Any) -> Any:
        raise RuntimeError("a bug in a handler")

    _replace_handler(monkeypatch, HEARTBEAT, crashing)
    _replace_handler(monkeypatch, DESCRIBE_GROUPS, crashing)
    with WireClient(broker.bootstrap) as client:
        answer = client.request(HeartbeatRequest(group_id="g", generation_id=1, member_id="m"), 4)
        assert answer.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
        groups = client.request(DescribeGroupsRequest(groups=["x", "y"]), 5).groups
        assert [(g.group_id, g.error_code) for g in groups] == [
            ("x", ErrorCode.UNKNOWN_SERVER_ERROR),
            ("y", ErrorCode.UNKNOWN_SERVER_ERROR),
        ]
        # The same connection goes on serving.
        assert (
            client.request(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3).error_code == 0
        )
        assert client.request(MetadataRequest(topics=[]), 12).brokers[0].port == broker.broker.advertised.port  # type: ignore[union-attr]
    crashes = [r for r in server_log.records if r.exc_info is not None]
    assert [r.exc_info[1].args for r in crashes if r.exc_info and r.exc_info[1]] == [
        ("a bug in a handler",),
        ("a bug in a handler",),
    ]  # one traceback per crash


def test_the_connection_remembers_the_client(broker: RunningBroker) -> None:
    assert broker.broker is not None
    with WireClient(broker.bootstrap, client_id="remembered") as client:
        client.request(ApiVersionsRequest(client_software_name="wire", client_software_version="1.2"), 3)
        connection = next(iter(broker.broker.open_connections.values()))
        assert isinstance(connection, Connection)
        assert (connection.client_id, connection.client_software_name, connection.client_software_version) == (
            "remembered",
            "wire",
            "1.2",
        )
        assert (connection.listener_name, connection.security_protocol, connection.principal) == (
            "PLAINTEXT",
            "PLAINTEXT",
            "User:ANONYMOUS",
        )


def _handled_pairs() -> list[Any]:
    return [
        pytest.param(key, version, id=f"{HANDLERS[key].name}-v{version}")
        for key, version in compared_pairs()
        if key in HANDLERS and HANDLERS[key].supports(version)
    ]


@pytest.mark.parametrize("api_key,version", _handled_pairs())
def test_every_handled_version_has_an_error_answer(api_key: int, version: int) -> None:
    msg = message(api_key, "request")

    @settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(struct_strategy(msg.fields, version, msg.proto_cls), st.sampled_from(list(ErrorCode)[:50]))
    def check(values: dict[str, Any], code: ErrorCode) -> None:
        request = build_protocol(msg.fields, values, msg.proto_cls)
        answer = error_response(api_key, version, request, code, "failed")
        assert answer is not None
        encoded = answer.encode(version)
        decoded, end = APIS[api_key].response_type().decode(encoded, version)
        assert end == len(encoded)
        assert _error_codes(decoded) <= {code, 0}  # the error where the answer has an error field, nothing else

    check()


def _error_codes(value: Any) -> set[int]:
    codes: set[int] = set()
    if isinstance(value, list):
        for item in value:
            codes |= _error_codes(item)
    elif hasattr(value, "FIELDS"):
        for name in value.FIELDS:
            item = getattr(value, name)
            if name == "error_code":
                codes.add(item)
            else:
                codes |= _error_codes(item)
    return codes


# --- a stream that is not a plain socket ---------------------------------------------------------------


class _Client:
    """A client on the other end of a trio stream: one request at a time."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.frames = FrameBuffer()
        self.correlation_id = 0

    async def request(self, body: Any, version: int) -> Any:
        self.correlation_id += 1
        await self.stream.send_all(encode_request(body, version, self.correlation_id))
        while (frame := self.frames.next_frame()) is None:
            data = await self.stream.receive_some(1000)  # small reads: a response arrives in many pieces
            assert data, "the broker closed the stream"
            self.frames.feed(data)
        correlation_id, response = decode_response(frame, body.API_KEY, version)
        assert correlation_id == self.correlation_id
        return response


def test_a_wrapped_stream_is_served_with_exact_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spliced: list[int] = []

    async def spy(stream: trio.abc.SendStream, out: SplicedOutput) -> None:
        spliced.append(len(out.splices))
        await send_spliced_to_stream(stream, out)

    monkeypatch.setattr(connection_module, "send_spliced_to_stream", spy)
    records = [Record(offset_delta=i % 25, key=b"k%d" % i, value=bytes([i]) * (3000 + i)) for i in range(40)]
    batches = [build_batch(records[:25], base_timestamp=1000), build_batch(records[25:], base_timestamp=2000)]
    fetched: list[Record] = []
    offsets: list[int] = []

    async def main() -> None:
        broker = Broker(BrokerConfig({}), tmp_path / "data", Endpoint("localhost", 9092))
        try:
            client_stream, server_stream = trio.testing.memory_stream_pair()
            connection = Connection(broker, server_stream, 1, ListenerInfo("INTERNAL", "PLAINTEXT"))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(connection.run)
                client = _Client(client_stream)
                topic = CreateTopicsRequest.CreatableTopic(name="wrapped", num_partitions=1, replication_factor=1)
                created = await client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7)
                assert created.topics[0].error_code == 0
                for batch in batches:
                    data = [ProduceRequest.PartitionProduceData(index=0, records=batch)]
                    topic_data = [ProduceRequest.TopicProduceData(name="wrapped", partition_data=data)]
                    produced = await client.request(ProduceRequest(acks=-1, timeout_ms=5000, topic_data=topic_data), 9)
                    assert produced.responses[0].partition_responses[0].error_code == 0
                partition = FetchRequest.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
                fetch = FetchRequest(
                    max_wait_ms=0,
                    min_bytes=1,
                    max_bytes=1 << 20,
                    topics=[FetchRequest.FetchTopic(topic="wrapped", partitions=[partition])],
                )
                answer = await client.request(fetch, 12)
                part = answer.responses[0].partitions[0]
                assert (part.error_code, part.high_watermark) == (0, 40)
                for (header, batch), sent in zip(iter_batches(part.records, strict=True), batches, strict=True):
                    # Byte for byte from the magic byte on (the broker sets base offset and leader epoch).
                    assert bytes(batch[16:]) == bytes(sent[16:])
                    fetched.extend(decode_records(batch))
                    offsets.append(header.base_offset)
                # Draining a connection that is not a socket: it stops reading and ends.
                assert broker.open_connections == {1: connection}
                broker.begin_drain()
                with trio.fail_after(5):
                    while broker.open_connections:
                        await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        finally:
            broker.close()

    trio.run(main)
    assert [(r.key, r.value) for r in fetched] == [(r.key, r.value) for r in records]
    assert offsets == [0, 25]
    assert spliced and spliced[0] > 0  # the records came from segment file regions, read for this stream
