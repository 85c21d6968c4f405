"""The coordinator against its predecessor, seed 02's ZooKeeper-based client-side rebalancing
(``bench/seed02_consumer.py``), for groups of 10, 50 and 100 consumers on one topic of 100
partitions, both on the same standalone ZooKeeper in the same run.

For each design and size: the group forms (every consumer starts at once), one more consumer joins,
then one dies; after each, the time until the assignment is settled and the ZooKeeper requests
made meanwhile. Over the whole run: failed ownership claims and two-owner instants (pairs of fetch
leases of two consumers on one partition that overlapped in time).

* seed 02: every consumer has its own ZooKeeper session; requests are counted by
  ``ZooKeeperRebalanceSession.operations`` over all sessions. A death closes the consumer's
  session (its ephemeral nodes go at once; a crash would wait for the session timeout). Settled:
  every live consumer is done rebalancing, no watch has fired since it read the members, and it
  fetches exactly its range share of the live members.
* the coordinator: the real ``GroupCoordinator`` on a ``ZooKeeperStore`` (requests counted by
  ``ZooKeeperStore.operations``), with ``simulation``'s consumers (the library's own, each a
  simulated process) over in-memory streams on the real clock; their fetch leases go to an
  ``OwnershipLedger``. A death closes the consumer's connection. Settled: ``wait_settled``.

Neither side moves offsets (nothing is produced, so no consumer finishes a record), and the
phases are 2.5 s apart, so that the coordinator's one-time write of a new group's first offset
reports (100 existence checks and a transaction) falls between them: the counts are the
rebalancing's own.
Each figure's ``value`` is the coordinator's, its ``baseline`` seed 02's.

    python -m bench.seed02 [--quick] [--work-dir DIR]
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path

import attrs
import trio

from bench.bare import LineReader
from bench.harness import (
    bench_arguments,
    run,
    work_area,
)
from bench.measure import figure, reporting_errors
from bench.seed02_consumer import Seed02Consumer
from bench.seed02_session import ZooKeeperRebalanceSession, open_zk_rebalance_session
from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import open_group_coordinator
from launch.zookeeper import open_ensemble
from protocol.types import BrokerInfo, Subscription, TopicPartition, TopicStreams
from simulation import LeaseInterval, OwnershipLedger, SimulatedCluster
from statemachine.assignment import range_assign
from store.slot_store import SlotStore
from store.zookeeper import ZooKeeperStore, open_zookeeper_store

BENCHMARK = "seed02"
GROUP = "billing"
TOPIC = "orders"
PARTITIONS = 100
SETTLE_DEADLINE = 60.0
POLL = 0.005
#: The simulated consumers' session timeout: a Ping (with their offsets) every second.
SESSION_MS = 3000
#: Between phases: longer than a Ping interval plus the coordinator's commit interval (1 s).
QUIET = 2.5
#: Seed 02's retry backoff after a failed claim (Kafka 0.8's default was 2 s).
BACKOFF = 0.2
#: The paused consumer: its id, and its ZooKeeper session timeout (seed 02) or the session
#: timeout it gives the coordinator, in seconds; it is paused for PAUSE_FACTOR times that.
PAUSED = "a-paused"  # sorts first: the range assignment always gives it partitions
PAUSED_SESSION = 2.0
PAUSE_FACTOR = 2.5
REPO = Path(__file__).resolve().parents[1]

_chroots = itertools.count(1)


@attrs.frozen(kw_only=True)
class Phase:
    seconds: float
    operations: int


@attrs.frozen(kw_only=True)
class Outcome:
    formed: Phase
    joined: Phase
    died: Phase
    failed_claims: int
    two_owner_instants: int
    two_owner_instants_pause: int


def two_owner_instants(intervals: Iterable[LeaseInterval]) -> int:
    """Pairs of leases of two different consumers on one partition that overlapped in time."""
    by_partition: dict[TopicPartition, list[LeaseInterval]] = defaultdict(list)
    for interval in intervals:
        by_partition[interval.partition].append(interval)
    count = 0
    for leases in by_partition.values():
        for a, b in itertools.combinations(leases, 2):
            if a.consumer_id != b.consumer_id and a.start < b.end and b.start < a.end:
                count += 1
    return count


async def settle(settled: Callable[[], bool]) -> None:
    with trio.fail_after(SETTLE_DEADLINE):
        while not settled():
            await trio.sleep(POLL)


async def measured(
    operations: Callable[[], int],
    trigger: Callable[[], Awaitable[object]],
    settled: Callable[[], bool],
) -> Phase:
    before = operations()
    started = trio.current_time()
    await trigger()
    await settle(settled)
    phase = Phase(seconds=trio.current_time() - started, operations=operations() - before)
    # Let the coordinator's committer write what the new group's first offset reports made dirty
    # (one-time: it learns the group's 100 offset nodes) before the next phase is measured.
    await trio.sleep(QUIET)
    return phase


# --- seed 02 ------------------------------------------------------------------------------------


@attrs.define(eq=False)
class Seed02Group:
    hosts: str
    nursery: trio.Nursery
    log_dir: Path
    ledger: OwnershipLedger = attrs.Factory(OwnershipLedger)
    consumers: dict[str, Seed02Consumer] = attrs.Factory(dict)
    sessions: list[ZooKeeperRebalanceSession] = attrs.Factory(list)
    _scopes: dict[str, trio.CancelScope] = attrs.Factory(dict)
    #: A consumer in a process of its own (so that it can be paused): what it fetches, and
    #: whether the model counts it as a member now.
    external_owned: set[TopicPartition] = attrs.Factory(set)
    external_member: bool = False

    def operations(self) -> int:
        return sum(session.operations for session in self.sessions)

    async def start(self, consumer_id: str) -> None:
        await self.nursery.start(self._consumer, consumer_id)

    async def _consumer(self, consumer_id: str, *, task_status: trio.TaskStatus[None]) -> None:
        with trio.CancelScope() as scope:
            self._scopes[consumer_id] = scope
            async with open_zk_rebalance_session(self.hosts) as session:
                self.sessions.append(session)
                consumer = Seed02Consumer(
                    session=session,
                    consumer_id=consumer_id,
                    group_id=GROUP,
                    topic=TOPIC,
                    ledger=self.ledger,
                    backoff=BACKOFF,
                )
                self.consumers[consumer_id] = consumer
                await consumer.run(task_status=task_status)

    async def kill(self, consumer_id: str) -> None:
        consumer = self.consumers[consumer_id]
        consumer.alive = False
        consumer.stop_fetching()
        self._scopes[consumer_id].cancel()
        await trio.lowlevel.checkpoint()

    def settled(self) -> bool:
        live = {cid: c for cid, c in self.consumers.items() if c.alive}
        members = sorted([*live, *([PAUSED] if self.external_member else [])])
        subscription = Subscription(topics=(TopicStreams(topic=TOPIC, streams=1),))
        assignment = range_assign(dict.fromkeys(members, subscription), {TOPIC: PARTITIONS})
        expected: dict[str, set[TopicPartition]] = defaultdict(set)
        for tp, thread in assignment.items():
            expected[thread.member_id].add(tp)
        return (not self.external_member or self.external_owned == expected[PAUSED]) and all(
            c.settled_view and c.view == tuple(members) and c.owned == expected[cid]
            for cid, c in live.items()
        )

    async def pause_one(self) -> None:
        """Run one more consumer as a process, SIGSTOP it until its session has expired and the
        others have taken its partitions, then SIGCONT it and wait until the group has settled
        with it again. Its leases are merged into the ledger."""
        offset = time.monotonic() - trio.current_time()  # real-clock: the child's clock
        command = [sys.executable, "-m", "bench.seed02_consumer", "--zookeeper", self.hosts]
        command += ["--group", GROUP, "--topic", TOPIC, "--id", PAUSED]
        command += ["--session-timeout", str(PAUSED_SESSION), "--backoff", str(BACKOFF)]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(self.log_dir / "paused-consumer.log", "ab") as log:
            process = await trio.lowlevel.open_process(
                command, stdout=subprocess.PIPE, stderr=log, env=env
            )
        try:
            assert process.stdout is not None
            lines = LineReader(process.stdout)

            async def read() -> None:
                while (text := await lines.next()) is not None:
                    line = json.loads(text)
                    tp = TopicPartition(topic=TOPIC, partition=line["partition"])
                    at = line["monotonic"] - offset
                    if line["event"] == "began":
                        self.ledger.began(GROUP, PAUSED, tp, at)
                        self.external_owned.add(tp)
                    else:
                        self.ledger.ended(GROUP, PAUSED, tp, at)
                        self.external_owned.discard(tp)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                self.external_member = True
                await settle(self.settled)
                process.send_signal(signal.SIGSTOP)
                paused_at = trio.current_time()
                self.external_member = False
                await settle(self.settled)  # its session expired; the others took over
                await trio.sleep_until(paused_at + PAUSED_SESSION * PAUSE_FACTOR)
                process.send_signal(signal.SIGCONT)
                self.external_member = True
                await settle(self.settled)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                process.send_signal(signal.SIGCONT)
                process.kill()
                await process.wait()


async def run_seed02(hosts: str, size: int, log_dir: Path) -> Outcome:
    async with open_zookeeper_store(hosts) as store:
        await store.create_topic(TOPIC, (1,) * PARTITIONS)
    async with trio.open_nursery() as nursery:
        group = Seed02Group(hosts=hosts, nursery=nursery, log_dir=log_dir)

        async def start_all() -> None:
            for i in range(size):
                await group.start(f"c{i:03d}")

        formed = await measured(group.operations, start_all, group.settled)
        joined = await measured(
            group.operations, lambda: group.start(f"c{size:03d}"), group.settled
        )
        died = await measured(
            group.operations, lambda: group.kill(f"c{size // 2:03d}"), group.settled
        )
        overlaps = two_owner_instants(group.ledger.intervals(trio.current_time()))
        await group.pause_one()
        outcome = Outcome(
            formed=formed,
            joined=joined,
            died=died,
            failed_claims=sum(c.failed_claims for c in group.consumers.values()),
            two_owner_instants=overlaps,
            two_owner_instants_pause=two_owner_instants(group.ledger.intervals(trio.current_time()))
            - overlaps,
        )
        nursery.cancel_scope.cancel()
    return outcome


# --- the coordinator ----------------------------------------------------------------------------


@attrs.define(eq=False)
class ZooKeeperCluster(SimulatedCluster):
    """``simulation``'s cluster with the coordinator on a ZooKeeperStore instead of the
    embedded store, so that its ZooKeeper requests can be counted."""

    hosts: str = ""
    zookeeper: ZooKeeperStore | None = None

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with open_zookeeper_store(self.hosts) as store:
            self.zookeeper = store
            await store.register_broker(self.broker)
            office = SlotStore(inner=store)  # the one slot: the office of every group
            async with (
                open_group_coordinator(office, self.config, self.broker) as coordinator,
                trio.open_nursery() as connections,
            ):
                self.store, self.coordinator = office, coordinator
                self._connections = connections
                connections.start_soon(self._follow_topics, office)
                self.incarnation.value += 1
                task_status.started()
                await trio.sleep_forever()

    def operations(self) -> int:
        return 0 if self.zookeeper is None else self.zookeeper.operations


@contextlib.asynccontextmanager
async def open_zookeeper_cluster(hosts: str) -> AsyncIterator[ZooKeeperCluster]:
    config = CoordinatorConfig(initial_rebalance_delay=0.2, commit_interval=1.0)
    broker = BrokerInfo(broker_id=1, host="simulated", port=9092)
    async with trio.open_nursery() as nursery:
        cluster = ZooKeeperCluster(
            config=config, data_dir=Path("unused"), broker=broker, nursery=nursery, hosts=hosts
        )
        await nursery.start(cluster._serve)
        try:
            yield cluster
        finally:
            nursery.cancel_scope.cancel()


async def run_coordinator(hosts: str, size: int) -> Outcome:
    async with open_zookeeper_cluster(hosts) as cluster:
        await cluster.create_topic(TOPIC, partitions=PARTITIONS)

        async def start(consumer_id: str) -> None:
            await cluster.start_consumer(
                consumer_id,
                group=GROUP,
                topics={TOPIC: 1},
                session_timeout_ms=SESSION_MS,
            )

        async def start_all() -> None:
            for i in range(size):
                await start(f"c{i:03d}")

        def settled() -> bool:
            return cluster._settled()

        formed = await measured(cluster.operations, start_all, settled)
        joined = await measured(cluster.operations, lambda: start(f"c{size:03d}"), settled)
        died = await measured(
            cluster.operations, lambda: cluster.consumers[f"c{size // 2:03d}"].kill(), settled
        )
        overlaps = two_owner_instants(cluster.ledger.intervals(trio.current_time()))
        # One more consumer, paused (a GC pause: it reads, answers and fetches nothing) for the
        # same multiple of its session timeout, then back.
        paused = await cluster.start_consumer(
            PAUSED,
            group=GROUP,
            topics={TOPIC: 1},
            session_timeout_ms=int(PAUSED_SESSION * 1000),
        )
        await settle(settled)
        paused.freeze(PAUSED_SESSION * PAUSE_FACTOR)
        await settle(settled)
        return Outcome(
            formed=formed,
            joined=joined,
            died=died,
            failed_claims=0,  # the coordinator assigns: nobody claims anything
            two_owner_instants=overlaps,
            two_owner_instants_pause=two_owner_instants(
                cluster.ledger.intervals(trio.current_time())
            )
            - overlaps,
        )


# --- the benchmark ------------------------------------------------------------------------------


def report(size: int, coordinator: Outcome, seed02: Outcome) -> None:
    extra = {"consumers": size, "partitions": PARTITIONS, "seed02_backoff_s": BACKOFF}
    for name in ("formed", "joined", "died"):
        ours, theirs = getattr(coordinator, name), getattr(seed02, name)
        figure(
            BENCHMARK,
            f"zk_operations_{name}",
            ours.operations,
            "requests",
            theirs.operations,
            **extra,
        )
        figure(
            BENCHMARK,
            f"settle_time_{name}",
            ours.seconds * 1000,
            "ms",
            theirs.seconds * 1000,
            **extra,
        )
    figure(
        BENCHMARK,
        "failed_claims",
        coordinator.failed_claims,
        "claims",
        seed02.failed_claims,
        **extra,
    )
    figure(
        BENCHMARK,
        "two_owner_instants_pause",
        coordinator.two_owner_instants_pause,
        "pairs",
        seed02.two_owner_instants_pause,
        paused_for_s=PAUSED_SESSION * PAUSE_FACTOR,
        paused_session_timeout_s=PAUSED_SESSION,
        **extra,
    )
    figure(
        BENCHMARK,
        "two_owner_instants",
        coordinator.two_owner_instants,
        "pairs",
        seed02.two_owner_instants,
        **extra,
    )


async def bench(sizes: list[int], work_dir: Path) -> None:
    shutil.rmtree(work_dir / "zookeeper", ignore_errors=True)  # a fresh server, fresh chroots
    with open_ensemble(1, base_dir=work_dir / "zookeeper") as ensemble:
        for size in sizes:
            with reporting_errors(BENCHMARK, "all", consumers=size):
                seed02_hosts = f"{ensemble.hosts}/seed02-{next(_chroots)}"
                seed02 = await run_seed02(seed02_hosts, size, work_dir)
                coordinator = await run_coordinator(
                    f"{ensemble.hosts}/coordinator-{next(_chroots)}", size
                )
                report(size, coordinator, seed02)


def main() -> None:
    args = bench_arguments(__doc__.splitlines()[0]).parse_args()
    sizes = [10] if args.quick else [10, 50, 100]
    with work_area(args.work_dir) as work_dir:
        run(lambda: bench(sizes, work_dir))


if __name__ == "__main__":
    main()
