"""Benchmark 1, the heartbeat path: server CPU per Ping round trip, and request latency through the
loaded server, next to a bare trio echo server doing the same number of round trips of the same
frame sizes in the same run.

The coordinator pings each consumer every T/3 (T = 10 s, Kafka's old default session timeout: a
Ping per consumer every 3.3 s); the bare clients each send one frame of the Ping response's size
per interval and get one of the Ping request's size back. (At T = 3 s, 10,000 consumers need
10,000 round trips a second: on 2 shared cores the bare echo server itself cannot carry that next
to its load generator, and its accept loop starves, so there is no baseline to compare with.)
CPU is the server process's utime + stime over the window divided by the round trips the load
generator counted in it. Latency is a probe's round trip, one every 20 ms,
through each server while it carries the load (the coordinator's own Ping round trips are timed
inside it and not visible from outside; the probe sees the same queueing). The coordinator figure
also reports how late Pings arrive against their T/3 period (lateness p99).

    python -m bench.heartbeat [--quick]
    python -m bench.heartbeat --metrics-cost 5 [--consumers N]

``--metrics-cost RUNS`` measures what the metrics endpoint (``serve --metrics-port``) adds to
the Ping path: RUNS coordinators with it and RUNS without, interleaved (off, on, on, off, ...,
so that a drift in the machine's load falls on both alike), the one with it scraped every
SCRAPE_EVERY seconds as Prometheus would; it reports each run's CPU per Ping round trip and the
two medians.
"""

from __future__ import annotations

import socket
import statistics
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from bench.harness import (
    ServerProcess,
    Worker,
    all_groups_stable,
    bench_arguments,
    open_bare_clients,
    open_bare_server,
    open_consumers,
    open_coordinator,
    probe_bare,
    probe_coordinator,
    profile_server,
    registered,
    run,
    stats,
    wait_until,
    work_area,
)
from bench.loadgen import PER_WORKER, frame_sizes
from bench.measure import figure, micros_per, now, percentile, reporting_errors

BENCH = "heartbeat"
SESSION_TIMEOUT_MS = 10_000
INTERVAL = SESSION_TIMEOUT_MS / 3000
PROBE_EVERY = 0.02
#: How often the metrics-cost runs scrape the endpoint (Prometheus' default interval is 15 s).
SCRAPE_EVERY = 5.0


async def _window(
    server: ServerProcess, workers: list[Worker], seconds: float, probe: Any
) -> tuple[float, float, list[float], list[dict[str, Any]]]:
    """Reset the counters, then (cpu seconds, wall seconds, probe rtts, stats) over ``seconds``."""
    for worker in workers:
        await worker.command("reset")
    cpu0, t0 = server.cpu_seconds(), now()
    rtts = await probe(seconds)
    cpu1, t1 = server.cpu_seconds(), now()
    return cpu1 - cpu0, t1 - t0, rtts, await stats(workers)


@asynccontextmanager
async def stable_coordinator(
    work: Path, n: int, *args: str, settle: float, per_worker: int
) -> AsyncIterator[tuple[ServerProcess, list[Worker]]]:
    """A coordinator (``serve`` with ``args``) and ``n`` consumers in groups of 100, every group
    Stable, ``settle`` seconds later."""
    async with (
        open_coordinator(work, "--initial-rebalance-delay", "2", *args) as server,
        open_consumers(
            server,
            n,
            work.parent,
            group_size=100,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            per_worker=per_worker,
        ) as workers,
    ):
        await wait_until(workers, registered(n), timeout=120 + n / 50)
        await wait_until(workers, all_groups_stable, timeout=60)
        await trio.sleep(settle)
        yield server, workers


