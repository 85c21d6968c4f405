"""What a scenario of :mod:`bench.incremental` comes to: who held what before and after, and who
stopped and started what when, turned into its figures (pure: tested in
tests/bench/test_incremental_figures.py), the baselines those are set against, and how the figures
are printed; and the broker both parts run on.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from bench.harness import (
    REPO,
    ServerProcess,
    open_coordinator,
)
from bench.measure import figure, reporting_errors
from bench.rebalance import bare_latencies
from bench.rebalance import settle as settle_server
from protocol.types import ConsumerThread, Subscription, TopicPartition, TopicStreams
from statemachine.assignment import sticky_assign
from store.embedded import open_embedded_store
from store.interface import GroupRecord, MemberRecord

BENCH = "incremental"
PROTOCOLS = ("eager", "incremental")
TOPIC = "incremental"
#: The issue's targets, by scenario; each figure line carries its own.
JOIN_LEAVE_TARGETS = {
    "unowned": "incremental <= 1.5 x (moved / all partitions) x eager; 0 outside the moved set",
    "contacted": "members that neither give nor receive partitions get no Stop/Start",
}
SETTLE_TARGET = "incremental <= 3 x (bare round trips + assignor + store) and <= 0.25 x eager"
DEPARTED_TARGET = "only the departed member's partitions are ever unowned"
ROLLING_TARGET = "no partition moves; no Stop/Start to anyone but the restarting member"

Holdings = dict[str, set[str]]


# --- what a scenario's handoffs come to (pure; tests/bench/test_incremental_figures.py) ---------


@attrs.frozen(kw_only=True)
class Handoff:
    """A member stopped (its answer left) or started (the StartFetcher arrived) ``partitions``."""

    member: str
    kind: str  # "stop" or "start"
    at: float
    partitions: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Outcome:
    settle: float
    unowned: dict[str, float]
    never_restarted: frozenset[str]
    moved: frozenset[str]
    contacted: frozenset[str]
    changed: frozenset[str]
    stops: int
    starts: int
    #: Partitions two members held at once by their own account (a start before the other's
    #: stop answer): must stay empty under either protocol.
    doubly_held: frozenset[str]

    @property
    def unowned_seconds(self) -> float:
        return sum(self.unowned.values())

    def unowned_outside(self, partitions: Iterable[str]) -> dict[str, float]:
        inside = set(partitions)
        return {p: s for p, s in self.unowned.items() if p not in inside and s > 0}


def owners(holdings: Mapping[str, Iterable[str]]) -> dict[str, str]:
    return {p: member for member, ps in holdings.items() for p in ps}


def analyze(
    before: Mapping[str, set[str]],
    after: Mapping[str, set[str]],
    handoffs: Iterable[Handoff],
    departures: Mapping[str, float],
    t0: float,
    end: float,
    leavers: Iterable[str] = (),
) -> Outcome:
    """The figures of one scenario: ``before`` and ``after`` are who held what around it,
    ``handoffs`` what members said they stopped and started from ``t0`` on, ``departures`` when a
    member that left without a word (a close, a kill, a freeze) stopped being able to fetch what
    it held ``before``; ``leavers`` are members that left saying so (their own stop is no request
    to them); ``end`` closes intervals still open (a partition never handed on)."""
    timeline: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    events = sorted((h for h in handoffs if h.at >= t0), key=lambda h: h.at)
    for h in events:
        for p in h.partitions:
            # At one instant a stop comes before a start: a handover, not an overlap.
            timeline[p].append((h.at, 0 if h.kind == "stop" else 1, h.member))
    for member, at in departures.items():
        for p in before.get(member, ()):
            timeline[p].append((at, 0, member))
    unowned: dict[str, float] = {}
    never: set[str] = set()
    doubly: set[str] = set()
    start_owner = owners(before)
    for p, points in timeline.items():
        points.sort()
        holders = {start_owner[p]} if p in start_owner else set()
        since: float | None = None
        total = 0.0
        for at, kind, member in points:
            if kind == 0:
                holders.discard(member)
                if not holders and since is None:
                    since = at
            else:
                holders.add(member)
                if len(holders) > 1:
                    doubly.add(p)
                if since is not None:
                    total += at - since
                    since = None
        if since is not None:
            total += max(0.0, end - since)
            never.add(p)
        unowned[p] = total
    old, new = owners(before), owners(after)
    moved = {p for p in old.keys() | new.keys() if old.get(p) != new.get(p)}
    members = before.keys() | after.keys()
    changed = {m for m in members if set(before.get(m, ())) != set(after.get(m, ()))}
    contacted = {h.member for h in events} - set(departures) - set(leavers)
    return Outcome(
        settle=max((h.at for h in events), default=t0) - t0,
        unowned=unowned,
        never_restarted=frozenset(never),
        moved=frozenset(moved),
        contacted=frozenset(contacted),
        changed=frozenset(changed),
        stops=sum(h.kind == "stop" for h in events),
        starts=sum(h.kind == "start" for h in events),
        doubly_held=frozenset(doubly),
    )


def report(
    part: str,
    scenario: str,
    protocol: str,
    outcome: Outcome,
    *,
    total_partitions: int,
    least_moved: int,
    departed: Iterable[str] = (),
    departed_partitions: Iterable[str] = (),
    settle_baseline: float | None = None,
    eager: Outcome | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Print the scenario's figures; ``eager`` is the same scenario under the eager protocol,
    for the incremental protocol's lines."""
    name = f"{part}_{scenario}"
    common: dict[str, Any] = {"protocol": protocol, "scenario": scenario, **(extra or {})}
    settle_extra: dict[str, Any] = {"target": SETTLE_TARGET} if scenario == "join" else {}
    if eager is not None:
        settle_extra["eager_ms"] = round(eager.settle * 1e3, 3)
        settle_extra["ratio_to_eager"] = (
            round(outcome.settle / eager.settle, 3) if eager.settle else None
        )
    figure(
        BENCH,
        f"{name}_settle",
        outcome.settle * 1e3,
        "ms",
        None if settle_baseline is None else settle_baseline * 1e3,
        **settle_extra,
        **common,
    )
    fraction = len(outcome.moved) / total_partitions if total_partitions else 0.0
    unowned_extra: dict[str, Any] = {
        "unowned_partitions": sum(1 for s in outcome.unowned.values() if s > 0),
        "outside_moved": round(sum(outcome.unowned_outside(outcome.moved).values()), 6),
        "never_handed_on": len(outcome.never_restarted),
        "doubly_held": sorted(outcome.doubly_held),
    }
    if scenario in ("kill", "freeze"):
        outside = sorted(outcome.unowned_outside(departed_partitions))
        unowned_extra["unowned_outside_departed"] = len(outside)
        unowned_extra["unowned_outside_departed_first"] = outside[:10]
        unowned_extra["target"] = DEPARTED_TARGET
    elif scenario == "rolling_restart":
        unowned_extra["target"] = ROLLING_TARGET
    else:
        unowned_extra["target"] = JOIN_LEAVE_TARGETS["unowned"]
    unowned_baseline = None
    if eager is not None:
        unowned_extra["eager"] = round(eager.unowned_seconds, 6)
        if scenario in ("join", "leave"):
            unowned_baseline = fraction * eager.unowned_seconds
            unowned_extra["target_ratio"] = 1.5
    figure(
        BENCH,
        f"{name}_unowned",
        outcome.unowned_seconds,
        "partition-seconds",
        unowned_baseline,
        **unowned_extra,
        **common,
    )
    figure(
        BENCH,
        f"{name}_moved",
        len(outcome.moved),
        "partitions",
        least_moved,
        all_partitions=total_partitions,
        **common,
    )
    figure(
        BENCH,
        f"{name}_contacted",
        len(outcome.contacted),
        "members",
        0 if scenario == "rolling_restart" else len(outcome.changed - set(departed)),
        uninvolved=len(outcome.contacted - outcome.changed),
        stops=outcome.stops,
        starts=outcome.starts,
        target=ROLLING_TARGET if scenario == "rolling_restart" else JOIN_LEAVE_TARGETS["contacted"],
        **common,
    )


