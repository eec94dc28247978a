"""hypothesis strategies for Kafka's record types, built from the record schemas that tools/gen_messages.py reads.

Every field a version has is filled in (nullable ones are sometimes null, arrays hold up to three elements),
so a round trip exercises each field's encoding in that version; fields the version lacks keep their defaults.
"""

from __future__ import annotations

import importlib
import sys
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
}
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)  # what UTF-8 can encode


def gen_messages() -> Any:
    sys.path.insert(0, str(REPO / "tools"))
    import gen_messages as module

    return module


@cache
def record_schemas() -> dict[str, Any]:
    """Every record schema (metadata, coordinator key and value) by name, from the pinned jars."""
    gm = gen_messages()
    schemas = gm.collect_record_schemas("kafka-metadata", "common/metadata/", ("metadata",))
    for artifact in gm.COORDINATOR_JARS.values():
        schemas += gm.collect_record_schemas(artifact, "common/message/", ("coordinator-key", "coordinator-value"))
    return {schema.name: schema for schema in schemas}


def record_class(schema: Any) -> Any:
    package = "protocol.metadata_records" if schema.kind == "metadata" else "protocol.coordinator_records"
    return getattr(importlib.import_module(f"{package}.{gen_messages().snake(schema.name)}"), schema.name)


def _scalar(type_name: str) -> st.SearchStrategy[Any]:
    if type_name in INT_RANGES:
        low, high = INT_RANGES[type_name]
        return st.integers(low, high)
    if type_name == "float64":
        return st.floats(allow_nan=False)
    if type_name == "bool":
        return st.booleans()
    if type_name == "string":
        return TEXT
    if type_name == "bytes":
        return st.binary(max_size=12)
    if type_name == "uuid":
        return st.uuids()
    raise ValueError(f"no strategy for {type_name}")


def _field(field: Any, version: int, root_cls: Any) -> st.SearchStrategy[Any]:
    gm = gen_messages()
    if field.struct is not None:
        element = _struct(field.struct, version, root_cls)
    else:
        element = _scalar(field.element)
    strategy = st.lists(element, max_size=3) if field.is_array else element
    if gm.in_versions(version, field.nullable):
        strategy = st.none() | strategy
    return strategy


def _struct(struct: Any, version: int, root_cls: Any) -> st.SearchStrategy[Any]:
    gm = gen_messages()
    cls = root_cls if struct.name == root_cls.NAME else getattr(root_cls, struct.name)
    present = {f.attr: _field(f, version, root_cls) for f in struct.fields if gm.in_versions(version, f.versions)}
    return st.fixed_dictionaries(present).map(lambda values: cls(**values))


def record_strategy(name: str, version: int) -> st.SearchStrategy[Any]:
    """Instances of record type ``name`` with every field of ``version`` drawn."""
    schema = record_schemas()[name]
    return _struct(schema.root, version, record_class(schema))
