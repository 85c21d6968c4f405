"""A new topic or new partitions rebalance every interested group — including groups with
wildcard subscriptions — and no group that is not interested (docs/design.md#rebalance-triggers).

T = 6 s; a new group's first rebalance waits the initial delay of 3 s.
"""

from pathlib import Path

import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol.types import Subscription, TopicPartition
from simulation import open_simulated_cluster

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0)


def _partitions(topic: str, count: int) -> set[TopicPartition]:
    return {TopicPartition(topic=topic, partition=p) for p in range(count)}


async def test_added_partitions_rebalance_the_group_and_get_owners(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=4)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        b = await cluster.start_consumer("b", group="g", topics={"events": 1})
        with trio.fail_after(10):
            assert await cluster.wait_stable("g", members=2) == 1
        await trio.sleep_until(10.0)
        await cluster.add_partitions("events", added=2)
        with trio.fail_after(5):
            await cluster.wait_settled()
        assert trio.current_time() == 10.0  # a topic change rebalances at once
        assert cluster.coordinator.groups["g"].machine.generation == 2
        assert a.owned | b.owned == _partitions("events", 6)
        assert (len(a.owned), len(b.owned)) == (3, 3)
        await cluster.check_invariants(settled=True)


async def test_a_new_topic_matching_a_whitelist_rebalances_only_the_interested_group(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("metrics.cpu", partitions=2)
        await cluster.create_topic("orders", partitions=2)
        wildcard = Subscription(pattern=r"metrics\..*", pattern_streams=1)
        w1 = await cluster.start_consumer("w1", group="watchers", subscription=wildcard)
        w2 = await cluster.start_consumer("w2", group="watchers", subscription=wildcard)
        o = await cluster.start_consumer("o", group="orders", topics={"orders": 1})
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert w1.owned | w2.owned == _partitions("metrics.cpu", 2)
        await trio.sleep_until(20.0)
        await cluster.create_topic("metrics.disk", partitions=4)
        await cluster.create_topic("payments", partitions=1)  # matches nobody
        with trio.fail_after(5):
            await cluster.wait_settled()
        assert trio.current_time() == 20.0
        assert w1.owned | w2.owned == _partitions("metrics.cpu", 2) | _partitions("metrics.disk", 4)
        assert cluster.coordinator.groups["watchers"].machine.generation == 2
        assert cluster.coordinator.groups["orders"].machine.generation == 1  # not disturbed
        assert o.owned == _partitions("orders", 2)
        await cluster.check_invariants(settled=True)


async def test_a_blacklist_takes_every_topic_but_those_it_matches(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        for topic in ("orders", "internal.audit", "payments"):
            await cluster.create_topic(topic, partitions=2)
        everything_but_internal = Subscription(
            pattern=r"internal\..*", pattern_is_blacklist=True, pattern_streams=1
        )
        a = await cluster.start_consumer("a", group="g", subscription=everything_but_internal)
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert a.owned == _partitions("orders", 2) | _partitions("payments", 2)
        await trio.sleep_until(10.0)
        await cluster.create_topic("internal.metrics", partitions=3)  # excluded: no rebalance
        await cluster.create_topic("refunds", partitions=1)  # not excluded: taken
        with trio.fail_after(5):
            await cluster.wait_settled()
        assert a.owned == (
            _partitions("orders", 2) | _partitions("payments", 2) | _partitions("refunds", 1)
        )
        assert not any(tp.topic.startswith("internal.") for tp in a.owned)
        assert cluster.coordinator.groups["g"].machine.generation == 2
        await cluster.check_invariants(settled=True)
