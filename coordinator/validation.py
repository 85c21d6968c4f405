"""Every request checked against the broker's bounds before a state machine, an assignor, the
store or the log sees it.

A request decoded from the wire is well-formed but not yet sane: a legal int16 string can be a
32 KiB consumer id that no StartFetcher stream id fits, a legal int32 can ask for two billion
streams or partitions, a legal pattern can be one RE2 refuses. These are pure functions of a
request and :class:`~coordinator.limits.RequestLimits` (no I/O, no clock), returning the error
code to answer with, so each handler refuses with one call and the checks live in one place.
Checks that need state (a group's size, a partition's log end, the partitions already placed on
a broker) stay in their handlers, which use the helpers here.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Mapping

from coordinator.limits import RequestLimits
from protocol import (
    ClusterMetadataRequest,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeGroupRequest,
    ErrorCode,
    FetchRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    ProduceRequest,
    RegisterConsumerRequest,
    RequestMessage,
)
from protocol.topic_configs import InvalidTopicConfig, checked_configs
from protocol.types import InvalidPattern, Subscription, TopicPartition, compile_pattern

TOPIC_NAME_MAX = 249
#: A generation a consumer reports must leave room below int32's end for the rebalances that
#: follow it (each takes the highest reported generation plus one): a report of 2^31-1 would make
#: the next StopFetcher unencodable. A million rebalances of headroom is decades of them.
MAX_REPORTED_GENERATION = 2**31 - 1 - 2**20
#: Line and paragraph separators end a line in some log viewers, like the C0/C1 controls.
_LINE_BREAKS = frozenset("\u2028\u2029")


def valid_id(value: str, limits: RequestLimits) -> bool:
    """A group, member or client id: non-empty, at most ``max_id_bytes`` of UTF-8, and nothing
    that ends or rewrites a log line."""
    if not value or len(value.encode()) > limits.max_id_bytes:
        return False
    return not any(c in _LINE_BREAKS or unicodedata.category(c) == "Cc" for c in value)


def valid_topic_name(name: str) -> bool:
    """Kafka's rule: at most 249 characters of ``[A-Za-z0-9._-]``, not ``.`` or ``..`` (a topic
    name is a directory name in the log)."""
    return (
        0 < len(name) <= TOPIC_NAME_MAX
        and name not in {".", ".."}
        and all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    )


def all_valid_topic_names(names: Iterable[str]) -> bool:
    """Checked once per distinct name: a request names a few topics many times."""
    return all(valid_topic_name(name) for name in set(names))


def request_error(message: RequestMessage, client_id: str, limits: RequestLimits) -> ErrorCode:
    """The code to refuse ``message`` with, or NONE; the checks that need no state.

    The client id is in every request header; it is stored with a member and shown by
    DescribeGroup, so every request carrying a bad one is refused (INVALID_REQUEST), not only a
    RegisterConsumer.
    """
    if client_id and not valid_id(client_id, limits):
        return ErrorCode.INVALID_REQUEST
    match message:
        case RegisterConsumerRequest():
            return registration_error(message, limits)
        case OffsetCommitRequest():
            return offset_commit_error(message, limits)
        case OffsetFetchRequest():
            if not valid_id(message.group_id, limits):
                return ErrorCode.INVALID_GROUP_ID
            if message.partitions is not None:
                if len(message.partitions) > limits.max_partitions_per_request:
                    return ErrorCode.INVALID_REQUEST
                # The answer repeats each name: bounded names keep it within a frame.
                if not all_valid_topic_names(tp.topic for tp in message.partitions):
                    return ErrorCode.INVALID_TOPIC_EXCEPTION
        case ClusterMetadataRequest():
            if message.group_id is not None and not valid_id(message.group_id, limits):
                return ErrorCode.INVALID_GROUP_ID
            # The answer repeats each named topic's partitions: the server names each once,
            # and asking for all topics (None) is bounded by what the cluster holds.
            if message.topics is not None:
                if len(set(message.topics)) > limits.max_topics_per_subscription:
                    return ErrorCode.INVALID_REQUEST
                if not all_valid_topic_names(message.topics):
                    return ErrorCode.INVALID_TOPIC_EXCEPTION
        case CreateTopicRequest():
            if not valid_topic_name(message.topic):
                return ErrorCode.INVALID_TOPIC_EXCEPTION
            try:  # stops at the first unknown or repeated name: a long list costs no more
                checked_configs((c.name, c.value) for c in message.configs)
            except InvalidTopicConfig:
                return ErrorCode.INVALID_CONFIG
            return partition_count_error(message.partitions, limits)
        case CreatePartitionsRequest():
            if not valid_topic_name(message.topic):
                return ErrorCode.INVALID_TOPIC_EXCEPTION
            return partition_count_error(message.total_partitions, limits)
        case DeleteTopicRequest():
            if not valid_topic_name(message.topic):
                return ErrorCode.INVALID_TOPIC_EXCEPTION
        case DescribeGroupRequest() | DeleteGroupRequest() | LeaveGroupRequest():
            if not valid_id(message.group_id, limits):
                return ErrorCode.INVALID_GROUP_ID
        case ProduceRequest() | FetchRequest() | ListOffsetsRequest():
            return data_error(message)
    return ErrorCode.NONE


def data_error(message: ProduceRequest | FetchRequest | ListOffsetsRequest) -> ErrorCode:
    """A partition that cannot exist is unknown at once, without asking the store whether the
    topic was created since the broker last looked."""
    if message.partition < 0 or not valid_topic_name(message.topic):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if isinstance(message, ListOffsetsRequest) and message.timestamp_ms < -1:
        return ErrorCode.INVALID_REQUEST  # -1 asks no lookup by time; other negatives nothing
    return ErrorCode.NONE


def registration_error(request: RegisterConsumerRequest, limits: RequestLimits) -> ErrorCode:
    """RegisterConsumer's checks against the bounds; the session timeout, the offset reset and
    the group's state are the coordinator's."""
    if not valid_id(request.group_id, limits):
        return ErrorCode.INVALID_GROUP_ID
    if not valid_id(request.consumer_id, limits):
        return ErrorCode.INVALID_REQUEST
    # A static member's instance id is its member id (docs/design.md#static-members).
    if request.instance_id is not None and not valid_id(request.instance_id, limits):
        return ErrorCode.INVALID_REQUEST
    if not -1 <= request.generation <= MAX_REPORTED_GENERATION:
        return ErrorCode.INVALID_REQUEST
    if len(request.owned_partitions) > limits.max_partitions_per_request or any(
        tp.partition < 0 for tp in request.owned_partitions
    ):
        return ErrorCode.INVALID_REQUEST
    return subscription_error(request.subscription, limits)


def subscription_error(subscription: Subscription, limits: RequestLimits) -> ErrorCode:
    """Bounded before any assignor builds a thread per stream or matches the pattern against
    every topic: a member's threads number its largest stream count."""
    topics = subscription.topics
    if not topics and subscription.pattern is None:
        return ErrorCode.INVALID_REQUEST
    if len(topics) > limits.max_topics_per_subscription:
        return ErrorCode.INVALID_REQUEST
    if len({entry.topic for entry in topics}) != len(topics):
        return ErrorCode.INVALID_REQUEST
    if any(not valid_topic_name(entry.topic) for entry in topics):
        return ErrorCode.INVALID_TOPIC_EXCEPTION
    if any(not valid_streams(entry.streams, limits) for entry in topics):
        return ErrorCode.INVALID_REQUEST
    if subscription.pattern is not None:
        if not valid_streams(subscription.pattern_streams, limits):
            return ErrorCode.INVALID_REQUEST
        if len(subscription.pattern.encode()) > limits.max_pattern_bytes:
            return ErrorCode.INVALID_REGULAR_EXPRESSION
        try:
            compile_pattern(subscription.pattern)
        except InvalidPattern:
            return ErrorCode.INVALID_REGULAR_EXPRESSION
    return ErrorCode.NONE


