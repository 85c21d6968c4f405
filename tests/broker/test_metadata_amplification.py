"""A ClusterMetadata request is a few bytes; its answer and its cost are the cluster's size.

Two bounds keep one such request from costing every other client: the answer is built with
checkpoints between chunks of partitions (and each topic once per placement, not per request),
and a request naming a topic the broker's view lacks shares one read of the store's topics with
every other such request instead of making one of its own (docs/limits.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import attrs
import trio
import trio.testing

from broker.dispatch import cluster_metadata
from broker.offices import TopicReads
from broker.pace import ANSWER_CHUNK
from coordinator.limits import RequestLimits
from protocol import ClusterMetadataRequest, ErrorCode, TopicIdentity
from protocol.types import BrokerInfo
from store import TopicPlacement
from tests.support.turns import turns_during

BROKERS = (BrokerInfo(broker_id=1, host="b1", port=9092),)


def _topics(count: int, partitions: int) -> dict[str, TopicPlacement]:
    return {
        f"t{i}": TopicPlacement(topic=f"t{i}", brokers=(1,) * partitions, topic_id=uuid.uuid4())
        for i in range(count)
    }


async def _answered_with_turns(
    topics: Mapping[str, TopicPlacement], message: ClusterMetadataRequest
) -> int:
    """How often another task ran while the answer was built."""
    answer, turns = await turns_during(
        cluster_metadata(
            message,
            topics=topics,
            brokers=BROKERS,
            coordinator_id=1,
            coordinator_epoch=1,
            limits=RequestLimits(),
        )
    )
    assert answer.error_code is ErrorCode.NONE
    assert sum(len(t.partitions) for t in answer.topics) == sum(
        topics[t.topic].partition_count for t in answer.topics
    )
    return turns


async def test_an_answer_for_every_partition_lets_others_run_between_chunks() -> None:
    """A checkpoint after about every ANSWER_CHUNK entries built: each of at most twice that."""
    every = ClusterMetadataRequest(group_id=None, topics=None)
    for count, partitions in ((3, 10_000), (30_000, 1)):
        topics = _topics(count, partitions)
        built = count + count * partitions  # topics, and each partition once
        assert await _answered_with_turns(topics, every) >= built // (2 * ANSWER_CHUNK)
        # Again: each topic as it was built for its placement, so only the topics count.
        assert await _answered_with_turns(topics, every) >= count // (2 * ANSWER_CHUNK)
    named = ClusterMetadataRequest(group_id=None, topics=("t0", "t1", "t2"))
    assert await _answered_with_turns(_topics(3, 10_000), named) >= 30_000 // (2 * ANSWER_CHUNK)


async def test_a_topic_is_answered_as_its_placement_is_now() -> None:
    """What is kept per placement never answers for another one."""
    message = ClusterMetadataRequest(group_id=None, topics=("t0", "gone"))
    for brokers in ((1, 1), (1, 1, 2), (2,)):
        topic_id = uuid.uuid4()  # each placement a new incarnation
        answer = await cluster_metadata(
            message,
            topics={"t0": TopicPlacement(topic="t0", brokers=brokers, topic_id=topic_id)},
            brokers=BROKERS,
            coordinator_id=1,
            coordinator_epoch=1,
            limits=RequestLimits(),
        )
        assert [p.broker_id for t in answer.topics for p in t.partitions] == list(brokers)
        assert answer.topic_ids == (TopicIdentity(topic="t0", topic_id=topic_id),)


@attrs.define(eq=False)
class _SlowStore:
    """The topics, read slowly (a ZooKeeper read of each topic's node), counting the reads."""

    topics_now: dict[str, TopicPlacement]
    reads: int = 0

    async def topics(self) -> Mapping[str, TopicPlacement]:
        self.reads += 1
        found = dict(self.topics_now)
        await trio.sleep(1.0)
        return found


async def test_requests_for_an_unknown_topic_share_the_stores_reads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = _SlowStore(topics_now=_topics(1, 1))
    reads = TopicReads(store=store)  # type: ignore[arg-type]
    seen: list[tuple[float, frozenset[str]]] = []

    async def ask() -> None:
        topics = await reads.since(trio.current_time())
        seen.append((trio.current_time(), frozenset(topics)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)  # begins a read at 0.0
        await trio.sleep(0.5)
        store.topics_now["new"] = TopicPlacement(topic="new", brokers=(1,), topic_id=uuid.uuid4())
        for _ in range(100):  # arrive while that read is in flight
            nursery.start_soon(ask)
    # The first read answers the request that began it; the hundred that came later share the
    # one read begun when it ended, which sees the topic created before they asked.
    assert store.reads == 2
    assert seen == [(1.0, frozenset({"t0"}))] + [(2.0, frozenset({"t0", "new"}))] * 100
