"""Cluster benchmark (issue #29): a 3-broker kbroker cluster beside a 3-broker Apache Kafka cluster on this
machine, each under Apache Kafka 4.4.0's KRaft controller run the same way, with confluent-kafka clients.

    python tools/bench_cluster.py                                     # 3 repetitions, 200 MB, 5 failovers each
    python tools/bench_cluster.py --quick                             # small volumes (development only)
    python tools/bench_cluster.py --clusters kbroker                  # one of the two

The clusters run one after the other, each fresh in a temporary directory:
- kbroker: kbroker/kraft/local_cluster.py, what ``kbroker cluster --brokers 3`` runs: one Kafka controller (node
  1000, a 512 MB heap, kafka-server-start.sh's G1 settings, formatted with the feature levels kbroker's brokers
  serve) and 3 ``kbroker serve`` processes with ``process.roles=broker``.
- kafka: the same controller (the same settings, heap, JVM options and feature levels) and 3 Apache Kafka 4.4.0
  brokers (compat/apache_kafka.py's ApacheKafkaBroker, kafka-server-start.sh's 1 GB heap and JVM settings).
Both clusters' brokers have Kafka's defaults but for the internal topics, replicated as widely as 3 brokers
allow (what local_cluster gives its brokers: offsets and transaction state with 3 replicas, the latter's min ISR
2). Every topic below has 3 partitions (one leader per broker) and replication factor 3, min.insync.replicas=2.

Measures (every producer a process of its own, the same settings for both clusters):
- produce: after an untimed warm-up of a quarter of the volume (a fresh JVM's first run would pay for its JIT
  compiler), 1 producer process, 1 KB records (bench_compare's payloads), acks=all, linger.ms=5, batch.size 1 MB,
  blocks of 100 records round-robin over the 3 partitions; MB/s of payload from the first produce() to the end of
  flush(), every record acknowledged. Broker CPU seconds per GB: user+sys from /proc of the 3 broker processes
  (every thread, and their child processes), summed, before and after the run. Repeated, each on a new topic.
- latency: 100 B records at a fixed 2,000 records/s to partition 0, acks=all, linger.ms=0, idempotent; the time
  from produce() to the delivery report (the acknowledgement), p50/p99/p99.9/max over the records after a
  1 s warm-up (a first record acknowledged before the clock starts: the producer id is in place).
- failover: a producer sends a 100 B record to partition 0 every 5 ms (acks=all, idempotent, linger.ms=0); once
  acknowledgements flow, the partition's leader is killed (SIGKILL); the time from the kill to the first
  acknowledgement of a record sent after the killed process was reaped (a new leader elected by the controller,
  found by the client, the records retried to it). Then the broker is started again and rejoins the ISR before
  the next round. Reported as the median and max of the rounds, with every round's value. With one controller
  a broker's death is seen when its heartbeats stop (broker.session.timeout.ms, 9 s by default, the same for
  both): most of the figure.
The machine is shared: the load average before and after each measure, how many cores the whole machine kept
busy during it (from /proc/stat), and how many of those went to work other than the benchmark's own processes
are recorded beside each figure.

Writes JSON (bench-results/bench_cluster.json, or --output) and prints a table. Not a test.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.bench_compare import (  # noqa: E402
    GB,
    MB,
    SPAWN,
    ScenarioError,
    machine_busy_seconds,
    machine_info,
    make_payloads,
    precompile_kbroker,
    proc_cpu,
    produce_worker,
    producers_elapsed,
    run_clients,
    summarize,
)

CLUSTERS = ("kbroker", "kafka")
BROKERS = 3
PARTITIONS = 3
TOPIC_CONFIG = {"min.insync.replicas": "2"}
KAFKA_BROKER_HEAP = "1g"  # kafka-server-start.sh's
WITHIN = 180.0  # seconds: a bound against hanging (two busy cores), never a measure
FAILOVER_INTERVAL_S = 0.005
ACKS_ALL_PRODUCER = {"acks": "all", "enable.idempotence": True, "linger.ms": 0}


@dataclass
class Plan:
    repeat: int = 3
    produce_records: int = 200_000  # of 1 KB: 200 MB
    latency_rate: int = 2_000
    latency_seconds: float = 10.0
    latency_warmup_seconds: float = 1.0
    failovers: int = 5

    @classmethod
    def quick(cls) -> Plan:
        return cls(repeat=1, produce_records=30_000, latency_seconds=3.0, latency_warmup_seconds=0.5, failovers=2)


# ---------------------------------------------------------------------------------------------------------------
# The two clusters


def controller_feature_levels() -> dict[str, int]:
    """The levels local_cluster formats its controller with (the highest kbroker's brokers serve)."""
    from kbroker.kraft.local_cluster import controller_features

    options = controller_features()
    return {name: int(level) for name, _, level in (option.partition("=") for option in options[1::2])}


class Cluster:
    name = ""

    def start(self) -> None:
        raise NotImplementedError

    @property
    def bootstrap(self) -> str:
        raise NotImplementedError

    def broker_pids(self) -> list[int]:
        raise NotImplementedError

    def kill(self, node_id: int) -> None:
        raise NotImplementedError

    def start_broker(self, node_id: int) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


class KbrokerCluster(Cluster):
    """``kbroker cluster --brokers 3``'s machinery (kbroker/kraft/local_cluster.py)."""

    name = "kbroker"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: Any = None

    def start(self) -> None:
        from kbroker.kraft.local_cluster import start_cluster

        precompile_kbroker()
        self.started = start_cluster(self.directory, BROKERS, progress=lambda line: print(f"  {line}", flush=True))

    @property
    def bootstrap(self) -> str:
        return str(self.started.bootstrap)

    def broker_pids(self) -> list[int]:
        pids = [broker.pid for broker in self.started.brokers]
        assert None not in pids, f"a broker is down: {pids}"
        return pids

    def kill(self, node_id: int) -> None:
        self.started.broker(node_id).kill()

    def start_broker(self, node_id: int) -> None:
        self.started.broker(node_id).start()

    def stop(self) -> None:
        if self.started is not None:
            self.started.stop()

    def describe(self) -> dict[str, Any]:
        import subprocess

        from kbroker.kraft.local_cluster import CONTROLLER_HEAP, KAFKA_VERSION

        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return {
            "brokers": "kbroker serve (process.roles=broker), started by kbroker/kraft/local_cluster.py",
            "commit": commit.stdout.strip(),
            "controller": f"Apache Kafka {KAFKA_VERSION}, heap {CONTROLLER_HEAP}",
            "controller_features": controller_feature_levels(),
        }


class KafkaCluster(Cluster):
    """The same controller as local_cluster's and 3 Apache Kafka brokers (compat/apache_kafka.py)."""

    name = "kafka"

    def __init__(self, directory: Path) -> None:
        from compat.apache_kafka import ApacheKafkaBroker, KafkaController
        from kbroker.kraft.local_cluster import CONTROLLER_HEAP, FIRST_CONTROLLER_ID, Layout, Node, broker_settings

        self.controller = KafkaController(
            directory / "controller", node_id=FIRST_CONTROLLER_ID, features=controller_feature_levels()
        )
        self.controller.heap = CONTROLLER_HEAP
        # The broker settings local_cluster writes for its brokers, less what names the node and its listeners.
        nodes = [Node("broker", i, 0, directory) for i in range(1, BROKERS + 1)]
        layout = Layout(directory, "", [], nodes)
        own = ("process.roles", "node.id", "controller.quorum.bootstrap.servers", "listeners", "log.dirs")
        self.settings = {k: v for k, v in broker_settings(layout, nodes[0]).items() if k not in own}
        self.brokers = {
            i: ApacheKafkaBroker(directory / f"broker-{i}", self.controller, i, heap=KAFKA_BROKER_HEAP)
            for i in range(1, BROKERS + 1)
        }
        for broker in self.brokers.values():
            broker.settings = dict(self.settings)  # Kafka's defaults otherwise, not the test suite's settings

    def start(self) -> None:
        self.controller.start(timeout=WITHIN)
        with concurrent.futures.ThreadPoolExecutor(BROKERS) as pool:
            for started in [pool.submit(broker.start, WITHIN) for broker in self.brokers.values()]:
                started.result()

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.bootstrap for broker in self.brokers.values())

    def broker_pids(self) -> list[int]:
        processes = [broker.process for broker in self.brokers.values()]
        assert None not in processes, "a broker is down"
        return [process.pid for process in processes if process is not None]

    def kill(self, node_id: int) -> None:
        self.brokers[node_id].kill()

    def start_broker(self, node_id: int) -> None:
        self.brokers[node_id].start(WITHIN)

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.stop()
        self.controller.stop()

    def describe(self) -> dict[str, Any]:
        from compat.apache_kafka import JVM_PERFORMANCE_OPTS, KAFKA_VERSION

        return {
            "brokers": f"Apache Kafka {KAFKA_VERSION} (process.roles=broker), heap {KAFKA_BROKER_HEAP}",
            "jvm": JVM_PERFORMANCE_OPTS,
            "broker_settings": self.settings,
            "controller": f"Apache Kafka {KAFKA_VERSION}, heap {self.controller.heap}",
            "controller_features": controller_feature_levels(),
        }


