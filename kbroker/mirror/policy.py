"""Which source topics ``kbroker mirror`` copies and what they are called in the target.

Modelled on MirrorMaker 2's replication policies (KIP-382): ``prefix`` is DefaultReplicationPolicy, a topic ``t``
of the cluster aliased ``source`` becomes ``source.t`` in the target; ``identity`` keeps the name
(IdentityReplicationPolicy). A topic is copied when the ``--topics`` regular expression matches its whole name
(as MM2's ``topics`` list does), it is not internal (``__consumer_offsets``, ``*.internal``, ``mm2-*``) and,
under ``prefix``, it is not itself a replica: a name whose first ``.``-separated part is the source or the target
alias came from mirroring (copying ``target.t`` back into the target would be a cycle, the check MM2 calls
isCycle).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RENAME_POLICIES = ("prefix", "identity")
SEPARATOR = "."


@dataclass(frozen=True)
class ReplicationPolicy:
    rename: str  # "prefix" or "identity"
    source_alias: str
    target_alias: str
    topics: re.Pattern[str]

    def target_topic(self, source_topic: str) -> str:
        if self.rename == "prefix":
            return f"{self.source_alias}{SEPARATOR}{source_topic}"
        return source_topic

    def is_replica(self, topic: str) -> bool:
        """A topic made by mirroring (its name begins with one of the two aliases and a dot)."""
        if self.rename != "prefix" or SEPARATOR not in topic:
            return False
        return topic.split(SEPARATOR, 1)[0] in (self.source_alias, self.target_alias)

    def should_mirror(self, topic: str) -> bool:
        return bool(self.topics.fullmatch(topic)) and not is_internal_topic(topic) and not self.is_replica(topic)


def is_internal_topic(topic: str) -> bool:
    """Kafka's and MirrorMaker's own topics, never copied."""
    return topic.startswith("__") or topic.startswith(".") or topic.endswith(".internal") or topic.startswith("mm2-")


def offset_syncs_topic(source_alias: str) -> str:
    """Where the mirror records which target offset each source offset went to (in the target cluster)."""
    return f"kbroker-mirror-offset-syncs.{source_alias}.internal"


def checkpoints_topic(source_alias: str) -> str:
    """MM2's checkpoints topic in the target: translated group offsets, in MM2's record format."""
    return f"{source_alias}.checkpoints.internal"


def mirror_group(source_alias: str, target_alias: str) -> str:
    """The mirror's own group: its progress (in the source, or in the target with --exactly-once)."""
    return f"kbroker-mirror-{source_alias}-{target_alias}"
