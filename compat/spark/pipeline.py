"""Per-key totals in event-time windows, from a Kafka topic to another, with PySpark and spark-sql-kafka-0-10.

One self-contained file (only the standard library and pyspark), so the same file runs locally, from the
repository, and on a cluster through spark-submit:

    python compat/spark/pipeline.py stream --bootstrap localhost:9092 --input events --output totals \\
        --checkpoint /tmp/totals-checkpoint --window "1 minute" --watermark "30 seconds"
    python compat/spark/pipeline.py batch --bootstrap localhost:9092 --input events --output totals \\
        --starting-offsets '{"events":{"0":0,"1":-2}}' --ending-offsets '{"events":{"0":100,"1":-1}}'
    python pipeline.py stream --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 ...   # only pyspark
    spark-submit --master spark://host:7077 \\
        --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<the cluster's Spark version> \\
        compat/spark/pipeline.py stream ...
    python compat/spark/pipeline.py connector      # the Kafka connector's Spark settings, or why there are none

``--master`` defaults to ``local[*]`` (under spark-submit, to spark-submit's own master).

Input records: the value is a UTF-8 JSON object (the Kafka key is not used)::

    {"key": "store-7", "ts": "2024-05-01T12:00:03.250Z", "amount": 12.5}
    {"key": "store-7", "ts": 1714564803250, "amount": 3}

- ``key``: the group key, a string (Spark takes a JSON number there as its text).
- ``ts``: the event time, ISO-8601 text (with a zone offset or ``Z``; without one, in the session time zone,
  which this pipeline sets to UTC) or epoch milliseconds (a JSON integer, or a string of digits).
- ``amount``: a JSON number.

A record that does not fit is dropped, not an error: one bad producer must not stop the stream.

Output records: key = the group key (UTF-8), value = a JSON object, window bounds in epoch milliseconds,
the window being [window_start, window_end)::

    {"key":"store-7","window_start":1714564800000,"window_end":1714564860000,"count":2,"total":15.5}

In the default ``append`` output mode each window is written once, when the watermark (the latest event
time seen, less ``--watermark``) passes its end; events older than the watermark are dropped. ``update``
writes a window's running total after every micro-batch that changes it.

The connector: spark-sql-kafka-0-10 is not part of pyspark. ``--packages`` (Maven coordinates, which Spark
resolves from Maven Central, e.g. org.apache.spark:spark-sql-kafka-0-10_2.13 at the installed pyspark's version)
or ``--jars`` (files or directories of jars: the connector, spark-token-provider-kafka-0-10, kafka-clients,
commons-pool2) say where it comes from, as they do for spark-submit. Given neither, and run from the kbroker
repository, the pipeline uses the repository's pinned Maven set (tools/maven/spark-kafka.pom.xml, fetched once
by tools/maven_artifacts.py into ~/.cache/kbroker/maven/spark-kafka). Under spark-submit, spark-submit's own
``--packages``/``--jars`` (or the cluster's jars) hold and the pipeline adds nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyspark
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import DoubleType, StringType, StructField, StructType

# tools/maven/spark-kafka.pom.xml: the connector at the pinned pyspark's version, with its dependencies.
CONNECTOR_ARTIFACT_SET = "spark-kafka"
REPOSITORY_TOOLS = Path(__file__).resolve().parents[2] / "tools"

# In one local JVM: 4 shuffle partitions instead of Spark's 200, each of which is a window state store that every
# micro-batch visits (a stream keeps the number its checkpoint was started with); no console progress bar.
LOCAL_CONF = {"spark.sql.shuffle.partitions": "4", "spark.ui.showConsoleProgress": "false"}

# Spark's per-partition offset sentinels in startingOffsets/endingOffsets JSON.
EARLIEST = -2
LATEST = -1

# The value schema. ts is read as text: a JSON number comes through as its digits, so both forms parse.
EVENT_SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("ts", StringType()),
        StructField("amount", DoubleType()),
    ]
)
# Epoch milliseconds of at most 15 digits (up to the year 33658): timestamp_millis of anything larger
# overflows, which with ANSI mode on (Spark 4's default) fails the whole query instead of one record.
EPOCH_MILLIS = r"^-?[0-9]{1,15}$"
OUTPUT_FIELDS = ("key", "window_start", "window_end", "count", "total")


# ------------------------------------------------------------------------------------- the connector


class ConnectorUnavailable(RuntimeError):
    """spark-sql-kafka-0-10 cannot be had as asked (or, asked nothing, from the repository's Maven set)."""


def connector_package(spark_version: str = pyspark.__version__) -> str:
    """The connector's Maven coordinates for this pyspark (Spark 4 is built for Scala 2.13 only)."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}"


def connector_jars(paths: str) -> list[str]:
    """The jar files named by ``paths`` (os.pathsep- or comma-separated files and directories of jars)."""
    jars: list[str] = []
    for entry in paths.replace(os.pathsep, ",").split(","):
        if not entry.strip():
            continue
        path = Path(entry.strip()).expanduser()
        if path.is_dir():
            found = sorted(str(jar.resolve()) for jar in path.glob("*.jar"))
            if not found:
                raise ConnectorUnavailable(f"--jars: no *.jar in directory {path}")
            jars.extend(found)
        elif path.is_file():
            jars.append(str(path.resolve()))
        else:
            raise ConnectorUnavailable(f"--jars: {path} does not exist")
    if not jars:
        raise ConnectorUnavailable("--jars names no jar")
    return jars


def maven_set_jars(tools: Path = REPOSITORY_TOOLS) -> list[str]:
    """The connector's jars from the repository's Maven set, fetched from Maven Central on first use."""
    if not (tools / "maven_artifacts.py").is_file():
        raise ConnectorUnavailable(
            f"no Kafka connector: pass --packages {connector_package()} (Spark fetches it from Maven Central) or "
            "--jars with its jars, or run the pipeline from the kbroker repository (its tools/maven_artifacts.py "
            "fetches them)"
        )
    if str(tools) not in sys.path:
        sys.path.insert(0, str(tools))
    import maven_artifacts

    try:
        return [str(jar) for jar in maven_artifacts.jars(CONNECTOR_ARTIFACT_SET)]
    except maven_artifacts.MavenUnavailable as exc:
        raise ConnectorUnavailable(f"no Kafka connector ({connector_package()}): {exc}") from None


def connector_conf(
    jars: str | None = None, packages: str | None = None, maven_set: Callable[[], list[str]] = maven_set_jars
) -> dict[str, str]:
    """The Spark settings that bring in the Kafka connector: ``packages`` (Maven coordinates, comma-separated)
    and/or ``jars`` as given, else the repository's Maven set. ConnectorUnavailable says why there are none."""
    conf: dict[str, str] = {}
    if packages is not None:
        if not packages.strip(","):
            raise ConnectorUnavailable("--packages names no Maven coordinates")
        conf["spark.jars.packages"] = packages
    if jars is not None:
        conf["spark.jars"] = ",".join(connector_jars(jars))
    if not conf:
        conf["spark.jars"] = ",".join(maven_set())
    return conf


def launched_by_spark_submit(env: Mapping[str, str] = os.environ) -> bool:
    """Under spark-submit the JVM already runs: its master and jars are settled, the builder cannot change them."""
    return "PYSPARK_GATEWAY_PORT" in env


def session_conf(
    master: str | None = None,
    *,
    connector: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
    env: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """The settings ``build_session`` uses: master, the connector's (connector_conf), LOCAL_CONF for a local
    master, UTC, then ``extra`` (which wins). Under spark-submit its own --master and --packages/--jars hold:
    only an explicit master and the rest go through."""
    conf: dict[str, str] = {}
    submitted = launched_by_spark_submit(env)
    if master is not None:
        conf["spark.master"] = master
    elif not submitted:
        conf["spark.master"] = "local[*]"
    if not submitted:
        conf.update(connector or {})
    if conf.get("spark.master", "").startswith("local"):
        conf.update(LOCAL_CONF)
    # Window bounds and ISO timestamps without a zone must not depend on the machine's time zone.
    conf["spark.sql.session.timeZone"] = "UTC"
    conf.update(extra or {})
    return conf


def build_session(
    master: str | None = None,
    *,
    app_name: str = "kbroker-spark-pipeline",
    connector: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for the pipeline; ``connector``: the settings of connector_conf (None: without Kafka)."""
    builder = SparkSession.builder.appName(app_name)
    for key, value in session_conf(master, connector=connector, extra=extra).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


# ------------------------------------------------------------------------------- the transformation


def event_time(ts: Column) -> Column:
    """Epoch milliseconds or ISO-8601 text as a timestamp; null when it is neither."""
    digits = F.trim(ts)
    return F.when(digits.rlike(EPOCH_MILLIS), F.timestamp_millis(digits.try_cast("long"))).otherwise(
        F.try_to_timestamp(ts)
    )


def parse_events(records: DataFrame) -> DataFrame:
    """key, event_time, amount from the JSON in a ``value`` column (string or binary); misfits dropped."""
    event = F.from_json(F.col("value").cast("string"), EVENT_SCHEMA)
    parsed = records.select(
        event["key"].alias("key"),
        event_time(event["ts"]).alias("event_time"),
        event["amount"].alias("amount"),
    )
    return parsed.where(
        F.col("key").isNotNull() & F.col("event_time").isNotNull() & F.col("amount").isNotNull() & ~F.isnan("amount")
    )


def windowed_totals(events: DataFrame, window: str, watermark: str, slide: str | None = None) -> DataFrame:
    """Count and sum of amount per key per event-time window (tumbling, or sliding by ``slide``).

    The watermark bounds how late an event may be (and how long a window's state is kept) in a stream;
    a batch query ignores it.
    """
    bucket = F.window("event_time", window, slide) if slide else F.window("event_time", window)
    return (
        events.withWatermark("event_time", watermark)
        .groupBy(bucket.alias("window"), F.col("key"))
        .agg(F.count(F.lit(1)).alias("count"), F.sum("amount").alias("total"))
        .select(
            "key",
            F.unix_millis(F.col("window.start")).alias("window_start"),
            F.unix_millis(F.col("window.end")).alias("window_end"),
            "count",
            "total",
        )
    )


def to_kafka_records(totals: DataFrame) -> DataFrame:
    """The Kafka sink's columns: key = the group key, value = the row as JSON."""
    return totals.select(F.col("key"), F.to_json(F.struct(*OUTPUT_FIELDS)).alias("value"))


def transform(records: DataFrame, window: str, watermark: str, slide: str | None = None) -> DataFrame:
    """Kafka records (a ``value`` column) in, Kafka records (key, value) of per-window totals out."""
    return to_kafka_records(windowed_totals(parse_events(records), window, watermark, slide))


# --------------------------------------------------------------------------------------- Kafka I/O


def offsets_json(topic: str, offsets: Mapping[int, int]) -> str:
    """startingOffsets/endingOffsets for one topic: {"topic": {"0": offset, ...}} (EARLIEST -2, LATEST -1)."""
    return json.dumps({topic: {str(partition): offset for partition, offset in sorted(offsets.items())}})


def kafka_client_options(bootstrap: str, client: Mapping[str, str] | None = None) -> dict[str, str]:
    """The bootstrap and any other Kafka client setting (security, timeouts), prefixed ``kafka.`` for Spark."""
    options = {"kafka.bootstrap.servers": bootstrap}
    options.update({f"kafka.{key}": value for key, value in (client or {}).items()})
    return options


@dataclass
class StreamJob:
    bootstrap: str
    input_topic: str
    output_topic: str
    checkpoint: str
    window: str = "1 minute"
    watermark: str = "30 seconds"
    slide: str | None = None
    starting_offsets: str = "earliest"  # or "latest", or per-partition JSON (offsets_json)
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    output_mode: str = "append"  # or "update"
    trigger_interval: str | None = None  # None: the next micro-batch as soon as the last one is done
    available_now: bool = False  # process what the topic has now (in max_offsets_per_trigger batches), then stop
    client: dict[str, str] = field(default_factory=dict)

    def source_options(self) -> dict[str, str]:
        options = kafka_client_options(self.bootstrap, self.client)
        options.update(
            {
                "subscribe": self.input_topic,
                "startingOffsets": self.starting_offsets,
                "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            }
        )
        if self.max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        return options


def start_stream(spark: SparkSession, job: StreamJob, query_name: str | None = None) -> StreamingQuery:
    """Kafka source → transform → Kafka sink, started; the caller awaits or stops the query."""
    records = spark.readStream.format("kafka").options(**job.source_options()).load()
    writer = (
        transform(records, job.window, job.watermark, job.slide)
        .writeStream.format("kafka")
        .options(**kafka_client_options(job.bootstrap, job.client))
        .option("topic", job.output_topic)
        .option("checkpointLocation", job.checkpoint)
        .outputMode(job.output_mode)
    )
    if query_name:
        writer = writer.queryName(query_name)
    if job.available_now:
        writer = writer.trigger(availableNow=True)
    elif job.trigger_interval:
        writer = writer.trigger(processingTime=job.trigger_interval)
    return writer.start()


@dataclass
class BatchJob:
    bootstrap: str
    input_topic: str
    output_topic: str
    starting_offsets: str = "earliest"  # or per-partition JSON (offsets_json)
    ending_offsets: str = "latest"  # or per-partition JSON; the range end is exclusive
    window: str = "1 minute"
    slide: str | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False  # read_batch's rows get a headers column: array<struct<key, value: binary>>
    client: dict[str, str] = field(default_factory=dict)

    def source_options(self) -> dict[str, str]:
        options = kafka_client_options(self.bootstrap, self.client)
        options.update(
            {
                "subscribe": self.input_topic,
                "startingOffsets": self.starting_offsets,
                "endingOffsets": self.ending_offsets,
                "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            }
        )
        if self.include_headers:
            options["includeHeaders"] = "true"
        return options


def read_batch(spark: SparkSession, job: BatchJob) -> DataFrame:
    """The records of the job's offset range: key, value, topic, partition, offset, timestamp, ..."""
    return spark.read.format("kafka").options(**job.source_options()).load()


def write_batch(records: DataFrame, bootstrap: str, topic: str, client: Mapping[str, str] | None = None) -> None:
    """Batch write of (key, value[, partition, headers, timestamp]) rows to ``topic`` with the Kafka sink."""
    records.write.format("kafka").options(**kafka_client_options(bootstrap, client)).option("topic", topic).save()


def run_batch(spark: SparkSession, job: BatchJob) -> int:
    """Totals of the offset range written to the output topic; returns how many records were written."""
    # The batch ignores the watermark (nothing is late in a fixed range); any value will do.
    records = transform(read_batch(spark, job), job.window, "0 seconds", job.slide).persist()
    try:
        written = records.count()
        write_batch(records, job.bootstrap, job.output_topic, job.client)
    finally:
        records.unpersist()
    return written


# ---------------------------------------------------------------------------------- command line


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def true_or_false(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="pipeline.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    commands = top.add_subparsers(dest="command", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--master", help="Spark master (default local[*]; under spark-submit, its master)")
    common.add_argument("--bootstrap", default="localhost:9092", help="Kafka bootstrap servers")
    common.add_argument("--input", required=True, help="topic of JSON events")
    common.add_argument("--output", required=True, help="topic the per-window totals go to")
    common.add_argument("--window", default="1 minute", help="window length (default: 1 minute)")
    common.add_argument("--slide", help="slide interval for sliding windows (default: tumbling)")
    common.add_argument("--fail-on-data-loss", type=true_or_false, default=True, metavar="true|false")
    common.add_argument(
        "--kafka-option", type=key_value, action="append", default=[], metavar="KEY=VALUE", help="Kafka client setting"
    )
    common.add_argument(
        "--conf", type=key_value, action="append", default=[], metavar="KEY=VALUE", help="Spark setting"
    )
    common.add_argument("--packages", help=f"Maven coordinates of the Kafka connector, e.g. {connector_package()}")
    common.add_argument("--jars", help="the Kafka connector's jars (comma-separated files or directories of jars)")

    stream = commands.add_parser("stream", parents=[common], help="run the streaming pipeline")
    stream.add_argument("--checkpoint", required=True, help="checkpoint directory (offsets and window state)")
    stream.add_argument("--watermark", default="30 seconds", help="allowed lateness (default: 30 seconds)")
    stream.add_argument("--starting-offsets", default="earliest", help="earliest, latest or per-partition JSON")
    stream.add_argument("--max-offsets-per-trigger", type=int, help="records per micro-batch at most")
    stream.add_argument("--output-mode", choices=["append", "update"], default="append")
    when = stream.add_mutually_exclusive_group()
    when.add_argument("--trigger", help="micro-batch interval, e.g. '10 seconds' (default: back to back)")
    when.add_argument("--available-now", action="store_true", help="process what is there now, then stop")

    batch = commands.add_parser("batch", parents=[common], help="one batch over an offset range")
    batch.add_argument("--starting-offsets", default="earliest", help="earliest or per-partition JSON")
    batch.add_argument("--ending-offsets", default="latest", help="latest or per-partition JSON (exclusive)")

    connector = commands.add_parser("connector", help="print the Kafka connector's Spark settings, or why none")
    connector.add_argument("--packages", help="Maven coordinates of the Kafka connector")
    connector.add_argument("--jars", help="the Kafka connector's jars")
    return top


def job_from_args(args: argparse.Namespace) -> StreamJob | BatchJob:
    """The job a ``stream`` or ``batch`` command line describes."""
    common = {
        "bootstrap": args.bootstrap,
        "input_topic": args.input,
        "output_topic": args.output,
        "window": args.window,
        "slide": args.slide,
        "starting_offsets": args.starting_offsets,
        "fail_on_data_loss": args.fail_on_data_loss,
        "client": dict(args.kafka_option),
    }
    if args.command == "batch":
        return BatchJob(ending_offsets=args.ending_offsets, **common)
    return StreamJob(
        checkpoint=args.checkpoint,
        watermark=args.watermark,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        output_mode=args.output_mode,
        trigger_interval=args.trigger,
        available_now=args.available_now,
        **common,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    submitted = launched_by_spark_submit()
    try:  # before any JVM starts: what is missing is one line, not a traceback
        connector = {} if submitted else connector_conf(args.jars, args.packages)
    except ConnectorUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.command == "connector":
        print(json.dumps(connector))
        return 0
    if not submitted and shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        print("error: Spark needs Java 17 or later (java is not on PATH and JAVA_HOME is not set)", file=sys.stderr)
        return 1

    job = job_from_args(args)
    spark = build_session(args.master, connector=connector, extra=dict(args.conf))
    spark.sparkContext.setLogLevel("WARN")
    try:
        if isinstance(job, BatchJob):
            print(json.dumps({"written": run_batch(spark, job), "topic": job.output_topic}))
            return 0
        query = start_stream(spark, job)
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
