"""The coordinator slots: a group's slot is stable, and the plan shares the slots evenly while
moving only what a change requires (docs/design.md#coordinator-slots)."""

from __future__ import annotations

import collections
import math

from hypothesis import given
from hypothesis import strategies as st

from statemachine.slots import DEFAULT_SLOTS, moved_slots, plan_slots, slot_of


def test_a_groups_slot_is_the_same_in_every_process() -> None:
    # Fixed values (CRC-32): a salted hash would give other numbers in another process.
    assert slot_of("orders", 50) == 12
    assert slot_of("payments", 50) == 6
    assert slot_of("console-consumer-1", 50) == 0
    assert slot_of("", 50) == 0
    assert slot_of("orders", 1) == 0


def test_many_groups_spread_over_every_slot() -> None:
    counts = collections.Counter(slot_of(f"group-{i}", DEFAULT_SLOTS) for i in range(3000))
    assert len(counts) == DEFAULT_SLOTS
    assert max(counts.values()) < 2 * 3000 / DEFAULT_SLOTS


def test_one_broker_holds_every_slot() -> None:
    assert plan_slots(4, [7], {}) == {0: 7, 1: 7, 2: 7, 3: 7}


def test_a_joining_broker_takes_only_its_share_from_the_others() -> None:
    alone = plan_slots(50, [1], {})
    two = plan_slots(50, [1, 2], alone)
    assert collections.Counter(two.values()) == {1: 25, 2: 25}
    three = plan_slots(50, [1, 2, 3], two)
    assert sorted(collections.Counter(three.values()).values()) == [16, 17, 17]
    # Only the slots the newcomer takes move.
    assert set(moved_slots(two, three).values()) == {3}
    assert len(moved_slots(two, three)) == collections.Counter(three.values())[3]


def test_a_dead_brokers_slots_and_only_those_move() -> None:
    three = plan_slots(50, [1, 2, 3], plan_slots(50, [1, 2], plan_slots(50, [1], {})))
    two = plan_slots(50, [1, 3], three)
    moved = moved_slots(three, two)
    assert set(moved) == {slot for slot, broker in three.items() if broker == 2}
    assert sorted(collections.Counter(two.values()).values()) == [25, 25]


def test_no_live_broker_holds_nothing() -> None:
    assert plan_slots(50, [], {0: 1}) == {}


@given(
    slots=st.integers(min_value=1, max_value=64),
    live=st.sets(st.integers(min_value=0, max_value=9), min_size=1, max_size=8),
    holders=st.dictionaries(st.integers(0, 63), st.integers(0, 11)),
)
def test_every_plan_is_balanced_and_keeps_what_it_can(
    slots: int, live: set[int], holders: dict[int, int]
) -> None:
    plan = plan_slots(slots, live, holders)
    assert sorted(plan) == list(range(slots))
    assert set(plan.values()) <= live
    counts = [sum(1 for b in plan.values() if b == broker) for broker in live]
    assert max(counts) - min(counts) <= 1
    assert max(counts) <= math.ceil(slots / len(live))
    # A slot leaves a live holder only if that holder ends with its full share.
    for slot, holder in holders.items():
        if slot < slots and holder in live and plan[slot] != holder:
            assert counts[sorted(live).index(holder)] >= slots // len(live)
    # Planning again changes nothing.
    assert plan_slots(slots, live, plan) == plan
