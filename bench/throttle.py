"""Starving a broker of CPU for the overload benchmarks (issue 36): a cgroup's CFS quota, which
gives a process a fixed share of a core however quiet the rest of the machine is, and busy loops
pinned beside it at its own priority, for where the kernel lets no cgroup be made.

Also the broker's own account of how late its loop ran (``broker_loop_lag_seconds`` on its
metrics endpoint), which a throttled run reports beside the members' view of it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path

import trio

from bench import harness

CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


@contextmanager
def cpu_quota(pids: list[int], cores: float, name: str) -> Iterator[Path]:
    """The processes ``pids`` limited to ``cores`` of CPU time each period, together, until the
    block ends (cgroup v2's ``cpu.max``, else v1's ``cpu.cfs_quota_us``); yields the cgroup's
    directory (its ``cpu.stat`` counts the periods throttled). Needs root; a machine without
    either controller is an error that says so, not a run that quietly measures nothing."""
    quota = max(1_000, round(cores * PERIOD_US))
    if (CGROUP_V2 / "cgroup.controllers").exists():
        root = CGROUP_V2
        group = root / name
        group.mkdir(exist_ok=True)
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    elif (CGROUP_V1 / "cpu.cfs_quota_us").exists():
        root = CGROUP_V1
        group = root / name
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        raise RuntimeError(
            f"no cgroup CPU controller at {CGROUP_V2} or {CGROUP_V1}: use --throttle busy"
        )
    try:
        for pid in pids:
            (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        for pid in pids:
            with suppress(OSError):  # it may have exited
                (root / "cgroup.procs").write_text(str(pid))
        with suppress(OSError):
            group.rmdir()


def throttled_periods(group: Path) -> int:
    """How many of the cgroup's periods ran out of quota so far."""
    for line in (group / "cpu.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "nr_throttled":
            return int(value)
    return 0


@asynccontextmanager
async def busy_loops(count: int, core: int) -> AsyncIterator[None]:
    """``count`` processes spinning on ``core`` until the block ends."""
    spin = [sys.executable, "-c", "while True: pass"]
    loops = [await trio.lowlevel.open_process(spin) for _ in range(count)]
    try:
        for process in loops:
            os.sched_setaffinity(process.pid, {core})
        yield
    finally:
        for process in loops:
            process.kill()
        with trio.CancelScope(shield=True):
            for process in loops:
                await process.wait()


def loop_lag_buckets(metrics_port: int) -> dict[float, float]:
    """The broker's ``broker_loop_lag_seconds`` histogram: cumulative count per upper bound."""
    return {
        float(name.split('le="', 1)[1].split('"', 1)[0]): value
        for name, value in harness.metrics_samples(metrics_port)
        if name.startswith("broker_loop_lag_seconds_bucket{")
    }


def deaths_by_cause(metrics_port: int) -> dict[str, int]:
    """The broker's ``coordinator_member_deaths_total``, by cause (``shed``: let go with their
    groups, docs/design.md#shedding-load)."""
    prefix = 'coordinator_member_deaths_total{cause="'
    return {
        name[len(prefix) :].split('"', 1)[0]: int(value)
        for name, value in harness.metrics_samples(metrics_port)
        if name.startswith(prefix)
    }


def lag_summary(before: dict[float, float], after: dict[float, float]) -> dict[str, float | int]:
    """What the loop lag was between two readings of its histogram: how many wakes were measured,
    the bucket bound under which every one of them fell (inf: some were above the last bound),
    and the bound under which 99% did."""
    counts = {bound: after[bound] - before.get(bound, 0.0) for bound in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    worst = next((b for b, c in counts.items() if c >= total), float("inf"))
    p99 = next((b for b, c in counts.items() if c >= 0.99 * total), float("inf"))
    return {"wakes": int(total), "lag_max_under_s": worst, "lag_p99_under_s": p99}
