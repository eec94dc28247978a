"""Capture record batches written by real producers, as test fixtures for protocol/records.py.

    python tools/capture_batches.py [--out tests/fixtures/batches] [--java 3.9.0,4.4.0] [--clients ...]

Starts an in-process kbroker, has each client produce a known set of records in each codec (with and
without keys and headers, with and without idempotence), and copies the stored batches out of the log
(byte for byte as the producer framed them, apart from the broker-assigned base offset, which the CRC does
not cover). Writes one ``<name>.bin`` per case and ``manifest.json`` with what was sent, which
tests/test_captured_batches.py checks the decoder against.

Clients: kafka-python (installed), confluent-kafka (librdkafka) and the Java producer of each kafka-clients
version given with ``--java`` (jars from tools/java_clients.py; tools/java/CaptureProducer.java is compiled
with javac against each), named ``java-<version>`` in the fixtures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kbroker.testing import RunningBroker  # noqa: E402
from protocol.records import iter_batches  # noqa: E402

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
VARIANTS = {
    "plain": {"keys": False, "headers": False, "idempotent": False},
    "keyed-headers": {"keys": True, "headers": True, "idempotent": False},
    "idempotent": {"keys": True, "headers": True, "idempotent": True},
}
RECORDS = 12


def records_for(variant: dict[str, bool]) -> list[dict]:
    out = []
    for i in range(RECORDS):
        out.append(
            {
                "key": f"key-{i % 4}".encode().hex() if variant["keys"] else None,
                # With keys, one record is a tombstone (null value); kafka-python refuses a record with neither.
                "value": None if i == 5 and variant["keys"] else (f"value {i} " * (i + 30)).encode().hex(),
                "headers": [["h1", f"{i}".encode().hex()], ["empty", ""]] if variant["headers"] else [],
            }
        )
    return out


def produce_kafka_python(bootstrap: str, topic: str, codec: str, variant: dict, records: list[dict]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if codec == "none" else codec,
        enable_idempotence=variant["idempotent"],
        linger_ms=50,
        batch_size=1 << 20,
    )
    futures = [
        producer.send(
            topic,
            partition=0,
            key=_bytes(r["key"]),
            value=_bytes(r["value"]),
            headers=[(k, _bytes(v)) for k, v in r["headers"]],
        )
        for r in records
    ]
    for future in futures:
        future.get(30)
    producer.close()


def produce_confluent(bootstrap: str, topic: str, codec: str, variant: dict, records: list[dict]) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "enable.idempotence": variant["idempotent"],
            "linger.ms": 50,
            "batch.num.messages": 10_000,
        }
    )
    for r in records:
        producer.produce(
            topic,
            partition=0,
            key=_bytes(r["key"]),
            value=_bytes(r["value"]),
            headers=[(k, _bytes(v)) for k, v in r["headers"]] or None,
        )
    if producer.flush(30) != 0:
        raise RuntimeError("confluent-kafka did not deliver everything")


def produce_java(classpath: str, bootstrap: str, topic: str, codec: str, variant: dict, records: list[dict]) -> None:
    lines = []
    for r in records:
        headers = ",".join(f"{k}={'-' if v is None else v}" for k, v in r["headers"]) or "-"
        lines.append(f"{r['key'] or '-'} {r['value'] or '-'} {headers}")
    command = ["java", "-cp", classpath, "CaptureProducer", bootstrap, topic, codec, str(variant["idempotent"]).lower()]
    run = subprocess.run(command, input="\n".join(lines) + "\n", text=True, capture_output=True, timeout=120)
    if run.returncode != 0:
        raise RuntimeError(f"Java producer failed: {run.stderr[-2000:]}")


def java_classpath(version: str, classes: Path) -> str:
    """kafka-clients ``version`` (downloaded if need be) plus CaptureProducer compiled against it."""
    sys.path.insert(0, str(ROOT / "tools"))
    import java_clients

    jars = java_clients.classpath(version)
    source = ROOT / "tools" / "java" / "CaptureProducer.java"
    subprocess.run(["javac", "-d", str(classes), "-cp", jars, str(source)], check=True, timeout=120)
    return os.pathsep.join([jars, str(classes)])


def _bytes(hex_text: str | None) -> bytes | None:
    return None if hex_text is None else bytes.fromhex(hex_text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "batches")
    parser.add_argument("--java", default="", help="kafka-clients versions to capture from, comma separated")
    parser.add_argument("--clients", default=None, help="only these clients (default: all given)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}

    clients = {
        "kafka-python": produce_kafka_python,
        "confluent-kafka": produce_confluent,
    }
    with tempfile.TemporaryDirectory() as tmp, RunningBroker(Path(tmp) / "data") as broker:
        for version in filter(None, args.java.split(",")):
            classes = Path(tmp) / f"classes-{version}"
            classpath = java_classpath(version, classes)
            clients[f"java-{version}"] = functools.partial(produce_java, classpath)
        wanted = set(args.clients.split(",")) if args.clients else set(clients)
        assert broker.broker is not None
        for client, produce in clients.items():
            if client not in wanted:
                continue
            for codec in CODECS:
                for variant_name, variant in VARIANTS.items():
                    name = f"{client}-{codec}-{variant_name}"
                    records = records_for(variant)
                    produce(broker.bootstrap, name, codec, variant, records)
                    plog = broker.broker.logs.get_partition(name, 0)
                    assert plog is not None
                    data = plog.read(0, 1 << 30).read_bytes()
                    if codec != "none" and all(h.compression == 0 for h, _ in iter_batches(data)):
                        print(f"{name}: the client sent it uncompressed; not kept", file=sys.stderr)
                        continue
                    (args.out / f"{name}.bin").write_bytes(data)
                    manifest[name] = {"client": client, "codec": codec, **variant, "records": records}
                    print(f"{name}: {len(data)} bytes")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
