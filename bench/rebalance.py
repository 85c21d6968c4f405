"""Benchmark 3, rebalance latency by group size: from a trigger (one more member registers) to
every member holding its StartFetcher of the new generation, for one group over one topic of
10,000 partitions, next to the bare cost of two round trips per member (a StopFetcher-sized and a
StartFetcher-sized frame to every connection, and their answers) on a bare trio server in the same
run.

The coordinator's time includes everything a rebalance does: stop all, the assignment, writing the
generation and assignment to the embedded store (fsynced), the forced offset commit, start all.
Each size is measured ``--repeats`` times on a fresh server; the median is the figure.

    python -m bench.rebalance [--quick] [--sizes 10,100] [--partitions N]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import trio

from bench.harness import (
    ServerProcess,
    bare_broadcast,
    bench_arguments,
    create_topic,
    open_bare_clients,
    open_bare_server,
    open_consumers,
    open_coordinator,
    profile_server,
    registered,
    run,
    stable_at,
    stable_generation,
    stats,
    top_frames,
    wait_until,
    work_area,
)
from bench.loadgen import frame_sizes
from bench.measure import figure, reporting_errors

BENCH = "rebalance"
TOPIC = "rebalance"


def session_timeout_ms(members: int) -> int:
    # Large groups get a longer session so that a slow rebalance is measured, not failed.
    return 10_000 if members >= 1000 else 3000


async def coordinator_latencies(
    work: Path, members: int, partitions: int, repeats: int, profile: float = 0
) -> list[float]:
    # The eager protocol: every member stopped and started, the seeds' rebalance that Results I
    # measured (bench/incremental.py measures the incremental one beside it).
    async with open_coordinator(
        work / f"coordinator-{members}",
        "--initial-rebalance-delay",
        "1",
        "--rebalance-protocol",
        "eager",
    ) as server:
        await create_topic(server, TOPIC, partitions)
        started = time.monotonic()  # real-clock: against the workers' CLOCK_MONOTONIC stamps
        async with open_consumers(
            server,
            members,
            work,
            group_size=10**9,  # one group, joiners included
            session_timeout_ms=session_timeout_ms(members),
            topic=TOPIC,
            per_worker=max(1000, (members + 1) // 2),
        ) as workers:
            await wait_until(workers, registered(members), timeout=60 + members / 50)
            formed = await wait_until(workers, stable_at(members), timeout=60 + members / 50)
            generation, stable = stable_generation(formed)
            # How a crowd forms: every member connecting at once, to all of them Stable; one
            # generation means one rebalance (each join restarted the initial delay of 1 s).
            figure(
                BENCH,
                "formation",
                (stable - started) * 1e3,
                "ms",
                None,
                members=members,
                partitions=partitions,
                generation=generation,
            )
            await settle(server)
            latencies = []
            # The last worker's next member ids follow everyone's: no DUPLICATE_MEMBER_ID.
            for k in range(1, repeats + 1):
                generation, _ = stable_generation(await stats(workers))
                t0 = (await workers[-1].command("join 1"))["t0"]
                st = await wait_until(
                    workers, stable_at(members + k, above=generation), timeout=60 + members / 50
                )
                latencies.append(stable_generation(st)[1] - t0)
            if profile:
                # One more, unmeasured rebalance, sampled with py-spy.
                path = work / f"profile-rebalance-{members}.txt"
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(profile_server, server, profile, path)
                    await trio.sleep(0.5)  # py-spy attaches
                    generation, _ = stable_generation(await stats(workers))
                    await workers[-1].command("join 1")
                    await wait_until(
                        workers,
                        stable_at(members + repeats + 1, above=generation),
                        timeout=60 + members / 50,
                    )
                figure(
                    BENCH,
                    "server_profile",
                    None,
                    "share of samples",
                    None,
                    members=members,
                    **top_frames(path),
                )
            return latencies


async def settle(server: ServerProcess, at_most: float = 60) -> None:
    """Wait until the broker has finished its one-time work on the new topic (it opens 10,000
    partition logs in threads, seconds of CPU), so that a rebalance is measured, not that: until
    the server's CPU per second stops falling, or is below a fifth of a core."""
    previous = None
    with trio.move_on_after(at_most):
        while True:
            before = server.cpu_seconds()
            await trio.sleep(1)
            rate = server.cpu_seconds() - before
            if rate < 0.2 or (previous is not None and rate > previous - 0.05):
                return
            previous = rate


async def bare_latencies(work: Path, members: int, partitions: int, repeats: int) -> list[float]:
    sizes = frame_sizes("m1234", TOPIC, partitions // members)
    async with (
        open_bare_server(work / f"bare-{members}", [sizes.stop, sizes.start]) as bare,
        open_bare_clients(bare, members, work, interval=0) as workers,
    ):
        await wait_until(
            workers, lambda st: sum(s["connected"] for s in st) >= members, timeout=120
        )
        await trio.sleep(0.5)  # the hellos are read
        return [await bare_broadcast(bare) for _ in range(repeats)]


async def main() -> None:
    parser = bench_arguments(__doc__ or BENCH)
    parser.add_argument("--repeats", type=int, default=3)
    parser.sized("--profile", quick=0.0, full=10.0, help="py-spy seconds on the largest group")
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(n) for n in text.split(",")],
        default=None,
        help="comma-separated group sizes (default: 10,100,1000,5000; quick: 10,50)",
    )
    parser.sized("--partitions", quick=1000, full=10_000, kind=int)
    args = parser.parse()
    sizes = args.sizes or ([10, 50] if args.quick else [10, 100, 1000, 5000])
    partitions = args.partitions
    with work_area(args.work_dir, BENCH) as work:
        for members in sizes:
            with reporting_errors(BENCH, "rebalance_latency", members=members):
                profile = args.profile
                ours = await coordinator_latencies(
                    work, members, partitions, args.repeats, profile if members == sizes[-1] else 0
                )
                bare: list[float] = []
                # A baseline that fails (the bare server falling over) still leaves our figure.
                with reporting_errors(BENCH, "bare_broadcast", members=members):
                    bare = await bare_latencies(work, members, partitions, args.repeats)
                common = {"members": members, "partitions": partitions, "repeats": args.repeats}
                figure(
                    BENCH,
                    "rebalance_latency",
                    statistics.median(ours) * 1e3,
                    "ms",
                    statistics.median(bare) * 1e3 if bare else None,
                    **common,
                    samples_ms=[round(x * 1e3, 1) for x in ours],
                    bare_samples_ms=[round(x * 1e3, 2) for x in bare],
                )


if __name__ == "__main__":
    run(main)
