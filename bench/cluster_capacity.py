"""Benchmark XI, cluster capacity: consumers three broker processes on one ZooKeeper hold for
``--hold`` seconds with a 30 s session timeout and no false death, beyond what one process's file
limit allows, next to three bare trio echo servers holding as many connections in the same run.

The cluster: a standalone ZooKeeper server and three real brokers (``cli serve --zookeeper
--broker-id N``), each coordinating the groups of the coordinator slots it holds
(docs/design.md#coordinator-slots). The load: ``--consumers`` consumers in ``--groups`` groups of
equal size, in load-generator processes of at most 5,000 each (a process may hold 20,000 open
files). Each consumer finds its group's coordinator as the consumer library does, by asking a
broker (each consumer starts at another) for ClusterMetadata naming its group over a connection
of its own, and registers there; a topic of one partition per member of a group gives every
member one partition.

The join is timed the same way on both sides: every worker process is started and has loaded
its modules before the clock starts; then the workers start their clients one worker after
another, each once the previous one's have joined (at most 200 joining at a time), the bare
workers taking the three servers in turn; and each worker says when its last client joined, so
the figure runs from the first client started to the last joined with no poll interval in it.
The bare clients join as a consumer does on the wire with no protocol: a connection of their own
for one round trip of ClusterMetadata's sizes, closed, then their connection with one round trip
of RegisterConsumer's sizes. One worker at a time, not all at once: with nine workers of 200
joins in flight beside three brokers on two cores, a trial of 45,000 counted 4,196 false deaths
while they joined (docs/benchmarks.md, Results XIV), and the hold is measured here, not how the
brokers weather a stampede. Until issue 36 the consumers' workers
were started one after the other, each once the previous one's consumers were seen registered
at a stats poll every 2 s, while the bare clients joined all at once over one connection and
one round trip each: the consumers' figure counted nine process starts and nine poll waits, and
the baseline half the connections and round trips, and used both cores where the consumers had
one. The CPU seconds of every process over each join are reported beside the times (on a shared
machine they vary less than the wall time).

Per run: consumers held (the fewest live at any poll of the hold, if nothing died), false deaths
(connections the coordinator closed, failed registrations, consumers not live at some poll) and
members told to stop or start during the hold (none should be: nothing changes); per broker: the
members and groups it coordinates, the slots it holds, its open files (peak, against its limit),
CPU seconds over the hold and the share of one core, and peak RSS. The baseline is three bare
echo servers (``bench.loadgen bare-serve``), each with a third of the connections doing one
round trip of the Ping's sizes per Ping interval (T/3): what trio itself costs to hold them.
Joining: the seconds to start and register every consumer, and every process's CPU seconds over
it, against the bare clients' and servers' (above).

    python -m bench.cluster_capacity [--quick] [--consumers N] [--groups G] [--hold S] [--cores C]
"""

from __future__ import annotations

import contextlib
import math
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from bench import harness
from bench.loadgen import frame_sizes
from bench.measure import figure, micros_per, now, reporting_errors
from bench.throttle import cpu_quota, throttled_periods
from consumer.admin import ClusterReport, open_admin
from launch.cluster import eventually
from launch.zookeeper import free_ports, open_ensemble

BENCH = "cluster_capacity"
BROKERS = 3
SESSION_TIMEOUT_MS = 30_000
POLL = 5.0
#: How often the workers are asked for their stats while the groups form: each answer walks all
#: of a worker's consumers, and nine workers asked five times a second are load of their own.
STATS_EVERY = 2.0
#: How long the joins may take (plus a second per 20 clients) before the run ends.
JOIN_DEADLINE = 120.0
TOPIC = "bench"
#: How long the brokers have to register and share the slots (counts differing by at most one)
#: before the run goes on and reports the shares as they are.
SHARE_DEADLINE = 60.0


