"""A quota manager fed by a single node's controller kept in memory, with synchronous alterations: the path
AlterClientQuotas takes (controller, metadata image, ClientQuotas as its subscriber), without a broker."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trio

from kbroker.metadata.controller import LocalController, MetadataCache
from kbroker.quotas import ClientQuotas, QuotaAlterResult, QuotaEntry, is_ip_literal


class ControlledQuotas(ClientQuotas):
    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        cache = MetadataCache()
        cache.subscribe(self.publish)
        self.controller = LocalController(1, cache, None)

    def alter(
        self,
        entries: Sequence[QuotaEntry],
        validate_only: bool,
        resolvable: Callable[[str], bool] = is_ip_literal,
    ) -> list[QuotaAlterResult]:
        return trio.run(self.controller.alter_client_quotas, entries, validate_only, resolvable)
