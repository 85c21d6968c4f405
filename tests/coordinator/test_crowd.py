"""A crowd joining together causes one rebalance, not hundreds (DESIGN.md, "Rebalance triggers")."""

import time
from pathlib import Path

import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from coordinator.testing import open_simulated_cluster

N = 1000  # consumers in the crowd


async def test_a_thousand_consumers_joining_within_a_second_cause_one_rebalance(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    real_start = time.perf_counter()
    config = CoordinatorConfig(initial_rebalance_delay=3.0)
    async with open_simulated_cluster(tmp_path, config) as cluster:
        await cluster.create_topic("events", partitions=2 * N)
        consumers = []
        for i in range(N):
            await trio.sleep_until(i / 1000)  # one join a millisecond, all within one second
            consumers.append(
                await cluster.start_consumer(f"c{i:04}", group="g", topics={"events": 1})
            )
        generation = await cluster.wait_stable("g", members=N)
        assert trio.current_time() == 3.0  # the initial delay after the first join
        group = cluster.coordinator.groups["g"]
        assert (generation, group.attempts, group.completed) == (1, 1, 1)
        assert sorted({len(c.owned) for c in consumers}) == [2]
        cluster.ledger.check()
    print(f"{N} consumers to Stable: {time.perf_counter() - real_start:.2f} s real time")
