"""The pytest plugin (kbroker/pytest_plugin.py), run as a user runs it: pytester writes a test project with no
conftest, pytest loads the plugin through the package's ``pytest11`` entry point, and the inner tests produce
and consume with kafka-python against the broker the fixture gives them.
"""

from __future__ import annotations

import json
import textwrap

import pytest

pytest_plugins = ["pytester"]

# What every inner test file starts with: a round trip through the broker with a real client.
ROUND_TRIP = """
import json, os
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

def round_trip(bootstrap, topic, value):
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    meta = producer.send(topic, key=b"k", value=value.encode()).get(10)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=5000)
    tp = TopicPartition(topic, meta.partition)
    consumer.assign([tp])
    consumer.seek(tp, meta.offset)
    record = next(iter(consumer))
    consumer.close()
    return meta.offset, record.key.decode(), record.value.decode()

def topics(bootstrap):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return sorted(t for t in admin.list_topics() if not t.startswith("_"))
    finally:
        admin.close()

def partitions(bootstrap, topic):
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        producer.send(topic, b"x").get(10)  # auto-creates it with num.partitions
        return len(producer.partitions_for(topic))
    finally:
        producer.close()

def report(name, **facts):
    with open(os.environ["PLUGIN_REPORT"], "a") as out:
        out.write(json.dumps({"test": name, **facts}) + "\\n")
"""


@pytest.fixture
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """Write ``code`` (after ROUND_TRIP) as the inner test module; return a reader of what the tests reported."""
    report = pytester.path / "report.jsonl"
    monkeypatch.setenv("PLUGIN_REPORT", str(report))

    def write(code: str, ini: str = "") -> None:
        pytester.makepyfile(test_inner=ROUND_TRIP + textwrap.dedent(code))
        pytester.makeini("[pytest]\n" + textwrap.dedent(ini))

    def facts() -> dict[str, dict]:
        lines = report.read_text().splitlines() if report.exists() else []
        return {entry.pop("test"): entry for entry in map(json.loads, lines)}

    write.facts = facts  # type: ignore[attr-defined]
    return write


