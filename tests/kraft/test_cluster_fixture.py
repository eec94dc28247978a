"""The pytest plugin's ``kbroker_cluster`` (kbroker/pytest_plugin.py), used as a user's test uses it: Apache Kafka's
KRaft controller and three kbroker brokers. A replicated topic survives a kill -9 of its leader with every
acknowledged record read exactly once, and the killed broker comes back and catches up; where no Java can be had,
a test that asks for a cluster skips with the reason.

Leaders and in-sync replicas are read from Metadata (confluent-kafka's list_topics), as a client sees them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.pytest_plugin import KbrokerCluster
from kbroker.wire_client import WireClient
from protocol.exceptions import DecodeError
from protocol.messages.metadata_request import MetadataRequest
from protocol.records import decode_records, iter_batches
from tests.kraft.conftest import WITHIN, wait_for

pytest_plugins = ["pytester"]


def partition_zero(admin: AdminClient, topic: str) -> Any:
    """Partition 0 as Metadata describes it (leader, replicas, isrs), or None while the topic is unknown."""
    topics = admin.list_topics(topic, timeout=10).topics
    described = topics.get(topic)
    if described is None or described.error is not None or 0 not in described.partitions:
        return None
    return described.partitions[0]


def process_state(pid: int) -> str:
    """The one-letter state in /proc (R, S, T for stopped, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_replicated_topic_survives_a_kill_of_its_leader(kbroker_cluster: KbrokerCluster) -> None:
    cluster = kbroker_cluster
    assert [b.node_id for b in cluster.brokers] == [1, 2, 3]
    assert cluster.bootstrap == ",".join(b.bootstrap for b in cluster.brokers)
    assert len({b.bootstrap for b in cluster.brokers} | {cluster.controller_bootstrap}) == 4
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]

    topic = "failover"
    created = admin.create_topics(
        [NewTopic(topic, num_partitions=3, replication_factor=3, config={"min.insync.replicas": "2"})]
    )
    created[topic].result(WITHIN)
    before = wait_for("full ISR", lambda: (p := partition_zero(admin, topic)) and len(p.isrs) == 3 and p)
    assert sorted(before.replicas) == [1, 2, 3]

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    acknowledged: list[tuple[int, bytes]] = []
    failed: list[Any] = []

    def produce(values: list[bytes]) -> None:
        for value in values:
            producer.produce(
                topic,
                value=value,
                partition=0,
                on_delivery=lambda err, msg: (
                    failed.append(err) if err else acknowledged.append((msg.offset(), msg.value()))
                ),
            )
        assert producer.flush(WITHIN) == 0

    first = [f"before-{n}".encode() for n in range(20)]
    produce(first)
    assert failed == [] and acknowledged == list(enumerate(first))

    # kill -9 of partition 0's leader: the controller elects another member of the ISR, the producer moves to it.
    leader = cluster.broker(before.leader)
    pid = leader.pid
    assert pid is not None
    leader.kill()
    assert leader.pid is None and not leader.is_running
    assert not Path(f"/proc/{pid}").exists()  # gone and reaped
    after_kill = wait_for(
        "new leader", lambda: (p := partition_zero(admin, topic)) and p.leader not in (-1, before.leader) and p
    )
    assert after_kill.leader in before.isrs
    second = [f"after-{n}".encode() for n in range(20)]
    produce(second)
    assert failed == []
    assert acknowledged == list(enumerate(first + second))  # acks=all: nothing lost, nothing twice

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: list[tuple[int, bytes | None]] = []
    deadline = time.monotonic() + WITHIN
    while len(read) < len(acknowledged) and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read.append((message.offset(), message.value()))
    assert consumer.poll(2.0) is None  # nothing after them
    consumer.close()
    assert read == acknowledged  # every acknowledged record exactly once, in order

    # restart() brings the killed broker back on its port and data: it rejoins and catches up into the ISR.
    leader.restart()
    assert leader.pid not in (None, pid)
    wait_for("the restarted broker in the ISR", lambda: (p := partition_zero(admin, topic)) and before.leader in p.isrs)
    assert sorted(admin.list_topics(timeout=10).brokers) == [1, 2, 3]

    # pause() / resume(): SIGSTOP and SIGCONT of the same process.
    follower = cluster.broker(after_kill.leader % 3 + 1)
    paused_pid = follower.pid
    assert paused_pid is not None
    follower.pause()
    assert wait_for("a stopped process", lambda: process_state(paused_pid) == "T")
    follower.resume()
    assert wait_for("a running process", lambda: process_state(paused_pid) != "T")
    assert follower.pid == paused_pid


