"""Generate protocol/messages/ from Kafka's JSON message schemas, and Kafka's record types beside it.

Source: Kafka's own schemas (common/message/*.json) inside the kafka-clients jar pinned below, fetched from
Maven Central by tools/maven_artifacts.py (set ``kafka-clients-4.4.0``) and checked against its sha256.

The record types are generated from the broker's jars of one Kafka release (``KAFKA_RECORDS_VERSION``, set
``kafka-<version>``), each checked against its sha256: protocol/metadata_records/ from kafka-metadata's
common/metadata/*.json (the KRaft controller's records in ``__cluster_metadata``), protocol/coordinator_records/
from the coordinator-key and coordinator-value schemas of kafka-group-coordinator, kafka-transaction-coordinator
and kafka-share-coordinator (the records of ``__consumer_offsets``, ``__transaction_state`` and
``__share_group_state``). Each package has a registry by record type in its ``__init__``.

Each schema becomes one module with straight-line decode and encode functions per version: runs of
fixed-width fields are read and written with one precompiled struct, and identical functions are shared
between versions. Run `python tools/gen_messages.py` to regenerate; `--check` fails on drift.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import keyword
import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "protocol" / "messages"
SCHEMA_JAR_SET = "kafka-clients-4.4.0"  # tools/maven/kafka-clients-4.4.0.pom.xml
SCHEMA_JAR = "kafka-clients-4.4.0.jar"
SCHEMA_JAR_SHA256 = "1ab07317eb6633241392449d329dbdc5d9251e6ffc4926860f42dd966e88bdf9"
SCHEMA_PREFIX = "common/message/"
MAX_VERSION = 32767

# The record schemas: one Kafka release, its broker set (tools/maven/kafka-<version>.pom.xml) and each jar's sha256.
KAFKA_RECORDS_VERSION = "4.4.0"
RECORDS_JAR_SET = f"kafka-{KAFKA_RECORDS_VERSION}"
RECORD_JARS_SHA256 = {
    "kafka-metadata": "6c52de74ecd670332e1e1324f5d40311275ac49b22699b6722e5fb07dd266fcb",
    "kafka-group-coordinator": "3fc830ace54f6a13f9f536bc0564bf39a68797365a4c4b194bd7db4fb893b2bc",
    "kafka-transaction-coordinator": "1d5324d59776d6b7f324cfdc87647b1e88f9823332201c0324e7ae9f210d915d",
    "kafka-share-coordinator": "6969a7961ca98d37a039bbe0af0fe761d6b0dd07ca9666802f47821167afbb6e",
}
METADATA_RECORDS_DIR = REPO / "protocol" / "metadata_records"
COORDINATOR_RECORDS_DIR = REPO / "protocol" / "coordinator_records"
# Which coordinator reads the records of each jar: record types are numbered per coordinator.
COORDINATOR_JARS = {
    "group": "kafka-group-coordinator",
    "transaction": "kafka-transaction-coordinator",
    "share": "kafka-share-coordinator",
}
RECORD_KINDS = ("metadata", "coordinator-key", "coordinator-value")
FIXED = {"int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H", "float64": "d", "bool": "?"}
FIXED_SIZE = {"b": 1, "h": 2, "i": 4, "q": 8, "H": 2, "d": 8, "?": 1}
PRIMITIVES = set(FIXED) | {"string", "bytes", "records", "uuid"}
PY_TYPES = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "int",
    "uint16": "int",
    "float64": "float",
    "bool": "bool",
    "string": "str",
    "bytes": "bytes",
    "records": "_c.Buffer",
    "uuid": "uuid.UUID",
}

Versions = tuple[int, int] | None


def parse_versions(text: str | None) -> Versions:
    if text is None or text == "none":
        return None
    if text.endswith("+"):
        return int(text[:-1]), MAX_VERSION
    if "-" in text:
        low, high = text.split("-")
        return int(low), int(high)
    return int(text), int(text)


def in_versions(version: int, versions: Versions) -> bool:
    return versions is not None and versions[0] <= version <= versions[1]


def snake(name: str) -> str:
    # The same rule kafka-python uses, so attribute names line up in differential tests.
    result = re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    return result + "_" if keyword.iskeyword(result) else result


def load_schema(source: str) -> dict:
    # Kafka's schema files are JSON with // comments.
    text = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))
    return json.loads(text)


@dataclass
class Field:
    name: str
    attr: str
    type: str
    versions: Versions
    nullable: Versions
    tagged: Versions
    tag: int | None
    flexible_override: Versions | str
    default: str | None
    struct: Struct | None = None

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def element(self) -> str:
        return self.type[2:] if self.is_array else self.type


@dataclass
class Struct:
    name: str
    fields: list[Field] = field(default_factory=list)


@dataclass
class Schema:
    name: str
    kind: str
    api_key: int | None
    valid: tuple[int, int]
    flexible: Versions
    root: Struct
    structs: dict[str, Struct]
    latest_version_unstable: bool = False


def default_text(value: object) -> str | None:
    """Schemas write most defaults as strings, a few as JSON numbers or booleans."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def build_schema(data: dict) -> Schema:
    structs: dict[str, Struct] = {}
    common = {item["name"]: item for item in data.get("commonStructs", [])}

    def make_struct(name: str, field_specs: list[dict]) -> Struct:
        if name in structs:
            return structs[name]
        struct = Struct(name)
        structs[name] = struct
        struct.fields = [make_field(spec) for spec in field_specs]
        return struct

    def make_field(spec: dict) -> Field:
        override = spec.get("flexibleVersions")
        f = Field(
            name=spec["name"],
            attr=snake(spec["name"]),
            type=spec["type"],
            # A field that names only taggedVersions exists in those versions (Kafka's FieldSpec rule).
            versions=parse_versions(spec.get("versions", spec.get("taggedVersions"))),
            nullable=parse_versions(spec.get("nullableVersions")),
            tagged=parse_versions(spec.get("taggedVersions")),
            tag=spec.get("tag"),
            flexible_override=parse_versions(override) if override is not None else "inherit",
            default=default_text(spec.get("default")),
        )
        element = f.element
        if element not in PRIMITIVES:
            if "fields" in spec:
                f.struct = make_struct(element, spec["fields"])
            elif element in common:
                f.struct = make_struct(element, common[element]["fields"])
            elif element in structs:
                f.struct = structs[element]
            else:
                raise ValueError(f"{data['name']}: unknown type {f.type}")
        return f

    root = Struct(data["name"])
    structs[data["name"]] = root
    root.fields = [make_field(spec) for spec in data["fields"]]
    valid = parse_versions(data["validVersions"])
    assert valid is not None
    return Schema(
        name=data["name"],
        kind=data["type"],
        api_key=data.get("apiKey"),
        valid=valid,
        flexible=parse_versions(data.get("flexibleVersions")),
        root=root,
        structs=structs,
        latest_version_unstable=bool(data.get("latestVersionUnstable", False)),
    )


