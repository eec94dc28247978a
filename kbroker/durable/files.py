"""Small durable-file helpers shared by the store, the broker's identity files and the offsets journal.

Every metadata file kbroker writes (except Kafka's own meta.properties) names its kind and format version
and carries a crc32c of its content, so a file that was damaged, cut short or put in the wrong place is
refused with a one-line DamagedFileError naming it instead of being misread. Two flavours, both written
atomically with the file and its directory fsynced:

- ``write_checked``/``read_checked``: a binary header, then the payload bytes::

      magic "\\x8bKBF" | kind length (u8) | kind (ASCII) | version (u16) | payload length (u32) | crc32c (u32)

  The crc32c covers everything between the magic and the crc, and the payload, so a damaged header is
  caught as surely as a damaged payload.
- ``write_checked_json``/``read_checked_json``: a JSON object for files people read (topics.json), with
  ``kind``, ``version`` and ``crc32c`` members beside the document's own; the crc32c covers the canonical
  form (sorted keys, no spaces) of every other member.

Files written before kbroker checked its files have no header; a reader that still understands them asks
for ``LEGACY_VERSION`` and gets the whole file back as the payload, then rewrites it in the current format.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Collection
from pathlib import Path
from typing import Any

from kbroker.durable import fs
from protocol.records import crc32c  # the C function, without the crc32c package's slow __init__


def write_atomically(path: Path, data: str | bytes, *, sync_directory: bool = False, private: bool = False) -> None:
    """Write to a temporary file, fsync it and rename it over ``path``: readers see old or new, never half.

    ``private``: readable by the owner only (0600), for secrets such as the SCRAM credentials. On any failure (a
    full disk, a failed fsync or rename) ``path`` is left as it was, the temporary file is removed if possible, and
    the OSError is raised (naming the file, which a failed write or fsync does not).
    """
    tmp = path.with_name(path.name + ".tmp")
    mode = 0o600 if private else 0o644
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        try:
            if private:
                os.fchmod(fd, mode)  # a .tmp left by a crash keeps its old mode through O_CREAT
            fs.write_all(fd, data.encode() if isinstance(data, str) else data)
            fs.fsync(fd)
        finally:
            os.close(fd)
        fs.replace(tmp, path)
    except OSError as exc:
        try:
            fs.unlink_if_exists(tmp)
        except OSError:
            pass  # a stray .tmp is removed when its directory is next opened
        if exc.filename is None:  # a failed write or fsync names no file: say which one it was
            exc.filename = str(tmp)
        raise
    if sync_directory:
        fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        fs.fsync(fd)
    finally:
        os.close(fd)


class StorageError(Exception):
    """The data directory or a file in it cannot be used; the message is one line that names the path."""


def describe_error(exc: BaseException) -> str:
    """A failed file operation in a few words: an OSError's reason and file, else the message."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror if exc.filename is None else f"{exc.strerror}: {exc.filename}"
    return str(exc)


class DataDirError(StorageError):
    """The data directory is missing and cannot be created, is not a directory, is not writable, or is in use."""


