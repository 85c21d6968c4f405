"""Coordinator failover with records flowing, with real processes: three brokers (``coordinator
serve --zookeeper``) on a three-node ZooKeeper ensemble, one producer per broker, six consumer
processes in one group, and a fault of the broker that coordinates.

Placement: a topic's partitions all live on the broker that created it, so there is one topic per
broker (``orders-<broker id>``, each created by asking that broker), of PARTITIONS_PER_BROKER
partitions each; the group subscribes to all three. One ``consumer`` library producer per topic
(in this process) sends RATE records/s round robin over its partitions, each record's value
stamped with the producer's sequence number and CLOCK_MONOTONIC send time. The six consumers are
processes of their own (``python -m bench.failover_consumer``, the library consumer) that print
every record with the CLOCK_MONOTONIC time it reached the application and the generation they
held then.

Two scenarios, each on fresh brokers under a chroot of their own on one ensemble: ``kill_9``
(SIGKILL of the coordinator's broker: its connections break at once) and ``sigstop`` (SIGSTOP of
it until both survivors name a successor, which they do only once its ZooKeeper session has
expired; then SIGCONT: nothing breaks, consumers notice only overdue Pings). Per scenario:

* ``<s>_longest_gap``: the longest time between two consecutive records of one partition on a
  surviving broker reaching the application (a record's first delivery; a redelivery is no
  progress), from the fault until the producers stop, against the p99 of the same partitions'
  gaps in the steady window before the fault (the baseline). The issue's target is
  ``target_ms`` = max(2 x p99, p99 + 100 ms).
* ``<s>_to_elected``: the fault to both survivors naming the same survivor as coordinator.
* ``<s>_to_stable``: the fault to the new coordinator describing the group Stable with all six
  members and every partition held, against the issue's target: ZooKeeper session + 1.5 s after
  a kill -9, max(ZooKeeper session, 2T/3) + 1.5 s after a SIGSTOP (T: consumer session).
* ``<s>_generation``: the generation at the new coordinator once Stable, against the one before
  the fault (no member is lost by the fault, so the target is the same generation).
* Correctness, on the surviving brokers' partitions: ``<s>_duplicates`` (records delivered more
  than once), ``<s>_missing`` (records the brokers acknowledged that no consumer was given, after
  the producers stopped and the consumers drained), and ``<s>_two_consumers_at_once``
  (partitions that one consumer was given a record of between two records another consumer was
  given under one unchanged generation: the second could not have stopped in between).

The brokers run with their default initial rebalance delay: what a user gets out of the box.

    python -m bench.failover [--quick] [--work-dir DIR] [--consumer-session T] [--runs N]
        [--scenario kill_9|sigstop]
"""

from __future__ import annotations

import contextlib
import itertools
import math
import shutil
import signal
import statistics
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import trio

from bench.bare import LineReader
from bench.harness import (
    ServerProcess,
    bench_arguments,
    open_coordinator,
    open_module,
    run,
    work_area,
)
from bench.measure import figure, percentile, reporting_errors
from consumer import Delivery, open_producer
from consumer.admin import AdminError, GroupReport, open_admin
from launch.cluster import agreed_coordinator, eventually
from launch.zookeeper import open_ensemble
from protocol.types import TopicPartition

BENCHMARK = "failover"
DEADLINE = 90.0
#: The brokers' ZooKeeper session timeout and the consumers' session timeout (T), in seconds.
ZK_SESSION = 2.0
#: The default T (``--consumer-session`` sets another): one the design rule admits
#: (docs/design.md#defaults-that-fit-a-failover: Z + a tick of the test ensemble, 500 ms, + load +
#: discovery < T/3 = 5 s), as a user following the docs would choose.
CONSUMER_SESSION = 15.0
BROKERS = 3
CONSUMERS = 6
PARTITIONS_PER_BROKER = 4
#: Records per second each producer sends (round robin over its topic's partitions).
RATE = 200.0
GROUP = "g"
#: After the fault, how long the group has to be Stable at the new coordinator before the run
#: goes on without it (the figure then says it was not reached).
STABLE_DEADLINE = 40.0
#: After the producers stop, how long the consumers have to be given every acknowledged record.
DRAIN_DEADLINE = 20.0
#: The steady window begins once every partition's latest record is at most this old.
CAUGHT_UP = 0.5
SCENARIOS = ("kill_9", "sigstop")

