"""What a request handler is given besides the request body: the request's identity and the broker's services.

Handlers see typed services, each a narrow view of one concern, not the whole broker: ``topics`` (look-ups
and changes, kbroker/topics.py), ``groups`` (the group router and through it both group coordinators and
the committed offsets, kbroker/groups), ``transactions`` (the transaction coordinator, kbroker/transactions),
``fetch_sessions``, ``producer_ids``, ``quotas`` (client quotas, kbroker/quotas.py), ``scram_credentials``
(kbroker/security/scram_credentials.py), ``replicas`` (the replica layer produce and fetch go through,
kbroker/replication), ``authorizer`` (None without ``authorizer.class.name``), ``cluster``
(this node's identity and listeners) and ``config``. ``RequestContext.authorize`` is how a handler asks the ACLs.
kbroker/app.py builds them once (``HandlerServices``) and each connection puts them in every request's context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from protocol.messages import APIS

if TYPE_CHECKING:
    from kbroker.broker import Broker, Endpoint
    from kbroker.config import BrokerConfig
    from kbroker.fetch_sessions import FetchSessionCache
    from kbroker.groups.router import GroupRouter
    from kbroker.metrics import BrokerMetrics
    from kbroker.quotas import ClientQuotas
    from kbroker.replication import ReplicaManager
    from kbroker.security.acls import AclOperation, Authorizer, ResourceType
    from kbroker.security.scram_credentials import ScramCredentials
    from kbroker.topics import TopicService
    from kbroker.transactions.coordinator import TransactionCoordinator


audit_log = logging.getLogger("kbroker.authorizer")  # refusals, as Kafka's kafka.authorizer.logger


class Cluster(Protocol):
    """This node as the cluster of one it is: identity, listeners and whether it is shutting down."""

    @property
    def node_id(self) -> int: ...
    @property
    def cluster_id(self) -> str: ...
    @property
    def data_dir(self) -> Path: ...
    @property
    def listen(self) -> Endpoint: ...
    @property
    def advertised(self) -> Endpoint: ...
    @property
    def listeners(self) -> list[tuple[str, Endpoint]]: ...
    @property
    def draining(self) -> bool: ...

    def advertised_for(self, listener: str) -> Endpoint: ...

    def on_drain(self, listener: Callable[[], None]) -> Callable[[], None]: ...


class ProducerIds(Protocol):
    def allocate_producer_id(self) -> int: ...


class HandlerServices(NamedTuple):
    """The services every request handler may use; built once per broker."""

    config: BrokerConfig
    cluster: Cluster
    topics: TopicService
    group_router: Callable[[], GroupRouter]  # the broker's, made by the first request that needs it (``groups``)
    fetch_sessions: FetchSessionCache
    producer_ids: ProducerIds
    transactions: TransactionCoordinator
    quotas: ClientQuotas
    # The broker's SCRAM credentials (the image's), made by the first request or login that needs them.
    scram_credentials_of: Callable[[], ScramCredentials]
    replicas: ReplicaManager  # the replica layer: produce and fetch reach the logs through it
    metrics: BrokerMetrics  # counters per topic (kbroker/metrics.py)
    authorizer: Authorizer | None = None  # None: no authorizer.class.name, every request is allowed (as Kafka)

    @classmethod
    def of(cls, broker: Broker) -> HandlerServices:
        return cls(
            config=broker.config,
            cluster=broker,
            topics=broker.topics,
            group_router=lambda: broker.group_router,
            fetch_sessions=broker.fetch_sessions,
            producer_ids=broker,
            transactions=broker.transactions,
            quotas=broker.quotas,
            scram_credentials_of=lambda: broker.scram_credentials,
            replicas=broker.replicas,
            metrics=broker.metrics,
            authorizer=broker.authorizer,
        )

    @property
    def groups(self) -> GroupRouter:
        return self.group_router()

    @property
    def scram_credentials(self) -> ScramCredentials:
        return self.scram_credentials_of()


class CloseConnection(Exception):
    """A handler's verdict that the client's connection ends here, unanswered (the message says why)."""


@dataclass(slots=True)
class RequestContext:
    services: HandlerServices
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    connection_id: int
    listener: str = "PLAINTEXT"  # the name of the listener the request came in on
    principal: str = "User:ANONYMOUS"
    # The request's header and body as received (no size prefix): what a broker under a KRaft quorum forwards.
    request_frame: bytes | bytearray | None = None

    @property
    def config(self) -> BrokerConfig:
        return self.services.config

    @property
    def cluster(self) -> Cluster:
        return self.services.cluster

    @property
    def topics(self) -> TopicService:
        return self.services.topics

    @property
    def groups(self) -> GroupRouter:
        return self.services.groups

    @property
    def fetch_sessions(self) -> FetchSessionCache:
        return self.services.fetch_sessions

    @property
    def producer_ids(self) -> ProducerIds:
        return self.services.producer_ids

    @property
    def transactions(self) -> TransactionCoordinator:
        return self.services.transactions

    @property
    def quotas(self) -> ClientQuotas:
        return self.services.quotas

    @property
    def scram_credentials(self) -> ScramCredentials:
        return self.services.scram_credentials

    @property
    def replicas(self) -> ReplicaManager:
        return self.services.replicas

    @property
    def client_address(self) -> str:
        """The client's IP address, without its port, as Java writes it (what ACL hosts are matched against:
        an IPv6 ACL host written for Kafka, ``0:0:0:0:0:0:0:1``, matches here too)."""
        from kbroker.security.acls import java_host_address

        host, sep, _port = self.client_host.rpartition(":")
        return java_host_address(host.strip("[]") if sep else self.client_host)

    def authorize(self, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        """Whether this request's principal may do ``operation`` on a resource (always, without an authorizer).

        A refusal is logged on ``kbroker.authorizer`` at INFO, as Kafka's authorizer logs its denials, so a client
        refused by the ACLs can be explained from the broker's log.
        """
        authorizer = self.services.authorizer
        if authorizer is None or authorizer.authorize(
            self.principal, self.client_address, operation, resource_type, name
        ):
            return True
        audit_log.info(
            "Principal = %s is Denied operation = %s from host = %s on resource = %s:%s for request = %s",
            self.principal,
            operation.name,
            self.client_address,
            resource_type.name,
            name,
            APIS[self.api_key].name if self.api_key in APIS else self.api_key,
        )
        return False

    def authorize_any(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether some resource of ``resource_type`` may be allowed ``operation`` (Kafka's authorizeByResourceType)."""
        authorizer = self.services.authorizer
        return authorizer is None or authorizer.authorize_any(
            self.principal, self.client_address, operation, resource_type
        )

    def authorized_operations(self, resource_type: ResourceType, name: str) -> int:
        """Kafka's ``authorized_operations`` bit field for one resource: bit ``op`` set for each allowed operation."""
        from kbroker.security.acls import SUPPORTED_OPERATIONS

        authorizer = self.services.authorizer
        bits = 0
        for operation in SUPPORTED_OPERATIONS[resource_type]:  # asked, not attempted: no denial is logged
            if authorizer is None or authorizer.authorize(
                self.principal, self.client_address, operation, resource_type, name
            ):
                bits |= 1 << operation
        return bits

    @property
    def advertised(self) -> Endpoint:
        """This broker's address as advertised on the request's listener (what Metadata and others give)."""
        return self.services.cluster.advertised_for(self.listener)
