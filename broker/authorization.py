"""Every request a broker answers, checked against the access rules in force
(statemachine/acl.py) for the principal its connection authenticated as (transport/security.py),
before anything else looks at it; Kafka's mapping of requests to operations and error codes.

A denied request is answered with Kafka's code for the resource it names (29 topic, 30 group,
31 cluster) and nothing else. What lists things shows only what the principal may describe:
ClusterMetadata the topics, ListGroups the groups. A subscription pattern matches only topics the
principal may read: the member's pattern is narrowed, when it registers, to the readable topic
names it matches, so rules added later apply to it from its next registration on.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
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
    ErrorCode,
    FetchRequest,
    LeaveGroupRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    ProduceRequest,
    RegisterConsumerRequest,
    RequestMessage,
    ResponseMessage,
    TopicMetadata,
    error_response,
)
from protocol.types import Subscription
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
    is not shown; in ListGroups, such groups are not shown."""
    if not authorizer.enabled or principal in authorizer.super_users:
        return response

    def may(resource: ResourceType, name: str) -> bool:
        return authorizer.allows(principal, Operation.DESCRIBE, resource, name)

    if isinstance(response, ClusterMetadataResponse):
        named = isinstance(request, ClusterMetadataRequest) and request.topics is not None
        topics = tuple(
            topic
            if may(ResourceType.TOPIC, topic.topic)
            else TopicMetadata(topic=topic.topic, error_code=_TOPIC, partitions=())
            for topic in response.topics
            if named or may(ResourceType.TOPIC, topic.topic)
        )
        return attrs.evolve(response, topics=topics)
    if isinstance(response, ListGroupsResponse):
        groups = tuple(g for g in response.groups if may(ResourceType.GROUP, g.group_id))
        return attrs.evolve(response, groups=groups)
    return response


def narrowed(authorizer: Authorizer, principal: str, subscription: Subscription) -> Subscription:
    """A wildcard subscription that matches only topics the principal may read: the readable
    topic names its pattern takes, as a pattern of their own. Unchanged if the principal may
    read every topic, or the subscription names its topics."""
    if subscription.pattern is None or authorizer.reads_every_topic(principal):
        return subscription
    names = sorted(
        name
        for name in authorizer.topics_readable_by_name(principal)
        if subscription.streams_for(name) > 0
    )
    # An empty pattern matches no topic: a topic's name is never empty.
    return attrs.evolve(
        subscription,
        pattern="|".join(re.escape(name) for name in names),
        pattern_is_blacklist=False,
    )
