"""Benchmark 2, capacity: consumers one coordinator process holds for ``--hold`` seconds with a
10 s session timeout and no false death (no consumer whose connection the coordinator closed),
next to a bare trio echo server holding as many connections doing one round trip each per Ping
interval, in the same run.

A process may hold at most 20,000 open files, so one coordinator can hold at most ~19,900
consumers; the full run tries 19,000 for 5 minutes (and the bare baseline for 30 s): the issue's
hold time, not a soak test.

    python -m bench.capacity [--quick] [--consumers N] [--hold SECONDS]
"""

from __future__ import annotations

from bench import harness
from bench.loadgen import frame_sizes
from bench.measure import figure, micros_per, now, reporting_errors

BENCH = "capacity"
SESSION_TIMEOUT_MS = 10_000
POLL = 5.0


async def main() -> None:
    parser = harness.bench_arguments(__doc__ or BENCH)
    parser.sized("--consumers", quick=200, full=19_000, kind=int)
    parser.sized("--hold", quick=6.0, full=300.0, help="seconds")
    parser.sized("--bare-hold", quick=4.0, full=30.0, help="seconds")
    args = parser.parse()
    n, hold, bare_hold = args.consumers, args.hold, args.bare_hold
    interval = SESSION_TIMEOUT_MS / 3000
    sizes = frame_sizes("m12345", "capacity", 0)
    with (
        harness.work_area(args.work_dir, BENCH) as work,
        reporting_errors(BENCH, "consumers_held", consumers=n),
    ):
        async with (
            # As many connections as the file limit allows: the default keeps a reserve below
            # it, and this benchmark measures what one process holds at the limit.
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
            started = now()
            await harness.wait_until(workers, harness.registered(n), timeout=60 + n / 20)
            connect_time = now() - started
            formed = await harness.groups_formed(workers, timeout=120)
            held = await harness.hold_consumers(
                workers, n, hold, every=POLL, pids=[server.process.pid]
            )
            rss = server.rss_bytes()

        async with harness.open_bare(work, n, interval=interval, ping=sizes.ping) as servers:
            baseline = await harness.hold_bare(
                servers, n, hold=bare_hold, connect_timeout=60 + n / 50
            )

        (cpu,), wall = held.cpu, held.wall
        common = {
            "consumers": n,
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "hold_s": round(wall, 1),
            "all_groups_formed": formed,
        }
        harness.report_hold(
            BENCH, held, baseline, session_timeout_ms=SESSION_TIMEOUT_MS, common=common
        )
        figure(BENCH, "connect_and_register_time", connect_time, "s", baseline.connect, **common)
        figure(
            BENCH,
            "server_cpu_share",
            cpu / wall,
            "cores",
            baseline.cpu[0] / baseline.wall,
            **common,
        )
        figure(
            BENCH,
            "cpu_per_round_trip",
            micros_per(cpu, held.total("pings")),
            "us",
            micros_per(baseline.cpu[0], baseline.round_trips),
            **common,
        )
        figure(BENCH, "server_rss", rss / 2**20, "MiB", baseline.rss[0] / 2**20, **common)


if __name__ == "__main__":
    harness.run(main)
