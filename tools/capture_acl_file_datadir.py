"""Write tests/fixtures/acl-file-datadir: a data directory as kbroker kept it before ACLs were metadata records (the
ACLs in the checked file ``acls``), for tests/metadata/test_acl_migration.py to start today's kbroker on.

Run the old kbroker from its own checkout (with its C extension built):

    git worktree add --detach /tmp/kb-old-acl <commit before ACL records>
    (cd /tmp/kb-old-acl && python3 setup.py -q build_ext --inplace)
    python3 tools/capture_acl_file_datadir.py /tmp/kb-old-acl

It starts that kbroker with the StandardAuthorizer (ANONYMOUS a super user), creates ACLs through CreateAcls,
deletes one through DeleteAcls, stops the broker cleanly, and writes the data directory and ``expected.json``
(the ACLs DescribeAcls answered at the end, as [resource type, name, pattern type, principal, host, operation,
permission] codes).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kbroker.wire_client import WireClient  # noqa: E402
from protocol.messages.create_acls_request import CreateAclsRequest  # noqa: E402
from protocol.messages.delete_acls_request import DeleteAclsRequest  # noqa: E402
from protocol.messages.describe_acls_request import DescribeAclsRequest  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "acl-file-datadir"
CONFIG = "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\nsuper.users=User:ANONYMOUS\n"
# (resource type, name, pattern type, principal, host, operation, permission), Kafka's codes.
ACLS = [
    (2, "orders", 3, "User:alice", "*", 3, 3),  # TOPIC orders LITERAL: alice READ ALLOW
    (2, "orders", 3, "User:bob", "10.0.0.7", 4, 2),  # ... bob WRITE DENY from one host
    (2, "pay-", 4, "User:*", "*", 8, 3),  # TOPIC pay- PREFIXED: everyone DESCRIBE
    (2, "*", 3, "User:carol", "*", 2, 3),  # every topic: carol ALL
    (3, "billing", 4, "User:alice", "*", 3, 3),  # GROUP billing PREFIXED: alice READ
    (4, "kafka-cluster", 3, "User:alice", "*", 12, 3),  # CLUSTER: alice IDEMPOTENT_WRITE
    (5, "tx-1", 3, "User:alice", "*", 4, 3),  # TRANSACTIONAL_ID tx-1: alice WRITE
    (2, "gone", 3, "User:alice", "*", 3, 3),  # deleted again below
]


def create_request() -> CreateAclsRequest:
    return CreateAclsRequest(
        creations=[
            CreateAclsRequest.AclCreation(
                resource_type=rt,
                resource_name=name,
                resource_pattern_type=pt,
                principal=principal,
                host=host,
                operation=op,
                permission_type=perm,
            )
            for rt, name, pt, principal, host, op, perm in ACLS
        ]
    )


def main(old_checkout: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="kb-capture-"))
    data_dir = work / "data"
    ready = work / "ready"
    (work / "server.properties").write_text(CONFIG)
    command = [sys.executable, "-m", "kbroker", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)]
    command += ["--config", str(work / "server.properties"), "--ready-file", str(ready)]
    process = subprocess.Popen(command, cwd=old_checkout)
    try:
        while not ready.exists():
            assert process.poll() is None, "the old kbroker did not start"
            time.sleep(0.05)
        host, _, port = ready.read_text().strip().rpartition(":")
        with WireClient(f"{host}:{port}") as client:
            results = client.request(create_request(), 3).results
            assert all(r.error_code == 0 for r in results), results
            deleted = client.request(
                DeleteAclsRequest(
                    filters=[
                        DeleteAclsRequest.DeleteAclsFilter(
                            resource_type_filter=2,
                            resource_name_filter="gone",
                            pattern_type_filter=3,
                            principal_filter=None,
                            host_filter=None,
                            operation=1,
                            permission_type=1,
                        )
                    ]
                ),
                3,
            ).filter_results
            assert [len(r.matching_acls) for r in deleted] == [1], deleted
            described = client.request(
                DescribeAclsRequest(
                    resource_type_filter=1,
                    resource_name_filter=None,
                    pattern_type_filter=1,
                    principal_filter=None,
                    host_filter=None,
                    operation=1,
                    permission_type=1,
                ),
                3,
            )
            assert described.error_code == 0, described
            acls = sorted(
                [r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation, a.permission_type]
                for r in described.resources
                for a in r.acls
            )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    assert (data_dir / "acls").exists(), "not a checkout from before ACL records"
    assert acls == sorted(list(acl) for acl in ACLS[:-1]), acls
    shutil.rmtree(FIXTURE, ignore_errors=True)
    shutil.copytree(data_dir, FIXTURE / "data", ignore=shutil.ignore_patterns(".lock"))
    (FIXTURE / "expected.json").write_text(json.dumps(acls, indent=1) + "\n")
    shutil.rmtree(work)
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
