"""The classic group coordinator driven directly with a fake clock: no sockets, no sleeps.

Each test runs in trio; JoinGroup/SyncGroup calls that park run as tasks, ``settle()`` lets every task
run until it blocks, and ``advance()`` moves the fake clock and fires the coordinator's due timers.
Expected behaviour follows Kafka's group coordinator (ClassicGroup / GroupMetadataManager), KIP-345
(static membership), KIP-394 (MEMBER_ID_REQUIRED), KIP-814 (skip assignment) and KIP-389 (max size).
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
import trio.testing

from kbroker.groups.coordinator import NEW_MEMBER_JOIN_TIMEOUT_MS, GroupCoordinator, GroupState, JoinResult
from kbroker.groups.offsets import CommittedOffset, OffsetStore
from protocol.errors import ErrorCode

SESSION_MS = 10_000
REBALANCE_MS = 30_000
WALL_START_MS = 1_700_000_000_000


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0: version, topic array, empty user data."""
    out = struct.pack(">hi", 0, len(topics))
    for topic in topics:
        out += struct.pack(">h", len(topic)) + topic.encode()
    return out + struct.pack(">i", -1)


RANGE = [("range", subscription("orders"))]


class Task:
    """A parked coordinator call; ``result`` is set once it returns."""

    def __init__(self) -> None:
        self.result: Any = None

    @property
    def done(self) -> bool:
        return self.result is not None


class Harness:
    def __init__(self, nursery: trio.Nursery, *, delay_ms: int = 0, max_size: int = 2**31 - 1) -> None:
        self.nursery = nursery
        self.now = 100.0
        self.wall_ms = WALL_START_MS
        self.coordinator = GroupCoordinator(
            min_session_timeout_ms=1000,
            max_session_timeout_ms=60_000,
            initial_rebalance_delay_ms=delay_ms,
            max_size=max_size,
            clock=lambda: self.now,
            wall_clock_ms=lambda: self.wall_ms,
        )

    # --- driving ----------------------------------------------------------------------------------------

    @staticmethod
    async def settle() -> None:
        await trio.testing.wait_all_tasks_blocked()

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall_ms += int(seconds * 1000)
        self.coordinator.tick()
        await self.settle()

    def spawn(self, call: Callable[[], Awaitable[Any]]) -> Task:
        task = Task()

        async def run() -> None:
            task.result = await call()

        self.nursery.start_soon(run)
        return task

    def join(
        self,
        member_id: str = "",
        *,
        group: str = "g",
        instance: str | None = None,
        protocols: list[tuple[str, bytes]] | None = None,
        protocol_type: str = "consumer",
        session_ms: int = SESSION_MS,
        rebalance_ms: int = REBALANCE_MS,
        known_id_required: bool = False,
        v9: bool = False,
    ) -> Task:
        return self.spawn(
            lambda: self.coordinator.join(
                group,
                member_id,
                instance,
                "client",
                "/127.0.0.1",
                session_ms,
                rebalance_ms,
                protocol_type,
                RANGE if protocols is None else protocols,
                require_known_member_id=known_id_required,
                supports_skip_assignment=v9,
            )
        )

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        *,
        group: str = "g",
        instance: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> Task:
        return self.spawn(
            lambda: self.coordinator.sync(
                group, generation, member_id, instance, protocol_type, protocol_name, assignments or {}
            )
        )

    def beat(self, member_id: str, generation: int, instance: str | None = None) -> ErrorCode:
        return self.coordinator.heartbeat("g", generation, member_id, instance)

    @property
    def group(self):  # noqa: ANN201
        return self.coordinator.groups["g"]

    async def finish_initial_rebalance(self) -> None:
        """Let the initial rebalance delay (and its extensions) run out."""
        await self.settle()
        for _ in range(10):
            if self.group.state != GroupState.PREPARING_REBALANCE:
                return
            await self.advance(self.coordinator.initial_rebalance_delay_ms / 1000)

    async def stable_group(self, count: int, **join: Any) -> list[JoinResult]:
        """``count`` members joined and synced, in join order, member i assigned b"a<i>".

        Returns each member's JoinGroup result for the generation the group is stable at.
        """
        tasks = [self.join(**join) for _ in range(count)]
        await self.settle()
        await self.finish_initial_rebalance()
        done = [t for t in tasks if t.done]
        if len(done) < count:
            # Without an initial delay the first member formed a generation alone; the others' arrival
            # started the next one, which waits for it to rejoin.
            tasks = [self.join(t.result.member_id, **join) for t in done] + [t for t in tasks if not t.done]
            await self.settle()
        results = {t.result.member_id: t.result for t in tasks}
        assert all(r.error_code == ErrorCode.NONE for r in results.values())
        generation = self.group.generation_id
        leader = self.group.leader_id
        order = list(self.group.members)
        syncs = [self.sync(m, generation) for m in order if m != leader]
        await self.settle()
        assert not any(s.done for s in syncs)
        self.sync(leader, generation, {m: f"a{i}".encode() for i, m in enumerate(order)})
        await self.settle()
        assert self.group.state == GroupState.STABLE
        return [results[m] for m in order]


