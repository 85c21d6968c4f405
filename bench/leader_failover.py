"""A partition leader's kill -9 under a consuming group, with real processes: three brokers
(``coordinator serve --zookeeper``) on a standalone ZooKeeper, a topic of replication factor 3
(min.insync.replicas 2) of ``--partitions`` partitions, the ``consumer`` library's producer (in
this process, acks=all) sending RATE records/s round robin over them, each record stamped with
its sequence number and CLOCK_MONOTONIC send time, and a group of CONSUMERS consumer processes
(``python -m bench.failover_consumer``, the library consumer) printing every record as it
reaches the application.

The broker killed (SIGKILL) leads some of the partitions and does not coordinate the group, so
that the group sees a leader change and nothing else (docs/design.md#replication: it is not a
group event). Per run, on fresh brokers:

* ``to_new_leader``: the kill to the moment every partition the dead broker led has another
  leader in ClusterMetadata, as a surviving broker answers it (both are asked in turn, as fast as
  they answer; the first to name the new leader counts). The issue's target: Z + 1 s
  (``target_ms``), Z being the brokers' ZooKeeper session timeout (the baseline: a dead broker's
  session must expire before anything can be decided).
* ``new_leader_to_consumed``: for each of those partitions, its new leader visible to the
  first record of it reaching the application after the kill; the worst partition. The target:
  1 s. The baseline: the p99 gap between two consecutive records of those partitions reaching
  the application in the steady window before the kill (what a consumer waits with no kill).
  Beside it, which side took the time, the worst partition of each: the producer (the new
  leader visible to that record's acknowledgement, 0 if it was acknowledged before: the
  producer must find the new leader too before there is anything new to read) and the consumer
  (the later of the two to the application, against the p99 of the acknowledgement to the
  application in the steady window).
* ``to_consumed``: the kill to that first record, the worst partition (target: Z + 2 s).
* ``generation``: the generation the consumers held as records reached them after the kill,
  against the one before (the target: the same), with the records acknowledged that no
  consumer was given once the producer stopped and the consumers drained (``missing``).

With ``--consumers 0`` only the producer runs beside the brokers and ``to_new_leader`` alone is
reported: the leaders' move at partition counts a group of this machine's consumers cannot
follow (each fetcher polls its partition on its own).

    python -m bench.leader_failover [--quick] [--work-dir DIR] [--runs N] [--partitions P]
        [--consumers C] [--zookeeper-session-timeout Z]
"""

from __future__ import annotations

import contextlib
import math
import shutil
import signal
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from bench.bare import LineReader
from bench.failover import (
    BROKERS,
    Broker,
    Consumed,
    Key,
    Observed,
    address,
    firsts,
    gaps_within,
    open_brokers,
)
from bench.harness import bench_arguments, open_module, run, work_area
from bench.measure import figure, percentile, reporting_errors
from consumer import Delivery, ProduceError, open_producer
from consumer.admin import AdminError, open_admin
from consumer.leaders import Leader
from launch.cluster import agreed_coordinator, eventually
from launch.zookeeper import open_ensemble
from protocol.types import TopicPartition
from transport.channel import ChannelClosed

BENCHMARK = "leader_failover"
DEADLINE = 90.0
TOPIC = "clicks"
GROUP = "readers"
#: Records per second the producer sends, round robin over the partitions.
RATE = 300.0
#: The consumers' session timeout: long enough that no consumer is taken for dead on a busy
#: machine (that would be a group event the kill did not cause).
CONSUMER_SESSION = 15.0
#: The steady window begins once every partition's latest record is at most this old.
CAUGHT_UP = 1.0
#: After the producer stops, how long the consumers have to be given every acknowledged record.
DRAIN_DEADLINE = 30.0


async def leaders_at(broker: Broker) -> dict[TopicPartition, Leader] | None:
    """The topic's leaders as ``broker`` answers; None if it does not."""
    found: list[dict[TopicPartition, Leader]] = []
    try:
        with trio.fail_after(5):
            async with open_admin([address(broker)]) as admin:
                found.append(dict((await admin.listing([TOPIC])).leaders))
    except* (OSError, AdminError, ChannelClosed, trio.TooSlowError):
        pass
    return found[0] if found else None


async def all_in_sync(brokers: Sequence[Broker], partitions: int) -> dict[TopicPartition, Leader]:
    """Every broker names a leader and three in-sync replicas for every partition."""
    seen: list[dict[TopicPartition, Leader]] = []

    async def check() -> bool:
        for broker in brokers:
            found = await leaders_at(broker)
            if (
                found is None
                or len(found) != partitions
                or not all(v.broker_id >= 0 and len(v.isr) == 3 for v in found.values())
            ):
                return False
            seen[:] = [found]
        return True

    await eventually(check, deadline=DEADLINE)
    return seen[0]


