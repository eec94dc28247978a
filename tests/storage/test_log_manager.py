"""Topic metadata and partition directories of the log manager."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from kbroker.durable import fs
from kbroker.durable.fs import FaultyFileSystem
from kbroker.metadata.log import MetadataLog
from kbroker.storage import LogManager, TopicInfo, validate_topic_name
from kbroker.storage.manager import CLEAN_SHUTDOWN_FILE, PARTITION_METADATA_FILE
from protocol.errors import ErrorCode, KafkaError
from protocol.records import Record, build_batch
from tests.storage.reading import stored_records


def one_batch(value: bytes) -> bytearray:
    return bytearray(build_batch([Record(value=value)], base_timestamp=1))


def test_topics_persist_with_ids_partitions_and_configs(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, {"retention.ms": "1000"})
    info = logs.create_topic("orders", 3, {"segment.bytes": "2048"})
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["orders-0", "orders-1", "orders-2"]
    assert logs.get_partition("orders", 2) is not None and logs.get_partition("orders", 3) is None
    assert logs.log_config(info).segment_bytes == 2048 and logs.log_config(info).retention_ms == 1000
    logs.get_partition("orders", 1).append(one_batch(b"x"))  # type: ignore[union-attr]
    logs.close()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()

    again = LogManager(tmp_path, {})
    assert again.clean_start and not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    reloaded = again.topic("orders")
    assert reloaded is not None
    assert (reloaded.topic_id, reloaded.partitions, reloaded.configs) == (info.topic_id, 3, {"segment.bytes": "2048"})
    assert again.topic_by_id(info.topic_id) is reloaded
    assert again.get_partition("orders", 1).high_watermark == 1  # type: ignore[union-attr]
    assert json.loads((tmp_path / "topics.json").read_text())["topics"]["orders"]["partitions"] == 3


def test_delete_and_recreate_starts_empty(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, {})
    old = logs.create_topic("t", 1, {})
    logs.get_partition("t", 0).append(one_batch(b"old"))  # type: ignore[union-attr]
    logs.delete_topic("t")
    assert logs.topic("t") is None and logs.topic_by_id(old.topic_id) is None
    assert not (tmp_path / "t-0").exists()
    new = logs.create_topic("t", 1, {})
    assert new.topic_id != old.topic_id
    assert logs.get_partition("t", 0).high_watermark == 0  # type: ignore[union-attr]


def test_leftover_directory_of_an_interrupted_delete_is_not_reused(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, {})
    logs.create_topic("t", 1, {})
    logs.get_partition("t", 0).append(one_batch(b"old"))  # type: ignore[union-attr]
    logs.close()
    # A crash after the metadata was written but before the directory went away.
    (tmp_path / "topics.json").write_text(json.dumps({"version": 1, "topics": {}}))
    again = LogManager(tmp_path, {})
    again.create_topic("t", 1, {})
    assert again.get_partition("t", 0).high_watermark == 0  # type: ignore[union-attr]


def test_add_partitions_and_alter_config_apply_live(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, {})
    logs.create_topic("t", 1, {})
    plog = logs.get_partition("t", 0)
    logs.add_partitions("t", 4)
    assert logs.get_partition("t", 3) is not None
    logs.alter_topic_config("t", {"max.message.bytes": "100"})
    assert plog.config.max_message_bytes == 100  # type: ignore[union-attr]
    with pytest.raises(KafkaError) as shrink:
        logs.add_partitions("t", 2)
    assert shrink.value.code == ErrorCode.INVALID_PARTITIONS
    with pytest.raises(KafkaError) as unknown:
        logs.add_partitions("nope", 2)
    assert unknown.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize(
    ("name", "problem"),
    [("ok.name_1-x", None), ("", "empty"), ("..", '"." or ".."'), ("a" * 250, "249"), ("bad/name", "character")],
)
def test_topic_name_rules(name: str, problem: str | None) -> None:
    result = validate_topic_name(name)
    assert (result is None) if problem is None else (result is not None and problem in result)


def _restart_with_one_record(tmp_path: Path) -> LogManager:
    logs = LogManager(tmp_path, {})
    logs.create_topic("t", 1, {})
    logs.get_partition("t", 0).append(one_batch(b"kept"))  # type: ignore[union-attr]
    logs.close()
    return LogManager(tmp_path, {})


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (b"version: 0\ntopic_id: not-a-uuid\n", "expected a topic id, found 'not-a-uuid'"),
        (b"\xff\xfe\x00garbage", "cannot be read"),
        (b"version: 7\n", "expected version 0, found '7'"),
    ],
)
def test_a_damaged_partition_metadata_file_keeps_the_data_and_answers_a_storage_error(
    tmp_path: Path, damage: bytes, problem: str
) -> None:
    metadata = tmp_path / "t-0" / PARTITION_METADATA_FILE
    logs = _restart_with_one_record(tmp_path)
    metadata.write_bytes(damage)
    with pytest.raises(KafkaError) as caught:
        logs.get_partition("t", 0)
    assert caught.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert f"damaged file {metadata}: {problem}" in (caught.value.message or "")
    assert logs.all_partitions() == []  # maintenance skips it instead of failing
    assert (tmp_path / "t-0" / "00000000000000000000.log").stat().st_size > 0  # nothing discarded
    info = logs.topic("t")
    assert info is not None
    metadata.write_text(f"version: 0\ntopic_id: {info.topic_id}\n")  # repaired: the record is there
    assert logs.get_partition("t", 0).high_watermark == 1  # type: ignore[union-attr]
    logs.close()


def test_a_missing_partition_metadata_file_is_rewritten_and_the_data_kept(tmp_path: Path) -> None:
    logs = _restart_with_one_record(tmp_path)
    metadata = tmp_path / "t-0" / PARTITION_METADATA_FILE
    metadata.unlink()
    assert logs.get_partition("t", 0).high_watermark == 1  # type: ignore[union-attr]
    info = logs.topic("t")
    assert info is not None and metadata.read_text() == f"version: 0\ntopic_id: {info.topic_id}\n"
    logs.close()


def test_a_partition_directory_of_another_topic_id_is_discarded(tmp_path: Path) -> None:
    logs = _restart_with_one_record(tmp_path)
    metadata = tmp_path / "t-0" / PARTITION_METADATA_FILE
    metadata.write_text("version: 0\ntopic_id: 00000000-0000-0000-0000-000000000001\n")
    assert logs.get_partition("t", 0).high_watermark == 0  # type: ignore[union-attr]
    logs.close()


def test_a_store_kept_in_memory_serves_the_same_engine_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LogManager.in_memory_store: topics, appends, rolls, DeleteRecords, retention, truncation and deletion all
    work, and not one file operation reaches the file system (through the fs seam or otherwise)."""
    monkeypatch.chdir(tmp_path)  # the store's nominal data directory is relative: nothing may appear here either
    with fs.installed(FaultyFileSystem()) as seam:
        logs = LogManager.in_memory_store({"segment.bytes": str(2 * len(one_batch(b"v0")))})
        info = logs.create_topic("orders", 2, {})
        plog = logs.get_partition("orders", 1)
        assert plog is not None and logs.get_partition("orders", 2) is None
        for i in range(6):
            assert plog.append(one_batch(f"v{i}".encode()), now_ms=1).base_offset == i
        assert [s.base_offset for s in plog.segments] == [0, 2, 4]  # rolled by segment.bytes, as on disk
        assert [r.value for _, r in stored_records(plog)] == [b"v0", b"v1", b"v2", b"v3", b"v4", b"v5"]
        plog.delete_records(3)
        assert (plog.log_start_offset, [s.base_offset for s in plog.segments]) == (3, [2, 4])
        plog.truncate_to(5)
        assert (plog.log_end_offset, plog.high_watermark) == (5, 5)
        logs.alter_topic_config("orders", {"retention.ms": "0"})
        assert [s.base_offset for s in logs.apply_retention(now_ms=10**13)] == [2, 4]  # the active one rolled too
        assert (plog.log_start_offset, [s.base_offset for s in plog.segments]) == (5, [5])
        assert logs.topic_by_id(info.topic_id) is info
        logs.delete_topic("orders")
        assert logs.topics() == []
        logs.close()
    assert (seam.steps, list(tmp_path.iterdir())) == (0, [])


