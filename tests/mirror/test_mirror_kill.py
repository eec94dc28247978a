"""``kill -9`` of ``kbroker mirror`` mid-stream loses nothing: the mirror runs as its own process while a producer
writes, is killed with SIGKILL, is started again, and every source record is in the target. At-least-once may
copy some records twice (counted and bounded by one batch per partition); --exactly-once copies each once, as a
read_committed consumer sees the target."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.testing import RunningBroker
from tests.mirror.conftest import create_topic, produce, read_all

RECORDS = 3000
PARTITIONS = 3
REPOSITORY = Path(__file__).resolve().parents[2]


def mirror_process(source: str, target: str, *extra: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "kbroker", "mirror", "--source", source, "--target", target, "--topics", "feed",
               "--report-interval", "0.5", "--refresh-interval", "1", *extra]  # fmt: skip
    return subprocess.Popen(command, cwd=REPOSITORY, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def target_end(bootstrap: str, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        if not consumer.partitions_for_topic(topic):
            return 0
        return sum(consumer.end_offsets(partitions).values())
    finally:
        consumer.close()


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_kill_9_mid_stream_loses_nothing(broker_factory: Callable[..., RunningBroker], exactly_once: bool) -> None:
    source, target = broker_factory().bootstrap, broker_factory().bootstrap
    create_topic(source, "feed", PARTITIONS)
    mode = ("--exactly-once",) if exactly_once else ()

    def write() -> None:  # 30 batches, slowly enough that the mirror is killed while records still arrive
        for batch in range(30):
            produce(source, "feed", [(i % PARTITIONS, None, f"r{batch * 100 + i}".encode(), [], None)
                                     for i in range(100)])  # fmt: skip
            time.sleep(0.05)

    writer = threading.Thread(target=write)
    writer.start()
    mirror = mirror_process(source, target, *mode)
    try:
        deadline = time.monotonic() + 30
        while target_end(target, "source.feed") < 300:  # it is copying
            assert mirror.poll() is None, mirror.communicate()[1].decode()
            assert time.monotonic() < deadline, "the mirror copied nothing in 30 s"
            time.sleep(0.1)
        os.kill(mirror.pid, signal.SIGKILL)
        assert mirror.wait(10) == -signal.SIGKILL
    finally:
        if mirror.poll() is None:
            mirror.kill()
        mirror.communicate()
        writer.join()

    restarted = mirror_process(source, target, "--once", *mode)
    _out, err = restarted.communicate(timeout=60)
    assert restarted.returncode == 0, err.decode()

    written = Counter(value for *_, value, _h, _t in read_all(source, "feed"))
    copied = Counter(value for *_, value, _h, _t in read_all(target, "source.feed"))
    assert sum(written.values()) == RECORDS and len(written) == RECORDS
    assert set(copied) == set(written)  # every source record is in the target
    duplicates = sum(copied.values()) - RECORDS
    print(f"{duplicates} records copied twice after the kill")
    if exactly_once:
        assert duplicates == 0
        # and in the same order, partition by partition
        by_partition = [(p, v) for p, _o, _k, v, _h, _t in read_all(target, "source.feed")]
        assert by_partition == [(p, v) for p, _o, _k, v, _h, _t in read_all(source, "feed")]
    else:
        assert duplicates <= 2000  # at most the batch in flight when it was killed (one poll: 2000 records)
    assert b"kbroker mirror: " in err and b"records copied; lag 0:" in err


def test_sigterm_flushes_commits_and_exits(broker_factory: Callable[..., RunningBroker]) -> None:
    source, target = broker_factory().bootstrap, broker_factory().bootstrap
    create_topic(source, "feed", PARTITIONS)
    produce(source, "feed", [(i % PARTITIONS, None, f"r{i}".encode(), [], None) for i in range(90)])
    mirror = mirror_process(source, target)
    try:
        deadline = time.monotonic() + 30
        while target_end(target, "source.feed") < 90:
            assert mirror.poll() is None, mirror.communicate()[1].decode()
            assert time.monotonic() < deadline, "the mirror copied nothing in 30 s"
            time.sleep(0.1)
        mirror.send_signal(signal.SIGTERM)
        _out, err = mirror.communicate(timeout=30)
    finally:
        if mirror.poll() is None:
            mirror.kill()
            mirror.communicate()
    assert mirror.returncode == 0, err.decode()
    last_line = err.decode().splitlines()[-1]
    assert last_line == "kbroker mirror: 90 records copied; lag 0: feed-0=0 feed-1=0 feed-2=0"
    # its progress was committed: a second run has nothing to copy
    again = mirror_process(source, target, "--once")
    _out, err = again.communicate(timeout=60)
    assert again.returncode == 0 and err.decode().splitlines()[-1] == (
        "kbroker mirror: 0 records copied; lag 0: feed-0=0 feed-1=0 feed-2=0"
    )