def default_expr(f: Field) -> str:
    """Python source for a field's default value (a fresh object each time for lists and structs)."""
    d = f.default
    if f.is_array:
        return "None" if d == "null" else "[]"
    if f.struct is not None:
        return "None" if d == "null" else f"{f.struct.name}()"
    t = f.type
    if t in ("int8", "int16", "int32", "int64", "uint16"):
        return str(int(d, 0)) if d not in (None, "") else "0"
    if t == "float64":
        return repr(float(d)) if d not in (None, "") else "0.0"
    if t == "bool":
        return "True" if (d or "").lower() == "true" else "False"
    if t == "string":
        if d == "null":
            return "None"
        return repr(d or "")
    if t in ("bytes", "records"):
        return "None" if d == "null" or t == "records" else "b''"
    if t == "uuid":
        return "_c.ZERO_UUID"
    raise ValueError(t)


def type_hint(f: Field, kind: str) -> str:
    """The field's Python type: None only where the wire allows null or the default is null.

    A non-nullable array or struct is never None: decoding rejects a null one, and a field absent from a
    version gets a fresh empty list or struct. A response's records may also be a region the transport
    splices in; a request's are the bytes it arrived with.
    """
    if f.struct is not None:
        inner = f.struct.name
    elif f.element == "records" and kind == "response":
        inner = "_c.Records"
    else:
        inner = PY_TYPES[f.element]
    hint = f"list[{inner}]" if f.is_array else inner
    if f.nullable is not None or default_expr(f) == "None":
        return f"{hint} | None"
    return hint


