"""coordinator.validation: each request field at and past its bound, as a pure function."""

from __future__ import annotations

import pytest

from coordinator.limits import RequestLimits
from coordinator.validation import (
    MAX_REPORTED_GENERATION,
    beyond_log_end,
    broker_partitions_error,
    request_error,
    valid_id,
)
from protocol import (
    ClusterMetadataRequest,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteTopicRequest,
    DescribeGroupRequest,
    ErrorCode,
    FetchRequest,
    ListGroupsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    ProduceRequest,
    RegisterConsumerRequest,
)
from protocol.messages import RequestMessage
from protocol.types import PartitionOffset, Subscription, TopicPartition, TopicStreams

LIMITS = RequestLimits(
    max_id_bytes=8,
    max_pattern_bytes=16,
    max_streams_per_topic=4,
    max_topics_per_subscription=3,
    max_partitions_per_topic=100,
    max_partitions_per_broker=150,
    max_partitions_per_request=5,
)


def _register(
    subscription: Subscription | None = None, *, generation: int = -1, **ids: str
) -> RegisterConsumerRequest:
    return RegisterConsumerRequest(
        group_id=ids.get("group_id", "g"),
        consumer_id=ids.get("consumer_id", "c"),
        subscription=subscription or Subscription(topics=(TopicStreams(topic="t", streams=1),)),
        auto_commit=True,
        auto_offset_reset="smallest",
        session_timeout_ms=6000,
        generation=generation,
        owned_partitions=(),
        instance_id=ids.get("instance_id"),
    )


def _topics(*streams: int, names: str = "abcdef") -> Subscription:
    return Subscription(
        topics=tuple(TopicStreams(topic=names[i], streams=n) for i, n in enumerate(streams))
    )


