"""The consumer library against the real coordinator in memory, on the autojump clock: exact
instants for group formation, growth, graceful hand-over and the ownership lease."""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import attrs
import pytest
import trio
import trio.testing

from broker.dispatch import handle_connection
from broker.election import Elector
from consumer import (
    Consumer,
    ConsumerSettings,
    InstanceFenced,
    RebalanceCallback,
    RecordStream,
    open_consumer,
    open_producer,
)
from consumer.admin import Admin
from coordinator.config import CoordinatorConfig, RebalanceProtocol
from protocol import ErrorCode, OffsetCommitRequest, OffsetCommitResponse, TopicIdentity
from protocol.types import BrokerInfo, PartitionOffset, TopicPartition
from statemachine.consumer import ConsumerState
from statemachine.group import GroupState
from store import TopicPlacement
from store.zookeeper import ZooKeeperStore
from tests.consumer.inmemory import (
    InMemoryCluster,
    Line,
    ScriptedCoordinator,
    open_in_memory_cluster,
    open_scripted_coordinator,
)
from transport.connect import open_channel

#: Where these tests start: they read what was produced before they joined.
EARLIEST = ConsumerSettings(auto_offset_reset="earliest")

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0)
ALL_12 = frozenset(TopicPartition(topic="t", partition=p) for p in range(12))


async def drain(stream: RecordStream, seen: list[tuple[TopicPartition, int]]) -> None:
    async for record in stream:
        seen.append((record.topic_partition, record.offset))


async def test_a_group_splits_grows_and_hands_over_at_once_on_close(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ConsumerSettings(auto_offset_reset="earliest", session_timeout=6.0)
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 12}) as net:
        start = trio.current_time()
        async with (
            open_consumer(
                "broker:9092", "g", topics={"t": 1}, settings=settings, connect=net.connect
            ) as a,
            open_consumer(
                "broker:9092", "g", topics={"t": 1}, settings=settings, connect=net.connect
            ) as b,
        ):
            await a.assignment.wait_value(lambda owned: len(owned) == 6)
            await b.assignment.wait_value(lambda owned: len(owned) == 6)
            # one rebalance, when the new group's initial delay ran out
            assert trio.current_time() - start == 1.0
            assert a.assignment.value | b.assignment.value == ALL_12
            assert a.generation == b.generation == 1
            assert a.member_id != b.member_id and a.member_id.startswith("consumer-")

            joined = trio.current_time()
            async with open_consumer(
                "broker:9092", "g", topics={"t": 1}, settings=settings, connect=net.connect
            ) as c:
                for member in (a, b, c):
                    await member.assignment.wait_value(lambda owned: len(owned) == 4)
                assert trio.current_time() == joined  # a join rebalances a stable group at once
                assert a.assignment.value | b.assignment.value | c.assignment.value == ALL_12
                # a and b only gave partitions up (a revocation): their generation stays
                assert (a.generation, b.generation, c.generation) == (1, 1, 2)

                leaving = trio.current_time()
                await c.aclose()
                assert c.state is ConsumerState.CLOSED
                for member in (a, b):
                    await member.assignment.wait_value(lambda owned: len(owned) == 6)
                # LeaveGroup: no failure detection, no lease wait
                assert trio.current_time() == leaving
                assert a.assignment.value | b.assignment.value == ALL_12
                assert a.generation == b.generation == 3  # both gained: an incremental start
            # Close one at a time: a member leaving while the coordinator is in the middle of
            # the previous leaver's rebalance is another test's business.
            await b.aclose()
            await a.assignment.wait_value(lambda owned: owned == ALL_12)


async def test_two_streams_split_their_members_partitions(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"t": 4}) as net,
        open_consumer(
            "broker:9092", "g", settings=EARLIEST, topics={"t": 2}, connect=net.connect
        ) as consumer,
    ):
        first, second = consumer.streams_for("t")
        await consumer.assignment.wait_value(lambda owned: len(owned) == 4)
        assert len(first.partitions) == len(second.partitions) == 2
        assert first.partitions | second.partitions == consumer.assignment.value
        seen: list[list[tuple[TopicPartition, int]]] = [[], []]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, first, seen[0])
            nursery.start_soon(drain, second, seen[1])
            await trio.sleep(2.0)
            nursery.cancel_scope.cancel()
        assert {tp for tp, _ in seen[0]} == first.partitions
        assert {tp for tp, _ in seen[1]} == second.partitions
        # each partition in order, from the start, nothing twice
        for stream_seen in seen:
            for tp in {tp for tp, _ in stream_seen}:
                offsets = [o for p, o in stream_seen if p == tp]
                assert offsets == list(range(len(offsets))) and len(offsets) >= 10


async def test_finished_records_are_reported_in_pings_and_committed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ConsumerSettings(auto_offset_reset="earliest", session_timeout=3.0)
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"t": 1}) as net,
        open_consumer("b:1", "g", topics={"t": 1}, settings=settings, connect=net.connect) as c,
    ):
        (stream,) = c.streams
        await c.assignment.wait_value(lambda owned: len(owned) == 1)
        tp = TopicPartition(topic="t", partition=0)
        taken = 0
        async for record in stream:
            assert record.offset == taken
            taken += 1
            if taken == 7:
                break
        # record 6 is still held: only 0..5 are finished
        assert c.consumed_offsets() == {tp: 6}
        await trio.sleep(settings.session_timeout / 2)  # a Ping (every T/3) has come and gone
        assert (await net.cluster.coordinator.offsets.committed("g")) == {tp: 6}
        c.mark(record)
        await c.commit()
        assert (await net.cluster.coordinator.offsets.committed("g")) == {tp: 7}


