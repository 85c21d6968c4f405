"""One coordinator slot's view of the ZooKeeper store (docs/design.md#coordinator-slots): the
store a group coordinator runs on when it coordinates that slot alone.

The coordinator takes office, waits for the office to end, checks contact and reads its groups
(and those with offsets only) through this view, which turns each into the slot's counterpart;
every other call goes to the store as it is. Its writes carry the slot's epoch, which the store
admits only for the slot's groups, so a coordinator of one slot cannot write another slot's group.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import attrs

from .interface import GroupRecord
from .zookeeper import ZooKeeperStore

__all__ = ["SlotStore"]


@attrs.frozen(kw_only=True)
class SlotStore:
    inner: ZooKeeperStore
    slot: int
    slots: int

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def take_office(self, broker_id: int) -> int:
        return await self.inner.take_slot(broker_id, self.slot, self.slots)

    async def wait_office_lost(self) -> None:
        await self.inner.wait_slot_lost(self.slot)

    def in_contact_until(self) -> float:
        return self.inner.slot_in_contact_until(self.slot)

    async def coordinator_id(self) -> int | None:
        return (await self.inner.slot_holders()).get(self.slot)

    async def groups(self) -> Mapping[str, GroupRecord]:
        return types.MappingProxyType(dict(await self.inner.slot_groups(self.slot, self.slots)))

    async def offset_only_groups(self) -> frozenset[str]:
        return await self.inner.slot_offset_only_groups(self.slot, self.slots)