@attrs.define(eq=False)
class Broker:
    broker_id: int
    server: harness.ServerProcess
    metrics_port: int
    peak_open_files: int = 0

    @property
    def address(self) -> tuple[str, int]:
        return (self.server.host, self.server.port)

    def sample(self) -> None:
        self.peak_open_files = max(self.peak_open_files, self.server.open_files())

    def metrics(self) -> dict[str, float]:
        """The broker's own count of what it holds, of the rebalances it completed (whatever
        started them) and of its group records written to the store, from its Prometheus
        endpoint."""
        wanted = {
            "coordinator_members": "coordinator_members",
            "broker_connections": "broker_connections",
            "coordinator_rebalances_total": "rebalances",
            'coordinator_store_operation_seconds_count{operation="write_group"}': "group_writes",
        }
        found: dict[str, float] = {}
        for name, value in harness.metrics_samples(self.metrics_port):
            rebalances = name.startswith("coordinator_rebalances_total{")  # one per cause
            key = wanted.get("coordinator_rebalances_total" if rebalances else name)
            if key is not None:
                found[key] = found.get(key, 0.0) + value
        return found


@contextlib.asynccontextmanager
async def open_cluster(hosts: str, work: Path) -> AsyncIterator[list[Broker]]:
    ports = free_ports(BROKERS)
    async with contextlib.AsyncExitStack() as stack:
        brokers = []
        for broker_id, metrics_port in enumerate(ports, start=1):
            server = await stack.enter_async_context(
                harness.open_coordinator(
                    work / f"broker{broker_id}",
                    f"--broker-id={broker_id}",
                    f"--zookeeper={hosts}",
                    "--initial-rebalance-delay=3",
                    f"--metrics-port={metrics_port}",
                )
            )
            brokers.append(Broker(broker_id=broker_id, server=server, metrics_port=metrics_port))
        yield brokers


async def cluster_view(brokers: Sequence[Broker]) -> ClusterReport:
    async with open_admin([b.address for b in brokers]) as admin:
        return await admin.cluster()


async def shared_view(brokers: Sequence[Broker]) -> tuple[ClusterReport, bool]:
    """The cluster once every broker is up and every slot held with counts differing by at
    most one (True), or as it is at SHARE_DEADLINE (False)."""
    seen: list[ClusterReport] = []

    async def shared() -> bool:
        with contextlib.suppress(Exception):
            seen.append(await cluster_view(brokers))
        if not seen:
            return False
        report = seen[-1]
        up = {b.broker_id for b in report.brokers if b.address is not None}
        counts = [len(b.slots) for b in report.brokers if b.broker_id in up]
        held = sum(counts)
        return len(up) == BROKERS and held == report.slots and max(counts) - min(counts) <= 1

    try:
        await eventually(shared, deadline=SHARE_DEADLINE)
        return seen[-1], True
    except trio.TooSlowError:
        if not seen:
            raise
        return seen[-1], False


async def create_topic(brokers: Sequence[Broker], partitions: int) -> None:
    """One replica per partition: the figure is the coordinators', comparable with the runs
    before replication (bench/replication.py measures what replicas cost)."""
    async with open_admin([b.address for b in brokers]) as admin:
        await admin.create_topic(TOPIC, partitions, replication_factor=1)


def summed(all_stats: list[dict[str, Any]], key: str) -> Counter[str]:
    total: Counter[str] = Counter()
    for s in all_stats:
        total.update(s[key])
    return total


