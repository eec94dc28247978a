"""A StandardAuthorizer fed by a single node's controller kept in memory, with synchronous create and delete: the
path CreateAcls and DeleteAcls take (controller, metadata image, authorizer), without a broker."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import trio

from kbroker.metadata.controller import LocalController, MetadataCache
from kbroker.metadata.log import MetadataLog
from kbroker.security.acls import AclBinding, AclBindingFilter
from kbroker.security.authorizer import AclResult, StandardAuthorizer


class ControlledAuthorizer(StandardAuthorizer):
    def __init__(
        self, super_users: Iterable[str] = (), allow_if_no_acl: bool = False, *, data_dir: Path | None = None
    ) -> None:
        """``data_dir``: the metadata log is kept there (and replayed when it already exists)."""
        super().__init__(super_users, allow_if_no_acl)
        cache = MetadataCache()
        cache.subscribe(self.publish)
        self.metadata_log = MetadataLog(data_dir) if data_dir is not None else None
        self.controller = LocalController(1, cache, self.metadata_log)

    def create(self, bindings: Sequence[AclBinding]) -> list[AclResult]:
        return trio.run(self.controller.create_acls, bindings)

    def delete(self, filters: Sequence[AclBindingFilter]) -> list[list[AclBinding] | AclResult]:
        return trio.run(self.controller.delete_acls, filters)

    def close(self) -> None:
        if self.metadata_log is not None:
            self.metadata_log.close()
