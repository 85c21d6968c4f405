"""``coordinator cluster`` shows a user the cluster through any broker: every broker, which are
up, which coordinator slots each holds and how many partitions it serves
(docs/design.md#coordinator-slots). Brokers run in this process on real ZooKeeper; the CLI runs
as real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.cluster import agreed_coordinator, eventually
from statemachine.slots import DEFAULT_SLOTS
from tests.support.node_cluster import cluster, ids
from tests.zookeeper.test_cluster_clients import CONFIG, DEADLINE, cli, cli_json

pytestmark = pytest.mark.realtime


async def test_the_cluster_view_names_every_broker_its_slots_and_who_is_down(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with cluster(zookeeper_hosts, tmp_path, CONFIG, 3) as brokers:
        coordinator_id = await agreed_coordinator(ids(brokers), deadline=DEADLINE)
        await cli(brokers[0], "topics", "create", "t", "--partitions", "6")
        all_slots = list(range(DEFAULT_SLOTS))
        for broker in brokers:
            view = await cli_json(broker, "cluster")
            assert view["slots"] == DEFAULT_SLOTS
            assert [
                (b["broker"], b["up"], b["port"], b["slots"], b["partitions"])
                for b in view["brokers"]
            ] == [
                (b.broker_id, True, b.port, all_slots if b.broker_id == coordinator_id else [], 2)
                for b in brokers
            ]
        table = await cli(brokers[1], "cluster")
        assert table.splitlines()[0] == f"{DEFAULT_SLOTS} coordinator slots"
        assert f"{DEFAULT_SLOTS}: 0-{DEFAULT_SLOTS - 1}" in table

        follower = next(b for b in brokers if b.broker_id != coordinator_id)
        asked = next(b for b in brokers if b is not follower)
        follower.scope.cancel()

        async def follower_is_down() -> bool:
            view = await cli_json(asked, "cluster")
            return {b["broker"]: b["up"] for b in view["brokers"]} == {
                b.broker_id: b is not follower for b in brokers
            }

        await eventually(follower_is_down, deadline=DEADLINE)
        view = await cli_json(asked, "cluster")
        down = next(b for b in view["brokers"] if b["broker"] == follower.broker_id)
        assert (down["host"], down["port"], down["partitions"]) == (None, None, 2)
