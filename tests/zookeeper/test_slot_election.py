"""Brokers of a ZooKeeper cluster share the coordinator slots (docs/design.md#coordinator-slots):
each answers the requests of its slots' groups and sends the others on; a joining broker takes
its share by handoffs that move only those slots' groups; and a broker of the single-office
layout cannot take office beside them. Brokers run in this process (``run_node``: real sockets,
real ZooKeeper, real clock)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest
import trio
from kazoo.client import KazooClient  # type: ignore[import-untyped]

from consumer import Consumer, ConsumerSettings, open_consumer, open_producer
from consumer.admin import open_admin
from coordinator.config import CoordinatorConfig
from launch.cluster import agreed_coordinator, eventually, slots_shared
from protocol import (
    DescribeGroupRequest,
    DescribeGroupResponse,
    ErrorCode,
    ListGroupsRequest,
    ListGroupsResponse,
)
from protocol.types import TopicPartition
from statemachine.consumer import ConsumerState
from statemachine.slots import DEFAULT_SLOTS, slot_of
from store.zookeeper import ELECTION
from tests.support.node_cluster import SESSION, add_broker, ids
from transport.connect import Address

pytestmark = pytest.mark.realtime

DEADLINE = 60  # generous: CI has two busy cores, ZooKeeper's JVM among them
CONFIG = CoordinatorConfig(initial_rebalance_delay=0.2, commit_interval=0.2)
#: Broker 1, alone, holds every slot; when broker 2 joins it keeps the lower half
#: (statemachine/slots.py) and hands the upper half off. So STAYING stays with broker 1 and
#: MOVING moves to broker 2.
STAYING, MOVING = "payments", "g"
PARTITIONS = 4
#: Consumers look for a moved coordinator at least every second.
SETTINGS = ConsumerSettings(
    auto_offset_reset="earliest", session_timeout=SESSION * 3, client_id="c", max_retry_backoff=1.0
)


def test_the_groups_fall_on_either_side_of_the_split() -> None:
    assert slot_of(STAYING, DEFAULT_SLOTS) < DEFAULT_SLOTS // 2 <= slot_of(MOVING, DEFAULT_SLOTS)


async def test_each_broker_answers_only_its_slots_groups(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with trio.open_nursery() as nursery:
        brokers = [
            await add_broker(nursery, zookeeper_hosts, tmp_path, CONFIG, broker_id)
            for broker_id in (1, 2)
        ]
        await eventually(lambda: slots_shared(brokers[0].address, [1, 2]), deadline=DEADLINE)
        holder: dict[str, int] = {}

        async def handed_off() -> bool:
            # The store shows the split before broker 1 has closed the office it hands off,
            # which answers for its groups until then: the brokers agree on 1 for a moment.
            for group in (STAYING, MOVING):
                agreed = await agreed_coordinator(ids(brokers), group=group, deadline=DEADLINE)
                holder[group] = agreed
            return holder == {STAYING: 1, MOVING: 2}

        await eventually(handed_off, deadline=DEADLINE)
        assert holder == {STAYING: 1, MOVING: 2}
        async with open_admin([brokers[0].address]) as admin:
            await admin.create_topic("t", PARTITIONS, replication_factor=1)
        bootstrap = [broker.address for broker in brokers]
        async with contextlib.AsyncExitStack() as stack:
            for group in (STAYING, MOVING):
                consumer = await stack.enter_async_context(
                    open_consumer(bootstrap, group, topics=["t"], settings=SETTINGS)
                )
                await consumer.assignment.wait_value(lambda owned: owned == EVERYTHING)
            async with open_admin([brokers[0].address]) as admin:
                assert [g.group_id for g in await admin.groups()] == sorted([STAYING, MOVING])
            for broker in brokers:
                async with open_admin([broker.address]) as admin:
                    listed = await admin.call(ListGroupsRequest())
                    assert isinstance(listed, ListGroupsResponse)
                    assert [g.group_id for g in listed.groups] == [
                        group for group in (STAYING, MOVING) if holder[group] == broker.broker_id
                    ]
                    for group in (STAYING, MOVING):
                        described = await admin.call(DescribeGroupRequest(group_id=group))
                        assert isinstance(described, DescribeGroupResponse)
                        expected = (
                            ErrorCode.NONE
                            if holder[group] == broker.broker_id
                            else ErrorCode.NOT_COORDINATOR
                        )
                        assert described.error_code is expected
                        metadata = await admin.metadata((), group=group)
                        assert metadata.coordinator_id == holder[group]
                        # Only the holder tells its epoch (SPEC.md §11.1).
                        assert (metadata.coordinator_epoch >= 0) is (
                            holder[group] == broker.broker_id
                        )
        nursery.cancel_scope.cancel()


async def consume(consumer: Consumer, seen: set[tuple[int, int]]) -> None:
    async for record in consumer:
        seen.add((record.partition, record.offset))
        consumer.mark(record)


def whole(consumers: list[Consumer]) -> bool:
    owned = [c.assignment.value for c in consumers]
    return set().union(*owned) == EVERYTHING and all(
        owned and c.state is ConsumerState.FETCHING
        for owned, c in zip(owned, consumers, strict=True)
    )


async def committed(address: Address, group: str) -> dict[int, int]:
    """The group's durable committed offsets, by partition of t (an admin of its own: one
    opened outside a deadline's scope would outlive it with the connections it opens inside)."""
    async with open_admin([address]) as admin:
        report = await admin.describe_group(group)
    return {p.partition: p.committed for p in report.partitions if p.topic == "t"}


