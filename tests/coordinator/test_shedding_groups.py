"""A broker whose loop stays behind, or that uses all the CPU it may have, lets whole groups go,
the newest first, and keeps the others (docs/design.md#shedding-load), on the autojump clock with
exact virtual times.

The members of a group let go are told so over the connection they have (StopFetcher 3, reason
BROKER_BUSY, with the group's hold as the hint), and come back only after it. The simulated
broker's loop never lags and uses no CPU to speak of, so the tests set the lag and the CPU use
the governor reads (stand-ins for ``LoopLag``, whose watcher measures a real loop's wakes:
tests/coordinator/test_loop_lag.py, and for ``CpuBudget``: tests/coordinator/test_cpu_budget.py);
everything else is the real coordinator, its real consumers and the simulated network. T = 6 s.
"""

from pathlib import Path

import attrs
import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from coordinator.overload import Governor
from protocol import ErrorCode
from protocol.types import TopicPartition
from simulation import SimulatedCluster, SimulatedConsumer, open_simulated_cluster
from statemachine.consumer import ConsumerState
from statemachine.group import GroupState
from tests.coordinator.test_overload import StandInBudget
from tests.support.standin_consumer import StandInConsumer

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0, shed_groups_above_lag=0.5)
TOPIC = "events"
ALL = frozenset(TopicPartition(topic=TOPIC, partition=p) for p in range(4))


@attrs.define
class SetLag:
    latest: float = 0.0


async def _groups(cluster: SimulatedCluster) -> dict[str, list[SimulatedConsumer]]:
    """Three groups of two, formed in the order g1, g2, g3 (g3 the newest)."""
    await cluster.create_topic(TOPIC, partitions=4)
    groups: dict[str, list[SimulatedConsumer]] = {}
    for group in ("g1", "g2", "g3"):
        groups[group] = [
            await cluster.start_consumer(f"{group}-{i}", group=group, topics={TOPIC: 1})
            for i in range(2)
        ]
    for group in groups:
        assert await cluster.wait_stable(group, members=2) == 1
    return groups


def _governor(cluster: SimulatedCluster) -> tuple[Governor, SetLag]:
    governor = cluster.coordinator.governor
    assert governor is not None
    lag = SetLag()
    governor.lag = lag
    governor.budget = StandInBudget(all_used=False)
    return governor, lag


def _untouched(members: list[SimulatedConsumer], held: tuple[object, int]) -> bool:
    """Same partitions, same generation, never told to stop."""
    owned = (members[0].owned | members[1].owned, members[0].generation)
    return owned == held and all(m.stops_received == 0 for m in members)


async def _back_after_the_hold(cluster: SimulatedCluster) -> None:
    """g3 and g2, let go at 11.0 and held out for T, come back after the hint (17.0) holding
    nothing, and form again after the initial delay (3 s) with their offsets."""
    for group in ("g3", "g2"):
        assert await cluster.wait_stable(group, members=2) == 2
    assert trio.current_time() == 17.0 + 3.0
    cluster.ledger.check()


