"""The replica runtime (broker/replicas.py, replica_serve.py, replica_fetcher.py; DESIGN37 §2.4)
on in-process brokers with real partition logs and a stand-in store (tests/broker/
replica_cluster.py): a follower copies its leader, truncates where its log diverges, acks=all
waits for the in-sync replicas and is refused with nothing written when they are too few,
consumers read up to the high watermark, a change of leader ends the waits, and REPLICA_FETCH
is refused under another epoch and held while there is nothing new."""

from __future__ import annotations

import uuid
from pathlib import Path

import trio

from protocol import (
    ErrorCode,
    ListOffsetsRequest,
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
)
from protocol.topic_configs import MIN_INSYNC_REPLICAS
from tests.broker.replica_cluster import DEADLINE, KEY, TP, open_cluster, until


async def test_a_follower_catches_up_and_joins_the_isr(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        cluster.store.elect(leader=1, epoch=0, isr=[1])
        await cluster.start(1)
        leader = cluster.nodes[1]
        for offset, value in enumerate((b"a", b"b", b"c")):
            assert await leader.produce(value, acks=1) == (ErrorCode.NONE, offset)
        await cluster.start(2)
        follower = cluster.nodes[2]
        await until(lambda: follower.end() == 3 and cluster.store.isr() == [1, 2])
        assert await follower.values() == [b"a", b"b", b"c"]
        # the follower learned the leader's epochs from the answers, not from the batches
        epochs = (await follower.log.partitions[TP].leader_epochs()).entries
        assert epochs == (await leader.log.partitions[TP].leader_epochs()).entries
        assert [(e.epoch, e.start_offset) for e in epochs] == [(0, 0)]
        assert cluster.store.states[KEY].version == 1  # the leader's one ISR write


async def test_acks_all_is_answered_once_every_in_sync_replica_has_the_records(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path, [1, 2, 3]) as cluster:
        cluster.store.elect(leader=1, epoch=0, isr=[1, 2, 3])
        for b in (1, 2, 3):
            await cluster.start(b)
        code, base = await cluster.nodes[1].produce(b"x", acks=-1)
        assert (code, base) == (ErrorCode.NONE, 0)
        # the high watermark covered the record: both followers had it
        assert cluster.nodes[2].end() == cluster.nodes[3].end() == 1
        fetched = await cluster.nodes[1].fetch(0)
        assert fetched.high_watermark == 1 and fetched.batches


async def test_acks_all_below_min_insync_is_refused_with_nothing_written(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, [1, 2, 3], ((MIN_INSYNC_REPLICAS, "2"),)) as cluster:
        cluster.store.elect(leader=1, epoch=0, isr=[1])
        await cluster.start(1)
        leader = cluster.nodes[1]
        assert await leader.produce(b"x", acks=-1) == (ErrorCode.NOT_ENOUGH_REPLICAS, -1)
        assert leader.end() == 0
        assert await leader.produce(b"y", acks=1) == (ErrorCode.NONE, 0)


async def test_reads_stop_at_the_high_watermark_and_only_the_leader_serves(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        cluster.store.elect(leader=1, epoch=0, isr=[1, 2])
        await cluster.start(1)
        leader = cluster.nodes[1]
        # broker 2 is in the ISR but not fetching: it holds the high watermark at 0
        assert await leader.produce(b"a", acks=1) == (ErrorCode.NONE, 0)
        below = await leader.fetch(0)
        assert (below.error_code, below.high_watermark, below.batches) == (ErrorCode.NONE, 0, b"")
        at_end = await leader.fetch(1)  # in (HW, LEO]: empty, not out of range
        assert (at_end.error_code, at_end.batches) == (ErrorCode.NONE, b"")
        assert (await leader.fetch(2)).error_code is ErrorCode.OFFSET_OUT_OF_RANGE
        assert (await leader.fetch(0, epoch=1)).error_code is ErrorCode.UNKNOWN_LEADER_EPOCH
        listed = await leader.log.list_offsets(ListOffsetsRequest(topic="r", partition=0), 2)
        assert listed.high_watermark == 0
        assert leader.log.log_end_offset(TP) == 0  # what the coordinator checks commits by
        # acks=all waits for broker 2, in vain
        assert await leader.produce(b"b", acks=-1, timeout_ms=200) == (
            ErrorCode.REQUEST_TIMED_OUT,
            -1,
        )
        await cluster.start(2)
        follower = cluster.nodes[2]
        await until(lambda: leader.log.log_end_offset(TP) == 2)
        assert follower.log.log_end_offset(TP) is None
        served = await follower.fetch(0)
        assert (served.error_code, served.leader_id) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, 1)
        old = await follower.fetch(0, api_version=2)
        assert old.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert await follower.produce(b"c", acks=1) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)
        assert follower.end() == 2


