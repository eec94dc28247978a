"""One timer service for every coordinator: the classic and consumer group coordinators and the transaction
coordinator register with CoordinatorTimers instead of each running its own loop. (Kafka's CoordinatorRuntime,
which writes coordinator records to their partitions, is kbroker/coordinators/runtime.py.)

A coordinator is anything with ``next_deadline(now)`` (the earliest moment one of its timers is due: a session
expiry, a rebalance or revocation timeout, the end of an initial rebalance delay; None if it has none) and
``tick(now)`` (fire every timer that is due at ``now``). The runtime sleeps until the earliest deadline any
coordinator reports and ticks the coordinators that are due. Timers fire at their deadline, not on a fixed
period, and an idle broker does not wake up at all.

Deadlines only move later on their own (a heartbeat pushes a session further out), so the runtime reads them
again only when it wakes. When a coordinator sets a deadline that may be earlier than the one the runtime is
sleeping towards (a new member, a rebalance starting), it calls ``wake(at=deadline)``; waking is a comparison and
costs nothing when the runtime already plans to wake by then. Time is trio's clock (``trio.current_time``), the
coordinators' default clock.
"""

from __future__ import annotations

import logging
import math
from typing import Protocol

import trio

log = logging.getLogger("kbroker.groups")

# A coordinator whose tick failed, or left a timer due, is ticked again after this long instead of at once, so
# that a bug cannot spin the event loop. It is the period the coordinators used to tick at.
RETRY_SECONDS = 0.05


class TimedCoordinator(Protocol):
    """What the runtime needs of a coordinator: when its next timer is due, and firing the due ones."""

    def next_deadline(self, now: float) -> float | None: ...

    def tick(self, now: float) -> None: ...


class CoordinatorTimers:
    """The coordinators' timer service: ``run`` ticks each registered coordinator when its deadline comes."""

    def __init__(self) -> None:
        self._coordinators: list[TimedCoordinator] = []
        self._failing: set[tuple[int, str]] = set()  # (coordinator id, method) whose last call raised
        self._woken = trio.Event()
        # When the running loop plans to look at the deadlines next: -inf while it is reading them (a wake
        # request then changes nothing), +inf while it waits for work or before it runs.
        self._planned_wake = math.inf

    def register(self, coordinator: TimedCoordinator) -> None:
        self._coordinators.append(coordinator)
        self.wake()  # it may already have timers

    def wake(self, at: float | None = None) -> None:
        """Make sure the coordinators are ticked no later than ``at`` (trio time), or look at them now."""
        when = -math.inf if at is None else at
        if when < self._planned_wake:
            self._planned_wake = when
            self._woken.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick the coordinators at their deadlines until cancelled."""
        task_status.started()
        while True:
            self._planned_wake = -math.inf
            wake_at = self._tick_due(trio.current_time())
            self._woken = trio.Event()
            self._planned_wake = wake_at
            with trio.move_on_at(wake_at):
                await self._woken.wait()

    def _tick_due(self, now: float) -> float:
        """Tick every coordinator that is due at ``now``; returns when to look again (inf: when woken)."""
        ticked: set[int] = set()
        for coordinator in list(self._coordinators):
            deadline = self._deadline_of(coordinator, now)
            if deadline is not None and deadline <= now:
                ticked.add(id(coordinator))
                try:
                    coordinator.tick(now)
                except Exception:
                    self._failed(coordinator, "tick")
                    continue
                self._failing.discard((id(coordinator), "tick"))
        # Read every deadline after all the ticks: one coordinator's tick may give another a timer.
        wake_at = math.inf
        for coordinator in self._coordinators:
            deadline = self._deadline_of(coordinator, now)
            if deadline is None:
                continue
            if deadline <= now and id(coordinator) in ticked:
                deadline = now + RETRY_SECONDS  # its tick did not move it on: do not spin
            wake_at = min(wake_at, deadline)
        return wake_at

    def _deadline_of(self, coordinator: TimedCoordinator, now: float) -> float | None:
        try:
            deadline = coordinator.next_deadline(now)
        except Exception:
            self._failed(coordinator, "next_deadline")
            return now + RETRY_SECONDS  # ask again soon; its timers wait meanwhile
        self._failing.discard((id(coordinator), "next_deadline"))
        return deadline

    def _failed(self, coordinator: TimedCoordinator, what: str) -> None:
        """Log a coordinator's exception with its traceback once, not every RETRY_SECONDS while it persists."""
        name = type(coordinator).__name__
        if (id(coordinator), what) in self._failing:
            log.debug("%s: %s failed again", name, what, exc_info=True)
        else:
            self._failing.add((id(coordinator), what))
            log.exception("%s: %s failed; the runtime keeps running and tries again", name, what)
