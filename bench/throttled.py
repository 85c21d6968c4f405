"""Benchmark (issue 36): a broker starved of CPU keeps the members it serves.

The coordinator is pinned to one core, its consumers (bench.loadgen, T = ``--session-timeout-ms``)
to the other. Once every group has formed, the consumers are held ``--baseline-hold`` seconds with
the broker alone on its core (the baseline), then ``--hold`` seconds throttled: ``--throttle
quota`` limits it to ``--cores`` of CPU time with a cgroup's CFS quota (what a container limit
does), ``--throttle busy`` pins ``--busy`` CPU-bound loops beside it at its own priority, so that it
gets about 1/(busy + 1) of the core. ``--offer N``: N more consumers (other groups) start joining
when the throttle does, so that the broker is offered more than it can serve; with
``--shed-above-lag`` the broker refuses them while its loop is behind, and they retry after its
hint; and while its loop stays behind it lets whole groups go, telling their members to come
back after a hint (docs/design.md#shedding-load): those are counted ``shed``, not dropped.
After the throttle, every consumer must be live again: how long that took is reported against
3T.

Figures: the members held and false deaths over the throttled hold (those in before it), how late
Pings came (the members' view of the broker's lag) and the broker's own loop lag (its
``broker_loop_lag_seconds``), the newcomers refused and when they were all in, the broker's CPU
share, and the machine's load average.

    python -m bench.throttled [--quick] [--consumers N] [--hold SECONDS] [--throttle quota|busy]
        [--cores C] [--busy K] [--tls] [--offer N] [--shed-above-lag SECONDS]
"""

from __future__ import annotations

import os
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path

from bench import harness
from bench.measure import figure, now, reporting_errors
from bench.throttle import (
    busy_loops,
    cpu_quota,
    deaths_by_cause,
    lag_summary,
    loop_lag_buckets,
    throttled_periods,
)
from bench.tls import certificates, server_args
from launch.zookeeper import free_ports

BENCH = "throttled"
POLL = 2.0
BROKER_CORE = 0
LOAD_CORE = 1
GROUP_SIZE = 100


