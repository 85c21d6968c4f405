"""How much the governor lets go at a step (coordinator/overload.py,
docs/design.md#shedding-load), on stand-ins for the groups: what each step chooses, not how a
group is let go (tests/coordinator/test_shedding_groups.py has that, with the real coordinator)."""

from __future__ import annotations

from typing import cast

import attrs

from coordinator.driver import GroupDriver
from coordinator.overload import Governor


@attrs.define
class _Lag:
    latest: float = 0.0


@attrs.define
class StandInBudget:
    """The broker's CPU, all used or not: ``cost`` cores a member (None: never measured), under
    ``limit`` (``CpuBudget`` measures a real process: tests/coordinator/test_cpu_budget.py)."""

    limit: float = 0.125
    cost: float | None = None
    all_used: bool = True
    members: dict[object, int] = attrs.field(factory=dict)

    def saturated(self) -> bool:
        return self.all_used

    def held(self) -> int:
        return sum(self.members.values())

    def room(self, keep: float) -> float | None:
        return None if self.cost is None else keep * self.limit / self.cost


@attrs.define
class _Group:
    members: dict[str, object]


@attrs.define(eq=False)
class _Driver:
    group_id: str
    group: _Group


def _groups(count: int, size: int) -> dict[str, GroupDriver]:
    """``count`` groups of ``size`` members, g0 the oldest."""
    return {
        f"g{i}": cast(
            GroupDriver,
            _Driver(group_id=f"g{i}", group=_Group({f"m{j}": None for j in range(size)})),
        )
        for i in range(count)
    }


def test_a_quota_lowered_under_the_broker_lets_go_enough_at_once_for_the_rest_to_fit() -> None:
    """9,000 members cost 0.27 of a core (30 µs a second each); the quota is now 0.125: those
    kept must need at most 80% of it, 3,333 of them, so 5,667 go at the first step (57 groups of
    100), not half, which would leave more than fits; and no more while those kept fit."""
    groups = _groups(90, 100)
    budget = StandInBudget(limit=0.125, cost=0.27 / 9000)
    governor = Governor(lag=_Lag(), bound=0.5, budget=budget)
    assert governor.look(groups, 10.0) == []  # one look all used: not yet
    chosen = governor.look(groups, 10.5)
    assert [d.group_id for d in chosen] == [f"g{i}" for i in range(89, 32, -1)]
    for driver in chosen:
        governor.held[driver.group_id] = 16.5
        driver.group.members.clear()
    # Looks during the settle count for nothing; then, all still used but the 3,300 left
    # within the room, nothing more goes: the rest of the CPU is the refusals' and the leaving.
    assert governor.look(groups, 11.0) == governor.look(groups, 12.0) == []
    assert budget.held() == 3300
    assert governor.look(groups, 12.5) == governor.look(groups, 13.0) == []
    assert governor.look(groups, 13.5) == []


def test_all_the_cpu_used_by_members_that_fit_is_the_door_s_to_deal_with() -> None:
    """Newcomers flooding a broker whose members fit: all its CPU goes to refusing them (and to
    the few let in), which the door paces; its members are not let go."""
    groups = _groups(50, 100)
    governor = Governor(lag=_Lag(), bound=0.5, budget=StandInBudget(limit=0.3, cost=0.15 / 5000))
    assert all(governor.look(groups, 10.0 + k / 2) == [] for k in range(10))


def test_a_loop_behind_lets_half_go_then_a_quarter_of_the_rest() -> None:
    """A machine grown busy: the CPU the broker gets is not all its quota, and only the loop's
    lag says it is short, not by how much. Half goes, then a quarter of those left."""
    groups = _groups(10, 10)
    governor = Governor(lag=_Lag(latest=2.0), bound=0.5, budget=StandInBudget(1.0, None, False))
    assert governor.look(groups, 1.0) == []
    first = governor.look(groups, 1.5)
    assert [d.group_id for d in first] == ["g9", "g8", "g7", "g6", "g5"]
    for driver in first:
        governor.held[driver.group_id] = 7.5
        driver.group.members.clear()
    assert governor.look(groups, 3.5) == []
    assert [d.group_id for d in governor.look(groups, 4.0)] == ["g4", "g3"]  # 25% of 50: 13
