"""A data directory an older kbroker wrote with ACLs in its own file (tests/fixtures/acl-file-datadir, written by
tools/capture_acl_file_datadir.py running that kbroker, ACLs created and deleted through CreateAcls/DeleteAcls) is
moved onto the metadata log once, at the first start: every binding becomes an AccessControlEntryRecord, the
authorizer answers them, and the file is kept renamed aside; a damaged ACL file stops start-up with one line and
changes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from kbroker.metadata.log import MetadataLog
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.messages.describe_acls_request import DescribeAclsRequest
from protocol.metadata_records.access_control_entry_record import AccessControlEntryRecord

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "acl-file-datadir"
EXPECTED: list[list[object]] = json.loads((FIXTURE / "expected.json").read_text())
SECURED = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
}
ANY = 1


def older_data_dir(tmp_path: Path) -> Path:
    data_dir = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", data_dir)
    return data_dir


def described(client: WireClient) -> list[list[object]]:
    request = DescribeAclsRequest(
        resource_type_filter=ANY,
        resource_name_filter=None,
        pattern_type_filter=ANY,
        principal_filter=None,
        host_filter=None,
        operation=ANY,
        permission_type=ANY,
    )
    answer = client.request(request, 3)
    assert answer.error_code == 0
    return sorted(
        [r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation, a.permission_type]
        for r in answer.resources
        for a in r.acls
    )


def acl_records(data_dir: Path) -> list[list[object]]:
    with MetadataLog(data_dir) as metadata_log:
        written = [record.message for record in metadata_log.replay().records()]
    return sorted(
        [r.resource_type, r.resource_name, r.pattern_type, r.principal, r.host, r.operation, r.permission_type]
        for r in written
        if isinstance(r, AccessControlEntryRecord)
    )


def test_the_acl_file_moves_into_the_metadata_log_once(tmp_path: Path) -> None:
    data_dir = older_data_dir(tmp_path)
    assert len(EXPECTED) == 7
    with RunningBroker(data_dir, overrides=SECURED) as broker, WireClient(broker.bootstrap) as client:
        assert described(client) == EXPECTED
    assert not (data_dir / "acls").exists()
    assert (data_dir / "acls.migrated").read_bytes() == (FIXTURE / "data" / "acls").read_bytes()
    assert acl_records(data_dir) == EXPECTED
    # Started again: nothing is migrated twice; an ACL file put back beside the log (a stop before the rename)
    # is only set aside again.
    (data_dir / "acls.migrated").rename(data_dir / "acls")
    with RunningBroker(data_dir, overrides=SECURED) as broker, WireClient(broker.bootstrap) as client:
        assert described(client) == EXPECTED
    assert acl_records(data_dir) == EXPECTED
    assert not (data_dir / "acls").exists()


def test_the_acls_move_even_without_an_authorizer_and_are_there_when_one_is_configured(tmp_path: Path) -> None:
    """ACLs are cluster metadata, kept whatever the broker's authorizer (as in Kafka)."""
    data_dir = older_data_dir(tmp_path)
    with RunningBroker(data_dir):
        pass
    assert acl_records(data_dir) == EXPECTED
    with RunningBroker(data_dir, overrides=SECURED) as broker, WireClient(broker.bootstrap) as client:
        assert described(client) == EXPECTED


def test_a_damaged_acl_file_stops_start_up_with_one_line(tmp_path: Path) -> None:
    data_dir = older_data_dir(tmp_path)
    acls = data_dir / "acls"
    damaged = bytearray(acls.read_bytes())
    damaged[-3] ^= 0x20
    acls.write_bytes(bytes(damaged))
    before = {p.relative_to(data_dir): p.read_bytes() for p in data_dir.rglob("*") if p.is_file()}
    command = [sys.executable, "-m", "kbroker", "serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in result.stderr and result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"kbroker: damaged file {acls}: ") and "checksum" in line
    assert acls.read_bytes() == bytes(damaged)  # kept where it was, for the operator
    assert acl_records(data_dir) == []
    after = {p.relative_to(data_dir): p.read_bytes() for p in data_dir.rglob("*") if p.is_file() and p.name != ".lock"}
    kept = {k: v for k, v in before.items() if "__cluster_metadata" not in str(k)}
    assert {k: v for k, v in after.items() if "__cluster_metadata" not in str(k)} == kept
