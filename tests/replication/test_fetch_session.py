"""The follower's fetch session handler (kbroker/replication/fetch_session.py), as Kafka's FetchSessionHandler."""

from __future__ import annotations

import uuid

from kbroker.replication.fetch_session import FollowerSession, Forgotten, PartitionFetch
from protocol.errors import ErrorCode

T_ID = uuid.UUID(int=1)
U_ID = uuid.UUID(int=2)
SESSION = 7


def fetch(offset: int, *, topic_id: uuid.UUID = T_ID, epoch: int = 3, log_start: int = 0) -> PartitionFetch:
    return PartitionFetch(
        topic_id=topic_id,
        fetch_offset=offset,
        log_start_offset=log_start,
        max_bytes=1_048_576,
        current_leader_epoch=epoch,
        last_fetched_epoch=epoch,
    )


def opened(wanted: dict[tuple[str, int], PartitionFetch]) -> FollowerSession:
    """A session whose full request fetching ``wanted`` was answered with session id SESSION."""
    session = FollowerSession()
    first = session.build(wanted, forget_replaced=True)
    assert (first.session_id, first.epoch, first.full) == (0, 0, True)
    assert first.to_send == wanted and first.to_forget == []
    assert session.handle_response(ErrorCode.NONE, SESSION, set(wanted))
    assert (session.session_id, session.epoch, session.full) == (SESSION, 1, False)
    return session


def test_a_full_fetch_opens_the_session_and_then_only_changed_partitions_are_sent() -> None:
    wanted = {("t", 0): fetch(10), ("t", 1): fetch(20), ("u", 0): fetch(5, topic_id=U_ID)}
    session = opened(wanted)

    same = session.build(dict(wanted), forget_replaced=True)
    assert (same.session_id, same.epoch, same.full) == (SESSION, 1, False)
    assert same.to_send == {} and same.to_forget == []
    assert session.handle_response(ErrorCode.NONE, SESSION, set())  # no news: nothing answered
    assert session.epoch == 2

    # Each field of the fetch state counts: the offset of t-0, the log start of t-1, the leader epoch of u-0.
    wanted = {("t", 0): fetch(15), ("t", 1): fetch(20, log_start=4), ("u", 0): fetch(5, topic_id=U_ID, epoch=4)}
    changed = session.build(wanted, forget_replaced=True)
    assert (changed.session_id, changed.epoch) == (SESSION, 2)
    assert changed.to_send == wanted and changed.to_forget == []
    assert session.handle_response(ErrorCode.NONE, SESSION, {("t", 0)})
    wanted[("t", 0)] = fetch(16)
    one = session.build(wanted, forget_replaced=True)
    assert (one.epoch, one.to_send, one.to_forget) == (3, {("t", 0): fetch(16)}, [])
    assert session.partitions == wanted


def test_partitions_no_longer_fetched_are_forgotten_and_sent_in_full_when_back() -> None:
    session = opened({("t", 0): fetch(10), ("u", 0): fetch(5, topic_id=U_ID)})
    parked = session.build({("t", 0): fetch(10)}, forget_replaced=True)
    assert parked.to_send == {}
    assert parked.to_forget == [Forgotten("u", U_ID, 0)]
    assert session.handle_response(ErrorCode.NONE, SESSION, set())
    assert set(session.partitions) == {("t", 0)}

    back = session.build({("t", 0): fetch(10), ("u", 0): fetch(5, topic_id=U_ID)}, forget_replaced=True)
    assert back.epoch == 2
    assert back.to_send == {("u", 0): fetch(5, topic_id=U_ID)} and back.to_forget == []


