"""tools/maven_artifacts.py: the pinned JVM artifact sets are there, and what cannot be fetched is said in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools import maven_artifacts

REPO = Path(__file__).resolve().parents[1]


def run_tool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(REPO / "tools" / "maven_artifacts.py"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


def test_every_set_is_fetched_with_its_pinned_versions() -> None:
    assert maven_artifacts.sets() == [
        "java-logging",
        "kafka-4.4.0",
        "kafka-clients-3.9.0",
        "kafka-clients-4.4.0",
        "kafka-tools-4.4.0",
        "spark-kafka",
    ]
    names = {name: {jar.name for jar in maven_artifacts.jars(name)} for name in maven_artifacts.sets()}
    assert {"kafka_2.13-4.4.0.jar", "kafka-server-4.4.0.jar", "kafka-clients-4.4.0.jar"} <= names["kafka-4.4.0"]
    assert any(n.startswith("log4j-slf4j-impl-") for n in names["kafka-4.4.0"])  # Kafka's log goes somewhere
    assert "kafka-clients-3.9.0.jar" in names["kafka-clients-3.9.0"]
    assert "kafka-clients-4.4.0.jar" in names["kafka-clients-4.4.0"]
    assert "kafka-tools-4.4.0.jar" in names["kafka-tools-4.4.0"]  # kafka-transactions.sh (TransactionsCommand)
    for clients in ("kafka-clients-3.9.0", "kafka-clients-4.4.0"):  # every codec a producer may be asked for
        assert {n.split("-")[0] for n in names[clients]} >= {"lz4", "snappy", "zstd"}
    import pyspark

    assert f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar" in names["spark-kafka"]


def test_an_unknown_set_is_one_line_naming_the_known_ones() -> None:
    run = run_tool("kafka-9.9.9")
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "error: unknown Maven artifact set 'kafka-9.9.9'; known: "
        "java-logging, kafka-4.4.0, kafka-clients-3.9.0, kafka-clients-4.4.0, kafka-tools-4.4.0, spark-kafka"
    ]


def test_without_maven_the_message_says_so(tmp_path: Path) -> None:
    env = {"PATH": str(Path(sys.executable).parent), "KBROKER_MAVEN_CACHE": str(tmp_path), "HOME": str(tmp_path)}
    run = run_tool("java-logging", env=env)
    assert run.returncode == 1
    assert run.stderr.strip() == "error: cannot fetch java-logging: mvn is not installed (apt-get install -y maven)"


def test_a_version_maven_central_does_not_serve_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    poms = tmp_path / "poms"
    poms.mkdir()
    pom = (maven_artifacts.POMS / "kafka-clients-4.4.0.pom.xml").read_text()
    unserved = pom.replace("<version>4.4.0</version>", "<version>0.0.1</version>")
    (poms / "kafka-clients-0.0.1.pom.xml").write_text(unserved)
    monkeypatch.setattr(maven_artifacts, "POMS", poms)
    monkeypatch.setenv("KBROKER_MAVEN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(maven_artifacts.MavenUnavailable) as raised:
        maven_artifacts.prepare("kafka-clients-0.0.1")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("cannot fetch kafka-clients-0.0.1 from Maven Central: ")
    assert "org.apache.kafka:kafka-clients:jar:0.0.1" in message
    assert not (tmp_path / "cache" / "kafka-clients-0.0.1").exists()  # nothing half-fetched is left as complete
