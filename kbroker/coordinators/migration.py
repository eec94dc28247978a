"""Migrating the journals of older kbrokers into ``__consumer_offsets`` and ``__transaction_state``, once, at
start-up.

Older kbrokers kept committed offsets in ``<data dir>/__consumer_offsets/offsets.journal`` (kbroker/durable/
journal.py records of compact JSON objects, or, older still, bare JSON lines). At start-up such a journal is
read, its live offsets (and the offsets of transactions not yet ended) are appended to ``__consumer_offsets``
as Kafka's records and fsynced, and only then is the journal renamed aside to ``offsets.journal.migrated``:
nothing is lost at any point.

A file ``migration-started`` is written (fsynced) before the first record, and removed after the rename. A start
that finds the journal and that file (a migration a crash cut short) migrates again: the journal's offsets are
written once more over the same keys, which changes nothing it had written. A start that finds the journal
without that file but ``__consumer_offsets`` already holding offsets stops with one line: which of the two is
current cannot be known (a journal copied back from a backup?), and neither is overwritten. A journal that is not
readable stops start-up with one line naming it (DamagedFileError); torn or corrupt records inside it are skipped
with a warning, as the old store did.

The transaction coordinator's journal, ``__transaction_state/transactions.journal``, is migrated the same way
(each id's last state written as its TransactionLog record), with the same rules.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kbroker.durable.files import DamagedFileError, StorageError, fsync_directory, write_atomically
from kbroker.durable.journal import Journal
from kbroker.groups.offsets import OFFSETS_TOPIC, CommittedOffset, OffsetStore

if TYPE_CHECKING:
    from kbroker.transactions.coordinator import TransactionCoordinator

log = logging.getLogger("kbroker.groups")

LEGACY_DIRECTORY = "__consumer_offsets"
LEGACY_JOURNAL = "offsets.journal"
LEGACY_JOURNAL_KIND = "consumer-offsets"
LEGACY_JOURNAL_VERSION = 1
MIGRATED_SUFFIX = ".migrated"
MIGRATION_STARTED = "migration-started"
LEGACY_TRANSACTIONS_DIRECTORY = "__transaction_state"
LEGACY_TRANSACTIONS_JOURNAL = "transactions.journal"

Offsets = dict[str, dict[tuple[str, int], CommittedOffset]]
Pending = dict[tuple[str, int], dict[tuple[str, int], CommittedOffset]]


class MigrationError(StorageError):
    """The old journal cannot be migrated without risking offsets; start-up stops."""


def migrate_offsets_journal(data_dir: Path, store: OffsetStore) -> bool:
    """Migrate ``data_dir``'s old offsets journal into ``store`` if there is one; whether there was."""
    directory = data_dir / LEGACY_DIRECTORY
    journal = directory / LEGACY_JOURNAL
    if not journal.is_file():
        return False
    started = directory / MIGRATION_STARTED
    if not started.exists() and (store.offsets or store.pending):
        raise MigrationError(
            f"{journal} (offsets of an older kbroker) was never migrated, but {OFFSETS_TOPIC} already holds "
            f"offsets: move the journal out of the data directory to keep {OFFSETS_TOPIC}'s, or remove the "
            f"{OFFSETS_TOPIC}-* directories to migrate the journal's"
        )
    offsets, pending = read_offsets_journal(journal)
    write_atomically(started, "offsets journal migration to __consumer_offsets started\n", sync_directory=True)
    try:
        for group, group_offsets in offsets.items():
            if group_offsets:
                store.commit(group, group_offsets)
        for (group, producer_id), group_offsets in pending.items():
            if group_offsets:
                store.commit_pending(group, producer_id, group_offsets)
        if offsets or pending:
            store.ensure_topic()
            _sync_topic(store)
    except StorageError as exc:
        raise MigrationError(f"migrating {journal} into {OFFSETS_TOPIC} failed (the journal is kept): {exc}") from None
    os.rename(journal, journal.with_name(LEGACY_JOURNAL + MIGRATED_SUFFIX))
    started.unlink()
    fsync_directory(directory)
    count = sum(len(o) for o in offsets.values())
    log.warning(
        "migrated %d committed offset(s) of %d group(s) from %s into %s; the journal is kept as %s%s",
        count,
        len(offsets),
        journal,
        OFFSETS_TOPIC,
        LEGACY_JOURNAL,
        MIGRATED_SUFFIX,
    )
    return True


def _sync_topic(store: OffsetStore) -> None:
    for partition in range(store.partition_count):
        plog = store.logs.get_partition(OFFSETS_TOPIC, partition)
        if plog is not None and not plog.sync():
            raise StorageError(f"fsync of {OFFSETS_TOPIC}-{partition} failed")


