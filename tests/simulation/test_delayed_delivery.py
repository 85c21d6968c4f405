"""A request delayed in the network cannot stretch a lease (docs/design.md#ownership-lease).

T = 6 s: Pings every 2 s from registration (0.0), each due within 4 s, one miss kills, and a
silent member's partitions wait until the last request sent to it + T + 0.5 s. Every Ping names the
frame of the consumer's answer to the Ping before it, so after the Ping of 10.0 a's lease runs
from 8.0 to 14.0.
"""

from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol.types import TopicPartition
from simulation import SimulatedCluster, SimulatedConsumer, open_simulated_cluster

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0, lease_margin=0.5)
ALL = {TopicPartition(topic="events", partition=p) for p in range(6)}


async def _pair(
    cluster: SimulatedCluster, *, fetch_through_failover: bool
) -> tuple[SimulatedConsumer, SimulatedConsumer]:
    await cluster.create_topic("events", partitions=6)
    a, b = [
        await cluster.start_consumer(
            name, group="g", topics={"events": 1}, fetch_through_failover=fetch_through_failover
        )
        for name in "ab"
    ]
    with trio.fail_after(10):
        await cluster.wait_settled()
    assert trio.current_time() == 3.0
    return a, b


def _spans(cluster: SimulatedCluster, consumer_id: str) -> set[tuple[float, float]]:
    now = trio.current_time()
    return {(i.start, i.end) for i in cluster.ledger.intervals(now) if i.consumer_id == consumer_id}


@pytest.mark.parametrize("fetch_through_failover", [False, True])
async def test_a_ping_delayed_past_the_margin_then_cut_off_does_not_outlast_the_coordinators_count(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, fetch_through_failover: bool
) -> None:
    """The Ping of 12.0 reaches a 1.5 s late, at 13.4, three times the lease margin; a takes
    0.5 s over its answer and the network is cut before it leaves. The coordinator counts a's
    lease from that Ping's send: a is dead at its deadline (16.0) and its partitions start on b
    at 12.0 + T + 0.5 = 18.5. A lease counted from the Ping's arrival would run to 19.4, and both
    would fetch from 18.5 to 19.4; counted from the frame the Ping names (a's answer to the Ping
    of 10.0, queued at 10.0), it ends at 16.0."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster, fetch_through_failover=fetch_through_failover)
        await trio.sleep_until(11.9)
        a.answer_slowly(0.5)
        a.delay_delivery(1.5)
        await trio.sleep_until(13.5)
        a.cut_network(6.0)
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=1)
        assert trio.current_time() == 18.5
        assert b.owned == ALL
        await trio.sleep_until(19.5)  # the cut heals: a reads the close that followed the Ping
        await cluster.check_invariants()
        assert _spans(cluster, "a") == {(3.0, 16.0)}
        assert _spans(cluster, "b") == {(3.0, 16.0), (18.5, 19.5)}
        with trio.fail_after(30):
            await cluster.wait_settled()
        await cluster.check_invariants(settled=True)


async def test_a_start_fetcher_delayed_past_the_margin_does_not_stretch_the_lease(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """c joins at 13.0 and the rebalance stops a, b and c; a takes a second over its answer, so
    StartFetcher goes out at 14.0, after a's StopFetcher answer. a's is held in the network until
    15.5, and a's own bytes are held from 15.0 on, so its answer never comes: a is dead at the
    StartFetcher's deadline (18.0) and its partitions start elsewhere at 14.0 + T + 0.5 = 20.5.
    a, which fetches through a lost connection, registers again at 20.0, but the coordinator
    hears it only at 25.0. Counted from its arrival, a's lease would run to 21.5; the
    StartFetcher names a's StopFetcher answer, queued at 14.0, so it runs to 20.0."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster, fetch_through_failover=True)
        await trio.sleep_until(12.9)
        a.answer_slowly(1.0)
        await trio.sleep_until(13.0)
        c = await cluster.start_consumer("c", group="g", topics={"events": 1})
        await trio.sleep_until(13.5)
        a.delay_delivery(2.0)
        await trio.sleep_until(14.5)
        assert not a.fetching  # it answered StopFetcher at 14.0
        a.answer_slowly(0.0)
        await trio.sleep_until(15.0)
        a.delay_delivery(10.0, to_consumer=False, to_broker=True)
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=2)
        assert trio.current_time() == 20.5
        assert b.owned | c.owned == ALL
        await trio.sleep_until(24.9)
        await cluster.check_invariants()
        assert _spans(cluster, "a") == {(3.0, 14.0), (15.5, 20.0)}
        with trio.fail_after(30):
            await cluster.wait_settled()
        await cluster.check_invariants(settled=True)
