"""Coordinator failover time with real processes: three brokers (``coordinator serve
--zookeeper``) on a three-node ZooKeeper ensemble, a group of consumers (the ``consumer``
library's ``open_consumer``, in this process), and ``kill -9`` of the broker that coordinates.

Measured from the kill until a successor is named by every surviving broker (``elected``), and
until every consumer fetches again under a newer generation, every partition has an owner and the
successor calls the group Stable (``stable``), both polled every 50 ms. Each run has fresh
brokers under a chroot of its own on the same ensemble; the figures are the p50 and max over the
runs, next to the bound the design gives: the dead broker's ZooKeeper session must expire before
anyone may take office, and then its consumers' partitions may move once their ownership lease
(the consumer session timeout) has run out, so ZooKeeper session timeout + consumer session
timeout. On top of that bound come the ensemble's session-expiry tick (up to 0.5 s here) and the
coordinator's lease margin (``CoordinatorConfig.lease_margin``), which ``elected_to_stable``
(bound: consumer session timeout + lease margin) shows apart.

    python -m bench.failover [--quick] [--work-dir DIR]
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import statistics
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from bench.harness import (
    ServerProcess,
    bench_arguments,
    figure,
    open_coordinator,
    reporting_errors,
    run,
)
from consumer import Consumer, ConsumerSettings, open_consumer
from consumer.admin import open_admin
from coordinator.config import CoordinatorConfig
from launch.cluster import agreed_coordinator, eventually, group_state
from launch.zookeeper import open_ensemble
from protocol.types import TopicPartition

BENCHMARK = "failover"
DEADLINE = 90.0
#: The brokers' ZooKeeper session timeout and the consumers' session timeout, in seconds.
ZK_SESSION = 2.0
CONSUMER_SESSION = 2.0
BROKERS = 3
CONSUMERS = 6
PARTITIONS = 12
GROUP = "billing"
TOPIC = "orders"
EVERYTHING = {TopicPartition(topic=TOPIC, partition=p) for p in range(PARTITIONS)}

Broker = tuple[int, ServerProcess]


def address(broker: Broker) -> tuple[str, int]:
    return (broker[1].host, broker[1].port)


def ids(brokers: list[Broker]) -> list[tuple[int, tuple[str, int]]]:
    return [(broker_id, address((broker_id, server))) for broker_id, server in brokers]


@contextlib.asynccontextmanager
async def open_brokers(hosts: str, work_dir: Path) -> AsyncIterator[list[Broker]]:
    async with contextlib.AsyncExitStack() as stack:
        brokers = []
        for broker_id in range(1, BROKERS + 1):
            server = await stack.enter_async_context(
                open_coordinator(
                    work_dir / f"broker{broker_id}",
                    f"--broker-id={broker_id}",
                    f"--zookeeper={hosts}",
                    f"--zookeeper-session-timeout={ZK_SESSION}",
                    "--initial-rebalance-delay=0.2",
                    "--commit-interval=0.2",
                )
            )
            brokers.append((broker_id, server))
        yield brokers


@contextlib.asynccontextmanager
async def open_group(brokers: list[Broker]) -> AsyncIterator[list[Consumer]]:
    # Consumers look for the new coordinator at least every second, so the time is the cluster's.
    settings = ConsumerSettings(
        session_timeout=CONSUMER_SESSION, client_id="bench", max_retry_backoff=1.0
    )
    bootstrap = [address(b) for b in brokers]
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                open_consumer(bootstrap, GROUP, topics={TOPIC: 1}, settings=settings)
            )
            for _ in range(CONSUMERS)
        ]


async def whole_and_stable(
    consumers: list[Consumer], coordinator: Broker, *, after_generation: int
) -> bool:
    owned = [c.assignment.value for c in consumers]
    return (
        set().union(*owned) == EVERYTHING
        and all(owned)
        and all(c.generation > after_generation for c in consumers)
        and await group_state(address(coordinator), GROUP) == "Stable"
    )


async def one_failover(hosts: str, work_dir: Path) -> tuple[float, float]:
    """Seconds from kill -9 of the coordinator's broker to the successor's election, and to the
    group Stable again."""
    async with open_brokers(hosts, work_dir) as brokers:
        first_id = await agreed_coordinator(ids(brokers), deadline=DEADLINE)
        first = next(b for b in brokers if b[0] == first_id)
        survivors = [b for b in brokers if b is not first]
        # The partitions live on a survivor, so the group still fetches after the kill.
        async with open_admin([address(survivors[0])]) as admin:
            await admin.create_topic(TOPIC, PARTITIONS)
        async with open_group(brokers) as consumers:
            await eventually(
                lambda: whole_and_stable(consumers, first, after_generation=0), deadline=DEADLINE
            )
            generation = max(c.generation for c in consumers)
            killed_at = trio.current_time()
            first[1].process.send_signal(signal.SIGKILL)
            second_id = await agreed_coordinator(ids(survivors), deadline=DEADLINE)
            elected = trio.current_time() - killed_at
            second = next(b for b in survivors if b[0] == second_id)
            await eventually(
                lambda: whole_and_stable(consumers, second, after_generation=generation),
                deadline=DEADLINE,
            )
            return elected, trio.current_time() - killed_at


async def bench(runs: int, work_dir: Path) -> None:
    bound_ms = (ZK_SESSION + CONSUMER_SESSION) * 1000
    elected: list[float] = []
    stable: list[float] = []
    shutil.rmtree(work_dir / "ensemble", ignore_errors=True)  # a fresh ensemble, fresh chroots
    with open_ensemble(3, base_dir=work_dir / "ensemble") as ensemble:
        for run_ in range(runs):
            with reporting_errors(BENCHMARK, "kill_9_to_stable", run=run_):
                e, s = await one_failover(f"{ensemble.hosts}/failover-{run_}", work_dir / f"{run_}")
                elected.append(e * 1000)
                stable.append(s * 1000)
    if not stable:
        return
    extra = {
        "runs": len(stable),
        "brokers": BROKERS,
        "zookeeper_servers": 3,
        "consumers": CONSUMERS,
        "partitions": PARTITIONS,
        "zookeeper_session_timeout_ms": ZK_SESSION * 1000,
        "consumer_session_timeout_ms": CONSUMER_SESSION * 1000,
    }
    # After its election the successor starts no partition before the previous owners' leases
    # have run out: the consumer session timeout plus the lease margin after it took office.
    after_election_ms = (CONSUMER_SESSION + CoordinatorConfig().lease_margin) * 1000
    after_election = [s - e for e, s in zip(elected, stable, strict=True)]
    phases = (
        ("kill_9_to_elected", elected, ZK_SESSION * 1000),
        ("kill_9_to_stable", stable, bound_ms),
        ("elected_to_stable", after_election, after_election_ms),
    )
    for name, samples, bound in phases:
        rounded = [round(sample, 1) for sample in samples]
        for stat, value in (("p50", statistics.median(samples)), ("max", max(samples))):
            figure(BENCHMARK, f"{name}_{stat}", value, "ms", bound, samples_ms=rounded, **extra)


def main() -> None:
    args = bench_arguments(__doc__.splitlines()[0]).parse_args()
    runs = 1 if args.quick else 5
    with contextlib.ExitStack() as stack:
        work_dir = args.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        run(lambda: bench(runs, work_dir))


if __name__ == "__main__":
    main()
