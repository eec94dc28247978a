"""The follower's side of replication: Kafka's ReplicaFetcherManager and ReplicaFetcherThread, as trio tasks.

One ``ReplicaFetcher`` per source broker fetches every partition this broker follows from it, over one
connection (kbroker/kraft/channel.py's ``NodeChannel``) to the leader's endpoint on the inter-broker listener as
the metadata image registered it. The ``ReplicaFetcherManager`` moves partitions between fetchers as the
ReplicaManager applies registrations (``follow`` when a partition becomes a follower of a leader, ``unfollow``
when it leads, loses its leader or stops); a fetcher left with no partitions ends. The fetchers run in the
ReplicaManager's ``run`` nursery (``run`` here): no task outlives it.

Each round sends one Fetch as Kafka's follower does: the broker's id (replica_id, or from v15 ReplicaState with
its broker epoch), replica.fetch.wait.max.ms / replica.fetch.min.bytes / replica.fetch.response.max.bytes, and
per partition the fetch offset (the follower's log end), the registration's leader epoch, the log start offset,
replica.fetch.max.bytes and (v12+) the epoch of the last batch it has. Records are appended with their offsets
and epochs (``Partition.append_as_follower``), the high watermark is the leader's bounded by the log end, and
the log start moves up to the leader's (bounded by the high watermark), as Kafka's processPartitionData.

Truncation (KIP-101, KIP-279, KIP-320): a partition entering a new leader epoch is fetched with its last epoch,
and a leader whose log differs answers diverging_epoch; the follower truncates to where the two agree
(``Partition.truncation_offset``, Kafka's getOffsetTruncationState) before it fetches again. A leader that does
not serve Fetch v12 is asked OffsetForLeaderEpoch first instead. OFFSET_OUT_OF_RANGE resets the position as
Kafka's fetchOffsetAndTruncate: to the leader's log end (ListOffsets latest, as a replica) when that is below
this log's end, else to the leader's log start when this log ends before it (the log is emptied and starts
there; at the base offset of the leader's first batch if its log start is inside one). FENCED_LEADER_EPOCH parks
the partition until a newer registration; UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, unknown topics and a
failed connection back off replica.fetch.backoff.ms. A fault in one partition's answer parks that partition, a
fault elsewhere retries the round after the back-off: neither ends the broker.

Fetches run in a KIP-227 incremental fetch session with the leader (fetch_session.py, Kafka's
FetchSessionHandler): a full request opens it, later ones name only the partitions added or whose fetch state
changed, and forget those no longer ready (backing off, parked, truncating: sent again in full once ready); the
leader answers only partitions with news, and one left out keeps its position. FETCH_SESSION_ID_NOT_FOUND or
INVALID_FETCH_SESSION_EPOCH on an incremental request (a leader restarted, or its cache evicted the session)
is followed at once by a full one; another error, a failed connection or a leader keeping no session (id 0)
make the next request full too. Requests go over the inter-broker listener's TLS and SASL as this broker's
config sets them (kbroker/kraft/node_security.py), whatever protocol the leader registered. The connection and
the messages load with the first fetcher: a single node, which follows nothing, starts without them.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

import trio

from kbroker import __version__
from kbroker.durable.files import StorageError
from kbroker.replication.fetch_session import FollowerSession, PartitionFetch
from kbroker.replication.partition import Partition
from kbroker.replication.registration import NO_LEADER
from protocol.errors import ErrorCode, KafkaError, error_name

if TYPE_CHECKING:
    from kbroker.kraft.channel import NodeChannel
    from kbroker.kraft.node_security import NodeSecurity
    from protocol.messages.fetch_response import FetchResponse

log = logging.getLogger("kbroker.replication")

TopicPartition = tuple[str, int]
FETCH_KEY = 1
TRUNCATION_ON_FETCH_VERSION = 12  # Fetch v12: last_fetched_epoch, and diverging_epoch in answers
TOPIC_IDS_VERSION = 13
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
API_VERSIONS_VERSION = 3
PLAINTEXT = 0


class Address(NamedTuple):
    """Where a source broker is reached: its endpoint on the inter-broker listener."""

    host: str
    port: int
    security_protocol: int = PLAINTEXT  # Kafka's SecurityProtocol id, as the broker registered it


class FetcherSettings(NamedTuple):
    """Kafka's replica.fetch.* settings (their defaults)."""

    wait_max_ms: int = 500  # replica.fetch.wait.max.ms
    min_bytes: int = 1  # replica.fetch.min.bytes
    max_bytes: int = 1_048_576  # replica.fetch.max.bytes, per partition
    response_max_bytes: int = 10_485_760  # replica.fetch.response.max.bytes
    backoff_ms: int = 1000  # replica.fetch.backoff.ms