async def main() -> None:
    parser = harness.bench_arguments(__doc__ or BENCH)
    parser.sized("--consumers", quick=300, full=5000, kind=int)
    parser.sized("--hold", quick=10.0, full=60.0, help="seconds")
    parser.sized("--baseline-hold", quick=6.0, full=20.0, help="seconds")
    parser.add_argument("--throttle", choices=("busy", "quota"), default="busy")
    parser.add_argument("--busy", type=int, default=3, help="busy loops beside the broker")
    parser.add_argument("--cores", type=float, default=0.25, help="the quota, in cores")
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--tls", action="store_true", help="consumers connect over TLS")
    parser.add_argument("--offer", type=int, default=0, help="newcomers during the throttle")
    parser.add_argument("--shed-above-lag", type=float, default=None, help="the broker's door")
    parser.add_argument(
        "--rejoin",
        action="store_true",
        help="a dropped consumer registers again (the library's way)",
    )
    args = parser.parse()
    n, hold, timeout_ms = args.consumers, args.hold, args.session_timeout_ms
    throttle = (
        {"throttle": "quota", "cores": args.cores}
        if args.throttle == "quota"
        else {"throttle": "busy", "busy_loops": args.busy}
    )
    with (
        harness.work_area(args.work_dir, BENCH) as work,
        reporting_errors(BENCH, "consumers_held", consumers=n),
    ):
        ca, server_pem = certificates(work)
        (metrics_port,) = free_ports(1)
        door = [] if args.shed_above_lag is None else ["--shed-above-lag", str(args.shed_above_lag)]
        broker_args = [
            "--initial-rebalance-delay",
            "3",
            "--max-connections",
            str(n + args.offer + 100),
            f"--metrics-port={metrics_port}",
            *door,
        ]
        tls_ca = ca if args.tls else None
        async with AsyncExitStack() as stack:
            server = await stack.enter_async_context(
                harness.open_coordinator(
                    work / "coordinator", *server_args(args.tls, server_pem, *broker_args)
                )
            )
            workers = await stack.enter_async_context(
                harness.open_consumers(
                    server,
                    n,
                    work,
                    group_size=GROUP_SIZE,
                    session_timeout_ms=timeout_ms,
                    tls_ca=tls_ca,
                    rejoin=args.rejoin,
                )
            )
            newcomers = await stack.enter_async_context(
                harness.open_consumers(
                    server,
                    args.offer,
                    work,
                    group_size=GROUP_SIZE,
                    session_timeout_ms=timeout_ms,
                    tls_ca=tls_ca,
                    group_prefix="x",
                    member_prefix="x",
                    first=n,
                    idle=True,
                    rejoin=args.rejoin,
                )
            )
            pid = server.process.pid
            os.sched_setaffinity(pid, {BROKER_CORE})
            for worker in (*workers, *newcomers):
                os.sched_setaffinity(worker.process.pid, {LOAD_CORE})
            await harness.wait_until(workers, harness.registered(n), timeout=60 + n / 20)
            formed = await harness.groups_formed(workers, timeout=180)
            alone = await harness.hold_consumers(
                workers, n, args.baseline_hold, every=POLL, pids=[pid]
            )
            load_before = os.getloadavg()[0]
            lag_before = loop_lag_buckets(metrics_port)
            deaths_before = deaths_by_cause(metrics_port)
            with ExitStack() as limits:
                group: Path | None = (
                    limits.enter_context(cpu_quota([pid], args.cores, "bench-throttled"))
                    if args.throttle == "quota"
                    else None
                )
                async with AsyncExitStack() as busy:
                    if args.throttle == "busy":
                        await busy.enter_async_context(busy_loops(args.busy, BROKER_CORE))
                    for worker in newcomers:
                        await worker.command(f"join {worker.share}")
                    throttled = await harness.hold_consumers(
                        workers, n, hold, every=POLL, pids=[pid]
                    )
                    periods = 0 if group is None else throttled_periods(group)
                    lag = lag_summary(lag_before, loop_lag_buckets(metrics_port))
                    after_deaths = deaths_by_cause(metrics_port)
                    deaths = {
                        cause: died
                        for cause, count in after_deaths.items()
                        if (died := count - deaths_before.get(cause, 0))
                    }
                    offered = await harness.stats(newcomers)
            ended = now()
            everyone = (*workers, *newcomers)
            back_within = 3 * timeout_ms / 1000
            try:
                await harness.wait_until(
                    everyone, harness.all_live(n + args.offer), timeout=back_within, every=0.2
                )
                back_s: float | None = round(now() - ended, 1)
            except RuntimeError:
                back_s = None
            after = await harness.stats(everyone)

        common = {
            "consumers": n,
            "session_timeout_ms": timeout_ms,
            "tls": args.tls,
            "offered": args.offer,
            "shed_above_lag": args.shed_above_lag,
            "rejoin": args.rejoin,
            **throttle,
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
            # Members let go with their groups and told so (docs/design.md#shedding-load): not
            # false deaths, though absent at some polls; the false deaths are then the drops
            # and the errors.
            shed=throttled.total("shed"),
            dropped_or_failed=throttled.total("dropped") + throttled.total("error_count"),
            closed_by_machine=throttled.total("closed_by_machine"),
            errors=throttled.total("error_count"),
            broker_deaths_by_cause=deaths,
            first_errors=[e for s in throttled.stats for e in s["errors"]][:3],
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
        figure(
            BENCH,
            "loop_lag_max_under",
            lag["lag_max_under_s"],
            "s",
            round(timeout_ms / 3000, 2),
            **common,
            loop_lag_p99_under_s=lag["lag_p99_under_s"],
            wakes=lag["wakes"],
            bound="T/3 less the margin (docs/design.md#a-broker-that-falls-behind)",
        )
        if args.offer:
            figure(
                BENCH,
                "newcomers_in_during_throttle",
                sum(s["registered"] for s in offered),
                "consumers",
                args.offer,
                **common,
                refused_busy=sum(s["refused_busy"] for s in offered),
                errors=sum(s["error_count"] for s in offered),
            )
        figure(
            BENCH,
            "all_back_after_throttle",
            back_s,
            "s",
            back_within,
            **common,
            live=sum(s["live"] for s in after),
            expected=n + args.offer,
            shed=sum(s["shed"] for s in after),
            dropped=sum(s["dropped"] for s in after),
            newcomers_refused_busy=sum(s["refused_busy"] for s in after[len(workers) :]),
        )
        (cpu,), (cpu_alone,) = throttled.cpu, alone.cpu
        figure(
            BENCH,
            "server_cpu_share",
            cpu / throttled.wall,
            "cores",
            cpu_alone / alone.wall,
            **common,
            periods_throttled=periods,
        )


if __name__ == "__main__":
    harness.run(main)
