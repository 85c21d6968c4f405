"""Users' credentials and access rules, read and changed over the wire while the brokers run
(SPEC.md §8: DescribeAcls, CreateAcls, DeleteAcls, DescribeUserScramCredentials and
AlterUserScramCredentials), by a principal broker/authorization.py let through: DESCRIBE on the
cluster to read, ALTER on the cluster to change.

Every change is a write to the metadata store, which is where every broker reads them
(docs/design.md#who-may-do-what): a credential at each authentication, so a user added through
one broker authenticates at any broker once the answer has come; the rules every
:data:`~broker.authorization.ACL_REFRESH`, so a rule applies on the broker that wrote it before
its answer, and on every other broker within that period and one read of the store.

Each entry of a request is bounded and checked before the store sees it: at most
:data:`MAX_ENTRIES` of them, names as the broker's ``--max-id-bytes`` bounds ids, and a
credential exactly as SCRAM makes one (a known mechanism, Kafka's iteration bounds, keys of the
hash's size), since whatever is stored is what every later authentication computes with.
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.authorization import Access
from coordinator.limits import RequestLimits
from coordinator.validation import valid_id, valid_topic_name
from protocol import (
    AclBinding,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ErrorCode,
    ResponseMessage,
    ScramCredentialInfo,
    ScramUpsertion,
    UserAlteration,
    UserScramCredentials,
    error_response,
)
from protocol.sasl import MECHANISMS, ScramCredential
from statemachine.acl import WILDCARD, Acl, ResourceType, acl_of, binding_of
from store import SecurityStore

__all__ = [
    "MAX_ENTRIES",
    "MAX_ITERATIONS",
    "MAX_SALT_BYTES",
    "MIN_ITERATIONS",
    "RightsRequest",
    "answer",
]

#: Rules, users or credentials one request may name: an operator changes a handful at a time,
#: and each is checked, and a user's written, before the answer.
MAX_ENTRIES = 1000
#: Kafka's bounds on a SCRAM credential's PBKDF2 rounds: below RFC 7677's 4096 a stolen credential
#: is cheap to attack; above 16384 every authentication costs the broker that much hashing.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
#: A salt is random bytes the client chose (scramp makes 16).
MAX_SALT_BYTES = 64
#: StoredKey and ServerKey are one digest of the mechanism's hash each.
_KEY_BYTES = {"SCRAM-SHA-256": 32, "SCRAM-SHA-512": 64}
assert set(_KEY_BYTES) == set(MECHANISMS)

RightsRequest = (
    DescribeAclsRequest
    | CreateAclsRequest
    | DeleteAclsRequest
    | DescribeUserScramCredentialsRequest
    | AlterUserScramCredentialsRequest
)


async def answer(
    access: Access, store: SecurityStore, message: RightsRequest, limits: RequestLimits
) -> ResponseMessage:
    """Answer one of the five requests, the store written before the answer."""
    match message:
        case DescribeAclsRequest():
            return await _describe_acls(store, message, limits)
        case CreateAclsRequest() | DeleteAclsRequest():
            rules = _rules(message.acls, limits)
            if rules is None:
                return error_response(message, ErrorCode.INVALID_REQUEST)
            if isinstance(message, CreateAclsRequest):
                access.wrote(await store.change_acls(rules, ()))
                return CreateAclsResponse(error_code=ErrorCode.NONE)
            deleted = sorted(set(rules) & await store.acls())
            access.wrote(await store.change_acls((), rules))
            return DeleteAclsResponse(
                error_code=ErrorCode.NONE, deleted=tuple(binding_of(acl) for acl in deleted)
            )
        case DescribeUserScramCredentialsRequest():
            return await _describe_users(store, message, limits)
        case AlterUserScramCredentialsRequest():
            return await _alter_users(store, message, limits)


def _rules(bindings: Sequence[AclBinding], limits: RequestLimits) -> list[Acl] | None:
    """The rules the bindings spell, or None if one spells none or breaks a bound."""
    if len(bindings) > MAX_ENTRIES:
        return None
    rules = []
    for binding in bindings:
        try:
            acl = acl_of(binding)
        except ValueError:
            return None
        if not _valid_principal(acl.principal, limits) or not _valid_name(acl, limits):
            return None
        rules.append(acl)
    return rules


def _valid_principal(principal: str, limits: RequestLimits) -> bool:
    """``*``, or ``User:`` and a name bounded as an id (a certificate's subject included)."""
    return principal == WILDCARD or valid_id(principal.removeprefix("User:"), limits)


def _valid_name(acl: Acl, limits: RequestLimits) -> bool:
    if acl.name == WILDCARD or acl.resource_type is ResourceType.CLUSTER:
        return True
    if acl.resource_type is ResourceType.TOPIC:
        return valid_topic_name(acl.name)
    return valid_id(acl.name, limits)


async def _describe_acls(
    store: SecurityStore, message: DescribeAclsRequest, limits: RequestLimits
) -> DescribeAclsResponse:
    asked = (message.principal, message.resource_type, message.name, message.operation)
    if any(value is not None and not valid_id(value, limits) for value in asked):
        return DescribeAclsResponse(error_code=ErrorCode.INVALID_REQUEST, acls=())
    found = []
    for acl in sorted(await store.acls()):
        binding = binding_of(acl)
        shown = (binding.principal, binding.resource_type, binding.name, binding.operation)
        if all(want is None or want == have for want, have in zip(asked, shown, strict=True)):
            found.append(binding)
    return DescribeAclsResponse(error_code=ErrorCode.NONE, acls=tuple(found))


async def _describe_users(
    store: SecurityStore, message: DescribeUserScramCredentialsRequest, limits: RequestLimits
) -> DescribeUserScramCredentialsResponse:
    asked = message.users
    if asked is not None and (
        len(asked) > MAX_ENTRIES or not all(valid_id(user, limits) for user in asked)
    ):
        return DescribeUserScramCredentialsResponse(error_code=ErrorCode.INVALID_REQUEST, users=())
    everyone = await store.users()
    names = sorted(everyone) if asked is None else list(dict.fromkeys(asked))
    described = []
    for user in names:
        infos = []
        for mechanism in everyone.get(user, ()):
            credential = await store.scram_credential(user, mechanism)
            if credential is not None:  # deleted meanwhile: not shown
                infos.append(
                    ScramCredentialInfo(mechanism=mechanism, iterations=credential.iterations)
                )
        if infos:
            described.append(UserScramCredentials(user=user, credentials=tuple(infos)))
    return DescribeUserScramCredentialsResponse(error_code=ErrorCode.NONE, users=tuple(described))


def _credential_error(upsertion: ScramUpsertion) -> ErrorCode:
    key_bytes = _KEY_BYTES.get(upsertion.mechanism)
    if (
        key_bytes is None
        or not MIN_ITERATIONS <= upsertion.iterations <= MAX_ITERATIONS
        or not 0 < len(upsertion.salt) <= MAX_SALT_BYTES
        or len(upsertion.stored_key) != key_bytes
        or len(upsertion.server_key) != key_bytes
    ):
        return ErrorCode.UNACCEPTABLE_CREDENTIAL
    return ErrorCode.NONE


async def _alter_users(
    store: SecurityStore, message: AlterUserScramCredentialsRequest, limits: RequestLimits
) -> AlterUserScramCredentialsResponse:
    """Each user's change is checked whole and written on its own: one user's refusal changes
    nothing of that user's and does not hold back the others'."""
    if len(message.deletions) + len(message.upsertions) > MAX_ENTRIES:
        return AlterUserScramCredentialsResponse(error_code=ErrorCode.INVALID_REQUEST, results=())
    errors: dict[str, ErrorCode] = {}

    def refuse(user: str, error: ErrorCode) -> None:
        if errors.get(user, ErrorCode.NONE) is ErrorCode.NONE:
            errors[user] = error

    deleted = set()
    for user in message.deletions:
        errors.setdefault(user, ErrorCode.NONE)
        if user in deleted or not valid_id(user, limits):
            refuse(user, ErrorCode.INVALID_REQUEST)
        deleted.add(user)
    upserted: set[tuple[str, str]] = set()
    for upsertion in message.upsertions:
        user = upsertion.user
        errors.setdefault(user, ErrorCode.NONE)
        if user in deleted or (user, upsertion.mechanism) in upserted or not valid_id(user, limits):
            refuse(user, ErrorCode.INVALID_REQUEST)
        upserted.add((user, upsertion.mechanism))
        refuse(user, _credential_error(upsertion))
    for user in message.deletions:
        if errors[user] is ErrorCode.NONE and not await store.delete_user(user):
            errors[user] = ErrorCode.RESOURCE_NOT_FOUND
    for upsertion in message.upsertions:
        if errors[upsertion.user] is ErrorCode.NONE:
            await store.set_scram_credential(
                upsertion.user,
                ScramCredential(
                    mechanism=upsertion.mechanism,
                    salt=upsertion.salt,
                    stored_key=upsertion.stored_key,
                    server_key=upsertion.server_key,
                    iterations=upsertion.iterations,
                ),
            )
    return AlterUserScramCredentialsResponse(
        error_code=ErrorCode.NONE,
        results=tuple(UserAlteration(user=u, error_code=error) for u, error in errors.items()),
    )
