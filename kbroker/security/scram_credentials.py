"""The SCRAM credentials: stored salted and hashed, managed with AlterUserScramCredentials and
DescribeUserScramCredentials, looked up by the SCRAM mechanisms (kbroker/security/sasl/scram.py).

What is stored per user and mechanism is RFC 5802's server-side credential: the salt, StoredKey, ServerKey and
iteration count, never the password nor the salted password (an upsertion carries the salted password; the keys
are derived from it and it is dropped). Kafka keeps them in its metadata log; kbroker keeps them in
``scram-credentials`` in the data directory, a checked file (kbroker/durable/files.py: kind, version, crc32c)
rewritten atomically on every change, so a damaged file is refused with a one-line error instead of being misread.

``kbroker serve --sasl-user`` is declarative (``configure_users``, at every start): the users it names get exactly
its passwords, and the users an earlier start's ``--sasl-user`` created but this one does not name are deleted, so a
user dropped from the command line no longer logs in. Users created through AlterUserScramCredentials stay, as in
Kafka. The file therefore records which users are ``--sasl-user``'s (format version 2). A user stays
``--sasl-user``'s when AlterUserScramCredentials later changes one of its credentials (the command line created
it, so the command line removes it; its next start resets its passwords), and stops being so once the API deletes
its last credential. A user the API created that ``--sasl-user`` then names becomes ``--sasl-user``'s.
A version 1 file (kbroker before this distinction) is migrated on reading: a user whose credentials are exactly
what ``--sasl-user`` writes (SCRAM-SHA-256 and SCRAM-SHA-512, both at 4096 iterations) is taken as
``--sasl-user``'s, any other as the API's.

``alter`` validates and answers as Kafka 4.3's controller does (ScramControlManager): an empty user, an unknown
mechanism, iterations outside 4096..16384, a user named twice in one request (in deletions, upsertions or both),
deleting a credential that does not exist, each with Kafka's code and message, results listed in Kafka's order.
``describe`` answers as its metadata image does (ScramImage.describe).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from kbroker.durable.files import DamagedFileError, read_checked, write_checked
from kbroker.quotas import java_hashmap_order, java_string_hash
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kbroker.security.sasl.scram import ScramCredential

CREDENTIALS_FILE = "scram-credentials"
CREDENTIALS_KIND = "scram-credentials"
CREDENTIALS_FORMAT_VERSION = 2  # 2 records the users --sasl-user created; 1 did not (migrated on reading)
SASL_USER_ITERATIONS = 4096  # what ``--sasl-user`` stores, for each of SCRAM_MECHANISMS
MAX_ITERATIONS = 16384  # Kafka's controller caps iterations whatever the mechanism

DUPLICATE_ALTERATION = "A user credential cannot be altered twice in the same request"
DELETE_MISSING = "Attempt to delete a user credential that does not exist"
DESCRIBE_DUPLICATE = "Cannot describe SCRAM credentials for the same user twice in a single request: "
DESCRIBE_MISSING = "Attempt to describe a user credential that does not exist: "


def _scram() -> ModuleType:
    """kbroker/security/sasl/scram.py (the mechanisms and their key derivation), imported by the first credential
    read or made: a broker without SCRAM users starts without it."""
    from kbroker.security.sasl import scram

    return scram


class ScramStoreError(OSError):
    """The credentials file could not be written: the change was not made (the store is as it was). An OSError,
    as the write's own failure was before the store put things back."""


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


def _written_by_sasl_user(credentials: dict[tuple[str, str], ScramCredential]) -> set[str]:
    """The users of a version 1 file (which did not record who created them) taken as ``--sasl-user``'s: those
    whose credentials are exactly the ones it writes, every SCRAM mechanism at SASL_USER_ITERATIONS."""
    by_user: dict[str, dict[str, int]] = {}
    for (user, mechanism), credential in credentials.items():
        by_user.setdefault(user, {})[mechanism] = credential.iterations
    shape = dict.fromkeys(_scram().SCRAM_MECHANISMS, SASL_USER_ITERATIONS)
    return {user for user, iterations in by_user.items() if iterations == shape}


