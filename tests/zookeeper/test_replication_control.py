"""The controllers of replicated partitions (docs/design.md#replication): each coordinator slot's
holder gives the partitions hashed onto its slot their first states, elects a new leader when a
leader's broker goes, never elects a replica back on a wiped disk, and writes nothing once
deposed; CreateTopic places replicas and waits for the first states. Brokers are electors in
this process on real ZooKeeper (their slots' coordinators and controllers), real clock: every
wait is bounded."""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import attrs
import pytest
import trio

from broker import dispatch
from broker.controller import ControlInputs, control_slot
from broker.election import Elector, open_elector
from coordinator.config import CoordinatorConfig
from coordinator.limits import RequestLimits
from protocol import (
    ClusterMetadataRequest,
    CreatePartitionsRequest,
    CreateTopicRequest,
    ErrorCode,
)
from protocol.types import BrokerInfo
from statemachine.partition_state import NO_LEADER, IsrEntry, PartitionKey, PartitionState
from store import Deposed, TopicPlacement
from store.zookeeper import open_zookeeper_store
from tests.zookeeper.test_zookeeper_store import DEADLINE, expire_session

pytestmark = pytest.mark.realtime

#: Few slots, so that a handful of brokers share them quickly.
CONFIG = CoordinatorConfig(coordinator_slots=4)
LIMITS = RequestLimits()


@attrs.define(eq=False)
class Brokers:
    """Brokers of one cluster, each started and stopped on its own."""

    hosts: str
    nursery: trio.Nursery
    running: dict[int, tuple[trio.CancelScope, trio.Event, Elector]] = attrs.Factory(dict)

    async def start(self, broker_id: int, log_dir: uuid.UUID) -> Elector:
        done = trio.Event()

        async def run(*, task_status: trio.TaskStatus[tuple[trio.CancelScope, Elector]]) -> None:
            try:
                with trio.CancelScope() as scope:
                    async with open_zookeeper_store(self.hosts) as store:
                        info = BrokerInfo(broker_id=broker_id, host="localhost", port=broker_id)
                        await store.register_broker(info, log_dir=log_dir)
                        async with open_elector(store, CONFIG, info) as elector:
                            task_status.started((scope, elector))
                            await trio.sleep_forever()
            finally:
                done.set()

        started: tuple[trio.CancelScope, Elector] = await self.nursery.start(run)
        scope, elector = started
        self.running[broker_id] = (scope, done, elector)
        return elector

    async def stop(self, broker_id: int) -> None:
        """The broker goes: its session ends with it, and its registration."""
        scope, done, _elector = self.running.pop(broker_id)
        scope.cancel()
        with trio.fail_after(DEADLINE):
            await done.wait()

    def control(self, broker_id: int) -> ControlInputs:
        control = self.running[broker_id][2].control
        assert control is not None
        return control


@contextlib.asynccontextmanager
async def brokers(hosts: str) -> AsyncIterator[Brokers]:
    async with trio.open_nursery() as nursery:
        cluster = Brokers(hosts=hosts, nursery=nursery)
        try:
            yield cluster
        finally:
            nursery.cancel_scope.cancel()


def keys_of(placement: TopicPlacement) -> list[PartitionKey]:
    return [
        PartitionKey(topic_id=placement.topic_id, partition=p)
        for p in range(placement.partition_count)
    ]


async def seen(control: ControlInputs, check: Callable[[], bool]) -> None:
    """Wait (bounded) until ``check`` holds of what the broker of ``control`` knows."""
    with trio.fail_after(DEADLINE):
        await control.changes.wait_value(lambda _: check())


async def every_broker_seen(cluster: Brokers, count: int) -> None:
    """Wait until each broker's controllers know ``count`` live brokers: a partition created
    before its controller saw a broker starts without it in sync (its leader adds it later)."""
    for broker_id in cluster.running:
        control = cluster.control(broker_id)
        await seen(control, partial(_knows, control, count))


def _knows(control: ControlInputs, count: int) -> bool:
    return len(control.live) == count


def summary(state: PartitionState | None) -> Any:
    if state is None:
        return None
    return state.leader, state.leader_epoch, tuple(e.broker_id for e in state.isr)