class Emitter:
    """Writes one module's source; collects precompiled struct formats as it goes."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.formats: dict[str, str] = {}
        self.functions: dict[str, str] = {}  # body text -> function name, to share identical versions

    def fmt_name(self, fmt: str) -> str:
        name = "_S_" + fmt.replace("?", "o")
        self.formats[fmt] = name
        return name

    def compact(self, f: Field, flexible: bool, version: int) -> bool:
        if f.flexible_override == "inherit":
            return flexible
        return in_versions(version, f.flexible_override)  # type: ignore[arg-type]

    # ---- decoding ---------------------------------------------------------------------------------------

    def decode_value(
        self, f: Field, target: str, version: int, flexible: bool, ind: str, *, tagged: bool = False
    ) -> list[str]:
        """Lines that read field ``f`` from buf at pos into ``target`` (not for fixed-width scalars); ``tagged``:
        the value of a tagged field, where a nullable struct's marker is a varint (0 null, 1 present), as Kafka's
        generated code reads it, instead of an int8."""
        compact = self.compact(f, flexible, version)
        nullable = in_versions(version, f.nullable)
        t = f.element
        if f.is_array:
            reader = "read_compact_array_length" if compact else "read_array_length"
            lines = [f"{ind}n, pos = _c.{reader}(buf, pos)"]
            null_line = (
                f"{ind}    {target} = None"
                if nullable
                else f"{ind}    raise DecodeError('null array in non-nullable field {f.name}')"
            )
            lines += [f"{ind}if n < 0:", null_line, f"{ind}else:"]
            if t in FIXED:
                s = self.fmt_name(FIXED[t])
                lines.append(f"{ind}    {target}, pos = _c.read_primitive_array(buf, pos, n, {s})")
                return lines
            lines += [f"{ind}    items = []", f"{ind}    for _ in range(n):"]
            lines += self.decode_value(
                Field(f.name, f.attr, t, f.versions, None, None, None, f.flexible_override, None, f.struct),
                "item",
                version,
                flexible,
                ind + "        ",
            )
            lines += [f"{ind}        items.append(item)", f"{ind}    {target} = items"]
            return lines
        if f.struct is not None:
            fn = self.struct_decoder(f.struct, version, flexible)
            if nullable and tagged:
                return [
                    f"{ind}marker, pos = _c.read_uvarint(buf, pos)",
                    f"{ind}if marker == 0:",
                    f"{ind}    {target} = None",
                    f"{ind}else:",
                    f"{ind}    {target}, pos = {fn}(buf, pos)",
                ]
            if nullable:
                return [
                    f"{ind}if buf[pos] == 0xFF:",
                    f"{ind}    {target} = None",
                    f"{ind}    pos += 1",
                    f"{ind}else:",
                    f"{ind}    {target}, pos = {fn}(buf, pos + 1)",
                ]
            return [f"{ind}{target}, pos = {fn}(buf, pos)"]
        if t in FIXED:
            s = self.fmt_name(FIXED[t])
            return [f"{ind}({target},) = {s}.unpack_from(buf, pos)", f"{ind}pos += {FIXED_SIZE[FIXED[t]]}"]
        if t == "uuid":
            return [f"{ind}{target}, pos = _c.read_uuid(buf, pos)"]
        if t == "records":  # a view into the frame, not a copy: batches go to disk from where they arrived
            return [f"{ind}{target}, pos = _c.read_{'compact_' if compact else ''}records(buf, pos)"]
        base = "string" if t == "string" else "bytes"
        reader = ("compact_" if compact else "") + ("nullable_" if nullable else "") + base
        return [f"{ind}{target}, pos = _c.read_{reader}(buf, pos)"]

    def struct_decoder(self, struct: Struct, version: int, flexible: bool) -> str:
        cls = struct.name
        body: list[str] = [f"    o = _new({cls})"]
        present = [f for f in struct.fields if in_versions(version, f.versions)]
        regular = [f for f in present if not (flexible and in_versions(version, f.tagged))]
        tagged = [f for f in present if flexible and in_versions(version, f.tagged)]
        for f in struct.fields:
            if f not in regular:
                body.append(f"    o.{f.attr} = {default_expr(f)}")
        run: list[Field] = []

        def flush() -> None:
            if not run:
                return
            fmt = "".join(FIXED[f.type] for f in run)
            s = self.fmt_name(fmt)
            targets = ", ".join(f"o.{f.attr}" for f in run)
            body.append(f"    ({targets},) = {s}.unpack_from(buf, pos)")
            body.append(f"    pos += {sum(FIXED_SIZE[c] for c in fmt)}")
            run.clear()

        for f in regular:
            if f.type in FIXED:
                run.append(f)
                continue
            flush()
            body += self.decode_value(f, f"o.{f.attr}", version, flexible, "    ")
        flush()
        if flexible and not tagged:
            body.append("    o.unknown_tagged_fields, pos = _c.read_unknown_tagged_fields(buf, pos)")
        elif flexible:
            body += [
                "    n, pos = _c.read_uvarint(buf, pos)",
                "    unknown = None",
                "    for _ in range(n):",
                "        tag, pos = _c.read_uvarint(buf, pos)",
                "        size, pos = _c.read_uvarint(buf, pos)",
                "        end = pos + size",
                "        if end > len(buf):",
                "            raise DecodeError('tagged field runs past the end of the buffer')",
            ]
            keyword_ = "if"
            for f in sorted(tagged, key=lambda item: item.tag or 0):
                body.append(f"        {keyword_} tag == {f.tag}:")
                body += self.decode_value(f, f"o.{f.attr}", version, flexible, "            ", tagged=True)
                body.append(f"            _c.check_tag_end(pos, end, {f.tag})")
                keyword_ = "elif"
            body += [
                "        else:",
                "            if unknown is None:",
                "                unknown = {}",
                "            unknown[tag] = bytes(buf[pos:end])",
                "        pos = end",
                "    o.unknown_tagged_fields = unknown",
            ]
        else:
            body.append("    o.unknown_tagged_fields = None")
        body.append("    return o, pos")
        return self.share(f"_decode_{cls}", version, body, "(buf, pos)")

    # ---- encoding ---------------------------------------------------------------------------------------

    def encode_value(
        self, f: Field, value: str, version: int, flexible: bool, ind: str, out: str, *, tagged: bool = False
    ) -> list[str]:
        compact = self.compact(f, flexible, version)
        nullable = in_versions(version, f.nullable)
        t = f.element
        if f.is_array:
            lines: list[str] = []
            length_writer = f"_c.write_uvarint({out}, len(v) + 1)" if compact else f"{out} += _c.INT32.pack(len(v))"
            null_writer = f"{out}.append(0)" if compact else f"{out} += b'\\xff\\xff\\xff\\xff'"
            lines.append(f"{ind}v = {value}")
            if nullable:
                lines += [f"{ind}if v is None:", f"{ind}    {null_writer}", f"{ind}else:"]
                inner = ind + "    "
            else:
                inner = ind
            lines.append(f"{inner}{length_writer}")
            if t in FIXED:
                s = self.fmt_name(FIXED[t])
                lines.append(f"{inner}_c.write_primitive_array({out}, v, {s})")
                return lines
            lines.append(f"{inner}for item in v:")
            lines += self.encode_value(
                Field(f.name, f.attr, t, f.versions, None, None, None, f.flexible_override, None, f.struct),
                "item",
                version,
                flexible,
                inner + "    ",
                out,
            )
            return lines
        if f.struct is not None:
            fn = self.struct_encoder(f.struct, version, flexible)
            if nullable:
                return [
                    f"{ind}if {value} is None:",
                    f"{ind}    {out}.append({'0' if tagged else '0xFF'})",  # a tagged field's marker is a varint
                    f"{ind}else:",
                    f"{ind}    {out}.append(1)",
                    f"{ind}    {fn}({value}, {out})",
                ]
            return [f"{ind}{fn}({value}, {out})"]
        if t in FIXED:
            s = self.fmt_name(FIXED[t])
            return [f"{ind}{out} += {s}.pack({value})"]
        if t == "uuid":
            return [f"{ind}{out} += {value}.bytes"]
        if t == "records":  # may be a region the transport splices in (see _codec.SplicedOutput)
            return [f"{ind}_c.write_{'compact_' if compact else ''}records({out}, {value})"]
        base = "string" if t == "string" else "bytes"
        writer = ("compact_" if compact else "") + ("nullable_" if nullable else "") + base
        return [f"{ind}_c.write_{writer}({out}, {value})"]

    def struct_encoder(self, struct: Struct, version: int, flexible: bool) -> str:
        cls = struct.name
        body: list[str] = []
        present = [f for f in struct.fields if in_versions(version, f.versions)]
        regular = [f for f in present if not (flexible and in_versions(version, f.tagged))]
        tagged = [f for f in present if flexible and in_versions(version, f.tagged)]
        run: list[Field] = []

        def flush() -> None:
            if not run:
                return
            fmt = "".join(FIXED[f.type] for f in run)
            s = self.fmt_name(fmt)
            args = ", ".join(f"o.{f.attr}" for f in run)
            body.append(f"    out += {s}.pack({args})")
            run.clear()

        for f in regular:
            if f.type in FIXED:
                run.append(f)
                continue
            flush()
            body += self.encode_value(f, f"o.{f.attr}", version, flexible, "    ", "out")
        flush()
        if flexible:
            if tagged:
                body.append("    tags = []")
                for f in sorted(tagged, key=lambda item: item.tag or 0):
                    # A tagged field is written only when it differs from its default, as Kafka does.
                    body.append(f"    if o.{f.attr} != {default_expr(f)}:")
                    body.append("        t = bytearray()")
                    body += self.encode_value(f, f"o.{f.attr}", version, flexible, "        ", "t", tagged=True)
                    body.append(f"        tags.append(({f.tag}, t))")
                body += [
                    "    if o.unknown_tagged_fields:",
                    "        tags.extend(o.unknown_tagged_fields.items())",
                    "    _c.write_tagged_fields(out, tags)",
                ]
            else:
                body += [
                    "    if o.unknown_tagged_fields:",
                    "        _c.write_tagged_fields(out, list(o.unknown_tagged_fields.items()))",
                    "    else:",
                    "        out.append(0)",
                ]
        if not body:
            body.append("    pass")
        return self.share(f"_encode_{cls}", version, body, "(o, out)")

    def share(self, prefix: str, version: int, body: list[str], params: str) -> str:
        text = "\n".join(body)
        key = prefix + "\n" + text
        if key in self.functions:
            return self.functions[key]
        name = f"{prefix}_v{version}"
        self.functions[key] = name
        self.pending.append(f"def {name}{params}:\n{text}\n")
        return name

    # ---- the module -------------------------------------------------------------------------------------

    def module(self) -> str:
        schema = self.schema
        self.pending: list[str] = []
        decoders: list[str] = []
        encoders: list[str] = []
        for version in range(schema.valid[1] + 1):
            if version < schema.valid[0]:
                decoders.append("_c.unsupported_version")
                encoders.append("_c.unsupported_version")
                continue
            flexible = in_versions(version, schema.flexible)
            decoders.append(self.struct_decoder(schema.root, version, flexible))
            encoders.append(self.struct_encoder(schema.root, version, flexible))

        parts = [
            f'"""{schema.name}: generated by tools/gen_messages.py from Kafka\'s message schema. Do not edit."""',
            "",
            "# ruff: noqa",
            "from __future__ import annotations",
            "",
            "import struct as _struct",
            "import uuid",
        ]
        if len(schema.structs) > 1:  # the root names its nested structs as type aliases
            parts.append("from typing import TypeAlias")
        parts += [
            "",
            "from protocol import _codec as _c",
            "from protocol.exceptions import DecodeError",
            "",
            "_new = _c.new_object",
        ]
        for fmt, name in sorted(self.formats.items(), key=lambda item: item[1]):
            parts.append(f"{name} = _struct.Struct('>{fmt}')")
        parts.append("")
        # Structs are defined leaves first so each class can name the ones it contains.
        order: list[Struct] = []

        def visit(struct: Struct) -> None:
            if struct in order:
                return
            for f in struct.fields:
                if f.struct is not None:
                    visit(f.struct)
            order.append(struct)

        visit(schema.root)
        for struct in order:
            parts.append(self.class_source(struct, struct is schema.root))
        parts.extend(self.pending)
        root = schema.root.name
        parts.append(f"{root}.DECODERS = ({', '.join(decoders)},)")
        parts.append(f"{root}.ENCODERS = ({', '.join(encoders)},)")
        return "\n".join(parts) + "\n"

    def class_source(self, struct: Struct, is_root: bool) -> str:
        schema = self.schema
        base = "_c.Message" if is_root else "_c.Struct"
        attrs = [f.attr for f in struct.fields]
        lines = [f"class {struct.name}({base}):"]
        lines.append(f"    __slots__ = {tuple(attrs + ['unknown_tagged_fields'])!r}")
        lines.append(f"    FIELDS = {tuple(attrs)!r}")
        if is_root:
            lines.append(f"    NAME = {schema.name!r}")
            lines.append(f"    API_KEY = {schema.api_key if schema.api_key is not None else -1}")
            lines.append(f"    VALID_VERSIONS = {schema.valid!r}")
            flexible = None
            if schema.flexible is not None:
                flexible = (schema.flexible[0], min(schema.flexible[1], MAX_VERSION))
            lines.append(f"    FLEXIBLE_VERSIONS = {flexible!r}")
            if schema.kind in RECORD_KINDS and schema.latest_version_unstable:
                # The newest version is still being designed: read, never written (Kafka's rule for the flag).
                lines.append("    LATEST_VERSION_UNSTABLE = True")
            # Nested structs are reachable as class attributes (FetchResponse.PartitionData). Assigned in the
            # body (the module-level classes are defined first) and marked as aliases, because mypy reads a
            # plain `X = X` in a class body as a variable, which annotations cannot use as a type.
            for nested in schema.structs.values():
                if nested is not struct:
                    lines.append(f"    {nested.name}: TypeAlias = {nested.name}")
        lines.append("")
        params = ["self", "*"]
        assigns = []
        for f in struct.fields:
            expr = default_expr(f)
            if expr in ("[]",) or expr.endswith("()"):
                # A sentinel, not None: None is a real value for nullable arrays and structs.
                params.append(f"{f.attr}: {type_hint(f, schema.kind)} = _c.UNSET")
                assigns.append(f"        self.{f.attr} = {expr} if {f.attr} is _c.UNSET else {f.attr}")
            else:
                params.append(f"{f.attr}: {type_hint(f, schema.kind)} = {expr}")
                assigns.append(f"        self.{f.attr} = {f.attr}")
        params.append("unknown_tagged_fields: dict[int, bytes] | None = None")
        lines.append(f"    def __init__({', '.join(params)}) -> None:")
        lines += assigns
        lines.append("        self.unknown_tagged_fields = unknown_tagged_fields")
        lines.append("")
        return "\n".join(lines)


