"""Users and rules over the wire (broker/rights.py) through a real broker on in-memory streams:
what an administrator changes is in the store, a rule in force on the broker before the answer,
a credential never shown; every hostile entry refused with its code, changing nothing; and a
re-read of the rules begun before a write does not undo it (broker/authorization.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from broker.authorization import ACL_REFRESH, Access, open_access
from broker.rights import MAX_ENTRIES
from consumer.admin import scram_upsertion
from protocol import (
    AclBinding,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    CreateAclsRequest,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ErrorCode,
    FetchRequest,
    RequestMessage,
    ResponseMessage,
    ScramCredentialInfo,
    ScramUpsertion,
    UserAlteration,
    UserScramCredentials,
)
from statemachine.acl import Acl, Authorizer, Operation, ResourceType
from tests.coordinator.test_boundary import DEADLINE, Broker, open_broker
from transport.scram import make_credential
from transport.security import Peer

ADMIN = "User:admin"
ALICE = "User:alice"
READ_T = AclBinding(principal=ALICE, resource_type="topic", name="t", operation="read")


def _upsertion(
    user: str = "alice", mechanism: str = "SCRAM-SHA-256", **changed: Any
) -> ScramUpsertion:
    upsertion = scram_upsertion(user, make_credential(mechanism, "pw"))
    return attrs.evolve(upsertion, **changed)


def _access(broker: Broker) -> Access:
    return Access(
        current=Authorizer(enabled=True, super_users=frozenset({ADMIN})),
        store=broker.coordinator.store,
    )


async def _ask(
    broker: Broker, access: Access, principal: str, message: RequestMessage
) -> ResponseMessage:
    async with broker.member(_no_requests, peer=Peer(principal=principal), access=access) as c:
        with trio.fail_after(DEADLINE):
            return await c.request(message)


async def _no_requests(*_: object) -> None:
    raise AssertionError("a client got a request")


FETCH_T = FetchRequest(topic="t", partition=0, offset=0, max_bytes=1024)


async def test_an_administrator_changes_users_and_rules_that_apply_before_the_answer(
    tmp_path: Path,
) -> None:
    async with open_broker(tmp_path) as broker:
        access = _access(broker)
        store = broker.coordinator.store
        upsertions = (_upsertion(), _upsertion(mechanism="SCRAM-SHA-512"), _upsertion("bob"))
        altered = await _ask(
            broker,
            access,
            ADMIN,
            AlterUserScramCredentialsRequest(deletions=(), upsertions=upsertions),
        )
        assert altered == AlterUserScramCredentialsResponse(
            error_code=ErrorCode.NONE,
            results=(
                UserAlteration(user="alice", error_code=ErrorCode.NONE),
                UserAlteration(user="bob", error_code=ErrorCode.NONE),
            ),
        )
        stored = await store.scram_credential("alice", "SCRAM-SHA-512")
        assert stored is not None and stored.stored_key == upsertions[1].stored_key
        described = await _ask(
            broker, access, ADMIN, DescribeUserScramCredentialsRequest(users=("alice", "nobody"))
        )
        assert described == DescribeUserScramCredentialsResponse(
            error_code=ErrorCode.NONE,
            users=(
                UserScramCredentials(
                    user="alice",
                    credentials=tuple(
                        ScramCredentialInfo(mechanism=m, iterations=4096)
                        for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")
                    ),
                ),
            ),
        )
        deleted = await _ask(
            broker,
            access,
            ADMIN,
            AlterUserScramCredentialsRequest(deletions=("bob",), upsertions=()),
        )
        assert isinstance(deleted, AlterUserScramCredentialsResponse)
        assert deleted.results == (UserAlteration(user="bob", error_code=ErrorCode.NONE),)
        assert set(await store.users()) == {"alice"}

        refused = await _ask(broker, access, ALICE, FETCH_T)
        assert getattr(refused, "error_code", None) is ErrorCode.TOPIC_AUTHORIZATION_FAILED
        created = await _ask(broker, access, ADMIN, CreateAclsRequest(acls=(READ_T,)))
        assert getattr(created, "error_code", None) is ErrorCode.NONE
        # in force on this broker at once, no re-read needed
        fetched = await _ask(broker, access, ALICE, FETCH_T)
        assert getattr(fetched, "error_code", None) is not ErrorCode.TOPIC_AUTHORIZATION_FAILED
        rule = Acl(
            principal=ALICE, resource_type=ResourceType.TOPIC, name="t", operation=Operation.READ
        )
        assert await store.acls() == {rule}
        listed = await _ask(
            broker,
            access,
            ADMIN,
            DescribeAclsRequest(principal=ALICE, resource_type="topic", name=None, operation=None),
        )
        assert listed == DescribeAclsResponse(error_code=ErrorCode.NONE, acls=(READ_T,))
        other = await _ask(
            broker,
            access,
            ADMIN,
            DescribeAclsRequest(principal=None, resource_type="group", name=None, operation=None),
        )
        assert other == DescribeAclsResponse(error_code=ErrorCode.NONE, acls=())
        removed = await _ask(broker, access, ADMIN, DeleteAclsRequest(acls=(READ_T, READ_T)))
        assert removed == DeleteAclsResponse(error_code=ErrorCode.NONE, deleted=(READ_T,))
        refused = await _ask(broker, access, ALICE, FETCH_T)
        assert getattr(refused, "error_code", None) is ErrorCode.TOPIC_AUTHORIZATION_FAILED
        assert await store.acls() == frozenset()


def _binding(**changed: str) -> AclBinding:
    return attrs.evolve(READ_T, **changed)


HOSTILE_RULES = {
    "an unknown operation": (_binding(operation="own"),),
    "an unknown resource type": (_binding(resource_type="broker"),),
    "an operation the resource type lacks": (_binding(resource_type="group", operation="write"),),
    "a cluster not named cluster": (
        _binding(resource_type="cluster", name="t", operation="alter"),
    ),
    "a principal of another kind": (_binding(principal="Group:x"),),
    "a principal's name too long": (_binding(principal="User:" + "a" * 256),),
    "a control character in a principal": (_binding(principal="User:a\nb"),),
    "a topic name that is none": (_binding(name="a/b"),),
    "a group id too long": (_binding(resource_type="group", name="g" * 256),),
    "too many rules": (READ_T,) * (MAX_ENTRIES + 1),
}


@pytest.mark.parametrize("rules", HOSTILE_RULES.values(), ids=HOSTILE_RULES.keys())
async def test_a_hostile_rule_is_refused_and_nothing_changes(
    tmp_path: Path, rules: tuple[AclBinding, ...]
) -> None:
    async with open_broker(tmp_path) as broker:
        access = _access(broker)
        for request in (CreateAclsRequest(acls=(READ_T, *rules)), DeleteAclsRequest(acls=rules)):
            answer = await _ask(broker, access, ADMIN, request)
            assert getattr(answer, "error_code", None) is ErrorCode.INVALID_REQUEST
        assert await broker.coordinator.store.acls() == frozenset()
        assert access.current.acls == frozenset()


HOSTILE_CREDENTIALS = {
    "an unknown mechanism": (
        attrs.evolve(_upsertion(), mechanism="SCRAM-SHA-1"),
        ErrorCode.UNACCEPTABLE_CREDENTIAL,
    ),
    "too few iterations": (_upsertion(iterations=4095), ErrorCode.UNACCEPTABLE_CREDENTIAL),
    "too many iterations": (_upsertion(iterations=16385), ErrorCode.UNACCEPTABLE_CREDENTIAL),
    "no salt": (_upsertion(salt=b""), ErrorCode.UNACCEPTABLE_CREDENTIAL),
    "a salt too long": (_upsertion(salt=b"s" * 65), ErrorCode.UNACCEPTABLE_CREDENTIAL),
    "a stored key of another hash": (
        _upsertion(stored_key=b"k" * 64),
        ErrorCode.UNACCEPTABLE_CREDENTIAL,
    ),
    "a server key cut short": (_upsertion(server_key=b"k" * 31), ErrorCode.UNACCEPTABLE_CREDENTIAL),
    "a user name too long": (_upsertion(user="u" * 256), ErrorCode.INVALID_REQUEST),
    "a control character in a user name": (_upsertion(user="a\x00"), ErrorCode.INVALID_REQUEST),
}


@pytest.mark.parametrize(
    ("upsertion", "code"), HOSTILE_CREDENTIALS.values(), ids=HOSTILE_CREDENTIALS.keys()
)
async def test_a_hostile_credential_is_refused_for_its_user_alone(
    tmp_path: Path, upsertion: ScramUpsertion, code: ErrorCode
) -> None:
    async with open_broker(tmp_path) as broker:
        store = broker.coordinator.store
        # the user's other, sound credential is held back with it; another user's goes in
        sound = _upsertion(upsertion.user, "SCRAM-SHA-512")
        request = AlterUserScramCredentialsRequest(
            deletions=(), upsertions=(sound, upsertion, _upsertion("bob"))
        )
        answer = await _ask(broker, _access(broker), ADMIN, request)
        assert answer == AlterUserScramCredentialsResponse(
            error_code=ErrorCode.NONE,
            results=(
                UserAlteration(user=upsertion.user, error_code=code),
                UserAlteration(user="bob", error_code=ErrorCode.NONE),
            ),
        )
        assert set(await store.users()) == {"bob"}


async def test_deletions_and_counts_are_checked(tmp_path: Path) -> None:
    async with open_broker(tmp_path) as broker:
        access = _access(broker)
        store = broker.coordinator.store
        await store.set_scram_credential("carol", make_credential("SCRAM-SHA-256", "pw"))
        answer = await _ask(
            broker,
            access,
            ADMIN,
            AlterUserScramCredentialsRequest(
                deletions=("nobody", "carol", "dave"), upsertions=(_upsertion("dave"),)
            ),
        )
        assert isinstance(answer, AlterUserScramCredentialsResponse)
        assert answer.results == (
            UserAlteration(user="nobody", error_code=ErrorCode.RESOURCE_NOT_FOUND),
            UserAlteration(user="carol", error_code=ErrorCode.NONE),
            UserAlteration(user="dave", error_code=ErrorCode.INVALID_REQUEST),  # both
        )
        assert await store.users() == {}
        too_many = await _ask(
            broker,
            access,
            ADMIN,
            AlterUserScramCredentialsRequest(
                deletions=("x",) * MAX_ENTRIES, upsertions=(_upsertion(),)
            ),
        )
        assert too_many == AlterUserScramCredentialsResponse(
            error_code=ErrorCode.INVALID_REQUEST, results=()
        )
        for users in (("u",) * (MAX_ENTRIES + 1), ("u" * 256,)):
            described = await _ask(
                broker, access, ADMIN, DescribeUserScramCredentialsRequest(users=users)
            )
            assert getattr(described, "error_code", None) is ErrorCode.INVALID_REQUEST
        assert await store.users() == {}


@attrs.define
class _SlowRules:
    """A store whose every read of the rules takes a second, returning what it held when the
    read began."""

    acls_held: frozenset[Acl] = frozenset()

    async def acls(self) -> frozenset[Acl]:
        held = self.acls_held
        await trio.sleep(1.0)
        return held


async def test_a_reread_begun_before_a_write_does_not_undo_it(autojump_clock: object) -> None:
    rule = Acl(
        principal=ALICE, resource_type=ResourceType.TOPIC, name="t", operation=Operation.READ
    )
    store = _SlowRules()
    async with open_access(store, enabled=True, super_users=frozenset()) as access:  # type: ignore[arg-type]
        began = trio.current_time()
        await trio.sleep(ACL_REFRESH + 0.5)  # a re-read is under way, reading no rules
        store.acls_held = frozenset({rule})
        access.wrote(frozenset({rule}))
        await trio.sleep(1.0)  # it returned the rules the write replaced
        assert access.current.acls == {rule}
        store.acls_held = frozenset()  # removed elsewhere: the next re-read shows it
        await trio.sleep(ACL_REFRESH + 1.0)
        assert trio.current_time() - began == ACL_REFRESH * 2 + 2.5
        assert access.current.acls == frozenset()
