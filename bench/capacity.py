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

import tempfile
from pathlib import Path

from bench.harness import (
    all_groups_stable,
    bench_arguments,
    fewest_live,
    figure,
    hold_bare,
    open_bare_clients,
    open_bare_server,
    open_consumers,
    open_coordinator,
    registered,
    reporting_errors,
    run,
    stats,
    wait_until,
)
from bench.loadgen import (
    frame_sizes,
    now,
)

BENCH = "capacity"
SESSION_TIMEOUT_MS = 10_000
POLL = 5.0


async def main() -> None:
    parser = bench_arguments(__doc__ or BENCH)
    parser.add_argument("--consumers", type=int, default=None)
    parser.add_argument("--hold", type=float, default=None)
    parser.add_argument("--bare-hold", type=float, default=None)
    args = parser.parse_args()
    n = args.consumers or (200 if args.quick else 19_000)
    hold = args.hold or (6.0 if args.quick else 300.0)
    bare_hold = args.bare_hold or (4.0 if args.quick else 30.0)
    interval = SESSION_TIMEOUT_MS / 3000
    sizes = frame_sizes("m12345", "capacity", 0)
    with (
        tempfile.TemporaryDirectory(prefix="bench-capacity-") as tmp,
        reporting_errors(BENCH, "consumers_held", consumers=n),
    ):
        work = (args.work_dir or Path(tmp)) / BENCH
        work.mkdir(parents=True, exist_ok=True)
        async with (
            # As many connections as the file limit allows: the default keeps a reserve below
            # it, and this benchmark measures what one process holds at the limit.
            open_coordinator(
                work / "coordinator",
                "--initial-rebalance-delay",
                "3",
                "--max-connections",
                str(n + 100),
            ) as server,
            open_consumers(
                server, n, work, group_size=100, session_timeout_ms=SESSION_TIMEOUT_MS
            ) as workers,
        ):
            started = now()
            await wait_until(workers, registered(n), timeout=60 + n / 20)
            connect_time = now() - started
            try:
                await wait_until(workers, all_groups_stable, timeout=120)
                formed = True
            except RuntimeError:
                formed = False  # some group never finished forming: measured and said anyway
            for worker in workers:
                await worker.command("reset")
            cpu0, t0 = server.cpu_seconds(), now()
            worst_live = await fewest_live(workers, hold, every=POLL)
            cpu, wall = server.cpu_seconds() - cpu0, now() - t0
            st = await stats(workers)
            dropped = sum(s["dropped"] for s in st)
            errors = sum(s["error_count"] for s in st)
            pings = sum(s["pings"] for s in st)
            lateness_max = max(s["lateness_max"] or 0.0 for s in st)
            lateness_p99 = max(s["lateness_p99"] or 0.0 for s in st)
            rss = server.rss_bytes()

        async with (
            open_bare_server(work / "bare") as bare,
            open_bare_clients(
                bare,
                n,
                work,
                interval=interval,
                request_size=sizes.ping[1],
                reply_size=sizes.ping[0],
            ) as bare_workers,
        ):
            baseline = await hold_bare(
                [(bare, bare_workers)], n, hold=bare_hold, connect_timeout=60 + n / 50
            )

        false_deaths = dropped + errors + (n - worst_live)
        common = {
            "consumers": n,
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "hold_s": round(wall, 1),
            "all_groups_formed": formed,
        }
        held = worst_live if false_deaths == 0 else 0
        figure(
            BENCH,
            "consumers_held",
            held,
            "consumers",
            baseline.held[0],
            **common,
            bare_hold_s=round(baseline.wall, 1),
        )
        figure(BENCH, "false_deaths", false_deaths, "consumers", 0, **common)
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
            cpu / pings * 1e6 if pings else None,
            "us",
            baseline.cpu[0] / baseline.round_trips * 1e6 if baseline.round_trips else None,
            **common,
        )
        figure(BENCH, "server_rss", rss / 2**20, "MiB", baseline.rss[0] / 2**20, **common)
        figure(BENCH, "ping_lateness_p99", lateness_p99 * 1e3, "ms", None, **common)
        figure(
            BENCH,
            "ping_lateness_max",
            lateness_max * 1e3,
            "ms",
            None,
            **common,
            deadline_ms=SESSION_TIMEOUT_MS * 2 / 3,
        )


if __name__ == "__main__":
    run(main)