# ---------------------------------------------------------------------------------------------------------------
# Client processes (spawned: no librdkafka thread of the parent is ever forked)


def _report(out: Any, fn: Callable[[], Any]) -> None:
    try:
        out.put(("ok", fn()))
    except BaseException:
        out.put(("error", traceback.format_exc(limit=3)))


def produce_latency_worker(bootstrap: str, topic: str, rate: int, seconds: float, warmup: float, out: Any) -> None:
    """100 B records to partition 0 at a fixed rate; report the produce-to-acknowledgement times (ns) of those
    sent after the warm-up, and how many failed."""

    def run() -> tuple[list[int], int]:
        from confluent_kafka import Producer

        latencies: list[int] = []
        failed: list[str] = []
        producer = Producer({"bootstrap.servers": bootstrap, **ACKS_ALL_PRODUCER})
        payload = make_payloads(100, 1)[0]
        # One record acknowledged before the clock: the producer id and the leader's connection are in place.
        producer.produce(topic, payload, partition=0)
        if producer.flush(60):
            raise RuntimeError("the first record was not acknowledged within 60 s")
        begin = time.monotonic()
        measured_from = begin + warmup

        def delivered(sent_ns: int) -> Callable[[Any, Any], None]:
            def report(error: Any, message: Any) -> None:
                if error is not None:
                    failed.append(str(error))
                elif sent_ns >= measured_from * 1e9:
                    latencies.append(time.monotonic_ns() - sent_ns)

            return report

        for sequence in range(int(rate * (warmup + seconds))):
            while (wait := begin + sequence / rate - time.monotonic()) > 0:
                producer.poll(wait)  # serves delivery reports as they come, so their times are taken on arrival
            producer.produce(topic, payload, partition=0, on_delivery=delivered(time.monotonic_ns()))
            producer.poll(0)
        if producer.flush(60):
            failed.append("records left undelivered after flush")
        return latencies, len(failed)

    _report(out, run)


