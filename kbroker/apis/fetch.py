"""Fetch (key 1): serve record batches from segment files as they are, with long polling and fetch sessions.

A fetch that finds fewer than min_bytes waits until max_wait_ms for one of its partitions' readable end to
move: it subscribes to the partitions' events (kbroker/storage), so nothing polls and no writer has to
remember to wake it. Large record data is not read here: such a partition's answer is a region of a segment
file that the connection sends with sendfile. The first INLINE_RECORD_BYTES of an answer are read into it
instead: a consumer that keeps up fetches a few small batches at a time, and a region costs more system calls
(dup, sendfile, close, a send before and after it) than copying them, and holds the answer back until each
has run.
Fetch sessions (KIP-227, v7+) are in fetch_sessions.py.

isolation_level=1 (read_committed) reads up to the last stable offset instead of the high watermark, waits
for that to move, and lists the aborted transactions the returned records overlap (from the partition's
aborted transaction index); read_uncommitted answers a null list, as Kafka.

From v9 a partition may carry the fetcher's current_leader_epoch: one below the partition's epoch is
FENCED_LEADER_EPOCH, one above it UNKNOWN_LEADER_EPOCH, -1 is not checked. Partitions a session remembers
without the request naming them are read as last named (leader epoch, log start, last fetched epoch included).

Partitions are read through the replica layer (kbroker/replication, ``ctx.replicas``): a consumer reads up to
the high watermark (or last stable offset) of a partition this broker leads, or from v11 (KIP-392, as Kafka)
of one it follows (its own high watermark), else NOT_LEADER_OR_FOLLOWER; a
follower (replica_id >= 0, from v15 ReplicaState) reads up to the log end, waits for the log end to move, and
its fetch offset is recorded as its log end (which moves the high watermark, and may propose it for the ISR).
A replica the partition does not have is refused as Kafka refuses it (UNKNOWN_LEADER_EPOCH if it sent an
epoch, else NOT_LEADER_OR_FOLLOWER).

From v12 a fetcher names the epoch of the last batch it has (last_fetched_epoch); where its log diverges from
this one (that epoch ends here before the fetch offset, or is unknown here) the answer is the epoch and end
offset to truncate to (diverging_epoch) with no records, and a follower's position is not recorded, as Kafka's
Partition.readRecords. From v16 a NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH answer names the current leader
and its endpoint (KIP-951, kbroker/apis/leader_hints.py).

Authorization as Kafka's: a consumer needs READ on each topic (else its partitions, the session's included, are
TOPIC_AUTHORIZATION_FAILED, whether they exist or not); a follower (replica_id >= 0) needs CLUSTER_ACTION on the
cluster instead, else every partition is TOPIC_AUTHORIZATION_FAILED. Asked once per request, before any waiting;
without an authorizer the only cost is one ``is None`` test.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import trio

from kbroker.apis.context import RequestContext
from kbroker.apis.leader_hints import current_leader, no_replica_error
from kbroker.apis.turns import Turns
from kbroker.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    NO_SESSION,
    CachedPartition,
    FetchSession,
    PartitionKey,
    next_epoch,
)
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from kbroker.storage import OffsetOutOfRange
from kbroker.storage.api import PartitionEvent
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.fetch_request import FetchRequest
from protocol.messages.fetch_response import FetchResponse

READ_COMMITTED = 1
TOPIC_IDS_VERSION = 13
LEADER_HINTS_VERSION = 16  # KIP-951: refusals name the current leader
FOLLOWER_READS_VERSION = 11  # KIP-392: a consumer's fetch carries client metadata (rack) and may read a follower
CONSUMER_REPLICA_ID = -1
NO_TOPIC_ID = uuid.UUID(int=0)
PartitionData = FetchResponse.PartitionData
INLINE_RECORD_BYTES = 64 * 1024  # per answer: record data up to this much is read, not sent with sendfile


@dataclass(slots=True)
class Wanted:
    """One partition to read: as the request (or the session) names it, and from where."""

    key: PartitionKey  # (topic id or name, partition): how the session knows it
    name: str | None  # None when the topic id is unknown
    topic: str  # the name as the request gave it ("" from v13)
    topic_id: uuid.UUID
    partition: int
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int = -1  # v9+: the epoch the fetcher knows (-1: not checked)
    log_start_offset: int = -1  # v5+: a follower's log start offset
    last_fetched_epoch: int = -1  # v12+: the epoch of the last batch the fetcher has (-1: not checked)


async def handle_fetch(ctx: RequestContext, request: FetchRequest) -> FetchResponse:
    uses_ids = ctx.api_version >= TOPIC_IDS_VERSION
    turns = Turns()  # a fetch naming many partitions lets other connections run as it goes (kbroker/apis/turns.py)
    requested = await _requested(ctx, request, uses_ids, turns)
    session: FetchSession | None = None
    create_session = False
    if ctx.api_version >= 7:
        cache = ctx.fetch_sessions
        now_ms = int(time.time() * 1000)
        if request.session_epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if request.session_id != NO_SESSION:
                cache.remove(request.session_id)  # a full request closes the session it names
            create_session = request.session_epoch == INITIAL_EPOCH
        else:
            session = cache.get(request.session_id)
            if session is None:
                return _session_error(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
            if session.epoch != request.session_epoch:
                return _session_error(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
            if session.uses_topic_ids != uses_ids:
                return _session_error(ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
            forgotten = _forgotten(request, uses_ids)
            session.update(((w.key, _asked(w)) for w in requested), forgotten)
            if not session.partitions:
                cache.remove(session.id)  # nothing left to fetch: the session ends
                session = None
            else:
                cache.touch(session, now_ms)
                session.epoch = next_epoch(session.epoch)
                requested = await _session_partitions(ctx, session, uses_ids, requested, turns)

    if ctx.api_version >= 15:
        replica_id, broker_epoch = request.replica_state.replica_id, request.replica_state.replica_epoch
    else:
        replica_id, broker_epoch = request.replica_id, -1
    denied = _denied_topics(ctx, replica_id, requested) if ctx.services.authorizer is not None else None
    keys = [(w.name, w.partition) for w in requested if w.name is not None and not (denied and w.name in denied)]
    deadline = trio.current_time() + max(request.max_wait_ms, 0) / 1000
    while True:
        answers, total_bytes, has_error = await _read_all(
            ctx, request, replica_id, broker_epoch, requested, turns, denied
        )
        if (
            total_bytes >= request.min_bytes
            or has_error
            or trio.current_time() >= deadline
            or ctx.cluster.draining
            or not keys
        ):
            break
        if replica_id >= 0:  # a follower reads up to the log end
            readable_end_moved = PartitionEvent.APPENDED
        elif request.isolation_level == READ_COMMITTED:
            readable_end_moved = PartitionEvent.STABLE_OFFSET
        else:
            readable_end_moved = PartitionEvent.HIGH_WATERMARK
        await _wait_for_data(ctx, keys, deadline, turns, readable_end_moved)
    if total_bytes:
        _count_bytes_out(ctx, answers)
    node_endpoints: list[FetchResponse.NodeEndpoint] = []
    if has_error and ctx.api_version >= LEADER_HINTS_VERSION:
        node_endpoints = _name_leaders(ctx, answers)

    session_id = NO_SESSION
    if session is not None:
        answers = await _incremental(session, answers, turns)
        session_id = session.id
    elif create_session and answers:
        partitions = {}
        for wanted, data in answers:
            partitions[wanted.key] = _cached(wanted, data)
            await turns.step()
        created = ctx.fetch_sessions.create(int(time.time() * 1000), uses_ids, partitions)
        session_id = created.id if created is not None else NO_SESSION
    return FetchResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        session_id=session_id,
        responses=await _by_topic(answers, turns),
        node_endpoints=node_endpoints,
    )


def _name_leaders(ctx: RequestContext, answers: list[tuple[Wanted, PartitionData]]) -> list[FetchResponse.NodeEndpoint]:
    """KIP-951: each partition refused for leadership gets its current leader, and the response their endpoints."""
    endpoints: dict[int, FetchResponse.NodeEndpoint] = {}
    for wanted, data in answers:
        if wanted.name is None or data.error_code not in (
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            ErrorCode.FENCED_LEADER_EPOCH,
        ):
            continue
        hint = current_leader(ctx, wanted.name, wanted.partition)
        data.current_leader = FetchResponse.LeaderIdAndEpoch(leader_id=hint.leader_id, leader_epoch=hint.leader_epoch)
        if hint.endpoint is not None:
            endpoints[hint.leader_id] = FetchResponse.NodeEndpoint(
                node_id=hint.leader_id, host=hint.endpoint.host, port=hint.endpoint.port, rack=hint.rack
            )
    return list(endpoints.values())


def _count_bytes_out(ctx: RequestContext, answers: list[tuple[Wanted, PartitionData]]) -> None:
    """kafka_server_brokertopicmetrics_bytesout_total: the record bytes answered, per topic (kbroker/metrics.py)."""
    metrics = ctx.services.metrics
    for wanted, data in answers:
        if wanted.name is not None and data.records:
            metrics.topic(wanted.name).bytes_out += len(data.records)


def _denied_topics(ctx: RequestContext, replica_id: int, wanted: list[Wanted]) -> set[str]:
    """The topics of ``wanted`` this request may not read: READ on the topic for a consumer, CLUSTER_ACTION on the
    cluster for a follower (which then may read every topic)."""
    names = {w.name for w in wanted if w.name is not None}
    if replica_id >= 0:
        return set() if ctx.authorize(AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME) else names
    return {name for name in names if not ctx.authorize(AclOperation.READ, ResourceType.TOPIC, name)}


def _session_error(code: ErrorCode) -> FetchResponse:
    return FetchResponse(throttle_time_ms=0, error_code=code, session_id=NO_SESSION, responses=[])


async def _wait_for_data(
    ctx: RequestContext,
    keys: list[tuple[str, int]],
    deadline: float,
    turns: Turns,
    readable_end_moved: PartitionEvent,
) -> None:
    """Until a partition's readable end moves (the high watermark, the last stable offset for read_committed, the
    log end for a follower), the broker starts draining, or the deadline."""
    woken = trio.Event()

    def on_change(event: PartitionEvent) -> None:
        if event & readable_end_moved:
            woken.set()

    unsubscribes = [ctx.cluster.on_drain(woken.set)]
    try:
        for topic, index in keys:
            try:
                partition = ctx.replicas.partition(topic, index)
            except KafkaError:  # answered with its error already
                continue
            if partition is not None:
                unsubscribes.append(partition.log.subscribe(on_change))
            await turns.step()
        with trio.move_on_at(deadline):
            await woken.wait()
    finally:
        for unsubscribe in unsubscribes:
            unsubscribe()


async def _requested(ctx: RequestContext, request: FetchRequest, uses_ids: bool, turns: Turns) -> list[Wanted]:
    out = []
    for topic in request.topics:
        if uses_ids:
            info = ctx.topics.topic_by_id(topic.topic_id)
            name = info.name if info is not None else None
        else:
            name = topic.topic
        ident = topic.topic_id if uses_ids else topic.topic
        for part in topic.partitions:
            out.append(
                Wanted(
                    (ident, part.partition),
                    name,
                    topic.topic,
                    topic.topic_id or NO_TOPIC_ID,
                    part.partition,
                    part.fetch_offset,
                    part.partition_max_bytes,
                    part.current_leader_epoch,
                    part.log_start_offset,
                    part.last_fetched_epoch,
                )
            )
            await turns.step()
    return out


def _forgotten(request: FetchRequest, uses_ids: bool) -> list[PartitionKey]:
    return [
        (topic.topic_id if uses_ids else topic.topic, partition)
        for topic in request.forgotten_topics_data or []
        for partition in topic.partitions
    ]


async def _session_partitions(
    ctx: RequestContext, session: FetchSession, uses_ids: bool, requested: list[Wanted], turns: Turns
) -> list[Wanted]:
    """Every partition of the session, in its order, with the fetch positions it has cached."""
    by_key = {w.key: w for w in requested}
    out = []
    for key, cached in list(session.partitions.items()):  # a copy: other requests run between turns
        await turns.step()
        known = by_key.get(key)
        if known is not None:
            out.append(known)
            continue
        ident, partition = key
        if uses_ids:
            assert isinstance(ident, uuid.UUID)
            info = ctx.topics.topic_by_id(ident)
            name, topic, topic_id = (info.name if info is not None else None), "", ident
        else:
            assert isinstance(ident, str)
            name, topic, topic_id = ident, ident, NO_TOPIC_ID
        out.append(
            Wanted(
                key,
                name,
                topic,
                topic_id,
                partition,
                cached.fetch_offset,
                cached.max_bytes,
                cached.current_leader_epoch,
                cached.fetcher_log_start_offset,
                cached.last_fetched_epoch,
            )
        )
    return out


def _asked(wanted: Wanted) -> CachedPartition:
    """A partition as the request names it, for the session to cache."""
    return CachedPartition(
        wanted.fetch_offset,
        wanted.max_bytes,
        current_leader_epoch=wanted.current_leader_epoch,
        fetcher_log_start_offset=wanted.log_start_offset,
        last_fetched_epoch=wanted.last_fetched_epoch,
    )


def _cached(wanted: Wanted, data: PartitionData) -> CachedPartition:
    cached = _asked(wanted)
    cached.remember(data.high_watermark, data.log_start_offset, data.error_code)
    return cached


async def _incremental(
    session: FetchSession, answers: list[tuple[Wanted, PartitionData]], turns: Turns
) -> list[tuple[Wanted, PartitionData]]:
    """Only the partitions with news, remembering what was told; they move to the end of the session."""
    kept = []
    for wanted, data in answers:
        await turns.step()
        cached = session.partitions.get(wanted.key)
        if cached is None:
            continue
        has_records = bool(data.records is not None and len(data.records))
        # As Kafka: where the fetcher must truncate, or which replica to read from, is always said.
        diverging = data.diverging_epoch.epoch >= 0 or data.diverging_epoch.end_offset >= 0
        always = diverging or data.preferred_read_replica >= 0
        if always or cached.must_respond(has_records, data.high_watermark, data.log_start_offset, data.error_code):
            cached.remember(data.high_watermark, data.log_start_offset, data.error_code)
            session.answered(wanted.key)
            kept.append((wanted, data))
    return kept


async def _by_topic(
    answers: list[tuple[Wanted, PartitionData]], turns: Turns
) -> list[FetchResponse.FetchableTopicResponse]:
    topics: list[FetchResponse.FetchableTopicResponse] = []
    for wanted, data in answers:
        await turns.step()
        if not topics or topics[-1].topic_id != wanted.topic_id or topics[-1].topic != wanted.topic:
            topics.append(
                FetchResponse.FetchableTopicResponse(topic=wanted.topic, topic_id=wanted.topic_id, partitions=[])
            )
        topics[-1].partitions.append(data)
    return topics


def _partition_error(index: int, code: ErrorCode) -> PartitionData:
    """Kafka's answer for a partition it cannot read: no offsets, and empty (never null) records.

    librdkafka rejects a whole response holding a null record set ("invalid MessageSetSize -1"), losing
    the other partitions of the response and the error that would have reset an out-of-range position.
    """
    return PartitionData(
        partition_index=index,
        error_code=code,
        high_watermark=-1,
        last_stable_offset=-1,
        log_start_offset=-1,
        records=b"",
    )


async def _read_all(
    ctx: RequestContext,
    request: FetchRequest,
    replica_id: int,
    broker_epoch: int,
    wanted: list[Wanted],
    turns: Turns,
    denied: set[str] | None = None,
) -> tuple[list[tuple[Wanted, PartitionData]], int, bool]:
    read_committed = request.isolation_level == READ_COMMITTED
    # As Kafka's FetchParams.fetchOnlyLeader: a follower's fetch, and a consumer's before v11 (no client
    # metadata), read the leader only; a consumer's from v11 reads a follower too, up to its high watermark.
    leader_only = replica_id >= 0 or (replica_id == CONSUMER_REPLICA_ID and ctx.api_version < FOLLOWER_READS_VERSION)
    replicas = ctx.replicas
    fetch_ms = replicas.clock() if replica_id >= 0 else 0  # when followers' positions were recorded
    remaining = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
    inline_left = INLINE_RECORD_BYTES
    total = 0
    has_error = False
    answers = []
    # Kafka's order: the partitions it reads (in request order), then unknown topic ids, then unauthorized and
    # unknown topics or partitions (in request order).
    unknown_ids: list[tuple[Wanted, PartitionData]] = []
    unknown: list[tuple[Wanted, PartitionData]] = []
    for part in wanted:
        await turns.step()
        if part.name is None:
            unknown_ids.append((part, _partition_error(part.partition, ErrorCode.UNKNOWN_TOPIC_ID)))
            continue
        if denied and part.name in denied:
            unknown.append((part, _partition_error(part.partition, ErrorCode.TOPIC_AUTHORIZATION_FAILED)))
            continue
        try:
            partition = replicas.partition(part.name, part.partition)
        except KafkaError as exc:  # a partition whose files cannot be opened (KAFKA_STORAGE_ERROR)
            has_error = True
            answers.append((part, _partition_error(part.partition, exc.code)))
            continue
        if partition is None:  # no replica here: another broker's partition (its leader named), or none at all
            code = no_replica_error(ctx, part.name, part.partition)
            if code == ErrorCode.NOT_LEADER_OR_FOLLOWER:
                has_error = True
                answers.append((part, _partition_error(part.partition, code)))
            else:
                unknown.append((part, _partition_error(part.partition, code)))
            continue
        refusal = partition.fetch_error(replica_id, part.current_leader_epoch, leader_only)
        if refusal != ErrorCode.NONE:  # checked before the offset, as Kafka's Partition.fetchRecords
            has_error = True
            answers.append((part, _partition_error(part.partition, refusal)))
            continue
        plog = partition.log
        high_watermark = plog.high_watermark
        stable = plog.last_stable_offset
        log_end = plog.log_end_offset
        if replica_id >= 0:
            upper = log_end  # a follower reads all the leader has
        else:
            upper = stable if read_committed else high_watermark
        data = PartitionData(
            partition_index=part.partition,
            error_code=ErrorCode.NONE,
            high_watermark=high_watermark,
            last_stable_offset=stable,
            log_start_offset=plog.log_start_offset,
            aborted_transactions=None,
            records=b"",
        )
        if part.last_fetched_epoch >= 0:
            try:
                diverging = partition.diverging_epoch(part.last_fetched_epoch, part.fetch_offset)
            except OffsetOutOfRange:
                error = _partition_error(part.partition, ErrorCode.OFFSET_OUT_OF_RANGE)
                error.aborted_transactions = None
                has_error = True
                answers.append((part, error))
                continue
            if diverging is not None:  # no records: the fetcher truncates first (its position is not recorded)
                data.diverging_epoch = FetchResponse.EpochEndOffset(epoch=diverging[0], end_offset=diverging[1])
                has_error = True  # answered at once, as an error would be
                answers.append((part, data))
                continue
        limit = min(part.max_bytes, remaining)
        try:
            # KIP-74: the first partition with data returns at least one whole batch, whatever the limits.
            chunk = plog.read(part.fetch_offset, limit, max_offset=upper, min_one_batch=total == 0)
        except OffsetOutOfRange:
            error = _partition_error(part.partition, ErrorCode.OFFSET_OUT_OF_RANGE)
            error.aborted_transactions = None  # as Kafka's log read answers it
            has_error = True
            answers.append((part, error))
            continue
        except KafkaError as exc:  # a damaged segment (CORRUPT_MESSAGE) or a failing disk (KAFKA_STORAGE_ERROR)
            has_error = True
            answers.append((part, _partition_error(part.partition, exc.code)))
            continue
        if chunk.size <= inline_left:  # in the answer itself, which then goes out in one send
            data.records = chunk.read_bytes()
            inline_left -= chunk.size
        else:
            data.records = chunk.region()  # sent from the segment file as it is (sendfile)
        if read_committed:
            # As Kafka: a read_committed answer lists the aborted transactions its records overlap, so the
            # client drops them; an empty list (never null) when there are none or no records.
            aborted = plog.aborted_transactions(part.fetch_offset, chunk.last_offset + 1) if chunk.size else []
            data.aborted_transactions = [
                FetchResponse.AbortedTransaction(producer_id=pid, first_offset=first) for pid, first in aborted
            ]
        if replica_id >= 0:  # its log ends where it asks from: the high watermark may move (told at its next fetch)
            partition.record_follower_fetch(
                replica_id, part.fetch_offset, part.log_start_offset, fetch_ms, log_end, broker_epoch
            )
        total += chunk.size
        remaining -= chunk.size
        answers.append((part, data))
    has_error = has_error or bool(unknown_ids or unknown)
    return answers + unknown_ids + unknown, total, has_error