EVERYTHING = {TopicPartition(topic="t", partition=p) for p in range(PARTITIONS)}


async def test_a_joining_broker_takes_its_share_by_handoff_and_only_those_groups_move(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    """Broker 2 joins a cluster where broker 1 holds every slot: broker 1 hands the upper half
    off. The group of a moved slot follows it to broker 2 and loses nothing; the group of a
    slot that stays hears nothing at all: no re-registration, no revocation, no assignment."""
    async with trio.open_nursery() as nursery:
        first = await add_broker(nursery, zookeeper_hosts, tmp_path, CONFIG, 1)
        async with open_admin([first.address]) as admin:
            await admin.create_topic("t", PARTITIONS, replication_factor=1)
        calls: dict[str, int] = {STAYING: 0, MOVING: 0}
        seen: dict[str, set[tuple[int, int]]] = {STAYING: set(), MOVING: set()}

        def counting(group: str) -> Callable[[frozenset[TopicPartition]], Awaitable[None]]:
            async def count(_partitions: frozenset[TopicPartition]) -> None:
                calls[group] += 1

            return count

        acknowledged: set[tuple[int, int]] = set()
        async with (
            open_producer([first.address]) as producer,
            contextlib.AsyncExitStack() as stack,
        ):
            groups = {
                group: [
                    await stack.enter_async_context(
                        open_consumer(
                            [first.address],
                            group,
                            topics=["t"],
                            settings=SETTINGS,
                            on_revoked=counting(group),
                            on_assigned=counting(group),
                        )
                    )
                    for _ in range(2)
                ]
                for group in (STAYING, MOVING)
            }
            consumers = trio.open_nursery()
            async with consumers as consuming:
                for group, members in groups.items():
                    for consumer in members:
                        consuming.start_soon(consume, consumer, seen[group])
                for n in range(40):
                    acknowledged.add(await producer.send_and_wait("t", b"before %d" % n))

                async def settled() -> bool:
                    return all(whole(members) for members in groups.values()) and all(
                        seen[group] == acknowledged for group in groups
                    )

                await eventually(settled, deadline=DEADLINE)
                staying = [
                    (c.member_id, c.generation, c.coordinator_epoch) for c in groups[STAYING]
                ]
                staying_calls = calls[STAYING]

                async def committed_everything(address: Address) -> bool:
                    offsets = await committed(address, MOVING)
                    return sum(offsets.values()) == len(acknowledged)

                await eventually(partial(committed_everything, first.address), deadline=DEADLINE)
                before = await committed(first.address, MOVING)

                second = await add_broker(nursery, zookeeper_hosts, tmp_path, CONFIG, 2)
                joined = trio.current_time()
                await eventually(lambda: slots_shared(first.address, [1, 2]), deadline=DEADLINE)
                shared = trio.current_time() - joined
                assert (
                    await agreed_coordinator(ids([first, second]), group=MOVING, deadline=DEADLINE)
                    == 2
                )

                async def moved() -> bool:
                    members = groups[MOVING]
                    return whole(members) and all(
                        c.coordinator is not None and c.coordinator.broker_id == 2 for c in members
                    )

                await eventually(moved, deadline=DEADLINE)
                # Flushed before the handoff, read by the successor: nothing went back.
                assert await committed(second.address, MOVING) == before
                for n in range(40):
                    acknowledged.add(await producer.send_and_wait("t", b"after %d" % n))
                await eventually(settled, deadline=DEADLINE)
                await eventually(partial(committed_everything, second.address), deadline=DEADLINE)
                after = await committed(second.address, MOVING)
                assert all(after[tp] >= offset for tp, offset in before.items())
                assert [
                    (c.member_id, c.generation, c.coordinator_epoch) for c in groups[STAYING]
                ] == staying
                assert calls[STAYING] == staying_calls
                assert all(
                    c.coordinator is not None and c.coordinator.broker_id == 1
                    for c in groups[STAYING]
                )
                print(
                    f"slots shared {shared:.1f}s after broker 2 joined; the moved group "
                    f"committed {before} before and {after} after"
                )
                consuming.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def test_a_broker_of_the_single_office_layout_never_takes_office_beside_slot_holders(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    """A broker from before the layout check elects itself at the single office's node (one
    transaction creating it, ephemeral, and bumping ``/coordinator_epoch``; while the node exists
    it waits for it to go) and then coordinates every group: the slot holders keep that node
    occupied, so its election fails while they serve."""
    async with trio.open_nursery() as nursery:
        broker = await add_broker(nursery, zookeeper_hosts, tmp_path, CONFIG, 1)
        client = KazooClient(hosts=zookeeper_hosts)
        await trio.to_thread.run_sync(lambda: client.start(timeout=30))

        def stand() -> bool:
            """The old broker's election, as it ran it: whether it took office."""
            client.ensure_path("/coordinator_epoch")
            tx = client.transaction()
            tx.create(ELECTION, b'{"broker_id":9}', ephemeral=True)
            tx.set_data("/coordinator_epoch", b'{"broker_id":9}')
            return not any(isinstance(result, Exception) for result in tx.commit())

        try:
            data, stat = await trio.to_thread.run_sync(client.get, ELECTION)
            assert (json.loads(data), stat.ephemeralOwner) == ({"broker_id": -1}, 0)
            assert not await trio.to_thread.run_sync(stand)
            # Meanwhile the slot holder serves a group from its start to its end.
            async with open_admin([broker.address]) as admin:
                await admin.create_topic("t", PARTITIONS, replication_factor=1)
            async with open_consumer(
                [broker.address], MOVING, topics=["t"], settings=SETTINGS
            ) as consumer:
                await consumer.assignment.wait_value(lambda owned: owned == EVERYTHING)
            assert not await trio.to_thread.run_sync(stand)
            data, stat = await trio.to_thread.run_sync(client.get, ELECTION)
            assert (json.loads(data), stat.ephemeralOwner) == ({"broker_id": -1}, 0)
        finally:
            await trio.to_thread.run_sync(client.stop)
            await trio.to_thread.run_sync(client.close)
        nursery.cancel_scope.cancel()
