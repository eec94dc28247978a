"""OffsetFetch reads committed offsets as of the last committed offset of the group's __consumer_offsets partition
(its high watermark), as Kafka's CoordinatorRuntime reads its timeline there; writes see every record. On a
single node the high watermark follows each append; a leader with records past its high watermark (followers
not caught up, or a restart whose checkpoint is behind its log end) answers what is committed only."""

from __future__ import annotations

from pathlib import Path

from kbroker.groups.offsets import OFFSETS_TOPIC, CommittedOffset, OffsetsShard, OffsetStore, offset_commit_record
from kbroker.storage import LogManager

GROUP, OTHER = "readers", "others"
TP = ("orders", 0)


def offset(value: int) -> CommittedOffset:
    return CommittedOffset(value, -1, "", 1000 + value)


def test_reads_undo_what_is_past_the_committed_offset() -> None:
    shard = OffsetsShard(0)
    writes = [
        (GROUP, offset(5)),  # log offset 0
        (OTHER, offset(1)),  # 1
        (GROUP, offset(7)),  # 2
        (GROUP, None),  # 3: a tombstone (the offset deleted)
    ]
    for log_offset, (group, committed) in enumerate(writes):
        key, value = offset_commit_record(group, *TP, committed)
        shard.replay(log_offset, -1, -1, key, value)
    # Offsets committed in a transaction (log offsets 4 and 5), then its commit marker at 6.
    for log_offset, value in ((4, 8), (5, 9)):
        key, record_value = offset_commit_record(GROUP, *TP, offset(value))
        shard.replay(log_offset, 42, 0, key, record_value)
    shard.replay_end_transaction(42, True, 6)
    assert shard.offsets[GROUP] == {TP: offset(9)}  # the latest state: every record
    expected = {0: {}, 1: {TP: offset(5)}, 2: {TP: offset(5)}, 3: {TP: offset(7)}, 4: {}, 6: {}, 7: {TP: offset(9)}}
    for committed_offset, seen in expected.items():
        fresh = OffsetsShard(0)  # each read on its own shard: a read forgets what is below its offset
        fresh.offsets = {group: dict(values) for group, values in shard.offsets.items()}
        fresh.uncommitted = list(shard.uncommitted)
        assert fresh.offsets_at(GROUP, committed_offset) == seen, committed_offset
    assert shard.offsets_at(OTHER, 2) == {TP: offset(1)}
    # Reads at a later committed offset forget the changes below it.
    assert shard.offsets_at(GROUP, 3) == {TP: offset(7)}
    assert [change[0] for change in shard.uncommitted] == [3, 6]
    assert shard.offsets_at(GROUP, 7) == {TP: offset(9)} and shard.uncommitted == []


def test_a_leader_with_records_past_its_high_watermark_answers_what_is_committed(tmp_path: Path) -> None:
    store = OffsetStore.in_data_dir(tmp_path, partitions=1)
    store.commit(GROUP, {TP: offset(5)})  # log offset 0
    store.commit(GROUP, {TP: offset(7)})  # log offset 1
    assert store.committed_offsets(GROUP) == {TP: offset(7)}  # one node: committed as appended
    store.close()
    # Reopened with its high watermark at 1: the second commit is in the log but not committed.
    logs = LogManager(tmp_path, {}, high_watermarks={(OFFSETS_TOPIC, 0): 1})
    reopened = OffsetStore(logs, partitions=1)
    try:
        assert reopened.get(GROUP) == {TP: offset(7)}  # what writes are checked against
        assert reopened.committed_offsets(GROUP) == {TP: offset(5)}  # what OffsetFetch answers
        plog = logs.get_partition(OFFSETS_TOPIC, 0)
        assert plog is not None and plog.update_high_watermark(2)  # the followers caught up
        assert reopened.committed_offsets(GROUP) == {TP: offset(7)}
    finally:
        logs.close()