def failover_producer(bootstrap: str, topic: str, stop: Any, last_sent_acknowledged: Any, out: Any) -> None:
    """A record to partition 0 every FAILOVER_INTERVAL_S until ``stop``. Reports (sent, acknowledged) times of
    every acknowledged record (CLOCK_MONOTONIC, the parent's clock too; an acknowledgement is timed when the
    client serves it) and the failed deliveries' errors; ``last_sent_acknowledged`` follows the send time of the
    newest acknowledged record."""

    def run() -> tuple[list[tuple[float, float]], list[str]]:
        from confluent_kafka import Producer

        acknowledged: list[tuple[float, float]] = []
        failed: list[str] = []

        def delivered(sent: float, error: Any, message: Any) -> None:
            if error is not None:
                failed.append(str(error))
            else:
                acknowledged.append((sent, time.monotonic()))
                last_sent_acknowledged.value = max(last_sent_acknowledged.value, sent)

        producer = Producer({"bootstrap.servers": bootstrap, **ACKS_ALL_PRODUCER})
        producer.list_topics(topic, timeout=30)
        payload = make_payloads(100, 1)[0]
        due = time.monotonic()
        while not stop.is_set():
            producer.produce(topic, payload, partition=0, on_delivery=functools.partial(delivered, time.monotonic()))
            due += FAILOVER_INTERVAL_S
            while (wait := due - time.monotonic()) > 0:
                producer.poll(wait)
            producer.poll(0)
        if producer.flush(WITHIN):
            failed.append("records left undelivered after flush")
        return acknowledged, failed

    _report(out, run)


def take_result(out: Any, process: Any, timeout: float) -> Any:
    import queue

    deadline = time.monotonic() + timeout
    while True:
        try:
            status, value = out.get(timeout=0.5)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise ScenarioError(f"the client did not report within {timeout:.0f} s") from None
            if process.exitcode is not None and out.empty():
                raise ScenarioError(f"the client exited with {process.exitcode} without reporting") from None
            continue
        if status == "error":
            raise ScenarioError(value.strip().splitlines()[-1] + "\n" + value)
        return value


