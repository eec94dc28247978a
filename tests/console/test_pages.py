"""The web console's pages over plain HTTP, against kbroker and Apache Kafka 4.3 (the console is a Kafka client):
exact cells of each page, record views (text, JSON, hex), escaping of hostile record contents, error pages with
Kafka's error code names, and ``kbroker serve --console`` serving the same pages inside the broker."""

from __future__ import annotations

import datetime
import http.client
import json
import socket
import uuid
from pathlib import Path

import pytest
import trio
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from kbroker import __version__
from kbroker import app as kbroker_app
from kbroker.cli import main
from kbroker.config import BrokerConfig, ConfigError
from kbroker.console import formats
from kbroker.console.app import BadInput, ConsoleService, parse_configs, parse_timestamp
from kbroker.server.listeners import plaintext_listener
from kbroker.testing import RunningBroker
from tests.console.conftest import ConsoleFactory, element_text, table_rows

HOSTILE = b"<script>alert('x')</script>"
JSON_VALUE = b'{"order": 7, "items": ["a", "b"]}'

Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["kbroker", "kafka"])
def cluster(request: pytest.FixtureRequest) -> str:
    """kbroker's bootstrap, then Apache Kafka 4.3's (the session's JVM: names here are unique per test)."""
    if request.param == "kbroker":
        broker: RunningBroker = request.getfixturevalue("broker")
        return broker.bootstrap
    return str(request.getfixturevalue("apache_kafka").bootstrap)


def produce(bootstrap: str, topic: str, records: list[Record]) -> list[int]:
    """Send ``records`` to partition 0 one by one; their timestamps."""
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        timestamps = []
        for key, value, headers in records:
            metadata = producer.send(topic, key=key, value=value, headers=headers, partition=0).get(timeout=30)
            timestamps.append(metadata.timestamp)
        return timestamps
    finally:
        producer.close()


def commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.commit({partition: OffsetAndMetadata(offset, "", -1)})
    finally:
        consumer.close()


