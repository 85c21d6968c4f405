"""The coordinator slots of a cluster of brokers sharing a ZooKeeper store: each broker
coordinates the groups of the slots it holds (docs/design.md#coordinator-slots).

Whenever a broker registers or goes, or a slot's office is taken or given up (ZooKeeper child
watches), and at least every second (the watches fire once and are armed again with each read, so
the poll is the backstop), the broker reads the live brokers and the slots' holders, plans who
should hold each slot (``statemachine.slots.plan_slots``: the same plan on every broker from the
same reads), stands for the slots the plan gives it and hands off the ones it holds beyond its
share. Each slot it holds runs a group coordinator of its own on that slot's view of the store
(store/slot_store.py), with the slot's own epoch, lease and office checks: when a broker dies or
joins, only the slots that move change coordinator, and only their groups fail over.

A handoff is a clean end of the slot's office: the coordinator stops (no more Pings, so no lease
is renewed), flushes its offsets, and only then releases the slot, which the planned holder is
waiting to take; like any successor, that one starts no partition before the leases granted
before it took office have run out (docs/design.md#ownership-lease). A slot's office that ends
without a handoff (the session expired, the connection stayed lost beyond the grace, a successor
refused its writes) closes its coordinator the same way, and the plan decides who stands again.

With replication served, each slot held also runs the controller of the replicated partitions
hashed onto it (broker/controller.py), under the slot's epoch, started and ended with the slot's
coordinator; the broker's controllers share one view of the partition states, the topics and the
live brokers' log directories. The holder of slot 0 also sweeps deleted topics' partition states
(broker/state_sweeper.py), under that slot's epoch too.
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial

import attrs
import trio
import trio_util

from broker.controller import ControlInputs, control_slot
from broker.leader_offsets import Connect, LeaderHighWatermarks
from broker.offices import BySlot, ClusterView
from broker.state_sweeper import SWEEPER_SLOT, sweep_states
from consumer.runtime import first_cause
from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import GroupCoordinator, open_group_coordinator
from coordinator.observer import NULL_OBSERVER, CoordinatorObserver
from coordinator.validation import LogEnd
from protocol.types import BrokerInfo
from statemachine.partition_state import PartitionKey
from statemachine.slots import plan_slots
from store import Deposed, MetadataStore, StoreError, StoreUnavailable, TopicPlacement
from store.slot_store import SlotStore
from store.zookeeper import ZooKeeperStore

__all__ = ["Elector", "open_elector"]

log = logging.getLogger(__name__)

#: How often the broker reads the cluster and plans the slots again when no watch fired: the
#: backstop for a change the watches missed (docs/design.md#coordinator-slots).
PLAN_INTERVAL = 1.0
#: After a watch fired, how long the broker lets further changes gather before it reads: a
#: broker's death deletes its registration and its slots' nodes one by one, and taking many slots
#: fires a watch for each; one read then serves them all.
PLAN_GATHER = 0.02
#: A clean stop or handoff releases the slot within this bound, or leaves it to the session.
RELEASE_BOUND = 5.0


@attrs.define(eq=False)
class _Standing:
    """This broker standing for, or holding, one slot."""

    slot: int
    #: Set to give the slot up: a handoff once held, giving up the wait before.
    handoff: trio.Event = attrs.Factory(trio.Event)
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    coordinator: GroupCoordinator | None = None

    def give_up(self) -> None:
        self.handoff.set()
        if self.coordinator is None:
            self.scope.cancel()  # still waiting to take office: stop waiting


#: Replicas per partition of a cluster's topic created without a factor (Kafka's recommended
#: ``default.replication.factor``): one broker may die and another be down for maintenance.
CLUSTER_REPLICATION_FACTOR = 3


@attrs.define(eq=False)
class Elector:
    """This broker's share of the coordinator slots, as its connections route to them
    (broker/offices.py)."""

    store: ZooKeeperStore
    config: CoordinatorConfig
    broker: BrokerInfo
    #: This broker's partition log ends, for checking offsets (coordinator.validation.LogEnd).
    log_end: LogEnd | None = None
    #: Told what each coordinator this broker runs sees (metrics): coordinator/observer.py.
    observer: CoordinatorObserver = NULL_OBSERVER
    #: How each slot's coordinator sees its view of the store (the metrics time it).
    timed: Callable[[MetadataStore], MetadataStore] = attrs.field(default=lambda store: store)
    #: What the controllers of the slots held here decide from; None: no slot runs a controller
    #: (an elector made without :func:`open_elector`, as some tests make one).
    control: ControlInputs | None = None
    #: The check of commits against the leaders' high watermarks (with ``control`` only).
    high_watermarks: LeaderHighWatermarks | None = None
    by_slot: trio_util.AsyncValue[BySlot] = attrs.Factory(
        lambda: trio_util.AsyncValue(types.MappingProxyType({}))
    )
    #: The slots' holders as last read (slot -> broker id).
    holders: Mapping[int, int] = attrs.Factory(dict)
    topics: Mapping[str, TopicPlacement] = attrs.Factory(dict)
    #: The live brokers as last read, by listener ("": the default one).
    brokers: dict[str, tuple[BrokerInfo, ...]] = attrs.Factory(dict)
    _standing: dict[int, _Standing] = attrs.Factory(dict)

    @property
    def fixed(self) -> bool:
        return False

    @property
    def default_replication_factor(self) -> int:
        return self.config.default_replication_factor or CLUSTER_REPLICATION_FACTOR

    async def view(self, listener: str) -> ClusterView:
        brokers = self.brokers.get(listener)
        if brokers is None:
            brokers = self.brokers[listener] = await self.store.brokers(listener or None)
        # This broker's own slots as they are now, not as last read.
        me = self.broker.broker_id
        holders = {slot: broker for slot, broker in self.holders.items() if broker != me}
        holders.update(dict.fromkeys(self.by_slot.value, me))
        states = {} if self.control is None else self.control.states
        return ClusterView(topics=self.topics, brokers=brokers, holders=holders, states=states)

    async def wait_states(self, keys: tuple[PartitionKey, ...]) -> None:
        if self.control is not None:
            await self.control.wait_states(keys)

    async def _watch_topics(self, *, task_status: trio.TaskStatus[None]) -> None:
        async with contextlib.aclosing(self.store.topic_updates()) as updates:
            async for topics in updates:
                self.topics = topics
                if self.control is not None:
                    self.control.set_topics(topics)
                task_status.started()
                task_status = trio.TASK_STATUS_IGNORED

    async def _watch_states(self, control: ControlInputs) -> None:
        """Forever: the partition states as the store's change notes tell them; a watch the
        store ended (its first read failed) starts again a second later."""
        while True:
            try:
                async with contextlib.aclosing(self.store.partition_state_updates()) as updates:
                    async for changed in updates:
                        control.learn(changed)
            except StoreUnavailable as exc:
                log.warning(
                    "broker %d cannot read the partition states: %s", self.broker.broker_id, exc
                )
            await trio.sleep(PLAN_INTERVAL)

    async def _plan(self, nursery: trio.Nursery) -> None:
        """Forever: read the cluster, stand for the slots the plan gives this broker and give up
        the others."""
        me = self.broker.broker_id
        slots = self.config.coordinator_slots
        while True:
            seen: int | None = None
            try:
                seen, live, holders = await self.store.read_cluster()
                for listener in [name for name in self.brokers if name]:
                    self.brokers[listener] = await self.store.brokers(listener)
                if self.control is not None:
                    self.control.set_live(await self.store.broker_dirs())
            except StoreUnavailable as exc:
                log.warning("broker %d cannot read the cluster: %s", me, exc)
            else:
                self.brokers[""] = live
                self.holders = holders
                self._tell_coordinators()
                plan = plan_slots(slots, [b.broker_id for b in live], holders)
                for slot in range(slots):
                    standing = self._standing.get(slot)
                    if plan.get(slot) == me and standing is None:
                        self._standing[slot] = standing = _Standing(slot=slot)
                        nursery.start_soon(self._hold, standing)
                    elif plan.get(slot) != me and standing is not None:
                        standing.give_up()
                    elif holders.get(slot) == me and standing is None:
                        # Taken by a wait given up as its transaction went through.
                        nursery.start_soon(self._abandon, slot)
            with trio.move_on_after(PLAN_INTERVAL):
                if seen is not None:
                    await self.store.cluster_changed(seen)
                    await trio.sleep(PLAN_GATHER)
                else:
                    await trio.sleep_forever()

    def _tell_coordinators(self) -> None:
        """The live brokers as just read, to the coordinators of the slots held here: their
        StartFetchers name each partition's broker at the address it has now, not the one it had
        when the office was taken (a broker restarted on another port or host)."""
        listeners = {name: brokers for name, brokers in self.brokers.items() if name}
        for standing in self._standing.values():
            if standing.coordinator is not None:
                standing.coordinator.brokers = self.brokers[""]
                standing.coordinator.brokers_by_listener.update(listeners)

    async def _abandon(self, slot: int) -> None:
        with contextlib.suppress(StoreError):
            await self.store.abandon_slot(slot)

    async def _hold(self, standing: _Standing) -> None:
        """Take the slot's office and coordinate its groups until the office ends or is handed
        off; then release it, so that the next holder need not wait for this session."""
        slot = standing.slot
        me = self.broker.broker_id
        try:
            with standing.scope:
                slot_store = SlotStore(
                    inner=self.store, slot=slot, slots=self.config.coordinator_slots
                )
                async with open_group_coordinator(
                    self.timed(slot_store),
                    self.config,
                    self.broker,
                    log_end=self.log_end,
                    observer=self.observer,
                    high_watermarks=self.high_watermarks,
                ) as coordinator:
                    standing.coordinator = coordinator
                    self._publish(slot, coordinator)
                    ends = [partial(self.store.wait_slot_lost, slot), standing.handoff.wait]
                    if self.control is not None:
                        ends.append(
                            partial(
                                control_slot,
                                self.store,
                                self.control,
                                slot=slot,
                                epoch=coordinator.epoch,
                            )
                        )
                        if slot == SWEEPER_SLOT:
                            ends.append(partial(sweep_states, self.store, epoch=coordinator.epoch))
                    try:
                        await trio_util.wait_any(*ends)
                    finally:
                        self._publish(slot, None)
            if standing.handoff.is_set():
                log.info("broker %d hands slot %d off", me, slot)
            else:
                log.warning("broker %d lost slot %d", me, slot)
        except* Deposed as deposed:
            log.warning("broker %d was deposed from slot %d: %s", me, slot, first_cause(deposed))
        except* StoreUnavailable as unavailable:
            log.warning("broker %d cannot hold slot %d: %s", me, slot, first_cause(unavailable))
        finally:
            del self._standing[slot]
            with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_BOUND):
                try:
                    await self.store.release_slot(slot)
                except StoreError as exc:
                    log.warning("broker %d could not release slot %d: %s", me, slot, exc)

    def _publish(self, slot: int, coordinator: GroupCoordinator | None) -> None:
        by_slot = dict(self.by_slot.value)
        if coordinator is None:
            by_slot.pop(slot, None)
        else:
            by_slot[slot] = coordinator
        self.by_slot.value = types.MappingProxyType(by_slot)


@contextlib.asynccontextmanager
async def open_elector(
    store: ZooKeeperStore,
    config: CoordinatorConfig,
    broker: BrokerInfo,
    *,
    log_end: LogEnd | None = None,
    observer: CoordinatorObserver = NULL_OBSERVER,
    timed: Callable[[MetadataStore], MetadataStore] = lambda store: store,
    connect: Connect = trio.open_tcp_stream,
) -> AsyncIterator[Elector]:
    """Take this broker's share of the coordinator slots for the duration of the block, and
    hand them off at its end. The slots held run the controllers of the replicated partitions
    hashed onto them; their coordinators check commits of partitions led elsewhere with their
    leaders, reached through ``connect``.
    """
    elector = Elector(
        store=store,
        config=config,
        broker=broker,
        log_end=log_end,
        observer=observer,
        timed=timed,
        control=ControlInputs(slots=config.coordinator_slots),
    )
    await store.occupy_single_office()
    async with trio.open_nursery() as nursery:
        await nursery.start(elector._watch_topics)
        if elector.control is not None:
            elector.high_watermarks = LeaderHighWatermarks(
                me=broker.broker_id,
                control=elector.control,
                topics=lambda: elector.topics,
                brokers=lambda: elector.brokers.get("", ()),
                nursery=nursery,
                connect=connect,
            )
            nursery.start_soon(elector._watch_states, elector.control)
        nursery.start_soon(elector._plan, nursery)
        try:
            yield elector
        finally:
            nursery.cancel_scope.cancel()
