"""One short seeded schedule of the fault suite (tools/faultsuite) on a 3-broker kbroker cluster under Apache
Kafka's KRaft controller: faults injected, clients acknowledged and read records, and the checker finds nothing.
The long runs (30 schedules x 60 s, on kbroker and on Kafka) are the tool's; their figures are in the README."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compat.apache_kafka import KafkaUnavailable
from tools.faultsuite.history import NEMESIS, read_history
from tools.faultsuite.run import run_schedule

SEED = 11
SECONDS = 40.0


def test_a_seeded_schedule_on_kbroker_finds_nothing(tmp_path: Path) -> None:
    try:
        outcome = run_schedule("kbroker", SEED, SECONDS, tmp_path)
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka's controller cannot run here: {exc}")
    report = json.loads((outcome.directory / "report.json").read_text())
    assert outcome.client_errors == [], report
    assert outcome.report.valid, report["anomalies"]
    stats = outcome.report.stats
    # The run did what it is for: faults on, records acknowledged through them, every one read back at the end.
    assert sum(outcome.faults.values()) >= 2, outcome.faults
    assert stats["acknowledged"] > 100, stats
    history = read_history(outcome.directory / "history.jsonl")
    faults = [op for op in history if op.process == NEMESIS and op.type == "invoke"]
    assert len(faults) == sum(outcome.faults.values())
    # The final read at both isolation levels is in the history, so the checker held every acknowledged value
    # to it (lost_writes is empty above).
    final = {op.get("isolation") for op in history if op.f == "poll" and op.type == "ok" and op.get("final")}
    assert final == {"read_committed", "read_uncommitted"}
    assert stats["distinct_read_values"] >= stats["acknowledged"]


def test_the_checker_catches_a_leader_that_acknowledges_without_its_isr(tmp_path: Path) -> None:
    """The mutation check: kbroker's brokers run with their high watermark moved without the in-sync followers
    (kbroker/replication/mutations.py), and a leader is cut off from them, then killed. What it acknowledged alone
    is gone from the new leader, whose own records take those offsets: the checker must say so."""
    try:
        outcome = run_schedule(
            "kbroker", SEED, 20.0, tmp_path, faults=["isolate-kill-leader"], mutations=["high-watermark-without-isr"]
        )
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka's controller cannot run here: {exc}")
    anomalies = outcome.report.anomalies
    assert anomalies["inconsistent_offsets"] or anomalies["lost_writes"], outcome.report.summary()
    assert outcome.faults.get("isolate-kill-leader", 0) >= 1
    # Every broker logged that it ran broken on purpose.
    assert not outcome.valid