def schema_jar() -> Path:
    """The pinned kafka-clients jar (fetched from Maven Central if need be), checked against its sha256."""
    import maven_artifacts  # beside this script: on the path when it runs, and for the tests that import it

    try:
        jar = maven_artifacts.prepare(SCHEMA_JAR_SET) / SCHEMA_JAR
    except maven_artifacts.MavenUnavailable as exc:
        raise SystemExit(f"gen_messages: the message schemas are unavailable: {exc}") from None
    digest = hashlib.sha256(jar.read_bytes()).hexdigest()
    if digest != SCHEMA_JAR_SHA256:
        raise SystemExit(f"gen_messages: {jar} has sha256 {digest}, expected {SCHEMA_JAR_SHA256}")
    return jar


def collect_schemas(jar: Path) -> list[Schema]:
    schemas: dict[str, Schema] = {}
    with zipfile.ZipFile(jar) as archive:
        for name in sorted(archive.namelist()):
            if name.startswith(SCHEMA_PREFIX) and name.endswith(".json"):
                data = load_schema(archive.read(name).decode())
                # APIs Kafka removed keep a schema with validVersions "none" and no fields.
                if data.get("type") in ("request", "response", "header", "data") and "fields" in data:
                    schemas[data["name"]] = build_schema(data)
    return sorted(schemas.values(), key=lambda s: s.name)


