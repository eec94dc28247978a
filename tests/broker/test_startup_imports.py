"""What ``kbroker serve`` has imported by the time it is ready: not the code that only some configurations or
later requests need (issue #27's start-up). Each of these is imported later, by what needs it: the group
coordinators by the first group request, the cleaner by its first pass over a compacted partition, the SCRAM
credentials and mechanisms by the first credential (or --sasl-user), SASL for SASL listeners only, the authorizer
only when configured, the client commands and the web console only by their own command lines; the compression
codecs by the first compressed batch, the error answers by the first failed request, KRaft's snapshot records by
the first metadata snapshot (issue #28's start-up)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kbroker.broker import Broker, Endpoint
from kbroker.config import BrokerConfig

ROOT = Path(__file__).resolve().parents[2]

DEFERRED = (
    "kbroker.groups.coordinator",
    "kbroker.groups.consumer_group",
    "kbroker.groups.router",
    "kbroker.storage.cleaner",
    "kbroker.storage.cleaner_worker",
    "pickle",
    "kbroker.security.authenticator",  # SASL listeners only
    "kbroker.security.sasl",
    "kbroker.security.sasl.scram",
    "kbroker.security.scram_credentials",
    "secrets",
    "kbroker.security.authorizer",
    "kbroker.commands",
    "kbroker.console",
    "kbroker.server.metrics_http",
    "prometheus_client",
    "kafka",  # kafka-python: the client commands'
    "cramjam",  # the compression codecs: the first compressed batch
    "kbroker.apis.error_responses",  # the first failed request
    "kbroker.storage.memory",  # logs kept in memory only
    "protocol.messages.snapshot_header_record",  # the first metadata snapshot
    "protocol.messages.snapshot_footer_record",
    "protocol.messages.voters_record",
    "protocol.messages.k_raft_version_record",
)

# The serve command line, stopped at the moment it announces readiness (it listens then), listing its modules.
SERVE_UNTIL_READY = """
import json, os, sys
from kbroker import app, cli

def ready(path, address):
    print(json.dumps(sorted(sys.modules)), flush=True)
    os._exit(0)

app.write_ready_file = ready
cli.main(["serve", "--listen", "127.0.0.1:0", "--data-dir", sys.argv[1], "--ready-file", sys.argv[2],
          "--log-level", "WARNING"])
"""


def modules_when_ready(tmp_path: Path) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", SERVE_UNTIL_READY, str(tmp_path / "data"), str(tmp_path / "ready")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    return set(json.loads(result.stdout))


def test_serve_is_ready_without_the_code_only_some_configs_and_later_requests_need(tmp_path: Path) -> None:
    for name in DEFERRED:  # each name is a real module: a misspelt one would make the check below vacuous
        assert importlib.util.find_spec(name) is not None, name
    loaded = modules_when_ready(tmp_path)
    assert {"trio", "kbroker.broker", "kbroker.server.connection", "kbroker.storage.manager"} <= loaded
    assert sorted(loaded & set(DEFERRED)) == []


def test_a_group_coordinator_made_after_start_up_ages_offsets_from_the_broker_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = Broker(BrokerConfig.load(None, []), tmp_path / "data", Endpoint("127.0.0.1", 9092))
    try:
        assert "groups" not in vars(broker)  # made by the first request that needs it, not at start-up
        started_ms = broker.started_ms
        monkeypatch.setattr(time, "time", lambda: started_ms / 1000 + 3600)  # the first group request, an hour on
        # A group unknown since start-up has its offsets age from the broker's start, not from this moment.
        assert broker.groups.offset_expiry_base_ms("a-group-from-before-the-restart") == started_ms
        assert broker.group_router.classic is broker.groups
    finally:
        broker.close()
