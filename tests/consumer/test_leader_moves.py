"""A partition's leader moves: the consumer's fetchers, the producer and the admin client follow
it (refresh the metadata, or take the answer's hint, and go to the leader) without the group
hearing of it: no rebalance, the generation unchanged, no record skipped or seen twice."""

from __future__ import annotations

import uuid

import pytest
import trio
import trio.testing

from consumer import ConsumerSettings, ProduceError, ProducerConfig, open_consumer, open_producer
from consumer.admin import open_admin
from consumer.leaders import Leader, Leaders
from protocol import (
    ClusterMetadataResponse,
    ErrorCode,
    FetchRequest,
    ListOffsetsRequest,
    PartitionMetadata,
    ProduceRequest,
    TopicIdentity,
    TopicMetadata,
)
from protocol.replica_messages import PartitionReplicas, TopicReplicas
from protocol.types import BrokerInfo, TopicPartition

from .inmemory import SCRIPTED_BROKER, open_scripted_coordinator
from .test_consumer_in_memory import drain, recorders

T0 = TopicPartition(topic="t", partition=0)
T1 = TopicPartition(topic="t", partition=1)
BROKER_2 = BrokerInfo(broker_id=2, host="broker-2", port=9092)
BROKER_3 = BrokerInfo(broker_id=3, host="broker-3", port=9092)