async def test_a_replicated_topic_gets_first_states_and_survives_its_leaders_death(
    zookeeper_hosts: str,
) -> None:
    dirs = {b: uuid.uuid4() for b in (1, 2, 3)}
    async with brokers(zookeeper_hosts) as cluster:
        electors = [await cluster.start(b, dirs[b]) for b in (1, 2, 3)]
        await every_broker_seen(cluster, 3)
        request = CreateTopicRequest(topic="orders", partitions=6, replication_factor=3)
        first = electors[0]
        # Its coordinators check commits against the leaders' high watermarks.
        coordinators = list(first.by_slot.value.values())
        assert coordinators
        assert {id(c.context.high_watermarks) for c in coordinators} == {id(first.high_watermarks)}
        error = await dispatch.create_topic(
            first.store, request, LIMITS, random.Random(0), wait_states=first.wait_states
        )
        assert error is ErrorCode.NONE
        placement = (await first.store.topics())["orders"]
        assert placement.replication_factor == 3
        # Answered once every partition had its first state: the asking broker knows them all.
        states = {key: cluster.control(1).states.get(key) for key in keys_of(placement)}
        for key, replicas in zip(keys_of(placement), placement.replicas, strict=True):
            assert summary(states[key]) == (replicas[0], 0, replicas)
        # Spread: each broker leads two of the six partitions.
        assert sorted(r[0] for r in placement.replicas) == [1, 1, 2, 2, 3, 3]

        # Broker 1 goes: each partition it led has a new leader, under the next epoch, and it
        # leaves every ISR; the others keep their leader and epoch.
        survivor = cluster.control(3)
        await seen(survivor, lambda: set(survivor.states) >= set(keys_of(placement)))
        await cluster.stop(1)

        def moved() -> bool:
            return all(
                1 not in [e.broker_id for e in survivor.states[key].isr]
                for key in keys_of(placement)
            )

        await seen(survivor, moved)
        for key, replicas in zip(keys_of(placement), placement.replicas, strict=True):
            state = survivor.states[key]
            rest = tuple(b for b in replicas if b != 1)
            if replicas[0] == 1:
                assert summary(state) == (rest[0], 1, rest)
            else:
                assert summary(state) == (replicas[0], 0, rest)
        # Everybody sees the same: the store holds what the survivor's view shows.
        stored = await electors[2].store.partition_states()
        assert {k: summary(stored[k]) for k in keys_of(placement)} == {
            k: summary(survivor.states[k]) for k in keys_of(placement)
        }
        # And ClusterMetadata answers it: each partition's leader, its replicas and its ISR.
        view = await electors[2].view("")
        answer = await dispatch.cluster_metadata(
            ClusterMetadataRequest(topics=("orders",), group_id=None),
            topics=view.topics,
            brokers=view.brokers,
            coordinator_id=-1,
            coordinator_epoch=-1,
            limits=LIMITS,
            states=view.states,
        )
        [topic], [replicated] = answer.topics, answer.replicas
        described = [
            (p.broker_id, r.leader_epoch, r.replicas, r.isr)
            for p, r in zip(topic.partitions, replicated.partitions, strict=True)
        ]
        assert described == [
            (state.leader, state.leader_epoch, replicas, tuple(e.broker_id for e in state.isr))
            for state, replicas in zip(
                [survivor.states[k] for k in keys_of(placement)], placement.replicas, strict=True
            )
        ]
        assert {b.broker_id for b in view.brokers} == {2, 3}


async def test_a_replica_back_on_a_wiped_disk_is_not_elected(
    zookeeper_hosts: str,
) -> None:
    """Broker 2 goes, then broker 1, the last in sync: the partition has no leader and keeps
    its ISR. Broker 1 back with a new log directory is not the replica that had the records;
    back on its own directory it leads again, under the next epoch only."""
    dirs = {b: uuid.uuid4() for b in (1, 2, 3)}
    async with brokers(zookeeper_hosts) as cluster:
        for b in (1, 2, 3):
            await cluster.start(b, dirs[b])
        await every_broker_seen(cluster, 3)
        bystander = cluster.control(3)
        placement = await cluster.running[3][2].store.create_topic("orders", ((1, 2),))
        [key] = keys_of(placement)
        await seen(bystander, lambda: summary(bystander.states.get(key)) == (1, 0, (1, 2)))

        await cluster.stop(2)
        await seen(bystander, lambda: summary(bystander.states.get(key)) == (1, 0, (1,)))
        await cluster.stop(1)
        await seen(bystander, lambda: summary(bystander.states.get(key)) == (NO_LEADER, 1, (1,)))
        assert bystander.states[key].isr == (IsrEntry(broker_id=1, log_dir=dirs[1]),)

        wiped = uuid.uuid4()
        await cluster.start(1, wiped)
        await seen(bystander, lambda: bystander.live.get(1) == wiped)
        # Deciding on that view elects nobody.
        assert summary(bystander.states[key]) == (NO_LEADER, 1, (1,))
        await cluster.stop(1)

        await cluster.start(1, dirs[1])
        await seen(bystander, lambda: bystander.states[key].leader == 1)
        # Epoch 2: nothing was elected while broker 1 ran on the wiped disk.
        assert summary(bystander.states[key]) == (1, 2, (1,))


