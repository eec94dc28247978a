"""Record batches written by real producers decode to exactly what they sent.

The fixtures under tests/fixtures/batches were captured by tools/capture_batches.py from kafka-python,
confluent-kafka (librdkafka) and the Java client, in every codec, with and without keys, headers and
idempotence. The broker only assigned their base offsets, which the CRC does not cover.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol.compression import Codec
from protocol.records import decode_records, iter_batches, validate_crc

FIXTURES = Path(__file__).parent / "fixtures" / "batches"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CODEC_IDS = {"none": Codec.NONE, "gzip": Codec.GZIP, "snappy": Codec.SNAPPY, "lz4": Codec.LZ4, "zstd": Codec.ZSTD}


def _bytes(hex_text: str | None) -> bytes | None:
    return None if hex_text is None else bytes.fromhex(hex_text)


def test_every_client_codec_and_variant_is_covered() -> None:
    clients = {case["client"] for case in MANIFEST.values()}
    assert {"kafka-python", "confluent-kafka", "java-3.9.0", "java-4.3.0"} <= clients
    for client in clients:
        cases = [c for c in MANIFEST.values() if c["client"] == client]
        assert {c["codec"] for c in cases} == set(CODEC_IDS)
        assert {(c["keys"], c["headers"], c["idempotent"]) for c in cases} == {
            (False, False, False),
            (True, True, False),
            (True, True, True),
        }


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_captured_batch_decodes_to_what_was_sent(name: str) -> None:
    case = MANIFEST[name]
    data = (FIXTURES / f"{name}.bin").read_bytes()
    decoded = []
    compressions = set()
    for header, batch in iter_batches(data, strict=True):
        assert validate_crc(batch)
        compressions.add(header.compression)
        if case["idempotent"]:
            assert header.producer_id >= 0 and header.producer_epoch >= 0 and header.base_sequence >= 0
        else:
            assert header.base_sequence == -1
        for record in decode_records(batch):
            decoded.append((header.base_offset + record.offset_delta, record.key, record.value, record.headers))
    expected = [
        (offset, _bytes(r["key"]), _bytes(r["value"]), [(k, _bytes(v)) for k, v in r["headers"]])
        for offset, r in enumerate(case["records"])
    ]
    assert decoded == expected
    assert compressions == {CODEC_IDS[case["codec"]]}
