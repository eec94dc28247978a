"""kbroker serve's start-up: spawn to the first answered Metadata request, and where the time goes.

    python tools/bench_startup.py [--repeat 20] [--checkout before=PATH ...] [--importtime]

Each repetition spawns ``python -m kbroker serve`` on a fresh data directory from this checkout and from each
``--checkout`` (another worktree: a before/after in one run, the order rotating), polls it every 2 ms with a
Metadata request (as tools/bench_compare.py's start-up does) and records, at the first answer:

- wall: spawn to answer, as a client sees it;
- cpu: the broker's own CPU time until then (every thread, from /proc/PID/task/*/schedstat), which other load on
  the machine disturbs far less than the wall time.

Both are printed as median (min-max). Bytecode is compiled first (``compileall``), as an installed package has it.
``--importtime`` also runs each checkout with ``-X importtime`` up to its first answer and splits the import time
(median of the repetitions) into ``site`` (what its .pth files import), trio (and what it imports), kbroker's
and protocol's own modules, and the other modules they import.
"""

from __future__ import annotations

import argparse
import compileall
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protocol.framing import FrameBuffer, decode_response, encode_request  # noqa: E402
from protocol.messages.metadata_request import MetadataRequest  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def metadata_answered(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(encode_request(MetadataRequest(topics=[]), 9, 1))
            frames = FrameBuffer(1 << 24)
            while (data := conn.recv(65536)) != b"":
                frames.feed(data)
                if (frame := frames.next_frame()) is not None:
                    decode_response(frame, 3, 9)
                    return True
    except (OSError, ValueError):
        pass
    return False


def cpu_ms(pid: int) -> float:
    """The process's CPU time so far, every thread (schedstat: nanoseconds on a CPU)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e6


def start_once(source: Path, python_flags: list[str], log: Path | None = None) -> tuple[float, float]:
    """Spawn the broker from ``source`` until its first Metadata answer: (wall ms, cpu ms). It is stopped (SIGSTOP
    first, so that an ``-X importtime`` log ends at the answer) and killed. Its stderr goes to ``log`` if given."""
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        port = free_port()
        err = open(log, "w") if log is not None else None  # noqa: SIM115 - closed below
        began = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, *python_flags, "-m", "kbroker", "serve", "--listen", f"127.0.0.1:{port}"]
            + ["--data-dir", f"{tmp}/data"],
            cwd=source,
            env={**os.environ, "PYTHONPATH": str(source)},
            stdout=subprocess.DEVNULL,
            stderr=err if err is not None else subprocess.DEVNULL,
        )
        try:
            deadline = began + 30
            while not metadata_answered(port):
                if proc.poll() is not None or time.perf_counter() > deadline:
                    raise RuntimeError(f"the broker from {source} did not answer (exit code {proc.poll()})")
                time.sleep(0.002)
            wall = (time.perf_counter() - began) * 1000
            proc.send_signal(signal.SIGSTOP)
            cpu = cpu_ms(proc.pid)
        finally:
            proc.kill()
            proc.wait()
            if err is not None:
                err.close()
    return wall, cpu


def import_split(log: Path) -> dict[str, float]:
    """Self import times (ms) of an ``-X importtime`` log by who caused them: site, trio, kbroker/protocol's own
    modules, and the other modules those import."""
    rows = []
    for line in log.read_text().splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            fields = line.split("|")
            name = fields[2]
            rows.append((name.strip(), (len(name) - len(name.lstrip(" ")) - 1) // 2, int(fields[0].split(":")[1])))
    split: dict[str, float] = {}
    ancestors: list[tuple[int, str]] = []  # a module's importer follows it in the log, one level less indented
    for name, depth, self_us in reversed(rows):
        while ancestors and ancestors[-1][0] >= depth:
            ancestors.pop()
        inherited = ancestors[-1][1] if ancestors else ""
        if inherited in ("site", "trio"):
            group = inherited
        elif name == "site" or name.split(".")[0] == "trio":
            group = name.split(".")[0]
        elif name.split(".")[0] in ("kbroker", "protocol"):
            group = "kbroker+protocol"
        elif inherited:
            group = "imported by kbroker"
        else:
            group = "other"
        ancestors.append((depth, group))
        split[group] = split.get(group, 0.0) + self_us / 1000
    return split


def describe(values: list[float]) -> str:
    return f"{statistics.median(values):6.1f} ms ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--checkout", action="append", default=[], metavar="NAME=PATH", help="another checkout")
    parser.add_argument("--importtime", action="store_true", help="also split the import time (-X importtime)")
    args = parser.parse_args()
    sources = {"this": ROOT, **{k: Path(v) for k, v in (item.split("=", 1) for item in args.checkout)}}
    for source in sources.values():
        for package in ("kbroker", "protocol"):
            compileall.compile_dir(source / package, quiet=1)
    walls: dict[str, list[float]] = {name: [] for name in sources}
    cpus: dict[str, list[float]] = {name: [] for name in sources}
    splits: dict[str, list[dict[str, float]]] = {name: [] for name in sources}
    order = list(sources)
    for rep in range(args.repeat):
        for name in order[rep % len(order) :] + order[: rep % len(order)]:
            wall, cpu = start_once(sources[name], [])
            walls[name].append(wall)
            cpus[name].append(cpu)
            if args.importtime:
                with tempfile.TemporaryDirectory() as tmp:
                    log = Path(tmp) / "importtime.log"
                    start_once(sources[name], ["-X", "importtime"], log)
                    splits[name].append(import_split(log))
    print(f"spawn to the first Metadata answer, median (min-max) of {args.repeat}; load {os.getloadavg()[0]:.1f}")
    for name in sources:
        print(f"{name:<10} wall {describe(walls[name])}   broker cpu {describe(cpus[name])}")
    if args.importtime:
        print("import time by cause (-X importtime, self times, median):")
        for name in sources:
            groups = sorted({group for split in splits[name] for group in split})
            parts = [f"{g} {statistics.median(s.get(g, 0.0) for s in splits[name]):.1f}" for g in groups]
            total = statistics.median(sum(s.values()) for s in splits[name])
            print(f"{name:<10} {', '.join(parts)}; all {total:.1f} ms")


if __name__ == "__main__":
    main()
