"""kbroker.groups.timers: one timer service ticks every registered coordinator at its next deadline.

Each test runs under trio's MockClock with autojump, so time is virtual: a tick recorded at 1.5 happened when
trio's clock read exactly 1.5, and nothing waits in real time. The deadlines used are exact binary fractions,
so the clock lands on them exactly.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from kbroker.groups.assignors import TopicMetadata
from kbroker.groups.consumer_group import ConsumerGroupCoordinator, MemberHeartbeat
from kbroker.groups.coordinator import GroupCoordinator, GroupState, JoinResult
from kbroker.groups.timers import RETRY_SECONDS, CoordinatorTimers
from protocol.errors import ErrorCode


class ScriptedCoordinator:
    """A coordinator whose timers are a list of deadlines; each tick fires (and forgets) the due ones."""

    def __init__(self, *deadlines: float, failures: int = 0) -> None:
        self.deadlines = sorted(deadlines)
        self.ticks: list[float] = []  # the trio time of every tick call
        self.failures = failures  # how many ticks raise before ticks work

    def next_deadline(self, now: float) -> float | None:
        return self.deadlines[0] if self.deadlines else None

    def tick(self, now: float) -> None:
        self.ticks.append(trio.current_time())
        assert now == trio.current_time()
        if self.failures:
            self.failures -= 1
            raise RuntimeError("a bug in a coordinator")
        self.deadlines = [deadline for deadline in self.deadlines if deadline > now]


def run_virtual(test: Callable[[trio.Nursery, CoordinatorTimers], Awaitable[None]]) -> None:
    """Run ``test`` with a started runtime under a virtual clock; the runtime is cancelled afterwards."""

    async def main() -> None:
        runtime = CoordinatorTimers()
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            await test(nursery, runtime)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_each_coordinator_is_ticked_exactly_at_its_own_deadlines() -> None:
    first = ScriptedCoordinator(1.5, 4.0, 4.0)
    second = ScriptedCoordinator(2.25)

    async def test(nursery: trio.Nursery, runtime: CoordinatorTimers) -> None:
        runtime.register(first)
        runtime.register(second)
        await trio.sleep_until(1000.0)  # long after the last deadline: nothing else fires

    run_virtual(test)
    assert first.ticks == [1.5, 4.0]  # both timers due at 4.0 fire in one tick
    assert second.ticks == [2.25]


def test_an_idle_runtime_sleeps_until_a_coordinator_wakes_it() -> None:
    work = ScriptedCoordinator()

    async def test(nursery: trio.Nursery, runtime: CoordinatorTimers) -> None:
        runtime.register(work)
        await trio.sleep_until(10.0)
        assert work.ticks == []  # no deadline: never ticked, however long
        # Work arrives: a timer at 12.5, and the coordinator asks the runtime to wake by then.
        work.deadlines = [12.5]
        runtime.wake(at=12.5)
        await trio.sleep_until(20.0)

    run_virtual(test)
    assert work.ticks == [12.5]


def test_a_deadline_earlier_than_the_planned_wake_up_is_honoured_when_the_coordinator_wakes_the_runtime() -> None:
    work = ScriptedCoordinator(100.0)

    async def test(nursery: trio.Nursery, runtime: CoordinatorTimers) -> None:
        runtime.register(work)
        await trio.sleep_until(1.0)  # the runtime now sleeps towards 100
        work.deadlines = [3.5, 100.0]
        runtime.wake(at=3.5)
        runtime.wake(at=50.0)  # later than planned: changes nothing
        await trio.sleep_until(200.0)

    run_virtual(test)
    assert work.ticks == [3.5, 100.0]


def test_wake_without_a_time_makes_the_runtime_read_the_deadlines_at_once() -> None:
    work = ScriptedCoordinator()

    async def test(nursery: trio.Nursery, runtime: CoordinatorTimers) -> None:
        runtime.register(work)
        await trio.sleep_until(5.0)
        work.deadlines = [2.0]  # already past: due now
        runtime.wake()
        await trio.testing.wait_all_tasks_blocked()
        assert work.ticks == [5.0]

    run_virtual(test)


def test_a_failing_tick_is_logged_once_retried_and_does_not_stop_the_other_coordinators(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = ScriptedCoordinator(0.5, failures=3)
    healthy = ScriptedCoordinator(1.0, 2.0)

    async def test(nursery: trio.Nursery, runtime: CoordinatorTimers) -> None:
        runtime.register(broken)
        runtime.register(healthy)
        await trio.sleep_until(10.0)

    with caplog.at_level(logging.DEBUG, logger="kbroker.groups"):
        run_virtual(test)
    # Three failures, then a tick that works; each retry RETRY_SECONDS after the previous attempt.
    assert broken.ticks == pytest.approx([0.5 + n * RETRY_SECONDS for n in range(4)])
    assert broken.deadlines == []
    assert healthy.ticks == [1.0, 2.0]
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "ScriptedCoordinator: tick failed" in errors[0].getMessage() and errors[0].exc_info is not None
    assert sum(1 for record in caplog.records if "failed again" in record.getMessage()) == 2


def test_a_failing_next_deadline_is_asked_again_and_does_not_stop_the_runtime(caplog: pytest.LogCaptureFixture) -> None:
    class Flaky(ScriptedCoordinator):
        def __init__(self) -> None:
            super().__init__(0.25)
            self.broken = True

        def next_deadline(self, now: float) -> float | None:
            if self.broken:
                raise ValueError("cannot tell")
            return super().next_deadline(now)

    flaky = Flaky()
    healthy = ScriptedCoordinator(1.0)

    async def test(nursery: trio.Nursery, runtime: CoordinatorTimers) -> None:
        runtime.register(flaky)
        runtime.register(healthy)
        await trio.sleep_until(0.5)
        flaky.broken = False  # its overdue timer fires at the next retry
        await trio.sleep_until(10.0)

    with caplog.at_level(logging.ERROR, logger="kbroker.groups"):
        run_virtual(test)
    assert len(flaky.ticks) == 1 and 0.5 < flaky.ticks[0] <= 0.5 + RETRY_SECONDS
    assert healthy.ticks == [1.0]
    assert [record.getMessage() for record in caplog.records] == [
        "Flaky: next_deadline failed; the runtime keeps running and tries again"
    ]


def test_cancelling_the_runtime_ends_it_while_it_waits_for_a_deadline_or_for_work() -> None:
    async def main() -> None:
        for timers_in in ((), (5.0,)):  # waiting for work; waiting for a deadline 5 s ahead
            runtime = CoordinatorTimers()
            work = ScriptedCoordinator(*(trio.current_time() + seconds for seconds in timers_in))
            runtime.register(work)
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(runtime.run)
                    await trio.sleep(1.0)
                    scope.cancel()
            assert scope.cancelled_caught
            assert work.ticks == []
            await trio.sleep(10.0)  # nothing is left running that could tick it
            assert work.ticks == []

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# --- the group coordinators on the runtime ---------------------------------------------------------------


def test_a_classic_member_that_stops_heartbeating_expires_exactly_at_its_session_timeout() -> None:
    async def test(nursery: trio.Nursery, runtime: CoordinatorTimers) -> None:
        coordinator = GroupCoordinator(
            min_session_timeout_ms=1000, max_session_timeout_ms=60_000, initial_rebalance_delay_ms=0, runtime=runtime
        )
        joined: list[JoinResult] = []

        async def join() -> None:
            joined.append(
                await coordinator.join(
                    "g", "", None, "client", "/127.0.0.1", 10_000, 30_000, "consumer", [("range", b"")],
                    require_known_member_id=False,
                )
            )  # fmt: skip

        nursery.start_soon(join)
        await trio.testing.wait_all_tasks_blocked()
        (result,) = joined
        assert (result.error_code, result.generation_id) == (ErrorCode.NONE, 1)
        await trio.sleep_until(2.0)
        sync = await coordinator.sync("g", 1, result.member_id, None, None, None, {result.member_id: b"a"})
        assert sync.error_code == ErrorCode.NONE and coordinator.groups["g"].state == GroupState.STABLE
        await trio.sleep_until(11.75)
        assert coordinator.heartbeat("g", 1, result.member_id, None) == ErrorCode.NONE  # session: until 21.75
        await trio.sleep_until(21.5)
        assert list(coordinator.groups["g"].members) == [result.member_id]
        await trio.sleep_until(21.75)
        await trio.testing.wait_all_tasks_blocked()
        assert coordinator.groups["g"].members == {}
        assert coordinator.groups["g"].state == GroupState.EMPTY

    run_virtual(test)


def test_the_initial_rebalance_delay_ends_exactly_on_time() -> None:
    async def test(nursery: trio.Nursery, runtime: CoordinatorTimers) -> None:
        coordinator = GroupCoordinator(
            min_session_timeout_ms=1000, max_session_timeout_ms=60_000, initial_rebalance_delay_ms=3000, runtime=runtime
        )
        finished_at: list[float] = []

        async def join() -> None:
            result = await coordinator.join(
                "g", "", None, "client", "/127.0.0.1", 10_000, 30_000, "consumer", [("range", b"")],
                require_known_member_id=False,
            )  # fmt: skip
            assert result.error_code == ErrorCode.NONE
            finished_at.append(trio.current_time())

        await trio.sleep_until(0.5)
        nursery.start_soon(join)
        await trio.sleep_until(100.0)
        assert finished_at == [3.5]

    run_virtual(test)


def test_consumer_group_members_are_fenced_exactly_at_their_session_and_revocation_deadlines() -> None:
    topic = TopicMetadata(uuid.UUID(int=1), "orders", 2)

    async def test(nursery: trio.Nursery, runtime: CoordinatorTimers) -> None:
        coordinator = ConsumerGroupCoordinator(
            topics=lambda: [topic],
            session_timeout_ms=45_000,
            heartbeat_interval_ms=5000,
            max_size=10,
            assignors=["range"],
            runtime=runtime,
        )

        def beat(member_id: str, epoch: int, owned: list[int]) -> int:
            result = coordinator.heartbeat(
                MemberHeartbeat(
                    version=1,
                    group_id="g",
                    member_id=member_id,
                    member_epoch=epoch,
                    rebalance_timeout_ms=2000 if epoch == 0 else -1,
                    subscribed_topic_names=["orders"] if epoch == 0 else None,
                    owned=[(topic.topic_id, owned)] if owned else [],
                )
            )
            assert result.error_code == ErrorCode.NONE
            return result.member_epoch

        await trio.sleep_until(1.0)
        assert beat("m1", 0, []) == 1  # m1 owns both partitions; its session ends at 46
        await trio.sleep_until(10.0)
        assert beat("m2", 0, []) == 2  # m1 must give partition 1 up, within 2 s of its next heartbeat
        await trio.sleep_until(10.5)
        assert beat("m1", 1, [0, 1]) == 1  # still holds partition 1: unrevoked
        await trio.sleep_until(12.25)
        group = coordinator.groups["g"]
        assert set(group.members) == {"m1", "m2"}
        await trio.sleep_until(12.5)
        await trio.testing.wait_all_tasks_blocked()
        assert set(group.members) == {"m2"}  # fenced at 10.5 + 2 s, not at its session's end
        await trio.sleep_until(54.75)
        assert set(group.members) == {"m2"}
        await trio.sleep_until(55.0)  # m2's session: 10 + 45 s
        await trio.testing.wait_all_tasks_blocked()
        assert group.members == {}

    run_virtual(test)


def test_a_member_answered_after_its_session_ran_out_while_it_waited_in_sync_group_expires_at_once() -> None:
    """A member parked in SyncGroup cannot heartbeat, so its session does not count; once answered it does."""

    async def test(nursery: trio.Nursery, runtime: CoordinatorTimers) -> None:
        coordinator = GroupCoordinator(
            min_session_timeout_ms=1000, max_session_timeout_ms=60_000, initial_rebalance_delay_ms=1000, runtime=runtime
        )
        joined: list[JoinResult] = []

        async def join() -> None:
            joined.append(
                await coordinator.join(
                    "g", "", None, "client", "/127.0.0.1", 10_000, 30_000, "consumer", [("range", b"")],
                    require_known_member_id=False,
                )
            )  # fmt: skip

        nursery.start_soon(join)
        nursery.start_soon(join)
        await trio.sleep_until(2.5)  # the initial delay ends at 2, extended once for the second member
        leader, follower = sorted(joined, key=lambda result: result.member_id != result.leader)
        assert (leader.generation_id, follower.generation_id) == (1, 1)
        answered: list[ErrorCode] = []

        async def follower_sync() -> None:
            result = await coordinator.sync("g", 1, follower.member_id, None, None, None, {})
            answered.append(result.error_code)

        nursery.start_soon(follower_sync)  # parked: the leader does not send its assignment
        await trio.sleep_until(11.0)
        assert coordinator.heartbeat("g", 1, leader.member_id, None) == ErrorCode.NONE  # leader's session: 21
        await trio.sleep_until(15.0)
        assert list(coordinator.groups["g"].members) == [leader.member_id, follower.member_id]
        coordinator.leave("g", [(leader.member_id, None)])  # answers the follower: rebalance
        await trio.testing.wait_all_tasks_blocked()
        assert answered == [ErrorCode.REBALANCE_IN_PROGRESS]
        assert trio.current_time() == 15.0
        assert coordinator.groups["g"].members == {}  # its session ended at 12, while it could not heartbeat

    run_virtual(test)
