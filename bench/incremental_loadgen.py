"""Part 1 of :mod:`bench.incremental`: one group of simulated consumers (:mod:`bench.loadgen`
workers, each member the consumer library's own machine) over one topic, joined by one more
member and left by one, under each rebalance protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from bench import incremental_figures as scenarios
from bench.harness import (
    Worker,
    create_topic,
    open_consumers,
    profile_server,
    registered,
    stable_at,
    stats,
    top_frames,
    wait_until,
)
from bench.measure import figure


async def holdings(workers: list[Worker]) -> scenarios.Holdings:
    found: scenarios.Holdings = {}
    for worker in workers:
        for member, partitions in (await worker.command("holdings")).items():
            found[member] = set(partitions)
    return found


async def loadgen_handoffs(workers: list[Worker], since: float) -> list[scenarios.Handoff]:
    """Every stop and start since ``since``."""
    found: list[scenarios.Handoff] = []
    for worker in workers:
        for entry in (await worker.command(f"handoffs {since!r}"))["consumers"]:
            for at, partitions in entry["stops"]:
                found.append(
                    scenarios.Handoff(member=entry["id"], kind="stop", at=at, partitions=partitions)
                )
            for at, partitions, _generation in entry["starts"]:
                found.append(
                    scenarios.Handoff(
                        member=entry["id"], kind="start", at=at, partitions=partitions
                    )
                )
    return found


def whole(live: int, partitions: int, above: int) -> Callable[[list[dict[str, Any]]], bool]:
    """``live`` consumers hold ``partitions`` between them, one of them under a generation newer
    than ``above``: the rebalance that ``above`` preceded handed everything on."""

    def check(all_stats: list[dict[str, Any]]) -> bool:
        return bool(
            sum(s["live"] for s in all_stats) == live
            and sum(s["held"] for s in all_stats) == partitions
            and max(s["max_generation"] for s in all_stats) > above
        )

    return check


async def max_generation(workers: list[Worker]) -> int:
    return max(int(s["max_generation"]) for s in await stats(workers))


async def loadgen_protocol(
    work: Path,
    protocol: str,
    supported: set[str],
    members: int,
    partitions: int,
    repeats: int,
    profile: float,
) -> dict[str, list[scenarios.Measured]]:
    """``repeats`` rounds of a join then a leave, each scenario's samples in order."""
    timeout = 60 + members / 20
    results: dict[str, list[scenarios.Measured]] = {"join": [], "leave": []}
    async with scenarios.open_broker(work / f"loadgen-{protocol}", protocol, supported) as server:
        await create_topic(server, scenarios.TOPIC, partitions)
        async with open_consumers(
            server,
            members,
            work,
            group_size=10**9,  # one group, the joiner included
            session_timeout_ms=10_000 if members >= 1000 else 3000,
            topic=scenarios.TOPIC,
            member_prefix=f"{protocol[0]}",
            per_worker=max(1000, (members + 1) // 2),
        ) as workers:
            await wait_until(workers, registered(members), timeout=timeout)
            await wait_until(workers, stable_at(members), timeout=timeout)
            await scenarios.logs_opened(server, partitions)

            for repeat in range(repeats):
                # join: one more member registers.
                await trio.sleep(1)
                before = await holdings(workers)
                above = await max_generation(workers)
                t0 = float((await workers[-1].command("join 1"))["t0"])
                await wait_until(workers, whole(members + 1, partitions, above), timeout=timeout)
                after = await holdings(workers)
                handoffs = await loadgen_handoffs(workers, t0)
                end = time.monotonic()
                scenarios.keep(
                    work / f"loadgen-{protocol}-join-{repeat}.json", before, after, handoffs
                )
                outcome = scenarios.analyze(before, after, handoffs, {}, t0, end)
                results["join"].append(
                    scenarios.Measured(outcome=outcome, before=before, after=after)
                )

                # leave: the first member closes its connection cleanly.
                await trio.sleep(1)
                before = await holdings(workers)
                above = await max_generation(workers)
                reply = await workers[0].command("close 1")
                t0, (leaver,) = float(reply["t0"]), reply["closed"]
                await wait_until(workers, whole(members, partitions, above), timeout=timeout)
                after = await holdings(workers)
                handoffs = await loadgen_handoffs(workers, t0)
                end = time.monotonic()
                scenarios.keep(
                    work / f"loadgen-{protocol}-leave-{repeat}.json", before, after, handoffs
                )
                outcome = scenarios.analyze(before, after, handoffs, {leaver: t0}, t0, end)
                results["leave"].append(
                    scenarios.Measured(
                        outcome=outcome, before=before, after=after, departed=(leaver,)
                    )
                )

            if profile:
                # One more join, unmeasured, sampled with py-spy: where the broker's time goes.
                path = work / f"profile-{protocol}.txt"
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(profile_server, server, profile, path)
                    await trio.sleep(0.5)  # py-spy attaches
                    above = await max_generation(workers)
                    await workers[-1].command("join 1")
                    await wait_until(
                        workers, whole(members + 1, partitions, above), timeout=timeout
                    )
                figure(
                    scenarios.BENCH,
                    "loadgen_join_server_profile",
                    None,
                    "share of samples",
                    None,
                    protocol=protocol,
                    members=members,
                    **top_frames(path),
                )
    return results


async def loadgen_part(work: Path, protocols: list[str], supported: set[str], args: Any) -> None:
    async def measure(protocol: str) -> dict[str, tuple[scenarios.Measured, dict[str, Any]]]:
        samples = await loadgen_protocol(
            work,
            protocol,
            supported,
            args.members,
            args.partitions,
            args.repeats,
            args.profile if protocol == protocols[-1] else 0,
        )
        chosen = {}
        for name, measured in samples.items():
            # The sample of median time stands for the scenario; the others are listed.
            ordered = sorted(measured, key=lambda m: m.outcome.settle)
            extra = {
                "members": args.members,
                "partitions": args.partitions,
                "repeats": len(measured),
                "samples_ms": [round(m.outcome.settle * 1e3, 1) for m in measured],
                "samples_unowned": [round(m.outcome.unowned_seconds, 3) for m in measured],
            }
            chosen[name] = (ordered[len(ordered) // 2], extra)
        return chosen

    await scenarios.each_protocol(
        "loadgen",
        protocols,
        supported,
        measure,
        work=work,
        total=args.partitions,
        members=args.members,
    )
