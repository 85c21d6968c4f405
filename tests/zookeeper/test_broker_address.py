"""A broker that comes back at another address is fetched from at that one: a coordinator names
each partition's broker in StartFetcher from the live brokers as it last read them, and on a
cluster of several brokers it reads them again whenever the cluster changes, not only when it
took office. Real processes: three brokers on ZooKeeper, the partition's broker stopped and
started again on another port while a coordinator that took office before keeps the group."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio

from consumer import ConsumerSettings, open_consumer, open_producer
from consumer.admin import open_admin
from launch.cluster import agreed_coordinator, eventually, slots_shared
from launch.processes import BrokerProcess
from statemachine.slots import slot_of
from tests.zookeeper.test_failover import SESSION, start_broker

pytestmark = pytest.mark.realtime

DEADLINE = 60
#: Slot 21 of 50: broker 3 takes it when it joins 1 and 2 (the free share, statemachine/slots.py)
#: and keeps it while broker 1 leaves and returns, so its office outlives broker 1's old address.
GROUP = "g12"


async def test_a_consumer_is_told_the_address_a_restarted_broker_has_now(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    assert slot_of(GROUP, 50) == 21
    stacks = {b: contextlib.AsyncExitStack() for b in (1, 2, 3)}
    running: dict[int, BrokerProcess] = {}

    async def start(broker_id: int) -> None:
        running[broker_id] = await stacks[broker_id].enter_async_context(
            start_broker(zookeeper_hosts, tmp_path, broker_id)
        )
        live = sorted(running)
        await eventually(lambda: slots_shared(running[1].address, live), deadline=DEADLINE)

    try:
        for broker_id in (1, 2, 3):
            await start(broker_id)
        brokers = [(broker_id, process.address) for broker_id, process in running.items()]
        assert await agreed_coordinator(brokers, group=GROUP, deadline=DEADLINE) == 3
        async with open_admin([running[2].address]) as admin:
            await admin.create_topic("far", 1, [1], replication_factor=1)
        async with open_producer([running[2].address]) as producer:
            for n in range(5):
                await producer.enqueue("far", value=b"before-%d" % n)
        old_port = running.pop(1).port
        await stacks[1].aclose()
        await eventually(lambda: slots_shared(running[2].address, [2, 3]), deadline=DEADLINE)
        stacks[1] = contextlib.AsyncExitStack()
        await start(1)
        assert running[1].port != old_port
        brokers = [(broker_id, process.address) for broker_id, process in running.items()]
        assert await agreed_coordinator(brokers, group=GROUP, deadline=DEADLINE) == 3
        settings = ConsumerSettings(
            auto_offset_reset="earliest", session_timeout=SESSION, max_retry_backoff=1.0
        )
        values = []
        with trio.fail_after(DEADLINE):
            async with open_consumer(
                [running[2].address], GROUP, topics={"far": 1}, settings=settings
            ) as consumer:
                (stream,) = consumer.streams_for("far")
                async for record in stream:
                    values.append(record.value)
                    if len(values) == 5:
                        break
        assert values == [b"before-%d" % n for n in range(5)]
    finally:
        for stack in stacks.values():
            await stack.aclose()
