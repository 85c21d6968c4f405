"""The level-0 frozen client (tests/frozen/level0.py: version 0 of every api, no lease) through a
coordinator failover on ZooKeeper: three broker processes, ``kill -9`` of the group's coordinator,
and the client's two members, which lose their connection, stop, and register with the successor
(docs/design.md#old-clients). The client runs in a worker thread of this process, calling nothing
of the repository: its module imports the standard library only."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import trio

from consumer.admin import open_admin
from launch.cluster import agreed_coordinator
from tests.zookeeper.test_failover import DEADLINE, broker_processes, ids

pytestmark = pytest.mark.realtime

TOPIC = "frozen-failover"
PARTITIONS = 4


def _level0() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "frozen" / "level0.py"
    spec = importlib.util.spec_from_file_location("frozen_level0", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_a_level_0_group_survives_a_coordinator_failover(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    level0 = _level0()
    async with broker_processes(zookeeper_hosts, tmp_path, 3) as brokers:
        coordinator_id = await agreed_coordinator(ids(brokers), group=TOPIC, deadline=DEADLINE)
        coordinator = next(b for b in brokers if b.broker_id == coordinator_id)
        survivor = next(b for b in brokers if b is not coordinator)
        async with open_admin([survivor.address]) as admin:
            await admin.create_topic(TOPIC, PARTITIONS, [survivor.broker_id], replication_factor=1)
        token = trio.lowlevel.current_trio_token()

        def kill_coordinator() -> None:
            trio.from_thread.run(coordinator.running.kill, trio_token=token)

        with trio.fail_after(DEADLINE):
            result = await trio.to_thread.run_sync(
                level0.run_failover,
                [b.address for b in brokers],
                survivor.address,
                TOPIC,
                kill_coordinator,
                PARTITIONS,
            )
        after = await agreed_coordinator(
            [(b.broker_id, b.address) for b in brokers if b is not coordinator],
            group=TOPIC,
            deadline=DEADLINE,
        )
    assert after != coordinator_id
    assert result["read_before"] == 10 * PARTITIONS
    assert result["read_after"] == 5 * PARTITIONS
    assert result["committed"] == [15] * PARTITIONS
    assert {version for _, version in result["versions_received"]} == {0}
