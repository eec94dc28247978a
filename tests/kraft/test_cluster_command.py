"""``kbroker cluster``: Apache Kafka 4.4's controller quorum and three kbroker brokers from one command. The test
runs it as a user does (a child process, its printed bootstrap list), creates a replicated topic through it,
round-trips records, stops it with SIGTERM (every process it started gone, the brokers' shutdown a controlled one),
and starts it again on the same directory: the same cluster, nodes and ports, the records read back.

The registered brokers and the partitions' leaders are read from the controllers' metadata, as any observer of the
quorum reads it (tests/kraft/test_serve_broker_role.py's controller_image)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.kraft import local_cluster
from kbroker.kraft.local_cluster import ClusterError, load_layout
from kbroker.metadata.image import MetadataImage
from tests.kraft.test_serve_broker_role import controller_image

WITHIN = 240.0  # seconds for a cold start of a JVM and three brokers on 2 busy cores: a bound, not a measure
NODE_LINE = re.compile(r"^(controller|broker) (\d+) at (\S+) pid (\d+) ")


@dataclass
class Started:
    process: subprocess.Popen[str]
    lines: list[str]
    cluster_id: str
    bootstrap: str
    nodes: dict[tuple[str, int], tuple[str, int]]  # (role, node id) -> (address, pid)

    def address(self, broker: int) -> str:
        return self.nodes[("broker", broker)][0]

    def quorum(self) -> Any:
        """What controller_image needs of a KafkaController: the voters and the cluster id."""
        voters = ",".join(
            f"{node}@{address}" for (role, node), (address, _) in self.nodes.items() if role == "controller"
        )
        return SimpleNamespace(voters=voters, cluster_id=self.cluster_id)


def start_cluster(directory: Path, *arguments: str) -> Started:
    command = [sys.executable, "-m", "kbroker", "cluster", "--dir", str(directory), *arguments]
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def read(stream: Any) -> None:
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, args=(process.stdout,), daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + WITHIN
    while not (seen and seen[-1].startswith("bootstrap: ")):
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            process.kill()
            raise AssertionError(f"no bootstrap line within {WITHIN:g} s: {seen}") from None
        assert line is not None, f"kbroker cluster exited with {process.wait()}: {seen}"
        seen.append(line)
    process_lines = Started(process, seen, "", seen[-1].removeprefix("bootstrap: "), {})
    threading.Thread(target=lambda: [seen.append(x) for x in iter(lines.get, None)], daemon=True).start()
    first = re.match(r"^cluster (\S+) \((formatted|restarting)\) in ", seen[0])
    assert first is not None, seen
    process_lines.cluster_id = first.group(1)
    for line in seen:
        if (node := NODE_LINE.match(line)) is not None:
            process_lines.nodes[(node.group(1), int(node.group(2)))] = (node.group(3), int(node.group(4)))
    return process_lines


def stop_cluster(started: Started) -> None:
    started.process.send_signal(signal.SIGTERM)
    assert started.process.wait(timeout=WITHIN) == 0
    time.sleep(0.2)  # the reader thread takes the last lines
    assert started.lines[-2:] == ["stopping: the brokers (controlled shutdown), then the controllers", "stopped"]
    for _address, pid in started.nodes.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped by the supervisor: no such process left, not even a zombie


def leaders(image: MetadataImage, topic: str) -> dict[int, int]:
    return {index: p.leader for index, p in image.topics.by_name[topic].partitions.items()}


def produce(address: str, topic: str, partition: int, values: list[bytes]) -> list[tuple[int | None, int | None]]:
    producer = Producer({"bootstrap.servers": address, "acks": "all", "enable.idempotence": True})
    delivered: list[tuple[int | None, int | None]] = []
    failed: list[Any] = []
    for value in values:
        producer.produce(
            topic,
            key=b"k",
            value=value,
            partition=partition,
            on_delivery=lambda err, msg: (
                failed.append(err) if err else delivered.append((msg.partition(), msg.offset()))
            ),
        )
    assert producer.flush(WITHIN) == 0
    assert failed == []
    return delivered


def consume(address: str, topic: str, partition: int, count: int) -> list[tuple[int, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": address, "group.id": "reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0)])
    read: list[tuple[int, bytes | None]] = []
    deadline = time.monotonic() + WITHIN
    while len(read) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read.append((message.offset(), message.value()))
    consumer.close()
    return read


def test_kbroker_cluster_runs_stops_and_restarts_a_three_broker_cluster(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    started = start_cluster(directory, "--brokers", "3", "--controllers", "1", "--port", "0")
    try:
        assert sorted(started.nodes) == [("broker", 1), ("broker", 2), ("broker", 3), ("controller", 1000)]
        assert started.bootstrap == ",".join(started.address(b) for b in (1, 2, 3))
        saved = json.loads((directory / "cluster.json").read_text())
        assert saved["cluster_id"] == started.cluster_id

        # Three brokers registered and unfenced, at the addresses printed.
        image = controller_image(started.quorum(), lambda i: len([b for b in i.brokers.values() if not b.fenced]) == 3)
        assert {
            b.broker_id: f"{b.endpoints['PLAINTEXT'].host}:{b.endpoints['PLAINTEXT'].port}"
            for b in image.brokers.values()
        } == {b: started.address(b) for b in (1, 2, 3)}

        # A topic of replication factor 3 created through the cluster: every partition on all three brokers.
        admin = AdminClient({"bootstrap.servers": started.bootstrap})
        admin.create_topics([NewTopic("orders", num_partitions=3, replication_factor=3)])["orders"].result(WITHIN)
        image = controller_image(started.quorum(), lambda i: i.topics.get("orders") is not None)
        partitions = image.topics.by_name["orders"].partitions
        assert {index: sorted(p.replicas) for index, p in partitions.items()} == {i: [1, 2, 3] for i in range(3)}
        led_by = leaders(image, "orders")
        assert sorted(led_by.values()) == [1, 2, 3]  # Kafka's placement: each broker leads one

        # Records through each partition's leader, acks=all: exact offsets, then read back.
        for partition, leader in led_by.items():
            values = [f"p{partition}-{n}".encode() for n in range(3)]
            assert produce(started.address(leader), "orders", partition, values) == [(partition, n) for n in range(3)]
            assert consume(started.address(leader), "orders", partition, 3) == list(enumerate(values))
    finally:
        if started.process.poll() is None:
            stop_cluster(started)
    for broker in (1, 2, 3):
        assert (
            "controlled shutdown allowed by the controller quorum"
            in (directory / f"broker-{broker}" / "broker.log").read_text()
        )

    # Again on the same directory: the same cluster, node ids and ports, and the records.
    again = start_cluster(directory)
    try:
        assert again.lines[0].startswith(f"cluster {started.cluster_id} (restarting) in ")
        assert {key: address for key, (address, _) in again.nodes.items()} == {
            key: address for key, (address, _) in started.nodes.items()
        }
        image = controller_image(again.quorum(), lambda i: all(leader > 0 for leader in leaders(i, "orders").values()))
        for partition, leader in leaders(image, "orders").items():
            expected = [(n, f"p{partition}-{n}".encode()) for n in range(3)]
            assert consume(again.address(leader), "orders", partition, 3) == expected

        # A broker that dies (kill -9 in a failover test) is reported; the others go on.
        _, pid = again.nodes[("broker", 2)]
        os.kill(pid, signal.SIGKILL)
        log = directory / "broker-2" / "broker.log"
        reported = f"broker 2 (pid {pid}) was ended by SIGKILL (log: {log})"
        deadline = time.monotonic() + WITHIN
        while reported not in again.lines and time.monotonic() < deadline:
            time.sleep(0.1)
        assert reported in again.lines and again.process.poll() is None
    finally:
        stop_cluster(again)


def test_a_cluster_directory_is_started_as_it_was_made(tmp_path: Path) -> None:
    made = load_layout(tmp_path, 2, 1, 0)
    assert made.created and [n.node_id for n in made.brokers] == [1, 2]
    assert [n.node_id for n in made.controllers] == [1000]
    again = load_layout(tmp_path, None, None, None)
    assert (again.created, again.cluster_id, again.brokers, again.controllers) == (
        False,
        made.cluster_id,
        made.brokers,
        made.controllers,
    )
    with pytest.raises(ClusterError) as refused:
        load_layout(tmp_path, 3, None, None)
    assert str(refused.value) == (
        f"{tmp_path} holds a cluster of 2 brokers and 1 controller(s) (cluster id {made.cluster_id}); run it with "
        "--brokers 2, or start a new cluster in another --dir"
    )
    base = load_layout(tmp_path / "fixed", 2, 3, 19092)
    assert [n.port for n in base.brokers + base.controllers] == [19092, 19093, 19094, 19095, 19096]
    with pytest.raises(ClusterError) as beyond:
        load_layout(tmp_path / "high", 3, 1, 65533)
    assert str(beyond.value) == "--port 65533: the cluster's ports would not all be in 1..65535"
    assert not (tmp_path / "high").exists()


def test_without_java_17_one_line_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "jdk11"
    (old / "bin").mkdir(parents=True)
    java = old / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.21\" 2023-10-17' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(old))
    done = subprocess.run(
        [sys.executable, "-m", "kbroker", "cluster", "--dir", str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"kbroker cluster: Kafka's KRaft controller needs Java 17+, {java} is Java 11: apt-get install -y "
        "openjdk-17-jre-headless, or https://adoptium.net; or set JAVA_HOME\n"
    )
    assert not (tmp_path / "c").exists()


def test_the_controller_jars_are_fetched_once_with_a_progress_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in mvn (no network here for Maven Central's jars): what it is asked for and what is said."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    mvn = bin_dir / "mvn"
    mvn.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'for arg in "$@"; do case "$arg" in -DoutputDirectory=*) out="${arg#-DoutputDirectory=}";; esac; done\n'
        'touch "$out/kafka_2.13-4.4.0.jar" "$out/kafka-clients-4.4.0.jar"\n'
    )
    mvn.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("KBROKER_MAVEN_CACHE", str(tmp_path / "cache"))
    said: list[str] = []
    classpath = local_cluster.controller_classpath(said.append)
    target = tmp_path / "cache" / "kafka-4.4.0"
    assert classpath == f"{target}/kafka-clients-4.4.0.jar:{target}/kafka_2.13-4.4.0.jar"
    assert said == [
        f"fetching Apache Kafka 4.4.0 (its KRaft controller) from Maven Central into {target} ...",
        "fetched 2 jars",
    ]
    assert (target / ".complete").read_text() == "kafka-clients-4.4.0.jar\nkafka_2.13-4.4.0.jar\n"
    assert local_cluster.controller_classpath(said.append) == classpath and len(said) == 2  # once
    assert len(calls.read_text().splitlines()) == 1 and "dependency:copy-dependencies" in calls.read_text()

    monkeypatch.setenv("KBROKER_MAVEN_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(ClusterError) as refused:
        local_cluster.controller_classpath(said.append)
    assert str(refused.value) == (
        f"Apache Kafka 4.4.0's jars are not in {tmp_path / 'empty' / 'kafka-4.4.0'} and fetching them needs Maven: "
        "apt-get install -y maven (then run this again)"
    )
