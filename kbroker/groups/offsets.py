"""Committed offsets, durable across restarts.

Kept in memory and journalled to ``<data dir>/__consumer_offsets/offsets.journal``: one JSON line per
change (a commit, a deleted offset, a deleted group), appended with a single write so a crash loses at
most a torn last line, which is skipped at load. When the journal holds many superseded lines it is
rewritten as a snapshot of the live state (written to a temporary file, then renamed) — the same idea as
Kafka's compacted ``__consumer_offsets`` topic, without the partitions a single node does not need.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("kbroker.groups")

DIRECTORY = "__consumer_offsets"
JOURNAL = "offsets.journal"
_COMPACT_FACTOR = 4  # rewrite when the journal has this many times more lines than live offsets
_COMPACT_MIN_LINES = 10_000


@dataclass(slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp: int
    expire_timestamp: int = -1  # set by OffsetCommit v2-4 retention_time_ms; -1 means group-based expiry


class OffsetStore:
    def __init__(self, data_dir: Path) -> None:
        self.directory = data_dir / DIRECTORY
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / JOURNAL
        self.offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        self._lines = 0
        self._load()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _load(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    entry = json.loads(raw)
                    self._apply(entry)
                except (ValueError, KeyError, TypeError):
                    log.warning("%s: skipping unreadable line %d (torn write?)", self.path, number)
                    continue
                self._lines += 1

    def _apply(self, entry: dict) -> None:
        group = entry["g"]
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
        self.offsets.setdefault(group, {})[key] = CommittedOffset(
            int(entry["o"]), int(entry.get("e", -1)), entry.get("m"), int(entry.get("ts", -1)), int(entry.get("x", -1))
        )

    def _append(self, entries: list[dict]) -> None:
        if not entries:
            return
        data = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries).encode()
        os.write(self._fd, data)
        self._lines += len(entries)
        live = sum(len(v) for v in self.offsets.values())
        if self._lines > _COMPACT_MIN_LINES and self._lines > _COMPACT_FACTOR * live:
            self._compact()

    def _compact(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        lines = 0
        with open(tmp, "w") as f:
            for group, offsets in self.offsets.items():
                for (topic, partition), c in offsets.items():
                    f.write(json.dumps(self._entry(group, topic, partition, c), separators=(",", ":")) + "\n")
                    lines += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._lines = lines

    @staticmethod
    def _entry(group: str, topic: str, partition: int, c: CommittedOffset) -> dict:
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
        group_offsets = self.offsets.setdefault(group, {})
        group_offsets.update(commits)
        self._append([self._entry(group, t, p, c) for (t, p), c in commits.items()])

    def get(self, group: str) -> dict[tuple[str, int], CommittedOffset]:
        return self.offsets.get(group, {})

    def has_group(self, group: str) -> bool:
        return bool(self.offsets.get(group))

    def delete(self, group: str, keys: list[tuple[str, int]]) -> None:
        group_offsets = self.offsets.get(group)
        if not group_offsets:
            return
        removed = [k for k in keys if group_offsets.pop(k, None) is not None]
        if not group_offsets:
            del self.offsets[group]
        self._append([{"g": group, "t": t, "p": p, "o": None} for t, p in removed])

    def delete_group(self, group: str) -> None:
        if self.offsets.pop(group, None) is not None:
            self._append([{"g": group, "delete_group": True}])

    def delete_topic(self, topic: str) -> None:
        for group in list(self.offsets):
            self.delete(group, [k for k in self.offsets[group] if k[0] == topic])

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
        self.delete(group, stale)
        return len(stale)

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