def test_function_scope_gives_each_test_a_fresh_broker(pytester: pytest.Pytester, inner) -> None:
    inner(
        """
        def test_first(kafka_broker, kafka_bootstrap):
            assert kafka_bootstrap == kafka_broker.bootstrap
            report("first", bootstrap=kafka_bootstrap, trip=round_trip(kafka_bootstrap, "one", "hello"),
                   topics=topics(kafka_bootstrap))

        def test_second(kafka_bootstrap, request):
            report("second", bootstrap=kafka_bootstrap, topics=topics(kafka_bootstrap),
                   plugin=request.config.pluginmanager.hasplugin("kbroker"))
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=2)
    facts = inner.facts()
    assert facts["first"]["trip"] == [0, "k", "hello"]
    assert facts["first"]["topics"] == ["one"]
    assert facts["first"]["bootstrap"].startswith("127.0.0.1:")
    # A new broker (own port, own empty data directory) for the second test; the plugin came from the entry point.
    assert facts["second"]["bootstrap"] != facts["first"]["bootstrap"]
    assert facts["second"]["topics"] == []
    assert facts["second"]["plugin"] is True


def test_the_entry_point_can_be_turned_off(pytester: pytest.Pytester, inner) -> None:
    inner("def test_uses_it(kafka_broker):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:kbroker")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'kafka_broker' not found*"])


def test_session_scope_shares_one_broker(pytester: pytest.Pytester, inner) -> None:
    inner(
        """
        def test_first(kafka_broker):
            report("first", bootstrap=kafka_broker.bootstrap, trip=round_trip(kafka_broker.bootstrap, "kept", "v1"))

        def test_second(kafka_broker):
            report("second", bootstrap=kafka_broker.bootstrap, trip=round_trip(kafka_broker.bootstrap, "kept", "v2"),
                   topics=topics(kafka_broker.bootstrap))
        """,
        ini="kafka_broker_scope = session\n",
    )
    pytester.runpytest().assert_outcomes(passed=2)
    facts = inner.facts()
    assert facts["first"]["bootstrap"] == facts["second"]["bootstrap"]
    assert facts["first"]["trip"] == [0, "k", "v1"]
    assert facts["second"]["trip"] == [1, "k", "v2"]  # the same log: the second record follows the first
    assert facts["second"]["topics"] == ["kept"]


def test_config_from_ini_marker_and_factory(pytester: pytest.Pytester, inner) -> None:
    inner(
        """
        def test_ini_default(kafka_bootstrap):
            report("ini", partitions=partitions(kafka_bootstrap, "auto"))

        @pytest.mark.kafka_broker_config({"num.partitions": 5})
        def test_marker(kafka_bootstrap):
            report("marker", partitions=partitions(kafka_bootstrap, "auto"))

        @pytest.mark.kafka_broker_config(**{"auto.create.topics.enable": False})
        def test_marker_keywords(kafka_bootstrap):
            from kafka.errors import KafkaTimeoutError
            producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_block_ms=1500)
            with pytest.raises(KafkaTimeoutError):  # no such topic and none is created for it
                producer.send("absent", b"x").get(5)
            producer.close()
            report("keywords", topics=topics(kafka_bootstrap))

        def test_factory(kafka_broker_factory, kafka_bootstrap):
            small = kafka_broker_factory({"num.partitions": "1"})
            other = kafka_broker_factory(mode="subprocess")
            report("factory", small=partitions(small.bootstrap, "auto"), other=partitions(other.bootstrap, "auto"),
                   other_kind=type(other).__name__, trip=round_trip(other.bootstrap, "t", "via child"),
                   distinct=len({small.bootstrap, other.bootstrap, kafka_bootstrap}))
        """,
        ini="kafka_broker_config =\n    num.partitions = 3\n",
    )
    pytester.runpytest().assert_outcomes(passed=4)
    facts = inner.facts()
    assert facts["ini"] == {"partitions": 3}
    assert facts["marker"] == {"partitions": 5}
    assert facts["keywords"] == {"topics": []}
    assert facts["factory"] == {
        "small": 1,
        "other": 3,  # the ini settings apply to factory brokers too
        "other_kind": "BrokerProcess",
        "trip": [0, "k", "via child"],
        "distinct": 3,
    }


def test_subprocess_mode_restart_and_kill(pytester: pytest.Pytester, inner) -> None:
    inner(
        """
        def test_child(kafka_broker):
            first = round_trip(kafka_broker.bootstrap, "durable", "before")
            kafka_broker.restart()
            second = round_trip(kafka_broker.bootstrap, "durable", "after")
            pid = kafka_broker.process.pid
            kafka_broker.kill()
            report("child", kind=type(kafka_broker).__name__, first=first, second=second,
                   gone=not os.path.exists(f"/proc/{pid}/status") or "zombie" in open(f"/proc/{pid}/status").read())
        """,
        ini="kafka_broker_mode = subprocess\n",
    )
    pytester.runpytest().assert_outcomes(passed=1)
    assert inner.facts()["child"] == {
        "kind": "BrokerProcess",
        "first": [0, "k", "before"],
        "second": [1, "k", "after"],
        "gone": True,
    }


def test_mistakes_are_reported_with_their_reason(pytester: pytest.Pytester, inner) -> None:
    inner(
        """
        @pytest.mark.kafka_broker_config({"no.such.key": "1"})
        def test_unknown_key(kafka_broker):
            pass

        def test_bad_value(kafka_broker_factory):
            from kbroker.config import ConfigError
            with pytest.raises(ConfigError, match="num.partitions: expected an integer"):
                kafka_broker_factory({"num.partitions": "many"})
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ConfigError: unknown configuration key 'no.such.key'*"])

    inner("def test_a(kafka_broker):\n    pass\n", ini="kafka_broker_scope = module\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*kafka_broker_scope = 'module': expected one of function, session*"])

    inner(
        """
        @pytest.mark.kafka_broker_config({"num.partitions": "2"})
        def test_marked(kafka_broker):
            pass
        """,
        ini="kafka_broker_scope = session\n",
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*needs kafka_broker_scope = function*kafka_broker_factory*"])


def test_groups_form_without_the_initial_rebalance_delay(pytester: pytest.Pytester, inner) -> None:
    """As with testcontainers' KafkaContainer, the fixture's broker has group.initial.rebalance.delay.ms=0 (Kafka's
    default is 3 s), so a group forms at its first join; an explicit setting still wins."""
    inner(
        """
        from kafka.admin import ConfigResource, ConfigResourceType

        def rebalance_delay(bootstrap):
            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                configs = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")], config_filter="all")
            finally:
                admin.close()
            entry = configs["broker"]["0"]["group.initial.rebalance.delay.ms"]
            return [entry["value"], entry["config_source"]]

        def test_fixture(kafka_broker):
            producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
            producer.send("events", b"first").get(10)
            producer.close()
            consumer = KafkaConsumer("events", bootstrap_servers=kafka_broker.bootstrap, group_id="g",
                                     auto_offset_reset="earliest", consumer_timeout_ms=10000)
            record = next(iter(consumer))
            admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
            group = admin.describe_groups(["g"])["g"]
            admin.close()
            consumer.close()
            report("fixture", delay=rebalance_delay(kafka_broker.bootstrap), value=record.value.decode(),
                   state=group["group_state"], members=len(group["members"]),
                   coordinator_delay=kafka_broker.broker.groups.initial_rebalance_delay_ms)

        def test_factory(kafka_broker_factory):
            child = kafka_broker_factory(mode="subprocess")
            report("factory", delay=rebalance_delay(child.bootstrap))

        @pytest.mark.kafka_broker_config({"group.initial.rebalance.delay.ms": 3000})
        def test_explicit(kafka_bootstrap):
            report("explicit", delay=rebalance_delay(kafka_bootstrap))
        """
    )
    pytester.runpytest().assert_outcomes(passed=3)
    facts = inner.facts()
    assert facts["fixture"] == {
        "delay": ["0", "STATIC_BROKER_CONFIG"],
        "value": "first",
        "state": "Stable",
        "members": 1,
        "coordinator_delay": 0,
    }
    assert facts["factory"] == {"delay": ["0", "STATIC_BROKER_CONFIG"]}
    assert facts["explicit"] == {"delay": ["3000", "STATIC_BROKER_CONFIG"]}