async def test_a_deposed_controller_writes_nothing(zookeeper_hosts: str) -> None:
    """A controller whose session ended, its slot taken by another, decides an election and
    has it refused: ``Deposed``, the state as it was."""
    dirs = {b: uuid.uuid4() for b in (1, 2, 3)}
    async with open_zookeeper_store(zookeeper_hosts) as old:
        old_epoch = await old.take_slot(1, 0, 1)
        placement = await old.create_topic("orders", ((1, 2, 3),))
        [key] = keys_of(placement)
        inputs = ControlInputs(slots=1)
        inputs.set_topics(await old.topics())
        inputs.set_live(dirs)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: control_slot(old, inputs, slot=0, epoch=old_epoch))
            await seen(inputs, lambda: key in inputs.states)
            nursery.cancel_scope.cancel()
        assert summary(inputs.states[key]) == (1, 0, (1, 2, 3))

        await expire_session(zookeeper_hosts, old)
        async with open_zookeeper_store(zookeeper_hosts) as new:
            with trio.fail_after(DEADLINE):
                new_epoch = await new.take_slot(2, 0, 1)
            assert new_epoch > old_epoch
            inputs.set_live({b: dirs[b] for b in (2, 3)})  # broker 1 went: an election
            with trio.fail_after(DEADLINE), pytest.raises(Deposed):
                # Through whatever session kazoo has by now (it retries while unavailable).
                await control_slot(old, inputs, slot=0, epoch=old_epoch)
            stored = await new.partition_states()
            assert summary(stored[key]) == (1, 0, (1, 2, 3))
            assert stored[key].version == 0


async def test_create_topic_refuses_a_factor_beyond_the_live_brokers(
    zookeeper_hosts: str,
) -> None:
    dirs = {b: uuid.uuid4() for b in (1, 2)}
    async with brokers(zookeeper_hosts) as cluster:
        for b in (1, 2):
            await cluster.start(b, dirs[b])
        await every_broker_seen(cluster, 2)
        elector = cluster.running[1][2]
        store = elector.store

        async def create(topic: str, factor: int, **kw: Any) -> ErrorCode:
            request = CreateTopicRequest(topic=topic, partitions=2, replication_factor=factor, **kw)
            return await dispatch.create_topic(
                store, request, LIMITS, wait_states=elector.wait_states
            )

        # Never fewer replicas than asked: refused whatever else the request says.
        assert await create("b", 3) is ErrorCode.INVALID_REPLICATION_FACTOR  # 2 live
        assert await create("c", 2, broker_ids=(1,)) is ErrorCode.INVALID_REPLICATION_FACTOR
        assert await create("z", 0) is ErrorCode.INVALID_REPLICATION_FACTOR
        assert set(await store.topics()) == set()
        # Factor 1, named or the default here, is the topic of old: no state, nobody controls it.
        assert await create("d", 1) is ErrorCode.NONE
        assert await create("e", -1) is ErrorCode.NONE
        topics = await store.topics()
        assert topics["d"].replication_factor == topics["e"].replication_factor == 1
        assert await create("f", 2) is ErrorCode.NONE
        assert set(await store.partition_states()) == set(keys_of((await store.topics())["f"]))
        # Partitions added to it come with as many replicas, and their controllers' states.
        grow = CreatePartitionsRequest(topic="f", total_partitions=3)
        assert await dispatch.add_partitions(store, grow, LIMITS) is ErrorCode.NONE
        grown = (await store.topics())["f"]
        assert [len(set(replicas)) for replicas in grown.replicas] == [2, 2, 2]
        control = cluster.control(1)
        await seen(control, lambda: set(control.states) >= set(keys_of(grown)))