def run(test: Callable[[Harness], Awaitable[None]], **options: Any) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await test(Harness(nursery, **options))
            nursery.cancel_scope.cancel()

    trio.run(main)


# --- the state machine --------------------------------------------------------------------------------


def test_empty_preparing_completing_stable_empty_dead() -> None:
    async def scenario(h: Harness) -> None:
        first = h.join(known_id_required=True)
        await h.settle()
        assert first.result.error_code == ErrorCode.MEMBER_ID_REQUIRED
        member_id = first.result.member_id
        assert member_id.startswith("client-") and h.group.state == GroupState.EMPTY
        joined = h.join(member_id, known_id_required=True)
        await h.settle()
        result = joined.result
        assert (result.error_code, result.generation_id, result.leader) == (ErrorCode.NONE, 1, member_id)
        assert (result.protocol_type, result.protocol_name) == ("consumer", "range")
        assert result.members == [(member_id, None, RANGE[0][1])]
        assert h.group.state == GroupState.COMPLETING_REBALANCE
        synced = h.sync(member_id, 1, {member_id: b"p0-p5"})
        await h.settle()
        assert (synced.result.error_code, synced.result.assignment) == (ErrorCode.NONE, b"p0-p5")
        assert h.group.state == GroupState.STABLE
        assert h.beat(member_id, 1) == ErrorCode.NONE
        group = h.group
        assert h.coordinator.leave("g", [(member_id, None)]) == (ErrorCode.NONE, [ErrorCode.NONE])
        assert (group.state, group.generation_id, group.protocol_name) == (GroupState.EMPTY, 2, None)
        assert group.protocol_type == "consumer"  # kept while Empty, as Kafka does
        assert group.state_since_ms == h.wall_ms
        assert h.coordinator.delete("g") == ErrorCode.NONE
        assert group.state == GroupState.DEAD and "g" not in h.coordinator.groups

    run(scenario)


def test_a_member_that_stops_heartbeating_is_removed_after_its_session_timeout() -> None:
    async def scenario(h: Harness) -> None:
        a, b = await h.stable_group(2)
        for _ in range(3):  # a heartbeats every 3 s, b is silent
            await h.advance(3)
            assert h.beat(a.member_id, a.generation_id) == ErrorCode.NONE
        await h.advance(3)  # 12 s: b's 10 s session is over
        assert h.group.state == GroupState.PREPARING_REBALANCE and b.member_id not in h.group.members
        assert h.beat(a.member_id, a.generation_id) == ErrorCode.REBALANCE_IN_PROGRESS
        assert h.beat(b.member_id, b.generation_id) == ErrorCode.UNKNOWN_MEMBER_ID
        rejoined = h.join(a.member_id)
        await h.settle()  # the only member left rejoined: the next generation starts at once
        assert (rejoined.result.generation_id, h.group.state) == (a.generation_id + 1, GroupState.COMPLETING_REBALANCE)
        assert [m for m, _, _ in rejoined.result.members] == [a.member_id]

    run(scenario)


def test_a_dead_member_holds_a_rebalance_only_for_its_session_not_the_rebalance_timeout() -> None:
    async def scenario(h: Harness) -> None:
        a, b, c = await h.stable_group(3)
        # b closes (LeaveGroup) while c has crashed: the rebalance must not wait for c's rebalance timeout.
        assert h.coordinator.leave("g", [(b.member_id, None)]) == (ErrorCode.NONE, [ErrorCode.NONE])
        assert h.beat(a.member_id, a.generation_id) == ErrorCode.REBALANCE_IN_PROGRESS
        rejoin = h.join(a.member_id)
        await h.settle()
        await h.advance(SESSION_MS / 1000 - 0.5)
        assert not rejoin.done
        await h.advance(1)  # c's session is over, 20 s before the rebalance timeout
        assert [m for m, _, _ in rejoin.result.members] == [a.member_id]
        assert rejoin.result.generation_id == a.generation_id + 1

    run(scenario)


