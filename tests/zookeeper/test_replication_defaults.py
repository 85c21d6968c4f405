"""A topic created without a replication factor gets the broker's default: 3 on a cluster
sharing ZooKeeper (Kafka's recommended ``default.replication.factor``), 1 alone on the embedded
store, and whatever ``serve --default-replication-factor`` says. A default the live brokers
cannot hold refuses the topic, never places fewer replicas. Brokers run in this process on real
ZooKeeper, real clock: every wait is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.node import NodeSettings, run_node
from consumer.admin import AdminError, open_admin
from coordinator.config import CoordinatorConfig
from protocol import ErrorCode
from protocol.types import TopicPartition
from tests.support.node_cluster import cluster

pytestmark = pytest.mark.realtime

DEADLINE = 60
CONFIG = CoordinatorConfig(coordinator_slots=4, initial_rebalance_delay=0)


async def test_a_cluster_topic_without_a_factor_gets_three_replicas(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with cluster(zookeeper_hosts, tmp_path, CONFIG, 3) as brokers:
        with trio.fail_after(DEADLINE):
            async with open_admin([b.address for b in brokers]) as admin:
                await admin.create_topic("threefold", 2)
                leaders = (await admin.listing(["threefold"])).leaders
    assert {tp: len(leader.replicas) for tp, leader in leaders.items()} == {
        TopicPartition(topic="threefold", partition=p): 3 for p in range(2)
    }


async def test_a_default_beyond_the_live_brokers_refuses_the_topic(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with cluster(zookeeper_hosts, tmp_path, CONFIG, 2) as brokers:
        with trio.fail_after(DEADLINE):
            async with open_admin([b.address for b in brokers]) as admin:
                with pytest.raises(AdminError) as refused:
                    await admin.create_topic("too-wide", 2)
                assert refused.value.error_code is ErrorCode.INVALID_REPLICATION_FACTOR
                assert "(the default)" in str(refused.value)
                assert "too-wide" not in {t.topic for t in await admin.topics()}
                await admin.create_topic("narrow", 2, replication_factor=2)
                leaders = (await admin.listing(["narrow"])).leaders
    assert sorted(len(leader.replicas) for leader in leaders.values()) == [2, 2]


async def test_the_default_is_what_the_broker_is_told(zookeeper_hosts: str, tmp_path: Path) -> None:
    config = CoordinatorConfig(
        coordinator_slots=4, initial_rebalance_delay=0, default_replication_factor=1
    )
    async with cluster(zookeeper_hosts, tmp_path, config, 2) as brokers:
        with trio.fail_after(DEADLINE):
            async with open_admin([b.address for b in brokers]) as admin:
                await admin.create_topic("single", 2)
                leaders = (await admin.listing(["single"])).leaders
    assert sorted(len(leader.replicas) for leader in leaders.values()) == [1, 1]


async def test_a_broker_alone_on_the_embedded_store_makes_one_replica(tmp_path: Path) -> None:
    settings = NodeSettings(port=0, data_dir=tmp_path / "alone")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(run_node, settings)
        with trio.fail_after(DEADLINE):
            async with open_admin([("127.0.0.1", port)]) as admin:
                await admin.create_topic("solo", 2)
                leaders = (await admin.listing(["solo"])).leaders
        nursery.cancel_scope.cancel()
    assert sorted(len(leader.replicas) for leader in leaders.values()) == [1, 1]
