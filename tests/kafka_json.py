"""What Kafka's generated JSON converters print for a message, computed from kbroker's decoded message and the
schema it was generated from: the oracle side of the tests that read Kafka's DumpLogSegments output.

Kafka's converter writes each field the version has under its camel-case name (first letter lower case), a tagged
field only when it differs from its default; a uuid as Uuid.toString (URL-safe base64, no padding), bytes as
standard base64, float64 as a double.
"""

from __future__ import annotations

import base64
import json
import math
import re
import uuid
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import cache
from typing import Any

from tests.record_strategies import gen_messages, record_schemas

# DumpLogSegments' lines: a batch, then each of its records ("| offset: 5 CreateTime: ... payload: {...}").
BATCH_LINE = re.compile(
    r"^baseOffset: (\d+) lastOffset: (\d+) count: (\d+) .* partitionLeaderEpoch: (-?\d+) "
    r"isTransactional: (true|false) isControl: (true|false) .* isvalid: (true|false)$"
)
RECORD_LINE = re.compile(
    r"^\| offset: (\d+) (?:CreateTime|LogAppendTime): (-?\d+) keySize: (-?\d+) valueSize: (-?\d+) "
    r"sequence: -?\d+ headerKeys: \[[^\]]*\]( .*)?$"
)


@dataclass
class DumpedRecord:
    offset: int
    timestamp: int
    key_size: int
    value_size: int
    rest: str  # what follows the record's metadata: a control record's description, or key and payload

    @property
    def payload(self) -> Any:
        """The payload as JSON where it is JSON, else as printed (<DELETE>, an error)."""
        return _json_or_text(self.rest.partition("payload: ")[2])

    @property
    def key(self) -> Any:
        text = self.rest.strip()
        if not text.startswith("key: "):
            return None
        return _json_or_text(text.removeprefix("key: ").partition(" payload: ")[0])


@dataclass
class DumpedBatch:
    base_offset: int
    last_offset: int
    count: int
    leader_epoch: int
    transactional: bool
    control: bool
    valid: bool
    records: list[DumpedRecord] = dataclass_field(default_factory=list)


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_dump(output: str) -> list[DumpedBatch]:
    """The batches and records of one file's DumpLogSegments output; any other line must be a known header."""
    batches: list[DumpedBatch] = []
    for line in output.split("\n"):  # only newlines: a JSON string may hold \x85 or \u2028, which splitlines splits at
        if batch := BATCH_LINE.match(line):
            base, last, count, epoch, transactional, control, valid = batch.groups()
            batches.append(
                DumpedBatch(
                    int(base),
                    int(last),
                    int(count),
                    int(epoch),
                    transactional == "true",
                    control == "true",
                    valid == "true",
                )
            )
        elif record := RECORD_LINE.match(line):
            offset, timestamp, key_size, value_size, rest = record.groups()
            batches[-1].records.append(
                DumpedRecord(int(offset), int(timestamp), int(key_size), int(value_size), rest or "")
            )
        elif line and not line.startswith(("Dumping ", "Log starting offset: ", "Snapshot end offset: ", "KRaft ")):
            raise AssertionError(f"unexpected DumpLogSegments line: {line}")
    return batches


def camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def kafka_uuid(value: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(value.bytes).rstrip(b"=").decode()


@cache
def message_schemas() -> dict[str, Any]:
    """kafka-clients' message schemas by name (the control records, ConsumerProtocol*)."""
    gm = gen_messages()
    return {schema.name: schema for schema in gm.collect_schemas(gm.schema_jar())}


def schema_of(name: str) -> Any:
    return record_schemas().get(name) or message_schemas()[name]


def _convert(value: Any, field: Any, version: int, flexible: bool) -> Any:
    if value is None:
        return None
    if field.is_array:
        return [_convert_one(item, field, version, flexible) for item in value]
    return _convert_one(value, field, version, flexible)


def _convert_one(value: Any, field: Any, version: int, flexible: bool) -> Any:
    if field.struct is not None:
        return _struct_json(value, field.struct, version, flexible)
    if isinstance(value, uuid.UUID):
        return kafka_uuid(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if field.element == "float64":
        # Jackson quotes what JSON has no number for: an infinite quota prints as "Infinity" or "-Infinity".
        return float(value) if math.isfinite(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _struct_json(obj: Any, struct: Any, version: int, flexible: bool) -> dict[str, Any]:
    gm = gen_messages()
    fresh = type(obj)()  # every field at its default
    out: dict[str, Any] = {}
    for field in struct.fields:
        if not gm.in_versions(version, field.versions):
            continue
        value = getattr(obj, field.attr)
        if flexible and gm.in_versions(version, field.tagged) and value == getattr(fresh, field.attr):
            continue
        out[camel(field.name)] = _convert(value, field, version, flexible)
    return out


def kafka_json(message: Any, version: int) -> dict[str, Any]:
    """The JSON object Kafka's converter writes for ``message`` at ``version``."""
    schema = schema_of(message.NAME)
    flexible = gen_messages().in_versions(version, schema.flexible)
    return _struct_json(message, schema.root, version, flexible)


# Kafka's transaction states by id (TransactionState: the admin client's names, Dead for 6).
TRANSACTION_STATE_NAMES = {
    0: "Empty",
    1: "Ongoing",
    2: "PrepareCommit",
    3: "PrepareAbort",
    4: "CompleteCommit",
    5: "CompleteAbort",
    6: "Dead",
    7: "PrepareEpochFence",
}


def transaction_log_value_json(value: Any, version: int) -> dict[str, Any]:
    """TransactionLogValue as DumpLogSegments' transaction log decoder prints it since Kafka 4.4: the status by its
    state's name, or its id as a string when no state has it."""
    out = kafka_json(value, version)
    status = value.transaction_status
    out["transactionStatus"] = TRANSACTION_STATE_NAMES.get(status, str(status))
    return out


def metadata_type_name(name: str) -> str:
    """MetadataRecordType's constant for a record (TOPIC_RECORD for TopicRecord)."""
    return str(gen_messages().snake(name)).upper()


def group_metadata_json(value: Any, version: int) -> dict[str, Any]:
    """GroupMetadataValue as DumpLogSegments' offsets decoder prints it: for a group of the consumer protocol,
    each member's subscription and assignment decoded (a version prefix, then the structure), where they decode."""
    from protocol.exceptions import DecodeError
    from protocol.messages.consumer_protocol_assignment import ConsumerProtocolAssignment
    from protocol.messages.consumer_protocol_subscription import ConsumerProtocolSubscription

    out = kafka_json(value, version)
    if value.protocol_type != "consumer":
        return out
    for member, printed in zip(value.members, out["members"], strict=True):
        for name, cls in (("subscription", ConsumerProtocolSubscription), ("assignment", ConsumerProtocolAssignment)):
            data = getattr(member, name)
            try:
                embedded_version = int.from_bytes(data[:2], "big", signed=True)
                decoded, _ = cls.decode(data, embedded_version, 2)
            except (DecodeError, IndexError):
                continue
            printed[name] = kafka_json(decoded, embedded_version)
    return out