async def watch_leaders(
    broker: Broker, moving: set[TopicPartition], dead: int, seen: dict[TopicPartition, float]
) -> None:
    """Ask ``broker`` for the leaders, over one connection, about as fast as it answers, until
    every partition of ``moving`` has a leader other than ``dead``: the first time each one did,
    in ``seen`` (CLOCK_MONOTONIC, the time of the answer)."""
    while not moving <= seen.keys():
        try:
            async with open_admin([address(broker)]) as admin:
                while not moving <= seen.keys():
                    asked = time.monotonic()
                    with trio.fail_after(5):
                        found = (await admin.listing([TOPIC])).leaders
                    answered = time.monotonic()
                    for tp in moving - seen.keys():
                        leader = found.get(tp)
                        if leader is not None and leader.broker_id not in (-1, dead):
                            seen[tp] = answered
                    # at most half the broker's time on the watch: a wide topic's answer is long
                    await trio.sleep(max(0.01, answered - asked))
        except* (OSError, AdminError, ChannelClosed, trio.TooSlowError):
            await trio.sleep(0.05)  # asked again on a new connection


async def run_consumer(
    index: int, brokers: list[Broker], observed: Observed, log_path: Path
) -> None:
    bootstrap = ",".join(f"{h}:{p}" for h, p in (address(b) for b in brokers))
    arguments = [
        f"--bootstrap={bootstrap}",
        f"--group={GROUP}",
        f"--session-timeout={CONSUMER_SESSION}",
        f"--client-id=bench-{index}",
        TOPIC,
    ]
    async with open_module("bench.failover_consumer", arguments, log_path) as process:
        assert process.stdout is not None
        lines = LineReader(process.stdout)
        while (line := await lines.next()) is not None:
            observed.take(index, line)


async def produce(
    brokers: list[Broker],
    observed: Observed,
    acknowledged_at: dict[int, float],
    partitions: int,
    stop: trio.Event,
) -> None:
    """RATE records/s round robin until ``stop``; then wait (bounded) for their
    acknowledgements. When the producer heard each one acknowledged goes to
    ``acknowledged_at`` (by sequence number; CLOCK_MONOTONIC)."""

    async def note(deliveries: trio.MemoryReceiveChannel[tuple[int, Delivery]]) -> None:
        # One partition's records are acknowledged in the order they were sent.
        async for seq, delivery in deliveries:
            with contextlib.suppress(ProduceError):
                await delivery.wait()
                acknowledged_at[seq] = time.monotonic()

    async with (
        open_producer([address(b) for b in brokers]) as producer,
        trio.open_nursery() as noting,
    ):
        senders = []
        for _ in range(partitions):
            send, receive = trio.open_memory_channel[tuple[int, Delivery]](math.inf)
            senders.append(send)
            noting.start_soon(note, receive)
        due = trio.current_time()
        seq = 0
        while not stop.is_set():
            value = f"{seq} {time.monotonic():.6f}".encode()
            delivery = await producer.enqueue(TOPIC, value, partition=seq % partitions)
            observed.deliveries.append((seq, delivery))
            senders[seq % partitions].send_nowait((seq, delivery))
            seq += 1
            due += 1 / RATE
            await trio.sleep_until(due)
        with trio.move_on_after(DRAIN_DEADLINE):
            await producer.flush()
        noting.cancel_scope.cancel()
        producer.nursery.cancel_scope.cancel()


@attrs.frozen(kw_only=True)
class Outcome:
    observed: Observed
    moved: list[Key]
    victim: int
    coordinator: int
    fault: float
    steady: tuple[float, float]
    new_leader: dict[Key, float]
    acknowledged_at: dict[int, float]


