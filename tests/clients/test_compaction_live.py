"""Log compaction against a live broker (issue #17, "How it is proven"): a KTable-style changelog compacts to
one record per key and a new consumer of each client family (Java kafka-clients 4.3, librdkafka through
confluent-kafka, kafka-python 3) rebuilds exactly the latest value per key from it; and a compacted topic's
disk use stays bounded while a gigabyte of updates to the same keys is written.

The broker is a ``kbroker serve`` child process (BrokerProcess): its log cleaner then has a core of its own
rather than sharing the test process's interpreter with the producer. Its cleaner backs off 100 ms when
nothing is dirty (log.cleaner.backoff.ms, 15 s by default). Records are produced with confluent-kafka (the
fastest client here) and read back through the compat suite's client processes (compat/clients/,
compat/java/CompatDriver.java), whose ``read`` is a fresh consumer assigned the partition from offset 0.
What the partition holds is checked independently of any client by compat/reference.py (raw Fetch requests).
"""

from __future__ import annotations

import os
import random
import string
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from compat.clients import CLIENT_SPECS, ClientUnavailable
from compat.java import CLIENT_SPECS as JAVA_SPECS
from compat.reference import Reference, StoredRecord
from kbroker.testing import BrokerProcess

CLEANER = {"log.cleaner.backoff.ms": "100"}
READERS = {spec.name: spec for spec in [*CLIENT_SPECS, *JAVA_SPECS]}
CHANGELOG_READERS = ["java-4.4", "confluent-kafka", "kafka-python-3"]
PRODUCER = {"linger.ms": 20, "batch.size": 1_000_000, "acks": "all", "enable.idempotence": False}

Placed = tuple[int, str, str]  # (offset, key, value) as the broker acknowledged it


def start_broker(directory: Path) -> BrokerProcess:
    # INFO: the cleaner's pass summaries ("cleaned ... MB read in ...") land in <data>.log, shown on failure.
    return BrokerProcess(directory / "data", CLEANER, log_level="INFO").start()


def produce(bootstrap: str, topic: str, updates: Iterator[tuple[str, bytes]]) -> list[tuple[int, bytes, bytes]]:
    """Send every (key, value) to partition 0 in order; the (offset, key, value) the broker acknowledged."""
    acknowledged: list[tuple[int, bytes, bytes]] = []
    errors: list[str] = []

    def delivered(error: object, message: object) -> None:
        if error is not None:
            errors.append(str(error))
        else:
            acknowledged.append((message.offset(), message.key(), message.value()))  # type: ignore[attr-defined]

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER, "on_delivery": delivered})
    for key, value in updates:
        while True:
            try:
                producer.produce(topic, value, key.encode(), partition=0)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    assert producer.flush(120) == 0 and not errors, errors[:3]
    return acknowledged


def log_tail(broker: BrokerProcess) -> str:
    return broker.log_path.read_text(errors="replace")[-3000:]


def segment_bases(partition_dir: Path) -> list[int]:
    return sorted(int(p.name.removesuffix(".log")) for p in partition_dir.glob("*.log"))


# --- the KTable changelog -----------------------------------------------------------------------------------

CHANGELOG_KEYS = 1_000
CHANGELOG_UPDATES = 100_000


class Changelog:
    def __init__(self, broker: BrokerProcess, topic: str, placed: list[Placed], stored: list[StoredRecord]):
        self.broker = broker
        self.topic = topic
        self.placed = placed
        self.stored = stored

    @property
    def table(self) -> dict[str, str]:
        """What a KTable holds after every update: the latest value per key."""
        return {key: value for _, key, value in self.placed}