# ---------------------------------------------------------------------------------------------------------------
# Measures


class Machine:
    """The load on the (shared) machine while a measure runs: load averages, the cores the whole machine kept
    busy (/proc/stat) and, of those, the ones busy with anything but this benchmark's processes (the clusters,
    the clients: this process and its children, running or ended), i.e. the other work sharing the machine.
    Kernel work not charged to any process (some of the loopback network's) counts as other work."""

    def __init__(self) -> None:
        self.load_before = os.getloadavg()
        self.busy_before = machine_busy_seconds()
        self.own_before = sum(proc_cpu(os.getpid()))

    def done(self) -> dict[str, Any]:
        busy, total = machine_busy_seconds()
        own = sum(proc_cpu(os.getpid())) - self.own_before
        cores = os.cpu_count() or 1
        elapsed = max(1e-9, (total - self.busy_before[1]) / cores)
        busy_cores = (busy - self.busy_before[0]) / elapsed
        return {
            "loadavg_before": [round(v, 2) for v in self.load_before],
            "loadavg_after": [round(v, 2) for v in os.getloadavg()],
            "machine_busy_cores": round(busy_cores, 2),
            "other_work_busy_cores": round(max(0.0, busy_cores - own / elapsed), 2),
        }


def create_topic(admin: Any, topic: str) -> None:
    from confluent_kafka.admin import NewTopic

    new = NewTopic(topic, num_partitions=PARTITIONS, replication_factor=BROKERS, config=TOPIC_CONFIG)
    admin.create_topics([new])[topic].result(WITHIN)
    wait_for(f"{topic}'s replicas all in sync", lambda: all(len(p.isrs) == BROKERS for p in partitions(admin, topic)))


def partitions(admin: Any, topic: str) -> list[Any]:
    described = admin.list_topics(topic, timeout=10).topics.get(topic)
    if described is None or described.error is not None or len(described.partitions) < PARTITIONS:
        return []
    return [described.partitions[i] for i in range(PARTITIONS)]


