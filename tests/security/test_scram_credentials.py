"""SCRAM credentials as metadata records (kbroker/security/scram_credentials.py) and their admin APIs on kbroker
(kbroker/apis/scram_credentials.py): what is kept (never the password) in the metadata log across a restart, an
older kbroker's credentials file read back and a damaged one refused with a one-line error, and every validation
of AlterUserScramCredentials and DescribeUserScramCredentials with Kafka 4.3's codes and messages
(tests/kafka/test_scram_admin_kafka.py sends the same requests to Kafka and compares); a credential made through
the API then logs in over SCRAM."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.durable.files import DamagedFileError
from kbroker.metadata.controller import LocalController, MetadataCache
from kbroker.metadata.log import MetadataLog
from kbroker.metadata.migration import migrate_older_files
from kbroker.security.sasl import SaslAuthenticationFailed, SaslSettings, create_server
from kbroker.security.sasl.scram import SCRAM_SHA_256, SCRAM_SHA_512, credential_from_password, salted_password
from kbroker.security.scram_credentials import (
    CREDENTIALS_FILE,
    SASL_USERS_FILE,
    Upsertion,
    read_credentials_file,
    write_credentials_file,
)
from kbroker.testing import RunningBroker
from kbroker.wire_client import WireClient
from protocol.messages.alter_user_scram_credentials_request import AlterUserScramCredentialsRequest as Alter
from protocol.messages.describe_user_scram_credentials_request import DescribeUserScramCredentialsRequest as Describe
from protocol.metadata_records.user_scram_credential_record import UserScramCredentialRecord
from tests.security.scram_store import ControlledScramStore
from tests.security.test_sasl_scram import Client

SHA256, SHA512 = 1, 2
NONE, NOT_FOUND, DUPLICATE, UNACCEPTABLE, UNSUPPORTED = 0, 91, 92, 93, 33
DUPLICATE_ALTER = "A user credential cannot be altered twice in the same request"


def upsertion(user: str, mechanism: int = SHA256, iterations: int = 4096, password: str = "secret") -> Upsertion:
    salt = b"salt-" + user.encode()
    scram = SCRAM_SHA_512 if mechanism == SHA512 else SCRAM_SHA_256
    salted = salted_password(scram, password, salt, max(iterations, 1)) if mechanism in (1, 2) else b"x" * 32
    return Upsertion(user, mechanism, iterations, salt, salted)


def test_store_keeps_keys_not_passwords_and_survives_a_restart(tmp_path: Path) -> None:
    store = ControlledScramStore(tmp_path)
    store.set_password("alice", "SCRAM-SHA-256", "a-unique-password", iterations=5000)
    store.alter([], [upsertion("bob", SHA512, 4096, "another-password")])
    data = b"".join(path.read_bytes() for path in (tmp_path / "__cluster_metadata-0").iterdir())
    assert b"a-unique-password" not in data and b"another-password" not in data
    salted = salted_password(SCRAM_SHA_512, "another-password", b"salt-bob", 4096)
    assert salted not in data and base64.b64encode(salted) not in data  # the salted password is not kept either
    assert not (tmp_path / CREDENTIALS_FILE).exists()  # no file of their own any more

    reopened = ControlledScramStore(tmp_path)
    alice = reopened.lookup("alice", "SCRAM-SHA-256")
    assert alice is not None and alice.iterations == 5000
    assert reopened.lookup("alice", "SCRAM-SHA-512") is None
    bob = reopened.lookup("bob", "SCRAM-SHA-512")
    assert bob is not None and bob.salt == b"salt-bob"
    assert bob.stored_key == hashlib.sha512(hmac_key(salted, b"Client Key")).digest()
    # A password set before the restart still logs in after it.
    server = create_server("SCRAM-SHA-256", SaslSettings(plain_users={}, scram_credentials=reopened))
    client = Client(SCRAM_SHA_256, "alice", "a-unique-password")
    final, signature = client.final(server.evaluate_response(client.first()))
    assert server.evaluate_response(final) == signature


def hmac_key(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, "sha512").digest()


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda data: data[:-3], "short file"),
        (lambda data: data[:-1] + bytes([data[-1] ^ 1]), "crc32c"),
        (lambda data: b"{}", "no header"),
    ],
)
def test_a_damaged_older_file_is_refused_with_a_clear_error(
    tmp_path: Path, damage: Callable[[bytes], bytes], problem: str
) -> None:
    path = tmp_path / CREDENTIALS_FILE
    alice = credential_from_password(SCRAM_SHA_256, "pw", 4096)
    write_credentials_file(path, {("alice", SHA256): alice}, ["alice"])
    assert read_credentials_file(path) == ({("alice", SHA256): alice}, {"alice"})
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DamagedFileError) as caught:
        read_credentials_file(path)
    assert str(caught.value).startswith(f"damaged file {path}: ")
    assert problem in str(caught.value) and "\n" not in str(caught.value)


def test_a_checksummed_file_with_bad_content_is_refused(tmp_path: Path) -> None:
    from kbroker.durable.files import write_checked

    write_checked(tmp_path / CREDENTIALS_FILE, "scram-credentials", 1, b'{"credentials": [{"user": "x"}]}')
    with pytest.raises(DamagedFileError, match="unreadable credentials"):
        read_credentials_file(tmp_path / CREDENTIALS_FILE)


@pytest.mark.parametrize(
    "user, mechanism, iterations, problem",
    [
        ("", "SCRAM-SHA-256", 4096, "Username must not be empty"),
        ("alice", "SCRAM-SHA-1", 4096, "Unknown SCRAM mechanism"),
        ("alice", "SCRAM-SHA-256", 4095, "Too few iterations"),
        ("alice", "SCRAM-SHA-512", 16385, "Too many iterations"),
    ],
)
def test_set_password_refuses_what_the_api_refuses(user: str, mechanism: str, iterations: int, problem: str) -> None:
    with pytest.raises(ValueError, match=f"^{problem}$"):
        ControlledScramStore().set_password(user, mechanism, "pw", iterations)


# --- --sasl-user's users (ScramCredentials.configure_users) --------------------------------------------------


def logs_in(store: ControlledScramStore, mechanism: str, user: str, password: str) -> bool:
    server = create_server(mechanism, SaslSettings(plain_users={}, scram_credentials=store))
    client = Client(SCRAM_SHA_512 if mechanism == "SCRAM-SHA-512" else SCRAM_SHA_256, user, password)
    try:
        final, signature = client.final(server.evaluate_response(client.first()))
        return server.evaluate_response(final) == signature
    except SaslAuthenticationFailed:
        return False


def test_sasl_user_names_the_command_lines_users_at_each_start(tmp_path: Path) -> None:
    first = ControlledScramStore(tmp_path).configure_users([("alice", "a"), ("bob", "b")])
    assert (first.removed, first.from_command_line, first.from_api) == ([], ["alice", "bob"], [])
    ControlledScramStore(tmp_path).alter([], [upsertion("carol", SHA512, 8192, "c")])

    store = ControlledScramStore(tmp_path)
    second = store.configure_users([("alice", "a2")])
    assert (second.removed, second.from_command_line, second.from_api) == (["bob"], ["alice"], ["carol"])
    for reopened in (store, ControlledScramStore(tmp_path)):
        assert reopened.users() == ["alice", "carol"]
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            assert not logs_in(reopened, mechanism, "bob", "b")
            assert logs_in(reopened, mechanism, "alice", "a2") and not logs_in(reopened, mechanism, "alice", "a")
        assert logs_in(reopened, "SCRAM-SHA-512", "carol", "c")
    # No --sasl-user at all: its users go, the API's stay.
    third = ControlledScramStore(tmp_path).configure_users([])
    assert (third.removed, third.from_command_line, third.from_api) == (["alice"], [], ["carol"])
    assert ControlledScramStore(tmp_path).users() == ["carol"]


def test_who_created_a_user_survives_api_changes_until_its_last_credential_goes(tmp_path: Path) -> None:
    ControlledScramStore(tmp_path).configure_users([("alice", "a"), ("bob", "b"), ("dave", "d")])
    store = ControlledScramStore(tmp_path)
    # alice's password changed through the API: still the command line's, so dropping her from it removes her.
    assert store.alter([], [upsertion("alice", SHA256, 4096, "api")])[0].error == 0
    # bob deleted through the API, then created by it: now the API's.
    assert [r.error for r in store.alter([("bob", SHA256)], [])] == [0]
    assert [r.error for r in store.alter([("bob", SHA512)], [])] == [0]
    assert store.alter([], [upsertion("bob", SHA256, 4096, "api")])[0].error == 0
    # dave lost one mechanism only: still the command line's.
    assert [r.error for r in store.alter([("dave", SHA512)], [])] == [0]
    after = ControlledScramStore(tmp_path).configure_users([])
    assert (after.removed, after.from_api) == (["alice", "dave"], ["bob"])
    assert logs_in(ControlledScramStore(tmp_path), "SCRAM-SHA-256", "bob", "api")


def test_a_version_1_file_is_migrated_by_the_shape_sasl_user_wrote(tmp_path: Path) -> None:
    """kbroker before version 2 did not record who created a user: one with exactly --sasl-user's credentials
    (both mechanisms, 4096 iterations) is taken as its, any other as the API's. The file moves into the metadata
    log once and is kept renamed; only the names of --sasl-user's users are kept beside the log."""
    credentials = {
        ("old-cli", SHA256): credential_from_password(SCRAM_SHA_256, "o", 4096),
        ("old-cli", SHA512): credential_from_password(SCRAM_SHA_512, "o", 4096),
        ("api-one", SHA256): credential_from_password(SCRAM_SHA_256, "p", 4096),
        ("api-both", SHA256): credential_from_password(SCRAM_SHA_256, "q", 4096),
        ("api-both", SHA512): credential_from_password(SCRAM_SHA_512, "q", 8192),
    }
    path = tmp_path / CREDENTIALS_FILE
    write_credentials_file(path, credentials, None)
    original = path.read_bytes()
    with MetadataLog(tmp_path) as metadata_log:
        migrate_older_files(LocalController(1, MetadataCache(), metadata_log), tmp_path)
    assert not path.exists() and (tmp_path / (CREDENTIALS_FILE + ".migrated")).read_bytes() == original
    assert (tmp_path / SASL_USERS_FILE).read_text() == "old-cli\n"
    store = ControlledScramStore(tmp_path)
    for (user, mechanism), credential in credentials.items():
        assert store.lookup(user, "SCRAM-SHA-256" if mechanism == SHA256 else "SCRAM-SHA-512") == credential

    migrated = store.configure_users([("new-cli", "n")])
    assert migrated.removed == ["old-cli"]
    assert (migrated.from_command_line, migrated.from_api) == (["new-cli"], ["api-both", "api-one"])
    assert (tmp_path / SASL_USERS_FILE).read_text() == "new-cli\n"
    assert ControlledScramStore(tmp_path).configure_users([]).removed == ["new-cli"]


