"""Reading a partition log back as a consumer would, for the storage tests."""

from __future__ import annotations

from kbroker.storage import PartitionLog
from protocol.records import BatchHeader, Record, decode_records, iter_batches


def stored_records(plog: PartitionLog) -> list[tuple[BatchHeader, Record]]:
    """Every record the log returns (control records too) with its batch's header, from the log start to its end."""
    out: list[tuple[BatchHeader, Record]] = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        chunk = plog.read(offset, 1 << 20)
        if chunk.size == 0:
            break
        for header, view in iter_batches(chunk.read_bytes()):
            out.extend((header, record) for record in decode_records(view))
        offset = chunk.last_offset + 1
    return out
