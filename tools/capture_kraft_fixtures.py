"""Capture log segments that Apache Kafka wrote, as fixtures for kbroker's record decoders.

    python tools/capture_kraft_fixtures.py [--out tests/fixtures/kraft-4.3.1]

Starts one Apache Kafka 4.3.1 node (compat/apache_kafka.py; run it under the machine's JVM lock if it has one),
and has it write one of each kind of record kbroker decodes: a topic with a config, a topic created and
deleted, a broker config, an ACL created and one deleted, a SCRAM user, a client quota, idempotent and
transactional producers (producer id blocks, transaction state), a classic group and a consumer-protocol
(KIP-848) group that commit offsets. Snapshots are taken every kilobyte of metadata. After a clean stop
it copies out:

- ``cluster_metadata/``: every segment of ``__cluster_metadata-0``, its newest snapshot (``.checkpoint``) and
  its ``quorum-state``;
- ``consumer_offsets/`` and ``transaction_state/``: the segments of ``__consumer_offsets-0`` and
  ``__transaction_state-0`` (one partition each);

and beside each file what Kafka's own DumpLogSegments prints for it (``<file>.dump``, with
``--cluster-metadata-decoder``, ``--offsets-decoder`` or ``--transaction-log-decoder``): the oracle that
tests/test_kafka_written_records.py compares kbroker's decoding with.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compat.apache_kafka import ApacheKafka  # noqa: E402
from kbroker.wire_client import WireClient  # noqa: E402
from protocol.messages.alter_client_quotas_request import AlterClientQuotasRequest  # noqa: E402
from tools import maven_artifacts  # noqa: E402

KAFKA_TOOLS_SET = "kafka-tools-4.3.1"
DUMP_LOG_SEGMENTS = "org.apache.kafka.tools.DumpLogSegments"
TOPIC = "records-topic"
OVERRIDES = {
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
    "metadata.log.max.record.bytes.between.snapshots": "1024",  # snapshots soon, the newest a fixture
    "metadata.max.idle.interval.ms": "60000",  # fewer NoOpRecords: a smaller fixture
    # ACLs need an authorizer; the scenario's client (PLAINTEXT, User:ANONYMOUS) may do everything.
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
}


def dump(files: list[Path], decoder: str) -> None:
    """Kafka's DumpLogSegments over ``files``, each output saved beside its file as ``<name>.dump``."""
    classpath = maven_artifacts.classpath(KAFKA_TOOLS_SET)
    for path in files:
        command = ["java", "-Xmx256m", "-cp", classpath, DUMP_LOG_SEGMENTS, decoder, "--print-data-log"]
        command += ["--files", str(path)]
        run = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
        # The first line names the file by its absolute path: keep only its name, so the fixture is portable.
        lines = run.stdout.splitlines()
        if lines and lines[0].startswith("Dumping "):
            lines[0] = f"Dumping {path.name}"
        (path.parent / f"{path.name}.dump").write_text("\n".join(lines) + "\n")


