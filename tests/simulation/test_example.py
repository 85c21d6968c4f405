from pathlib import Path

import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol.types import Subscription, TopicPartition
from simulation import open_simulated_cluster


async def test_a_long_gc_pause_hands_the_partitions_over_safely(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = CoordinatorConfig(initial_rebalance_delay=3.0)
    async with open_simulated_cluster(tmp_path, config) as cluster:
        await cluster.create_topic("clicks", partitions=6)
        wanted = Subscription(pattern=r"clicks|views", pattern_streams=1)
        a = await cluster.start_consumer("a", group="web", subscription=wanted)
        b = await cluster.start_consumer("b", group="web", subscription=wanted)
        with trio.fail_after(30):  # virtual seconds: a bug fails the test, it does not hang
            await cluster.wait_settled()
        assert trio.current_time() == 3.0  # the group waited its initial rebalance delay
        assert len(a.owned) == len(b.owned) == 3

        await trio.sleep_until(10.5)  # a answered the Ping of 10.0 (T = 6 s: a Ping every 2 s)
        a.freeze(20)  # a 20 s GC pause
        await cluster.create_topic("views", partitions=2)  # matches: the group rebalances
        with trio.fail_after(30):
            await cluster.wait_stable("web", members=1)
        # a missed its StopFetcher deadline at 14.5; the coordinator then waited out a's lease:
        # T + a 0.5 s margin after the last request it sent a (the Ping of 12.0).
        assert trio.current_time() == 18.5
        everything = {TopicPartition(topic="clicks", partition=p) for p in range(6)}
        everything |= {TopicPartition(topic="views", partition=p) for p in range(2)}
        assert b.owned == everything

        with trio.fail_after(60):
            await cluster.wait_settled()  # a wakes at 30.5, its lease long gone, and rejoins
        # a stopped at its lease's end (14.0) and looked for its coordinator again at once; its
        # connection opened when it woke, and the group took it back in that instant.
        assert trio.current_time() == 30.5
        assert a.owned | b.owned == everything and a.owned and b.owned
        await cluster.check_invariants(settled=True)
