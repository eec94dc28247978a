"""The offsets journal of older kbrokers is migrated once into __consumer_offsets at start-up
(kbroker/coordinators/migration.py): nothing is lost, a cut-short migration finishes, an ambiguous or damaged
directory stops start-up with one line.

The old data directory is written by the code of the last commit that kept the journal, run as a subprocess."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kbroker.coordinators.migration import (
    LEGACY_DIRECTORY,
    LEGACY_JOURNAL,
    LEGACY_TRANSACTIONS_DIRECTORY,
    LEGACY_TRANSACTIONS_JOURNAL,
    MIGRATION_STARTED,
    migrate_offsets_journal,
)
from kbroker.groups.offsets import OFFSETS_TOPIC, CommittedOffset, OffsetStore
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.messages.list_transactions_request import ListTransactionsRequest

JOURNAL_COMMIT = "c7802a9"  # main before __consumer_offsets: committed offsets in offsets.journal
REPOSITORY = Path(__file__).resolve().parents[2]
COMMITS = {"alpha": {0: 11, 1: 22}, "beta": {1: 5}}
TRANSACTIONAL_ID = "migrated-txn"


def checkout(commit: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPOSITORY), "archive", commit], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def serve_old(code: Path, data_dir: Path) -> subprocess.Popen[bytes]:
    ready = data_dir.with_name("old.ready")
    command = [sys.executable, "-m", "kbroker", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)]
    env = {**os.environ, "PYTHONPATH": str(code)}
    process = subprocess.Popen([*command, "--ready-file", str(ready)], cwd=code, env=env, stderr=subprocess.PIPE)
    for _ in range(3000):
        if ready.exists() and ready.read_text().strip():
            process.bootstrap = ready.read_text().strip()  # type: ignore[attr-defined]
            return process
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        subprocess.run(["sleep", "0.01"])
    process.kill()
    raise AssertionError("the old kbroker did not start")


@pytest.fixture(scope="module")
def old_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data directory of the old code holding COMMITS, committed with confluent-kafka."""
    root = tmp_path_factory.mktemp("old")
    code = checkout(JOURNAL_COMMIT, root / "code")
    data_dir = root / "data"
    process = serve_old(code, data_dir)
    try:
        bootstrap = process.bootstrap  # type: ignore[attr-defined]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("orders", 2, 1)])["orders"].result(timeout=30)
        for group, offsets in COMMITS.items():
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
            wanted = [TopicPartition("orders", p, o) for p, o in offsets.items()]
            consumer.commit(offsets=wanted, asynchronous=False)
            consumer.close()
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": TRANSACTIONAL_ID})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce("orders", b"in a transaction", partition=0)
        producer.commit_transaction(30)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert (data_dir / LEGACY_DIRECTORY / LEGACY_JOURNAL).stat().st_size > 0  # the old code's journals
    assert (data_dir / LEGACY_TRANSACTIONS_DIRECTORY / LEGACY_TRANSACTIONS_JOURNAL).stat().st_size > 0
    assert not (data_dir / f"{OFFSETS_TOPIC}-0").exists()
    yield data_dir


def committed(bootstrap: str) -> dict[str, dict[int, int]]:
    found = {}
    for group in COMMITS:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        offsets = consumer.committed([TopicPartition("orders", p) for p in (0, 1)], timeout=30)
        consumer.close()
        found[group] = {tp.partition: tp.offset for tp in offsets if tp.offset >= 0}
    return found


def transactions(bootstrap: str) -> list[tuple[str, int, str]]:
    with WireClient(bootstrap) as client:
        listed = client.request(ListTransactionsRequest(), 1).transaction_states
    return [(t.transactional_id, t.producer_id, t.transaction_state) for t in listed]


def test_an_old_data_directory_is_migrated_once_and_its_journals_kept_aside(old_data_dir: Path, tmp_path: Path) -> None:
    data_dir = shutil.copytree(old_data_dir, tmp_path / "data")
    with RunningBroker(data_dir) as broker:
        assert committed(broker.bootstrap) == COMMITS
        [(transactional_id, producer_id, state)] = transactions(broker.bootstrap)
        assert (transactional_id, state) == (TRANSACTIONAL_ID, "CompleteCommit")
    assert sorted(os.listdir(data_dir / LEGACY_DIRECTORY)) == [LEGACY_JOURNAL + ".migrated"]
    assert sorted(os.listdir(data_dir / LEGACY_TRANSACTIONS_DIRECTORY)) == [LEGACY_TRANSACTIONS_JOURNAL + ".migrated"]
    with RunningBroker(data_dir) as broker:  # the second start reads the topics alone
        assert committed(broker.bootstrap) == COMMITS
        assert transactions(broker.bootstrap) == [(TRANSACTIONAL_ID, producer_id, "CompleteCommit")]
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": TRANSACTIONAL_ID})
        producer.init_transactions(30)  # the migrated id goes on: its producer id, the epoch bumped
        producer.begin_transaction()
        producer.produce("orders", b"after the migration", partition=0)
        producer.commit_transaction(30)
        assert transactions(broker.bootstrap) == [(TRANSACTIONAL_ID, producer_id, "CompleteCommit")]


