"""Shedding load at the door (docs/design.md#shedding-load, SPEC.md §11.7): while the broker's
own loop is behind, new clients, registrations and admin requests are refused with a retriable
code and a back-off hint, and the members already in keep their Pings and their partitions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from broker.door import Door
from consumer import Consumer, ConsumerSettings, open_consumer, open_producer, runtime
from consumer.admin import Admin
from coordinator.config import CoordinatorConfig
from coordinator.loop_lag import LoopLag, watch_loop
from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    ErrorCode,
    FetchRequest,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    Request,
    RequestMessage,
)
from protocol.types import Subscription, TopicPartition, TopicStreams
from statemachine import consumer as sm
from tests.consumer.inmemory import InMemoryCluster, open_in_memory_cluster
from transport.connect import open_channel

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0)
ALL_12 = frozenset(TopicPartition(topic="t", partition=p) for p in range(12))


@attrs.define
class StubLag:
    """A lag figure the test sets: the door's decision alone, without a loop to slow down."""

    value: float = 0.0

    def recent(self) -> float:
        return self.value


def _request(message: RequestMessage, version: int) -> Request:
    return Request(correlation_id=1, api_version=version, client_id="c", message=message)


def _registration(owned: tuple[TopicPartition, ...] = ()) -> RegisterConsumerRequest:
    return RegisterConsumerRequest(
        group_id="g",
        consumer_id="c",
        subscription=Subscription(topics=(TopicStreams(topic="t", streams=1),)),
        auto_commit=True,
        auto_offset_reset="smallest",
        session_timeout_ms=6000,
        generation=3 if owned else -1,
        owned_partitions=owned,
    )


def test_the_door_sheds_new_work_above_its_bound_and_never_a_member_with_partitions() -> None:
    lag = StubLag(0.25)
    door = Door(lag=lag, bound=0.25)
    metadata = ClusterMetadataRequest(group_id="g", topics=None)
    # At the bound: served.
    assert door.refusal(_request(metadata, 4), first=True) is None
    lag.value = 1.5
    # Level 11: BROKER_BUSY and a hint of twice the lag.
    answer = door.refusal(_request(metadata, 4), first=True)
    assert isinstance(answer, ClusterMetadataResponse)
    assert (answer.error_code, answer.throttle_time_ms) == (ErrorCode.BROKER_BUSY, 3000)
    registered = door.refusal(_request(_registration(), 3), first=True)
    assert isinstance(registered, RegisterConsumerResponse)
    assert (registered.error_code, registered.throttle_time_ms) == (ErrorCode.BROKER_BUSY, 3000)
    # Older versions carry no hint: the code every level retries with backoff.
    for version in (0, 1, 2, 3):
        old = door.refusal(_request(metadata, version), first=True)
        assert isinstance(old, ClusterMetadataResponse)
        assert (old.error_code, old.throttle_time_ms) == (ErrorCode.COORDINATOR_NOT_AVAILABLE, 0)
    for version in (0, 1, 2):
        old_registration = door.refusal(_request(_registration(), version), first=True)
        assert isinstance(old_registration, RegisterConsumerResponse)
        assert old_registration.error_code is ErrorCode.COORDINATOR_NOT_AVAILABLE
    # A member re-registering with partitions at stake is never shed, nor is a later request
    # of a connection already in, nor a fetcher's first request.
    owned = (TopicPartition(topic="t", partition=0),)
    assert door.refusal(_request(_registration(owned), 3), first=True) is None
    assert door.refusal(_request(metadata, 4), first=False) is None
    # Nor the discovery of a consumer fetching under its lease.
    leased = ClusterMetadataRequest(group_id="g", topics=None, leased=True)
    assert door.refusal(_request(leased, 4), first=True) is None
    fetch = FetchRequest(topic="t", partition=0, offset=0, max_bytes=1024)
    assert door.refusal(_request(fetch, 2), first=True) is None
    # An admin request is shed wherever it comes; its answer has no hint in any version.
    create = CreateTopicRequest(topic="u", partitions=1)
    shed = door.refusal(_request(create, 1), first=False)
    assert shed == CreateTopicResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
    # The hint is bounded both ways.
    lag.value = 0.3
    low = door.refusal(_request(metadata, 4), first=True)
    lag.value = 60.0
    high = door.refusal(_request(metadata, 4), first=True)
    assert isinstance(low, ClusterMetadataResponse) and isinstance(high, ClusterMetadataResponse)
    assert (low.throttle_time_ms, high.throttle_time_ms) == (1000, 10_000)
    assert door.shed == 12


