"""Replicated partitions on ZooKeeper (docs/design.md#metadata-layout): replica lists in topic
nodes, one state node per partition whose version every write checks, a change note per write
that brokers follow through one child watch, controllers fenced by their slot's office, and the
upgrade from layout 3, during which no topic a broker of layout 3 could not read is written.
Real ZooKeeper, real clock: every wait is bounded."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any

import pytest
import trio

from launch.cluster import eventually
from protocol.topic_configs import MIN_INSYNC_REPLICAS
from protocol.types import BrokerInfo
from statemachine.partition_state import (
    IsrEntry,
    PartitionKey,
    PartitionState,
    StateWrite,
    slot_key,
)
from statemachine.slots import slot_of
from store import Deposed, InvalidReplicationFactor, StoreUnavailable, TopicPlacement
from store.zookeeper import ZooKeeperStore, open_zookeeper_store
from store.zookeeper_layout import PARTITION_CHANGES, partition_state_path
from tests.zookeeper.test_slot_layout import read_layout, write_layout
from tests.zookeeper.test_zookeeper_store import DEADLINE, _raw_client, expire_session, raw

pytestmark = pytest.mark.realtime

DIRS = {broker: uuid.uuid4() for broker in (1, 2, 3)}


def state(leader: int, epoch: int, *isr: int) -> PartitionState:
    return PartitionState(
        leader=leader,
        leader_epoch=epoch,
        isr=tuple(IsrEntry(broker_id=b, log_dir=DIRS[b]) for b in isr),
    )


def keys_of(placement: TopicPlacement) -> list[PartitionKey]:
    return [
        PartitionKey(topic_id=placement.topic_id, partition=p)
        for p in range(placement.partition_count)
    ]


def versioned(states: Mapping[PartitionKey, PartitionState]) -> dict[PartitionKey, tuple[Any, ...]]:
    """States as (leader, epoch, isr brokers, version), for comparisons at a glance."""
    return {
        key: (s.leader, s.leader_epoch, tuple(e.broker_id for e in s.isr), s.version)
        for key, s in states.items()
    }


@asynccontextmanager
async def controller(hosts: str, slot: int = 0, slots: int = 1) -> AsyncIterator[Any]:
    """A store holding ``slot``'s office: (store, epoch)."""
    async with open_zookeeper_store(hosts) as store:
        epoch = await store.take_slot(1, slot, slots)
        yield store, epoch


async def replicated_topic(store: ZooKeeperStore, partitions: int = 2) -> TopicPlacement:
    assignment = tuple(tuple((p + r) % 3 + 1 for r in range(3)) for p in range(partitions))
    return await store.create_topic("orders", assignment)


async def test_a_replicated_topic_keeps_its_replicas(zookeeper_hosts: str) -> None:
    async with open_zookeeper_store(zookeeper_hosts) as store:
        placement = await store.create_topic("orders", ((1, 2, 3), (2, 3, 1)))
        assert (placement.brokers, placement.replication_factor) == ((1, 2), 3)
        added = await store.add_partitions("orders", ((3, 1, 2),))
        assert added.replicas == ((1, 2, 3), (2, 3, 1), (3, 1, 2))
        with pytest.raises(InvalidReplicationFactor, match="replication factor 3"):
            await store.add_partitions("orders", (1,))
    async with open_zookeeper_store(zookeeper_hosts) as store:
        assert (await store.topics())["orders"] == added
    node = await raw(zookeeper_hosts, lambda client: client.get("/brokers/topics/orders")[0])
    assert json.loads(node) == {"0": [1, 2, 3], "1": [2, 3, 1], "2": [3, 1, 2]}