def test_members_parked_in_join_or_sync_do_not_expire_but_new_ones_eventually_do() -> None:
    async def scenario(h: Harness) -> None:
        (a,) = await h.stable_group(1)
        b = h.join()  # a new member: a rebalance waits for a to rejoin
        await h.settle()
        await h.advance(SESSION_MS / 1000 - 1)
        assert h.beat(a.member_id, a.generation_id) == ErrorCode.REBALANCE_IN_PROGRESS
        await h.advance(SESSION_MS / 1000 - 1)  # b has been parked longer than a session: it stays
        assert not b.done and len(h.group.members) == 2
        parked_a = h.join(a.member_id)
        await h.settle()
        assert b.result.generation_id == parked_a.result.generation_id == a.generation_id + 1
        # A follower parked in SyncGroup is not expired while the leader takes its time.
        follower = b.result.member_id if b.result.leader != b.result.member_id else a.member_id
        leader = h.group.leader_id
        waiting = h.sync(follower, b.result.generation_id)
        for _ in range(7):  # the leader takes 21 s to assign, heartbeating meanwhile
            await h.advance(3)
            assert h.beat(leader, b.result.generation_id) == ErrorCode.NONE
        assert not waiting.done and follower in h.group.members

    run(scenario)


def test_new_member_join_is_answered_after_the_new_member_timeout() -> None:
    async def scenario(h: Harness) -> None:
        (a,) = await h.stable_group(1, rebalance_ms=600_000)
        newcomer = h.join(rebalance_ms=600_000)
        await h.settle()
        for _ in range(NEW_MEMBER_JOIN_TIMEOUT_MS // 5000):  # a keeps its session alive, never rejoins
            await h.advance(5)
            h.beat(a.member_id, a.generation_id)
        assert newcomer.result == JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, "")
        assert len(h.group.members) == 1

    run(scenario)


def test_members_that_do_not_rejoin_within_the_rebalance_timeout_are_removed() -> None:
    async def scenario(h: Harness) -> None:
        leader, follower = await h.stable_group(2)
        assert h.group.leader_id == leader.member_id
        rejoin = h.join(leader.member_id)  # the leader rejoining forces a rebalance
        await h.settle()
        assert h.group.state == GroupState.PREPARING_REBALANCE
        for _ in range(5):  # the follower heartbeats (hearing REBALANCE_IN_PROGRESS) but never rejoins
            await h.advance(5)
            assert h.beat(follower.member_id, follower.generation_id) == ErrorCode.REBALANCE_IN_PROGRESS
        assert not rejoin.done
        await h.advance(REBALANCE_MS / 1000 - 25 + 0.001)
        assert rejoin.result.error_code == ErrorCode.NONE
        assert [m for m, _, _ in rejoin.result.members] == [leader.member_id]
        assert h.beat(follower.member_id, follower.generation_id) == ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_initial_rebalance_delay_lets_a_starting_group_settle_in_one_rebalance() -> None:
    async def scenario(h: Harness) -> None:
        tasks = [h.join()]
        await h.settle()
        assert h.group.state == GroupState.PREPARING_REBALANCE
        await h.advance(1)
        tasks.append(h.join())
        await h.settle()
        await h.advance(1.5)
        tasks.append(h.join())  # at 2.5 s: the delay window ending at 3 s is extended by another 3 s
        await h.settle()
        await h.advance(0.5)
        await h.advance(2.75)
        assert not any(t.done for t in tasks) and h.group.state == GroupState.PREPARING_REBALANCE
        await h.advance(0.25)
        results = [t.result for t in tasks]
        assert {r.generation_id for r in results} == {1}
        assert {r.leader for r in results} == {results[0].member_id}
        assert sorted(m for m, _, _ in results[0].members) == sorted(r.member_id for r in results)

    run(scenario, delay_ms=3000)


def test_initial_rebalance_delay_is_bounded_by_the_rebalance_timeout() -> None:
    async def scenario(h: Harness) -> None:
        tasks = [h.join(rebalance_ms=7000)]
        await h.settle()
        for second in range(1, 8):
            await h.advance(1)
            if second in (2, 4, 6):  # a new member every 2 s keeps extending the delay ...
                tasks.append(h.join(rebalance_ms=7000))
                await h.settle()
            if second < 7:
                assert not any(t.done for t in tasks)
        # ... but not past max(rebalance timeout, delay) = 7 s
        assert {t.result.generation_id for t in tasks} == {1} and len(h.group.members) == 4

    run(scenario, delay_ms=3000)


