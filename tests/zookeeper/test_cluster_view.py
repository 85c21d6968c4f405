"""``coordinator cluster`` shows a user the cluster through any broker: every broker, which are
up, which coordinator slots each holds and how many partitions it serves
(docs/design.md#coordinator-slots). Brokers run in this process on real ZooKeeper; the CLI runs
as real processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from launch.cluster import eventually
from statemachine.slots import DEFAULT_SLOTS
from tests.support.node_cluster import cluster
from tests.zookeeper.test_cluster_clients import CONFIG, DEADLINE, cli, cli_json

pytestmark = pytest.mark.realtime


def balanced(view: dict[str, Any], up: set[int]) -> bool:
    """Every slot held once, by a broker that is up, the counts differing by at most one."""
    held = {b["broker"]: b["slots"] for b in view["brokers"]}
    counts = [len(held.get(broker, [])) for broker in up]
    return (
        sorted(slot for slots in held.values() for slot in slots) == list(range(DEFAULT_SLOTS))
        and set(held) - up <= {b for b, slots in held.items() if not slots}
        and max(counts) - min(counts) <= 1
    )


async def test_the_cluster_view_names_every_broker_its_slots_and_who_is_down(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    """The brokers start one after another: each joining broker takes its share of the slots
    from those before it, and every broker shows the same view."""
    async with cluster(zookeeper_hosts, tmp_path, CONFIG, 3) as brokers:
        everyone = {b.broker_id for b in brokers}
        await cli(
            brokers[0], "topics", "create", "t", "--partitions", "6", "--replication-factor", "1"
        )
        started = trio.current_time()
        views: list[dict[str, Any]] = []

        async def shared_and_agreed() -> bool:
            views[:] = [await cli_json(broker, "cluster") for broker in brokers]
            return all(balanced(view, everyone) for view in views) and all(
                view == views[0] for view in views
            )

        await eventually(shared_and_agreed, deadline=DEADLINE)
        print(f"slots shared among 3 brokers {trio.current_time() - started:.1f}s after start")
        view = views[0]
        assert view["slots"] == DEFAULT_SLOTS
        assert [(b["broker"], b["up"], b["port"], b["partitions"]) for b in view["brokers"]] == [
            (b.broker_id, True, b.port, 2) for b in brokers
        ]
        assert sorted(len(b["slots"]) for b in view["brokers"]) == [16, 17, 17]
        table = await cli(brokers[1], "cluster")
        assert table.splitlines()[0] == f"{DEFAULT_SLOTS} coordinator slots"

        gone, *survivors = brokers
        gone.scope.cancel()  # a clean stop: it hands its slots off
        stopped = trio.current_time()
        alive = {b.broker_id for b in survivors}

        async def taken_over() -> bool:
            view = await cli_json(survivors[0], "cluster")
            ups = {b["broker"]: b["up"] for b in view["brokers"]}
            return ups == {b: b in alive for b in everyone} and balanced(view, alive)

        await eventually(taken_over, deadline=DEADLINE)
        print(f"its slots taken over {trio.current_time() - stopped:.1f}s after a clean stop")
        view = await cli_json(survivors[0], "cluster")
        down = next(b for b in view["brokers"] if b["broker"] == gone.broker_id)
        assert (down["host"], down["port"], down["slots"], down["partitions"]) == (
            None,
            None,
            [],
            2,
        )
        assert sorted(len(b["slots"]) for b in view["brokers"] if b["up"]) == [25, 25]
