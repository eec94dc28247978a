"""The fault suite's checker: what a history (tools/faultsuite/history.py) shows the cluster did wrong.

The analyses follow Jepsen's Kafka test (its ``jepsen.tests.kafka``), over one topic whose partitions are the
keys. Each (partition, offset) should hold one value; the values a partition was seen to hold at their offsets
are its *version order*. A send is *acknowledged* when its completion is ``ok`` (for a transactional send: the
transaction committed). The anomalies, each a list of cases in the report:

- ``inconsistent_offsets``: one (partition, offset) seen holding two values (by sends' acknowledgements or polls).
- ``duplicates``: one value at two offsets (the producers are idempotent and every value is sent once).
- ``lost_writes``: an acknowledged value never read though a poll read its partition at or past its offset; and,
  when the history ends with a final read of every partition (polls marked ``final``), any acknowledged value
  that read did not return, even one read earlier (it was there, and is gone).
- ``aborted_reads``: a value whose send certainly failed, read by anyone; or a value of an aborted transaction
  read at read_committed.
- ``uncommitted_reads``: a read_committed poll that returned a transactional value before its producer had asked
  to commit it (or of a transaction that never asked to).
- ``nonmonotonic_polls`` / ``poll_skips``: a consumer's next poll of a partition, with no assignment change
  between (an ``assign`` or ``rebalance`` operation, or a poll marked ``reset``),
  starting at or before where its last poll ended, or past a value it should have read (a value of a
  non-transactional send or a committed transaction; for read_uncommitted, of an aborted one as well). Within
  one poll likewise.
- ``nonmonotonic_sends``: a producer's acknowledged offsets in one partition going backwards from one send to
  the next (its sends are one after another).
- ``committed_regressions``: a read of a group's committed offset lower than an acknowledged commit that
  completed before the read began, and that no commit of the offset read could have overwritten.

``stats`` counts what the history holds and how available the cluster was around each fault: the share of
client operations begun while the fault was on that succeeded, and the longest time without an acknowledged
send that began while it was on.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from tools.faultsuite.history import FAIL, INFO, INVOKE, NEMESIS, OK, Op, pairs

READ_COMMITTED = "read_committed"
Cases = list[dict[str, Any]]  # one anomaly's cases, each a small JSON-able dict
ANOMALIES = (
    "inconsistent_offsets",
    "duplicates",
    "lost_writes",
    "aborted_reads",
    "uncommitted_reads",
    "nonmonotonic_polls",
    "poll_skips",
    "nonmonotonic_sends",
    "committed_regressions",
)


class Write(NamedTuple):
    """One value a send carried, and what became of it."""

    partition: int
    value: int
    offset: int | None  # the acknowledged offset (None: not acknowledged, or not told)
    outcome: str  # ok, fail or info (info also for a send that never completed)
    transactional: bool
    commit_at: float | None  # when its transaction's commit was asked for
    op: int  # the index of the send's invoke


class Read(NamedTuple):
    """One record a poll returned."""

    partition: int
    offset: int
    value: int
    process: str
    isolation: str
    at: float  # when the poll completed
    op: int  # the index of the poll's completion
    final: bool


class Report(NamedTuple):
    anomalies: dict[str, Cases]
    stats: dict[str, Any]

    @property
    def valid(self) -> bool:
        return not any(self.anomalies.values())

    def summary(self) -> str:
        found = [f"{name}: {len(cases)}" for name, cases in self.anomalies.items() if cases]
        return "no anomalies" if not found else "; ".join(found)


def check(ops: Sequence[Op]) -> Report:
    writes = _writes(ops)
    reads = _reads(ops)
    anomalies: dict[str, Cases] = {name: [] for name in ANOMALIES}
    order = _version_order(writes, reads, anomalies["inconsistent_offsets"])
    by_value = {write.value: write for write in writes}
    anomalies["duplicates"] = _duplicates(writes, reads)
    anomalies["lost_writes"] = _lost_writes(writes, reads, ops)
    anomalies["aborted_reads"], anomalies["uncommitted_reads"] = _dirty_reads(reads, by_value)
    anomalies["nonmonotonic_polls"], anomalies["poll_skips"] = _poll_order(ops, order, by_value)
    anomalies["nonmonotonic_sends"] = _send_order(ops)
    anomalies["committed_regressions"] = _committed_regressions(ops)
    return Report(anomalies, _stats(ops, writes, reads))


def _writes(ops: Sequence[Op]) -> list[Write]:
    writes: list[Write] = []
    for invoked, completed in pairs(ops):
        if invoked.f != "send":
            continue
        outcome = INFO if completed is None else completed.type
        offsets: dict[int, int] = {}
        if completed is not None and outcome == OK:
            offsets = {value: offset for _, value, offset in completed.value or () if offset is not None}
        commit_at = None if completed is None else completed.get("commit_at")
        for partition, value in invoked.value:
            writes.append(
                Write(
                    partition,
                    value,
                    offsets.get(value),
                    outcome,
                    bool(invoked.get("txn", False)),
                    commit_at,
                    invoked.index,
                )
            )
    return writes


def _reads(ops: Sequence[Op]) -> list[Read]:
    reads: list[Read] = []
    for op in ops:
        if op.f != "poll" or op.type != OK or not op.value:
            continue
        isolation = op.get("isolation", READ_COMMITTED)
        final = bool(op.get("final", False))
        for partition, records in op.value.items():
            for offset, value in records:
                reads.append(Read(int(partition), offset, value, op.process, isolation, op.time, op.index, final))
    return reads


def _version_order(writes: Iterable[Write], reads: Iterable[Read], inconsistent: Cases) -> dict[int, dict[int, int]]:
    """partition -> offset -> value, as acknowledgements and polls saw them; a second value is a case."""
    order: dict[int, dict[int, int]] = defaultdict(dict)
    reported: set[tuple[int, int]] = set()
    seen = [(w.partition, w.offset, w.value) for w in writes if w.offset is not None and w.outcome == OK]
    seen += [(r.partition, r.offset, r.value) for r in reads]
    for partition, offset, value in seen:
        assert offset is not None
        held = order[partition].setdefault(offset, value)
        if held != value and (partition, offset) not in reported:
            reported.add((partition, offset))
            values = sorted({v for p, o, v in seen if p == partition and o == offset})
            inconsistent.append({"partition": partition, "offset": offset, "values": values})
    return order


def _duplicates(writes: Iterable[Write], reads: Iterable[Read]) -> Cases:
    places: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for write in writes:
        if write.offset is not None and write.outcome == OK:
            places[write.value].add((write.partition, write.offset))
    for read in reads:
        places[read.value].add((read.partition, read.offset))
    return [{"value": value, "at": sorted(where)} for value, where in sorted(places.items()) if len(where) > 1]


def _lost_writes(writes: Iterable[Write], reads: Sequence[Read], ops: Sequence[Op]) -> Cases:
    """Acknowledged values missing: never read though a poll passed their offset, or absent from the final read
    of their partition (a value read earlier and gone by the end is lost too)."""
    read_values = {read.value for read in reads}
    final_values = {read.value for read in reads if read.final}
    highest_read: dict[int, int] = {}
    for read in reads:
        highest_read[read.partition] = max(read.offset, highest_read.get(read.partition, -1))
    final_readers = {read.process for read in reads if read.final}
    final_partitions = {
        int(partition)
        for op in ops
        if op.f == "assign" and op.type == INVOKE and op.process in final_readers
        for partition in op.value or ()
    }
    final_partitions |= {read.partition for read in reads if read.final}
    lost = []
    for write in writes:
        if write.outcome != OK:
            continue
        passed = write.offset is not None and write.offset <= highest_read.get(write.partition, -1)
        missing = write.partition in final_partitions and write.value not in final_values
        if missing or (passed and write.value not in read_values):
            lost.append(
                {
                    "partition": write.partition,
                    "value": write.value,
                    "offset": write.offset,
                    "highest_read": highest_read.get(write.partition),
                    "read_before_the_end": write.value in read_values,
                    "send": write.op,
                }
            )
    return lost


def _dirty_reads(reads: Iterable[Read], by_value: dict[int, Write]) -> tuple[Cases, Cases]:
    aborted: Cases = []
    uncommitted: Cases = []
    for read in reads:
        write = by_value.get(read.value)
        if write is None:
            continue
        case = {"partition": read.partition, "offset": read.offset, "value": read.value, "poll": read.op}
        if write.outcome == FAIL and (not write.transactional or read.isolation == READ_COMMITTED):
            aborted.append({**case, "send": write.op})
        elif write.transactional and read.isolation == READ_COMMITTED and write.outcome != FAIL:
            if write.commit_at is None and write.outcome == OK:
                continue  # a committed transaction whose writer did not say when (not a case to judge)
            if write.commit_at is None or read.at < write.commit_at:
                uncommitted.append({**case, "send": write.op, "read_at": read.at, "commit_at": write.commit_at})
    return aborted, uncommitted


def _visible(write: Write | None, isolation: str) -> bool:
    """Whether a consumer at ``isolation`` must read this value when it passes its offset."""
    if write is None or not write.transactional:
        return True  # a plain send (or a value seen only by a poll): in the log, so visible
    if write.outcome == OK:
        return True
    return write.outcome == FAIL and isolation != READ_COMMITTED


def _poll_order(ops: Sequence[Op], order: dict[int, dict[int, int]], by_value: dict[int, Write]) -> tuple[Cases, Cases]:
    nonmonotonic: Cases = []
    skips: Cases = []
    sorted_offsets = {partition: sorted(offsets) for partition, offsets in order.items()}
    last: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)  # process -> partition -> (offset, poll)

    def skipped(partition: int, after: int, before: int, isolation: str) -> list[int]:
        offsets = sorted_offsets.get(partition, [])
        between = offsets[bisect_right(offsets, after) : bisect_left(offsets, before)]
        return [offset for offset in between if _visible(by_value.get(order[partition][offset]), isolation)]

    for op in ops:
        if op.type != OK or op.process == NEMESIS:
            continue
        if op.f in ("assign", "rebalance"):
            last[op.process] = {}
            continue
        if op.f != "poll" or not op.value:
            continue
        isolation = op.get("isolation", READ_COMMITTED)
        if op.get("reset"):  # a group member whose assignment changed: it may read again from committed offsets
            last[op.process] = {}
        for key, records in op.value.items():
            partition = int(key)
            previous = last[op.process].get(partition)
            for offset, _ in records:
                if previous is not None:
                    before, poll = previous
                    case = {"process": op.process, "partition": partition, "from": before, "to": offset}
                    if offset <= before:
                        nonmonotonic.append({**case, "polls": [poll, op.index]})
                    elif missed := skipped(partition, before, offset, isolation):
                        skips.append({**case, "skipped": missed, "polls": [poll, op.index]})
                previous = (offset, op.index)
            if previous is not None:
                last[op.process][partition] = previous
    return nonmonotonic, skips


def _send_order(ops: Sequence[Op]) -> Cases:
    cases: Cases = []
    last: dict[tuple[str, int], tuple[int, int]] = {}  # (process, partition) -> (offset, send)
    for invoked, completed in pairs(ops):
        if invoked.f != "send" or completed is None or completed.type != OK:
            continue
        for partition, _, offset in completed.value or ():
            if offset is None:
                continue
            previous = last.get((invoked.process, partition))
            if previous is not None and offset <= previous[0]:
                cases.append(
                    {
                        "process": invoked.process,
                        "partition": partition,
                        "from": previous[0],
                        "to": offset,
                        "sends": [previous[1], invoked.index],
                    }
                )
            last[(invoked.process, partition)] = (offset, invoked.index)
    return cases


class Commit(NamedTuple):
    """One commit of one partition's offset for a group."""

    group: str
    partition: int
    offset: int
    invoked_at: float
    completed_at: float | None  # None: never answered
    outcome: str
    op: int


