"""protocol/_records_native.c against the pure-Python loops of protocol/records.py, on the same inputs.

The C functions answer what the Python loop would answer, or None (and the Python loop decides): hypothesis
builds valid records with every field width, then mutates, cuts and pads them. Valid records must be answered
in C (otherwise the fast path silently falls back), and the public functions must give the same answers and
the same DecodeError messages with the C loops and without them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import records
from protocol.exceptions import DecodeError
from protocol.records import (
    KeysMapped,
    RawRecord,
    Record,
    RecordsWalk,
    builder_timestamp_deltas,
    encode_record,
    iter_raw_records,
    keyless_record_indexes,
    map_record_keys,
    retained_records,
    walk_records,
)
from tests.records_loops import NATIVE

REPO = Path(__file__).resolve().parents[1]

needs_native = pytest.mark.skipif(NATIVE is None, reason="protocol._records_native is not built (pip install -e .)")

INT64 = st.integers(-(2**63), 2**63 - 1)
deltas = st.one_of(st.integers(-3, 300), st.integers(-(2**40), 2**40), INT64)
optional_bytes = st.none() | st.binary(max_size=40)
# Keys that repeat, among them one longer than the offset maps' short keys.
KEYS = [b"", b"a", b"b", b"k" * 20]
keys = st.none() | st.sampled_from(KEYS) | st.binary(max_size=40)


@st.composite
def record_lists(draw: st.DrawFn) -> list[Record]:
    """Records as clients write them (offset deltas in order) or not, with any field widths."""
    count = draw(st.integers(1, 40))
    in_order = draw(st.booleans())
    return [
        Record(
            offset_delta=index if in_order else draw(deltas),
            timestamp_delta=draw(deltas),
            key=draw(keys),
            value=draw(optional_bytes | st.binary(min_size=200, max_size=300)),
            headers=draw(st.lists(st.tuples(st.text(max_size=4), optional_bytes), max_size=2)),
            attributes=draw(st.integers(0, 255)),
        )
        for index in range(count)
    ]


@st.composite
def damaged(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` with a few bytes overwritten, cut short, or with bytes after it."""
    data = bytearray(body)
    for _ in range(draw(st.integers(0, 3))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
    cut = draw(st.integers(0, min(len(data), 12)))
    if cut:
        del data[-cut:]
    return bytes(data) + draw(st.binary(max_size=3))


def _outcome(function: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "answer", function()
    except DecodeError as exc:
        return "error", str(exc)


def _raw_outcome(body: bytes | bytearray | memoryview, count: int) -> tuple[list[RawRecord], str | None]:
    """What a caller of iter_raw_records sees: the records it yields, then the error that stops it, if any."""
    seen: list[RawRecord] = []
    try:
        for record in iter_raw_records(body, count):
            seen.append(record)
    except DecodeError as exc:
        return seen, str(exc)
    return seen, None


@contextmanager
def pure_python() -> Iterator[None]:
    saved = records._native
    records._native = None
    try:
        yield
    finally:
        records._native = saved


def _every_public_answer(body: bytes | bytearray | memoryview, count: int) -> list[object]:
    return [
        _outcome(lambda: walk_records(body, count)),
        _outcome(lambda: walk_records(body, count, check_offsets=False)),
        _outcome(lambda: keyless_record_indexes(body, count)),
        _raw_outcome(body, count),
    ]


def _check_native_against_python(body: bytes | bytearray | memoryview, count: int, *, valid: bool) -> None:
    """Each C function answers exactly what the Python loop does, or None where Python must decide; for
    ``valid`` records (every field within 64 bits) it always answers."""
    assert NATIVE is not None
    with pure_python():
        python = _every_public_answer(body, count)
    native_answers = [
        NATIVE.walk_records(body, count, True, RecordsWalk),
        NATIVE.walk_records(body, count, False, RecordsWalk),
        NATIVE.keyless_record_indexes(body, count),
        NATIVE.raw_records(body, count, RawRecord),
    ]
    for index, (native, expected) in enumerate(zip(native_answers, python, strict=True)):
        if valid:
            assert native is not None, f"C loop {index} left valid records to Python"
        if native is None:
            continue
        if index == 3:
            assert (native, None) == expected
            assert all(type(record) is RawRecord for record in native)
        else:
            assert ("answer", native) == expected
            assert type(native) is type(expected[1])
    assert _every_public_answer(body, count) == python  # with the C loops, as the broker runs


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_lists(), st.sampled_from([bytes, bytearray, memoryview]))
def test_the_c_loops_answer_valid_records_as_python_does(batch: list[Record], kind: type) -> None:
    body = b"".join(encode_record(record) for record in batch)
    _check_native_against_python(kind(body), len(batch), valid=True)


@needs_native
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_records_get_python_s_answer_and_message(data: st.DataObject) -> None:
    batch = data.draw(record_lists())
    body = data.draw(damaged(b"".join(encode_record(record) for record in batch)))
    count = len(batch) + data.draw(st.sampled_from([0, 0, 0, -1, 1, -len(batch), 2**31]))
    _check_native_against_python(body, count, valid=False)


@needs_native
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(-2, 20))
def test_arbitrary_bytes_get_python_s_answer_and_message(body: bytes, count: int) -> None:
    _check_native_against_python(body, count, valid=False)


