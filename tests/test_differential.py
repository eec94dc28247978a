"""Differential tests of protocol/ against kafka-python 3.0.12's independent codecs, for every API and version.

hypothesis fills in every field a version has, walking the JSON message schemas in the kafka-python wheel.
Requests go kafka-python -> bytes -> protocol/ (same values, byte-identical re-encode); responses go
protocol/ -> bytes -> kafka-python (same values, byte-identical re-encode).
"""

from __future__ import annotations

import keyword
import operator
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import kafka.protocol.admin
import kafka.protocol.consumer
import kafka.protocol.metadata
import kafka.protocol.producer
import kafka.protocol.sasl  # noqa: F401  (the imports above register every kafka-python message class)
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas import load_json
from kafka.protocol.schemas.fields.codecs import BitField

from protocol.messages import APIS, ApiSchema

Versions = tuple[int, int] | None

ZERO_UUID = uuid.UUID(int=0)
ABSENT = "<tagged field not sent>"  # a tagged field left at its default, so not on the wire
INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}
MAX_EXAMPLES = 10

# Fields Kafka renamed after kafka-python's schemas were taken, same type and versions: (message, old) -> new.
RENAMED_BY_KAFKA = {("TxnOffsetCommitRequest", "GenerationId"): "GenerationIdOrMemberEpoch"}  # Kafka 4.4, KIP-1319

# (api_key, version, "request" | "response") pairs that cannot be compared; keep this as small as possible.
EXCLUDED: dict[tuple[int, int, str], str] = {}


def parse_versions(text: str | None) -> Versions:
    if text is None or text == "none":
        return None
    if text.endswith("+"):
        return int(text[:-1]), 32767
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def within(version: int, versions: Versions) -> bool:
    return versions is not None and versions[0] <= version <= versions[1]


def snake(name: str) -> str:
    result = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    return result + "_" if keyword.iskeyword(result) else result


@dataclass(frozen=True)
class Node:
    """One schema field, as both implementations see it."""

    name: str  # protocol/ attribute: snake case of the JSON name
    kp_name: str  # kafka-python attribute (differs where kafka-python patches its schema)
    type: str  # JSON type: "int32", "[]string", "[]FetchTopic", "ReplicaState", ...
    versions: Versions
    nullable: Versions
    tagged: Versions  # versions in which the field is a tagged field
    children: tuple[Node, ...]  # the fields of a struct or struct array
    proto_cls: Any  # protocol/ class of a struct or struct array element, else None
    kp_field: Any  # kafka-python's parsed field: its default and the container class of structs
    bitfield: bool  # kafka-python turns this int32 into a set of bit numbers (None for bit 31 alone)

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def scalar(self) -> str:
        return self.type.removeprefix("[]")


@dataclass(frozen=True)
class Message:
    """A request or response type in both implementations."""

    api: ApiSchema
    kind: str
    proto_cls: Any
    kp_cls: Any
    fields: tuple[Node, ...]


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@cache
def kafka_python_classes() -> dict[tuple[int, str], Any]:
    """kafka-python's message class for each (api key, "request" | "response"); versioned wrappers skipped."""
    return {(c.API_KEY, c.type): c for c in _subclasses(ApiMessage) if getattr(c, "_class_version", 0) is None}


def _nodes(raw_fields: list[dict[str, Any]], kp_fields: tuple[Any, ...], top: Any) -> tuple[Node, ...]:
    # kafka-python's parsed fields are in JSON order; its schema patches rename or retype some, never reorder.
    nodes = []
    for raw, kp_field in zip(raw_fields, kp_fields, strict=True):
        has_fields = "fields" in raw
        proto_cls = getattr(top, raw["type"].removeprefix("[]")) if has_fields else None
        # A struct array parses its element struct separately; that copy is the one kafka-python encodes with.
        kp_children = getattr(kp_field, "array_of", kp_field)._fields
        nodes.append(
            Node(
                name=snake(RENAMED_BY_KAFKA.get((top.NAME, raw["name"]), raw["name"])),
                kp_name=kp_field.name,
                type=raw["type"],
                versions=parse_versions(raw["versions"]),
                nullable=parse_versions(raw.get("nullableVersions")),
                tagged=parse_versions(raw.get("taggedVersions")) if "tag" in raw else None,
                children=_nodes(raw["fields"], kp_children, top) if has_fields else (),
                proto_cls=proto_cls,
                kp_field=kp_field,
                bitfield=kp_field.type_str == "bitfield",
            )
        )
    return tuple(nodes)


