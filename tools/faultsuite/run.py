"""Run the fault suite: seeded schedules of faults against a 3-broker cluster of kbroker's brokers and, as the
control, of Apache Kafka's, under one Apache Kafka KRaft controller; check each history.

    python -m tools.faultsuite                                     # 30 schedules x 60 s on each, seeds 1..30
    python -m tools.faultsuite --implementations kbroker --schedules 1 --seconds 30 --seed 7
    python -m tools.faultsuite --check faultsuite-results/kbroker-7/history.jsonl   # check a kept history again

Each schedule: a new cluster (replication factor 3, min.insync.replicas=2, unclean election off), the topic
created, the workload (tools/faultsuite/workload.py) started, the nemesis (tools/faultsuite/nemesis.py) drawing
faults for ``--seconds``, then everything healed, the workload stopped, every partition read to its end, and the
history checked (tools/faultsuite/checker.py). Every history is kept under ``--out``, with the checker's report;
a schedule that found anything also keeps every broker's and the controller's log. The exit status is 1 when any
schedule found an anomaly or its clients failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from tools.faultsuite.checker import Report, check
from tools.faultsuite.history import History, read_history
from tools.faultsuite.nemesis import FAULTS, Nemesis
from tools.faultsuite.workload import Workload

MUTATIONS_ENVIRONMENT = "KBROKER_TEST_MUTATIONS"  # kbroker/replication/mutations.py's switch
TOPIC = "faultsuite"
PARTITIONS = 4
# The same for both implementations: quick failure detection, so that a 60 s schedule sees several faults.
BROKER_SETTINGS = {
    "min.insync.replicas": "2",
    "default.replication.factor": "3",
    "unclean.leader.election.enable": "false",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": "3",
    "replica.lag.time.max.ms": "4000",
    "broker.heartbeat.interval.ms": "500",
    "group.initial.rebalance.delay.ms": "0",
}
CONTROLLER_SETTINGS = {"broker.session.timeout.ms": "6000"}
SETTLE_SECONDS = 10.0  # after healing, before the clients stop: let them finish what is in flight


class Outcome(NamedTuple):
    implementation: str
    seed: int
    report: Report
    client_errors: list[str]
    faults: dict[str, int]
    directory: Path

    @property
    def valid(self) -> bool:
        return self.report.valid and not self.client_errors


def run_schedule(
    implementation: str,
    seed: int,
    seconds: float,
    out: Path,
    faults: Sequence[str] = FAULTS,
    mutations: Sequence[str] = (),
) -> Outcome:
    """One schedule on a new cluster; ``mutations``: kbroker's test-only broken mechanisms to run its brokers with
    (kbroker/replication/mutations.py)."""
    from tests.cluster.kraft_cluster import KRaftCluster  # the JVM and process harness, loaded only to run

    if mutations and implementation != "kbroker":
        raise ValueError("mutations are kbroker's: they cannot be applied to Apache Kafka")
    previous = os.environ.get(MUTATIONS_ENVIRONMENT)
    if mutations:
        os.environ[MUTATIONS_ENVIRONMENT] = ",".join(mutations)  # every broker process started from here has it
    try:
        return _run_schedule(KRaftCluster, implementation, seed, seconds, out, faults, mutations)
    finally:
        if previous is None:
            os.environ.pop(MUTATIONS_ENVIRONMENT, None)
        else:
            os.environ[MUTATIONS_ENVIRONMENT] = previous


def _run_schedule(
    cluster_type: Any,
    implementation: str,
    seed: int,
    seconds: float,
    out: Path,
    faults: Sequence[str],
    mutations: Sequence[str],
) -> Outcome:
    name = f"{implementation}-{seed}" + "".join(f"-{mutation}" for mutation in mutations)
    directory = out / name
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix=f"faultsuite-{implementation}-") as root:
        cluster = cluster_type(
            Path(root),
            implementation,
            size=3,
            broker_settings=BROKER_SETTINGS,
            controller_settings=CONTROLLER_SETTINGS,
        )
        with cluster, (directory / "history.jsonl").open("w") as stream:
            # Every broker unfenced in the quorum's image first: a broker whose image has none yet answers
            # Metadata with no controller id, and librdkafka's CreateTopics then waits for one until it times out.
            ids = {broker.node_id for broker in cluster.brokers}
            cluster.observe().wait(
                lambda image: all(i in image.brokers and not image.brokers[i].fenced for i in ids),
                "every broker registered and unfenced",
            )
            create_topic(cluster.bootstrap)
            cluster.observe().wait(lambda image: fully_replicated(image, TOPIC), "the topic fully replicated")
            history = History(stream)
            workload = Workload(history, cluster.bootstrap, TOPIC, PARTITIONS, seed).start()
            nemesis = Nemesis(cluster, history, TOPIC, seed, faults=tuple(faults))
            try:
                nemesis.run(seconds)
            finally:
                nemesis.heal_all()
            errors: list[str] = []
            try:
                cluster.observe().wait(lambda image: fully_replicated(image, TOPIC), "every replica in sync", 180)
                nemesis.elect_preferred()
            except AssertionError as exc:  # the cluster did not recover: a finding, and the clients read on
                errors.append(f"after healing: {exc}")
            time.sleep(SETTLE_SECONDS)
            workload.stop()
            errors += workload.errors
            try:
                workload.final_read()
            except Exception as exc:  # reported: a final read that cannot finish is a finding in itself
                errors.append(f"final read: {type(exc).__name__}: {exc}")
            report = check(history.ops)
            outcome = Outcome(implementation, seed, report, errors, dict(nemesis.count), directory)
            (directory / "report.json").write_text(json.dumps(report_json(outcome), indent=2, default=str) + "\n")
            if not outcome.valid:
                keep_logs(cluster, directory)
    return outcome


def create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
    admin.create_topics([new], request_timeout=60)[TOPIC].result(timeout=90)


def fully_replicated(image: Any, topic: str) -> bool:
    found = image.topics.get(topic)
    return found is not None and all(
        len(registration.isr) == len(registration.replicas) and registration.leader >= 0
        for registration in found.partitions.values()
    )


def keep_logs(cluster: Any, directory: Path) -> None:
    for name, path in [("controller", cluster.controller.log_path)] + [
        (broker.name, broker.log_path) for broker in cluster.brokers
    ]:
        try:
            shutil.copy(path, directory / f"{name}.log")
        except OSError:
            pass


def report_json(outcome: Outcome) -> dict[str, Any]:
    return {
        "implementation": outcome.implementation,
        "seed": outcome.seed,
        "valid": outcome.valid,
        "summary": outcome.report.summary(),
        "client_errors": outcome.client_errors,
        "faults_injected": outcome.faults,
        "stats": outcome.report.stats,
        "anomalies": {name: cases[:50] for name, cases in outcome.report.anomalies.items() if cases},
    }


def availability_table(outcomes: Sequence[Outcome]) -> str:
    """Per implementation and fault: operations begun while it was on, the share that succeeded, the longest
    time without an acknowledged send."""
    rows: dict[tuple[str, str], list[float]] = {}
    for outcome in outcomes:
        for fault, entry in outcome.report.stats["faults"].items():
            row = rows.setdefault((outcome.implementation, fault), [0, 0, 0, 0.0])
            row[0] += entry["count"]
            row[1] += entry["operations"]
            row[2] += entry["succeeded"]
            row[3] = max(row[3], entry["longest_gap_s"])
    lines = ["| implementation | fault | times | operations | succeeded | longest without an ack |", "|---" * 6 + "|"]
    for (implementation, fault), (count, operations, succeeded, gap) in sorted(rows.items()):
        share = f"{succeeded / operations:.1%}" if operations else "-"
        lines.append(f"| {implementation} | {fault} | {count:g} | {operations:g} | {share} | {gap:.1f} s |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.faultsuite", description=__doc__.split("\n\n")[0])
    parser.add_argument("--implementations", default="kbroker,kafka", help="comma-separated: kbroker, kafka")
    parser.add_argument("--schedules", type=int, default=30, help="schedules per implementation")
    parser.add_argument("--seconds", type=float, default=60.0, help="fault time per schedule")
    parser.add_argument("--seed", type=int, default=1, help="the first schedule's seed (the next ones count up)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated among {','.join(FAULTS)}")
    parser.add_argument("--out", type=Path, default=Path("faultsuite-results"), help="where histories are kept")
    parser.add_argument("--check", type=Path, metavar="HISTORY", help="only check a kept history")
    parser.add_argument(
        "--mutations",
        default="",
        help="kbroker only: test-only broken mechanisms for its brokers (kbroker/replication/mutations.py), "
        "comma-separated; the checker should then find something",
    )
    args = parser.parse_args(argv)
    if args.check is not None:
        report = check(read_history(args.check))
        print(json.dumps({"summary": report.summary(), "stats": report.stats}, indent=2, default=str))
        return 0 if report.valid else 1
    implementations = [name.strip() for name in args.implementations.split(",") if name.strip()]
    unknown = set(implementations) - {"kbroker", "kafka"}
    faults = [name.strip() for name in args.faults.split(",") if name.strip()]
    if unknown or set(faults) - set(FAULTS):
        parser.error(f"unknown: {', '.join(sorted(unknown | (set(faults) - set(FAULTS))))}")
    outcomes: list[Outcome] = []
    for offset in range(args.schedules):
        for implementation in implementations:
            seed = args.seed + offset
            began = time.monotonic()
            mutations = [name.strip() for name in args.mutations.split(",") if name.strip()]
            outcome = run_schedule(implementation, seed, args.seconds, args.out, faults, mutations)
            outcomes.append(outcome)
            stats = outcome.report.stats
            print(
                f"{implementation} seed {seed}: {outcome.report.summary()}"
                f"{'; client errors: ' + '; '.join(outcome.client_errors) if outcome.client_errors else ''}"
                f" ({stats['acknowledged']} acknowledged, {stats['distinct_read_values']} read, "
                f"{sum(outcome.faults.values())} faults, {time.monotonic() - began:.0f} s)",
                flush=True,
            )
    print()
    print(availability_table(outcomes))
    failed = [o for o in outcomes if not o.valid]
    print(f"\n{len(outcomes) - len(failed)} of {len(outcomes)} schedules found nothing; histories in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