def test_rebalance_in_progress_for_heartbeat_sync_and_waiting_followers() -> None:
    async def scenario(h: Harness) -> None:
        a, b = await h.stable_group(2)
        h.join()  # a third member arrives
        await h.settle()
        assert h.beat(b.member_id, b.generation_id) == ErrorCode.REBALANCE_IN_PROGRESS
        stale_sync = h.sync(b.member_id, b.generation_id)
        await h.settle()
        assert stale_sync.result.error_code == ErrorCode.REBALANCE_IN_PROGRESS
        rejoins = [h.join(a.member_id), h.join(b.member_id)]
        await h.settle()
        generation = rejoins[0].result.generation_id
        follower = next(r.member_id for r in (t.result for t in rejoins) if r.member_id != h.group.leader_id)
        parked = h.sync(follower, generation)
        await h.settle()
        h.join()  # yet another member: the follower waiting for its assignment must rejoin
        await h.settle()
        assert parked.result.error_code == ErrorCode.REBALANCE_IN_PROGRESS
        assert h.group.state == GroupState.PREPARING_REBALANCE

    run(scenario)


def test_illegal_generation_and_unknown_member_id() -> None:
    async def scenario(h: Harness) -> None:
        (a,) = await h.stable_group(1)
        old = a.generation_id
        assert h.beat(a.member_id, old - 1) == ErrorCode.ILLEGAL_GENERATION
        stale = h.sync(a.member_id, old + 1)
        await h.settle()
        assert stale.result.error_code == ErrorCode.ILLEGAL_GENERATION
        assert h.beat("nobody", old) == ErrorCode.UNKNOWN_MEMBER_ID
        unknown = h.sync("nobody", old)
        rejoin_unknown = h.join("nobody")
        other_group = h.join("somebody", group="never-created")
        await h.settle()
        assert unknown.result.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        assert rejoin_unknown.result.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        assert other_group.result.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        assert "never-created" not in h.coordinator.groups  # a known member id does not create a group
        assert h.coordinator.heartbeat("never-created", 1, "x", None) == ErrorCode.UNKNOWN_MEMBER_ID
        assert h.coordinator.validate_offset_commit("g", a.member_id, None, old - 1, 8, False) == (
            ErrorCode.ILLEGAL_GENERATION
        )

    run(scenario)


def test_member_id_required_and_pending_members_hold_the_rebalance() -> None:
    async def scenario(h: Harness) -> None:
        (a,) = await h.stable_group(1)
        first = h.join(known_id_required=True)
        await h.settle()
        assert first.result.error_code == ErrorCode.MEMBER_ID_REQUIRED
        pending = first.result.member_id
        assert h.group.state == GroupState.STABLE  # handing out an id does not start a rebalance
        leader_rejoin = h.join(a.member_id)
        await h.settle()
        assert not leader_rejoin.done  # the rebalance waits for the member id it handed out
        second = h.join(pending, known_id_required=True)
        await h.settle()
        assert sorted(m for m, _, _ in leader_rejoin.result.members) == sorted([a.member_id, pending])
        assert second.result.generation_id == leader_rejoin.result.generation_id
        generation = second.result.generation_id
        h.sync(pending, generation)
        h.sync(a.member_id, generation, {})
        await h.settle()
        assert h.group.state == GroupState.STABLE

        # An id that is never used stops holding the rebalance after the session timeout.
        third = h.join(known_id_required=True)
        await h.settle()
        unused = third.result.member_id
        assert unused in h.group.pending_members
        again = [h.join(a.member_id)]  # the leader first: it starts the rebalance
        await h.settle()
        again.append(h.join(pending))
        await h.settle()
        assert not any(t.done for t in again)
        await h.advance(SESSION_MS / 1000)
        assert all(t.result.error_code == ErrorCode.NONE for t in again) and unused not in h.group.pending_members
        # Static members and JoinGroup v3 are never asked for an id first.
        static = h.join(instance="s1", known_id_required=True)
        await h.settle()
        assert not static.done and "s1" in h.group.static_members  # joined, waiting for the rebalance

    run(scenario)


def test_protocol_selection_votes_among_the_protocols_every_member_supports() -> None:
    async def scenario(h: Harness) -> None:
        both = [("range", b"r1"), ("roundrobin", b"o1")]
        tasks = [
            h.join(protocols=both),
            h.join(protocols=[("roundrobin", b"o2"), ("range", b"r2")]),
            h.join(protocols=[("sticky", b"s3"), ("roundrobin", b"o3")]),
        ]
        await h.finish_initial_rebalance()
        results = [t.result for t in tasks]
        assert {r.protocol_name for r in results} == {"roundrobin"}  # the only one all three support
        leader = next(r for r in results if r.members)
        assert sorted(md for _, _, md in leader.members) == [b"o1", b"o2", b"o3"]

    run(scenario, delay_ms=500)


