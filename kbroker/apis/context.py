"""What a request handler is given besides the request body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kbroker.broker import Broker, Endpoint


@dataclass(slots=True)
class RequestContext:
    broker: Broker
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    connection_id: int
    listener: str = "PLAINTEXT"  # the name of the listener the request came in on
    principal: str = "User:ANONYMOUS"

    @property
    def advertised(self) -> Endpoint:
        """This broker's address as advertised on the request's listener (what Metadata and others give)."""
        return self.broker.advertised_for(self.listener)
