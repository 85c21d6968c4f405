"""Every request a broker answers, checked against the access rules in force
(statemachine/acl.py) for the principal its connection authenticated as (transport/security.py),
before anything else looks at it; Kafka's mapping of requests to operations and error codes.

A denied request is answered with Kafka's code for the resource it names (29 topic, 30 group,
31 cluster) and nothing else. Every answer names only topics and groups the principal may
describe: ClusterMetadata the topics, ListGroups the groups, OffsetFetch and DescribeGroup of a
group it may describe the topics (their offsets, and its members' subscriptions and partitions).
A subscription pattern matches only topics the principal may read: the member's pattern is
narrowed, when it registers, to the readable topic names it matches, so rules added later apply
to it from its next registration on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import trio

from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeGroupRequest,
    DescribeGroupResponse,
    ErrorCode,
    FetchRequest,
    LeaveGroupRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    ProduceRequest,
    RegisterConsumerRequest,
    RequestMessage,
    ResponseMessage,
    TopicMetadata,
    error_response,
)
from protocol.types import PartitionOffset, Subscription
from statemachine.acl import CLUSTER, Authorizer, Operation, ResourceType
from store import MetadataStore, StoreUnavailable

__all__ = ["ACL_REFRESH", "Access", "narrowed", "open_access", "refusal", "visible"]

log = logging.getLogger(__name__)

#: How often a broker reads the rules again: a rule added or removed applies within this long.
ACL_REFRESH = 2.0

_TOPIC = ErrorCode.TOPIC_AUTHORIZATION_FAILED
_GROUP = ErrorCode.GROUP_AUTHORIZATION_FAILED
_CLUSTER = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


@attrs.define(eq=False)
class Access:
    """The rules in force on this broker, read again every :data:`ACL_REFRESH`."""

    current: Authorizer


@asynccontextmanager
async def open_access(
    store: MetadataStore, *, enabled: bool, super_users: frozenset[str]
) -> AsyncIterator[Access]:
    """The broker's access rules for the block's span: none enforced unless ``enabled``."""
    access = Access(current=Authorizer(enabled=enabled, super_users=super_users))
    if not enabled:
        yield access
        return
    access.current = attrs.evolve(access.current, acls=await store.acls())
    async with trio.open_nursery() as nursery:

        async def refresh() -> None:
            while True:
                await trio.sleep(ACL_REFRESH)
                try:
                    acls = await store.acls()
                except StoreUnavailable as exc:  # the rules read last stay in force
                    log.warning("cannot read the access rules again: %s", exc)
                    continue
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
    return None if error is None else error_response(message, error)


def visible(
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
    ListGroups, such groups are not shown."""
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

    def offsets(listed: tuple[PartitionOffset, ...]) -> tuple[PartitionOffset, ...]:
        return tuple(o for o in listed if may(ResourceType.TOPIC, o.topic))

    match response:
        case ClusterMetadataResponse():
            named = isinstance(request, ClusterMetadataRequest) and request.topics is not None
            topics = tuple(
                topic
                if may(ResourceType.TOPIC, topic.topic)
                else TopicMetadata(topic=topic.topic, error_code=_TOPIC, partitions=())
                for topic in response.topics
                if named or may(ResourceType.TOPIC, topic.topic)
            )
            return attrs.evolve(response, topics=topics)
        case ListGroupsResponse():
            groups = tuple(g for g in response.groups if may(ResourceType.GROUP, g.group_id))
            return attrs.evolve(response, groups=groups)
        case OffsetFetchResponse():
            if isinstance(request, OffsetFetchRequest) and request.partitions is not None:
                return attrs.evolve(
                    response,
                    offsets=tuple(
                        o if may(ResourceType.TOPIC, o.topic) else attrs.evolve(o, offset=-1)
                        for o in response.offsets
                    ),
                )
            return attrs.evolve(response, offsets=offsets(response.offsets))
        case DescribeGroupResponse():
            members = tuple(
                attrs.evolve(
                    member,
                    subscription=_described(authorizer, principal, member.subscription, may),
                    partitions=tuple(
                        tp for tp in member.partitions if may(ResourceType.TOPIC, tp.topic)
                    ),
                )
                for member in response.members
            )
            return attrs.evolve(
                response,
                members=members,
                offsets=offsets(response.offsets),
                reported_offsets=offsets(response.reported_offsets),
            )
    return response


def _described(
    authorizer: Authorizer,
    principal: str,
    subscription: Subscription,
    may: Callable[[ResourceType, str], bool],
) -> Subscription:
    """A member's subscription as a principal that may describe only some topics sees it: the
    topics it names that the principal may describe, and its pattern as the describable topic
    names it matches (a pattern narrowed at registration names the topics it took)."""
    topics = tuple(entry for entry in subscription.topics if may(ResourceType.TOPIC, entry.topic))
    return attrs.evolve(
        narrowed(authorizer, principal, subscription, Operation.DESCRIBE), topics=topics
    )


def narrowed(
    authorizer: Authorizer,
    principal: str,
    subscription: Subscription,
    operation: Operation = Operation.READ,
) -> Subscription:
    """A wildcard subscription that matches only topics the principal may read (or do
    ``operation`` on): the topic names its pattern takes that the principal's rules name, as a
    pattern of their own. Unchanged if the principal may do it on every topic, or the
    subscription names its topics."""
    if subscription.pattern is None or authorizer.every_topic(principal, operation):
        return subscription
    names = sorted(
        name
        for name in authorizer.topics_by_name(principal, operation)
        if subscription.streams_for(name) > 0
    )
    # An empty pattern matches no topic: a topic's name is never empty.
    return attrs.evolve(
        subscription,
        pattern="|".join(re.escape(name) for name in names),
        pattern_is_blacklist=False,
    )
