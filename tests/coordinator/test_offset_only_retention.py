"""A group that only a standalone committer used (OffsetCommit with no member, generation -1:
``groups reset-offsets`` on a new group, the Spark sink) is listed as Empty and removed with its
offsets the retention period after its last commit; after a failover, after the instant the new
coordinator took office (docs/design.md#group-retention). Virtual time: retention 100 s, checked
every 10 s from the coordinator's load (at 0.0, or when it took office again)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
import trio.testing

from protocol import (
    DescribeGroupRequest,
    DescribeGroupResponse,
    ErrorCode,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
)
from protocol.types import PartitionOffset
from simulation import SimulatedCluster, open_simulated_cluster
from tests.coordinator.test_group_retention import CONFIG, TP


async def _commit(cluster: SimulatedCluster, group: str, offset: int) -> None:
    offsets = (PartitionOffset(topic=TP.topic, partition=TP.partition, offset=offset),)
    async with cluster.open_client() as client:
        response = await client.request(
            OffsetCommitRequest(group_id=group, consumer_id=None, generation=-1, offsets=offsets)
        )
    assert isinstance(response, OffsetCommitResponse)
    assert response.error_code is ErrorCode.NONE


@asynccontextmanager
async def _committed_at_5(tmp_path: Path, group: str) -> AsyncIterator[SimulatedCluster]:
    """A cluster in which a standalone committer committed offset 10 for ``group`` at 5.0."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic(TP.topic, partitions=1)
        await trio.sleep_until(5.0)
        await _commit(cluster, group, 10)
        yield cluster


async def _listed(cluster: SimulatedCluster) -> dict[str, str]:
    """What ListGroups shows: each group's state by id."""
    async with cluster.open_client() as client:
        response = await client.request(ListGroupsRequest())
    assert isinstance(response, ListGroupsResponse)
    assert response.error_code is ErrorCode.NONE
    return {g.group_id: g.state for g in response.groups}


async def _described(cluster: SimulatedCluster, group: str) -> DescribeGroupResponse:
    async with cluster.open_client() as client:
        response = await client.request(DescribeGroupRequest(group_id=group))
    assert isinstance(response, DescribeGroupResponse)
    return response


async def _removed_at(cluster: SimulatedCluster, group: str, at: float) -> None:
    """Still there (listed, offsets in the store) just before ``at``; gone at ``at``."""
    await trio.sleep_until(at - 0.1)
    assert (await _listed(cluster)).get(group) == "Empty"
    assert TP in await cluster.store.fetch_offsets(group)
    await trio.sleep_until(at)
    await trio.testing.wait_all_tasks_blocked()
    assert trio.current_time() == at
    assert await cluster.store.fetch_offsets(group) == {}
    assert group not in await cluster.store.offset_only_groups()
    assert group not in await _listed(cluster)
    assert (await _described(cluster, group)).error_code is ErrorCode.GROUP_ID_NOT_FOUND


async def test_a_standalone_committers_group_is_listed_and_removed_after_its_last_commit(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with _committed_at_5(tmp_path, "reset") as cluster:
        assert await _listed(cluster) == {"reset": "Empty"}
        described = await _described(cluster, "reset")
        assert (described.state, described.offsets) == (
            "Empty",
            (PartitionOffset(topic="events", partition=0, offset=10),),
        )
        # Committed at 5.0: the first check at or after 105.0 removes it.
        await _removed_at(cluster, "reset", 110.0)


async def test_a_later_commit_puts_the_removal_off(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with _committed_at_5(tmp_path, "sink") as cluster:
        await trio.sleep_until(50.0)
        await _commit(cluster, "sink", 20)
        await trio.sleep_until(130.0)  # past 5.0 + 100: kept for the commit at 50.0
        assert await _listed(cluster) == {"sink": "Empty"}
        await _removed_at(cluster, "sink", 150.0)


async def test_after_a_restart_the_group_is_known_and_counted_from_taking_office(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with _committed_at_5(tmp_path, "reset") as cluster:
        await trio.sleep_until(60.0)
        await cluster.restart_coordinator(down_for=1.0)  # in office again at 61.0
        assert cluster.coordinator.took_office_at == 61.0
        assert await _listed(cluster) == {"reset": "Empty"}
        await trio.sleep_until(130.0)  # past 5.0 + 100: its last commit is unknown now
        assert await _listed(cluster) == {"reset": "Empty"}
        # Counted from 61.0, checked every 10 s from 61.0.
        await _removed_at(cluster, "reset", 161.0)


async def test_a_group_that_gets_a_member_is_counted_by_its_members(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with _committed_at_5(tmp_path, "g") as cluster:
        assert await _listed(cluster) == {"g": "Empty"}
        await trio.sleep_until(50.0)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        await cluster.wait_stable("g", members=1)
        assert a.positions[TP] == 10  # it starts from the standalone commit
        await trio.sleep_until(120.0)  # past 5.0 + 100, with a member all along
        assert await _listed(cluster) == {"g": "Stable"}
        await a.kill()  # closed cleanly: empty from 120.0, nothing under lease
        # Empty from 120.0, not from the commit at 5.0: removed at the first check after 220.0.
        await _removed_at(cluster, "g", 220.0)
