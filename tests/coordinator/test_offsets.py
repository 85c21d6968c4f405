"""Offsets: fenced by member and generation, durable before the answer, kept across restarts."""

import uuid
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import attrs
import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from coordinator.offsets import OffsetKeeper
from protocol import (
    DescribeGroupRequest,
    DescribeGroupResponse,
    ErrorCode,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from protocol.types import PartitionOffset, TopicPartition
from simulation import SimulatedCluster, open_simulated_cluster
from store import OffsetBatch
from tests.support.standin_consumer import StandInConsumer

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0)


def _offsets(**by_partition: int) -> tuple[PartitionOffset, ...]:
    return tuple(
        PartitionOffset(topic="events", partition=int(p[1:]), offset=o)
        for p, o in by_partition.items()
    )


async def _standalone_commit(
    cluster: SimulatedCluster, group: str, offsets: tuple[PartitionOffset, ...]
) -> ErrorCode:
    async with cluster.open_client() as client:
        response = await client.request(
            OffsetCommitRequest(group_id=group, consumer_id=None, generation=-1, offsets=offsets)
        )
    assert isinstance(response, OffsetCommitResponse)
    return response.error_code


async def _fetch(cluster: SimulatedCluster, group: str) -> dict[TopicPartition, int]:
    async with cluster.open_client() as client:
        response = await client.request(OffsetFetchRequest(group_id=group, partitions=None))
    assert isinstance(response, OffsetFetchResponse)
    return {po.topic_partition: po.offset for po in response.offsets}


async def test_committed_offsets_survive_a_restart_and_seed_the_next_assignment(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=4)
        cluster.produce("events", records=20)
        assert await _standalone_commit(cluster, "g", _offsets(p0=10, p1=20)) is ErrorCode.NONE
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        await cluster.wait_stable("g", members=1)
        assert a.positions[TopicPartition(topic="events", partition=0)] == 10
        # a finishes p0's 10 records after its committed offset at once, then one every 2 s
        # (1.0 to 9.0); the Ping of 11.0 reports them.
        cluster.nursery.start_soon(partial(cluster.feed, "events", every=2.0))
        await trio.sleep(10)
        before = await _fetch(cluster, "g")
        assert before[TopicPartition(topic="events", partition=0)] == 25
        assert before[TopicPartition(topic="events", partition=1)] == 25
    restart = trio.current_time()
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        assert await _fetch(cluster, "g") == before
        await cluster.create_topic("more", partitions=1)  # the topic watch has loaded
        cluster.produce("events", records=25)  # the new cluster's log: as far as committed
        b = await cluster.start_consumer("b", group="g", topics={"events": 1})
        await cluster.wait_stable("g", members=1)
        # a, the previous owner, may still fetch under its lease: T (6 s) + 0.5 s after the
        # new coordinator took office
        assert trio.current_time() == restart + 6.5
        assert b.positions == before
        cluster.ledger.check()


async def test_commits_are_fenced_by_member_generation_and_ownership(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=2)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        b = await cluster.start_consumer("b", group="g", topics={"events": 1})
        generation = await cluster.wait_stable("g", members=2)
        (mine,) = a.owned
        (theirs,) = b.owned

        async def commit(
            consumer_id: str | None, generation: int, partition: TopicPartition, offset: int
        ) -> ErrorCode:
            offsets = (
                PartitionOffset(
                    topic=partition.topic, partition=partition.partition, offset=offset
                ),
            )
            assert a.channel is not None  # a's own coordinator connection
            response = await a.channel.request(
                OffsetCommitRequest(
                    group_id="g", consumer_id=consumer_id, generation=generation, offsets=offsets
                )
            )
            assert isinstance(response, OffsetCommitResponse)
            return response.error_code

        assert await commit("a", generation, mine, 100) is ErrorCode.NONE
        assert await commit("a", generation - 1, mine, 200) is ErrorCode.ILLEGAL_GENERATION
        assert await commit("a", generation, theirs, 300) is ErrorCode.ILLEGAL_GENERATION
        assert await commit("b", generation, theirs, 300) is ErrorCode.UNKNOWN_MEMBER_ID
        assert await commit("nobody", generation, mine, 400) is ErrorCode.UNKNOWN_MEMBER_ID
        assert await commit(None, -1, mine, 0) is ErrorCode.NON_EMPTY_GROUP
        assert await commit("a", generation, mine, 50) is ErrorCode.NONE  # never backwards
        committed = await _fetch(cluster, "g")
        assert committed[mine] == 100
        assert committed.get(theirs, -1) < 300


