"""Broker benchmark: start-up, memory, produce and consume throughput with confluent-kafka clients.

    python tools/bench_broker.py [--records 200000] [--sizes 100,1000] [--producers 2] [--repeat 3]

Starts ``kbroker serve`` as a child process on a temporary data directory and measures:
- start-up: from spawn to the first answered Metadata request;
- idle RSS after start-up, and peak RSS at the end (from /proc);
- produce throughput: N producer processes (confluent-kafka, acks=all, linger.ms=5, large batches), each
  sending its share of the records to a 2-partition topic; records/s and MB/s of payload;
- consume throughput: one confluent-kafka consumer reading the whole topic from the beginning.
Medians over ``--repeat`` runs, with min and max. Not a test: numbers go in the README.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocol.framing import FrameBuffer, decode_response, encode_request  # noqa: E402
from protocol.messages.metadata_request import MetadataRequest  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def metadata_answered(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(encode_request(MetadataRequest(topics=[]), 12, 1))
            frames = FrameBuffer(1 << 24)
            while True:
                data = conn.recv(65536)
                if not data:
                    return False
                frames.feed(data)
                frame = frames.next_frame()
                if frame is not None:
                    decode_response(frame, 3, 12)
                    return True
    except OSError:
        return False


class BrokerProcess:
    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kbroker",
                "serve",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--data-dir",
                str(data_dir),
                "--log-level",
                "WARNING",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        while not metadata_answered(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError("broker exited during start-up")
            time.sleep(0.002)
        self.startup_s = time.perf_counter() - self.started

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _produce_worker(bootstrap: str, topic: str, count: int, size: int, codec: str, out: multiprocessing.Queue) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "compression.type": codec,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    payload = os.urandom(size)
    start = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, payload, key=str(i % 64).encode())
                break
            except BufferError:
                producer.poll(0.01)
    remaining = producer.flush(60)
    out.put((time.perf_counter() - start, remaining))


def produce(bootstrap: str, topic: str, records: int, size: int, processes: int, codec: str) -> float:
    queue: multiprocessing.Queue = multiprocessing.Queue()
    workers = [
        multiprocessing.Process(
            target=_produce_worker, args=(bootstrap, topic, records // processes, size, codec, queue)
        )
        for _ in range(processes)
    ]
    start = time.perf_counter()
    for w in workers:
        w.start()
    results = [queue.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    assert all(remaining == 0 for _, remaining in results), "undelivered records"
    return time.perf_counter() - start


def consume(bootstrap: str, topic: str, expected: int) -> float:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    seen = 0
    start = time.perf_counter()
    while seen < expected:
        batch = consumer.consume(10_000, timeout=5)
        if not batch:
            raise RuntimeError(f"consumer stalled after {seen} of {expected} records")
        seen += len(batch)
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        future.result(30)


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--codec", default="none")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    results: dict = {"startup_s": [], "idle_rss_mb": [], "peak_rss_mb": [], "runs": {}}
    for repetition in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            broker = BrokerProcess(Path(tmp))
            try:
                results["startup_s"].append(broker.startup_s)
                time.sleep(0.2)
                results["idle_rss_mb"].append(rss_kb(broker.proc.pid) / 1024)
                for size in sizes:
                    topic = f"bench-{size}"
                    create_topic(broker.bootstrap, topic)
                    cpu_before = broker.cpu_seconds()
                    produce_s = produce(broker.bootstrap, topic, args.records, size, args.producers, args.codec)
                    cpu_produce = broker.cpu_seconds() - cpu_before
                    consume_s = consume(broker.bootstrap, topic, args.records - args.records % args.producers)
                    cpu_consume = broker.cpu_seconds() - cpu_before - cpu_produce
                    run = results["runs"].setdefault(
                        str(size),
                        {
                            k: []
                            for k in (
                                "produce_rec_s",
                                "produce_mb_s",
                                "consume_rec_s",
                                "consume_mb_s",
                                "broker_cpu_s_per_gb_produce",
                                "broker_cpu_s_per_gb_consume",
                            )
                        },
                    )
                    megabytes = args.records * size / 1e6
                    run["produce_rec_s"].append(args.records / produce_s)
                    run["produce_mb_s"].append(megabytes / produce_s)
                    run["consume_rec_s"].append(args.records / consume_s)
                    run["consume_mb_s"].append(megabytes / consume_s)
                    run["broker_cpu_s_per_gb_produce"].append(cpu_produce / (megabytes / 1000))
                    run["broker_cpu_s_per_gb_consume"].append(cpu_consume / (megabytes / 1000))
                results["peak_rss_mb"].append(rss_kb(broker.proc.pid, "VmHWM") / 1024)
            finally:
                broker.stop()
        print(f"repetition {repetition + 1}/{args.repeat} done", file=sys.stderr)

    report = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "settings": vars(args) | {"json": str(args.json) if args.json else None},
        "startup_s": summarize(results["startup_s"]),
        "idle_rss_mb": summarize(results["idle_rss_mb"]),
        "peak_rss_mb": summarize(results["peak_rss_mb"]),
        "runs": {size: {k: summarize(v) for k, v in run.items()} for size, run in results["runs"].items()},
    }
    print(f"{'metric':<44}{'median':>12}{'min':>12}{'max':>12}")
    for name in ("startup_s", "idle_rss_mb", "peak_rss_mb"):
        s = report[name]
        print(f"{name:<44}{s['median']:>12.3f}{s['min']:>12.3f}{s['max']:>12.3f}")
    for size, run in report["runs"].items():
        for key, s in run.items():
            print(f"{size + ' B ' + key:<44}{s['median']:>12.1f}{s['min']:>12.1f}{s['max']:>12.1f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
