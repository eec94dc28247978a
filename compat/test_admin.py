"""Admin: topics, partitions and configs through each client's admin API.

Kafka applies topic deletion and metadata changes asynchronously (the controller commits, brokers catch
up), so what follows a change is waited for, not expected at once; kbroker applies them at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from compat.clients.api import ClientError
from compat.clients.remote import RemoteClient
from compat.reference import Reference


def eventually(check: Callable[[], Any], expected: Any, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while (value := check()) != expected:
        assert time.monotonic() < deadline, f"still {value!r}, expected {expected!r}"
        time.sleep(0.1)


def test_topics_partitions_and_configs(client: RemoteClient, reference: Reference, names) -> None:
    topic = names("admin")
    client.create_topic(topic=topic, partitions=3, configs={"retention.ms": "3600000"})
    with pytest.raises(ClientError) as exists:
        client.create_topic(topic=topic, partitions=1, configs={})
    assert exists.value.error == "TOPIC_ALREADY_EXISTS"

    eventually(lambda: topic in client.list_topics(), True)
    eventually(lambda: client.describe_topic(topic=topic), [0, 1, 2])
    assert reference.partition_count(topic) == 3
    wanted = ["retention.ms", "cleanup.policy", "max.message.bytes"]
    assert client.describe_configs(topic=topic, names=wanted) == {
        "retention.ms": "3600000",  # set at creation
        "cleanup.policy": "delete",  # Kafka's defaults
        "max.message.bytes": "1048588",
    }

    # Altering one config leaves the others as they were.
    client.alter_configs(topic=topic, configs={"cleanup.policy": "compact"})
    eventually(
        lambda: client.describe_configs(topic=topic, names=wanted),
        {"retention.ms": "3600000", "cleanup.policy": "compact", "max.message.bytes": "1048588"},
    )

    client.create_partitions(topic=topic, total=5)
    eventually(lambda: client.describe_topic(topic=topic), [0, 1, 2, 3, 4])
    assert reference.partition_count(topic) == 5
    with pytest.raises(ClientError) as fewer:
        client.create_partitions(topic=topic, total=2)
    assert fewer.value.error == "INVALID_PARTITIONS"

    client.delete_topic(topic=topic)
    eventually(lambda: topic in client.list_topics(), False)
    with pytest.raises(ClientError) as gone:
        client.delete_topic(topic=topic)
    assert gone.value.error == "UNKNOWN_TOPIC_OR_PARTITION"
