"""``kbroker acls list|create|delete``: ACL bindings, as kafka-acls.sh lists, adds and removes them.

- ``list [filter]``: DescribeAcls. With no filter every binding; the filter options narrow it: ``--principal``,
  ``--host``, ``--operation``, ``--permission allow|deny``, one resource (``--topic T``, ``--group G``,
  ``--cluster``, ``--transactional-id X``) and ``--resource-pattern-type any|match|literal|prefixed`` (default
  ``any``; ``match`` finds the bindings that apply to the named resource: literal, prefixed and wildcard).
- ``create --allow-principal|--deny-principal P ... --operation OP ... <resource> [--host H]
  [--resource-pattern-type literal|prefixed]``: CreateAcls, one binding per principal and operation; prints them.
- ``delete [filter]``: DeleteAcls with the same filter as ``list`` (at least a resource or a principal: deleting
  every binding is not done by accident); prints the bindings the broker deleted.

Operations are Kafka's names in any case, with or without separators: ``Read``, ``WRITE``, ``describe-configs``,
``IdempotentWrite``, ``All``. A broker without an authorizer answers ``SECURITY_DISABLED (54): No Authorizer is
configured on the broker`` (one line, exit 1).

JSON (``--output json``), stable keys: a list of bindings sorted as the table is (by resource type, resource name,
pattern type, principal, permission, operation, host), each
``{"principal": str, "host": str, "operation": str, "permission": "ALLOW" | "DENY", "resource_type": str,
"resource_name": str, "pattern_type": "LITERAL" | "PREFIXED"}`` (Kafka's enum names, upper case).
"""

from __future__ import annotations

import argparse
from typing import Any

from kbroker.commands.configs import raise_for_error, send_request
from kbroker.commands.connection import (
    ClientSettings,
    CommandError,
    add_client_arguments,
    add_output_argument,
    admin_client,
)

ACL_COLUMNS = ("principal", "host", "operation", "permission", "resource_type", "resource_name", "pattern_type")
# Kafka's AclOperation names, as the wire codes kafka-python's ACLOperation carries.
OPERATIONS = (
    "ALL",
    "READ",
    "WRITE",
    "CREATE",
    "DELETE",
    "ALTER",
    "DESCRIBE",
    "CLUSTER_ACTION",
    "DESCRIBE_CONFIGS",
    "ALTER_CONFIGS",
    "IDEMPOTENT_WRITE",
    "CREATE_TOKENS",
    "DESCRIBE_TOKENS",
)
CLUSTER_RESOURCE_NAME = "kafka-cluster"  # the one name a CLUSTER binding has


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("acls", help="list, create or delete ACLs")
    actions = parser.add_subparsers(dest="action", required=True)

    listing = actions.add_parser("list", help="the ACL bindings matching a filter (all by default)")
    _add_filter_arguments(listing, default_pattern="any")
    add_client_arguments(listing)
    add_output_argument(listing)
    listing.set_defaults(run=list_command)

    create = actions.add_parser("create", help="add ACL bindings")
    create.add_argument("--allow-principal", action="append", default=[], metavar="PRINCIPAL", help="User:NAME")
    create.add_argument("--deny-principal", action="append", default=[], metavar="PRINCIPAL", help="User:NAME")
    create.add_argument("--operation", action="append", default=[], metavar="OP", help="Read, Write, All, ...")
    create.add_argument("--host", default="*", help="the client host the binding is for (default *: any)")
    _add_resource_arguments(create)
    create.add_argument(
        "--resource-pattern-type", choices=("literal", "prefixed"), default="literal", help="default literal"
    )
    add_client_arguments(create)
    add_output_argument(create)
    create.set_defaults(run=create_command)

    delete = actions.add_parser("delete", help="remove the ACL bindings matching a filter")
    _add_filter_arguments(delete, default_pattern="any")
    add_client_arguments(delete)
    add_output_argument(delete)
    delete.set_defaults(run=delete_command)


def _add_resource_arguments(parser: argparse.ArgumentParser) -> None:
    resource = parser.add_mutually_exclusive_group()
    resource.add_argument("--topic", metavar="TOPIC")
    resource.add_argument("--group", metavar="GROUP")
    resource.add_argument("--transactional-id", metavar="ID")
    resource.add_argument("--cluster", action="store_true", help="the cluster resource")


def _add_filter_arguments(parser: argparse.ArgumentParser, default_pattern: str) -> None:
    parser.add_argument("--principal", metavar="PRINCIPAL", help="User:NAME")
    parser.add_argument("--host", metavar="HOST")
    parser.add_argument("--operation", metavar="OP", help="Read, Write, All, ...")
    parser.add_argument("--permission", choices=("allow", "deny"))
    _add_resource_arguments(parser)
    parser.add_argument(
        "--resource-pattern-type",
        choices=("any", "match", "literal", "prefixed"),
        default=default_pattern,
        help=f"default {default_pattern}",
    )


# --- arguments as kafka-python's ACL types ---------------------------------------------------------------------


def operation_code(text: str) -> Any:
    from kafka.admin import ACLOperation

    normalized = text.replace("-", "").replace("_", "").upper()
    for name in OPERATIONS:
        if name.replace("_", "") == normalized:
            return ACLOperation[name]
    raise CommandError(f"--operation {text}: not one of Kafka's operations ({', '.join(OPERATIONS)})")