# The registries' value types are NamedTuples, not dataclasses: every start-up makes them, and a frozen dataclass
# costs about 0.5 ms to create (a NamedTuple a sixth of that).
def registry_source(schemas: list[Schema]) -> str:
    apis: dict[int, dict[str, Schema]] = {}
    for schema in schemas:
        if schema.kind in ("request", "response") and schema.api_key is not None:
            apis.setdefault(schema.api_key, {})[schema.kind] = schema
    lines = [
        '"""Every generated message, by API key. Generated by tools/gen_messages.py. Do not edit.',
        "",
        "Modules are imported on first use, so start-up pays only for the APIs a client actually calls.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import importlib",
        "from functools import cache",
        "from typing import Any, NamedTuple",
        "",
        "",
        "@cache  # looked up for every request: the import machinery only once per class",
        "def _message_class(module: str, name: str) -> Any:",
        "    return getattr(importlib.import_module(module), name)",
        "",
        "",
        "class ApiSchema(NamedTuple):",
        "    api_key: int",
        "    name: str",
        "    request_module: str",
        "    request_class: str",
        "    response_module: str",
        "    response_class: str",
        "    valid_versions: tuple[int, int]",
        "    flexible_versions: tuple[int, int] | None",
        "",
        "    def request_type(self) -> Any:",
        "        return _message_class(self.request_module, self.request_class)",
        "",
        "    def response_type(self) -> Any:",
        "        return _message_class(self.response_module, self.response_class)",
        "",
        "    def is_flexible(self, version: int) -> bool:",
        "        flexible = self.flexible_versions",
        "        return flexible is not None and flexible[0] <= version <= flexible[1]",
        "",
        "",
        "APIS: dict[int, ApiSchema] = {",
    ]
    for key in sorted(apis):
        req, resp = apis[key]["request"], apis[key]["response"]
        name = req.name[: -len("Request")]
        flexible = req.flexible if req.flexible is None else (req.flexible[0], MAX_VERSION)
        lines.append(
            f"    {key}: ApiSchema({key}, {name!r}, 'protocol.messages.{snake(req.name)}', {req.name!r}, "
            f"'protocol.messages.{snake(resp.name)}', {resp.name!r}, {req.valid!r}, {flexible!r}),"
        )
    lines += ["}", "", "API_BY_NAME: dict[str, ApiSchema] = {api.name: api for api in APIS.values()}", ""]
    return "\n".join(lines)


