"""Client quotas (kbroker/quotas.py, kbroker/apis/client_quotas.py, kbroker/server/throttling.py): AlterClientQuotas
validation and DescribeClientQuotas filters with the answers Apache Kafka 4.3 gives (tests/kafka/
test_client_quotas_kafka.py compares them live), ClientQuotaRecords in the metadata log across restarts, the rate
and throttle arithmetic on an injected clock, Kafka's precedence of user and client-id quotas, and one live
producer held to its quota."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from kbroker.durable.files import DamagedFileError
from kbroker.java_hashing import java_hashmap_order, java_string_hash
from kbroker.metadata.controller import LocalController, MetadataCache
from kbroker.metadata.log import MetadataLog
from kbroker.quotas import (
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    ClientQuotas,
    QuotaFilterError,
    entity_hash,
    entity_parts_in_kafka_order,
    is_ip_literal,
    read_quotas_file,
    values_in_kafka_order,
    write_quotas_file,
)
from kbroker.server import throttling
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.alter_client_quotas_request import AlterClientQuotasRequest
from protocol.messages.create_topics_request import CreateTopicsRequest
from protocol.messages.describe_client_quotas_request import DescribeClientQuotasRequest
from protocol.messages.produce_request import ProduceRequest
from protocol.metadata_records.client_quota_record import ClientQuotaRecord
from protocol.records import Record, build_batch
from tests.broker.quota_store import ControlledQuotas

INVALID = ErrorCode.INVALID_REQUEST


class FakeClock:
    def __init__(self) -> None:
        self.seconds = 1000.0

    def __call__(self) -> float:
        return self.seconds


def alter_one(quotas: ClientQuotas, parts: list[tuple[str, str | None]], ops: list[tuple[str, float | None]]) -> Any:
    [(_, result)] = quotas.alter([(parts, ops)], validate_only=False)
    return result.error, result.message


# --- Kafka's orders ----------------------------------------------------------------------------------------------


def test_java_hash_and_hashmap_order_match_what_kafka_answered() -> None:
    assert java_string_hash("user") == 3599307 and java_string_hash(None) == 0
    # DescribeClientQuotas of an entity with four quotas, as Kafka 4.3 listed them.
    values = {"request_percentage": 1.0, "controller_mutation_rate": 2.0, "consumer_byte_rate": 3.0}
    values["producer_byte_rate"] = 4.0
    assert [k for k, _ in values_in_kafka_order(values)] == [
        "producer_byte_rate",
        "consumer_byte_rate",
        "controller_mutation_rate",
        "request_percentage",
    ]
    assert [k for k, _ in values_in_kafka_order({"producer_byte_rate": 1, "consumer_byte_rate": 2})] == [
        "consumer_byte_rate",
        "producer_byte_rate",
    ]
    assert entity_parts_in_kafka_order([("user", None), ("client-id", None)]) == [("client-id", None), ("user", None)]
    # A repeated type keeps its last name (Kafka's entity map).
    assert entity_parts_in_kafka_order([("user", "bob"), ("user", "x")], 2) == [("user", "x")]
    # The entries of one AlterClientQuotas answer, in the order Kafka gave them.
    sent = [(("client-id", "b"), ("user", "a")), (("ip", None),), (("client-id", "z"), ("user", None))]
    assert java_hashmap_order(list(reversed(sent)), entity_hash) == sent


# --- AlterClientQuotas -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parts", "ops", "message"),
    [
        ([("user", "alice")], [("bogus", 1.0)], "Invalid configuration key bogus"),
        ([("user", "alice")], [("producer_byte_rate", 1.5)], "producer_byte_rate cannot be a fractional value."),
        ([("user", "alice")], [("producer_byte_rate", -1.0)], "Quota producer_byte_rate must be greater than 0"),
        ([("user", "alice")], [("producer_byte_rate", 0.0)], "Quota producer_byte_rate must be greater than 0"),
        ([("user", "alice")], [("request_percentage", -0.5)], "Quota request_percentage must be greater than 0"),
        (
            [("client-id", "c")],
            [("producer_byte_rate", 1e30)],
            "Proposed value for producer_byte_rate is too large for a LONG.",
        ),
        (
            [("user", "alice")],
            [("producer_byte_rate", 1.0), ("producer_byte_rate", 2.0)],
            "Ignoring duplicate entity ClientQuotaEntity(entries={user=alice})",
        ),
        ([("user", "alice")], [("bogus", 1.0), ("consumer_byte_rate", 2048.0)], "Invalid configuration key bogus"),
        ([], [("consumer_byte_rate", 2048.0)], "Invalid empty client quota entity"),
        ([("group", "g")], [("consumer_byte_rate", 2048.0)], "Unhandled client quota entity type: group"),
        ([("user", "")], [("consumer_byte_rate", 2048.0)], "Empty user not supported"),
        ([("ip", "1.2.3.4")], [("consumer_byte_rate", 2048.0)], "Invalid configuration key consumer_byte_rate"),
        (
            [("ip", "no.such.host.invalid")],
            [("connection_creation_rate", 20.0)],
            "no.such.host.invalid is not a valid IP or resolvable host.",
        ),
        (
            [("user", "u"), ("ip", "1.2.3.4")],
            [("connection_creation_rate", 20.0)],
            "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId",
        ),
        (
            [("client-id", "c")],
            [("connection_creation_rate", 20.0)],
            "Invalid configuration key connection_creation_rate",
        ),
    ],
)
def test_alter_refuses_what_kafka_refuses_with_its_message(
    parts: list[tuple[str, str | None]], ops: list[tuple[str, float | None]], message: str
) -> None:
    quotas = ControlledQuotas()
    assert alter_one(quotas, parts, ops) == (INVALID, message)
    assert quotas.describe([], strict=False) == []  # nothing of a refused entity is kept


def test_alter_sets_removes_validates_only_and_answers_each_entity_once() -> None:
    quotas = ControlledQuotas()
    ok = (ErrorCode.NONE, None)
    assert alter_one(quotas, [("user", "alice")], [(PRODUCER_BYTE_RATE, 1024.0), (REQUEST_PERCENTAGE, 0.5)]) == ok
    assert alter_one(quotas, [("user", "bob"), ("user", "x")], [(CONSUMER_BYTE_RATE, 2048.0)]) == ok  # user=x
    assert alter_one(quotas, [("ip", "1.2.3.4")], [(CONNECTION_CREATION_RATE, 20.0)]) == ok
    assert alter_one(quotas, [("user", None), ("client-id", None)], [(PRODUCER_BYTE_RATE, 100.0)]) == ok
    # validate_only: answered, not applied.
    [(_, checked)] = quotas.alter([([("user", "w")], [(PRODUCER_BYTE_RATE, 100.0)])], validate_only=True)
    assert (checked.error, checked.parts) == (ErrorCode.NONE, [("user", "w")])
    # The same entity twice: one answer, an error; the first entry's change still applies (as in Kafka).
    results = quotas.alter(
        [([("user", "v")], [(PRODUCER_BYTE_RATE, 100.0)]), ([("user", "v")], [(CONSUMER_BYTE_RATE, 100.0)])], False
    )
    assert [(r.error, r.message) for _, r in results] == [
        (INVALID, "Ignoring duplicate entity ClientQuotaEntity(entries={user=v})")
    ]
    # Removing a key that is not set is fine; removing the last key removes the entity.
    assert alter_one(quotas, [("user", "alice")], [(PRODUCER_BYTE_RATE, None), ("nothing", None)]) == ok
    assert alter_one(quotas, [("user", "alice")], [(REQUEST_PERCENTAGE, None)]) == ok
    assert dict(quotas.describe([], strict=False)) == {
        (("ip", "1.2.3.4"),): {CONNECTION_CREATION_RATE: 20.0},
        (("user", "v"),): {PRODUCER_BYTE_RATE: 100.0},
        (("user", "x"),): {CONSUMER_BYTE_RATE: 2048.0},
        (("client-id", None), ("user", None)): {PRODUCER_BYTE_RATE: 100.0},
    }


def test_controller_mutation_rate_is_refused_because_it_is_not_enforced() -> None:
    quotas = ControlledQuotas()
    code, message = alter_one(
        quotas, [("user", "alice")], [(PRODUCER_BYTE_RATE, 10.0), ("controller_mutation_rate", 5.0)]
    )
    assert code == INVALID and message.startswith("kbroker does not enforce controller_mutation_rate (KIP-599)")
    assert quotas.describe([], strict=False) == []
    assert alter_one(quotas, [("user", "alice")], [("controller_mutation_rate", None)]) == (ErrorCode.NONE, None)


# --- DescribeClientQuotas ----------------------------------------------------------------------------------------


@pytest.fixture
def described() -> ControlledQuotas:
    quotas = ControlledQuotas()
    stored: list[tuple[list[tuple[str, str | None]], str]] = [
        ([("user", "alice")], PRODUCER_BYTE_RATE),
        ([("user", None)], PRODUCER_BYTE_RATE),
        ([("client-id", "app")], CONSUMER_BYTE_RATE),
        ([("user", "alice"), ("client-id", None)], REQUEST_PERCENTAGE),
        ([("ip", "10.0.0.1")], CONNECTION_CREATION_RATE),
    ]
    for parts, key in stored:
        assert alter_one(quotas, parts, [(key, 100.0)]) == (ErrorCode.NONE, None)
    return quotas


EXACT, DEFAULT, ANY = 0, 1, 2


@pytest.mark.parametrize(
    ("components", "strict", "found"),
    [
        ([("user", EXACT, "alice")], False, [[("user", "alice")], [("client-id", None), ("user", "alice")]]),
        ([("user", EXACT, "alice")], True, [[("user", "alice")]]),
        ([("user", DEFAULT, None)], False, [[("user", None)]]),
        ([("user", ANY, None)], True, [[("user", "alice")], [("user", None)]]),
        ([("client-id", DEFAULT, None)], False, [[("client-id", None), ("user", "alice")]]),
        ([("client-id", ANY, None), ("user", EXACT, "alice")], True, [[("client-id", None), ("user", "alice")]]),
        ([("ip", ANY, None)], False, [[("ip", "10.0.0.1")]]),
        ([("ip", DEFAULT, None)], False, []),
        ([("user", EXACT, "nobody")], False, []),
        ([], True, []),
    ],
)
def test_describe_filters_as_kafka(
    described: ClientQuotas, components: list[tuple[str, int, str | None]], strict: bool, found: list[Any]
) -> None:
    answer = described.describe(components, strict)
    assert sorted((entity_parts_in_kafka_order(entity) for entity, _ in answer), key=repr) == sorted(found, key=repr)


def test_describe_without_components_lists_everything(described: ClientQuotas) -> None:
    assert len(described.describe([], strict=False)) == 5


@pytest.mark.parametrize(
    ("components", "code", "message"),
    [
        ([("bogus", ANY, None)], ErrorCode.UNSUPPORTED_VERSION, "Unsupported entity type bogus"),
        ([("", ANY, None)], INVALID, "Invalid empty entity type."),
        ([("user", 5, None)], INVALID, "Unknown match type 5"),
        ([("user", EXACT, None)], INVALID, "Request specified MATCH_TYPE_EXACT, but set match string to null."),
        ([("user", DEFAULT, "x")], INVALID, "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
        ([("user", ANY, "x")], INVALID, "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."),
        (
            [("user", ANY, None), ("user", ANY, None)],
            INVALID,
            "Entity type user cannot appear more than once in the filter.",
        ),
        (
            [("user", ANY, None), ("ip", ANY, None)],
            INVALID,
            "Invalid entity filter component combination. IP filter component should not be used with user or "
            "clientId filter component.",
        ),
    ],
)
def test_describe_refuses_filters_kafka_refuses(
    described: ClientQuotas, components: list[tuple[str, int, str | None]], code: ErrorCode, message: str
) -> None:
    with pytest.raises(QuotaFilterError) as refused:
        described.describe(components, strict=False)
    assert (refused.value.code, refused.value.message) == (code, message)


# --- persistence -------------------------------------------------------------------------------------------------


def test_quotas_are_client_quota_records_and_survive_a_restart(tmp_path: Path) -> None:
    """Each change is ClientQuotaRecords in the metadata log; a controller reopened on it has the same quotas."""
    with MetadataLog(tmp_path) as metadata_log:
        quotas = ClientQuotas()
        cache = MetadataCache()
        cache.subscribe(quotas.publish)
        controller = LocalController(1, cache, metadata_log)
        for parts, ops in [
            ([("user", "ANONYMOUS")], [(PRODUCER_BYTE_RATE, 5000.0)]),
            ([("client-id", None), ("user", None)], [(REQUEST_PERCENTAGE, 12.5)]),
            ([("ip", None)], [(CONNECTION_CREATION_RATE, 7.0)]),
            ([("client-id", "gone")], [(CONSUMER_BYTE_RATE, 1.0)]),
            ([("client-id", "gone")], [(CONSUMER_BYTE_RATE, None)]),
        ]:
            [(_, result)] = trio.run(controller.alter_client_quotas, [(parts, ops)], False, is_ip_literal)
            assert result.error == ErrorCode.NONE
        written = [
            (
                [(e.entity_type, e.entity_name) for e in r.message.entity],
                r.message.key,
                r.message.value,
                r.message.remove,
            )
            for r in metadata_log.replay().records()
            if isinstance(r.message, ClientQuotaRecord)
        ]
    assert written == [
        ([("user", "ANONYMOUS")], PRODUCER_BYTE_RATE, 5000.0, False),
        ([("client-id", None), ("user", None)], REQUEST_PERCENTAGE, 12.5, False),
        ([("ip", None)], CONNECTION_CREATION_RATE, 7.0, False),
        ([("client-id", "gone")], CONSUMER_BYTE_RATE, 1.0, False),
        ([("client-id", "gone")], CONSUMER_BYTE_RATE, 0.0, True),
    ]
    with MetadataLog(tmp_path) as metadata_log:
        reopened = ClientQuotas()
        cache = MetadataCache()
        cache.subscribe(reopened.publish)
        LocalController(1, cache, metadata_log)
    assert dict(reopened.describe([], strict=False)) == dict(quotas.describe([], strict=False))
    assert len(reopened.describe([], strict=False)) == 3 and reopened.enforcing and reopened.limits_connections


def test_an_older_quotas_file_reads_back_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "client-quotas"
    stored = {(("user", "ANONYMOUS"),): {PRODUCER_BYTE_RATE: 5000.0}, (("ip", None),): {CONNECTION_CREATION_RATE: 7.0}}
    write_quotas_file(path, stored)
    assert read_quotas_file(path) == stored
    data = bytearray(path.read_bytes())
    data[-2] ^= 0xFF
    path.write_bytes(data)
    with pytest.raises(DamagedFileError, match="checksum mismatch"):
        read_quotas_file(path)


def test_quotas_survive_a_broker_restart_over_the_wire(tmp_path: Path) -> None:
    with RunningBroker(tmp_path, {"node.id": "1"}) as running:
        with WireClient(running.bootstrap) as client:
            entity = [AlterClientQuotasRequest.EntityData(entity_type="client-id", entity_name="kept")]
            op = AlterClientQuotasRequest.OpData(key=CONSUMER_BYTE_RATE, value=4096.0)
            answer = client.request(
                AlterClientQuotasRequest(entries=[AlterClientQuotasRequest.EntryData(entity=entity, ops=[op])]), 1
            )
            assert [(e.error_code, e.error_message) for e in answer.entries] == [(0, None)]
        running.restart()
        with WireClient(running.bootstrap) as client:
            component = DescribeClientQuotasRequest.ComponentData(
                entity_type="client-id", match_type=EXACT, match="kept"
            )
            described = client.request(DescribeClientQuotasRequest(components=[component]), 1)
    assert (described.error_code, described.error_message) == (0, "")
    assert [
        ([(e.entity_type, e.entity_name) for e in entry.entity], [(v.key, v.value) for v in entry.values])
        for entry in described.entries
    ] == [([("client-id", "kept")], [(CONSUMER_BYTE_RATE, 4096.0)])]


# --- rates and throttle times ------------------------------------------------------------------------------------


def test_throttle_time_is_kafkas_over_the_sampled_window() -> None:
    clock = FakeClock()
    quotas = ControlledQuotas(window_samples=11, window_seconds=1, clock=clock)
    alter_one(quotas, [("user", "ANONYMOUS")], [(PRODUCER_BYTE_RATE, 1000.0)])
    # The rate is measured over at least 10 whole windows: 5000 bytes at once is 500 B/s, within the quota.
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "p", 5000) == 0
    # 15000 bytes over 10 s is 1500 B/s: (1500 - 1000) / 1000 * 10000 ms.
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "p", 10000) == 5000
    # 5 s later the window is 10 s still (the oldest sample started 5 s ago, plus 5 missing windows)...
    clock.seconds += 5
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "p", 0) == 5000
    # ...and after 11 windows every sample has expired: nothing recorded, no throttle.
    clock.seconds += 11
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "p", 0) == 0
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "p", 10000) == 0  # 10000 over 10 s: at the quota
    # 10.5 s later the oldest sample spans more than 10 windows: 11000 bytes over 10.5 s.
    clock.seconds += 10.5
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "p", 1000) == 500  # (11000/10.5 - 1000) / 1000 * 10500


def test_request_percentage_throttle_is_capped_at_one_window() -> None:
    clock = FakeClock()
    quotas = ControlledQuotas(window_samples=11, window_seconds=2, clock=clock)
    alter_one(quotas, [("client-id", "busy")], [(REQUEST_PERCENTAGE, 10.0)])
    # 5 s of handler time at once: 500 percent-seconds over 20 s = 25%, 150% over the quota, 30 s: capped at 2 s.
    assert quotas.record(REQUEST_PERCENTAGE, "ANONYMOUS", "busy", 500.0) == 2000


def test_quota_precedence_and_who_shares_a_rate() -> None:
    clock = FakeClock()
    quotas = ControlledQuotas(window_samples=2, window_seconds=1, clock=clock)
    user, other = "ANONYMOUS", "bob"

    def limit_seen(user: str, client: str) -> float:
        resolved = quotas._resolve(PRODUCER_BYTE_RATE, user, client)
        assert resolved is not None
        return resolved[1]

    levels: list[tuple[list[tuple[str, str | None]], float]] = [
        ([("client-id", None)], 8.0),
        ([("client-id", "c")], 7.0),
        ([("user", None)], 6.0),
        ([("user", None), ("client-id", None)], 5.0),
        ([("user", None), ("client-id", "c")], 4.0),
        ([("user", user)], 3.0),
        ([("user", user), ("client-id", None)], 2.0),
        ([("user", user), ("client-id", "c")], 1.0),
    ]
    assert quotas._resolve(PRODUCER_BYTE_RATE, user, "c") is None
    for parts, value in levels:  # each more specific level takes over
        alter_one(quotas, parts, [(PRODUCER_BYTE_RATE, value)])
        assert limit_seen(user, "c") == value
    assert limit_seen(user, "d") == 2.0  # user + default client id
    assert limit_seen(other, "c") == 4.0  # default user + client id c
    assert limit_seen(other, "d") == 5.0
    # A user-level quota is shared by all the user's clients; a user+client one per client id.
    alter_one(quotas, [("user", other)], [(PRODUCER_BYTE_RATE, 100.0)])
    assert quotas.record(PRODUCER_BYTE_RATE, other, "x", 100) == 0
    assert quotas.record(PRODUCER_BYTE_RATE, other, "y", 100) == 1000  # 200 B over 1 s against 100 B/s
    assert quotas.record(PRODUCER_BYTE_RATE, user, "x", 2) == 0  # user+default client: x ...
    assert quotas.record(PRODUCER_BYTE_RATE, user, "y", 2) == 0  # ... and y each have 2 B/s


def test_enforcing_only_while_a_byte_or_request_quota_is_set() -> None:
    quotas = ControlledQuotas()
    assert not quotas.enforcing and not quotas.limits_connections
    alter_one(quotas, [("ip", None)], [(CONNECTION_CREATION_RATE, 5.0)])
    assert not quotas.enforcing and quotas.limits_connections
    alter_one(quotas, [("client-id", "c")], [(CONSUMER_BYTE_RATE, 5.0)])
    assert quotas.enforcing
    alter_one(quotas, [("client-id", "c")], [(CONSUMER_BYTE_RATE, None)])
    assert not quotas.enforcing


def test_connections_over_an_ips_rate_are_held_and_not_counted() -> None:
    clock = FakeClock()
    quotas = ControlledQuotas(window_samples=2, window_seconds=1, clock=clock)
    alter_one(quotas, [("ip", None)], [(CONNECTION_CREATION_RATE, 2.0)])
    alter_one(quotas, [("ip", "10.0.0.9")], [(CONNECTION_CREATION_RATE, 1.0)])
    assert [quotas.record_connection("10.0.0.1") for _ in range(4)] == [0, 0, 500, 500]
    assert [quotas.record_connection("10.0.0.9") for _ in range(2)] == [0, 1000]


def test_timed_counts_the_handlers_steps_not_its_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(throttling.time, "perf_counter", lambda: now[0])

    async def handler() -> str:
        now[0] += 0.25  # work
        await trio.sleep(0)  # another task runs meanwhile (below) and takes 10 s
        now[0] += 0.5
        return "done"

    async def other() -> None:
        now[0] += 10.0

    async def main() -> tuple[str, float]:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            return await throttling.timed(handler())

    assert trio.run(main) == ("done", 0.75)


def test_client_throttling_versions_follow_kip_219() -> None:
    assert not throttling.client_throttles(0, 5) and throttling.client_throttles(0, 6)
    assert not throttling.client_throttles(1, 7) and throttling.client_throttles(1, 8)
    assert throttling.client_throttles(48, 0) and throttling.client_throttles(44, 0)
    assert throttling.user_of("User:ANONYMOUS") == "ANONYMOUS"


# --- live: a producer held to its quota --------------------------------------------------------------------------

QUOTA = 200_000  # bytes/s


@pytest.fixture
def quota_broker(tmp_path: Path) -> Iterator[str]:
    # Two samples of one second: the burst allowed before throttling starts is about one second's worth.
    with RunningBroker(
        tmp_path, {"node.id": "1", "quota.window.num": "2", "quota.window.size.seconds": "1"}
    ) as running:
        yield running.bootstrap


def test_a_producer_over_its_byte_rate_is_throttled_and_held_near_it(quota_broker: str) -> None:
    value = b"x" * 20_000
    records = build_batch([Record(offset_delta=0, timestamp_delta=0, key=None, value=value)])
    with WireClient(quota_broker, timeout=30, client_id="throttled") as client:
        topic = CreateTopicsRequest.CreatableTopic(name="quota", num_partitions=1, replication_factor=1)
        assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=10_000), 7).topics[0].error_code == 0
        entity = [AlterClientQuotasRequest.EntityData(entity_type="user", entity_name="ANONYMOUS")]
        op = AlterClientQuotasRequest.OpData(key=PRODUCER_BYTE_RATE, value=float(QUOTA))
        answer = client.request(
            AlterClientQuotasRequest(entries=[AlterClientQuotasRequest.EntryData(entity=entity, ops=[op])]), 1
        )
        assert answer.entries[0].error_code == 0
        partition = ProduceRequest.PartitionProduceData(index=0, records=records)
        produce = ProduceRequest(
            acks=1,
            timeout_ms=10_000,
            topic_data=[ProduceRequest.TopicProduceData(name="quota", partition_data=[partition])],
        )
        acked, throttles = 0, []
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < 4.0:
            # The client does not back off itself: the broker reading nothing while muted holds it back.
            response = client.request(produce, 9)
            assert response.responses[0].partition_responses[0].error_code == 0
            acked += len(records)
            throttles.append(response.throttle_time_ms)
        elapsed = time.monotonic() - started
    assert max(throttles) > 0
    # Within the quota, give or take the first second's burst; well above nothing (generous on a busy machine).
    assert QUOTA * 0.3 < acked / elapsed < QUOTA * 2.0, (acked, elapsed, throttles)
