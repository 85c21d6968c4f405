"""The access rules as pure decisions (statemachine/acl.py) and the broker's mapping of each
request to them (broker/authorization.py)."""

from __future__ import annotations

import pytest

from broker.authorization import narrowed, refusal, visible
from broker.pace import ANSWER_CHUNK
from protocol import (
    AlterUserScramCredentialsRequest,
    ApiKey,
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    CreateAclsRequest,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteAclsRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeAclsRequest,
    DescribeGroupRequest,
    DescribeGroupResponse,
    DescribeUserScramCredentialsRequest,
    ErrorCode,
    FetchRequest,
    GroupSummary,
    LeaveGroupRequest,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    MemberDescription,
    OffsetCommitRequest,
    OffsetFetchRequest,
    ProduceRequest,
    RegisterConsumerRequest,
    RequestMessage,
    TopicMetadata,
    TopicReplicas,
    error_response,
)
from protocol.types import PartitionOffset, Subscription, TopicPartition, TopicStreams
from statemachine.acl import Acl, Authorizer, Operation, ResourceType
from tests.protocol.protocol_testing import SAMPLE_REQUESTS
from tests.support.turns import turns_during

ALICE = "User:alice"
TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED


def rule(operation: Operation, resource: ResourceType, name: str, who: str = ALICE) -> Acl:
    return Acl(principal=who, resource_type=resource, name=name, operation=operation)


#: Alice may read topic t and group g, nothing else.
READER = Authorizer(
    enabled=True,
    acls=frozenset(
        {
            rule(Operation.READ, ResourceType.TOPIC, "t"),
            rule(Operation.READ, ResourceType.GROUP, "g"),
        }
    ),
    super_users=frozenset({"User:admin"}),
)


def _register(group: str, subscription: Subscription) -> RegisterConsumerRequest:
    return RegisterConsumerRequest(
        group_id=group,
        consumer_id="c",
        subscription=subscription,
        auto_commit=True,
        auto_offset_reset="smallest",
        session_timeout_ms=6000,
        generation=-1,
        owned_partitions=(),
    )


def _commit(group: str, topic: str) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id=group,
        consumer_id=None,
        generation=-1,
        offsets=(PartitionOffset(topic=topic, partition=0, offset=1),),
    )


T = Subscription(topics=(TopicStreams(topic="t", streams=1),))
U = Subscription(topics=(TopicStreams(topic="u", streams=1),))

CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
#: Reading the users and the rules: DESCRIBE on the cluster.
RIGHTS_DESCRIBED: list[RequestMessage] = [
    DescribeAclsRequest(principal=None, resource_type=None, name=None, operation=None),
    DescribeUserScramCredentialsRequest(users=None),
]
#: Changing them: ALTER on the cluster.
RIGHTS_ALTERED: list[RequestMessage] = [
    CreateAclsRequest(acls=()),
    DeleteAclsRequest(acls=()),
    AlterUserScramCredentialsRequest(deletions=("bob",), upsertions=()),
]

#: A follower broker's fetch (SPEC.md §8, 1000).
REPLICA_FETCH = SAMPLE_REQUESTS[ApiKey.REPLICA_FETCH]

