"""The file-system seam: every write, fsync, truncate, rename and unlink of the storage and offsets code.

Storage code calls ``fs.write``, ``fs.fsync``, ``fs.ftruncate``, ``fs.replace`` and ``fs.unlink`` (always
through the module, never imported by name) instead of ``os``. By default these *are* the ``os`` functions,
so the produce path pays one module attribute look-up. Tests install a ``FaultyFileSystem`` (``installed``)
that injects the faults a real disk produces: ENOSPC on the Nth operation or from a step on (disk full), a
short write followed by ENOSPC, an fsync error, a failed (torn) rename, a failed truncate, and a crash that
stops the process at step N (``SimulatedCrash``, a BaseException, so no ``except Exception`` swallows it).
It also keeps, for every file written through it, the length known to be on disk (its size at the last
fsync), so ``power_cut`` can drop what was never synced, as a power failure does.

Modelled: file contents. Not modelled: directory entries (a create, rename or unlink counts as durable at
once) and bytes of a file below its synced length changing later.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

# The real operations; ``install`` rebinds these names, so callers must look them up on the module. ``write`` is
# os.write itself (the produce path); the others look ``os`` up at each call, which costs nothing next to the
# system call and keeps tests that patch ``os.fsync`` and the like working.
write = os.write


def fsync(fd: int) -> None:
    os.fsync(fd)


def ftruncate(fd: int, length: int) -> None:
    os.ftruncate(fd, length)


def replace(source: os.PathLike[str] | str, target: os.PathLike[str] | str) -> None:
    os.replace(source, target)


def unlink(path: os.PathLike[str] | str) -> None:
    os.unlink(path)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` at the descriptor's position (or the end, with O_APPEND), or raise OSError.

    A short write is continued; a write that makes no progress is a full disk (ENOSPC). On OSError some
    prefix of ``data`` may have been written: the caller decides how to undo it.
    """
    written = write(fd, data)
    if written == len(data):  # the usual case, without building a view
        return
    view = memoryview(data)
    while written < len(view):
        more = write(fd, view[written:])
        if more <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written += more


def unlink_if_exists(path: os.PathLike[str] | str) -> None:
    try:
        unlink(path)
    except FileNotFoundError:
        pass


# --- the test double ------------------------------------------------------------------------------------------


class SimulatedCrash(BaseException):
    """The process stopped here (a kill or power cut): nothing after it runs, not even error handling."""


FaultKind = Literal["enospc", "short", "fsync", "rename", "truncate", "crash", "crash_after"]
OPERATIONS = ("write", "fsync", "ftruncate", "replace", "unlink")
_DEFAULTS = {name: globals()[name] for name in OPERATIONS}