def _committed_regressions(ops: Sequence[Op]) -> Cases:
    """A read of committed offsets lower than a commit acknowledged before the read began, unless a commit of
    that very offset could have come after it (the last commit wins: a member that lost a partition in a
    rebalance may still commit it once more)."""
    commits: list[Commit] = []
    fetched: list[tuple[float, float, str, dict[str, int], int]] = []  # (invoked, completed, group, offsets, op)
    for invoked, completed in pairs(ops):
        group = str(invoked.get("group", ""))
        if invoked.f == "commit" and (completed is None or completed.type != FAIL):
            done = None if completed is None else completed.time
            outcome = INFO if completed is None else completed.type
            for key, offset in invoked.value.items():
                commits.append(Commit(group, int(key), offset, invoked.time, done, outcome, invoked.index))
        elif invoked.f == "committed" and completed is not None and completed.type == OK:
            fetched.append((invoked.time, completed.time, group, completed.value or {}, invoked.index))
    by_key: dict[tuple[str, int], list[Commit]] = defaultdict(list)
    for commit in commits:
        by_key[(commit.group, commit.partition)].append(commit)
    cases: Cases = []
    for began, ended, group, offsets, read in fetched:
        for key, offset in offsets.items():
            history = by_key.get((group, int(key)), [])
            acknowledged = [
                c for c in history if c.outcome == OK and c.completed_at is not None and c.completed_at < began
            ]
            if not acknowledged:
                continue
            highest = max(acknowledged, key=lambda c: c.offset)
            if offset >= highest.offset:
                continue
            explained = any(
                c.offset == offset
                and c.invoked_at < ended
                and (c.completed_at is None or c.completed_at > highest.invoked_at)
                for c in history
            )
            if not explained:
                cases.append(
                    {
                        "group": group,
                        "partition": int(key),
                        "read": offset,
                        "acknowledged": highest.offset,
                        "ops": [highest.op, read],
                    }
                )
    return cases


