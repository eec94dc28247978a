"""Offset translation: which target offset a source offset became, and consumer-group checkpoints (MirrorMaker 2's
KIP-382/KIP-545 design).

Offsets differ between the clusters (a restart after a crash copies some records twice, transaction markers
take offsets on either side), so the mirror records *offset syncs* as it copies. A sync here is a run: source
offsets ``upstream .. upstream + count - 1`` went, one for one, to target offsets ``downstream .. downstream +
count - 1``. Each produced batch yields one sync per unbroken run (usually one per partition per batch).

The record layout is MirrorMaker 2's OffsetSync (key: topic as int16-length UTF-8 and partition as int32; value:
upstream and downstream offsets as int64) followed by the run length (int32), so a reader of MM2's format sees the
first record of each run.

Translating a committed source offset ``c`` (the next record the group will read) is conservative, as MM2's
OffsetSyncStore: no record after ``c`` may be skipped in the target.

- ``c`` inside a run, or just after its last record: exact, ``downstream + (c - upstream)``.
- otherwise, the run with the greatest ``upstream <= c``: the offset after its last record (every source record
  after that run was copied later, so to a higher target offset). Records may be read twice, never lost.
- no run at or before ``c``: not translatable (nothing is known about where those records went).

Among equal ``upstream`` values the latest sync wins: after a restart that copied records again, a group resumes
at the newer copy and reads fewer duplicates.

Checkpoints (the translated offsets) go to ``<alias>.checkpoints.internal`` in MM2's Checkpoint format: key
``group, topic, partition`` (strings as int16-length UTF-8, partition int32; the topic is the target's name),
value ``version`` int16 0, ``upstreamOffset`` int64, ``offset`` int64, ``metadata`` string.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field

# Per partition, the runs kept for translation; the oldest go first (a group that far behind resumes earlier).
MAX_SYNCS_PER_PARTITION = 10_000


@dataclass(frozen=True)
class OffsetSync:
    topic: str  # the source topic
    partition: int
    upstream: int  # first source offset of the run
    downstream: int  # the target offset it went to
    count: int  # records in the run, offsets consecutive on both sides

    def key(self) -> bytes:
        return _string(self.topic) + struct.pack(">i", self.partition)

    def value(self) -> bytes:
        return struct.pack(">qqi", self.upstream, self.downstream, self.count)

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> OffsetSync:
        topic, position = _read_string(key, 0)
        (partition,) = struct.unpack_from(">i", key, position)
        upstream, downstream = struct.unpack_from(">qq", value, 0)
        count = struct.unpack_from(">i", value, 16)[0] if len(value) >= 20 else 1  # MM2's own syncs: one record
        return cls(topic, partition, upstream, downstream, count)


def runs(topic: str, partition: int, pairs: list[tuple[int, int]]) -> list[OffsetSync]:
    """The unbroken runs of ``(source offset, target offset)`` pairs, in order."""
    syncs: list[OffsetSync] = []
    start: tuple[int, int] | None = None
    count = 0
    for upstream, downstream in pairs:
        if start is not None and upstream == start[0] + count and downstream == start[1] + count:
            count += 1
            continue
        if start is not None:
            syncs.append(OffsetSync(topic, partition, start[0], start[1], count))
        start, count = (upstream, downstream), 1
    if start is not None:
        syncs.append(OffsetSync(topic, partition, start[0], start[1], count))
    return syncs


@dataclass
class OffsetSyncStore:
    """The syncs of every partition, sorted by upstream offset (the later of two equal ones kept last)."""

    syncs: dict[tuple[str, int], list[OffsetSync]] = field(default_factory=dict)

    def add(self, sync: OffsetSync) -> None:
        partition_syncs = self.syncs.setdefault((sync.topic, sync.partition), [])
        # after equal upstreams: the newest of equals is found first by translate's right-bisect
        index = bisect.bisect_right([s.upstream for s in partition_syncs], sync.upstream)
        partition_syncs.insert(index, sync)
        if len(partition_syncs) > MAX_SYNCS_PER_PARTITION:
            del partition_syncs[0]

    def translate(self, topic: str, partition: int, committed: int) -> int | None:
        """The target offset a group that committed ``committed`` in the source resumes at (None: unknown)."""
        partition_syncs = self.syncs.get((topic, partition), [])
        index = bisect.bisect_right([s.upstream for s in partition_syncs], committed)
        if index == 0:
            return None
        best = partition_syncs[index - 1]
        # a later sync with a smaller upstream may still cover `committed` exactly (runs copied again after a
        # restart start below older ones): prefer an exact answer, the newest first
        for sync in reversed(partition_syncs[:index]):
            if committed <= sync.upstream + sync.count:
                return sync.downstream + (committed - sync.upstream)
        return best.downstream + best.count


@dataclass(frozen=True)
class Checkpoint:
    group: str
    topic: str  # the target topic
    partition: int
    upstream: int
    downstream: int
    metadata: str = ""

    def key(self) -> bytes:
        return _string(self.group) + _string(self.topic) + struct.pack(">i", self.partition)

    def value(self) -> bytes:
        return struct.pack(">hqq", 0, self.upstream, self.downstream) + _string(self.metadata)

    @classmethod
    def decode(cls, key: bytes, value: bytes) -> Checkpoint:
        group, position = _read_string(key, 0)
        topic, position = _read_string(key, position)
        (partition,) = struct.unpack_from(">i", key, position)
        _version, upstream, downstream = struct.unpack_from(">hqq", value, 0)
        metadata, _ = _read_string(value, 18)
        return cls(group, topic, partition, upstream, downstream, metadata)


def _string(text: str) -> bytes:
    encoded = text.encode()
    return struct.pack(">h", len(encoded)) + encoded


def _read_string(data: bytes, position: int) -> tuple[str, int]:
    (length,) = struct.unpack_from(">h", data, position)
    start = position + 2
    return data[start : start + length].decode(), start + length
