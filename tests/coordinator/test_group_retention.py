"""A group that has had no member for the retention period is removed with its offsets, in
memory, in the store and its driver task (docs/design.md#group-retention); one that had a member
within it stays. Virtual time: retention 100 s, checked every 10 s from the coordinator's load
at 0.0."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol.types import TopicPartition
from simulation import open_simulated_cluster
from statemachine.group import GroupState

CONFIG = CoordinatorConfig(
    initial_rebalance_delay=3.0,
    lease_margin=0.5,
    group_retention=100.0,
    group_retention_check_interval=10.0,
)
TP = TopicPartition(topic="events", partition=0)


async def test_a_group_without_members_for_the_retention_period_is_removed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=1)
        a = await cluster.start_consumer("a", group="old", topics={"events": 1})
        await cluster.wait_stable("old", members=1)
        await trio.sleep_until(5.0)
        await a.kill()  # closed cleanly: empty from 5.0, nothing under lease
        group = cluster.coordinator.groups["old"]
        await group.status.wait_value(lambda s: s[0] is GroupState.EMPTY)
        assert group.last_member_at == 5.0
        assert TP in await cluster.store.fetch_offsets("old")  # its position, committed

        with trio.fail_after(1000):
            await group.status.wait_value(lambda s: s[0] is GroupState.DEAD)
        # Empty since 5.0: the first check at or after 105.0 removes it.
        assert trio.current_time() == 110.0
        assert "old" not in cluster.coordinator.groups
        assert "old" not in await cluster.store.groups()
        assert await cluster.store.fetch_offsets("old") == {}
        await trio.sleep(0)
        assert group.scope is None  # its driver task ended


async def test_a_member_within_the_retention_period_keeps_the_group(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=1)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        await cluster.wait_stable("g", members=1)
        await a.kill()
        group = cluster.coordinator.groups["g"]
        await trio.sleep_until(90.0)
        b = await cluster.start_consumer("b", group="g", topics={"events": 1})
        await cluster.wait_stable("g", members=1)
        await trio.sleep_until(150.0)
        await b.kill()  # empty again from 150.0
        with trio.fail_after(1000):
            await group.status.wait_value(lambda s: s[0] is GroupState.DEAD)
        assert trio.current_time() == 250.0
        assert "g" not in cluster.coordinator.groups
