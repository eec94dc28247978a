"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51): the wire side of
kbroker/security/scram_credentials.py. Describing reads the metadata image; altering is a controller operation
(its records committed to the metadata log before the answer).

Both need the CLUSTER resource: DESCRIBE to describe, ALTER to alter, as Kafka's KafkaApis and ControllerApis
check; refused, every user named gets CLUSTER_AUTHORIZATION_FAILED without a message (Kafka's getErrorResponse of
each request, kbroker/apis/error_responses.py).
The validation, the order of the results and the messages follow Kafka's controller (ScramControlManager).
"""

from __future__ import annotations

from kbroker.apis.context import RequestContext
from kbroker.apis.error_responses import error_response
from kbroker.security.acls import CLUSTER_NAME, AclOperation, ResourceType
from kbroker.security.sasl import scram  # noqa: F401 - the credentials import it on first use: loaded with the handler
from kbroker.security.scram_credentials import Upsertion
from protocol.errors import ErrorCode
from protocol.messages.alter_user_scram_credentials_request import AlterUserScramCredentialsRequest
from protocol.messages.alter_user_scram_credentials_response import AlterUserScramCredentialsResponse
from protocol.messages.describe_user_scram_credentials_request import DescribeUserScramCredentialsRequest
from protocol.messages.describe_user_scram_credentials_response import DescribeUserScramCredentialsResponse


async def handle_describe_user_scram_credentials(
    ctx: RequestContext, request: DescribeUserScramCredentialsRequest
) -> DescribeUserScramCredentialsResponse:
    if not ctx.authorize(AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        refused = error_response(50, 0, request, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None)
        assert refused is not None  # every version has the builder's answer
        return refused
    users = None if request.users is None else [user.name for user in request.users]
    r = DescribeUserScramCredentialsResponse
    return r(
        error_code=ErrorCode.NONE,
        error_message="",
        results=[
            r.DescribeUserScramCredentialsResult(
                user=result.user,
                error_code=result.error,
                error_message="" if result.message is None else result.message,
                credential_infos=[r.CredentialInfo(mechanism=m, iterations=i) for m, i in result.credentials],
            )
            for result in ctx.scram_credentials.describe(users)
        ],
    )


async def handle_alter_user_scram_credentials(
    ctx: RequestContext, request: AlterUserScramCredentialsRequest
) -> AlterUserScramCredentialsResponse:
    if not ctx.authorize(AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        refused = error_response(51, 0, request, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, None)
        assert refused is not None
        return refused
    # A commit that fails raises KafkaError (KAFKA_STORAGE_ERROR): every user of the request gets it, nothing changed.
    results = await ctx.topics.admin.alter_user_scram_credentials(
        [(d.name, d.mechanism) for d in request.deletions],
        [Upsertion(u.name, u.mechanism, u.iterations, u.salt, u.salted_password) for u in request.upsertions],
    )
    ctx.scram_credentials.forget_users_without_credentials()
    r = AlterUserScramCredentialsResponse
    return r(
        results=[
            r.AlterUserScramCredentialsResult(user=result.user, error_code=result.error, error_message=result.message)
            for result in results
        ]
    )
