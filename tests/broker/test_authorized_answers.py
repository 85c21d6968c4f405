"""Every answer names only the topics and groups its principal may describe, for every api.

Through a real broker (store, logs, coordinator, the connection handler) on in-memory streams:
alice may read group ``shared-group`` and topic ``open-topic``, nothing else. The group also has
offsets on ``hidden-topic``, and a member (not alice's) subscribed to it by a pattern that takes
both topics; ``hidden-group`` has offsets too. Alice asks every api the ApiKey enum has, and no
answer (nor anything the broker sends her member) may name the hidden topic or group, or show
their offsets. An api added to the enum fails :func:`test_every_api_is_asked_or_exempt` until it
is asked here or exempted with its reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from broker.authorization import Access
from protocol import (
    COORDINATOR_REQUESTS,
    AclBinding,
    AlterUserScramCredentialsRequest,
    ApiKey,
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    ConfigEntry,
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
    LeaveGroupRequest,
    ListGroupsRequest,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PingRequest,
    PingResponse,
    ProduceRequest,
    Record,
    RegisterConsumerRequest,
    Request,
    RequestMessage,
    ResponseMessage,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
    TopicConfigs,
    error_response,
)
from protocol.types import PartitionOffset, Subscription, TopicPartition
from statemachine.acl import Acl, Authorizer, Operation, ResourceType
from tests.coordinator.test_boundary import DEADLINE, Broker, open_broker
from tests.protocol.protocol_testing import SAMPLE_REQUESTS
from transport.channel import Channel
from transport.security import Peer

ALICE = "User:alice"
GROUP = "shared-group"
TOPIC = "open-topic"
#: Every name alice may not see contains this (and every offset names its topic).
HIDDEN = "hidden"
HIDDEN_TOPIC = f"{HIDDEN}-topic"
HIDDEN_GROUP = f"{HIDDEN}-group"

RULES = Authorizer(
    enabled=True,
    acls=frozenset(
        Acl(principal=ALICE, resource_type=resource, name=name, operation=Operation.READ)
        for resource, name in ((ResourceType.GROUP, GROUP), (ResourceType.TOPIC, TOPIC))
    ),
)


def _register(group: str, consumer_id: str, subscription: Subscription) -> RegisterConsumerRequest:
    return RegisterConsumerRequest(
        group_id=group,
        consumer_id=consumer_id,
        subscription=subscription,
        auto_commit=False,
        auto_offset_reset="smallest",
        session_timeout_ms=30_000,
        generation=-1,
        owned_partitions=(),
    )


def _commit(group: str, *offsets: tuple[str, int]) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id=group,
        consumer_id=None,
        generation=-1,
        offsets=tuple(PartitionOffset(topic=t, partition=0, offset=o) for t, o in offsets),
    )


#: Each topic's own settings, which ClusterMetadata shows (v3) where it shows the topic.
SETTINGS = (ConfigEntry(name="segment.bytes", value="1048576"),)

WRITE_TOPIC = AclBinding(principal=ALICE, resource_type="topic", name=TOPIC, operation="write")

#: What alice asks of each api, none of it naming what she may not see.
ASKED: dict[ApiKey, RequestMessage] = {
    ApiKey.PRODUCE: ProduceRequest(topic=TOPIC, partition=0, records=()),
    ApiKey.FETCH: FetchRequest(topic=TOPIC, partition=0, offset=0, max_bytes=1 << 16),
    # version 1: a lookup by time (SPEC.md §8, 2), which finds the one record produced
    ApiKey.LIST_OFFSETS: ListOffsetsRequest(topic=TOPIC, partition=0, timestamp_ms=0),
    ApiKey.CLUSTER_METADATA: ClusterMetadataRequest(group_id=GROUP, topics=None),
    ApiKey.REGISTER_CONSUMER: _register(GROUP, "alice", Subscription(pattern=".*")),
    ApiKey.OFFSET_COMMIT: _commit(GROUP, (TOPIC, 3)),
    ApiKey.OFFSET_FETCH: OffsetFetchRequest(group_id=GROUP, partitions=None),
    ApiKey.CREATE_TOPIC: CreateTopicRequest(
        topic="new-topic", partitions=1, configs=(ConfigEntry(name="retention.ms", value="1"),)
    ),
    ApiKey.CREATE_PARTITIONS: CreatePartitionsRequest(topic=TOPIC, total_partitions=3),
    ApiKey.LIST_GROUPS: ListGroupsRequest(),
    ApiKey.DESCRIBE_GROUP: DescribeGroupRequest(group_id=GROUP),
    ApiKey.LEAVE_GROUP: LeaveGroupRequest(group_id=GROUP, consumer_id="nobody", generation=1),
    ApiKey.DELETE_GROUP: DeleteGroupRequest(group_id=GROUP),
    ApiKey.SASL_HANDSHAKE: SaslHandshakeRequest(mechanism="SCRAM-SHA-256"),
    ApiKey.SASL_AUTHENTICATE: SaslAuthenticateRequest(auth_bytes=b""),
    ApiKey.DELETE_TOPIC: DeleteTopicRequest(topic=TOPIC),
    ApiKey.DESCRIBE_ACLS: DescribeAclsRequest(
        principal=None, resource_type=None, name=None, operation=None
    ),
    ApiKey.CREATE_ACLS: CreateAclsRequest(acls=(WRITE_TOPIC,)),
    ApiKey.DELETE_ACLS: DeleteAclsRequest(acls=(WRITE_TOPIC,)),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: DescribeUserScramCredentialsRequest(users=None),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: AlterUserScramCredentialsRequest(
        deletions=("alice",), upsertions=()
    ),
    ApiKey.REPLICA_FETCH: SAMPLE_REQUESTS[ApiKey.REPLICA_FETCH],
}
#: Apis about users and rules, and a follower broker's REPLICA_FETCH, which only a principal that
#: may describe or alter the cluster may ask: alice is refused them, and told nothing else.
CLUSTER_APIS = frozenset(
    {
        ApiKey.DESCRIBE_ACLS,
        ApiKey.CREATE_ACLS,
        ApiKey.DELETE_ACLS,
        ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        ApiKey.REPLICA_FETCH,  # a follower broker's
    }
)
#: Apis alice cannot ask, with the reason; what they carry is checked all the same.
EXEMPT: dict[ApiKey, str] = {
    key: "the broker sends it to a member, and alice's member's are checked: its assignment "
    "comes from its subscription, narrowed at registration to the topics alice may read"
    for key in COORDINATOR_REQUESTS
}


def test_every_api_is_asked_or_exempt() -> None:
    assert not ASKED.keys() & EXEMPT.keys()
    assert set(ApiKey) == ASKED.keys() | EXEMPT.keys()
    assert all(message.API_KEY is key for key, message in ASKED.items())


def leaks(message: object) -> bool:
    """Whether ``message`` names a hidden topic or group."""
    return HIDDEN in repr(message)


def _member(
    received: list[RequestMessage], started: trio.Event
) -> Callable[[Channel, Request], Awaitable[None]]:
    """A member that holds what it is given and reports nothing; what it was sent in
    ``received``, ``started`` set at its first StartFetcher."""

    async def answer(channel: Channel, request: Request) -> None:
        message = request.message
        received.append(message)
        match message:
            case PingRequest(consumer_id=consumer_id):
                response: ResponseMessage = PingResponse(
                    error_code=ErrorCode.NONE, consumer_id=consumer_id, offsets=()
                )
            case StopFetcherRequest(consumer_id=consumer_id):
                response = StopFetcherResponse(
                    error_code=ErrorCode.NONE, consumer_id=consumer_id, offsets=()
                )
            case StartFetcherRequest(consumer_id=consumer_id):
                response = StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id=consumer_id)
                started.set()
            case _:
                raise AssertionError(request)
        await channel.respond(request, response)

    return answer


async def _set_up(broker: Broker) -> None:
    """The topics, the offsets, and records on both topics; as a client held to no rules."""
    for topic in (TOPIC, HIDDEN_TOPIC):
        created = await broker.request(
            CreateTopicRequest(topic=topic, partitions=2, configs=SETTINGS)
        )
        assert created.error_code is ErrorCode.NONE
        produced = await broker.request(
            ProduceRequest(
                topic=topic,
                partition=0,
                records=(Record(offset=-1, timestamp_ms=0, key=None, value=b"v"),),
            )
        )
        assert produced.error_code is ErrorCode.NONE
    for commit in (
        _commit(GROUP, (TOPIC, 1), (HIDDEN_TOPIC, 1)),
        _commit(HIDDEN_GROUP, (TOPIC, 1)),
    ):
        assert (await broker.request(commit)).error_code is ErrorCode.NONE


async def test_no_answer_names_what_alice_may_not_describe(tmp_path: Path) -> None:
    access = Access(current=RULES)
    alice = Peer(principal=ALICE)
    async with open_broker(tmp_path) as broker:
        await _set_up(broker)
        # Another principal's member of the group, holding partitions of both topics.
        other_started = trio.Event()
        other = broker.member(_member([], other_started), "other")
        async with other as channel:
            with trio.fail_after(DEADLINE):
                both = Subscription(pattern=f"({HIDDEN}|open)-topic")
                joined = await channel.request(_register(GROUP, "other", both))
                assert joined.error_code is ErrorCode.NONE
                await other_started.wait()
            answers: dict[ApiKey, ResponseMessage] = {}
            sent: list[RequestMessage] = []
            alice_started = trio.Event()
            async with broker.member(
                _member(sent, alice_started), "alice", peer=alice, access=access
            ) as member:
                with trio.fail_after(DEADLINE):
                    answers[ApiKey.REGISTER_CONSUMER] = await member.request(
                        ASKED[ApiKey.REGISTER_CONSUMER]
                    )
                    await alice_started.wait()
                for key, message in ASKED.items():
                    if key is ApiKey.REGISTER_CONSUMER:
                        continue
                    async with broker.member(
                        _member([], trio.Event()), peer=alice, access=access
                    ) as client:
                        with trio.fail_after(DEADLINE):
                            answers[key] = await client.request(message)

    assert answers[ApiKey.REGISTER_CONSUMER].error_code is ErrorCode.NONE
    assert {key: answers[key] for key in CLUSTER_APIS} == {
        key: error_response(ASKED[key], ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        for key in CLUSTER_APIS
    }
    assert [key.name for key, answer in answers.items() if leaks(answer)] == []
    assert [message for message in sent if leaks(message)] == []
    # She was answered, not refused: what she may see is there.
    metadata = answers[ApiKey.CLUSTER_METADATA]
    assert isinstance(metadata, ClusterMetadataResponse)
    assert metadata.topic_configs == (TopicConfigs(topic=TOPIC, configs=SETTINGS),)
    assert answers[ApiKey.CREATE_TOPIC].error_code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    fetched = answers[ApiKey.OFFSET_FETCH]
    assert isinstance(fetched, OffsetFetchResponse)
    assert fetched.offsets == (PartitionOffset(topic=TOPIC, partition=0, offset=1),)
    described = answers[ApiKey.DESCRIBE_GROUP]
    assert isinstance(described, DescribeGroupResponse)
    assert described.offsets == fetched.offsets
    listed = answers[ApiKey.LIST_OFFSETS]
    assert isinstance(listed, ListOffsetsResponse)
    assert (listed.error_code, listed.high_watermark, listed.offset) == (ErrorCode.NONE, 1, 0)
    # Both members' patterns, as the topics alice may see that they take.
    assert [m.subscription.pattern for m in described.members] == [r"open\-topic"] * 2
    assigned = [
        p.topic
        for m in sent
        if isinstance(m, StartFetcherRequest)
        for s in m.streams
        for p in s.partitions
    ]
    assert set(assigned) == {TOPIC}


async def test_an_offset_asked_for_by_name_is_not_shown(tmp_path: Path) -> None:
    """Asked for by name, a hidden topic's offset is answered as if the group had none."""
    partitions = (
        TopicPartition(topic=HIDDEN_TOPIC, partition=0),
        TopicPartition(topic=TOPIC, partition=0),
    )
    async with open_broker(tmp_path) as broker:
        await _set_up(broker)
        async with broker.member(
            _member([], trio.Event()), peer=Peer(principal=ALICE), access=Access(current=RULES)
        ) as client:
            with trio.fail_after(DEADLINE):
                answer = await client.request(
                    OffsetFetchRequest(group_id=GROUP, partitions=partitions)
                )
    assert isinstance(answer, OffsetFetchResponse)
    assert answer.offsets == (
        PartitionOffset(topic=HIDDEN_TOPIC, partition=0, offset=-1),
        PartitionOffset(topic=TOPIC, partition=0, offset=1),
    )
