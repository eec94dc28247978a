"""The follower's side of a KIP-227 incremental fetch session (Kafka's FetchSessionHandler), sans I/O.

A fetcher's first request is full (session id 0, epoch 0): it names every partition, and the leader answers
with a session id (0: it keeps no session). Each later request carries that id and the next epoch, and names
only the partitions added since or whose fetch state changed (fetch offset, log start offset, leader epoch,
max bytes, last fetched epoch, topic id); partitions no longer fetched go in forgotten_topics_data. The leader
fetches the rest from what it cached, and answers only the partitions with news: one left out keeps its
position. An error on the request, an answer naming a partition outside the session or a failed connection
make the next request full again: after FETCH_SESSION_ID_NOT_FOUND as a new session, else closing the old one
(its id, epoch 0).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import NamedTuple

from kbroker.fetch_sessions import INITIAL_EPOCH, NO_SESSION, next_epoch
from protocol.errors import ErrorCode

TopicPartition = tuple[str, int]


class PartitionFetch(NamedTuple):
    """What a request says of one partition: a change in any field sends it again."""

    topic_id: uuid.UUID
    fetch_offset: int
    log_start_offset: int
    max_bytes: int
    current_leader_epoch: int
    last_fetched_epoch: int


class Forgotten(NamedTuple):
    topic: str  # named before Fetch v13
    topic_id: uuid.UUID  # from v13
    partition: int


class SessionRequest(NamedTuple):
    """One request of the session: its id and epoch, the partitions to send, the partitions to forget."""

    session_id: int
    epoch: int
    to_send: dict[TopicPartition, PartitionFetch]
    to_forget: list[Forgotten]

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH


class FollowerSession:
    """The fetch session of one fetcher with one leader: what the leader holds of it, and the next id and epoch."""

    def __init__(self) -> None:
        self.session_id = NO_SESSION
        self.epoch = INITIAL_EPOCH
        self.partitions: dict[TopicPartition, PartitionFetch] = {}  # as the leader's session has them

    def __repr__(self) -> str:
        return f"FollowerSession(id {self.session_id}, epoch {self.epoch}, {len(self.partitions)} partitions)"

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH

    def build(self, wanted: dict[TopicPartition, PartitionFetch], *, forget_replaced: bool) -> SessionRequest:
        """The request fetching ``wanted`` (every partition to fetch now): all of them when the next request is
        full, else only what changed. ``forget_replaced``: the request names topics by id (v13+), so a partition
        whose topic id changed forgets the old one (by name it would forget the new one too)."""
        if self.full:
            self.partitions = dict(wanted)
            return SessionRequest(self.session_id, self.epoch, dict(wanted), [])
        to_send: dict[TopicPartition, PartitionFetch] = {}
        to_forget: list[Forgotten] = []
        for key, held in list(self.partitions.items()):
            fetch = wanted.get(key)
            if fetch is None:
                del self.partitions[key]
                to_forget.append(Forgotten(key[0], held.topic_id, key[1]))
            elif fetch != held:
                if forget_replaced and fetch.topic_id != held.topic_id:
                    to_forget.append(Forgotten(key[0], held.topic_id, key[1]))
                self.partitions[key] = to_send[key] = fetch
        for key, fetch in wanted.items():
            if key not in self.partitions:
                self.partitions[key] = to_send[key] = fetch
        return SessionRequest(self.session_id, self.epoch, to_send, to_forget)

    def handle_response(
        self, error_code: int, session_id: int, answered: Collection[TopicPartition], throttle_time_ms: int = 0
    ) -> bool:
        """Move on after the answer to the last request built; False when its partitions are not to be taken."""
        if error_code != ErrorCode.NONE:
            if error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND:
                self._start_over()
            else:
                self.epoch = INITIAL_EPOCH  # closes the session it names, and asks for a new one
            return False
        unknown = any(key not in self.partitions for key in answered)
        if self.full:
            # KIP-219: a throttled full request is answered empty, and must be asked again.
            if unknown or (throttle_time_ms > 0 and not answered):
                self._start_over()
                return False
            self.session_id = session_id
            self.epoch = INITIAL_EPOCH if session_id == NO_SESSION else next_epoch(INITIAL_EPOCH)
            return True
        if unknown:
            self.epoch = INITIAL_EPOCH
            return False
        if session_id == NO_SESSION:  # the leader closed the session
            self._start_over()
        else:
            self.epoch = next_epoch(self.epoch)
        return True

    def handle_error(self) -> None:
        """The request failed (the connection): the next one is full, closing the session."""
        self.epoch = INITIAL_EPOCH

    def _start_over(self) -> None:
        self.session_id = NO_SESSION
        self.epoch = INITIAL_EPOCH
