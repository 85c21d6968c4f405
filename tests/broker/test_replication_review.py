"""Hazards found reviewing the replication path (issue 37), each on in-process brokers
(tests/broker/replica_cluster.py): what a user would see go wrong, held by a test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from broker.controller import ControlInputs
from broker.leader_offsets import LeaderHighWatermarks
from broker.log.epochs import LEADER_EPOCHS
from broker.replica_fetcher import BACKOFF, ReplicaFetcher
from protocol import (
    ErrorCode,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProduceRequest,
    Request,
    Role,
)
from protocol.batches import Compression, build_batch
from protocol.types import BrokerInfo, TopicPartition
from statemachine.partition_state import IsrEntry, PartitionKey, PartitionState
from store import TopicPlacement
from tests.broker.replica_cluster import (
    KEY,
    TOPIC,
    TP,
    FakeClusterStore,
    open_cluster,
    until,
)
from transport.channel import Channel


async def test_a_produce_let_in_before_its_leader_stepped_down_writes_nothing_after(
    tmp_path: Path,
) -> None:
    """A produce told it may append (the leader's ``ask``) that waits before appending (here
    for the broker's decompression budget, which every request shares) while its broker stops
    leading must not append once the broker follows: a record written into a follower's log
    after the new leader's records of the new epoch is never found by the diverging-epoch
    handshake, and the two replicas differ for good."""
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        one, two = cluster.nodes[1], cluster.nodes[2]
        cluster.store.elect(leader=1, epoch=0, isr=[1, 2])
        await cluster.start(1)
        await cluster.start(2)
        assert await one.produce(b"a") == (ErrorCode.NONE, 0)
        budget = one.log.decompressed
        budget.used = budget.limit  # other requests hold the whole budget
        answers: list[ErrorCode] = []

        async def stale_produce() -> None:
            request = ProduceRequest(
                topic=TOPIC,
                partition=0,
                records=(),
                batches=build_batch([b"stale"], compression=Compression.ZSTD),
                acks=1,
                timeout_ms=5_000,
            )
            answers.append((await one.log.produce(request, 3)).error_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stale_produce)
            # it was let in (broker 1 leads) and waits for the budget
            await until(lambda: budget._room.statistics().tasks_waiting == 1)
            cluster.store.elect(leader=2, epoch=1, isr=[1, 2])
            await until(lambda: two.manager is not None and two.manager.leading(TP) is not None)
            assert await two.produce(b"b") == (ErrorCode.NONE, 1)
            await until(lambda: one.end() == 2)  # broker 1 follows and has "b", epoch 1
            budget.release(budget.limit)
        assert answers == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
        assert await two.produce(b"c") == (ErrorCode.NONE, 2)
        await until(lambda: one.end() == two.end() == 3)
        assert await one.values() == await two.values() == [b"a", b"b", b"c"]


async def test_a_damaged_epoch_file_of_a_partition_elected_here_does_not_end_the_broker(
    tmp_path: Path,
) -> None:
    """A partition whose leader-epoch file cannot be read is not led here (the follower's
    fetcher already treats it so: that partition waits, the others go on); the broker's
    replica manager, which every replicated partition here depends on, keeps running."""
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        cluster.store.elect(leader=1, epoch=0, isr=[1, 2])
        await cluster.start(1)
        await cluster.start(2)
        assert await cluster.nodes[1].produce(b"a") == (ErrorCode.NONE, 0)
        cluster.store.elect(leader=2, epoch=1, isr=[1, 2])
        await cluster.reopen(1)  # restarted: its epochs are read again on first use
        directory = cluster.nodes[1].log.partitions[TP].directory
        (directory / LEADER_EPOCHS).write_text("not an epoch file\n")
        await cluster.start(1)
        one = cluster.nodes[1].manager
        assert one is not None
        cluster.store.elect(leader=1, epoch=2, isr=[1, 2])
        await until(
            lambda: (
                one.states[KEY].leader_epoch == 2
                and KEY not in one.following
                and not one.lock(KEY).locked()
            )
        )
        assert not cluster.nodes[1].stopped.is_set()
        assert KEY not in one.led


async def test_a_topic_created_again_is_asked_its_own_high_watermark(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The coordinator's check of a commit against the leader's high watermark remembers what
    each leader told under a leader epoch; a topic deleted and created again under its name
    starts again at leader epoch 0, so what the old incarnation's leader told must not answer
    for the new one: a commit beyond the new topic's high watermark would be admitted."""
    old, new = (
        TopicPlacement.of(topic="r", assignment=((2, 1),), topic_id=uuid.uuid4()) for _ in "on"
    )
    topics = {"r": old}
    control = ControlInputs(slots=1)
    isr = tuple(IsrEntry(broker_id=b, log_dir=uuid.UUID(int=b)) for b in (1, 2))
    first = PartitionState(leader=2, leader_epoch=0, isr=isr, version=0)
    control.learn({PartitionKey(topic_id=old.topic_id, partition=0): first})
    told = [10]
    async with trio.open_nursery() as nursery:

        async def connect(host: str, port: int) -> trio.abc.Stream:
            ours, theirs = trio.testing.memory_stream_pair()
            channel = Channel.open(theirs, Role.BROKER, max_frame_size=1 << 20)

            async def answer(request: Request) -> None:
                assert isinstance(request.message, ListOffsetsRequest)
                response = ListOffsetsResponse(
                    error_code=ErrorCode.NONE,
                    log_start_offset=0,
                    high_watermark=told[0],
                    leader_id=2,
                    leader_epoch=0,
                )
                await channel.respond(request, response)

            nursery.start_soon(channel.run, answer)
            return ours

        high_watermarks = LeaderHighWatermarks(
            me=1,
            control=control,
            topics=lambda: topics,
            brokers=lambda: (BrokerInfo(broker_id=2, host="h2", port=2),),
            nursery=nursery,
            connect=connect,
        )
        tp = TopicPartition(topic="r", partition=0)
        assert await high_watermarks({tp: 7}) == {tp: 10}
        # deleted and created again: its leader (at epoch 0 again) has two records
        topics["r"] = new
        control.learn({PartitionKey(topic_id=new.topic_id, partition=0): first})
        told[0] = 2
        assert await high_watermarks({tp: 7}) == {tp: 2}
        nursery.cancel_scope.cancel()


async def test_a_wiped_follower_rejoins_every_isr_of_its_leader(tmp_path: Path) -> None:
    """A broker back on a wiped disk registers a new log directory; its leader learns it when
    the broker first fetches with it (or when it is elected for another partition, which reads
    the directories again) and every partition it leads must learn it then: one that kept the
    old directory never takes the replica back into its ISR, under-replicated for good."""
    other = TopicPlacement.of(topic="q", assignment=((1, 2),), topic_id=uuid.uuid4())
    other_key = PartitionKey(topic_id=other.topic_id, partition=0)
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        store = cluster.store
        store.placement["q"] = other
        store.elect(leader=1, epoch=0, isr=[1])  # broker 2 is down
        await cluster.start(1)
        one = cluster.nodes[1].manager
        assert one is not None
        await until(lambda: KEY in one.led)
        store.dirs[2] = uuid.uuid4()  # broker 2 comes back on a wiped disk
        # broker 1 is elected for another partition meanwhile (it reads the directories)
        store.states[other_key] = PartitionState(
            leader=1,
            leader_epoch=0,
            isr=(IsrEntry(broker_id=1, log_dir=store.dirs[1]),),
            version=0,
        )
        store._notify()
        await until(lambda: other_key in one.led)
        await cluster.start(2)
        await until(lambda: store.states[other_key].in_sync(2))
        await until(lambda: store.isr() == [1, 2])


async def test_a_fetcher_left_with_nothing_to_fetch_does_not_spin(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A follower's partition of a topic deleted meanwhile is no longer fetched (its log is
    closed), but its leader's fetcher lives on while the state names that leader; a partition
    it paused once (the leader answered UNKNOWN_TOPIC_ID as the topic went) must not make it
    wake up every 10 ms for the rest of the broker's life."""
    rounds = 0

    class Manager:
        broker_id = 1
        followed_more = trio.Event()

        def followed_at(self, leader: int) -> dict[PartitionKey, object]:
            nonlocal rounds
            rounds += 1
            return {}

        @asynccontextmanager
        async def connect(self, leader: int) -> AsyncIterator[object]:
            yield object()

    fetcher = ReplicaFetcher(manager=Manager(), leader=2)  # type: ignore[arg-type]
    fetcher.paused[KEY] = trio.current_time() + BACKOFF  # its last answer said wait
    with trio.move_on_after(10):
        await fetcher.run()
    assert rounds <= 10 / BACKOFF + 1


async def test_a_broker_elected_for_many_partitions_reads_the_log_directories_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that takes over a dead broker's partitions becomes leader of many at once (at
    the default 10,000 partitions a broker, thousands); each one reading every broker's
    registration from the store again (two round trips, one after the other) would put
    seconds between the first new leader and the last. A map read within the last second
    serves them all: a follower that fetches with a directory it does not name has it read
    again."""
    many = TopicPlacement.of(topic="m", assignment=((1, 2),) * 20, topic_id=uuid.uuid4())
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        store = cluster.store
        store.placement["m"] = many
        entry = IsrEntry(broker_id=1, log_dir=store.dirs[1])
        for partition in range(20):
            key = PartitionKey(topic_id=many.topic_id, partition=partition)
            store.states[key] = PartitionState(leader=1, leader_epoch=0, isr=(entry,), version=0)
        reads = 0
        read = FakeClusterStore.broker_dirs

        async def counted(self: FakeClusterStore) -> Mapping[int, uuid.UUID]:
            nonlocal reads
            reads += 1
            return await read(self)

        monkeypatch.setattr(FakeClusterStore, "broker_dirs", counted)
        await cluster.start(1)
        one = cluster.nodes[1].manager
        assert one is not None
        assert len(one.led) == 20
        assert reads == 1
