"""The ``Controller`` of a broker under Kafka's KRaft quorum: each operation is sent to the active controller.

Kafka's broker forwards an admin request to the active controller and hands its answer back; this does the same
one operation at a time, through the seam every admin handler already uses (kbroker/metadata/controller.py).

A client's admin request goes as Kafka's ForwardingManager sends it (``forward``): its header and body in an
Envelope (kbroker/kraft/envelope.py) with the client's principal and address, so the controller authorizes and
audits the client, not the broker; the inner response is handed back to the client. Envelope-level errors are
Kafka's broker's: NOT_CONTROLLER (the controller that got it is no longer active) sends it again to the active
one, UNSUPPORTED_VERSION (the controller cannot read that version) ends the client's connection so that it asks
ApiVersions again, any other envelope error and an unreadable answer are UNKNOWN_SERVER_ERROR, and a principal
that cannot be serialized is UNKNOWN_SERVER_ERROR before anything is sent. Which requests are forwarded is the
handler table's (kbroker/apis/__init__.py, as Kafka 4.4's KafkaApis).

The operations of the ``Controller`` seam go to the controller directly, as the broker's own principal: the
broker's own AllocateProducerIds and AlterPartition (as Kafka's broker sends them), and the changes kbroker itself
makes (an internal topic a coordinator creates). The controller's error code and message become the KafkaError
the caller answers with, and a change the controller accepted is waited for in the broker's own image (the
metadata follower applies it) before the operation returns, as the ``Controller`` contract says; a forwarded
request that changed something is waited for the same way.

Requests that find no active controller (NOT_CONTROLLER, a lost connection) go to the next voter until
``request_timeout`` has passed; then the handler answers REQUEST_TIMED_OUT. Producer ids come in blocks from
AllocateProducerIds: a block is fetched ahead (``run``) so InitProducerId hands ids out without waiting, as
Kafka's RPCProducerIdManager prefetches its next block.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence

import trio

from kbroker.kraft.channel import ChannelError
from kbroker.kraft.envelope import PrincipalSerializationError, envelope, inner_response
from kbroker.kraft.quorum import QuorumView
from kbroker.metadata.controller import Controller, Listener, MetadataCache
from kbroker.metadata.image import (
    MetadataDelta,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from protocol._codec import Buffer, Message
from protocol.errors import ErrorCode, KafkaError
from protocol.exceptions import DecodeError
from protocol.messages.allocate_producer_ids_request import AllocateProducerIdsRequest
from protocol.messages.allocate_producer_ids_response import AllocateProducerIdsResponse
from protocol.messages.alter_partition_request import AlterPartitionRequest
from protocol.messages.alter_partition_response import AlterPartitionResponse
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.create_topics_response import CreateTopicsResponse
from protocol.messages.envelope_response import EnvelopeResponse

log = logging.getLogger("kbroker.kraft")

RETRY_SECONDS = 0.2
SET, DELETE = 0, 1  # IncrementalAlterConfigs' config operations
_NO_CONTROLLER = {ErrorCode.NOT_CONTROLLER}


class ControllerVersionMismatch(Exception):
    """The controller answered an Envelope UNSUPPORTED_VERSION: it cannot read the client's request at its version
    (Kafka's broker then closes the client's connection, so that the client asks ApiVersions again)."""


class QuorumController(Controller):
    """Admin operations sent to Kafka's active controller; the broker's image follows from the metadata log."""

    metadata_log = None  # the broker keeps no controller log of its own (the follower's is the quorum's)
    forwards_requests = True

    def __init__(
        self,
        quorum: QuorumView,
        cache: MetadataCache,
        *,
        sync: Callable[[], Awaitable[None]],
        node_id: int,
        broker_epoch: Callable[[], int],
        request_timeout_ms: int = 30000,
    ) -> None:
        self.quorum = quorum
        self.cache = cache
        self._sync = sync  # waits until what the quorum committed so far is in the image
        self.node_id = node_id
        self._broker_epoch = broker_epoch
        self.request_timeout = request_timeout_ms / 1000
        self._published = trio.Event()
        cache.subscribe(self._on_publish)
        self._producer_ids: list[range] = []  # blocks fetched ahead, handed out in order
        self._want_producer_ids = trio.Event()

    @property
    def image(self) -> MetadataImage:
        return self.cache.image

    def _on_publish(self, image: MetadataImage, delta: MetadataDelta) -> None:
        self._published.set()
        self._published = trio.Event()

    async def _until(self, applied: Callable[[MetadataImage], bool]) -> None:
        """Wait until the broker's image shows a change the controller answered as made (the follower is at most a
        fetch behind the controller's answer; the request timeout bounds a change that never shows)."""
        with trio.move_on_after(self.request_timeout):
            while not applied(self.cache.image):
                await self._published.wait()
            return
        raise KafkaError(ErrorCode.REQUEST_TIMED_OUT, "the change was made but has not reached this broker's metadata")

    def controller_api_versions(self) -> Mapping[int, tuple[int, int]] | None:
        return self.quorum.leader_api_versions()

    async def forward(
        self,
        request_frame: Buffer,
        *,
        api_key: int,
        api_version: int,
        principal: str,
        client_host: str,
        changes: bool = True,
    ) -> Message:
        """The active controller's answer to a client's request (``request_frame``: its header and body) sent in an
        Envelope as ``principal`` from ``client_host``, as Kafka's ForwardingManager sends it. ``changes``: the
        request may change metadata (not a read, not validate-only)."""
        try:
            wrapped = envelope(request_frame, principal, client_host)
        except (PrincipalSerializationError, ValueError) as exc:  # ValueError: no IP address to send
            log.warning("cannot forward api key %d for %s from %s: %s", api_key, principal[:200], client_host, exc)
            raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR) from None
        answer = await self._send(wrapped, channel="envelope", timed_out=None)
        assert isinstance(answer, EnvelopeResponse)
        if answer.error_code == ErrorCode.UNSUPPORTED_VERSION:
            raise ControllerVersionMismatch(f"the active controller cannot read api key {api_key} v{api_version}")
        if answer.error_code != ErrorCode.NONE or answer.response_data is None:
            # The controller refused the envelope itself (Kafka's broker answers the client UNKNOWN_SERVER_ERROR
            # rather than an error the request does not expect): say why here.
            log.warning("the controller refused the envelope of api key %d: error %d", api_key, answer.error_code)
            raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR)
        try:
            _correlation_id, response = inner_response(answer.response_data, api_key, api_version)
        except DecodeError as exc:
            log.error("unreadable response to a forwarded api key %d v%d: %s", api_key, api_version, exc)
            raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR) from None
        if changes and _changed_something(response):
            # What the controller committed is in this broker's image before the client hears of it (a client that
            # created a topic finds it in this broker's Metadata next). The answer is the controller's either way.
            with trio.move_on_after(self.request_timeout):
                await self._sync()
        return response

    async def _send(
        self,
        request: Message,
        *,
        channel: str = "forwarding",
        timed_out: str | None = "no active KRaft controller answered in time",
    ) -> Message:
        """``request`` to the active controller, trying the voters in turn while none answers as active."""
        with trio.move_on_after(self.request_timeout):
            while True:
                address = self.quorum.address()
                try:
                    answer = await self.quorum.channel(address, channel).request(request)
                except ChannelError as exc:
                    log.info("%s to the controller quorum failed (retrying): %s", type(request).__name__, exc)
                    self.quorum.forget_leader()
                    await trio.sleep(RETRY_SECONDS)
                    continue
                if _top_level_error(answer) in _NO_CONTROLLER:
                    self.quorum.forget_leader()
                    await trio.sleep(RETRY_SECONDS)
                    continue
                return answer
        raise KafkaError(ErrorCode.REQUEST_TIMED_OUT, timed_out)

    # --- topics -------------------------------------------------------------------------------------------

    async def create_topic(
        self,
        name: str,
        *,
        partitions: int,
        replication_factor: int,
        configs: Mapping[str, str],
        assignments: Sequence[Sequence[int]] | None = None,
        validate_only: bool = False,
    ) -> TopicImage:
        topic = CreateTopicsRequest.CreatableTopic(
            name=name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            assignments=[
                CreateTopicsRequest.CreatableReplicaAssignment(partition_index=index, broker_ids=list(brokers))
                for index, brokers in enumerate(assignments or ())
            ],
            configs=[CreateTopicsRequest.CreatableTopicConfig(name=key, value=value) for key, value in configs.items()],
        )
        request = CreateTopicsRequest(
            topics=[topic], timeout_ms=int(self.request_timeout * 1000), validate_only=validate_only
        )
        answer = await self._send(request)
        assert isinstance(answer, CreateTopicsResponse)
        [result] = answer.topics
        _raise_for(result.error_code, result.error_message)
        if validate_only:
            return TopicImage(name, result.topic_id)
        await self._until(lambda image: result.topic_id in image.topics.by_id)
        return self.image.topics.by_id[result.topic_id]

    # --- producer ids -------------------------------------------------------------------------------------

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> range:
        answer = await self._send(AllocateProducerIdsRequest(broker_id=broker_id, broker_epoch=broker_epoch))
        assert isinstance(answer, AllocateProducerIdsResponse)
        _raise_for(answer.error_code, None)
        return range(answer.producer_id_start, answer.producer_id_start + answer.producer_id_len)

    def allocate_producer_ids_now(self, broker_id: int, broker_epoch: int) -> range:
        """The block fetched ahead; COORDINATOR_LOAD_IN_PROGRESS (clients retry) while the next is on its way."""
        self._want_producer_ids.set()
        if not self._producer_ids:
            raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "Producer ID block is not available yet")
        return self._producer_ids.pop(0)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep one producer id block fetched ahead of the one in use."""
        task_status.started()
        while True:
            if self._producer_ids:
                await self._want_producer_ids.wait()
                self._want_producer_ids = trio.Event()
                continue
            try:
                block = await self.allocate_producer_ids(self.node_id, self._broker_epoch())
            except KafkaError as exc:
                log.info("AllocateProducerIds answered %s (retrying)", exc)
                await trio.sleep(1)
                continue
            self._producer_ids.append(block)

    # --- the broker's own requests ------------------------------------------------------------------------

    def register_broker(
        self, broker_id: int, listeners: Sequence[Listener], features: Mapping[str, tuple[int, int]]
    ) -> int:
        """The lifecycle manager registers with the quorum (kbroker/kraft/lifecycle.py): the epoch known so far."""
        return self._broker_epoch()

    async def alter_partition(
        self,
        broker_id: int,
        broker_epoch: int,
        topic_id: uuid.UUID,
        index: int,
        *,
        leader_epoch: int,
        partition_epoch: int,
        isr: Sequence[tuple[int, int]],
    ) -> PartitionRegistration:
        partition = AlterPartitionRequest.PartitionData(
            partition_index=index,
            leader_epoch=leader_epoch,
            new_isr_with_epochs=[
                AlterPartitionRequest.BrokerState(broker_id=member, broker_epoch=epoch) for member, epoch in isr
            ],
            partition_epoch=partition_epoch,
        )
        request = AlterPartitionRequest(
            broker_id=broker_id,
            broker_epoch=broker_epoch,
            topics=[AlterPartitionRequest.TopicData(topic_id=topic_id, partitions=[partition])],
        )
        answer = await self._send(request)
        assert isinstance(answer, AlterPartitionResponse)
        _raise_for(answer.error_code, None)
        [data] = answer.topics[0].partitions
        _raise_for(data.error_code, None)

        def reached(image: MetadataImage) -> bool:
            topic = image.topics.by_id.get(topic_id)
            current = None if topic is None else topic.partitions.get(index)
            return current is None or current.partition_epoch >= data.partition_epoch

        await self._until(reached)
        topic = self.image.topics.by_id.get(topic_id)
        current = None if topic is None else topic.partitions.get(index)
        if current is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID, f"No topic with id {topic_id}.")
        return current


def _top_level_error(answer: Message) -> int:
    """The answer's error code for the request as a whole (per-item codes for the answers that have none)."""
    code = getattr(answer, "error_code", 0)
    if code:
        return int(code)
    for items in ("topics", "results", "responses"):
        for item in getattr(answer, items, None) or ():
            item_code = getattr(item, "error_code", 0)
            if item_code:
                return int(item_code)
    return 0


def _changed_something(answer: Message) -> bool:
    """Whether an admin answer accepted anything: no error for the request as a whole, and some item without one."""
    if getattr(answer, "error_code", 0):
        return False
    for items in ("topics", "results", "responses", "entries", "filter_results", "replica_election_results"):
        listed = getattr(answer, items, None)
        if listed is not None:
            return any(not getattr(item, "error_code", 0) for item in listed)
    return True


def _raise_for(code: int, message: str | None) -> None:
    if code != ErrorCode.NONE:
        raise KafkaError(ErrorCode(code), message or None)