def wait_for(what: str, found: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WITHIN
    while not (answer := found()):
        if time.monotonic() > deadline:
            raise ScenarioError(f"no {what} within {WITHIN:g} s")
        time.sleep(0.2)
    return answer


def broker_cpu(cluster: Cluster) -> float:
    return sum(sum(proc_cpu(pid)) for pid in cluster.broker_pids())


def measure_produce(cluster: Cluster, admin: Any, plan: Plan, rep: int) -> dict[str, Any]:
    topic = f"produce-{rep}-{uuid.uuid4().hex[:8]}"
    create_topic(admin, topic)
    settings = {"acks": "all"}
    if rep == 0:  # untimed, a quarter of the volume: a fresh JVM's first run would pay for its JIT compiler
        warm_up = (cluster.bootstrap, topic, plan.produce_records // 4, 1000, settings, 1, PARTITIONS, True, 0)
        producers_elapsed(run_clients([(produce_worker, warm_up)], timeout=600))
    args = (cluster.bootstrap, topic, plan.produce_records, 1000, settings, 1, PARTITIONS, True, 0)
    machine = Machine()
    cpu_before = broker_cpu(cluster)
    results = run_clients([(produce_worker, args)], timeout=600)
    cpu = broker_cpu(cluster) - cpu_before
    elapsed = producers_elapsed(results)
    payload = plan.produce_records * 1000
    admin.delete_topics([topic])[topic].result(WITHIN)
    return {
        "mb_per_s": payload / MB / elapsed,
        "records_per_s": plan.produce_records / elapsed,
        "broker_cpu_s_per_gb": cpu / (payload / GB),
        "client_cpu_s_per_gb": results[0][5] / (payload / GB),
        **machine.done(),
    }


def percentile(values: list[int], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] / 1e6


def measure_latency(cluster: Cluster, admin: Any, plan: Plan) -> dict[str, Any]:
    topic = f"latency-{uuid.uuid4().hex[:8]}"
    create_topic(admin, topic)
    out = SPAWN.Queue()
    args = (cluster.bootstrap, topic, plan.latency_rate, plan.latency_seconds, plan.latency_warmup_seconds, out)
    machine = Machine()
    process = SPAWN.Process(target=produce_latency_worker, args=args, daemon=True)
    process.start()
    latencies, failed = take_result(out, process, plan.latency_seconds + WITHIN)
    process.join(10)
    admin.delete_topics([topic])[topic].result(WITHIN)
    if failed or not latencies:
        raise ScenarioError(f"{failed} records failed, {len(latencies)} measured")
    return {
        "records": len(latencies),
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "p999_ms": percentile(latencies, 0.999),
        "max_ms": max(latencies) / 1e6,
        **machine.done(),
    }


def failover_round(cluster: Cluster, admin: Any, topic: str, round_number: int) -> dict[str, Any]:
    """kill -9 partition 0's leader under a steady acks=all producer: the time from the kill to the first
    acknowledgement of a record sent once the leader was dead (earlier ones may be acknowledged by the dying
    leader, or served by the client after the kill though received before it); then the broker started again
    and back in the ISR."""
    leader = partitions(admin, topic)[0].leader
    stop, last_sent_acknowledged, out = SPAWN.Event(), SPAWN.Value("d", 0.0), SPAWN.Queue()
    args = (cluster.bootstrap, topic, stop, last_sent_acknowledged, out)
    process = SPAWN.Process(target=failover_producer, args=args)
    process.start()
    machine = Machine()
    killed_at = dead_at = math.inf
    try:
        wait_for("acknowledgements before the kill", lambda: last_sent_acknowledged.value > 0)
        time.sleep(2.0)  # steady acknowledgements
        killed_at = time.monotonic()
        cluster.kill(leader)  # returns once the process has been reaped
        dead_at = time.monotonic()
        wait_for("an acknowledgement after the kill", lambda: last_sent_acknowledged.value > dead_at)
        time.sleep(0.5)
    finally:
        stop.set()
    acknowledged, failed = take_result(out, process, WITHIN)
    process.join(10)
    first = min(acked for sent, acked in acknowledged if sent > dead_at)
    measured = {
        "round": round_number,
        "killed_leader": leader,
        "new_leader": partitions(admin, topic)[0].leader,
        "first_ack_after_kill_s": first - killed_at,
        "kill_s": dead_at - killed_at,
        "acknowledged": len(acknowledged),
        "failed_deliveries": len(failed),
        "first_failure": failed[0] if failed else "",
        **machine.done(),
    }
    print(f"  failover {round_number}: leader {leader} killed, {first - killed_at:.2f} s to the next ack", flush=True)
    cluster.start_broker(leader)
    wait_for("the restarted broker back in the ISR", lambda: len(partitions(admin, topic)[0].isrs) == BROKERS)
    return measured


def measure_failover(cluster: Cluster, admin: Any, plan: Plan) -> dict[str, Any]:
    topic = f"failover-{uuid.uuid4().hex[:8]}"
    create_topic(admin, topic)
    rounds = [failover_round(cluster, admin, topic, n) for n in range(plan.failovers)]
    admin.delete_topics([topic])[topic].result(WITHIN)
    seconds = [r["first_ack_after_kill_s"] for r in rounds]
    return {"median_s": statistics.median(seconds), "max_s": max(seconds), "rounds": rounds}


def run_cluster(cluster: Cluster, plan: Plan) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient

    result: dict[str, Any] = {"failures": []}
    began = time.monotonic()
    cluster.start()
    result["startup_s"] = time.monotonic() - began
    print(f"{cluster.name}: 3 brokers at {cluster.bootstrap}, started in {result['startup_s']:.1f} s", flush=True)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    try:
        measures: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            *(
                (f"produce-{rep}", lambda rep=rep: measure_produce(cluster, admin, plan, rep))
                for rep in range(plan.repeat)
            ),
            ("latency", lambda: measure_latency(cluster, admin, plan)),
            ("failover", lambda: measure_failover(cluster, admin, plan)),
        ]
        produce_runs = []
        for name, measure in measures:
            try:
                value = measure()
            except Exception as exc:  # recorded as the measure's result: the others still run
                result["failures"].append({"measure": name, "error": str(exc)[:2000]})
                print(f"  {name}: FAILED {str(exc).splitlines()[0]}", flush=True)
                continue
            if name.startswith("produce-"):
                produce_runs.append(value)
                print(f"  {name}: {value['mb_per_s']:.1f} MB/s, {value['broker_cpu_s_per_gb']:.1f} broker CPU s/GB")
            else:
                result[name] = value
                if name == "latency":
                    print(f"  latency: p50 {value['p50_ms']:.2f} ms, p99 {value['p99_ms']:.2f} ms")
        if produce_runs:
            result["produce_runs"] = produce_runs
            result["produce"] = {
                key: summarize([run[key] for run in produce_runs])
                for key in ("mb_per_s", "records_per_s", "broker_cpu_s_per_gb", "client_cpu_s_per_gb")
            }
    finally:
        cluster.stop()
    result["describe"] = cluster.describe()
    return result


# ---------------------------------------------------------------------------------------------------------------
# Report


def rows(report: dict[str, Any]) -> list[tuple[str, list[str]]]:
    def produce(name: str, key: str, digits: int) -> str:
        summary = report["clusters"].get(name, {}).get("produce", {}).get(key)
        if summary is None:
            return "-"
        return f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}-{summary['max']:.{digits}f})"

    def field(name: str, measure: str, key: str, digits: int) -> str:
        value = report["clusters"].get(name, {}).get(measure, {}).get(key)
        return "-" if value is None else f"{value:.{digits}f}"

    def others(name: str) -> str:
        runs = report["clusters"].get(name, {}).get("produce_runs", [])
        return ", ".join(f"{run['other_work_busy_cores']:.2f}" for run in runs) or "-"

    names = list(report["clusters"])
    return [
        ("acks=all produce MB/s (1 KB)", [produce(n, "mb_per_s", 1) for n in names]),
        ("broker CPU s/GB (3 brokers)", [produce(n, "broker_cpu_s_per_gb", 1) for n in names]),
        ("latency p50 ms (2,000/s)", [field(n, "latency", "p50_ms", 2) for n in names]),
        ("latency p99 ms (2,000/s)", [field(n, "latency", "p99_ms", 2) for n in names]),
        ("latency p99.9 ms (2,000/s)", [field(n, "latency", "p999_ms", 2) for n in names]),
        ("kill -9 leader to ack, median s", [field(n, "failover", "median_s", 2) for n in names]),
        ("kill -9 leader to ack, max s", [field(n, "failover", "max_s", 2) for n in names]),
        ("cluster start-up s", [f"{report['clusters'][n].get('startup_s', 0):.1f}" for n in names]),
        ("other work's busy cores (produce)", [others(n) for n in names]),
    ]


