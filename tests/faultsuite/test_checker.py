"""The fault suite's checker (tools/faultsuite/checker.py) on histories written by hand: a clean one passes, and
each anomaly planted in it is reported, exactly, under its own name and nowhere else."""

from __future__ import annotations

import io
from typing import Any

from tools.faultsuite.checker import ANOMALIES, Report, check
from tools.faultsuite.history import FAIL, INFO, NEMESIS, OK, History, Op, pairs, read_history, write_history


class Script:
    """A history written step by step; each step is one operation, invoked and completed at once."""

    def __init__(self) -> None:
        self.history = History()

    def send(self, process: str, sends: list[tuple[int, int]], offsets: list[int | None] | None, **extra: Any) -> Op:
        commit_at = extra.pop("commit_at", None)
        outcome = extra.pop("outcome", OK if offsets is not None else INFO)
        invoked = self.history.invoke(process, "send", [list(s) for s in sends], **extra)
        value = None
        if offsets is not None:
            value = [[p, v, o] for (p, v), o in zip(sends, offsets, strict=True)]
        more = {} if commit_at is None else {"commit_at": commit_at}
        return self.history.complete(invoked, outcome, value, **more)

    def poll(self, process: str, records: dict[int, list[tuple[int, int]]], **extra: Any) -> Op:
        invoked = self.history.invoke(process, "poll", **extra)
        return self.history.complete(invoked, OK, {str(p): [list(r) for r in rs] for p, rs in records.items()})

    def simple(self, process: str, f: str, value: Any, result: Any = None, outcome: str = OK, **extra: Any) -> Op:
        invoked = self.history.invoke(process, f, value, **extra)
        return self.history.complete(invoked, outcome, result)

    def check(self) -> Report:
        return check(self.history.ops)


def clean() -> Script:
    """Two producers, a transactional one, a consumer that reads everything twice over a rebalance, commits."""
    s = Script()
    s.send("p1", [(0, 1), (0, 2)], [0, 1])
    s.send("p2", [(1, 10)], [0])
    t = s.history.now()
    s.send("t1", [(0, 100), (1, 101)], [2, 1], txn=True, commit_at=t)
    s.send("t1", [(0, 102)], None, txn=True, outcome=FAIL)  # aborted: offset 4 (3 is the commit marker)
    s.send("p1", [(0, 3)], [6])  # 5: the abort marker
    s.simple("c1", "assign", [0, 1])
    s.poll("c1", {0: [(0, 1), (1, 2)], 1: [(0, 10)]}, isolation="read_committed")
    s.poll("c1", {0: [(2, 100), (6, 3)], 1: [(1, 101)]}, isolation="read_committed")
    s.simple("c1", "commit", {"0": 7, "1": 2}, group="g")
    s.simple("c1", "committed", None, {"0": 7, "1": 2}, group="g")
    s.simple("c1", "rebalance", [0, 1])
    s.poll("c1", {0: [(6, 3)]}, isolation="read_committed")  # re-read after a rebalance: allowed
    s.simple("u1", "assign", [0])
    s.poll("u1", {0: [(0, 1), (1, 2), (2, 100), (4, 102), (6, 3)]}, isolation="read_uncommitted", final=True)
    return s


def cases(report: Report) -> dict[str, int]:
    return {name: len(found) for name, found in report.anomalies.items() if found}


def test_a_clean_history_passes() -> None:
    report = clean().check()
    assert report.valid, report.anomalies
    assert report.summary() == "no anomalies"
    assert report.stats["acknowledged"] == 6
    assert report.stats["failed"] == 1
    assert report.stats["distinct_read_values"] == 7


def test_two_values_at_one_offset() -> None:
    s = clean()
    s.simple("c2", "assign", [1])
    s.poll("c2", {1: [(0, 11)]})
    report = s.check()
    assert report.anomalies["inconsistent_offsets"] == [{"partition": 1, "offset": 0, "values": [10, 11]}]
    assert set(cases(report)) <= {"inconsistent_offsets", "duplicates"}


def test_one_value_at_two_offsets() -> None:
    s = clean()
    s.simple("c2", "assign", [0])
    s.poll("c2", {0: [(6, 3), (7, 3)]})
    report = s.check()
    assert report.anomalies["duplicates"] == [{"value": 3, "at": [(0, 6), (0, 7)]}]
    assert cases(report) == {"duplicates": 1}


def test_an_acknowledged_write_never_read_below_what_was_read() -> None:
    s = Script()
    s.send("p1", [(0, 1)], [0])
    s.send("p1", [(0, 2)], [1])
    s.send("p1", [(0, 3)], [2])
    s.simple("c1", "assign", [0])
    s.poll("c1", {0: [(0, 1), (2, 3)]})  # 1 is acknowledged at offset 1 and gone: also a skip
    report = s.check()
    assert report.anomalies["lost_writes"] == [
        {"partition": 0, "value": 2, "offset": 1, "highest_read": 2, "read_before_the_end": False, "send": 2}
    ]
    assert cases(report) == {"lost_writes": 1, "poll_skips": 1}


