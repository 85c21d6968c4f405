"""Coordinator failover with real processes: three brokers (``coordinator serve --zookeeper``) on
a three-node ZooKeeper ensemble, a group of consumers (the ``consumer`` library, in this process),
and ``kill -9`` of the broker that coordinates. A successor must be elected once the dead broker's
ZooKeeper session expires, and the group must be whole and Stable again under it; no acknowledged
record is lost and no committed offset goes backwards, through the failover and the dead broker's
return. The group also outlives the loss of ZooKeeper servers, and a coordinator woken from a
pause writes nothing and is obeyed by nobody.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio
from kazoo.client import KazooClient  # type: ignore[import-untyped]

from consumer import Consumer, ConsumerSettings, Producer, open_consumer, open_producer
from consumer.admin import AdminError, open_admin
from launch.cluster import agreed_coordinator, eventually, group_state, slots_shared
from launch.processes import BrokerProcess, run_broker
from launch.zookeeper import Ensemble
from protocol.types import TopicPartition
from transport.channel import ChannelClosed
from transport.connect import Address

pytestmark = pytest.mark.realtime

DEADLINE = 90  # generous: CI has two busy cores, with three JVMs and three brokers on them
SESSION = 2.0  # the brokers' ZooKeeper session timeout and the consumers' session timeout
PARTITIONS = 6
#: The group of every test. Its coordinator slot (6 of 50) is among the lower half, which a
#: broker holding every slot keeps when another returns (statemachine/slots.py: the returning
#: one takes the free share, the higher slots): so after a paused coordinator wakes and takes
#: its share back, the group stays with its successor, whose writes the test compares.
GROUP = "payments"


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
            running = await stack.enter_async_context(start_broker(hosts, tmp_path, broker_id))
            brokers.append(Broker(broker_id=broker_id, running=running))
        yield brokers


def start_broker(
    hosts: str, tmp_path: Path, broker_id: int, *args: str
) -> contextlib.AbstractAsyncContextManager[BrokerProcess]:
    """Broker ``broker_id`` on its own data dir: called again, it restarts on the same one.
    ``args``: more options of ``serve`` (``--port=N`` to listen where it did before)."""
    return run_broker(
        tmp_path / f"broker{broker_id}",
        f"--broker-id={broker_id}",
        f"--zookeeper={hosts}",
        f"--zookeeper-session-timeout={SESSION}",
        "--initial-rebalance-delay=0.2",
        "--commit-interval=0.2",
        *args,
    )


def ids(brokers: list[Broker]) -> list[tuple[int, tuple[str, int]]]:
    return [(b.broker_id, b.address) for b in brokers]


EVERYTHING = {TopicPartition(topic="orders", partition=p) for p in range(PARTITIONS)}


@contextlib.asynccontextmanager
async def open_group(brokers: list[Broker], size: int) -> AsyncIterator[list[Consumer]]:
    # Their leases (T = 2 s) run out before a successor is elected, so they look for it with the
    # backoff, which grows to 5 s by default: at least every second here, so the time measured
    # is the cluster's.
    settings = ConsumerSettings(
        auto_offset_reset="earliest", session_timeout=SESSION, client_id="c", max_retry_backoff=1.0
    )
    bootstrap = [b.address for b in brokers]
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                open_consumer(bootstrap, GROUP, topics={"orders": 1}, settings=settings)
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
        and await group_state(coordinator.address, GROUP) == "Stable"
    )


Offset = tuple[int, int]
"""(partition, offset) of a record of ``orders`` (or of ``ledger``)."""


async def consume(consumer: Consumer, seen: set[Offset]) -> None:
    """The application: finish every record as soon as it arrives, so that it gets committed."""
    (stream,) = consumer.streams_for("orders")
    async for record in stream:
        seen.add((record.partition, record.offset))
        consumer.mark(record)


async def produce(producer: Producer, topic: str, acknowledged: set[Offset], count: int) -> None:
    """Send ``count`` records one at a time (``count`` < 0: until cancelled), keeping each one
    the broker acknowledged."""
    sent = 0
    while sent != count:
        acknowledged.add(await producer.send_and_wait(topic, b"record %d" % sent))
        sent += 1
        if count < 0:
            await trio.sleep(0.02)  # a steady trickle, not a flood, on two shared cores


async def committed_offsets(address: Address) -> dict[int, int] | None:
    """The committed offset of every partition of ``orders`` (-1: none), as the coordinator that
    the broker at ``address`` forwards to reports them; None while it cannot say."""
    found: list[dict[int, int]] = []
    try:
        with trio.fail_after(5):
            async with open_admin([address]) as admin:
                report = await admin.describe_group(GROUP)
        if report.state == "Stable":
            found.append({r.partition: r.committed for r in report.partitions})
    except* (OSError, AdminError, ChannelClosed, trio.TooSlowError):
        pass
    return found[0] if found else None


async def sample_committed(address: Address) -> dict[int, int]:
    samples: list[dict[int, int]] = []

    async def sampled() -> bool:
        if (sample := await committed_offsets(address)) is not None:
            samples.append(sample)
        return bool(samples)

    await eventually(sampled, deadline=DEADLINE)
    return samples[0]


def assert_not_backwards(earlier: dict[int, int], later: dict[int, int]) -> None:
    for partition, offset in earlier.items():
        assert later.get(partition, -1) >= offset, (partition, earlier, later)


async def consumed_all(seen: set[Offset], wanted: set[Offset]) -> bool:
    return seen >= wanted


async def _holds(condition: bool) -> bool:
    return condition


async def assert_readable(address: Address, topic: str, acknowledged: set[Offset]) -> None:
    """Every acknowledged offset lies within its partition's log, as its broker reports it."""
    wanted = {TopicPartition(topic=topic, partition=p) for p, _ in acknowledged}
    found: list[dict[TopicPartition, tuple[int, int]]] = []

    async def bounds_known() -> bool:
        # A broker just back may not be listed yet; its partitions are left out until it is.
        with contextlib.suppress(OSError, AdminError, ChannelClosed):
            async with open_admin([address]) as admin:
                found[:] = [await admin.log_bounds([topic])]
        return bool(found) and wanted <= found[0].keys()

    await eventually(bounds_known, deadline=DEADLINE)
    bounds = found[0]
    for partition, offset in acknowledged:
        start, end = bounds[TopicPartition(topic=topic, partition=partition)]
        assert start <= offset < end, (topic, partition, offset, start, end)