def generate(out_dir: Path) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    schemas = collect_schemas(schema_jar())
    written = []
    for schema in schemas:
        name = f"{snake(schema.name)}.py"
        (out_dir / name).write_text(Emitter(schema).module())
        written.append(name)
    (out_dir / "__init__.py").write_text(registry_source(schemas))
    written.append("__init__.py")
    return written


# ---- record schemas ----------------------------------------------------------------------------------


def record_jar(artifact: str) -> Path:
    """One jar of the pinned Kafka release (fetched from Maven Central if need be), checked against its sha256."""
    import maven_artifacts

    try:
        jar = maven_artifacts.prepare(RECORDS_JAR_SET) / f"{artifact}-{KAFKA_RECORDS_VERSION}.jar"
    except maven_artifacts.MavenUnavailable as exc:
        raise SystemExit(f"gen_messages: the record schemas are unavailable: {exc}") from None
    if not jar.exists():
        raise SystemExit(f"gen_messages: {RECORDS_JAR_SET} has no {jar.name}")
    digest = hashlib.sha256(jar.read_bytes()).hexdigest()
    expected = RECORD_JARS_SHA256[artifact]
    if digest != expected:
        raise SystemExit(f"gen_messages: {jar} has sha256 {digest}, expected {expected}")
    return jar


def check_record_schema(schema: Schema) -> None:
    """Kafka's generator rules for record schemas (MessageSpec), so a schema it would refuse is refused here."""
    if schema.api_key is None:
        raise SystemExit(f"gen_messages: {schema.name} ({schema.kind}) has no apiKey")
    if schema.flexible is not None and schema.flexible[1] != MAX_VERSION:
        raise SystemExit(f"gen_messages: {schema.name} has flexibleVersions that are not open-ended")
    if schema.kind == "coordinator-key" and (schema.valid != (0, 0) or schema.flexible is not None):
        raise SystemExit(f"gen_messages: coordinator key {schema.name} must have version 0 only, none flexible")


def collect_record_schemas(artifact: str, prefix: str, kinds: tuple[str, ...]) -> list[Schema]:
    schemas = []
    with zipfile.ZipFile(record_jar(artifact)) as archive:
        for name in sorted(archive.namelist()):
            if name.startswith(prefix) and name.endswith(".json"):
                data = load_schema(archive.read(name).decode())
                if data.get("type") in kinds:
                    schema = build_schema(data)
                    check_record_schema(schema)
                    schemas.append(schema)
    return sorted(schemas, key=lambda s: s.name)


