"""Finalized features and producer id blocks are records of the metadata log (FeatureLevelRecord,
ProducerIdsRecord); the files older kbrokers kept them in (finalized-features.json, producer-id-block) are moved
onto it once, and no producer id is handed out twice, across restarts and across the move."""

from __future__ import annotations

import shutil
from pathlib import Path

import trio

from kbroker.durable.files import read_offset_file, write_checked_json
from kbroker.metadata.controller import LocalController, MetadataCache, record
from kbroker.metadata.log import MetadataLog
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.init_producer_id_request import InitProducerIdRequest
from protocol.metadata_records.feature_level_record import FeatureLevelRecord
from protocol.metadata_records.producer_ids_record import ProducerIdsRecord

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "topics-json-datadir" / "data"
TV = "transaction.version"


def producer_id(client: WireClient) -> int:
    answer = client.request(InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=-1), 4)
    assert answer.error_code == ErrorCode.NONE
    return int(answer.producer_id)


def finalized(client: WireClient) -> dict[str, int]:
    answer = client.request(ApiVersionsRequest(client_software_name="test", client_software_version="1"), 4)
    return {f.name: f.max_version_level for f in answer.finalized_features}


def metadata_records(data_dir: Path) -> list[object]:
    with MetadataLog(data_dir) as metadata_log:
        return [item.message for item in metadata_log.replay().records()]


def test_producer_ids_never_repeat_after_the_move_and_after_restarts(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(FIXTURE, data_dir)
    handed_out_before = read_offset_file(data_dir / "producer-id-block", "producer-id-block", "the next producer id")
    assert handed_out_before > 0  # the older kbroker handed ids out below this
    seen: list[int] = []
    for _ in range(3):
        with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
            seen += [producer_id(client) for _ in range(3)]
    assert min(seen) >= handed_out_before
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert not (data_dir / "producer-id-block").exists()
    assert (data_dir / "producer-id-block.migrated").exists()
    blocks = [r for r in metadata_records(data_dir) if isinstance(r, ProducerIdsRecord)]
    # The move, then one block per start (each committed before its first id was handed out).
    assert [r.next_producer_id for r in blocks] == [handed_out_before + 1000 * n for n in range(4)]
    assert {r.broker_id for r in blocks} == {0}  # the default node.id


def test_a_block_is_refused_for_a_stale_broker_epoch_and_after_the_last_int64_block(tmp_path: Path) -> None:
    cache = MetadataCache()
    controller = LocalController(1, cache, MetadataLog(tmp_path))
    controller.bootstrap()
    epoch = controller.register_broker(1, [], {})
    assert controller.allocate_producer_ids_now(1, epoch) == range(0, 1000)
    try:
        controller.allocate_producer_ids_now(1, epoch + 1)
    except KafkaError as exc:
        assert exc.code == ErrorCode.STALE_BROKER_EPOCH
    else:
        raise AssertionError("a stale broker epoch got a block")
    assert controller.migrate_producer_ids((1 << 63) - 500, 1)
    try:
        trio.run(lambda: controller.allocate_producer_ids(1, epoch))
    except KafkaError as exc:
        assert (exc.code, exc.message) == (
            ErrorCode.UNKNOWN_SERVER_ERROR,
            "Exhausted all producerIds as the next block's end producerId has exceeded the int64 type limit",
        )
    else:
        raise AssertionError("a block past the int64 limit was handed out")
    assert cache.image.next_producer_id == (1 << 63) - 500
    assert controller.metadata_log is not None
    controller.metadata_log.close()


def test_the_finalized_features_file_is_moved_onto_the_metadata_log(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(FIXTURE, data_dir)
    # An older kbroker that had transaction.version set to 0 kept it so (it is not in its levels).
    write_checked_json(data_dir / "finalized-features.json", "finalized-features", 1, {"levels": {}, "epoch": 1})
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        assert finalized(client) == {}
    assert not (data_dir / "finalized-features.json").exists()
    assert (data_dir / "finalized-features.json.migrated").exists()
    levels = [(r.name, r.feature_level) for r in metadata_records(data_dir) if isinstance(r, FeatureLevelRecord)]
    assert levels == [("metadata.version", 30), (TV, 2), (TV, 0)]  # the bootstrap, then the move
    with RunningBroker(data_dir) as broker, WireClient(broker.bootstrap) as client:
        assert finalized(client) == {}  # not moved again, not bootstrapped again


def test_a_metadata_log_written_before_features_moved_gets_the_levels_it_answered_with(tmp_path: Path) -> None:
    # What an older kbroker's bootstrap wrote: metadata.version only (transaction.version 2 was its default).
    with MetadataLog(tmp_path) as metadata_log:
        metadata_log.become_leader(1, 1, [1])
        metadata_log.append([record(FeatureLevelRecord(name="metadata.version", feature_level=30))])
    with RunningBroker(tmp_path) as broker, WireClient(broker.bootstrap) as client:
        assert finalized(client) == {TV: 2}
    levels = [(r.name, r.feature_level) for r in metadata_records(tmp_path) if isinstance(r, FeatureLevelRecord)]
    assert levels == [("metadata.version", 30), (TV, 2)]


def test_a_level_a_registered_broker_does_not_support_is_refused_with_kafkas_message() -> None:
    controller = LocalController(1, MetadataCache(), None)
    controller.bootstrap()  # transaction.version 2
    controller.register_broker(1, [], {TV: (0, 2)})
    controller.register_broker(5, [], {TV: (2, 2)})

    def refusal(level: int, upgrade_type: int) -> str | None:
        try:
            trio.run(lambda: controller.update_features({TV: (level, upgrade_type)}))
        except KafkaError as exc:
            assert exc.code == ErrorCode.INVALID_UPDATE_VERSION
            return exc.message
        return None

    prefix = "The update failed for all features since the following feature had an error: "
    assert refusal(1, 2) == (
        f"{prefix}Invalid update version 1 for feature {TV}. Broker 5 does not support the given version. It "
        "supports 2 to 2."
    )
    controller.register_broker(5, [], {})  # registered again, without the feature
    assert (
        refusal(1, 2) == f"{prefix}Invalid update version 1 for feature {TV}. Broker 5 does not support this feature."
    )
    assert controller.image.features[TV] == 2  # nothing refused was written
    assert refusal(0, 3) is None  # level 0 needs no broker's support
    assert TV not in controller.image.features