def _principal(text: str) -> str:
    kind, sep, name = text.partition(":")
    if not sep or not kind or not name:
        raise CommandError(f"principal {text!r}: expected TYPE:NAME, such as User:alice")
    return text


def _resource(args: argparse.Namespace, *, required: bool) -> tuple[Any, str | None]:
    """(kafka-python ResourceType, name) the resource options name; ANY and None when none is given."""
    from kafka.admin import ResourceType

    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.transactional_id is not None:
        return ResourceType.TRANSACTIONAL_ID, args.transactional_id
    if args.cluster:
        return ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME
    if required:
        raise CommandError("create: name a resource (--topic, --group, --transactional-id or --cluster)")
    return ResourceType.ANY, None


def acl_filter(args: argparse.Namespace) -> Any:
    from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, ResourcePatternFilter

    resource_type, resource_name = _resource(args, required=False)
    pattern = ResourcePatternFilter(
        resource_type, resource_name, ACLResourcePatternType[args.resource_pattern_type.upper()]
    )
    return ACLFilter(
        principal=_principal(args.principal) if args.principal else None,
        host=args.host,
        operation=operation_code(args.operation) if args.operation else ACLOperation.ANY,
        permission_type=ACLPermissionType[args.permission.upper()] if args.permission else ACLPermissionType.ANY,
        resource_pattern=pattern,
    )


def acl_row(acl: Any) -> dict[str, Any]:
    pattern = acl.resource_pattern
    return {
        "principal": acl.principal,
        "host": acl.host,
        "operation": acl.operation.name,
        "permission": acl.permission_type.name,
        "resource_type": pattern.resource_type.name,
        "resource_name": pattern.resource_name,
        "pattern_type": pattern.pattern_type.name,
    }


SORT_ORDER = ("resource_type", "resource_name", "pattern_type", "principal", "permission", "operation", "host")


def _sorted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """By resource first (as kafka-acls.sh groups them), then principal, permission, operation and host."""
    return sorted(rows, key=lambda row: tuple(row[column] for column in SORT_ORDER))


# --- commands ------------------------------------------------------------------------------------------------


def list_command(args: argparse.Namespace) -> int:
    from kbroker.commands.output import emit

    acl_filter_ = acl_filter(args)
    with admin_client(ClientSettings.from_args(args)) as admin:
        acls, _ = admin.describe_acls(acl_filter_)
    emit(args.output, ACL_COLUMNS, _sorted([acl_row(acl) for acl in acls]))
    return 0


def create_command(args: argparse.Namespace) -> int:
    from kafka.admin import ACL, ACLPermissionType, ACLResourcePatternType, ResourcePattern
    from kafka.protocol.admin import CreateAclsRequest

    from kbroker.commands.output import emit

    if not args.allow_principal and not args.deny_principal:
        raise CommandError("create: give --allow-principal or --deny-principal")
    if not args.operation:
        raise CommandError("create: give at least one --operation")
    resource_type, resource_name = _resource(args, required=True)
    pattern = ResourcePattern(resource_type, resource_name, ACLResourcePatternType[args.resource_pattern_type.upper()])
    operations = list(dict.fromkeys(operation_code(text) for text in args.operation))
    acls = [
        ACL(_principal(principal), args.host, operation, permission, pattern)
        for permission, principals in (
            (ACLPermissionType.ALLOW, args.allow_principal),
            (ACLPermissionType.DENY, args.deny_principal),
        )
        for principal in dict.fromkeys(principals)
        for operation in operations
    ]
    with admin_client(ClientSettings.from_args(args)) as admin:
        creations = [admin._convert_create_acls_resource_request(acl) for acl in acls]
        response = send_request(admin, CreateAclsRequest(creations=creations))
    for acl, result in zip(acls, response.results, strict=True):
        raise_for_error(result.error_code, result.error_message, f"ACL {acl_row(acl)}")
    emit(args.output, ACL_COLUMNS, _sorted([acl_row(acl) for acl in acls]), title="Created ACLs")
    return 0


def delete_command(args: argparse.Namespace) -> int:
    from kafka.admin import ACL, ACLOperation, ACLPermissionType, ACLResourcePatternType, ResourcePattern, ResourceType
    from kafka.protocol.admin import DeleteAclsRequest

    from kbroker.commands.output import emit

    acl_filter_ = acl_filter(args)
    if acl_filter_.resource_pattern.resource_type == ResourceType.ANY and acl_filter_.principal is None:
        raise CommandError("delete: name a resource (--topic, --group, --transactional-id, --cluster) or a --principal")
    with admin_client(ClientSettings.from_args(args)) as admin:
        request = DeleteAclsRequest(filters=[admin._convert_delete_acls_resource_request(acl_filter_)])
        response = send_request(admin, request)
    deleted = []
    for result in response.filter_results:
        raise_for_error(result.error_code, result.error_message, "the ACL filter")
        for match in result.matching_acls:
            acl = ACL(
                principal=match.principal,
                host=match.host,
                operation=ACLOperation(match.operation),
                permission_type=ACLPermissionType(match.permission_type),
                resource_pattern=ResourcePattern(
                    ResourceType(match.resource_type),
                    match.resource_name,
                    ACLResourcePatternType(match.pattern_type),
                ),
            )
            raise_for_error(match.error_code, match.error_message, f"ACL {acl_row(acl)}")
            deleted.append(acl_row(acl))
    emit(args.output, ACL_COLUMNS, _sorted(deleted), title="Deleted ACLs")
    return 0