async def test_describe_shows_members_assignment_and_offsets(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=3)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        generation = await cluster.wait_stable("g", members=1)
        await trio.sleep(2)  # one Ping
        async with cluster.open_client() as client:
            response = await client.request(DescribeGroupRequest(group_id="g"))
            missing = await client.request(DescribeGroupRequest(group_id="nope"))
        assert isinstance(response, DescribeGroupResponse)
        assert (response.state, response.generation) == ("Stable", generation)
        (member,) = response.members
        assert member.member_id == "a" and set(member.partitions) == a.owned
        assert {po.topic_partition: po.offset for po in response.offsets} == a.positions
        assert isinstance(missing, DescribeGroupResponse)
        assert missing.error_code is ErrorCode.GROUP_ID_NOT_FOUND


async def test_generations_stay_above_any_a_returning_member_reports(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A coordinator that died mid-attempt may have sent a generation it never persisted; the
    members that saw it carry it back, and the next generation must still be larger."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=2)
        await cluster.start_consumer("a", group="g", topics={"events": 1})
        assert await cluster.wait_stable("g", members=1) == 1
        # a process back from a coordinator that died: a client of the tests' own
        returning = await cluster.start_consumer(
            "b", group="g", topics={"events": 1}, generation=41, member=StandInConsumer
        )
        assert returning.last_register_error is ErrorCode.NONE
        assert await cluster.wait_stable("g", members=2) == 42
        assert returning.generation == 42


@attrs.define
class _BatchStore:
    """The two calls an OffsetKeeper makes of its store: what it was asked to write."""

    written: list[OffsetBatch] = attrs.Factory(list)

    async def fetch_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        await trio.lowlevel.checkpoint()
        return {}

    async def commit_offsets(self, epoch: int, batches: Sequence[OffsetBatch]) -> None:
        await trio.lowlevel.checkpoint()
        self.written.extend(batches)


async def test_offsets_carry_their_incarnation_and_an_old_ones_are_never_applied() -> None:
    """docs/design.md#topic-ids: a report read from the incarnation no longer in force is
    dropped; a commit by name applies to the one in force; every batch names the incarnation
    of its offsets; forgetting an incarnation keeps what was accepted for the one after it."""
    old, new = uuid.UUID(int=1), uuid.UUID(int=2)
    tp0, tp1 = (
        TopicPartition(topic="events", partition=0),
        TopicPartition(topic="events", partition=1),
    )
    store = _BatchStore()
    keeper = OffsetKeeper(store=store, epoch=1, commit_interval=1.0, retry_backoff=1.0)  # type: ignore[arg-type]
    keeper.topic_ids = {"events": old}
    await keeper.accept("g", 1, {tp0: 10}, monotonic=True, topic_ids={"events": old})
    await keeper.flush()
    assert store.written[-1].topic_ids == {"events": old}
    keeper.topic_ids = {"events": new}  # deleted and created again
    assert await keeper.forget_topics({"events"}) == {"g": {"events"}}
    assert await keeper.committed("g") == {}
    # A member still reading the old incarnation reports: dropped, not applied to the new one.
    await keeper.accept("g", 1, {tp0: 12}, monotonic=True, topic_ids={"events": old})
    assert await keeper.committed("g") == {}
    # A standalone commit names no incarnation: the one in force.
    await keeper.accept("g", -1, {tp1: 3}, monotonic=False)
    assert await keeper.committed("g") == {tp1: 3}
    # The topic watch forgetting the old incarnation again keeps the new one's offsets.
    assert await keeper.forget_topics({"events"}) == {}
    await keeper.flush()
    assert store.written[-1].offsets == {tp1: 3}
    assert store.written[-1].topic_ids == {"events": new}