ALLOWED: list[RequestMessage] = [
    FetchRequest(topic="t", partition=0, offset=0, max_bytes=1024),
    ListOffsetsRequest(topic="t", partition=0),  # read implies describe
    ListOffsetsRequest(topic="t", partition=0, timestamp_ms=0),  # by time, alike
    _register("g", T),
    _commit("g", "t"),
    OffsetFetchRequest(group_id="g", partitions=None),
    DescribeGroupRequest(group_id="g"),
    LeaveGroupRequest(group_id="g", consumer_id="c", generation=1),
    ClusterMetadataRequest(group_id="g", topics=None),
    ListGroupsRequest(),
]
DENIED: list[tuple[RequestMessage, ErrorCode]] = [
    (ProduceRequest(topic="t", partition=0, records=()), TOPIC_DENIED),
    (FetchRequest(topic="u", partition=0, offset=0, max_bytes=1), TOPIC_DENIED),
    (ListOffsetsRequest(topic="u", partition=0, timestamp_ms=0), TOPIC_DENIED),
    (_register("h", T), GROUP_DENIED),
    (_register("g", U), TOPIC_DENIED),
    (_commit("h", "t"), GROUP_DENIED),
    (_commit("g", "u"), TOPIC_DENIED),
    (DeleteGroupRequest(group_id="g"), GROUP_DENIED),
    (DescribeGroupRequest(group_id="h"), GROUP_DENIED),
    (CreateTopicRequest(topic="x", partitions=1), ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
    (CreatePartitionsRequest(topic="t", total_partitions=2), TOPIC_DENIED),
    (DeleteTopicRequest(topic="t"), TOPIC_DENIED),  # reading a topic does not delete it
    *((message, CLUSTER_DENIED) for message in RIGHTS_DESCRIBED),
    *((message, CLUSTER_DENIED) for message in RIGHTS_ALTERED),
    (REPLICA_FETCH, CLUSTER_DENIED),
]


@pytest.mark.parametrize("message", ALLOWED, ids=lambda m: type(m).__name__)
def test_a_reader_of_t_in_g_may_consume_it(message: RequestMessage) -> None:
    assert refusal(READER, ALICE, message) is None


@pytest.mark.parametrize(("message", "code"), DENIED, ids=lambda m: type(m).__name__)
def test_everything_else_is_denied_with_kafkas_code(
    message: RequestMessage, code: ErrorCode
) -> None:
    refused = refusal(READER, ALICE, message)
    assert refused is not None and getattr(refused, "error_code", None) is code
    assert refusal(READER, "User:admin", message) is None  # a super user may
    assert refusal(Authorizer(), "User:ANONYMOUS", message) is None  # authorization off


def test_wildcards_for_principal_and_name() -> None:
    everyone = Authorizer(
        enabled=True, acls=frozenset({rule(Operation.WRITE, ResourceType.TOPIC, "*", who="*")})
    )
    assert (
        refusal(everyone, "User:ANONYMOUS", ProduceRequest(topic="any", partition=0, records=()))
        is None
    )
    assert (
        refusal(everyone, ALICE, FetchRequest(topic="any", partition=0, offset=0, max_bytes=1))
        is not None
    )
    creator = Authorizer(
        enabled=True, acls=frozenset({rule(Operation.CREATE, ResourceType.CLUSTER, "cluster")})
    )
    assert refusal(creator, ALICE, CreateTopicRequest(topic="x", partitions=1)) is None
    deleter = Authorizer(
        enabled=True, acls=frozenset({rule(Operation.DELETE, ResourceType.TOPIC, "*")})
    )
    assert refusal(deleter, ALICE, DeleteTopicRequest(topic="any")) is None
    assert refusal(creator, ALICE, DeleteTopicRequest(topic="x")) is not None
    with pytest.raises(ValueError, match="not an operation on a group"):
        rule(Operation.WRITE, ResourceType.GROUP, "g")
    with pytest.raises(ValueError, match="bad principal"):
        rule(Operation.READ, ResourceType.TOPIC, "t", who="alice")


async def test_lists_show_only_what_the_principal_may_describe() -> None:
    metadata = ClusterMetadataResponse(
        error_code=ErrorCode.NONE,
        coordinator_id=1,
        coordinator_epoch=1,
        brokers=(),
        topics=tuple(
            TopicMetadata(topic=name, error_code=ErrorCode.NONE, partitions=())
            for name in ("secret", "t")
        ),
        replicas=tuple(TopicReplicas(topic=name, partitions=()) for name in ("secret", "t")),
    )
    every = await visible(
        READER, ALICE, ClusterMetadataRequest(group_id=None, topics=None), metadata
    )
    assert isinstance(every, ClusterMetadataResponse)
    assert [t.topic for t in every.topics] == ["t"]
    assert [t.topic for t in every.replicas] == ["t"]
    named = await visible(
        READER, ALICE, ClusterMetadataRequest(group_id=None, topics=("secret", "t")), metadata
    )
    assert isinstance(named, ClusterMetadataResponse)
    assert [(t.topic, t.error_code) for t in named.topics] == [
        ("secret", TOPIC_DENIED),
        ("t", ErrorCode.NONE),
    ]
    groups = ListGroupsResponse(
        error_code=ErrorCode.NONE,
        groups=(
            GroupSummary(group_id="g", state="Stable"),
            GroupSummary(group_id="h", state="Stable"),
        ),
    )
    listed = await visible(READER, ALICE, ListGroupsRequest(), groups)
    assert isinstance(listed, ListGroupsResponse)
    assert [g.group_id for g in listed.groups] == ["g"]


def test_a_pattern_matches_only_readable_topics() -> None:
    readers = Authorizer(
        enabled=True,
        acls=frozenset(
            rule(Operation.READ, ResourceType.TOPIC, name)
            for name in ("clicks", "clicks.eu", "views")
        ),
    )
    pattern = narrowed(readers, ALICE, Subscription(pattern=r"clicks.*"))
    assert [
        n for n in ("clicks", "clicks.eu", "clicks-secret", "views") if pattern.streams_for(n)
    ] == [
        "clicks",
        "clicks.eu",
    ]
    blacklist = narrowed(readers, ALICE, Subscription(pattern="views", pattern_is_blacklist=True))
    assert [n for n in ("clicks", "clicks.eu", "secret", "views") if blacklist.streams_for(n)] == [
        "clicks",
        "clicks.eu",
    ]
    nothing = narrowed(READER, "User:bob", Subscription(pattern=".*"))
    assert not nothing.streams_for("t")
    everything = Authorizer(
        enabled=True, acls=frozenset({rule(Operation.READ, ResourceType.TOPIC, "*")})
    )
    unchanged = Subscription(pattern=".*")
    assert narrowed(everything, ALICE, unchanged) is unchanged


async def test_a_large_answer_is_filtered_a_chunk_at_a_time() -> None:
    """A group of 5,000 members with offsets on 20,000 partitions: others run between chunks,
    and each member's pattern is narrowed as alice sees it."""
    pattern = Subscription(pattern="t|u")
    response = DescribeGroupResponse(
        error_code=ErrorCode.NONE,
        group_id="g",
        state="Stable",
        generation=1,
        members=tuple(
            MemberDescription(
                member_id=f"m{i}",
                client_id="c",
                session_timeout_ms=6000,
                subscription=pattern,
                partitions=(TopicPartition(topic="u", partition=i),),
            )
            for i in range(5000)
        ),
        offsets=tuple(
            PartitionOffset(topic=topic, partition=p, offset=1)
            for topic in ("t", "u")
            for p in range(10_000)
        ),
    )
    shown, turns = await turns_during(
        visible(READER, ALICE, DescribeGroupRequest(group_id="g"), response)
    )
    assert isinstance(shown, DescribeGroupResponse)
    assert turns >= (5000 + 20_000) // (2 * ANSWER_CHUNK)
    assert {m.subscription.pattern for m in shown.members} == {"t"}
    assert not any(m.partitions for m in shown.members)
    assert {o.topic for o in shown.offsets} == {"t"} and len(shown.offsets) == 10_000


@pytest.mark.parametrize(
    ("operation", "allowed"),
    [
        (Operation.DESCRIBE, RIGHTS_DESCRIBED),
        (Operation.ALTER, RIGHTS_DESCRIBED + RIGHTS_ALTERED),  # alter implies describe
        (Operation.ALL, RIGHTS_DESCRIBED + RIGHTS_ALTERED),
        (Operation.CREATE, []),
    ],
    ids=lambda v: v.value if isinstance(v, Operation) else "",
)
def test_users_and_rules_are_read_with_describe_and_changed_with_alter_on_the_cluster(
    operation: Operation, allowed: list[RequestMessage]
) -> None:
    rules = Authorizer(
        enabled=True, acls=frozenset({rule(operation, ResourceType.CLUSTER, "cluster")})
    )
    for message in RIGHTS_DESCRIBED + RIGHTS_ALTERED:
        refused = refusal(rules, ALICE, message)
        if message in allowed:
            assert refused is None, message
        else:
            assert refused is not None and getattr(refused, "error_code", None) is CLUSTER_DENIED
    topic_admin = Authorizer(
        enabled=True, acls=frozenset({rule(Operation.ALL, ResourceType.TOPIC, "*")})
    )
    assert all(refusal(topic_admin, ALICE, m) is not None for m in RIGHTS_ALTERED)


@pytest.mark.parametrize(
    ("resource", "operation"),
    [
        (ResourceType.CLUSTER, Operation.ALTER),
        (ResourceType.CLUSTER, Operation.ALL),
        (ResourceType.TOPIC, Operation.ALL),  # every right on every topic is not a broker's
    ],
)
def test_no_rule_lets_a_principal_fetch_as_a_replica(
    resource: ResourceType, operation: Operation
) -> None:
    name = "cluster" if resource is ResourceType.CLUSTER else "*"
    rules = Authorizer(enabled=True, acls=frozenset({rule(operation, resource, name)}))
    assert refusal(rules, ALICE, REPLICA_FETCH) == error_response(REPLICA_FETCH, CLUSTER_DENIED)


def test_a_super_user_fetches_as_a_replica() -> None:
    # the brokers' own principals are super users (docs/security.md)
    brokers = Authorizer(enabled=True, super_users=frozenset({"User:broker"}))
    assert refusal(brokers, "User:broker", REPLICA_FETCH) is None
    assert refusal(brokers, ALICE, REPLICA_FETCH) == error_response(REPLICA_FETCH, CLUSTER_DENIED)
