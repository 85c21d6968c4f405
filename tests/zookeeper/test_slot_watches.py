"""The per-slot election reacts to ZooKeeper watches, and a slot with no live holder is a failover
under way (docs/design.md#coordinator-slots, docs/design.md#loading).

Before, each broker re-planned its slots once a second only, so a dead broker's slots waited up
to a second after its session ended, and a broker asked about a group whose slot had no live
holder answered as if nobody coordinated it: consumers counted that as a failed discovery and
backed off, doubling, for seconds. Brokers run in this process (``run_node``: real sockets, real
ZooKeeper, real clock), so a test can make the poll too slow to matter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from kazoo.client import KazooClient  # type: ignore[import-untyped]

import broker.election
from consumer.admin import open_admin
from coordinator.config import CoordinatorConfig
from launch.cluster import eventually, slots_shared
from protocol import ErrorCode
from statemachine.slots import DEFAULT_SLOTS, slot_of
from store.zookeeper import SLOT_ELECTIONS
from tests.support.node_cluster import add_broker

pytestmark = pytest.mark.realtime

DEADLINE = 60  # generous: CI has two busy cores, ZooKeeper's JVM among them
CONFIG = CoordinatorConfig(initial_rebalance_delay=0.2, commit_interval=0.2)
GROUP = "payments"


async def test_slots_move_on_a_watch_when_the_poll_would_take_an_hour(
    zookeeper_hosts: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broker 2 joins, then stops: broker 1 hands half its slots over and takes them back on the
    watches alone (its poll comes once an hour here)."""
    monkeypatch.setattr(broker.election, "PLAN_INTERVAL", 3600.0)
    async with trio.open_nursery() as nursery:
        first = await add_broker(nursery, zookeeper_hosts, tmp_path, CONFIG, 1)
        await eventually(lambda: slots_shared(first.address, [1]), deadline=DEADLINE)
        second = await add_broker(nursery, zookeeper_hosts, tmp_path, CONFIG, 2)
        await eventually(lambda: slots_shared(first.address, [1, 2]), deadline=DEADLINE)
        second.scope.cancel()  # a clean stop: its slots are released, its registration goes
        await eventually(lambda: slots_shared(first.address, [1]), deadline=DEADLINE)
        nursery.cancel_scope.cancel()


async def test_a_group_whose_slot_has_no_live_holder_is_answered_a_failover_under_way(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    """Another session holds the group's slot in the name of broker 99, which is not registered
    (a dead broker's node before its session ends looks the same to the others once its
    registration is gone). ClusterMetadata about the group says COORDINATOR_LOAD_IN_PROGRESS,
    which clients retry at the failover pace; once the node goes, broker 1 takes the slot."""
    slot = slot_of(GROUP, DEFAULT_SLOTS)
    squatter = KazooClient(hosts=zookeeper_hosts)
    await trio.to_thread.run_sync(squatter.start)
    try:
        await trio.to_thread.run_sync(
            lambda: squatter.create(
                f"{SLOT_ELECTIONS}/{slot}",
                json.dumps({"broker_id": 99}).encode(),
                ephemeral=True,
                makepath=True,
            )
        )
        async with trio.open_nursery() as nursery:
            first = await add_broker(nursery, zookeeper_hosts, tmp_path, CONFIG, 1)
            async with open_admin([first.address]) as admin:
                answers: list[tuple[ErrorCode, int]] = []

                async def answered(code: ErrorCode) -> bool:
                    metadata = await admin.metadata((), group=GROUP)
                    answers.append((metadata.error_code, metadata.coordinator_id))
                    return metadata.error_code is code

                # Once broker 1 has read the slot's holder (its plan, within a second).
                await eventually(
                    lambda: answered(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), deadline=DEADLINE
                )
                assert answers[-1] == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, -1)
                await trio.to_thread.run_sync(squatter.stop)  # its session ends, the node goes
                await eventually(lambda: answered(ErrorCode.NONE), deadline=DEADLINE)
                assert answers[-1] == (ErrorCode.NONE, 1)
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(squatter.stop)
        await trio.to_thread.run_sync(squatter.close)