async def test_a_silent_coordinator_stops_the_fetchers_at_the_last_request_plus_t(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    session_timeout = 3.0
    settings = ConsumerSettings(
        auto_offset_reset="earliest", session_timeout=session_timeout, fetch_idle_interval=0.1
    )
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"t": 4}) as net,
        open_consumer("b:1", "g", topics={"t": 1}, settings=settings, connect=net.connect) as c,
        trio.open_nursery() as app,
    ):
        await c.assignment.wait_value(lambda owned: len(owned) == 4)
        app.start_soon(drain, c.streams[0], [])
        await trio.sleep(2.5)
        net.silence_coordinator()
        heard = c.last_heard
        assert heard is not None and trio.current_time() - heard < session_timeout
        lease_end = heard + session_timeout

        await c.assignment.wait_value(lambda owned: not owned)
        assert trio.current_time() == lease_end
        fetched_at = [at for at, _, _ in net.log.fetches]
        # fetching went on under the lease, right up to its end, and never past it
        assert max(fetched_at) < lease_end
        assert lease_end - max(fetched_at) <= settings.fetch_idle_interval
        await trio.sleep(3 * session_timeout)
        assert max(at for at, _, _ in net.log.fetches) < lease_end
        assert c.state is ConsumerState.DISCOVERING  # looking for a coordinator, fetching nothing
        app.cancel_scope.cancel()


async def test_a_consumer_back_from_a_silence_rejoins_and_fetches_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ConsumerSettings(auto_offset_reset="earliest", session_timeout=3.0)
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"t": 4}) as net,
        open_consumer("b:1", "g", topics={"t": 1}, settings=settings, connect=net.connect) as c,
    ):
        await c.assignment.wait_value(lambda owned: len(owned) == 4)
        await net.cluster.wait_stable("g", members=1)
        net.silence_coordinator()
        await c.assignment.wait_value(lambda owned: not owned)
        lease_end = trio.current_time()
        net.refusing = False  # the network is back
        await c.assignment.wait_value(lambda owned: len(owned) == 4)
        assert c.generation > 1
        rejoined = trio.current_time()
        # the coordinator moved nothing before the lease (and its margin) had run out
        assert rejoined >= lease_end + CONFIG.lease_margin
        await trio.sleep(1.0)
        assert {tp for at, tp, _ in net.log.fetches if at >= rejoined} == c.assignment.value


async def test_offsets_reset_per_auto_offset_reset(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    tp0, tp1 = (TopicPartition(topic="t", partition=p) for p in (0, 1))
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 2}) as net:
        # t-0 has an offset far past its end (committed while the group was empty)
        async with net.cluster.open_client() as admin:
            response = await admin.request(
                OffsetCommitRequest(
                    group_id="g",
                    consumer_id=None,
                    generation=-1,
                    offsets=(PartitionOffset(topic="t", partition=0, offset=10_000),),
                )
            )
            assert isinstance(response, OffsetCommitResponse)
            assert response.error_code is ErrorCode.NONE
        settings = ConsumerSettings(auto_offset_reset="latest")
        async with open_consumer(
            "b:1", "g", topics={"t": 1}, settings=settings, connect=net.connect
        ) as c:
            first: dict[TopicPartition, int] = {}
            async for record in c.streams[0]:
                first.setdefault(record.topic_partition, record.offset)
                if len(first) == 2:
                    break
            # t-1 had nothing committed: "latest" starts at the end it found; t-0 was out of
            # range: "latest" moves it to the end at that moment
            (listed,) = net.log.listed
            assert first[tp1] == listed
            out_of_range = [(at, o) for at, tp, o in net.log.fetches if tp == tp0 and o == 10_000]
            assert len(out_of_range) == 1
            assert first[tp0] == net.log.rate * (out_of_range[0][0] - net.log.start) // 1


@pytest.mark.parametrize("protocol", list(RebalanceProtocol))
async def test_rebalance_callbacks_see_revoked_before_assigned(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    events: list[tuple[str, int]] = []

    async def revoked(partitions: frozenset[TopicPartition]) -> None:
        events.append(("revoked", len(partitions)))

    async def assigned(partitions: frozenset[TopicPartition]) -> None:
        events.append(("assigned", len(partitions)))

    config = attrs.evolve(CONFIG, rebalance_protocol=protocol)
    async with (
        open_in_memory_cluster(tmp_path, config, {"t": 4}) as net,
        open_consumer(
            "b:1",
            "g",
            settings=EARLIEST,
            topics={"t": 1},
            connect=net.connect,
            on_revoked=revoked,
            on_assigned=assigned,
        ) as a,
    ):
        await a.assignment.wait_value(lambda owned: len(owned) == 4)
        async with open_consumer(
            "b:1", "g", settings=EARLIEST, topics={"t": 1}, connect=net.connect
        ) as b:
            await b.assignment.wait_value(lambda owned: len(owned) == 2)
            await a.assignment.wait_value(lambda owned: len(owned) == 2)
        await a.assignment.wait_value(lambda owned: len(owned) == 4)
        if protocol is RebalanceProtocol.EAGER:  # every rebalance stops and starts everything
            assert events == [
                ("assigned", 4),
                ("revoked", 4),
                ("assigned", 2),
                ("revoked", 2),
                ("assigned", 4),
            ]
        else:  # only what moves: b takes two, then gives them back
            assert events == [("assigned", 4), ("revoked", 2), ("assigned", 2)]


async def test_a_wildcard_subscription_takes_every_matching_topic(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"clicks": 2, "views": 2, "other": 3}) as net,
        open_consumer(
            "b:1", "g", settings=EARLIEST, pattern="clicks|views", connect=net.connect
        ) as c,
    ):
        await c.assignment.wait_value(lambda owned: len(owned) == 4)
        assert {tp.topic for tp in c.assignment.value} == {"clicks", "views"}
        (stream,) = c.streams
        assert stream.topic is None and stream.partitions == c.assignment.value