@cache
def message(api_key: int, kind: str) -> Message:
    api = APIS[api_key]
    proto_cls = api.request_type() if kind == "request" else api.response_type()
    kp_cls = kafka_python_classes()[api_key, kind]
    raw = load_json(kp_cls.__name__)  # the unpatched schema, with its common structs resolved
    assert raw["name"] == proto_cls.NAME and raw["apiKey"] == api_key
    return Message(api, kind, proto_cls, kp_cls, _nodes(raw["fields"], kp_cls._struct._fields, proto_cls))


def compared_pairs() -> list[tuple[int, int]]:
    """Every (api key, version) both implementations know."""
    kp = kafka_python_classes()
    pairs = []
    for key, api in APIS.items():
        if (key, "request") not in kp or (key, "response") not in kp:
            continue  # ConsumerGroupHeartbeat and ConsumerGroupDescribe: kafka-python 3.0.12 lacks them
        low = max(api.valid_versions[0], *(kp[key, kind]._valid_versions[0] for kind in ("request", "response")))
        high = min(api.valid_versions[1], *(kp[key, kind]._valid_versions[1] for kind in ("request", "response")))
        pairs.extend((key, version) for version in range(low, high + 1))
    return pairs


# --- plain values: the common form both implementations' objects are compared in -------------------------


def _signed32(value: int) -> int:
    return value - 2**32 if value >= 2**31 else value


def _plain_scalar(kind: str, value: Any) -> Any:
    if kind == "uuid":
        return ZERO_UUID if value is None else value  # kafka-python reads the zero UUID as None
    if kind in ("bytes", "records") and value is not None:
        return bytes(value)
    return value


def plain(nodes: tuple[Node, ...], obj: Any, version: int, kafka_python: bool) -> dict[str, Any]:
    """An object's fields for ``version`` as plain data; tagged fields at their default become ABSENT."""
    defaults = None
    out: dict[str, Any] = {}
    for node in nodes:
        if not within(version, node.versions):
            continue
        value = getattr(obj, node.kp_name if kafka_python else node.name)
        if within(version, node.tagged):
            if kafka_python:
                default = node.kp_field.default
            else:
                defaults = defaults if defaults is not None else type(obj)()
                default = getattr(defaults, node.name)
            if value == default:
                out[node.name] = ABSENT
                continue
        out[node.name] = plain_value(node, value, version, kafka_python)
    return out


def plain_value(node: Node, value: Any, version: int, kafka_python: bool) -> Any:
    if node.bitfield and kafka_python:
        return _signed32(BitField.to_32_bit_field({31} if value is None else value))
    if value is None:
        return _plain_scalar(node.scalar, None)
    if node.children:
        if node.is_array:
            return [plain(node.children, item, version, kafka_python) for item in value]
        return plain(node.children, value, version, kafka_python)
    if node.is_array:
        return [_plain_scalar(node.scalar, item) for item in value]
    return _plain_scalar(node.scalar, value)


# --- building each implementation's objects from plain values ---------------------------------------------