DEFAULT_SETTINGS = FetcherSettings()


class FetchState:
    """One partition in a fetcher (Kafka's PartitionFetchState)."""

    __slots__ = ("partition", "leader_epoch", "fetch_offset", "truncating", "delayed_until", "parked", "lag")

    def __init__(self, partition: Partition, leader_epoch: int, fetch_offset: int) -> None:
        self.partition = partition
        self.leader_epoch = leader_epoch  # the registration's: sent as current_leader_epoch
        self.fetch_offset = fetch_offset
        self.truncating = True  # entering this leader epoch: to be checked against the leader's log first
        self.delayed_until = -math.inf  # trio time: backing off until then
        self.parked = False  # fenced or failed: waits for a newer registration
        self.lag: int | None = None  # the leader's high watermark less this log's end, as last fetched

    def __repr__(self) -> str:
        return f"FetchState({self.partition!r}, epoch {self.leader_epoch}, offset {self.fetch_offset})"

    def ready(self, now: float) -> bool:
        return not self.parked and now >= self.delayed_until


class ReplicaFetcher:
    """The partitions followed from one source broker, fetched in one loop over one connection."""

    def __init__(self, manager: ReplicaFetcherManager, source_id: int, fetcher_id: int) -> None:
        self.manager = manager
        self.source_id = source_id
        self.client_id = f"ReplicaFetcherThread-{fetcher_id}-{source_id}"  # as Kafka names its threads
        self.states: dict[TopicPartition, FetchState] = {}
        self.cancel_scope = trio.CancelScope()
        self.ended = trio.Event()  # set when its loop has ended and its connection is closed
        self._changed = trio.Event()  # a partition was added
        self._channel: NodeChannel | None = None
        self._unreachable_logged = False
        self._refusal_logged = False  # the last failure was a refused login, already warned of
        self.session = FollowerSession()  # KIP-227, with the source broker

    def __repr__(self) -> str:
        return f"ReplicaFetcher({self.client_id}, {sorted(self.states)})"

    def changed(self) -> None:
        self._changed.set()

    # --- the loop ------------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            with self.cancel_scope:
                while self.states:
                    await self._round()
        finally:
            channel, self._channel = self._channel, None
            if channel is not None:
                with trio.CancelScope(shield=True):
                    await channel.aclose()
            self.manager.fetcher_ended(self)
            self.ended.set()

    async def _round(self) -> None:
        from kbroker.kraft.channel import ChannelAuthenticationError, ChannelError

        settings = self.manager.settings
        address = self.manager.address_of(self.source_id)
        if address is None:
            if not self._unreachable_logged:
                log.warning("%s: broker %d is not registered on the inter-broker listener; retried every %d ms",
                            self.client_id, self.source_id, settings.backoff_ms)  # fmt: skip
                self._unreachable_logged = True
            await self._pause(settings.backoff_ms / 1000)
            return
        self._unreachable_logged = False
        channel = await self._channel_to(address)
        try:
            if any(s.truncating and s.ready(trio.current_time()) for s in self.states.values()):
                await self._truncate(channel)
            ready = self._ready()
            if not ready:
                await self._wait_for_ready()
                return
            await self._fetch(channel, ready)
            self._refusal_logged = False
        except ChannelError as exc:
            # A refused TLS or SASL login needs the settings fixed: said as a warning, once until one succeeds.
            refused = isinstance(exc, ChannelAuthenticationError)
            level = logging.WARNING if refused and not self._refusal_logged else logging.INFO
            self._refusal_logged = refused
            self.session.handle_error()
            log.log(level, "%s: fetching from broker %d failed, retried in %d ms: %s", self.client_id,
                    self.source_id, settings.backoff_ms, exc)  # fmt: skip
            self._delay(self.states.values())
        except Exception:  # a fault here must not end the broker: logged, and the round tried again later
            log.exception("%s: fetching from broker %d failed, retried in %d ms", self.client_id, self.source_id,
                          settings.backoff_ms)  # fmt: skip
            await channel.aclose()  # its requests may have been cut short: the next round connects afresh
            self.session.handle_error()
            self._delay(self.states.values())

    async def _channel_to(self, address: Address) -> NodeChannel:
        from kbroker.kraft.channel import NodeChannel
        from kbroker.kraft.node_security import PLAINTEXT_NODE

        channel = self._channel
        if channel is None or (channel.host, channel.port) != (address.host, address.port):
            if channel is not None:  # the broker registered again elsewhere
                await channel.aclose()
                self.session.handle_error()
            channel = self._channel = NodeChannel(
                address.host, address.port, client_id=self.client_id, security=self.manager.security or PLAINTEXT_NODE
            )
        return channel

    def _ready(self) -> list[FetchState]:
        now = trio.current_time()
        return [state for state in self.states.values() if state.ready(now) and not state.truncating]

    async def _wait_for_ready(self) -> None:
        """Until a partition is added or the first back-off ends (none: until a partition is added)."""
        delays = [s.delayed_until for s in self.states.values() if not s.parked]
        self._changed = trio.Event()
        with trio.move_on_at(min(delays, default=math.inf)):
            await self._changed.wait()

    async def _pause(self, seconds: float) -> None:
        self._changed = trio.Event()
        with trio.move_on_after(seconds):
            await self._changed.wait()

    def _delay(self, states: Iterable[FetchState]) -> None:
        until = trio.current_time() + self.manager.settings.backoff_ms / 1000
        for state in states:
            state.delayed_until = until

    def _current(self, state: FetchState) -> bool:
        """Whether ``state`` is still this partition's (not moved, stopped or re-registered meanwhile)."""
        partition = state.partition
        return self.states.get((partition.topic, partition.index)) is state

    # --- fetching ------------------------------------------------------------------------------------

    async def _fetch(self, channel: NodeChannel, ready: list[FetchState]) -> None:
        from kbroker.kraft.channel import ChannelError
        from protocol.messages.fetch_request import FetchRequest
        from protocol.messages.fetch_response import FetchResponse

        manager = self.manager
        settings = manager.settings
        local = manager.local_broker_id
        wanted: dict[TopicPartition, PartitionFetch] = {}
        sent: dict[TopicPartition, tuple[FetchState, int]] = {}
        names: dict[uuid.UUID, str] = {}
        for state in ready:
            partition = state.partition
            topic_id = manager.topic_id_of(partition.topic)
            if topic_id is None:  # not in the image (being deleted): the registration that removes it comes
                self._delay([state])
                continue
            plog = partition.log
            key = (partition.topic, partition.index)
            wanted[key] = PartitionFetch(
                topic_id=topic_id,
                fetch_offset=state.fetch_offset,
                log_start_offset=plog.log_start_offset,
                max_bytes=settings.max_bytes,
                current_leader_epoch=state.leader_epoch,
                last_fetched_epoch=plog.leader_epochs.latest_epoch,
            )
            sent[key] = (state, state.fetch_offset)
            names[topic_id] = partition.topic
        if not wanted:
            await self._wait_for_ready()
            return
        version = self._fetch_version(channel)
        known = version if version is not None else channel.version_for(FETCH_KEY) if channel.versions else None
        # Partitions not ready (backing off, parked, truncating) are forgotten, and sent again once ready.
        plan = self.session.build(wanted, forget_replaced=known is not None and known >= TOPIC_IDS_VERSION)
        topics: dict[str, FetchRequest.FetchTopic] = {}
        for (name, index), fetch in plan.to_send.items():
            topic = topics.get(name)
            if topic is None:
                topic = topics[name] = FetchRequest.FetchTopic(topic=name, topic_id=fetch.topic_id, partitions=[])
            topic.partitions.append(
                FetchRequest.FetchPartition(
                    partition=index,
                    current_leader_epoch=fetch.current_leader_epoch,
                    fetch_offset=fetch.fetch_offset,
                    last_fetched_epoch=fetch.last_fetched_epoch,
                    log_start_offset=fetch.log_start_offset,
                    partition_max_bytes=fetch.max_bytes,
                )
            )
        forgotten: dict[tuple[str, uuid.UUID], FetchRequest.ForgottenTopic] = {}
        for gone in plan.to_forget:
            forget = forgotten.get((gone.topic, gone.topic_id))
            if forget is None:
                forget = forgotten[(gone.topic, gone.topic_id)] = FetchRequest.ForgottenTopic(
                    topic=gone.topic, topic_id=gone.topic_id, partitions=[]
                )
            forget.partitions.append(gone.partition)
        request = FetchRequest(
            replica_id=local,
            replica_state=FetchRequest.ReplicaState(replica_id=local, replica_epoch=manager.broker_epoch()),
            max_wait_ms=settings.wait_max_ms,
            min_bytes=settings.min_bytes,
            max_bytes=settings.response_max_bytes,
            isolation_level=0,
            session_id=plan.session_id,
            session_epoch=plan.epoch,
            topics=list(topics.values()),
            forgotten_topics_data=list(forgotten.values()),
        )
        response = await channel.request(request, version)
        assert isinstance(response, FetchResponse)
        used = version if version is not None else channel.version_for(FETCH_KEY)
        by_id = used >= TOPIC_IDS_VERSION
        answered = [
            (names.get(topic_answer.topic_id, topic_answer.topic) if by_id else topic_answer.topic, data)
            for topic_answer in response.responses
            for data in topic_answer.partitions
        ]
        answered_keys = {(name, data.partition_index) for name, data in answered}
        if not self.session.handle_response(
            response.error_code, response.session_id, answered_keys, response.throttle_time_ms
        ):
            if response.error_code == ErrorCode.NONE:  # partitions it was not asked for, or throttled (KIP-219)
                log.info("%s: broker %d's answer to fetch session %d was not taken: fetched in full again",
                         self.client_id, self.source_id, plan.session_id)  # fmt: skip
                if plan.full:  # not at once: the same answer again would make a busy loop
                    self._delay(state for state, _ in sent.values())
                return
            if not plan.full and response.error_code in (
                ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
                ErrorCode.INVALID_FETCH_SESSION_EPOCH,
            ):  # the leader restarted or lost the session: a full fetch at once opens a new one
                log.info("%s: broker %d answered fetch session %d with %s: fetched in full again", self.client_id,
                         self.source_id, plan.session_id, error_name(response.error_code))  # fmt: skip
                return
            log.info("%s: broker %d answered the fetch with %s", self.client_id, self.source_id,
                     error_name(response.error_code))  # fmt: skip
            self._delay(state for state, _ in sent.values())
            return
        if plan.full and self.session.session_id:
            log.info("%s: fetch session %d opened with broker %d (%d partitions)", self.client_id,
                     self.session.session_id, self.source_id, len(wanted))  # fmt: skip
        # An incremental answer names only the partitions with news: the others keep their positions.
        failed: list[FetchState] = []
        for name, data in answered:
            entry = sent.get((name, data.partition_index))
            if entry is None:
                continue
            state, fetch_offset = entry
            # As Kafka: only for the partition as it was asked for (not moved, truncated or re-added since).
            if not self._current(state) or state.fetch_offset != fetch_offset or state.parked:
                continue
            try:
                if await self._take(state, data):
                    continue
            except ChannelError:
                raise
            except Exception:  # as Kafka's fetcher: this partition stops (until its next registration), not all
                log.exception("%s: %s-%d failed at offset %d", self.client_id, state.partition.topic,
                              state.partition.index, fetch_offset)  # fmt: skip
                state.parked = True
                continue
            failed.append(state)
        self._delay(failed)

    def _fetch_version(self, channel: NodeChannel) -> int | None:
        cap = self.manager.max_fetch_version
        if cap is None:
            return None  # the newest both sides know, chosen as the request goes
        if not channel.versions:
            return cap  # the channel connects with this request: the cap is at most what Kafka 4 brokers serve
        return min(cap, channel.version_for(FETCH_KEY))

    async def _take(self, state: FetchState, data: FetchResponse.PartitionData) -> bool:
        """Apply one partition's answer; False to back off."""
        code = data.error_code
        partition = state.partition
        if code == ErrorCode.NONE:
            diverging = data.diverging_epoch
            if diverging is not None and (diverging.epoch >= 0 or diverging.end_offset >= 0):
                return self._truncate_to(state, partition.truncation_offset(diverging.epoch, diverging.end_offset))
            return self._append(state, data)
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            return await self._reset_out_of_range(state)
        if code == ErrorCode.FENCED_LEADER_EPOCH:
            log.info("%s: %s-%d has an older leader epoch (%d) than broker %d; waits for its next registration",
                     self.client_id, partition.topic, partition.index, state.leader_epoch, self.source_id)  # fmt: skip
            state.parked = True
            return True
        # UNKNOWN_LEADER_EPOCH (the leader has not seen this epoch yet), NOT_LEADER_OR_FOLLOWER, unknown topics...
        log.debug("%s: %s-%d: %s, retried after the back-off", self.client_id, partition.topic, partition.index,
                  error_name(code))  # fmt: skip
        return False

    def _append(self, state: FetchState, data: FetchResponse.PartitionData) -> bool:
        partition = state.partition
        plog = partition.log
        if state.fetch_offset != plog.log_end_offset:  # as Kafka's "Offset mismatch": refetched from the log end
            state.fetch_offset = plog.log_end_offset
            return True
        records = data.records
        if records and isinstance(records, (bytes, bytearray, memoryview)):  # decoded answers are never regions
            result = partition.append_as_follower(records, self.manager.clock())
            first_offset = int.from_bytes(records[:8], "big", signed=True) if len(records) >= 8 else -1
            if (
                result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
                and plog.log_end_offset == plog.log_start_offset
                and 0 <= first_offset < plog.log_end_offset
            ):
                # As Kafka's follower: an empty log starting inside the leader's first batch (its log start moved
                # there by DeleteRecords) starts over at that batch's base offset, and takes it whole.
                plog.truncate_fully_and_start_at(first_offset)
                result = partition.append_as_follower(records, self.manager.clock())
            if result.error_code != ErrorCode.NONE:
                log.error("%s: appending to %s-%d at offset %d failed: %s %s", self.client_id, partition.topic,
                          partition.index, state.fetch_offset, error_name(result.error_code),
                          result.error_message or "")  # fmt: skip
                if result.error_code == ErrorCode.KAFKA_STORAGE_ERROR:
                    state.parked = True
                    return True
                return False
        log_end = plog.log_end_offset
        partition.update_follower_high_watermark(data.high_watermark)
        leader_start = data.log_start_offset
        if leader_start > plog.log_start_offset:
            # As Kafka's maybeIncrementLogStartOffset: never past this replica's high watermark.
            target = min(leader_start, plog.high_watermark)
            if target > plog.log_start_offset:
                try:
                    plog.delete_records(target)
                except KafkaError as exc:
                    log.warning("%s: %s-%d: log start offset not moved to %d: %s", self.client_id, partition.topic,
                                partition.index, target, exc.message)  # fmt: skip
        state.fetch_offset = log_end
        state.lag = max(0, data.high_watermark - log_end)
        return True

    # --- truncation ----------------------------------------------------------------------------------

    def _truncate_to(self, state: FetchState, offset: int, *, done: bool = True) -> bool:
        """Cut this log at ``offset`` and fetch from its new end (Kafka's truncate); a failure parks it."""
        partition = state.partition
        plog = partition.log
        try:
            if offset < plog.log_end_offset:
                log.info("%s: truncating %s-%d to offset %d (log end %d, high watermark %d)", self.client_id,
                         partition.topic, partition.index, offset, plog.log_end_offset,
                         plog.high_watermark)  # fmt: skip
            partition.truncate_to(offset)  # at the log end too: an epoch begun there unused goes
        except (KafkaError, StorageError) as exc:
            log.error("%s: truncating %s-%d to offset %d failed: %s", self.client_id, partition.topic,
                      partition.index, offset, exc)  # fmt: skip
            state.parked = True
            return True
        state.fetch_offset = plog.log_end_offset
        state.truncating = not done
        return True

    async def _truncate(self, channel: NodeChannel) -> None:
        """Partitions entering a leader epoch: fetched with their last epoch where the leader serves Fetch v12
        (its diverging_epoch answer says where to truncate), else truncated through OffsetForLeaderEpoch first."""
        from protocol.messages.api_versions_request import ApiVersionsRequest
        from protocol.messages.offset_for_leader_epoch_request import OffsetForLeaderEpochRequest
        from protocol.messages.offset_for_leader_epoch_response import OffsetForLeaderEpochResponse

        if not channel.versions:  # not connected yet: ApiVersions says which way
            hello = ApiVersionsRequest(client_software_name="kbroker", client_software_version=__version__)
            await channel.request(hello, API_VERSIONS_VERSION)
        capped = self._fetch_version(channel)
        version = channel.version_for(FETCH_KEY) if capped is None else capped
        if version >= TRUNCATION_ON_FETCH_VERSION:
            for state in self.states.values():
                state.truncating = False
            return
        now = trio.current_time()
        asking = [s for s in self.states.values() if s.truncating and s.ready(now)]
        topics: dict[str, OffsetForLeaderEpochRequest.OffsetForLeaderTopic] = {}
        for state in asking:
            partition = state.partition
            topic = topics.get(partition.topic)
            if topic is None:
                topic = topics[partition.topic] = OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
                    topic=partition.topic, partitions=[]
                )
            topic.partitions.append(
                OffsetForLeaderEpochRequest.OffsetForLeaderPartition(
                    partition=partition.index,
                    current_leader_epoch=state.leader_epoch,
                    leader_epoch=partition.log.leader_epochs.latest_epoch,
                )
            )
        request = OffsetForLeaderEpochRequest(replica_id=self.manager.local_broker_id, topics=list(topics.values()))
        response = await channel.request(request)
        assert isinstance(response, OffsetForLeaderEpochResponse)
        by_key = {(s.partition.topic, s.partition.index): s for s in asking}
        failed = []
        for topic_answer in response.topics:
            for answer in topic_answer.partitions:
                answered = by_key.pop((topic_answer.topic, answer.partition), None)
                if answered is None or not self._current(answered):
                    continue
                if answer.error_code == ErrorCode.FENCED_LEADER_EPOCH:
                    answered.parked = True
                elif answer.error_code != ErrorCode.NONE:
                    failed.append(answered)
                else:
                    partition = answered.partition
                    known, _ = partition.log.end_offset_for_epoch(answer.leader_epoch)
                    # An epoch this log does not know: cut to the end of its largest one below and ask again.
                    done = answer.end_offset < 0 or answer.leader_epoch < 0 or known == answer.leader_epoch
                    offset = partition.truncation_offset(answer.leader_epoch, answer.end_offset)
                    self._truncate_to(answered, offset, done=done)
        self._delay(failed + list(by_key.values()))

    async def _reset_out_of_range(self, state: FetchState) -> bool:
        """Kafka's fetchOffsetAndTruncate: behind the leader's log start, start over there; ahead of its log end
        (an unclean election), truncate to it."""
        assert self._channel is not None
        partition = state.partition
        plog = partition.log
        leader_end = await self._list_offset(state, LATEST_TIMESTAMP)
        if leader_end is None or not self._current(state):
            return False
        log_end = plog.log_end_offset
        if leader_end < log_end:
            log.warning("%s: %s-%d: resetting the fetch offset from %d to the leader's log end %d", self.client_id,
                        partition.topic, partition.index, log_end, leader_end)  # fmt: skip
            self._truncate_to(state, leader_end)
            state.lag = 0
            return True
        leader_start = await self._list_offset(state, EARLIEST_TIMESTAMP)
        if leader_start is None or not self._current(state):
            return False
        log_end = plog.log_end_offset
        if leader_start > log_end:
            log.warning("%s: %s-%d: the log ends at %d, before the leader's log start %d: emptied to start there",
                        self.client_id, partition.topic, partition.index, log_end, leader_start)  # fmt: skip
            try:
                plog.truncate_fully_and_start_at(leader_start)
            except (OSError, KafkaError, StorageError) as exc:
                log.error("%s: emptying %s-%d failed: %s", self.client_id, partition.topic, partition.index, exc)
                state.parked = True
                return True
        state.fetch_offset = plog.log_end_offset
        state.lag = max(0, leader_end - state.fetch_offset)
        return True

    async def _list_offset(self, state: FetchState, timestamp: int) -> int | None:
        from protocol.messages.list_offsets_request import ListOffsetsRequest
        from protocol.messages.list_offsets_response import ListOffsetsResponse

        assert self._channel is not None
        partition = state.partition
        request = ListOffsetsRequest(
            replica_id=self.manager.local_broker_id,
            isolation_level=0,
            topics=[
                ListOffsetsRequest.ListOffsetsTopic(
                    name=partition.topic,
                    partitions=[
                        ListOffsetsRequest.ListOffsetsPartition(
                            partition_index=partition.index,
                            current_leader_epoch=state.leader_epoch,
                            timestamp=timestamp,
                        )
                    ],
                )
            ],
        )
        response = await self._channel.request(request)
        assert isinstance(response, ListOffsetsResponse)
        for topic in response.topics:
            for answer in topic.partitions:
                if topic.name != partition.topic or answer.partition_index != partition.index:
                    continue
                if answer.error_code == ErrorCode.FENCED_LEADER_EPOCH:
                    state.parked = True
                    return None
                if answer.error_code == ErrorCode.NONE and answer.offset >= 0:
                    return int(answer.offset)
        return None


