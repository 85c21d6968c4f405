"""Per-slot coordinator offices on ZooKeeper (docs/design.md#coordinator-slots): each slot has its
own election node and epoch; two brokers hold different slots at once, each writing only its
slots' groups; a handoff (release) fences the old holder's writes for that slot alone. Real
ZooKeeper, real clock."""

from __future__ import annotations

import math

import pytest
import trio

from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import open_group_coordinator
from protocol.types import BrokerInfo, TopicPartition
from statemachine.slots import slot_of
from store import Deposed, OffsetBatch
from store.slot_store import SlotStore
from store.zookeeper import open_zookeeper_store
from tests.store.test_contract import sample_group

pytestmark = pytest.mark.realtime

SLOTS = 4
DEADLINE = 30
TP = TopicPartition(topic="t", partition=0)


def group_in(slot: int, prefix: str = "group") -> str:
    return next(g for g in (f"{prefix}-{i}" for i in range(1000)) if slot_of(g, SLOTS) == slot)


def offsets(group_id: str, offset: int) -> list[OffsetBatch]:
    return [OffsetBatch(group_id=group_id, generation=1, offsets={TP: offset})]


async def test_brokers_hold_different_slots_at_once_each_writing_only_its_own(
    zookeeper_hosts: str,
) -> None:
    async with (
        open_zookeeper_store(zookeeper_hosts) as one,
        open_zookeeper_store(zookeeper_hosts) as two,
    ):
        zero = await one.take_slot(1, 0, SLOTS)
        first = await one.take_slot(1, 1, SLOTS)
        second = await two.take_slot(2, 2, SLOTS)
        assert len({zero, first, second}) == 3
        assert await two.slot_holders() == {0: 1, 1: 1, 2: 2}

        await one.write_group(zero, sample_group(group_in(0)))
        await one.commit_offsets(first, offsets(group_in(1), 5))
        await two.commit_offsets(second, offsets(group_in(2), 7))
        assert await two.fetch_offsets(group_in(1)) == {TP: 5}
        # An office writes only its slot's groups.
        with pytest.raises(Deposed):
            await one.commit_offsets(zero, offsets(group_in(1), 6))
        with pytest.raises(Deposed):
            await two.write_group(second, sample_group(group_in(0)))
        assert await one.fetch_offsets(group_in(1)) == {TP: 5}


async def test_a_handoff_moves_one_slot_and_fences_only_its_old_epoch(
    zookeeper_hosts: str,
) -> None:
    async with (
        open_zookeeper_store(zookeeper_hosts) as one,
        open_zookeeper_store(zookeeper_hosts) as two,
    ):
        kept = await one.take_slot(1, 0, SLOTS)
        moving = await one.take_slot(1, 1, SLOTS)
        with trio.move_on_after(0.5) as waited:
            await two.take_slot(2, 1, SLOTS)
        assert waited.cancelled_caught, "took a slot another broker holds"

        await one.commit_offsets(moving, offsets(group_in(1), 10))  # flushed, then released
        await one.release_slot(1)
        with trio.fail_after(DEADLINE):
            taken = await two.take_slot(2, 1, SLOTS)
        assert taken > moving
        assert await one.slot_holders() == {0: 1, 1: 2}

        with pytest.raises(Deposed):
            await one.commit_offsets(moving, offsets(group_in(1), 99))
        await two.commit_offsets(taken, offsets(group_in(1), 11))
        await one.commit_offsets(kept, offsets(group_in(0), 3))  # slot 0 is not touched
        assert await two.fetch_offsets(group_in(1)) == {TP: 11}
        assert await two.fetch_offsets(group_in(0)) == {TP: 3}


async def test_a_coordinator_of_one_slot_recovers_only_its_slots_groups(
    zookeeper_hosts: str,
) -> None:
    async with (
        open_zookeeper_store(zookeeper_hosts) as writer,
        open_zookeeper_store(zookeeper_hosts) as store,
    ):
        for slot in range(SLOTS):
            epoch = await writer.take_slot(9, slot, SLOTS)
            await writer.write_group(epoch, sample_group(group_in(slot)))
            await writer.release_slot(slot)
        broker = BrokerInfo(broker_id=2, host="127.0.0.1", port=9092)
        await store.register_broker(broker)
        view = SlotStore(inner=store, slot=1, slots=SLOTS)
        with trio.fail_after(DEADLINE):
            async with open_group_coordinator(view, CoordinatorConfig(), broker) as coordinator:
                await coordinator.loaded.wait()
                assert set(coordinator.groups) == {group_in(1)}
                assert await view.coordinator_id() == 2
                assert view.in_contact_until() > trio.current_time()
                with pytest.raises(Deposed):  # its epoch writes no other slot's group
                    await view.delete_group(coordinator.epoch, group_in(0))
                await store.release_slot(1)  # the handoff: the office ends for this view alone
                await SlotStore(inner=store, slot=1, slots=SLOTS).wait_office_lost()
                assert view.in_contact_until() == -math.inf


async def test_a_coordinator_of_one_slot_lists_and_expires_only_its_slots_standalone_groups(
    zookeeper_hosts: str,
) -> None:
    """Groups with offsets but no record (a standalone committer's): the slot's coordinator
    learns only its own when it takes office, lists them as Empty and removes them after the
    retention period, leaving every other slot's (docs/design.md#group-retention)."""
    async with (
        open_zookeeper_store(zookeeper_hosts) as writer,
        open_zookeeper_store(zookeeper_hosts) as store,
    ):
        await writer.create_topic(TP.topic, (2,))
        standalone = {slot: group_in(slot, "sink") for slot in range(SLOTS)}
        for slot, group_id in standalone.items():
            epoch = await writer.take_slot(9, slot, SLOTS)
            await writer.commit_offsets(
                epoch, [OffsetBatch(group_id=group_id, generation=-1, offsets={TP: 4})]
            )
            await writer.release_slot(slot)
        assert await writer.slot_offset_only_groups(0, 1) == set(standalone.values())
        broker = BrokerInfo(broker_id=2, host="127.0.0.1", port=9092)
        await store.register_broker(broker)
        view = SlotStore(inner=store, slot=1, slots=SLOTS)
        assert await view.offset_only_groups() == {standalone[1]}
        config = CoordinatorConfig(group_retention=0.5, group_retention_check_interval=0.1)
        with trio.fail_after(DEADLINE):
            async with open_group_coordinator(view, config, broker) as coordinator:
                await coordinator.loaded.wait()
                assert [(g.group_id, g.state) for g in coordinator.list_groups()] == [
                    (standalone[1], "Empty")
                ]
                while await store.fetch_offsets(standalone[1]):
                    await trio.sleep(0.1)
                assert coordinator.list_groups() == ()
                await trio.sleep(1.0)  # more checks: none reaches for another slot's group
                for slot in (0, 2, 3):
                    assert await store.fetch_offsets(standalone[slot]) == {TP: 4}
                assert await store.slot_offset_only_groups(0, 1) == {
                    standalone[slot] for slot in (0, 2, 3)
                }