async def test_discovery_goes_round_robin_and_backs_off_until_a_broker_answers(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 1}) as net:
        tried: list[tuple[float, str]] = []
        start = trio.current_time()

        async def connect(host: str, port: int) -> trio.abc.Stream:
            tried.append((trio.current_time() - start, host))
            if host == "dead":
                raise ConnectionRefusedError(f"{host}:{port}")
            return await net.connect(host, port)

        net.refusing = True
        async with open_consumer(
            "dead:1,alive:1", "g", settings=EARLIEST, topics={"t": 1}, connect=connect
        ) as c:
            await trio.sleep(1.0)
            net.refusing = False
            await c.assignment.wait_value(lambda owned: len(owned) == 1)
            assigned_at = trio.current_time() - start
        # each pass asks both brokers, starting one further each time; failed passes in a row
        # back off 0.1, 0.2, 0.4, 0.8 s (ConsumerSettings.retry_backoff doubling)
        passes = [0.0, 0.1, 0.3, 0.7, 1.5]
        assert [at for at, _ in tried[:9]] == pytest.approx([t for t in passes for _ in (0, 1)][:9])
        assert [host for _, host in tried[:4]] == ["dead", "alive", "alive", "dead"]
        # registered in the pass at 1.5 s, then the new group's initial delay
        assert assigned_at == pytest.approx(1.5 + CONFIG.initial_rebalance_delay)


async def test_a_consumer_silenced_while_starting_loses_its_lease_and_the_coordinator_survives(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ConsumerSettings(auto_offset_reset="earliest", session_timeout=3.0)
    net_box: list[InMemoryCluster] = []

    async def assigned(partitions: frozenset[TopicPartition]) -> None:
        net_box[0].silence_coordinator()  # before the StartFetcher response goes out

    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 4}) as net:
        net_box.append(net)
        async with open_consumer(
            "b:1",
            "g",
            topics={"t": 1},
            settings=settings,
            connect=net.connect,
            on_assigned=assigned,
        ) as c:
            await c.assignment.wait_value(lambda owned: len(owned) == 4)
            # The StartFetcher named the registration's frame (no StopFetcher came before it,
            # whose answer it would have named): the lease runs from when that was queued.
            heard = c.last_heard
            assert heard == 0.0
            await c.assignment.wait_value(lambda owned: not owned)
            assert trio.current_time() == heard + settings.session_timeout
            await trio.sleep(2 * settings.session_timeout)


async def test_after_losing_its_coordinator_a_consumer_believes_the_follower_naming_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A follower names the coordinator in ClusterMetadata with no epoch (only the coordinator
    knows its own). A consumer that had registered once and took that for stale metadata would
    back off, pass after pass, until a pass happened to start at the coordinator itself, and
    recover seconds late."""
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 2}) as net:
        # The real code of brokers that hold no slot, on the cluster's store (a mock
        # ZooKeeperStore: a broker that never stands needs none), having read who holds them.
        coordinator_id = net.cluster.coordinator.broker.broker_id
        holders = dict.fromkeys(range(CONFIG.coordinator_slots), coordinator_id)
        followers = {
            host: Elector(
                store=cast(ZooKeeperStore, net.cluster.store),
                config=CONFIG,
                broker=BrokerInfo(broker_id=broker_id, host=host, port=1),
                holders=holders,
                topics=await net.cluster.store.topics(),
            )
            for broker_id, host in ((2, "f2"), (3, "f3"), (4, "f4"))
        }
        asked: list[tuple[float, str]] = []
        coordinator_lines: list[tuple[float, Line]] = []

        async def connect(host: str, port: int) -> trio.abc.Stream:
            if host not in followers:
                line = await net.connect(host, port)
                coordinator_lines.append((trio.current_time(), cast(Line, line)))
                return line
            asked.append((trio.current_time(), host))
            client, server = trio.testing.memory_stream_pair()
            net.nursery.start_soon(handle_connection, followers[host], server)
            return client

        async with open_consumer(
            "f2:1,f3:1,f4:1", "g", settings=EARLIEST, topics={"t": 1}, connect=connect
        ) as c:
            await c.assignment.wait_value(lambda owned: len(owned) == 2)
            assert asked == [(0.0, "f2")]
            assert [at for at, line in coordinator_lines if line.carries_registration] == [0.0]
            assert c.coordinator_epoch >= 0
            (registration,) = (line for line in net.lines if line.carries_registration)
            await trio.sleep(0.5)  # into the stable generation
            lost = trio.current_time()
            held = c.assignment.value
            await registration.aclose()  # the coordinator connection is lost
            # It fetches on under its lease, re-registers offering its partitions, and the
            # re-formed group's incremental start gives it the same ones: no stop in between.
            group = net.cluster.coordinator.group("g")
            await group.status.wait_value(lambda status: status == (GroupState.STABLE, 2))
            assert (c.generation, c.state, c.assignment.value) == (2, ConsumerState.FETCHING, held)
            back = trio.current_time()
            for tp in held:  # and fetched at least every idle interval all along
                instants = [lost, *(at for at, p, _ in net.log.fetches if p == tp and at > lost)]
                assert max(b - a for a, b in itertools.pairwise([*instants, back])) <= 0.1 + 1e-9
        # The pass after the loss starts at the next broker, f3, which names the coordinator:
        # the consumer registers with it at once, no backoff.
        assert [(at - lost, host) for at, host in asked[1:]] == [(0.0, "f3")]
        registered = [at for at, line in coordinator_lines if line.carries_registration]
        assert [at - lost for at in registered[1:]] == [0.0]
        # It was the group's only member, so the group forms afresh, after the initial delay.
        assert back == lost + CONFIG.initial_rebalance_delay


async def restart_slowly_with_a_group(net: InMemoryCluster, settings: ConsumerSettings) -> float:
    """Group g gets a record (a consumer joins, is assigned, leaves), then the coordinator
    restarts and reads the groups' records for 1.99 s; returns when it took office."""
    async with open_consumer(
        "b:1", "g", topics={"t": 1}, settings=settings, connect=net.connect
    ) as first:
        await first.assignment.wait_value(lambda owned: len(owned) == 2)
    net.cluster.slow_group_reads(1.99)
    await net.cluster.restart_coordinator(loaded=False)
    return trio.current_time()