def _stats(ops: Sequence[Op], writes: Sequence[Write], reads: Sequence[Read]) -> dict[str, Any]:
    outcomes: dict[str, int] = defaultdict(int)
    for write in writes:
        outcomes[write.outcome] += 1
    client = [(i, c) for i, c in pairs(ops) if i.process != NEMESIS]
    acknowledged_at = sorted(c.time for i, c in client if i.f == "send" and c is not None and c.type == OK)
    faults: dict[str, dict[str, Any]] = {}
    for start, stop in pairs(op for op in ops if op.process == NEMESIS):
        name = str(start.get("fault", start.f))
        begin, end = start.time, (stop.time if stop is not None else ops[-1].time if ops else start.time)
        during = [(i, c) for i, c in client if begin <= i.time <= end]
        succeeded = sum(1 for _, c in during if c is not None and c.type == OK)
        entry = faults.setdefault(name, {"count": 0, "operations": 0, "succeeded": 0, "longest_gap_s": 0.0})
        entry["count"] += 1
        entry["operations"] += len(during)
        entry["succeeded"] += succeeded
        entry["longest_gap_s"] = max(entry["longest_gap_s"], _longest_gap(acknowledged_at, begin, end))
    for entry in faults.values():
        entry["availability"] = round(entry["succeeded"] / entry["operations"], 4) if entry["operations"] else None
        entry["longest_gap_s"] = round(entry["longest_gap_s"], 3)
    return {
        "operations": len(client),
        "sent_values": len(writes),
        "acknowledged": outcomes[OK],
        "failed": outcomes[FAIL],
        "unknown": outcomes[INFO],
        "read_records": len(reads),
        "distinct_read_values": len({read.value for read in reads}),
        "faults": faults,
    }


def _longest_gap(times: Sequence[float], begin: float, end: float) -> float:
    """The longest wait from an instant in [begin, end] to the next acknowledged send (to the end if none)."""
    longest = 0.0
    previous = begin
    for at in times:
        if at < begin:
            continue
        longest = max(longest, at - previous)
        previous = at
        if at > end:
            break
    else:
        longest = max(longest, end - previous)
    return longest
