"""Replication with real processes (docs/design.md#replication): three brokers (``coordinator
serve --zookeeper``) on real ZooKeeper, a topic of factor 3 with min.insync.replicas 2, the
library's producer at acks=all, and ``kill -9`` of a partition's leader. A new leader must be
elected, the producer must follow it, and afterwards every acknowledged record must be readable
at the offset it was acknowledged with, with nothing there that was not produced.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import trio

from bench.jepsen import read_all
from consumer import Producer, open_producer
from consumer.admin import AdminError, open_admin
from consumer.leaders import Leader
from launch.cluster import eventually
from protocol.types import TopicPartition
from tests.zookeeper.test_failover import DEADLINE, Broker, broker_processes
from transport.channel import ChannelClosed

pytestmark = pytest.mark.realtime

TOPIC = "ledger"
PARTITIONS = 3
#: (partition, offset) -> value, for every record the producer had acknowledged.
Acknowledged = dict[tuple[int, int], bytes]


async def leaders(brokers: list[Broker]) -> Mapping[TopicPartition, Leader]:
    """The partitions' leaders as the first broker that answers reports them."""
    for broker in brokers:
        found: list[Mapping[TopicPartition, Leader]] = []
        try:
            with trio.fail_after(5):
                async with open_admin([broker.address]) as admin:
                    found.append((await admin.listing([TOPIC])).leaders)
        except* (OSError, AdminError, ChannelClosed, trio.TooSlowError):
            pass
        if found:
            return found[0]
    return {}


async def all_in_sync(brokers: list[Broker], size: int) -> bool:
    found = await leaders(brokers)
    return len(found) == PARTITIONS and all(
        leader.broker_id >= 0 and len(leader.isr) == size for leader in found.values()
    )


async def produce(producer: Producer, acknowledged: Acknowledged, tag: str, count: int) -> None:
    for n in range(count):
        value = b"%s-%d" % (tag.encode(), n)
        partition, offset = await producer.send_and_wait(TOPIC, value, partition=n % PARTITIONS)
        acknowledged[(partition, offset)] = value


async def test_a_leaders_kill9_loses_no_acknowledged_record(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with broker_processes(zookeeper_hosts, tmp_path, 3) as brokers:
        async with open_admin([b.address for b in brokers]) as admin:
            await admin.create_topic(
                TOPIC, PARTITIONS, replication_factor=3, configs={"min.insync.replicas": "2"}
            )
        await eventually(lambda: all_in_sync(brokers, 3), deadline=DEADLINE)

        acknowledged: Acknowledged = {}
        async with open_producer([b.address for b in brokers]) as producer:
            await produce(producer, acknowledged, "before", 30)
            victim_id = (await leaders(brokers))[TopicPartition(topic=TOPIC, partition=0)]
            victim = next(b for b in brokers if b.broker_id == victim_id.broker_id)
            await victim.running.kill()
            rest = [b for b in brokers if b is not victim]

            async def moved() -> bool:
                leader = (await leaders(rest)).get(TopicPartition(topic=TOPIC, partition=0))
                return leader is not None and leader.broker_id not in (-1, victim.broker_id)

            await eventually(moved, deadline=DEADLINE)
            with trio.fail_after(DEADLINE):
                await produce(producer, acknowledged, "after", 30)

        async with open_admin([b.address for b in rest]) as admin:
            for partition in range(PARTITIONS):
                stored = await read_all(admin, TopicPartition(topic=TOPIC, partition=partition))
                wanted = {o: v for (p, o), v in acknowledged.items() if p == partition}
                assert wanted.items() <= stored.items(), (partition, wanted, stored)
                produced = set(acknowledged.values())
                assert set(stored.values()) <= produced, partition
