"""Part 2 of :mod:`bench.incremental`: real consumer processes (:mod:`bench.incremental_consumer`,
the ``consumer`` library) joining, leaving, killed, frozen and restarted one by one, records
flowing from a producer, under each rebalance protocol.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import attrs
import trio

from bench import incremental_figures as scenarios
from bench.bare import LineReader
from bench.harness import ServerProcess, create_topic, open_module
from bench.measure import reporting_errors
from consumer import open_producer


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
    held: scenarios.Holdings = attrs.field(factory=lambda: defaultdict(set))
    handoffs: list[scenarios.Handoff] = attrs.field(factory=list)
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
                scenarios.Handoff(
                    member=slot, kind="stop", at=at, partitions=tuple(sorted(stopped))
                )
            )
        elif kind == "assigned":
            # The callback hears what was added (incremental) or everything (eager, after a
            # revocation of everything): either way, what it did not hold starts now.
            gained = set(event["partitions"]) - self.held[slot]
            self.held[slot] |= gained
            self.handoffs.append(
                scenarios.Handoff(
                    member=slot, kind="start", at=at, partitions=tuple(sorted(gained))
                )
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
        arguments = [
            f"--bootstrap={self.server.host}:{self.server.port}",
            f"--group={group}",
            f"--session-timeout={session or self.session}",
            f"--client-id=bench-{slot}",
            f"--fetch-idle-interval={self.fetch_idle_interval}",
            *([f"--instance-id={instance_id}"] if instance_id is not None else []),
            scenarios.TOPIC,
        ]
        self.opened.pop(slot, None)
        await self.nursery.start(self._run, slot, arguments)

    async def opening(self, slot: str, timeout: float) -> float:
        """When ``slot``'s new process said it was up."""
        with trio.fail_after(timeout):
            while slot not in self.opened:
                await trio.sleep(0.01)
        return self.opened[slot]

    async def _run(
        self, slot: str, arguments: list[str], *, task_status: trio.TaskStatus[None]
    ) -> None:
        """``slot``'s consumer process, its lines taken as they come, until it exits or the
        nursery is cancelled."""
        log_path = self.work / f"consumer-{slot}.log"
        entry: ConsumerProcess | None = None
        try:
            async with open_module("bench.incremental_consumer", arguments, log_path) as process:
                entry = self.processes[slot] = ConsumerProcess(slot=slot, process=process)
                task_status.started()
                assert process.stdout is not None
                lines = LineReader(process.stdout)
                while (line := await lines.next()) is not None:
                    self.take(slot, line)
        finally:
            if entry is not None:
                entry.exited.set()

    def depart(self, slot: str) -> set[str]:
        """Forget what ``slot`` held (it can no longer fetch it); return it."""
        return self.held.pop(slot, set())

    def coverage(self, live: Iterable[str]) -> int:
        return len(set().union(*(self.held.get(s, set()) for s in live)))

    def snapshot(self, live: Iterable[str]) -> scenarios.Holdings:
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
            await producer.enqueue(scenarios.TOPIC, b"x" * 64)
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
) -> dict[str, tuple[scenarios.Measured, dict[str, Any]]]:
    n, partitions, session = args.consumers, args.consumer_partitions, args.session
    static_session = args.static_session
    quiet, timeout = 1.0, 60 + 4 * session
    results: dict[str, tuple[scenarios.Measured, dict[str, Any]]] = {}
    work = work / f"consumers-{protocol}"
    async with scenarios.open_broker(
        work, protocol, supported, "--commit-interval", "0.2"
    ) as server:
        await create_topic(server, scenarios.TOPIC, partitions)
        await scenarios.logs_opened(server, partitions)
        async with (
            trio.open_nursery() as producers,
            open_cluster(server, work, session, args.fetch_idle_interval) as cluster,
        ):
            producers.start_soon(produce, server, args.rate)

            def measure(
                name: str,
                before: scenarios.Holdings,
                live: list[str],
                t0: float,
                departures: dict[str, float],
                records_from: int,
                leavers: tuple[str, ...] = (),
                **extra: Any,
            ) -> None:
                after = cluster.snapshot(live)
                kept = [h for h in cluster.handoffs if h.at >= t0]
                scenarios.keep(work / f"{name}.json", before, after, kept)
                outcome = scenarios.analyze(
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
                    scenarios.Measured(
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

            with reporting_errors(scenarios.BENCH, "consumers_join", protocol=protocol):
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

            with reporting_errors(scenarios.BENCH, "consumers_leave", protocol=protocol):
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
                with reporting_errors(scenarios.BENCH, f"consumers_{scenario}", protocol=protocol):
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
            with reporting_errors(scenarios.BENCH, "consumers_rolling_restart", protocol=protocol):
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
    await scenarios.each_protocol(
        "consumers",
        protocols,
        supported,
        lambda protocol: consumers_protocol(work, protocol, supported, args),
        work=work,
        total=args.consumer_partitions,
        members=args.consumers,
    )