def _long_key(key: bytes) -> bytes:
    return b"long:" + key[:3]


def _map_outcome(
    body: bytes | bytearray | memoryview, count: int, start: dict[bytes, int], **options: int
) -> tuple[dict[bytes, int], tuple[str, Any]]:
    """What map_record_keys leaves in a copy of ``start`` and what it answers (or raises)."""
    slots = dict(start)
    answer = _outcome(lambda: map_record_keys(body, count, slots=slots, long_key=_long_key, **options))
    return slots, answer


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    record_lists(),
    st.booleans(),
    st.integers(0, 2**62),
    st.integers(0, 30),
    st.integers(0, 12),
    st.integers(0, 20),
    st.dictionaries(st.binary(max_size=4), st.integers(0, 99), max_size=5),
)
def test_the_c_offset_map_maps_as_python_does(
    batch: list[Record],
    damage: bool,
    base_offset: int,
    skipped: int,
    max_short_key: int,
    capacity: int,
    start: dict[bytes, int],
) -> None:
    body = b"".join(encode_record(record) for record in batch)
    if damage:
        body = body[:-1]
    options = {"base_offset": base_offset, "from_offset": base_offset + skipped, "capacity": capacity}
    options["max_short_key"] = max_short_key
    with pure_python():
        python = _map_outcome(body, len(batch), start, **options)
    assert _map_outcome(body, len(batch), start, **options) == python
    assert NATIVE is not None
    slots = dict(start)
    native = NATIVE.map_record_keys(
        body, len(batch), base_offset, slots, base_offset + skipped, capacity, max_short_key, _long_key, KeysMapped
    )
    if native is None:
        assert damage or any(abs(record.offset_delta) >= 2**62 for record in batch)
        assert slots == start  # untouched: Python maps and fails
    else:
        assert (slots, ("answer", native)) == python


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    record_lists(),
    st.booleans(),
    st.integers(0, 2**62),
    st.integers(-3, 40),
    st.booleans(),
    st.integers(0, 12),
    st.dictionaries(st.sampled_from([*KEYS, _long_key(KEYS[-1])]) | st.binary(max_size=4), st.integers(-2, 60)),
)
def test_the_c_cleaning_keeps_what_python_keeps(
    batch: list[Record],
    damage: bool,
    base_offset: int,
    mapped: int,
    retain_deletes: bool,
    max_short_key: int,
    latest: dict[bytes, int],
) -> None:
    body = b"".join(encode_record(record) for record in batch)
    if damage:
        body = body[:-1]
    map_options = {"from_offset": base_offset, "capacity": 50, "max_short_key": max_short_key, "long_key": _long_key}
    slots = {key: base_offset + offset for key, offset in latest.items()}
    with pure_python():  # the cleaner maps the batch's keys before it cleans it: most keys point into it
        _outcome(lambda: map_record_keys(body, len(batch), base_offset, slots, **map_options))
    options: dict[str, Any] = {"mapped_up_to": base_offset + mapped, "retain_deletes": retain_deletes}
    options.update(max_short_key=max_short_key, long_key=_long_key)
    with pure_python():
        python = _outcome(lambda: retained_records(body, len(batch), base_offset, slots, **options))
    assert _outcome(lambda: retained_records(body, len(batch), base_offset, slots, **options)) == python
    assert NATIVE is not None
    native = NATIVE.retained_records(
        body, len(batch), base_offset, slots, base_offset + mapped, retain_deletes, max_short_key, _long_key, RawRecord
    )
    if native is None:
        assert damage or any(abs(record.offset_delta) >= 2**62 for record in batch)
    else:
        assert ("answer", native) == python
        assert all(type(record) is RawRecord for record in native[0])


