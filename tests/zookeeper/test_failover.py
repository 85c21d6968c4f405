"""Coordinator failover with real processes: three brokers (``coordinator serve --zookeeper``) on
a three-node ZooKeeper ensemble, a group of consumers (the ``consumer`` library, in this process),
and ``kill -9`` of the broker that coordinates. A successor must be elected once the dead broker's
ZooKeeper session expires, and the group must be whole and Stable again under it.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

from consumer import Consumer, ConsumerSettings, open_consumer
from coordinator.admin import open_admin
from protocol.types import TopicPartition
from tests.support.cluster import agreed_coordinator, eventually, group_state
from tests.support.processes import BrokerProcess, run_broker
from tests.support.zookeeper import Ensemble

pytestmark = pytest.mark.realtime

DEADLINE = 90  # generous: CI has two busy cores, with three JVMs and three brokers on them
SESSION = 2.0  # the brokers' ZooKeeper session timeout and the consumers' session timeout
PARTITIONS = 6


@attrs.frozen
class Broker:
    broker_id: int
    running: BrokerProcess

    @property
    def address(self) -> tuple[str, int]:
        return self.running.address


@contextlib.asynccontextmanager
async def broker_processes(hosts: str, tmp_path: Path, size: int) -> AsyncIterator[list[Broker]]:
    """``size`` brokers sharing ZooKeeper at ``hosts``, with ids 1..size."""
    async with contextlib.AsyncExitStack() as stack:
        brokers = []
        for broker_id in range(1, size + 1):
            running = await stack.enter_async_context(
                run_broker(
                    tmp_path / f"broker{broker_id}",
                    f"--broker-id={broker_id}",
                    f"--zookeeper={hosts}",
                    f"--zookeeper-session-timeout={SESSION}",
                    "--initial-rebalance-delay=0.2",
                    "--commit-interval=0.2",
                )
            )
            brokers.append(Broker(broker_id=broker_id, running=running))
        yield brokers


def ids(brokers: list[Broker]) -> list[tuple[int, tuple[str, int]]]:
    return [(b.broker_id, b.address) for b in brokers]


EVERYTHING = {TopicPartition(topic="orders", partition=p) for p in range(PARTITIONS)}


@contextlib.asynccontextmanager
async def open_group(brokers: list[Broker], size: int) -> AsyncIterator[list[Consumer]]:
    # Consumers look for the new coordinator at least every second (by default their backoff
    # grows to 5 s while the dead one is still named), so the time measured is the cluster's.
    settings = ConsumerSettings(session_timeout=SESSION, client_id="c", max_retry_backoff=1.0)
    bootstrap = [b.address for b in brokers]
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                open_consumer(bootstrap, "billing", topics={"orders": 1}, settings=settings)
            )
            for _ in range(size)
        ]


async def whole_and_stable(
    consumers: list[Consumer], coordinator: Broker, *, after_generation: int
) -> bool:
    """Every partition fetched by someone, every consumer fetching, all in a generation later
    than ``after_generation``, and ``coordinator`` calls the group Stable."""
    owned = [c.assignment.value for c in consumers]
    return (
        set().union(*owned) == EVERYTHING
        and all(owned)
        and all(c.generation > after_generation for c in consumers)
        and await group_state(coordinator.address, "billing") == "Stable"
    )


async def test_kill_9_of_the_coordinator_elects_another_and_the_group_recovers(
    zookeeper_ensemble: Ensemble, tmp_path: Path
) -> None:
    hosts = zookeeper_ensemble.hosts + "/failover"
    async with broker_processes(hosts, tmp_path, 3) as brokers:
        first_id = await agreed_coordinator(ids(brokers), deadline=DEADLINE)
        first = next(b for b in brokers if b.broker_id == first_id)
        survivors = [b for b in brokers if b is not first]
        # The partitions live on a survivor, so the group still fetches after the kill.
        async with open_admin([survivors[0].address]) as admin:
            await admin.create_topic("orders", PARTITIONS)

        async with open_group(brokers, 3) as consumers:
            await eventually(
                lambda: whole_and_stable(consumers, first, after_generation=0), deadline=DEADLINE
            )
            generation = max(c.generation for c in consumers)

            killed_at = trio.current_time()
            await first.running.kill()

            second_id = await agreed_coordinator(ids(survivors), deadline=DEADLINE)
            elected_at = trio.current_time()
            second = next(b for b in survivors if b.broker_id == second_id)
            await eventually(
                lambda: whole_and_stable(consumers, second, after_generation=generation),
                deadline=DEADLINE,
            )
            print(
                f"kill -9 of the coordinator -> successor elected {elected_at - killed_at:.3f}s, "
                f"group Stable again {trio.current_time() - killed_at:.3f}s "
                f"(ZooKeeper session {SESSION}s, consumer session {SESSION}s)"
            )


async def test_a_coordinator_paused_past_its_session_steps_down_when_it_wakes(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    """SIGSTOP, a successor takes over, SIGCONT: the old coordinator must find itself deposed
    and leave the group, now Stable under its successor, alone."""
    async with broker_processes(zookeeper_hosts, tmp_path, 2) as brokers:
        first_id = await agreed_coordinator(ids(brokers), deadline=DEADLINE)
        first = next(b for b in brokers if b.broker_id == first_id)
        second = next(b for b in brokers if b is not first)
        async with open_admin([second.address]) as admin:
            await admin.create_topic("orders", PARTITIONS)

        async with open_group(brokers, 2) as consumers:
            await eventually(
                lambda: whole_and_stable(consumers, first, after_generation=0), deadline=DEADLINE
            )
            generation = max(c.generation for c in consumers)
            first.running.process.send_signal(signal.SIGSTOP)
            try:
                elected = await agreed_coordinator(ids([second]), deadline=DEADLINE)
                assert elected == second.broker_id
                await eventually(
                    lambda: whole_and_stable(consumers, second, after_generation=generation),
                    deadline=DEADLINE,
                )
                settled = {c.member_id: (c.generation, c.assignment.value) for c in consumers}
            finally:
                first.running.process.send_signal(signal.SIGCONT)

            # Awake, it learns it was deposed and names its successor like everyone else.
            assert await agreed_coordinator(ids(brokers), deadline=DEADLINE) == second.broker_id
            assert await whole_and_stable(consumers, second, after_generation=generation)
            assert {c.member_id: (c.generation, c.assignment.value) for c in consumers} == settled
        log = first.running.log_text()
        assert "lost the coordinator office" in log or "was deposed" in log
