"""The replica runtime with what outlives a process (tests/broker/replica_cluster.py's
in-process brokers): a follower whose leader's log now starts past its end starts its own log
there and catches up; a damaged file of one partition stops that partition, not the broker;
brokers restarted from their logs and high-watermark checkpoints serve no more than the
checkpoint says, lose nothing acknowledged, and truncate at epoch boundaries."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.log import read_high_watermarks, write_high_watermarks
from broker.log.epochs import LEADER_EPOCHS
from broker.replica_fetcher import BACKOFF
from protocol import ErrorCode, ListOffsetsRequest
from protocol.batches import records_from_batches
from protocol.topic_configs import RETENTION_BYTES, SEGMENT_BYTES, UNCLEAN_LEADER_ELECTION
from tests.broker.replica_cluster import KEY, TP, Cluster, Node, open_cluster, until

#: Segments of a few records, of which retention keeps about two.
SMALL_SEGMENTS = ((SEGMENT_BYTES, "300"), (RETENTION_BYTES, "600"))


def leads(node: Node, epoch: int) -> bool:
    led = None if node.manager is None else node.manager.leading(TP)
    return led is not None and led.epoch == epoch


def high_watermark(node: Node) -> int:
    led = None if node.manager is None else node.manager.leading(TP)
    return -1 if led is None else led.high_watermark


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


# --- restarts from the high-watermark checkpoint ---------------------------------------------


async def acknowledged_then_away(cluster: Cluster, *values: bytes) -> None:
    """Broker 1 leads under epoch 0 with broker 2 in sync, ``values`` are acknowledged by both
    (acks=all), and broker 2 stops."""
    cluster.store.elect(leader=1, epoch=0, isr=[1, 2])
    await cluster.start(1)
    await cluster.start(2)
    for offset, value in enumerate(values):
        assert await cluster.nodes[1].produce(value, acks=-1) == (ErrorCode.NONE, offset)
    cluster.stop(2)


async def test_a_restarted_leader_serves_up_to_its_checkpointed_high_watermark(
    tmp_path: Path,
) -> None:
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        one, two = cluster.nodes[1], cluster.nodes[2]
        await acknowledged_then_away(cluster, b"a", b"b")
        # broker 2 in the ISR but away: "c" is in broker 1's log, past its high watermark
        assert await one.produce(b"c", acks=1) == (ErrorCode.NONE, 2)
        await cluster.reopen(1)
        assert read_high_watermarks(one.log.directory) == {KEY: 2}
        cluster.store.elect(leader=1, epoch=1, isr=[1, 2])
        await cluster.start(1)
        assert one.end() == 3
        served = await one.fetch(0)
        assert (served.error_code, served.high_watermark) == (ErrorCode.NONE, 2)
        assert [r.value for r in records_from_batches(served.batches)] == [b"a", b"b"]
        past = await one.fetch(2)  # in (HW, LEO]: empty, not out of range
        assert (past.error_code, past.batches) == (ErrorCode.NONE, b"")
        listed = await one.log.list_offsets(ListOffsetsRequest(topic=TP.topic, partition=0), 2)
        assert listed.high_watermark == 2
        # broker 2 comes back and copies "c" (of epoch 0, which epoch 1's leader still has)
        await cluster.start(2)
        await until(lambda: two.end() == 3)
        await until(lambda: high_watermark(one) == 3)  # at broker 2's next fetch
        served = await one.fetch(0)
        assert [r.value for r in records_from_batches(served.batches)] == [b"a", b"b", b"c"]
        assert await two.values() == [b"a", b"b", b"c"]


async def test_a_follower_restarted_from_an_old_checkpoint_truncates_to_the_epoch_boundary(
    tmp_path: Path,
) -> None:
    """KIP-101's case: a follower whose high-watermark checkpoint is behind its log, restarted
    and elected, keeps what was acknowledged; the old leader, restarted, truncates what it alone
    had at the boundary of the new leader's epoch, not at its high watermark (KIP-101, KIP-279)."""
    async with open_cluster(tmp_path, [1, 2]) as cluster:
        one, two = cluster.nodes[1], cluster.nodes[2]
        await acknowledged_then_away(cluster, b"m0", b"m1")
        assert await one.produce(b"m2", acks=1) == (ErrorCode.NONE, 2)  # broker 1's alone
        # broker 2 crashed before it wrote the high watermark it learned last (every 5 s)
        await cluster.reopen(2)
        write_high_watermarks(two.log.directory, {KEY: 1})
        # broker 1 dies, and broker 2 restarts following it (in vain) until it is elected
        await cluster.reopen(1)
        assert read_high_watermarks(one.log.directory) == {KEY: 2}
        await cluster.start(2)
        assert two.manager is not None and KEY in two.manager.following
        cluster.store.elect(leader=2, epoch=1, isr=[2])
        # nothing acknowledged is lost: m1 stays though the checkpoint said 1
        await until(lambda: leads(two, epoch=1))
        assert await two.values() == [b"m0", b"m1"]
        assert await two.produce(b"m3", acks=-1) == (ErrorCode.NONE, 2)
        served = await two.fetch(0)
        assert [r.value for r in records_from_batches(served.batches)] == [b"m0", b"m1", b"m3"]
        # broker 1 restarts as a follower: its m2 (epoch 0 past offset 2, where epoch 1 starts
        # at the new leader) goes, m3 comes
        await cluster.start(1)
        await until(lambda: cluster.store.isr() == [2, 1])
        assert await one.values() == [b"m0", b"m1", b"m3"]
        epochs = (await one.log.partitions[TP].leader_epochs()).entries
        assert [(e.epoch, e.start_offset) for e in epochs] == [(0, 0), (1, 2)]
        assert two.manager is not None
        await until(lambda: two.manager is not None and two.manager.high_watermarks()[KEY] == 3)