@attrs.frozen(kw_only=True)
class Measured:
    outcome: Outcome
    before: Holdings
    after: Holdings
    departed: tuple[str, ...] = ()


def keep(path: Path, before: Holdings, after: Holdings, handoffs: Iterable[Handoff]) -> None:
    """What a scenario's figures were computed from, for a reader who doubts one."""
    path.write_text(
        json.dumps(
            {
                "before": {m: sorted(ps) for m, ps in before.items()},
                "after": {m: sorted(ps) for m, ps in after.items()},
                "handoffs": [attrs.asdict(h) for h in handoffs],
            }
        )
    )


def departed_partitions(measured: Measured) -> set[str]:
    return {p for member in measured.departed for p in measured.before.get(member, ())}


async def bare_seconds(work: Path, involved: int, partitions_per_member: int) -> float:
    """Two round trips (StopFetcher-, then StartFetcher-sized) to ``involved`` bare peers, as
    bench/rebalance.py measures them: the median of three."""
    samples = await bare_latencies(work, involved, involved * partitions_per_member, 3)
    return statistics.median(samples)


def _record(group: str, assignment: Mapping[TopicPartition, ConsumerThread]) -> GroupRecord:
    members = sorted({thread.member_id for thread in assignment.values()})
    subscription = Subscription(topics=(TopicStreams(topic=TOPIC, streams=1),))
    return GroupRecord(
        group_id=group,
        generation=1,
        members=tuple(
            MemberRecord(
                member_id=m,
                client_id="loadgen",
                subscription=subscription,
                session_timeout_ms=10_000,
                auto_commit=False,
                auto_offset_reset="smallest",
            )
            for m in members
        ),
        assignment=assignment,
    )


