"""Transaction state in ``__transaction_state`` as Kafka keeps it: one TransactionLog record per transition.

Key TransactionLogKey (the transactional id), value TransactionLogValue v1 (producer id and epoch, previous and
next producer id, timeout, status, partitions, timestamps, client transaction version), a tombstone when the id
expires; Kafka's ``kafka-dump-log --transaction-log-decoder`` reads them. The partition of an id is Kafka's:
``abs(hashCode(transactional id)) % transaction.state.log.num.partitions``.

A transaction's consumer groups are listed among its partitions as their ``__consumer_offsets`` partitions, as
Kafka lists them. What kbroker keeps beyond Kafka's fields (the groups by name, the last producer epoch, the last
completed transaction that marker reconciliation uses) travels in one tagged field of the value, ``KBROKER_TAG``,
as compact JSON: a tagged field Kafka's readers do not know is kept and skipped by them.

Records are the coordinator's ``to_record`` dicts (kbroker/transactions/coordinator.py) in and out, so this module
knows nothing of the coordinator's classes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kbroker.coordinators.runtime import CoordinatorRecord
from kbroker.groups.offsets import OFFSETS_TOPIC
from kbroker.java_hashing import coordinator_partition
from protocol import coordinator_records
from protocol.coordinator_frame import UnknownRecordType, decode_coordinator_record, encode_coordinator_record
from protocol.exceptions import DecodeError

log = logging.getLogger("kbroker.transactions")

TRANSACTION_TOPIC = "__transaction_state"
DEFAULT_PARTITIONS = 50
DEFAULT_SEGMENT_BYTES = 104857600
VALUE_VERSION = 1  # flexible: it has the tagged fields
KBROKER_TAG = 10_000  # far above Kafka's tags (0-3)
# Kafka's TransactionState ids (its transaction_status field), by kbroker's state names.
STATUS_IDS = {
    "Empty": 0,
    "Ongoing": 1,
    "PrepareCommit": 2,
    "PrepareAbort": 3,
    "CompleteCommit": 4,
    "CompleteAbort": 5,
    "Dead": 6,
    "PrepareEpochFence": 7,
}
STATUS_NAMES = {number: name for name, number in STATUS_IDS.items()}


def transaction_topic_configs(segment_bytes: int) -> dict[str, str]:
    """The configs __transaction_state is created with (by FindCoordinator, the coordinator, or auto-creation)."""
    return {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes), "compression.type": "producer"}


def transaction_record(record: dict[str, Any], offsets_partitions: int) -> CoordinatorRecord:
    """The TransactionLog record of a coordinator record dict (its ``to_record``)."""
    key = coordinator_records.TransactionLogKey(transactional_id=record["id"])
    by_topic: dict[str, list[int]] = {}
    for topic, partition in record["partitions"]:
        by_topic.setdefault(topic, []).append(partition)
    for group in record["groups"]:
        by_topic.setdefault(OFFSETS_TOPIC, []).append(coordinator_partition(group, offsets_partitions))
    extra = {"last_epoch": record["last_epoch"], "groups": record["groups"]}
    # __consumer_offsets partitions added by name (a TxnOffsetCommit verified from another broker), not by group.
    named_offsets = sorted({partition for topic, partition in record["partitions"] if topic == OFFSETS_TOPIC})
    if named_offsets:
        extra["offsets"] = named_offsets
    if "done" in record:
        extra["done"] = record["done"]
    value = coordinator_records.TransactionLogValue(
        producer_id=record["pid"],
        previous_producer_id=record["prev_pid"],
        next_producer_id=record["next_pid"],
        producer_epoch=record["epoch"],
        transaction_timeout_ms=record["timeout"],
        transaction_status=STATUS_IDS[record["state"]],
        transaction_partitions=[
            coordinator_records.TransactionLogValue.PartitionsSchema(topic=topic, partition_ids=sorted(set(ids)))
            for topic, ids in sorted(by_topic.items())
        ],
        transaction_last_update_timestamp_ms=record["update"],
        transaction_start_timestamp_ms=record["start"],
        client_transaction_version=record["tv"],
        unknown_tagged_fields={KBROKER_TAG: json.dumps(extra, separators=(",", ":")).encode()},
    )
    return encode_coordinator_record(key, value, VALUE_VERSION)


def transaction_tombstone(transactional_id: str) -> CoordinatorRecord:
    return encode_coordinator_record(coordinator_records.TransactionLogKey(transactional_id=transactional_id), None)


def record_of(
    key: coordinator_records.TransactionLogKey, value: coordinator_records.TransactionLogValue
) -> dict[str, Any]:
    """The coordinator record dict a TransactionLog record holds (one Kafka wrote has no kbroker tag)."""
    tags = value.unknown_tagged_fields or {}
    tagged = tags.get(KBROKER_TAG)
    extra: dict[str, Any] = json.loads(tagged) if tagged is not None else {}

    # The groups' __consumer_offsets partitions come back as the groups; those added by name as partitions (all
    # of them from a record Kafka wrote, which names no groups).
    partitions = [
        [p.topic, index]
        for p in value.transaction_partitions or []
        if p.topic != OFFSETS_TOPIC or tagged is None
        for index in p.partition_ids
    ]
    partitions.extend([OFFSETS_TOPIC, index] for index in extra.get("offsets", []))
    record = {
        "id": key.transactional_id,
        "pid": value.producer_id,
        "epoch": value.producer_epoch,
        "last_epoch": extra.get("last_epoch", -1),
        "prev_pid": value.previous_producer_id,
        "next_pid": value.next_producer_id,
        "timeout": value.transaction_timeout_ms,
        "state": STATUS_NAMES[value.transaction_status],
        "partitions": partitions,
        "groups": extra.get("groups", []),
        "start": value.transaction_start_timestamp_ms,
        "update": value.transaction_last_update_timestamp_ms,
        "tv": max(value.client_transaction_version, 1),
    }
    if "done" in extra:
        record["done"] = extra["done"]
    return record


@dataclass
class TransactionStateShard:
    """The transactional ids of one __transaction_state partition: the replay of its records, applied to the
    coordinator's table of ids (``apply``: the id's record dict, or None when it is gone, and this partition)."""

    partition: int
    apply: Callable[[str, dict[str, Any] | None, int], None]
    ids: set[str] = field(default_factory=set)
    skipped: int = 0

    def replay(
        self, offset: int, producer_id: int, producer_epoch: int, key: bytes | None, value: bytes | None
    ) -> None:
        try:
            record = decode_coordinator_record("transaction", key, value)
            assert isinstance(record.key, coordinator_records.TransactionLogKey)
            transactional_id = record.key.transactional_id
            if record.value is None:
                self.ids.discard(transactional_id)
                self.apply(transactional_id, None, self.partition)
                return
            assert isinstance(record.value, coordinator_records.TransactionLogValue)
            state = record_of(record.key, record.value)
        except UnknownRecordType:
            return
        except (DecodeError, ValueError, KeyError, TypeError) as exc:
            self.skipped += 1
            log.warning("%s-%d offset %d: skipping a record: %s", TRANSACTION_TOPIC, self.partition, offset, exc)
            return
        if state["state"] == "Dead":
            self.ids.discard(transactional_id)
            self.apply(transactional_id, None, self.partition)
            return
        self.ids.add(transactional_id)
        self.apply(transactional_id, state, self.partition)

    def replay_end_transaction(self, producer_id: int, commit: bool, offset: int = -1) -> None:
        """The transaction coordinator's own log holds no transactions."""
