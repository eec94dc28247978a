"""An append-only journal of checksummed records: the persisted state of the coordinators.

The file starts with a header naming what the journal holds and the version of its record format::

    magic "\\xfeKBJ" | version (u16) | kind length (u8) | kind (ASCII) | crc32c of the preceding bytes (u32)

followed by records, each framed as::

    magic "\\xfeREC" | payload length (u32) | crc32c of length and payload (u32) | payload

A batch of records is appended with a single write, and fsynced when the caller asks (``sync``). Replay
yields every intact record in order. A crash can tear the last record; a bad disk or a stray write can
damage one in the middle. Either is skipped — logged once, with the file and the byte position — and
reading resynchronises on the next record magic whose frame checks out, so the records after a damaged one
are kept. ``rewrite`` replaces the whole journal atomically with the live state (compaction).

The header is written atomically when the journal is created, so it is never torn: a damaged header means
the file cannot be trusted at all, and is a DamagedFileError.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path

from kbroker.durable import fs
from kbroker.durable.files import DamagedFileError, StorageError, write_atomically
from protocol.records import crc32c  # the C function, without the crc32c package's slow __init__

log = logging.getLogger("kbroker.storage")

FILE_MAGIC = b"\xfeKBJ"  # 0xfe: not UTF-8, and no single bit flip away from "{" (a JSON-lines journal)
RECORD_MAGIC = b"\xfeREC"
_VERSION_AND_KIND_LENGTH = struct.Struct(">HB")
_CRC = struct.Struct(">I")
_RECORD_HEADER = struct.Struct(">4sII")  # magic, payload length, crc32c
MAX_RECORD_BYTES = 2**31 - 1


class JournalTailDamaged(StorageError):
    """An append failed and its partial bytes could not be cut off (replay skips them; appends may go on)."""


def encode_header(kind: str, version: int) -> bytes:
    kind_bytes = kind.encode("ascii")
    if not 0 < len(kind_bytes) < 256 or not 0 < version < 65536:
        raise ValueError(f"bad kind {kind!r} or version {version} for a journal")
    described = FILE_MAGIC + _VERSION_AND_KIND_LENGTH.pack(version, len(kind_bytes)) + kind_bytes
    return described + _CRC.pack(crc32c(described))


def encode_record(payload: bytes) -> bytes:
    """One framed record."""
    if len(payload) > MAX_RECORD_BYTES:
        raise ValueError(f"a journal record of {len(payload)} bytes is too large")
    length = struct.pack(">I", len(payload))
    return RECORD_MAGIC + length + _CRC.pack(crc32c(payload, crc32c(length))) + payload


def _record_at(data: bytes, position: int) -> tuple[bytes, int] | None:
    """(payload, end) of an intact record framed at ``position``; None if there is none."""
    if len(data) - position < _RECORD_HEADER.size:
        return None
    magic, length, stored_crc = _RECORD_HEADER.unpack_from(data, position)
    start = position + _RECORD_HEADER.size
    end = start + length
    if magic != RECORD_MAGIC or end > len(data):
        return None
    payload = data[start:end]
    if crc32c(payload, crc32c(data[position + 4 : position + 8])) != stored_crc:
        return None
    return payload, end


class Journal:
    """One journal file: ``replay`` it once at start-up, then ``open`` it to ``append``.

    ``version`` is the format of the records the caller writes; ``readable_versions`` (default: only
    ``version``) are the ones it can still replay. After ``replay``, ``file_version`` is the version found and
    ``damaged_regions`` the number of torn or corrupt stretches that were skipped.
    """

    def __init__(self, path: Path, kind: str, version: int = 1, readable_versions: Collection[int] = ()) -> None:
        self.path = path
        self.kind = kind
        self.version = version
        self.readable_versions = frozenset(readable_versions or (version,))
        self.file_version: int | None = None
        self.damaged_regions = 0
        self._header = encode_header(kind, version)
        self._fd: int | None = None
        self._size = 0  # bytes in the file while open: where a failed append cuts back to

    # --- reading ---------------------------------------------------------------------------------------

    def has_other_format(self) -> bool:
        """Whether the file exists with content that does not even start like a journal (an older format)."""
        try:
            with open(self.path, "rb") as f:
                first = f.read(1)
        except FileNotFoundError:
            return False
        return first not in (b"", FILE_MAGIC[:1])

    def replay(self) -> Iterator[bytes]:
        """Every intact record, in order; nothing if the file does not exist or is empty."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if not data:
            return
        position = self._check_header(data)
        self.damaged_regions = 0
        damaged_from: int | None = None
        while position < len(data):
            found = _record_at(data, position)
            if found is None:
                if damaged_from is None:
                    damaged_from = position
                following = data.find(RECORD_MAGIC, position + 1)
                position = following if following >= 0 else len(data)
                continue
            if damaged_from is not None:
                self._report_damage(damaged_from, position, at_end=False)
                damaged_from = None
            payload, position = found
            yield payload
        if damaged_from is not None:
            self._report_damage(damaged_from, len(data), at_end=True)

    def _check_header(self, data: bytes) -> int:
        """The position of the first record; DamagedFileError if the header is not this journal's."""
        fixed = len(FILE_MAGIC) + _VERSION_AND_KIND_LENGTH.size
        if not data.startswith(FILE_MAGIC):
            raise DamagedFileError(self.path, f"not a kbroker {self.kind} journal (no journal header)")
        if len(data) < fixed:
            raise DamagedFileError(self.path, f"short file: {len(data)} bytes, cut inside the journal header")
        version, kind_length = _VERSION_AND_KIND_LENGTH.unpack_from(data, len(FILE_MAGIC))
        end = fixed + kind_length + _CRC.size
        if len(data) < end:
            raise DamagedFileError(self.path, f"short file: {len(data)} bytes, cut inside the journal header")
        (stored_crc,) = _CRC.unpack_from(data, end - _CRC.size)
        if crc32c(data[: end - _CRC.size]) != stored_crc:
            raise DamagedFileError(self.path, "checksum mismatch in the journal header")
        kind = data[fixed : fixed + kind_length].decode("ascii", "replace")
        if kind != self.kind:
            raise DamagedFileError(self.path, f"is a {kind!r} journal, expected {self.kind!r}")
        if version not in self.readable_versions:
            readable = ", ".join(str(v) for v in sorted(self.readable_versions))
            raise DamagedFileError(self.path, f"{kind} journal version {version} is not supported (reads {readable})")
        self.file_version = version
        return end

    def _report_damage(self, start: int, end: int, *, at_end: bool) -> None:
        self.damaged_regions += 1
        if at_end:
            log.warning(
                "%s: skipping %d bytes at byte %d: a torn or corrupt last record (a write cut by a crash?)",
                self.path,
                end - start,
                start,
            )
        else:
            log.warning(
                "%s: skipping %d damaged bytes at byte %d (a torn or corrupt record); the records after them are kept",
                self.path,
                end - start,
                start,
            )

    # --- writing ---------------------------------------------------------------------------------------

    def open(self) -> None:
        """Open for appending, creating the file (its header written atomically) if it is missing or empty."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            write_atomically(self.path, self._header, sync_directory=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = os.fstat(self._fd).st_size

    def append(self, payloads: Sequence[bytes], *, sync: bool = False) -> None:
        """Append the records with one write, so a crash tears at most the batch's tail; fsync if ``sync``.

        A failed write (a full disk) is undone: the file is cut back to its size before, and the OSError
        raised. If the cut fails too, JournalTailDamaged: the partial record stays, which replay skips (the
        records appended after it are kept). A failed fsync raises its OSError; the records were written and
        may or may not survive a power cut.
        """
        if not payloads:
            return
        data = b"".join(encode_record(payload) for payload in payloads)
        fd = self._open_fd()
        try:
            fs.write_all(fd, data)
        except OSError as exc:
            self._cut_back(fd, exc)
            raise
        self._size += len(data)
        if sync:
            fs.fsync(fd)

    def _cut_back(self, fd: int, cause: OSError) -> None:
        try:
            fs.ftruncate(fd, self._size)
        except OSError as exc:
            self._size = os.fstat(fd).st_size  # the next record starts after the partial one
            raise JournalTailDamaged(
                f"{self.path}: an append failed ({cause.strerror or cause}) and its partial record could not be "
                f"cut off ({exc.strerror or exc}); it will be skipped when the journal is read"
            ) from None

    def sync(self) -> None:
        fs.fsync(self._open_fd())

    def rewrite(self, payloads: Iterable[bytes]) -> None:
        """Replace the journal atomically with exactly these records, in the current version (compaction)."""
        data = self._header + b"".join(encode_record(payload) for payload in payloads)
        write_atomically(self.path, data, sync_directory=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)  # the new file, not the replaced one
            self._size = len(data)
        self.file_version = self.version
        self.damaged_regions = 0

    def close(self, *, sync: bool = True) -> None:
        """Fsync and close; a no-op if not open. ``sync=False`` after a failed fsync: another would prove nothing."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if sync:
                fs.fsync(fd)
        finally:
            os.close(fd)

    def _open_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"journal {self.path} is not open")
        return self._fd