def write_modules(out_dir: Path, schemas: list[Schema]) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for schema in schemas:
        name = f"{snake(schema.name)}.py"
        (out_dir / name).write_text(Emitter(schema).module())
        written.append(name)
    return written


def stable_versions(schema: Schema) -> tuple[int, int]:
    """The versions a writer may use: all valid ones but an unstable latest."""
    low, high = schema.valid
    return (low, high - 1) if schema.latest_version_unstable and high > low else (low, high)


RECORD_REGISTRY_HELPERS = [
    "",
    "from __future__ import annotations",
    "",
    "import importlib",
    "from functools import cache",
    "from typing import TYPE_CHECKING, NamedTuple",
    "",
    "from protocol._codec import Message",
    "",
    "",
    "@cache  # the import machinery once per class",
    "def _record_class(module: str, name: str) -> type[Message]:",
    "    cls: type[Message] = getattr(importlib.import_module(module), name)",
    "    return cls",
    "",
    "",
]


def lazy_attributes_source(package: str, classes: list[str]) -> list[str]:
    """``package.SomeRecord`` imports SomeRecord's module when first read (PEP 562), so a module that names record
    classes by attribute costs nothing at start-up; mypy sees the classes through the TYPE_CHECKING imports."""
    lines = ["", "if TYPE_CHECKING:"]
    lines += [f"    from protocol.{package}.{snake(name)} import {name} as {name}" for name in sorted(classes)]
    lines += [
        "",
        "_MODULE_OF_CLASS: dict[str, str] = {",
        *(f"    {name!r}: 'protocol.{package}.{snake(name)}'," for name in sorted(classes)),
        "}",
        "",
        "",
        "def __getattr__(name: str) -> type[Message]:",
        "    module = _MODULE_OF_CLASS.get(name)",
        "    if module is None:",
        "        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')",
        "    cls = _record_class(module, name)",
        "    globals()[name] = cls  # later reads find it without calling this",
        "    return cls",
        "",
    ]
    return lines


def metadata_registry_source(schemas: list[Schema]) -> str:
    lines = [
        '"""Kafka\'s metadata records, by record type (api key). Generated by tools/gen_messages.py. Do not edit.',
        "",
        f"From the common/metadata schemas of kafka-metadata-{KAFKA_RECORDS_VERSION}; in ``__cluster_metadata`` a",
        "record's value is one of them framed as protocol/metadata_frame.py says. Modules are imported on first use.",
        '"""',
        *RECORD_REGISTRY_HELPERS,
        f"KAFKA_VERSION = {KAFKA_RECORDS_VERSION!r}",
        "",
        "",
        "class MetadataRecordType(NamedTuple):",
        "    api_key: int",
        "    name: str",
        "    module: str",
        "    class_name: str",
        "    valid_versions: tuple[int, int]",
        "    stable_versions: tuple[int, int]  # what may be written: an unstable latest version is only read",
        "",
        "    def record_class(self) -> type[Message]:",
        "        return _record_class(self.module, self.class_name)",
        "",
        "",
        "RECORD_TYPES: dict[int, MetadataRecordType] = {",
    ]
    seen: dict[int, str] = {}
    for schema in sorted(schemas, key=lambda s: s.api_key or 0):
        key = schema.api_key
        assert key is not None
        if key in seen:
            raise SystemExit(f"gen_messages: metadata records {seen[key]} and {schema.name} share type {key}")
        seen[key] = schema.name
        lines.append(
            f"    {key}: MetadataRecordType({key}, {schema.name!r}, "
            f"'protocol.metadata_records.{snake(schema.name)}', {schema.name!r}, {schema.valid!r}, "
            f"{stable_versions(schema)!r}),"
        )
    lines += [
        "}",
        "",
        "RECORD_TYPE_BY_NAME: dict[str, MetadataRecordType] = {r.name: r for r in RECORD_TYPES.values()}",
        *lazy_attributes_source("metadata_records", [schema.name for schema in schemas]),
    ]
    return "\n".join(lines)


