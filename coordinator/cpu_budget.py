"""How much of the CPU it may have the broker is using (docs/design.md#shedding-load).

The loop's lag says a broker is over its capacity only once it is, and then only after the
members it let in have started to cost it: a member costs little when it registers, and its
Pings for as long as it stays. Under a CPU quota (a container's ``cpu.max``) the lag says it later
still: the kernel runs the broker at full speed for its share of each period and stops it for
the rest, so the loop looks punctual until the work queued outruns the quota, and by then every
member is late. What the broker can have is known, though (the quota; one core at most, since one
thread runs the loop), and so is what it takes (its own CPU time): the door turns newcomers away
once it takes most of what it can have, before the lag shows anything. And what one member
costs it, measured while it kept up, says how many members fit in what it may have now: the
governor lets go those beyond once it takes all of it (``coordinator/overload.py``).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

__all__ = ["SATURATED", "CpuBudget", "cpu_limit", "watch_cpu"]

#: The broker's loop runs on one thread: it can use at most one core whatever the quota.
ONE_CORE = 1.0

#: How often the CPU time is sampled, and how far back the use is measured: the door's window,
#: and the governor's shorter one (at twice the demand, the members' Pings are a lease late
#: within seconds: docs/design.md#shedding-load).
SAMPLE_INTERVAL = 0.25
WINDOW = 5.0
RECENT = 1.0
#: Of the limit: at least this much used over :data:`RECENT` seconds is all of it (a CFS quota
#: lets the broker run a little past it in some periods and short of it in others).
SATURATED = 0.95

#: A window is steady when its member count varied by at most this share, and says what a
#: member costs when it held at least MEASURED_MEMBERS (fewer cost less than the broker's own
#: upkeep: its samplers, its status page).
STEADY = 0.05
MEASURED_MEMBERS = 100

_RUN: trio.lowlevel.RunVar[CpuBudget] = trio.lowlevel.RunVar("cpu_budget")


def cpu_limit(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float:
    """The cores this process may use: its cgroup's CPU quota (v2 ``cpu.max``, else v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), and one core at most; one core where no quota
    can be read. Read again at every sample: a container's limit may change while it runs."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return ONE_CORE
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = path.lstrip("/")
        try:
            if hierarchy == "0" and controllers == "":
                quota, _, period = (root / relative / "cpu.max").read_text().partition(" ")
                if quota.strip() != "max":
                    return min(ONE_CORE, int(quota) / int(period))
            elif "cpu" in controllers.split(","):
                for mount in (root / controllers, root / "cpu"):
                    quota_file = mount / relative / "cpu.cfs_quota_us"
                    if quota_file.exists():
                        quota_us = int(quota_file.read_text())
                        period_us = int((mount / relative / "cpu.cfs_period_us").read_text())
                        if quota_us > 0:
                            return min(ONE_CORE, quota_us / period_us)
                        break
        except (OSError, ValueError):
            continue
    return ONE_CORE


@attrs.define(eq=False)
class CpuBudget:
    """The broker's CPU time over the last ``WINDOW`` seconds against what it may have, and what
    a member costs it."""

    share: float = 0.8
    """Of what it may have: above it, the budget is spent and newcomers wait. Below one, so that
    the members already in have room for their rebalances and for the refusals themselves."""
    limit: float = ONE_CORE
    #: Members held, by the coordinator that holds them (each governor counts its own).
    members: dict[object, int] = attrs.field(factory=dict)
    cost: float | None = None
    """Cores one member takes (its Pings, its answers, its share of its group's work): the CPU
    used over the latest whole window in which the budget was not spent and the members stayed
    within ``STEADY`` of one number, divided by that number; None until such a window."""
    #: (wall seconds, CPU seconds, members) samples, oldest first.
    _samples: collections.deque[tuple[float, float, int]] = attrs.field(
        factory=lambda: collections.deque(maxlen=int(WINDOW / SAMPLE_INTERVAL) + 1)
    )

    @staticmethod
    def of_run() -> CpuBudget:
        """The current trio run's: the door and every coordinator's governor read the one the
        broker samples (``watch_cpu``); never sampled, it is never spent."""
        try:
            return _RUN.get()
        except LookupError:
            budget = CpuBudget()
            _RUN.set(budget)
            return budget

    def sample(self, wall: float, cpu: float, limit: float) -> None:
        self._samples.append((wall, cpu, self.held()))
        self.limit = limit
        self._learn()

    def held(self) -> int:
        """Members held by every coordinator of the broker, as each last counted."""
        return sum(self.members.values())

    def used(self, over: float = WINDOW) -> float:
        """Cores used since the newest sample at least ``over`` seconds before the latest (the
        oldest kept if none is; a loop far behind samples late). 0 before two samples."""
        if len(self._samples) < 2:
            return 0.0
        wall1, cpu1, _ = self._samples[-1]
        wall0, cpu0, _ = next(
            (sample for sample in reversed(self._samples) if wall1 - sample[0] >= over),
            self._samples[0],
        )
        return (cpu1 - cpu0) / (wall1 - wall0) if wall1 > wall0 else 0.0

    def spent(self) -> bool:
        return self.used() > self.share * self.limit

    def saturated(self) -> bool:
        """Whether the broker used all it may have over the last :data:`RECENT` seconds."""
        return self.used(RECENT) >= SATURATED * self.limit

    def room(self, keep: float) -> float | None:
        """How many members the broker can keep within ``keep`` of what it may have now, at what
        a member cost it while it kept up; None if it never measured that."""
        return None if self.cost is None else keep * self.limit / self.cost

    def _learn(self) -> None:
        """A member's cost, from a full window that was steady: a join or a rebalance under way
        costs far more per member than holding them, and must not be taken for it."""
        if len(self._samples) < (self._samples.maxlen or 0):
            return
        counts = [members for _, _, members in self._samples]
        fewest, most = min(counts), max(counts)
        used = self.used()
        if fewest < MEASURED_MEMBERS or most > fewest * (1 + STEADY):
            return
        if used > self.share * self.limit:
            return  # the door's refusals and what it let in are in that use too
        self.cost = used / most


async def watch_cpu(
    budget: CpuBudget,
    limit: Callable[[], float] = cpu_limit,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Sample the broker's own CPU time and its limit every second until cancelled."""
    task_status.started()
    while True:
        budget.sample(trio.current_time(), time.process_time(), limit())
        await trio.sleep(SAMPLE_INTERVAL)