async def test_states_are_written_only_over_the_version_read(zookeeper_hosts: str) -> None:
    """The version is the partition epoch: a write naming an older one loses, changes nothing
    and is reported for its writer to read again; the others of the call are written."""
    async with controller(zookeeper_hosts) as (store, epoch):
        placement = await replicated_topic(store)
        zero, one = keys_of(placement)
        created = [
            StateWrite(key=zero, state=state(1, 0, 1, 2, 3), expected_version=-1),
            StateWrite(key=one, state=state(2, 0, 2, 3, 1), expected_version=-1),
        ]
        assert await store.write_partition_states(epoch, created) == ()
        assert versioned(await store.partition_states()) == {
            zero: (1, 0, (1, 2, 3), 0),
            one: (2, 0, (2, 3, 1), 0),
        }
        # Created again: the node exists, so the write lost.
        assert await store.write_partition_states(epoch, created[:1]) == (zero,)
        moved = StateWrite(key=zero, state=state(2, 1, 2, 3), expected_version=0)
        assert await store.write_partition_states(epoch, [moved]) == ()
        # A writer that read version 0 of both: zero moved on meanwhile, one did not.
        stale = [
            StateWrite(key=zero, state=state(3, 1, 3), expected_version=0),
            StateWrite(key=one, state=state(3, 1, 3, 1), expected_version=0),
        ]
        assert await store.write_partition_states(epoch, stale) == (zero,)
        assert versioned(await store.read_partition_states([zero, one])) == {
            zero: (2, 1, (2, 3), 1),
            one: (3, 1, (3, 1), 1),
        }


async def test_a_leader_changes_its_isr_by_version_alone(zookeeper_hosts: str) -> None:
    async with controller(zookeeper_hosts) as (store, epoch):
        placement = await replicated_topic(store, partitions=1)
        [key] = keys_of(placement)
        first = StateWrite(key=key, state=state(1, 0, 1, 2, 3), expected_version=-1)
        assert await store.write_partition_states(epoch, [first]) == ()
        path = partition_state_path(placement.topic_id, 0)
        node = await raw(zookeeper_hosts, lambda client: client.get(path)[0])
        assert json.loads(node)["controller_epoch"] == epoch
    async with open_zookeeper_store(zookeeper_hosts) as leader:
        shrunk = StateWrite(key=key, state=state(1, 0, 1, 2), expected_version=0)
        assert await leader.write_partition_states(None, [shrunk]) == ()
        assert await leader.write_partition_states(None, [shrunk]) == (key,)  # version 1 now
        assert versioned(await leader.partition_states()) == {key: (1, 0, (1, 2), 1)}
    node = await raw(zookeeper_hosts, lambda client: client.get(path)[0])
    assert "controller_epoch" not in json.loads(node)


async def test_a_deposed_controller_writes_nothing(zookeeper_hosts: str) -> None:
    """A controller whose session ended (a pause past it) and whose slot another took still
    holds its office in memory: the server refuses its write, and no note is written."""
    async with controller(zookeeper_hosts) as (old, old_epoch):
        placement = await replicated_topic(old, partitions=1)
        [key] = keys_of(placement)
        first = StateWrite(key=key, state=state(1, 0, 1, 2, 3), expected_version=-1)
        assert await old.write_partition_states(old_epoch, [first]) == ()
        notes = await raw(zookeeper_hosts, lambda client: client.get_children(PARTITION_CHANGES))
        await expire_session(zookeeper_hosts, old)
        async with open_zookeeper_store(zookeeper_hosts) as new:
            with trio.fail_after(DEADLINE):
                new_epoch = await new.take_slot(2, 0, 1)
            assert new_epoch > old_epoch
            elect = StateWrite(key=key, state=state(2, 1, 2, 3), expected_version=0)

            # Through whatever session kazoo has by now: the server refuses it.
            async def fenced() -> bool:
                try:
                    await old.write_partition_states(old_epoch, [elect])
                except Deposed:
                    return True
                except StoreUnavailable:
                    return False  # still reconnecting
                raise AssertionError("a deposed controller wrote a state")

            await eventually(fenced, deadline=DEADLINE)
            with pytest.raises(Deposed):  # and its office is over for good
                await old.write_partition_states(old_epoch, [elect])
            assert versioned(await new.partition_states()) == {key: (1, 0, (1, 2, 3), 0)}
            assert await new.write_partition_states(new_epoch, [elect]) == ()
    after = await raw(zookeeper_hosts, lambda client: client.get_children(PARTITION_CHANGES))
    assert len(after) == len(notes) + 1  # the new controller's


