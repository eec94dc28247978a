"""The transaction coordinator's traffic with other brokers of a cluster.

Two of Kafka's broker components in miniature:

- **Markers** (Kafka's TransactionMarkerChannelManager): a commit or abort marker owed to a partition that another
  broker leads is sent to that leader in a WriteTxnMarkers request (key 27), the markers queued for one broker going
  in one request. The leader is looked up in the metadata image at each attempt, so a NOT_LEADER_OR_FOLLOWER (or an
  unreachable broker, or a partition without a leader) is retried after a pause at whichever broker leads it then,
  until the marker is written; the coordinator is then told (``written``) and completes the transaction once every
  marker is. As Kafka, a marker answered INVALID_PRODUCER_EPOCH, PRODUCER_FENCED or UNKNOWN_TOPIC_OR_PARTITION is
  dropped (a newer epoch of the producer is there, or the partition is gone), and a partition that the image no
  longer has is dropped too. A marker this broker no longer owes (it stopped coordinating the transactional id,
  or coordinates it in a newer epoch: ``owed``), or answered TRANSACTION_COORDINATOR_FENCED (a newer coordinator
  wrote there), is cancelled without being counted as written, as Kafka's TransactionMarkerRequestCompletionHandler
  cancels them: the coordinator that now owns the transaction writes its markers.
- **Verification** (Kafka's AddPartitionsToTxnManager): a transactional Produce (or TxnOffsetCommit) reaching a
  broker whose transaction coordinator for that id is another asks that coordinator with AddPartitionsToTxn v4+ (the
  batched broker form, as Kafka 4.4's broker sends it): ``verify_only`` whether the partitions are part of the
  producer's ongoing transaction (transaction version 1 clients, which add them themselves), or adding them
  (transaction version 2: Produce v12+, TxnOffsetCommit v5+, whose clients leave that to the broker). The
  verifications waiting for one coordinator go in one request, one in flight per coordinator: those that come
  while it is answered wait and go together in the next. A transactional id queued twice keeps its newer epoch,
  the older request answered INVALID_PRODUCER_EPOCH (NETWORK_EXCEPTION, which the producer retries, for the same
  epoch), as Kafka's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import NamedTuple

import trio

from kbroker.kraft.channel import ChannelError, NodeChannel
from kbroker.kraft.node_security import PLAINTEXT_NODE, NodeSecurity
from kbroker.replication.fetcher import Address
from protocol.errors import ErrorCode
from protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from protocol.messages.add_partitions_to_txn_response import AddPartitionsToTxnResponse
from protocol.messages.write_txn_markers_request import WriteTxnMarkersRequest
from protocol.messages.write_txn_markers_response import WriteTxnMarkersResponse

log = logging.getLogger("kbroker.transactions")

# A marker that could not be written is sent again after this pause (seconds); a request waits at most REQUEST_SECONDS.
RETRY_SECONDS = 0.2
REQUEST_SECONDS = 30.0
# Answers after which a marker is not sent again (Kafka's TransactionMarkerRequestCompletionHandler drops them).
DROPPED = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
NO_LEADER = -1


class RemoteMarker(NamedTuple):
    """One marker owed to a partition another broker leads."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    transaction_version: int
    topic: str
    partition: int


class _Verification:
    """One transactional id's partitions waiting to be verified with its coordinator, and then its answer."""

    __slots__ = ("add", "answer", "done", "partitions", "producer_epoch", "producer_id")

    def __init__(self, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]], add: bool) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.partitions = partitions
        self.add = add
        self.answer: dict[tuple[str, int], ErrorCode] = {}
        self.done = trio.Event()

    def finish(self, code: ErrorCode | None = None, codes: dict[tuple[str, int], ErrorCode] | None = None) -> None:
        """Answer every partition ``code``, or each as ``codes`` says (NONE where it says nothing)."""
        if not self.done.is_set():
            self.answer = {
                key: code if code is not None else (codes or {}).get(key, ErrorCode.NONE) for key in self.partitions
            }
            self.done.set()


