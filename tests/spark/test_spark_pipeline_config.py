"""The pipeline's settings: where the Kafka connector comes from, the session, the Kafka options, the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")

from compat.spark import pipeline  # noqa: E402

ENV = pipeline.CONNECTOR_JARS_ENV
PACKAGE = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def never() -> bool:
    raise AssertionError("Maven Central must not be probed when the jars are given")


def jar(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PK")
    return str(path)


def test_connector_jars_from_the_environment(tmp_path: Path) -> None:
    single = jar(tmp_path / "spark-sql-kafka-0-10_2.13.jar")
    directory = tmp_path / "libs"
    in_directory = [jar(directory / "kafka-clients.jar"), jar(directory / "commons-pool2.jar")]
    (directory / "README").write_text("not a jar")
    paths = f"{single}{os.pathsep}{directory}, "
    assert pipeline.connector_conf({ENV: paths}, never) == {"spark.jars": ",".join([single, *sorted(in_directory)])}
    assert pipeline.connector_conf({ENV: f"{single},{single}"}, never) == {"spark.jars": f"{single},{single}"}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("/nowhere/spark-sql-kafka.jar", f"{ENV}: /nowhere/spark-sql-kafka.jar does not exist"),
        (", ,", f"{ENV} is set but names no jar"),
    ],
)
def test_connector_jars_that_are_not_there(value: str, reason: str) -> None:
    with pytest.raises(pipeline.ConnectorUnavailable) as raised:
        pipeline.connector_conf({ENV: value}, never)
    assert str(raised.value) == reason


def test_connector_jars_directory_without_jars(tmp_path: Path) -> None:
    with pytest.raises(pipeline.ConnectorUnavailable, match=f"{ENV}: no \\*.jar in directory {tmp_path}"):
        pipeline.connector_conf({ENV: str(tmp_path)}, never)


def test_connector_from_maven_or_nowhere() -> None:
    assert pipeline.connector_conf({}, lambda: True) == {"spark.jars.packages": PACKAGE}
    assert pipeline.connector_conf({ENV: "  "}, lambda: True) == {"spark.jars.packages": PACKAGE}
    assert pipeline.connector_conf({}, lambda: True, spark_version="4.0.1") == {
        "spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.1"
    }
    with pytest.raises(pipeline.ConnectorUnavailable) as raised:
        pipeline.connector_conf({}, lambda: False)
    assert str(raised.value) == (
        f"the Kafka connector ({PACKAGE}) is unavailable: {ENV} is not set and Maven Central (repo1.maven.org) "
        "cannot be reached"
    )


def test_session_settings() -> None:
    def conf(master: str | None, env: dict[str, str], **kwargs: object) -> dict[str, str]:
        return pipeline.session_conf(master, env=env, maven_probe=lambda: True, **kwargs)  # type: ignore[arg-type]

    utc = {"spark.sql.session.timeZone": "UTC"}
    assert conf(None, {}) == {"spark.master": "local[*]", "spark.jars.packages": PACKAGE, **utc}
    assert conf("spark://head:7077", {}, connector=False) == {"spark.master": "spark://head:7077", **utc}
    assert conf(None, {}, extra={"spark.sql.session.timeZone": "Europe/Paris", "spark.executor.memory": "2g"}) == {
        "spark.master": "local[*]",
        "spark.jars.packages": PACKAGE,
        "spark.sql.session.timeZone": "Europe/Paris",
        "spark.executor.memory": "2g",
    }
    # Under spark-submit its own --master and --packages/--jars hold; an explicit master still goes through.
    submitted = {"PYSPARK_GATEWAY_PORT": "40000"}
    assert conf(None, submitted) == utc
    assert conf("yarn", submitted) == {"spark.master": "yarn", **utc}


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


def test_connector_command_says_why_not(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV, "/nowhere/connector.jar")
    assert pipeline.main(["connector"]) == 1
    assert capsys.readouterr().err == f"{ENV}: /nowhere/connector.jar does not exist\n"


def test_commands_without_the_connector_say_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before any Spark starts: the connector settings are worked out first.
    monkeypatch.setenv(ENV, "/nowhere/connector.jar")
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert pipeline.main(["batch", "--input", "in", "--output", "out"]) == 1
    assert pipeline.main(["stream", "--input", "in", "--output", "out", "--checkpoint", "ck"]) == 1
    assert capsys.readouterr().err == f"{ENV}: /nowhere/connector.jar does not exist\n" * 2
