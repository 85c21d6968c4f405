"""``groups reset-offsets`` with a broker down: all or nothing
(docs/failure-domains.md#admin-operations-never-cut-a-lease-short).

Before, the reset asked each partition's broker for its log bounds, left out the partitions whose
broker did not answer, reset the others and exited 0 without a word: the group was left half
moved. Brokers run in this process (real sockets, real ZooKeeper); the CLI is a process of its own,
as a user runs it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from consumer import open_producer
from consumer.admin import open_admin
from coordinator.config import CoordinatorConfig
from launch.cluster import eventually, slots_shared
from protocol.types import TopicPartition
from tests.cli.cli_process import run_cli
from tests.support.node_cluster import add_broker

pytestmark = pytest.mark.realtime

DEADLINE = 60  # generous: CI has two busy cores, ZooKeeper's JVM among them
CONFIG = CoordinatorConfig(initial_rebalance_delay=0.2, commit_interval=0.2)
PARTITIONS = 4


async def test_a_reset_with_a_broker_down_writes_nothing_and_names_what_it_could_not_read(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        first = await add_broker(nursery, zookeeper_hosts, tmp_path, CONFIG, 1)
        second = await add_broker(nursery, zookeeper_hosts, tmp_path, CONFIG, 2)
        await eventually(lambda: slots_shared(first.address, [1, 2]), deadline=DEADLINE)
        async with open_admin([first.address]) as admin:
            await admin.create_topic("t", PARTITIONS, [1, 2], replication_factor=1)
            placement = {
                p.partition: p.broker_id for p in (await admin.topics(["t"]))[0].partitions
            }
        on_second = sorted(p for p, broker_id in placement.items() if broker_id == 2)
        assert on_second and len(on_second) < PARTITIONS
        async with open_producer([first.address]) as producer:
            for n in range(2 * PARTITIONS):
                await producer.send_and_wait("t", b"%d" % n)
        everything = {TopicPartition(topic="t", partition=p) for p in range(PARTITIONS)}
        async with open_admin([first.address]) as admin:
            await admin.reset_offsets("g", dict.fromkeys(everything, 0))  # an empty group's

        second.scope.cancel()  # broker 2 stops: its partitions cannot be read
        await eventually(lambda: slots_shared(first.address, [1]), deadline=DEADLINE)
        done = await run_cli(
            "groups",
            "reset-offsets",
            "g",
            "--topic",
            "t",
            "--to-latest",
            "--bootstrap",
            f"{first.address[0]}:{first.address[1]}",
        )
        err = done.stderr.decode()
        assert done.returncode == 1, (done.returncode, err)
        named = ", ".join(f"t-{p}" for p in on_second)
        assert err == (
            f"coordinator: cannot read the log bounds of {named} (is its broker down?): "
            "nothing was reset\n"
        )
        async with open_admin([first.address]) as admin:
            report = await admin.describe_group("g")
        assert {p.partition: p.committed for p in report.partitions} == dict.fromkeys(
            range(PARTITIONS), 0
        )
        nursery.cancel_scope.cancel()