@pytest.fixture(scope="module")
def changelog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Changelog]:
    """100,000 updates over 1,000 keys (a key drawn at random for each) to a compacted topic whose segments
    roll every 256 KiB, compacted by the broker's cleaner; the records the partition holds afterwards."""
    broker = start_broker(tmp_path_factory.mktemp("compaction-changelog"))
    reference = Reference(broker.bootstrap)
    try:
        topic = "ktable-changelog"
        configs = {"cleanup.policy": "compact", "segment.bytes": str(256 * 1024), "min.cleanable.dirty.ratio": "0.01"}
        reference.create_topic(topic, 1, configs)
        draw = random.Random(17)
        keys = [f"key-{draw.randrange(CHANGELOG_KEYS):04d}" for _ in range(CHANGELOG_UPDATES)]
        sent = produce(broker.bootstrap, topic, ((key, f"{key}:{n}".encode()) for n, key in enumerate(keys)))
        placed = [(offset, key.decode(), value.decode()) for offset, key, value in sorted(sent)]
        assert [offset for offset, _, _ in placed] == list(range(CHANGELOG_UPDATES))
        assert [key for _, key, _ in placed] == keys  # acknowledged in the order sent
        assert len(set(keys)) == CHANGELOG_KEYS

        # The cleaner never touches the active segment; below it, each key keeps only its latest record.
        bases = segment_bases(broker.data_dir / f"{topic}-0")
        active = bases[-1]
        assert active > 0, f"no segment rolled: {bases}"
        below: dict[str, Placed] = {}
        for offset, key, value in placed[:active]:
            below[key] = (offset, key, value)
        expected = sorted(below.values()) + placed[active:]

        deadline = time.monotonic() + 120
        while True:
            stored = reference.records(topic, 0)
            if [(r.offset, r.key, r.value) for r in stored] == expected:
                break
            assert time.monotonic() < deadline, (
                f"not compacted in 120 s: {len(stored)} records stored, {len(expected)} expected\n{log_tail(broker)}"
            )
            time.sleep(0.2)
        assert segment_bases(broker.data_dir / f"{topic}-0")[-1] == active  # nothing appended since
        yield Changelog(broker, topic, placed, stored)
    finally:
        reference.close()
        broker.stop()


def test_the_changelog_compacts_to_one_record_per_key_below_the_active_segment(changelog: Changelog) -> None:
    active = segment_bases(changelog.broker.data_dir / f"{changelog.topic}-0")[-1]
    cleaned = [r for r in changelog.stored if r.offset < active]
    assert len({r.key for r in cleaned}) == len(cleaned)  # exactly one record per key
    # ... and it is that key's latest record below the active segment; the active segment is as written.
    latest_below = {key: offset for offset, key, _ in changelog.placed[:active]}
    assert {r.key: r.offset for r in cleaned} == latest_below
    assert [(r.offset, r.key, r.value) for r in changelog.stored if r.offset >= active] == changelog.placed[active:]
    # At most 1,000 records plus those of the active segment remain of 100,000.
    assert len(changelog.stored) <= CHANGELOG_KEYS + (CHANGELOG_UPDATES - active)
    assert len(changelog.stored) < CHANGELOG_UPDATES // 5


@pytest.mark.parametrize("reader", CHANGELOG_READERS)
def test_a_new_consumer_rebuilds_the_latest_value_per_key(changelog: Changelog, reader: str) -> None:
    try:
        client = READERS[reader].start(changelog.broker.bootstrap)
    except ClientUnavailable as exc:
        pytest.skip(f"client {reader} cannot run here: {exc}")
    try:
        # A fresh consumer assigned the partition from offset 0, reading as many records as it holds (and
        # every one of them: the gaps the cleaner left are skipped).
        count = len(changelog.stored)
        got = client.read(topic=changelog.topic, partition=0, offset=0, count=count, settings={"timeout_ms": 60_000})
    finally:
        client.close()
    assert [(r["offset"], r["key"], r["value"]) for r in got] == [(r.offset, r.key, r.value) for r in changelog.stored]
    table = {r["key"]: r["value"] for r in got}
    assert len(table) == CHANGELOG_KEYS
    assert table == changelog.table


# --- bounded disk ------------------------------------------------------------------------------------------

DISK_KEYS = 100
VALUE_BYTES = 10_000
DISK_UPDATES = 100_000  # x 10 KB: 1 GB of updates
DISK_SEGMENT = 8 * 1024 * 1024
# Without compaction the partition would hold the whole gigabyte. Compacted, it holds the live set (100 keys x
# 10 KB = 1 MB) in the cleaned segments, the active segment (up to 8 MiB), the sealed segments written since
# the cleaner's last pass began, and that pass's replacement files (at most the live set again). The cleaner
# keeps up when it reads faster than the producer writes; 16 segments' worth (128 MiB) leaves room for a pass
# that lags behind a burst a dozen segments long, and is still an eighth of what an uncompacted log would hold.
DISK_BOUND = 16 * DISK_SEGMENT


