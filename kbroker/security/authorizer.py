"""Kafka's StandardAuthorizer over the ACLs of the metadata image (AccessControlEntryRecords the controller commits
for CreateAcls and DeleteAcls).

Decisions (``authorize``), as Kafka's StandardAuthorizerData makes them:

- a principal named in ``super.users`` is allowed everything;
- the ACLs that apply to a resource are those of its type whose pattern is the LITERAL name itself, the LITERAL
  wildcard ``*``, or a PREFIXED prefix of the name; among them, those for the principal (or ``User:*``), the host
  (or ``*``) and the operation (ALL matches every operation; an ALLOW for READ, WRITE, DELETE or ALTER also
  allows DESCRIBE, an ALLOW for ALTER_CONFIGS also allows DESCRIBE_CONFIGS) decide: any DENY denies, else any
  ALLOW allows;
- if none decides, the answer is ``allow.everyone.if.no.acl.found`` when no ACL at all applies to the resource
  (whoever and whatever it is for), and a denial otherwise.

``authorize_any`` is Kafka's default Authorizer.authorizeByResourceType (KIP-679).

The ACLs are indexed by resource type, then by literal name and by prefix (with the prefix lengths in use), then
by principal, so a decision costs a few dictionary look-ups and a scan of the ACLs of its own principal and
``User:*`` on the matching resources, whatever the number of ACLs. The authorizer is a MetadataCache subscriber:
each published image's added and removed ACLs are indexed or unindexed before the change is answered, so the next
decision sees it.

Older kbrokers kept the ACLs in ``acls`` in the data directory (a checked file); ``read_acl_file`` reads it for
its one-time migration into the metadata log (kbroker/metadata/migration.py).
"""

from __future__ import annotations

import json
import logging
import uuid
from bisect import insort
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kbroker.durable.files import DamagedFileError, read_checked, write_checked
from kbroker.metadata.image import AclEntry, MetadataDelta, MetadataImage
from kbroker.security.acls import (
    USER_WILDCARD,
    WILDCARD,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    entry_applies,
    operation_of,
    pattern_type_of,
    permission_of,
    resource_type_of,
    validate_new_binding,
)
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from kbroker.config import BrokerConfig

log = logging.getLogger("kbroker.security.authorizer")

STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ACLS_KIND = "acls"
ACLS_FORMAT_VERSION = 1

AUTHORIZE_ANY_PROBE = "hardcode"  # the name Kafka's authorizeByResourceType first asks about (super users, defaults)


def parse_super_users(value: str) -> frozenset[str]:
    """``super.users``: principals separated by semicolons (blanks around them and empty items ignored)."""
    return frozenset(item.strip() for item in value.split(";") if item.strip())


def principal_problem(principal: str) -> str | None:
    """Kafka's refusal of an ACL principal that is not ``Type:name`` (its message, INVALID_REQUEST)."""
    if ":" in principal:
        return None
    return (
        f"Could not parse principal from `{principal}` "
        "(no colon is present separating the principal type from the principal name)"
    )


# Kafka 4.4 matches a host written as a CIDR block (an address with "/") against the client's address, once the
# cluster's metadata version is 4.4-IV1; kbroker matches hosts literally, so it answers such an ACL as a Kafka 4.4
# cluster at an older metadata version does (UNSUPPORTED.md).
CIDR_HOSTS_UNSUPPORTED = "CIDR-based ACL host patterns require metadata version 4.4-IV1 or higher."


def host_problem(host: str) -> tuple[ErrorCode, str] | None:
    """Kafka 4.4's refusal of an ACL host (after the principal's): empty, or a CIDR block (see above)."""
    if not host:
        return ErrorCode.INVALID_REQUEST, "Host pattern cannot be null or empty"
    if host != WILDCARD and "/" in host:
        return ErrorCode.UNSUPPORTED_VERSION, CIDR_HOSTS_UNSUPPORTED
    return None


@dataclass(frozen=True, slots=True)
class AclResult:
    code: ErrorCode
    message: str | None = None


