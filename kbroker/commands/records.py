"""``kbroker produce TOPIC`` and ``kbroker consume TOPIC``: records in and out of a topic from the command line, as
kafka-console-producer.sh / kafka-console-consumer.sh and kcat's -P / -C modes do.

produce reads lines (stdin or ``--file``), one record a line, optionally split into key and value at the first
``--key-separator`` (kcat's -K), with ``--header`` pairs on every record. It sends them with kafka-python's
producer (compression, acks, idempotence, one transaction for the whole input with ``--transactional-id``) and
reports one summary line on stderr, or a JSON document on stdout with ``--output json``.

consume prints records as they arrive: the value alone by default (as kafka-console-consumer does), a kcat ``-f``
style format string, or one JSON object a line. It starts at the end (the console consumer's default), the
beginning, an offset or a timestamp; with ``--group`` it joins the group and commits exactly the records it has
printed, so a second consumer of the group continues after them. Ctrl-C (or SIGTERM) stops it cleanly: the
consumer commits and closes, and the command exits with 128 + the signal number and no traceback.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any

from kbroker.commands.connection import (
    ClientSettings,
    CommandError,
    add_client_arguments,
    add_output_argument,
    admin_client,
    consumer_client,
    failure_line,
    producer_client,
)

COMPRESSION_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
ACKS = {"0": 0, "1": 1, "all": -1, "-1": -1}
MAX_FAILURE_LINES = 20  # a broken cluster must not print one line for each of a million records
IN_FLIGHT_LIMIT = 10_000  # futures kept before the oldest are waited for: memory stays bounded on long inputs
COMMIT_INTERVAL_SECONDS = 5.0  # as the Java consumer's auto.commit.interval.ms
AUTO_CREATE_ATTEMPTS = 30  # 100 ms apart: how long a topic being auto-created may take to appear
POLL_SLICE_MS = 200  # how long one poll may block: a Ctrl-C is acted on within this


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_produce(subparsers)
    _register_consume(subparsers)


# --- produce -----------------------------------------------------------------------------------------------------


def _register_produce(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "produce",
        help="send lines from stdin or a file to a topic, one record a line",
        description="Send one record per input line (kafka-console-producer.sh, kcat -P). The summary goes to "
        "stderr; with --output json a document with the partitions and offsets goes to stdout.",
    )
    parser.add_argument("topic", metavar="TOPIC")
    add_client_arguments(parser)
    add_output_argument(parser)
    parser.add_argument("--file", "-f", type=Path, default=None, help="read lines from FILE (default stdin)")
    parser.add_argument(
        "--key-separator",
        "-K",
        default=None,
        metavar="SEP",
        help="split each line at the first SEP into key and value (without it records have no key)",
    )
    parser.add_argument(
        "--header", "-H", action="append", default=[], metavar="KEY=VALUE", help="a header on every record (repeatable)"
    )
    parser.add_argument("--partition", "-p", type=int, default=None, help="send every record to this partition")
    parser.add_argument("--compression", choices=COMPRESSION_CODECS, default="none", help="batch compression codec")
    parser.add_argument("--acks", choices=("0", "1", "all", "-1"), default="all", help="acknowledgements (default all)")
    parser.add_argument("--idempotent", action="store_true", help="idempotent producer (needs --acks all)")
    parser.add_argument(
        "--transactional-id",
        default=None,
        metavar="ID",
        help="send all lines in one transaction, committed at the end of the input and aborted on error or Ctrl-C",
    )
    parser.add_argument(
        "--null-value-marker",
        default=None,
        metavar="TEXT",
        help="a value (or key) equal to TEXT is sent as null, e.g. a tombstone",
    )
    parser.add_argument("--linger-ms", type=int, default=0, help="wait this long to fill batches (default 0)")
    parser.add_argument("--verbose", "-v", action="store_true", help="also print partitions and offsets on stderr")
    parser.set_defaults(run=run_produce)


@dataclass
class PartitionTally:
    """What one partition received: a count and the first and last offsets the broker gave."""

    records: int = 0
    first_offset: int = -1
    last_offset: int = -1

    def add(self, offset: int) -> None:
        self.records += 1
        if offset >= 0:  # acks=0 gives no offsets
            self.first_offset = offset if self.first_offset < 0 else min(self.first_offset, offset)
            self.last_offset = max(self.last_offset, offset)


@dataclass
class ProduceReport:
    """The outcome of a produce run, printed as the summary line, the -v lines or the JSON document."""

    topic: str
    partitions: dict[int, PartitionTally] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    failed: int = 0
    transactional_id: str | None = None
    transaction: str | None = None  # "committed" / "aborted" with --transactional-id

    @property
    def produced(self) -> int:
        if self.transaction == "aborted":
            return 0
        return sum(tally.records for tally in self.partitions.values())

    def fail(self, line_number: int | None, message: str) -> None:
        self.failed += 1
        where = f"line {line_number}: " if line_number is not None else ""
        self.failures.append(f"{where}{message}")

    def document(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "produced": self.produced,
            "failed": self.failed,
            "transactional_id": self.transactional_id,
            "transaction": self.transaction,
            "partitions": [
                {
                    "partition": partition,
                    "records": tally.records,
                    "first_offset": tally.first_offset if tally.first_offset >= 0 else None,
                    "last_offset": tally.last_offset if tally.last_offset >= 0 else None,
                }
                for partition, tally in sorted(self.partitions.items())
            ],
            "errors": self.failures,
        }

    def summary(self) -> str:
        records = "record" if self.produced == 1 else "records"
        line = f"produced {self.produced} {records} to {self.topic}"
        if self.transaction is not None:
            line += f" (transaction {self.transaction})"
        if self.failed:
            line += f"; {self.failed} failed"
        return line

    def partition_lines(self) -> list[str]:
        lines = []
        for partition, tally in sorted(self.partitions.items()):
            count = f"{tally.records} record{'' if tally.records == 1 else 's'}"
            if tally.first_offset < 0:
                lines.append(f"  partition {partition}: {count} (acks=0: no offsets)")
            else:
                lines.append(f"  partition {partition}: offsets {tally.first_offset}-{tally.last_offset} ({count})")
        return lines


@dataclass(frozen=True)
class LineParser:
    """Turns an input line into (key, value) as kcat -K and the console producer's null.marker do."""

    key_separator: bytes | None
    null_marker: bytes | None

    def parse(self, line: bytes, line_number: int) -> tuple[bytes | None, bytes | None]:
        key: bytes | None = None
        value: bytes | None = line
        if self.key_separator is not None:
            key, separator, rest = line.partition(self.key_separator)
            if not separator:
                raise CommandError(
                    f"line {line_number}: no key separator {self.key_separator.decode(errors='replace')!r} "
                    "(with --key-separator every line is KEY<SEP>VALUE)"
                )
            value = rest
            if self.null_marker is not None and key == self.null_marker:
                key = None
        if self.null_marker is not None and value == self.null_marker:
            value = None
        if key is None and value is None:
            raise CommandError(f"line {line_number}: a null value needs a key (kafka-python sends no empty record)")
        return key, value