@needs_native
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_lists(), st.sampled_from(["builder", "attributes", "first delta", "offsets", "damaged"]))
def test_the_c_recompression_check_keeps_what_python_keeps(batch: list[Record], change: str) -> None:
    """Records as Kafka's builder writes them (attributes 0, offset delta = index, the first timestamp delta 0)
    keep their bytes when broker-side recompression rebuilds their batch; C and Python must agree which do."""
    for index, record in enumerate(batch):
        record.attributes, record.offset_delta = 0, index
    batch[0].timestamp_delta = 0
    if change == "attributes":
        batch[-1].attributes = 1
    elif change == "first delta":
        batch[0].timestamp_delta = 1
    elif change == "offsets":
        batch[-1].offset_delta += 1
    body = b"".join(encode_record(record) for record in batch)
    if change == "damaged":
        body = body[:-1]
    with pure_python():
        python = _outcome(lambda: builder_timestamp_deltas(body, len(batch)))
    assert _outcome(lambda: builder_timestamp_deltas(body, len(batch))) == python
    assert NATIVE is not None
    native = NATIVE.builder_timestamp_deltas(body, len(batch))
    if change == "builder":
        deltas = [record.timestamp_delta for record in batch]
        assert native == python[1] == (min(deltas), max(deltas))
    elif change == "damaged":
        assert native is None or native is False and python == ("answer", None)
    else:
        assert native is False and python == ("answer", None)


def _varint(value: int) -> bytes:
    """An unsigned varint of any width, as Python reads it (more than 64 bits included)."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@needs_native
@pytest.mark.parametrize("zigzag", [2**64 - 2, 2**64 - 1, 2**64, 2**65 + 2, 2**70 - 1])
def test_varints_wider_than_64_bits_are_left_to_python(zigzag: int) -> None:
    """Python reads a 10-byte varint into an int of up to 70 bits; C takes up to 64 bits and leaves the rest."""
    fields = b"\x00" + _varint(zigzag) + b"\x00" + b"\x01" + b"\x01" + b"\x00"  # attributes, deltas, no key...
    body = _varint(len(fields) << 1) + fields
    _check_native_against_python(body, 1, valid=zigzag < 2**64)


@needs_native
def test_buffers_are_released_and_odd_buffers_left_to_python() -> None:
    records_ = [Record(offset_delta=i, key=None if i % 2 else b"k", value=b"v") for i in range(600)]
    body = bytearray(b"".join(encode_record(record) for record in records_))
    for bad in (body, body[:-1]):
        NATIVE.walk_records(bad, 600, True, RecordsWalk)
        NATIVE.keyless_record_indexes(bad, 600)
        NATIVE.raw_records(bad, 600, RawRecord)
        bad.append(0)  # a bytearray whose buffer is still exported cannot be resized
        del bad[-1]
    words = array("i", [0] * 8)  # a buffer of 4-byte items: Python indexes it by item, so C leaves it
    assert NATIVE.walk_records(memoryview(words), 1, True, RecordsWalk) is None
    assert NATIVE.walk_records(memoryview(body)[::2], 300, True, RecordsWalk) is None  # not contiguous
    with pytest.raises(TypeError):
        NATIVE.walk_records(body, 600, True, dict)
    assert keyless_record_indexes(body, 600) == list(range(1, 600, 2))


def test_kbroker_pure_python_selects_the_python_loops() -> None:
    code = "from protocol import records; print(records._native is None)"
    environment = {**os.environ, "KBROKER_PURE_PYTHON": "1"}
    shown = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environment, capture_output=True, text=True)
    assert shown.stdout.strip() == "True", shown.stderr


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI only: a development machine may lack a compiler")
def test_ci_runs_the_c_loops() -> None:
    """`.ci/run`'s `pip install -e .` builds the extension in place; CI must not fall back to Python unseen."""
    assert os.environ.get("KBROKER_PURE_PYTHON", "") in ("", "0")
    assert NATIVE is not None, "protocol._records_native did not build: see the pip install output"
