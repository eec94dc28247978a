"""StandardAuthorizer (kbroker/security/authorizer.py): decisions over stored ACLs as Kafka's StandardAuthorizer
makes them (literal, wildcard and prefixed patterns, deny over allow, hosts, User:*, super users,
allow.everyone.if.no.acl.found), authorize_any as Kafka's authorizeByResourceType, and the ACLs it decides over
as the controller changes them (create, delete per filter, describe), kept in the metadata log across a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbroker.durable.files import DamagedFileError, StorageError
from kbroker.metadata.image import MetadataDelta
from kbroker.metadata.log import MetadataLog
from kbroker.metadata.migration import ACLS_FILE
from kbroker.security.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from kbroker.security.authorizer import (
    AclResult,
    StandardAuthorizer,
    parse_super_users,
    read_acl_file,
    write_acl_file,
)
from protocol.errors import ErrorCode, KafkaError
from tests.security.acl_store import ControlledAuthorizer

ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
READ, WRITE, DESCRIBE = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def acl(
    name: str,
    operation: AclOperation = READ,
    permission: AclPermissionType = ALLOW,
    *,
    pattern: PatternType = LITERAL,
    principal: str = ALICE,
    host: str = "*",
    resource_type: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def authorizer(
    *acls: AclBinding, allow_if_no_acl: bool = False, super_users: tuple[str, ...] = ()
) -> ControlledAuthorizer:
    built = ControlledAuthorizer(super_users, allow_if_no_acl)
    assert built.create(acls) == [AclResult(ErrorCode.NONE)] * len(acls)
    return built


def test_literal_wildcard_and_prefixed_patterns() -> None:
    auth = authorizer(acl("orders"), acl("*", AclOperation.CREATE), acl("pay", DESCRIBE, pattern=PREFIXED))
    assert auth.authorize(ALICE, HOST, READ, TOPIC, "orders")
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "orders2")  # a literal name is not a prefix
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "order")
    assert auth.authorize(ALICE, HOST, AclOperation.CREATE, TOPIC, "anything")  # the literal wildcard
    assert auth.authorize(ALICE, HOST, DESCRIBE, TOPIC, "payments")
    assert auth.authorize(ALICE, HOST, DESCRIBE, TOPIC, "pay")  # a prefix matches the name itself
    assert not auth.authorize(ALICE, HOST, DESCRIBE, TOPIC, "pa")
    assert not auth.authorize(ALICE, HOST, READ, GROUP, "orders")  # another resource type
    assert not auth.authorize(BOB, HOST, READ, TOPIC, "orders")


def test_prefixed_star_is_a_prefix_not_the_wildcard() -> None:
    auth = authorizer(acl("*", pattern=PREFIXED))
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "orders")
    assert auth.authorize(ALICE, HOST, READ, TOPIC, "*orders")


@pytest.mark.parametrize(
    ("deny", "name", "allowed"),
    [
        (acl("orders", READ, DENY), "orders", False),
        (acl("*", READ, DENY), "orders", False),
        (acl("ord", READ, DENY, pattern=PREFIXED), "orders", False),
        (acl("orders", AclOperation.ALL, DENY), "orders", False),
        (acl("orders", READ, DENY, principal="User:*"), "orders", False),
        (acl("orders", READ, DENY, host=HOST), "orders", False),
        (acl("orders", READ, DENY, host="10.0.0.2"), "orders", True),  # another host: does not apply
        (acl("orders", WRITE, DENY), "orders", True),  # another operation
        (acl("orders", READ, DENY, principal=BOB), "orders", True),  # another principal
        (acl("other", READ, DENY), "orders", True),
    ],
)
def test_deny_beats_allow(deny: AclBinding, name: str, allowed: bool) -> None:
    auth = authorizer(acl("orders", AclOperation.ALL), acl("*"), deny)
    assert auth.authorize(ALICE, HOST, READ, TOPIC, name) is allowed


def test_deny_read_does_not_deny_describe() -> None:
    auth = authorizer(acl("orders", READ), acl("orders", READ, DENY))
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "orders")
    assert auth.authorize(ALICE, HOST, DESCRIBE, TOPIC, "orders")  # the ALLOW READ implies it, the DENY does not
    auth = authorizer(acl("orders", READ, DENY), allow_if_no_acl=True)
    assert not auth.authorize(ALICE, HOST, DESCRIBE, TOPIC, "orders")  # an ACL exists: not the default


@pytest.mark.parametrize(
    ("granted", "asked", "allowed"),
    [
        (READ, DESCRIBE, True),
        (WRITE, DESCRIBE, True),
        (AclOperation.DELETE, DESCRIBE, True),
        (AclOperation.ALTER, DESCRIBE, True),
        (AclOperation.CREATE, DESCRIBE, False),
        (AclOperation.ALTER_CONFIGS, AclOperation.DESCRIBE_CONFIGS, True),
        (AclOperation.ALTER_CONFIGS, DESCRIBE, False),
        (AclOperation.DESCRIBE_CONFIGS, DESCRIBE, False),
        (DESCRIBE, READ, False),
        (AclOperation.ALL, AclOperation.IDEMPOTENT_WRITE, True),
    ],
)
def test_implication_through_the_authorizer(granted: AclOperation, asked: AclOperation, allowed: bool) -> None:
    auth = authorizer(acl("t", granted))
    assert auth.authorize(ALICE, HOST, asked, TOPIC, "t") is allowed


def test_hosts_and_user_wildcard() -> None:
    auth = authorizer(acl("t", principal="User:*", host=HOST))
    assert auth.authorize(BOB, HOST, READ, TOPIC, "t")
    assert auth.authorize("Group:x", HOST, READ, TOPIC, "t")  # User:* matches any principal, as in Kafka
    assert not auth.authorize(BOB, "10.0.0.2", READ, TOPIC, "t")


def test_super_users_are_allowed_everything_even_over_deny() -> None:
    auth = authorizer(acl("*", AclOperation.ALL, DENY, principal="User:*"), super_users=("User:admin",))
    assert auth.authorize("User:admin", HOST, AclOperation.ALTER, CLUSTER, "kafka-cluster")
    assert auth.authorize("User:admin", HOST, READ, TOPIC, "t")
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "t")
    assert auth.authorize_any("User:admin", HOST, WRITE, TOPIC)


def test_super_users_setting() -> None:
    assert parse_super_users(" User:a ; User:b;;") == {"User:a", "User:b"}
    assert parse_super_users("") == frozenset()


def test_allow_everyone_if_no_acl_found_is_about_the_resource_not_the_principal() -> None:
    auth = authorizer(acl("orders", principal=BOB), acl("logs", WRITE), allow_if_no_acl=True)
    assert auth.authorize(ALICE, HOST, READ, TOPIC, "nothing-about-it")  # no ACL on the resource at all
    assert auth.authorize(ALICE, HOST, READ, GROUP, "g")  # no ACL of that type
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "orders")  # an ACL for someone else exists
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "logs")  # an ACL for another operation exists
    strict = authorizer(acl("orders", principal=BOB))
    assert not strict.authorize(ALICE, HOST, READ, TOPIC, "nothing-about-it")
    assert not strict.authorize(ALICE, HOST, READ, GROUP, "g")


def test_allow_everyone_counts_wildcard_and_prefix_acls_as_found() -> None:
    auth = authorizer(acl("*", principal=BOB), allow_if_no_acl=True)
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "x")
    auth = authorizer(acl("x", principal=BOB, pattern=PREFIXED), allow_if_no_acl=True)
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "xyz")
    assert auth.authorize(ALICE, HOST, READ, TOPIC, "yz")


def test_changes_are_seen_by_the_next_decision() -> None:
    auth = authorizer()
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "t")
    auth.create([acl("t", pattern=PREFIXED)])
    assert auth.authorize(ALICE, HOST, READ, TOPIC, "topic")
    auth.create([acl("to", READ, DENY, pattern=PREFIXED)])
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "topic")
    auth.delete([AclBindingFilter(permission=DENY)])
    assert auth.authorize(ALICE, HOST, READ, TOPIC, "topic")
    auth.delete([AclBindingFilter()])
    assert not auth.authorize(ALICE, HOST, READ, TOPIC, "topic")


# --- authorize_any (Kafka's authorizeByResourceType) --------------------------------------------------------


@pytest.mark.parametrize(
    ("acls", "allowed"),
    [
        ((), False),
        ((acl("t", WRITE),), True),
        ((acl("t", WRITE, host="10.9.9.9"),), False),
        ((acl("t", WRITE, principal=BOB),), False),
        ((acl("t", WRITE, principal="User:*"),), True),
        ((acl("t", AclOperation.ALL),), True),
        ((acl("t", READ),), False),  # no implication here
        ((acl("t", WRITE), acl("t", WRITE, DENY)), False),
        ((acl("t", WRITE), acl("t", WRITE, DENY, pattern=PREFIXED)), False),
        ((acl("topic", WRITE), acl("to", WRITE, DENY, pattern=PREFIXED)), False),
        ((acl("topic", WRITE), acl("topics", WRITE, DENY, pattern=PREFIXED)), True),  # does not cover "topic"
        ((acl("t", WRITE, pattern=PREFIXED), acl("t", WRITE, DENY)), True),  # a literal deny leaves "tx"
        ((acl("ab", WRITE, pattern=PREFIXED), acl("a", WRITE, DENY, pattern=PREFIXED)), False),
        ((acl("a", WRITE), acl("*", WRITE, DENY)), False),  # a wildcard deny denies all
        ((acl("*", WRITE), acl("a", WRITE, DENY)), True),  # a wildcard allow wins over a literal deny
        ((acl("*", WRITE), acl("h", WRITE, DENY, pattern=PREFIXED)), True),  # ...and over a prefixed deny
        ((acl("t", WRITE, resource_type=GROUP),), False),
    ],
)
def test_authorize_any(acls: tuple[AclBinding, ...], allowed: bool) -> None:
    assert authorizer(*acls).authorize_any(ALICE, HOST, WRITE, TOPIC) is allowed


def test_authorize_any_default_and_implication_through_the_probe() -> None:
    assert authorizer(allow_if_no_acl=True).authorize_any(ALICE, HOST, WRITE, TOPIC)
    # "hardcode" has no ACL, so the default allows, whatever ACLs other topics have.
    assert authorizer(acl("x", principal=BOB), allow_if_no_acl=True).authorize_any(ALICE, HOST, WRITE, TOPIC)
    assert not authorizer(acl("h", principal=BOB, pattern=PREFIXED), allow_if_no_acl=True).authorize_any(
        ALICE, HOST, WRITE, TOPIC
    )
    # The probe is an ordinary decision, so a wildcard ALLOW WRITE answers DESCRIBE through implication.
    assert authorizer(acl("*", WRITE)).authorize_any(ALICE, HOST, DESCRIBE, TOPIC)
    with pytest.raises(ValueError, match="operation ANY"):
        authorizer().authorize_any(ALICE, HOST, AclOperation.ANY, TOPIC)


# --- the store ----------------------------------------------------------------------------------------------


def test_create_is_idempotent_and_validates_each_binding() -> None:
    auth = authorizer()
    results = auth.create(
        [
            acl("t"),
            acl("t"),
            acl("x", principal="alice"),
            acl("x", resource_type=CLUSTER),
            acl(""),
            acl("h", host=""),
            acl("h", host="10.0.0.0/8"),  # a CIDR block: refused as by a Kafka 4.4 cluster below 4.4-IV1
            acl("h", host="10.0.0.1"),
        ]
    )
    assert results == [
        AclResult(ErrorCode.NONE),
        AclResult(ErrorCode.NONE),
        AclResult(
            ErrorCode.INVALID_REQUEST,
            "Could not parse principal from `alice` (no colon is present separating the principal type from the "
            "principal name)",
        ),
        AclResult(ErrorCode.INVALID_REQUEST, "The only valid name for the CLUSTER resource is kafka-cluster"),
        AclResult(ErrorCode.INVALID_REQUEST, "Invalid empty resource name"),
        AclResult(ErrorCode.INVALID_REQUEST, "Host pattern cannot be null or empty"),
        AclResult(
            ErrorCode.UNSUPPORTED_VERSION, "CIDR-based ACL host patterns require metadata version 4.4-IV1 or higher."
        ),
        AclResult(ErrorCode.NONE),
    ]
    assert auth.acls() == [acl("h", host="10.0.0.1"), acl("t")]


def test_delete_answers_per_filter_against_the_acls_before_the_call() -> None:
    auth = authorizer(acl("a"), acl("b", WRITE), acl("g", resource_type=GROUP))
    answers = auth.delete(
        [
            AclBindingFilter(TOPIC),
            AclBindingFilter(TOPIC, "a", LITERAL),  # also selected by the first: both report it
            AclBindingFilter(ResourceType.UNKNOWN),
            AclBindingFilter(operation=AclOperation.UNKNOWN),
            AclBindingFilter(TOPIC, "zzz", LITERAL),
        ]
    )
    assert answers == [
        [acl("a"), acl("b", WRITE)],
        [acl("a")],
        AclResult(ErrorCode.INVALID_REQUEST, "Unknown patternFilter."),
        AclResult(ErrorCode.INVALID_REQUEST, "Unknown entryFilter."),
        [],
    ]
    assert auth.acls() == [acl("g", resource_type=GROUP)]


def test_acls_survive_a_restart_in_the_metadata_log(tmp_path: Path) -> None:
    first = ControlledAuthorizer(data_dir=tmp_path)
    kept = [acl("orders", pattern=PREFIXED, host=HOST), acl("*", WRITE, DENY, principal="User:*")]
    first.create([*kept, acl("gone")])
    first.delete([AclBindingFilter(TOPIC, "gone", LITERAL)])
    first.close()
    assert not (tmp_path / ACLS_FILE).exists()  # no file of their own any more
    second = ControlledAuthorizer(data_dir=tmp_path)
    try:
        assert second.acls() == first.acls()
        assert set(second.acls()) == set(kept)
        assert second.authorize(ALICE, HOST, READ, TOPIC, "orders-eu")
        assert not second.authorize(ALICE, HOST, WRITE, TOPIC, "orders-eu")
    finally:
        second.close()


def test_the_image_decides_not_a_store_of_its_own() -> None:
    """A StandardAuthorizer subscribed late is told the current image and decides over its ACLs."""
    fed = authorizer(acl("orders"))
    late = StandardAuthorizer()
    late.publish(fed.controller.image, MetadataDelta(fed.controller.image))
    assert late.acls() == [acl("orders")] and late.authorize(ALICE, HOST, READ, TOPIC, "orders")


def test_an_old_acl_file_reads_back_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    write_acl_file(tmp_path / ACLS_FILE, [acl("orders"), acl("p", pattern=PREFIXED)])
    assert read_acl_file(tmp_path / ACLS_FILE) == [acl("orders"), acl("p", pattern=PREFIXED)]
    data = bytearray((tmp_path / ACLS_FILE).read_bytes())
    data[-3] ^= 0x20
    (tmp_path / ACLS_FILE).write_bytes(bytes(data))
    with pytest.raises(DamagedFileError, match="checksum mismatch"):
        read_acl_file(tmp_path / ACLS_FILE)


def test_a_failed_commit_leaves_the_acls_as_they_were(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = ControlledAuthorizer(data_dir=tmp_path)
    try:
        auth.create([acl("kept")])
        assert auth.metadata_log is not None

        def full_disk(records: object) -> int:
            raise StorageError("no space left on device")

        monkeypatch.setattr(auth.metadata_log, "append", full_disk)
        with pytest.raises(KafkaError) as refused:
            auth.create([acl("orders")])
        assert refused.value.code == ErrorCode.KAFKA_STORAGE_ERROR
        with pytest.raises(KafkaError):
            auth.delete([AclBindingFilter()])
        assert auth.acls() == [acl("kept")]
        assert not auth.authorize(ALICE, HOST, READ, TOPIC, "orders")
    finally:
        auth.close()


def test_migrated_acls_are_written_once_in_one_transaction(tmp_path: Path) -> None:
    auth = ControlledAuthorizer(data_dir=tmp_path)
    try:
        auth.create([acl("a")])
        assert auth.controller.migrate_acls([acl("a"), acl("b"), acl("b"), acl("c", WRITE, DENY)]) == 2
        assert auth.controller.migrate_acls([acl("b")]) == 0
        assert auth.acls() == [acl("a"), acl("b"), acl("c", WRITE, DENY)]
    finally:
        auth.close()
    with MetadataLog(tmp_path) as metadata_log:
        kinds = [type(record.message).__name__ for record in metadata_log.replay().records()]
    assert kinds == [
        "AccessControlEntryRecord",
        "BeginTransactionRecord",
        "AccessControlEntryRecord",
        "AccessControlEntryRecord",
        "EndTransactionRecord",
    ]
