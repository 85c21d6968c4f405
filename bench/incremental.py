"""Incremental rebalancing and static membership against the eager protocol, both measured in
the same run (broker ``serve --rebalance-protocol incremental|eager``).

Two parts, each run once per protocol on a fresh broker:

* **load generator**: one group of ``--members`` (1,000) simulated consumers over one topic of
  ``--partitions`` (10,000), in :mod:`bench.loadgen` workers that answer the coordinator and
  stamp, per partition, each StopFetcher answer and each StartFetcher that hands it on.
  Scenarios: ``join`` (one more member registers) and ``leave`` (one closes its connection
  cleanly).
* **consumers**: ``--consumers`` (10) real consumer processes (:mod:`bench.incremental_consumer`,
  the ``consumer`` library, printing their revoke and assign callbacks with times) over one topic
  of ``--consumer-partitions`` (900), records flowing from a producer (``--rate`` records/s).
  Scenarios: ``join``, ``leave`` (SIGTERM: the library stops, commits, leaves), ``kill``
  (SIGKILL), ``freeze`` (SIGSTOP until its partitions are handed on, past its session), and on a
  second group of static members (``instance_id``), ``rolling_restart`` (each member in turn
  stopped cleanly and started again with its instance id, the next once it fetches again).

Per scenario and protocol, one JSON line per figure (the issue's targets in ``target``):

* ``<part>_<scenario>_settle``: the trigger (join command, close, signal) to the last Stop answer
  or Start arrival it caused (ms). Baseline: the bare round trips (a StopFetcher-sized and a
  StartFetcher-sized frame, as in bench/rebalance.py) to the members involved, plus the sticky
  assignor's and the embedded store's time on the same group, measured in this run; for the
  incremental protocol also the eager protocol's time (``eager``).
* ``<part>_<scenario>_unowned``: unowned partition-seconds, the sum over partitions of the time no
  member may fetch it: from its Stop answer (or clean close, or the fault for a kill or freeze)
  until the StartFetcher that hands it on arrives. For the incremental protocol the baseline is
  (partitions moved / all partitions) x the eager protocol's figure; ``outside_moved`` is the
  part of partitions that did not move; ``unowned_outside_departed`` lists, for a kill or freeze,
  every partition ever unowned that the departed member did not hold.
* ``<part>_<scenario>_moved``: partitions whose owner changed; baseline the departed or joined
  member's share, the least a rebalance can move.
* ``<part>_<scenario>_contacted``: members (the departed one aside) that got a Stop or Start;
  baseline the members whose assignment changed; ``uninvolved`` counts the others.

The rolling restart's figures cover the whole roll: ``moved`` (by instance id), ``contacted``
(members other than the one restarting at the time), ``unowned`` and the roll's duration.

The load generator's join and leave are repeated ``--repeats`` times (default 3); the sample of
median time stands for each, the others are listed (``samples_ms``). For a kill or a freeze the
departed member's partitions count as unowned from the signal: the end of its lease is the
coordinator's to know, so the figure is an upper bound (a kill's clean close ends the lease at
once). With ``--work-dir`` each scenario's holdings and handoffs stay there as JSON.

    python -m bench.incremental [--quick] [--work-dir DIR] [--parts loadgen,consumers]
        [--protocols eager,incremental] [--repeats N] [--profile SECONDS]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from bench.harness import (
    REPO,
    ServerProcess,
    Worker,
    bench_arguments,
    create_topic,
    open_consumers,
    open_coordinator,
    profile_server,
    registered,
    run,
    stable_at,
    stats,
    top_frames,
    wait_until,
    work_area,
)
from bench.measure import figure, reporting_errors
from bench.rebalance import bare_latencies
from bench.rebalance import settle as settle_server
from consumer import open_producer
from launch.processes import stop_process
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


# --- part 1: the load generator -----------------------------------------------------------------


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


async def holdings(workers: list[Worker]) -> Holdings:
    found: Holdings = {}
    for worker in workers:
        for member, partitions in (await worker.command("holdings")).items():
            found[member] = set(partitions)
    return found


async def loadgen_handoffs(workers: list[Worker], since: float) -> list[Handoff]:
    """Every stop and start since ``since``."""
    found: list[Handoff] = []
    for worker in workers:
        for entry in (await worker.command(f"handoffs {since!r}"))["consumers"]:
            for at, partitions in entry["stops"]:
                found.append(Handoff(member=entry["id"], kind="stop", at=at, partitions=partitions))
            for at, partitions, _generation in entry["starts"]:
                found.append(
                    Handoff(member=entry["id"], kind="start", at=at, partitions=partitions)
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


async def loadgen_protocol(
    work: Path,
    protocol: str,
    supported: set[str],
    members: int,
    partitions: int,
    repeats: int,
    profile: float,
) -> dict[str, list[Measured]]:
    """``repeats`` rounds of a join then a leave, each scenario's samples in order."""
    timeout = 60 + members / 20
    results: dict[str, list[Measured]] = {"join": [], "leave": []}
    async with open_broker(work / f"loadgen-{protocol}", protocol, supported) as server:
        await create_topic(server, TOPIC, partitions)
        async with open_consumers(
            server,
            members,
            work,
            group_size=10**9,  # one group, the joiner included
            session_timeout_ms=10_000 if members >= 1000 else 3000,
            topic=TOPIC,
            member_prefix=f"{protocol[0]}",
            per_worker=max(1000, (members + 1) // 2),
        ) as workers:
            await wait_until(workers, registered(members), timeout=timeout)
            await wait_until(workers, stable_at(members), timeout=timeout)
            await logs_opened(server, partitions)

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
                keep(work / f"loadgen-{protocol}-join-{repeat}.json", before, after, handoffs)
                outcome = analyze(before, after, handoffs, {}, t0, end)
                results["join"].append(Measured(outcome=outcome, before=before, after=after))

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
                keep(work / f"loadgen-{protocol}-leave-{repeat}.json", before, after, handoffs)
                outcome = analyze(before, after, handoffs, {leaver: t0}, t0, end)
                results["leave"].append(
                    Measured(outcome=outcome, before=before, after=after, departed=(leaver,))
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
                    BENCH,
                    "loadgen_join_server_profile",
                    None,
                    "share of samples",
                    None,
                    protocol=protocol,
                    members=members,
                    **top_frames(path),
                )
    return results


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


def skipped(part: str, protocol: str) -> None:
    line = {
        "benchmark": BENCH,
        "figure": part,
        "protocol": protocol,
        "skipped": "the broker has no --rebalance-protocol",
    }
    print(json.dumps(line), flush=True)


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


async def loadgen_part(work: Path, protocols: list[str], supported: set[str], args: Any) -> None:
    results: Results = {}
    for protocol in protocols:
        if protocol not in supported:
            skipped("loadgen", protocol)
            continue
        with reporting_errors(BENCH, "loadgen", protocol=protocol):
            samples = await loadgen_protocol(
                work,
                protocol,
                supported,
                args.members,
                args.partitions,
                args.repeats,
                args.profile if protocol == protocols[-1] else 0,
            )
            results[protocol] = {}
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
                results[protocol][name] = (ordered[len(ordered) // 2], extra)
    await report_all("loadgen", results, work, args.partitions, args.members)


# --- part 2: real consumer processes ------------------------------------------------------------


@attrs.define(eq=False)
class ConsumerProcess:
    slot: str
    process: trio.Process
    exited: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class Cluster:
    """The consumer processes of one broker, and what they said, as the parent read it."""

    server: ServerProcess
    work: Path
    session: float
    fetch_idle_interval: float
    nursery: trio.Nursery
    processes: dict[str, ConsumerProcess] = attrs.field(factory=dict)
    #: When each slot's latest process said it was up.
    opened: dict[str, float] = attrs.field(factory=dict)
    held: Holdings = attrs.field(factory=lambda: defaultdict(set))
    handoffs: list[Handoff] = attrs.field(factory=list)
    last_event: float = 0.0
    records: int = 0
    changed: trio.Event = attrs.field(factory=trio.Event)

    def take(self, slot: str, line: str) -> None:
        event = json.loads(line)
        at, kind = float(event["t"]), event["event"]
        if kind == "records":
            self.records += int(event["count"])
            return
        if kind == "opening":
            self.opened[slot] = at
            return
        if kind == "revoked":
            stopped = set(event["partitions"]) & self.held[slot]
            self.held[slot] -= stopped
            self.handoffs.append(
                Handoff(member=slot, kind="stop", at=at, partitions=tuple(sorted(stopped)))
            )
        elif kind == "assigned":
            # The callback hears what was added (incremental) or everything (eager, after a
            # revocation of everything): either way, what it did not hold starts now.
            gained = set(event["partitions"]) - self.held[slot]
            self.held[slot] |= gained
            self.handoffs.append(
                Handoff(member=slot, kind="start", at=at, partitions=tuple(sorted(gained)))
            )
        else:
            return
        self.last_event = time.monotonic()
        self.changed.set()
        self.changed = trio.Event()

    async def start(
        self,
        slot: str,
        group: str,
        instance_id: str | None = None,
        session: float | None = None,
    ) -> None:
        command = [
            sys.executable,
            "-m",
            "bench.incremental_consumer",
            f"--bootstrap={self.server.host}:{self.server.port}",
            f"--group={group}",
            f"--session-timeout={session or self.session}",
            f"--client-id=bench-{slot}",
            f"--fetch-idle-interval={self.fetch_idle_interval}",
            *([f"--instance-id={instance_id}"] if instance_id is not None else []),
            TOPIC,
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(self.work / f"consumer-{slot}.log", "ab") as log_file:
            process = await trio.lowlevel.open_process(
                command, stdout=subprocess.PIPE, stderr=log_file, cwd=REPO, env=env
            )
        entry = ConsumerProcess(slot=slot, process=process)
        self.processes[slot] = entry
        self.opened.pop(slot, None)
        self.nursery.start_soon(self._read, entry)

    async def opening(self, slot: str, timeout: float) -> float:
        """When ``slot``'s new process said it was up."""
        with trio.fail_after(timeout):
            while slot not in self.opened:
                await trio.sleep(0.01)
        return self.opened[slot]

    async def _read(self, entry: ConsumerProcess) -> None:
        process = entry.process
        try:
            assert process.stdout is not None
            pending = b""
            while chunk := await process.stdout.receive_some(65536):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self.take(entry.slot, line.decode())
        finally:
            with trio.CancelScope(shield=True):
                await stop_process(process)
            entry.exited.set()

    def depart(self, slot: str) -> set[str]:
        """Forget what ``slot`` held (it can no longer fetch it); return it."""
        return self.held.pop(slot, set())

    def coverage(self, live: Iterable[str]) -> int:
        return len(set().union(*(self.held.get(s, set()) for s in live)))

    def snapshot(self, live: Iterable[str]) -> Holdings:
        return {s: set(self.held.get(s, set())) for s in live}

    async def wait_whole(
        self,
        live: list[str],
        partitions: int,
        *,
        quiet: float,
        timeout: float,
        holders: Iterable[str] = (),
    ) -> None:
        """Until the ``live`` slots hold every partition between them, each of ``holders`` (members
        that just joined) holds some, and no consumer has said anything for ``quiet`` seconds."""
        with trio.fail_after(timeout):
            while True:
                done = self.coverage(live) == partitions
                done = done and all(self.held.get(holder) for holder in holders)
                idle = time.monotonic() - self.last_event
                if done and idle >= quiet:
                    return
                await trio.sleep(max(0.05, quiet - idle) if done else 0.05)


async def produce(server: ServerProcess, rate: float) -> None:
    """``rate`` records a second, round robin over the topic's partitions, until cancelled."""
    async with open_producer([(server.host, server.port)]) as producer:
        due = trio.current_time()
        while True:
            await producer.enqueue(TOPIC, b"x" * 64)
            due += 1 / rate
            await trio.sleep_until(due)


@contextlib.asynccontextmanager
async def open_cluster(
    server: ServerProcess, work: Path, session: float, fetch_idle_interval: float
) -> AsyncIterator[Cluster]:
    async with trio.open_nursery() as nursery:
        cluster = Cluster(
            server=server,
            work=work,
            session=session,
            fetch_idle_interval=fetch_idle_interval,
            nursery=nursery,
        )
        try:
            yield cluster
        finally:
            nursery.cancel_scope.cancel()


def library_has_instance_id() -> bool:
    from consumer import ConsumerSettings

    return "instance_id" in attrs.fields_dict(ConsumerSettings)


async def consumers_protocol(
    work: Path, protocol: str, supported: set[str], args: Any
) -> dict[str, tuple[Measured, dict[str, Any]]]:
    n, partitions, session = args.consumers, args.consumer_partitions, args.session
    static_session = args.static_session
    quiet, timeout = 1.0, 60 + 4 * session
    results: dict[str, tuple[Measured, dict[str, Any]]] = {}
    work = work / f"consumers-{protocol}"
    async with open_broker(work, protocol, supported, "--commit-interval", "0.2") as server:
        await create_topic(server, TOPIC, partitions)
        await logs_opened(server, partitions)
        async with (
            trio.open_nursery() as producers,
            open_cluster(server, work, session, args.fetch_idle_interval) as cluster,
        ):
            producers.start_soon(produce, server, args.rate)

            def measure(
                name: str,
                before: Holdings,
                live: list[str],
                t0: float,
                departures: dict[str, float],
                records_from: int,
                leavers: tuple[str, ...] = (),
                **extra: Any,
            ) -> None:
                after = cluster.snapshot(live)
                kept = [h for h in cluster.handoffs if h.at >= t0]
                keep(work / f"{name}.json", before, after, kept)
                outcome = analyze(
                    before, after, cluster.handoffs, departures, t0, time.monotonic(), leavers
                )
                extra = {
                    "consumers": n,
                    "partitions": partitions,
                    "session_timeout_ms": session * 1000,
                    "records_per_s": args.rate,
                    "records_consumed": cluster.records - records_from,
                    **extra,
                }
                results[name] = (
                    Measured(
                        outcome=outcome,
                        before=before,
                        after=after,
                        departed=(*departures, *leavers),
                    ),
                    extra,
                )

            # A group of dynamic members.
            live = [f"c{i}" for i in range(n)]
            for slot in live:
                await cluster.start(slot, f"dynamic-{protocol}")
            # Formed: every member holds some (a member that started late joined, too).
            await cluster.wait_whole(live, partitions, quiet=2.0, timeout=timeout, holders=live)

            with reporting_errors(BENCH, "consumers_join", protocol=protocol):
                before, records = cluster.snapshot(live), cluster.records
                joiner = f"c{n}"
                await cluster.start(joiner, f"dynamic-{protocol}")
                t0 = await cluster.opening(joiner, timeout)
                live.append(joiner)
                await cluster.wait_whole(
                    live,
                    partitions,
                    quiet=quiet,
                    timeout=timeout,
                    holders=[joiner],
                )
                measure("join", before, live, t0, {}, records)

            with reporting_errors(BENCH, "consumers_leave", protocol=protocol):
                leaver = live.pop()
                before, records = cluster.snapshot([*live, leaver]), cluster.records
                t0 = time.monotonic()
                cluster.processes[leaver].process.send_signal(signal.SIGTERM)
                # Its own revoke line (the stop before the close) is the departure.
                with trio.fail_after(timeout):
                    await cluster.processes[leaver].exited.wait()
                await cluster.wait_whole(live, partitions, quiet=quiet, timeout=timeout)
                # What it revoked at its close was its own stop, not a request to it.
                measure("leave", before, live, t0, {}, records, leavers=(leaver,))

            for scenario, signum in (("kill", signal.SIGKILL), ("freeze", signal.SIGSTOP)):
                with reporting_errors(BENCH, f"consumers_{scenario}", protocol=protocol):
                    victim = live.pop()
                    before, records = cluster.snapshot([*live, victim]), cluster.records
                    t0 = time.monotonic()
                    cluster.processes[victim].process.send_signal(signum)
                    cluster.depart(victim)
                    await cluster.wait_whole(live, partitions, quiet=quiet, timeout=timeout)
                    measure(scenario, before, live, t0, {victim: t0}, records)
                    if signum == signal.SIGSTOP:
                        cluster.processes[victim].process.send_signal(signal.SIGKILL)

            for slot in live:
                cluster.processes[slot].process.send_signal(signal.SIGTERM)
            for slot in live:
                with trio.move_on_after(timeout):
                    await cluster.processes[slot].exited.wait()

            # A group of static members, restarted one by one.
            static = library_has_instance_id()
            with reporting_errors(BENCH, "consumers_rolling_restart", protocol=protocol):
                group = f"static-{protocol}"
                live = [f"s{i}" for i in range(n)]
                for slot in live:
                    await cluster.start(slot, group, slot if static else None, static_session)
                await cluster.wait_whole(live, partitions, quiet=2.0, timeout=timeout, holders=live)
                before, records = cluster.snapshot(live), cluster.records
                t0 = time.monotonic()
                departures: dict[str, float] = {}
                outsiders: set[str] = set()
                rejoined: list[float] = []
                down: list[float] = []
                for slot in live:
                    handoffs_before = len(cluster.handoffs)
                    step = time.monotonic()
                    cluster.processes[slot].process.send_signal(signal.SIGTERM)
                    with trio.fail_after(timeout):
                        await cluster.processes[slot].exited.wait()
                    await cluster.start(slot, group, slot if static else None, static_session)
                    opened = await cluster.opening(slot, timeout)
                    down.append(opened - step)
                    await cluster.wait_whole(
                        live,
                        partitions,
                        quiet=quiet,
                        timeout=timeout,
                        holders=[slot],
                    )
                    # Its process up to its partitions back: what a restart costs besides the
                    # interpreter's start.
                    back = [h.at for h in cluster.handoffs[handoffs_before:] if h.member == slot]
                    rejoined.append(max(back, default=opened) - opened)
                    outsiders |= {
                        h.member
                        for h in cluster.handoffs[handoffs_before:]
                        if h.member != slot and h.at >= step
                    }
                measure(
                    "rolling_restart",
                    before,
                    live,
                    t0,
                    departures,
                    records,
                    static_ids=static,
                    contacted_while_others_restarted=sorted(outsiders),
                    roll_ms=round((time.monotonic() - t0) * 1e3, 1),
                    rejoin_ms=[round(r * 1e3, 1) for r in rejoined],
                    # The signal to the new process up: the interpreter's stop and start.
                    down_ms=[round(d * 1e3, 1) for d in down],
                    session_timeout_ms=static_session * 1000,
                )
                # Every member restarts, so each is contacted once (its own Start): what counts
                # is who was contacted while another restarted.
                measured, extra = results["rolling_restart"]
                results["rolling_restart"] = (
                    attrs.evolve(
                        measured,
                        outcome=attrs.evolve(measured.outcome, contacted=frozenset(outsiders)),
                    ),
                    extra,
                )
            producers.cancel_scope.cancel()
    return results


async def consumers_part(work: Path, protocols: list[str], supported: set[str], args: Any) -> None:
    results: Results = {}
    for protocol in protocols:
        if protocol not in supported:
            skipped("consumers", protocol)
            continue
        with reporting_errors(BENCH, "consumers", protocol=protocol):
            results[protocol] = await consumers_protocol(work, protocol, supported, args)
    await report_all("consumers", results, work, args.consumer_partitions, args.consumers)


async def main() -> None:
    parser = bench_arguments(__doc__ or BENCH)
    parser.add_argument("--parts", default="loadgen,consumers")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.sized("--members", quick=20, full=1000, kind=int)
    parser.sized("--partitions", quick=200, full=10_000, kind=int)
    parser.sized("--consumers", quick=4, full=10, kind=int)
    parser.sized("--consumer-partitions", quick=40, full=900, kind=int)
    parser.sized("--session", quick=3.0, full=6.0, help="consumers' T")
    parser.sized(
        "--static-session",
        quick=10.0,
        full=20.0,
        help="the static members' T: a restart must fit in it, even on a busy machine where an "
        "interpreter takes seconds to start",
    )
    parser.sized("--rate", quick=30.0, full=300.0, help="records/s")
    parser.add_argument("--fetch-idle-interval", type=float, default=0.5)
    parser.add_argument(
        "--profile", type=float, default=0, help="py-spy seconds on one more loadgen join"
    )
    parser.sized("--repeats", quick=1, full=3, kind=int, help="loadgen joins and leaves")
    args = parser.parse()
    protocols = [p for p in args.protocols.split(",") if p]
    parts = [p for p in args.parts.split(",") if p]
    supported = broker_protocols()
    with work_area(args.work_dir, BENCH) as work:
        if "loadgen" in parts:
            await loadgen_part(work, protocols, supported, args)
        if "consumers" in parts:
            await consumers_part(work, protocols, supported, args)


if __name__ == "__main__":
    run(main)