def test_protocol_selection_prefers_what_most_members_prefer() -> None:
    async def scenario(h: Harness) -> None:
        tasks = [
            h.join(protocols=[("cooperative-sticky", b"c"), ("range", b"r")]),
            h.join(protocols=[("cooperative-sticky", b"c"), ("range", b"r")]),
            h.join(protocols=[("range", b"r"), ("cooperative-sticky", b"c")]),
        ]
        await h.finish_initial_rebalance()
        assert {t.result.protocol_name for t in tasks} == {"cooperative-sticky"}

    run(scenario, delay_ms=500)


def test_inconsistent_group_protocol() -> None:
    async def scenario(h: Harness) -> None:
        await h.stable_group(1)
        wrong_type = h.join(protocol_type="connect", protocols=[("range", b"")])
        no_common = h.join(protocols=[("roundrobin", b"")])
        empty_type = h.join(group="fresh", protocol_type="")
        no_protocols = h.join(group="fresh2", protocols=[])
        await h.settle()
        for task in (wrong_type, no_common, empty_type, no_protocols):
            assert task.result.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert len(h.group.members) == 1 and h.group.state == GroupState.STABLE

    run(scenario)


def test_sync_group_v5_checks_protocol_type_and_name() -> None:
    async def scenario(h: Harness) -> None:
        (a,) = await h.stable_group(1)
        checks = {
            "type": h.sync(a.member_id, a.generation_id, protocol_type="connect"),
            "name": h.sync(a.member_id, a.generation_id, protocol_type="consumer", protocol_name="roundrobin"),
            "match": h.sync(a.member_id, a.generation_id, protocol_type="consumer", protocol_name="range"),
        }
        await h.settle()
        assert checks["type"].result.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert checks["name"].result.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        assert (checks["match"].result.error_code, checks["match"].result.assignment) == (ErrorCode.NONE, b"a0")
        assert (checks["match"].result.protocol_type, checks["match"].result.protocol_name) == ("consumer", "range")

    run(scenario)


def test_leader_sync_hands_every_member_its_share_and_missing_ones_get_nothing() -> None:
    async def scenario(h: Harness) -> None:
        tasks = [h.join() for _ in range(3)]
        await h.finish_initial_rebalance()
        generation = tasks[0].result.generation_id
        leader = h.group.leader_id
        others = [t.result.member_id for t in tasks if t.result.member_id != leader]
        parked = [h.sync(m, generation) for m in others]
        await h.settle()
        done = h.sync(leader, generation, {leader: b"L", others[0]: b"F"})
        await h.settle()
        assert done.result.assignment == b"L"
        assert [p.result.assignment for p in parked] == [b"F", b""]
        assert h.group.state == GroupState.STABLE and not h.group.pending_sync

    run(scenario, delay_ms=500)


def test_join_during_completing_rebalance_with_same_metadata_returns_the_current_generation() -> None:
    async def scenario(h: Harness) -> None:
        tasks = [h.join() for _ in range(2)]
        await h.finish_initial_rebalance()
        generation = tasks[0].result.generation_id
        for task in tasks:  # both lost their JoinGroup response and ask again
            again = h.join(task.result.member_id)
            await h.settle()
            assert again.result == task.result
        assert h.group.state == GroupState.COMPLETING_REBALANCE and h.group.generation_id == generation

    run(scenario, delay_ms=500)


def test_the_same_join_sent_twice_gets_both_answers() -> None:
    async def scenario(h: Harness) -> None:
        a, b = await h.stable_group(2)
        first, retry = (
            h.join(b.member_id, protocols=[("range", b"new")]),
            h.join(b.member_id, protocols=[("range", b"new")]),
        )
        await h.settle()
        h.join(a.member_id)
        await h.settle()
        assert first.result == retry.result and first.result.error_code == ErrorCode.NONE

    run(scenario)


def test_members_that_never_sync_are_removed_after_the_rebalance_timeout() -> None:
    async def scenario(h: Harness) -> None:
        tasks = [h.join(rebalance_ms=20_000) for _ in range(2)]
        await h.finish_initial_rebalance()
        generation = tasks[0].result.generation_id
        leader = h.group.leader_id
        silent = next(t.result.member_id for t in tasks if t.result.member_id != leader)
        h.sync(leader, generation, {leader: b"L", silent: b"S"})
        await h.settle()
        for _ in range(3):  # both heartbeat, but one never sends SyncGroup
            await h.advance(5)
            assert h.beat(leader, generation) == ErrorCode.NONE
            assert h.beat(silent, generation) == ErrorCode.NONE
        await h.advance(5.5)
        assert silent not in h.group.members and h.group.state == GroupState.PREPARING_REBALANCE

    run(scenario, delay_ms=500)


