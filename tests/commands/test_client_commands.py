"""What every client command shares, tried through ``kbroker topics``: ``--command-config`` logging in with SASL
PLAIN to a kbroker secured as ``kbroker serve --sasl-user`` secures it, and an unknown key refused in one line."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.cli import security_overrides
from kbroker.testing import RunningBroker
from tests.commands.conftest import Cli


@pytest.fixture
def sasl_broker(broker_factory: Callable[..., RunningBroker]) -> str:
    """A kbroker whose listener is what ``--sasl-user alice:s3cret`` makes of it (on an ephemeral port)."""
    serve_args = argparse.Namespace(config=None, listen="127.0.0.1:0", tls=None)
    lines = security_overrides(serve_args, [("alice", "s3cret")])
    overrides = dict(line.split("=", 1) for line in lines)
    return broker_factory(overrides).bootstrap


def command_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return str(path)


def test_sasl_plain_command_config(cli: Cli, sasl_broker: str, tmp_path: Path) -> None:
    config = command_config(
        tmp_path,
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=PLAIN\n"
        'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" '
        'password="s3cret";\n',
    )
    created = cli("topics", "create", "cli-sasl", "--bootstrap", sasl_broker, "--command-config", config)
    assert (created.exit_code, created.stdout, created.stderr) == (0, "Created topic cli-sasl.\n", "")
    listed = cli("topics", "list", "--bootstrap", sasl_broker, "--command-config", config, "-o", "json")
    assert listed.json() == [{"name": "cli-sasl", "partitions": 1, "replication_factor": 1, "internal": False}]
    configs = cli("configs", "describe", "--topic", "cli-sasl", "--bootstrap", sasl_broker, "--command-config", config,
                  "-o", "json")  # fmt: skip
    assert configs.json() == {"resource_type": "topic", "name": "cli-sasl", "configs": []}


def test_unknown_command_config_key_is_refused(cli: Cli, tmp_path: Path) -> None:
    config = command_config(tmp_path, "security.protocol=PLAINTEXT\nlinger.ms=5\n")
    result = cli("topics", "list", "--bootstrap", "127.0.0.1:1", "--command-config", config)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (
        f"kbroker topics: --command-config {config}: linger.ms is not a client setting kbroker's commands understand "
        "(they take security.protocol, sasl.*, ssl.* store keys, client.id and request.timeout.ms)\n"
    )