def exercise(kafka: ApacheKafka) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    bootstrap = {"bootstrap.servers": kafka.bootstrap}
    admin = AdminClient(bootstrap)

    def wait(futures: dict) -> None:
        for future in futures.values():
            future.result(timeout=30)

    wait(admin.create_topics([NewTopic(TOPIC, 2, 1, config={"retention.ms": "3600000"})]))
    wait(admin.create_topics([NewTopic("doomed-topic", 1, 1)]))
    wait(admin.delete_topics(["doomed-topic"]))
    wait(
        admin.incremental_alter_configs(
            [
                ConfigResource(
                    ResourceType.TOPIC,
                    TOPIC,
                    incremental_configs=[
                        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)
                    ],
                ),
                ConfigResource(
                    ResourceType.BROKER,
                    "1",  # the node's own dynamic config
                    incremental_configs=[
                        ConfigEntry("log.cleaner.threads", "2", incremental_operation=AlterConfigOpType.SET)
                    ],
                ),
            ]
        )
    )
    allow = AclBinding(
        ResourceType.TOPIC,
        TOPIC,
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    denied = AclBinding(
        ResourceType.GROUP,
        "grp-",
        ResourcePatternType.PREFIXED,
        "User:bob",
        "*",
        AclOperation.ALL,
        AclPermissionType.DENY,
    )
    wait(admin.create_acls([allow, denied]))
    deleted = AclBindingFilter(
        ResourceType.GROUP,
        "grp-",
        ResourcePatternType.PREFIXED,
        "User:bob",
        "*",
        AclOperation.ALL,
        AclPermissionType.DENY,
    )
    wait(admin.delete_acls([deleted]))
    credential = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192)
    wait(admin.alter_user_scram_credentials([UserScramCredentialUpsertion("alice", credential, b"secret", b"salt")]))
    with WireClient(kafka.bootstrap) as client:
        quota = AlterClientQuotasRequest.EntryData(
            entity=[AlterClientQuotasRequest.EntityData(entity_type="user", entity_name="alice")],
            ops=[AlterClientQuotasRequest.OpData(key="producer_byte_rate", value=1024.0, remove=False)],
        )
        answer = client.request(AlterClientQuotasRequest(entries=[quota]), 1)
        assert all(entry.error_code == 0 for entry in answer.entries), answer

    producer = Producer({**bootstrap, "enable.idempotence": True})
    for i in range(6):
        producer.produce(TOPIC, key=f"key-{i}".encode(), value=f"value-{i}".encode(), partition=i % 2)
    producer.flush(30)
    transactional = Producer({**bootstrap, "transactional.id": "records-txn"})
    transactional.init_transactions(30)
    transactional.begin_transaction()
    transactional.produce(TOPIC, key=b"txn-key", value=b"txn-value", partition=0)
    transactional.commit_transaction(30)

    for group, protocol in (("classic-group", "classic"), ("consumer-group", "consumer")):
        consumer = Consumer(
            {**bootstrap, "group.id": group, "group.protocol": protocol, "auto.offset.reset": "earliest"}
            | ({"session.timeout.ms": 10000} if protocol == "classic" else {})
            | {"enable.auto.commit": False}
        )
        consumer.subscribe([TOPIC])
        seen = 0
        deadline = time.monotonic() + 60
        while seen < 7 and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                seen += 1
        if seen < 7:
            raise RuntimeError(f"{group} consumed {seen} of 7 records")
        consumer.commit(asynchronous=False)
        consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "kraft-4.3.1")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kraft-fixtures-") as scratch:
        kafka = ApacheKafka(Path(scratch), OVERRIDES)
        kafka.start()
        try:
            exercise(kafka)
            time.sleep(2)  # the group coordinator's last writes, a snapshot
        finally:
            kafka.stop()
        data = kafka.data_dir
        if args.out.exists():
            shutil.rmtree(args.out)
        copies: dict[str, list[Path]] = {}
        for source, target, decoder in (
            ("__cluster_metadata-0", "cluster_metadata", "--cluster-metadata-decoder"),
            ("__consumer_offsets-0", "consumer_offsets", "--offsets-decoder"),
            ("__transaction_state-0", "transaction_state", "--transaction-log-decoder"),
        ):
            (args.out / target).mkdir(parents=True)
            files = sorted((data / source).glob("*.log"))
            snapshots = sorted((data / source).glob("*.checkpoint"))
            files += snapshots[-1:]
            for path in files:
                shutil.copyfile(path, args.out / target / path.name)
            if (data / source / "quorum-state").exists():
                shutil.copyfile(data / source / "quorum-state", args.out / target / "quorum-state")
            copies[decoder] = [args.out / target / path.name for path in files]
    for decoder, files in copies.items():
        dump(files, decoder)
    for path in sorted(args.out.rglob("*")):
        if path.is_file():
            print(f"{path.relative_to(ROOT)}\t{path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