# --- static membership (KIP-345, KIP-814) ----------------------------------------------------------------


def test_static_member_returns_without_a_rebalance_and_fences_its_old_incarnation() -> None:
    async def scenario(h: Harness) -> None:
        a, b = await h.stable_group(2, instance=None)
        s = h.join(instance="static-1")
        await h.settle()
        rejoins = [h.join(a.member_id), h.join(b.member_id)]
        await h.settle()
        generation = s.result.generation_id
        leader = h.group.leader_id
        old_id = s.result.member_id
        followers = [m for m in h.group.members if m != leader]
        parked = {m: h.sync(m, generation, instance="static-1" if m == old_id else None) for m in followers}
        await h.settle()
        h.sync(leader, generation, {m: m.encode() for m in h.group.members}, instance=None)
        await h.settle()
        assert parked[old_id].result.assignment == old_id.encode()
        assert all(r.result.error_code == ErrorCode.NONE for r in rejoins)

        # The process restarts: same instance id, no member id. No rebalance, same generation.
        back = h.join(instance="static-1")
        await h.settle()
        new_id = back.result.member_id
        assert new_id != old_id and new_id.startswith("static-1-")
        assert (back.result.error_code, back.result.generation_id) == (ErrorCode.NONE, generation)
        assert back.result.members == [] and h.group.state == GroupState.STABLE
        synced = h.sync(new_id, generation, instance="static-1")
        await h.settle()
        assert synced.result.assignment == old_id.encode()  # its partitions back

        # The old incarnation is fenced everywhere it shows its instance id.
        assert h.beat(old_id, generation, "static-1") == ErrorCode.FENCED_INSTANCE_ID
        old_join = h.join(old_id, instance="static-1")
        old_sync = h.sync(old_id, generation, instance="static-1")
        await h.settle()
        assert old_join.result.error_code == ErrorCode.FENCED_INSTANCE_ID
        assert old_sync.result.error_code == ErrorCode.FENCED_INSTANCE_ID
        assert h.coordinator.validate_offset_commit("g", old_id, "static-1", generation, 8, True) == (
            ErrorCode.FENCED_INSTANCE_ID
        )
        assert h.coordinator.leave("g", [(old_id, "static-1")]) == (ErrorCode.NONE, [ErrorCode.FENCED_INSTANCE_ID])
        # Without the instance id the old member id is simply unknown.
        assert h.beat(old_id, generation) == ErrorCode.UNKNOWN_MEMBER_ID
        assert h.beat(new_id, generation, "other-instance") == ErrorCode.UNKNOWN_MEMBER_ID

    run(scenario)


def test_a_parked_old_incarnation_is_fenced_when_the_new_one_joins() -> None:
    async def scenario(h: Harness) -> None:
        await h.stable_group(1, instance="s")
        old_id = h.group.static_members["s"]
        h.join(known_id_required=True)  # a member id handed out holds the next rebalance open ...
        await h.settle()
        parked = h.join(old_id, instance="s")  # ... which the old incarnation starts and waits in
        await h.settle()
        assert not parked.done
        h.join(instance="s")  # and then the restarted process shows up
        await h.settle()
        assert parked.result.error_code == ErrorCode.FENCED_INSTANCE_ID

    run(scenario)


def test_static_leader_rejoin_with_join_group_v9_skips_assignment() -> None:
    async def scenario(h: Harness) -> None:
        tasks = [h.join(instance="leader")]
        await h.settle()
        tasks.append(h.join(instance="follower"))
        await h.finish_initial_rebalance()
        generation = h.group.generation_id
        leader_old = h.group.leader_id
        assert leader_old == h.group.static_members["leader"]
        follower_id = h.group.static_members["follower"]
        h.sync(follower_id, generation, instance="follower")
        h.sync(leader_old, generation, {leader_old: b"L", follower_id: b"F"}, instance="leader")
        await h.settle()
        assert all(t.done for t in tasks) and h.group.state == GroupState.STABLE

        v9 = h.join(instance="leader", v9=True)
        await h.settle()
        new_leader = v9.result.member_id
        assert (v9.result.leader, v9.result.skip_assignment) == (new_leader, True)
        assert sorted(i for _, i, _ in v9.result.members) == ["follower", "leader"]
        assert h.group.generation_id == generation and h.group.state == GroupState.STABLE

        old = h.join(instance="leader", v9=False)  # an older client: told the previous leader id
        await h.settle()
        assert (old.result.leader, old.result.skip_assignment, old.result.members) == (new_leader, False, [])
        assert old.result.member_id != new_leader and h.group.leader_id == old.result.member_id

    run(scenario, delay_ms=500)


