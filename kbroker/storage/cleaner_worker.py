"""The log cleaner's worker process: passes (kbroker/storage/cleaner.py ``run_job``) outside the broker's
interpreter, so that a pass over a large log runs on another core instead of taking turns with request handling
for the broker's GIL.

The broker's LogCleanerService starts ``python -m kbroker.storage.cleaner_worker`` at its first pass and keeps
it. Each job is a frame on stdin, its outcome a frame on stdout; a frame is an 8-byte big-endian length and a
pickle. The outcome is ("done", JobResult), or (kind, message) with kind "aborted" (a segment went away during
the pass), "damaged" (a batch that cannot be read) or "failed" (anything else, named). A pass writes only
``.cleaned`` files beside the segments it reads; the broker swaps them in. The worker ends at the end of its
stdin; killed part-way (shutdown), it leaves ``.cleaned`` files that the broker removes.
"""

from __future__ import annotations

import pickle
import struct
import sys
from typing import BinaryIO

from kbroker.storage.cleaner import CleanerAborted, CleanJob, run_job
from protocol.exceptions import DecodeError

FRAME_LENGTH = struct.Struct(">Q")


def read_frame(stream: BinaryIO) -> bytes | None:
    """One frame's payload, or None at the end of the stream."""
    head = stream.read(FRAME_LENGTH.size)
    if len(head) < FRAME_LENGTH.size:
        return None
    (length,) = FRAME_LENGTH.unpack(head)
    payload = stream.read(length)
    if len(payload) != length:
        return None
    return payload


def frame(payload: bytes) -> bytes:
    return FRAME_LENGTH.pack(len(payload)) + payload


def outcome_of(job: object) -> tuple[str, object]:
    if not isinstance(job, CleanJob):
        return "failed", f"expected a CleanJob, got {type(job).__name__}"
    try:
        return "done", run_job(job)
    except CleanerAborted as exc:
        return "aborted", str(exc)
    except DecodeError as exc:
        return "damaged", str(exc)
    except Exception as exc:  # reported to the broker, which logs it and leaves the partition alone
        return "failed", f"{type(exc).__name__}: {exc}"


def main() -> int:
    while (payload := read_frame(sys.stdin.buffer)) is not None:
        sys.stdout.buffer.write(frame(pickle.dumps(outcome_of(pickle.loads(payload)))))
        sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