def test_a_version_2_file_naming_a_user_without_credentials_is_refused(tmp_path: Path) -> None:
    from kbroker.durable.files import write_checked

    document = {"credentials": [], "command_line_users": ["ghost"]}
    write_checked(tmp_path / CREDENTIALS_FILE, "scram-credentials", 2, json.dumps(document).encode())
    with pytest.raises(DamagedFileError, match="unreadable credentials"):
        read_credentials_file(tmp_path / CREDENTIALS_FILE)


def test_sasl_user_writes_records_only_for_what_changed(tmp_path: Path) -> None:
    """The same --sasl-user at every start adds nothing to the metadata log; a new password adds its records."""
    store = ControlledScramStore(tmp_path)
    store.configure_users([("alice", "a")])
    with MetadataLog(tmp_path) as metadata_log:
        end = metadata_log.end_offset
    ControlledScramStore(tmp_path).configure_users([("alice", "a")])
    with MetadataLog(tmp_path) as metadata_log:
        replay = metadata_log.replay()
        written = [r.message for b in replay.batches if b.base_offset >= end for r in b.records]
    assert not any(isinstance(m, UserScramCredentialRecord) for m in written)
    ControlledScramStore(tmp_path).configure_users([("alice", "a2")])
    assert logs_in(ControlledScramStore(tmp_path), "SCRAM-SHA-512", "alice", "a2")


