"""Forwarding a client's admin request in an Envelope (KIP-590), against scripted controller answers (no JVM; the
real controller's side is tests/kraft/test_forwarded_principal_kafka.py): the envelope carries the request's bytes
as received, the client's principal as Kafka's DefaultKafkaPrincipalBuilder serializes it and the client's address;
the inner response comes back to the client. Envelope-level errors are mapped as Kafka's broker maps them:
NOT_CONTROLLER is sent again to the active controller, UNSUPPORTED_VERSION ends the client's connection, any other
error or an unreadable answer is UNKNOWN_SERVER_ERROR, as is a principal that cannot be serialized (nothing sent)."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

import pytest
import trio

from kbroker.apis.context import CloseConnection
from kbroker.apis.forwarded import forward_to_controller
from kbroker.kraft.envelope import (
    PrincipalSerializationError,
    address_bytes,
    deserialize_principal,
    serialize_principal,
)
from kbroker.kraft.forwarding import ControllerVersionMismatch, QuorumController
from kbroker.kraft.quorum import QuorumView
from kbroker.metadata.controller import MetadataCache
from protocol._codec import Message
from protocol.errors import ErrorCode, KafkaError
from protocol.framing import decode_request, encode_request, encode_response
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.create_topics_response import CreateTopicsResponse
from protocol.messages.envelope_request import EnvelopeRequest
from protocol.messages.envelope_response import EnvelopeResponse

VOTERS = [("voter-a.example", 9093), ("voter-b.example", 9093)]
CREATE_TOPICS_VERSION = 7
CORRELATION_ID = 41


def test_a_principal_is_serialized_as_kafkas_default_principal_builder_does() -> None:
    # int16 version 0, then DefaultPrincipalData v0 (flexible): compact strings type and name, the boolean
    # token_authenticated, no tagged fields.
    assert serialize_principal("User:alice") == b"\x00\x00" + b"\x05User" + b"\x06alice" + b"\x00" + b"\x00"
    assert deserialize_principal(serialize_principal("User:CN=a,O=b:c")) == ("User:CN=a,O=b:c", False)
    with pytest.raises(PrincipalSerializationError, match="name is too long"):
        serialize_principal("User:" + "x" * 0x8000)
    with pytest.raises(PrincipalSerializationError, match="has no type"):
        serialize_principal("alice")
    assert address_bytes("127.0.0.1") == bytes([127, 0, 0, 1])
    assert address_bytes("0:0:0:0:0:0:0:1") == bytes(15) + b"\x01"


def create_topics_frame() -> bytes:
    """A client's CreateTopics v7 as it arrives (no size prefix)."""
    topic = CreateTopicsRequest.CreatableTopic(name="orders", num_partitions=3, replication_factor=1)
    request = CreateTopicsRequest(topics=[topic], timeout_ms=30000)
    return encode_request(request, CREATE_TOPICS_VERSION, CORRELATION_ID, client_id="app-1")[4:]


def inner_answer(code: ErrorCode, message: str | None) -> bytes:
    """The controller's CreateTopics response, header included, as an EnvelopeResponse carries it."""
    result = CreateTopicsResponse.CreatableTopicResult(
        name="orders", topic_id=uuid.UUID(int=0), error_code=code, error_message=message
    )
    body = CreateTopicsResponse(throttle_time_ms=0, topics=[result])
    return bytes(encode_response(body, 19, CREATE_TOPICS_VERSION, CORRELATION_ID))[4:]


class ScriptedController:
    """Answers each Envelope with the next scripted answer; keeps each request and where it was sent."""

    def __init__(self, answers: list[EnvelopeResponse]) -> None:
        self.answers = answers
        self.sent: list[tuple[tuple[str, int], EnvelopeRequest]] = []
        self.syncs = 0  # waits for the broker's image to catch up with the controller

    def channel(self, address: tuple[str, int]) -> Any:
        controller = self

        class Channel:
            async def request(self, body: Message, version: int | None = None) -> Message:
                assert isinstance(body, EnvelopeRequest)
                controller.sent.append((address, body))
                if not controller.answers:
                    return EnvelopeResponse(error_code=ErrorCode.NOT_CONTROLLER)
                return controller.answers.pop(0)

        return Channel()


