"""Finalized features (KIP-584) as the controller validates them: Kafka's FeatureControlManager.

The finalized levels are FeatureLevelRecords of the metadata log, so they live in the image
(``MetadataImage.features``); this module holds what the controller checks an UpdateFeatures against: the levels
this node supports, what a new cluster is formatted with, and Kafka's refusals in Kafka's order and words.

Kafka's checks (its error code is INVALID_UPDATE_VERSION, the whole request fails, the message names the first
feature that failed in the order a java.util.HashMap of the names iterates): an upgrade type other than 1
(upgrade), 2 (safe downgrade) or 3 (unsafe downgrade); a level below 0; a feature this node does not know ("not
found" for level 0); a level outside the supported range; a level a registered broker does not support (each
broker registers the features it supports, RegisterBrokerRecord.features); a lower level with the upgrade type
"upgrade"; a higher one with a downgrade type. Several updates of one feature: the last counts.
"""

from __future__ import annotations

from collections.abc import Mapping

from kbroker.java_hashing import java_hashmap_order, java_string_hash

TRANSACTION_VERSION = "transaction.version"
# Feature name -> (lowest, highest) level UpdateFeatures accepts and ApiVersions advertises; a feature finalized
# at 0 is not listed as finalized. metadata.version is in the image (a FeatureLevelRecord written at bootstrap, as
# Kafka's storage tool writes it) but kbroker has one metadata layout, so it is neither advertised nor changed.
SUPPORTED_LEVELS: Mapping[str, tuple[int, int]] = {TRANSACTION_VERSION: (0, 2)}
# What a new metadata log is formatted with beside metadata.version, as a Kafka 4.3 cluster formatted by its
# storage tool: Java 4.x clients then use transaction version 2.
DEFAULT_LEVELS: Mapping[str, int] = {TRANSACTION_VERSION: 2}

# The feature ranges a kbroker broker registers with under Apache Kafka's KRaft controllers (kbroker/kraft): what
# it reads and serves. metadata.version 7 is 3.3-IV3, the oldest a Kafka 4 KRaft cluster runs; 33 is Kafka 4.4's
# newest (the records are generated from its schemas). Share groups and Streams groups are not served yet, so a
# quorum that finalized share.version or streams.version above 0 refuses such a broker, as it should.
KRAFT_BROKER_FEATURES: Mapping[str, tuple[int, int]] = {
    "metadata.version": (7, 33),
    "kraft.version": (0, 1),
    **SUPPORTED_LEVELS,
    "group.version": (0, 1),
    "eligible.leader.replicas.version": (0, 1),
    "share.version": (0, 0),
    "streams.version": (0, 0),
}

UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3
REFUSED_PREFIX = "The update failed for all features since the following feature had an error: "


BrokerFeatures = Mapping[int, Mapping[str, tuple[int, int]]]  # broker id -> feature -> supported (min, max)


def update_problem(
    name: str, level: int, upgrade_type: int, current: int, node_id: int, brokers: BrokerFeatures
) -> str | None:
    """Why Kafka's controller refuses setting ``name`` to ``level`` (finalized at ``current``; ``brokers``: what
    each registered broker supports), in its words; None if it may."""
    if upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
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
    for broker_id, supported_features in brokers.items():
        broker_range = supported_features.get(name)
        if broker_range is None:
            if level > 0:
                return f"Broker {broker_id} does not support this feature."
        elif not broker_range[0] <= level <= broker_range[1]:
            return (
                f"Broker {broker_id} does not support the given version. It supports {broker_range[0]} to "
                f"{broker_range[1]}."
            )
    if level < current and upgrade_type == UPGRADE:
        return (
            "Can't downgrade the version of this feature without setting the upgrade type to either safe or "
            "unsafe downgrade."
        )
    if level > current and upgrade_type != UPGRADE:
        return "Can't downgrade to a newer version."
    return None


def first_refusal(
    updates: Mapping[str, tuple[int, int]], finalized: Mapping[str, int], node_id: int, brokers: BrokerFeatures
) -> str | None:
    """The message Kafka refuses ``updates`` (name -> (level, upgrade type)) with, or None if every one may."""
    for name in java_hashmap_order(list(updates), java_string_hash):  # Kafka checks them in a HashMap's order
        level, upgrade_type = updates[name]
        problem = update_problem(name, level, upgrade_type, finalized.get(name, 0), node_id, brokers)
        if problem is not None:
            return f"{REFUSED_PREFIX}Invalid update version {level} for feature {name}. {problem}"
    return None