def _commit(*offsets: tuple[int, int]) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id="g",
        consumer_id=None,
        generation=-1,
        offsets=tuple(PartitionOffset(topic="t", partition=p, offset=o) for p, o in offsets),
    )


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("a", True),
        ("a" * 8, True),
        ("a" * 9, False),
        ("é" * 4, True),  # 8 bytes
        ("é" * 4 + "a", False),  # 9 bytes, 5 characters
        ("", False),
        ("a\nb", False),
        ("a\rb", False),
        ("a\x00b", False),
        ("a\x1bb", False),
        ("a\x7fb", False),
        ("a\x85b", False),  # C1 next line
        ("a\u2028b", False),
        ("a b", True),
        ("a\tb", False),
    ],
)
def test_ids(value: str, ok: bool) -> None:
    assert valid_id(value, LIMITS) is ok


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (_register(), ErrorCode.NONE),
        (_register(group_id="g" * 9), ErrorCode.INVALID_GROUP_ID),
        (_register(group_id=""), ErrorCode.INVALID_GROUP_ID),
        (_register(consumer_id="c" * 9), ErrorCode.INVALID_REQUEST),
        (_register(consumer_id="c\n"), ErrorCode.INVALID_REQUEST),
        # A static member's instance id is its member id: the same bounds (design#static-members).
        (_register(instance_id="i"), ErrorCode.NONE),
        (_register(instance_id=""), ErrorCode.INVALID_REQUEST),
        (_register(instance_id="i" * 9), ErrorCode.INVALID_REQUEST),
        (_register(instance_id="i\n"), ErrorCode.INVALID_REQUEST),
        (_register(generation=MAX_REPORTED_GENERATION), ErrorCode.NONE),
        (_register(generation=MAX_REPORTED_GENERATION + 1), ErrorCode.INVALID_REQUEST),
        (_register(generation=2**31 - 1), ErrorCode.INVALID_REQUEST),
        (_register(generation=-2), ErrorCode.INVALID_REQUEST),
        (_register(Subscription()), ErrorCode.INVALID_REQUEST),
        (_register(_topics(4, 4, 4)), ErrorCode.NONE),
        (_register(_topics(1, 1, 1, 1)), ErrorCode.INVALID_REQUEST),
        (_register(_topics(5)), ErrorCode.INVALID_REQUEST),
        (_register(_topics(0)), ErrorCode.INVALID_REQUEST),
        (_register(_topics(2**31 - 1)), ErrorCode.INVALID_REQUEST),
        (_register(_topics(1, 1, names="tt")), ErrorCode.INVALID_REQUEST),
        (_register(_topics(1, names="/")), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (_register(Subscription(pattern="t.*", pattern_streams=4)), ErrorCode.NONE),
        (_register(Subscription(pattern="t.*", pattern_streams=5)), ErrorCode.INVALID_REQUEST),
        (_register(Subscription(pattern="(")), ErrorCode.INVALID_REGULAR_EXPRESSION),
        (_register(Subscription(pattern="(?=a)")), ErrorCode.INVALID_REGULAR_EXPRESSION),
        (_register(Subscription(pattern="a" * 16)), ErrorCode.NONE),
        (_register(Subscription(pattern="a" * 17)), ErrorCode.INVALID_REGULAR_EXPRESSION),
        (_register(Subscription(pattern="é" * 9)), ErrorCode.INVALID_REGULAR_EXPRESSION),
        (_commit((0, 0), (1, 2**63 - 1)), ErrorCode.NONE),
        (_commit((0, -1)), ErrorCode.INVALID_REQUEST),
        (_commit((0, -(2**63))), ErrorCode.INVALID_REQUEST),
        (_commit((-1, 0)), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (_commit(*[(p, 0) for p in range(5)]), ErrorCode.NONE),
        (_commit(*[(p, 0) for p in range(6)]), ErrorCode.INVALID_REQUEST),
        (
            OffsetFetchRequest(
                group_id="g", partitions=(TopicPartition(topic="t", partition=0),) * 6
            ),
            ErrorCode.INVALID_REQUEST,
        ),
        (OffsetFetchRequest(group_id="g", partitions=None), ErrorCode.NONE),
        (OffsetFetchRequest(group_id="g\n", partitions=None), ErrorCode.INVALID_GROUP_ID),
        (DescribeGroupRequest(group_id="g" * 9), ErrorCode.INVALID_GROUP_ID),
        (ClusterMetadataRequest(group_id=None, topics=("a",) * 1000), ErrorCode.NONE),
        (
            ClusterMetadataRequest(group_id=None, topics=("a", "b", "c", "d")),
            ErrorCode.INVALID_REQUEST,
        ),
        (ClusterMetadataRequest(group_id="", topics=None), ErrorCode.INVALID_GROUP_ID),
        (CreateTopicRequest(topic="t", partitions=100), ErrorCode.NONE),
        (CreateTopicRequest(topic="t", partitions=101), ErrorCode.INVALID_PARTITIONS),
        (CreateTopicRequest(topic="t", partitions=0), ErrorCode.INVALID_PARTITIONS),
        (CreateTopicRequest(topic="t", partitions=-(2**31)), ErrorCode.INVALID_PARTITIONS),
        (CreateTopicRequest(topic="..", partitions=1), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (DeleteTopicRequest(topic="t"), ErrorCode.NONE),
        (DeleteTopicRequest(topic=""), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (DeleteTopicRequest(topic="a" * 250), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (DeleteTopicRequest(topic="../x"), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (
            CreatePartitionsRequest(topic="t", total_partitions=2**31 - 1),
            ErrorCode.INVALID_PARTITIONS,
        ),
        (ProduceRequest(topic="t", partition=-1, records=()), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (
            FetchRequest(topic="a/b", partition=0, offset=0, max_bytes=1),
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ),
        (ListGroupsRequest(), ErrorCode.NONE),
        (
            OffsetFetchRequest(
                group_id="g", partitions=(TopicPartition(topic="a" * 250, partition=0),)
            ),
            ErrorCode.INVALID_TOPIC_EXCEPTION,
        ),
        (
            ClusterMetadataRequest(group_id=None, topics=("a" * 250,)),
            ErrorCode.INVALID_TOPIC_EXCEPTION,
        ),
        (
            OffsetCommitRequest(
                group_id="g",
                consumer_id=None,
                generation=-1,
                offsets=(PartitionOffset(topic="a/b", partition=0, offset=0),),
            ),
            ErrorCode.INVALID_TOPIC_EXCEPTION,
        ),
    ],
)
def test_request_error(message: RequestMessage, code: ErrorCode) -> None:
    assert request_error(message, "client", LIMITS) is code


def test_a_bad_client_id_refuses_any_request() -> None:
    assert request_error(ListGroupsRequest(), "", LIMITS) is ErrorCode.NONE
    assert request_error(ListGroupsRequest(), "x" * 9, LIMITS) is ErrorCode.INVALID_REQUEST
    assert request_error(_register(), "a\nb", LIMITS) is ErrorCode.INVALID_REQUEST


def test_partitions_per_broker() -> None:
    assert broker_partitions_error(100, 50, LIMITS) is ErrorCode.NONE
    assert broker_partitions_error(100, 51, LIMITS) is ErrorCode.POLICY_VIOLATION


def test_beyond_log_end() -> None:
    a, b, c = (TopicPartition(topic="t", partition=p) for p in range(3))
    ends = {a: 10, b: 0}
    offsets = {a: 10, b: 1, c: 10**15}
    assert beyond_log_end(offsets, ends.get) == [b]  # c: not this broker's, not checked
