"""Write tests/fixtures/d0761eb-datadir: a data directory as kbroker d0761eb (the release before issue #28) left it,
for tests/metadata/test_older_datadir.py to start today's kbroker on.

Run that kbroker from its own checkout:

    git worktree add --detach /tmp/kb-d0761eb d0761eb
    python3 tools/capture_older_datadir.py /tmp/kb-d0761eb

It starts that kbroker with the StandardAuthorizer (ANONYMOUS a super user) and, through the wire protocol, creates
two topics (one with a config set at creation and another set later), produces records with fixed timestamps,
commits a group's offsets, creates ACLs, a SCRAM user through AlterUserScramCredentials and client quotas; it
stops that kbroker and starts it again with ``--sasl-user`` (a user the command line creates), then stops it
cleanly. The data directory is written with ``expected.json``: what those requests set, as that kbroker
answered them (the records as fetched, the offsets as OffsetFetch answered, the ACLs as DescribeAcls did, the
quotas as DescribeClientQuotas did, the SCRAM users as DescribeUserScramCredentials did).
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kbroker.wire_client import WireClient  # noqa: E402
from protocol.messages.alter_client_quotas_request import AlterClientQuotasRequest  # noqa: E402
from protocol.messages.alter_user_scram_credentials_request import AlterUserScramCredentialsRequest  # noqa: E402
from protocol.messages.create_acls_request import CreateAclsRequest  # noqa: E402
from protocol.messages.create_topics_request import CreateTopicsRequest  # noqa: E402
from protocol.messages.describe_acls_request import DescribeAclsRequest  # noqa: E402
from protocol.messages.describe_client_quotas_request import DescribeClientQuotasRequest  # noqa: E402
from protocol.messages.describe_configs_request import DescribeConfigsRequest  # noqa: E402
from protocol.messages.describe_user_scram_credentials_request import (  # noqa: E402
    DescribeUserScramCredentialsRequest,
)
from protocol.messages.fetch_request import FetchRequest  # noqa: E402
from protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest  # noqa: E402
from protocol.messages.offset_commit_request import OffsetCommitRequest  # noqa: E402
from protocol.messages.offset_fetch_request import OffsetFetchRequest  # noqa: E402
from protocol.messages.produce_request import ProduceRequest  # noqa: E402
from protocol.records import Record, build_batch, decode_records, iter_batches  # noqa: E402

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "d0761eb-datadir"
CONFIG = "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\nsuper.users=User:ANONYMOUS\n"
TOPICS = {"orders": 2, "events": 1}
TOPIC_CONFIGS = {"orders": {"max.message.bytes": "65536"}}  # at creation
ALTERED_CONFIGS = {"orders": {"retention.ms": "3600000"}}  # by IncrementalAlterConfigs afterwards
BASE_TIMESTAMP = 1_700_000_000_000
# (topic, partition) -> the batches produced, each a list of (key, value).
PRODUCED = {
    ("orders", 0): [[("o-1", "apple"), ("o-2", "pear")], [("o-3", "plum")]],
    ("orders", 1): [[("o-4", "fig")]],
    ("events", 0): [[("e-1", "start"), (None, "tick"), ("e-3", "stop")]],
}
GROUP = "billing"
COMMITTED = {("orders", 0): (2, "half-way"), ("orders", 1): (1, ""), ("events", 0): (3, "done")}
# (resource type, name, pattern type, principal, host, operation, permission), Kafka's codes.
ACLS = [
    (2, "orders", 3, "User:alice", "*", 3, 3),
    (2, "pay-", 4, "User:*", "*", 8, 3),
    (3, "billing", 3, "User:bob", "*", 3, 3),
]
API_USER = ("bob", 2, 8192, "bob-secret")  # user, mechanism (SCRAM-SHA-512), iterations, password
SASL_USER = ("alice", "alice-secret")
# (entity parts, {key: value})
QUOTAS = [
    ([("user", "bob")], {"producer_byte_rate": 1048576.0}),
    ([("client-id", "reporting"), ("user", None)], {"consumer_byte_rate": 2097152.0, "request_percentage": 50.0}),
    ([("ip", "10.0.0.9")], {"connection_creation_rate": 20.0}),
]


def start(old_checkout: Path, work: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    ready = work / "ready"
    ready.unlink(missing_ok=True)
    command = [sys.executable, "-m", "kbroker", "serve", "--listen", "127.0.0.1:0", "--data-dir", str(work / "data")]
    command += ["--config", str(work / "server.properties"), "--ready-file", str(ready), *extra]
    process = subprocess.Popen(command, cwd=old_checkout)
    while not ready.exists():
        assert process.poll() is None, "the old kbroker did not start"
        time.sleep(0.05)
    host, _, port = ready.read_text().strip().rpartition(":")
    return process, f"{host}:{port}"


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0


def fill(client: WireClient) -> None:
    created = client.request(
        CreateTopicsRequest(
            topics=[
                CreateTopicsRequest.CreatableTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=1,
                    configs=[
                        CreateTopicsRequest.CreatableTopicConfig(name=k, value=v)
                        for k, v in TOPIC_CONFIGS.get(name, {}).items()
                    ],
                )
                for name, partitions in TOPICS.items()
            ],
            timeout_ms=10_000,
        ),
        7,
    )
    assert all(t.error_code == 0 for t in created.topics), created
    altered = client.request(
        IncrementalAlterConfigsRequest(
            resources=[
                IncrementalAlterConfigsRequest.AlterConfigsResource(
                    resource_type=2,
                    resource_name=name,
                    configs=[
                        IncrementalAlterConfigsRequest.AlterableConfig(name=k, config_operation=0, value=v)
                        for k, v in configs.items()
                    ],
                )
                for name, configs in ALTERED_CONFIGS.items()
            ]
        ),
        1,
    )
    assert all(r.error_code == 0 for r in altered.responses), altered
    timestamp = BASE_TIMESTAMP
    for (topic, partition), batches in PRODUCED.items():
        for batch in batches:
            records = [
                Record(offset_delta=i, timestamp_delta=i, key=None if k is None else k.encode(), value=v.encode())
                for i, (k, v) in enumerate(batch)
            ]
            data = ProduceRequest.PartitionProduceData(
                index=partition, records=build_batch(records, base_timestamp=timestamp)
            )
            produced = client.request(
                ProduceRequest(
                    acks=-1,
                    timeout_ms=10_000,
                    topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[data])],
                ),
                9,
            )
            assert produced.responses[0].partition_responses[0].error_code == 0, produced
            timestamp += 1000
    committed = client.request(
        OffsetCommitRequest(
            group_id=GROUP,
            generation_id_or_member_epoch=-1,
            member_id="",
            topics=[
                OffsetCommitRequest.OffsetCommitRequestTopic(
                    name=topic,
                    partitions=[
                        OffsetCommitRequest.OffsetCommitRequestPartition(
                            partition_index=p, committed_offset=offset, committed_metadata=metadata
                        )
                        for (t, p), (offset, metadata) in COMMITTED.items()
                        if t == topic
                    ],
                )
                for topic in TOPICS
            ],
        ),
        8,
    )
    assert all(p.error_code == 0 for t in committed.topics for p in t.partitions), committed
    acls = client.request(
        CreateAclsRequest(
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
        ),
        3,
    )
    assert all(r.error_code == 0 for r in acls.results), acls
    scram = client.request(api_user_request(), 0)
    assert [(r.user, r.error_code) for r in scram.results] == [(API_USER[0], 0)], scram
    quotas = client.request(
        AlterClientQuotasRequest(
            entries=[
                AlterClientQuotasRequest.EntryData(
                    entity=[AlterClientQuotasRequest.EntityData(entity_type=t, entity_name=n) for t, n in parts],
                    ops=[AlterClientQuotasRequest.OpData(key=k, value=v) for k, v in values.items()],
                )
                for parts, values in QUOTAS
            ]
        ),
        1,
    )
    assert all(e.error_code == 0 for e in quotas.entries), quotas


def api_user_request() -> AlterUserScramCredentialsRequest:
    from kbroker.security.sasl.scram import SCRAM_MECHANISMS_BY_TYPE, salted_password

    user, mechanism, iterations, password = API_USER
    salt = b"fixture-salt-" + user.encode()
    salted = salted_password(SCRAM_MECHANISMS_BY_TYPE[mechanism], password, salt, iterations)
    return AlterUserScramCredentialsRequest(
        deletions=[],
        upsertions=[
            AlterUserScramCredentialsRequest.ScramCredentialUpsertion(
                name=user, mechanism=mechanism, iterations=iterations, salt=salt, salted_password=salted
            )
        ],
    )


def state(client: WireClient) -> dict[str, Any]:
    """What a kbroker answers about everything ``fill`` set: the same requests the migration test sends."""
    return {
        "topics": topics_state(client),
        "records": records_state(client),
        "offsets": offsets_state(client),
        "acls": acls_state(client),
        "scram_users": scram_state(client),
        "quotas": quotas_state(client),
    }


def topics_state(client: WireClient) -> dict[str, Any]:
    described = client.request(
        DescribeConfigsRequest(
            resources=[
                DescribeConfigsRequest.DescribeConfigsResource(
                    resource_type=2, resource_name=name, configuration_keys=None
                )
                for name in TOPICS
            ]
        ),
        4,
    )
    answer = {}
    for result in described.results:
        assert result.error_code == 0, result
        overrides = {c.name: c.value for c in result.configs if c.config_source == 1}  # DYNAMIC_TOPIC_CONFIG
        answer[result.resource_name] = overrides
    return answer


def records_state(client: WireClient) -> dict[str, list[list[Any]]]:
    fetch = FetchRequest(
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=[
            FetchRequest.FetchTopic(
                topic=topic,
                partitions=[
                    FetchRequest.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=1 << 20)
                    for (t, p) in PRODUCED
                    if t == topic
                ],
            )
            for topic in TOPICS
        ],
    )
    answer: dict[str, list[list[Any]]] = {}
    for topic in client.request(fetch, 12).responses:
        for partition in topic.partitions:
            assert partition.error_code == 0, partition
            rows = []
            for header, batch in iter_batches(partition.records or b""):
                for record in decode_records(batch):
                    rows.append(
                        [
                            header.base_offset + record.offset_delta,
                            header.base_timestamp + record.timestamp_delta,
                            None if record.key is None else record.key.decode(),
                            None if record.value is None else record.value.decode(),
                        ]
                    )
            answer[f"{topic.topic}-{partition.partition_index}"] = [*rows, ["high watermark", partition.high_watermark]]
    return answer


def offsets_state(client: WireClient) -> dict[str, list[Any]]:
    fetched = client.request(
        OffsetFetchRequest(
            groups=[OffsetFetchRequest.OffsetFetchRequestGroup(group_id=GROUP, topics=None)], require_stable=True
        ),
        8,
    )
    [group] = fetched.groups
    assert group.error_code == 0, group
    return {
        f"{t.name}-{p.partition_index}": [p.committed_offset, p.metadata]
        for t in group.topics
        for p in t.partitions
        if p.error_code == 0
    }


def acls_state(client: WireClient) -> list[list[Any]]:
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
    return sorted(
        [r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation, a.permission_type]
        for r in described.resources
        for a in r.acls
    )


def scram_state(client: WireClient) -> list[list[Any]]:
    described = client.request(DescribeUserScramCredentialsRequest(users=None), 0)
    assert described.error_code == 0, described
    return sorted([r.user, sorted([c.mechanism, c.iterations] for c in r.credential_infos)] for r in described.results)


def quotas_state(client: WireClient) -> list[list[Any]]:
    described = client.request(DescribeClientQuotasRequest(components=[], strict=False), 1)
    assert described.error_code == 0, described
    return sorted(
        [sorted([e.entity_type, e.entity_name] for e in entry.entity), sorted([v.key, v.value] for v in entry.values)]
        for entry in described.entries or []
    )


def main(old_checkout: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="kb-capture-"))
    (work / "server.properties").write_text(CONFIG)
    process, address = start(old_checkout, work)
    try:
        with WireClient(address) as client:
            fill(client)
            before = state(client)
    finally:
        stop(process)
    # Started again with --sasl-user: a user the command line creates (its listener is SASL's from then on).
    (work / "server.properties").write_text("")
    process, _ = start(old_checkout, work, "--sasl-user", ":".join(SASL_USER))
    stop(process)
    data_dir = work / "data"
    for name in ("acls", "scram-credentials", "client-quotas", "topics.json"):
        assert (data_dir / name).exists(), f"not a checkout from before issue #28: no {name}"
    before["scram_users"] = sorted([*before["scram_users"], [SASL_USER[0], [[1, 4096], [2, 4096]]]])
    shutil.rmtree(FIXTURE, ignore_errors=True)
    shutil.copytree(data_dir, FIXTURE / "data", ignore=shutil.ignore_patterns(".lock"))
    (FIXTURE / "expected.json").write_text(json.dumps(before, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(work)
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
