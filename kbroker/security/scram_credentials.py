"""SCRAM credentials as cluster metadata: UserScramCredentialRecords in the metadata image, changed through the
controller by AlterUserScramCredentials, read by DescribeUserScramCredentials and the SCRAM mechanisms
(kbroker/security/sasl/scram.py).

What is kept per user and mechanism is RFC 5802's server-side credential: the salt, StoredKey, ServerKey and
iteration count, never the password nor the salted password (an upsertion carries the salted password; the keys
are derived from it and it is dropped), as Kafka's UserScramCredentialRecord holds it. The records are in
``__cluster_metadata-0``, which only the broker's user can read (kbroker/metadata/log.py).

``alter_records`` validates and answers as Kafka's controller does (ScramControlManager): an empty user, an unknown
mechanism, iterations outside 4096..16384, a user named twice in one request (in deletions, upsertions or both),
deleting a credential that does not exist, each with Kafka's code and message, results listed in Kafka's order;
the controller commits the records it returns. ``ScramCredentials.describe`` answers as Kafka's ScramImage.

``kbroker serve --sasl-user`` is declarative (``ScramCredentials.configure_users``, at every start): the users it
names get exactly its passwords, and the users an earlier start's ``--sasl-user`` created but this one does not
name are deleted, so a user dropped from the command line no longer logs in. Users created through
AlterUserScramCredentials stay, as in Kafka. Which users are ``--sasl-user``'s is the one thing not in the image:
their names (never a credential) are kept in ``sasl-users`` in the data directory. A user stays ``--sasl-user``'s
when AlterUserScramCredentials later changes one of its credentials, and stops being so once the API deletes its
last credential. A user the API created that ``--sasl-user`` then names becomes ``--sasl-user``'s.

Older kbrokers kept the credentials in the checked file ``scram-credentials`` (``read_credentials_file``); it is
moved into the metadata log once at start-up (kbroker/metadata/migration.py). Its version 1 did not record who
created a user: one whose credentials are exactly what ``--sasl-user`` writes (SCRAM-SHA-256 and SCRAM-SHA-512,
both at 4096 iterations) is taken as ``--sasl-user``'s, any other as the API's.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from kbroker.durable.files import (
    DamagedFileError,
    StorageError,
    fsync_directory,
    read_checked,
    write_atomically,
    write_checked,
)
from kbroker.java_hashing import java_hashmap_order, java_string_hash
from kbroker.metadata.controller import record
from kbroker.metadata.image import MetadataImage, ScramMechanism
from kbroker.metadata.migration import SASL_USERS_FILE
from protocol import metadata_records
from protocol.errors import ErrorCode
from protocol.metadata_frame import MetadataRecord

if TYPE_CHECKING:
    from kbroker.metadata.controller import LocalController, MetadataCache
    from kbroker.security.sasl.scram import ScramCredential

log = logging.getLogger("kbroker.security.scram_credentials")

CREDENTIALS_FILE = "scram-credentials"  # where older kbrokers kept the credentials (migrated at start-up)
CREDENTIALS_KIND = "scram-credentials"
CREDENTIALS_FORMAT_VERSION = 2  # 2 records the users --sasl-user created; 1 did not
SASL_USER_ITERATIONS = 4096  # what ``--sasl-user`` stores, for each of SCRAM_MECHANISMS
MAX_ITERATIONS = 16384  # Kafka's controller caps iterations whatever the mechanism

DUPLICATE_ALTERATION = "A user credential cannot be altered twice in the same request"
DELETE_MISSING = "Attempt to delete a user credential that does not exist"
DESCRIBE_DUPLICATE = "Cannot describe SCRAM credentials for the same user twice in a single request: "
DESCRIBE_MISSING = "Attempt to describe a user credential that does not exist: "

# A credential by (user, mechanism type code: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512).
Credentials = Mapping[tuple[str, int], "ScramCredential"]


def _scram() -> ModuleType:
    """kbroker/security/sasl/scram.py (the mechanisms and their key derivation), imported by the first credential
    read or made: a broker without SCRAM users starts without it."""
    from kbroker.security.sasl import scram

    return scram


@dataclass(frozen=True, slots=True)
class Upsertion:
    user: str
    mechanism: int  # the API's type code: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True, slots=True)
class ConfiguredUsers:
    """What ``configure_users`` did and what is left: the ``--sasl-user`` users removed, then every user with a
    credential, by who created it (names only)."""

    removed: list[str]
    from_command_line: list[str]
    from_api: list[str]


@dataclass(frozen=True, slots=True)
class AlterResult:
    user: str
    error: ErrorCode
    message: str | None


@dataclass(frozen=True, slots=True)
class DescribeResult:
    user: str
    error: ErrorCode
    message: str | None
    credentials: list[tuple[int, int]]  # (mechanism type, iterations)


def _validate_user_and_mechanism(user: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    if not user:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if mechanism not in _scram().SCRAM_MECHANISMS_BY_TYPE:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    return None


def _validate_iterations(mechanism: int, iterations: int) -> tuple[ErrorCode, str] | None:
    if iterations < _scram().SCRAM_MECHANISMS_BY_TYPE[mechanism].min_iterations:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations"
    if iterations > MAX_ITERATIONS:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations"
    return None


def _hashmap_order(keys: list[str], peak_size: int) -> list[str]:
    """``keys`` (in insertion order) as a Java HashMap<String, ...> that once held ``peak_size`` entries lists them
    (its table never shrinks)."""
    capacity = 16
    while peak_size > capacity * 3 // 4:
        capacity *= 2
    return java_hashmap_order(keys, java_string_hash, capacity)


def _credential_for_password(user: str, mechanism: str, password: str, iterations: int) -> ScramCredential:
    scram = _scram().SCRAM_MECHANISMS.get(mechanism)
    problem = _validate_user_and_mechanism(user, scram.type if scram else 0)
    if problem is None and scram is not None:
        problem = _validate_iterations(scram.type, iterations)
    if problem is not None or scram is None:
        raise ValueError(problem[1] if problem else "Unknown SCRAM mechanism")
    return _scram().credential_from_password(scram, password, iterations)


def _written_by_sasl_user(credentials: Credentials) -> set[str]:
    """The users of a version 1 file (which did not record who created them) taken as ``--sasl-user``'s: those
    whose credentials are exactly the ones it writes, every SCRAM mechanism at SASL_USER_ITERATIONS."""
    by_user: dict[str, dict[int, int]] = {}
    for (user, mechanism), credential in credentials.items():
        by_user.setdefault(user, {})[mechanism] = credential.iterations
    shape = dict.fromkeys(_scram().SCRAM_MECHANISMS_BY_TYPE, SASL_USER_ITERATIONS)
    return {user for user, iterations in by_user.items() if iterations == shape}


def credential_record(user: str, mechanism: int, credential: ScramCredential) -> MetadataRecord:
    return record(
        metadata_records.UserScramCredentialRecord(
            name=user,
            mechanism=mechanism,
            salt=credential.salt,
            stored_key=credential.stored_key,
            server_key=credential.server_key,
            iterations=credential.iterations,
        )
    )


def removal_record(user: str, mechanism: int) -> MetadataRecord:
    return record(metadata_records.RemoveUserScramCredentialRecord(name=user, mechanism=mechanism))


# --- the controller's side -----------------------------------------------------------------------------------------


def alter_records(
    image: MetadataImage, deletions: Sequence[tuple[str, int]], upsertions: Sequence[Upsertion]
) -> tuple[list[AlterResult], list[MetadataRecord]]:
    """An AlterUserScramCredentials request against ``image``, as Kafka's ScramControlManager answers it: its results
    (the deletions done, the upsertions done, then the refusals, each group in a Java HashMap's order of user
    names) and the records that make the changes."""
    existing = image.scram_credentials
    to_delete: dict[str, int] = {}
    to_upsert: dict[str, Upsertion] = {}
    errors: dict[str, tuple[ErrorCode, str]] = {}
    peak = {"delete": 0, "upsert": 0}
    for user, mechanism in deletions:
        if user in errors:
            continue
        if to_delete.pop(user, None) is not None:
            errors[user] = (ErrorCode.DUPLICATE_RESOURCE, DUPLICATE_ALTERATION)
            continue
        problem = _validate_user_and_mechanism(user, mechanism)
        if problem is None and (user, mechanism) not in existing:
            problem = ErrorCode.RESOURCE_NOT_FOUND, DELETE_MISSING
        if problem is not None:
            errors[user] = problem
        else:
            to_delete[user] = mechanism
            peak["delete"] = max(peak["delete"], len(to_delete))
    for upsertion in upsertions:
        user = upsertion.user
        if user in errors:
            continue
        if to_delete.pop(user, None) is not None or to_upsert.pop(user, None) is not None:
            errors[user] = (ErrorCode.DUPLICATE_RESOURCE, DUPLICATE_ALTERATION)
            continue
        problem = _validate_user_and_mechanism(user, upsertion.mechanism) or _validate_iterations(
            upsertion.mechanism, upsertion.iterations
        )
        if problem is not None:
            errors[user] = problem
        else:
            to_upsert[user] = upsertion
            peak["upsert"] = max(peak["upsert"], len(to_upsert))

    results: list[AlterResult] = []
    records: list[MetadataRecord] = []
    for user in _hashmap_order(list(to_delete), peak["delete"]):
        records.append(removal_record(user, to_delete[user]))
        results.append(AlterResult(user, ErrorCode.NONE, None))
    for user in _hashmap_order(list(to_upsert), peak["upsert"]):
        upsertion = to_upsert[user]
        if not upsertion.salted_password:
            # Kafka's HMAC refuses an empty key ("Empty key"): an unexpected error, reported without a message.
            errors[user] = (ErrorCode.UNKNOWN_SERVER_ERROR, "")
            continue
        scram = _scram().SCRAM_MECHANISMS_BY_TYPE[upsertion.mechanism]
        credential = _scram().credential_from_salted_password(
            scram, upsertion.salt, upsertion.salted_password, upsertion.iterations
        )
        records.append(credential_record(user, scram.type, credential))
        results.append(AlterResult(user, ErrorCode.NONE, None))
    for user in _hashmap_order(list(errors), len(errors)):
        code, message = errors[user]
        results.append(AlterResult(user, code, message or None))
    return results, records


# --- the file of older kbrokers --------------------------------------------------------------------------------------


def read_credentials_file(path: Path) -> tuple[dict[tuple[str, int], ScramCredential], set[str]]:
    """The credentials an older kbroker kept in ``path`` (by user and mechanism type) and the users its
    ``--sasl-user`` created; DamagedFileError, one line, for a file that cannot be read."""
    version, payload = read_checked(path, CREDENTIALS_KIND, (1, CREDENTIALS_FORMAT_VERSION))
    scram = _scram()
    try:
        document = json.loads(payload)
        credentials: dict[tuple[str, int], ScramCredential] = {}
        for item in document["credentials"]:
            mechanism = scram.SCRAM_MECHANISMS.get(item["mechanism"])
            if mechanism is None:
                raise ValueError(f"unknown mechanism {item['mechanism']!r}")
            credentials[(str(item["user"]), mechanism.type)] = scram.ScramCredential(
                salt=base64.b64decode(item["salt"], validate=True),
                stored_key=base64.b64decode(item["stored_key"], validate=True),
                server_key=base64.b64decode(item["server_key"], validate=True),
                iterations=int(item["iterations"]),
            )
        if version == 1:
            command_line_users = _written_by_sasl_user(credentials)
        else:
            command_line_users = {str(user) for user in document["command_line_users"]}
            if not command_line_users <= {user for user, _ in credentials}:
                raise ValueError("a --sasl-user user without credentials")
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise DamagedFileError(path, f"unreadable credentials ({exc})") from None
    return credentials, command_line_users


def write_credentials_file(path: Path, credentials: Credentials, command_line_users: Iterable[str] | None) -> None:
    """A credentials file as older kbrokers wrote it (for tests of the migration): version 2, or version 1 when
    ``command_line_users`` is None."""
    scram = _scram()
    document: dict[str, object] = {
        "credentials": [
            {
                "user": user,
                "mechanism": scram.SCRAM_MECHANISMS_BY_TYPE[mechanism].name,
                "salt": base64.b64encode(credential.salt).decode(),
                "stored_key": base64.b64encode(credential.stored_key).decode(),
                "server_key": base64.b64encode(credential.server_key).decode(),
                "iterations": credential.iterations,
            }
            for (user, mechanism), credential in sorted(credentials.items())
        ]
    }
    version = 1
    if command_line_users is not None:
        document["command_line_users"] = sorted(command_line_users)
        version = 2
    write_checked(path, CREDENTIALS_KIND, version, json.dumps(document).encode(), private=True)


def read_sasl_users(path: Path) -> set[str]:
    """The names in ``sasl-users`` (none when there is no such file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return set()
    except (OSError, UnicodeDecodeError) as exc:
        raise DamagedFileError(path, f"unreadable user names ({exc})") from None
    return {line for line in text.splitlines() if line}


def write_sasl_users(path: Path, users: Iterable[str]) -> None:
    text = "".join(f"{user}\n" for user in sorted(users))
    write_atomically(path, text, sync_directory=True, private=True)


# --- the broker's view ---------------------------------------------------------------------------------------------


class ScramCredentials:
    """The SCRAM credentials of the broker's metadata image (read at each look-up, so a committed change is seen
    by the next login), and the ``--sasl-user`` users' names kept in ``data_dir`` (None: in memory only)."""

    def __init__(self, cache: MetadataCache, data_dir: Path | None) -> None:
        self._cache = cache
        self._names_path = data_dir / SASL_USERS_FILE if data_dir is not None else None
        self._command_line_users: set[str] | None = None  # read on first use

    @property
    def _image(self) -> MetadataImage:
        return self._cache.image

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        """``user``'s credential for ``mechanism`` (SCRAM-SHA-256 or SCRAM-SHA-512), as the mechanisms ask."""
        scram = _scram()
        known = scram.SCRAM_MECHANISMS.get(mechanism)
        found = None if known is None else self._image.scram_credentials.get((user, known.type))
        if found is None:
            return None
        return scram.ScramCredential(found.salt, found.stored_key, found.server_key, found.iterations)

    def users(self) -> list[str]:
        return self._users()

    def _users(self) -> list[str]:
        return sorted({user for user, _ in self._image.scram_credentials})

    def describe(self, users: Sequence[str] | None) -> list[DescribeResult]:
        """A DescribeUserScramCredentials answer: every user with a credential when ``users`` is None or empty."""
        stored = self._image.scram_credentials
        requested: dict[str, bool] = {}  # user -> named more than once
        if not users:
            for mechanism in sorted(_scram().SCRAM_MECHANISMS_BY_TYPE):
                for user in sorted(u for u, m in stored if m == mechanism):
                    requested.setdefault(user, False)
        else:
            for user in users:
                requested[user] = user in requested
        results = []
        for user in _hashmap_order(list(requested), len(requested)):
            if requested[user]:
                results.append(DescribeResult(user, ErrorCode.DUPLICATE_RESOURCE, DESCRIBE_DUPLICATE + user, []))
                continue
            found = [
                (mechanism, credential.iterations)
                for mechanism in sorted(_scram().SCRAM_MECHANISMS_BY_TYPE)
                if (credential := stored.get((user, mechanism))) is not None
            ]
            if found:
                results.append(DescribeResult(user, ErrorCode.NONE, None, found))
            else:
                results.append(DescribeResult(user, ErrorCode.RESOURCE_NOT_FOUND, DESCRIBE_MISSING + user, []))
        return results

    # --- --sasl-user -----------------------------------------------------------------------------------------------

    def command_line_users(self) -> set[str]:
        if self._command_line_users is None:
            self._command_line_users = read_sasl_users(self._names_path) if self._names_path is not None else set()
        return set(self._command_line_users)

    def _keep_command_line_users(self, users: set[str]) -> None:
        if users == self._command_line_users:
            return
        if self._names_path is not None:
            write_sasl_users(self._names_path, users)
        self._command_line_users = set(users)

    def configure_users(self, controller: LocalController, users: Sequence[tuple[str, str]]) -> ConfiguredUsers:
        """Make ``users`` (``--sasl-user``'s (user, password) pairs) the users the command line created: each gets
        both SCRAM mechanisms for its password (a credential that already matches the password is kept), and
        those an earlier start created that ``users`` does not name are deleted, in one metadata transaction, at
        start-up. ValueError "USER: reason" for a user the admin API would refuse (nothing changed then)."""
        scram = _scram()
        named = {user for user, _ in users}
        stored = self._image.scram_credentials
        changes: list[MetadataRecord] = []
        for user, password in users:
            for mechanism in scram.SCRAM_MECHANISMS_BY_TYPE.values():
                current = stored.get((user, mechanism.type))
                if current is not None and current.iterations == SASL_USER_ITERATIONS:
                    salted = scram.salted_password(mechanism, password, current.salt, current.iterations)
                    if scram.stored_key(mechanism, scram.client_key(mechanism, salted)) == current.stored_key:
                        continue  # the same password: no new record at every start
                try:
                    credential = _credential_for_password(user, mechanism.name, password, SASL_USER_ITERATIONS)
                except ValueError as exc:
                    raise ValueError(f"{user}: {exc}") from None
                changes.append(credential_record(user, mechanism.type, credential))
        removed = sorted(self.command_line_users() - named)
        changes.extend(removal_record(user, mechanism) for user, mechanism in sorted(stored) if user in removed)
        if changes:
            controller.commit_now(changes, transaction="--sasl-user")
        # After the records: a crash between the two leaves the old names, and the next start removes again.
        self._keep_command_line_users(named)
        everyone = self._users()
        return ConfiguredUsers(
            removed=removed,
            from_command_line=[user for user in everyone if user in named],
            from_api=[user for user in everyone if user not in named],
        )

    def forget_users_without_credentials(self) -> None:
        """After an alteration: a ``--sasl-user`` user whose last credential the API deleted is no longer the
        command line's (a later API upsertion makes it the API's)."""
        try:
            self._keep_command_line_users(self.command_line_users() & set(self._users()))
        except (OSError, StorageError) as exc:  # the change is committed; only the names file is behind
            log.error("could not update %s: %s", self._names_path, exc)


def migrate_credentials_file(controller: LocalController, data_dir: Path) -> int:
    """Move an older kbroker's ``scram-credentials`` into the metadata log (credentials already there are
    skipped), record which users its ``--sasl-user`` created, and rename the file ``.migrated``. Returns how many
    credentials were written."""
    path = data_dir / CREDENTIALS_FILE
    credentials, command_line_users = read_credentials_file(path)
    stored = controller.image.scram_credentials
    records = [
        credential_record(user, mechanism, credential)
        for (user, mechanism), credential in sorted(credentials.items())
        if tuple(stored.get((user, ScramMechanism(mechanism)), ()))
        != (
            credential.salt,
            credential.stored_key,
            credential.server_key,
            credential.iterations,
        )
    ]
    if records:
        controller.commit_now(records, transaction="migration of the SCRAM credentials file")
    names = data_dir / SASL_USERS_FILE
    if command_line_users - read_sasl_users(names):
        write_sasl_users(names, command_line_users | read_sasl_users(names))
    os.replace(path, path.with_name(CREDENTIALS_FILE + ".migrated"))
    fsync_directory(data_dir)
    return len(records)
