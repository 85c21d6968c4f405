"""The sweeper of deleted topics' partition states (broker/state_sweeper.py): the holder of slot 0
removes the states of topic ids no topic has (a controller's late write after a delete leaves
one), never those of a topic in force, and nothing once its office is over. Real ZooKeeper, real
clock: every wait is bounded."""

from __future__ import annotations

import uuid

import pytest
import trio

from broker.election import open_elector
from broker.state_sweeper import sweep
from coordinator.config import CoordinatorConfig
from launch.cluster import eventually
from protocol.types import BrokerInfo
from statemachine.partition_state import StateWrite
from store import Deposed, StoreUnavailable, TopicPlacement
from store.zookeeper import ZooKeeperStore, open_zookeeper_store
from store.zookeeper_layout import partition_state_path
from tests.zookeeper.test_partition_states import controller, keys_of, state
from tests.zookeeper.test_zookeeper_store import DEADLINE, expire_session, raw

pytestmark = pytest.mark.realtime


async def with_states(store: ZooKeeperStore, epoch: int, topic: str) -> TopicPlacement:
    """A topic of factor 3 with a state for each of its 3 partitions."""
    placement = await store.create_topic(topic, tuple((1, 2, 3) for _ in range(3)))
    writes = [
        StateWrite(key=key, state=state(1, 0, 1, 2, 3), expected_version=-1)
        for key in keys_of(placement)
    ]
    assert await store.write_partition_states(epoch, writes) == ()
    return placement


async def deleted_with_a_state_left(store: ZooKeeperStore, epoch: int) -> TopicPlacement:
    """A topic deleted, and a state of it written after the delete removed its states (a
    controller that had not seen the topic go)."""
    placement = await with_states(store, epoch, "gone")
    await store.delete_topic("gone")
    late = StateWrite(key=keys_of(placement)[1], state=state(2, 0, 2, 3), expected_version=-1)
    assert await store.write_partition_states(epoch, [late]) == ()
    return placement


async def exists(hosts: str, topic_id: uuid.UUID) -> bool:
    path = partition_state_path(topic_id)
    return await raw(hosts, lambda client: client.exists(path)) is not None


async def test_the_sweeper_removes_the_states_of_deleted_topics_only(zookeeper_hosts: str) -> None:
    async with controller(zookeeper_hosts) as (store, epoch):
        kept = await with_states(store, epoch, "orders")
        gone = await deleted_with_a_state_left(store, epoch)
        assert await store.partition_state_ids() == {kept.topic_id, gone.topic_id}
        assert await sweep(store, epoch) == (gone.topic_id,)
        assert not await exists(zookeeper_hosts, gone.topic_id)
        assert set(await store.partition_states()) == set(keys_of(kept))
        assert await sweep(store, epoch) == ()


async def test_a_deposed_sweeper_removes_nothing(zookeeper_hosts: str) -> None:
    async with controller(zookeeper_hosts) as (old, old_epoch):
        gone = await deleted_with_a_state_left(old, old_epoch)
        await expire_session(zookeeper_hosts, old)
        async with open_zookeeper_store(zookeeper_hosts) as new:
            with trio.fail_after(DEADLINE):
                new_epoch = await new.take_slot(2, 0, 1)

            async def fenced() -> bool:
                try:
                    await sweep(old, old_epoch)
                except Deposed:
                    return True
                except StoreUnavailable:
                    return False  # still reconnecting
                raise AssertionError("a deposed sweeper removed states")

            await eventually(fenced, deadline=DEADLINE)
            assert await exists(zookeeper_hosts, gone.topic_id)
            assert await sweep(new, new_epoch) == (gone.topic_id,)


async def test_the_holder_of_slot_0_sweeps_as_it_takes_the_slot(zookeeper_hosts: str) -> None:
    async with controller(zookeeper_hosts) as (store, epoch):
        gone = await deleted_with_a_state_left(store, epoch)
        await store.release_slot(0)
    async with open_zookeeper_store(zookeeper_hosts) as store:
        info = BrokerInfo(broker_id=1, host="localhost", port=1)
        await store.register_broker(info, log_dir=uuid.uuid4())
        config = CoordinatorConfig(coordinator_slots=2)
        async with open_elector(store, config, info):

            async def swept() -> bool:
                return not await exists(zookeeper_hosts, gone.topic_id)

            await eventually(swept, deadline=DEADLINE)