async def one_run(
    hosts: str, work_dir: Path, partitions: int, consumers: int, session: float, steady: float
) -> Outcome:
    observed = Observed()
    acknowledged_at: dict[int, float] = {}
    async with open_brokers(hosts, work_dir, session=session) as brokers:
        coordinator = await agreed_coordinator(
            [(b, address((b, s))) for b, s in brokers], group=GROUP, deadline=DEADLINE
        )
        async with open_admin([address(b) for b in brokers]) as admin:
            await admin.create_topic(
                TOPIC, partitions, replication_factor=3, configs={"min.insync.replicas": "2"}
            )
        placed = await all_in_sync(brokers, partitions)
        # The victim: the broker leading most partitions among those not coordinating the group.
        led = {b: [tp for tp, v in placed.items() if v.broker_id == b] for b, _ in brokers}
        victim = max((b for b in led if b != coordinator), key=lambda b: len(led[b]))
        moving = set(led[victim])
        keys = [(TOPIC, p) for p in range(partitions)]
        moved = sorted((tp.topic, tp.partition) for tp in moving)
        stop = trio.Event()
        async with trio.open_nursery() as consuming, trio.open_nursery() as producing:
            for index in range(consumers):
                log_path = work_dir / f"consumer{index}.log"
                consuming.start_soon(run_consumer, index, brokers, observed, log_path)
            producing.start_soon(produce, brokers, observed, acknowledged_at, partitions, stop)

            # A partition's records come every partitions / RATE seconds.
            within = CAUGHT_UP + 3 * partitions / RATE

            async def caught_up() -> bool:
                return observed.caught_up(keys, within)

            try:
                await eventually(caught_up if consumers else _flowing, deadline=DEADLINE)
            except trio.TooSlowError:
                consumed = sum(1 for k in keys if observed.consumed[k])
                raise RuntimeError(
                    f"the group did not catch up: {consumed} of {partitions} partitions consumed"
                ) from None
            steady_start = time.monotonic()
            await trio.sleep(steady)
            still = {
                tp
                for tp, v in (await all_in_sync(brokers, partitions)).items()
                if v.broker_id == victim
            }
            if still != moving:
                raise RuntimeError(f"leaders moved before the kill: {sorted(still ^ moving)}")
            fault = time.monotonic()
            victim_server = next(s for b, s in brokers if b == victim)
            victim_server.process.send_signal(signal.SIGKILL)
            seen: dict[TopicPartition, float] = {}
            with trio.fail_after(DEADLINE):
                async with trio.open_nursery() as watching:
                    for broker in brokers:
                        if broker[0] != victim:
                            watching.start_soon(watch_leaders, broker, moving, victim, seen)

            async def consumed_again() -> bool:
                return all(any(c.received > fault for c in observed.consumed[key]) for key in moved)

            if consumers:
                await eventually(consumed_again, deadline=DEADLINE)
                await trio.sleep(1.0)  # records after the move, for the generation they come with
                stop.set()
                with trio.move_on_after(DRAIN_DEADLINE):
                    await drained(observed, keys)
            producing.cancel_scope.cancel()
            consuming.cancel_scope.cancel()
        return Outcome(
            observed=observed,
            moved=moved,
            victim=victim,
            coordinator=coordinator,
            fault=fault,
            steady=(steady_start, fault),
            new_leader={(tp.topic, tp.partition): t for tp, t in seen.items()},
            acknowledged_at=acknowledged_at,
        )


async def _flowing() -> bool:
    """Without consumers: nothing to wait for but the steady window."""
    return True


async def drained(observed: Observed, keys: list[Key]) -> None:
    """Until the producer has every answer and every acknowledged record reached a consumer."""
    while True:
        observed.note_acknowledged()
        if all(d.done for _, d in observed.deliveries) and observed.drained(keys):
            return
        await trio.sleep(0.1)


