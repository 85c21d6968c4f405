"""How much of the CPU it may have the broker is using (docs/design.md#shedding-load).

The loop's lag says a broker is over its capacity only once it is, and then only after the
members it let in have started to cost it: a member costs little when it registers, and its
Pings for as long as it stays. Under a CPU quota (a container's ``cpu.max``) the lag says it later
still: the kernel runs the broker at full speed for its share of each period and stops it for
the rest, so the loop looks punctual until the work queued outruns the quota, and by then every
member is late. What the broker can have is known, though (the quota; one core at most, since one
thread runs the loop), and so is what it takes (its own CPU time): the door turns newcomers away
once it takes most of what it can have, before the lag shows anything.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

__all__ = ["CpuBudget", "cpu_limit", "watch_cpu"]

#: The broker's loop runs on one thread: it can use at most one core whatever the quota.
ONE_CORE = 1.0

#: How often the CPU time is sampled, and how far back the use is measured.
SAMPLE_INTERVAL = 1.0
WINDOW = 5.0


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
    """The broker's CPU time over the last ``WINDOW`` seconds against what it may have."""

    share: float = 0.8
    """Of what it may have: above it, the budget is spent and newcomers wait. Below one, so that
    the members already in have room for their rebalances and for the refusals themselves."""
    limit: float = ONE_CORE
    #: (wall seconds, CPU seconds) samples, oldest first.
    _samples: collections.deque[tuple[float, float]] = attrs.field(
        factory=lambda: collections.deque(maxlen=int(WINDOW / SAMPLE_INTERVAL) + 1)
    )

    def sample(self, wall: float, cpu: float, limit: float) -> None:
        self._samples.append((wall, cpu))
        self.limit = limit

    def used(self) -> float:
        """Cores used over the window (0 before two samples)."""
        if len(self._samples) < 2:
            return 0.0
        (wall0, cpu0), (wall1, cpu1) = self._samples[0], self._samples[-1]
        return (cpu1 - cpu0) / (wall1 - wall0) if wall1 > wall0 else 0.0

    def spent(self) -> bool:
        return self.used() > self.share * self.limit


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
