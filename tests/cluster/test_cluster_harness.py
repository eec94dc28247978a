"""The harness itself (tests/cluster/harness.py): what each broker operation does to the process, that the
fixture puts a broker back after a test and reports one that died on its own, and that closing a cluster
leaves no process, thread or listener behind."""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

import pytest

from kbroker.wire_client import WireClient
from protocol.messages.api_versions_request import ApiVersionsRequest
from tests.cluster.harness import Cluster, ClusterBroker, process_state, wait_for

pytestmark = pytest.mark.cluster(size=1)


def answers(bootstrap: str) -> bool:
    """The broker behind ``bootstrap`` answers ApiVersions."""
    with WireClient(bootstrap, timeout=60) as client:
        return client.request(ApiVersionsRequest(), 0).error_code == 0


def exited(pid: int) -> bool:
    try:
        return process_state(pid) == "Z"  # a zombie until its parent reaps it
    except FileNotFoundError:
        return True


def test_pause_freezes_the_process_and_resume_thaws_it(cluster: Cluster) -> None:
    (broker,) = cluster.brokers
    broker.pause()
    assert process_state(broker.pid) == "T"
    broker.resume()
    assert process_state(broker.pid) != "T"
    assert answers(broker.bootstrap)


def test_a_paused_broker_can_be_killed_or_stopped(cluster: Cluster) -> None:
    (broker,) = cluster.brokers
    broker.pause()
    pid = broker.pid
    broker.kill()
    assert exited(pid)
    broker.start()
    broker.pause()
    pid = broker.pid
    broker.stop()  # resumed first, so SIGTERM is delivered and it drains
    assert exited(pid)
    broker.start()
    assert answers(broker.bootstrap)


def test_restart_keeps_the_proxy_address_and_the_node_id(cluster: Cluster) -> None:
    (broker,) = cluster.brokers
    bootstrap, pid = broker.bootstrap, broker.pid
    broker.restart()
    assert broker.pid != pid
    assert broker.bootstrap == bootstrap
    assert answers(broker.bootstrap)
    assert broker.process.overrides["node.id"] == str(broker.node_id)


def test_restore_brings_back_a_broker_that_died_and_says_so(cluster: Cluster) -> None:
    (broker,) = cluster.brokers
    broker.isolate()
    os.kill(broker.pid, signal.SIGKILL)  # behind the harness's back, as a crash would be
    wait_for(lambda: broker.exit_code() is not None, "the broker exited")
    with pytest.raises(AssertionError, match=f"broker {broker.node_id} exited with -9"):
        cluster.restore()
    assert broker.state == "running"
    assert answers(broker.bootstrap)  # healed, too


def test_a_taken_port_is_replaced_at_start(cluster: Cluster) -> None:
    (broker,) = cluster.brokers
    broker.stop()
    with socket.create_server(("127.0.0.1", broker.process.port)) as squatter:
        taken = squatter.getsockname()[1]
        broker.start()
        assert broker.process.port != taken
        assert answers(broker.bootstrap)


def test_closing_a_cluster_stops_its_processes_threads_and_listeners(tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    cluster = Cluster(tmp_path, size=2).start()
    brokers: list[ClusterBroker] = list(cluster.brokers)
    pids = [broker.pid for broker in brokers]
    brokers[0].pause()
    cluster.close()
    assert all(exited(pid) for pid in pids)
    assert set(threading.enumerate()) == threads_before
    for broker in brokers:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(broker.proxy.address, timeout=30)
