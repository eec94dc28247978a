"""The handler table: API key → handler and the versions it handles.

This table is the single source of truth: ApiVersions is derived from it, so the versions the broker
advertises can never drift from what it handles. Each API family lives in its own module, named here as
"module.function" and imported on the first request that needs it: the broker answers its first
Metadata request without loading the codecs of forty other APIs.

A handler that cannot be imported (the process is out of descriptors, EMFILE, and cannot open its source) fails
only the request that needed it: that request is answered UNKNOWN_SERVER_ERROR, as Kafka answers an unexpected
server-side error, the failure is logged once, and the import is tried again on the next request.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kbroker.apis.context import RequestContext
from protocol.errors import ErrorCode, KafkaError
from protocol.messages import APIS
from protocol.messages.api_versions_response import ApiVersionsResponse

log = logging.getLogger("kbroker.apis")

Handler = Callable[[RequestContext, Any], Awaitable[Any]]


class HandlerUnavailable(KafkaError):
    """The handler's module could not be imported this time; the request is answered with this error."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNKNOWN_SERVER_ERROR, message)


@dataclass(slots=True)
class ApiHandler:
    api_key: int
    min_version: int
    max_version: int
    target: str  # "module.function" under kbroker.apis
    _handle: Handler | None = None
    _load_failure: str | None = None  # why the last import failed, logged once until one succeeds

    @property
    def name(self) -> str:
        return APIS[self.api_key].name

    @property
    def handle(self) -> Handler:
        """The handler, imported on first use; HandlerUnavailable if it cannot be imported now."""
        if self._handle is None:
            reason = self._import()
            if reason is not None:
                self._log_failure(reason)
                raise HandlerUnavailable(f"cannot load the {self.name} handler: {reason}")
        assert self._handle is not None
        return self._handle

    def load(self, *, quiet: bool = False) -> str | None:
        """Import the handler and its request and response classes now: None once loaded, else why not (logged
        once, unless ``quiet``: the caller reports it)."""
        reason = self._import() if self._handle is None else None
        if reason is None:
            schema = APIS[self.api_key]
            try:
                schema.request_type()
                schema.response_type()
            except (OSError, ImportError) as exc:
                reason = _describe(exc)
        if reason is not None and not quiet:
            self._log_failure(reason)
        return reason

    def _import(self) -> str | None:
        """Import the handler's function: None if done, else why it failed."""
        module, _, function = self.target.rpartition(".")
        try:
            handle = getattr(importlib.import_module(f"kbroker.apis.{module}"), function)
            if self.api_key in FORWARDED:
                from kbroker.apis.forwarded import forwarded_in_a_cluster

                handle = forwarded_in_a_cluster(handle)
        except (OSError, ImportError) as exc:  # ImportError: a module it imports met the same EMFILE
            return _describe(exc)
        self._handle = handle
        if self._load_failure is not None:
            log.warning("the %s handler is loaded now", self.name)
            self._load_failure = None
        return None

    def _log_failure(self, reason: str) -> None:
        """Log why loading failed, once while the reason stays the same."""
        if reason != self._load_failure:
            log.error("cannot load the %s handler: %s (its requests fail until it can be)", self.name, reason)
            self._load_failure = reason

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


def _describe(exc: OSError | ImportError) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror if exc.filename is None else f"{exc.strerror}: {exc.filename}"
    return str(exc)


def _table(*entries: tuple[int, int, int, str]) -> dict[int, ApiHandler]:
    table: dict[int, ApiHandler] = {}
    for key, low, high, target in entries:
        schema = APIS[key]
        # A handler may not claim versions the generated codecs cannot parse.
        assert schema.valid_versions[0] <= low <= high <= schema.valid_versions[1], (schema.name, low, high)
        table[key] = ApiHandler(key, low, high, target)
    return table


