"""A Kafka-level readiness check: is something at this address answering as a Kafka broker?

Used by ``kbroker health`` (the Docker health check), by ``kbroker.testcontainers.KBrokerContainer`` and
by the compat suite to wait for a broker. It works against any Kafka broker, not only kbroker: it sends
ApiVersions (v3, which Kafka has answered since 2.4) and then Metadata, and calls the broker ready when
ApiVersions answers without error and Metadata lists at least one broker. ApiVersions alone is answered
by a KRaft broker before it has registered with its controller; Metadata is not useful until it has.
An SSL listener is checked over TLS (``kbroker health --command-config`` with security.protocol=SSL); a SASL
listener is not, since the check would have to log in first.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass

from kbroker.wire_client import WireClient
from protocol.errors import ErrorCode
from protocol.messages.api_versions_request import ApiVersionsRequest
from protocol.messages.metadata_request import MetadataRequest

API_VERSIONS_VERSION = 3
METADATA_API_KEY = 3
METADATA_VERSIONS = range(1, 13)  # v1 is the first where an empty topic list means "no topics"


class NotReady(Exception):
    """The address does not (yet) answer as a ready Kafka broker; the message says why."""


@dataclass(frozen=True)
class Health:
    bootstrap: str
    api_count: int
    brokers: list[str]  # host:port of every broker in the Metadata answer
    cluster_id: str | None
    controller_id: int

    def summary(self) -> str:
        return (
            f"ready: {self.bootstrap} answers ApiVersions ({self.api_count} APIs) and Metadata "
            f"(brokers {', '.join(self.brokers)}; cluster id {self.cluster_id}; controller {self.controller_id})"
        )


def check(bootstrap: str, timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None) -> Health:
    """One ApiVersions and one Metadata request (over TLS with ``ssl_context``); raises NotReady unless both show
    a working broker."""
    try:
        with WireClient(bootstrap, timeout=timeout, client_id="kbroker-health", ssl_context=ssl_context) as client:
            versions = client.request(
                ApiVersionsRequest(client_software_name="kbroker-health", client_software_version="1"),
                API_VERSIONS_VERSION,
            )
            if versions.error_code != ErrorCode.NONE:
                raise NotReady(f"ApiVersions answered {ErrorCode(versions.error_code).name}")
            metadata_range = next((a for a in versions.api_keys if a.api_key == METADATA_API_KEY), None)
            if metadata_range is None:
                raise NotReady("the broker does not offer Metadata")
            version = min(metadata_range.max_version, METADATA_VERSIONS[-1])
            if version < max(metadata_range.min_version, METADATA_VERSIONS[0]):
                raise NotReady(f"no common Metadata version (broker offers {metadata_range.min_version}-{version})")
            metadata = client.request(MetadataRequest(topics=[]), version)
    except NotReady:
        raise
    except (OSError, ConnectionError, ValueError) as exc:  # refused, reset, timed out, garbled answer, TLS refused
        raise NotReady(f"{bootstrap}: {type(exc).__name__}: {exc}") from exc
    if not metadata.brokers:
        raise NotReady(f"{bootstrap} answers, but its Metadata lists no broker yet")
    return Health(
        bootstrap=bootstrap,
        api_count=len(versions.api_keys),
        brokers=[f"{b.host}:{b.port}" for b in metadata.brokers],
        cluster_id=metadata.cluster_id,
        controller_id=metadata.controller_id,
    )


def wait_until_ready(
    bootstrap: str, timeout: float = 60.0, interval: float = 0.05, ssl_context: ssl.SSLContext | None = None
) -> Health:
    """Repeat ``check`` until it passes; raises TimeoutError (with the last reason) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check(bootstrap, max(0.5, min(5.0, deadline - time.monotonic())), ssl_context)
        except NotReady as exc:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no ready Kafka broker at {bootstrap} after {timeout:g} s: {exc}") from None
        time.sleep(interval)