class _TypeIndex:
    """The ACLs of one resource type: by literal name (the wildcard included) and by prefix, each resource's ACLs
    grouped by principal, so a decision looks only at the ACLs of its principal and of ``User:*`` (a resource
    that thousands of principals have ACLs on costs no more than one with a single ACL)."""

    __slots__ = ("literal", "prefixed", "prefix_lengths", "_length_counts")

    def __init__(self) -> None:
        self.literal: dict[str, dict[str, list[AclBinding]]] = {}
        self.prefixed: dict[str, dict[str, list[AclBinding]]] = {}
        self.prefix_lengths: list[int] = []  # sorted, distinct: the lengths of the prefixes in ``prefixed``
        self._length_counts: Counter[int] = Counter()  # prefixes per length: kept in step, never recounted

    def add(self, acl: AclBinding) -> None:
        table = self.literal if acl.pattern_type == PatternType.LITERAL else self.prefixed
        if acl.pattern_type == PatternType.PREFIXED and acl.name not in table:
            self._length_counts[len(acl.name)] += 1
            if self._length_counts[len(acl.name)] == 1:
                insort(self.prefix_lengths, len(acl.name))
        table.setdefault(acl.name, {}).setdefault(acl.principal, []).append(acl)

    def remove(self, acl: AclBinding) -> None:
        table = self.literal if acl.pattern_type == PatternType.LITERAL else self.prefixed
        by_principal = table[acl.name]
        entries = by_principal[acl.principal]
        entries.remove(acl)
        if not entries:
            del by_principal[acl.principal]
        if not by_principal:
            del table[acl.name]
            if acl.pattern_type == PatternType.PREFIXED:
                self._length_counts[len(acl.name)] -= 1
                if not self._length_counts[len(acl.name)]:
                    del self._length_counts[len(acl.name)]
                    self.prefix_lengths.remove(len(acl.name))

    def applying_to(self, name: str) -> Iterator[dict[str, list[AclBinding]]]:
        """The ACLs (by principal) of each resource pattern that matches the resource ``name``."""
        exact = self.literal.get(name)
        if exact:
            yield exact
        if name != WILDCARD:
            wildcard = self.literal.get(WILDCARD)
            if wildcard:
                yield wildcard
        for length in self.prefix_lengths:
            if length > len(name):
                break
            found = self.prefixed.get(name[:length])
            if found:
                yield found

    def __iter__(self) -> Iterator[AclBinding]:
        for table in (self.literal, self.prefixed):
            for by_principal in table.values():
                for entries in by_principal.values():
                    yield from entries


class StandardAuthorizer:
    """Kafka's StandardAuthorizer: ACL decisions over the metadata image's ACLs, and the ACLs DescribeAcls lists."""

    def __init__(self, super_users: Iterable[str] = (), allow_if_no_acl: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl
        self._acls: Counter[AclBinding] = Counter()  # one binding under two record ids counts twice
        self._by_type: dict[ResourceType, _TypeIndex] = {}
        self._source: Mapping[uuid.UUID, AclEntry] = {}  # the image's ACLs the index holds

    def publish(self, image: MetadataImage, delta: MetadataDelta) -> None:
        """A MetadataCache subscriber: the ACLs are the image's. Only the ACLs added or removed since the last
        image are indexed or unindexed (an image whose ACLs did not change shares its mapping: nothing to do)."""
        if image.acls is self._source:
            return
        previous, self._source = self._source, image.acls
        for acl_id in previous.keys() - image.acls.keys():
            self._remove(acl_binding_of(previous[acl_id]))
        for acl_id in image.acls.keys() - previous.keys():
            self._add(acl_binding_of(image.acls[acl_id]))

    def _add(self, acl: AclBinding) -> None:
        self._acls[acl] += 1
        if self._acls[acl] == 1:
            self._by_type.setdefault(acl.resource_type, _TypeIndex()).add(acl)

    def _remove(self, acl: AclBinding) -> None:
        self._acls[acl] -= 1
        if not self._acls[acl]:
            del self._acls[acl]
            self._by_type[acl.resource_type].remove(acl)

    @classmethod
    def from_config(cls, config: BrokerConfig) -> StandardAuthorizer | None:
        """The authorizer ``authorizer.class.name`` names (None for the empty name: no authorizer)."""
        if not str(config["authorizer.class.name"]).strip():
            return None
        allow = config["allow.everyone.if.no.acl.found"]
        allow_if_no_acl = allow if isinstance(allow, bool) else str(allow).strip().lower() == "true"
        return cls(parse_super_users(str(config["super.users"] or "")), allow_if_no_acl)

    # --- decisions ----------------------------------------------------------------------------------------------

    def authorize(
        self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType, name: str
    ) -> bool:
        if principal in self.super_users:
            return True
        index = self._by_type.get(resource_type)
        if index is None:
            return self.allow_if_no_acl
        found_any = allowed = False
        for by_principal in index.applying_to(name):
            found_any = True  # an ACL on the resource, whoever it is for: the default no longer applies
            for who in (principal, USER_WILDCARD):
                for acl in by_principal.get(who, ()):
                    if entry_applies(acl, principal, host, operation):
                        if acl.permission == AclPermissionType.DENY:
                            return False
                        allowed = True
        if allowed:
            return True
        return self.allow_if_no_acl and not found_any

    def authorize_any(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Kafka's Authorizer.authorizeByResourceType: allowed if a made-up resource is (super users, the default,
        wildcard or ``h`` prefixes), else if the principal's ALLOW ACLs for ``operation`` (or ALL, no implied
        operations) name some resource that none of its DENY ACLs covers: a DENY on the wildcard denies all, a
        LITERAL DENY covers that literal name, a PREFIXED DENY covers every name it prefixes."""
        if operation in (AclOperation.ANY, AclOperation.UNKNOWN):
            raise ValueError(f"authorize_any does not take operation {operation.name}")
        if resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            raise ValueError(f"authorize_any does not take resource type {resource_type.name}")
        if self.authorize(principal, host, operation, resource_type, AUTHORIZE_ANY_PROBE):
            return True
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow_literal: set[str] = set()
        allow_prefixed: set[str] = set()
        wildcard_allowed = False
        for acl in self._by_type.get(resource_type, ()):
            if acl.host != host and acl.host != WILDCARD:
                continue
            if acl.principal != principal and acl.principal != USER_WILDCARD:
                continue
            if acl.operation != operation and acl.operation != AclOperation.ALL:
                continue
            literal = acl.pattern_type == PatternType.LITERAL
            if acl.permission == AclPermissionType.DENY:
                if literal and acl.name == WILDCARD:
                    return False
                (deny_literal if literal else deny_prefixed).add(acl.name)
            elif literal and acl.name == WILDCARD:
                wildcard_allowed = True
            else:
                (allow_literal if literal else allow_prefixed).add(acl.name)
        if wildcard_allowed:
            return True
        for name in allow_literal:
            if name not in deny_literal and not _has_prefix_in(name, deny_prefixed):
                return True
        return any(not _has_prefix_in(name, deny_prefixed) for name in allow_prefixed)

    # --- the store ----------------------------------------------------------------------------------------------

    def acls(self, binding_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        """The image's ACLs ``binding_filter`` selects (all without one), in a stable order."""
        selected = (acl for acl in self._acls if binding_filter is None or binding_filter.matches(acl))
        return sorted(selected, key=acl_order)