async def test_kill_9_of_the_coordinator_elects_another_and_the_group_recovers(
    zookeeper_ensemble: Ensemble, tmp_path: Path
) -> None:
    hosts = zookeeper_ensemble.hosts + "/failover"
    async with broker_processes(hosts, tmp_path, 3) as brokers:
        first_id = await agreed_coordinator(ids(brokers), group=GROUP, deadline=DEADLINE)
        first = next(b for b in brokers if b.broker_id == first_id)
        survivors = [b for b in brokers if b is not first]
        # The partitions live on a survivor, so the group still fetches after the kill.
        async with open_admin([survivors[0].address]) as admin:
            await admin.create_topic(
                "orders", PARTITIONS, [survivors[0].broker_id], replication_factor=1
            )
        # ... and ``ledger`` lives on the coordinator, to be read back after it returns.
        async with open_admin([first.address]) as admin:
            await admin.create_topic("ledger", 2, [first.broker_id], replication_factor=1)

        orders: set[Offset] = set()
        ledger: set[Offset] = set()
        seen: set[Offset] = set()
        bootstrap = [b.address for b in brokers]
        async with (
            open_producer(bootstrap) as producer,
            open_group(brokers, 3) as consumers,
            trio.open_nursery() as nursery,
        ):
            for consumer in consumers:
                nursery.start_soon(consume, consumer, seen)
            await produce(producer, "ledger", ledger, 20)
            producing = trio.CancelScope()

            async def keep_producing() -> None:
                with producing:
                    await produce(producer, "orders", orders, -1)

            nursery.start_soon(keep_producing)
            await eventually(
                lambda: whole_and_stable(consumers, first, after_generation=0), deadline=DEADLINE
            )
            generation = max(c.generation for c in consumers)
            # Committed means durable: what the store holds (describe_group also shows offsets
            # accepted but not yet written, which a kill -9 may rightly lose).
            before: list[dict[int, int]] = []

            async def every_partition_committed() -> bool:
                before[:] = [await trio.to_thread.run_sync(durable_committed, hosts)]
                return len(before[0]) == PARTITIONS and min(before[0].values()) > 0

            await eventually(every_partition_committed, deadline=DEADLINE)

            killed_at = trio.current_time()
            await first.running.kill()

            second_id = await agreed_coordinator(ids(survivors), group=GROUP, deadline=DEADLINE)
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
            after_failover = await sample_committed(second.address)
            assert_not_backwards(before[0], after_failover)

            # The dead broker returns on its data dir and takes its share of the slots back,
            # by handoffs: the group may move to it, and no committed offset goes back.
            async with start_broker(hosts, tmp_path, first.broker_id) as returned:
                everyone = [*ids(survivors), (first.broker_id, returned.address)]
                await eventually(
                    lambda: slots_shared(returned.address, [b for b, _ in everyone]),
                    deadline=DEADLINE,
                )
                now_id = await agreed_coordinator(everyone, group=GROUP, deadline=DEADLINE)
                print(f"after the return, broker {now_id} coordinates the group")
                after_restart = await sample_committed(second.address)
                assert_not_backwards(after_failover, after_restart)
                await assert_readable(returned.address, "ledger", ledger)

                producing.cancel()
                assert len(orders) > 0
                await eventually(functools.partial(consumed_all, seen, orders), deadline=DEADLINE)
                await assert_readable(second.address, "orders", orders)
                assert await whole_and_stable(consumers, second, after_generation=generation)
                print(
                    f"committed before the kill {before[0]}, after the failover {after_failover}, "
                    f"after the restart {after_restart}; {len(orders)} orders and {len(ledger)} "
                    "ledger records acknowledged, all readable"
                )
            nursery.cancel_scope.cancel()


