"""Offset checkpoint files in Kafka's layout: ``recovery-point-offset-checkpoint`` in the data directory.

Kafka's OffsetCheckpointFile: a version line (0), a line with the number of entries, then one
``<topic> <partition> <offset>`` line per partition. The recovery point of a partition is the offset below
which all of its log was fsynced: after an unclean stop only the segments from the one holding it are
validated (CRC included; a torn end of the log is cut, its bytes kept aside, and a corrupt batch with valid ones
after it is kept in place and reported, see segment.py), the segments before it are trusted.

The file is replaced atomically (file and directory fsynced). A damaged one is refused here with a one-line
DamagedFileError; the log manager then recovers every segment, as Kafka does for a partition the file does
not name, which costs time but never data.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kbroker.durable.files import DamagedFileError, write_atomically

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
CHECKPOINT_VERSION = 0

TopicPartition = tuple[str, int]


def write_offset_checkpoint(path: Path, offsets: Mapping[TopicPartition, int]) -> None:
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    write_atomically(path, "\n".join(lines) + "\n", sync_directory=True)


def read_offset_checkpoint(path: Path) -> dict[TopicPartition, int]:
    """The entries of a checkpoint file ({} if there is none), or DamagedFileError naming what is wrong."""
    try:
        text = path.read_bytes().decode("ascii")
    except FileNotFoundError:
        return {}
    except UnicodeDecodeError:
        raise DamagedFileError(path, "not an ASCII text file") from None
    lines = text.splitlines()
    if not lines or lines[0].strip() != str(CHECKPOINT_VERSION):
        raise DamagedFileError(path, f"expected version {CHECKPOINT_VERSION}, found {(lines or [''])[0][:40]!r}")
    if len(lines) < 2 or not lines[1].strip().isdigit():
        raise DamagedFileError(path, "no entry count on line 2")
    expected = int(lines[1])
    entries: dict[TopicPartition, int] = {}
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split()
        if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
            raise DamagedFileError(path, f"line {number} is not 'topic partition offset': {line[:80]!r}")
        entries[(fields[0], int(fields[1]))] = int(fields[2])
    if len(entries) != expected or len(lines) - 2 != expected:
        raise DamagedFileError(path, f"{len(lines) - 2} entries, but the file says {expected} (cut short?)")
    return entries