# --- reading the old journal ----------------------------------------------------------------------------
# Payloads: {"g", "t", "p", "o", "e", "m", "ts", "x"} a commit ("o": null a deleted offset), {"g", "delete_group"}
# a deleted group, with "pid" a transactional commit, {"g", "pid", "txn": "commit" | "abort"} its end.


def read_offsets_journal(path: Path) -> tuple[Offsets, Pending]:
    """The live offsets and pending transactional offsets an old journal holds."""
    offsets: Offsets = {}
    pending: Pending = {}
    journal = Journal(path, LEGACY_JOURNAL_KIND, LEGACY_JOURNAL_VERSION)
    payloads = _json_lines(path) if journal.has_other_format() else list(journal.replay())
    for number, payload in enumerate(payloads, 1):
        try:
            _apply(offsets, pending, json.loads(payload))
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("%s: skipping record %d, whose content is not a valid offsets change", path, number)
    return offsets, pending


def _json_lines(path: Path) -> list[bytes]:
    """The journal of still older kbrokers: one JSON object per line, a torn last line possible."""
    data = path.read_bytes()
    if not data.startswith(b"{"):
        raise DamagedFileError(path, "neither an offsets journal nor the older JSON-lines format")
    return data.splitlines()


def _apply(offsets: Offsets, pending: Pending, entry: dict[str, Any]) -> None:
    group = entry["g"]
    if "pid" in entry:
        producer_id = int(entry["pid"])
        end = entry.get("txn")
        if end is None:
            pending.setdefault((group, producer_id), {})[(entry["t"], int(entry["p"]))] = _committed(entry)
            return
        if end not in ("commit", "abort"):
            raise ValueError(f"unknown transaction end {end!r}")
        done = pending.pop((group, producer_id), {})
        if end == "commit" and done:
            offsets.setdefault(group, {}).update(done)
        return
    if entry.get("delete_group"):
        offsets.pop(group, None)
        return
    key = (entry["t"], int(entry["p"]))
    if entry.get("o") is None:
        group_offsets = offsets.get(group)
        if group_offsets is not None:
            group_offsets.pop(key, None)
            if not group_offsets:
                del offsets[group]
        return
    offsets.setdefault(group, {})[key] = _committed(entry)


def _committed(entry: dict[str, Any]) -> CommittedOffset:
    return CommittedOffset(
        int(entry["o"]), int(entry.get("e", -1)), entry.get("m"), int(entry.get("ts", -1)), int(entry.get("x", -1))
    )


def migrate_transactions_journal(data_dir: Path, coordinator: TransactionCoordinator) -> bool:
    """Migrate ``data_dir``'s old transactions journal into ``coordinator``'s topic if there is one."""
    from kbroker.transactions.coordinator import TransactionMetadata
    from kbroker.transactions.state_log import TRANSACTION_TOPIC

    directory = data_dir / LEGACY_TRANSACTIONS_DIRECTORY
    journal = directory / LEGACY_TRANSACTIONS_JOURNAL
    if not journal.is_file():
        return False
    started = directory / MIGRATION_STARTED
    if not started.exists() and coordinator.transactions:
        raise MigrationError(
            f"{journal} (transactions of an older kbroker) was never migrated, but {TRANSACTION_TOPIC} already "
            f"holds transactional ids: move the journal out of the data directory to keep {TRANSACTION_TOPIC}'s, or "
            f"remove the {TRANSACTION_TOPIC}-* directories to migrate the journal's"
        )
    states: dict[str, dict[str, Any]] = {}
    for number, payload in enumerate(list(Journal(journal, "transactions", 1).replay()), 1):
        try:
            record = json.loads(payload)
            if record.get("state") == "Dead":
                states.pop(str(record["id"]), None)
            else:
                TransactionMetadata.from_record(record)  # checked now, not half-way through the migration
                states[str(record["id"])] = record
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("%s: skipping record %d, whose content is not a transaction state", journal, number)
    write_atomically(started, "transactions journal migration to __transaction_state started\n", sync_directory=True)
    try:
        for transactional_id, record in states.items():
            coordinator._persist(TransactionMetadata.from_record(record), transactional_id)
        if states:
            coordinator.flush()
    except StorageError as exc:
        raise MigrationError(
            f"migrating {journal} into {TRANSACTION_TOPIC} failed (the journal is kept): {exc}"
        ) from None
    os.rename(journal, journal.with_name(LEGACY_TRANSACTIONS_JOURNAL + MIGRATED_SUFFIX))
    started.unlink()
    fsync_directory(directory)
    log.warning(
        "migrated %d transactional id(s) from %s into %s; the journal is kept as %s%s",
        len(states),
        journal,
        TRANSACTION_TOPIC,
        LEGACY_TRANSACTIONS_JOURNAL,
        MIGRATED_SUFFIX,
    )
    return True