async def test_the_group_keeps_working_when_zookeeper_servers_die(
    zookeeper_ensemble: Ensemble, tmp_path: Path
) -> None:
    """kill -9 of the ensemble's leader, then (that one back) of a follower: two of three keep
    the quorum each time, so the group stays Stable under a coordinator and keeps consuming."""
    hosts = zookeeper_ensemble.hosts + "/quorum"
    async with broker_processes(hosts, tmp_path, 2) as brokers:
        coordinator_id = await agreed_coordinator(ids(brokers), group=GROUP, deadline=DEADLINE)
        async with open_admin([brokers[0].address]) as admin:
            await admin.create_topic("orders", PARTITIONS, replication_factor=1)
        produced: set[Offset] = set()
        seen: set[Offset] = set()
        async with (
            open_producer([b.address for b in brokers]) as producer,
            open_group(brokers, 2) as consumers,
            trio.open_nursery() as nursery,
        ):
            for consumer in consumers:
                nursery.start_soon(consume, consumer, seen)
            coordinator = next(b for b in brokers if b.broker_id == coordinator_id)
            await eventually(
                lambda: whole_and_stable(consumers, coordinator, after_generation=0),
                deadline=DEADLINE,
            )
            for role in ("leader", "follower"):
                leader = await trio.to_thread.run_sync(zookeeper_ensemble.leader)
                assert leader is not None
                victim = (
                    leader
                    if role == "leader"
                    else next(n for n in zookeeper_ensemble.nodes if n is not leader)
                )
                killed_at = trio.current_time()
                await trio.to_thread.run_sync(victim.kill)

                coordinator_id = await agreed_coordinator(
                    ids(brokers), group=GROUP, deadline=DEADLINE
                )
                coordinator = next(b for b in brokers if b.broker_id == coordinator_id)
                stable = functools.partial(whole_and_stable, consumers, coordinator)
                await eventually(functools.partial(stable, after_generation=0), deadline=DEADLINE)
                after_kill: set[Offset] = set()
                with trio.fail_after(DEADLINE):
                    await produce(producer, "orders", after_kill, 30)
                await eventually(
                    functools.partial(consumed_all, seen, after_kill), deadline=DEADLINE
                )
                produced |= after_kill
                print(
                    f"ZooKeeper {role} killed -> coordinator {coordinator_id}, group Stable and "
                    f"consuming again {trio.current_time() - killed_at:.3f}s"
                )
                await trio.to_thread.run_sync(victim.start)
                await trio.to_thread.run_sync(zookeeper_ensemble.wait_serving)
            assert seen >= produced and len(produced) == 60
            nursery.cancel_scope.cancel()


def durable_committed(hosts: str) -> dict[int, int]:
    """The committed offset of each partition of ``orders`` that the store holds (blocking)."""
    prefix = f"/consumers/{GROUP}/offsets/orders/"
    return {
        int(path.removeprefix(prefix)): int(json.loads(data)["offset"])
        for path, data in read_group_znodes(hosts).items()
        if path.startswith(prefix)
    }


