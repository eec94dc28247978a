"""ACL vocabulary with Kafka's wire codes: resource types, pattern types, operations and permissions.

The codes are those of Kafka's ``ResourceType``, ``PatternType``, ``AclOperation`` and ``AclPermissionType``,
as CreateAcls, DescribeAcls and DeleteAcls carry them and as ``authorized_operations`` bit fields number them.
"""

from __future__ import annotations

import functools
import ipaddress
from enum import IntEnum
from typing import NamedTuple, Protocol, TypeVar


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only: any pattern type
    MATCH = 2  # filters only: every binding that matches the name (literal, wildcard and prefixes)
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"  # the one CLUSTER resource's name
WILDCARD = "*"  # a LITERAL resource name or host that matches every name


# The operations that mean something on each resource type (Kafka's AclEntry.supportedOperations): what an
# ``authorized_operations`` bit field is computed over.
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (
        AclOperation.READ,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    ),
    ResourceType.CLUSTER: (
        AclOperation.CREATE,
        AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE,
    ),
    ResourceType.TRANSACTIONAL_ID: (AclOperation.DESCRIBE, AclOperation.WRITE, AclOperation.TWO_PHASE_COMMIT),
    ResourceType.DELEGATION_TOKEN: (AclOperation.DESCRIBE,),
    ResourceType.USER: (AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS),
}


class Authorizer(Protocol):
    """What request handlers ask (through RequestContext.authorize); kbroker/security/authorizer.py implements it.

    ``principal`` is ``Type:name`` (``User:alice``), ``host`` the client's IP address.
    """

    def authorize(
        self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType, name: str
    ) -> bool:
        """Whether ``principal`` from ``host`` may do ``operation`` on the resource ``name`` of ``resource_type``."""
        ...

    def authorize_any(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Kafka's authorizeByResourceType (KIP-679): whether some resource of the type could be allowed, e.g.
        WRITE on any topic lets an idempotent producer without IDEMPOTENT_WRITE on the cluster get an id."""
        ...


E = TypeVar("E", bound=IntEnum)

USER_WILDCARD = "User:*"  # an ACL principal that matches every principal

# Kafka's StandardAuthorizerData: an ALLOW ACL for one of these operations also allows DESCRIBE (resp.
# DESCRIBE_CONFIGS). DENY ACLs imply nothing: denying READ does not deny DESCRIBE.
IMPLIES_DESCRIBE = frozenset(
    {AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
)
IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})


def _enum_or_unknown(enum: type[E], code: int) -> E:
    """Kafka's ``fromCode``: a code it does not know is UNKNOWN."""
    try:
        return enum(code)
    except ValueError:
        return enum(0)


def resource_type_of(code: int) -> ResourceType:
    return _enum_or_unknown(ResourceType, code)


def pattern_type_of(code: int) -> PatternType:
    return _enum_or_unknown(PatternType, code)


def operation_of(code: int) -> AclOperation:
    return _enum_or_unknown(AclOperation, code)


def permission_of(code: int) -> AclPermissionType:
    return _enum_or_unknown(AclPermissionType, code)


class AclBinding(NamedTuple):
    """One ACL: a resource pattern (type, name, LITERAL or PREFIXED) and an entry (principal, host, operation,
    ALLOW or DENY). Kafka's AclBinding / StandardAcl."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def describe(self) -> str:
        return (
            f"(pattern=ResourcePattern(resourceType={self.resource_type.name}, name={self.name}, "
            f"patternType={self.pattern_type.name}), entry=(principal={self.principal}, host={self.host}, "
            f"operation={self.operation.name}, permissionType={self.permission.name}))"
        )


def validate_new_binding(binding: AclBinding) -> str | None:
    """Why Kafka refuses to create ``binding`` (an INVALID_REQUEST message), or None if it is acceptable.

    The checks and messages of Kafka's AclApis.handleCreateAcls (the cluster's name, an empty name) and then
    AclControlManager.validateNewAcl, in their order.
    """
    if binding.resource_type == ResourceType.CLUSTER and binding.name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if binding.name == "":
        return "Invalid empty resource name"
    if binding.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {binding.resource_type.name}"
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {binding.pattern_type.name}"
    if binding.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return f"Invalid operation {binding.operation.name}"
    if binding.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        return f"Invalid permissionType {binding.permission.name}"
    return None


class AclBindingFilter(NamedTuple):
    """What DescribeAcls and DeleteAcls select: None for a name, principal or host matches any; ANY resource type,
    operation or permission matches any; pattern type ANY matches every binding with exactly this name (any
    pattern type), MATCH every binding that would apply to a resource of this name (itself, the wildcard, its
    prefixes). Kafka's AclBindingFilter."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    def unknown_problem(self) -> str | None:
        """Kafka's AclControlManager.validateFilter: a filter with an UNKNOWN element is refused."""
        if self.resource_type == ResourceType.UNKNOWN or self.pattern_type == PatternType.UNKNOWN:
            return "Unknown patternFilter."
        if self.operation == AclOperation.UNKNOWN or self.permission == AclPermissionType.UNKNOWN:
            return "Unknown entryFilter."
        return None

    def matches(self, acl: AclBinding) -> bool:
        return self.matches_pattern(acl) and self.matches_entry(acl)

    def matches_pattern(self, acl: AclBinding) -> bool:
        """Kafka's ResourcePatternFilter.matches."""
        if self.resource_type != ResourceType.ANY and self.resource_type != acl.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != acl.pattern_type:
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, acl.pattern_type):
            return self.name == acl.name
        # MATCH: the binding applies to a resource called ``name``.
        if acl.pattern_type == PatternType.LITERAL:
            return self.name == acl.name or acl.name == WILDCARD
        return self.name.startswith(acl.name)

    def matches_entry(self, acl: AclBinding) -> bool:
        """Kafka's AccessControlEntryFilter.matches."""
        return (
            (self.principal is None or self.principal == acl.principal)
            and (self.host is None or self.host == acl.host)
            and (self.operation == AclOperation.ANY or self.operation == acl.operation)
            and (self.permission == AclPermissionType.ANY or self.permission == acl.permission)
        )


