"""Committed offsets, durable across restarts.

Kept in memory and journalled to ``<data dir>/__consumer_offsets/offsets.journal`` (kbroker/durable/journal.py):
one checksummed record per change (a commit, a deleted offset, a deleted group), each a compact JSON object,
a request's changes appended with a single write. A crash loses at most a torn last record; a damaged record
is skipped and the ones after it are kept. When the journal holds many superseded records it is rewritten
atomically with the live state — the same idea as Kafka's compacted ``__consumer_offsets`` topic, without
the partitions a single node does not need.

Record payloads: ``{"g": group, "t": topic, "p": partition, "o": offset, "e": leader epoch, "m": metadata,
"ts": commit timestamp, "x": expire timestamp}`` for a commit, the same with ``"o": null`` for a deleted
offset, ``{"g": group, "delete_group": true}`` for a deleted group. Transactional commits (TxnOffsetCommit) are
journalled as a commit with ``"pid": producer id`` and stay pending, invisible to OffsetFetch, until the
transaction's end is journalled as ``{"g": group, "pid": producer id, "txn": "commit" | "abort"}``: a commit applies
them, an abort drops them (as Kafka's group coordinator applies the offsets when the commit marker reaches
``__consumer_offsets``). A pending transaction at restart stays pending until the transaction coordinator ends it.
Older kbrokers wrote the same objects as bare JSON lines; such a journal is read once and rewritten in the current
format.

Durability: a change is written to the journal before it changes the offsets in memory, so a write that fails
(a full disk) changes nothing and raises OffsetStoreError, which OffsetCommit answers as Kafka's coordinator
answers a failed append to ``__consumer_offsets`` (KAFKA_STORAGE_ERROR becomes NOT_COORDINATOR). With
``sync_commits`` (the broker's log.flush.interval.messages is 1) each change is also fsynced before it is
applied; otherwise the flush service and ``close`` fsync it. A failed fsync takes the store offline until the
broker restarts (Kafka treats a failed fsync as fatal for the log dir): every later change is refused.

The journal lives in the data directory and shares its health (LogDirHealth, kbroker/storage/log.py), as
Kafka's ``__consumer_offsets`` partitions live in a log dir: a failed journal write counts as a failed write of
the directory, a failed fsync takes the directory offline, and while the directory is offline every change is
refused (OffsetCommit then answers NOT_COORDINATOR, Kafka's answer when the append to an offline log dir fails
with KAFKA_STORAGE_ERROR).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kbroker.durable.files import DamagedFileError, StorageError
from kbroker.durable.journal import Journal

if TYPE_CHECKING:
    from kbroker.storage.log import LogDirHealth

log = logging.getLogger("kbroker.groups")

DIRECTORY = "__consumer_offsets"
JOURNAL = "offsets.journal"
JOURNAL_KIND = "consumer-offsets"
JOURNAL_VERSION = 1
_COMPACT_FACTOR = 4  # rewrite when the journal has this many times more records than live offsets
_COMPACT_MIN_RECORDS = 10_000


class OffsetStoreError(StorageError):
    """A change could not be made durable; the offsets in memory are as they were."""


@dataclass(slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp: int
    expire_timestamp: int = -1  # set by OffsetCommit v2-4 retention_time_ms; -1 means group-based expiry


class OffsetStore:
    def __init__(self, data_dir: Path, *, sync_commits: bool = False, health: LogDirHealth | None = None) -> None:
        """``health``: the data directory's (None: the store keeps only its own offline state)."""
        self.sync_commits = sync_commits
        self.offline_reason: str | None = None
        self.health = health
        self.directory = data_dir / DIRECTORY
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / JOURNAL
        self.offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        # Offsets committed in a transaction not yet ended: (group, producer id) -> offsets.
        self.pending: dict[tuple[str, int], dict[tuple[str, int], CommittedOffset]] = {}
        self._journal = Journal(self.path, JOURNAL_KIND, JOURNAL_VERSION)
        self._records = 0
        if self._journal.has_other_format():
            self._load_json_lines()
            self._compact()  # the legacy file is replaced by a journal holding the same live offsets
        else:
            self._load()
            if self._journal.damaged_regions:
                try:
                    self._compact()  # drop the damaged bytes (already logged) so they are not reported at every start
                except OSError as exc:  # a full disk: the journal stays as it is, its damage skipped again next time
                    log.warning("%s: not rewritten without its damaged bytes: %s", self.path, _describe(exc))
        self._journal.open()

    def _load(self) -> None:
        for number, payload in enumerate(self._journal.replay(), 1):
            try:
                self._apply(json.loads(payload))
            except (ValueError, KeyError, TypeError, AttributeError):
                # Intact frame (its crc32c matched) but content this version cannot use: skip only this record.
                log.warning("%s: skipping record %d, whose content is not a valid offsets change", self.path, number)
                continue
            self._records += 1

    def _load_json_lines(self) -> None:
        """The journal of older kbrokers: one JSON object per line, a torn last line possible."""
        with open(self.path, "rb") as f:
            if f.read(1) != b"{":
                raise DamagedFileError(self.path, "neither an offsets journal nor the older JSON-lines format")
            f.seek(0)
            for number, raw in enumerate(f, 1):
                try:
                    self._apply(json.loads(raw))
                except (ValueError, KeyError, TypeError, AttributeError):
                    log.warning("%s: skipping unreadable line %d (torn write?)", self.path, number)
                    continue
                self._records += 1

    def _apply(self, entry: dict[str, Any]) -> None:
        group = entry["g"]
        if "pid" in entry:
            self._apply_transactional(group, int(entry["pid"]), entry)
            return
        if entry.get("delete_group"):
            self.offsets.pop(group, None)
            return
        key = (entry["t"], int(entry["p"]))
        if entry.get("o") is None:
            group_offsets = self.offsets.get(group)
            if group_offsets is not None:
                group_offsets.pop(key, None)
                if not group_offsets:
                    del self.offsets[group]
            return
        self.offsets.setdefault(group, {})[key] = _committed(entry)

    def _apply_transactional(self, group: str, producer_id: int, entry: dict[str, Any]) -> None:
        end = entry.get("txn")
        if end is None:
            key = (entry["t"], int(entry["p"]))
            self.pending.setdefault((group, producer_id), {})[key] = _committed(entry)
            return
        if end not in ("commit", "abort"):
            raise ValueError(f"unknown transaction end {end!r}")
        offsets = self.pending.pop((group, producer_id), {})
        if end == "commit" and offsets:
            self.offsets.setdefault(group, {}).update(offsets)

    def _write(self, entries: list[dict[str, Any]]) -> None:
        """Journal ``entries`` (and fsync them if ``sync_commits``) before the caller applies them.

        OffsetStoreError if they could not be written (nothing of them remains, or a torn record that replay
        skips) or synced (then they may or may not survive a power cut, and the store goes offline).
        """
        if not entries:
            return
        if self.offline_reason is not None:
            raise OffsetStoreError(f"{self.path} is offline until the broker restarts: {self.offline_reason}")
        if self.health is not None and self.health.offline:
            raise OffsetStoreError(f"data directory {self.health.path} is offline until the broker restarts")
        try:
            self._journal.append([_encode(e) for e in entries])
        except (OSError, StorageError) as exc:
            log.error("%s: writing %d offset change(s) failed: %s", self.path, len(entries), _describe(exc))
            if self.health is not None:
                self.health.write_failed(f"writing {self.path}", exc, logged=True)
            raise OffsetStoreError(f"writing {self.path} failed: {_describe(exc)}") from None
        if self.health is not None:
            self.health.write_succeeded()
        self._records += len(entries)
        if self.sync_commits:
            self._sync()

    def _sync(self) -> None:
        try:
            self._journal.sync()
        except OSError as exc:
            self.offline_reason = f"fsync failed: {_describe(exc)}"
            log.error("%s is offline until the broker restarts: %s", self.path, self.offline_reason)
            if self.health is not None:
                self.health.take_offline(f"fsync of {self.path} failed")
            raise OffsetStoreError(f"{self.path}: {self.offline_reason}") from None

    def _maybe_compact(self) -> None:
        live = sum(len(v) for v in self.offsets.values())
        if self._records > _COMPACT_MIN_RECORDS and self._records > _COMPACT_FACTOR * live:
            try:
                self._compact()
            except OSError as exc:  # the journal is as it was (rewritten atomically): try again later
                log.warning("%s: compaction failed, the journal is kept as it is: %s", self.path, _describe(exc))

    def _compact(self) -> None:
        live = [
            _encode(self._entry(group, topic, partition, c))
            for group, offsets in self.offsets.items()
            for (topic, partition), c in offsets.items()
        ]
        live += [
            _encode({**self._entry(group, topic, partition, c), "pid": producer_id})
            for (group, producer_id), offsets in self.pending.items()
            for (topic, partition), c in offsets.items()
        ]
        self._journal.rewrite(live)
        self._records = len(live)

    @staticmethod
    def _entry(group: str, topic: str, partition: int, c: CommittedOffset) -> dict[str, Any]:
        return {
            "g": group,
            "t": topic,
            "p": partition,
            "o": c.offset,
            "e": c.leader_epoch,
            "m": c.metadata,
            "ts": c.commit_timestamp,
            "x": c.expire_timestamp,
        }

    # --- API ------------------------------------------------------------------------------------------

    def commit(self, group: str, commits: dict[tuple[str, int], CommittedOffset]) -> None:
        """Journal the commits, then apply them; OffsetStoreError (nothing applied) if they could not be written."""
        self._write([self._entry(group, t, p, c) for (t, p), c in commits.items()])
        if commits:
            self.offsets.setdefault(group, {}).update(commits)
            self._maybe_compact()

    def commit_pending(self, group: str, producer_id: int, commits: dict[tuple[str, int], CommittedOffset]) -> None:
        """TxnOffsetCommit: journal the commits as pending in the producer's transaction (invisible until it
        commits); OffsetStoreError (nothing recorded) if they could not be written."""
        self._write([{**self._entry(group, t, p, c), "pid": producer_id} for (t, p), c in commits.items()])
        if commits:
            self.pending.setdefault((group, producer_id), {}).update(commits)

    def complete_transaction(self, group: str, producer_id: int, commit: bool) -> None:
        """The producer's transaction ended: apply (commit) or drop (abort) its pending offsets for ``group``.
        Called by the transaction coordinator for each group of the transaction, again after a restart if it
        did not complete: a second call finds nothing pending and writes nothing."""
        if (group, producer_id) not in self.pending:
            return
        self._write([{"g": group, "pid": producer_id, "txn": "commit" if commit else "abort"}])
        offsets = self.pending.pop((group, producer_id))
        if commit:
            self.offsets.setdefault(group, {}).update(offsets)
            self._maybe_compact()

    def has_pending(self, group: str, topic: str, partition: int) -> bool:
        """Whether a transaction not yet ended holds an offset for the partition (OffsetFetch's require_stable
        answers UNSTABLE_OFFSET_COMMIT then, KIP-447)."""
        return any(g == group and (topic, partition) in offsets for (g, _), offsets in self.pending.items())

    def get(self, group: str) -> dict[tuple[str, int], CommittedOffset]:
        return self.offsets.get(group, {})

    def has_group(self, group: str) -> bool:
        return bool(self.offsets.get(group))

    def delete(self, group: str, keys: list[tuple[str, int]]) -> None:
        """Journal, then forget, the group's offsets for ``keys``; OffsetStoreError (nothing forgotten) on failure."""
        group_offsets = self.offsets.get(group)
        if not group_offsets:
            return
        removed = [k for k in dict.fromkeys(keys) if k in group_offsets]
        self._write([{"g": group, "t": t, "p": p, "o": None} for t, p in removed])
        for key in removed:
            del group_offsets[key]
        if not group_offsets:
            del self.offsets[group]
        self._maybe_compact()

    def delete_group(self, group: str) -> None:
        """Journal, then forget, the group's offsets; OffsetStoreError (nothing forgotten) on failure."""
        if group in self.offsets:
            self._write([{"g": group, "delete_group": True}])
            del self.offsets[group]

    def delete_topic(self, topic: str) -> None:
        """Forget the offsets of a deleted topic. Best effort: a failure is logged and those offsets stay (as
        Kafka's, they go when their group expires or is deleted)."""
        for group in list(self.offsets):
            try:
                self.delete(group, [k for k in self.offsets[group] if k[0] == topic])
            except OffsetStoreError as exc:
                log.warning("offsets of deleted topic %s kept for group %s: %s", topic, group, exc)

    def expire(self, group: str, older_than_ms: int, now_ms: int, base_ms: int | None = None) -> int:
        """Drop the group's offsets that aged past ``older_than_ms`` (or past their own expiry).

        An offset ages from its commit, or from ``base_ms`` if that is later: the moment its group became
        empty (KIP-211), so a group that stopped committing while it still had members keeps its offsets.
        """
        group_offsets = self.offsets.get(group, {})
        stale = [
            key
            for key, c in group_offsets.items()
            if (c.expire_timestamp >= 0 and c.expire_timestamp <= now_ms)
            or (c.expire_timestamp < 0 and max(c.commit_timestamp, base_ms or -1) < older_than_ms)
        ]
        try:
            self.delete(group, stale)
        except OffsetStoreError:  # logged; the next expiry check tries again
            return 0
        return len(stale)

    def flush(self) -> None:
        """fsync the journal (OffsetStoreError if that fails, and the store goes offline)."""
        if self.offline_reason is None:
            self._sync()

    def close(self) -> None:
        """fsync and close the journal; a failure is logged (the next start replays what reached the disk)."""
        try:
            self._journal.close(sync=self.offline_reason is None)
        except OSError as exc:
            log.error("%s: fsync at close failed: %s", self.path, _describe(exc))


def _describe(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _committed(entry: dict[str, Any]) -> CommittedOffset:
    return CommittedOffset(
        int(entry["o"]), int(entry.get("e", -1)), entry.get("m"), int(entry.get("ts", -1)), int(entry.get("x", -1))
    )


def _encode(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode()