def test_restart_is_a_controlled_shutdown_on_the_same_port(kbroker_cluster: KbrokerCluster) -> None:
    """The module's cluster again, whole after the test before (which killed and paused brokers)."""
    assert all(b.is_running for b in kbroker_cluster.brokers)
    broker = kbroker_cluster.broker(2)
    pid, address = broker.pid, broker.bootstrap
    broker.restart()
    assert broker.pid not in (None, pid) and broker.bootstrap == address
    assert "controlled shutdown allowed by the controller quorum" in broker.log_path.read_text()
    admin = AdminClient({"bootstrap.servers": kbroker_cluster.bootstrap})
    admin.create_topics([NewTopic("after-restart", num_partitions=1, replication_factor=3)])["after-restart"].result(
        WITHIN
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    delivered: list[tuple[int, Any]] = []
    producer.produce("after-restart", value=b"v", on_delivery=lambda err, msg: delivered.append((msg.offset(), err)))
    assert producer.flush(WITHIN) == 0
    assert delivered == [(0, None)]


def replica_values(broker: Any, topic: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in the broker's own segment files of partition 0."""
    records = []
    for segment in sorted((broker.node.data_dir / f"{topic}-0").glob("*.log")):
        try:
            for header, batch in iter_batches(segment.read_bytes()):
                records += [(header.base_offset + r.offset_delta, r.value or b"") for r in decode_records(batch)]
        except DecodeError:  # a batch being written as the file is read: the next look sees it whole
            break
    return records


def answered_at(bootstrap: str, topic: str) -> tuple[int, int, list[int]]:
    """(leader, leader epoch, ISR) of partition 0 as the one broker at ``bootstrap`` answers Metadata (a client's
    metadata may come from any broker it knows, the isolated one's stale view included)."""
    request = MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)])
    with WireClient(bootstrap, timeout=WITHIN) as client:
        [described] = client.request(request, 12).topics
    if described.error_code != 0 or not described.partitions:
        return -1, -1, []
    [partition] = described.partitions
    return partition.leader_id, partition.leader_epoch, sorted(partition.isr_nodes)


