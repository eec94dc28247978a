"""What metrics cost on the produce path: produce throughput and broker CPU seconds per GB, three ways.

* ``off``: the request path's counters replaced by no-ops (the broker as it was before metrics);
* ``counters``: a plain ``kbroker serve`` (the counters are always updated, nothing reads them);
* ``endpoint``: ``kbroker serve --metrics-listen``, scraped every second during the run.

Each run starts a fresh broker (a child process), produces ``--megabytes`` of ``--record-bytes`` records with
confluent-kafka (acks=1), and reads the broker's CPU time from /proc. Runs alternate between the modes
``--rounds`` times; the medians are printed, with each mode's cost against ``off``. On a busy machine those
medians move by more than the counters cost, so it also prints a figure noise barely touches: the counters' own
work per produce request, timed in-process, as a share of the broker's CPU per produce request (the endpoint
counts the requests).

    python tools/bench_metrics.py --megabytes 200 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

MODES = ("off", "counters", "endpoint")


def serve_without_counters(argv: list[str]) -> int:
    """``kbroker serve`` with BrokerMetrics' request-path methods replaced by no-ops (the ``off`` mode)."""
    from kbroker import cli
    from kbroker.metrics import BrokerMetrics, TopicCounters

    sink = TopicCounters()  # every topic's counters: additions to one object nobody reads

    def no_request(self: BrokerMetrics, api_key: int, version: int, seconds: float) -> None:
        return None

    def one_topic(self: BrokerMetrics, name: str) -> TopicCounters:
        return sink

    BrokerMetrics.observe_request = no_request  # type: ignore[method-assign]
    BrokerMetrics.topic = one_topic  # type: ignore[method-assign]
    return cli.main(argv)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def start_broker(mode: str, data_dir: Path) -> tuple[subprocess.Popen[bytes], str, str | None]:
    ready = data_dir.with_suffix(".ready")
    args = ["serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--ready-file", str(ready)]
    args += ["--log-level", "WARNING"]
    metrics_url = None
    if mode == "endpoint":
        import socket

        with socket.socket() as probe:  # a free port for the endpoint
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        args += ["--metrics-listen", f"127.0.0.1:{port}"]
        metrics_url = f"http://127.0.0.1:{port}/metrics"
    if mode == "off":
        command = [sys.executable, __file__, "--serve-without-counters", *args]
    else:
        command = [sys.executable, "-m", "kbroker", *args]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"broker ({mode}) did not start")
        time.sleep(0.01)
    return process, ready.read_text().strip(), metrics_url


def produce(bootstrap: str, megabytes: int, record_bytes: int, batch_bytes: int = 256 * 1024) -> float:
    """Seconds to produce and acknowledge ``megabytes`` of records."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": 1,
            "linger.ms": 5,
            "batch.size": batch_bytes,
            "queue.buffering.max.kbytes": 256 * 1024,
        }
    )
    producer.produce("warmup", b"x")
    producer.flush(30)
    value = os.urandom(record_bytes)
    count = megabytes * 1024 * 1024 // record_bytes
    started = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                producer.produce("bench", value)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(120)
    return time.perf_counter() - started


def scrape_every_second(url: str, stop: threading.Event, counts: list[int]) -> None:
    while not stop.wait(1.0):
        with urllib.request.urlopen(url, timeout=10) as answer:
            answer.read()
        counts[0] += 1


def counter_work_microseconds(rounds: int = 200_000) -> float:
    """What the counters add to one produce request of one partition, in this process: the request's two clock
    reads and its observation, and the topic's byte and message counts (the code the request path runs)."""
    from time import perf_counter

    from kbroker.metrics import BrokerMetrics

    metrics = BrokerMetrics()
    best = float("inf")
    for _ in range(5):  # the least disturbed of five
        started = perf_counter()
        for _ in range(rounds):
            request_started = perf_counter()
            counters = metrics.topic("bench")
            counters.bytes_in += 16384
            counters.messages_in += 16
            metrics.observe_request(0, 11, perf_counter() - request_started)
        best = min(best, (perf_counter() - started) / rounds)
    return best * 1e6