def read_group_znodes(hosts: str) -> dict[str, bytes]:
    """Every znode under the group's root (the store's layout) and its data, with a plain kazoo
    client of the test's own; blocking, so run it in a thread."""
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    try:
        found: dict[str, bytes] = {}
        pending = [f"/consumers/{GROUP}"]
        while pending:
            path = pending.pop()
            data, _stat = client.get(path)
            found[path] = data
            pending += [f"{path}/{child}" for child in client.get_children(path)]
        return found
    finally:
        client.stop()
        client.close()


async def settled_group_znodes(hosts: str) -> dict[str, bytes]:
    """The group's znodes once two reads a second apart agree: the coordinator has written
    what it will write for a Stable group that is not consuming anything."""
    reads: list[dict[str, bytes]] = []

    async def unchanged() -> bool:
        reads.append(await trio.to_thread.run_sync(read_group_znodes, hosts))
        if len(reads) > 1 and reads[-1] == reads[-2]:
            return True
        await trio.sleep(1.0)
        return False

    await eventually(unchanged, deadline=DEADLINE)
    return reads[-1]


async def test_a_coordinator_paused_past_its_session_steps_down_when_it_wakes(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    """SIGSTOP, a successor takes over, SIGCONT: the old coordinator must find itself deposed
    and leave the group, now Stable under its successor, alone."""
    async with broker_processes(zookeeper_hosts, tmp_path, 2) as brokers:
        first_id = await agreed_coordinator(ids(brokers), group=GROUP, deadline=DEADLINE)
        first = next(b for b in brokers if b.broker_id == first_id)
        second = next(b for b in brokers if b is not first)
        async with open_admin([second.address]) as admin:
            await admin.create_topic("orders", PARTITIONS, [second.broker_id], replication_factor=1)

        async with open_group(brokers, 2) as consumers:
            await eventually(
                lambda: whole_and_stable(consumers, first, after_generation=0), deadline=DEADLINE
            )
            generation = max(c.generation for c in consumers)
            old_epoch = max(c.coordinator_epoch for c in consumers)
            first.running.process.send_signal(signal.SIGSTOP)
            try:
                elected = await agreed_coordinator(ids([second]), group=GROUP, deadline=DEADLINE)
                assert elected == second.broker_id
                await eventually(
                    lambda: whole_and_stable(consumers, second, after_generation=generation),
                    deadline=DEADLINE,
                )
                settled = {c.member_id: (c.generation, c.assignment.value) for c in consumers}
                written = await settled_group_znodes(zookeeper_hosts)
            finally:
                first.running.process.send_signal(signal.SIGCONT)
            new_epoch = max(c.coordinator_epoch for c in consumers)
            assert new_epoch > old_epoch

            # Awake, it learns it was deposed and names its successor like everyone else.
            def deposed() -> bool:
                log = first.running.log_text()
                return "lost slot" in log or "was deposed" in log

            await eventually(lambda: _holds(deposed()), deadline=DEADLINE)
            assert (
                await agreed_coordinator(ids(brokers), group=GROUP, deadline=DEADLINE)
                == second.broker_id
            )
            assert await whole_and_stable(consumers, second, after_generation=generation)
            assert {c.member_id: (c.generation, c.assignment.value) for c in consumers} == settled

            # It wrote nothing: the layout records no epoch with a write, so the group's znodes
            # must read as its successor left them, registry and offsets of the new generation.
            after = await trio.to_thread.run_sync(read_group_znodes, zookeeper_hosts)
            assert after == written
            registry = json.loads(after[f"/consumers/{GROUP}/registry"])
            assert registry["generation"] == max(c.generation for c in consumers) > generation
            for path, data in after.items():
                if "/offsets/" in path and data:
                    assert json.loads(data)["generation"] <= registry["generation"], path

            print(
                f"epochs {old_epoch} -> {new_epoch}; accepted (first, last) per epoch: "
                f"{[c._accepted_span for c in consumers]}; {len(after)} group znodes unchanged"
            )
            # And no consumer obeyed it once its successor had been heard.
            for consumer in consumers:
                spans = consumer._accepted_span
                assert consumer._accepted_by_epoch[new_epoch] > 0, spans
                assert set(spans) <= {old_epoch, new_epoch}, spans
                if old_epoch in spans:
                    assert spans[old_epoch][1] < spans[new_epoch][0], spans