Broker = tuple[int, ServerProcess]
Key = tuple[str, int]  # (topic, partition)


def topic_of(broker_id: int) -> str:
    return f"orders-{broker_id}"


def address(broker: Broker) -> tuple[str, int]:
    return (broker[1].host, broker[1].port)


def ids(brokers: list[Broker]) -> list[tuple[int, tuple[str, int]]]:
    return [(broker_id, address((broker_id, server))) for broker_id, server in brokers]


def stable_target(scenario: str, consumer_session: float) -> float:
    """The issue's target for the fault to Stable at the new coordinator, in seconds."""
    if scenario == "kill_9":
        return ZK_SESSION + 1.5
    return max(ZK_SESSION, 2 * consumer_session / 3) + 1.5


@attrs.frozen(kw_only=True)
class Consumed:
    received: float
    consumer: int
    generation: int
    seq: int
    #: When the producer handed it over (CLOCK_MONOTONIC, like ``received``).
    sent: float


@attrs.define
class Observed:
    """What the consumer processes printed, by partition, and what the producers had
    acknowledged."""

    consumed: dict[Key, list[Consumed]] = attrs.field(factory=lambda: defaultdict(list))
    acknowledged: dict[Key, set[int]] = attrs.field(factory=lambda: defaultdict(set))
    deliveries: list[tuple[int, Delivery]] = attrs.field(factory=list)

    def take(self, consumer: int, line: str) -> None:
        received, generation, topic, partition, _offset, seq, sent = line.split()
        self.consumed[(topic, int(partition))].append(
            Consumed(
                received=float(received),
                consumer=consumer,
                generation=int(generation),
                seq=int(seq),
                sent=float(sent),
            )
        )

    def note_acknowledged(self) -> None:
        for seq, delivery in self.deliveries:
            if delivery.done and delivery.error is None:
                self.acknowledged[(delivery.topic, delivery.partition)].add(seq)

    def caught_up(self, keys: list[Key], within: float) -> bool:
        """Every partition's latest record reached a consumer at most ``within`` seconds after it
        was sent, and was sent that recently: the backlog of the group's start is read."""
        now = time.monotonic()
        latest = [max(self.consumed[k], key=lambda c: c.sent, default=None) for k in keys]
        return all(c is not None and c.sent > now - within for c in latest)

    def drained(self, keys: list[Key]) -> bool:
        return all(self.acknowledged[k] <= {c.seq for c in self.consumed[k]} for k in keys)


def firsts(events: list[Consumed]) -> list[float]:
    """When each record first reached the application, in time order."""
    first: dict[int, float] = {}
    for event in events:
        first[event.seq] = min(first.get(event.seq, math.inf), event.received)
    return sorted(first.values())


def gaps_within(times: list[float], start: float, end: float) -> list[float]:
    """Gaps between consecutive times that both fall in [start, end]."""
    inside = [t for t in times if start <= t <= end]
    return [b - a for a, b in itertools.pairwise(inside)]


def longest_gap_after(times: list[float], fault: float, end: float) -> float:
    """The longest stretch without a new record that overlaps [fault, end], counting the stretch
    from the last record to ``end`` when nothing came after it."""
    before = [t for t in times if t <= fault]
    after = [t for t in times if fault < t <= end]
    points = before[-1:] + after + [end]
    return max((b - a for a, b in itertools.pairwise(points)), default=end - fault)