def test_the_final_read_must_return_every_acknowledged_write() -> None:
    s = Script()
    s.send("p1", [(0, 1)], [0])
    s.send("p1", [(0, 2)], [None])  # acknowledged, offset not told
    s.simple("c1", "assign", [0])
    s.poll("c1", {0: [(0, 1)]})
    assert s.check().valid  # not read, but nothing shows it should have been
    s.poll("c1", {0: []}, final=True)
    s.simple("c9", "assign", [0])
    s.poll("c9", {0: [(0, 1)]}, final=True)
    report = s.check()
    assert [case["value"] for case in report.anomalies["lost_writes"]] == [2]


def test_an_unacknowledged_write_may_be_missing_or_present() -> None:
    s = Script()
    s.send("p1", [(0, 1)], None)  # timed out: info
    s.send("p1", [(0, 2)], [1])
    s.simple("c1", "assign", [0])
    s.poll("c1", {0: [(1, 2)]}, final=True)
    assert s.check().valid
    s.poll("c1", {0: [(2, 1)]})  # ... written after all (a retry), later: fine too
    assert s.check().valid


def test_an_aborted_transaction_read_committed() -> None:
    s = clean()
    s.simple("c2", "assign", [0])
    s.poll("c2", {0: [(2, 100), (4, 102)]}, isolation="read_committed")
    report = s.check()
    assert [(case["value"], case["offset"]) for case in report.anomalies["aborted_reads"]] == [(102, 4)]
    assert cases(report) == {"aborted_reads": 1}


def test_a_failed_plain_send_read_by_anyone() -> None:
    s = clean()
    s.send("p1", [(1, 50)], None, outcome=FAIL)
    s.simple("c2", "assign", [1])
    s.poll("c2", {1: [(3, 50)]}, isolation="read_uncommitted")
    report = s.check()
    assert [case["value"] for case in report.anomalies["aborted_reads"]] == [50]


def test_a_transaction_read_before_its_commit_was_asked_for() -> None:
    s = Script()
    s.simple("c1", "assign", [0])
    s.send("p1", [(0, 1)], [0])
    early = s.poll("c1", {0: [(0, 1), (1, 7)]}, isolation="read_committed")
    s.send("t1", [(0, 7)], [1], txn=True, commit_at=early.time + 0.5)
    report = s.check()
    assert [(case["value"], case["commit_at"]) for case in report.anomalies["uncommitted_reads"]] == [
        (7, early.time + 0.5)
    ]
    assert cases(report) == {"uncommitted_reads": 1}


def test_a_transaction_that_never_asked_to_commit_is_not_readable_committed() -> None:
    s = Script()
    s.send("t1", [(0, 7)], None, txn=True)  # unknown end, no commit asked for
    s.simple("c1", "assign", [0])
    s.poll("c1", {0: [(0, 7)]}, isolation="read_committed")
    assert cases(s.check()) == {"uncommitted_reads": 1}
    s2 = Script()
    s2.send("t1", [(0, 7)], None, txn=True)
    s2.simple("c1", "assign", [0])
    s2.poll("c1", {0: [(0, 7)]}, isolation="read_uncommitted")
    assert s2.check().valid


def test_a_poll_that_goes_back_without_a_rebalance() -> None:
    s = clean()
    before = [op for op in s.history.ops if op.process == "c1" and op.f == "poll" and op.type == OK][-1]
    again = s.poll("c1", {0: [(6, 3)]})  # right after reading 6 again: back, with no new assignment
    report = s.check()
    assert report.anomalies["nonmonotonic_polls"] == [
        {"process": "c1", "partition": 0, "from": 6, "to": 6, "polls": [before.index, again.index]}
    ]
    assert cases(report) == {"nonmonotonic_polls": 1}


def test_a_poll_that_skips_a_committed_value() -> None:
    s = clean()
    s.simple("c3", "assign", [0])
    s.poll("c3", {0: [(0, 1)]}, isolation="read_committed")
    s.poll("c3", {0: [(6, 3)]}, isolation="read_committed")  # skipped 1 (value 2) and 2 (committed 100)
    report = s.check()
    assert [case["skipped"] for case in report.anomalies["poll_skips"]] == [[1, 2]]


def test_read_committed_passes_an_aborted_value_and_read_uncommitted_does_not() -> None:
    s = clean()
    s.simple("c3", "assign", [0])
    s.poll("c3", {0: [(2, 100)]}, isolation="read_committed")
    s.poll("c3", {0: [(6, 3)]}, isolation="read_committed")  # 4 holds the aborted 102: not to be read
    assert s.check().valid
    s.simple("u3", "assign", [0])
    s.poll("u3", {0: [(2, 100)]}, isolation="read_uncommitted")
    s.poll("u3", {0: [(6, 3)]}, isolation="read_uncommitted")
    assert [case["skipped"] for case in s.check().anomalies["poll_skips"]] == [[4]]