async def test_a_fetcher_follows_its_partitions_leader_without_a_rebalance(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[tuple[TopicPartition, int]] = []
    rebalances: list[tuple[float, str, frozenset[TopicPartition]]] = []
    revoked, assigned = recorders(rebalances)
    settings = ConsumerSettings(auto_offset_reset="earliest")
    async with (
        open_scripted_coordinator() as coordinator,
        open_consumer(
            "broker:9092",
            "g",
            topics={"t": 1},
            settings=settings,
            connect=coordinator.connect,
            on_assigned=assigned,
            on_revoked=revoked,
        ) as consumer,
        trio.open_nursery() as app,
    ):
        app.start_soon(drain, consumer.streams[0], seen)
        member = await coordinator.member()
        # t-1 moved before the consumer starts it: its first ListOffsets is refused
        coordinator.leaders[T1] = (BROKER_2, 1)
        await member.start(1, member.streams(("t", 0, 0), ("t", 1, -1)))
        await trio.sleep_until(1.0)
        moved_at = len(coordinator.data_requests)
        coordinator.leaders[T0] = (BROKER_2, 3)
        await trio.sleep_until(3.0)
        app.cancel_scope.cancel()
        assert consumer.generation == 1
        assert consumer.assignment.value == {T0, T1}
        assert rebalances == [(0.0, "assigned", frozenset({T0, T1}))]  # the start alone

    assert len(coordinator.registrations) == 1
    for tp in (T0, T1):
        offsets = [o for p, o in seen if p == tp]
        assert offsets == list(range(len(offsets))) and len(offsets) >= 25, (tp, offsets)
    # after the move, t-0 is fetched from broker 2 naming its epoch; broker 1 refused it once
    t0_after = [
        (b, m)
        for b, m in coordinator.data_requests[moved_at:]
        if isinstance(m, FetchRequest) and m.partition == 0
    ]
    refused = [m for b, m in t0_after if b == 1]
    assert len(refused) == 1
    assert t0_after[-1][0] == 2 and t0_after[-1][1].current_leader_epoch == 3
    lists = [(b, m) for b, m in coordinator.data_requests if isinstance(m, ListOffsetsRequest)]
    assert [(b, m.current_leader_epoch) for b, m in lists] == [(1, -1), (2, 1)]


def metadata(leader: int, epoch: int, topic_id: int = 1) -> ClusterMetadataResponse:
    return ClusterMetadataResponse(
        error_code=ErrorCode.NONE,
        coordinator_id=1,
        coordinator_epoch=1,
        brokers=(),
        topics=(
            TopicMetadata(
                topic="t",
                error_code=ErrorCode.NONE,
                partitions=(PartitionMetadata(partition=0, broker_id=leader),),
            ),
        ),
        replicas=(
            TopicReplicas(
                topic="t",
                partitions=(
                    PartitionReplicas(
                        partition=0, leader_epoch=epoch, replicas=(1, 2, 3), isr=(leader, 3)
                    ),
                ),
            ),
        ),
        topic_ids=(TopicIdentity(topic="t", topic_id=uuid.UUID(int=topic_id)),),
    )


async def test_leaders_refresh_a_topic_at_most_every_100_ms_and_take_only_newer_hints(
    autojump_clock: trio.testing.MockClock,
) -> None:
    asked: list[float] = []
    answers = [metadata(1, 4), metadata(2, 5), metadata(1, 3)]

    async def ask(topics: tuple[str, ...]) -> ClusterMetadataResponse | None:
        assert topics == ("t",)
        asked.append(trio.current_time())
        return answers.pop(0)

    leaders = Leaders(ask=ask)
    async with trio.open_nursery() as nursery:
        for _ in range(5):  # five fetchers refused at once: one question
            nursery.start_soon(leaders.refresh, "t")
    assert asked == [0.0]
    assert leaders.of(T0) == Leader(broker_id=1, epoch=4, replicas=(1, 2, 3), isr=(1, 3))
    assert leaders.epoch_at(T0, 1) == 4 and leaders.epoch_at(T0, 2) == -1
    await trio.sleep(0.05)
    await leaders.refresh("t")
    assert asked == [0.0]
    await trio.sleep(0.05)
    await leaders.refresh("t")
    assert asked == [0.0, 0.1]
    assert leaders.of(T0) == Leader(broker_id=2, epoch=5, replicas=(1, 2, 3), isr=(2, 3))
    await trio.sleep(0.1)
    await leaders.refresh("t")  # a broker that has not heard of epoch 5 yet
    assert leaders.of(T0) == Leader(broker_id=2, epoch=5, replicas=(1, 2, 3), isr=(2, 3))
    assert not leaders.learn_hint(T0, 3, 5)
    assert not leaders.learn_hint(T0, 3, 4)
    assert leaders.learn_hint(T0, 3, 6)
    assert await leaders.follow(T0, 1, 2) == 3  # an old hint: a refresh, rate-limited
    assert len(asked) == 3


def test_another_incarnation_of_a_topic_counts_its_leader_epochs_afresh() -> None:
    """A topic deleted and created again under its name starts at leader epoch 0: its leaders
    are taken, not refused as older than the gone incarnation's (a fetcher would name epoch 4
    to a leader at epoch 0, be refused, and never learn better)."""

    async def ask(topics: tuple[str, ...]) -> ClusterMetadataResponse | None:
        raise AssertionError("not asked")

    leaders = Leaders(ask=ask)
    leaders.learn(metadata(1, 4))
    leaders.learn(metadata(1, 3))  # a broker behind: the gone incarnation's older epoch
    assert leaders.of(T0) == Leader(broker_id=1, epoch=4, replicas=(1, 2, 3), isr=(1, 3))
    leaders.learn(metadata(1, 0, topic_id=2))
    assert leaders.of(T0) == Leader(broker_id=1, epoch=0, replicas=(1, 2, 3), isr=(1, 3))
    assert leaders.epoch_at(T0, 1) == 0


async def test_the_producer_retries_leader_moves_and_too_few_replicas_not_a_refused_acks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = ProducerConfig(linger=0.0, retry_backoff=0.1)
    async with open_scripted_coordinator() as coordinator:
        coordinator.leaders[T0] = (SCRIPTED_BROKER, 0)
        async with open_producer("broker:9092", connect=coordinator.connect, config=config) as p:
            assert await p.partitions_for("t") == 1
            looked_up = len(coordinator.lookups)
            coordinator.produce_answers[:] = [
                ErrorCode.NOT_ENOUGH_REPLICAS,
                ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                ErrorCode.REQUEST_TIMED_OUT,
            ]
            start = trio.current_time()
            assert await p.send_and_wait("t", b"x") == (0, 0)
            assert trio.current_time() - start == pytest.approx(0.3)
            assert len(coordinator.lookups) == looked_up  # the same leader, asked again

            coordinator.leaders[T0] = (BROKER_2, 1)
            assert await p.send_and_wait("t", b"y") == (0, 1)
            assert len(coordinator.lookups) == looked_up + 1

            coordinator.produce_answers[:] = [ErrorCode.INVALID_REQUIRED_ACKS]
            with pytest.raises(ProduceError) as refused:
                await p.send_and_wait("t", b"z")
            assert refused.value.error_code is ErrorCode.INVALID_REQUIRED_ACKS
    produced = [(b, m) for b, m in coordinator.data_requests if isinstance(m, ProduceRequest)]
    assert [b for b, _ in produced] == [1, 1, 1, 1, 1, 2, 2]
    assert {(m.acks, m.timeout_ms) for _, m in produced} == {(-1, 30_000)}


async def test_the_producer_never_goes_back_to_a_leader_of_an_older_epoch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two partitions move to broker 3, one after the other; the answer to the refresh that
    t-1's move asks for comes from a broker that has not heard of t-0's move yet. t-0 stays
    with its newer leader."""
    config = ProducerConfig(linger=0.0, retry_backoff=0.1)
    async with open_scripted_coordinator() as coordinator:
        coordinator.leaders.update({T0: (BROKER_2, 1), T1: (BROKER_2, 1)})
        async with open_producer("broker:9092", connect=coordinator.connect, config=config) as p:
            assert await p.send_and_wait("t", b"a", partition=0) == (0, 0)
            assert await p.send_and_wait("t", b"b", partition=1) == (1, 1)
            coordinator.leaders[T0] = (BROKER_3, 2)
            assert await p.send_and_wait("t", b"c", partition=0) == (0, 2)
            moved = len(coordinator.data_requests)
            coordinator.leaders[T1] = (BROKER_3, 2)
            coordinator.stale_leaders.append({T0: (BROKER_2, 1), T1: (BROKER_3, 2)})
            assert await p.send_and_wait("t", b"d", partition=1) == (1, 3)
            assert await p.send_and_wait("t", b"e", partition=0) == (0, 4)
    produced = [
        (b, m.partition)
        for b, m in coordinator.data_requests[moved:]
        if isinstance(m, ProduceRequest)
    ]
    # t-1 is refused at its old leader once; t-0 goes straight to its new one
    assert produced == [(2, 1), (3, 1), (3, 0)]


def test_acks_is_all_or_1() -> None:
    assert ProducerConfig().acks == "all"
    assert ProducerConfig(acks=1).acks == 1
    with pytest.raises(ValueError, match="acks"):
        ProducerConfig(acks=0)  # type: ignore[arg-type]


async def test_an_admin_read_goes_to_the_partitions_new_leader(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_scripted_coordinator() as coordinator:
        coordinator.leaders[T0] = (SCRIPTED_BROKER, 0)
        await trio.sleep(1.0)  # 10 records
        async with open_admin("broker:9092", connect=coordinator.connect) as admin:
            first = await admin.read(T0, 0)
            coordinator.leaders[T0] = (BROKER_2, 1)
            second = await admin.read(T0, 5)
    assert [b.base_offset for b in first.batches] == [0, 1, 2, 3, 4]
    assert [b.base_offset for b in second.batches] == [5, 6, 7, 8, 9]
    reads = [(b, m.offset) for b, m in coordinator.data_requests if isinstance(m, FetchRequest)]
    assert reads == [(1, 0), (1, 5), (2, 5)]