def coordinator_registry_source(by_coordinator: dict[str, list[Schema]]) -> str:
    lines = [
        '"""Kafka\'s coordinator records, by coordinator and record type. Generated by tools/gen_messages.py.',
        "",
        f"From the coordinator-key and coordinator-value schemas of Kafka {KAFKA_RECORDS_VERSION}'s jars of the group,",
        "transaction and share coordinators. A record's key is its record type (int16) and key struct, its value the",
        "value's version (int16) and value struct (protocol/coordinator_frame.py). Modules are imported on first use.",
        "Do not edit.",
        '"""',
        *RECORD_REGISTRY_HELPERS,
        f"KAFKA_VERSION = {KAFKA_RECORDS_VERSION!r}",
        "",
        "",
        "class CoordinatorRecordType(NamedTuple):",
        "    coordinator: str  # group, transaction or share",
        "    record_type: int  # the key's int16 prefix (the key schema's apiKey)",
        "    name: str  # the key's name without Key: OffsetCommit, GroupMetadata, TransactionLog ...",
        "    key_module: str",
        "    key_class_name: str",
        "    value_module: str",
        "    value_class_name: str",
        "    value_versions: tuple[int, int]",
        "    value_stable_versions: tuple[int, int]  # what may be written: an unstable latest version is only read",
        "",
        "    def key_class(self) -> type[Message]:",
        "        return _record_class(self.key_module, self.key_class_name)",
        "",
        "    def value_class(self) -> type[Message]:",
        "        return _record_class(self.value_module, self.value_class_name)",
        "",
    ]
    for coordinator, schemas in by_coordinator.items():
        keys = {s.api_key: s for s in schemas if s.kind == "coordinator-key"}
        values = {s.api_key: s for s in schemas if s.kind == "coordinator-value"}
        if len(keys) + len(values) != len(schemas) or set(keys) != set(values):
            raise SystemExit(f"gen_messages: the {coordinator} coordinator's record types do not pair keys and values")
        lines += ["", f"{coordinator.upper()}_RECORD_TYPES: dict[int, CoordinatorRecordType] = {{"]
        for record_type in sorted(k for k in keys if k is not None):
            key, value = keys[record_type], values[record_type]
            stem = key.name.removesuffix("Key")
            if value.name != stem + "Value":
                raise SystemExit(f"gen_messages: record type {record_type} pairs {key.name} with {value.name}")
            lines.append(
                f"    {record_type}: CoordinatorRecordType({coordinator!r}, {record_type}, {stem!r}, "
                f"'protocol.coordinator_records.{snake(key.name)}', {key.name!r}, "
                f"'protocol.coordinator_records.{snake(value.name)}', {value.name!r}, {value.valid!r}, "
                f"{stable_versions(value)!r}),"
            )
        lines.append("}")
    lines += ["", "RECORD_TYPES_BY_COORDINATOR: dict[str, dict[int, CoordinatorRecordType]] = {"]
    lines += [f"    {c!r}: {c.upper()}_RECORD_TYPES," for c in by_coordinator]
    lines += ["}", ""]
    everything = [schema.name for schemas in by_coordinator.values() for schema in schemas]
    lines += lazy_attributes_source("coordinator_records", everything)
    return "\n".join(lines)


def generate_metadata_records(out_dir: Path) -> list[str]:
    schemas = collect_record_schemas("kafka-metadata", "common/metadata/", ("metadata",))
    written = write_modules(out_dir, schemas)
    (out_dir / "__init__.py").write_text(metadata_registry_source(schemas))
    return written + ["__init__.py"]


def generate_coordinator_records(out_dir: Path) -> list[str]:
    by_coordinator = {
        coordinator: collect_record_schemas(artifact, "common/message/", ("coordinator-key", "coordinator-value"))
        for coordinator, artifact in COORDINATOR_JARS.items()
    }
    everything = [schema for schemas in by_coordinator.values() for schema in schemas]
    names = [schema.name for schema in everything]
    if len(set(names)) != len(names):  # one package for all three coordinators: module names must not clash
        raise SystemExit("gen_messages: two coordinator jars define a record of the same name")
    written = write_modules(out_dir, sorted(everything, key=lambda s: s.name))
    (out_dir / "__init__.py").write_text(coordinator_registry_source(by_coordinator))
    return written + ["__init__.py"]


# What the script writes: each package with its generator.
TARGETS = (
    (OUT_DIR, generate),
    (METADATA_RECORDS_DIR, generate_metadata_records),
    (COORDINATOR_RECORDS_DIR, generate_coordinator_records),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the committed code differs")
    args = parser.parse_args()
    if not args.check:
        for out_dir, make in TARGETS:
            with tempfile.TemporaryDirectory() as tmp:
                written = make(Path(tmp))  # nothing is removed unless generation succeeds
                out_dir.mkdir(parents=True, exist_ok=True)
                for stale in out_dir.glob("*.py"):
                    stale.unlink()
                for name in written:
                    shutil.copyfile(Path(tmp) / name, out_dir / name)
            print(f"wrote {len(written)} modules to {out_dir}")
        return 0
    failed = False
    for out_dir, make in TARGETS:
        with tempfile.TemporaryDirectory() as tmp:
            written = make(Path(tmp))
            committed = sorted(p.name for p in out_dir.glob("*.py"))
            drift = sorted(set(committed) ^ set(written))
            drift += [n for n in written if n in committed and not filecmp.cmp(Path(tmp) / n, out_dir / n, False)]
        where = out_dir.relative_to(REPO)
        if drift:
            print(f"{where} drifted from the schemas: " + ", ".join(drift), file=sys.stderr)
            failed = True
        else:
            print(f"{where} matches the schemas")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