def test_a_migration_cut_short_finishes_at_the_next_start(old_data_dir: Path, tmp_path: Path) -> None:
    data_dir = shutil.copytree(old_data_dir, tmp_path / "data")
    store = OffsetStore.in_data_dir(data_dir)
    store.commit("alpha", {("orders", 0): CommittedOffset(11, -1, None, 0)})  # part of it written ...
    store.close()
    (data_dir / LEGACY_DIRECTORY / MIGRATION_STARTED).write_text("started\n")  # ... before a crash
    with RunningBroker(data_dir) as broker:
        assert committed(broker.bootstrap) == COMMITS
    assert sorted(os.listdir(data_dir / LEGACY_DIRECTORY)) == [LEGACY_JOURNAL + ".migrated"]


def test_a_journal_beside_offsets_it_did_not_write_stops_start_up_with_one_line(
    old_data_dir: Path, tmp_path: Path
) -> None:
    data_dir = shutil.copytree(old_data_dir, tmp_path / "data")
    store = OffsetStore.in_data_dir(data_dir)
    store.commit("alpha", {("orders", 0): CommittedOffset(99, -1, None, 0)})  # newer than the journal's?
    store.close()
    command = [sys.executable, "-m", "kbroker", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    journal = data_dir / LEGACY_DIRECTORY / LEGACY_JOURNAL
    assert result.returncode == 1 and "Traceback" not in result.stderr
    *logged, error = result.stderr.strip().splitlines()
    # Before it: the topics of the older data directory moved into the metadata log (one warning), nothing else.
    assert all(" WARNING kbroker.metadata: moved " in line for line in logged)
    assert error == (
        f"kbroker: {journal} (offsets of an older kbroker) was never migrated, but {OFFSETS_TOPIC} already holds "
        f"offsets: move the journal out of the data directory to keep {OFFSETS_TOPIC}'s, or remove the "
        f"{OFFSETS_TOPIC}-* directories to migrate the journal's"
    )
    assert journal.exists()  # nothing was touched
    reopened = OffsetStore.in_data_dir(data_dir)
    assert reopened.get("alpha")[("orders", 0)].offset == 99
    reopened.close()


def test_a_damaged_journal_stops_start_up_with_one_line_and_is_kept(tmp_path: Path) -> None:
    journal = tmp_path / "data" / LEGACY_DIRECTORY / LEGACY_JOURNAL
    journal.parent.mkdir(parents=True)
    journal.write_bytes(b"\x00garbage")
    command = [
        sys.executable,
        "-m",
        "kbroker",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        str(journal.parents[1]),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    *logged, error = result.stderr.strip().splitlines()
    assert all(" WARNING kbroker.metadata: moved " in line for line in logged)
    assert error.startswith("kbroker: ") and str(journal) in error
    assert journal.read_bytes() == b"\x00garbage"


def test_pending_transactional_offsets_of_the_journal_stay_pending(tmp_path: Path) -> None:
    journal = tmp_path / LEGACY_DIRECTORY / LEGACY_JOURNAL
    journal.parent.mkdir()
    lines = [
        {"g": "g", "t": "a", "p": 0, "o": 1, "e": 3, "m": "x", "ts": 10, "x": -1},
        {"g": "g", "t": "a", "p": 0, "o": 7, "e": -1, "m": None, "ts": 11, "x": -1, "pid": 5},
        {"g": "g", "t": "a", "p": 1, "o": 2, "ts": 12, "pid": 6},
        {"g": "g", "pid": 6, "txn": "commit"},
    ]
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines))  # the JSON-lines format
    store = OffsetStore.in_data_dir(tmp_path, partitions=3)
    assert migrate_offsets_journal(tmp_path, store)
    store.close()
    store = OffsetStore.in_data_dir(tmp_path, partitions=3)
    assert store.get("g") == {("a", 0): CommittedOffset(1, 3, "x", 10), ("a", 1): CommittedOffset(2, -1, "", 12)}
    assert store.has_pending("g", "a", 0)
    store.complete_transaction("g", 5, True)
    assert store.get("g")[("a", 0)].offset == 7
    store.close()
