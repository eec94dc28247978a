"""A real full disk: a small tmpfs as the data directory, filled while a stock producer (confluent-kafka, acks=all)
writes and a stock consumer commits offsets. The producer gets KAFKA_STORAGE_ERROR for what could not be written,
commits that cannot be journalled are refused, and after freeing the space and a restart every acknowledged
record is there at its offset, every acknowledged commit too, and new records take the next offsets.

Mounting needs root. Without it the test runs itself again in a user and mount namespace
(``unshare --user --map-root-user --mount``), where it is root; it skips, printing why, only if neither works.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")

from kbroker.storage.manager import LogManager  # noqa: E402
from kbroker.testing import RunningBroker  # noqa: E402
from kbroker.wire_client import WireClient  # noqa: E402
from protocol.messages.create_topics_request import CreateTopicsRequest  # noqa: E402

TOPIC = "filling"
TMPFS_BYTES = 6 << 20
LEFT_FREE = 700 << 10  # what the filler file leaves for the broker
VALUE = b"x" * 1000
INSIDE_NAMESPACE = "KBROKER_DISK_FULL_IN_NAMESPACE"


def _mount_tmpfs(mount_point: Path) -> str | None:
    """Mount a small tmpfs; None if mounted, else why not."""
    if os.geteuid() != 0:
        return "not root"
    mount = shutil.which("mount")
    if mount is None:
        return "no mount command"
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    return None if done.returncode == 0 else f"mount -t tmpfs failed: {done.stderr.strip()}"


@contextlib.contextmanager
def small_tmpfs(mount_point: Path) -> Iterator[Path]:
    """A small tmpfs mounted at ``mount_point`` (skips, saying why, if it cannot be); unmounted at the end."""
    mount_point.mkdir()
    problem = _mount_tmpfs(mount_point)
    if problem is not None:
        pytest.skip(f"cannot mount a tmpfs ({problem})")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(data_dir: Path) -> Path:
    """A filler file taking all but LEFT_FREE bytes of the file system."""
    stat = os.statvfs(data_dir)
    filler = data_dir / "filler"
    size = stat.f_bavail * stat.f_frsize - LEFT_FREE
    with open(filler, "wb") as f:
        f.write(b"\0" * size)
    return filler


def _fill_completely(data_dir: Path) -> Path:
    """A second filler file taking every byte left."""
    filler = data_dir / "filler-rest"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def _produce(bootstrap: str, count: int, prefix: str) -> tuple[dict[int, bytes], list[str]]:
    """(acknowledged offset -> value, error names of what was not acknowledged)."""
    acked: dict[int, bytes] = {}
    errors: list[str] = []

    def delivered(error: object, message: object) -> None:
        if error is None:
            acked[message.offset()] = message.value()  # type: ignore[attr-defined]
        else:
            errors.append(error.name())  # type: ignore[attr-defined]

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "retries": 0,  # the broker's answer reaches the application as it is
            "enable.idempotence": False,
            "linger.ms": 5,
            "batch.num.messages": 20,
            "message.timeout.ms": 20_000,
        }
    )
    for i in range(count):
        producer.produce(TOPIC, value=f"{prefix}{i:06d}".encode() + VALUE, partition=0, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    return acked, errors


def _commit(bootstrap: str, offset: int) -> str | None:
    """Commit ``offset`` for group g; None when acknowledged, else the error's name."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[confluent_kafka.TopicPartition(TOPIC, 0, offset)], asynchronous=False)
    except confluent_kafka.KafkaException as exc:
        return str(exc.args[0].name())
    finally:
        consumer.close()
    return None


def _committed(bootstrap: str) -> int:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "g"})
    try:
        return int(consumer.committed([confluent_kafka.TopicPartition(TOPIC, 0)], timeout=10)[0].offset)
    finally:
        consumer.close()


def _consume_all(bootstrap: str, end: int) -> dict[int, bytes]:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}", "enable.auto.commit": False}
    )
    records: dict[int, bytes] = {}
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
        misses = 0
        while len(records) < end and misses < 20:
            message = consumer.poll(0.5)
            if message is None:
                misses += 1
                continue
            assert message.error() is None, message.error()
            records[message.offset()] = message.value()
    finally:
        consumer.close()
    return records