def two_consumers_at_once(events: list[Consumed]) -> bool:
    """A consumer was given a record between two records another consumer was given under one
    generation: that one held the partition all along, so both did."""
    ordered = sorted(events, key=lambda e: e.received)
    last_index: dict[int, int] = {}
    previous: dict[int, Consumed] = {}
    for index, event in enumerate(ordered):
        before = previous.get(event.consumer)
        if before is not None and before.generation == event.generation:
            since = last_index[event.consumer]
            if any(i > since for c, i in last_index.items() if c != event.consumer):
                return True
        last_index[event.consumer] = index
        previous[event.consumer] = event
    return False


@attrs.define
class Outcome:
    scenario: str
    observed: Observed
    surviving: list[Key]
    steady: tuple[float, float]
    fault: float
    end: float
    elected: float
    stable: float | None
    generation_formed: int
    generation_before: int
    generation_after: int | None
    consumer_session: float


@contextlib.asynccontextmanager
async def open_brokers(
    hosts: str,
    work_dir: Path,
    shed_above_lag: float | None = None,
    *,
    session: float = ZK_SESSION,
) -> AsyncIterator[list[Broker]]:
    """BROKERS brokers sharing ZooKeeper at ``hosts``, broker N's data in ``work_dir/brokerN``;
    ``session``: their ZooKeeper session timeout."""
    door = () if shed_above_lag is None else (f"--shed-above-lag={shed_above_lag}",)
    async with contextlib.AsyncExitStack() as stack:
        brokers = []
        for broker_id in range(1, BROKERS + 1):
            server = await stack.enter_async_context(
                open_coordinator(
                    work_dir / f"broker{broker_id}",
                    f"--broker-id={broker_id}",
                    f"--zookeeper={hosts}",
                    f"--zookeeper-session-timeout={session}",
                    "--commit-interval=0.2",
                    *door,
                )
            )
            brokers.append((broker_id, server))
        yield brokers


async def run_consumer(
    index: int, brokers: list[Broker], observed: Observed, log_path: Path, consumer_session: float
) -> None:
    """One consumer process for as long as the caller's scope lasts; its lines go to
    ``observed``."""
    bootstrap = ",".join(f"{h}:{p}" for h, p in (address(b) for b in brokers))
    arguments = [
        f"--bootstrap={bootstrap}",
        f"--group={GROUP}",
        f"--session-timeout={consumer_session}",
        f"--client-id=bench-{index}",
        *(topic_of(broker_id) for broker_id, _ in brokers),
    ]
    async with open_module("bench.failover_consumer", arguments, log_path) as process:
        assert process.stdout is not None
        lines = LineReader(process.stdout)
        while (line := await lines.next()) is not None:
            observed.take(index, line)


async def produce(topic: str, brokers: list[Broker], observed: Observed, stop: trio.Event) -> None:
    """RATE records/s to ``topic`` until ``stop``; then wait (bounded) for their acknowledgements.
    A producer whose broker is gone is cancelled by the caller's scope instead."""
    async with open_producer([address(b) for b in brokers]) as producer:
        due = trio.current_time()
        seq = 0
        while not stop.is_set():
            value = f"{seq} {time.monotonic():.6f}".encode()
            observed.deliveries.append((seq, await producer.enqueue(topic, value)))
            seq += 1
            due += 1 / RATE
            await trio.sleep_until(due)
        with trio.move_on_after(DRAIN_DEADLINE):
            await producer.flush()
        producer.nursery.cancel_scope.cancel()


async def describe(broker: Broker) -> GroupReport | None:
    with contextlib.suppress(Exception), trio.fail_after(5):
        async with open_admin([address(broker)]) as admin:
            return await admin.describe_group(GROUP)
    return None


def whole_and_stable(report: GroupReport | None, everything: set[TopicPartition]) -> bool:
    if report is None or report.state != "Stable" or len(report.members) != CONSUMERS:
        return False
    held = {tp for member in report.members for tp in member.partitions}
    return held == everything


