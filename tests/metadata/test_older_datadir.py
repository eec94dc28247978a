"""A data directory the release before issue #28 wrote (tests/fixtures/d0761eb-datadir, written by
tools/capture_older_datadir.py running kbroker d0761eb: topics with records and configs, a group's committed
offsets, ACLs, a SCRAM user of --sasl-user and one of AlterUserScramCredentials, client quotas, each in that
release's own files) starts on today's kbroker with all of it intact: the same requests get the answers that
release gave, both users log in with their passwords, and the older files are kept renamed aside; a damaged
one stops start-up with one line and is kept where it was."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kbroker.metadata.log import MetadataLog
from kbroker.security.sasl.scram import SCRAM_SHA_256, SCRAM_SHA_512, ScramMechanism
from kbroker.wire_client import WireClient
from protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from protocol.messages.sasl_handshake_request import SaslHandshakeRequest
from protocol.metadata_records.client_quota_record import ClientQuotaRecord
from protocol.metadata_records.user_scram_credential_record import UserScramCredentialRecord
from tests.security.test_sasl_scram import Client
from tools.capture_older_datadir import SASL_USER, start, state, stop

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "d0761eb-datadir"
EXPECTED: dict[str, Any] = json.loads((FIXTURE / "expected.json").read_text())
SUPER_USERS = "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\nsuper.users={}\n"
SASL_AUTHENTICATION_FAILED = 58


def login(client: WireClient, mechanism: ScramMechanism, user: str, password: str) -> int:
    """A SCRAM exchange on ``client``'s connection: the error code of the step that ended it (0: logged in)."""
    handshake = client.request(SaslHandshakeRequest(mechanism=mechanism.name), 1)
    assert handshake.error_code == 0, handshake
    scram = Client(mechanism, user, password)
    first = client.request(SaslAuthenticateRequest(auth_bytes=scram.first()), 2)
    if first.error_code:
        return int(first.error_code)
    final, signature = scram.final(first.auth_bytes)
    answer = client.request(SaslAuthenticateRequest(auth_bytes=final), 2)
    if answer.error_code == 0:
        assert answer.auth_bytes == signature  # the server proved it holds the same credential
    return int(answer.error_code)


def test_a_d0761eb_data_directory_starts_with_everything_intact(tmp_path: Path) -> None:
    shutil.copytree(FIXTURE / "data", tmp_path / "data")
    assert sorted(EXPECTED["records"]) == ["events-0", "orders-0", "orders-1"] and len(EXPECTED["acls"]) == 3
    assert [user for user, _ in EXPECTED["scram_users"]] == ["alice", "bob"] and len(EXPECTED["quotas"]) == 3
    (tmp_path / "server.properties").write_text(SUPER_USERS.format("User:alice;User:bob"))
    user, password = SASL_USER
    process, address = start(ROOT, tmp_path, "--sasl-user", f"{user}:{password}")
    try:
        with WireClient(address) as refused:
            assert login(refused, SCRAM_SHA_256, user, "wrong") == SASL_AUTHENTICATION_FAILED
        with WireClient(address) as alice:  # the --sasl-user user, named again
            assert login(alice, SCRAM_SHA_512, user, password) == 0
            assert state(alice) == EXPECTED
        with WireClient(address) as bob:  # the AlterUserScramCredentials user: SCRAM-SHA-512 only
            assert login(bob, SCRAM_SHA_512, "bob", "bob-secret") == 0
            assert state(bob) == EXPECTED
    finally:
        stop(process)
    data_dir = tmp_path / "data"
    for name in ("acls", "scram-credentials", "client-quotas", "topics.json"):
        assert (
            not (data_dir / name).exists()
            and (data_dir / f"{name}.migrated").read_bytes() == (FIXTURE / "data" / name).read_bytes()
        )
    assert (data_dir / "sasl-users").read_text() == "alice\n"  # names only
    metadata_dir = data_dir / "__cluster_metadata-0"
    assert metadata_dir.stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in metadata_dir.iterdir()} == {0o600}

    # Started again without --sasl-user: the user it created is gone, the API's stays, nothing else changes.
    (tmp_path / "server.properties").write_text(SUPER_USERS.format("User:ANONYMOUS"))
    process, address = start(ROOT, tmp_path)
    try:
        with WireClient(address) as client:
            assert state(client) == {**EXPECTED, "scram_users": [["bob", [[2, 8192]]]]}
    finally:
        stop(process)
    assert (data_dir / "sasl-users").read_text() == ""


@pytest.mark.parametrize("name", ["scram-credentials", "client-quotas"])
def test_a_damaged_older_file_stops_start_up_with_one_line_and_is_kept(tmp_path: Path, name: str) -> None:
    data_dir = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data_dir)
    path = data_dir / name
    damaged = bytearray(path.read_bytes())
    damaged[-3] ^= 0x20
    path.write_bytes(bytes(damaged))
    command = [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "Traceback" not in result.stderr and result.returncode == 1
    *moved, line = result.stderr.strip().splitlines()
    assert line.startswith(f"kbroker: damaged file {path}: ") and "checksum" in line
    assert all(" WARNING kbroker.metadata: moved " in earlier for earlier in moved)  # the files before it
    assert path.read_bytes() == bytes(damaged) and not (data_dir / f"{name}.migrated").exists()
    with MetadataLog(data_dir) as metadata_log:
        kinds = {type(r.message) for r in metadata_log.replay().records()}
    assert (UserScramCredentialRecord if name == "scram-credentials" else ClientQuotaRecord) not in kinds
    # Put right, the next start moves it.
    path.write_bytes((FIXTURE / "data" / name).read_bytes())
    (tmp_path / "server.properties").write_text(SUPER_USERS.format("User:ANONYMOUS"))
    process, address = start(ROOT, tmp_path)
    try:
        with WireClient(address) as client:
            assert state(client) == {**EXPECTED, "scram_users": [["bob", [[2, 8192]]]]}
    finally:
        stop(process)
