"""Java transactional producers on kbroker: kafka-clients 3.9 (transaction version 1: AddPartitionsToTxn, EndTxn
v4) and 4.3 (transaction version 2, which kbroker finalizes: partitions added by Produce v12+, TxnOffsetCommit v5,
EndTxn v5 bumping the epoch). Commit 10 records with sendOffsetsToTransaction, abort 10, commit 5: a
read_committed consumer sees exactly the 15 committed in order, read_uncommitted all 25, the group's offset is
the one sent in the committed transaction; a new instance fences the old one and goes on."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.testing import RunningBroker

JavaProgram = Callable[..., list[str]]  # the java_program fixture (tests/conftest.py)
SOURCE = Path(__file__).parent / "java" / "TransactionalScenario.java"


@pytest.mark.parametrize("version", ["3.9.0", "4.4.0"])
def test_commit_abort_commit_and_fencing(broker: RunningBroker, java_program: JavaProgram, version: str) -> None:
    command = java_program(SOURCE, version)
    name = f"java-txn-{version.replace('.', '')}"
    done = subprocess.run(
        [*command, broker.bootstrap, name, f"{name}-group", f"{name}-id"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    expected = [f"commit-a-{i}" for i in range(10)] + [f"commit-b-{i}" for i in range(5)]
    assert lines["read_committed"].split(",") == expected
    assert lines["read_uncommitted"] == "25"
    assert lines["group_offset"] == "7"
    assert lines["zombie"] in ("ProducerFencedException", "InvalidProducerEpochException"), lines["zombie"]
    assert lines["last"] == "successor-0 count=16"
    # 4.x clients took the finalized transaction.version=2 (EndTxn v5), 3.9 stays on version 1.
    assert broker.broker is not None
    metadata = broker.broker.transactions.get(f"{name}-id")
    assert metadata is not None and metadata.transaction_version == (2 if version.startswith("4.") else 1)