def utc_text(timestamp_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_topic_lifecycle_in_the_console(cluster: str, console_factory: ConsoleFactory) -> None:
    console = console_factory(cluster)
    topic, group = unique("console"), unique("console-group")

    created = console.post(
        "/create-topic", {"name": topic, "partitions": "2", "replication_factor": "", "configs": "retention.ms=3600000"}
    )
    assert (created.status, created.headers["location"]) == (303, f"/topics/{topic}")
    timestamps = produce(
        cluster,
        topic,
        [(b"order-7", JSON_VALUE, [("trace", b"abc")]), (b"bin", b"\x00\xffhi", []), (None, HOSTILE, [])],
    )

    listed = console.get("/topics")
    assert listed.status == 200
    row = next(r for r in table_rows(listed.text, "topics") if r[0] == topic)
    assert row[1:4] == ["2", "1", "3"]  # partitions, replication factor, messages ≈ end − start

    detail = console.get(f"/topics/{topic}")
    assert detail.status == 200
    partitions = table_rows(detail.text, "partitions")
    # partition, start, end, messages ≈ (the leader is the one broker, whatever its id)
    assert [[r[0], r[4], r[5], r[6]] for r in partitions] == [["0", "0", "3", "3"], ["1", "0", "0", "0"]]
    configs = {r[0]: r[1:] for r in table_rows(detail.text, "configs")}
    assert configs["retention.ms"] == ["3600000", "DYNAMIC_TOPIC_CONFIG"]
    assert configs["cleanup.policy"] == ["delete", "DEFAULT_CONFIG"]

    text = console.get(f"/topics/{topic}/messages?partition=0")
    assert text.status == 200
    assert table_rows(text.text, "records") == [
        ["0", utc_text(timestamps[0]), "order-7", JSON_VALUE.decode(), "trace:abc"],
        ["1", utc_text(timestamps[1]), "bin", "\x00\ufffdhi", ""],
        ["2", utc_text(timestamps[2]), "null", HOSTILE.decode(), ""],
    ]
    assert "<script>" not in text.text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in text.text
    assert '<span class="note">not UTF-8: see hex</span>' in text.text
    assert element_text(text.text, "range").startswith("Partition 0: offsets 0 to 3 (end);")

    pretty = console.get(f"/topics/{topic}/messages?partition=0&format=json&count=1")
    assert [r[3] for r in table_rows(pretty.text, "records")] == [json.dumps(json.loads(JSON_VALUE), indent=2)]
    next_query = "partition=0&amp;mode=offset&amp;offset=1&amp;timestamp=&amp;count=1&amp;format=json"
    assert f'href="/topics/{topic}/messages?{next_query}"' in pretty.text

    hexed = console.get(f"/topics/{topic}/messages?partition=0&mode=offset&offset=1&count=1&format=hex")
    assert [(r[0], r[2], r[3]) for r in table_rows(hexed.text, "records")] == [
        ("1", "00000000  62 69 6e" + " " * 39 + "  bin", "00000000  00 ff 68 69" + " " * 36 + "  ..hi")
    ]

    newest = console.get(f"/topics/{topic}/messages?partition=0&mode=newest&count=2")
    assert [r[0] for r in table_rows(newest.text, "records")] == ["1", "2"]
    by_time = console.get(f"/topics/{topic}/messages?partition=0&mode=timestamp&timestamp={timestamps[2]}&count=5")
    first = min(i for i, ts in enumerate(timestamps) if ts >= timestamps[2])  # records may share a millisecond
    assert [r[0] for r in table_rows(by_time.text, "records")] == [str(i) for i in range(first, 3)]
    later = console.get(f"/topics/{topic}/messages?partition=0&mode=timestamp&timestamp={timestamps[2] + 60_000}")
    assert table_rows(later.text, "records") == [["No records here."]]
    assert "no record at or after that timestamp" in element_text(later.text, "range") + later.text

    commit(cluster, group, topic, 1)
    groups = console.get("/groups")
    assert groups.status == 200
    group_row = next(r for r in table_rows(groups.text, "groups") if r[0] == group)
    assert (group_row[1], group_row[4], group_row[5]) == ("Empty", "0", "2")  # state, members, lag
    described = console.get(f"/groups/{group}")
    assert described.status == 200
    assert table_rows(described.text, "offsets") == [[topic, "0", "1", "3", "2", ""]]
    assert element_text(described.text, "total-lag") == "2"

    refused = console.post(f"/topics/{topic}/delete", {"confirm": "not-the-name"})
    assert refused.status == 400
    assert element_text(refused.text, "error") == "type the topic's name to confirm: nothing was deleted"
    assert console.get(f"/topics/{topic}").status == 200
    # DNS rebinding: a page at evil.test whose name now points at 127.0.0.1 sends Host and Origin evil.test, which
    # pass the same-origin check; the console on a loopback address answers loopback names only.
    rebound = console.request(
        "POST", f"/topics/{topic}/delete", {"confirm": topic}, {"Host": "evil.test", "Origin": "http://evil.test"}
    )
    assert (rebound.status, rebound.text) == (400, "Invalid host header")
    assert console.request("GET", "/", headers={"Host": f"evil.test:{console.port}"}).status == 400
    assert console.request("GET", "/", headers={"Host": f"localhost:{console.port}"}).status == 200
    assert console.get(f"/topics/{topic}").status == 200
    deleted = console.post(f"/topics/{topic}/delete", {"confirm": topic})
    assert (deleted.status, deleted.headers["location"]) == (303, f"/topics?deleted={topic}")
    gone = console.get(f"/topics/{topic}")
    assert gone.status == 404
    assert element_text(gone.text, "error").startswith("UNKNOWN_TOPIC_OR_PARTITION (3): ")


def test_overview(broker: RunningBroker, console_factory: ConsoleFactory) -> None:
    console = console_factory(broker.bootstrap)
    page = console.get("/")
    assert page.status == 200
    assert broker.broker is not None
    assert element_text(page.text, "cluster-id") == broker.broker.cluster_id
    assert element_text(page.text, "broker-count") == "1"
    assert element_text(page.text, "controller") == str(broker.broker.node_id)
    host, port = broker.bootstrap.rsplit(":", 1)
    assert table_rows(page.text, "brokers") == [[str(broker.broker.node_id), host, port, "-", "controller"]]
    assert element_text(page.text, "kafka-version").startswith("as Kafka ")
    assert 'id="software"' not in page.text  # a separate process cannot know the broker's software


def test_error_pages(broker: RunningBroker, console_factory: ConsoleFactory) -> None:
    console = console_factory(broker.bootstrap)
    topic = unique("errors")
    assert console.post("/create-topic", {"name": topic, "partitions": "1"}).status == 303

    again = console.post("/create-topic", {"name": topic, "partitions": "1"})
    assert again.status == 409
    assert element_text(again.text, "error").startswith("TOPIC_ALREADY_EXISTS (36): ")
    assert f'value="{topic}"' in again.text  # the form keeps what was typed

    illegal = console.post("/create-topic", {"name": "no spaces<b>", "partitions": "1"})
    assert illegal.status == 400
    assert element_text(illegal.text, "error").startswith("INVALID_TOPIC_EXCEPTION (17): ")
    assert "no spaces<b>" not in illegal.text and "no spaces&lt;b&gt;" in illegal.text

    not_a_number = console.post("/create-topic", {"name": unique("x"), "partitions": "two"})
    assert (not_a_number.status, element_text(not_a_number.text, "error")) == (
        400,
        "partitions must be a whole number, got 'two'",
    )
    bad_configs = console.post("/create-topic", {"name": unique("x"), "configs": "retention.ms"})
    assert (bad_configs.status, element_text(bad_configs.text, "error")) == (
        400,
        "configs line 1: expected KEY=VALUE, got 'retention.ms'",
    )
    unknown_config = console.post("/create-topic", {"name": unique("x"), "configs": "no.such.config=1"})
    assert unknown_config.status == 400
    assert element_text(unknown_config.text, "error").startswith("INVALID_CONFIG (40): ")

    cross_site = console.post(f"/topics/{topic}/delete", {"confirm": topic}, headers={"Origin": "http://evil.test"})
    assert (cross_site.status, element_text(cross_site.text, "error")) == (
        403,
        "a form from another site cannot change topics",
    )
    assert console.get(f"/topics/{topic}").status == 200

    for path, status, start in [
        ("/topics/no-such-topic", 404, "UNKNOWN_TOPIC_OR_PARTITION (3): "),
        ("/topics/no-such-topic/messages", 404, "UNKNOWN_TOPIC_OR_PARTITION (3): "),
        (f"/topics/{topic}/messages?partition=7", 404, "UNKNOWN_TOPIC_OR_PARTITION (3): "),
        (f"/topics/{topic}/messages?format=yaml", 400, "format must be one of text, json, hex, got 'yaml'"),
        (f"/topics/{topic}/messages?count=0", 400, "count must be 1..500, got 0"),
        (f"/topics/{topic}/messages?mode=timestamp&timestamp=soon", 400, "timestamp: give a date and time"),
        (f"/topics/{topic}/messages?mode=timestamp&timestamp=99999999999999999999", 400, "timestamp: give a date"),
        (f"/topics/{topic}/messages?offset=99999999999999999999", 400, "offset must be 0..9223372036854775807, got"),
        ("/groups/no-such-group", 404, "GROUP_ID_NOT_FOUND (69): "),
        ("/no/such/page", 404, "GET /no/such/page"),
    ]:
        page = console.get(path)
        assert (path, page.status) == (path, status)
        assert element_text(page.text, "error").startswith(start), path
        assert "Traceback" not in page.text
    assert console.request("DELETE", "/topics").status == 405


def test_unreachable_cluster_is_one_line(console_factory: ConsoleFactory) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    console = console_factory(f"127.0.0.1:{port}", {"request.timeout.ms": "1000"})
    page = console.get("/")
    assert page.status == 503
    assert element_text(page.text, "error") == f"timed out: Unable to bootstrap from ['127.0.0.1:{port}']"


def test_serve_with_console(tmp_path: Path) -> None:
    """``kbroker serve --console``: the console is one of the broker's services, reading the broker itself."""
    settings = kbroker_app.Settings(
        BrokerConfig({}), tmp_path, plaintext_listener("127.0.0.1", 0), console=("127.0.0.1", 0)
    )

    def get(port: int, path: str) -> tuple[int, str]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode()
        finally:
            connection.close()

    async def scenario() -> tuple[int, str, str]:
        async with trio.open_nursery() as nursery:
            app = await nursery.start(kbroker_app.run, settings)
            service = dict(app.services)["console"]
            assert isinstance(service, ConsoleService) and service.address is not None
            status, html = await trio.to_thread.run_sync(get, service.address[1], "/")
            app.stop()
            nursery.cancel_scope.cancel()
            return status, html, app.broker.cluster_id

    status, html, cluster_id = trio.run(scenario)
    assert status == 200
    assert element_text(html, "cluster-id") == cluster_id
    assert element_text(html, "software") == f"kbroker {__version__}"


def test_serve_console_needs_a_plaintext_listener() -> None:
    with pytest.raises(ConfigError, match="--console reads the broker through a PLAINTEXT listener"):
        trio.run(ConsoleService(None, "127.0.0.1", 0).run)


def test_console_command_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["console", "--bootstrap", "127.0.0.1:1", "--listen", "nowhere"]) == 1
    assert capsys.readouterr().err == "kbroker console: --listen must be HOST:PORT, got 'nowhere'\n"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["console", "--bootstrap", "127.0.0.1:1", "--listen", f"127.0.0.1:{port}"]) == 1
    assert capsys.readouterr().err == (
        f"kbroker console: web console: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    )


def test_formats() -> None:
    assert formats.show(b'{"a":[1]}', "json") == formats.Shown('{\n  "a": [\n    1\n  ]\n}')
    assert formats.show(b"plain", "json") == formats.Shown("plain", "not JSON")
    assert formats.show(b"\xff", "text") == formats.Shown("\ufffd", "not UTF-8: see hex")
    assert formats.show(None, "hex") == formats.Shown("null", null=True)
    assert formats.hex_dump(bytes(range(0x41, 0x41 + 17))) == (
        "00000000  41 42 43 44 45 46 47 48 49 4a 4b 4c 4d 4e 4f 50  ABCDEFGHIJKLMNOP\n00000010  51" + " " * 45 + "  Q"
    )
    assert formats.hex_dump(b"") == "(empty)"


def test_form_parsing() -> None:
    assert parse_configs("# comment\nretention.ms = 1000\n\ncleanup.policy=compact\n") == {
        "retention.ms": "1000",
        "cleanup.policy": "compact",
    }
    with pytest.raises(BadInput, match="configs line 2: expected KEY=VALUE"):
        parse_configs("a=1\nb")
    assert parse_timestamp("1700000000000") == 1_700_000_000_000
    assert parse_timestamp("2023-11-14T22:13:20") == 1_700_000_000_000  # no zone: UTC
    assert parse_timestamp("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    assert parse_timestamp("later") is None
    assert parse_timestamp("99999999999999999999") is None  # more than an int64: not a time ListOffsets can carry


def test_allowed_hosts_follow_the_listening_address() -> None:
    from kbroker.console.app import allowed_hosts

    assert allowed_hosts("127.0.0.1") == ["localhost", "127.0.0.1", "::1", "[::1]"]
    assert allowed_hosts("::1") == ["localhost", "127.0.0.1", "::1", "[::1]"]
    assert allowed_hosts("10.0.0.5") == ["localhost", "127.0.0.1", "::1", "[::1]", "10.0.0.5"]
    assert allowed_hosts("0.0.0.0") == ["*"]
    assert allowed_hosts("::") == ["*"]