HANDLERS: dict[int, ApiHandler] = _table(
    # Produce advertises from v0 as Kafka does (KAFKA-18659) so librdkafka keeps working, though the
    # generated codecs (Kafka 4.x) parse v3+; v0-2 carry message format v0/v1, which Kafka 4 rejects too.
    (0, 3, 13, "produce.handle_produce"),
    (1, 4, 18, "fetch.handle_fetch"),
    (2, 1, 11, "list_offsets.handle_list_offsets"),
    (3, 0, 13, "metadata.handle_metadata"),
    (8, 2, 9, "group_offsets.handle_offset_commit"),
    (9, 1, 9, "group_offsets.handle_offset_fetch"),
    (10, 0, 6, "groups.handle_find_coordinator"),
    (11, 0, 9, "groups.handle_join_group"),
    (12, 0, 4, "groups.handle_heartbeat"),
    (13, 0, 5, "groups.handle_leave_group"),
    (14, 0, 5, "groups.handle_sync_group"),
    (15, 0, 6, "groups.handle_describe_groups"),
    (16, 0, 5, "groups.handle_list_groups"),
    (17, 0, 1, "sasl.handle_sasl_handshake"),
    (18, 0, 5, "api_versions.handle_api_versions"),
    (19, 2, 7, "topics.handle_create_topics"),
    (20, 1, 6, "topics.handle_delete_topics"),
    (21, 0, 2, "records_admin.handle_delete_records"),
    (22, 0, 5, "producer_ids.handle_init_producer_id"),
    (23, 2, 4, "leader_epochs.handle_offset_for_leader_epoch"),
    (24, 0, 5, "transactions.handle_add_partitions_to_txn"),
    (25, 0, 4, "transactions.handle_add_offsets_to_txn"),
    (26, 0, 5, "transactions.handle_end_txn"),
    (27, 1, 2, "txn_markers.handle_write_txn_markers"),
    (28, 0, 5, "transactions.handle_txn_offset_commit"),
    (29, 1, 3, "acls.handle_describe_acls"),
    (30, 1, 3, "acls.handle_create_acls"),
    (31, 1, 3, "acls.handle_delete_acls"),
    (32, 1, 4, "configs.handle_describe_configs"),
    (33, 0, 2, "configs.handle_alter_configs"),
    (34, 1, 2, "log_dirs.handle_alter_replica_log_dirs"),
    (35, 1, 5, "log_dirs.handle_describe_log_dirs"),
    (36, 0, 2, "sasl.handle_sasl_authenticate"),
    (37, 0, 3, "topics.handle_create_partitions"),
    (42, 0, 3, "groups.handle_delete_groups"),
    (43, 0, 2, "replicas.handle_elect_leaders"),
    (44, 0, 1, "configs.handle_incremental_alter_configs"),
    (45, 0, 1, "replicas.handle_alter_partition_reassignments"),
    (46, 0, 0, "replicas.handle_list_partition_reassignments"),
    (47, 0, 0, "group_offsets.handle_offset_delete"),
    (48, 0, 1, "client_quotas.handle_describe_client_quotas"),
    (49, 0, 1, "client_quotas.handle_alter_client_quotas"),
    (50, 0, 0, "scram_credentials.handle_describe_user_scram_credentials"),
    (51, 0, 0, "scram_credentials.handle_alter_user_scram_credentials"),
    (55, 0, 2, "quorum.handle_describe_quorum"),
    (57, 0, 2, "features.handle_update_features"),
    (60, 0, 2, "cluster.handle_describe_cluster"),
    (61, 0, 0, "producers.handle_describe_producers"),
    (65, 0, 0, "transaction_admin.handle_describe_transactions"),
    (66, 0, 2, "transaction_admin.handle_list_transactions"),
    (68, 0, 1, "consumer_groups.handle_consumer_group_heartbeat"),
    (69, 0, 1, "consumer_groups.handle_consumer_group_describe"),
    (74, 0, 1, "config_resources.handle_list_config_resources"),
    (75, 0, 0, "cluster.handle_describe_topic_partitions"),
)

API_VERSIONS = 18

# What Kafka 4.4's broker forwards whole to the active controller (KafkaApis.forwardToController): under a KRaft
# quorum these go to the controller in an Envelope with the client's principal (kbroker/apis/forwarded.py).
# CreateTopics, DeleteTopics, CreateAcls, DeleteAcls, CreatePartitions, ElectLeaders, AlterPartitionReassignments,
# ListPartitionReassignments, AlterClientQuotas, AlterUserScramCredentials, DescribeQuorum, UpdateFeatures.
FORWARDED = frozenset({19, 20, 30, 31, 37, 43, 45, 46, 49, 51, 55, 57})

# What Kafka's ApiKeys call forwardable: under a KRaft quorum a broker advertises these in the versions both it and
# the active controller serve (ApiVersionsResponse.intersectForwardableApis), and not at all if they share none.
FORWARDABLE = FORWARDED | {33, 44}  # AlterConfigs and IncrementalAlterConfigs are forwarded in part

# Versions advertised that differ from the handled range (see the Produce note above).
ADVERTISED_MIN_VERSION = {0: 0}


@cache  # the table is fixed at import; every connection asks for it first
def advertised_versions() -> list[ApiVersionsResponse.ApiVersion]:
    return [
        ApiVersionsResponse.ApiVersion(
            api_key=h.api_key,
            min_version=ADVERTISED_MIN_VERSION.get(h.api_key, h.min_version),
            max_version=h.max_version,
        )
        for h in sorted(HANDLERS.values(), key=lambda h: h.api_key)
    ]


def advertised_under(controller: Mapping[int, tuple[int, int]]) -> list[ApiVersionsResponse.ApiVersion]:
    """The advertised versions with each forwardable API's narrowed to those ``controller`` serves too."""
    advertised = []
    for api in advertised_versions():
        if api.api_key in FORWARDABLE:
            low, high = controller.get(api.api_key, (0, -1))
            low, high = max(low, api.min_version), min(high, api.max_version)
            if low > high:
                continue
            api = ApiVersionsResponse.ApiVersion(api_key=api.api_key, min_version=low, max_version=high)
        advertised.append(api)
    return advertised


def unsupported_version_response() -> ApiVersionsResponse:
    """The v0 answer to an ApiVersions version the broker does not know: as Kafka (KIP-511), it lists only the
    ApiVersions versions, so the client can retry with one of them."""
    own = [v for v in advertised_versions() if v.api_key == API_VERSIONS]
    return ApiVersionsResponse(error_code=ErrorCode.UNSUPPORTED_VERSION, api_keys=own)
