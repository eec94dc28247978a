"""Benchmark of the protocol/ hot paths (not a test): run `python tools/bench_protocol.py`.

- decode a Produce request carrying one 1 MiB batch of 1,000 records, then walk its batch header and
  check the CRC (what the broker does per produce);
- encode a Fetch response carrying 1 MiB of record batches;
- the header-only path (split batches, read headers, assign offsets) for the same total size in batches
  of 10 and of 10,000 records: its cost must not depend on the record count;
- the validator every produced batch passes (kbroker/storage/validation.py: Kafka's LogValidator checks,
  which walk every record): its cost grows with the record count, and a compressed batch is decompressed.
  It runs twice, with protocol.records' C loops (protocol/_records_native.c) and with its pure-Python ones.

It measures the protocol package it imports, which it names: run it from the checkout you mean
(`PYTHONPATH=. python tools/bench_protocol.py` in a git worktree whose editable install is elsewhere).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from protocol import records as records_module
from protocol.framing import decode_request, encode_request, encode_response
from protocol.messages.fetch_response import FetchResponse
from protocol.messages.produce_request import ProduceRequest
from protocol.records import HEADER_SIZE, Record, assign_offsets, build_batch, iter_batches, validate_crc, walk_records

MIB = 1024 * 1024


LZ4 = 3


def make_batch(records: int, total_bytes: int, codec: int = 0) -> bytes:
    value = b"v" * max(total_bytes // records - 20, 1)
    return build_batch(
        [Record(offset_delta=i, timestamp_delta=0, key=None, value=value, headers=[]) for i in range(records)],
        compression_type=codec,
    )


def measure(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6, min(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()

    batch = make_batch(1000, MIB)
    request = ProduceRequest(
        acks=-1,
        timeout_ms=30000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="bench", partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
            )
        ],
    )
    frame = encode_request(request, 9, correlation_id=1)[4:]

    def produce_path() -> None:
        decoded = decode_request(frame)
        records = decoded.body.topic_data[0].partition_data[0].records
        for _, view in iter_batches(records, strict=True):
            validate_crc(view)

    fetch = FetchResponse(
        responses=[
            FetchResponse.FetchableTopicResponse(
                topic="bench",
                partitions=[FetchResponse.PartitionData(partition_index=0, high_watermark=1000, records=batch)],
            )
        ]
    )

    def fetch_encode() -> None:
        encode_response(fetch, 1, 12, 1)

    # (what, function, bytes, records, with the C loops): the records, for the validator's cost per record.
    rows: list[tuple[str, Callable[[], object], int, int, bool]] = [
        ("decode Produce v9 (1 MiB, 1,000 records) + CRC", produce_path, len(frame), 0, True),
        ("encode Fetch v12 response (1 MiB)", fetch_encode, len(batch), 0, True),
    ]
    for count in (10, 10_000):
        blob = b"".join(make_batch(count, 64 * 1024) for _ in range(16))  # 1 MiB in 16 batches

        def header_path(blob: bytes = blob) -> None:
            buffer = bytearray(blob)
            offset = 0
            for header, view in iter_batches(buffer, strict=True):
                assign_offsets(view, offset)
                offset += header.records_count

        rows.append((f"header-only path, 1 MiB in batches of {count:,} records", header_path, len(blob), 0, True))

    # The records walk alone (protocol.records.walk_records), the part of the validator that reads every record.
    for count in (10, 10_000):
        bodies = [memoryview(make_batch(count, 64 * 1024))[HEADER_SIZE:] for _ in range(16)]

        def walk(bodies: list[memoryview] = bodies, count: int = count) -> None:
            for body in bodies:
                walk_records(body, count, check_offsets=False)

        for native in (True, False):
            label = f"walk_records, 1 MiB in batches of {count:,} records, " + ("C" if native else "Python")
            rows.append((label, walk, 16 * 64 * 1024, 16 * count, native))

    # What a produce costs on top of that: Kafka's LogValidator checks, which walk every record (issue #15).
    from kbroker.storage.validation import validate_batch

    for count, codec in ((10, 0), (10_000, 0), (10_000, LZ4)):
        batches = [make_batch(count, 64 * 1024, codec) for _ in range(16)]
        size = sum(len(b) for b in batches) if not codec else 16 * 64 * 1024  # uncompressed payload for lz4

        def validate(batches: list[bytes] = batches) -> None:
            for batch in batches:
                validate_batch(bytearray(batch), 1 << 30)

        label = f"validate_batch, 1 MiB in batches of {count:,} records" + (" (lz4)" if codec else "")
        for native in (True, False):
            rows.append((label + (", C" if native else ", Python"), validate, size, 16 * count, native))

    native_loops = records_module._native
    print(f"protocol from {records_module.__file__}; C records loops: {'yes' if native_loops else 'NOT BUILT'}")
    print(f"{'operation':<66} {'median µs':>10} {'min µs':>10} {'MB/s':>8} {'ns/record':>10}")
    for name, fn, size, count, native in rows:
        if not native or native_loops is None:
            if native:
                continue  # no C loops to measure
            records_module._native = None
        try:
            median, best = measure(fn, args.repeat)
        finally:
            records_module._native = native_loops
        per_record = f"{median * 1000 / count:>10.1f}" if count else ""
        print(f"{name:<66} {median:>10.1f} {best:>10.1f} {size / median:>8.0f} {per_record:>10}")


if __name__ == "__main__":
    main()
