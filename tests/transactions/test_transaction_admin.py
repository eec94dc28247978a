"""ListTransactions / DescribeTransactions details that the comparison with Kafka (tests/kafka) cannot reach."""

from __future__ import annotations

import pytest

from kbroker.java_hashing import coordinator_partition


@pytest.mark.parametrize(
    ("group", "partition"),
    # Kafka's GroupCoordinatorService/TransactionStateManager.partitionFor: Utils.abs(id.hashCode()) % 50, computed
    # with jshell on kafka-clients 4.4.0. Negative hashes ("my-group" -1906497762, "group-100") are where the
    # partitioner's sign-bit mask would differ; "polygenelubricants" hashes to Integer.MIN_VALUE, which abs makes 0.
    [("my-group", 12), ("connect-cluster", 13), ("é€😀", 6), ("", 0), ("group-100", 11), ("polygenelubricants", 0)],
)
def test_a_groups_offsets_partition_is_kafkas(group: str, partition: int) -> None:
    assert coordinator_partition(group, 50) == partition
