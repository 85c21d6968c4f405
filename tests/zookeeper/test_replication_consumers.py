"""A group consuming a replicated topic through a leader's kill -9, with real processes
(docs/design.md#replication): three brokers on real ZooKeeper, a topic of factor 3 with
min.insync.replicas 2, the library's producer at acks=all writing all along, and a group of the
library's consumers reading it. The broker killed leads a partition and does not coordinate the
group, so that what the group sees is a leader change and nothing else: a new leader is elected,
the consumers follow it and consume every acknowledged record, and the group does not rebalance
(its generation and members unchanged) nor does any committed offset go back.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from consumer import Consumer, ConsumerSettings, Producer, open_consumer, open_producer
from consumer.admin import AdminError, open_admin
from launch.cluster import agreed_coordinator, eventually
from tests.zookeeper.test_failover import (
    DEADLINE,
    SESSION,
    Broker,
    broker_processes,
    ids,
)
from tests.zookeeper.test_replication_processes import PARTITIONS, TOPIC, all_in_sync, leaders
from transport.channel import ChannelClosed
from transport.connect import Address

pytestmark = pytest.mark.realtime

GROUP = "payments"
CONSUMERS = 2
#: Long enough that no consumer is taken for dead on two busy cores: a death would be a group
#: event, which this test must not mistake for one caused by the leader's move.
CONSUMER_SESSION = 10.0

Offset = tuple[int, int]
"""(partition, offset) of a record of the topic."""


@contextlib.asynccontextmanager
async def open_group(brokers: list[Broker]) -> AsyncIterator[list[Consumer]]:
    settings = ConsumerSettings(
        auto_offset_reset="earliest",
        session_timeout=CONSUMER_SESSION,
        client_id="c",
        max_retry_backoff=1.0,
    )
    bootstrap = [b.address for b in brokers]
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                open_consumer(bootstrap, GROUP, topics={TOPIC: 1}, settings=settings)
            )
            for _ in range(CONSUMERS)
        ]


async def consume(consumer: Consumer, seen: dict[Offset, float]) -> None:
    """The application: every record finished as it arrives (so it gets committed), noting when
    it first came."""
    (stream,) = consumer.streams_for(TOPIC)
    async for record in stream:
        seen.setdefault((record.partition, record.offset), trio.current_time())
        consumer.mark(record)


async def produce(producer: Producer, acknowledged: set[Offset]) -> None:
    """A steady trickle over every partition, one record at a time, until cancelled."""
    n = 0
    while True:
        acknowledged.add(await producer.send_and_wait(TOPIC, b"%d" % n, partition=n % PARTITIONS))
        n += 1
        await trio.sleep(0.02)


async def committed(address: Address) -> tuple[int, dict[int, int]] | None:
    """The group's generation and committed offsets (partition -> offset, -1: none) as its
    coordinator at ``address`` reports them while Stable; None while it cannot say."""
    found: list[tuple[int, dict[int, int]]] = []
    try:
        with trio.fail_after(5):
            async with open_admin([address]) as admin:
                report = await admin.describe_group(GROUP)
        if report.state == "Stable":
            found.append((report.generation, {r.partition: r.committed for r in report.partitions}))
    except* (OSError, AdminError, ChannelClosed, trio.TooSlowError):
        pass
    return found[0] if found else None


async def watch_committed(address: Address, samples: list[tuple[int, dict[int, int]]]) -> None:
    """Sample the coordinator's view until cancelled (the coordinator lives: an offset it
    accepted is never lost, so no sample may be behind an earlier one)."""
    while True:
        if (sample := await committed(address)) is not None:
            samples.append(sample)
        await trio.sleep(0.1)


async def test_a_leaders_kill9_is_no_group_event(zookeeper_hosts: str, tmp_path: Path) -> None:
    async with broker_processes(zookeeper_hosts, tmp_path, 3) as brokers:
        coordinator_id = await agreed_coordinator(ids(brokers), group=GROUP, deadline=DEADLINE)
        coordinator = next(b for b in brokers if b.broker_id == coordinator_id)
        async with open_admin([b.address for b in brokers]) as admin:
            await admin.create_topic(
                TOPIC, PARTITIONS, replication_factor=3, configs={"min.insync.replicas": "2"}
            )
        await eventually(lambda: all_in_sync(brokers, 3), deadline=DEADLINE)

        acknowledged: set[Offset] = set()
        seen: dict[Offset, float] = {}
        samples: list[tuple[int, dict[int, int]]] = []
        async with (
            open_producer([b.address for b in brokers]) as producer,
            open_group(brokers) as consumers,
            trio.open_nursery() as nursery,
        ):
            for consumer in consumers:
                nursery.start_soon(consume, consumer, seen)
            producing = trio.CancelScope()

            async def keep_producing() -> None:
                with producing:
                    await produce(producer, acknowledged)

            nursery.start_soon(keep_producing)

            async def every_partition_flows() -> bool:
                owned = set().union(*(c.assignment.value for c in consumers))
                flowing = {p for p, _ in seen}
                return (
                    len(acknowledged) >= 10 * PARTITIONS
                    and len(owned) == PARTITIONS
                    and all(c.assignment.value for c in consumers)
                    and flowing == set(range(PARTITIONS))
                    and len({c.generation for c in consumers}) == 1
                )

            await eventually(every_partition_flows, deadline=DEADLINE)
            generation = consumers[0].generation
            members = {c.member_id: c.assignment.value for c in consumers}
            nursery.start_soon(watch_committed, coordinator.address, samples)

            # The victim leads a partition and is not the group's coordinator.
            placed = await leaders(brokers)
            tp, led = next(
                (tp, leader)
                for tp, leader in sorted(placed.items(), key=lambda item: item[0].partition)
                if leader.broker_id != coordinator_id
            )
            victim = next(b for b in brokers if b.broker_id == led.broker_id)
            rest = [b for b in brokers if b is not victim]
            killed_at = trio.current_time()
            await victim.running.kill()

            async def moved() -> bool:
                leader = (await leaders(rest)).get(tp)
                return leader is not None and leader.broker_id not in (-1, victim.broker_id)

            await eventually(moved, deadline=DEADLINE)
            elected_at = trio.current_time()
            # The partition had no leader from the kill to here: what is acknowledged of it
            # from now on was written to the new leader only.
            before = {o for p, o in acknowledged if p == tp.partition}

            async def resumed() -> bool:
                return any(p == tp.partition and o not in before for p, o in seen)

            await eventually(resumed, deadline=DEADLINE)
            resumed_at = min(t for (p, _), t in seen.items() if p == tp.partition and t > killed_at)
            # The writes go on a while under the new leader, then stop.
            wanted = len(acknowledged) + 10 * PARTITIONS

            async def written() -> bool:
                return len(acknowledged) >= wanted

            await eventually(written, deadline=DEADLINE)
            producing.cancel()

            async def all_consumed() -> bool:
                return seen.keys() >= acknowledged

            await eventually(all_consumed, deadline=DEADLINE)

            # Everything consumed gets committed, the moved partition's records too.
            ends = {p: max(o for q, o in acknowledged if q == p) + 1 for p in range(PARTITIONS)}

            async def all_committed() -> bool:
                # At or past each end: a write cut off by the stop may be stored, not answered.
                return bool(samples) and all(
                    samples[-1][1].get(p, -1) >= e for p, e in ends.items()
                )

            await eventually(all_committed, deadline=DEADLINE)
            print(
                f"kill -9 of broker {victim.broker_id} (leader of {tp}) -> a new leader seen "
                f"{elected_at - killed_at:.3f}s, the partition consumed again "
                f"{resumed_at - killed_at:.3f}s (ZooKeeper session {SESSION}s); "
                f"{len(acknowledged)} acknowledged, all consumed and committed "
                f"({len(samples)} samples of the committed offsets)"
            )
            # No group event: the same members, holding the same partitions, in the same
            # generation, and no committed offset went back.
            assert {c.member_id: c.assignment.value for c in consumers} == members
            assert {c.generation for c in consumers} == {generation}
            assert {g for g, _ in samples} == {generation}
            for earlier, later in itertools.pairwise(samples):
                for partition, offset in earlier[1].items():
                    assert later[1].get(partition, -1) >= offset, (partition, earlier, later)
            nursery.cancel_scope.cancel()
