"""UpdateFeatures (key 57), versions 0-2: finalize feature levels (KIP-584), and the finalized features ApiVersions
reports.

The one feature kbroker has is transaction.version (supported 0-2, finalized at 2 when the broker is new, as in a
Kafka 4.3 cluster). A level set here takes effect in every later ApiVersions answer: the finalized level, and
the finalized features epoch, which grows by one with each change (Kafka's is the offset of the change in its
metadata log; clients only need it to grow). Level 0 removes the feature from the finalized list, as in Kafka.
The levels and the epoch are kept in ``finalized-features.json`` in the data directory, written before the
answer, so a restart keeps them; the file exists only once a level has been changed.

Kafka's checks and answers, in Kafka's order (its error code is INVALID_UPDATE_VERSION, with a message naming
the first feature that failed, in the order a java.util.HashMap of the names iterates; the whole request fails):
an upgrade type other than 1 (upgrade), 2 (safe downgrade) or 3 (unsafe downgrade); a level below 0; a feature
kbroker does not know ("not found" for level 0); a level above the supported range; a lower level with the
upgrade type "upgrade"; a higher one with a downgrade type. Several updates of one feature: the last counts.

- v0: each update carries allow_downgrade, which Kafka 4 ignores (it reads only the upgrade type, 1 in v0).
- v1: upgrade_type replaces allow_downgrade; validate_only checks without changing anything.
- v2: no per-feature results on success (v0-1 list each update with NONE and the message "NONE", as Kafka).
The request's timeout_ms is not used: the change is made before the answer, as Kafka 4.3 answers even with 0.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import trio

from kbroker.apis.context import RequestContext
from kbroker.durable.files import read_checked_json, write_checked_json
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.update_features_request import UpdateFeaturesRequest
from protocol.messages.update_features_response import UpdateFeaturesResponse

TRANSACTION_VERSION = "transaction.version"
# Feature name -> (lowest, highest) supported level; a feature finalized at 0 is not listed as finalized.
SUPPORTED_LEVELS: dict[str, tuple[int, int]] = {TRANSACTION_VERSION: (0, 2)}
# What a broker starts with, as a Kafka 4.3 cluster formatted by its storage tool: Java 4.x clients then use
# transaction version 2.
DEFAULT_LEVELS: dict[str, int] = {TRANSACTION_VERSION: 2}
FEATURES_FILE = "finalized-features.json"
_FILE_KIND = "finalized-features"
_FILE_VERSION = 1

UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


class _HasDataDir(Protocol):
    @property
    def data_dir(self) -> Path: ...


@dataclass
class FinalizedFeatures:
    """The finalized feature levels of one broker and their epoch; changed only by ``update``."""

    path: Path
    levels: dict[str, int]  # features finalized at a level above 0
    epoch: int = 0  # one per change since the broker was new
    _changes: trio.Lock = field(default_factory=trio.Lock)

    @classmethod
    def load(cls, data_dir: Path) -> FinalizedFeatures:
        """The features kept in ``data_dir``; the defaults while no level was ever changed there.

        Raises DamagedFileError if the file is not one kbroker wrote."""
        path = data_dir / FEATURES_FILE
        if not path.exists():
            return cls(path, dict(DEFAULT_LEVELS))
        _, document = read_checked_json(path, _FILE_KIND, {_FILE_VERSION})
        return cls(path, {name: int(level) for name, level in document["levels"].items()}, int(document["epoch"]))

    def level(self, name: str) -> int:
        return self.levels.get(name, 0)

    async def update(self, levels: dict[str, int]) -> None:
        """Set each feature's level; written to disk (off the event loop) before anyone sees it."""
        async with self._changes:
            new_levels = {**self.levels, **levels}
            new_levels = {name: level for name, level in new_levels.items() if level > 0}
            if new_levels == self.levels:
                return  # nothing changed: no new epoch, as Kafka writes no record for an unchanged level
            document = {"levels": new_levels, "epoch": self.epoch + 1}
            await trio.to_thread.run_sync(write_checked_json, self.path, _FILE_KIND, _FILE_VERSION, document)
            self.levels, self.epoch = new_levels, self.epoch + 1