def test_the_metadata_log_directory_is_not_a_topic_partition(tmp_path: Path) -> None:
    """``__cluster_metadata-0`` is named like a partition directory: it is neither taken for a topic when the
    topics are rebuilt from the directories nor moved aside as a stray."""
    MetadataLog(tmp_path).close()
    catalog_kept = LogManager(tmp_path, {}, catalog=[])
    assert catalog_kept.topics() == [] and (tmp_path / "__cluster_metadata-0").is_dir()
    catalog_kept.close()
    rebuilt = LogManager(tmp_path, {})  # no topics.json: rebuilt from the partition directories
    assert rebuilt.topics() == [] and (tmp_path / "__cluster_metadata-0").is_dir()
    assert not list(tmp_path.glob("*-stray"))
    rebuilt.close()


def test_a_catalog_from_the_image_writes_no_topics_json(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, {}, catalog=[])
    new = logs.register_topic(TopicInfo("t", uuid.uuid4(), 1, {"retention.ms": "5"}))
    grown = logs.topic("t")
    assert new == range(0, 1) and grown is not None
    assert logs.get_partition("t", 0) is None  # not served before its files are made
    logs.finish_building(grown, new, logs.build_partitions(grown, new.start, new.stop))
    logs.get_partition("t", 0).append(one_batch(b"x"))  # type: ignore[union-attr]
    assert (tmp_path / "t-0" / PARTITION_METADATA_FILE).exists()
    assert logs.register_topic(TopicInfo("t", grown.topic_id, 3, {})) == range(1, 3)
    assert (grown.partitions, grown.configs) == (3, {})
    assert logs.get_partition("t", 0).config.retention_ms != 5  # type: ignore[union-attr]
    logs.delete_topic("t")
    logs.close()
    assert not (tmp_path / "topics.json").exists() and not (tmp_path / "t-0").exists()