def test_sasl_user_refused_by_the_api_rules_changes_nothing(tmp_path: Path) -> None:
    ControlledScramStore(tmp_path).configure_users([("alice", "a")])
    with pytest.raises(ValueError, match="^: Username must not be empty$"):
        ControlledScramStore(tmp_path).configure_users([("bob", "b"), ("", "x")])
    assert ControlledScramStore(tmp_path).configure_users([("alice", "a")]).removed == []


# --- the APIs on a running kbroker -----------------------------------------------------------------------------


def alter(client: WireClient, deletions: list[tuple[str, int]], upsertions: list[Upsertion]) -> list[tuple]:
    request = Alter(
        deletions=[Alter.ScramCredentialDeletion(name=n, mechanism=m) for n, m in deletions],
        upsertions=[
            Alter.ScramCredentialUpsertion(
                name=u.user,
                mechanism=u.mechanism,
                iterations=u.iterations,
                salt=u.salt,
                salted_password=u.salted_password,
            )
            for u in upsertions
        ],
    )
    answer = client.request(request, 0)
    return [(r.user, r.error_code, r.error_message) for r in answer.results]


def describe(client: WireClient, users: list[str] | None) -> tuple:
    request = Describe(users=None if users is None else [Describe.UserName(name=u) for u in users])
    answer = client.request(request, 0)
    return (
        answer.error_code,
        answer.error_message,
        [
            (r.user, r.error_code, r.error_message, sorted((c.mechanism, c.iterations) for c in r.credential_infos))
            for r in answer.results
        ],
    )


