"""A crowd joining together causes one rebalance, not hundreds
(docs/design.md#rebalance-triggers)."""

import time
from pathlib import Path

import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from simulation import SimulatedConsumer, open_simulated_cluster
from tests.support.protocols import eager

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
        assert trio.current_time() == 0.999 + 3.0  # the initial delay after the last join
        group = cluster.coordinator.groups["g"]
        assert (generation, group.attempts, group.completed) == (1, 1, 1)
        assert sorted({len(c.owned) for c in consumers}) == [2]
        cluster.ledger.check()
    print(f"{N} consumers to Stable: {time.perf_counter() - real_start:.2f} s real time")


async def test_each_join_while_the_group_forms_restarts_the_initial_delay(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = CoordinatorConfig(initial_rebalance_delay=3.0)
    async with open_simulated_cluster(tmp_path, config) as cluster:
        await cluster.create_topic("events", partitions=12)
        for i in range(6):
            await trio.sleep_until(float(i))  # a join every second, each within the delay
            await cluster.start_consumer(f"c{i}", group="g", topics={"events": 1})
        generation = await cluster.wait_stable("g", members=6)
        assert trio.current_time() == 5.0 + 3.0  # the initial delay after the last join
        group = cluster.coordinator.groups["g"]
        assert (generation, group.attempts, group.completed) == (1, 1, 1)

        await trio.sleep_until(20.0)  # once formed, a join rebalances at once
        await cluster.start_consumer("late", group="g", topics={"events": 1})
        assert await cluster.wait_stable("g", members=7) == 2
        assert trio.current_time() == 20.0
        cluster.ledger.check()


async def test_a_crowd_that_never_stops_joining_rebalances_at_the_cap(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = CoordinatorConfig(initial_rebalance_delay=3.0, initial_rebalance_max_delay=20.0)
    async with open_simulated_cluster(tmp_path, config) as cluster:
        await cluster.create_topic("events", partitions=40)
        group = cluster.coordinator.group("g")
        first_attempt_at: list[float] = []

        async def watch_first_attempt() -> None:
            await group.status.wait_value(lambda status: status[1] >= 1)
            first_attempt_at.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_first_attempt)
            for i in range(20):  # a join every 1.5 s, from 0 to 28.5: never 3 s of quiet
                await trio.sleep_until(1.5 * i)
                await cluster.start_consumer(f"c{i:02}", group="g", topics={"events": 1})
        # the first join was at 0, so the cap ran out at 20.0, when 14 had joined (0 to 19.5)
        assert first_attempt_at == [20.0]
        assert group.completed >= 1
        generation = await cluster.wait_stable("g", members=20)
        # the joins after the first rebalance each rebalanced at once: 21.0 ... 28.5
        assert trio.current_time() == 28.5
        assert generation == 1 + 6
        cluster.ledger.check()


async def test_joins_during_a_slow_rebalance_cause_one_more_not_one_each(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = CoordinatorConfig(initial_rebalance_delay=3.0)
    async with open_simulated_cluster(tmp_path, eager(config)) as cluster:
        await cluster.create_topic("events", partitions=24)

        async def join(consumer_id: str) -> SimulatedConsumer:
            # T = 60 s: no Ping falls within the test, so only Stop/StartFetcher are slow
            consumer: SimulatedConsumer = await cluster.start_consumer(
                consumer_id, group="g", topics={"events": 1}, session_timeout_ms=60_000
            )
            return consumer

        a = await join("a")
        await join("b")
        assert await cluster.wait_stable("g", members=2) == 1
        assert trio.current_time() == 3.0
        a.answer_slowly(1.0)

        await trio.sleep_until(4.0)
        await join("c00")
        # attempt 2 runs from 4.0: a answers its StopFetcher at 5.0 and its StartFetcher at 6.0
        for i in range(1, 11):
            await trio.sleep_until(4.0 + 0.1 * i - 0.05)  # 4.05 ... 4.95: all in flight
            await join(f"c{i:02}")
        assert await cluster.wait_stable("g", members=13) == 3
        # one more attempt for all ten, from 6.0: a answers at 7.0 and 8.0
        assert trio.current_time() == 8.0
        group = cluster.coordinator.groups["g"]
        assert (group.attempts, group.completed) == (3, 3)
        cluster.ledger.check()