def test_static_members_keep_their_place_when_they_miss_a_rebalance() -> None:
    async def scenario(h: Harness) -> None:
        tasks = [h.join(instance="s1"), h.join(instance="s2"), h.join()]
        await h.finish_initial_rebalance()
        generation = tasks[0].result.generation_id
        dynamic = tasks[2].result.member_id
        static_ids = [t.result.member_id for t in tasks[:2]]
        for m in h.group.members:
            if m != h.group.leader_id:
                h.sync(m, generation, instance={static_ids[0]: "s1", static_ids[1]: "s2"}.get(m))
        h.sync(
            h.group.leader_id,
            generation,
            {},
            instance={static_ids[0]: "s1", static_ids[1]: "s2"}.get(h.group.leader_id),
        )
        await h.settle()
        assert h.group.state == GroupState.STABLE
        # Only the dynamic member rejoins (with new metadata); the static ones heartbeat but do not.
        rejoin = h.join(dynamic, protocols=[("range", b"changed")])
        await h.settle()
        for _ in range(5):
            await h.advance(5)
            for m, instance in zip(static_ids, ["s1", "s2"], strict=True):
                assert h.beat(m, generation, instance) == ErrorCode.REBALANCE_IN_PROGRESS
        await h.advance(REBALANCE_MS / 1000 - 25)
        result = rejoin.result
        assert result.leader == dynamic  # the old leader did not rejoin: a member that did leads
        assert sorted(m for m, _, _ in result.members) == sorted([dynamic, *static_ids])

    run(scenario, delay_ms=500)


# --- leaving ------------------------------------------------------------------------------------------


def test_leave_group_with_a_batch_of_members() -> None:
    async def scenario(h: Harness) -> None:
        tasks = [h.join(), h.join(), h.join(instance="static")]
        await h.finish_initial_rebalance()
        a, b, s = (t.result.member_id for t in tasks)
        pending = h.join(known_id_required=True)
        await h.settle()
        code, codes = h.coordinator.leave(
            "g",
            [
                (a, None),
                ("", "static"),  # an administrator removing a static member by instance id
                ("ghost", None),
                (b, "not-its-instance"),
                ("", "unknown-instance"),
                (pending.result.member_id, None),
            ],
        )
        assert code == ErrorCode.NONE
        assert codes == [
            ErrorCode.NONE,
            ErrorCode.NONE,
            ErrorCode.UNKNOWN_MEMBER_ID,
            ErrorCode.UNKNOWN_MEMBER_ID,
            ErrorCode.UNKNOWN_MEMBER_ID,
            ErrorCode.NONE,
        ]
        assert list(h.group.members) == [b] and not h.group.pending_members and "static" not in h.group.static_members
        assert h.group.state == GroupState.PREPARING_REBALANCE
        assert h.coordinator.leave("unknown-group", [(a, None), (b, None)]) == (
            ErrorCode.NONE,
            [ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.UNKNOWN_MEMBER_ID],
        )
        assert "unknown-group" not in h.coordinator.groups

    run(scenario, delay_ms=500)


def test_last_member_leaving_empties_the_group_and_parked_requests_are_answered() -> None:
    async def scenario(h: Harness) -> None:
        a, b = await h.stable_group(2)
        parked = h.join(a.member_id)  # a forces a rebalance and waits for b ...
        await h.settle()
        assert h.coordinator.leave("g", [(a.member_id, None)]) == (ErrorCode.NONE, [ErrorCode.NONE])
        await h.settle()
        assert parked.result == JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, "")  # ... then leaves instead
        assert h.coordinator.leave("g", [(b.member_id, None)]) == (ErrorCode.NONE, [ErrorCode.NONE])
        assert h.group.state == GroupState.EMPTY and h.group.generation_id == a.generation_id + 1

    run(scenario)


# --- size limit, shutdown -------------------------------------------------------------------------------


def test_group_max_size() -> None:
    async def scenario(h: Harness) -> None:
        a, b = await h.stable_group(2)
        third = h.join()
        await h.settle()
        assert third.result == JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, "")
        assert h.group.state == GroupState.STABLE and len(h.group.members) == 2
        rejoin = h.join(b.member_id, protocols=[("range", b"changed")])  # members already in are fine
        await h.settle()
        assert h.group.state == GroupState.PREPARING_REBALANCE and not rejoin.done

    run(scenario, max_size=2)


