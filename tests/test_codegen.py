"""The generated codecs match the schemas they came from, and every API/version round-trips."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.messages import APIS

REPO = Path(__file__).resolve().parent.parent


def test_generated_code_has_not_drifted() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_messages.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_registry_covers_every_api_of_the_schema_jar() -> None:
    import zipfile

    sys.path.insert(0, str(REPO / "tools"))
    import gen_messages

    with zipfile.ZipFile(gen_messages.schema_jar()) as jar:
        names = [Path(n).stem for n in jar.namelist() if n.startswith("common/message/") and n.endswith("Request.json")]
    removed = {"ControlledShutdownRequest", "LeaderAndIsrRequest", "StopReplicaRequest", "UpdateMetadataRequest"}
    assert len(names) > 90  # about 200 schemas, half of them requests
    ours = {api.request_class for api in APIS.values()}
    assert set(names) - removed - {"RequestHeader"} == ours
    assert {"ConsumerGroupHeartbeatRequest", "ShareFetchRequest", "StreamsGroupHeartbeatRequest"} <= ours
    assert APIS[0].name == "Produce" and APIS[1].valid_versions == (4, 18)
    assert APIS[18].flexible_versions == (3, 32767)
    assert APIS[69].name == "ConsumerGroupDescribe" and APIS[69].valid_versions == (0, 1)


CASES = [
    (api, kind, version)
    for api in APIS.values()
    for kind in ("request", "response")
    for version in range(api.valid_versions[0], api.valid_versions[1] + 1)
]


@pytest.mark.parametrize("api,kind,version", CASES, ids=[f"{a.name}-{k}-v{v}" for a, k, v in CASES])
def test_default_message_round_trips(api, kind, version) -> None:
    cls = api.request_type() if kind == "request" else api.response_type()
    encoded = cls().encode(version)
    decoded, end = cls.decode(encoded, version)
    assert end == len(encoded)
    assert decoded.encode(version) == encoded


def test_unknown_tagged_fields_are_kept_and_re_encoded() -> None:
    from protocol.messages.metadata_request import MetadataRequest

    plain = MetadataRequest(topics=None).encode(12)
    assert plain.endswith(b"\x00")  # the empty tagged-field section
    with_tags = plain[:-1] + bytes([2, 5, 3, 1, 2, 3, 90, 1, 9])  # tags 5 and 90
    decoded, end = MetadataRequest.decode(with_tags, 12)
    assert end == len(with_tags)
    assert decoded.unknown_tagged_fields == {5: b"\x01\x02\x03", 90: b"\x09"}
    assert decoded.encode(12) == with_tags


def test_known_tagged_field_decodes_into_its_attribute() -> None:
    from protocol.messages.fetch_request import FetchRequest

    request = FetchRequest(cluster_id="abc", max_wait_ms=10, min_bytes=1)
    encoded = request.encode(12)
    decoded, _ = FetchRequest.decode(encoded, 12)
    assert decoded.cluster_id == "abc"
    assert FetchRequest.decode(FetchRequest(max_wait_ms=10).encode(12), 12)[0].cluster_id is None


def test_modules_import_lazily() -> None:
    code = "import sys, protocol.framing; print(sum(1 for m in sys.modules if m.startswith('protocol.messages.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert int(out.stdout) == 2, out.stderr  # only the two header modules


def test_every_module_imports() -> None:
    for api in APIS.values():
        importlib.import_module(api.request_module)
        importlib.import_module(api.response_module)


# --- the record types: protocol/metadata_records and protocol/coordinator_records ----------------------


def _gen_messages():
    sys.path.insert(0, str(REPO / "tools"))
    import gen_messages

    return gen_messages


def _record_schemas(artifact: str, prefix: str) -> dict[str, dict]:
    import zipfile

    gen_messages = _gen_messages()
    with zipfile.ZipFile(gen_messages.record_jar(artifact)) as jar:
        found = [
            gen_messages.load_schema(jar.read(n).decode())
            for n in jar.namelist()
            if n.startswith(prefix) and n.endswith(".json")
        ]
    return {schema["name"]: schema for schema in found}  # a file may be named otherwise (ZkMigrationRecord.json)


def test_metadata_registry_covers_every_schema_of_the_metadata_jar() -> None:
    from protocol.metadata_records import KAFKA_VERSION, RECORD_TYPE_BY_NAME, RECORD_TYPES

    schemas = _record_schemas("kafka-metadata", "common/metadata/")
    assert KAFKA_VERSION == _gen_messages().KAFKA_RECORDS_VERSION
    assert set(schemas) == set(RECORD_TYPE_BY_NAME)
    for name, schema in schemas.items():
        record_type = RECORD_TYPE_BY_NAME[name]
        assert record_type.api_key == schema["apiKey"]
        assert RECORD_TYPES[schema["apiKey"]] is record_type
        cls = record_type.record_class()
        assert (cls.NAME, cls.API_KEY, cls.VALID_VERSIONS) == (name, schema["apiKey"], record_type.valid_versions)
    assert RECORD_TYPES[2].name == "TopicRecord" and RECORD_TYPES[3].valid_versions == (0, 2)
    assert RECORD_TYPES[12].name == "FeatureLevelRecord" and RECORD_TYPES[14].name == "ClientQuotaRecord"


@pytest.mark.parametrize(
    "artifact,coordinator",
    [
        ("kafka-group-coordinator", "group"),
        ("kafka-transaction-coordinator", "transaction"),
        ("kafka-share-coordinator", "share"),
    ],
)
def test_coordinator_registry_covers_every_record_schema_of_its_jar(artifact: str, coordinator: str) -> None:
    from protocol.coordinator_records import RECORD_TYPES_BY_COORDINATOR

    schemas = _record_schemas(artifact, "common/message/")
    keys = {s["apiKey"]: name for name, s in schemas.items() if s["type"] == "coordinator-key"}
    values = {s["apiKey"]: name for name, s in schemas.items() if s["type"] == "coordinator-value"}
    ours = RECORD_TYPES_BY_COORDINATOR[coordinator]
    assert {t: r.key_class_name for t, r in ours.items()} == keys
    assert {t: r.value_class_name for t, r in ours.items()} == values
    for record_type in ours.values():
        assert record_type.key_class().VALID_VERSIONS == (0, 0)
        assert record_type.value_class().VALID_VERSIONS == record_type.value_versions


def test_coordinator_record_types_are_kafkas_numbers() -> None:
    from protocol.coordinator_records import GROUP_RECORD_TYPES, SHARE_RECORD_TYPES, TRANSACTION_RECORD_TYPES

    assert GROUP_RECORD_TYPES[1].name == "OffsetCommit" and GROUP_RECORD_TYPES[1].value_versions == (0, 4)
    assert GROUP_RECORD_TYPES[2].name == "GroupMetadata" and GROUP_RECORD_TYPES[2].value_versions == (0, 4)
    assert GROUP_RECORD_TYPES[3].name == "ConsumerGroupMetadata"
    assert TRANSACTION_RECORD_TYPES[0].name == "TransactionLog" and TRANSACTION_RECORD_TYPES[0].value_versions == (0, 1)
    assert SHARE_RECORD_TYPES[0].name == "ShareSnapshot" and SHARE_RECORD_TYPES[1].name == "ShareUpdate"


def _record_cases() -> list[tuple[str, str, int]]:
    from protocol.coordinator_records import RECORD_TYPES_BY_COORDINATOR
    from protocol.metadata_records import RECORD_TYPES

    cases = [
        (r.module, r.class_name, v)
        for r in RECORD_TYPES.values()
        for v in range(r.valid_versions[0], r.valid_versions[1] + 1)
    ]
    for record_types in RECORD_TYPES_BY_COORDINATOR.values():
        for r in record_types.values():
            cases.append((r.key_module, r.key_class_name, 0))
            low, high = r.value_versions
            cases += [(r.value_module, r.value_class_name, v) for v in range(low, high + 1)]
    return cases


RECORD_CASES = _record_cases()


@pytest.mark.parametrize("module,name,version", RECORD_CASES, ids=[f"{n}-v{v}" for _, n, v in RECORD_CASES])
def test_default_record_round_trips(module: str, name: str, version: int) -> None:
    cls = getattr(importlib.import_module(module), name)
    encoded = cls().encode(version)
    decoded, end = cls.decode(encoded, version)
    assert end == len(encoded)
    assert decoded == cls() or decoded.encode(version) == encoded
    assert decoded.encode(version) == encoded


def test_record_schema_rules_are_kafkas() -> None:
    gen_messages = _gen_messages()
    base = {"name": "FooKey", "type": "coordinator-key", "apiKey": 3, "fields": []}
    gen_messages.check_record_schema(
        gen_messages.build_schema({**base, "validVersions": "0", "flexibleVersions": "none"})
    )
    for bad in (
        {**base, "validVersions": "0-1", "flexibleVersions": "none"},  # a key has version 0 only
        {**base, "validVersions": "0", "flexibleVersions": "0+"},  # and is never flexible
        {**base, "apiKey": None, "validVersions": "0", "flexibleVersions": "none"},
        {**base, "type": "metadata", "validVersions": "0-2", "flexibleVersions": "0-1"},  # not open-ended
    ):
        schema = gen_messages.build_schema({k: v for k, v in bad.items() if v is not None})
        with pytest.raises(SystemExit):
            gen_messages.check_record_schema(schema)


def test_an_unstable_latest_version_is_read_but_not_written() -> None:
    gen_messages = _gen_messages()
    spec = {
        "name": "FooRecord",
        "type": "metadata",
        "apiKey": 99,
        "validVersions": "0-3",
        "flexibleVersions": "0+",
        "latestVersionUnstable": True,
        "fields": [{"name": "Bar", "type": "int32", "versions": "3+"}],
    }
    schema = gen_messages.build_schema(spec)
    assert gen_messages.stable_versions(schema) == (0, 2)
    assert "    LATEST_VERSION_UNSTABLE = True" in gen_messages.Emitter(schema).module().splitlines()
    source = gen_messages.metadata_registry_source([schema])
    assert (
        "99: MetadataRecordType(99, 'FooRecord', 'protocol.metadata_records.foo_record', 'FooRecord', (0, 3), (0, 2)),"
        in source
    )
    stable = gen_messages.build_schema({**spec, "latestVersionUnstable": False})
    assert gen_messages.stable_versions(stable) == (0, 3)
    assert "LATEST_VERSION_UNSTABLE" not in gen_messages.Emitter(stable).module()