async def test_a_consumer_registering_while_the_coordinator_loads_is_in_right_after_the_load(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Reading the groups' records takes 1.99 s (a big group on ZooKeeper): meanwhile the new
    # coordinator answers COORDINATOR_LOAD_IN_PROGRESS, and the consumer asks again every 50 ms
    # (failover_retry), not after a growing backoff.
    caplog.set_level(logging.DEBUG, logger="consumer.client")
    settings = ConsumerSettings(auto_offset_reset="earliest", session_timeout=6.0)
    assert settings.failover_retry == 0.05
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 2}) as net:
        took_office = await restart_slowly_with_a_group(net, settings)
        async with open_consumer(
            "b:1", "g", topics={"t": 1}, settings=settings, connect=net.connect
        ):
            await net.cluster.incarnation.wait_value(lambda n: n == 2)
            assert trio.current_time() == took_office + 1.99  # the load is over
            group = net.cluster.coordinator.groups["g"]
            assert not group.members
            await group.status.wait_transition()  # the consumer joined
            # the first retry after the load; 40 refusals before, at took_office + 0.05 k
            assert trio.current_time() == pytest.approx(took_office + 2.0, abs=1e-9)
            assert len(group.members) == 1
            refusals = [
                r
                for r in caplog.records
                if "registration refused: COORDINATOR_LOAD_IN_PROGRESS" in r.getMessage()
            ]
            assert len(refusals) == 40
            # retried: said once at WARNING, the retries only at DEBUG
            assert [r.levelno for r in refusals] == [logging.WARNING] + [logging.DEBUG] * 39


async def test_an_admin_asks_again_while_the_coordinator_loads(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ConsumerSettings(auto_offset_reset="earliest", session_timeout=6.0)
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 2}) as net:
        took_office = await restart_slowly_with_a_group(net, settings)
        async with (
            open_channel(await net.connect("b", 1), client_id="admin") as channel,
            trio.open_nursery() as nursery,
        ):
            admin = Admin(channel=channel, address=("b", 1), nursery=nursery, connect=net.connect)
            groups = await admin.groups()
            nursery.cancel_scope.cancel()  # the admin's connections to other brokers
        # asked every LOAD_RETRY (50 ms): the first time after the load ended, at 1.99 s
        assert trio.current_time() == pytest.approx(took_office + 2.0, abs=1e-9)
        assert [g.group_id for g in groups] == ["g"]


async def test_consumers_fetch_through_a_coordinator_restart_and_are_adopted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A lost coordinator connection does not stop the fetchers: the consumers fetch on under
    their lease, find the coordinator again and re-register holding their partitions under their
    generation, which the restarted coordinator adopts as its completed record says: no new
    generation, no StopFetcher or StartFetcher (docs/design.md#adoption-after-a-failover)."""
    settings = ConsumerSettings(
        auto_offset_reset="earliest", session_timeout=6.0, failover_jitter=0.0
    )
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"t": 12}) as net,
        open_consumer("b:1", "g", topics={"t": 1}, settings=settings, connect=net.connect) as a,
        open_consumer("b:1", "g", topics={"t": 1}, settings=settings, connect=net.connect) as b,
        trio.open_nursery() as watchers,
    ):
        for consumer in (a, b):
            await consumer.assignment.wait_value(lambda owned: len(owned) == 6)
        await net.cluster.wait_stable("g", members=2)
        held = {a.member_id: a.assignment.value, b.member_id: b.assignment.value}
        assignments: list[frozenset[TopicPartition]] = []

        async def watch(consumer: Consumer) -> None:
            async for value in consumer.assignment.transitions():
                assignments.append(value)

        for consumer in (a, b):
            watchers.start_soon(watch, consumer)
        await trio.sleep_until(10.0)
        sessions = [line for line in net.lines if line.carries_registration]
        await net.restart_broker(down_for=1.0)
        assert trio.current_time() == 11.0
        assert {a.state, b.state} == {ConsumerState.REDISCOVERING}  # fetching on, looking
        # Each gave up its closed connection with a reset, not an end of stream.
        assert all(line.aborted for line in sessions)
        group = net.cluster.coordinator.groups["g"]
        await group.status.wait_value(lambda status: status[0] is GroupState.STABLE)
        # Fetching under their leases, they looked at once and then at the failover pace
        # (50 ms: two members are far below the group's looks per second), refused until the
        # broker was back at 11.0, not after a backoff doubling from 0.1 s (which found it at
        # 11.5): both re-registered with the look at 11.0, and were adopted at once.
        # (docs/design.md#finding-the-coordinator-again)
        assert trio.current_time() == pytest.approx(11.0, abs=1e-9)
        assert group.machine.generation == a.generation == b.generation == 1
        assert group.attempts == 0
        await trio.sleep(3.0)
        assert {a.state, b.state} == {ConsumerState.FETCHING}
        assert {a.member_id: a.assignment.value, b.member_id: b.assignment.value} == held
        assert not assignments  # never revoked, never assigned anew
        assert {tp for at, tp, _ in net.log.fetches if at > 11.5} == ALL_12
        watchers.cancel_scope.cancel()