async def stable_report(broker: Broker, everything: set[TopicPartition]) -> GroupReport:
    found: list[GroupReport] = []

    async def check() -> bool:
        report = await describe(broker)
        if report is not None and whole_and_stable(report, everything):
            found.append(report)
            return True
        return False

    await eventually(check, deadline=DEADLINE)
    return found[0]


async def placement_at(broker: Broker, names: list[str]) -> dict[Key, int] | None:
    """Each partition's broker as ``broker`` describes the topics; None while it does not know
    them all."""
    found: list[dict[Key, int]] = []
    try:
        with trio.fail_after(5):
            async with open_admin([address(broker)]) as admin:
                topics = await admin.topics(names)
        found.append({(t.topic, p.partition): p.broker_id for t in topics for p in t.partitions})
    except* (AdminError, OSError, trio.TooSlowError):
        pass
    return found[0] if found else None


async def agreed_placement(brokers: list[Broker]) -> dict[Key, int]:
    """Each partition's broker, once every broker describes every topic the same (brokers learn
    of each other's topics through ZooKeeper)."""
    names = [topic_of(b) for b, _ in brokers]
    seen: list[dict[Key, int]] = []

    async def agree() -> bool:
        views = [await placement_at(broker, names) for broker in brokers]
        if views[0] is not None and all(v == views[0] for v in views):
            seen.append(views[0])
            return True
        return False

    await eventually(agree, deadline=DEADLINE)
    return seen[0]


async def one_scenario(
    scenario: str,
    hosts: str,
    work_dir: Path,
    steady: float,
    settle: float,
    consumer_session: float,
    shed_above_lag: float | None = None,
) -> Outcome:
    observed = Observed()
    async with open_brokers(hosts, work_dir, shed_above_lag) as brokers:
        first_id = await agreed_coordinator(ids(brokers), group=GROUP, deadline=DEADLINE)
        first = next(b for b in brokers if b[0] == first_id)
        survivors = [b for b in brokers if b is not first]
        for broker in brokers:  # each topic lives on one broker
            async with open_admin([address(broker)]) as admin:
                await admin.create_topic(
                    topic_of(broker[0]), PARTITIONS_PER_BROKER, [broker[0]], replication_factor=1
                )
        # Where the partitions are, as a client learns it: a partition survives the fault when
        # its broker is not the coordinator's.
        placement = await agreed_placement(brokers)
        if set(placement.values()) != {b for b, _ in brokers}:
            raise RuntimeError(f"partitions not on every broker: {placement}")
        everything = {TopicPartition(topic=t, partition=p) for t, p in placement}
        all_keys = sorted(placement)
        surviving = sorted(k for k, broker_id in placement.items() if broker_id != first_id)
        stop = trio.Event()
        async with trio.open_nursery() as consumers, trio.open_nursery() as producers:
            for index in range(CONSUMERS):
                consumers.start_soon(
                    run_consumer,
                    index,
                    brokers,
                    observed,
                    work_dir / f"consumer{index}.log",
                    consumer_session,
                )
            for broker_id, _ in brokers:
                producers.start_soon(produce, topic_of(broker_id), brokers, observed, stop)
            formed = await stable_report(first, everything)

            async def caught_up() -> bool:
                return observed.caught_up(all_keys, CAUGHT_UP)

            await eventually(caught_up, deadline=DEADLINE)
            steady_start = time.monotonic()
            await trio.sleep(steady)
            before = await stable_report(first, everything)  # the generation at the fault
            fault = time.monotonic()
            first[1].process.send_signal(signal.SIGKILL if scenario == "kill_9" else signal.SIGSTOP)
            second_id = await agreed_coordinator(ids(survivors), group=GROUP, deadline=DEADLINE)
            elected = time.monotonic() - fault
            if scenario == "sigstop":
                first[1].process.send_signal(signal.SIGCONT)
            # For reading the logs against the fault (the consumers' lines are on this clock).
            (work_dir / "fault.txt").write_text(
                f"{scenario} of broker {first_id} at monotonic {fault:.6f} "
                f"(wall {time.time() - (time.monotonic() - fault):.6f}); "
                f"broker {second_id} coordinator {elected:.3f} s later\n"
            )
            second = next(b for b in survivors if b[0] == second_id)
            stable: float | None = None
            after: GroupReport | None = None
            with trio.move_on_after(STABLE_DEADLINE - elected):
                after = await stable_report(second, everything)
                stable = time.monotonic() - fault
            await trio.sleep(settle)
            end = time.monotonic()
            stop.set()
            with trio.move_on_after(DRAIN_DEADLINE):
                await wait_drained(observed, surviving)
            producers.cancel_scope.cancel()  # the dead broker's producer would retry on and on
            consumers.cancel_scope.cancel()
        return Outcome(
            scenario=scenario,
            observed=observed,
            surviving=surviving,
            steady=(steady_start, fault),
            fault=fault,
            end=end,
            elected=elected,
            stable=stable,
            generation_formed=formed.generation,
            generation_before=before.generation,
            generation_after=None if after is None else after.generation,
            consumer_session=consumer_session,
        )