# One per running broker (the cluster object handlers see), loaded on first use: a restarted broker is a new
# object and reads the file again.
_BY_BROKER: weakref.WeakKeyDictionary[_HasDataDir, FinalizedFeatures] = weakref.WeakKeyDictionary()


def finalized_features(cluster: _HasDataDir) -> FinalizedFeatures:
    features = _BY_BROKER.get(cluster)
    if features is None:
        features = _BY_BROKER[cluster] = FinalizedFeatures.load(cluster.data_dir)
    return features


def java_hash_map_order(names: list[str]) -> list[str]:
    """``names`` (distinct) in the order a java.util.HashMap filled with them in this order iterates: by bucket
    (the String hash, its high half folded in, modulo a capacity of 16 doubled while more than 3/4 full), then
    by insertion within a bucket. Kafka checks feature updates in this order and reports the first failure."""
    capacity = 16
    while len(names) > capacity * 3 // 4:
        capacity *= 2

    def bucket(name: str) -> int:
        utf16 = name.encode("utf-16-be")
        h = 0
        for i in range(0, len(utf16), 2):
            h = (31 * h + int.from_bytes(utf16[i : i + 2], "big")) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(names, key=bucket)  # stable: insertion order within a bucket


def _problem(update: UpdateFeaturesRequest.FeatureUpdateKey, current: int, node_id: int) -> str | None:
    """Why Kafka refuses this update, in Kafka's words; None if it is valid."""
    name, level = update.feature, update.max_version_level
    if update.upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
        return "The controller does not support the given upgrade type."
    if level < 0:
        return "A feature version cannot be less than 0."
    supported = SUPPORTED_LEVELS.get(name)
    if supported is None:
        return (
            f"Feature {name} not found." if level == 0 else f"Local controller {node_id} does not support this feature."
        )
    low, high = supported
    if level > high or (level != 0 and level < low):
        return f"Local controller {node_id} only supports versions {low}-{high}"
    if level < current and update.upgrade_type == UPGRADE:
        return (
            "Can't downgrade the version of this feature without setting the upgrade type to either safe or "
            "unsafe downgrade."
        )
    if level > current and update.upgrade_type != UPGRADE:
        return "Can't downgrade to a newer version."
    return None


async def handle_update_features(ctx: RequestContext, request: UpdateFeaturesRequest) -> UpdateFeaturesResponse:
    # As Kafka's controller: ALTER on the cluster, else the request fails (its message names the request object).
    if not ctx.authorize(AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    features = finalized_features(ctx.cluster)
    latest = {update.feature: update for update in request.feature_updates}  # like a map: the last update counts
    for name in java_hash_map_order(list(latest)):
        update = latest[name]
        problem = _problem(update, features.level(name), ctx.cluster.node_id)
        if problem is not None:
            return UpdateFeaturesResponse(
                throttle_time_ms=0,
                error_code=ErrorCode.INVALID_UPDATE_VERSION,
                error_message=(
                    "The update failed for all features since the following feature had an error: "
                    f"Invalid update version {update.max_version_level} for feature {name}. {problem}"
                ),
                results=[],
            )
    if not request.validate_only:
        await features.update({name: update.max_version_level for name, update in latest.items()})
    results = [
        UpdateFeaturesResponse.UpdatableFeatureResult(
            feature=update.feature, error_code=ErrorCode.NONE, error_message=ErrorCode.NONE.name
        )
        for update in request.feature_updates
    ]
    return UpdateFeaturesResponse(
        throttle_time_ms=0,
        error_code=ErrorCode.NONE,
        error_message=None,
        results=results if ctx.api_version < 2 else [],
    )