def test_shutdown_answers_parked_requests_with_not_coordinator() -> None:
    async def scenario(h: Harness) -> None:
        a, b = await h.stable_group(2)
        parked = h.join(a.member_id)
        await h.settle()
        h.coordinator.wake_all()
        await h.settle()
        assert parked.result.error_code == ErrorCode.NOT_COORDINATOR

    run(scenario)


# --- offsets --------------------------------------------------------------------------------------------


def test_offset_commit_checks_generation_member_and_state() -> None:
    async def scenario(h: Harness) -> None:
        check = h.coordinator.validate_offset_commit
        # No group at all: a "simple" consumer may commit with generation -1.
        assert check("simple", "", None, -1, 8, False) == ErrorCode.NONE
        assert check("simple", "m", None, 3, 8, False) == ErrorCode.ILLEGAL_GENERATION
        assert check("simple", "m", None, 3, 9, False) == ErrorCode.GROUP_ID_NOT_FOUND
        # A group known only by its offsets (e.g. after a restart) is empty: only generation -1.
        assert check("stored", "", None, -1, 8, True) == ErrorCode.NONE
        assert check("stored", "old-member", None, 5, 8, True) == ErrorCode.UNKNOWN_MEMBER_ID

        a, b = await h.stable_group(2)
        gen = a.generation_id
        assert check("g", a.member_id, None, gen, 8, True) == ErrorCode.NONE
        assert check("g", a.member_id, None, gen + 1, 8, True) == ErrorCode.ILLEGAL_GENERATION
        assert check("g", "stranger", None, gen, 8, True) == ErrorCode.UNKNOWN_MEMBER_ID
        assert check("g", "", None, -1, 8, True) == ErrorCode.UNKNOWN_MEMBER_ID  # not while it has members
        h.join()  # PreparingRebalance: members of the current generation may still commit
        await h.settle()
        assert check("g", a.member_id, None, gen, 8, True) == ErrorCode.NONE
        rejoins = [h.join(a.member_id), h.join(b.member_id)]
        await h.settle()
        new_gen = rejoins[0].result.generation_id
        assert h.group.state == GroupState.COMPLETING_REBALANCE
        assert check("g", a.member_id, None, new_gen, 8, True) == ErrorCode.REBALANCE_IN_PROGRESS
        assert check("g", a.member_id, None, gen, 8, True) == ErrorCode.ILLEGAL_GENERATION

    run(scenario)


def test_offsets_of_an_empty_group_age_from_when_it_became_empty(tmp_path: Path) -> None:
    day_ms = 86_400_000
    retention_ms = 7 * day_ms

    async def scenario(h: Harness) -> None:
        store = OffsetStore.in_data_dir(tmp_path, partitions=3)
        (a,) = await h.stable_group(1)
        store.commit("g", {("orders", 0): CommittedOffset(42, -1, None, h.wall_ms)})
        store.commit("simple", {("orders", 0): CommittedOffset(7, -1, None, h.wall_ms)})
        store.commit("g", {("orders", 1): CommittedOffset(9, -1, None, h.wall_ms, h.wall_ms + day_ms)})  # v2-4
        # Ten days pass with the member still there, then it leaves.
        for _ in range(10 * 24):
            h.now += 3600
            h.wall_ms += 3600_000
            h.beat(a.member_id, a.generation_id)
        h.coordinator.leave("g", [(a.member_id, None)])
        now = h.wall_ms
        base = h.coordinator.offset_expiry_base_ms
        assert store.expire("g", now - retention_ms, now, base("g")) == 1  # only the explicit-retention one
        assert set(store.get("g")) == {("orders", 0)}
        # A simple group (no members ever) ages from its commits; one unknown since start-up from start-up.
        h.coordinator.groups.pop("simple", None)
        assert base("simple") == WALL_START_MS
        assert store.expire("simple", now - retention_ms, now, base("simple")) == 1
        later = now + retention_ms + 1
        assert store.expire("g", later - retention_ms, later, base("g")) == 1 and not store.has_group("g")
        store.close()

    run(scenario)


def test_the_periodic_clean_up_forgets_empty_groups_without_offsets() -> None:
    async def scenario(h: Harness) -> None:
        (a,) = await h.stable_group(1)
        for group in ("left-with-offsets", "left-without"):
            joined = h.join(group=group)
            await h.settle()
            h.coordinator.leave(group, [(joined.result.member_id, None)])
        forgotten = h.coordinator.forget_empty_groups(keep=lambda group_id: group_id == "left-with-offsets")
        assert forgotten == ["left-without"]
        assert sorted(h.coordinator.groups) == ["g", "left-with-offsets"]  # "g" still has a member

    run(scenario)