def test_an_isolated_leader_loses_the_partition_and_nothing_acknowledged_with_acks_all(
    kbroker_cluster_factory: Callable[..., KbrokerCluster],
) -> None:
    """isolate(): a partition around the leader. Its clients still reach it, but it cannot reach the controller or
    its followers: the controller fences it and elects an ISR member, the rest of the cluster goes on with acks=all,
    and what the cut-off leader acknowledged with acks=1 alone is gone once heal() lets it follow the new leader
    (Kafka's rule for acks=1). Every acks=all acknowledgement, on either side, is in the final log exactly once."""
    cluster = kbroker_cluster_factory(brokers=3, network_faults=True)
    topic = "partitioned"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    created = admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})]
    )
    created[topic].result(WITHIN)
    before = wait_for("full ISR", lambda: (p := partition_zero(admin, topic)) and len(p.isrs) == 3 and p)
    isolated = cluster.broker(before.leader)
    others = [b for b in cluster.brokers if b.node_id != before.leader]
    _, epoch, _ = answered_at(others[0].bootstrap, topic)

    acknowledged: list[tuple[int, bytes]] = []  # acks=all, either side
    one_only: list[bytes] = []  # acks=1 at the isolated leader

    def producer(bootstrap: str, acks: str, into: Callable[[Any], None]) -> Any:
        settings = {"bootstrap.servers": bootstrap, "acks": acks, "message.timeout.ms": 20000}
        settings["enable.idempotence"] = acks == "all"
        made = Producer(settings)
        return made, lambda err, msg: err is None and into(msg)

    everyone, on_all = producer(cluster.bootstrap, "all", lambda m: acknowledged.append((m.offset(), m.value())))
    for n in range(10):
        everyone.produce(topic, value=f"before-{n}".encode(), partition=0, on_delivery=on_all)
    assert everyone.flush(WITHIN) == 0 and len(acknowledged) == 10

    isolated.isolate()
    cut_off_all, on_cut_off_all = producer(
        isolated.bootstrap, "all", lambda m: acknowledged.append((m.offset(), m.value()))
    )
    cut_off_one, on_cut_off_one = producer(isolated.bootstrap, "1", lambda m: one_only.append(m.value()))
    for n in range(5):
        cut_off_one.produce(topic, value=f"acks-1-{n}".encode(), partition=0, on_delivery=on_cut_off_one)
        cut_off_all.produce(topic, value=f"cut-off-{n}".encode(), partition=0, on_delivery=on_cut_off_all)
    assert cut_off_one.flush(WITHIN) == 0
    # Nothing tells the cut-off leader it is no longer one: it acknowledges acks=1 writes alone, as Kafka's would.
    assert one_only == [f"acks-1-{n}".encode() for n in range(5)]

    # The controller, no longer hearing from it, fences it and elects another ISR member at a newer epoch. A
    # producer started now knows the majority's brokers only (the fenced one is in no Metadata answer of theirs).
    new_leader, new_epoch, _ = wait_for(
        "a new leader",
        lambda: (a := answered_at(others[0].bootstrap, topic))[0] not in (-1, before.leader) and a,
    )
    assert new_leader in before.isrs and new_epoch > epoch
    majority_side, on_majority = producer(
        ",".join(b.bootstrap for b in others), "all", lambda m: acknowledged.append((m.offset(), m.value()))
    )
    for n in range(10):
        majority_side.produce(topic, value=f"after-{n}".encode(), partition=0, on_delivery=on_majority)
    assert majority_side.flush(WITHIN) == 0

    cluster.heal()
    cut_off_all.flush(WITHIN)  # its records time out, or reach the new leader once the partition heals
    wait_for("the healed broker back in the ISR", lambda: len(answered_at(others[0].bootstrap, topic)[2]) == 3)

    leader_log = replica_values(cluster.broker(new_leader), topic)
    assert sorted(acknowledged) == [r for r in leader_log if r in set(acknowledged)]  # each once, in order
    assert {value for _, value in leader_log} >= {value for _, value in acknowledged}
    assert len({value for _, value in leader_log}) == len(leader_log)  # no duplicate
    assert not set(one_only) & {value for _, value in leader_log}  # acks=1 at the cut-off leader: gone
    # The healed broker truncated its own tail and holds the new leader's log (up to where it has fetched).
    wait_for(
        "the healed replica caught up",
        lambda: replica_values(isolated, topic)[: len(leader_log)] == leader_log,
    )