class DiskSampler:
    """The partition's log bytes on disk (``.log`` files, and the cleaner's ``.log.cleaned``/``.log.swap``
    replacements being written) every 20 ms in a thread; keeps the largest."""

    def __init__(self, partition_dir: Path) -> None:
        self.partition_dir = partition_dir
        self.largest = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def size(self) -> int:
        total = 0
        with os.scandir(self.partition_dir) as entries:
            for entry in entries:
                if ".log" in entry.name:
                    try:
                        total += entry.stat().st_size
                    except FileNotFoundError:  # swapped or deleted since the listing
                        pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.largest = max(self.largest, self.size())
            self.samples += 1

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_a_compacted_topic_stays_bounded_on_disk_under_a_gigabyte_of_updates(tmp_path: Path) -> None:
    """1 GB of updates (100,000 values of 10 KB over 100 keys, cycling) to a compacted topic with 8 MiB
    segments; the partition's log files never exceed DISK_BOUND while they are written, and a new consumer
    then reads exactly the latest value of each key. The whole gigabyte, as the issue asks: about 7 s on a
    2-core machine (the producer writes ~180 MB/s, the cleaner reads ~200 MB/s; the peak seen is ~53 MiB)."""
    broker = start_broker(tmp_path)
    reference = Reference(broker.bootstrap)
    try:
        topic = "bounded"
        configs = {"cleanup.policy": "compact", "segment.bytes": str(DISK_SEGMENT), "min.cleanable.dirty.ratio": "0.1"}
        reference.create_topic(topic, 1, configs)
        filler = "".join(random.Random(1).choices(string.ascii_letters, k=VALUE_BYTES)).encode()

        def value(n: int) -> bytes:
            header = f"{n % DISK_KEYS}:{n}|".encode()
            return header + filler[len(header) :]

        updates = ((f"key-{n % DISK_KEYS:03d}", value(n)) for n in range(DISK_UPDATES))
        partition_dir = broker.data_dir / f"{topic}-0"
        with DiskSampler(partition_dir) as disk:
            sent = produce(broker.bootstrap, topic, updates)
        assert len(sent) == DISK_UPDATES and sorted(o for o, _, _ in sent) == list(range(DISK_UPDATES))
        assert disk.samples >= 20  # sampled all along (every 20 ms)
        assert disk.largest < DISK_BOUND, (
            f"{disk.largest / 2**20:.0f} MiB on disk at most (bound {DISK_BOUND / 2**20:.0f} MiB)\n{log_tail(broker)}"
        )
        # Every record of the log was stored once: 1 GB went through a partition that never held 128 MiB.
        assert DISK_UPDATES * VALUE_BYTES > 7 * DISK_BOUND

        # Once the cleaner has caught up, each key is held once below the active segment (which the cleaner
        # never touches), and a new consumer reading the partition to its end gets the latest value of each.
        active = segment_bases(partition_dir)[-1]
        deadline = time.monotonic() + 60
        while True:
            stored = reference.records(topic, 0)
            cleaned = [r.key for r in stored if r.offset < active]
            if len(cleaned) == len(set(cleaned)):
                break
            assert time.monotonic() < deadline, f"not compacted in 60 s\n{log_tail(broker)}"
            time.sleep(0.2)
        assert len(cleaned) <= DISK_KEYS and segment_bases(partition_dir)[-1] == active
        client = READERS["confluent-kafka"].start(broker.bootstrap)
        try:
            got = client.read(topic=topic, partition=0, offset=0, count=len(stored), settings={"timeout_ms": 60_000})
        finally:
            client.close()
        assert [r["offset"] for r in got] == [r.offset for r in stored]
        latest = {f"key-{n % DISK_KEYS:03d}": value(n).decode() for n in range(DISK_UPDATES - DISK_KEYS, DISK_UPDATES)}
        assert {r["key"]: r["value"] for r in got} == latest
    finally:
        reference.close()
        broker.stop()