async def assign_and_store_seconds(work: Path, before: Holdings, after_members: list[str]) -> float:
    """The sticky assignor's time for ``after_members`` given ``before``, plus the embedded
    store's two writes of the group record (before the starts, and marked complete) as a diff
    from the previous record: the coordinator's own work in a rebalance besides the round
    trips."""
    previous = {
        TopicPartition(topic=p.rpartition("/")[0], partition=int(p.rpartition("/")[2])): (
            ConsumerThread(member_id=m, index=0)
        )
        for m, ps in before.items()
        for p in ps
    }
    subscription = Subscription(topics=(TopicStreams(topic=TOPIC, streams=1),))
    counts = {TOPIC: len(previous)}
    started = time.perf_counter()
    assignment = sticky_assign(dict.fromkeys(after_members, subscription), counts, previous)
    assigned = time.perf_counter() - started
    data = work / "store-baseline"
    with contextlib.suppress(FileNotFoundError):
        for child in data.iterdir():
            child.unlink()
    async with open_embedded_store(data) as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, _record("g", previous))
        record = attrs.evolve(_record("g", assignment), generation=2)
        started = time.perf_counter()
        await store.write_group(epoch, record)
        await store.write_group(epoch, attrs.evolve(record, complete=True))
        stored = time.perf_counter() - started
    return assigned + stored


Results = dict[str, dict[str, tuple[Measured, dict[str, Any]]]]
#: Scenarios whose time has a bare baseline: a kill's rebalance starts at the death (a clean
#: close), a freeze's only when the lease ends, a rolling restart is many rebalances.
TIMED = ("join", "leave", "kill")