def test_a_consumer_told_busy_waits_the_hint_lengthened_by_its_jitter() -> None:
    config = sm.ConsumerConfig(session_timeout=6.0, busy_jitter=0.5)
    machine = sm.ConsumerMachine(config=config)
    machine.handle(sm.Start())
    effects = machine.handle(
        sm.DiscoveryFailed(now=1.0, error_code=ErrorCode.BROKER_BUSY, retry_after=2.0)
    )
    # Uniform over [2.0, 3.0]: never sooner than the hint.
    assert effects == [sm.Discover(delay=2.5, jitter=0.5)]
    assert machine.last_error is ErrorCode.BROKER_BUSY
    # Past the hint, the doubling backoff wins: 0.1 · 2^5 = 3.2 s after six failures in a row.
    for _ in range(4):
        machine.handle(sm.DiscoveryFailed(now=2.0, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE))
    effects = machine.handle(
        sm.DiscoveryFailed(now=3.0, error_code=ErrorCode.BROKER_BUSY, retry_after=2.0)
    )
    assert effects == [sm.Discover(delay=4.0, jitter=0.8)]


async def _busy(clock: trio.testing.MockClock, hold: float, every: float) -> None:
    """A task that holds the broker's loop: ``hold`` seconds of the loop's time pass with
    nothing else running, every ``every`` seconds."""
    while True:
        await trio.sleep(every)
        clock.jump(hold)


@asynccontextmanager
async def _consumers(
    net: InMemoryCluster, count: int, settings: ConsumerSettings
) -> AsyncIterator[list[Consumer]]:
    async with AsyncExitStack() as stack:
        consumers = [
            await stack.enter_async_context(
                open_consumer(
                    "broker:9092", "g", topics={"t": 1}, settings=settings, connect=net.connect
                )
            )
            for _ in range(count)
        ]
        yield consumers


async def test_a_lagging_broker_keeps_its_members_and_makes_newcomers_wait_their_turn(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ConsumerSettings(
        session_timeout=6.0, busy_jitter=0.0, failover_jitter=0.0, max_retry_backoff=1.0
    )
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 12}) as net:
        net.cluster.door = Door(
            lag=LoopLag.of_run(), bound=0.25, retry_after=2.0, max_retry_after=2.0
        )
        await net.nursery.start(watch_loop)
        stall = trio.CancelScope()

        async def stalls() -> None:
            # The loop is held 0.5 s in every 1.5 s: a lag of 0.5 s, twice the door's bound,
            # an eighth of a member's Ping deadline (2T/3 = 4 s).
            with stall:
                await _busy(autojump_clock, 0.5, 1.0)

        async with _consumers(net, 3, settings) as members:
            for member in members:
                await member.assignment.wait_value(lambda owned: len(owned) == 4)
            assert trio.current_time() == 1.0
            held = [member.assignment.value for member in members]
            generation = members[0].generation
            registrations = sum(line.carries_registration for line in net.lines)
            net.nursery.start_soon(stalls)
            await trio.sleep(2.0)
            assert LoopLag.of_run().recent() == pytest.approx(0.5)
            looks: dict[str, list[tuple[float, float]]] = {}

            def seen(consumer: Consumer, effects: list[sm.Effect]) -> None:
                for effect in effects:
                    if isinstance(effect, sm.Discover):
                        looks.setdefault(consumer.member_id, []).append(
                            (trio.current_time(), effect.delay)
                        )

            async with _consumers(net, 6, settings) as newcomers:
                for newcomer in newcomers:
                    newcomer.observer = seen
                await trio.sleep(30.0)
                # Nobody new got in, and every newcomer was told why and keeps asking.
                assert all(n.state is sm.ConsumerState.DISCOVERING for n in newcomers)
                assert all(n.last_error is ErrorCode.BROKER_BUSY for n in newcomers)
                assert sum(line.carries_registration for line in net.lines) == registrations
                # Each waited exactly the hint before it looked again (no jitter here), though
                # its backoff alone would have let it look every second.
                # Its looks: at once, then the hint plus the time its answer took on the held
                # loop (0.5 s every other time).
                times = [3.0, 5.5, 7.5, 10.0, 12.0, 14.5, 16.5, 19.0, 21.0, 23.5, 25.5, 28.0]
                expected = [(3.0, 0.0)] + [(t, 2.0) for t in [*times, 30.0, 32.5]]
                assert len(looks) == 6
                for when in looks.values():
                    assert [(round(t, 6), delay) for t, delay in when] == expected
                # The members already in were never in doubt.
                assert [m.assignment.value for m in members] == held
                assert all(m.generation == generation for m in members)
                assert all(m.state is sm.ConsumerState.FETCHING for m in members)
                # A member whose coordinator connection breaks while the loop lags finds its
                # coordinator and registers again, fetching on: neither is shed.
                first = next(line for line in net.lines if line.carries_registration)
                first.abort()
                await trio.sleep(4.0)
                assert [m.assignment.value for m in members] == held
                assert all(m.state is sm.ConsumerState.FETCHING for m in members)
                assert sum(line.carries_registration for line in net.lines) == registrations + 1
                assert all(m.last_error is None for m in members)
                stall.cancel()
                quiet = trio.current_time()
                # The loop keeps up again: within the hint and a rebalance, everyone is in.
                for consumer in (*members, *newcomers):
                    await consumer.assignment.wait_value(lambda owned: 1 <= len(owned) <= 2)
                # The newcomers' next looks (the hint after their last refusal) find the
                # coordinator, and the group takes them at once.
                assert (quiet, trio.current_time()) == pytest.approx((37.0, 39.0))
                everyone = (*members, *newcomers)
                assert frozenset().union(*(c.assignment.value for c in everyone)) == ALL_12
                assert sum(len(c.assignment.value) for c in everyone) == 12


