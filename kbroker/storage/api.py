"""Partition events: what a partition log tells those waiting for its offsets to move (long-polling fetches).

This module imports nothing from the engine, so anything may import ``PartitionEvent`` from here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class PartitionEvent(enum.Flag):
    """What changed in a partition; a listener gets the flags of one change together."""

    APPENDED = enum.auto()  # the log end offset moved forward
    HIGH_WATERMARK = enum.auto()  # the high watermark moved forward
    STABLE_OFFSET = enum.auto()  # the last stable offset moved forward


# Every combination of the flags, made once: ``|`` or a call on a Flag runs Python code (a microsecond or two),
# and every append sends an event. ``PARTITION_EVENTS[bits]`` is the event of those bits.
PARTITION_EVENTS = tuple(PartitionEvent(bits) for bits in range(1 << len(PartitionEvent)))


PartitionEventListener = Callable[[PartitionEvent], None]
