"""ListTransactions / DescribeTransactions details that the comparison with Kafka (tests/kafka) cannot reach."""

from __future__ import annotations

import pytest

from kbroker.apis.transaction_admin import offsets_partition


@pytest.mark.parametrize(
    ("group", "partition"),
    # Java: (group.hashCode() & 0x7fffffff) % 50, computed with jshell on Java 17.
    [("my-group", 36), ("connect-cluster", 13), ("é€😀", 6), ("", 0)],
)
def test_a_groups_offsets_partition_is_kafkas(group: str, partition: int) -> None:
    assert offsets_partition(group, 50) == partition