class ScriptedQuorum(QuorumView):
    def __init__(self, controller: ScriptedController) -> None:
        super().__init__(list(VOTERS), client_id="test")
        self.scripted = controller

    def channel(self, address: tuple[str, int], purpose: str) -> Any:
        return self.scripted.channel(address)


def quorum_controller(answers: list[EnvelopeResponse], timeout_ms: int = 30000) -> tuple[QuorumController, Any]:
    scripted = ScriptedController(answers)

    async def synced() -> None:
        scripted.syncs += 1

    controller = QuorumController(
        ScriptedQuorum(scripted),
        MetadataCache(),
        sync=synced,
        node_id=1,
        broker_epoch=lambda: 5,
        request_timeout_ms=timeout_ms,
    )
    return controller, scripted


def forward(controller: QuorumController, principal: str = "User:alice", frame: bytes | None = None) -> Message:
    async def main() -> Message:
        return await controller.forward(
            create_topics_frame() if frame is None else frame,
            api_key=19,
            api_version=CREATE_TOPICS_VERSION,
            principal=principal,
            client_host="10.1.2.3",
        )

    return trio.run(main)


def test_the_envelope_carries_the_request_as_received_the_principal_and_the_address() -> None:
    refused = inner_answer(ErrorCode.TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
    controller, scripted = quorum_controller([EnvelopeResponse(response_data=refused)])
    answer = forward(controller)
    assert isinstance(answer, CreateTopicsResponse)
    [result] = answer.topics
    assert (result.name, result.error_code, result.error_message) == (
        "orders",
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        "Authorization failed.",
    )
    [(_, sent)] = scripted.sent
    assert sent.request_data == create_topics_frame()
    inner = decode_request(sent.request_data)
    assert (inner.api_key, inner.api_version, inner.correlation_id, inner.header.client_id) == (
        19,
        CREATE_TOPICS_VERSION,
        CORRELATION_ID,
        "app-1",
    )
    assert sent.request_principal is not None
    assert deserialize_principal(sent.request_principal) == ("User:alice", False)
    assert sent.client_host_address == bytes([10, 1, 2, 3])
    assert scripted.syncs == 0  # refused: nothing to wait for in the image


def test_not_controller_sends_it_again_to_the_next_controller() -> None:
    created = inner_answer(ErrorCode.NONE, None)
    not_active = EnvelopeResponse(error_code=ErrorCode.NOT_CONTROLLER)
    controller, scripted = quorum_controller([not_active, EnvelopeResponse(response_data=created)])
    answer = forward(controller)
    assert isinstance(answer, CreateTopicsResponse) and answer.topics[0].error_code == ErrorCode.NONE
    assert [address for address, _ in scripted.sent] == VOTERS
    assert scripted.syncs == 1  # created: in this broker's image before the client hears of it
    assert scripted.sent[0][1].request_data == scripted.sent[1][1].request_data == create_topics_frame()


def test_envelope_errors_are_mapped_as_kafkas_broker_maps_them() -> None:
    # The controller cannot read the request's version: the client's connection is to end.
    controller, _ = quorum_controller([EnvelopeResponse(error_code=ErrorCode.UNSUPPORTED_VERSION)])
    with pytest.raises(ControllerVersionMismatch):
        forward(controller)
    # Any other envelope error (a broker principal without CLUSTER_ACTION, say) is the client's
    # UNKNOWN_SERVER_ERROR, as is an answer that cannot be read.
    for answer in (
        EnvelopeResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
        EnvelopeResponse(response_data=b"\x00\x00"),
    ):
        controller, _ = quorum_controller([answer])
        with pytest.raises(KafkaError) as failed:
            forward(controller)
        assert (failed.value.code, failed.value.message) == (ErrorCode.UNKNOWN_SERVER_ERROR, None)
    # A principal Kafka's serializer refuses: UNKNOWN_SERVER_ERROR, and nothing is sent.
    controller, scripted = quorum_controller([])
    with pytest.raises(KafkaError) as failed:
        forward(controller, principal="User:" + "x" * 40000)
    assert (failed.value.code, failed.value.message, scripted.sent) == (ErrorCode.UNKNOWN_SERVER_ERROR, None, [])
    # No controller active before the request timeout: REQUEST_TIMED_OUT, without a message (Kafka's
    # TimeoutException has none).
    controller, scripted = quorum_controller([], timeout_ms=300)
    with pytest.raises(KafkaError) as failed:
        forward(controller)
    assert (failed.value.code, failed.value.message) == (ErrorCode.REQUEST_TIMED_OUT, None)
    assert len(scripted.sent) >= 1


class Services:
    def __init__(self, controller: QuorumController) -> None:
        self.topics = type("Topics", (), {"controller": controller})()


def test_a_version_the_controller_cannot_read_closes_the_clients_connection() -> None:
    from kbroker.apis.context import RequestContext

    controller, _ = quorum_controller([EnvelopeResponse(error_code=ErrorCode.UNSUPPORTED_VERSION)])
    ctx = RequestContext(
        services=Services(controller),  # type: ignore[arg-type]
        api_key=19,
        api_version=CREATE_TOPICS_VERSION,
        correlation_id=CORRELATION_ID,
        client_id="app-1",
        client_host="10.1.2.3:50000",
        connection_id=1,
        principal="User:alice",
        request_frame=create_topics_frame(),
    )
    body = decode_request(create_topics_frame()).body
    with pytest.raises(CloseConnection, match="cannot read api key 19 v7"):
        trio.run(partial(forward_to_controller, ctx, body, as_received=True))


def test_a_request_answered_in_part_is_forwarded_re_encoded_with_the_clients_header() -> None:
    from kbroker.apis.context import RequestContext

    created = inner_answer(ErrorCode.NONE, None)
    controller, scripted = quorum_controller([EnvelopeResponse(response_data=created)])
    ctx = RequestContext(
        services=Services(controller),  # type: ignore[arg-type]
        api_key=19,
        api_version=CREATE_TOPICS_VERSION,
        correlation_id=CORRELATION_ID,
        client_id="app-1",
        client_host="[::1]:50000",
        connection_id=1,
        principal="User:bob",
        request_frame=b"the frame as received, not sent: a body is given",
    )
    rest = CreateTopicsRequest(
        topics=[CreateTopicsRequest.CreatableTopic(name="orders", num_partitions=3, replication_factor=1)],
        timeout_ms=30000,
    )
    answer = trio.run(forward_to_controller, ctx, rest)
    assert isinstance(answer, CreateTopicsResponse) and answer.topics[0].error_code == ErrorCode.NONE
    [(_, sent)] = scripted.sent
    assert sent.request_data == create_topics_frame()  # the client's api version, correlation id and client id
    assert sent.request_principal is not None
    assert deserialize_principal(sent.request_principal) == ("User:bob", False)
    assert sent.client_host_address == bytes(15) + b"\x01"


def test_forwardable_apis_are_advertised_in_the_versions_the_controller_serves_too() -> None:
    from kbroker.apis import FORWARDABLE, advertised_under, advertised_versions

    own = {api.api_key: (api.min_version, api.max_version) for api in advertised_versions()}
    controller = {key: versions for key, versions in own.items() if key != 55}  # no DescribeQuorum at all
    controller[19] = (3, 5)  # CreateTopics: kbroker 2-7, the controller 3-5
    controller[20] = (0, own[20][0] - 1)  # DeleteTopics: no version in common
    controller[0] = (5, 6)  # Produce is not forwardable: kbroker's own range stays
    narrowed = {api.api_key: (api.min_version, api.max_version) for api in advertised_under(controller)}
    assert narrowed[19] == (3, 5)
    assert 20 not in narrowed and 55 not in narrowed
    assert narrowed[0] == own[0]
    assert {key: versions for key, versions in narrowed.items() if key not in (19, 20, 55)} == {
        key: versions for key, versions in own.items() if key not in (19, 20, 55)
    }
    assert {19, 20, 33, 44, 55} <= FORWARDABLE and 0 not in FORWARDABLE


def test_a_broker_under_the_quorum_has_no_admin_operations_of_its_own() -> None:
    """The admin handlers' requests are forwarded whole under a quorum; one that still reached ``topics.admin``
    gets Kafka's answer to a controller-only request instead of being applied to a local image."""
    from types import SimpleNamespace

    from kbroker.topics import TopicService

    controller, scripted = quorum_controller([])
    admin = TopicService.admin.fget  # type: ignore[attr-defined]
    with pytest.raises(KafkaError) as refused:
        admin(SimpleNamespace(controller=controller))
    assert refused.value.code == ErrorCode.NOT_CONTROLLER
    assert scripted.sent == []