class DamagedFileError(StorageError):
    """A file kbroker wrote cannot be read back: the message names the file and what is wrong with it."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"damaged file {path}: {problem}")
        self.path = path
        self.problem = problem


# --- checked files --------------------------------------------------------------------------------------------

LEGACY_VERSION = 0  # "the file has no header": written by a kbroker from before checked files
CHECKED_MAGIC = b"\x8bKBF"  # starts with a non-ASCII byte: no legacy text file (digits, JSON) starts like this
_VERSION_LENGTH_CRC = struct.Struct(">HII")


def encode_checked(kind: str, version: int, payload: bytes) -> bytes:
    """The bytes of a checked file: header, then payload."""
    kind_bytes = kind.encode("ascii")
    if not 0 < len(kind_bytes) < 256 or not 0 < version < 65536:
        raise ValueError(f"bad kind {kind!r} or version {version} for a checked file")
    described = bytes([len(kind_bytes)]) + kind_bytes + struct.pack(">HI", version, len(payload))
    checksum = crc32c(payload, crc32c(described))
    return CHECKED_MAGIC + described + struct.pack(">I", checksum) + payload


def decode_checked(path: Path, data: bytes, kind: str, supported_versions: Collection[int]) -> tuple[int, bytes]:
    """(version, payload) of the content ``data`` of the checked file ``path``; see ``read_checked``."""
    if not data.startswith(CHECKED_MAGIC):
        if len(data) < len(CHECKED_MAGIC) and CHECKED_MAGIC.startswith(data):
            raise DamagedFileError(path, f"short file: {len(data)} bytes, cut inside the header")
        if LEGACY_VERSION in supported_versions:
            return LEGACY_VERSION, data
        raise DamagedFileError(path, f"not a kbroker {kind} file (no header)")
    at = len(CHECKED_MAGIC)
    kind_length = data[at] if len(data) > at else 0
    header_end = at + 1 + kind_length + _VERSION_LENGTH_CRC.size
    if len(data) < header_end:
        raise DamagedFileError(path, f"short file: {len(data)} bytes, cut inside the header")
    found_kind = data[at + 1 : at + 1 + kind_length]
    version, length, stored_crc = _VERSION_LENGTH_CRC.unpack_from(data, at + 1 + kind_length)
    payload = data[header_end:]
    if len(payload) < length:
        raise DamagedFileError(path, f"short file: payload of {length} bytes, only {len(payload)} present")
    if len(payload) > length:
        raise DamagedFileError(path, f"{len(payload) - length} bytes after the payload of {length} bytes")
    computed_crc = crc32c(payload, crc32c(data[at : header_end - 4]))
    if computed_crc != stored_crc:
        raise DamagedFileError(
            path, f"checksum mismatch (crc32c stored {stored_crc:#010x}, computed {computed_crc:#010x})"
        )
    if found_kind != kind.encode("ascii"):
        raise DamagedFileError(path, f"is a {found_kind.decode('ascii', 'replace')!r} file, expected {kind!r}")
    if version not in supported_versions:
        raise DamagedFileError(
            path, f"{kind} format version {version} is not supported ({_versions(supported_versions)})"
        )
    return version, payload


def write_checked(path: Path, kind: str, version: int, payload: bytes, *, private: bool = False) -> None:
    """Replace ``path`` atomically and durably (file and directory fsynced) with a checked file (``private``: 0600)."""
    write_atomically(path, encode_checked(kind, version, payload), sync_directory=True, private=private)


def read_checked(path: Path, kind: str, supported_versions: Collection[int]) -> tuple[int, bytes]:
    """(version, payload) of a file written by ``write_checked``.

    DamagedFileError (naming the file) for a short file, a checksum mismatch, another kind or a version not in
    ``supported_versions``. A file without a header is returned whole as ``(LEGACY_VERSION, content)`` if
    ``supported_versions`` includes LEGACY_VERSION, and refused otherwise.
    """
    return decode_checked(path, path.read_bytes(), kind, supported_versions)


def _versions(supported: Collection[int]) -> str:
    readable = sorted(v for v in supported if v != LEGACY_VERSION)
    return "this kbroker reads " + ", ".join(str(v) for v in readable)


def _canonical_json(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


_JSON_ENVELOPE = ("kind", "version", "crc32c")


def write_checked_json(path: Path, kind: str, version: int, document: dict[str, Any]) -> None:
    """Replace ``path`` atomically and durably with ``document`` plus its kind, version and crc32c members."""
    if any(key in document for key in _JSON_ENVELOPE):
        raise ValueError(f"a checked JSON document cannot have its own {_JSON_ENVELOPE} members")
    described = {"kind": kind, "version": version, **document}
    checked = {**described, "crc32c": crc32c(_canonical_json(described))}
    write_atomically(path, json.dumps(checked, indent=1, sort_keys=True) + "\n", sync_directory=True)


def read_checked_json(path: Path, kind: str, supported_versions: Collection[int]) -> tuple[int, Any]:
    """(version, document without kind/version/crc32c) of a file written by ``write_checked_json``.

    A JSON value with neither a ``kind`` nor a ``crc32c`` member predates checked files: it is returned whole
    as ``(LEGACY_VERSION, value)`` if LEGACY_VERSION is supported. Both members are required otherwise, so a
    damaged member name is caught rather than mistaken for a legacy file.
    """
    try:
        value = json.loads(path.read_bytes())
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise DamagedFileError(path, f"not valid JSON{where}") from None
    if not (isinstance(value, dict) and ("kind" in value or "crc32c" in value)):
        if LEGACY_VERSION in supported_versions:
            return LEGACY_VERSION, value
        raise DamagedFileError(path, f"not a kbroker {kind} file (no kind and crc32c members)")
    described = {key: item for key, item in value.items() if key != "crc32c"}
    stored_crc = value.get("crc32c")
    computed_crc = crc32c(_canonical_json(described))
    if stored_crc != computed_crc:
        raise DamagedFileError(path, f"checksum mismatch (crc32c stored {stored_crc!r}, computed {computed_crc})")
    if value.get("kind") != kind:
        raise DamagedFileError(path, f"is a {value.get('kind')!r} file, expected {kind!r}")
    version = value.get("version")
    if type(version) is not int or version not in supported_versions or version == LEGACY_VERSION:
        raise DamagedFileError(
            path, f"{kind} format version {version!r} is not supported ({_versions(supported_versions)})"
        )
    return version, {key: item for key, item in described.items() if key not in _JSON_ENVELOPE}


# --- offsets kept in small files -----------------------------------------------------------------------------

_OFFSET = struct.Struct(">q")
LOG_START_OFFSET_KIND = "log-start-offset"


def write_offset_file(path: Path, kind: str, offset: int) -> None:
    """A checked file holding one non-negative 64-bit offset (version 1)."""
    write_checked(path, kind, 1, _OFFSET.pack(offset))


def read_offset_file(path: Path, kind: str, legacy_description: str) -> int:
    """The offset in a file written by ``write_offset_file``, or by older kbrokers as decimal text.

    A legacy file is rewritten in the current format once read. ``legacy_description`` names what a legacy
    file holds, for the error ("expected the log start offset, found '-'").
    """
    version, payload = read_checked(path, kind, (LEGACY_VERSION, 1))
    if version == LEGACY_VERSION:
        text = payload.decode(errors="replace").strip()
        if not (text.isascii() and text.isdigit()):
            raise DamagedFileError(path, f"expected {legacy_description}, found {text[:40]!r}")
        offset = int(text)
        write_offset_file(path, kind, offset)
        return offset
    if len(payload) != _OFFSET.size:
        raise DamagedFileError(path, f"expected an {_OFFSET.size}-byte offset, found {len(payload)} bytes")
    (offset,) = _OFFSET.unpack(payload)
    if offset < 0:
        raise DamagedFileError(path, f"negative offset {offset}")
    return offset


def read_log_start_offset(path: Path) -> int:
    """The log start offset persisted in ``path`` (the legacy decimal text is read and rewritten)."""
    return read_offset_file(path, LOG_START_OFFSET_KIND, "the log start offset")


def write_log_start_offset(path: Path, offset: int) -> None:
    """Persist the log start offset durably: the file and its directory are fsynced before this returns, so a
    DeleteRecords answer sent afterwards is never undone by a crash."""
    write_offset_file(path, LOG_START_OFFSET_KIND, offset)


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
