"""The Java Kafka client (kafka-clients 3.9.0 and 4.4.0) and its runtime jars, from Maven Central.

A thin layer over tools/maven_artifacts.py (sets ``kafka-clients-<version>`` and ``java-logging``) that adds
a log4j2 configuration and compiles the Java programs of the tests and the compat suite against a version.

    python tools/java_clients.py          # fetch every version, print the dirs
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

if __package__:
    from . import maven_artifacts
else:  # run as a script, or loaded by path (tests/conftest.py)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import maven_artifacts

VERSIONS = ["3.9.0", "4.4.0"]

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
    """The jars could not be obtained (no mvn, no network, an unknown version); the message is one line."""


def _set_name(version: str) -> str:
    if version not in VERSIONS:
        raise JavaClientsUnavailable(f"unknown kafka-clients version {version!r}; known: {', '.join(VERSIONS)}")
    return f"kafka-clients-{version}"


def prepare(version: str) -> Path:
    """Fetch kafka-clients ``version`` and its runtime jars (a no-op once fetched); their directory."""
    try:
        return maven_artifacts.prepare(_set_name(version))
    except maven_artifacts.MavenUnavailable as exc:
        raise JavaClientsUnavailable(str(exc)) from None


def _logging_dir() -> Path:
    """log4j's jars and a log4j2.properties that logs to stderr, in one directory."""
    try:
        directory = maven_artifacts.prepare("java-logging")
    except maven_artifacts.MavenUnavailable as exc:
        raise JavaClientsUnavailable(str(exc)) from None
    properties = directory / "log4j2.properties"
    if not properties.exists():
        properties.write_text(LOG4J2_PROPERTIES)
    return directory


def classpath(version: str, logging: bool = False) -> str:
    """The classpath of kafka-clients ``version`` and its runtime jars (fetched if need be).

    With ``logging`` it also holds log4j and the directory of a log4j2.properties that logs to stderr
    at the level in the environment variable KBROKER_JAVA_LOG (default warn).
    """
    entries = sorted(prepare(version).glob("*.jar"))
    if logging:
        directory = _logging_dir()
        entries += [*sorted(directory.glob("*.jar")), directory]
    return os.pathsep.join(map(str, entries))


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
    jars = classpath(version, logging=logging)
    classes.mkdir(parents=True, exist_ok=True)
    sources = [str(source), *map(str, shared)]
    command = [javac, "-Xlint:all", "-Werror", "-d", str(classes), "-cp", jars, *sources]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"javac {source.name} against kafka-clients {version} failed:\n{run.stderr}")
    return [java, *JAVA_FLAGS, "-cp", os.pathsep.join([jars, str(classes)]), source.stem]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", default=VERSIONS, help="kafka-clients versions (default: all)")
    args = parser.parse_args(argv)
    for version in args.versions:
        try:
            directory = prepare(version)
        except JavaClientsUnavailable as exc:
            print(f"error: kafka-clients {version}: {exc}", file=sys.stderr)
            return 1
        print(f"{version}\t{directory}\t{' '.join(p.name for p in sorted(directory.glob('*.jar')))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
