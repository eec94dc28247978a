"""Small durable-file helpers shared by the store, the broker's identity files and the offsets journal."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: str | bytes, *, sync_directory: bool = False) -> None:
    """Write to a temporary file, fsync it and rename it over ``path``: readers see old or new, never half."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync_directory:
        fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StorageError(Exception):
    """The data directory or a file in it cannot be used; the message is one line that names the path."""


class DataDirError(StorageError):
    """The data directory is missing and cannot be created, is not a directory, is not writable, or is in use."""


class DamagedFileError(StorageError):
    """A file kbroker wrote cannot be read back: the message names the file and what is wrong with it."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"damaged file {path}: {problem}")
        self.path = path
        self.problem = problem


LOCK_FILE = ".lock"


def _first_non_directory(path: Path) -> Path | None:
    """The first existing component of ``path`` that is not a directory (None if there is none)."""
    for candidate in reversed([path, *path.parents]):
        if candidate.exists() and not candidate.is_dir():
            return candidate
    return None


def prepare_data_dir(path: Path) -> None:
    """Create the data directory if it is missing; a DataDirError says why it cannot be used."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DataDirError(f"data directory {path} exists but is not a directory") from None
    except NotADirectoryError:
        blocker = _first_non_directory(path)
        where = f"{blocker} is not a directory" if blocker is not None else "a parent is not a directory"
        raise DataDirError(f"cannot create data directory {path}: {where}") from None
    except PermissionError:
        parent = next((p for p in path.parents if p.exists()), path.parent)
        raise DataDirError(f"cannot create data directory {path}: {parent} is not writable") from None
    except OSError as exc:
        raise DataDirError(f"cannot create data directory {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise DataDirError(f"data directory {path} is not writable")
    if not os.access(path, os.R_OK):
        raise DataDirError(f"data directory {path} is not readable")


class DataDirLock:
    """Kafka's ``.lock``: an exclusive flock on a file in the data directory, held while a broker uses it.

    The operating system drops the lock when the process ends, however it ends, so a crash leaves nothing to
    clean up; the file itself stays. Two brokers in one process conflict too (each opens the file itself).
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        import fcntl

        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DataDirError(f"cannot create the lock file {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirError(
                f"data directory {self.path.parent} is in use: another broker holds its lock ({self.path})"
            ) from None
        except OSError as exc:  # a file system without locks: refuse rather than risk two writers
            os.close(fd)
            raise DataDirError(f"cannot lock {self.path}: {exc.strerror or exc}") from None
        self._fd = fd
        return self

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        os.close(fd)  # closing the only descriptor of the open file releases the flock


def lock_data_dir(data_dir: Path) -> DataDirLock:
    """Create (if needed), check and lock the data directory; DataDirError says why it cannot be used."""
    prepare_data_dir(data_dir)
    return DataDirLock(data_dir).acquire()