async def test_a_follower_truncates_where_its_log_diverges_from_the_new_leaders(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        one, two = cluster.nodes[1], cluster.nodes[2]
        # epoch 0: broker 2 leads alone; broker 1 copies "a", then stops
        cluster.store.elect(leader=2, epoch=0, isr=[2])
        await cluster.start(2)
        await cluster.start(1)
        assert await two.produce(b"a", acks=1) == (ErrorCode.NONE, 0)
        await until(lambda: one.end() == 1)
        cluster.stop(1)
        assert await two.produce(b"b", acks=1) == (ErrorCode.NONE, 1)  # never copied
        cluster.stop(2)
        # epoch 1: broker 1 leads (an unclean election: "b" is lost) and takes "c", "d"
        cluster.store.elect(leader=1, epoch=1, isr=[1])
        await cluster.start(1)
        assert await one.produce(b"c", acks=1) == (ErrorCode.NONE, 1)
        assert await one.produce(b"d", acks=1) == (ErrorCode.NONE, 2)
        # broker 2 comes back as a follower: its "b" (epoch 0 past offset 1) goes
        await cluster.start(2)
        await until(lambda: two.end() == 3 and cluster.store.isr() == [1, 2])
        assert await two.values() == [b"a", b"c", b"d"]
        epochs = (await two.log.partitions[TP].leader_epochs()).entries
        assert [(e.epoch, e.start_offset) for e in epochs] == [(0, 0), (1, 1)]


async def test_a_new_leader_ends_the_old_leaders_waits(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        cluster.store.elect(leader=1, epoch=0, isr=[1, 2])
        await cluster.start(1)
        answers: list[tuple[int, int]] = []

        async def produce() -> None:
            answers.append(await cluster.nodes[1].produce(b"x", acks=-1, timeout_ms=60_000))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            await until(lambda: cluster.nodes[1].end() == 1)
            assert answers == []  # waiting for broker 2
            with trio.fail_after(DEADLINE):
                cluster.store.elect(leader=2, epoch=1, isr=[2])
                while not answers:
                    await trio.sleep(0.01)
        assert answers == [(ErrorCode.NOT_LEADER_OR_FOLLOWER, -1)]
        # broker 1 follows broker 2 now: it serves nothing
        assert (await cluster.nodes[1].fetch(0)).error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER


def _replica_fetch(
    leader_epoch: int, fetch_offset: int = 0, *, topic_id: uuid.UUID = KEY.topic_id
) -> ReplicaFetchRequest:
    return ReplicaFetchRequest(
        replica_id=2,
        log_dir=uuid.uuid4(),
        max_wait_ms=300,
        max_bytes=1 << 20,
        partitions=(
            ReplicaFetchPartition(
                topic_id=topic_id,
                partition=0,
                leader_epoch=leader_epoch,
                fetch_offset=fetch_offset,
                last_fetched_epoch=-1 if fetch_offset == 0 else 3,
            ),
        ),
    )


async def test_replica_fetch_checks_the_epoch_and_holds_an_idle_fetch(tmp_path: Path) -> None:
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        cluster.store.elect(leader=1, epoch=3, isr=[1])
        await cluster.start(1)
        manager = cluster.nodes[1].manager
        assert manager is not None

        async def code(request: ReplicaFetchRequest) -> ErrorCode:
            answer = await manager.replica_fetch(request)
            assert isinstance(answer, ReplicaFetchResponse)
            return answer.partitions[0].error_code

        assert await code(_replica_fetch(2)) is ErrorCode.FENCED_LEADER_EPOCH
        assert await code(_replica_fetch(4)) is ErrorCode.UNKNOWN_LEADER_EPOCH
        other = _replica_fetch(3, topic_id=uuid.uuid4())
        assert await code(other) is ErrorCode.UNKNOWN_TOPIC_ID
        # nothing to send: held for max_wait_ms, then answered empty with the HW
        began = trio.current_time()
        idle = await manager.replica_fetch(_replica_fetch(3))
        assert trio.current_time() - began >= 0.3
        data = idle.partitions[0]
        assert (data.error_code, data.batches, data.high_watermark) == (ErrorCode.NONE, b"", 0)
        # a record produced while a fetch is held is in its answer
        async with trio.open_nursery() as nursery:
            answers: list[ReplicaFetchResponse] = []

            async def fetch() -> None:
                answers.append(await manager.replica_fetch(_replica_fetch(3)))

            nursery.start_soon(fetch)
            await trio.sleep(0.05)
            assert await cluster.nodes[1].produce(b"z", acks=1) == (ErrorCode.NONE, 0)
        data = answers[0].partitions[0]
        assert data.batches
        assert [(e.epoch, e.start_offset) for e in data.epoch_starts] == [(3, 0)]
        # the follower's own broker has no leader of the partition: it refuses
        await cluster.start(2)
        follower = cluster.nodes[2].manager
        assert follower is not None
        answer = await follower.replica_fetch(_replica_fetch(3))
        assert answer.partitions[0].error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_followers_that_fall_behind_leave_the_isr_and_fail_the_waits(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path, [1, 2, 3], ((MIN_INSYNC_REPLICAS, "2"),)) as cluster:
        cluster.store.elect(leader=1, epoch=0, isr=[1, 2, 3])
        await cluster.start(1, replica_lag=0.5)
        began = trio.current_time()
        # brokers 2 and 3 never fetch: after the lag both leave, in one ISR write, and the
        # record appended meanwhile is not acknowledged
        answer = await cluster.nodes[1].produce(b"x", acks=-1, timeout_ms=30_000)
        assert answer == (ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, -1)
        assert trio.current_time() - began >= 0.5
        assert cluster.store.isr() == [1]
        assert cluster.nodes[1].end() == 1
        # and from now on nothing more is written
        assert await cluster.nodes[1].produce(b"y", acks=-1) == (ErrorCode.NOT_ENOUGH_REPLICAS, -1)
        assert cluster.nodes[1].end() == 1