def print_report(report: dict[str, Any]) -> None:
    names = list(report["clusters"])
    table = rows(report)
    width = max(len(label) for label, _ in table)
    columns = [max(len(n), *(len(values[i]) for _, values in table)) for i, n in enumerate(names)]
    print()
    print(" " * width + "  " + "  ".join(n.rjust(w) for n, w in zip(names, columns, strict=True)))
    for label, values in table:
        print(label.ljust(width) + "  " + "  ".join(v.rjust(w) for v, w in zip(values, columns, strict=True)))
    for name in names:
        for failure in report["clusters"][name]["failures"]:
            print(f"{name} {failure['measure']} failed: {failure['error'].splitlines()[0]}")
    print(f"load average at start {report['machine']['load_average_at_start']}, at end {report['load_average_at_end']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small volumes, 1 repetition, 2 failovers")
    parser.add_argument("--clusters", default=",".join(CLUSTERS), help="comma-separated: kbroker,kafka")
    parser.add_argument("--output", type=Path, default=None, help="the JSON file (default bench-results/...)")
    args = parser.parse_args()
    names = [n.strip() for n in args.clusters.split(",") if n.strip()]
    unknown = [n for n in names if n not in CLUSTERS]
    if unknown or not names:
        parser.error(f"--clusters: expected names among {', '.join(CLUSTERS)}, got {args.clusters!r}")
    plan = Plan.quick() if args.quick else Plan()
    output = args.output or ROOT / "bench-results" / (
        "bench_cluster-quick.json" if args.quick else "bench_cluster.json"
    )
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "plan": plan.__dict__,
        "clusters": {},
    }
    began = time.monotonic()
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"bench-cluster-{name}-") as directory:
            cluster: Cluster = KbrokerCluster(Path(directory)) if name == "kbroker" else KafkaCluster(Path(directory))
            report["clusters"][name] = run_cluster(cluster, plan)
    report["wall_s"] = time.monotonic() - began
    report["load_average_at_end"] = os.getloadavg()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print_report(report)
    print(f"results: {output}")


if __name__ == "__main__":
    main()
