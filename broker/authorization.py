"""Every request a broker answers, checked against the access rules in force
(statemachine/acl.py) for the principal its connection authenticated as (transport/security.py),
before anything else looks at it; Kafka's mapping of requests to operations and error codes.

A denied request is answered with Kafka's code for the resource it names (29 topic, 30 group,
31 cluster) and nothing else. Reading the users and the rules needs DESCRIBE on the cluster,
changing them ALTER on the cluster (which implies DESCRIBE), as in Kafka. A follower broker's
REPLICA_FETCH is answered to super users alone, as which brokers authenticate to each other
(docs/security.md): no rule grants it (Kafka's ClusterAction, which these rules do not have),
since the offsets a follower reports move the high watermark. Every answer names
only topics and groups the principal may describe: ClusterMetadata the topics, ListGroups the
groups, OffsetFetch and DescribeGroup of a group it may describe the topics (their offsets, and
its members' subscriptions and partitions).
A subscription pattern matches only topics the principal may read: the member's pattern is
narrowed, when it registers, to the readable topic names it matches, so rules added later apply
to it from its next registration on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TypeVar

import attrs
import trio

from broker.pace import ANSWER_CHUNK, Pace
from protocol import (
    AlterUserScramCredentialsRequest,
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
    ListGroupsResponse,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    ProduceRequest,
    RegisterConsumerRequest,
    ReplicaFetchRequest,
    RequestMessage,
    ResponseMessage,
    TopicConfigs,
    TopicIdentity,
    TopicMetadata,
    TopicReplicas,
    error_response,
)
from protocol.types import PartitionOffset, Subscription, TopicPartition
from statemachine.acl import CLUSTER, Acl, Authorizer, Operation, ResourceType
from store import SecurityStore, StoreUnavailable

__all__ = ["ACL_REFRESH", "Access", "narrowed", "open_access", "refusal", "visible"]

log = logging.getLogger(__name__)

#: How often a broker reads the rules again: a rule another broker added or removed applies here
#: within this long and one read of the store.
ACL_REFRESH = 2.0

_TOPIC = ErrorCode.TOPIC_AUTHORIZATION_FAILED
_GROUP = ErrorCode.GROUP_AUTHORIZATION_FAILED
_CLUSTER = ErrorCode.CLUSTER_AUTHORIZATION_FAILED

_T = TypeVar("_T")
#: What names one topic: an entry of an answer left out where the topic is not to be shown.
_Named = TypeVar(
    "_Named", PartitionOffset, TopicPartition, TopicIdentity, TopicConfigs, TopicReplicas
)


@attrs.define(eq=False)
class Access:
    """The rules in force on this broker, read again every :data:`ACL_REFRESH`, and where they
    are kept (None: nowhere, for tests of other things)."""

    current: Authorizer
    store: SecurityStore | None = None
    #: Changes this broker wrote, counted: a re-read begun before one may return the rules it
    #: replaced, and is then dropped instead of undoing the change until the next re-read.
    writes: int = 0

    def wrote(self, acls: frozenset[Acl]) -> None:
        """Put ``acls``, what this broker's own write left in force, in force at once."""
        self.writes += 1
        self.current = attrs.evolve(self.current, acls=acls)


@asynccontextmanager
async def open_access(
    store: SecurityStore, *, enabled: bool, super_users: frozenset[str]
) -> AsyncIterator[Access]:
    """The broker's access rules for the block's span: none enforced unless ``enabled``. A
    change another broker writes applies here within :data:`ACL_REFRESH` and one read of the
    store; one this broker writes, before it answers (broker/rights.py)."""
    access = Access(current=Authorizer(enabled=enabled, super_users=super_users), store=store)
    if not enabled:
        yield access
        return
    access.current = attrs.evolve(access.current, acls=await store.acls())
    async with trio.open_nursery() as nursery:

        async def refresh() -> None:
            while True:
                await trio.sleep(ACL_REFRESH)
                writes = access.writes
                try:
                    acls = await store.acls()
                except StoreUnavailable as exc:  # the rules read last stay in force
                    log.warning("cannot read the access rules again: %s", exc)
                    continue
                if access.writes == writes:
                    access.current = attrs.evolve(access.current, acls=acls)

        nursery.start_soon(refresh)
        try:
            yield access
        finally:
            nursery.cancel_scope.cancel()


