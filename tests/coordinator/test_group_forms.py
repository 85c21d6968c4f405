"""A group of consumers forms, reaches Stable, and splits its topics (virtual time)."""

from pathlib import Path

import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol.types import TopicPartition
from simulation import open_simulated_cluster

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0)


async def test_a_group_of_five_reaches_stable_after_the_initial_delay(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=12)
        start = trio.current_time()
        consumers = [
            await cluster.start_consumer(f"c{i}", group="g", topics={"events": 1}) for i in range(5)
        ]
        generation = await cluster.wait_stable("g", members=5)
        # one rebalance, begun exactly when the initial delay after the first join ran out;
        # in-memory round trips take no virtual time
        assert trio.current_time() - start == 3.0
        assert generation == 1
        owned = [c.owned for c in consumers]
        assert sorted(len(o) for o in owned) == [2, 2, 2, 3, 3]
        assert set().union(*owned) == {
            TopicPartition(topic="events", partition=p) for p in range(12)
        }
        assert sum(len(o) for o in owned) == 12
        cluster.ledger.check()