def entry_applies(acl: AclBinding, principal: str, host: str, operation: AclOperation) -> bool:
    """Whether ``acl`` (whose resource pattern is known to match) speaks about ``principal`` from ``host`` doing
    ``operation``: Kafka's StandardAuthorizerData.findResult without the verdict.

    The principal is the ACL's or ``User:*``; the host the ACL's or ``*``; the operation the ACL's, or any if the
    ACL is for ALL, or DESCRIBE (DESCRIBE_CONFIGS) when an ALLOW ACL is for an operation that implies it.
    """
    if acl.principal != principal and acl.principal != USER_WILDCARD:
        return False
    if acl.host != WILDCARD and acl.host != host:
        return False
    if acl.operation == AclOperation.ALL or acl.operation == operation:
        return True
    if acl.permission != AclPermissionType.ALLOW:
        return False
    if operation == AclOperation.DESCRIBE:
        return acl.operation in IMPLIES_DESCRIBE
    if operation == AclOperation.DESCRIBE_CONFIGS:
        return acl.operation in IMPLIES_DESCRIBE_CONFIGS
    return False


@functools.lru_cache(maxsize=4096)  # asked on every authorization of a request: a handful of client addresses
def java_host_address(address: str) -> str:
    """A client's IP address as Kafka matches ACL hosts against it: Java's InetAddress.getHostAddress.

    IPv4 is as Python writes it; IPv6 is not compressed (``::1`` is ``0:0:0:0:0:0:0:1``, ``fe80::1%eth0`` is
    ``fe80:0:0:0:0:0:0:1%eth0``) and an IPv4-mapped one is its IPv4 address, so an ACL written for Kafka with a
    client's IPv6 address matches here too. Anything that is not an IP address is returned as it is.
    """
    text, percent, scope = address.partition("%")
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    groups = ":".join(format(int(group, 16), "x") for group in ip.exploded.split(":"))
    return groups + percent + scope
