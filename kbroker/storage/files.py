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