def parse_headers(items: list[str]) -> list[tuple[str, bytes]]:
    headers = []
    for item in items:
        name, separator, value = item.partition("=")
        if not separator or not name:
            raise CommandError(f"--header expects KEY=VALUE, got {item!r}")
        headers.append((name, value.encode()))
    return headers


def input_lines(stream: IO[bytes]) -> Iterator[bytes]:
    """The lines of ``stream`` without their ends (\\n, \\r\\n), read as they come so a pipe streams."""
    for raw in stream:
        line = raw[:-1] if raw.endswith(b"\n") else raw
        yield line[:-1] if line.endswith(b"\r") else line


def with_progress(lines: Iterator[bytes], stream: IO[bytes], total_bytes: int) -> Iterator[bytes]:
    """``lines`` of a file, with a rich progress bar of the bytes read on stderr (for a person watching)."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("producing"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("produce", total=total_bytes)
        for line in lines:
            yield line
            progress.update(task, completed=stream.tell())


def producer_settings(args: argparse.Namespace) -> dict[str, Any]:
    """kafka-python producer arguments for the command line, refusing combinations Kafka refuses."""
    acks = ACKS[args.acks]
    idempotent = args.idempotent or args.transactional_id is not None
    if idempotent and acks != -1:
        what = "--transactional-id" if args.transactional_id is not None else "--idempotent"
        raise CommandError(f"{what} needs --acks all (an idempotent producer waits for every in-sync replica)")
    if args.linger_ms < 0:
        raise CommandError(f"--linger-ms must not be negative, got {args.linger_ms}")
    kwargs: dict[str, Any] = {
        "acks": acks,
        "compression_type": None if args.compression == "none" else args.compression,
        "linger_ms": args.linger_ms,
        "enable_idempotence": idempotent,
        # preflight_topic has already asked the broker (and let it auto-create the topic, if it does)
        "max_block_ms": 30_000,
    }
    if args.transactional_id is not None:
        kwargs["transactional_id"] = args.transactional_id
    return kwargs


def preflight_topic(settings: ClientSettings, topic: str) -> set[int]:
    """The partitions of ``topic``. A topic that does not exist is asked for the way a producer asks (Metadata with
    auto-creation allowed), saying so on stderr: a cluster with auto.create.topics.enable creates it, one without
    is reported at once (with Kafka's error code name) rather than after kafka-python's minute of retries."""
    import kafka.errors as kafka_errors
    from kafka.protocol.metadata import MetadataRequest

    admin = admin_client(settings)

    def ask(allow_auto_create: bool) -> tuple[type[Exception], Any]:
        request = MetadataRequest(
            topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
            allow_auto_topic_creation=allow_auto_create,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )

        async def send() -> Any:
            return await admin._manager.send(request)

        response = admin._manager.run(send)
        answer = next((t for t in response.topics if t.name == topic), None)
        if answer is None:
            return kafka_errors.UnknownTopicOrPartitionError, None
        return kafka_errors.for_code(answer.error_code), answer

    try:
        error, answer = ask(allow_auto_create=False)
        if error is kafka_errors.UnknownTopicOrPartitionError:
            print(
                f"kbroker produce: topic {topic!r} does not exist; asking the cluster to create it on first use "
                "(auto.create.topics.enable)",
                file=sys.stderr,
            )
        # Kafka's KRaft brokers answer UNKNOWN_TOPIC_OR_PARTITION (or LEADER_NOT_AVAILABLE) while the controller
        # creates an auto-created topic: ask again for a few seconds before concluding it will not be created.
        for _attempt in range(AUTO_CREATE_ATTEMPTS):
            if error is kafka_errors.NoError:
                partitions = {p.partition_index for p in answer.partitions}
                if partitions and all(p.leader_id >= 0 for p in answer.partitions):
                    return partitions
            elif error not in (kafka_errors.UnknownTopicOrPartitionError, kafka_errors.LeaderNotAvailableError):
                raise error()
            time.sleep(0.1)
            error, answer = ask(allow_auto_create=True)
        if error is kafka_errors.UnknownTopicOrPartitionError:
            raise CommandError(
                f"UNKNOWN_TOPIC_OR_PARTITION (3): topic {topic!r} does not exist and the cluster did not create it "
                f"(it does so only with auto.create.topics.enable=true); create it: kbroker topics create {topic}"
            )
        raise CommandError(f"LEADER_NOT_AVAILABLE (5): topic {topic!r} has partitions without a leader")
    finally:
        admin.close()


def run_produce(args: argparse.Namespace) -> int:
    settings = ClientSettings.from_args(args)
    parser = LineParser(
        args.key_separator.encode() if args.key_separator is not None else None,
        args.null_value_marker.encode() if args.null_value_marker is not None else None,
    )
    if args.key_separator == "":
        raise CommandError("--key-separator must not be empty")
    headers = parse_headers(args.header)
    kwargs = producer_settings(args)
    stream: IO[bytes]
    if args.file is None or str(args.file) == "-":
        stream = sys.stdin.buffer
    else:
        try:
            stream = args.file.open("rb")
        except OSError as exc:
            raise CommandError(f"--file {args.file}: {exc.strerror or exc}") from None
    try:
        partitions = preflight_topic(settings, args.topic)
        if args.partition is not None and args.partition not in partitions:
            raise CommandError(
                f"UNKNOWN_TOPIC_OR_PARTITION (3): topic {args.topic!r} has partitions 0-{max(partitions)}, "
                f"not {args.partition}"
            )
        report = ProduceReport(args.topic, transactional_id=args.transactional_id)
        lines = input_lines(stream)
        if stream is not sys.stdin.buffer and sys.stderr.isatty() and args.file.is_file():
            lines = with_progress(lines, stream, args.file.stat().st_size)
        interrupted = _produce(settings, kwargs, args, parser, headers, lines, report)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    _print_produce_report(args, report)
    if interrupted:
        return 130
    return 1 if report.failed else 0


def _produce(
    settings: ClientSettings,
    kwargs: dict[str, Any],
    args: argparse.Namespace,
    parser: LineParser,
    headers: list[tuple[str, bytes]],
    lines: Iterable[bytes],
    report: ProduceReport,
) -> bool:
    """Send every line; True if Ctrl-C stopped it. Failures go into ``report``."""
    import kafka.errors as kafka_errors

    producer = producer_client(settings, **kwargs)
    transactional = args.transactional_id is not None
    in_flight: deque[tuple[int, Any]] = deque()
    interrupted = False

    def settle(line_number: int, future: Any) -> None:
        try:
            metadata = future.get()
        except kafka_errors.KafkaError as exc:
            report.fail(line_number, failure_line(exc) or str(exc))
            return
        report.partitions.setdefault(metadata.partition, PartitionTally()).add(metadata.offset)

    try:
        if transactional:
            producer.init_transactions()
            producer.begin_transaction()
        for line_number, line in enumerate(lines, 1):
            try:
                key, value = parser.parse(line, line_number)
            except CommandError as exc:  # bad input stops the run (and aborts a transaction), as Kafka's producer
                report.fail(None, str(exc))
                break
            try:
                future = producer.send(
                    args.topic, value=value, key=key, headers=list(headers), partition=args.partition
                )
            except kafka_errors.KafkaError as exc:  # refused before sending, e.g. a record over max_request_size
                report.fail(line_number, failure_line(exc) or str(exc))
                if transactional:
                    break
                continue
            in_flight.append((line_number, future))
            while len(in_flight) > IN_FLIGHT_LIMIT:
                settle(*in_flight.popleft())
            if transactional and report.failed:
                break
        producer.flush()
        while in_flight:
            settle(*in_flight.popleft())
        if transactional:
            if report.failed:
                producer.abort_transaction()
                report.transaction = "aborted"
            else:
                producer.commit_transaction()
                report.transaction = "committed"
    except KeyboardInterrupt:
        interrupted = True
        if transactional:
            _abort_quietly(producer, report)
        else:  # what was sent before Ctrl-C is delivered, as the console producer's close() does
            producer.flush()
            while in_flight:
                settle(*in_flight.popleft())
    except BaseException:
        if transactional:
            _abort_quietly(producer, report)
        raise
    finally:
        producer.close(timeout=10)
    return interrupted


def _abort_quietly(producer: Any, report: ProduceReport) -> None:
    """Abort the open transaction (nothing of it becomes visible to read_committed); a failure to abort is left to
    the transaction timeout, which aborts it on the broker."""
    try:
        producer.abort_transaction()
        report.transaction = "aborted"
    except Exception as exc:
        report.transaction = "aborted"
        report.fail(None, f"could not abort ({failure_line(exc) or exc}); the broker aborts it at its timeout")


def _print_produce_report(args: argparse.Namespace, report: ProduceReport) -> None:
    for failure in report.failures[:MAX_FAILURE_LINES]:
        print(f"kbroker produce: {failure}", file=sys.stderr)
    if len(report.failures) > MAX_FAILURE_LINES:
        print(f"kbroker produce: ... and {len(report.failures) - MAX_FAILURE_LINES} more failures", file=sys.stderr)
    if args.output == "json":
        json.dump(report.document(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print(report.summary(), file=sys.stderr)
    if args.verbose:
        for line in report.partition_lines():
            print(line, file=sys.stderr)


# --- consume -----------------------------------------------------------------------------------------------------


DEFAULT_FORMAT = "%s\\n"  # the value alone, as kafka-console-consumer prints it


def _register_consume(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "consume",
        help="print a topic's records (from the end by default; Ctrl-C to stop)",
        # A description is printed as written (only help strings are %-formatted by argparse).
        description="Print records as they arrive (kafka-console-consumer.sh, kcat -C). Format tokens: %t topic, "
        "%p partition, %o offset, %k key, %s value, %h headers (k=v,...), %T timestamp (ms), %K / %S key / "
        "value length (-1 for null), %% a percent sign; escapes \\n \\t \\r \\\\.",
    )
    parser.add_argument("topic", metavar="TOPIC")
    add_client_arguments(parser)
    add_output_argument(parser)
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the earliest record")
    start.add_argument("--from-end", action="store_true", help="start after the last record (the default)")
    start.add_argument(
        "--offset", default=None, metavar="N", help="start at offset N (or earliest/latest) of --partition"
    )
    start.add_argument(
        "--from-timestamp",
        default=None,
        metavar="TIME",
        help="start at the first record at or after TIME: ISO 8601 (UTC without a zone) or epoch ms",
    )
    parser.add_argument("--partition", "-p", type=int, default=None, help="read only this partition")
    parser.add_argument("--count", "-c", type=int, default=None, help="exit after N records")
    parser.add_argument(
        "--group", "-g", default=None, help="join consumer group G and commit what was printed (default: no group)"
    )
    parser.add_argument(
        "--isolation",
        choices=("read_uncommitted", "read_committed"),
        default="read_uncommitted",
        help="read_committed skips aborted transactions and waits for open ones",
    )
    parser.add_argument(
        "--timeout-ms", type=int, default=None, help="exit when no record arrived for this long (default: never)"
    )
    parser.add_argument(
        "--format",
        "-F",
        default=None,
        metavar="FMT",
        help=f"kcat -f style output (default {DEFAULT_FORMAT.replace('%', '%%')!r})",  # argparse %-formats help
    )
    parser.set_defaults(run=run_consume)


# A compiled format: literal bytes and token letters, in order.
FormatPart = bytes | str
FORMAT_TOKENS = frozenset("tpokshTKS")
ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", "0": b"\0"}


def compile_format(text: str) -> list[FormatPart]:
    """``"%k=%s\\n"`` -> [token 'k', b'=', token 's', b'\\n']; an unknown token or escape is refused."""
    parts: list[FormatPart] = []
    literal = bytearray()
    index = 0
    while index < len(text):
        char = text[index]
        following = text[index + 1] if index + 1 < len(text) else ""
        if char == "%":
            if following == "%":
                literal += b"%"
            elif following in FORMAT_TOKENS and following:
                if literal:
                    parts.append(bytes(literal))
                    literal.clear()
                parts.append(following)
            else:
                raise CommandError(
                    f"--format: %{following} is not a token (%t %p %o %k %s %h %T %K %S, %% for a percent sign)"
                )
            index += 2
        elif char == "\\" and following in ESCAPES:
            literal += ESCAPES[following]
            index += 2
        else:
            literal += char.encode()
            index += 1
    if literal:
        parts.append(bytes(literal))
    return parts


def format_record(parts: list[FormatPart], record: Any) -> bytes:
    out = bytearray()
    for part in parts:
        if isinstance(part, bytes):
            out += part
        elif part == "s":
            out += record.value or b""
        elif part == "k":
            out += record.key or b""
        elif part == "t":
            out += record.topic.encode()
        elif part == "p":
            out += str(record.partition).encode()
        elif part == "o":
            out += str(record.offset).encode()
        elif part == "T":
            out += str(record.timestamp if record.timestamp is not None else -1).encode()
        elif part == "K":
            out += str(len(record.key) if record.key is not None else -1).encode()
        elif part == "S":
            out += str(len(record.value) if record.value is not None else -1).encode()
        elif part == "h":
            out += b",".join(name.encode() + b"=" + (value or b"") for name, value in record.headers or ())
    return bytes(out)


def _text_or_base64(data: bytes | None) -> tuple[str | None, bool]:
    """UTF-8 text where the bytes are text; otherwise base64 (and True, so the reader knows)."""
    if data is None:
        return None, False
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), True


def record_json(record: Any) -> dict[str, Any]:
    """One record as JSON: text where the bytes are UTF-8, else base64 with ``<field>_encoding: "base64"``."""
    document: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
    }
    for name in ("key", "value"):
        text, encoded = _text_or_base64(getattr(record, name))
        document[name] = text
        if encoded:
            document[f"{name}_encoding"] = "base64"
    headers = []
    for header_name, header_value in record.headers or ():
        text, encoded = _text_or_base64(header_value)
        header: dict[str, Any] = {"key": header_name, "value": text}
        if encoded:
            header["value_encoding"] = "base64"
        headers.append(header)
    document["headers"] = headers
    return document


def parse_timestamp(text: str) -> int:
    """Epoch milliseconds from ``1700000000000`` or ISO 8601 (``2024-05-01T12:00:00Z``; UTC without a zone, as
    Kafka's Utils.getDateTime reads kafka-consumer-groups.sh --to-datetime, and as kbroker groups and the console
    read it)."""
    if text.lstrip("-").isdigit():
        value = int(text)
        if value < 0:
            raise CommandError(f"--from-timestamp must not be negative, got {text}")
        return value
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(
            f"--from-timestamp: {text!r} is neither epoch milliseconds nor ISO 8601 (2024-05-01T12:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


class StopSignals:
    """SIGINT and SIGTERM ask the consume loop to stop (it polls in short slices, so it notices soon); a second
    signal interrupts at once. Outside the main thread signals cannot be caught and nothing changes."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        import threading

        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum


@dataclass
class ConsumePlan:
    """Where to start and what to read, checked before any connection is made."""

    partition: int | None
    offset: int | str | None  # a number, "earliest" or "latest"
    timestamp_ms: int | None
    from_beginning: bool
    count: int | None
    timeout_ms: int | None
    parts: list[FormatPart] | None  # None: JSON lines

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ConsumePlan:
        offset: int | str | None = None
        if args.offset is not None:
            if args.partition is None:
                raise CommandError("--offset needs --partition (an offset belongs to one partition)")
            if args.offset in ("earliest", "latest"):
                offset = args.offset
            elif args.offset.isdigit():
                offset = int(args.offset)
            else:
                raise CommandError(f"--offset must be a non-negative number, earliest or latest, got {args.offset!r}")
        if args.count is not None and args.count < 1:
            raise CommandError(f"--count must be at least 1, got {args.count}")
        if args.timeout_ms is not None and args.timeout_ms < 0:
            raise CommandError(f"--timeout-ms must not be negative, got {args.timeout_ms}")
        if args.partition is not None and args.partition < 0:
            raise CommandError(f"--partition must not be negative, got {args.partition}")
        if args.output == "json" and args.format is not None:
            raise CommandError("--format and --output json are two different outputs: choose one")
        parts = None if args.output == "json" else compile_format(args.format or DEFAULT_FORMAT)
        timestamp = parse_timestamp(args.from_timestamp) if args.from_timestamp is not None else None
        return cls(args.partition, offset, timestamp, args.from_beginning, args.count, args.timeout_ms, parts)

    @property
    def explicit_start(self) -> bool:
        """An offset or a timestamp: the start is set by hand, so the group's committed offsets do not apply."""
        return self.offset is not None or self.timestamp_ms is not None


class GroupCommitter:
    """Commits, for ``--group``, the position after the last record printed of each partition it still owns: every
    few seconds and at exit (never past what was printed)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.printed: dict[Any, int] = {}  # TopicPartition -> offset of the next record to read
        self.committed: dict[Any, int] = {}
        self.last_commit = time.monotonic()

    def record_printed(self, record: Any) -> None:
        from kafka.structs import TopicPartition

        self.printed[TopicPartition(record.topic, record.partition)] = record.offset + 1

    def commit(self) -> None:
        import kafka.errors as kafka_errors
        from kafka.structs import OffsetAndMetadata

        # Only partitions still assigned: after a rebalance, another member owns (and commits) the others.
        assigned = set(self.consumer.assignment())
        wanted = assigned & self.printed.keys()
        offsets = {
            tp: OffsetAndMetadata(self.printed[tp], "", -1)
            for tp in wanted
            if self.committed.get(tp) != self.printed[tp]
        }
        self.last_commit = time.monotonic()
        if offsets:
            try:
                self.consumer.commit(offsets)
            except kafka_errors.CommitFailedError:
                # The group rebalanced between the check above and the commit: the new owner reads them again
                # (at least once, as Kafka's console consumer after a rebalance).
                return
            self.committed.update({tp: meta.offset for tp, meta in offsets.items()})

    def maybe_commit(self) -> None:
        if time.monotonic() - self.last_commit >= COMMIT_INTERVAL_SECONDS:
            self.commit()


def run_consume(args: argparse.Namespace) -> int:
    plan = ConsumePlan.from_args(args)
    settings = ClientSettings.from_args(args)
    consumer = consumer_client(
        settings,
        group_id=args.group,
        enable_auto_commit=False,  # GroupCommitter commits exactly what was printed
        auto_offset_reset="earliest" if plan.from_beginning else "latest",
        isolation_level=args.isolation,
        allow_auto_create_topics=False,  # reading never creates a topic
    )
    committer = GroupCommitter(consumer) if args.group is not None else None
    printed = 0
    with StopSignals() as stop:
        try:
            _position(consumer, args, plan, committer)
            printed = _consume_loop(consumer, plan, committer, stop)
        finally:
            try:
                if committer is not None:
                    committer.commit()
            finally:
                consumer.close(autocommit=False)
    print(f"Processed a total of {printed} messages", file=sys.stderr)
    if stop.received is not None:
        return 128 + stop.received
    return 0


def _position(consumer: Any, args: argparse.Namespace, plan: ConsumePlan, committer: GroupCommitter | None) -> None:
    """Subscribe (a group without a hand-set start) or assign the partitions and seek where the plan says."""
    from kafka.structs import TopicPartition

    partitions = consumer.partitions_for_topic(args.topic)
    if not partitions:
        raise CommandError(f"UNKNOWN_TOPIC_OR_PARTITION (3): topic {args.topic!r} does not exist")
    if plan.partition is not None and plan.partition not in partitions:
        raise CommandError(
            f"UNKNOWN_TOPIC_OR_PARTITION (3): topic {args.topic!r} has partitions 0-{max(partitions)}, "
            f"not {plan.partition}"
        )
    if committer is not None and plan.partition is None and not plan.explicit_start:
        # The group's committed offsets decide the start; auto_offset_reset covers partitions without one.
        consumer.subscribe([args.topic])
        return
    chosen = [TopicPartition(args.topic, p) for p in sorted(partitions) if plan.partition in (None, p)]
    consumer.assign(chosen)
    if plan.offset == "earliest" or (plan.from_beginning and committer is None):
        consumer.seek_to_beginning(*chosen)
    elif isinstance(plan.offset, int):
        consumer.seek(chosen[0], plan.offset)
    elif plan.timestamp_ms is not None:
        found = consumer.offsets_for_times({tp: plan.timestamp_ms for tp in chosen})
        for tp in chosen:
            if found.get(tp) is None:  # no record at or after the time: start at the end
                consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, found[tp].offset)
    elif committer is None or plan.offset == "latest":
        consumer.seek_to_end(*chosen)
    # else: a group with --partition and no hand-set start: its committed offset, else auto_offset_reset


def _consume_loop(consumer: Any, plan: ConsumePlan, committer: GroupCommitter | None, stop: StopSignals) -> int:
    out = _binary_stdout()
    printed = 0
    idle_since = time.monotonic()
    while stop.received is None:
        if plan.timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= plan.timeout_ms:
            break
        remaining = None if plan.count is None else plan.count - printed
        batches = consumer.poll(timeout_ms=POLL_SLICE_MS, max_records=remaining)
        records = [record for batch in batches.values() for record in batch]  # each partition in offset order
        if records:
            idle_since = time.monotonic()
        written: list[Any] = []
        for record in records:
            if plan.parts is None:
                out.write(json.dumps(record_json(record), separators=(",", ":")).encode() + b"\n")
            else:
                out.write(format_record(plan.parts, record))
            printed += 1
            written.append(record)
            if plan.count is not None and printed >= plan.count:
                break
        out.flush()
        # Committable only once flushed: a flush that fails (the reader left: `| head`) delivered none of them.
        if committer is not None:
            for record in written:
                committer.record_printed(record)
        if plan.count is not None and printed >= plan.count:
            break
        if committer is not None:
            committer.maybe_commit()
    return printed


def _binary_stdout() -> Any:
    """stdout as bytes: values are printed as the broker holds them, as kcat prints them."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a text-only stream (some test harnesses): write through it
        return _TextAsBinary(sys.stdout)
    return buffer


class _TextAsBinary:
    """Adapts a text stream to the bytes writes of the consume loop (undecodable bytes are replaced)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, data: bytes) -> int:
        return self.stream.write(data.decode("utf-8", errors="replace"))

    def flush(self) -> None:
        self.stream.flush()