class RemoteTransactions:
    """WriteTxnMarkers to partition leaders and AddPartitionsToTxn to transaction coordinators on other brokers."""

    def __init__(
        self,
        node_id: int,
        *,
        leader_of: Callable[[str, int], int | None],
        address_of: Callable[[int], Address | None],
        written: Callable[[RemoteMarker], None],
        owed: Callable[[RemoteMarker], bool] = lambda marker: True,
        security: NodeSecurity = PLAINTEXT_NODE,
    ) -> None:
        """``leader_of``: a partition's leader in the image (None: the image has no such partition; -1: no leader
        now). ``address_of``: a broker's inter-broker endpoint. ``written``: told of each marker written (or
        dropped), in the broker's trio task. ``owed``: whether this broker still coordinates the marker's
        transaction in the marker's coordinator epoch (asked before each attempt). ``security``: the inter-broker
        listener's TLS and SASL."""
        self.node_id = node_id
        self._leader_of = leader_of
        self._address_of = address_of
        self._written = written
        self._owed = owed
        self._security = security
        self._queued: set[RemoteMarker] = set()  # markers to send (again): a set, so a marker is owed once
        self._wake = trio.Event()
        self._channels: dict[tuple[str, int, str], NodeChannel] = {}  # (host, port, purpose) -> channel
        # Verifications waiting for their coordinator, by its node id, each by transactional id; the nodes a
        # request is being sent to (their sender task takes the next batch when it is answered).
        self._verifying: dict[int, dict[str, _Verification]] = {}
        self._senders: set[int] = set()
        self._nursery: trio.Nursery | None = None

    # --- markers ---------------------------------------------------------------------------------------

    def send(self, marker: RemoteMarker) -> None:
        """Owe ``marker`` to its partition's leader: sent by ``run`` until it is written."""
        if marker not in self._queued:
            self._queued.add(marker)
            self._wake.set()

    def pending(self) -> int:
        return len(self._queued)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery  # where the verification senders run
                task_status.started()
                await self._send_markers()
        finally:
            self._nursery = None
            for channel in self._channels.values():
                await channel.aclose()
            self._channels.clear()

    async def _send_markers(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await self._send_round()
            if self._queued:  # some failed: a pause, unless a new marker comes first
                with trio.move_on_after(RETRY_SECONDS):
                    await self._wake.wait()
                self._wake.set()

    async def _send_round(self) -> None:
        by_leader: dict[int, list[RemoteMarker]] = {}
        for marker in list(self._queued):
            if not self._owed(marker):  # another coordinator owns the transaction now: its markers are its own
                log.info(
                    "transactional id %r: %s-%d's marker cancelled (coordinated elsewhere or in a newer epoch now)",
                    marker.transactional_id,
                    marker.topic,
                    marker.partition,
                )
                self._queued.discard(marker)
                continue
            leader = self._leader_of(marker.topic, marker.partition)
            if leader is None:  # the topic is gone: as Kafka, its markers are dropped
                self._done(marker)
            elif leader != NO_LEADER:
                by_leader.setdefault(leader, []).append(marker)
        async with trio.open_nursery() as nursery:
            for leader, markers in by_leader.items():
                nursery.start_soon(self._send_to, leader, markers)

    def _done(self, marker: RemoteMarker) -> None:
        self._queued.discard(marker)
        self._written(marker)

    async def _send_to(self, leader: int, markers: list[RemoteMarker]) -> None:
        address = self._address_of(leader)
        if address is None:
            return  # not registered now: tried again after the pause
        # One marker entry per (producer, epoch, outcome, coordinator epoch), its partitions grouped by topic.
        grouped: dict[tuple[int, int, bool, int, int], dict[str, list[int]]] = {}
        for m in markers:
            key = (m.producer_id, m.producer_epoch, m.commit, m.coordinator_epoch, m.transaction_version)
            grouped.setdefault(key, {}).setdefault(m.topic, []).append(m.partition)
        request = WriteTxnMarkersRequest(
            markers=[
                WriteTxnMarkersRequest.WritableTxnMarker(
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    transaction_result=commit,
                    coordinator_epoch=coordinator_epoch,
                    transaction_version=transaction_version,
                    topics=[
                        WriteTxnMarkersRequest.WritableTxnMarkerTopic(name=name, partition_indexes=indexes)
                        for name, indexes in topics.items()
                    ],
                )
                for (
                    producer_id,
                    producer_epoch,
                    commit,
                    coordinator_epoch,
                    transaction_version,
                ), topics in grouped.items()
            ]
        )
        try:
            with trio.fail_after(REQUEST_SECONDS):
                answer = await self._channel(address, "markers").request(request)
        except (ChannelError, trio.TooSlowError) as exc:
            log.warning("WriteTxnMarkers to broker %d failed (%s); retrying", leader, exc)
            return
        assert isinstance(answer, WriteTxnMarkersResponse)
        codes: dict[tuple[int, str, int], ErrorCode] = {}
        for result in answer.markers:
            for topic in result.topics:
                for part in topic.partitions:
                    codes[(result.producer_id, topic.name, part.partition_index)] = ErrorCode(part.error_code)
        for m in markers:
            code = codes.get((m.producer_id, m.topic, m.partition), ErrorCode.UNKNOWN_SERVER_ERROR)
            if code == ErrorCode.NONE:
                self._done(m)
            elif code == ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                log.info(
                    "transactional id %r: marker for %s-%d fenced by a newer coordinator; cancelled",
                    m.transactional_id,
                    m.topic,
                    m.partition,
                )
                self._queued.discard(m)
            elif code in DROPPED:
                log.warning(
                    "transactional id %r: %s marker for %s-%d not written by broker %d: %s",
                    m.transactional_id,
                    "commit" if m.commit else "abort",
                    m.topic,
                    m.partition,
                    leader,
                    code.name,
                )
                self._done(m)
            else:  # NOT_LEADER_OR_FOLLOWER, a storage error...: again, at the leader the image names then
                log.info(
                    "transactional id %r: marker for %s-%d at broker %d: %s; retrying",
                    m.transactional_id,
                    m.topic,
                    m.partition,
                    leader,
                    code.name,
                )

    def _channel(self, address: Address, purpose: str) -> NodeChannel:
        key = (address.host, address.port, purpose)
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = NodeChannel(
                address.host,
                address.port,
                client_id=f"kbroker-txn-{purpose}-{self.node_id}",
                security=self._security,
            )
        return channel

    # --- verification ----------------------------------------------------------------------------------

    async def verify(
        self,
        coordinator: int,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[tuple[str, int]],
        *,
        add: bool = False,
    ) -> dict[tuple[str, int], ErrorCode]:
        """The coordinator's answer for each partition, before Kafka's mapping for the producer (``add``: the
        partitions join the transaction, Kafka's ADD_PARTITION for transaction version 2; else verify_only):
        NONE if it is in the ongoing transaction; COORDINATOR_NOT_AVAILABLE if the coordinator has no leader or
        endpoint, NETWORK_EXCEPTION if it cannot be reached, as Kafka's AddPartitionsToTxnManager answers."""
        wanted = list(dict.fromkeys(partitions))
        address = None if coordinator == NO_LEADER else self._address_of(coordinator)
        if address is None:
            return dict.fromkeys(wanted, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        verification = _Verification(producer_id, producer_epoch, wanted, add)
        queued = self._verifying.setdefault(coordinator, {})
        earlier = queued.get(transactional_id)
        if earlier is not None:
            if earlier.producer_epoch > producer_epoch:  # this producer is fenced by the one queued
                return dict.fromkeys(wanted, ErrorCode.INVALID_PRODUCER_EPOCH)
            # The queued one is fenced by this one, or (the same epoch) a retry of it: it answers, this one waits.
            same = earlier.producer_epoch == producer_epoch
            earlier.finish(ErrorCode.NETWORK_EXCEPTION if same else ErrorCode.INVALID_PRODUCER_EPOCH)
        queued[transactional_id] = verification
        if coordinator not in self._senders:
            self._senders.add(coordinator)
            if self._nursery is not None:
                self._nursery.start_soon(self._send_verifications, coordinator)
            else:  # not running as a service (a test's instance): this request sends the batch itself
                await self._send_verifications(coordinator)
        await verification.done.wait()
        return verification.answer

    async def _send_verifications(self, coordinator: int) -> None:
        """Send what waits for ``coordinator``, batch after batch, one request in flight, until nothing waits."""
        try:
            while batch := self._verifying.pop(coordinator, None):
                await self._verify_batch(coordinator, batch)
        finally:
            self._senders.discard(coordinator)
            for verification in self._verifying.pop(coordinator, {}).values():  # cancelled: none is left waiting
                verification.finish(ErrorCode.NETWORK_EXCEPTION)

    async def _verify_batch(self, coordinator: int, batch: dict[str, _Verification]) -> None:
        try:
            await self._ask(coordinator, batch)
        finally:  # an answer that named no partition of a transaction, or a cancelled request
            for verification in batch.values():
                verification.finish(ErrorCode.NETWORK_EXCEPTION)

    async def _ask(self, coordinator: int, batch: dict[str, _Verification]) -> None:
        address = self._address_of(coordinator)
        if address is None:
            for verification in batch.values():
                verification.finish(ErrorCode.COORDINATOR_NOT_AVAILABLE)
            return
        transactions = []
        for transactional_id, verification in batch.items():
            by_topic: dict[str, list[int]] = {}
            for topic, index in verification.partitions:
                by_topic.setdefault(topic, []).append(index)
            transactions.append(
                AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction(
                    transactional_id=transactional_id,
                    producer_id=verification.producer_id,
                    producer_epoch=verification.producer_epoch,
                    verify_only=not verification.add,
                    topics=[
                        AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=name, partitions=indexes)
                        for name, indexes in by_topic.items()
                    ],
                )
            )
        request = AddPartitionsToTxnRequest(transactions=transactions)
        try:
            with trio.fail_after(REQUEST_SECONDS):
                answer = await self._channel(address, "verify").request(request)  # v5 from kbroker and Kafka 4.x
        except (ChannelError, trio.TooSlowError) as exc:
            log.info("AddPartitionsToTxn to broker %d failed: %s", coordinator, exc)
            for verification in batch.values():
                verification.finish(ErrorCode.NETWORK_EXCEPTION)
            return
        assert isinstance(answer, AddPartitionsToTxnResponse)
        if answer.error_code != ErrorCode.NONE:
            # As Kafka: a coordinator refusing this broker's request fails the transaction, not the producer.
            code = ErrorCode(answer.error_code)
            if code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED:
                code = ErrorCode.INVALID_TXN_STATE
            for verification in batch.values():
                verification.finish(code)
            return
        for result in answer.results_by_transaction:
            answered = batch.get(result.transactional_id)
            if answered is None:
                continue
            codes = {
                (topic_result.name, part.partition_index): ErrorCode(part.partition_error_code)
                for topic_result in result.topic_results
                for part in topic_result.results_by_partition
            }
            answered.finish(codes=codes)