async def test_a_controller_writes_only_its_slots_partitions(zookeeper_hosts: str) -> None:
    slots = 50
    async with open_zookeeper_store(zookeeper_hosts) as store:
        placement = await store.create_topic("orders", tuple((1, 2, 3) for _ in range(8)))
        keys = keys_of(placement)
        slot = slot_of(slot_key(keys[0]), slots)
        epoch = await store.take_slot(1, slot, slots)
        theirs = next(key for key in keys if slot_of(slot_key(key), slots) != slot)
        writes = [
            StateWrite(key=key, state=state(1, 0, 1, 2, 3), expected_version=-1)
            for key in (keys[0], theirs)
        ]
        with pytest.raises(Deposed, match="not in the slot"):
            await store.write_partition_states(epoch, writes)
        assert await store.partition_states() == {}
        assert await store.write_partition_states(epoch, writes[:1]) == ()


async def test_updates_follow_the_change_notes(zookeeper_hosts: str) -> None:
    """Every state at once, then each batch of changes, a state at its latest version: the
    changes of several writes made while the reader was away come together."""
    async with controller(zookeeper_hosts) as (writer, epoch):
        placement = await replicated_topic(writer, partitions=3)
        zero, one, two = keys_of(placement)
        new = [
            StateWrite(key=key, state=state(1, 0, 1, 2, 3), expected_version=-1)
            for key in (zero, one)
        ]
        assert await writer.write_partition_states(epoch, new) == ()
        async with (
            open_zookeeper_store(zookeeper_hosts) as reader,
            aclosing(reader.partition_state_updates()) as updates,
        ):
            with trio.fail_after(DEADLINE):
                assert versioned(await anext(updates)) == {
                    zero: (1, 0, (1, 2, 3), 0),
                    one: (1, 0, (1, 2, 3), 0),
                }
            moved = StateWrite(key=zero, state=state(2, 1, 2, 3), expected_version=0)
            assert await writer.write_partition_states(epoch, [moved]) == ()
            with trio.fail_after(DEADLINE):
                assert versioned(await anext(updates)) == {zero: (2, 1, (2, 3), 1)}
            # A lost write writes no note: nothing to hear of.
            assert await writer.write_partition_states(epoch, [moved]) == (zero,)
            assert (
                await writer.write_partition_states(
                    epoch, [StateWrite(key=zero, state=state(3, 2, 3), expected_version=1)]
                )
                == ()
            )
            assert (
                await writer.write_partition_states(
                    epoch,
                    [
                        StateWrite(key=zero, state=state(2, 3, 2), expected_version=2),
                        StateWrite(key=two, state=state(3, 0, 3, 1, 2), expected_version=-1),
                    ],
                )
                == ()
            )
            with trio.fail_after(DEADLINE):
                changes = versioned(await anext(updates))
                while changes.keys() != {zero, two} or changes[zero][3] != 3:
                    changes |= versioned(await anext(updates))
            assert changes == {zero: (2, 3, (2,), 3), two: (3, 0, (3, 1, 2), 0)}


