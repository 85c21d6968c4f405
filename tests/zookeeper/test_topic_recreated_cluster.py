"""Issue 33's reproductions (tests/broker/test_topic_recreated.py) on two broker processes sharing
ZooKeeper: the delete and the create race from connections to different brokers, and each broker
hears of a delete and a create through its own watch, which may lag or fold the two into one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from launch.cluster import agreed_coordinator, eventually
from tests.broker.test_topic_recreated import (
    GROUP,
    delete_and_create_again,
    race_delete_and_create,
)
from tests.zookeeper.test_cluster_clients import every_broker_sees
from tests.zookeeper.test_failover import broker_processes
from transport.connect import Address

pytestmark = pytest.mark.realtime

DEADLINE = 60  # generous: CI has two busy cores, ZooKeeper's JVM among them


@contextlib.asynccontextmanager
async def two_brokers(hosts: str, tmp_path: Path) -> AsyncIterator[list[Address]]:
    async with broker_processes(hosts, tmp_path, 2) as brokers:
        addresses = [b.address for b in brokers]
        await eventually(lambda: every_broker_sees(addresses, {1, 2}), deadline=DEADLINE)
        yield addresses


async def test_a_topic_created_while_deleted_never_serves_the_deleted_records(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with two_brokers(zookeeper_hosts, tmp_path) as addresses:
        await race_delete_and_create(addresses, rounds=25, partitions=2)


async def test_a_topic_created_again_has_no_offsets_of_the_deleted_one(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    """Through the broker that does not coordinate the group, whose watch hears of the delete
    and the create only through ZooKeeper."""
    async with two_brokers(zookeeper_hosts, tmp_path) as addresses:
        brokers = list(enumerate(addresses, start=1))
        coordinator = await agreed_coordinator(brokers, group=GROUP, deadline=DEADLINE)
        follower = next(address for i, address in brokers if i != coordinator)
        await delete_and_create_again(addresses, rounds=25, through=follower)
