"""``kbroker format`` against Kafka's own ``kafka-storage format``: the same meta.properties keys and values (the
directory id apart, random in both), each tool takes the other's directory as formatted, refusals in one line, and
a kbroker broker started on a directory kbroker formatted registers with a Kafka 4.4 controller quorum under the
directory id written there."""

from __future__ import annotations

import base64
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from compat.apache_kafka import KafkaController, KafkaUnavailable, kafka_classpath
from kbroker.commands.format import random_uuid
from kbroker.config import parse_properties
from kbroker.testing import BrokerProcess
from tests.kraft.test_serve_broker_role import controller_image

WITHIN = 120  # seconds: a bound against hanging (2 busy cores)
CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qk"


def kbroker_format(*arguments: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kbroker", "format", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=WITHIN)


def meta(directory: Path) -> dict[str, str]:
    return parse_properties((directory / "meta.properties").read_text())


def decoded_uuid(text: str) -> uuid.UUID:
    assert len(text) == 22 and "=" not in text
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=="))


def broker_properties(path: Path, directories: list[Path], node_id: int) -> Path:
    path.write_text(
        "process.roles=broker\n"
        f"node.id={node_id}\n"
        "controller.quorum.bootstrap.servers=127.0.0.1:9093\n"
        "controller.listener.names=CONTROLLER\n"
        "listeners=PLAINTEXT://127.0.0.1:9092\n"
        f"log.dirs={','.join(str(d) for d in directories)}\n"
    )
    return path


def test_format_writes_meta_properties_into_each_log_dir_of_the_config(tmp_path: Path) -> None:
    directories = [tmp_path / "a", tmp_path / "b"]
    config = broker_properties(tmp_path / "broker.properties", directories, 4)
    done = kbroker_format("--config", str(config), "--cluster-id", CLUSTER_ID)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [f"Formatting {d} for cluster {CLUSTER_ID} as node 4." for d in directories]
    written = [meta(d) for d in directories]
    for values in written:
        assert {k: v for k, v in values.items() if k != "directory.id"} == {
            "version": "1",
            "cluster.id": CLUSTER_ID,
            "node.id": "4",
        }
        decoded_uuid(values["directory.id"])
    assert written[0]["directory.id"] != written[1]["directory.id"]
    # --dir and --node-id stand in for the config.
    done = kbroker_format("-t", CLUSTER_ID, "--node-id", "5", "--dir", str(tmp_path / "c"))
    assert done.returncode == 0 and meta(tmp_path / "c")["node.id"] == "5"


def test_random_uuid_is_a_kafka_cluster_id() -> None:
    done = kbroker_format("--random-uuid")
    assert done.returncode == 0
    text = done.stdout.strip()
    assert decoded_uuid(text).version == 4 and not text.startswith("-")
    assert len({random_uuid() for _ in range(50)}) == 50


def test_refusals_are_one_line_and_write_nothing(tmp_path: Path) -> None:
    formatted, fresh = tmp_path / "formatted", tmp_path / "fresh"
    assert kbroker_format("-t", CLUSTER_ID, "--node-id", "1", "--dir", str(formatted)).returncode == 0
    before = (formatted / "meta.properties").read_text()

    def refused(*arguments: str) -> str:
        done = kbroker_format(*arguments)
        assert (done.returncode, done.stdout) == (1, "")
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
        assert not fresh.exists(), "a refused format wrote the other directory"
        return done.stderr.strip()

    both = ["--dir", str(fresh), "--dir", str(formatted)]
    assert refused("-t", CLUSTER_ID, "--node-id", "1", *both) == (
        f"kbroker format: log directory {formatted} is already formatted; use --ignore-formatted to leave it as it "
        "is and format the others"
    )
    other_cluster = random_uuid()
    assert refused("-t", other_cluster, "--node-id", "1", "--ignore-formatted", *both) == (
        f"kbroker format: {formatted} is already formatted for cluster '{CLUSTER_ID}', not '{other_cluster}' (a "
        "directory of another cluster: give its id, or format an empty directory)"
    )
    assert refused("-t", CLUSTER_ID, "--node-id", "2", "--ignore-formatted", *both) == (
        f"kbroker format: {formatted} is already formatted as node.id 1, not 2 (a directory of another node: give "
        "its node id, or format an empty directory)"
    )
    assert refused("-t", "not-a-uuid", "--node-id", "1", "--dir", str(fresh)) == (
        "kbroker format: cluster id 'not-a-uuid' is not a Kafka cluster id (22 characters of URL-safe base64 such "
        "as `kbroker format --random-uuid` or `kafka-storage random-uuid` prints)"
    )
    assert refused("-t", "AAAAAAAAAAAAAAAAAAAAAA", "--node-id", "1", "--dir", str(fresh)) == (
        "kbroker format: cluster id 'AAAAAAAAAAAAAAAAAAAAAA' is one of Kafka's reserved ids; make one with "
        "--random-uuid"
    )
    assert refused("--node-id", "1", "--dir", str(fresh)) == (
        "kbroker format: --cluster-id is needed (the controllers' cluster id; a new one: --random-uuid)"
    )
    assert (
        refused("-t", CLUSTER_ID, "--dir", str(fresh)) == "kbroker format: --node-id is needed (or node.id in --config)"
    )
    assert refused("-t", CLUSTER_ID, "--config", str(tmp_path / "missing.properties")) == (
        f"kbroker format: cannot read {tmp_path / 'missing.properties'}: No such file or directory"
    )
    assert (formatted / "meta.properties").read_text() == before

    # --ignore-formatted: the formatted directory is left as it is, the other formatted.
    done = kbroker_format("-t", CLUSTER_ID, "--node-id", "1", "--ignore-formatted", *both)
    assert done.returncode == 0 and done.stdout.splitlines() == [
        f"Formatting {fresh} for cluster {CLUSTER_ID} as node 1."
    ]
    assert (formatted / "meta.properties").read_text() == before
    done = kbroker_format("-t", CLUSTER_ID, "--node-id", "1", "--ignore-formatted", *both)
    assert (done.returncode, done.stdout) == (0, "All of the log directories are already formatted.\n")


# --- against Apache Kafka 4.4 (one JVM at a time) -------------------------------


def kafka_storage_format(classpath: str, config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = ["java", "-Xmx256m", "-cp", classpath, "kafka.tools.StorageTool", "format"]
    command += ["-t", CLUSTER_ID, "-c", str(config), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=WITHIN)


@pytest.fixture(scope="module")
def classpath() -> str:
    try:
        return kafka_classpath()
    except KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")


def test_kafkas_storage_tool_and_kbroker_format_write_the_same_and_take_each_others_dirs(
    classpath: str, tmp_path: Path
) -> None:
    by_kafka, by_kbroker = tmp_path / "by-kafka", tmp_path / "by-kbroker"
    kafka_config = broker_properties(tmp_path / "kafka.properties", [by_kafka], 6)
    kbroker_config = broker_properties(tmp_path / "kbroker.properties", [by_kbroker], 6)
    assert kafka_storage_format(classpath, kafka_config).returncode == 0
    assert kbroker_format("-c", str(kbroker_config), "-t", CLUSTER_ID).returncode == 0

    kafka_meta, kbroker_meta = meta(by_kafka), meta(by_kbroker)
    assert sorted(kafka_meta) == sorted(kbroker_meta) == ["cluster.id", "directory.id", "node.id", "version"]
    assert {k: v for k, v in kafka_meta.items() if k != "directory.id"} == {
        k: v for k, v in kbroker_meta.items() if k != "directory.id"
    }
    decoded_uuid(kafka_meta["directory.id"])
    decoded_uuid(kbroker_meta["directory.id"])
    assert sorted(p.name for p in by_kafka.iterdir()) == sorted(p.name for p in by_kbroker.iterdir())

    # Each tool takes the other's directory as formatted for this cluster and node: refused without
    # --ignore-formatted, left as it is with it.
    kafka_again = kafka_storage_format(classpath, kbroker_config)
    assert kafka_again.returncode == 1
    assert f"Log directory {by_kbroker} is already formatted" in kafka_again.stdout + kafka_again.stderr
    kbroker_again = kbroker_format("-c", str(kafka_config), "-t", CLUSTER_ID)
    assert kbroker_again.returncode == 1
    assert f"log directory {by_kafka} is already formatted" in kbroker_again.stderr
    kafka_ignoring = kafka_storage_format(classpath, kbroker_config, "--ignore-formatted")
    assert kafka_ignoring.returncode == 0
    assert "All of the log directories are already formatted." in kafka_ignoring.stdout
    kbroker_ignoring = kbroker_format("-c", str(kafka_config), "-t", CLUSTER_ID, "--ignore-formatted")
    assert (kbroker_ignoring.returncode, kbroker_ignoring.stdout) == (
        0,
        "All of the log directories are already formatted.\n",
    )
    assert (meta(by_kafka), meta(by_kbroker)) == (kafka_meta, kbroker_meta)


def test_a_broker_on_a_directory_kbroker_formatted_joins_a_kafka_controller(
    controller: KafkaController, tmp_path: Path
) -> None:
    node = 21
    data_dir = tmp_path / "broker"
    done = kbroker_format("-t", controller.cluster_id, "--node-id", str(node), "--dir", str(data_dir))
    assert done.returncode == 0, done.stderr
    directory_id = decoded_uuid(meta(data_dir)["directory.id"])
    settings = {
        "process.roles": "broker",
        "node.id": str(node),
        "controller.quorum.bootstrap.servers": controller.bootstrap,
        "controller.listener.names": "CONTROLLER",
    }
    broker = BrokerProcess(data_dir, settings).start(timeout=WITHIN)
    try:
        image = controller_image(controller, lambda i: node in i.brokers and not i.brokers[node].fenced)
        registration = image.brokers[node]
        assert registration.log_dirs == (directory_id,)
        assert registration.endpoints["PLAINTEXT"].port == broker.port
    finally:
        broker.stop(timeout=WITHIN)
    assert meta(data_dir)["directory.id"] == base64.urlsafe_b64encode(directory_id.bytes).decode().rstrip("=")
