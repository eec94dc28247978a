"""The fault suite's test-only mutations (kbroker/replication/mutations.py): each breaks exactly the mechanism it
names, nothing is changed without the variable, and a name that is not one stops start-up in one line. The
fault suite's own test (tests/faultsuite) shows that its checker catches a cluster running them."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from kbroker.broker import Broker
from kbroker.config_registry import ConfigError
from kbroker.metadata.image import PartitionRegistration
from kbroker.replication import mutations
from kbroker.replication.partition import Partition
from protocol.errors import ErrorCode
from tests.broker.test_handlers_in_memory import create
from tests.replication.test_replica_layer import FOLLOWER, NODE, fetch, produce, with_follower
from tests.replication.test_replica_layer import broker as broker  # noqa: F401 - the fixture

REPLACED = ("maybe_increment_high_watermark", "truncation_offset", "truncate_to", "fetch_error")


@pytest.fixture
def mutated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Partition's methods put back after the test, whatever a mutation replaced."""
    saved = {name: getattr(Partition, name) for name in REPLACED}
    monkeypatch.setattr(mutations, "_installed", set())
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(Partition, name, method)


def install(monkeypatch: pytest.MonkeyPatch, names: str) -> list[str]:
    monkeypatch.setenv(mutations.ENVIRONMENT, names)
    return mutations.install_from_environment()


def test_without_the_variable_nothing_is_replaced(mutated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mutations.ENVIRONMENT, raising=False)
    before = {name: getattr(Partition, name) for name in REPLACED}
    assert mutations.install_from_environment() == []
    assert {name: getattr(Partition, name) for name in REPLACED} == before


def test_an_unknown_mutation_is_one_line(mutated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as refused:
        install(monkeypatch, "high-watermark-without-isr,typo")
    assert str(refused.value) == (
        "KBROKER_TEST_MUTATIONS: no mutation named typo (there are high-watermark-without-isr, "
        "no-follower-truncation, no-leader-epoch-fence)"
    )


def test_high_watermark_without_isr_acknowledges_what_only_the_leader_has(
    broker: Broker, mutated: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    create(broker, "t")
    with_follower(broker, "t", isr=(NODE, FOLLOWER))
    with caplog.at_level(logging.ERROR, logger="kbroker.replication"):
        assert install(monkeypatch, "high-watermark-without-isr") == ["high-watermark-without-isr"]
    assert "TEST-ONLY MUTATION high-watermark-without-isr is on" in caplog.text
    # acks=all answered at once: the follower in the ISR has fetched nothing.
    assert produce(broker, "t", [b"only-here"], -1) == (ErrorCode.NONE, 0)
    assert fetch(broker, "t", 0) == (ErrorCode.NONE, 1, [(0, b"only-here")])


def test_no_follower_truncation_keeps_a_diverged_tail(
    broker: Broker, mutated: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    create(broker, "t")
    assert produce(broker, "t", [b"a", b"b", b"c"], 1) == (ErrorCode.NONE, 0)
    # Now a follower of broker FOLLOWER at epoch 2: the leader says epoch 0 ended at offset 1.
    broker.replicas.apply("t", 0, PartitionRegistration((NODE, FOLLOWER), (NODE, FOLLOWER), FOLLOWER, 2, 2))
    partition = broker.replicas.partition("t", 0)
    assert partition is not None
    assert partition.truncation_offset(0, 1) == 1  # the real follower would cut at 1
    install(monkeypatch, "no-follower-truncation")
    assert partition.truncation_offset(0, 1) == 3
    partition.truncate_to(1)
    assert partition.log.log_end_offset == 3


def test_no_leader_epoch_fence_serves_a_fetch_of_another_epoch(
    broker: Broker, mutated: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    create(broker, "t")
    with_follower(broker, "t", isr=(NODE, FOLLOWER), epoch=3)
    assert fetch(broker, "t", 0, replica_id=FOLLOWER, epoch=2)[0] == ErrorCode.FENCED_LEADER_EPOCH
    assert fetch(broker, "t", 0, replica_id=FOLLOWER, epoch=4)[0] == ErrorCode.UNKNOWN_LEADER_EPOCH
    install(monkeypatch, "no-leader-epoch-fence")
    assert fetch(broker, "t", 0, replica_id=FOLLOWER, epoch=2)[0] == ErrorCode.NONE
    assert fetch(broker, "t", 0, replica_id=FOLLOWER, epoch=4)[0] == ErrorCode.NONE
