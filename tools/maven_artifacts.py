"""JVM artifacts from Maven Central, at pinned versions: Apache Kafka, the Java clients, Spark's Kafka connector.

Each set is one pom under tools/maven/ (``<set>.pom.xml``) whose dependencies, with everything they need at
run time, ``mvn dependency:copy-dependencies`` copies into ``$KBROKER_MAVEN_CACHE/<set>/`` (default
``~/.cache/kbroker/maven``). Nothing is built; a set whose directory is complete is never fetched again.

    python tools/maven_artifacts.py                 # every set (what .ci/run does)
    python tools/maven_artifacts.py kafka-4.4.0     # one set; prints its directory and jars

The sets:
- ``kafka-4.4.0``: the Apache Kafka broker (``kafka.Kafka``, ``kafka.tools.StorageTool``) with log4j2;
- ``kafka-clients-3.9.0``, ``kafka-clients-4.4.0``: the Java client with its compression libraries; the
  4.4.0 jar also carries Kafka's message schemas, the input of tools/gen_messages.py;
- ``kafka-tools-4.4.0``: Kafka's command-line tools (``kafka-transactions.sh`` is
  ``org.apache.kafka.tools.TransactionsCommand``), run against kbroker in tests/transactions;
- ``java-logging``: log4j2 as an SLF4J 2 provider, for a client's log when asked for;
- ``spark-kafka``: spark-sql-kafka-0-10 and spark-token-provider-kafka-0-10 at the pinned pyspark's version
  (Spark's provided dependencies are pyspark's own jars).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POMS = Path(__file__).resolve().parent / "maven"
COMPLETE = ".complete"


class MavenUnavailable(RuntimeError):
    """A set could not be fetched (no mvn, no network, an unknown version); the message is one line."""


def sets() -> list[str]:
    return sorted(path.name.removesuffix(".pom.xml") for path in POMS.glob("*.pom.xml"))


def cache_dir() -> Path:
    return Path(os.environ.get("KBROKER_MAVEN_CACHE") or Path.home() / ".cache" / "kbroker" / "maven")


def set_dir(name: str) -> Path:
    return cache_dir() / name


def is_prepared(name: str) -> bool:
    return (set_dir(name) / COMPLETE).exists()


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One fetcher at a time (parallel test sessions, CI steps)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _maven_error(output: str) -> str:
    """The line of Maven's output that says what went wrong, without its log prefix."""
    for line in output.splitlines():
        line = line.replace("\x1b[0m", "").replace("\x1b[1;31m", "").strip()
        if line.startswith("[ERROR]") and len(line) > len("[ERROR] "):
            return re.split(r" in central \(| -> \[Help", line.removeprefix("[ERROR] "))[0][:400]
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:400] if lines else "no output"


def prepare(name: str) -> Path:
    """Make ``<cache>/<name>`` hold the set's jars; a no-op when it already does. Raises MavenUnavailable."""
    pom = POMS / f"{name}.pom.xml"
    if not pom.exists():
        raise MavenUnavailable(f"unknown Maven artifact set {name!r}; known: {', '.join(sets())}")
    target = set_dir(name)
    if is_prepared(name):
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenUnavailable(f"cannot fetch {name}: mvn is not installed (apt-get install -y maven)")
    root = cache_dir()
    with _locked(root):
        if is_prepared(name):
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        staging.chmod(0o755)
        command = [
            mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
        ]  # fmt: skip
        try:
            try:
                run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise MavenUnavailable(f"cannot fetch {name} from Maven Central: {exc}") from None
            if run.returncode != 0 or not any(staging.glob("*.jar")):
                detail = _maven_error(run.stdout + "\n" + run.stderr)
                raise MavenUnavailable(f"cannot fetch {name} from Maven Central: {detail}")
            (staging / COMPLETE).write_text("\n".join(sorted(p.name for p in staging.glob("*.jar"))) + "\n")
            if target.exists():  # an earlier, interrupted fetch
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return target


def jars(name: str) -> list[Path]:
    """The set's jars, fetched first if need be."""
    return sorted(prepare(name).glob("*.jar"))


def classpath(name: str) -> str:
    return os.pathsep.join(str(path) for path in jars(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="*", default=None, help=f"artifact sets (default: all of {', '.join(sets())})")
    args = parser.parse_args(argv)
    failed = False
    for name in args.sets or sets():
        try:
            found = jars(name)
        except MavenUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
            continue
        print(f"{name}\t{set_dir(name)}\t{len(found)} jars")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