def _run_in_namespace() -> None:
    """Not root: run this test again as root of a new user and mount namespace, or skip saying why."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("not root and no unshare command: cannot mount a tmpfs")
    probe = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"not root, and unshare --user --map-root-user --mount fails: {probe.stderr.strip()}")
    test = f"{__file__}::test_a_full_disk_loses_nothing_acknowledged_across_the_fill_the_freeing_and_a_restart"
    done = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", sys.executable, "-m", "pytest", "-q", "-x", test],
        env={**os.environ, INSIDE_NAMESPACE: "1"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_a_full_disk_loses_nothing_acknowledged_across_the_fill_the_freeing_and_a_restart(tmp_path: Path) -> None:
    if os.geteuid() != 0 and not os.environ.get(INSIDE_NAMESPACE):
        _run_in_namespace()
        return
    with small_tmpfs(tmp_path / "data") as data_dir:
        _fill_and_check(data_dir)


def _fill_and_check(data_dir: Path) -> None:
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        topic = CreateTopicsRequest.CreatableTopic(name=TOPIC, num_partitions=1, replication_factor=1)
        assert client.request(CreateTopicsRequest(topics=[topic], timeout_ms=5000), 7).topics[0].error_code == 0
        before, errors = _produce(broker.bootstrap, 100, "before")
        assert (sorted(before), errors) == (list(range(100)), [])
        assert _commit(broker.bootstrap, 100) is None

        filler = _fill(data_dir)
        acked, errors = _produce(broker.bootstrap, 2000, "filling")
        # Some of it fit; the rest was refused with the storage error (or not sent once the batch it was in failed).
        assert acked and errors
        assert set(errors) <= {"KAFKA_STORAGE_ERROR"}, set(errors)
        assert sorted(acked) == list(range(100, 100 + len(acked)))  # no gap, no offset used twice
        assert broker.broker is not None
        logs = broker.broker.logs
        assert isinstance(logs, LogManager)
        # Take the last free bytes too; the offsets journal then fills its last page and the commits fail
        # (NOT_COORDINATOR); the committed offset is the last one acknowledged.
        last_filler = _fill_completely(data_dir)
        last_acked_commit, refused = 100, None
        for offset in range(101, 300):
            refused = _commit(broker.bootstrap, offset)
            if refused is not None:
                break
            last_acked_commit = offset
        assert refused == "NOT_COORDINATOR", refused
        assert _committed(broker.bootstrap) == last_acked_commit
        last_filler.unlink()

        filler.unlink()
        offline = logs.dir_health.offline
        after_freeing, errors = _produce(broker.bootstrap, 1, "freed")
        if offline:  # writes kept failing: the directory stays offline until the restart, as Kafka's
            assert (after_freeing, errors) == ({}, ["KAFKA_STORAGE_ERROR"])
        else:
            assert list(after_freeing) == [100 + len(acked)]
        acked.update(after_freeing)
        # Offline, the directory takes no offset commit either: NOT_COORDINATOR, Kafka's answer to an append to an
        # offline log dir (KAFKA_STORAGE_ERROR), until the restart.
        assert _commit(broker.bootstrap, 160) == ("NOT_COORDINATOR" if offline else None)
        final_commit = last_acked_commit if offline else 160
    acknowledged = {offset: value for offset, value in {**before, **acked}.items()}
    end = max(acknowledged) + 1
    with RunningBroker(data_dir) as broker:
        found = _consume_all(broker.bootstrap, end)
        assert {o: found.get(o) for o in acknowledged} == acknowledged  # every acknowledged record, as it was
        assert set(found) == set(range(end))  # and nothing else in between
        assert _committed(broker.bootstrap) == final_commit
        again, errors = _produce(broker.bootstrap, 10, "restarted")
        assert (sorted(again), errors) == (list(range(end, end + 10)), [])
