"""kafka-python 2.x (the release line many projects still pin) against a live broker.

kafka-python 3.x is the installed one (tests/broker/test_kafka_python_client.py); 2.x is installed into a
cache directory with ``pip install --target`` and put first on PYTHONPATH of a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from compat import clients as compat_clients
from kbroker.testing import RunningBroker

SCENARIO = Path(__file__).with_name("kafka_python_scenario.py")


@pytest.fixture(scope="session")
def kafka_python2_path() -> Path:
    try:
        return compat_clients.kafka_python2_path()  # the compat suite's install, shared
    except compat_clients.ClientUnavailable as exc:
        pytest.skip(f"{exc} (no package index?)")


def test_kafka_python_2_full_flow(broker: RunningBroker, kafka_python2_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(kafka_python2_path), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, str(SCENARIO), broker.bootstrap], capture_output=True, text=True, timeout=120, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["version"] == compat_clients.KAFKA_PYTHON_2
    assert result["topics"] == ["py"]
    assert result["configs"]["retention.ms"] == "3600000"
    assert result["configs"]["cleanup.policy"] == "delete"
    sent = result["sent"]
    assert len(sent) == 50
    for partition in (0, 1):
        assert [o for p, o, *_ in sent if p == partition] == list(range(sum(1 for s in sent if s[0] == partition)))
    consumed = sorted(result["consumed"])
    assert [c[:4] for c in consumed] == sorted(sent)
    assert all(c[4] == [["i", c[3].rsplit("-", 1)[1]]] for c in consumed)
    counts = {str(p): sum(1 for s in sent if s[0] == p) for p in (0, 1)}
    assert result["end_offsets"] == counts and result["beginning_offsets"] == {"0": 0, "1": 0}
    assert result["big_offset"] == 5
    assert result["offset_for_time"] == [3, 3000]
    assert result["from_time"] == [[3, 1], [4, 1], [5, 921_600]] and result["big_intact"]
    assert result["position_at_end"] == 6
    assert result["after_delete"] == ["timed"]
