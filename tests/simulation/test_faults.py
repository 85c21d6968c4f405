"""The faults a test can choose, each on the autojump clock with exact virtual times.

T = 6 s throughout: Pings every 2 s, each due within 4 s, one miss kills, a silent member's
partitions wait out its lease plus 0.5 s, and a consumer that lost its coordinator waits T/3 = 2 s
before it rediscovers it.
"""

from pathlib import Path

import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from coordinator.testing import SimulatedCluster, SimulatedConsumer, open_simulated_cluster
from protocol.types import TopicPartition

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0, lease_margin=0.5)
ALL = {TopicPartition(topic="events", partition=p) for p in range(6)}


async def _pair(cluster: SimulatedCluster) -> tuple[SimulatedConsumer, SimulatedConsumer]:
    await cluster.create_topic("events", partitions=6)
    a = await cluster.start_consumer("a", group="g", topics={"events": 1})
    b = await cluster.start_consumer("b", group="g", topics={"events": 1})
    with trio.fail_after(10):
        await cluster.wait_settled()
    assert trio.current_time() == 3.0
    return a, b


def _starts(cluster: SimulatedCluster, consumer_id: str) -> set[float]:
    return {
        i.start
        for i in cluster.ledger.intervals(trio.current_time())
        if i.consumer_id == consumer_id
    }


async def test_a_dropped_connection_moves_partitions_at_once_and_the_consumer_comes_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        await trio.sleep_until(5.0)
        a.drop_connection()
        with trio.fail_after(5):
            await cluster.wait_stable("g", members=1)
        assert trio.current_time() == 5.0
        assert not a.fetching and b.owned == ALL
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert trio.current_time() == 7.0  # a waited T/3, registered again, and rebalanced
        assert a.registrations == 2
        assert a.owned | b.owned == ALL and a.owned
        await cluster.check_invariants(settled=True)


async def test_a_cut_network_silences_both_sides_until_it_heals(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, _b = await _pair(cluster)
        await trio.sleep_until(10.5)  # a answered the Ping of 10.0
        a.cut_network(10)
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=1)
        # The Ping of 12.0 never arrives: a is dead at its deadline, 16.0; its partitions wait
        # until the last request sent to it (12.0) + T + margin.
        assert trio.current_time() == 18.5
        assert {i.end for i in cluster.ledger.closed if i.consumer_id == "a"} == {16.0}
        assert _starts(cluster, "b") == {3.0, 18.5}
        # a stopped by itself at 16.0, found the network down at 18.0 and 20.0, and connects
        # again at 22.0, after the network came back at 20.5.
        with trio.fail_after(20):
            await cluster.wait_settled()
        assert trio.current_time() == 22.0
        assert a.registrations == 2 and a.owned
        await cluster.check_invariants(settled=True)


async def test_a_request_that_arrives_when_its_answer_cannot_still_renews_the_lease(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The Ping of 12.0 reaches a, which takes a second over its answer; the network is cut in
    that second. a's lease runs from 12.0, though the coordinator last heard from it at 10.0."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, _b = await _pair(cluster)
        await trio.sleep_until(11.0)
        a.answer_slowly(1.0)
        await trio.sleep_until(12.5)
        a.cut_network(30)
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=1)
        assert trio.current_time() == 18.5  # the last request sent to a (12.0) + T + margin
        await trio.sleep_until(19.0)
        assert {i.end for i in cluster.ledger.closed if i.consumer_id == "a"} == {18.0}
        cluster.ledger.check()


async def test_a_restarted_coordinator_keeps_offsets_and_groups_and_waits_out_old_leases(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        await trio.sleep_until(10.5)
        await cluster.check_invariants()
        committed = dict(await cluster.coordinator.offsets.committed("g"))
        assert committed and all(offset == 4 for offset in committed.values())  # 4 Pings
        before = cluster.coordinator
        with trio.fail_after(5):
            await cluster.restart_coordinator(down_for=1.0)
        assert cluster.coordinator is not before
        assert trio.current_time() == 11.5
        assert not a.fetching and not b.fetching  # both saw the connection close at 10.5
        assert await cluster.coordinator.offsets.committed("g") == committed
        assert cluster.coordinator.groups["g"].machine.generation == 1  # recovered
        with trio.fail_after(20):
            await cluster.wait_settled()
        # Both rediscovered at 12.5; the new coordinator took office at 11.5 and starts no
        # partition of the old assignment before 11.5 + T + margin.
        assert trio.current_time() == 18.0
        assert a.generation == b.generation == 2
        assert a.owned | b.owned == ALL
        assert all(a.positions[tp] >= committed[tp] for tp in a.owned)
        await cluster.check_invariants(settled=True)
