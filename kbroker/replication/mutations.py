"""Test-only mutations of replication: the fault suite's proof that its checker catches a broken broker (issue #30).

``KBROKER_TEST_MUTATIONS=name[,name]`` in a broker's environment replaces, at start-up, one safety mechanism of
the replica layer with a broken one. Nothing else reads the variable, nothing is changed without it, and a broker
running a mutation says so at ERROR level. Never set it on a broker that holds data anyone wants:

- ``high-watermark-without-isr``: a leader moves its high watermark to its own log end, without waiting for the
  in-sync followers (Kafka's maybeIncrementLeaderHW) or min.insync.replicas: acks=all is answered for records
  only the leader has, and a failover loses them.
- ``no-follower-truncation``: a follower never cuts its log (diverging epochs, OffsetForLeaderEpoch,
  out-of-range resets are all ignored): a former leader keeps the records it alone had, at offsets where the new
  leader wrote others, and fetches on from its own end.
- ``no-leader-epoch-fence``: a replica answers fetches whatever leader epoch they name (no FENCED_LEADER_EPOCH
  or UNKNOWN_LEADER_EPOCH, KIP-320), so a fetcher with an older or newer view of the partition is served.

The mutations replace methods of ``Partition`` once, at start-up: the hot path has no test of its own for them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from kbroker.config_registry import ConfigError
from kbroker.replication.partition import Partition, Role

log = logging.getLogger("kbroker.replication")

ENVIRONMENT = "KBROKER_TEST_MUTATIONS"


def _high_watermark_without_isr() -> None:
    def maybe_increment_high_watermark(self: Partition, now_ms: int) -> bool:
        if self.role is not Role.LEADER:
            return False
        return self.log.update_high_watermark(self.log.log_end_offset)

    Partition.maybe_increment_high_watermark = maybe_increment_high_watermark  # type: ignore[method-assign]


def _no_follower_truncation() -> None:
    def truncation_offset(self: Partition, diverging_epoch: int, diverging_end_offset: int) -> int:
        return self.log.log_end_offset

    def truncate_to(self: Partition, offset: int) -> None:
        return None

    Partition.truncation_offset = truncation_offset  # type: ignore[method-assign]
    Partition.truncate_to = truncate_to  # type: ignore[method-assign]


def _no_leader_epoch_fence() -> None:
    fenced = Partition.fetch_error

    def fetch_error(self: Partition, replica_id: int, current_leader_epoch: int, leader_only: bool = True) -> int:
        return fenced(self, replica_id, -1, leader_only)  # -1: "no epoch given", which is never checked

    Partition.fetch_error = fetch_error  # type: ignore[method-assign, assignment]


MUTATIONS: dict[str, Callable[[], None]] = {
    "high-watermark-without-isr": _high_watermark_without_isr,
    "no-follower-truncation": _no_follower_truncation,
    "no-leader-epoch-fence": _no_leader_epoch_fence,
}
_installed: set[str] = set()


def install_from_environment() -> list[str]:
    """Install the mutations ``KBROKER_TEST_MUTATIONS`` names (each once); which ones. Raises ConfigError, in one
    line, for a name that is not one."""
    names = [name.strip() for name in os.environ.get(ENVIRONMENT, "").split(",") if name.strip()]
    unknown = [name for name in names if name not in MUTATIONS]
    if unknown:
        raise ConfigError(f"{ENVIRONMENT}: no mutation named {', '.join(unknown)} (there are {', '.join(MUTATIONS)})")
    for name in names:
        if name not in _installed:
            MUTATIONS[name]()
            _installed.add(name)
            log.error("TEST-ONLY MUTATION %s is on (%s): this broker is broken on purpose", name, ENVIRONMENT)
    return names