def report(outcome: Outcome, run_: int, partitions: int, consumers: int, session: float) -> None:
    fault = outcome.fault
    extra: dict[str, Any] = {
        "run": run_,
        "brokers": BROKERS,
        "zookeeper_servers": 1,
        "partitions": partitions,
        "replication_factor": 3,
        "partitions_moved": len(outcome.moved),
        "consumers": consumers,
        "records_per_s": RATE,
        "zookeeper_session_timeout_ms": session * 1000,
        "consumer_session_timeout_ms": CONSUMER_SESSION * 1000,
        "victim": outcome.victim,
        "coordinator": outcome.coordinator,
    }

    def spread(values: dict[Key, float]) -> dict[str, float]:
        ordered = list(values.values())
        return {
            "first_ms": round(min(ordered), 1),
            "median_ms": round(statistics.median(ordered), 1),
        }

    to_leader = {k: (t - fault) * 1000 for k, t in outcome.new_leader.items()}
    figure(
        BENCHMARK,
        "to_new_leader",
        max(to_leader.values()),
        "ms",
        session * 1000,
        target_ms=(session + 1) * 1000,
        **spread(to_leader),
        **extra,
    )
    if not consumers:
        return
    observed = outcome.observed
    observed.note_acknowledged()
    steady_gaps: list[float] = []
    resumed: dict[Key, float] = {}
    # The first record of each moved partition given to the application after the kill, when
    # the producer heard it acknowledged, and the same in the steady window (the baseline).
    first_after: dict[Key, Consumed] = {}
    steady_delay: list[float] = []
    acknowledged_at = outcome.acknowledged_at
    for key in outcome.moved:
        times = firsts(observed.consumed[key])
        steady_gaps += gaps_within(times, *outcome.steady)
        resumed[key] = min(t for t in times if t > fault)
        first_after[key] = min(
            (c for c in observed.consumed[key] if c.received > fault), key=lambda c: c.received
        )
        steady_delay += [
            c.received - acknowledged_at[c.seq]
            for c in observed.consumed[key]
            if outcome.steady[0] <= c.received <= outcome.steady[1] and c.seq in acknowledged_at
        ]
    baseline = percentile(steady_gaps, 99) * 1000
    # Which side took the time after the new leader was known: the producer, to write there
    # (from the new leader known to the acknowledgement of that first record, none if it was
    # acknowledged before), or the consumer, to read it (from the later of the two to the
    # application; against the acknowledgement to the application in the steady window).
    producer_part: dict[Key, float] = {}
    consumer_part: dict[Key, float] = {}
    for key, first in first_after.items():
        ready = max(acknowledged_at.get(first.seq, math.nan), outcome.new_leader[key])
        producer_part[key] = (ready - outcome.new_leader[key]) * 1000
        consumer_part[key] = (first.received - ready) * 1000
    to_consumed = {k: (t - fault) * 1000 for k, t in resumed.items()}
    after_leader = {k: (resumed[k] - outcome.new_leader[k]) * 1000 for k in outcome.moved}
    figure(
        BENCHMARK,
        "new_leader_to_consumed",
        max(after_leader.values()),
        "ms",
        baseline,
        target_ms=1000,
        **spread(after_leader),
        steady_gaps=len(steady_gaps),
        new_leader_to_acknowledged_ms=round(max(producer_part.values()), 1),
        acknowledged_to_consumed_ms=round(max(consumer_part.values()), 1),
        acknowledged_to_consumed_steady_p99_ms=round(percentile(steady_delay, 99) * 1000, 1),
        **extra,
    )
    figure(
        BENCHMARK,
        "to_consumed",
        max(to_consumed.values()),
        "ms",
        baseline,
        target_ms=(session + 2) * 1000,
        **spread(to_consumed),
        **extra,
    )
    consumed = [c for key in observed.consumed for c in observed.consumed[key]]
    before = sorted({c.generation for c in consumed if c.received <= fault})
    after = sorted({c.generation for c in consumed if c.received > fault})
    missing = sum(
        len(observed.acknowledged[k] - {c.seq for c in observed.consumed[k]})
        for k in observed.acknowledged
    )
    figure(
        BENCHMARK,
        "generation",
        max(after, default=None),
        "generation",
        max(before, default=None),
        generations_before=before,
        generations_after=after,
        missing=missing,
        acknowledged=sum(len(v) for v in observed.acknowledged.values()),
        **extra,
    )


async def bench(
    runs: int, partitions: int, consumers: int, session: float, steady: float, work_dir: Path
) -> None:
    shutil.rmtree(work_dir / "zookeeper", ignore_errors=True)
    with open_ensemble(1, base_dir=work_dir / "zookeeper") as ensemble:
        for run_ in range(runs):
            with reporting_errors(BENCHMARK, "to_new_leader", run=run_):
                outcome = await one_run(
                    f"{ensemble.hosts}/leader-failover-{run_}",
                    work_dir / f"run{run_}",
                    partitions,
                    consumers,
                    session,
                    steady,
                )
                report(outcome, run_, partitions, consumers, session)


def main() -> None:
    parser = bench_arguments(__doc__.splitlines()[0])
    parser.sized("--runs", quick=1, full=5, kind=int, help="kills, each on fresh brokers")
    parser.sized("--partitions", quick=6, full=30, kind=int, help="partitions of the topic")
    parser.sized(
        "--consumers",
        quick=2,
        full=3,
        kind=int,
        help="consumer processes (0: the leaders' move alone, to_new_leader)",
    )
    parser.add_argument(
        "--zookeeper-session-timeout",
        type=float,
        default=2.0,
        help="the brokers' ZooKeeper session timeout Z in seconds (default 2)",
    )
    args = parser.parse()
    steady = 3.0 if args.quick else 10.0
    with work_area(args.work_dir) as work_dir:
        run(
            lambda: bench(
                args.runs,
                args.partitions,
                args.consumers,
                args.zookeeper_session_timeout,
                steady,
                work_dir,
            )
        )


if __name__ == "__main__":
    main()
