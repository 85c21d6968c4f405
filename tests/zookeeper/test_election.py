"""Brokers sharing ZooKeeper elect one coordinator; the others send consumers to it, and when it
goes another takes over and the group is whole again. Brokers run in this process (``run_node``,
real sockets, real ZooKeeper, real clock); tests/zookeeper/test_failover.py kills real processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from consumer import Consumer, ConsumerSettings, open_consumer
from consumer.admin import open_admin
from coordinator.config import CoordinatorConfig
from launch.cluster import agreed_coordinator, eventually, slots_shared
from protocol import ErrorCode, RegisterConsumerRequest, RegisterConsumerResponse
from protocol.types import Subscription, TopicPartition, TopicStreams
from statemachine.consumer import ConsumerState
from tests.support.node_cluster import cluster, ids

pytestmark = pytest.mark.realtime

DEADLINE = 60  # generous: CI has two busy cores, ZooKeeper's JVM among them
SESSION = 2.0  # consumers' session timeout T, and the brokers' ZooKeeper session timeout

CONFIG = CoordinatorConfig(initial_rebalance_delay=0.2, commit_interval=0.2)


def covered(consumers: list[Consumer]) -> set[TopicPartition]:
    return {tp for c in consumers for tp in c.assignment.value}


async def test_one_coordinator_and_followers_refuse_group_requests(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with cluster(zookeeper_hosts, tmp_path, CONFIG, 3) as brokers:
        # Once the slots are shared: while a slot is handed off it has no holder for a moment,
        # and a broker asked about its groups then answers that a failover is under way.
        await eventually(lambda: slots_shared(brokers[0].address, [1, 2, 3]), deadline=DEADLINE)
        leader_id = await agreed_coordinator(ids(brokers), group="g", deadline=DEADLINE)
        follower = next(b for b in brokers if b.broker_id != leader_id)
        async with open_admin([follower.address]) as admin:
            response = await admin.call(
                RegisterConsumerRequest(
                    group_id="g",
                    consumer_id="c1",
                    subscription=Subscription(topics=(TopicStreams(topic="t", streams=1),)),
                    auto_commit=True,
                    auto_offset_reset="smallest",
                    session_timeout_ms=6000,
                    generation=-1,
                    owned_partitions=(),
                )
            )
            assert isinstance(response, RegisterConsumerResponse)
            assert response.error_code == ErrorCode.NOT_COORDINATOR
            metadata = await admin.metadata(group="g")
            assert metadata.coordinator_id == leader_id
            assert {b.broker_id for b in metadata.brokers} == {1, 2, 3}
        for broker in brokers:
            broker.scope.cancel()


async def test_the_group_is_whole_again_after_the_coordinator_goes(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with cluster(zookeeper_hosts, tmp_path, CONFIG, 2) as brokers:
        leader_id = await agreed_coordinator(ids(brokers), group="billing", deadline=DEADLINE)
        leader = next(b for b in brokers if b.broker_id == leader_id)
        survivor = next(b for b in brokers if b.broker_id != leader_id)
        # The partitions live on the survivor, so the group can fetch after the failover.
        async with open_admin([survivor.address]) as admin:
            await admin.create_topic("orders", 4, [survivor.broker_id], replication_factor=1)

        # Consumers look for the new coordinator at least every second (by default their backoff
        # grows to 5 s while the dead one is still named), so the time measured is the cluster's.
        settings = ConsumerSettings(
            auto_offset_reset="earliest",
            session_timeout=SESSION,
            client_id="c",
            max_retry_backoff=1.0,
        )
        bootstrap = [b.address for b in brokers]
        all_partitions = {TopicPartition(topic="orders", partition=p) for p in range(4)}
        async with (
            open_consumer(bootstrap, "billing", topics={"orders": 1}, settings=settings) as c1,
            open_consumer(bootstrap, "billing", topics={"orders": 1}, settings=settings) as c2,
        ):
            consumers = [c1, c2]

            async def whole() -> bool:
                return covered(consumers) == all_partitions and all(
                    c.assignment.value for c in consumers
                )

            await eventually(whole, deadline=DEADLINE)
            before = {c.generation for c in consumers}

            gone_at = trio.current_time()
            leader.scope.cancel()  # a clean shutdown: its ZooKeeper session closes at once

            assert (
                await agreed_coordinator(ids([survivor]), group="billing", deadline=DEADLINE)
                == survivor.broker_id
            )
            elected_at = trio.current_time()

            async def whole_again() -> bool:
                # Registered with the successor, which either adopted what they fetched on
                # through the failover (the same generation) or rebalanced (a newer one).
                return await whole() and all(
                    c.coordinator is not None
                    and c.coordinator.broker_id == survivor.broker_id
                    and c.state is ConsumerState.FETCHING
                    for c in consumers
                )

            await eventually(whole_again, deadline=DEADLINE)
            assert all(c.generation >= max(before) for c in consumers)
            print(
                f"coordinator shut down -> successor elected {elected_at - gone_at:.3f}s, "
                f"group whole again {trio.current_time() - gone_at:.3f}s"
            )
        survivor.scope.cancel()
