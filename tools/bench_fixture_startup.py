"""How fast the pytest plugin's ``kafka_broker`` fixture can hand out a bootstrap address, per start-up mode.

    python tools/bench_fixture_startup.py [--repeat 20]

For each mode (``thread``: kbroker.testing.RunningBroker, a trio broker on a thread of the test process;
``subprocess``: kbroker.testing.BrokerProcess, a ``kbroker serve`` child) it measures, over fresh temp data
directories: start() until it returns, then until the broker answers ApiVersions and Metadata (what a client
needs first), and stop(). The thread mode is measured first in a fresh interpreter so its one-off import
cost shows up separately ("first start").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kbroker.health import check  # noqa: E402
from kbroker.testing import BrokerProcess, RunningBroker  # noqa: E402

BrokerClass = type[RunningBroker] | type[BrokerProcess]


def measure(kind: BrokerClass, repeat: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {"start": [], "first answer": [], "stop": []}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            began = time.perf_counter()
            broker = kind(Path(tmp) / "data").start()
            started = time.perf_counter()
            check(broker.bootstrap)
            answered = time.perf_counter()
            broker.stop()
            stopped = time.perf_counter()
        timings["start"].append(started - began)
        timings["first answer"].append(answered - began)
        timings["stop"].append(stopped - answered)
    return timings


def first_thread_start() -> float:
    """A fresh interpreter: importing the broker's modules and starting the thread, to the first answer."""
    code = (
        "import time, tempfile, pathlib; began = time.perf_counter()\n"
        "from kbroker.testing import RunningBroker\nfrom kbroker.health import check\n"
        "with tempfile.TemporaryDirectory() as tmp:\n"
        "    b = RunningBroker(pathlib.Path(tmp) / 'd').start(); check(b.bootstrap)\n"
        "    print(time.perf_counter() - began); b.stop()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    return float(run.stdout.split()[0])


def describe(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"{statistics.median(ms):7.1f} ms  ({ms[0]:.1f}-{ms[-1]:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="print the raw timings as JSON")
    args = parser.parse_args()
    first = [first_thread_start() for _ in range(min(5, args.repeat))]
    results = {"thread": measure(RunningBroker, args.repeat), "subprocess": measure(BrokerProcess, args.repeat)}
    if args.json:
        print(json.dumps({"thread first start": first, **results}))
        return
    print(f"{'mode':<12}{'measure':<16}median (min-max) over {args.repeat} starts")
    print(f"{'thread':<12}{'first start':<16}{describe(first)}  (fresh interpreter, imports included)")
    for mode, timings in results.items():
        for name, values in timings.items():
            print(f"{mode:<12}{name:<16}{describe(values)}")


if __name__ == "__main__":
    main()