async def each_protocol(
    part: str,
    protocols: list[str],
    supported: set[str],
    measure: Callable[[str], Awaitable[dict[str, tuple[Measured, dict[str, Any]]]]],
    *,
    work: Path,
    total: int,
    members: int,
) -> None:
    """``measure`` each protocol the broker serves (a line says which it does not), then print
    every scenario's figures; ``total`` partitions over ``members`` members."""
    results: Results = {}
    for protocol in protocols:
        if protocol not in supported:
            line = {"benchmark": BENCH, "figure": part, "protocol": protocol}
            print(
                json.dumps({**line, "skipped": "the broker has no --rebalance-protocol"}),
                flush=True,
            )
            continue
        with reporting_errors(BENCH, part, protocol=protocol):
            results[protocol] = await measure(protocol)
    await report_all(part, results, work, total, members)


async def report_all(part: str, results: Results, work: Path, total: int, members: int) -> None:
    """Every scenario's figures, the incremental protocol's next to the eager one's, with the
    bare baseline of the timed scenarios measured now (nothing else running)."""
    for protocol, scenarios in results.items():
        for scenario, (measured, extra) in scenarios.items():
            outcome = measured.outcome
            involved = len(outcome.contacted | (outcome.changed - set(measured.departed)))
            baseline = None
            timing: dict[str, Any] = {"involved": involved}
            if scenario in TIMED:
                with reporting_errors(BENCH, f"{part}_{scenario}_baseline", protocol=protocol):
                    own = await assign_and_store_seconds(
                        work, measured.before, sorted(measured.after)
                    )
                    bare = await bare_seconds(work, max(involved, 1), total // members)
                    baseline = bare + own
                    timing |= {
                        "bare_ms": round(bare * 1e3, 3),
                        "assign_store_ms": round(own * 1e3, 3),
                    }
            eager = results.get("eager", {}).get(scenario) if protocol != "eager" else None
            departed = departed_partitions(measured)
            least = len(departed) if departed else total // max(1, len(measured.after))
            if scenario == "rolling_restart":
                least = 0
            report(
                part,
                scenario,
                protocol,
                outcome,
                total_partitions=total,
                least_moved=least,
                departed=measured.departed,
                departed_partitions=departed,
                settle_baseline=baseline,
                eager=None if eager is None else eager[0].outcome,
                extra={**extra, **timing},
            )


# --- the broker ---------------------------------------------------------------------------------


def broker_protocols() -> set[str]:
    """The rebalance protocols this tree's broker serves: ``--rebalance-protocol`` if it has it,
    else only the seeds' eager one."""
    result = subprocess.run(
        [sys.executable, "-m", "cli", "serve", "--help"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    return set(PROTOCOLS) if "--rebalance-protocol" in result.stdout else {"eager"}


def open_broker(
    work: Path, protocol: str, supported: set[str], *args: str
) -> contextlib.AbstractAsyncContextManager[ServerProcess]:
    chosen = ["--rebalance-protocol", protocol] if len(supported) > 1 else []
    return open_coordinator(work, "--initial-rebalance-delay", "1", *chosen, *args)


def _opened_logs(log_dir: Path) -> int:
    """Partition logs under ``log_dir`` that have their first segment."""
    if not log_dir.exists():
        return 0
    return sum(
        1
        for entry in os.scandir(log_dir)
        if entry.name.startswith(f"{TOPIC}-") and any(os.scandir(entry.path))
    )


async def logs_opened(server: ServerProcess, partitions: int, at_most: float = 600) -> None:
    """Wait until the broker has opened every partition log of the new topic (it does so in the
    background, a directory fsync each: minutes of a busy disk at 10,000 partitions), then until
    its CPU settles, so that a rebalance is measured, not that."""
    log_dir = server.log_path.parent / "log"
    with trio.move_on_after(at_most):
        while await trio.to_thread.run_sync(_opened_logs, log_dir) < partitions:
            await trio.sleep(1)
    await settle_server(server)