def refusal(
    authorizer: Authorizer, principal: str, message: RequestMessage
) -> ResponseMessage | None:
    """The answer to a request the principal may not make; None if it may."""
    if not authorizer.enabled or principal in authorizer.super_users:
        return None

    def may(operation: Operation, resource: ResourceType, name: str) -> bool:
        return authorizer.allows(principal, operation, resource, name)

    error: ErrorCode | None = None
    match message:
        case ProduceRequest(topic=topic):
            error = None if may(Operation.WRITE, ResourceType.TOPIC, topic) else _TOPIC
        case FetchRequest(topic=topic):
            error = None if may(Operation.READ, ResourceType.TOPIC, topic) else _TOPIC
        case ListOffsetsRequest(topic=topic):
            error = None if may(Operation.DESCRIBE, ResourceType.TOPIC, topic) else _TOPIC
        case RegisterConsumerRequest(group_id=group, subscription=subscription):
            if not may(Operation.READ, ResourceType.GROUP, group):
                error = _GROUP
            elif not all(
                may(Operation.READ, ResourceType.TOPIC, entry.topic)
                for entry in subscription.topics
            ):
                error = _TOPIC
        case OffsetCommitRequest(group_id=group, offsets=offsets):
            if not may(Operation.READ, ResourceType.GROUP, group):
                error = _GROUP
            elif not all(
                may(Operation.READ, ResourceType.TOPIC, topic)
                for topic in {o.topic for o in offsets}
            ):
                error = _TOPIC
        case OffsetFetchRequest(group_id=group) | DescribeGroupRequest(group_id=group):
            error = None if may(Operation.DESCRIBE, ResourceType.GROUP, group) else _GROUP
        case LeaveGroupRequest(group_id=group):
            error = None if may(Operation.READ, ResourceType.GROUP, group) else _GROUP
        case DeleteGroupRequest(group_id=group):
            error = None if may(Operation.DELETE, ResourceType.GROUP, group) else _GROUP
        case CreateTopicRequest(topic=topic):
            allowed = may(Operation.CREATE, ResourceType.CLUSTER, CLUSTER) or may(
                Operation.CREATE, ResourceType.TOPIC, topic
            )
            error = None if allowed else _CLUSTER
        case CreatePartitionsRequest(topic=topic):
            error = None if may(Operation.ALTER, ResourceType.TOPIC, topic) else _TOPIC
        case DeleteTopicRequest(topic=topic):
            error = None if may(Operation.DELETE, ResourceType.TOPIC, topic) else _TOPIC
        case DescribeAclsRequest() | DescribeUserScramCredentialsRequest():
            error = None if may(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER) else _CLUSTER
        case CreateAclsRequest() | DeleteAclsRequest() | AlterUserScramCredentialsRequest():
            error = None if may(Operation.ALTER, ResourceType.CLUSTER, CLUSTER) else _CLUSTER
        case ReplicaFetchRequest():
            # Brokers only, which are super users: a follower reads every record of what it
            # follows whatever the topic's rules, and what it says it has moves the high
            # watermark, so no rule grants it (Kafka's ClusterAction, which rules here lack).
            error = _CLUSTER
    return None if error is None else error_response(message, error)