def test_alter_and_describe_on_kbroker(broker_factory: Callable[..., RunningBroker]) -> None:
    running = broker_factory({})
    with WireClient(running.bootstrap) as client:
        assert alter(client, [], [upsertion("alice"), upsertion("bob", SHA512, 8192)]) == [
            ("bob", NONE, None),
            ("alice", NONE, None),
        ]
        assert alter(client, [], [upsertion("alice", SHA512, 16384)]) == [("alice", NONE, None)]
        assert describe(client, ["alice", "carol", "bob", "bob"]) == (
            NONE,
            "",
            [  # in the order of Kafka's HashMap of the names
                ("carol", NOT_FOUND, "Attempt to describe a user credential that does not exist: carol", []),
                (
                    "bob",
                    DUPLICATE,
                    "Cannot describe SCRAM credentials for the same user twice in a single request: bob",
                    [],
                ),
                ("alice", NONE, "", [(SHA256, 4096), (SHA512, 16384)]),
            ],
        )
        assert (
            describe(client, None)
            == describe(client, [])
            == (
                NONE,
                "",
                [("bob", NONE, "", [(SHA512, 8192)]), ("alice", NONE, "", [(SHA256, 4096), (SHA512, 16384)])],
            )
        )
        refused = alter(
            client,
            [("alice", SHA256), ("dave", SHA256), ("", SHA256), ("erin", 0), ("frank", SHA256), ("frank", SHA512)],
            [
                upsertion("alice"),
                upsertion("gina", SHA256, 4095),
                upsertion("hank", SHA512, 16385),
                upsertion("ivan", 3),
                upsertion("bob", SHA512, 4096),
                upsertion("", SHA512),
            ],
        )
        assert sorted(refused) == sorted(
            [
                ("alice", DUPLICATE, DUPLICATE_ALTER),
                ("dave", NOT_FOUND, "Attempt to delete a user credential that does not exist"),
                ("", UNACCEPTABLE, "Username must not be empty"),
                ("erin", UNSUPPORTED, "Unknown SCRAM mechanism"),
                ("frank", NOT_FOUND, "Attempt to delete a user credential that does not exist"),  # first error wins
                ("gina", UNACCEPTABLE, "Too few iterations"),
                ("hank", UNACCEPTABLE, "Too many iterations"),
                ("ivan", UNSUPPORTED, "Unknown SCRAM mechanism"),
                ("bob", NONE, None),
            ]
        )
        assert refused[0] == ("bob", NONE, None)  # what was done comes first
        assert alter(client, [("alice", SHA512), ("bob", SHA512)], []) == [("bob", NONE, None), ("alice", NONE, None)]
        assert describe(client, None) == (NONE, "", [("alice", NONE, "", [(SHA256, 4096)])])
    # The credentials are kept across a restart.
    running.stop()
    running.start()
    with WireClient(running.bootstrap) as client:
        assert describe(client, None) == (NONE, "", [("alice", NONE, "", [(SHA256, 4096)])])


def test_without_cluster_acls_both_apis_are_refused(broker_factory: Callable[..., RunningBroker]) -> None:
    """With Kafka's StandardAuthorizer and no ACL, ANONYMOUS may neither describe nor alter: every user named gets
    CLUSTER_AUTHORIZATION_FAILED without a message (Kafka's getErrorResponse), Describe's results unnamed."""
    running = broker_factory({"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer"})
    with WireClient(running.bootstrap) as client:
        assert alter(client, [("zed", SHA256)], [upsertion("amy"), upsertion("zed")]) == [
            ("amy", 31, None),
            ("zed", 31, None),
        ]
        assert describe(client, ["amy", "bob"]) == (31, None, [("", 31, None, []), ("", 31, None, [])])
        assert describe(client, None) == (31, None, [])
    assert running.broker is not None and running.broker.scram_credentials.users() == []