def test_a_recreated_topic_forgets_its_old_id_only_when_topics_go_by_id() -> None:
    new_id = uuid.UUID(int=3)
    by_id = opened({("t", 0): fetch(10)})
    replaced = by_id.build({("t", 0): fetch(0, topic_id=new_id)}, forget_replaced=True)
    assert replaced.to_send == {("t", 0): fetch(0, topic_id=new_id)}
    assert replaced.to_forget == [Forgotten("t", T_ID, 0)]

    by_name = opened({("t", 0): fetch(10)})  # forgetting t-0 by name would forget the one sent too
    renamed = by_name.build({("t", 0): fetch(0, topic_id=new_id)}, forget_replaced=False)
    assert renamed.to_send == {("t", 0): fetch(0, topic_id=new_id)} and renamed.to_forget == []


def test_an_unknown_session_starts_a_new_one_and_other_errors_close_the_old_one() -> None:
    wanted = {("t", 0): fetch(10), ("t", 1): fetch(20)}
    session = opened(wanted)
    session.build(wanted, forget_replaced=True)
    assert not session.handle_response(ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0, set())
    again = session.build(wanted, forget_replaced=True)
    assert (again.session_id, again.epoch, again.full) == (0, 0, True)  # a new session
    assert again.to_send == wanted and again.to_forget == []

    for code in (
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR,
        ErrorCode.UNKNOWN_SERVER_ERROR,
    ):
        session = opened(wanted)
        session.build({("t", 0): fetch(11)}, forget_replaced=True)
        assert not session.handle_response(code, 0, set())
        again = session.build(wanted, forget_replaced=True)
        # Full, naming the old session with epoch 0: the leader closes it and opens another.
        assert (again.session_id, again.epoch, again.full) == (SESSION, 0, True)
        assert again.to_send == wanted and again.to_forget == []
        assert session.handle_response(ErrorCode.NONE, SESSION + 1, set(wanted))
        assert (session.session_id, session.epoch) == (SESSION + 1, 1)


def test_a_failed_request_makes_the_next_one_full() -> None:
    wanted = {("t", 0): fetch(10)}
    session = opened(wanted)
    session.build({("t", 0): fetch(12)}, forget_replaced=True)
    session.handle_error()
    again = session.build({("t", 0): fetch(12)}, forget_replaced=True)
    assert (again.session_id, again.epoch) == (SESSION, 0)
    assert again.to_send == {("t", 0): fetch(12)}


def test_a_leader_keeping_no_session_is_fetched_in_full_each_time() -> None:
    wanted = {("t", 0): fetch(10)}
    session = FollowerSession()
    for _ in range(2):
        request = session.build(wanted, forget_replaced=True)
        assert (request.session_id, request.epoch, request.to_send) == (0, 0, wanted)
        assert session.handle_response(ErrorCode.NONE, 0, set(wanted))

    session = opened(wanted)  # a session the leader ends (an incremental answer with id 0)
    session.build(wanted, forget_replaced=True)
    assert session.handle_response(ErrorCode.NONE, 0, {("t", 0)})
    assert (session.session_id, session.epoch, session.full) == (0, 0, True)


def test_answers_outside_the_session_are_not_taken() -> None:
    wanted = {("t", 0): fetch(10)}
    session = opened(wanted)
    session.build(wanted, forget_replaced=True)
    assert not session.handle_response(ErrorCode.NONE, SESSION, {("t", 0), ("v", 0)})
    assert (session.session_id, session.epoch) == (SESSION, 0)

    session = FollowerSession()
    session.build(wanted, forget_replaced=True)
    assert not session.handle_response(ErrorCode.NONE, SESSION, {("v", 0)})
    assert (session.session_id, session.epoch) == (0, 0)
    # KIP-219: a throttled full request answered empty opens nothing.
    session.build(wanted, forget_replaced=True)
    assert not session.handle_response(ErrorCode.NONE, SESSION, set(), throttle_time_ms=100)
    assert (session.session_id, session.epoch) == (0, 0)


def test_the_epoch_wraps_to_one() -> None:
    wanted = {("t", 0): fetch(10)}
    session = opened(wanted)
    session.epoch = 2**31 - 1
    session.build(wanted, forget_replaced=True)
    assert session.handle_response(ErrorCode.NONE, SESSION, set())
    assert session.epoch == 1