class ScramCredentialStore:
    """Credentials by (user, mechanism name); ``data_dir`` None keeps them in memory only."""

    def __init__(self, data_dir: Path | None) -> None:
        self._path = data_dir / CREDENTIALS_FILE if data_dir is not None else None
        self._credentials: dict[tuple[str, str], ScramCredential] = {}
        self._command_line_users: set[str] = set()  # the users ``--sasl-user`` created (module docstring)
        self._load()

    # --- persistence -------------------------------------------------------------------------------------------

    def _load(self) -> None:
        if self._path is None or not self._path.exists():
            return
        version, payload = read_checked(self._path, CREDENTIALS_KIND, (1, CREDENTIALS_FORMAT_VERSION))
        try:
            document = json.loads(payload)
            credentials: dict[tuple[str, str], ScramCredential] = {}
            for item in document["credentials"]:
                mechanism = item["mechanism"]
                if mechanism not in _scram().SCRAM_MECHANISMS:
                    raise ValueError(f"unknown mechanism {mechanism!r}")
                credentials[(str(item["user"]), mechanism)] = _scram().ScramCredential(
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
            raise DamagedFileError(self._path, f"unreadable credentials ({exc})") from None
        self._credentials = credentials
        self._command_line_users = command_line_users

    def _save_or_undo(self, before: dict[tuple[str, str], ScramCredential], users_before: set[str]) -> None:
        """Persist the change just made in memory; if the file cannot be written, put ``before`` (and the
        ``--sasl-user`` users ``users_before``) back and raise ScramStoreError, so that no login is accepted (or
        refused) on a credential a restart would not have."""
        try:
            self._save()
        except OSError as exc:
            self._credentials = before
            self._command_line_users = users_before
            raise ScramStoreError(f"could not write the SCRAM credentials file {self._path}: {exc}") from exc

    def _save(self) -> None:
        if self._path is None:
            return
        document = {
            "credentials": [
                {
                    "user": user,
                    "mechanism": mechanism,
                    "salt": base64.b64encode(credential.salt).decode(),
                    "stored_key": base64.b64encode(credential.stored_key).decode(),
                    "server_key": base64.b64encode(credential.server_key).decode(),
                    "iterations": credential.iterations,
                }
                for (user, mechanism), credential in sorted(self._credentials.items())
            ],
            "command_line_users": sorted(self._command_line_users),
        }
        # Salted keys, not passwords, but enough for an offline guess: readable by the broker's user only.
        payload = json.dumps(document).encode()
        write_checked(self._path, CREDENTIALS_KIND, CREDENTIALS_FORMAT_VERSION, payload, private=True)

    # --- what the mechanisms and the CLI use -------------------------------------------------------------------

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._credentials.get((user, mechanism))

    def set_password(self, user: str, mechanism: str, password: str, iterations: int = 4096) -> None:
        """Store ``user``'s credential for ``mechanism`` (a name, SCRAM-SHA-256 or SCRAM-SHA-512) from a password,
        leaving who created the user as it was; ValueError, with Kafka's reason, for what the admin API refuses."""
        credential = _credential_for_password(user, mechanism, password, iterations)
        before = dict(self._credentials)
        self._credentials[(user, mechanism)] = credential
        self._save_or_undo(before, set(self._command_line_users))

    def configure_users(self, users: Sequence[tuple[str, str]]) -> ConfiguredUsers:
        """Make ``users`` (``--sasl-user``'s (user, password) pairs) the users the command line created: each gets
        both SCRAM mechanisms for its password, and those an earlier start created that ``users`` does not name
        are deleted; one write of the file. ValueError "USER: reason" for a user the admin API would refuse
        (nothing changed then); ScramStoreError if the file cannot be written (nothing changed either)."""
        named = {user for user, _ in users}
        fresh: dict[tuple[str, str], ScramCredential] = {}
        for user, password in users:
            for mechanism in _scram().SCRAM_MECHANISMS:
                try:
                    fresh[(user, mechanism)] = _credential_for_password(user, mechanism, password, SASL_USER_ITERATIONS)
                except ValueError as exc:
                    raise ValueError(f"{user}: {exc}") from None
        removed = sorted(self._command_line_users - named)
        before, users_before = dict(self._credentials), set(self._command_line_users)
        for key in [key for key in self._credentials if key[0] in removed]:
            del self._credentials[key]
        self._credentials.update(fresh)
        self._command_line_users = named
        if self._credentials != before or named != users_before:
            self._save_or_undo(before, users_before)
        everyone = self.users()
        return ConfiguredUsers(
            removed=removed,
            from_command_line=[user for user in everyone if user in named],
            from_api=[user for user in everyone if user not in named],
        )

    def users(self) -> list[str]:
        return sorted({user for user, _ in self._credentials})

    # --- the admin APIs ----------------------------------------------------------------------------------------

    def alter(self, deletions: Sequence[tuple[str, int]], upsertions: Sequence[Upsertion]) -> list[AlterResult]:
        """Apply an AlterUserScramCredentials request all at once; its results in Kafka's order (the deletions
        done, the upsertions done, then the refusals, each group in a Java HashMap's order of user names)."""
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
            if problem is None and (user, _scram().SCRAM_MECHANISMS_BY_TYPE[mechanism].name) not in self._credentials:
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
        changed = False
        before, users_before = dict(self._credentials), set(self._command_line_users)
        for user in _hashmap_order(list(to_delete), peak["delete"]):
            del self._credentials[(user, _scram().SCRAM_MECHANISMS_BY_TYPE[to_delete[user]].name)]
            results.append(AlterResult(user, ErrorCode.NONE, None))
            changed = True
        for user in _hashmap_order(list(to_upsert), peak["upsert"]):
            upsertion = to_upsert[user]
            if not upsertion.salted_password:
                # Kafka's HMAC refuses an empty key ("Empty key"): an unexpected error, reported without a message.
                errors[user] = (ErrorCode.UNKNOWN_SERVER_ERROR, "")
                continue
            scram = _scram().SCRAM_MECHANISMS_BY_TYPE[upsertion.mechanism]
            self._credentials[(user, scram.name)] = _scram().credential_from_salted_password(
                scram, upsertion.salt, upsertion.salted_password, upsertion.iterations
            )
            results.append(AlterResult(user, ErrorCode.NONE, None))
            changed = True
        for user in _hashmap_order(list(errors), len(errors)):
            code, message = errors[user]
            results.append(AlterResult(user, code, message or None))
        if changed:
            # A --sasl-user user whose last credential the API deleted is no longer the command line's.
            self._command_line_users &= {user for user, _ in self._credentials}
            self._save_or_undo(before, users_before)  # ScramStoreError: nothing of this request was applied
        return results

    def describe(self, users: Sequence[str] | None) -> list[DescribeResult]:
        """A DescribeUserScramCredentials answer: every user with a credential when ``users`` is None or empty."""
        requested: dict[str, bool] = {}  # user -> named more than once
        if not users:
            for mechanism in _scram().SCRAM_MECHANISMS:
                for user in sorted(u for u, m in self._credentials if m == mechanism):
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
                (scram.type, credential.iterations)
                for scram in _scram().SCRAM_MECHANISMS.values()
                if (credential := self._credentials.get((user, scram.name))) is not None
            ]
            if found:
                results.append(DescribeResult(user, ErrorCode.NONE, None, found))
            else:
                results.append(DescribeResult(user, ErrorCode.RESOURCE_NOT_FOUND, DESCRIBE_MISSING + user, []))
        return results