def new_acl_refusal(binding: AclBinding) -> AclResult | None:
    """Why Kafka refuses to create ``binding`` (AclApis, then its controller's AclControlManager), or None."""
    problem = validate_new_binding(binding) or principal_problem(binding.principal)
    if problem is not None:
        return AclResult(ErrorCode.INVALID_REQUEST, problem)
    refusal = host_problem(binding.host)
    return AclResult(*refusal) if refusal is not None else None


def acl_binding_of(entry: AclEntry) -> AclBinding:
    """An ACL of the metadata image (codes as AccessControlEntryRecord carries them) as a binding."""
    return AclBinding(
        resource_type_of(entry.resource_type),
        entry.resource_name,
        pattern_type_of(entry.pattern_type),
        entry.principal,
        entry.host,
        operation_of(entry.operation),
        permission_of(entry.permission_type),
    )


def acl_entry_of(binding: AclBinding) -> AclEntry:
    return AclEntry(
        int(binding.resource_type),
        binding.name,
        int(binding.pattern_type),
        binding.principal,
        binding.host,
        int(binding.operation),
        int(binding.permission),
    )


def read_acl_file(path: Path) -> list[AclBinding]:
    """The ACLs of the file older kbrokers kept them in (``acls`` in the data directory); DamagedFileError if it
    cannot be read."""
    _, payload = read_checked(path, ACLS_KIND, (ACLS_FORMAT_VERSION,))
    try:
        return [
            AclBinding(
                ResourceType(item[0]),
                str(item[1]),
                PatternType(item[2]),
                str(item[3]),
                str(item[4]),
                AclOperation(item[5]),
                AclPermissionType(item[6]),
            )
            for item in json.loads(payload)["acls"]
        ]
    except (ValueError, KeyError, TypeError, IndexError) as exc:  # a checksum-valid file kbroker cannot read
        raise DamagedFileError(path, f"unreadable ACLs ({exc})") from None


def write_acl_file(path: Path, acls: Iterable[AclBinding]) -> None:
    """An ACL file as older kbrokers wrote it (for tests of the migration)."""
    document = {"acls": [list(acl_order(acl)) for acl in sorted(acls, key=acl_order)]}
    write_checked(path, ACLS_KIND, ACLS_FORMAT_VERSION, json.dumps(document).encode())


def _has_prefix_in(name: str, prefixes: set[str]) -> bool:
    return any(name[:length] in prefixes for length in range(1, len(name) + 1))


def acl_order(acl: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    return (
        acl.resource_type,
        acl.name,
        acl.pattern_type,
        acl.principal,
        acl.host,
        acl.operation,
        acl.permission,
    )