async def test_a_reader_that_missed_a_note_reads_every_state(zookeeper_hosts: str) -> None:
    """A note deleted before the reader came to it (a reader more than a minute behind, or
    10,000 notes) is seen in the directory's count of changes: the reader reads every state."""
    async with controller(zookeeper_hosts) as (writer, epoch):
        placement = await replicated_topic(writer, partitions=2)
        zero, one = keys_of(placement)
        first = StateWrite(key=zero, state=state(1, 0, 1, 2, 3), expected_version=-1)
        assert await writer.write_partition_states(epoch, [first]) == ()
        async with (
            open_zookeeper_store(zookeeper_hosts) as reader,
            aclosing(reader.partition_state_updates()) as updates,
        ):
            with trio.fail_after(DEADLINE):
                assert versioned(await anext(updates)) == {zero: (1, 0, (1, 2, 3), 0)}
            # While the reader is away, a state is written and its note deleted.
            later = StateWrite(key=one, state=state(2, 0, 2, 3, 1), expected_version=-1)
            assert await writer.write_partition_states(epoch, [later]) == ()

            def delete_notes(client: Any) -> None:
                for name in client.get_children(PARTITION_CHANGES):
                    client.delete(f"{PARTITION_CHANGES}/{name}")

            await raw(zookeeper_hosts, delete_notes)
            with trio.fail_after(DEADLINE):
                assert versioned(await anext(updates)) == {one: (2, 0, (2, 3, 1), 0)}
            # And it follows the notes again from there.
            moved = StateWrite(key=zero, state=state(2, 1, 2, 3), expected_version=0)
            assert await writer.write_partition_states(epoch, [moved]) == ()
            with trio.fail_after(DEADLINE):
                assert versioned(await anext(updates)) == {zero: (2, 1, (2, 3), 1)}


