"""SCRAM credentials as a broker keeps them, without a broker: a single node's controller and MetadataCache (kept in
memory, or on a metadata log in ``data_dir``) read through ScramCredentials, with synchronous changes: the path
AlterUserScramCredentials and --sasl-user take (controller, metadata image, reader)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import trio

from kbroker.metadata.controller import LocalController, MetadataCache
from kbroker.metadata.log import MetadataLog
from kbroker.security.sasl.scram import ScramCredential
from kbroker.security.scram_credentials import (
    SASL_USER_ITERATIONS,
    AlterResult,
    ConfiguredUsers,
    ScramCredentials,
    Upsertion,
    _credential_for_password,
    _scram,
    credential_record,
)

T = TypeVar("T")


class ControlledScramStore(ScramCredentials):
    """``data_dir`` given: every call opens the metadata log there (replaying it, as a start does), works, and
    closes it, so two stores on one directory are two starts of a broker."""

    def __init__(self, data_dir: Path | None = None) -> None:
        self.cache = MetadataCache()
        super().__init__(self.cache, data_dir)
        self.data_dir = data_dir
        self.controller = LocalController(1, self.cache, None) if data_dir is None else None

    def _open(self) -> tuple[LocalController, MetadataLog | None]:
        if self.controller is not None:
            return self.controller, None
        assert self.data_dir is not None
        metadata_log = MetadataLog(self.data_dir)
        self.cache = self._cache = MetadataCache()
        return LocalController(1, self.cache, metadata_log), metadata_log

    def _run(self, action: Callable[[LocalController], T]) -> T:
        controller, metadata_log = self._open()
        try:
            return action(controller)
        finally:
            if metadata_log is not None:
                metadata_log.close()

    def lookup(self, user: str, mechanism: str) -> ScramCredential | None:
        return self._run(lambda _: ScramCredentials.lookup(self, user, mechanism))

    def users(self) -> list[str]:
        return self._run(lambda _: ScramCredentials.users(self))

    def alter(self, deletions: Sequence[tuple[str, int]], upsertions: Sequence[Upsertion]) -> list[AlterResult]:
        def alter(controller: LocalController) -> list[AlterResult]:
            results = trio.run(controller.alter_user_scram_credentials, deletions, upsertions)
            self.forget_users_without_credentials()
            return results

        return self._run(alter)

    def put(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        """``user``'s credential for ``mechanism`` as given (a test vector's salt)."""
        record = credential_record(user, _scram().SCRAM_MECHANISMS[mechanism].type, credential)
        self._run(lambda controller: controller.commit_now([record], transaction="test"))

    def set_password(self, user: str, mechanism: str, password: str, iterations: int = SASL_USER_ITERATIONS) -> None:
        """``user``'s credential for ``mechanism`` made from ``password`` (ValueError with Kafka's reason for what
        AlterUserScramCredentials refuses)."""
        credential = _credential_for_password(user, mechanism, password, iterations)
        record = credential_record(user, _scram().SCRAM_MECHANISMS[mechanism].type, credential)
        self._run(lambda controller: controller.commit_now([record], transaction="test"))

    def configure_users(self, users: Sequence[tuple[str, str]]) -> ConfiguredUsers:  # type: ignore[override]
        configure = super().configure_users
        return self._run(lambda controller: configure(controller, users))


def set_password_over_the_wire(
    bootstrap: str, user: str, mechanism: str, password: str, iterations: int = SASL_USER_ITERATIONS
) -> None:
    """``user``'s credential set on a running broker through AlterUserScramCredentials, as an admin client does."""
    from kbroker.wire_client import WireClient
    from protocol.messages.alter_user_scram_credentials_request import AlterUserScramCredentialsRequest as Alter

    scram = _scram().SCRAM_MECHANISMS[mechanism]
    salt = _scram().random_string().encode()
    upsertion = Alter.ScramCredentialUpsertion(
        name=user,
        mechanism=scram.type,
        iterations=iterations,
        salt=salt,
        salted_password=_scram().salted_password(scram, password, salt, iterations),
    )
    with WireClient(bootstrap) as client:
        answer = client.request(Alter(deletions=[], upsertions=[upsertion]), 0)
    assert [(r.user, r.error_code) for r in answer.results] == [(user, 0)], answer