def valid_streams(streams: int, limits: RequestLimits) -> bool:
    return 1 <= streams <= limits.max_streams_per_topic


def offset_commit_error(request: OffsetCommitRequest, limits: RequestLimits) -> ErrorCode:
    """An offset is the next one to read, so it is never negative; where it ends is the log's
    (the coordinator checks it against the log end)."""
    if not valid_id(request.group_id, limits):
        return ErrorCode.INVALID_GROUP_ID
    if request.consumer_id is not None and not valid_id(request.consumer_id, limits):
        return ErrorCode.INVALID_REQUEST
    if len(request.offsets) > limits.max_partitions_per_request:
        return ErrorCode.INVALID_REQUEST
    if not all_valid_topic_names(po.topic for po in request.offsets):
        return ErrorCode.INVALID_TOPIC_EXCEPTION
    if any(po.partition < 0 for po in request.offsets):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if any(po.offset < 0 for po in request.offsets):
        return ErrorCode.INVALID_REQUEST
    return ErrorCode.NONE


def partition_count_error(count: int, limits: RequestLimits) -> ErrorCode:
    """A topic's partition count, wanted by CreateTopic or CreatePartitions."""
    if not 1 <= count <= limits.max_partitions_per_topic:
        return ErrorCode.INVALID_PARTITIONS
    return ErrorCode.NONE


