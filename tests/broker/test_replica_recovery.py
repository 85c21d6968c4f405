"""The replica runtime with what outlives a process (tests/broker/replica_cluster.py's
in-process brokers): a follower whose leader's log now starts past its end starts its own log
there and catches up; a damaged file of one partition stops that partition, not the broker."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.log import read_high_watermarks
from broker.log.epochs import LEADER_EPOCHS
from broker.replica_fetcher import BACKOFF
from protocol import ErrorCode
from protocol.topic_configs import RETENTION_BYTES, SEGMENT_BYTES
from tests.broker.replica_cluster import KEY, TP, Node, open_cluster, until

#: Segments of a few records, of which retention keeps about two.
SMALL_SEGMENTS = ((SEGMENT_BYTES, "300"), (RETENTION_BYTES, "600"))


def leads(node: Node, epoch: int) -> bool:
    led = None if node.manager is None else node.manager.leading(TP)
    return led is not None and led.epoch == epoch


async def test_a_follower_behind_the_leaders_log_start_starts_there_and_catches_up(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path, [1, 2], SMALL_SEGMENTS) as cluster:
        one, two = cluster.nodes[1], cluster.nodes[2]
        cluster.store.elect(leader=1, epoch=0, isr=[1, 2])
        await cluster.start(1)
        await cluster.start(2)
        for value in (b"a", b"b", b"c"):
            assert (await one.produce(value, acks=-1))[0] is ErrorCode.NONE
        assert two.end() == 3
        cluster.stop(2)
        # broker 2 is away while broker 1 takes more, under a new epoch too, and retention
        # deletes every record broker 2 has and those after it
        cluster.store.elect(leader=1, epoch=1, isr=[1])
        await until(lambda: leads(one, epoch=1))
        for i in range(40):
            assert (await one.produce(b"v%02d" % i, acks=1))[0] is ErrorCode.NONE
        assert await one.log.enforce_retention() > 0
        leader_log = one.log.partitions[TP]
        start = leader_log.log_start_offset
        assert start > two.end()
        await cluster.start(2)
        await until(lambda: two.end() == one.end())
        follower_log = two.log.partitions[TP]
        assert follower_log.log_start_offset == start
        assert await two.values() == await one.values()
        # its epochs are the leader's from its new start on, none of its old ones
        assert (await follower_log.leader_epochs()).entries == (
            await leader_log.leader_epochs()
        ).entries
        # the high watermark it wrote down is one of the new log's
        assert two.manager is not None
        marks = read_high_watermarks(two.log.directory)
        assert start <= marks[KEY] <= two.end()
        await until(lambda: cluster.store.isr() == [1, 2])


async def test_a_damaged_epoch_file_stops_that_partition_only_until_it_is_repaired(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        one, two = cluster.nodes[1], cluster.nodes[2]
        cluster.store.elect(leader=1, epoch=0, isr=[1])
        await cluster.start(1)
        for value in (b"a", b"b", b"c"):
            assert (await one.produce(value, acks=1))[0] is ErrorCode.NONE
        follower_log = await two.log.partition(TP.topic, TP.partition, KEY.topic_id)
        assert follower_log is not None
        damaged = follower_log.directory / LEADER_EPOCHS
        damaged.write_text("not a checkpoint")
        await cluster.start(2)
        await trio.sleep(2 * BACKOFF)
        # broker 2 goes on (its fetcher, its manager), fetching nothing into that log
        assert two.manager is not None and two.end() == 0
        damaged.unlink()  # the operator's repair
        await until(lambda: two.end() == 3)
        assert await two.values() == [b"a", b"b", b"c"]
