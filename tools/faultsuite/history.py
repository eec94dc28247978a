"""The fault suite's history: every operation a client or the nemesis began and how it ended, one JSON line each.

An operation is recorded twice, as Jepsen records it: an ``invoke`` when it starts and a completion when it ends,
with the same ``process`` and ``f``. The completion's type says what is known of its effect:

- ``ok``: it took effect (a send acknowledged, a transaction committed, a poll that returned records);
- ``fail``: it certainly did not (a transaction aborted, a send refused before anything was written);
- ``info``: nobody knows (a send that timed out, a commit whose answer was lost, a client that crashed).

What each ``f`` carries in ``value`` (partitions are integers of the suite's one topic, values unique integers):

- ``send``: the invoke lists ``[partition, value]`` pairs; an ``ok`` completion ``[partition, value, offset]``
  triples (the acknowledged offsets). ``txn`` is true for a transactional producer's transaction, and then the
  completion's ``commit_at`` is when ``commit_transaction`` was called.
- ``poll``: the completion maps a partition to the ``[offset, value]`` pairs one poll returned, in order;
  ``isolation`` is ``read_committed`` or ``read_uncommitted``.
- ``assign`` / ``rebalance``: the partitions a consumer reads from now on (a reset of where it is).
- ``commit``: ``{partition: offset}`` a consumer committed for ``group``; ``committed``: what a read of the
  group's committed offsets answered.
- the nemesis (process ``nemesis``): ``start`` and ``stop`` of one fault, its name in ``fault``.

Times are seconds since the history began (``time.monotonic`` based), so a history can be read without the clock
of the machine that wrote it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
COMPLETIONS = (OK, FAIL, INFO)
NEMESIS = "nemesis"


@dataclass(frozen=True, slots=True)
class Op:
    """One line of a history."""

    index: int
    time: float
    process: str
    type: str
    f: str
    value: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.extra.get(key, default)

    def to_json(self) -> str:
        line = {"index": self.index, "time": self.time, "process": self.process, "type": self.type}
        line["f"] = self.f
        if self.value is not None:
            line["value"] = self.value
        line.update(self.extra)
        return json.dumps(line, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Op:
        line = json.loads(text)
        core = {key: line.pop(key) for key in ("index", "time", "process", "type", "f")}
        value = line.pop("value", None)
        return cls(core["index"], core["time"], str(core["process"]), core["type"], core["f"], value, line)


class History:
    """A history being written by many threads: each ``invoke`` returns the op its completion names."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.ops: list[Op] = []
        self._out = out
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def _add(self, process: str, type_: str, f: str, value: Any, extra: dict[str, Any]) -> Op:
        with self._lock:
            op = Op(len(self.ops), round(time.monotonic() - self._started, 6), process, type_, f, value, extra)
            self.ops.append(op)
            if self._out is not None:
                self._out.write(op.to_json() + "\n")
        return op

    def invoke(self, process: str, f: str, value: Any = None, **extra: Any) -> Op:
        return self._add(process, INVOKE, f, value, extra)

    def complete(self, invoked: Op, type_: str, value: Any = None, **extra: Any) -> Op:
        assert type_ in COMPLETIONS, type_
        return self._add(invoked.process, type_, invoked.f, value, {**invoked.extra, **extra})

    def now(self) -> float:
        return time.monotonic() - self._started


def read_history(path: Path) -> list[Op]:
    with path.open() as lines:
        return [Op.from_json(line) for line in lines if line.strip()]


def write_history(path: Path, ops: Iterable[Op]) -> None:
    with path.open("w") as out:
        for op in ops:
            out.write(op.to_json() + "\n")


def pairs(ops: Iterable[Op]) -> Iterator[tuple[Op, Op | None]]:
    """Each invoke with its completion (None: never completed), in invoke order."""
    matched: list[tuple[Op, Op | None]] = []
    pending: dict[str, int] = {}  # process -> its open invoke's place in ``matched``
    for op in ops:
        if op.type == INVOKE:
            pending[op.process] = len(matched)
            matched.append((op, None))
        elif (place := pending.pop(op.process, None)) is not None:
            matched[place] = (matched[place][0], op)
    return iter(matched)
