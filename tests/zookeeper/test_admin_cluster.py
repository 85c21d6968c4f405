"""The admin client on a cluster: a call that reaches another broker than the bootstrap one may
be bounded by the caller's own deadline (``trio.fail_after`` around it), as an application
bounds any call, and the admin goes on working after it. Brokers run in this process on real
ZooKeeper, real clock: every wait is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from consumer.admin import open_admin
from coordinator.config import CoordinatorConfig
from protocol.types import TopicPartition
from tests.support.node_cluster import cluster

pytestmark = pytest.mark.realtime

DEADLINE = 60


async def test_a_call_to_another_broker_under_the_callers_deadline(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    config = CoordinatorConfig(coordinator_slots=4, initial_rebalance_delay=0)
    async with (
        cluster(zookeeper_hosts, tmp_path, config, 2) as (one, _two),
        open_admin([one.address]) as admin,
    ):
        with trio.fail_after(DEADLINE):
            await admin.create_topic("far", 1, brokers=[2], replication_factor=1)
        far = TopicPartition(topic="far", partition=0)
        for _ in range(2):  # the second time on the connection the first one opened
            with trio.fail_after(DEADLINE):
                bounds = await admin.log_bounds(["far"])
            assert bounds == {far: (0, 0)}
