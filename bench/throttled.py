"""Benchmark (issue 36): a broker that shares its core with busy loops keeps its members.

The coordinator is pinned to one core, its consumers (bench.loadgen, T = 6 s) to another. Once
every group has formed, the consumers are held ``--baseline-hold`` seconds with the broker alone on
its core (the baseline), then ``--hold`` seconds with ``--busy`` CPU-bound loops pinned beside it
at its own priority, so that it gets about 1/(busy + 1) of the core. Figures: consumers held and
false deaths in each hold, how late Pings came (the members' view of the broker's lag), the
broker's CPU share, and the machine's load average.

    python -m bench.throttled [--quick] [--consumers N] [--hold SECONDS] [--busy K]
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from bench import harness
from bench.measure import figure, now, reporting_errors

BENCH = "throttled"
SESSION_TIMEOUT_MS = 6000
POLL = 2.0
BROKER_CORE = 0
LOAD_CORE = 1


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


async def main() -> None:
    parser = harness.bench_arguments(__doc__ or BENCH)
    parser.sized("--consumers", quick=300, full=5000, kind=int)
    parser.sized("--hold", quick=10.0, full=60.0, help="seconds")
    parser.sized("--baseline-hold", quick=6.0, full=20.0, help="seconds")
    parser.sized("--busy", quick=3, full=3, kind=int, help="busy loops beside the broker")
    args = parser.parse()
    n, hold, busy = args.consumers, args.hold, args.busy
    with (
        harness.work_area(args.work_dir, BENCH) as work,
        reporting_errors(BENCH, "consumers_held", consumers=n),
    ):
        async with (
            harness.open_coordinator(
                work / "coordinator",
                "--initial-rebalance-delay",
                "3",
                "--max-connections",
                str(n + 100),
            ) as server,
            harness.open_consumers(
                server, n, work, group_size=100, session_timeout_ms=SESSION_TIMEOUT_MS
            ) as workers,
        ):
            pid = server.process.pid
            os.sched_setaffinity(pid, {BROKER_CORE})
            for worker in workers:
                os.sched_setaffinity(worker.process.pid, {LOAD_CORE})
            await harness.wait_until(workers, harness.registered(n), timeout=60 + n / 20)
            formed = await harness.groups_formed(workers, timeout=180)
            alone = await harness.hold_consumers(
                workers, n, args.baseline_hold, every=POLL, pids=[pid]
            )
            load_before = os.getloadavg()[0]
            async with busy_loops(busy, BROKER_CORE):
                throttled = await harness.hold_consumers(workers, n, hold, every=POLL, pids=[pid])
            ended = now()
            back = await harness.stats(workers)

        common = {
            "consumers": n,
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "busy_loops": busy,
            "hold_s": round(throttled.wall, 1),
            "baseline_hold_s": round(alone.wall, 1),
            "all_groups_formed": formed,
            "load_before": round(load_before, 2),
        }
        figure(BENCH, "consumers_held", throttled.held, "consumers", alone.held, **common)
        figure(
            BENCH,
            "false_deaths",
            throttled.false_deaths,
            "consumers",
            alone.false_deaths,
            **common,
            dropped=throttled.total("dropped"),
            closed_by_machine=throttled.total("closed_by_machine"),
            errors=throttled.total("error_count"),
            live_after=sum(s["live"] for s in back),
            after_s=round(now() - ended, 1),
        )
        for key in ("lateness_p99", "lateness_max"):
            figure(
                BENCH,
                f"ping_{key}",
                throttled.lateness(key) * 1e3,
                "ms",
                alone.lateness(key) * 1e3,
                **common,
            )
        (cpu,), (cpu_alone,) = throttled.cpu, alone.cpu
        figure(
            BENCH,
            "server_cpu_share",
            cpu / throttled.wall,
            "cores",
            cpu_alone / alone.wall,
            **common,
        )


if __name__ == "__main__":
    harness.run(main)
