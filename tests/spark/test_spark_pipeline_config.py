"""The pipeline's settings: where the Kafka connector comes from, the session, the Kafka options, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from compat.spark import pipeline  # noqa: E402

PACKAGE = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
REPOSITORY = Path(__file__).resolve().parents[2]


def never() -> list[str]:
    raise AssertionError("the Maven set must not be fetched when the connector is given")


def jar(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PK")
    return str(path)


def test_connector_jars_as_given(tmp_path: Path) -> None:
    single = jar(tmp_path / "spark-sql-kafka-0-10_2.13.jar")
    directory = tmp_path / "libs"
    in_directory = [jar(directory / "kafka-clients.jar"), jar(directory / "commons-pool2.jar")]
    (directory / "README").write_text("not a jar")
    paths = f"{single}{os.pathsep}{directory}, "
    expected = ",".join([single, *sorted(in_directory)])
    assert pipeline.connector_conf(jars=paths, maven_set=never) == {"spark.jars": expected}
    assert pipeline.connector_conf(jars=f"{single},{single}", maven_set=never) == {"spark.jars": f"{single},{single}"}


def test_connector_packages_as_given(tmp_path: Path) -> None:
    assert pipeline.connector_conf(packages=PACKAGE, maven_set=never) == {"spark.jars.packages": PACKAGE}
    pool = jar(tmp_path / "commons-pool2.jar")
    assert pipeline.connector_conf(jars=pool, packages=PACKAGE, maven_set=never) == {
        "spark.jars.packages": PACKAGE,
        "spark.jars": pool,
    }


@pytest.mark.parametrize(
    ("jars", "packages", "reason"),
    [
        ("/nowhere/spark-sql-kafka.jar", None, "--jars: /nowhere/spark-sql-kafka.jar does not exist"),
        (", ,", None, "--jars names no jar"),
        (None, ",", "--packages names no Maven coordinates"),
    ],
)
def test_connector_that_is_not_there(jars: str | None, packages: str | None, reason: str) -> None:
    with pytest.raises(pipeline.ConnectorUnavailable) as raised:
        pipeline.connector_conf(jars, packages, maven_set=never)
    assert str(raised.value) == reason


def test_connector_jars_directory_without_jars(tmp_path: Path) -> None:
    with pytest.raises(pipeline.ConnectorUnavailable, match=f"--jars: no \\*.jar in directory {tmp_path}"):
        pipeline.connector_conf(jars=str(tmp_path), maven_set=never)


def test_connector_from_the_repositorys_maven_set() -> None:
    assert pipeline.connector_conf(maven_set=lambda: ["/a.jar", "/b.jar"]) == {"spark.jars": "/a.jar,/b.jar"}
    # The real set, at the pinned pyspark's version (what the tests' session and the README's commands use).
    jars = pipeline.connector_conf()["spark.jars"].split(",")
    names = {Path(path).name for path in jars}
    version = pyspark.__version__
    assert {f"spark-sql-kafka-0-10_2.13-{version}.jar", f"spark-token-provider-kafka-0-10_2.13-{version}.jar"} <= names
    assert any(name.startswith("kafka-clients-") for name in names)
    assert any(name.startswith("commons-pool2-") for name in names)
    assert all(Path(path).is_absolute() and Path(path).is_file() for path in jars)


def test_the_maven_set_pins_the_installed_pysparks_version() -> None:
    pom = (REPOSITORY / "tools" / "maven" / f"{pipeline.CONNECTOR_ARTIFACT_SET}.pom.xml").read_text()
    assert f"<spark.version>{pyspark.__version__}</spark.version>" in pom
    pyproject = (REPOSITORY / "pyproject.toml").read_text()
    assert f'"pyspark=={pyspark.__version__}"' in pyproject


def test_connector_outside_the_repository(tmp_path: Path) -> None:
    with pytest.raises(pipeline.ConnectorUnavailable) as raised:
        pipeline.maven_set_jars(tmp_path)
    assert str(raised.value) == (
        f"no Kafka connector: pass --packages {PACKAGE} (Spark fetches it from Maven Central) or --jars with its "
        "jars, or run the pipeline from the kbroker repository (its tools/maven_artifacts.py fetches them)"
    )


def test_session_settings() -> None:
    utc = {"spark.sql.session.timeZone": "UTC"}
    local = {**pipeline.LOCAL_CONF, **utc}
    jars = {"spark.jars": "/a.jar"}
    assert pipeline.session_conf(None, connector=jars, env={}) == {"spark.master": "local[*]", **jars, **local}
    assert pipeline.session_conf("local[2]", env={}) == {"spark.master": "local[2]", **local}
    assert pipeline.session_conf("spark://head:7077", env={}) == {"spark.master": "spark://head:7077", **utc}
    extra = {"spark.sql.session.timeZone": "Europe/Paris", "spark.sql.shuffle.partitions": "8"}
    assert pipeline.session_conf(None, connector=jars, extra=extra, env={}) == {
        "spark.master": "local[*]",
        "spark.jars": "/a.jar",
        "spark.sql.shuffle.partitions": "8",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "Europe/Paris",
    }
    # Under spark-submit its own --master and --packages/--jars hold; an explicit master still goes through.
    submitted = {"PYSPARK_GATEWAY_PORT": "40000"}
    assert pipeline.session_conf(None, connector=jars, env=submitted) == utc
    assert pipeline.session_conf("yarn", env=submitted) == {"spark.master": "yarn", **utc}


def test_offsets_json() -> None:
    text = pipeline.offsets_json("events", {1: pipeline.EARLIEST, 0: 5, 10: pipeline.LATEST})
    assert text == '{"events": {"0": 5, "1": -2, "10": -1}}'
    assert json.loads(text) == {"events": {"0": 5, "1": -2, "10": -1}}


def test_stream_command_line() -> None:
    args = pipeline.parser().parse_args(
        [
            "stream",
            "--master",
            "spark://head:7077",
            "--bootstrap",
            "broker:9092",
            "--input",
            "events",
            "--output",
            "totals",
            "--checkpoint",
            "/tmp/ck",
            "--window",
            "5 minutes",
            "--slide",
            "1 minute",
            "--watermark",
            "2 minutes",
            "--starting-offsets",
            '{"events":{"0":7}}',
            "--max-offsets-per-trigger",
            "1000",
            "--fail-on-data-loss",
            "false",
            "--output-mode",
            "update",
            "--trigger",
            "30 seconds",
            "--kafka-option",
            "security.protocol=SASL_SSL",
            "--kafka-option",
            "sasl.jaas.config=a=b c=d",
            "--conf",
            "spark.executor.memory=2g",
        ]
    )
    assert args.master == "spark://head:7077" and args.conf == [("spark.executor.memory", "2g")]
    job = pipeline.job_from_args(args)
    assert job == pipeline.StreamJob(
        bootstrap="broker:9092",
        input_topic="events",
        output_topic="totals",
        checkpoint="/tmp/ck",
        window="5 minutes",
        watermark="2 minutes",
        slide="1 minute",
        starting_offsets='{"events":{"0":7}}',
        max_offsets_per_trigger=1000,
        fail_on_data_loss=False,
        output_mode="update",
        trigger_interval="30 seconds",
        available_now=False,
        client={"security.protocol": "SASL_SSL", "sasl.jaas.config": "a=b c=d"},
    )
    assert job.source_options() == {
        "kafka.bootstrap.servers": "broker:9092",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.jaas.config": "a=b c=d",
        "subscribe": "events",
        "startingOffsets": '{"events":{"0":7}}',
        "failOnDataLoss": "false",
        "maxOffsetsPerTrigger": "1000",
    }


def test_stream_command_line_defaults() -> None:
    args = pipeline.parser().parse_args(["stream", "--input", "in", "--output", "out", "--checkpoint", "ck"])
    assert args.master is None
    job = pipeline.job_from_args(args)
    assert job == pipeline.StreamJob(bootstrap="localhost:9092", input_topic="in", output_topic="out", checkpoint="ck")
    assert (job.window, job.watermark, job.output_mode, job.available_now) == (
        "1 minute",
        "30 seconds",
        "append",
        False,
    )
    assert job.source_options() == {
        "kafka.bootstrap.servers": "localhost:9092",
        "subscribe": "in",
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
    }


def test_batch_command_line() -> None:
    starting = pipeline.offsets_json("in", {0: 3, 1: pipeline.EARLIEST})
    ending = pipeline.offsets_json("in", {0: 9, 1: pipeline.LATEST})
    args = pipeline.parser().parse_args(
        ["batch", "--input", "in", "--output", "out", "--starting-offsets", starting, "--ending-offsets", ending]
    )
    job = pipeline.job_from_args(args)
    assert job == pipeline.BatchJob(
        bootstrap="localhost:9092",
        input_topic="in",
        output_topic="out",
        starting_offsets=starting,
        ending_offsets=ending,
    )
    assert job.source_options() == {
        "kafka.bootstrap.servers": "localhost:9092",
        "subscribe": "in",
        "startingOffsets": '{"in": {"0": 3, "1": -2}}',
        "endingOffsets": '{"in": {"0": 9, "1": -1}}',
        "failOnDataLoss": "true",
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["stream", "--input", "in", "--output", "out"],  # no checkpoint
        ["stream", "--input", "in", "--output", "out", "--checkpoint", "ck", "--trigger", "1s", "--available-now"],
        ["stream", "--input", "in", "--output", "out", "--checkpoint", "ck", "--output-mode", "complete"],
        ["batch", "--input", "in", "--output", "out", "--fail-on-data-loss", "maybe"],
        ["batch", "--input", "in", "--output", "out", "--kafka-option", "no-equals-sign"],
        ["batch", "--input", "in"],
    ],
)
def test_bad_command_lines_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        pipeline.parser().parse_args(argv)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_connector_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pool = jar(tmp_path / "commons-pool2.jar")
    assert pipeline.main(["connector", "--jars", pool, "--packages", PACKAGE]) == 0
    assert json.loads(capsys.readouterr().out) == {"spark.jars.packages": PACKAGE, "spark.jars": pool}
    assert pipeline.main(["connector", "--jars", "/nowhere/connector.jar"]) == 1
    assert capsys.readouterr().err == "error: --jars: /nowhere/connector.jar does not exist\n"


def test_commands_without_the_connector_say_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before any Spark starts: the connector settings are worked out first.
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    missing = ["--jars", "/nowhere/connector.jar"]
    assert pipeline.main(["batch", "--input", "in", "--output", "out", *missing]) == 1
    assert pipeline.main(["stream", "--input", "in", "--output", "out", "--checkpoint", "ck", *missing]) == 1
    assert capsys.readouterr().err == "error: --jars: /nowhere/connector.jar does not exist\n" * 2


def test_a_connector_that_cannot_be_fetched_is_one_line(tmp_path: Path) -> None:
    """No Maven (an empty cache, no mvn on PATH): one line naming what could not be fetched, no traceback."""
    env = {**os.environ, "KBROKER_MAVEN_CACHE": str(tmp_path / "cache"), "PATH": str(tmp_path)}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    command = [sys.executable, str(REPOSITORY / "compat" / "spark" / "pipeline.py"), "batch", "--input", "in"]
    run = subprocess.run([*command, "--output", "out"], capture_output=True, text=True, env=env, timeout=120)
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr == (
        f"error: no Kafka connector ({PACKAGE}): cannot fetch spark-kafka: mvn is not installed "
        "(apt-get install -y maven)\n"
    )
