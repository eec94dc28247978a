"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31): describing reads the authorizer's ACLs (those of the
metadata image, kbroker/security/authorizer.py); creating and deleting are controller operations
(kbroker/metadata/controller.py: AccessControlEntryRecords committed to the metadata log).

As Kafka's AclApis: describing needs DESCRIBE on the cluster, creating and deleting ALTER on the cluster
(CLUSTER_AUTHORIZATION_FAILED for every item otherwise); without an authorizer every answer is SECURITY_DISABLED
with Kafka's messages. What Kafka 4.3 answers for malformed items was read off a running Kafka 4.3: a binding
with an ANY resource type, pattern type, operation or permission fails the whole CreateAcls with
UNKNOWN_SERVER_ERROR and no message (Kafka cannot even build the binding), other invalid bindings fail alone with
INVALID_REQUEST and the message of Kafka's check, and a DeleteAcls filter with a code Kafka does not know fails
alone with INVALID_REQUEST. A raw UNKNOWN (0) code makes Kafka refuse to parse the request and close the
connection; kbroker answers INVALID_REQUEST instead (UNSUPPORTED.md).

DescribeAcls groups the ACLs by resource pattern, patterns and ACLs in a stable order (Kafka's order is that of
Java hash maps of enum-hashed keys, which changes from one JVM to the next).
"""

from __future__ import annotations

from itertools import groupby

from kbroker.apis.context import RequestContext
from kbroker.security.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    operation_of,
    pattern_type_of,
    permission_of,
    resource_type_of,
)
from kbroker.security.authorizer import AclResult, StandardAuthorizer
from protocol.errors import ErrorCode, KafkaError
from protocol.messages.create_acls_request import CreateAclsRequest
from protocol.messages.create_acls_response import CreateAclsResponse
from protocol.messages.delete_acls_request import DeleteAclsRequest
from protocol.messages.delete_acls_response import DeleteAclsResponse
from protocol.messages.describe_acls_request import DescribeAclsRequest
from protocol.messages.describe_acls_response import DescribeAclsResponse

# Kafka's messages when no authorizer is configured (AclApis).
NO_AUTHORIZER_DESCRIBE = "No Authorizer is configured on the broker"
NO_AUTHORIZER = "No Authorizer is configured."
UNKNOWN_CODE = 0  # a raw UNKNOWN code: Kafka's request parser refuses the request


def _authorizer(ctx: RequestContext, operation: AclOperation) -> StandardAuthorizer | None:
    """The ACL store, after Kafka's cluster check (which passes when there is no authorizer)."""
    if not ctx.authorize(operation, ResourceType.CLUSTER, CLUSTER_NAME):
        raise KafkaError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Request is not authorized.")
    authorizer = ctx.services.authorizer
    return authorizer if isinstance(authorizer, StandardAuthorizer) else None


def _filter(
    resource_type: int,
    name: str | None,
    pattern_type: int,
    principal: str | None,
    host: str | None,
    operation: int,
    permission: int,
) -> AclBindingFilter:
    if UNKNOWN_CODE in (resource_type, pattern_type, operation, permission):
        raise KafkaError(ErrorCode.INVALID_REQUEST, "The filter contains UNKNOWN elements")
    return AclBindingFilter(
        resource_type_of(resource_type),
        name,
        pattern_type_of(pattern_type),
        principal,
        host,
        operation_of(operation),
        permission_of(permission),
    )


async def handle_describe_acls(ctx: RequestContext, request: DescribeAclsRequest) -> DescribeAclsResponse:
    authorizer = _authorizer(ctx, AclOperation.DESCRIBE)
    if authorizer is None:
        return DescribeAclsResponse(error_code=ErrorCode.SECURITY_DISABLED, error_message=NO_AUTHORIZER_DESCRIBE)
    binding_filter = _filter(
        request.resource_type_filter,
        request.resource_name_filter,
        request.pattern_type_filter,
        request.principal_filter,
        request.host_filter,
        request.operation,
        request.permission_type,
    )
    resources = [
        DescribeAclsResponse.DescribeAclsResource(
            resource_type=resource_type,
            resource_name=name,
            pattern_type=pattern_type,
            acls=[
                DescribeAclsResponse.AclDescription(
                    principal=acl.principal, host=acl.host, operation=acl.operation, permission_type=acl.permission
                )
                for acl in acls
            ],
        )
        for (resource_type, name, pattern_type), acls in groupby(
            authorizer.acls(binding_filter), key=lambda acl: (acl.resource_type, acl.name, acl.pattern_type)
        )
    ]
    return DescribeAclsResponse(error_code=ErrorCode.NONE, error_message="", resources=resources)


def _binding(creation: CreateAclsRequest.AclCreation) -> AclBinding:
    codes = (creation.resource_type, creation.resource_pattern_type, creation.operation, creation.permission_type)
    if UNKNOWN_CODE in codes:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "CreatableAcls contain unknown elements")
    binding = AclBinding(
        resource_type_of(creation.resource_type),
        creation.resource_name,
        pattern_type_of(creation.resource_pattern_type),
        creation.principal,
        creation.host,
        operation_of(creation.operation),
        permission_of(creation.permission_type),
    )
    if (
        binding.resource_type == ResourceType.ANY
        or binding.pattern_type in (PatternType.ANY, PatternType.MATCH)
        or binding.operation == AclOperation.ANY
        or binding.permission == AclPermissionType.ANY
    ):
        # Kafka cannot build such a binding (its constructors throw): the whole request fails, with no message.
        raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, None)
    return binding


async def handle_create_acls(ctx: RequestContext, request: CreateAclsRequest) -> CreateAclsResponse:
    authorizer = _authorizer(ctx, AclOperation.ALTER)
    if authorizer is None:
        raise KafkaError(ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER)
    bindings = [_binding(creation) for creation in request.creations]
    results = await ctx.topics.admin.create_acls(bindings)
    return CreateAclsResponse(
        results=[
            CreateAclsResponse.AclCreationResult(
                error_code=result.code, error_message="" if result.code == ErrorCode.NONE else result.message
            )
            for result in results
        ]
    )


def _deleted(acl: AclBinding) -> DeleteAclsResponse.DeleteAclsMatchingAcl:
    return DeleteAclsResponse.DeleteAclsMatchingAcl(
        error_code=ErrorCode.NONE,
        error_message=None,
        resource_type=acl.resource_type,
        resource_name=acl.name,
        pattern_type=acl.pattern_type,
        principal=acl.principal,
        host=acl.host,
        operation=acl.operation,
        permission_type=acl.permission,
    )


async def handle_delete_acls(ctx: RequestContext, request: DeleteAclsRequest) -> DeleteAclsResponse:
    authorizer = _authorizer(ctx, AclOperation.ALTER)
    if authorizer is None:
        raise KafkaError(ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER)
    filters = [
        _filter(
            f.resource_type_filter,
            f.resource_name_filter,
            f.pattern_type_filter,
            f.principal_filter,
            f.host_filter,
            f.operation,
            f.permission_type,
        )
        for f in request.filters
    ]
    answers = await ctx.topics.admin.delete_acls(filters)
    Result = DeleteAclsResponse.DeleteAclsFilterResult
    return DeleteAclsResponse(
        filter_results=[
            Result(error_code=answer.code, error_message=answer.message, matching_acls=[])
            if isinstance(answer, AclResult)
            else Result(error_code=ErrorCode.NONE, error_message=None, matching_acls=[_deleted(a) for a in answer])
            for answer in answers
        ]
    )