async def visible(
    authorizer: Authorizer,
    principal: str,
    request: RequestMessage,
    response: ResponseMessage,
) -> ResponseMessage:
    """``response`` with what the principal may not describe left out: in ClusterMetadata, a
    topic it asked for by name is answered TOPIC_AUTHORIZATION_FAILED and one it did not ask for
    is not shown; in OffsetFetch, a partition it asked for by name is answered -1 (no committed
    offset, as for any partition the group never committed) and one it did not ask for is not
    shown; in DescribeGroup, such topics' offsets, subscriptions and partitions are not shown; in
    ListGroups, such groups are not shown. A chunk at a time (broker/pace.py): an answer may
    name 100,000 partitions, or 10,000 members each with a pattern to narrow."""
    if not authorizer.enabled or principal in authorizer.super_users:
        return response
    decided: dict[tuple[ResourceType, str], bool] = {}

    def may(resource: ResourceType, name: str) -> bool:
        # An answer names one topic for each of its partitions: each name is decided once.
        key = (resource, name)
        allowed = decided.get(key)
        if allowed is None:
            allowed = decided[key] = authorizer.allows(
                principal, Operation.DESCRIBE, resource, name
            )
        return allowed

    pace = Pace()

    async def kept(listed: tuple[_T, ...], shown: Callable[[_T], _T | None]) -> tuple[_T, ...]:
        """What ``shown`` makes of each entry, those it leaves out (None) left out."""
        out: list[_T] = []
        for start in range(0, len(listed), ANSWER_CHUNK):
            chunk = listed[start : start + ANSWER_CHUNK]
            out.extend(entry for entry in map(shown, chunk) if entry is not None)
            await pace.did(len(chunk))
        return tuple(out)

    def topic_named(entry: _Named) -> _Named | None:
        return entry if may(ResourceType.TOPIC, entry.topic) else None

    match response:
        case ClusterMetadataResponse():
            named = isinstance(request, ClusterMetadataRequest) and request.topics is not None

            def described(topic: TopicMetadata) -> TopicMetadata | None:
                if may(ResourceType.TOPIC, topic.topic):
                    return topic
                return (
                    TopicMetadata(topic=topic.topic, error_code=_TOPIC, partitions=())
                    if named
                    else None
                )

            return attrs.evolve(
                response,
                topics=await kept(response.topics, described),
                topic_ids=await kept(response.topic_ids, topic_named),
                topic_configs=await kept(response.topic_configs, topic_named),
                replicas=await kept(response.replicas, topic_named),
            )
        case ListGroupsResponse():

            def group_named(group: GroupSummary) -> GroupSummary | None:
                return group if may(ResourceType.GROUP, group.group_id) else None

            return attrs.evolve(response, groups=await kept(response.groups, group_named))
        case OffsetFetchResponse():
            if isinstance(request, OffsetFetchRequest) and request.partitions is not None:

                def answered(offset: PartitionOffset) -> PartitionOffset:
                    return (
                        offset
                        if may(ResourceType.TOPIC, offset.topic)
                        else attrs.evolve(offset, offset=-1)
                    )

                return attrs.evolve(response, offsets=await kept(response.offsets, answered))
            return attrs.evolve(response, offsets=await kept(response.offsets, topic_named))
        case DescribeGroupResponse():
            every = authorizer.every_topic(principal, Operation.DESCRIBE)
            names = sorted(authorizer.topics_by_name(principal, Operation.DESCRIBE))
            # A group's members mostly share one subscription: each is narrowed once.
            subscriptions: dict[Subscription, Subscription] = {}
            members = []
            for member in response.members:
                subscription = subscriptions.get(member.subscription)
                if subscription is None:
                    subscription = subscriptions[member.subscription] = attrs.evolve(
                        member.subscription
                        if every or member.subscription.pattern is None
                        else _taking(member.subscription, names),
                        topics=tuple(
                            entry
                            for entry in member.subscription.topics
                            if may(ResourceType.TOPIC, entry.topic)
                        ),
                    )
                    await pace.did(len(names) + len(member.subscription.topics))
                partitions = await kept(member.partitions, topic_named)
                members.append(
                    attrs.evolve(member, subscription=subscription, partitions=partitions)
                )
                await pace.did(1)
            return attrs.evolve(
                response,
                members=tuple(members),
                offsets=await kept(response.offsets, topic_named),
                reported_offsets=await kept(response.reported_offsets, topic_named),
            )
    return response


def narrowed(authorizer: Authorizer, principal: str, subscription: Subscription) -> Subscription:
    """A wildcard subscription that matches only topics the principal may read: the readable
    topic names its pattern takes, as a pattern of their own. Unchanged if the principal may
    read every topic, or the subscription names its topics."""
    if subscription.pattern is None or authorizer.every_topic(principal, Operation.READ):
        return subscription
    return _taking(subscription, sorted(authorizer.topics_by_name(principal, Operation.READ)))


def _taking(subscription: Subscription, names: Iterable[str]) -> Subscription:
    """``subscription`` with its pattern replaced by those of ``names`` it takes."""
    taken = [name for name in names if subscription.streams_for(name) > 0]
    # An empty pattern matches no topic: a topic's name is never empty.
    return attrs.evolve(
        subscription,
        pattern="|".join(re.escape(name) for name in taken),
        pattern_is_blacklist=False,
    )