def test_marker_and_factory_make_clusters_of_their_own_stopped_in_order(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A marked test and the factory get clusters of the size and settings asked; the module's cluster is whole
    again after a test that took its brokers down. At the end the brokers stop first, with a controlled shutdown
    (which needs the controller up), and the controller after them."""
    report = pytester.path / "report.jsonl"
    monkeypatch.setenv("CLUSTER_REPORT", str(report))
    pytester.makepyfile(
        """
        import json, os, time
        import pytest
        from confluent_kafka.admin import AdminClient, ConfigResource
        from kbroker.wire_client import WireClient
        from protocol.messages.metadata_request import MetadataRequest

        def facts(cluster, name):
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            brokers = sorted(admin.list_topics(timeout=10).brokers)
            resource = ConfigResource("broker", str(brokers[-1]))
            configs = admin.describe_configs([resource])[resource].result(30)
            with open(os.environ["CLUSTER_REPORT"], "a") as out:
                out.write(json.dumps({
                    "test": name, "brokers": brokers,
                    "num.partitions": configs["num.partitions"].value,
                    "delay": configs["group.initial.rebalance.delay.ms"].value,
                    "directory": str(cluster.directory),
                    "pids": [b.pid for b in cluster.brokers] + [cluster.controller_pid],
                }) + "\\n")

        @pytest.mark.kbroker_cluster(brokers=1, config={"num.partitions": 4})
        def test_marker(kbroker_cluster):
            facts(kbroker_cluster, "marker")

        def test_factory(kbroker_cluster_factory):
            cluster = kbroker_cluster_factory(brokers=2, config={"num.partitions": 2, "default.replication.factor": 2})
            facts(cluster, "factory")
            # A topic auto-created by Metadata gets default.replication.factor replicas (Kafka's broker setting).
            wanted = [MetadataRequest.MetadataRequestTopic(name="auto-made")]
            request = MetadataRequest(topics=wanted, allow_auto_topic_creation=True)
            for _ in range(600):
                with WireClient(cluster.broker(1).bootstrap) as client:
                    [topic] = client.request(request, 12).topics
                if topic.error_code == 0 and topic.partitions:
                    break
                time.sleep(0.2)
            with open(os.environ["CLUSTER_REPORT"], "a") as out:
                replicas = sorted(len(p.replica_nodes) for p in topic.partitions)
                out.write(json.dumps({"test": "auto-created", "replicas": replicas}) + "\\n")

        def test_takes_brokers_down(kbroker_cluster):
            kbroker_cluster.broker(1).kill()
            kbroker_cluster.broker(2).pause()
            kbroker_cluster.broker(3).stop()

        def test_finds_them_back(kbroker_cluster):
            facts(kbroker_cluster, "shared")
        """
    )
    pytester.runpytest().assert_outcomes(passed=4)
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    seen = {entry["test"]: entry for entry in lines}
    assert seen.pop("auto-created") == {"test": "auto-created", "replicas": [2, 2]}
    assert {name: (e["brokers"], e["num.partitions"], e["delay"]) for name, e in seen.items()} == {
        "marker": ([1], "4", "0"),
        "factory": ([1, 2], "2", "0"),
        "shared": ([1, 2, 3], "1", "0"),  # the module's cluster, every broker back for the next test
    }
    for entry in seen.values():
        assert None not in entry["pids"]  # each node was running when the test looked
        for pid in entry["pids"]:
            assert not Path(f"/proc/{pid}").exists()  # every process stopped and reaped
        for broker in entry["brokers"]:
            log = (Path(entry["directory"]) / f"broker-{broker}" / "broker.log").read_text()
            assert "controlled shutdown allowed by the controller quorum" in log


def test_without_java_a_test_asking_for_a_cluster_skips_saying_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(pytester.mkdir("empty-path")))
    pytester.makepyfile(
        """
        def test_uses_it(kbroker_cluster):
            raise AssertionError("never reached")

        def test_factory(kbroker_cluster_factory):
            kbroker_cluster_factory(brokers=1)
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=2)
    reason = "kbroker_cluster cannot run here: Kafka's KRaft controller needs Java 17+ and there is no java: apt-get"
    result.stdout.fnmatch_lines([f"*{reason}*"])


def test_a_scope_that_is_not_one_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_a(kbroker_cluster):\n    pass\n")
    pytester.makeini("[pytest]\nkbroker_cluster_scope = class\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*kbroker_cluster_scope = 'class': expected one of module, session, function*"])


def test_the_plugin_imports_nothing_of_the_cluster_until_asked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import sys

        def test_nothing_imported():
            assert "kbroker.kraft.local_cluster" not in sys.modules
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)
