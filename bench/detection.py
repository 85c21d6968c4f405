"""Benchmark 4, detection to Stable: one member of a group of 100 fails, and we time until every
survivor holds its StartFetcher of the next generation.

* Frozen: the member's load-generator process (holding just that member) gets SIGSTOP, like a GC
  pause that never ends. The coordinator must notice the missed Ping and then wait out the
  member's ownership lease (session timeout T plus a 0.5 s margin after the last request it
  received, which may be the unanswered Ping sent T/3 after its last answer) before its
  partitions may start elsewhere: measured from the member's last answered Ping the bound is
  T/3 + T + 0.5 s, and the target is that bound + 0.5 s.
* Killed: the member's process gets SIGKILL, so its connection closes. A closed connection is a
  death at once and the partitions may move at once: the baseline is the bare cost of two round
  trips to the 99 survivors on a bare trio server in the same run.

    python -m bench.detection [--quick]
"""

from __future__ import annotations

import signal
import statistics
from functools import partial
from pathlib import Path

from bench.harness import (
    bench_arguments,
    create_topic,
    open_consumers,
    open_coordinator,
    run,
    stable_at,
    stable_generation,
    stats,
    wait_until,
    work_area,
)
from bench.measure import figure, now, reporting_errors
from bench.rebalance import bare_latencies

BENCH = "detection"
TOPIC = "detection"
SESSION_TIMEOUT_MS = 3000
LEASE_MARGIN = 0.5  # CoordinatorConfig.lease_margin's default
ONE_GROUP = 10**9
PARTITIONS = 1000


async def fail_one(work: Path, members: int, kind: str) -> tuple[float, float, float]:
    """(failed at, last answer of the failed member, every survivor started) for one failure of
    ``kind`` ("freeze" or "kill"), on a fresh coordinator."""
    # The eager protocol, so that every survivor's StartFetcher marks the rebalance's end
    # (bench/incremental.py measures a freeze and a kill under both protocols).
    async with open_coordinator(
        work / f"coordinator-{kind}",
        "--initial-rebalance-delay",
        "1",
        "--rebalance-protocol",
        "eager",
    ) as server:
        await create_topic(server, TOPIC, PARTITIONS)
        consumers = partial(
            open_consumers,
            server,
            work_dir=work,
            topic=TOPIC,
            group_size=ONE_GROUP,
            session_timeout_ms=SESSION_TIMEOUT_MS,
        )
        async with (
            consumers(members - 1) as survivors,
            consumers(1, first=members - 1) as failing,
        ):
            await wait_until(survivors + failing, stable_at(members), timeout=60)
            generation, _ = stable_generation(await stats(survivors))
            (last_answer,) = [s["last_answer"] for s in await stats(failing)]
            failed_at = now()
            failing[0].signal(signal.SIGSTOP if kind == "freeze" else signal.SIGKILL)
            st = await wait_until(survivors, stable_at(members - 1, above=generation), timeout=60)
            _, stable = stable_generation(st)
            failing[0].signal(signal.SIGCONT)
    return failed_at, last_answer, stable


async def main() -> None:
    args = bench_arguments(__doc__ or BENCH).parse_args()
    members = 20 if args.quick else 100
    session = SESSION_TIMEOUT_MS / 1000
    # The lease runs from the last request the member received (each one renews it), and the
    # coordinator cannot know whether the Ping it sent after the freeze arrived: that Ping went
    # out T/3 after the last answered one, so the bound is T/3 + T + margin after the last answer.
    bound = session / 3 + session + LEASE_MARGIN
    with work_area(args.work_dir, BENCH) as work:
        common = {"members": members, "session_timeout_ms": SESSION_TIMEOUT_MS}
        with reporting_errors(BENCH, "frozen_last_heard_to_stable", **common):
            stopped_at, last_answer, stable = await fail_one(work, members, "freeze")
            figure(
                BENCH,
                "frozen_last_heard_to_stable",
                (stable - last_answer) * 1e3,
                "ms",
                bound * 1e3,
                **common,
                target_ms=(bound + 0.5) * 1e3,
            )
            figure(
                BENCH, "frozen_sigstop_to_stable", (stable - stopped_at) * 1e3, "ms", None, **common
            )
        with reporting_errors(BENCH, "killed_to_stable", **common):
            killed_at, _, stable = await fail_one(work, members, "kill")
            bare = await bare_latencies(work, members - 1, PARTITIONS, 3)
            # A closed connection frees the partitions at once: the bound is 0, the target 0.5 s.
            figure(
                BENCH,
                "killed_to_stable",
                (stable - killed_at) * 1e3,
                "ms",
                statistics.median(bare) * 1e3,
                **common,
                target_ms=500,
            )


if __name__ == "__main__":
    run(main)