async def test_a_producer_whose_metadata_broker_dies_mid_request_retries_elsewhere(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The first bootstrap broker the producer asks for metadata reads the request and dies
    before answering (a kill -9): the producer asks the next one at once, as it would after a
    refused connection."""
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 2}) as net:
        dying: list[trio.abc.Stream] = []

        async def connect(host: str, port: int) -> trio.abc.Stream:
            if dying:
                return await net.connect(host, port)
            client, server = trio.testing.memory_stream_pair()

            async def die() -> None:
                await server.receive_some()
                await server.aclose()

            net.nursery.start_soon(die)
            dying.append(client)
            return client

        # The simulated broker serves metadata but keeps no partition log: what is checked is
        # where the producer learns the topic's placement, the step a dying broker broke.
        async with open_producer([("b", 1), ("b", 2)], connect=connect) as producer:
            asked_at = trio.current_time()
            await producer.refresh_metadata("t")
            assert len(dying) == 1
            assert len(producer.placement["t"]) == 2
            assert trio.current_time() == asked_at


# --- incremental rebalancing and static membership, against a coordinator played by hand --------

T0, T1, T2, T3, T4 = (TopicPartition(topic="t", partition=p) for p in range(5))


def delivered(seen: list[tuple[float, TopicPartition, int]], tp: TopicPartition) -> list[int]:
    return [offset for _, p, offset in seen if p == tp]


def recorders(
    events: list[tuple[float, str, frozenset[TopicPartition]]],
) -> tuple[RebalanceCallback, RebalanceCallback]:
    """on_revoked and on_assigned callbacks noting when they heard what."""

    async def revoked(partitions: frozenset[TopicPartition]) -> None:
        events.append((trio.current_time(), "revoked", partitions))

    async def assigned(partitions: frozenset[TopicPartition]) -> None:
        events.append((trio.current_time(), "assigned", partitions))

    return revoked, assigned


async def drain_timed(stream: RecordStream, seen: list[tuple[float, TopicPartition, int]]) -> None:
    async for record in stream:
        seen.append((trio.current_time(), record.topic_partition, record.offset))


async def test_a_revocation_stops_only_its_partitions_and_the_rest_flow_on_without_a_gap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list[tuple[float, str, frozenset[TopicPartition]]] = []
    revoked, assigned = recorders(events)
    settings = ConsumerSettings(auto_offset_reset="earliest", session_timeout=6.0)
    seen: list[tuple[float, TopicPartition, int]] = []
    async with (
        open_scripted_coordinator() as coordinator,
        open_consumer(
            "broker:9092",
            "g",
            topics={"t": 1},
            settings=settings,
            connect=coordinator.connect,
            on_revoked=revoked,
            on_assigned=assigned,
        ) as consumer,
        trio.open_nursery() as app,
    ):
        app.start_soon(drain_timed, consumer.streams[0], seen)
        member = await coordinator.member()
        await member.start(1, member.streams(("t", 0, 0), ("t", 1, 0), ("t", 2, 0), ("t", 3, 0)))
        await trio.sleep_until(2.0)
        answer = await member.stop(1, partitions=(T2, T3, T4))
        events.append((trio.current_time(), "answered", frozenset()))
        stopped_at = trio.current_time()
        # the final offsets of what it stopped, and of nothing else
        assert {(o.topic, o.partition) for o in answer.offsets} == {("t", 2), ("t", 3)}
        assert consumer.assignment.value == {T0, T1}
        assert consumer.generation == 1
        ping = await member.ping(1)
        assert {(o.topic, o.partition) for o in ping.offsets} == {("t", 0), ("t", 1)}
        await trio.sleep_until(4.0)
        # an incremental start: t-0 and t-1 go on whatever offset it names, t-4 starts at 0
        added = member.streams(("t", 0, 999), ("t", 1, 999), ("t", 4, 0))
        await member.start(2, added, incremental=True)
        assert consumer.generation == 2
        assert consumer.assignment.value == {T0, T1, T4}
        await trio.sleep_until(6.0)
        app.cancel_scope.cancel()
        rebalances = list(events)  # closing revokes the rest

    assert rebalances == [
        (0.0, "assigned", frozenset({T0, T1, T2, T3})),
        (2.0, "revoked", frozenset({T2, T3})),  # before the answer left
        (2.0, "answered", frozenset()),
        (4.0, "assigned", frozenset({T4})),
    ]
    fetches = coordinator.log.fetches
    # t-2 and t-3: nothing fetched once stopped, and nothing delivered that was fetched before
    assert max(at for at, tp, _ in fetches if tp in (T2, T3)) < stopped_at
    assert max(at for at, tp, _ in seen if tp in (T2, T3)) < stopped_at
    for tp in (T0, T1):
        # No pause: fetched at least every idle interval (0.1 s) from 0 to 6 s, through both
        # rebalances, never from the offset the incremental start named.
        instants = [0.0, *(at for at, p, _ in fetches if p == tp), 6.0]
        assert max(b - a for a, b in itertools.pairwise(instants)) <= 0.1 + 1e-9
        assert 999 not in {offset for _, p, offset in fetches if p == tp}
    # Every record in order, none twice, none skipped: up to 58, the last below the log's end
    # (59) at the last fetch, at 5.9 s; t-4 from its start at 4.0 s.
    for tp in (T0, T1, T4):
        assert delivered(seen, tp) == list(range(59))


async def test_an_incremental_start_moves_a_kept_partition_to_another_stream_without_a_gap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """SPEC.md §11.6: a partition kept by an incremental start may move to another stream of the
    same consumer; its records go on in the new stream, none lost or repeated, and an assigned
    partition that the start no longer names is stopped first."""
    revoked: list[frozenset[TopicPartition]] = []

    async def on_revoked(partitions: frozenset[TopicPartition]) -> None:
        revoked.append(partitions)

    seen: list[tuple[float, TopicPartition, int]] = []
    async with (
        open_scripted_coordinator() as coordinator,
        open_consumer(
            "broker:9092",
            "g",
            topics={"t": 2},
            settings=ConsumerSettings(
                auto_offset_reset="earliest", session_timeout=6.0, max_buffered_records=8
            ),
            connect=coordinator.connect,
            on_revoked=on_revoked,
        ) as consumer,
        trio.open_nursery() as app,
    ):
        first, second = consumer.streams
        member = await coordinator.member()
        await member.start(1, member.streams_of({0: (("t", 0, 0), ("t", 2, 0)), 1: (("t", 1, 0),)}))
        app.start_soon(drain_timed, first, seen)
        await trio.sleep_until(3.0)  # stream 1 is not read: t-1 fills its buffer and waits
        assert second.partitions == {T1}
        await member.start(2, member.streams_of({0: (("t", 0, 0), ("t", 1, 0))}), incremental=True)
        assert first.partitions == {T0, T1}
        assert second.partitions == frozenset()
        assert revoked == [frozenset({T2})]  # not named any more: stopped
        await trio.sleep_until(5.0)
        app.cancel_scope.cancel()

    # t-1's records buffered in stream 1 moved to stream 0 with it: all of them, in order, once
    assert delivered(seen, T1) == list(range(49))
    assert delivered(seen, T0) == list(range(49))
    assert [at for at, tp, offset in seen if tp == T1 and offset == 0] == [3.0]


async def test_a_commit_from_on_revoked_still_counts_the_revoked_partitions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Without auto_commit the application commits in on_revoked, which runs after the fetchers
    of the revoked partitions stopped and before the StopFetcher answer: the coordinator still
    counts them as this member's then, so the commit carries them."""
    box: list[Consumer] = []

    async def commit_on_revoke(partitions: frozenset[TopicPartition]) -> None:
        await box[0].commit()

    async with (
        open_scripted_coordinator() as coordinator,
        open_consumer(
            "broker:9092",
            "g",
            topics={"t": 1},
            settings=ConsumerSettings(
                auto_offset_reset="earliest", session_timeout=6.0, auto_commit=False
            ),
            connect=coordinator.connect,
            on_revoked=commit_on_revoke,
        ) as consumer,
        trio.open_nursery() as app,
    ):
        box.append(consumer)
        member = await coordinator.member()
        await member.start(1, member.streams(("t", 0, 0), ("t", 1, 0)))
        app.start_soon(drain, consumer.streams[0], [])
        await trio.sleep_until(1.0)
        answer = await member.stop(1, partitions=(T1,))
        assert answer.offsets == ()  # without auto_commit the answer carries none
        (commit,) = coordinator.commits
        assert {(o.topic, o.partition) for o in commit.offsets} == {("t", 0), ("t", 1)}
        assert commit.generation == 1
        await consumer.commit()  # answered: t-1 is no longer this member's to commit
        assert {(o.topic, o.partition) for o in coordinator.commits[-1].offsets} == {("t", 0)}
        app.cancel_scope.cancel()


async def test_a_static_member_registers_under_its_instance_id_and_closes_without_leaving(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = ConsumerSettings(
        auto_offset_reset="earliest", session_timeout=6.0, instance_id="billing-1"
    )
    async with open_scripted_coordinator() as coordinator:
        async with open_consumer(
            "broker:9092", "g", topics={"t": 1}, settings=settings, connect=coordinator.connect
        ) as consumer:
            member = await coordinator.member()
            assert member.registration.instance_id == "billing-1"
            assert consumer.member_id != "billing-1"  # the process has its own id
            # the coordinator names the streams after the member, which is the instance id
            await member.start(1, member.streams(("t", 0, 0)))
            assert consumer.assignment.value == {T0}
            await trio.sleep(1.0)
        # stopped, committed, and closed cleanly: no LeaveGroup, since a restart is expected
        assert member.ended.is_set() and not member.line.aborted
        assert [c.offsets[0].partition for c in coordinator.commits] == [0]
        assert coordinator.leaves == []
        assert max(at for at, _, _ in coordinator.log.fetches) < trio.current_time()
    with pytest.raises(ValueError, match="must differ"):
        async with open_consumer(
            "broker:9092", "g", topics={"t": 1}, consumer_id="billing-1", settings=settings
        ):
            pass


async def fenced_consumer_ends(
    coordinator: ScriptedCoordinator, consumer: Consumer, stream_error: list[BaseException]
) -> None:
    """What every way of being fenced ends in: stopped, closed cleanly, the application told,
    and never a discovery or registration again (watched for 3 T)."""
    await trio.sleep(3 * consumer.settings.session_timeout)
    assert consumer.state is ConsumerState.FENCED
    assert consumer.last_error is ErrorCode.FENCED_INSTANCE_ID
    assert consumer.assignment.value == frozenset()
    assert [type(e) for e in stream_error] == [InstanceFenced]
    assert len(coordinator.lookups) == len(coordinator.registrations) == 1


async def read_until_fenced(stream: RecordStream, errors: list[BaseException]) -> None:
    try:
        async for _ in stream:
            pass
    except InstanceFenced as exc:
        errors.append(exc)


@asynccontextmanager
async def a_static_consumer_reading(
    errors: list[BaseException],
) -> AsyncIterator[tuple[ScriptedCoordinator, Consumer]]:
    """Static member billing-1 on a coordinator played by hand, its stream read until fenced."""
    settings = ConsumerSettings(
        auto_offset_reset="earliest", session_timeout=6.0, instance_id="billing-1"
    )
    async with (
        open_scripted_coordinator() as coordinator,
        open_consumer(
            "broker:9092", "g", topics={"t": 1}, settings=settings, connect=coordinator.connect
        ) as consumer,
        trio.open_nursery() as app,
    ):
        app.start_soon(read_until_fenced, consumer.streams[0], errors)
        yield coordinator, consumer


async def test_a_fenced_stop_stops_answers_closes_and_ends_for_good(
    autojump_clock: trio.testing.MockClock,
) -> None:
    errors: list[BaseException] = []
    async with a_static_consumer_reading(errors) as (coordinator, consumer):
        member = await coordinator.member()
        await member.start(1, member.streams(("t", 0, 0), ("t", 1, 0)))
        await trio.sleep_until(1.0)
        answer = await member.stop(1, reason=ErrorCode.FENCED_INSTANCE_ID)
        # the final offsets of everything, then a clean close: it had stopped
        assert {o.partition for o in answer.offsets} == {0, 1}
        await member.ended.wait()
        assert trio.current_time() == 1.0 and not member.line.aborted
        assert max(at for at, _, _ in coordinator.log.fetches) < 1.0
        await fenced_consumer_ends(coordinator, consumer, errors)
        with pytest.raises(InstanceFenced):
            await consumer.commit()
    assert coordinator.commits == [] and coordinator.leaves == []


async def test_a_commit_answered_fenced_ends_the_consumer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    errors: list[BaseException] = []
    async with a_static_consumer_reading(errors) as (coordinator, consumer):
        member = await coordinator.member()
        await member.start(1, member.streams(("t", 0, 0)))
        await trio.sleep_until(1.0)
        coordinator.commit_answer = ErrorCode.FENCED_INSTANCE_ID
        with pytest.raises(InstanceFenced):
            await consumer.commit()
        await member.ended.wait()
        assert trio.current_time() == 1.0 and not member.line.aborted
        assert max(at for at, _, _ in coordinator.log.fetches) < 1.0
        await fenced_consumer_ends(coordinator, consumer, errors)


async def test_a_registration_answered_fenced_ends_the_consumer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    errors: list[BaseException] = []
    async with a_static_consumer_reading(errors) as (coordinator, consumer):
        coordinator.register_answer = ErrorCode.FENCED_INSTANCE_ID
        await fenced_consumer_ends(coordinator, consumer, errors)
        assert coordinator.log.fetches == []


async def test_a_rebalance_that_does_not_touch_a_consumer_leaves_it_fetching_and_committing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The real coordinator's incremental rebalance: a joins on topic a, b on topic b, then c
    joins on b. Only b and c hear of it; a gets no request, delivers on without a pause, keeps
    its generation, and its commits under that generation still count."""
    events: list[tuple[float, str, frozenset[TopicPartition]]] = []
    revoked, assigned = recorders(events)
    settings = ConsumerSettings(auto_offset_reset="earliest", session_timeout=6.0)
    seen: list[tuple[float, TopicPartition, int]] = []
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"a": 2, "b": 4}) as net,
        open_consumer(
            "b:1",
            "g",
            topics={"a": 1},
            settings=settings,
            connect=net.connect,
            on_revoked=revoked,
            on_assigned=assigned,
        ) as a,
        open_consumer("b:1", "g", topics={"b": 1}, settings=settings, connect=net.connect) as b,
        trio.open_nursery() as app,
    ):
        app.start_soon(drain_timed, a.streams[0], seen)
        await net.cluster.wait_stable("g", members=2)
        assert trio.current_time() == CONFIG.initial_rebalance_delay
        assert len(b.assignment.value) == 4
        await trio.sleep_until(3.0)
        async with open_consumer(
            "b:1", "g", topics={"b": 1}, settings=settings, connect=net.connect
        ) as c:
            await c.assignment.wait_value(lambda owned: len(owned) == 2)
            assert trio.current_time() == 3.0
            assert len(b.assignment.value) == 2
            assert (a.generation, b.generation, c.generation) == (1, 1, 2)
            await trio.sleep_until(5.0)
            a_partitions = frozenset(TopicPartition(topic="a", partition=p) for p in (0, 1))
            assert events == [(1.0, "assigned", a_partitions)]  # nothing since
            await a.commit()  # under generation 1, in group generation 2
            committed = await net.cluster.coordinator.offsets.committed("g")
            assert {tp: committed[tp] for tp in a_partitions} == a.consumed_offsets()
            app.cancel_scope.cancel()
    for tp in a_partitions:
        # from its start at 1.0 to 5.0: fetched at least every idle interval, each record once
        instants = [1.0, *(at for at, p, _ in net.log.fetches if p == tp and at <= 5.0), 5.0]
        assert max(y - x for x, y in itertools.pairwise(instants)) <= 0.1 + 1e-9
        # every record once, in order: up to 48, the last below the log's end at 4.9 s
        assert delivered(seen, tp) == list(range(49))


async def test_a_static_member_restarts_into_its_partitions_and_a_newer_process_fences_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The real coordinator's static membership (SPEC.md §11.11) with the consumer library: a
    static member that closes and starts again within T gets exactly its partitions back, and a
    third process under its instance id fences the second, which ends with InstanceFenced; the
    dynamic member beside them hears nothing after the group formed."""
    static = ConsumerSettings(auto_offset_reset="earliest", session_timeout=6.0, instance_id="s1")
    events: list[tuple[float, str, frozenset[TopicPartition]]] = []
    revoked, assigned = recorders(events)
    errors: list[BaseException] = []
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"t": 4}) as net,
        open_consumer(
            "b:1",
            "g",
            topics={"t": 1},
            settings=ConsumerSettings(auto_offset_reset="earliest", session_timeout=6.0),
            connect=net.connect,
            on_revoked=revoked,
            on_assigned=assigned,
        ) as dynamic,
    ):
        async with open_consumer(
            "b:1", "g", topics={"t": 1}, settings=static, connect=net.connect
        ) as first:
            await first.assignment.wait_value(lambda owned: len(owned) == 2)
            held = first.assignment.value
        assert trio.current_time() == 1.0  # formed after the initial delay, closed at once
        await trio.sleep(1.0)
        async with (
            open_consumer(
                "b:1", "g", topics={"t": 1}, settings=static, connect=net.connect
            ) as second,
            trio.open_nursery() as app,
        ):
            await second.assignment.wait_value(lambda owned: owned == held)
            assert trio.current_time() == 2.0  # no rebalance delay: its partitions were waiting
            app.start_soon(read_until_fenced, second.streams[0], errors)
            async with open_consumer(
                "b:1", "g", topics={"t": 1}, settings=static, connect=net.connect
            ) as third:
                await third.assignment.wait_value(lambda owned: owned == held)
                assert trio.current_time() == 2.0  # the second answered its fence at once
                assert second.state is ConsumerState.FENCED
                assert second.last_error is ErrorCode.FENCED_INSTANCE_ID
                assert [type(e) for e in errors] == [InstanceFenced]
        assert events == [(1.0, "assigned", dynamic.assignment.value)]