async def test_a_follower_restarted_and_elected_serves_up_to_the_high_watermark_it_wrote(
    tmp_path: Path,
) -> None:
    """Elected with another in-sync replica that has not fetched from it yet, a broker restarted
    from its checkpoint serves no further than the checkpoint says until that replica fetches."""
    async with open_cluster(tmp_path, [1, 2, 3]) as cluster:
        one, two = cluster.nodes[1], cluster.nodes[2]
        cluster.store.elect(leader=1, epoch=0, isr=[1, 2, 3])
        for broker in (1, 2, 3):
            await cluster.start(broker)
        for offset, value in enumerate((b"m0", b"m1")):
            assert await one.produce(value, acks=-1) == (ErrorCode.NONE, offset)
        cluster.stop(3)
        await cluster.reopen(2)
        write_high_watermarks(two.log.directory, {KEY: 1})  # written before it learned 2
        await cluster.reopen(1)  # broker 1 dies
        cluster.store.elect(leader=2, epoch=1, isr=[2, 3])
        await cluster.start(2)
        await until(lambda: leads(two, epoch=1))
        served = await two.fetch(0)
        assert (served.error_code, served.high_watermark) == (ErrorCode.NONE, 1)
        assert [r.value for r in records_from_batches(served.batches)] == [b"m0"]
        assert (await two.fetch(1)).batches == b""
        # broker 3, in sync, fetches from the new leader: m1 was acknowledged, and is served
        await cluster.start(3)
        await until(lambda: high_watermark(two) == 2)
        served = await two.fetch(0)
        assert [r.value for r in records_from_batches(served.batches)] == [b"m0", b"m1"]


async def test_a_follower_that_agrees_on_nothing_it_has_with_its_leader_starts_over(
    tmp_path: Path,
) -> None:
    """A log started past where it parts from the new leader's (that leader elected uncleanly
    with a shorter log) cannot be truncated there: it starts over at that point."""
    configs = (*SMALL_SEGMENTS, (UNCLEAN_LEADER_ELECTION, "true"))
    async with open_cluster(tmp_path, [1, 2, 3], configs) as cluster:
        one, two, three = cluster.nodes[1], cluster.nodes[2], cluster.nodes[3]
        cluster.store.elect(leader=1, epoch=0, isr=[1])
        await cluster.start(1)
        for i in range(40):
            assert (await one.produce(b"v%02d" % i, acks=1))[0] is ErrorCode.NONE
        assert await one.log.enforce_retention() > 0
        start = one.log.partitions[TP].log_start_offset
        await cluster.start(2)
        await until(lambda: two.end() == one.end())
        assert two.log.partitions[TP].log_start_offset == start
        # broker 1 is lost; broker 3, which never had a record, is elected uncleanly
        cluster.stop(1)
        cluster.store.elect(leader=3, epoch=1, isr=[3])
        await cluster.start(3)
        await until(lambda: leads(three, epoch=1))
        assert await three.produce(b"x", acks=1) == (ErrorCode.NONE, 0)
        await until(lambda: two.end() == 1)
        assert two.log.partitions[TP].log_start_offset == 0
        assert await two.values() == [b"x"]
