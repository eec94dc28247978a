"""Incremental fetch sessions (KIP-227): the broker remembers what a fetcher asked for and was last told.

A fetch request with session epoch 0 is a full request and opens a session; later requests on it carry only
the partitions whose fetch position changed (and those to forget), and the response carries only partitions
with news: records, a changed high watermark or log start offset, or an error. With many partitions this
keeps both directions small. Epoch -1 is a full request that wants no session.

Sessions are not tied to connections, as in Kafka: they live in a cache of
``max.incremental.fetch.session.cache.slots`` entries, and a new session may evict one unused for two
minutes, or else a smaller one older than that.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
NO_SESSION = 0
EVICTION_MS = 120_000  # Kafka's min.incremental.fetch.session.eviction.ms

# A partition as a session knows it: by topic id from Fetch v13, by topic name before.
PartitionKey = tuple[object, int]


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``: it wraps to 1, since 0 and -1 have their own meanings."""
    return 1 if epoch >= 2**31 - 1 else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """What the fetcher last asked for a partition, and what it was last told about it."""

    fetch_offset: int
    max_bytes: int
    high_watermark: int = -1
    log_start_offset: int = -1
    # The rest of the request, as Kafka's CachedPartition keeps it: a follower sends a partition again only when
    # one of these changes, and the fencing and divergence checks and its log start must not lapse meanwhile.
    current_leader_epoch: int = -1
    fetcher_log_start_offset: int = -1
    last_fetched_epoch: int = -1

    def must_respond(self, has_records: bool, high_watermark: int, log_start_offset: int, error: int) -> bool:
        return (
            has_records
            or error != 0
            or high_watermark != self.high_watermark
            or log_start_offset != self.log_start_offset
        )

    def remember(self, high_watermark: int, log_start_offset: int, error: int) -> None:
        # After an error the high watermark is forgotten, so the partition is sent again once it clears.
        self.high_watermark = -1 if error != 0 else high_watermark
        self.log_start_offset = log_start_offset


@dataclass(slots=True)
class FetchSession:
    id: int
    uses_topic_ids: bool
    created_ms: int
    last_used_ms: int
    epoch: int = 1  # the epoch the next request must carry
    # Insertion ordered: partitions that were just answered move to the end, so that when max_bytes cuts
    # a response short, the next one starts with the partitions that were left out.
    partitions: dict[PartitionKey, CachedPartition] = field(default_factory=dict)

    def update(
        self, requested: Iterable[tuple[PartitionKey, CachedPartition]], forgotten: Iterable[PartitionKey]
    ) -> None:
        """``requested``: each partition the request names, with its request fields (the answer's are kept)."""
        for key, asked in requested:
            cached = self.partitions.get(key)
            if cached is not None:  # what the last answer said carries over (a known key keeps its place)
                asked.high_watermark, asked.log_start_offset = cached.high_watermark, cached.log_start_offset
            self.partitions[key] = asked
        for key in forgotten:
            self.partitions.pop(key, None)

    def answered(self, key: PartitionKey) -> None:
        self.partitions[key] = self.partitions.pop(key)


class FetchSessionCache:
    def __init__(self, max_sessions: int, eviction_ms: int = EVICTION_MS, rng: random.Random | None = None) -> None:
        self.max_sessions = max_sessions
        self.eviction_ms = eviction_ms
        self._sessions: dict[int, FetchSession] = {}
        self._random = rng or random.Random()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def remove(self, session_id: int) -> None:
        self._sessions.pop(session_id, None)

    def create(
        self, now_ms: int, uses_topic_ids: bool, partitions: dict[PartitionKey, CachedPartition]
    ) -> FetchSession | None:
        """A new session, or None when the cache is full of sessions worth more than this one."""
        if len(self._sessions) >= self.max_sessions and not self._evict_for(len(partitions), now_ms):
            return None
        session_id = NO_SESSION
        while session_id == NO_SESSION or session_id in self._sessions:
            session_id = self._random.randint(1, 2**31 - 1)
        session = FetchSession(session_id, uses_topic_ids, now_ms, now_ms, partitions=partitions)
        self._sessions[session_id] = session
        return session

    def touch(self, session: FetchSession, now_ms: int) -> None:
        session.last_used_ms = now_ms

    def _evict_for(self, size: int, now_ms: int) -> bool:
        if not self._sessions:
            return False
        stalest = min(self._sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now_ms - stalest.last_used_ms > self.eviction_ms:
            del self._sessions[stalest.id]
            return True
        # Otherwise a smaller session that has had its chance (older than the eviction time) makes way.
        settled = [s for s in self._sessions.values() if now_ms - s.created_ms > self.eviction_ms]
        if not settled:
            return False
        smallest = min(settled, key=lambda s: (len(s.partitions), s.id))
        if len(smallest.partitions) > size:
            return False
        del self._sessions[smallest.id]
        return True
