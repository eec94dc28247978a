"""Consumer group offsets follow the records to the target (MirrorMaker 2's checkpoints): a group that committed
offset N in the source resumes in the target at the translated offset and reads exactly the records after N."""

from __future__ import annotations

from collections.abc import Callable

from kbroker.mirror.checkpoints import Checkpoint, OffsetSync, OffsetSyncStore, runs
from tests.mirror.conftest import Pair, Result, create_topic, produce, read_all

BASE_TIMESTAMP = 1_700_000_000_000


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.structs import OffsetAndMetadata

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.alter_group_offsets(
            group, {TopicPartition(t, p): OffsetAndMetadata(o, "app-meta", -1) for (t, p), o in offsets.items()}
        )
    finally:
        admin.close()


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None})[group]
        return {(tp.topic, tp.partition): o.offset for tp, o in offsets.items()}
    finally:
        admin.close()


def resume(bootstrap: str, group: str, topic: str, partitions: int) -> list[tuple[int, bytes | None]]:
    """What a consumer of ``group`` reads in ``topic`` from its committed offsets to the end."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="none"
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        read: list[tuple[int, bytes | None]] = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for batch in consumer.poll(timeout_ms=500).values():
                read.extend((r.partition, r.value) for r in batch)
        return sorted(read)
    finally:
        consumer.close(autocommit=False)


def test_group_offsets_translated(pair: Pair, kbroker: Callable[..., Result]) -> None:
    topic, group = f"clicks-{pair.alias}", f"app-{pair.alias}"
    target_topic = f"{pair.alias}.{topic}"
    create_topic(pair.source, topic, 2)
    for batch in range(3):  # several produce batches: several offset syncs per partition
        produce(pair.source, topic, [(i % 2, None, f"c{batch}-{i}".encode(), [], BASE_TIMESTAMP) for i in range(20)])
    # the target topic already holds 5 records in partition 0: there the offsets drift by 5
    create_topic(pair.target, target_topic, 2)
    produce(pair.target, target_topic, [(0, None, b"before", [], BASE_TIMESTAMP)] * 5)
    commit(pair.source, group, {(topic, 0): 12, (topic, 1): 30})
    commit(pair.source, f"other-{pair.alias}", {(topic, 0): 3})  # not matched by --groups

    result = kbroker(
        "mirror", "--source", pair.source, "--target", pair.target, "--topics", topic,
        "--source-alias", pair.alias, "--groups", f"app-{pair.alias}", "--once",
    )  # fmt: skip

    assert result.exit_code == 0, result.stderr
    assert committed(pair.target, group) == {(target_topic, 0): 17, (target_topic, 1): 30}
    assert committed(pair.target, f"other-{pair.alias}") == {}
    source_values = [(p, v) for p, offset, _k, v, _h, _t in read_all(pair.source, topic) if offset >= (12, 30)[p]]
    assert resume(pair.target, group, target_topic, 2) == sorted(source_values)
    checkpoint_records = read_all(pair.target, f"{pair.alias}.checkpoints.internal")
    checkpoints = [Checkpoint.decode(key, value) for _p, _o, key, value, _h, _t in checkpoint_records]
    assert checkpoints == [
        Checkpoint(group, target_topic, 0, 12, 17, "app-meta"),
        Checkpoint(group, target_topic, 1, 30, 30, "app-meta"),
    ]


def test_active_target_group_is_left_alone(
    broker_factory: Callable[..., object], kbroker: Callable[..., Result]
) -> None:
    from kafka import KafkaConsumer

    source, target = broker_factory().bootstrap, broker_factory().bootstrap  # type: ignore[attr-defined]
    create_topic(source, "t", 1)
    produce(source, "t", [(0, None, b"v", [], BASE_TIMESTAMP)] * 10)
    commit(source, "busy", {("t", 0): 8})
    create_topic(target, "source.t", 1)
    member = KafkaConsumer("source.t", bootstrap_servers=target, group_id="busy", enable_auto_commit=False)
    member.partitions_for_topic("source.t")  # before the join (kafka-python 3.0.12: tests/commands/test_groups.py)
    try:
        while not member.assignment():
            member.poll(timeout_ms=200)
        result = kbroker("mirror", "--source", source, "--target", target, "--topics", "t", "--groups", "busy",
                         "--once")  # fmt: skip
        assert result.exit_code == 0, result.stderr
        assert committed(target, "busy") == {}  # a member is active there: MM2 does not move it either
    finally:
        member.close(autocommit=False)
    checkpoints = [Checkpoint.decode(k, v) for *_, k, v, _h, _t in read_all(target, "source.checkpoints.internal")]
    assert checkpoints == [Checkpoint("busy", "source.t", 0, 8, 8, "app-meta")]


# --- translation rules ----------------------------------------------------------------------------------------


def test_runs_split_where_either_side_skips() -> None:
    pairs = [(0, 10), (1, 11), (2, 12), (4, 13), (5, 14), (6, 16)]
    assert runs("t", 0, pairs) == [
        OffsetSync("t", 0, 0, 10, 3),
        OffsetSync("t", 0, 4, 13, 2),
        OffsetSync("t", 0, 6, 16, 1),
    ]


def test_translation_is_exact_inside_runs_and_never_skips_outside() -> None:
    store = OffsetSyncStore()
    for sync in runs("t", 0, [(0, 10), (1, 11), (2, 12), (5, 13), (6, 14)]):
        store.add(sync)
    assert store.translate("t", 0, 0) == 10
    assert store.translate("t", 0, 2) == 12
    assert store.translate("t", 0, 3) == 13  # just after a run: its next target offset
    assert store.translate("t", 0, 4) == 13  # in a gap of the source: the offset after the run before it
    assert store.translate("t", 0, 6) == 14
    assert store.translate("t", 0, 7) == 15
    assert store.translate("t", 0, 100) == 15  # not copied yet: where the next copy will go, at the earliest
    assert store.translate("u", 0, 1) is None
    late = OffsetSyncStore()
    late.add(OffsetSync("t", 0, 10, 0, 5))
    assert late.translate("t", 0, 9) is None  # before anything known: not translatable


def test_translation_prefers_the_newest_copy() -> None:
    store = OffsetSyncStore()
    store.add(OffsetSync("t", 0, 0, 0, 150))  # first run copied 0..149
    store.add(OffsetSync("t", 0, 100, 150, 50))  # a restart copied 100..149 again, to 150..199
    store.add(OffsetSync("t", 0, 150, 200, 50))
    assert store.translate("t", 0, 120) == 170
    assert store.translate("t", 0, 50) == 50
    assert store.translate("t", 0, 160) == 210


def test_record_formats_are_mm2s() -> None:
    sync = OffsetSync("orders", 3, 7, 9, 2)
    assert sync.key() == b"\x00\x06orders\x00\x00\x00\x03"
    assert sync.value() == (7).to_bytes(8, "big") + (9).to_bytes(8, "big") + (2).to_bytes(4, "big")
    assert OffsetSync.decode(sync.key(), sync.value()) == sync
    assert OffsetSync.decode(sync.key(), sync.value()[:16]) == OffsetSync("orders", 3, 7, 9, 1)  # MM2's own
    checkpoint = Checkpoint("g", "a.t", 1, 5, 6, "m")
    assert checkpoint.key() == b"\x00\x01g\x00\x03a.t\x00\x00\x00\x01"
    assert checkpoint.value() == b"\x00\x00" + (5).to_bytes(8, "big") + (6).to_bytes(8, "big") + b"\x00\x01m"
    assert Checkpoint.decode(checkpoint.key(), checkpoint.value()) == checkpoint
