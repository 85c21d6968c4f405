"""DescribeGroup and OffsetFetch call an offset committed only once it is durable.

Offsets reported in Ping answers are accepted at once but written by the committer at its
interval; a coordinator that dies in between loses them. Shown as committed before they are
written, they would seem to go backwards after a crash (docs/design.md#offsets).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol import (
    DescribeGroupRequest,
    DescribeGroupResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from protocol.types import TopicPartition
from simulation import SimulatedCluster, open_simulated_cluster


async def _describe(cluster: SimulatedCluster) -> tuple[list[int], list[int]]:
    """(committed, reported) offsets of partition t-0, as DescribeGroup answers them."""
    async with cluster.open_client() as client:
        response = await client.request(DescribeGroupRequest(group_id="g"))
    assert isinstance(response, DescribeGroupResponse)
    return [po.offset for po in response.offsets], [po.offset for po in response.reported_offsets]


async def _fetched(cluster: SimulatedCluster, tp: TopicPartition) -> int:
    """What a consumer restarting now would read as its committed offset of ``tp``."""
    async with cluster.open_client() as client:
        response = await client.request(OffsetFetchRequest(group_id="g", partitions=(tp,)))
    assert isinstance(response, OffsetFetchResponse)
    (offset,) = response.offsets
    return offset.offset


async def test_a_reported_offset_is_shown_as_reported_until_the_committer_writes_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = CoordinatorConfig(initial_rebalance_delay=3.0, commit_interval=10.0)
    t0 = TopicPartition(topic="t", partition=0)
    async with open_simulated_cluster(tmp_path, config) as cluster:
        await cluster.create_topic("t", partitions=1)
        await cluster.start_consumer("a", group="g", topics={"t": 1})
        with trio.fail_after(30):
            await cluster.wait_settled()
        assert trio.current_time() == 3.0
        cluster.nursery.start_soon(partial(cluster.feed, "t", every=2.0))  # 3.0, 5.0, 7.0...

        # The Ping of 4.0 (T = 6 s: one every 2 s) reported offset 1; the committer has not
        # written anything since it started at 0.0.
        await trio.sleep_until(4.5)
        assert await _describe(cluster) == ([], [1])
        assert await _fetched(cluster, t0) == -1

        # The committer wrote at 10.0, just before the Ping of 10.0 reported 4.
        await trio.sleep_until(10.5)
        assert await _describe(cluster) == ([3], [4])
        assert await _fetched(cluster, t0) == 3

        await trio.sleep_until(20.5)
        assert await _describe(cluster) == ([8], [9])
        assert await _fetched(cluster, t0) == 8
