"""What a broker coordinates at a moment, as its connections see it: the group coordinators it
runs, by the coordinator slot each holds, and the cluster as it last read it
(docs/design.md#coordinator-slots).

A broker alone on the embedded store runs one coordinator that holds every slot
(``WholeOffice``); a broker of a ZooKeeper cluster holds the slots its election gave it
(broker/election.py). A connection routes each group's request to the coordinator of the group's
slot, and answers NOT_COORDINATOR when this broker holds no such slot.
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections.abc import Mapping
from typing import Protocol

import attrs
import trio
import trio_util

from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import GroupCoordinator
from protocol.types import BrokerInfo
from statemachine.partition_state import PartitionKey, PartitionState
from statemachine.slots import slot_of
from store import StoreUnavailable, TopicPlacement, TopicStore

__all__ = [
    "BySlot",
    "ClusterView",
    "Offices",
    "TopicReads",
    "WholeOffice",
    "coordinator_of",
    "distinct",
    "refresh_brokers",
    "topic_reads",
    "whole_office",
]

#: Slot -> the coordinator this broker runs for it.
BySlot = Mapping[int, GroupCoordinator]


@attrs.frozen(kw_only=True)
class ClusterView:
    """What a broker answers ClusterMetadata from."""

    topics: Mapping[str, TopicPlacement]
    brokers: tuple[BrokerInfo, ...]
    #: Slot -> the broker holding it (a slot nobody holds now is left out).
    holders: Mapping[int, int]
    #: The replicated partitions' states as last heard of (none while replication is not
    #: served; a partition of factor 1 has none: its one broker leads it).
    states: Mapping[PartitionKey, PartitionState] = types.MappingProxyType({})


class Offices(Protocol):
    @property
    def broker(self) -> BrokerInfo: ...

    @property
    def config(self) -> CoordinatorConfig: ...

    @property
    def store(self) -> TopicStore:
        """What a connection reads and writes topics through."""
        ...

    @property
    def by_slot(self) -> trio_util.AsyncValue[BySlot]:
        """Changes only when this broker takes or gives up a slot."""
        ...

    @property
    def fixed(self) -> bool:
        """Whether ``by_slot`` never changes (no connection needs to watch it)."""
        ...

    @property
    def default_replication_factor(self) -> int:
        """Replicas per partition of a topic created without a factor."""
        ...

    async def view(self, listener: str) -> ClusterView:
        """The cluster as the clients of ``listener`` reach it ("": the default listener's);
        ``StoreUnavailable`` if it was never read and cannot be now."""
        ...

    async def wait_states(self, keys: tuple[PartitionKey, ...]) -> None:
        """Return once every one of ``keys`` (partitions of a new replicated topic) has a
        state, as ``view`` would answer; at once where there are no controllers."""
        ...


def distinct(by_slot: BySlot) -> list[GroupCoordinator]:
    """Each coordinator of ``by_slot`` once (one may hold every slot), in slot order."""
    return list({id(c): c for _slot, c in sorted(by_slot.items())}.values())


def group_slot(offices: Offices, group_id: str) -> int:
    """The coordinator slot ``group_id`` hashes onto (docs/design.md#coordinator-slots)."""
    return slot_of(group_id, offices.config.coordinator_slots)


def coordinator_of(offices: Offices, group_id: str) -> GroupCoordinator | None:
    """The coordinator this broker runs for ``group_id``'s slot, if it holds that slot."""
    by_slot: BySlot = offices.by_slot.value
    return by_slot.get(group_slot(offices, group_id))


@attrs.define(eq=False)
class WholeOffice:
    """One coordinator holding every slot: a broker alone on its store."""

    coordinator: GroupCoordinator
    by_slot: trio_util.AsyncValue[BySlot] = attrs.field(init=False)
    _holders: Mapping[int, int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        every = dict.fromkeys(range(self.coordinator.config.coordinator_slots), self.coordinator)
        self.by_slot = trio_util.AsyncValue(types.MappingProxyType(every))
        me = self.coordinator.broker.broker_id
        self._holders = types.MappingProxyType(dict.fromkeys(every, me))

    @property
    def broker(self) -> BrokerInfo:
        return self.coordinator.broker

    @property
    def config(self) -> CoordinatorConfig:
        return self.coordinator.config

    @property
    def default_replication_factor(self) -> int:
        """A broker alone on its store has no other to hold a replica."""
        return self.config.default_replication_factor or 1

    @property
    def store(self) -> TopicStore:
        return self.coordinator.store

    @property
    def fixed(self) -> bool:
        return True

    async def view(self, listener: str) -> ClusterView:
        coordinator = self.coordinator
        # Brokers of a cluster come and go after the coordinator took office; the cached list
        # serves while the store cannot answer.
        with contextlib.suppress(StoreUnavailable):
            await refresh_brokers(coordinator, listener)
        return ClusterView(
            topics=coordinator.topics,
            brokers=coordinator.brokers_by_listener.get(listener, coordinator.brokers),
            holders=self._holders,
        )

    async def wait_states(self, keys: tuple[PartitionKey, ...]) -> None:
        """A broker alone on its store replicates nothing: no state to wait for."""


#: The one WholeOffice of each coordinator, so that its connections share it.
_WHOLE: weakref.WeakKeyDictionary[GroupCoordinator, WholeOffice] = weakref.WeakKeyDictionary()


def whole_office(coordinator: GroupCoordinator) -> WholeOffice:
    """The offices of a broker whose one coordinator holds every slot."""
    office = _WHOLE.get(coordinator)
    if office is None:
        office = _WHOLE[coordinator] = WholeOffice(coordinator=coordinator)
    return office


async def refresh_brokers(coordinator: GroupCoordinator, listener: str) -> None:
    """Read the live brokers again, as the clients of ``listener`` reach them ("": as the
    default listener's do)."""
    coordinator.brokers = await coordinator.store.brokers()
    if listener:
        coordinator.brokers_by_listener[listener] = await coordinator.store.brokers(listener)


@attrs.define(eq=False)
class TopicReads:
    """Reads of every topic from the store, shared among the requests that need one.

    A ClusterMetadata naming a topic the broker's view lacks reads the topics again, in case it
    was created elsewhere since the view was read (the topic watch lags a write on another
    broker). A read costs the store one read per topic (ZooKeeper: a node each), so a small
    request naming a topic that does not exist would otherwise cost as much as the cluster is
    large, once per request, as many at once as clients send them. Here at most one read is in
    flight per store, and it answers every request that arrived before it began: each still
    sees every topic created before it asked."""

    store: TopicStore
    #: The last read: when it began, and what it found.
    _latest: tuple[float, Mapping[str, TopicPlacement]] | None = None
    #: Set when the read in flight ends (None: none is).
    _reading: trio.Event | None = None

    async def since(self, moment: float) -> Mapping[str, TopicPlacement]:
        """The topics as a read begun after ``moment`` (``trio.current_time()``) found them;
        ``StoreUnavailable`` if the store cannot be read."""
        while True:
            latest = self._latest
            if latest is not None and latest[0] > moment:
                return latest[1]
            if self._reading is not None:
                await self._reading.wait()
                continue  # that read may have begun too early, or failed
            reading = self._reading = trio.Event()
            began = trio.current_time()
            try:
                topics = await self.store.topics()
            finally:
                self._reading = None
                reading.set()
            self._latest = (began, topics)
            return topics


_READS: weakref.WeakKeyDictionary[TopicStore, TopicReads] = weakref.WeakKeyDictionary()


def topic_reads(store: TopicStore) -> TopicReads:
    """The one TopicReads of ``store``, shared by every connection of the broker."""
    reads = _READS.get(store)
    if reads is None:
        reads = _READS[store] = TopicReads(store=store)
    return reads