@dataclass
class FaultyFileSystem:
    """Counts operations (steps, from 1) and injects ``faults`` keyed by step, and ``nth`` faults keyed by
    (operation, its count from 1): ``("write", 3)`` is the third write.

    ``enospc``: the write fails with nothing written. ``short``: half of it is written and returned, then the
    next write fails with ENOSPC. ``fsync``/``rename``/``truncate``: that operation fails with EIO (a rename
    leaves both names as they were). ``crash``: SimulatedCrash before the operation, ``crash_after``: after it;
    every operation after a crash raises SimulatedCrash too. Outside ``faults``: ``disk_full`` fails every
    write with ENOSPC, ``fail_truncates`` every ftruncate with EIO.
    """

    faults: dict[int, FaultKind] = field(default_factory=dict)
    nth: dict[tuple[str, int], FaultKind] = field(default_factory=dict)
    disk_full: bool = False
    fail_truncates: bool = False
    steps: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # operations done so far, by name
    operations: list[str] = field(default_factory=list)  # the name of each step, in order
    crashed: bool = False
    injected: list[tuple[int, str, str]] = field(default_factory=list)  # (step, operation, fault) as they happened
    _durable: dict[str, int] = field(default_factory=dict)  # path -> length on disk
    _full_after_short: bool = False

    # --- bookkeeping ---

    def _step(self, operation: str) -> FaultKind | None:
        if self.crashed:
            raise SimulatedCrash(f"{operation} after the crash")
        self.steps += 1
        self.counts[operation] = count = self.counts.get(operation, 0) + 1
        self.operations.append(operation)
        fault = self.faults.pop(self.steps, None) or self.nth.pop((operation, count), None)
        if fault is not None:
            self.injected.append((self.steps, operation, fault))
        if fault == "crash":
            self.crashed = True
            raise SimulatedCrash(f"crash before {operation} (step {self.steps})")
        return fault

    def _after(self, fault: FaultKind | None) -> None:
        if fault == "crash_after":
            self.crashed = True
            raise SimulatedCrash(f"crash after step {self.steps}")

    @staticmethod
    def _path_of(fd: int) -> str | None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(" (deleted)") or not os.path.isfile(path):
            return None
        return path

    def _track(self, fd: int) -> str | None:
        """The file's path, remembering its current size as durable the first time it is seen."""
        path = self._path_of(fd)
        if path is not None and path not in self._durable:
            self._durable[path] = os.fstat(fd).st_size
        return path

    # --- the operations ---

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> int:
        fault = self._step("write")
        self._track(fd)
        if self.disk_full or fault == "enospc" or self._full_after_short:
            self._full_after_short = False
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if fault == "short" and len(data) > 1:
            self._full_after_short = True
            return os.write(fd, memoryview(data)[: len(data) // 2])
        written = os.write(fd, data)
        self._after(fault)
        return written

    def fsync(self, fd: int) -> None:
        fault = self._step("fsync")
        if fault == "fsync":
            raise OSError(errno.EIO, "injected fsync failure")
        os.fsync(fd)
        path = self._track(fd)
        if path is not None:
            self._durable[path] = os.fstat(fd).st_size
        self._after(fault)

    def ftruncate(self, fd: int, length: int) -> None:
        fault = self._step("ftruncate")
        if fault == "truncate" or self.fail_truncates:
            raise OSError(errno.EIO, "injected truncate failure")
        path = self._track(fd)
        os.ftruncate(fd, length)
        if path is not None:
            self._durable[path] = min(self._durable[path], length)
        self._after(fault)

    def replace(self, source: os.PathLike[str] | str, target: os.PathLike[str] | str) -> None:
        fault = self._step("replace")
        if fault == "rename":
            raise OSError(errno.EIO, f"injected rename failure {source} -> {target}")
        source_path, target_path = os.path.realpath(source), os.path.realpath(target)
        os.replace(source, target)
        self._durable.pop(target_path, None)
        if source_path in self._durable:
            self._durable[target_path] = self._durable.pop(source_path)
        self._after(fault)

    def unlink(self, path: os.PathLike[str] | str) -> None:
        fault = self._step("unlink")
        real_path = os.path.realpath(path)
        os.unlink(path)
        self._durable.pop(real_path, None)
        self._after(fault)

    # --- the power cut ---

    def durable_length(self, path: os.PathLike[str] | str) -> int | None:
        return self._durable.get(os.path.realpath(path))

    def power_cut(self) -> list[str]:
        """Cut every file written through this object back to its last fsynced length; returns the paths cut."""
        cut = []
        for path, length in self._durable.items():
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                continue
            if size > length:
                os.truncate(path, length)
                cut.append(path)
        self._durable.clear()
        return cut


def install(double: FaultyFileSystem | None) -> None:
    """Route the storage code's operations through ``double`` (None: back to ``os``)."""
    operations = _DEFAULTS if double is None else {name: getattr(double, name) for name in OPERATIONS}
    globals().update(operations)


@contextmanager
def installed(double: FaultyFileSystem) -> Iterator[FaultyFileSystem]:
    install(double)
    try:
        yield double
    finally:
        install(None)