async def main() -> None:
    parser = harness.bench_arguments(__doc__ or BENCH)
    parser.sized("--consumers", quick=3_000, full=45_000, kind=int)
    parser.sized("--groups", quick=30, full=300, kind=int)
    parser.sized("--hold", quick=30.0, full=300.0, help="seconds")
    parser.sized("--bare-hold", quick=4.0, full=30.0, help="seconds")
    parser.add_argument(
        "--cores",
        type=float,
        default=None,
        help="hold with each broker limited to this much of a core (a cgroup CPU quota: root; "
        "issue 36); default: unlimited",
    )
    args = parser.parse()
    n, groups, hold, bare_hold = args.consumers, args.groups, args.hold, args.bare_hold
    group_size = math.ceil(n / groups)
    interval = SESSION_TIMEOUT_MS / 3000
    sizes = frame_sizes("m12345", TOPIC, 1)
    with (
        harness.work_area(args.work_dir, BENCH) as work,
        reporting_errors(BENCH, "consumers_held", consumers=n, groups=groups),
    ):
        shutil.rmtree(work / "zookeeper", ignore_errors=True)
        with open_ensemble(1, base_dir=work / "zookeeper") as ensemble:
            async with open_cluster(f"{ensemble.hosts}/{BENCH}", work) as brokers:
                view, shared = await shared_view(brokers)
                await create_topic(brokers, group_size)
                async with harness.open_consumers(
                    brokers[0].server,
                    n,
                    work,
                    group_size=group_size,
                    session_timeout_ms=SESSION_TIMEOUT_MS,
                    bootstrap=[b.server for b in brokers],
                    idle=True,
                ) as workers:
                    # One worker after another, as the bare clients below: the same shape.
                    (zookeeper,) = ensemble.nodes
                    assert zookeeper.process is not None
                    pids = [*(b.server.process.pid for b in brokers), zookeeper.process.pid]
                    joining = await harness.join(
                        workers, together=False, within=JOIN_DEADLINE + n / 20, pids=pids
                    )
                    joined = await harness.stats(workers)
                    formed = await harness.groups_formed(workers, timeout=300, every=STATS_EVERY)
                    for broker in brokers:
                        broker.sample()
                    t0 = now()

                    def sample() -> None:
                        for broker in brokers:
                            broker.sample()

                    with contextlib.ExitStack() as quotas:
                        groups_limited = [
                            quotas.enter_context(
                                cpu_quota(
                                    [b.server.process.pid], args.cores, f"bench-b{b.broker_id}"
                                )
                            )
                            for b in brokers
                            if args.cores is not None
                        ]
                        holding = await harness.hold_consumers(
                            workers,
                            n,
                            hold,
                            every=POLL,
                            pids=pids,
                            each_poll=sample,
                        )
                        throttled = [throttled_periods(g) for g in groups_limited]
                    *broker_cpu, zookeeper_cpu = holding.cpu
                    cpu = {b.broker_id: c for b, c in zip(brokers, broker_cpu, strict=True)}
                    wall, st = holding.wall, holding.stats
                    moved = [await w.command(f"handoffs {t0}") for w in workers]
                    told = sum(len(m["consumers"]) for m in moved)
                    rss = {b.broker_id: b.server.rss_bytes("VmHWM") for b in brokers}
                    limits = {b.broker_id: b.server.file_limit() for b in brokers}
                    own = {b.broker_id: await trio.to_thread.run_sync(b.metrics) for b in brokers}
                    view_after = await cluster_view(brokers)

        async with harness.open_bare(
            work / "bare",
            n,
            interval=interval,
            ping=sizes.ping,
            servers=BROKERS,
            join_sizes=(*sizes.discover, *sizes.register),
            idle=True,
        ) as servers:
            bare = await harness.hold_bare(
                servers,
                n,
                hold=bare_hold,
                connect_timeout=JOIN_DEADLINE + n / 20,
                started_idle=True,
                together=False,
            )

        members = summed(st, "coordinators")
        groups_at: dict[str, set[str]] = {}
        for s in st:
            for broker_id, names in s["groups_at"].items():
                groups_at.setdefault(broker_id, set()).update(names)
        common = {
            "consumers": n,
            "groups": groups,
            "brokers": BROKERS,
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "hold_s": round(wall, 1),
            "all_groups_formed": formed,
            "cores_per_broker": args.cores,
            "periods_throttled": throttled,
        }
        harness.report_hold(
            BENCH,
            holding,
            bare,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            common=common,
            members_by_broker=dict(sorted(members.items())),
        )
        figure(BENCH, "told_to_stop_or_start_in_hold", told, "consumers", 0, **common)
        figure(
            BENCH,
            "rediscovered",
            sum(s["rediscovered"] for s in st),
            "consumers",
            None,
            **common,
        )
        figure(
            BENCH,
            "connect_and_register_time",
            joining.wall,
            "s",
            bare.connect,
            **common,
            registered=sum(s["registered"] for s in joined),
            bare_connected=sum(bare.held),
        )
        # The store writes the join cost: each rebalance writes its group's record twice
        # (docs/design.md#rebalance); none is expected in the hold.
        figure(
            BENCH,
            "rebalances",
            sum(o.get("rebalances", 0.0) for o in own.values()),
            "rebalances",
            None,
            **common,
            group_record_writes=sum(o.get("group_writes", 0.0) for o in own.values()),
        )
        # Where the join's time went: every process's CPU over it, against the bare join's
        # (clients and servers), on the same cores.
        bare_join = bare.joined
        assert bare_join is not None
        *brokers_cpu, zookeeper_join_cpu = joining.servers_cpu
        figure(
            BENCH,
            "join_cpu_seconds",
            joining.clients_cpu + sum(joining.servers_cpu),
            "s",
            bare_join.clients_cpu + sum(bare_join.servers_cpu),
            **common,
            consumers_cpu=round(joining.clients_cpu, 1),
            brokers_cpu=[round(c, 1) for c in brokers_cpu],
            zookeeper_cpu=round(zookeeper_join_cpu, 1),
            bare_clients_cpu=round(bare_join.clients_cpu, 1),
            bare_servers_cpu=[round(c, 1) for c in bare_join.servers_cpu],
        )
        slots_before = {b.broker_id: list(b.slots) for b in view.brokers}
        slots_after = {b.broker_id: list(b.slots) for b in view_after.brokers}
        for index, broker in enumerate(brokers):
            key = str(broker.broker_id)
            per = {**common, "broker": broker.broker_id}
            figure(
                BENCH,
                "broker_members",
                members.get(key, 0),
                "consumers",
                None,
                **per,
                groups_coordinated=len(groups_at.get(key, ())),
                slots=len(slots_after.get(broker.broker_id, [])),
                slots_shared_at_start=shared,
                slots_unchanged=slots_before.get(broker.broker_id)
                == slots_after.get(broker.broker_id),
                broker_reports_members=own[broker.broker_id].get("coordinator_members"),
            )
            figure(
                BENCH,
                "broker_open_files_peak",
                broker.peak_open_files,
                "files",
                None,
                **per,
                file_limit=limits[broker.broker_id],
                connections_at_end=own[broker.broker_id].get("broker_connections"),
            )
            figure(
                BENCH,
                "broker_cpu_seconds",
                cpu[broker.broker_id],
                "s",
                bare_cpu_for(bare, index, members.get(key, 0)) / bare.wall * wall,
                **per,
                bare_connections=bare.held[index],
            )
            figure(
                BENCH,
                "broker_cpu_share",
                cpu[broker.broker_id] / wall,
                "cores",
                bare_cpu_for(bare, index, members.get(key, 0)) / bare.wall,
                **per,
                hold_cpu_percent=round(100 * cpu[broker.broker_id] / wall, 1),
            )
            figure(
                BENCH,
                "broker_peak_rss",
                rss[broker.broker_id] / 2**20,
                "MiB",
                bare.peak_rss[index] / 2**20,
                **per,
                bare_connections=bare.held[index],
            )
        figure(
            BENCH,
            "cpu_per_round_trip",
            micros_per(sum(cpu.values()), holding.total("pings")),
            "us",
            micros_per(sum(bare.cpu), bare.round_trips),
            **common,
        )
        figure(BENCH, "zookeeper_cpu_share", zookeeper_cpu / wall, "cores", None, **common)


def bare_cpu_for(bare: harness.BareHold, index: int, connections: int) -> float:
    """Bare server ``index``'s CPU seconds over the hold per connection it held, times
    ``connections``: the bare cost of what a broker held, whatever its share."""
    return bare.cpu[index] / bare.held[index] * connections if bare.held[index] else math.nan


if __name__ == "__main__":
    harness.run(main)
