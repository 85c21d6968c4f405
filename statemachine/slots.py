"""Coordinator slots: which slot a group belongs to, and how the slots are shared among the live
brokers (docs/design.md#coordinator-slots).

A group's slot is a stable hash of its id modulo the cluster's slot count: the same on every
broker, in every process and every release, which Python's salted ``hash()`` is not. The count is
fixed when the cluster's store is created; a different count would put one group in two slots,
under two coordinators.

The plan is pure: given the slot count, the live brokers and who holds what now, it says who
should hold each slot. It keeps every slot where it is unless its holder is gone or holds more
than its share, so a change moves only the slots it must; afterwards no broker holds more than
``ceil(slots / brokers)`` and the counts differ by at most one.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

__all__ = ["DEFAULT_SLOTS", "moved_slots", "plan_slots", "slot_of"]

#: Kafka's ``offsets.topic.num.partitions``: enough slots to share among tens of brokers, few
#: enough that each is a meaningful share of the groups.
DEFAULT_SLOTS = 50


def slot_of(group_id: str, slots: int) -> int:
    """The slot of ``group_id`` among ``slots``: CRC-32 of its UTF-8 bytes modulo the count."""
    if slots < 1:
        raise ValueError(f"a cluster has at least one coordinator slot, not {slots}")
    return zlib.crc32(group_id.encode("utf-8", "surrogatepass")) % slots


def plan_slots(slots: int, live: Iterable[int], holders: Mapping[int, int]) -> dict[int, int]:
    """Who should hold each slot (slot -> broker id): every slot held by a live broker, each
    broker holding ``slots // n`` or one more, the ones with one more chosen among those that
    hold the most now; a slot stays with its holder while that holder is live and within its
    share. With no live broker, nobody holds anything."""
    brokers = sorted(set(live))
    if not brokers:
        return {}
    base, extra = divmod(slots, len(brokers))
    held: dict[int, list[int]] = {broker: [] for broker in brokers}
    for slot in range(slots):
        holder = holders.get(slot)
        if holder in held:
            held[holder].append(slot)
    # The larger shares go to the brokers that hold the most already: fewest slots move.
    by_holding = sorted(brokers, key=lambda broker: (-len(held[broker]), broker))
    quota = {broker: base + (1 if rank < extra else 0) for rank, broker in enumerate(by_holding)}
    plan: dict[int, int] = {}
    for broker in brokers:
        for slot in held[broker][: quota[broker]]:
            plan[slot] = broker
    free = iter([slot for slot in range(slots) if slot not in plan])
    for broker in brokers:
        for _ in range(quota[broker] - min(len(held[broker]), quota[broker])):
            plan[next(free)] = broker
    return dict(sorted(plan.items()))


def moved_slots(before: Mapping[int, int], after: Mapping[int, int]) -> dict[int, int]:
    """The slots ``after`` gives to another broker than ``before`` did (slot -> new holder)."""
    return {slot: broker for slot, broker in after.items() if before.get(slot) != broker}
