"""Start Apache Kafka 4.4 (compat/apache_kafka.py) and kbroker, ask both for ApiVersions, print the README's table.

    python tools/api_versions_table.py            # the Markdown table of every API Kafka advertises

Each row is an API Kafka advertises, its version range there and in kbroker, and what the gap is: the issue
that will close it, or why it is not planned. tests/kafka/test_differential_kafka.py checks the same gaps.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compat.apache_kafka import KAFKA_VERSION, ApacheKafka, KafkaUnavailable  # noqa: E402
from kbroker.testing import RunningBroker  # noqa: E402
from kbroker.wire_client import WireClient  # noqa: E402
from protocol.messages import APIS  # noqa: E402
from protocol.messages.api_versions_request import ApiVersionsRequest  # noqa: E402

TRANSACTIONS = "transactions: #16"
TOKENS = "delegation tokens (KIP-48): not built (UNSUPPORTED.md)"
NOT_PLANNED_KRAFT = "not planned: KRaft controller and cluster internals"
NOT_PLANNED_SHARE = "not planned: share groups (KIP-932)"
NOT_PLANNED_STREAMS = "not planned: streams groups (KIP-1071)"

# Why kbroker's range differs from Kafka's, per API name.
GAP_REASONS = {
    "OffsetCommit": "v10 (topic ids): no client needs it yet (UNSUPPORTED.md)",
    "OffsetFetch": "v10 (topic ids): no client needs it yet (UNSUPPORTED.md)",
    "TxnOffsetCommit": "v6 (topic ids, KIP-1319): no client needs it yet (UNSUPPORTED.md)",
    "CreateDelegationToken": TOKENS,
    "RenewDelegationToken": TOKENS,
    "ExpireDelegationToken": TOKENS,
    "DescribeDelegationToken": TOKENS,
    "UnregisterBroker": NOT_PLANNED_KRAFT,
    "UnregisterController": NOT_PLANNED_KRAFT,
    "AddRaftVoter": NOT_PLANNED_KRAFT,
    "RemoveRaftVoter": NOT_PLANNED_KRAFT,
    "ShareGroupHeartbeat": NOT_PLANNED_SHARE,
    "ShareGroupDescribe": NOT_PLANNED_SHARE,
    "ShareFetch": NOT_PLANNED_SHARE,
    "ShareAcknowledge": NOT_PLANNED_SHARE,
    "InitializeShareGroupState": NOT_PLANNED_SHARE,
    "ReadShareGroupState": NOT_PLANNED_SHARE,
    "WriteShareGroupState": NOT_PLANNED_SHARE,
    "DeleteShareGroupState": NOT_PLANNED_SHARE,
    "ReadShareGroupStateSummary": NOT_PLANNED_SHARE,
    "DescribeShareGroupOffsets": NOT_PLANNED_SHARE,
    "AlterShareGroupOffsets": NOT_PLANNED_SHARE,
    "DeleteShareGroupOffsets": NOT_PLANNED_SHARE,
    "StreamsGroupHeartbeat": NOT_PLANNED_STREAMS,
    "StreamsGroupDescribe": NOT_PLANNED_STREAMS,
    "StreamsGroupTopologyDescriptionUpdate": NOT_PLANNED_STREAMS,
}


def advertised(bootstrap: str) -> dict[int, tuple[int, int]]:
    with WireClient(bootstrap) as client:
        answer = client.request(ApiVersionsRequest(client_software_name="kbroker", client_software_version="1"), 3)
    return {api.api_key: (api.min_version, api.max_version) for api in answer.api_keys}


def table(kafka: dict[int, tuple[int, int]], ours: dict[int, tuple[int, int]]) -> str:
    def span(versions: tuple[int, int] | None) -> str:
        return "—" if versions is None else f"{versions[0]}–{versions[1]}"

    lines = [
        f"| key | API | Kafka {KAFKA_VERSION} | kbroker | gap |",
        "| ---: | --- | --- | --- | --- |",
    ]
    missing = []
    for key in sorted(kafka):
        name = APIS[key].name if key in APIS else f"key {key}"
        if ours.get(key) == kafka[key]:
            gap = ""
        else:
            gap = GAP_REASONS.get(name, "")
            if not gap:
                missing.append(name)
        lines.append(f"| {key} | {name} | {span(kafka[key])} | {span(ours.get(key))} | {gap} |")
    if missing:
        raise SystemExit(f"no reason recorded for the gap of: {', '.join(missing)} (GAP_REASONS)")
    same = sum(1 for key in kafka if ours.get(key) == kafka[key])
    lines.append("")
    lines.append(f"{len(kafka)} APIs advertised by Kafka; kbroker has {same} of them at the same versions.")
    return "\n".join(lines)


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        try:
            kafka = ApacheKafka(Path(scratch) / "kafka").start()
        except KafkaUnavailable as exc:
            print(f"Apache Kafka cannot run here: {exc}", file=sys.stderr)
            return 1
        try:
            with RunningBroker(Path(scratch) / "kbroker") as ours:
                print(table(advertised(kafka.bootstrap), advertised(ours.bootstrap)))
        finally:
            kafka.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
