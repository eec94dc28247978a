"""Write tests/fixtures/topics-json-datadir: a data directory as kbroker kept it before the metadata log (topics in
topics.json), for tests/metadata/test_migration.py to start today's kbroker on.

Run the old kbroker from its own checkout (with its C extension built):

    git worktree add --detach /tmp/kb-old <commit before the metadata log>
    (cd /tmp/kb-old && python3 setup.py -q build_ext --inplace)
    python3 tools/capture_topics_json_datadir.py /tmp/kb-old

It creates topics (with config overrides, one grown, one deleted), produces keyed records, stops the broker
cleanly, and writes the data directory and ``expected.json`` (each topic's id, partitions, configs and records).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kbroker.wire_client import WireClient  # noqa: E402
from protocol.messages.create_partitions_request import CreatePartitionsRequest  # noqa: E402
from protocol.messages.create_topics_request import CreateTopicsRequest  # noqa: E402
from protocol.messages.delete_topics_request import DeleteTopicsRequest  # noqa: E402
from protocol.messages.metadata_request import MetadataRequest  # noqa: E402
from protocol.messages.produce_request import ProduceRequest  # noqa: E402
from protocol.records import Record, build_batch  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "topics-json-datadir"
TOPICS = {
    "orders": (3, {"cleanup.policy": "compact", "retention.ms": "86400000"}),
    "clicks": (1, {}),
    "grown": (1, {"max.message.bytes": "200000"}),
    "gone": (2, {}),
}


def create(client: WireClient, name: str, partitions: int, configs: dict[str, str]) -> None:
    topic = CreateTopicsRequest.CreatableTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=1,
        configs=[CreateTopicsRequest.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()],
    )
    answer = client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0]
    assert answer.error_code == 0, answer


def produce(client: WireClient, topic: str, partition: int, values: list[tuple[str, str]]) -> None:
    records = [Record(offset_delta=i, key=k.encode(), value=v.encode()) for i, (k, v) in enumerate(values)]
    data = [ProduceRequest.PartitionProduceData(index=partition, records=build_batch(records, base_timestamp=1000))]
    request = ProduceRequest(
        acks=-1, timeout_ms=5000, topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=data)]
    )
    answer = client.request(request, 9).responses[0].partition_responses[0]
    assert answer.error_code == 0, answer


def main(old_checkout: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="kb-capture-"))
    data_dir = work / "data"
    ready = work / "ready"
    command = [sys.executable, "-m", "kbroker", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)]
    command += ["--ready-file", str(ready)]
    process = subprocess.Popen(command, cwd=old_checkout)
    try:
        while not ready.exists():
            assert process.poll() is None, "the old kbroker did not start"
            time.sleep(0.05)
        host, _, port = ready.read_text().strip().rpartition(":")
        records: dict[str, dict[int, list[tuple[str, str]]]] = {}
        with WireClient(f"{host}:{port}") as client:
            for name, (partitions, configs) in TOPICS.items():
                create(client, name, partitions, configs)
            assert (
                client.request(
                    CreatePartitionsRequest(
                        topics=[CreatePartitionsRequest.CreatePartitionsTopic(name="grown", count=3, assignments=None)],
                        timeout_ms=5000,
                        validate_only=False,
                    ),
                    3,
                )
                .results[0]
                .error_code
                == 0
            )
            for name in ("orders", "clicks", "grown", "gone"):
                for partition in range(3 if name != "clicks" else 1):
                    values = [(f"k{i}", f"{name}-{partition}-{i}") for i in range(3)]
                    if name == "gone" and partition == 2:
                        continue
                    produce(client, name, partition, values)
                    records.setdefault(name, {})[partition] = values
            assert (
                client.request(DeleteTopicsRequest(topic_names=["gone"], timeout_ms=5000), 4).responses[0].error_code
                == 0
            )
            del records["gone"]
            topics = client.request(MetadataRequest(topics=None), 12).topics
            ids = {t.name: str(t.topic_id) for t in topics}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    assert not (data_dir / "__cluster_metadata-0").exists(), "not a checkout from before the metadata log"
    expected = {
        name: {
            "id": ids[name],
            "partitions": 3 if name == "grown" else TOPICS[name][0],
            "configs": TOPICS[name][1],
            "records": {str(p): values for p, values in records[name].items()},
        }
        for name in records
    }
    shutil.rmtree(FIXTURE, ignore_errors=True)
    shutil.copytree(data_dir, FIXTURE / "data")
    (FIXTURE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(work)
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