@pytest.mark.parametrize(
    ("metadata_version", "version", "code"),
    [(3, 2, ErrorCode.COORDINATOR_NOT_AVAILABLE), (4, 3, ErrorCode.BROKER_BUSY)],
)
async def test_a_lagging_broker_tells_each_level_a_code_it_retries(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    metadata_version: int,
    version: int,
    code: ErrorCode,
) -> None:
    """Level 10 (ClusterMetadata 3, RegisterConsumer 2) and level 11 (4 and 3)."""
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 12}) as net:
        net.cluster.door = Door(lag=LoopLag.of_run(), bound=0.25)
        await net.nursery.start(watch_loop)
        async with trio.open_nursery() as load:
            load.start_soon(_busy, autojump_clock, 0.5, 1.0)  # hold 0.5 s every 1 s
            await trio.sleep(2.0)
            stream = await net.connect("broker", 9092)
            async with open_channel(stream, client_id="old") as channel:
                metadata = await channel.request(
                    ClusterMetadataRequest(group_id="g", topics=None),
                    api_version=metadata_version,
                )
            stream = await net.connect("broker", 9092)
            async with open_channel(stream, client_id="old") as channel:
                registration = await channel.request(_registration(), api_version=version)
            load.cancel_scope.cancel()
    assert isinstance(metadata, ClusterMetadataResponse)
    assert isinstance(registration, RegisterConsumerResponse)
    assert metadata.error_code is registration.error_code is code
    # The hint (twice the lag of 0.5 s) only where the version carries it.
    hint = 1000 if version >= 3 else 0
    assert metadata.throttle_time_ms == registration.throttle_time_ms == hint


async def test_a_producer_and_an_admin_wait_for_a_busy_broker_and_then_get_their_answer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The jitter at its longest, for exact instants.
    monkeypatch.setattr(runtime._JITTER, "uniform", lambda low, high: high)
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 3}) as net:
        lag = StubLag(1.5)  # a hint of 3 s
        net.cluster.door = Door(lag=lag, bound=0.25)

        async def keeps_up_again() -> None:
            await trio.sleep(1.0)
            lag.value = 0.0

        start = trio.current_time()
        net.nursery.start_soon(keeps_up_again)
        async with open_producer("broker:9092", connect=net.connect) as producer:
            # Told BROKER_BUSY with 3 s, it asks again 3 s and half of that later, not at once,
            # and is served then: the topic exists, busy is not "no such topic".
            assert await producer.partitions_for("t") == 3
        assert trio.current_time() - start == pytest.approx(4.5)
        lag.value = 1.5
        net.nursery.start_soon(keeps_up_again)
        start = trio.current_time()
        async with (
            open_channel(await net.connect("broker", 9092), client_id="admin") as channel,
            trio.open_nursery() as nursery,
        ):
            admin = Admin(
                channel=channel, address=("broker", 9092), nursery=nursery, connect=net.connect
            )
            # Shed with COORDINATOR_NOT_AVAILABLE (its answer has no hint), asked again with
            # backoff from 0.1 s, doubling, lengthened by half: after 0.15, 0.3 and 0.6 s, the
            # third time past the busy second.
            await admin.create_topic("u", 2)
            nursery.cancel_scope.cancel()  # the admin's connections to other brokers
        assert trio.current_time() - start == pytest.approx(1.05)
        assert len((await net.cluster.store.topics())["u"].brokers) == 2