async def measure(
    work: Path, n: int, *, settle: float, window: float, profile: float, per_worker: int
) -> None:
    sizes = frame_sizes("m1234", "bench", 0)
    async with stable_coordinator(
        work / f"coordinator-{n}", n, settle=settle, per_worker=per_worker
    ) as (server, workers):
        cpu, wall, rtts, coordinator_stats = await _window(
            server,
            workers,
            window,
            lambda seconds: probe_coordinator(server, seconds, PROBE_EVERY),
        )
        pings = sum(s["pings"] for s in coordinator_stats)
        dropped = sum(s["dropped"] for s in coordinator_stats)
        lateness = max(s["lateness_p99"] or 0.0 for s in coordinator_stats)
        rss = server.rss_bytes()
        if profile:
            # After the measured window, so that sampling does not weigh on the figures.
            top = await profile_server(server, profile, work / f"profile-heartbeat-{n}.txt")
            figure(BENCH, "server_profile", None, "share of samples", None, consumers=n, **top)

    request_size, reply_size = sizes.ping[1], sizes.ping[0]
    async with (
        open_bare_server(work / f"bare-{n}") as bare,
        open_bare_clients(
            bare,
            n,
            work,
            interval=INTERVAL,
            request_size=request_size,
            reply_size=reply_size,
        ) as bare_workers,
    ):
        await wait_until(
            bare_workers, lambda st: sum(s["connected"] for s in st) >= n, timeout=120 + n / 50
        )
        await trio.sleep(settle)
        bare_cpu, bare_wall, bare_rtts, bare_stats = await _window(
            bare,
            bare_workers,
            window,
            lambda seconds: probe_bare(bare, seconds, PROBE_EVERY, request_size, reply_size),
        )
        round_trips = sum(s["round_trips"] for s in bare_stats)
        bare_rss = bare.rss_bytes()

    per_ping, per_echo = micros_per(cpu, pings), micros_per(bare_cpu, round_trips)
    common = {"consumers": n, "window_s": round(wall, 2)}
    figure(
        BENCH,
        "cpu_per_round_trip",
        per_ping,
        "us",
        per_echo,
        **common,
        round_trips=pings,
        bare_round_trips=round_trips,
        false_deaths=dropped,
    )
    figure(BENCH, "round_trips_per_s", pings / wall, "1/s", round_trips / bare_wall, **common)
    figure(BENCH, "server_cpu_share", cpu / wall, "cores", bare_cpu / bare_wall, **common)
    for q in (50, 99):
        figure(
            BENCH,
            f"probe_latency_p{q}",
            percentile(rtts, q) * 1e3,
            "ms",
            percentile(bare_rtts, q) * 1e3,
            **common,
            probes=len(rtts),
        )
    figure(BENCH, "ping_lateness_p99", lateness * 1e3, "ms", None, **common)
    figure(BENCH, "server_rss", rss / 2**20, "MiB", bare_rss / 2**20, **common)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _scrape(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return len(response.read())


async def _cpu_per_ping(
    work: Path, n: int, *, metrics: bool, settle: float, window: float, per_worker: int
) -> float:
    """Server CPU per Ping round trip (us) over ``window``, with or without the endpoint."""
    port = _free_port()
    extra = ("--metrics-port", str(port)) if metrics else ()
    async with stable_coordinator(
        work / "coordinator", n, *extra, settle=settle, per_worker=per_worker
    ) as (server, workers):

        async def scraped(seconds: float) -> list[float]:
            async with trio.open_nursery() as nursery:
                if metrics:

                    async def scraper() -> None:
                        while True:
                            await trio.to_thread.run_sync(_scrape, port)
                            await trio.sleep(SCRAPE_EVERY)

                    nursery.start_soon(scraper)
                await trio.sleep(seconds)
                nursery.cancel_scope.cancel()
            return []

        cpu, _, _, coordinator_stats = await _window(server, workers, window, scraped)
    pings = sum(s["pings"] for s in coordinator_stats)
    return cpu / pings * 1e6 if pings else float("nan")


async def metrics_cost(
    work: Path, n: int, runs: int, *, settle: float, window: float, per_worker: int
) -> None:
    results: dict[bool, list[float]] = {False: [], True: []}
    for run_index in range(runs):
        # off/on, then on/off: each setting goes first as often as second
        order = (False, True) if run_index % 2 == 0 else (True, False)
        for metrics in order:
            us = await _cpu_per_ping(
                work, n, metrics=metrics, settle=settle, window=window, per_worker=per_worker
            )
            results[metrics].append(us)
            figure(BENCH, "metrics_cost_run", us, "us", None, consumers=n, metrics=metrics)
    on, off = statistics.median(results[True]), statistics.median(results[False])
    figure(
        BENCH,
        "cpu_per_round_trip_with_metrics",
        on,
        "us",
        off,
        consumers=n,
        runs_each=runs,
        with_metrics=[round(x, 1) for x in results[True]],
        without=[round(x, 1) for x in results[False]],
    )


async def main() -> None:
    parser = bench_arguments(__doc__ or BENCH)
    parser.sized("--profile", quick=0.0, full=10.0, help="py-spy seconds after each window")
    parser.add_argument("--consumers", type=int, nargs="+", help="sizes instead of the defaults")
    parser.add_argument("--per-worker", type=int, default=PER_WORKER, help="consumers per process")
    parser.add_argument(
        "--metrics-cost",
        type=int,
        metavar="RUNS",
        help="compare CPU per Ping with and without the metrics endpoint, RUNS each",
    )
    args = parser.parse()
    profile = args.profile
    sizes = args.consumers or ([200] if args.quick else [5000, 10000])
    # The window is a whole number of Ping periods: consumers registered in the same instant are
    # pinged in the same instant, so a window shorter than a period can hold no Ping at all (CI
    # measured none once, in a 3 s window), and a fraction of one counts a burst or not by chance.
    settle, window = (1.5, 2 * INTERVAL) if args.quick else (5.0, 6 * INTERVAL)
    with work_area(args.work_dir, BENCH) as work:
        if args.metrics_cost:
            n = args.consumers[0] if args.consumers else 2000
            await metrics_cost(
                work,
                n,
                args.metrics_cost,
                settle=settle,
                window=window,
                per_worker=args.per_worker,
            )
            return
        for n in sizes:
            with reporting_errors(BENCH, "cpu_per_round_trip", consumers=n):
                await measure(
                    work,
                    n,
                    settle=settle,
                    window=window,
                    profile=profile,
                    per_worker=args.per_worker,
                )


if __name__ == "__main__":
    run(main)