async def test_a_partition_whose_topic_was_created_again_stops_until_the_next_start(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC.md §11.12: started on t's incarnation 1, the consumer names it in every Fetch; the
    broker has incarnation 2 under the name now and answers UNKNOWN_TOPIC_ID: t-0 stops (one
    warning, nothing delivered, no reset) while u-0 fetches on. An incremental start naming 2
    does not keep t-0 going as it was: it starts it afresh, at the offset it names."""
    old, new = uuid.UUID(int=1), uuid.UUID(int=2)
    seen: list[tuple[float, TopicPartition, int]] = []
    u0 = TopicPartition(topic="u", partition=0)
    async with (
        open_scripted_coordinator() as coordinator,
        open_consumer(
            "broker:9092",
            "g",
            topics={"t": 1, "u": 1},
            settings=ConsumerSettings(auto_offset_reset="earliest", session_timeout=6.0),
            connect=coordinator.connect,
        ) as consumer,
        trio.open_nursery() as app,
    ):
        coordinator.log.follow(
            {
                name: TopicPlacement(topic=name, brokers=(1,), topic_id=topic_id)
                for name, topic_id in (("t", new), ("u", old))
            }
        )
        for stream in consumer.streams:
            app.start_soon(drain_timed, stream, seen)
        member = await coordinator.member()
        ids = (TopicIdentity(topic="t", topic_id=old), TopicIdentity(topic="u", topic_id=old))
        streams = member.streams(("t", 0, 0), ("u", 0, 0))
        await member.start(1, streams, topic_ids=ids)
        await trio.sleep_until(2.0)
        t_fetches = [at for at, tp, _ in coordinator.log.fetches if tp == T0]
        assert t_fetches == [0.0]  # refused once, never asked again
        assert delivered(seen, T0) == []
        assert delivered(seen, u0) == list(range(19))  # the other topic flows on
        assert coordinator.log.listed == []  # no reset
        warnings = [r for r in caplog.records if "has another id now" in r.getMessage()]
        assert [r.levelno for r in warnings] == [logging.WARNING]
        assert consumer.assignment.value == {T0, u0}
        renamed = (TopicIdentity(topic="t", topic_id=new), ids[1])
        await member.start(2, streams, incremental=True, topic_ids=renamed)
        await trio.sleep_until(4.0)
        assert delivered(seen, T0)[:3] == [0, 1, 2]  # afresh, from the offset the start named
        assert min(at for at, tp, _ in coordinator.log.fetches if tp == T0 and at > 0) == 2.0
        app.cancel_scope.cancel()
