"""Handlers whose work grows with an array in the request take turns with the other connections.

A Fetch may name 300,000 partitions and a Metadata request 100,000 topics; a few microseconds each is a second
or more in which the event loop serves no one else. Such a handler counts its items with a ``Turns`` and lets
the other tasks run (a trio checkpoint) after every ``per_turn`` of them: a few milliseconds of work at a time.
A request with fewer items never yields, and counting costs one integer decrement per item.

Between turns other requests run, so what a handler reads of the broker's state may move on between two turns,
as between two partitions of Kafka's own fetch: each item is answered from the state it was read in.
"""

from __future__ import annotations

import trio

ITEMS_PER_TURN = 1000  # a few microseconds each: a few milliseconds per turn


class Turns:
    """Counts items of work; ``await step()`` after each lets other tasks run once a turn's worth is done."""

    __slots__ = ("_left", "_per_turn", "taken")

    def __init__(self, per_turn: int = ITEMS_PER_TURN) -> None:
        self._per_turn = per_turn
        self._left = per_turn
        self.taken = 0  # times other tasks were let run (for tests and diagnostics)

    async def step(self, items: int = 1) -> None:
        self._left -= items
        if self._left <= 0:
            self._left = self._per_turn
            self.taken += 1
            await trio.lowlevel.checkpoint()
