"""One coordinator slot's view of the ZooKeeper store (docs/design.md#coordinator-slots): the
store a group coordinator runs on when it coordinates that slot alone.

The view changes the office (``OfficeStore``) alone: the coordinator takes the slot's office,
checks the slot's contact and recovers the slot's groups (and those with offsets only) through it;
everything else is the ZooKeeper store's (``ForwardingCluster``). Its writes carry the slot's
epoch, which the store admits only for the slot's groups, so a coordinator of one slot cannot
write another slot's group.

A coordinator of every group on ZooKeeper (a benchmark's, a test's) runs on the view of the one
slot of a count of 1: there is no other office on ZooKeeper, so that taking, holding and losing an
office, and what its writes check, is one path.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs

from .forwarding import ForwardingCluster
from .interface import GroupRecord, MetadataStore
from .zookeeper import ZooKeeperStore

__all__ = ["SlotStore"]


@attrs.define(eq=False)
class SlotStore(ForwardingCluster[ZooKeeperStore]):
    slot: int = 0
    slots: int = 1

    async def take_office(self, broker_id: int) -> int:
        return await self.inner.take_slot(broker_id, self.slot, self.slots)

    async def wait_office_lost(self, *, suspended_grace: float | None = None) -> None:
        """Return once the slot's office may be over (``ZooKeeperStore.wait_slot_lost``)."""
        await self.inner.wait_slot_lost(self.slot, suspended_grace=suspended_grace)

    def in_contact_until(self) -> float:
        return self.inner.slot_in_contact_until(self.slot)

    async def coordinator_id(self) -> int | None:
        return (await self.inner.slot_holders()).get(self.slot)

    async def groups(self) -> Mapping[str, GroupRecord]:
        return types.MappingProxyType(dict(await self.inner.slot_groups(self.slot, self.slots)))

    async def offset_only_groups(self) -> frozenset[str]:
        return await self.inner.slot_offset_only_groups(self.slot, self.slots)


if TYPE_CHECKING:  # mypy proves here that the class meets the interface
    _conforms: type[MetadataStore] = SlotStore