def build_kafka_python(nodes: tuple[Node, ...], values: dict[str, Any], version: int, cls: Any) -> Any:
    kwargs = {}
    for node in nodes:
        value = values.get(node.name, ABSENT)
        if value is ABSENT:
            continue
        if node.bitfield:
            value = BitField.from_32_bit_field(value)
        elif node.children and value is not None:
            data_class = node.kp_field.data_class
            if node.is_array:
                value = [build_kafka_python(node.children, item, version, data_class) for item in value]
            else:
                value = build_kafka_python(node.children, value, version, data_class)
        kwargs[node.kp_name] = value
    return cls(version=version, **kwargs)


def build_protocol(nodes: tuple[Node, ...], values: dict[str, Any], cls: Any) -> Any:
    kwargs = {}
    for node in nodes:
        value = values.get(node.name, ABSENT)
        if value is ABSENT:
            continue
        if node.children and value is not None:
            if node.is_array:
                value = [build_protocol(node.children, item, node.proto_cls) for item in value]
            else:
                value = build_protocol(node.children, value, node.proto_cls)
        kwargs[node.name] = value
    return cls(**kwargs)


# --- hypothesis strategies from the schema ---------------------------------------------------------------


def _long(short: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A short value repeated past 127 bytes or items, so lengths take multi-byte varints; cheap to draw."""
    return st.builds(operator.mul, short.filter(len), st.integers(130, 200))


def _scalar_strategy(kind: str) -> st.SearchStrategy[Any]:
    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        return st.integers(low, high)
    text = st.text(st.characters(codec="utf-8"), max_size=8)
    binary = st.binary(max_size=12)
    strategies: dict[str, st.SearchStrategy[Any]] = {
        "bool": st.booleans(),
        "float64": st.floats(allow_nan=False),
        "string": text | _long(text),
        "bytes": binary | _long(binary),
        "records": binary | _long(binary),
        "uuid": st.just(ZERO_UUID) | st.uuids(),
    }
    return strategies[kind]


def _value_strategy(node: Node, version: int) -> st.SearchStrategy[Any]:
    if node.children:
        item = struct_strategy(node.children, version, node.proto_cls)
        strategy = st.lists(item, max_size=2) if node.is_array else item
    elif node.is_array:
        items = st.lists(_scalar_strategy(node.scalar), max_size=3)
        strategy = items | _long(items)
    else:
        strategy = _scalar_strategy(node.type)
    if within(version, node.nullable):
        strategy = st.none() | strategy
    return strategy


def _differs_from(default: Any) -> Callable[[Any], bool]:
    return lambda value: value != default


def struct_strategy(nodes: tuple[Node, ...], version: int, proto_cls: Any) -> st.SearchStrategy[dict[str, Any]]:
    """Plain values for every field ``version`` has; a tagged field is ABSENT or differs from its default.

    (A tagged field equal to its default is never sent, so it cannot survive a round trip; kafka-python
    would even send a tagged struct whose fields all hold their defaults, which Kafka and protocol/ omit.)
    """
    defaults = proto_cls()
    parts = {}
    for node in nodes:
        if not within(version, node.versions):
            continue
        strategy = _value_strategy(node, version)
        if within(version, node.tagged):
            default = plain_value(node, getattr(defaults, node.name), version, kafka_python=False)
            strategy = st.just(ABSENT) | strategy.filter(_differs_from(default))
        parts[node.name] = strategy
    return st.fixed_dictionaries(parts)


# --- the tests -------------------------------------------------------------------------------------------


def _cases(kind: str) -> list[Any]:
    cases = []
    for key, version in compared_pairs():
        case_id = f"{APIS[key].name}-v{version}"
        reason = EXCLUDED.get((key, version, kind))
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        cases.append(pytest.param(key, version, id=case_id, marks=marks))
    return cases


def _run(strategy: st.SearchStrategy[dict[str, Any]], check: Callable[[dict[str, Any]], None]) -> None:
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(strategy)
    def run(values: dict[str, Any]) -> None:
        check(values)

    run()


def kafka_python_decode(cls: Any, data: bytes, version: int) -> Any:
    # ApiVersionsResponse.decode falls back to v0 whenever error_code != 0 (what a broker does when it does not
    # support the requested version); the generic decode underneath is the codec this test compares.
    return ApiMessage.decode.__func__(cls, data, version=version)


@pytest.mark.parametrize("api_key,version", _cases("request"))
def test_request_from_kafka_python_decodes_and_reencodes_identically(api_key: int, version: int) -> None:
    msg = message(api_key, "request")

    def check(values: dict[str, Any]) -> None:
        sent = build_kafka_python(msg.fields, values, version, msg.kp_cls)
        data = bytes(sent.encode(version=version))
        assert plain(msg.fields, sent, version, kafka_python=True) == values
        decoded, end = msg.proto_cls.decode(data, version)
        assert end == len(data)
        assert plain(msg.fields, decoded, version, kafka_python=False) == values
        assert decoded.encode(version) == data

    _run(struct_strategy(msg.fields, version, msg.proto_cls), check)


@pytest.mark.parametrize("api_key,version", _cases("response"))
def test_response_from_protocol_decodes_in_kafka_python_and_reencodes_identically(api_key: int, version: int) -> None:
    msg = message(api_key, "response")

    def check(values: dict[str, Any]) -> None:
        sent = build_protocol(msg.fields, values, msg.proto_cls)
        data = sent.encode(version)
        assert plain(msg.fields, sent, version, kafka_python=False) == values
        decoded = kafka_python_decode(msg.kp_cls, data, version)
        assert plain(msg.fields, decoded, version, kafka_python=True) == values
        # No version= here: kafka-python's decode leaves _header unset and encode(version=...) then trips on it.
        assert decoded.version == version and bytes(decoded.encode()) == data

    _run(struct_strategy(msg.fields, version, msg.proto_cls), check)


def test_every_api_and_version_both_know_is_compared() -> None:
    pairs = compared_pairs()
    known_to_kafka_python = {key for key, kind in kafka_python_classes() if kind == "request"}
    shared = known_to_kafka_python & set(APIS)
    assert shared == known_to_kafka_python  # Kafka's schema jar has every API kafka-python has, and more
    assert {68, 69} <= set(APIS) - shared  # ConsumerGroupHeartbeat and ConsumerGroupDescribe, among others
    every = {(key, v) for key in shared for v in range(APIS[key].valid_versions[0], APIS[key].valid_versions[1] + 1)}
    assert set(pairs) <= every and len(pairs) >= 230
    # Versions newer than kafka-python 3.0.12's schemas (Kafka 4.4's): ApiVersions v5, TxnOffsetCommit v6 and
    # DeleteGroups v3; tests/test_codegen.py round-trips them and tests/kafka compares them with Kafka's answers.
    assert every - set(pairs) == {(18, 5), (28, 6), (42, 3)}
    for kind in ("request", "response"):
        compared = [case for case in _cases(kind) if not case.marks]
        assert len(compared) == len(pairs) - sum(1 for *_, k in EXCLUDED if k == kind)


def test_schema_walk_sees_every_field_kind() -> None:
    kinds: set[str] = set()
    tagged = nullable_structs = renamed = 0

    def visit(nodes: tuple[Node, ...]) -> None:
        nonlocal tagged, nullable_structs, renamed
        for node in nodes:
            kinds.add(("[]" if node.is_array else "") + ("struct" if node.children else node.scalar))
            tagged += node.tagged is not None
            nullable_structs += bool(node.children) and not node.is_array and node.nullable is not None
            renamed += node.name != node.kp_name
            visit(node.children)

    for key, _ in compared_pairs():
        for kind in ("request", "response"):
            visit(message(key, kind).fields)
    assert kinds >= {"int8", "int16", "int32", "int64", "uint16", "float64", "bool", "string", "bytes", "records"}
    assert kinds >= {"uuid", "struct", "[]struct", "[]int32", "[]int64", "[]string"}
    assert tagged > 10 and nullable_structs >= 2 and renamed >= 3