def produce_requests(url: str) -> int:
    """Produce requests the broker counted (its own endpoint)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    prefix = 'kafka_network_requestmetrics_requests_total{request="Produce"'
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)))


def run_once(mode: str, megabytes: int, record_bytes: int, batch_bytes: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        process, bootstrap, url = start_broker(mode, Path(directory) / "data")
        try:
            produce(bootstrap, 1, record_bytes)  # topic created, connections and handlers warm
            stop, scrapes = threading.Event(), [0]
            scraper = None
            if url is not None:
                scraper = threading.Thread(target=scrape_every_second, args=(url, stop, scrapes), daemon=True)
                scraper.start()
            requests_before = produce_requests(url) if url is not None else 0
            cpu_before = cpu_seconds(process.pid)
            seconds = produce(bootstrap, megabytes, record_bytes, batch_bytes)
            cpu = cpu_seconds(process.pid) - cpu_before
            stop.set()
            if scraper is not None:
                scraper.join()
            requests = produce_requests(url) - requests_before if url is not None else 0
        finally:
            process.terminate()
            process.wait(60)
    gigabytes = megabytes / 1024
    result = {"mb_per_s": megabytes / seconds, "cpu_s_per_gb": cpu / gigabytes, "scrapes": scrapes[0]}
    if requests:
        result["produce_requests"] = requests
        result["cpu_us_per_request"] = cpu / requests * 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-bytes", type=int, default=256 * 1024, help="the producer's batch.size")
    parser.add_argument("--json", type=Path, default=None, help="write every run and the medians here")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for round_number in range(args.rounds):
        for mode in MODES:
            result = run_once(mode, args.megabytes, args.record_bytes, args.batch_bytes)
            runs[mode].append(result)
            print(
                f"round {round_number + 1} {mode:9} {result['mb_per_s']:7.1f} MB/s "
                f"{result['cpu_s_per_gb']:6.2f} CPU s/GB",
                flush=True,
            )
    medians = {
        mode: {key: statistics.median(run[key] for run in runs[mode]) for key in ("mb_per_s", "cpu_s_per_gb")}
        for mode in MODES
    }
    base = medians["off"]
    print(
        f"\nmedians of {args.rounds} rounds, {args.megabytes} MB of {args.record_bytes}-byte records, "
        f"batch.size {args.batch_bytes}, acks=1:"
    )
    for mode in MODES:
        m = medians[mode]
        throughput_cost = (base["mb_per_s"] - m["mb_per_s"]) / base["mb_per_s"] * 100
        cpu_cost = (m["cpu_s_per_gb"] - base["cpu_s_per_gb"]) / base["cpu_s_per_gb"] * 100
        print(
            f"{mode:9} {m['mb_per_s']:7.1f} MB/s ({throughput_cost:+.1f}% slower)  "
            f"{m['cpu_s_per_gb']:6.2f} CPU s/GB ({cpu_cost:+.1f}%)"
        )
    # The noise-free figure: the counters' own work per produce request against the broker's CPU per request.
    work_us = counter_work_microseconds()
    per_request = statistics.median(run["cpu_us_per_request"] for run in runs["endpoint"])
    share = work_us / per_request * 100
    print(
        f"counter work per produce request: {work_us:.2f} us in-process; the broker spends {per_request:.0f} us of "
        f"CPU per produce request here (median, endpoint runs): {share:.2f}% of the produce path"
    )
    if args.json is not None:
        document = {
            "runs": runs,
            "medians": medians,
            "counter_work_us_per_request": work_us,
            "broker_cpu_us_per_produce_request": per_request,
            "counter_share_percent": share,
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-without-counters":
        sys.exit(serve_without_counters(sys.argv[2:]))
    main()