class ReplicaFetcherManager:
    """Which fetcher fetches each followed partition (Kafka's ReplicaFetcherManager, with one fetcher per source
    broker: num.replica.fetchers is 1)."""

    def __init__(
        self,
        local_broker_id: int,
        *,
        address_of: Callable[[int], Address | None],
        broker_epoch: Callable[[], int],
        topic_id_of: Callable[[str], uuid.UUID | None],
        clock: Callable[[], int],
        settings: FetcherSettings = DEFAULT_SETTINGS,
        max_fetch_version: int | None = None,
        security: NodeSecurity | None = None,
    ) -> None:
        """``address_of``: a broker's endpoint on the inter-broker listener (None: not registered there);
        ``broker_epoch``: this broker's epoch in the image (-1 without one); ``topic_id_of``: a topic's id in
        the image; ``max_fetch_version``: the newest Fetch version to send (None: the newest both sides know);
        ``security``: the inter-broker listener's TLS and SASL (None: PLAINTEXT)."""
        self.local_broker_id = local_broker_id
        self.address_of = address_of
        self.broker_epoch = broker_epoch
        self.topic_id_of = topic_id_of
        self.clock = clock
        self.settings = settings
        self.max_fetch_version = max_fetch_version
        self.security = security
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._nursery: trio.Nursery | None = None

    def fetcher_of(self, topic: str, index: int) -> ReplicaFetcher | None:
        for fetcher in self.fetchers.values():
            if (topic, index) in fetcher.states:
                return fetcher
        return None

    def state_of(self, topic: str, index: int) -> FetchState | None:
        fetcher = self.fetcher_of(topic, index)
        return None if fetcher is None else fetcher.states[(topic, index)]

    def lags(self) -> list[tuple[str, str, int, int]]:
        """(fetcher client id, topic, partition, lag) of each partition fetched at least once (ReplicaLag)."""
        return [
            (fetcher.client_id, topic, index, state.lag)
            for fetcher in self.fetchers.values()
            for (topic, index), state in fetcher.states.items()
            if state.lag is not None
        ]

    # --- registrations -------------------------------------------------------------------------------

    def follow(self, partition: Partition) -> None:
        """``partition`` now follows ``partition.leader_id`` in ``partition.registered_leader_epoch`` (Kafka's
        addFetcherForPartitions): moved to that leader's fetcher; a new epoch is checked for divergence first."""
        leader = partition.leader_id
        if leader == NO_LEADER or leader == self.local_broker_id:
            self.unfollow(partition.topic, partition.index)
            return
        key = (partition.topic, partition.index)
        epoch = partition.registered_leader_epoch
        current = self.fetcher_of(*key)
        if current is not None and current.source_id == leader:
            state = current.states[key]
            if state.partition is partition and state.leader_epoch == epoch:
                return  # the same registration again (an ISR change): fetching goes on as it was
        self.unfollow(*key)
        fetcher = self.fetchers.get(leader)
        if fetcher is None:
            fetcher = self.fetchers[leader] = ReplicaFetcher(self, leader, 0)  # num.replica.fetchers is 1
            if self._nursery is not None:
                self._nursery.start_soon(fetcher.run)
        fetcher.states[key] = FetchState(partition, epoch, partition.log.log_end_offset)
        fetcher.changed()

    def unfollow(self, topic: str, index: int) -> None:
        """Stop fetching the partition (Kafka's removeFetcherForPartitions); an emptied fetcher ends."""
        fetcher = self.fetcher_of(topic, index)
        if fetcher is None:
            return
        del fetcher.states[(topic, index)]
        if not fetcher.states:
            self.fetchers.pop(fetcher.source_id, None)
            fetcher.cancel_scope.cancel()

    def fetcher_ended(self, fetcher: ReplicaFetcher) -> None:
        if self.fetchers.get(fetcher.source_id) is fetcher:  # ended by cancellation with partitions left
            del self.fetchers[fetcher.source_id]

    # --- running -------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the fetchers (those of partitions followed before this started too) until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for fetcher in list(self.fetchers.values()):
                    nursery.start_soon(fetcher.run)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