def test_a_producer_whose_offsets_go_back() -> None:
    s = Script()
    s.send("p1", [(0, 1)], [5])
    s.send("p1", [(0, 2)], [3])
    s.send("p2", [(0, 3)], [4])  # another producer: its own order
    report = s.check()
    assert report.anomalies["nonmonotonic_sends"] == [
        {"process": "p1", "partition": 0, "from": 5, "to": 3, "sends": [0, 2]}
    ]


def test_a_committed_offset_that_goes_back() -> None:
    s = clean()
    s.simple("c1", "commit", {"0": 9}, group="g")
    s.simple("c9", "committed", None, {"0": 7, "1": 2}, group="g")
    s.simple("c9", "committed", None, {"0": 9}, group="other")  # another group: its own offsets
    report = s.check()
    assert [(case["read"], case["acknowledged"]) for case in report.anomalies["committed_regressions"]] == [(7, 9)]
    assert cases(report) == {"committed_regressions": 1}


def test_a_commit_not_acknowledged_may_be_lost() -> None:
    s = clean()
    s.simple("c1", "commit", {"0": 9}, outcome=INFO, group="g")
    s.simple("c9", "committed", None, {"0": 7}, group="g")
    assert s.check().valid


def test_availability_around_each_fault() -> None:
    s = Script()
    s.send("p1", [(0, 1)], [0])
    kill = s.history.invoke(NEMESIS, "start", fault="kill-leader")
    s.send("p1", [(0, 2)], None)
    s.send("p1", [(0, 3)], [2])
    s.history.complete(kill, OK)
    report = s.check()
    fault = report.stats["faults"]["kill-leader"]
    assert (fault["count"], fault["operations"], fault["succeeded"], fault["availability"]) == (1, 2, 1, 0.5)
    acknowledged_at = s.history.ops[-2].time
    assert fault["longest_gap_s"] == round(acknowledged_at - kill.time, 3)


def test_every_anomaly_name_is_reported() -> None:
    assert set(clean().check().anomalies) == set(ANOMALIES)


def test_a_history_round_trips_through_its_file(tmp_path: Any) -> None:
    s = clean()
    path = tmp_path / "history.jsonl"
    write_history(path, s.history.ops)
    again = read_history(path)
    assert again == s.history.ops
    assert check(again).anomalies == s.check().anomalies


def test_a_history_streams_each_line_as_it_is_written() -> None:
    out = io.StringIO()
    history = History(out)
    invoked = history.invoke("p1", "send", [[0, 1]], txn=False)
    history.complete(invoked, OK, [[0, 1, 0]])
    assert [Op.from_json(line) for line in out.getvalue().splitlines()] == history.ops


def test_an_operation_never_completed_pairs_with_none() -> None:
    history = History()
    first = history.invoke("p1", "send", [[0, 1]])
    second = history.invoke("p1", "send", [[0, 2]])  # the process gave up on the first
    done = history.complete(second, OK, [[0, 2, 0]])
    assert list(pairs(history.ops)) == [(first, None), (second, done)]


def test_a_later_commit_of_a_lower_offset_explains_a_lower_read() -> None:
    s = clean()
    late = s.history.invoke("c2", "commit", {"0": 5}, group="g")  # a member that lost partition 0 commits it once more
    s.simple("c1", "commit", {"0": 9}, group="g")
    s.history.complete(late, OK)
    s.simple("c9", "committed", None, {"0": 5}, group="g")
    assert s.check().valid
    s.simple("c9", "committed", None, {"0": 7}, group="g")  # 7 was committed before 9 began: a regression
    assert [(case["read"], case["acknowledged"]) for case in s.check().anomalies["committed_regressions"]] == [(7, 9)]


def test_a_poll_marked_reset_may_read_again() -> None:
    s = clean()
    s.poll("c1", {0: [(0, 1), (1, 2)]}, isolation="read_committed")
    assert cases(s.check()) == {"nonmonotonic_polls": 1}
    s2 = clean()
    invoked = s2.history.invoke("c1", "poll", isolation="read_committed")
    s2.history.complete(invoked, OK, {"0": [[0, 1], [1, 2]]}, reset=True)
    assert s2.check().valid


def test_a_value_read_once_and_gone_from_the_final_read_is_lost() -> None:
    s = Script()
    s.send("p1", [(0, 1)], [0])
    s.send("p1", [(1, 2)], [0])
    s.simple("c1", "assign", [0, 1])
    s.poll("c1", {0: [(0, 1)], 1: [(0, 2)]})  # both read from a leader that acknowledged them alone
    s.simple("final", "assign", [0, 1])
    s.poll("final", {0: [(0, 1)]}, final=True)  # partition 1's new leader has nothing: value 2 is gone
    report = s.check()
    assert [(case["value"], case["read_before_the_end"]) for case in report.anomalies["lost_writes"]] == [(2, True)]
    assert cases(report) == {"lost_writes": 1}