def broker_partitions_error(placed: int, added: int, limits: RequestLimits) -> ErrorCode:
    """``placed`` partitions on the broker already, ``added`` more wanted there: POLICY_VIOLATION
    past ``max_partitions_per_broker`` (the topic's own count is fine, the broker is full)."""
    if placed + added > limits.max_partitions_per_broker:
        return ErrorCode.POLICY_VIOLATION
    return ErrorCode.NONE


#: A partition's log end offset if this broker can tell it now, else None (placed on another
#: broker, or no log at all, as in the coordinator's simulation). In a ZooKeeper cluster an
#: offset for a partition on another broker is not checked: asking that broker (ListOffsets) for
#: every Ping answer would put a network round trip, and that broker's failures, into the
#: offsets path.
LogEnd = Callable[[TopicPartition], int | None]


def beyond_log_end(offsets: Mapping[TopicPartition, int], log_end: LogEnd) -> list[TopicPartition]:
    """The partitions whose offset lies past their log end: nothing was ever written there,
    and members only move an offset forward, so one such commit would pin its group above what
    every later commit says. An offset equal to the log end is the next record to be written."""
    beyond = []
    for tp, offset in offsets.items():
        end = log_end(tp)
        if end is not None and offset > end:
            beyond.append(tp)
    return beyond


class LeaderUnavailable(Exception):
    """A replicated partition's leader could not tell its high watermark in time (none now, or
    unreachable): a commit is answered COORDINATOR_NOT_AVAILABLE, which its client retries."""


#: The high watermarks of the replicated partitions among some offsets' whose leader is another
#: broker, each asked of that leader (docs/design.md#replication): a record below it is
#: on every in-sync replica, so an offset above it was never readable. A partition left out (or
#: None) is checked by ``LogEnd`` as before: factor 1, or led here. A cached value at or above
#: the offset may answer without asking. Raises :class:`LeaderUnavailable`.
HighWatermarks = Callable[[Mapping[TopicPartition, int]], Awaitable[Mapping[TopicPartition, int]]]


async def beyond_high_watermarks(
    offsets: Mapping[TopicPartition, int],
    log_end: LogEnd | None,
    high_watermarks: HighWatermarks | None,
) -> list[TopicPartition]:
    """The partitions whose offset lies past what was ever readable there: past the leader's
    high watermark for those ``high_watermarks`` answers, past the local log end
    (``beyond_log_end``) for the others. Raises :class:`LeaderUnavailable`."""
    known: Mapping[TopicPartition, int] = {}
    if high_watermarks is not None:
        known = await high_watermarks(offsets)
    beyond = [tp for tp, hw in known.items() if tp in offsets and offsets[tp] > hw]
    if log_end is not None:
        rest = {tp: offset for tp, offset in offsets.items() if tp not in known}
        beyond.extend(beyond_log_end(rest, log_end))
    return beyond