async def wait_drained(observed: Observed, keys: list[Key]) -> None:
    """Until every record the surviving brokers acknowledged has reached a consumer (the
    producers flush first: until then, acknowledgements still come in)."""
    while True:
        observed.note_acknowledged()
        flushed = all(d.done for _, d in observed.deliveries if (d.topic, d.partition) in set(keys))
        if flushed and observed.drained(keys):
            return
        await trio.sleep(0.1)


def report(outcome: Outcome, run_: int) -> None:
    s = outcome.scenario
    observed = outcome.observed
    observed.note_acknowledged()
    steady_gaps: list[float] = []
    longest: dict[str, float] = {}
    for key in outcome.surviving:
        times = firsts(observed.consumed[key])
        steady_gaps += gaps_within(times, *outcome.steady)
        longest[f"{key[0]}/{key[1]}"] = longest_gap_after(times, outcome.fault, outcome.end) * 1000
    baseline = percentile(steady_gaps, 99) * 1000
    latencies = [
        e.received - e.sent
        for k in outcome.surviving
        for e in observed.consumed[k]
        if outcome.steady[0] <= e.received <= outcome.steady[1]
    ]
    events = {k: observed.consumed[k] for k in outcome.surviving}
    extra: dict[str, Any] = {
        "run": run_,
        "brokers": BROKERS,
        "zookeeper_servers": 3,
        "consumers": CONSUMERS,
        "partitions": BROKERS * PARTITIONS_PER_BROKER,
        "surviving_partitions": len(outcome.surviving),
        "records_per_s_per_producer": RATE,
        "zookeeper_session_timeout_ms": ZK_SESSION * 1000,
        "consumer_session_timeout_ms": outcome.consumer_session * 1000,
        "steady_s": round(outcome.steady[1] - outcome.steady[0], 1),
    }
    figure(
        BENCHMARK,
        f"{s}_longest_gap",
        max(longest.values()),
        "ms",
        baseline,
        target_ms=round(max(2 * baseline, baseline + 100), 1),
        longest_gap_ms={k: round(v, 1) for k, v in longest.items()},
        steady_gaps=len(steady_gaps),
        # How long records took from the producer to the application in the steady window.
        steady_latency_p50_ms=round(statistics.median(latencies) * 1000, 1),
        steady_latency_p99_ms=round(percentile(latencies, 99) * 1000, 1),
        **extra,
    )
    figure(BENCHMARK, f"{s}_to_elected", outcome.elected * 1000, "ms", ZK_SESSION * 1000, **extra)
    figure(
        BENCHMARK,
        f"{s}_to_stable",
        None if outcome.stable is None else outcome.stable * 1000,
        "ms",
        stable_target(s, outcome.consumer_session) * 1000,
        reached=outcome.stable is not None,
        **extra,
    )
    # The generations the consumers held as records reached them, as they saw it themselves.
    held = [e for k in outcome.surviving for e in observed.consumed[k]]
    stable_at = outcome.end if outcome.stable is None else outcome.fault + outcome.stable
    figure(
        BENCHMARK,
        f"{s}_generation",
        outcome.generation_after,
        "generation",
        outcome.generation_before,
        # A generation before the fault newer than the first: a rebalance in the steady window.
        formed=outcome.generation_formed,
        consumers_before=sorted({e.generation for e in held if e.received <= outcome.fault}),
        consumers_after=sorted(
            {e.generation for e in held if stable_at < e.received <= outcome.end}
        ),
        **extra,
    )
    duplicates = {f"{k[0]}/{k[1]}": len(e) - len({c.seq for c in e}) for k, e in events.items()}
    missing = {
        f"{k[0]}/{k[1]}": len(observed.acknowledged[k] - {c.seq for c in e})
        for k, e in events.items()
    }
    overlapping = [f"{k[0]}/{k[1]}" for k, e in events.items() if two_consumers_at_once(e)]
    acknowledged = sum(len(observed.acknowledged[k]) for k in outcome.surviving)
    for name, value, per_partition, unit in (
        ("duplicates", sum(duplicates.values()), duplicates, "records"),
        ("missing", sum(missing.values()), missing, "records"),
        ("two_consumers_at_once", len(overlapping), overlapping, "partitions"),
    ):
        figure(
            BENCHMARK,
            f"{s}_{name}",
            value,
            unit,
            None,
            per_partition=per_partition,
            acknowledged=acknowledged,
            **extra,
        )