async def test_notes_beyond_the_newest_are_pruned_by_writers(
    zookeeper_hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("store.zookeeper_partitions._KEPT_NOTES", 2)
    monkeypatch.setattr("store.zookeeper_partitions._PRUNE_INTERVAL", 0.0)
    async with controller(zookeeper_hosts) as (writer, epoch):
        placement = await replicated_topic(writer, partitions=1)
        [key] = keys_of(placement)
        for version in range(5):
            write = StateWrite(key=key, state=state(1, version, 1), expected_version=version - 1)
            assert await writer.write_partition_states(epoch, [write]) == ()
        notes = await raw(zookeeper_hosts, lambda client: client.get_children(PARTITION_CHANGES))
        assert len(notes) == 2
        # The newest two: a reader that starts now follows from them.
        async with (
            open_zookeeper_store(zookeeper_hosts) as reader,
            aclosing(reader.partition_state_updates()) as updates,
        ):
            with trio.fail_after(DEADLINE):
                assert versioned(await anext(updates)) == {key: (1, 4, (1,), 4)}


async def test_deleting_a_topic_removes_its_states(zookeeper_hosts: str) -> None:
    async with controller(zookeeper_hosts) as (store, epoch):
        placement = await replicated_topic(store)
        writes = [
            StateWrite(key=key, state=state(1, 0, 1, 2, 3), expected_version=-1)
            for key in keys_of(placement)
        ]
        assert await store.write_partition_states(epoch, writes) == ()
        await store.delete_topic("orders")
        assert await store.partition_states() == {}
        path = partition_state_path(placement.topic_id)
        assert await raw(zookeeper_hosts, lambda client: client.exists(path)) is None
        # The name created again starts with none.
        again = await replicated_topic(store)
        assert await store.read_partition_states(keys_of(again)) == {}


async def test_a_broker_of_layout_3_registered_holds_off_replicated_topics(
    zookeeper_hosts: str,
) -> None:
    """A rolling upgrade from layout 3: the first broker of layout 4 upgrades the store, but a
    broker of layout 3 still running would find a topic with replica lists (or a setting it does
    not know) unreadable, and with it every topic: no such topic is created until it is gone."""
    write_layout(zookeeper_hosts, {"version": 3, "slots": 50})
    old_broker = await trio.to_thread.run_sync(_raw_client, zookeeper_hosts)
    try:
        # How a broker of layout 3 registers: no layout, no log directory.
        old_broker.create(
            "/brokers/ids/5",
            json.dumps({"host": "127.0.0.1", "port": 9095}).encode(),
            ephemeral=True,
            makepath=True,
        )
        async with open_zookeeper_store(zookeeper_hosts, coordinator_slots=50) as store:
            assert read_layout(zookeeper_hosts) == {"version": 4, "slots": 50}
            await store.register_broker(
                BrokerInfo(broker_id=1, host="127.0.0.1", port=9091), log_dir=DIRS[1]
            )
            refused = "broker 5 runs layout 3 or older: restart it first"
            with pytest.raises(InvalidReplicationFactor, match=refused):
                await store.create_topic("orders", ((1, 5, 2),))
            with pytest.raises(InvalidReplicationFactor, match=refused):
                await store.create_topic("orders", (1,), ((MIN_INSYNC_REPLICAS, "1"),))
            assert await store.topics() == {}
            plain = await store.create_topic("plain", (1, 5))  # what layout 3 reads
            await trio.to_thread.run_sync(old_broker.stop)
            with trio.fail_after(DEADLINE):
                while 5 in {b.broker_id for b in await store.brokers()}:
                    await trio.sleep(0.05)
            replicated = await store.create_topic("orders", ((1, 5, 2),))
            assert await store.topics() == {"plain": plain, "orders": replicated}
            registration = await raw(zookeeper_hosts, lambda client: client.get("/brokers/ids/1"))
            assert json.loads(registration[0]) == {
                "host": "127.0.0.1",
                "port": 9091,
                "layout": 4,
                "log_dir": str(DIRS[1]),
            }
    finally:
        await trio.to_thread.run_sync(old_broker.stop)
        await trio.to_thread.run_sync(old_broker.close)


async def test_many_states_are_written_in_parts_under_the_request_limit(
    zookeeper_hosts: str,
) -> None:
    """ZooKeeper drops a request over 1 MiB: thousands of states (a broker's death moves a
    third of its leaders) go out as several transactions, each with its note, and a stale one
    among them is reported alone."""
    count = 6000
    async with controller(zookeeper_hosts) as (store, epoch):
        placement = await replicated_topic(store, partitions=count)
        keys = keys_of(placement)
        first = StateWrite(key=keys[4000], state=state(1, 0, 1, 2, 3), expected_version=-1)
        assert await store.write_partition_states(epoch, [first]) == ()
        writes = [
            StateWrite(key=key, state=state(2, 0, 2, 3, 1), expected_version=-1) for key in keys
        ]
        with trio.fail_after(DEADLINE):
            assert await store.write_partition_states(epoch, writes) == (keys[4000],)
            states = await store.partition_states()
        assert len(states) == count
        assert states[keys[4000]].leader == 1
        assert {states[key].leader for key in keys[:4000] + keys[4001:]} == {2}
        notes = await raw(zookeeper_hosts, lambda client: client.get_children(PARTITION_CHANGES))
        assert len(notes) > 2  # the first write's, and the big one's parts


async def test_a_reader_follows_the_states_into_a_new_session(zookeeper_hosts: str) -> None:
    """A watch dies with its session: a reader whose session ended reads again under the next
    one, and hears of what was written meanwhile."""
    async with controller(zookeeper_hosts) as (writer, epoch):
        placement = await replicated_topic(writer, partitions=1)
        [key] = keys_of(placement)
        async with (
            open_zookeeper_store(zookeeper_hosts) as reader,
            aclosing(reader.partition_state_updates()) as updates,
        ):
            with trio.fail_after(DEADLINE):
                assert await anext(updates) == {}
            await expire_session(zookeeper_hosts, reader)
            first = StateWrite(key=key, state=state(1, 0, 1, 2, 3), expected_version=-1)
            assert await writer.write_partition_states(epoch, [first]) == ()
            with trio.fail_after(DEADLINE):
                assert versioned(await anext(updates)) == {key: (1, 0, (1, 2, 3), 0)}