async def test_a_broker_that_stays_behind_lets_the_newest_groups_go_and_keeps_the_others(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        groups = await _groups(cluster)
        _, lag = _governor(cluster)
        await trio.sleep_until(10.25)
        held = {g: (m[0].owned | m[1].owned, m[0].generation) for g, m in groups.items()}
        assert all(owned == ALL for owned, _ in held.values())
        registrations = {c.consumer_id: c.registrations for m in groups.values() for c in m}
        lag.latest = 1.0  # behind at the looks of 10.5 and 11.0: half of 6 members go
        shed = [cluster.coordinator.groups[g] for g in ("g3", "g2")]
        for driver in shed:
            await driver.status.wait_value(lambda s: s[0] is GroupState.EMPTY)
        assert trio.current_time() == 11.0
        lag.latest = 0.0
        # Their members were told over the connections they had (StopFetcher, BROKER_BUSY):
        # they stopped then and there, answered (the answer frees their partitions) and closed.
        for consumer in groups["g3"] + groups["g2"]:
            await consumer.fetching_state.wait_value(lambda fetching: not fetching)
        assert trio.current_time() == 11.0
        await trio.sleep_until(11.5)
        for consumer in groups["g3"] + groups["g2"]:
            assert consumer.consumer is not None
            assert consumer.consumer.last_error is ErrorCode.BROKER_BUSY
            assert consumer.stopped_partitions[-1] is None  # everything
            assert consumer.stopped_at[-1] == 11.0
        assert not any(driver.ownership.under_lease(11.5) for driver in shed)
        # The oldest never noticed: same generation, same partitions, no stop.
        await trio.sleep_until(16.75)
        assert _untouched(groups["g1"], held["g1"])
        # The members let go did not come back before the hint (T, the group's hold): they
        # cost the broker no connection meanwhile, and no refusal.
        for consumer in groups["g3"] + groups["g2"]:
            assert not consumer.fetching
            assert consumer.consumer is not None
            assert consumer.consumer.state is ConsumerState.DISCOVERING
            assert consumer.registrations == registrations[consumer.consumer_id]
        assert all(driver.group.members == {} for driver in shed)
        await _back_after_the_hold(cluster)


async def test_a_broker_that_uses_all_its_cpu_lets_go_the_members_beyond_its_room(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Under a CPU quota the loop looks punctual until every lease is at stake: all the CPU
    used is the sign, and what a member cost while the broker kept up says how many it can
    keep. Here room for 2.5 of 6 (a member 0.04 core, 80% of 0.125 kept): 4 go at once, the
    newest first, and none more while the 2 kept fit, though all the CPU is still used."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        groups = await _groups(cluster)
        governor, _ = _governor(cluster)
        budget = StandInBudget(cost=0.04, all_used=False)
        governor.budget = budget
        await trio.sleep_until(10.25)
        held = {g: (m[0].owned | m[1].owned, m[0].generation) for g, m in groups.items()}
        budget.all_used = True  # at every look from 10.5 on
        for group in ("g3", "g2"):
            driver = cluster.coordinator.groups[group]
            await driver.status.wait_value(lambda s: s[0] is GroupState.EMPTY)
        assert trio.current_time() == 11.0
        await trio.sleep_until(16.75)
        assert _untouched(groups["g1"], held["g1"])
        budget.all_used = False
        await _back_after_the_hold(cluster)


async def test_a_stopped_broker_that_resumes_on_time_sheds_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        groups = await _groups(cluster)
        _, lag = _governor(cluster)
        await trio.sleep_until(10.25)
        lag.latest = 1.4  # one late wake (a stop), then punctual ones
        await trio.sleep_until(10.75)
        lag.latest = 0.0
        await trio.sleep_until(20.0)
        for group, members in groups.items():
            assert cluster.coordinator.groups[group].group.machine.state is GroupState.STABLE
            assert all(m.generation == 1 and m.stops_received == 0 for m in members)
        cluster.ledger.check()


async def test_a_member_of_an_older_level_is_let_go_by_closing_its_connection_and_held_out(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A member that reads no StopFetcher 3 cannot be told: its connection closes, its
    partitions wait for its lease, and its registrations are refused COORDINATOR_NOT_AVAILABLE,
    which every level retries, until its group's hold is over."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic(TOPIC, partitions=4)
        new = await cluster.start_consumer("new", group="g", topics={TOPIC: 1})
        old = await cluster.start_consumer(
            "old", group="g", topics={TOPIC: 1}, level0=True, member=StandInConsumer
        )
        assert await cluster.wait_stable("g", members=2) == 1
        _, lag = _governor(cluster)
        await trio.sleep_until(10.25)
        lag.latest = 1.0
        group = cluster.coordinator.groups["g"]
        await group.status.wait_value(lambda s: s[0] is GroupState.EMPTY)
        assert trio.current_time() == 11.0
        lag.latest = 0.0
        await trio.sleep_until(11.5)
        assert new.stopped_at[-1] == 11.0 and not new.fetching
        # The old one's partitions wait T and the margin after its connection closed (it keeps
        # no lease: docs/design.md#old-clients); the new one's answer freed its own.
        assert group.ownership.under_lease(11.5)
        await trio.sleep_until(16.75)
        assert old.last_register_error is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert group.group.members == {}
        assert await cluster.wait_stable("g", members=2) == 2
        assert trio.current_time() == 17.0 + 3.0
        cluster.ledger.check()