async def bench(
    runs: int,
    steady: float,
    settle: float,
    work_dir: Path,
    consumer_session: float,
    scenarios: tuple[str, ...] = SCENARIOS,
    shed_above_lag: float | None = None,
) -> None:
    shutil.rmtree(work_dir / "ensemble", ignore_errors=True)  # a fresh ensemble, fresh chroots
    with open_ensemble(3, base_dir=work_dir / "ensemble") as ensemble:
        for run_ in range(runs):
            for scenario in scenarios:
                with reporting_errors(BENCHMARK, f"{scenario}_to_stable", run=run_):
                    outcome = await one_scenario(
                        scenario,
                        f"{ensemble.hosts}/failover-{scenario}-{run_}",
                        work_dir / f"{scenario}-{run_}",
                        steady,
                        settle,
                        consumer_session,
                        shed_above_lag,
                    )
                    report(outcome, run_)


def main() -> None:
    parser = bench_arguments(__doc__.splitlines()[0])
    parser.add_argument(
        "--consumer-session",
        type=float,
        default=CONSUMER_SESSION,
        help=f"the consumers' session timeout T in seconds (default {CONSUMER_SESSION:g})",
    )
    parser.sized("--runs", quick=1, full=2, kind=int, help="runs of each scenario")
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS,
        action="append",
        help="run only this scenario (repeatable; default: every one)",
    )
    parser.add_argument(
        "--shed-above-lag",
        type=float,
        default=None,
        help="the brokers' door (serve --shed-above-lag; default: off, as serve's)",
    )
    args = parser.parse()
    runs, (steady, settle) = args.runs, (4.0, 2.0) if args.quick else (15.0, 5.0)
    scenarios = tuple(args.scenario or SCENARIOS)
    with work_area(args.work_dir) as work_dir:
        run(
            lambda: bench(
                runs,
                steady,
                settle,
                work_dir,
                args.consumer_session,
                scenarios,
                args.shed_above_lag,
            )
        )


if __name__ == "__main__":
    main()
